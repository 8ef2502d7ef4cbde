"""How a long stage tells a person what it is doing, without knowing where that is shown.

Stages take a Progress and call it; the CLI hands them one that writes to the terminal's
stderr (cli/console.py), library callers and tests a Silent one. Nothing here prints.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from typing import Protocol


class Progress(Protocol):
    def note(self, message: str, *, level: str = "info") -> None:
        """A line worth keeping: a step done, a decision made. level: info | warn."""

    def status(self, message: str) -> AbstractContextManager[Callable[[str], None]]:
        """A live line while something runs; the function it yields replaces the text."""


class Silent:
    """Progress that goes nowhere."""

    def note(self, message: str, *, level: str = "info") -> None:
        pass

    @contextmanager
    def status(self, message: str) -> Iterator[Callable[[str], None]]:
        yield lambda _text: None


SILENT = Silent()
