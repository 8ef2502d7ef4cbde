"""Decision tests for the small shared modules: fsutil (atomic writes, writable directories, the
error a refused write becomes) and progress (what a pull or push event counts as, the human
figures). Plain data and tmp_path files only."""

from __future__ import annotations

import stat

import pytest

from imgbuild import fsutil
from imgbuild.errors import EnvError
from imgbuild.progress import SILENT, Transfer, human_bytes, human_seconds

# ------------------------------------------------------------------------------------------------
# fsutil
# ------------------------------------------------------------------------------------------------


def test_atomic_write_sets_the_mode_and_leaves_no_temporary(tmp_path):
    target = tmp_path / "sub" / "lock.txt"
    fsutil.atomic_write_text(target, "one")
    assert target.read_text() == "one"
    assert stat.S_IMODE(target.stat().st_mode) == 0o644
    fsutil.atomic_write_text(target, "two", mode=0o600)
    assert target.read_text() == "two" and stat.S_IMODE(target.stat().st_mode) == 0o600
    assert sorted(p.name for p in target.parent.iterdir()) == ["lock.txt"]


def test_atomic_write_that_fails_keeps_the_old_content_and_no_temporary(tmp_path):
    target = tmp_path / "f.txt"
    target.write_text("old")
    with pytest.raises(UnicodeEncodeError):
        fsutil.atomic_write_text(target, "\udcff")  # not encodable: fails inside the write
    assert target.read_text() == "old"
    assert [p.name for p in tmp_path.iterdir()] == ["f.txt"]


def test_check_writable_makes_the_directory_and_leaves_no_probe(tmp_path):
    d = tmp_path / "a" / "b"
    fsutil.check_writable(d, "the log")
    assert d.is_dir() and list(d.iterdir()) == []


def test_a_directory_that_cannot_be_is_an_environment_error(tmp_path):
    (tmp_path / "file").write_text("")
    with pytest.raises(EnvError) as e:
        fsutil.check_writable(tmp_path / "file" / "sub", "the cache")
    assert e.value.exit_code == 3
    assert e.value.message.startswith(f"cannot write the cache {tmp_path / 'file' / 'sub'}: ")
    assert e.value.facts == [f"{tmp_path / 'file' / 'sub'} is as it was before this command"]


def test_cannot_write_says_a_scratch_directory_is_gone(tmp_path):
    err = fsutil.cannot_write(tmp_path, OSError(28, "No space left on device"), "scratch",
                              scratch=True)
    assert err.facts == [f"{tmp_path} is removed"]
    assert "No space left on device" in err.message
    assert "OSError" not in err.message
    bare = fsutil.cannot_write(tmp_path, OSError("odd"), "x")
    assert bare.message.endswith(": odd")


# ------------------------------------------------------------------------------------------------
# progress
# ------------------------------------------------------------------------------------------------


def _feed(t: Transfer, lid: str, status: str, current: int = 0, total: int = 0) -> None:
    t.feed({"id": lid, "status": status, "progressDetail": {"current": current, "total": total}})


def test_push_events_count_mounted_and_existing_layers_apart():
    said = []
    t = Transfer("push", "r/x:1", on_change=lambda _t, s: said.append(s))
    _feed(t, "1", "Preparing")  # the tag "1": not a layer
    _feed(t, "a", "Pushing", 30, 100)
    _feed(t, "b", "Mounted from other/repo")
    _feed(t, "c", "Layer already exists")
    _feed(t, "c", "Layer already exists")  # said once
    _feed(t, "a", "Pushed")
    _feed(t, "c", "Pushed")  # an existing layer stays existing
    assert (t.existing, t.finished, t.total_bytes, t.done_bytes) == (2, 1, 100, 100)
    assert "1" not in t.layers
    assert t.unpacked_bytes == 0  # a push unpacks nothing
    assert [s for s in said if s] == ["a moving", "b exists", "c exists", "a done"]
    assert "unpacked_bytes" not in t.summary() and t.summary()["layers_existing"] == 2


def test_a_layer_event_cannot_move_more_than_its_total_or_undo_done():
    t = Transfer("pull", "r/x:1")
    _feed(t, "a", "Downloading", 500, 100)
    assert t.done_bytes == 100
    _feed(t, "a", "Pull complete")
    _feed(t, "a", "Download complete")
    _feed(t, "a", "Extracting", 1, 100)
    assert t.layers["a"].state == "done" and t.unpacked_bytes == 100
    # a status with a space in its id is a message, not a layer
    t.feed({"id": "Digest: sha256", "status": "x"})
    assert list(t.layers) == ["a"]


def test_eta_needs_a_rate_and_a_total():
    t = Transfer("pull", "r/x:1")
    assert t.eta is None and t.rate == 0.0
    t.started -= 10
    _feed(t, "a", "Downloading", 50, 100)
    assert t.rate == pytest.approx(5, rel=0.1) and t.eta == pytest.approx(10, rel=0.1)
    unknown = Transfer("pull", "r/x:1")
    unknown.started -= 10
    _feed(unknown, "a", "Downloading", 50, 0)  # no total said yet
    assert unknown.rate > 0 and unknown.eta is None


@pytest.mark.parametrize(("n", "text"), [
    (0, "0 B"), (999, "999 B"), (1000, "1.0 kB"), (1_500_000, "1.5 MB"), (2e9, "2.0 GB"),
    (3e12, "3000.0 GB")])
def test_human_bytes(n, text):
    assert human_bytes(n) == text


@pytest.mark.parametrize(("s", "text"), [(0, "0s"), (59.9, "59s"), (60, "1m00s"), (605, "10m05s")])
def test_human_seconds(s, text):
    assert human_seconds(s) == text


def test_silent_progress_still_counts():
    with SILENT.transfer("pull", "r/x:1") as t:
        _feed(t, "a", "Downloading", 1, 2)
    assert t.done_bytes == 1
    with SILENT.status("x") as update:
        update("y")
    SILENT.note("z")
