"""A Progress (imgbuild/progress.py) that keeps what it is told, for the tests that check what
a step says: each note with its level, and each status line (its opening text and each update).
Transfers are shown nowhere, as by progress.SILENT."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator

from imgbuild.progress import SILENT, Transfer


class Notes:
    def __init__(self) -> None:
        self.notes: list[tuple[str, str]] = []  # (level, message), in the order said
        self.statuses: list[str] = []
        self.details: list[tuple[str, str]] = []  # each status update with its detail, if any

    def note(self, message: str, *, level: str = "info") -> None:
        assert isinstance(message, str), message  # a note is words, never an object
        self.notes.append((level, message))

    @property
    def said(self) -> list[str]:
        """The notes' messages, whatever their level."""
        return [m for _level, m in self.notes]

    def text(self, level: str | None = None) -> str:
        """The notes of `level` (all of them without one), one a line."""
        return "\n".join(m for lv, m in self.notes if level in (None, lv))

    @contextlib.contextmanager
    def status(self, message: str) -> Iterator[Callable[..., None]]:
        self.statuses.append(message)

        def update(text: str, detail: str = "") -> None:
            self.statuses.append(text)
            if detail:
                self.details.append((text, detail))

        yield update

    def transfer(self, kind: str, ref: str) -> contextlib.AbstractContextManager[Transfer]:
        return SILENT.transfer(kind, ref)
