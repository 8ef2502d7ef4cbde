"""The one place that makes consoles, and the stream rule every command follows:

- the report goes to stdout (a table for people; with --json, JSON and nothing else);
- progress, diagnostics and errors for people go to stderr;
- with --json an error is a JSON document on stdout, so `--json | jq` always reads JSON.
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass

from rich.console import Console, ConsoleOptions, RenderResult
from rich.markup import escape
from rich.measure import Measurement
from rich.progress import (
    BarColumn,
    DownloadColumn,
    ProgressColumn,
    Task,
    TimeRemainingColumn,
    TransferSpeedColumn,
)
from rich.progress import Progress as Bars
from rich.table import Column
from rich.text import Text

from ..errors import ImgbuildError, JobFailed
from ..progress import SILENT, Progress, Transfer, human_bytes, human_seconds

PROGRESS_MODES = ("auto", "tty", "plain", "json")


@dataclass(frozen=True)
class Output:
    json: bool
    out: Console  # the report
    err: Console  # progress, diagnostics, errors
    progress_mode: str = "auto"  # auto | tty | plain | json (--progress)

    def print_json(self, doc: object) -> None:
        sys.stdout.write(json.dumps(doc, indent=2, sort_keys=False, default=str) + "\n")
        sys.stdout.flush()

    def progress(self) -> Progress:
        """auto: a live display on a terminal, plain lines elsewhere, nothing beside --json
        (unless --progress asks: `--json --progress json` is a report on stdout and events on
        stderr)."""
        mode = self.progress_mode
        if mode == "auto":
            if self.json:
                return SILENT
            mode = "tty" if self.err.is_terminal else "plain"
        if mode == "json":
            return JsonProgress(sys.stderr)
        return RichProgress(self.err) if mode == "tty" else PlainProgress(self.err)

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


def make_output(as_json: bool, progress_mode: str = "auto") -> Output:
    out, err = Console(highlight=False), Console(stderr=True, highlight=False)
    for c in (out, err):
        # In a log or a pipe a line is not folded at 80 columns: a path or a message that
        # someone greps for stays on one line.
        c.soft_wrap = not c.is_terminal
    return Output(as_json, out, err, progress_mode)


class _Elapsed:
    """A status text that shows how long it has stood, re-rendered with every refresh."""

    def __init__(self, text: str):
        self.text, self.detail, self.since = text, "", time.monotonic()

    def set(self, text: str, detail: str) -> None:
        if text != self.text:
            self.text, self.since = text, time.monotonic()
        self.detail = detail

    def __rich__(self) -> str:
        took = human_seconds(time.monotonic() - self.since)
        detail = f"; {escape(self.detail)}" if self.detail else ""
        return f"{escape(self.text)} [dim]({took}{detail})[/]"


def middle_cut(text: str, width: int) -> str:
    """`text` in at most `width` columns, cut in its middle: a reference keeps its registry's
    start and, longer, its tag's end (where a content tag's hash is)."""
    if len(text) <= width:
        return text
    if width <= 1:
        return "…"[:width]
    head = (width - 1) // 3
    return text[:head] + "…" + text[len(text) - (width - 1 - head):]


MIN_REF = 16  # below this a reference says too little; the "there already" count goes first


def fit_transfer(kind: str, ref: str, counts: tuple[str, ...], width: int) -> str:
    """A transfer's line in `width` columns: `kind ref (counts)`, the reference cut in its
    middle to fit; where it would fall under MIN_REF, the last counts are left out first."""
    keep = len(counts)
    while True:
        said = f" ({', '.join(counts[:keep])})" if keep else ""
        room = width - len(kind) - 1 - len(said)
        if room >= min(MIN_REF, len(ref)) or keep == 0:
            return (f"{kind} {middle_cut(ref, max(room, 1))}{said}")[:width]
        keep -= 1


@dataclass(frozen=True)
class _TransferLine:
    """The text of a transfer's bar, fitted to the width its column is given when drawn."""

    kind: str
    ref: str
    counts: tuple[str, ...]

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        yield Text(fit_transfer(self.kind, self.ref, self.counts, options.max_width),
                   no_wrap=True, overflow="crop")

    def __rich_measure__(self, console: Console, options: ConsoleOptions) -> Measurement:
        whole = len(fit_transfer(self.kind, self.ref, self.counts, 10**6))
        return Measurement(min(whole, len(self.kind) + 2), whole)


class _LineColumn(ProgressColumn):
    """A task's text, never read as markup (a reference may hold brackets): its fitted line
    when it has one (task field `line`), else its description."""

    def render(self, task: Task) -> Text | _TransferLine:
        line = task.fields.get("line")
        return line if line is not None else Text(task.description, no_wrap=True,
                                                  overflow="ellipsis")


class RichProgress:
    """Progress on a terminal's stderr: notes as lines, a status as a spinner with the time it
    has run, a pull or push as bars (bytes, rate, time left; unpacking after download).

    The bars take the terminal's width, and the figures (bytes done of total, rate, time
    left) keep theirs whole: the text and the bar share what is left, three parts to one, and
    the reference is cut in its middle to fit (fit_transfer)."""

    def __init__(self, console: Console, *, clock: Callable[[], float] | None = None):
        self.console = console
        self.clock = clock  # the bars' clock (rates, time left); None: rich's monotonic
        self.bars: Bars | None = None  # the bars on the screen while a transfer runs

    def note(self, message: str, *, level: str = "info") -> None:
        style = "bold red" if level == "warn" else None
        self.console.print(escape(message), style=style, highlight=False)

    @contextmanager
    def status(self, message: str) -> Iterator[Callable[..., None]]:
        shown = _Elapsed(message)
        with self.console.status(shown, spinner="dots") as st:
            def update(text: str, detail: str = "") -> None:
                shown.set(text, detail)
                st.update(shown)
            yield update

    @contextmanager
    def transfer(self, kind: str, ref: str) -> Iterator[Transfer]:
        # Only the text and the bar take part in the width (ratio columns of an expanded
        # table); the figures are measured and kept whole.
        bars = Bars(_LineColumn(table_column=Column(ratio=3, no_wrap=True)),
                        BarColumn(bar_width=None, table_column=Column(ratio=1)),
                        DownloadColumn(), TransferSpeedColumn(), TimeRemainingColumn(),
                        console=self.console, transient=True, expand=True,
                        get_time=self.clock)
        moving = bars.add_task(f"{kind} {ref}", total=None, line=_TransferLine(kind, ref, ()))
        unpack = bars.add_task("unpacking", total=None, visible=False)

        def changed(t: Transfer, _said: str | None) -> None:
            counts = (f"{t.finished}/{len(t.layers) - t.existing} layers",) + (
                (f"{t.existing} there already",) if t.existing else ())
            bars.update(moving, completed=t.done_bytes, total=t.total_bytes or None,
                        description=f"{kind} {ref} ({', '.join(counts)})",
                        line=_TransferLine(kind, ref, counts))
            if kind == "pull" and t.unpacked_bytes:
                bars.update(unpack, completed=t.unpacked_bytes, total=t.total_bytes or None,
                            visible=True)

        t = Transfer(kind, ref, on_change=changed)
        self.bars = bars
        try:
            with bars:
                yield t
        finally:
            self.bars = None
        self.console.print(escape(_done(kind, ref, t)), highlight=False)  # what stays


class PlainProgress:
    """Progress for a log (CI, a file, a pipe): lines only. A status is said when it starts
    and, while it runs, at most every INTERVAL seconds; a transfer's totals likewise."""

    INTERVAL = 5.0

    def __init__(self, console: Console):
        self.console = console

    def _line(self, text: str) -> None:
        self.console.out(text, highlight=False)

    def note(self, message: str, *, level: str = "info") -> None:
        self._line(("warning: " if level == "warn" else "") + message)

    @contextmanager
    def status(self, message: str) -> Iterator[Callable[..., None]]:
        self._line(f"{message} ...")
        shown = _Elapsed(message)
        last = time.monotonic()

        def update(text: str, detail: str = "") -> None:
            nonlocal last
            now = time.monotonic()
            new = text != shown.text
            shown.set(text, detail)
            if new or now - last >= self.INTERVAL:
                last = now
                took = human_seconds(now - shown.since)
                self._line(f"{text} ({took}{'; ' + detail if detail else ''})" if not new
                           else text)
        yield update

    @contextmanager
    def transfer(self, kind: str, ref: str) -> Iterator[Transfer]:
        last = time.monotonic()
        said_existing = False

        def changed(t: Transfer, said: str | None) -> None:
            nonlocal last, said_existing
            if said and not said.endswith("exists") and t.existing and not said_existing:
                said_existing = True  # once, when the first layer moves
                self._line(f"{kind} {ref}: {t.existing} layer(s) already there, not sent again"
                           if kind == "push" else
                           f"{kind} {ref}: {t.existing} layer(s) already here, not fetched")
            now = time.monotonic()
            if now - last >= self.INTERVAL and t.total_bytes:
                last = now
                self._line(_totals(kind, ref, t))

        t = Transfer(kind, ref, on_change=changed)
        self._line(f"{kind} {ref} ...")
        yield t
        self._line(_done(kind, ref, t))


class JsonProgress:
    """Progress for dashboards: one JSON object per line on stderr (stdout keeps the report).
    Events: note, status, layer (a layer's state changed), transfer (totals, at most every
    INTERVAL seconds), transfer-done."""

    INTERVAL = 1.0

    def __init__(self, stream):
        self.stream = stream

    def _emit(self, event: str, **fields) -> None:
        self.stream.write(json.dumps({"event": event, "time": round(time.time(), 3)}
                                     | fields) + "\n")
        self.stream.flush()

    def note(self, message: str, *, level: str = "info") -> None:
        self._emit("note", message=message, level=level)

    @contextmanager
    def status(self, message: str) -> Iterator[Callable[..., None]]:
        self._emit("status", message=message, state="started")
        start = last = time.monotonic()
        shown = _Elapsed(message)

        def update(text: str, detail: str = "") -> None:
            nonlocal last
            new = text != shown.text
            shown.set(text, detail)
            if new or time.monotonic() - last >= self.INTERVAL:
                last = time.monotonic()
                self._emit("status", message=text, state="running", detail=detail,
                           seconds=round(last - shown.since, 1))
        try:
            yield update
        finally:
            self._emit("status", message=message, state="ended",
                       seconds=round(time.monotonic() - start, 1))

    @contextmanager
    def transfer(self, kind: str, ref: str) -> Iterator[Transfer]:
        last = time.monotonic()

        def changed(t: Transfer, said: str | None) -> None:
            nonlocal last
            if said:
                lid, state = said.split(" ", 1)
                la = t.layers[lid]
                self._emit("layer", kind=kind, ref=ref, layer=lid, state=state,
                           bytes=la.total if state != "exists" else 0)
            if time.monotonic() - last >= self.INTERVAL:
                last = time.monotonic()
                self._emit("transfer", **t.summary(), eta_s=None if t.eta is None
                           else round(t.eta, 1))

        t = Transfer(kind, ref, on_change=changed)
        yield t
        self._emit("transfer-done", **t.summary())


def _totals(kind: str, ref: str, t: Transfer) -> str:
    pct = 100 * t.done_bytes / t.total_bytes if t.total_bytes else 0
    eta = f", about {human_seconds(t.eta)} left" if t.eta is not None else ""
    unpack = (f"; unpacked {human_bytes(t.unpacked_bytes)}"
              if kind == "pull" and t.unpacked_bytes else "")
    return (f"{kind} {ref}: {human_bytes(t.done_bytes)} of {human_bytes(t.total_bytes)} "
            f"({pct:.0f}%), {human_bytes(t.rate)}/s{eta}; {t.finished} of "
            f"{len(t.layers) - t.existing} layers done{unpack}")


def _done(kind: str, ref: str, t: Transfer) -> str:
    verb = "pulled" if kind == "pull" else "pushed"
    there = f", {t.existing} already there" if t.existing else ""
    return (f"{verb} {ref}: {human_bytes(t.done_bytes)} in {human_seconds(t.elapsed)} "
            f"({human_bytes(t.rate)}/s); {t.finished} layer(s) moved{there}")
