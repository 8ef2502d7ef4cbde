"""The one place that makes consoles, and the stream rule every command follows:

- the report goes to stdout (a table for people; with --json, JSON and nothing else);
- progress, diagnostics and errors for people go to stderr;
- with --json an error is a JSON document on stdout, so `--json | jq` always reads JSON.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass

from rich.console import Console
from rich.markup import escape

from ..errors import ImgbuildError, JobFailed


@dataclass(frozen=True)
class Output:
    json: bool
    out: Console  # the report
    err: Console  # progress, diagnostics, errors

    def print_json(self, doc: object) -> None:
        sys.stdout.write(json.dumps(doc, indent=2, sort_keys=False, default=str) + "\n")
        sys.stdout.flush()

    def progress(self) -> RichProgress:
        return RichProgress(self.err)

    def error(self, err: ImgbuildError) -> None:
        """uv-style: the message, the chain of facts that leads to it, then the way out."""
        if self.json:
            self.print_json(err.to_dict() | (
                {"log_tail": err.log_tail} if isinstance(err, JobFailed) else {}))
            return
        c = self.err
        if isinstance(err, JobFailed) and err.log_tail:
            c.print("[dim]── log tail ──[/]")
            for line in err.log_tail:
                c.out(f"│ {line}", highlight=False)
        c.print(f"[bold red]error[/]: {escape(err.message)}")
        for i, fact in enumerate(err.facts):
            lead = "  ╰─▶ " if i == len(err.facts) - 1 else "  ├─▶ "
            c.out(lead + fact, highlight=False)
        if err.hint:
            c.print(f"  [bold cyan]help[/]: {escape(err.hint)}")


def make_output(as_json: bool) -> Output:
    return Output(as_json, Console(highlight=False), Console(stderr=True, highlight=False))


class RichProgress:
    """builder.progress.Progress on a terminal's stderr: notes as lines, status as a spinner."""

    def __init__(self, console: Console):
        self.console = console

    def note(self, message: str, *, level: str = "info") -> None:
        style = "bold red" if level == "warn" else None
        self.console.print(escape(message), style=style, highlight=False)

    @contextmanager
    def status(self, message: str) -> Iterator[Callable[[str], None]]:
        with self.console.status(escape(message), spinner="dots") as st:
            yield lambda text: st.update(escape(text))
