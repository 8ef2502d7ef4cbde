"""How a long stage tells a person what it is doing, without knowing where that is shown.

Stages take a Progress and call it; the CLI hands them one that writes to stderr
(cli/console.py: a live display on a terminal, a line every few seconds in a log, one JSON
event per line for dashboards), library callers and tests a Silent one. Nothing here prints.

A pull or a push is a Transfer: the Engine's streamed events (one per layer and state) are fed
to it, and it keeps the totals every display shows: bytes moved of bytes to move, layers done,
layers that were there already (said once, never counted as traffic).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass, field
from typing import Protocol


class Progress(Protocol):
    def note(self, message: str, *, level: str = "info") -> None:
        """A line worth keeping: a step done, a decision made. level: info | warn."""

    def status(self, message: str) -> AbstractContextManager[Callable[..., None]]:
        """A live line while something runs, with the time its text has stood. The function it
        yields, update(text, detail=""), replaces the text (a new phase: the clock restarts) or
        only the detail after it (bytes so far: the clock runs on)."""

    def transfer(self, kind: str, ref: str) -> AbstractContextManager[Transfer]:
        """A pull or push of `ref` ("pull" | "push"): feed it the Engine's events."""


# The Engine's words, by what they mean for the totals.
_EXISTS = {"Already exists", "Layer already exists", "Mounted from"}
_DONE = {"Pull complete", "Pushed"}
_MOVING = {"Downloading", "Pushing"}


@dataclass
class Layer:
    total: int = 0  # bytes to move (pull: compressed; push: the layer as the Engine reads it)
    current: int = 0
    unpacked: int = 0  # pull: bytes of the download unpacked so far
    state: str = "waiting"  # waiting | moving | downloaded | unpacking | exists | done


@dataclass
class Transfer:
    """The totals of one pull or push, from the Engine's events (docker's JSON message
    stream: {"id": layer, "status": ..., "progressDetail": {"current", "total"}})."""

    kind: str
    ref: str
    layers: dict[str, Layer] = field(default_factory=dict)
    started: float = field(default_factory=time.monotonic)
    on_change: Callable[[Transfer, str | None], None] = field(default=lambda _t, _l: None,
                                                              repr=False)

    def feed(self, event: dict) -> None:
        lid, status = event.get("id"), str(event.get("status") or "")
        if not lid or lid == self.ref.rpartition(":")[2] or " " in lid:
            return  # "Pulling from repo", a tag: not a layer
        layer = self.layers.setdefault(lid, Layer())
        detail = event.get("progressDetail") or {}
        said = None
        if status in _EXISTS or status.startswith("Mounted from"):
            if layer.state != "exists":
                layer.state, said = "exists", "exists"
        elif status in _MOVING:
            layer.total = max(layer.total, int(detail.get("total") or 0))
            layer.current = min(int(detail.get("current") or 0), layer.total or 1 << 62)
            if layer.state == "waiting":
                said = "moving"
            layer.state = "moving"
        elif status == "Download complete" and layer.state not in ("exists", "done"):
            layer.current = layer.total
            layer.state = "downloaded"
        elif status == "Extracting" and layer.state not in ("exists", "done"):
            layer.total = layer.total or int(detail.get("total") or 0)
            layer.current = layer.total
            layer.unpacked = int(detail.get("current") or 0)
            layer.state = "unpacking"
        elif status in _DONE and layer.state not in ("exists", "done"):
            layer.current = layer.total
            layer.unpacked = layer.total if self.kind == "pull" else 0
            layer.state, said = "done", "done"
        self.on_change(self, said and f"{lid} {said}")

    @property
    def total_bytes(self) -> int:
        return sum(la.total for la in self.layers.values() if la.state != "exists")

    @property
    def done_bytes(self) -> int:
        return sum(la.current for la in self.layers.values() if la.state != "exists")

    @property
    def unpacked_bytes(self) -> int:
        return sum(la.unpacked for la in self.layers.values() if la.state != "exists")

    @property
    def existing(self) -> int:
        return sum(la.state == "exists" for la in self.layers.values())

    @property
    def finished(self) -> int:
        return sum(la.state == "done" for la in self.layers.values())

    @property
    def elapsed(self) -> float:
        return time.monotonic() - self.started

    @property
    def rate(self) -> float:
        """Bytes per second so far."""
        return self.done_bytes / self.elapsed if self.elapsed > 0.5 else 0.0

    @property
    def eta(self) -> float | None:
        """Seconds left at the rate so far; None until there is a rate and a total."""
        left = self.total_bytes - self.done_bytes
        return left / self.rate if self.rate > 0 and self.total_bytes else None

    def summary(self) -> dict:
        return {"kind": self.kind, "ref": self.ref, "bytes": self.done_bytes,
                "total_bytes": self.total_bytes,
                **({"unpacked_bytes": self.unpacked_bytes} if self.kind == "pull" else {}),
                "layers": len(self.layers),
                "layers_done": self.finished, "layers_existing": self.existing,
                "seconds": round(self.elapsed, 1), "rate_bps": round(self.rate)}


def human_bytes(n: float) -> str:
    for unit in ("B", "kB", "MB", "GB"):
        if abs(n) < 1000 or unit == "GB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1000
    return f"{n:.1f} GB"


def human_seconds(s: float) -> str:
    s = int(s)
    return f"{s // 60}m{s % 60:02d}s" if s >= 60 else f"{s}s"


class Silent:
    """Progress that goes nowhere."""

    def note(self, message: str, *, level: str = "info") -> None:
        pass

    @contextmanager
    def status(self, message: str) -> Iterator[Callable[..., None]]:
        yield lambda _text, _detail="": None

    @contextmanager
    def transfer(self, kind: str, ref: str) -> Iterator[Transfer]:
        yield Transfer(kind, ref)


SILENT = Silent()
