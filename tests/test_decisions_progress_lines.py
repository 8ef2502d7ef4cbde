"""What progress says in a log and to a dashboard (cli/console.py's PlainProgress and
JsonProgress), line by line, on a clock the test moves: when a status or a transfer's totals
are said again (at most every INTERVAL seconds, at once when the text changes), the words for
layers already there (once, pushed or pulled), and the last line a transfer leaves. The Engine's
event stream is the one tests/test_progress.py records from real pushes and pulls.

Nothing here needs an Engine: a Transfer is fed the events as the Engine sends them."""

from __future__ import annotations

import io
import json
import time
from types import SimpleNamespace

import pytest
from rich.console import Console

from imgbuild import progress as progress_mod
from imgbuild.cli import console as console_mod
from imgbuild.cli.console import JsonProgress, PlainProgress, RichProgress

EPOCH = 1_767_225_600.0  # what time.time() says when the test's clock starts


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def monotonic(self) -> float:
        return self.now

    def time(self) -> float:
        return EPOCH + self.now - 1000.0


@pytest.fixture()
def clock(monkeypatch) -> Clock:
    c = Clock()
    fake = SimpleNamespace(monotonic=c.monotonic, time=c.time)
    monkeypatch.setattr(console_mod, "time", fake)
    monkeypatch.setattr(progress_mod, "time", fake)
    return c


def _plain() -> tuple[PlainProgress, io.StringIO]:
    buf = io.StringIO()
    return PlainProgress(Console(file=buf, width=200, force_terminal=False, _environ={})), buf


def _lines(buf: io.StringIO) -> list[str]:
    return buf.getvalue().splitlines()


# --- a log: plain lines -----------------------------------------------------------------------

def test_a_note_is_one_line_and_a_warning_says_so():
    p, buf = _plain()
    p.note("resolving tiny-cpu")
    p.note("the lock is older than the spec", level="warn")
    assert _lines(buf) == ["resolving tiny-cpu", "warning: the lock is older than the spec"]


def test_a_status_is_said_when_it_starts_when_it_changes_and_every_interval(clock):
    p, buf = _plain()
    with p.status("building tiny-cpu") as update:
        clock.now += 1
        update("building tiny-cpu", "step 3/9")  # same text, too soon: nothing
        clock.now += PlainProgress.INTERVAL - 1
        update("building tiny-cpu", "step 4/9")  # same text, an interval on: said
        clock.now += 1
        update("exporting")  # a new text: said at once, alone
        clock.now += PlainProgress.INTERVAL - 0.5
        update("exporting")  # not yet an interval since the last line
        clock.now += 1
        update("exporting")
    assert _lines(buf) == ["building tiny-cpu ...", "building tiny-cpu (5s; step 4/9)",
                           "exporting", "exporting (5s)"]


def _push(p, clock) -> None:
    """A push: one layer there already, one sent over 10 s, another found there meanwhile."""
    with p.transfer("push", "r/x:1") as t:
        t.started = clock.now
        t.feed({"id": "aaa", "status": "Layer already exists"})
        t.feed({"id": "bbb", "status": "Preparing"})
        clock.now += 2
        t.feed({"id": "bbb", "status": "Pushing", "progressDetail": {"current": 400_000,
                                                                     "total": 1_000_000}})
        clock.now += 4
        t.feed({"id": "bbb", "status": "Pushing", "progressDetail": {"current": 600_000,
                                                                     "total": 1_000_000}})
        t.feed({"id": "ccc", "status": "Layer already exists"})
        clock.now += 4
        t.feed({"id": "bbb", "status": "Pushed"})


def test_a_push_says_the_layers_there_once_its_totals_each_interval_and_how_it_ended(clock):
    p, buf = _plain()
    _push(p, clock)
    assert _lines(buf) == [
        "push r/x:1 ...",
        "push r/x:1: 1 layer(s) already there, not sent again",
        "push r/x:1: 600.0 kB of 1.0 MB (60%), 100.0 kB/s, about 4s left; 0 of 1 layers done",
        "pushed r/x:1: 1.0 MB in 10s (100.0 kB/s); 1 layer(s) moved, 2 already there"]


def test_a_pull_says_the_layers_here_and_what_is_unpacked(clock):
    p, buf = _plain()
    with p.transfer("pull", "r/x:1") as t:
        t.started = clock.now
        t.feed({"id": "aaa", "status": "Already exists"})
        t.feed({"id": "bbb", "status": "Downloading", "progressDetail": {"current": 500_000,
                                                                         "total": 1_000_000}})
        clock.now += 5
        t.feed({"id": "bbb", "status": "Extracting", "progressDetail": {"current": 250_000,
                                                                        "total": 1_000_000}})
        t.feed({"id": "bbb", "status": "Pull complete"})
    assert _lines(buf) == [
        "pull r/x:1 ...",
        "pull r/x:1: 1 layer(s) already here, not fetched",
        # downloaded whole, unpacking: no time left to download
        "pull r/x:1: 1.0 MB of 1.0 MB (100%), 200.0 kB/s, about 0s left; 0 of 1 layers done; "
        "unpacked 250.0 kB",
        "pulled r/x:1: 1.0 MB in 5s (200.0 kB/s); 1 layer(s) moved, 1 already there"]


def test_nothing_there_already_is_not_said_and_no_totals_before_there_are_bytes(clock):
    p, buf = _plain()
    with p.transfer("push", "r/x:1") as t:
        t.started = clock.now
        t.feed({"id": "bbb", "status": "Preparing"})
        clock.now += 6
        t.feed({"id": "bbb", "status": "Waiting"})  # no bytes known yet: no totals line
        t.feed({"id": "bbb", "status": "Pushed"})
    assert _lines(buf) == ["push r/x:1 ...", "pushed r/x:1: 0 B in 6s (0 B/s); 1 layer(s) moved"]


# --- a dashboard: JSON events -----------------------------------------------------------------

def _events(buf: io.StringIO) -> list[dict]:
    return [json.loads(ln) for ln in buf.getvalue().splitlines()]


def test_each_event_is_one_json_object_with_the_wall_clock_time(clock):
    buf = io.StringIO()
    JsonProgress(buf).note("resolving", level="warn")
    JsonProgress(buf).note("resolved")
    assert _events(buf) == [{"event": "note", "time": EPOCH, "message": "resolving",
                             "level": "warn"},
                            {"event": "note", "time": EPOCH, "message": "resolved",
                             "level": "info"}]


def test_a_status_starts_runs_at_most_every_interval_and_ends(clock):
    buf = io.StringIO()
    with JsonProgress(buf).status("building") as update:
        clock.now += 0.5
        update("building", "step 1")  # too soon
        clock.now += JsonProgress.INTERVAL
        update("building", "step 2")
        update("exporting")  # new text: at once
        clock.now += 2
    got = [{k: v for k, v in e.items() if k != "time"} for e in _events(buf)]
    assert got == [
        {"event": "status", "message": "building", "state": "started"},
        {"event": "status", "message": "building", "state": "running", "detail": "step 2",
         "seconds": 1.5},
        {"event": "status", "message": "exporting", "state": "running", "detail": "",
         "seconds": 0.0},
        {"event": "status", "message": "building", "state": "ended", "seconds": 3.5}]


def test_a_status_that_fails_still_ends(clock):
    buf = io.StringIO()
    with pytest.raises(RuntimeError), JsonProgress(buf).status("building"):
        clock.now += 1
        raise RuntimeError("build failed")
    assert _events(buf)[-1]["state"] == "ended" and _events(buf)[-1]["seconds"] == 1.0


def test_a_transfer_says_each_layers_change_its_totals_each_interval_and_its_end(clock):
    buf = io.StringIO()
    _push(JsonProgress(buf), clock)
    got = _events(buf)
    layers = [(e["layer"], e["state"], e["bytes"]) for e in got if e["event"] == "layer"]
    assert layers == [("aaa", "exists", 0), ("bbb", "moving", 1_000_000),
                      ("ccc", "exists", 0), ("bbb", "done", 1_000_000)]
    totals = [e for e in got if e["event"] == "transfer"]
    # one at the first reading an interval on: at 2 s, 6 s and 10 s of the push (the layer
    # there already at 6 s comes in the same second: no second line)
    assert [(e["bytes"], e["eta_s"]) for e in totals] == [
        (400_000, 3.0), (600_000, 4.0), (1_000_000, 0.0)]
    [done] = [e for e in got if e["event"] == "transfer-done"]
    assert {k: done[k] for k in ("kind", "ref", "bytes", "total_bytes", "layers", "layers_done",
                                 "layers_existing", "seconds", "rate_bps")} == {
        "kind": "push", "ref": "r/x:1", "bytes": 1_000_000, "total_bytes": 1_000_000,
        "layers": 3, "layers_done": 1, "layers_existing": 2, "seconds": 10.0,
        "rate_bps": 100_000}
    assert "unpacked_bytes" not in done  # a push unpacks nothing


# --- a terminal -----------------------------------------------------------------------------

def test_a_warning_on_a_terminal_is_bold_red_and_a_note_is_not_markup():
    buf = io.StringIO()
    tty = RichProgress(Console(file=buf, width=100, force_terminal=True,
                               color_system="standard", _environ={}))
    tty.note("[not markup]")
    tty.note("careful", level="warn")
    assert buf.getvalue().splitlines() == ["[not markup]", "\x1b[1;31mcareful\x1b[0m"]


def test_a_terminal_status_shows_its_text_and_how_long_it_has_stood(clock):
    shown = console_mod._Elapsed("building [x]")
    clock.now += 3
    assert shown.__rich__() == r"building \[x] [dim](3s)[/]"
    shown.set("building [x]", "layer [bold]")  # the same text: its time goes on
    clock.now += 1
    assert shown.__rich__() == r"building \[x] [dim](4s; layer \[bold])[/]"
    shown.set("exporting", "")  # a new text: its time starts again
    assert shown.__rich__() == "exporting [dim](0s)[/]"


def test_the_status_spinner_is_updated_with_the_new_text():
    buf = io.StringIO()
    tty = RichProgress(Console(file=buf, width=100, force_terminal=True, record=True,
                               _environ={}))
    with tty.status("building") as update:
        update("exporting", "layer 3")
        time.sleep(0)  # the spinner draws on its own thread; the text is what was set
    assert "exporting" in buf.getvalue()
