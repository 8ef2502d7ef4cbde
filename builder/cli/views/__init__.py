"""How each command's result looks: a rich table or text for people on stdout, or the JSON
document with --json. Views format values the stages return; they decide nothing. One module
per area, so a command loads only the view (and the stages) it shows."""

from __future__ import annotations

from collections.abc import Sequence

from rich.console import Console
from rich.markup import escape
from rich.table import Table


def table(console: Console, title: str, columns: list[str], rows: list[list[str]]) -> None:
    t = Table(title=title, title_justify="left")
    for col in columns:
        t.add_column(col)
    for r in rows:
        t.add_row(*[escape(str(x)) for x in r])
    console.print(t)


def kv(console: Console, title: str, pairs: list[tuple[str, str]]) -> None:
    t = Table(title=title, title_justify="left", show_header=False, box=None, pad_edge=False)
    t.add_column(style="bold")
    t.add_column()
    for k, v in pairs:
        t.add_row(k, escape(v))
    console.print(t)


def lines(console: Console, text_lines: Sequence[str]) -> None:
    for line in text_lines:
        console.out(line, highlight=False)

