"""Terminal output: rich for people, JSON for machines. Nothing here decides anything."""

from __future__ import annotations

import json
import sys

from rich.console import Console
from rich.table import Table

from .errors import ImgbuildError, JobFailed


def console() -> Console:
    # Reports go to stdout; progress and errors to stderr so `--json | jq` stays clean.
    return Console(stderr=True, highlight=False)


def print_json(doc) -> None:
    sys.stdout.write(json.dumps(doc, indent=2, sort_keys=False, default=str) + "\n")


def print_error(err: ImgbuildError, as_json: bool) -> None:
    if as_json:
        print_json(err.to_dict() | ({"log_tail": err.log_tail} if isinstance(err, JobFailed) else {}))
        return
    c = console()
    if isinstance(err, JobFailed) and err.log_tail:
        c.print("[dim]── log tail ──[/]")
        for line in err.log_tail:
            c.out(f"│ {line}", highlight=False)
    c.print(f"[bold red]error[/]: {err.message}", highlight=False)
    for i, fact in enumerate(err.facts):
        lead = "  ╰─▶ " if i == len(err.facts) - 1 else "  ├─▶ "
        c.out(lead + fact, highlight=False)
    if err.hint:
        c.print(f"  [bold cyan]help[/]: {err.hint}", highlight=False)


def table(title: str, columns: list[str], rows: list[list[str]]) -> None:
    t = Table(title=title, title_justify="left")
    for col in columns:
        t.add_column(col)
    for r in rows:
        t.add_row(*[str(x) for x in r])
    Console(highlight=False).print(t)


def kv(title: str, pairs: list[tuple[str, str]]) -> None:
    t = Table(title=title, title_justify="left", show_header=False, box=None, pad_edge=False)
    t.add_column(style="bold")
    t.add_column()
    for k, v in pairs:
        t.add_row(k, v)
    Console(highlight=False).print(t)
