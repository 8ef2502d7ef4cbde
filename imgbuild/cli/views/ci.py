"""matrix, outdated and relock reports."""

from __future__ import annotations

import json

from rich.markup import escape
from rich.table import Table

from ...ci import outdated
from ..console import Output
from . import lines


def matrix(out: Output, doc: dict, fmt: str) -> None:
    # Plain JSON on stdout whatever --json says: it is what CI reads. One line for github (it
    # goes into $GITHUB_OUTPUT).
    text = json.dumps(doc, separators=(",", ":")) if fmt == "github" else json.dumps(doc, indent=2)
    out.out.file.write(text + "\n")


def outdated_news(out: Output, news: list[outdated.TargetNews]) -> None:
    if out.json:
        out.print_json(outdated.to_dict(news))
        return
    c = out.out
    for tn in news:
        t = Table(title=f"{tn.target} ({tn.lock})", title_justify="left")
        for col in ("package", "locked", "newest", "status"):
            # folded, not cut: a base image's tag is what the reader copies
            t.add_column(col, overflow="fold")
        for p in tn.packages:
            t.add_row(p.package + (" (engine)" if p.role == "engine" else ""), p.locked or "-",
                      p.latest or "-", escape(outdated.summary(p)))
        for b in tn.bases:
            t.add_row("base image", b.image, b.newer[-1] if b.newer else "-",
                      escape(b.status + (f": {b.note}" if b.note else "")))
        c.print(t)
        for p in tn.packages:
            if p.changes:
                c.out(f"  relock --upgrade {p.package}" + (f"=={p.available}" if p.available else "")
                      + ":", highlight=False)
                lines(c, ["    " + line for line in outdated.diff_lines(p.changes)])
        lines(c, [f"  note: {e}" for e in tn.errors])


def relock(out: Output, res: outdated.RelockResult) -> None:
    if out.json:
        out.print_json(res.to_dict())
        return
    lines(out.out, res.diff)
    if res.note:
        out.out.print(escape(res.note))

