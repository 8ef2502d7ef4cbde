"""How each command's result looks: a rich table or text for people on stdout, or the JSON
document with --json. Views format values the stages return; they decide nothing. One module
per area, so a command loads only the view (and the stages) it shows."""

from __future__ import annotations

from collections.abc import Sequence

from rich.console import Console
from rich.markup import escape
from rich.table import Table


def table(console: Console, title: str, columns: list[str], rows: list[list[str]]) -> None:
    """Rows under a title. The first column holds what a user types next (a target, a model,
    a package): on a terminal the other columns fold before it is cut.

    On a terminal: a table whose other columns wrap to fit. Elsewhere (a pipe, a file, CI's
    log): one record per line, columns padded to their widest cell and nothing cut or wrapped,
    which is what `grep`, `cut` and `column` read.
    """
    cells = [[str(x) for x in r] for r in rows]
    if not console.is_terminal:
        flat = [[c.replace("\n", ", ") for c in r] for r in [list(columns), *cells]]
        widths = [max(len(r[i]) for r in flat) for i in range(len(columns))]
        console.out(title, highlight=False)
        for r in flat:
            console.out("  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip(),
                        highlight=False)
        return
    t = Table(title=title, title_justify="left")
    for i, col in enumerate(columns):
        # rich gives a no_wrap column its whole width while the others can fold; on a
        # terminal too narrow even for it, it ends in an ellipsis (a cut that shows), where a
        # minimum width would only be cropped silently at the edge.
        if i == 0:
            t.add_column(col, no_wrap=True)
        else:
            t.add_column(col, overflow="fold")
    for r in cells:
        t.add_row(*[escape(x) for x in r])
    console.print(t)


def kv(console: Console, title: str, pairs: list[tuple[str, str]]) -> None:
    """Key and value under a title. Elsewhere than a terminal: a line a pair (a value of
    several lines goes on under its key), nothing cut: digests and tags are copied from it."""
    if not console.is_terminal:
        width = max((len(k) for k, _ in pairs), default=0)
        console.out(title, highlight=False)
        for k, v in pairs:
            for i, line in enumerate(str(v).splitlines() or [""]):
                console.out(f"{(k if i == 0 else ''):<{width}}  {line}".rstrip(),
                            highlight=False)
        return
    t = Table(title=title, title_justify="left", show_header=False, box=None, pad_edge=False)
    t.add_column(style="bold")
    t.add_column()
    for k, v in pairs:
        t.add_row(k, escape(v))
    console.print(t)


def lines(console: Console, text_lines: Sequence[str]) -> None:
    for line in text_lines:
        console.out(line, highlight=False)

