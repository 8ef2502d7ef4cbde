"""Which processes `imgbuild` ends when it is stopped (cli/main.py _children, _end_children),
on real processes read from /proc: its own children (uv, the docker client) are ended; a
clean-up command (`docker rm -f`, marked in its environment) is spared, so that a served
container is still removed; a grandchild is its parent's business."""

from __future__ import annotations

import importlib
import os
import subprocess
import sys
import time
from types import SimpleNamespace

import pytest

main_mod = importlib.import_module("imgbuild.cli.main")

# Another program than this interpreter: a child still running this program is one between
# fork and exec, which _children leaves for the next sweep.
SLEEP = ["sleep", "30"]


@pytest.fixture()
def started():
    procs: list[subprocess.Popen] = []

    def start(cmd, **kw) -> subprocess.Popen:
        p = subprocess.Popen(cmd, **kw)
        procs.append(p)
        return p
    yield start
    for p in procs:
        p.kill()
        p.wait()


def _settled(pids: set[int]) -> list[int]:
    """_children once every child has finished exec (an empty environment is read again)."""
    for _ in range(100):
        got = main_mod._children()
        if pids <= set(got) or not pids:
            return got
        time.sleep(0.02)
    return main_mod._children()


def test_a_child_is_found_and_a_clean_up_command_is_spared(started):
    work = started(SLEEP)
    cleanup = started(SLEEP, env={**os.environ, "IMGBUILD_CLEANUP": "1"})
    # one still running this program: as if between fork and exec, left for the next sweep
    forked = started([sys.executable, "-c", "import time; time.sleep(30)"])
    got = _settled({work.pid})
    assert work.pid in got and cleanup.pid not in got and forked.pid not in got


def test_a_child_whose_name_holds_a_parenthesis_is_found(started, tmp_path):
    """/proc/PID/stat gives the name in parentheses, as the program named itself: a name with
    ") 1 2" in it must not be read as the fields after it."""
    import shutil

    odd = tmp_path / "x) 1 2"
    shutil.copy(shutil.which("sleep"), odd)
    work = started([str(odd), "30"])
    assert work.pid in _settled({work.pid})


def test_a_grandchild_is_not_this_processs_to_end(started):
    parent = started(["sh", "-c", "sleep 30 & echo $!; wait"], stdout=subprocess.PIPE,
                     text=True)
    grandchild = int(parent.stdout.readline())
    try:
        got = _settled({parent.pid})
        assert parent.pid in got and grandchild not in got
    finally:
        os.kill(grandchild, 9)


class _Stop(Exception):
    pass


def test_the_sweep_ends_the_children_it_finds(started, monkeypatch):
    """One round of the sweep, run here: left running, it would end every later child of the
    test process. It is shown only this test's child: the test process may hold others (an
    Engine a docker test started, under xdist), which are not this test's to end."""
    work = started(SLEEP)
    assert work.pid in _settled({work.pid})
    monkeypatch.setattr(main_mod, "_children", lambda: [work.pid])
    threads = []
    # main's own names for the modules, not the modules: the test process keeps its threads
    # and its sleep
    monkeypatch.setattr(main_mod, "threading", SimpleNamespace(
        Thread=lambda target, name, daemon: threads.append((target, name, daemon))
        or SimpleNamespace(start=lambda: None)))

    def one_round(s):
        # soon again: a child started meanwhile (uv, between two tries) lives no longer
        assert isinstance(s, float) and 0 < s <= 0.1
        raise _Stop
    monkeypatch.setattr(main_mod, "time", SimpleNamespace(sleep=one_round))
    main_mod._end_children()
    [(sweep, name, daemon)] = threads
    assert daemon is True  # it must not keep imgbuild from exiting
    with pytest.raises(_Stop):
        sweep()
    assert work.wait(timeout=10) == -15  # SIGTERM, which the docker client passes on
