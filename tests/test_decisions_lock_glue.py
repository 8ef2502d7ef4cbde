"""Two decisions around uv that ran only with the network (lock/freshness.py freshness and
lock/resolve.py lock_many), with uv's answer as the seam: whether a committed lock has drifted
from what resolves now (what gets installed counts, not uv's `# via` notes), and how several
targets are locked side by side (in order, one failure not stopping the others, each said).
And how a locked wheel's shared object is read for its GPU code: spooled to the cache (not
memory), hashed as it is read.

uv itself resolves against a real index in tests/test_lock*.py."""

from __future__ import annotations

import re
import threading
import time
from pathlib import Path

import pytest

from imgbuild.errors import ResolveError
from imgbuild.lock import freshness as fresh_mod
from imgbuild.lock import resolve as resolve_mod

from .conftest import checkout_workspace

LOCK = "lockfiles/tiny-cpu.py3.11-manylinux_2_36-x86_64.txt"


@pytest.fixture(scope="module")
def ref():
    return checkout_workspace().target("tiny-cpu")


def _body(path) -> str:
    from imgbuild.lock.lockfile import read_lock

    return read_lock(path).body


def test_a_lock_that_resolves_the_same_is_fresh_and_via_notes_are_no_drift(ref, monkeypatch):
    body = _body(ref.lock_path)
    asked = []

    def resolve(req, wheels, prefer=None):
        asked.append(prefer)
        return re.sub(r"    # via .*", "    # via something-else", body)
    monkeypatch.setattr(fresh_mod, "resolve", resolve)
    got = fresh_mod.freshness(ref.request, ref.lock_path)
    assert not got.stale
    assert [d for d in got.diff if not d.startswith(("---", "+++"))] == []  # no pin moved
    assert asked == [body]  # uv is asked to keep the committed versions


def test_a_lock_whose_pins_differ_is_stale_with_the_pins_that_moved(ref, monkeypatch):
    body = _body(ref.lock_path)
    moved = body.replace("click==8.5.1", "click==8.5.2", 1)
    monkeypatch.setattr(fresh_mod, "resolve", lambda req, wheels, prefer=None: moved)
    got = fresh_mod.freshness(ref.request, ref.lock_path)
    assert got.stale
    assert [d for d in got.diff if not d.startswith(("---", "+++"))] == [
        "-click==8.5.1 \\", "+click==8.5.2 \\"]
    name = ref.lock_path.name
    assert got.diff[:2] == (f"--- {name} (committed)", f"+++ {name} (resolved now)")


def test_a_missing_lock_is_stale_and_uv_prefers_nothing(ref, monkeypatch, tmp_path):
    asked = []
    monkeypatch.setattr(fresh_mod, "resolve", lambda req, wheels, prefer=None: (
        asked.append(prefer), _body(ref.lock_path))[1])
    assert fresh_mod.freshness(ref.request, tmp_path / "none.txt").stale
    assert asked == [None]


def test_a_lock_uv_cannot_keep_is_resolved_again_with_its_conflicts_explained(ref, monkeypatch):
    def resolve(req, wheels, prefer=None):
        raise ResolveError("no solution", facts=["uv's chain"])

    asked = []

    def explained(req, wheels):
        asked.append(wheels)
        raise ResolveError("explained", facts=["every conflict"])
    monkeypatch.setattr(fresh_mod, "resolve", resolve)
    monkeypatch.setattr(fresh_mod, "resolve_explained", explained)
    with pytest.raises(ResolveError) as e:
        fresh_mod.freshness(ref.request, ref.lock_path, Path("/srv/wheels"))
    assert e.value.message == "explained"
    assert asked == [Path("/srv/wheels")]  # the same wheel directory, explained


# --- several targets side by side -------------------------------------------------------------

def test_targets_are_locked_side_by_side_in_order_and_one_failure_stops_none(ref, monkeypatch,
                                                                             tmp_path):
    from dataclasses import replace

    from imgbuild.errors import InputError

    reqs = [replace(ref.request, target=n) for n in ("a", "b", "c")]
    threads, notes = set(), []
    barrier = threading.Barrier(3, timeout=10)  # all three at once, or this times out

    def ensure(r, lock_dir, wheels, refresh=False):
        threads.add(threading.get_ident())
        barrier.wait()
        if r.target == "b":
            raise InputError("b's spec is wrong")
        return type("Lock", (), {"packages": (1, 2, 3)})(), r.target == "a"
    monkeypatch.setattr(resolve_mod, "ensure_lock", ensure)
    got = resolve_mod.lock_many(reqs, tmp_path, jobs=3, note=notes.append)
    assert [(w, type(e).__name__ if e else None) for _, w, e in got] == [
        (True, None), (False, "InputError"), (False, None)]
    assert got[1][0] is None and len(threads) == 3
    # each target with no lock yet is said when it starts; the one written, with its count
    starts = sorted(n for n in notes if n.startswith("locking "))
    assert starts == [f"locking {t} ({ref.request.uv_platform}) with uv ..." for t in "abc"]
    [done] = [n for n in notes if n.startswith("locked ")]
    assert re.fullmatch(rf"locked a \({re.escape(ref.request.uv_platform)}\): 3 packages in "
                        r"\d+\.\d s", done)
    assert float(done.split(" in ")[1][:-2]) < 60  # how long it took, not a clock's reading


def test_a_lock_already_there_is_not_said_to_be_locking_unless_refreshed(ref, monkeypatch,
                                                                         tmp_path):
    (tmp_path / ref.request.filename()).write_text("")
    notes, handed = [], []
    monkeypatch.setattr(resolve_mod, "ensure_lock", lambda r, d, w, refresh=False: (
        handed.append((r, d, w, refresh)) or (type("Lock", (), {"packages": ()})(), False)))
    resolve_mod.lock_many([ref.request], tmp_path, note=notes.append)
    assert notes == [] and handed == [(ref.request, tmp_path, None, False)]
    resolve_mod.lock_many([ref.request], tmp_path, tmp_path / "wheels", refresh=True, jobs=0,
                          note=notes.append)
    assert notes == [f"locking tiny-cpu ({ref.request.uv_platform}) with uv ..."]
    assert handed[-1] == (ref.request, tmp_path, tmp_path / "wheels", True)


@pytest.mark.parametrize("jobs, most", [(None, 4), (0, 1), (1, 1), (2, 2)])
def test_as_many_targets_resolve_at_once_as_jobs_says(ref, monkeypatch, tmp_path, jobs, most):
    # Each resolution waits until as many run as are allowed (or 5 s): more at once than
    # `most` is too many threads, fewer would wait out the 5 s and still be seen.
    from dataclasses import replace

    reqs = [replace(ref.request, target=f"t{i}") for i in range(6)]
    guard, seen, enough = threading.Lock(), {"now": 0, "most": 0}, threading.Event()

    def ensure(r, lock_dir, wheels, refresh=False):
        with guard:
            seen["now"] += 1
            seen["most"] = max(seen["most"], seen["now"])
            if seen["now"] >= most:
                enough.set()
        enough.wait(5)
        time.sleep(0.05)  # long enough for one more, were there a thread for it
        with guard:
            seen["now"] -= 1
        return type("Lock", (), {"packages": ()})(), False
    monkeypatch.setattr(resolve_mod, "ensure_lock", ensure)
    resolve_mod.lock_many(reqs, tmp_path, **({} if jobs is None else {"jobs": jobs}))
    assert seen["most"] == most


# --- reading a wheel's GPU code: spooled to disk, hashed as read ------------------------------

def test_a_shared_object_is_spooled_to_the_cache_hashed_and_scanned(tmp_path, monkeypatch):
    import hashlib
    import io
    import zipfile

    from imgbuild.lock import kernels
    from imgbuild.lock.wheels import Wheel

    monkeypatch.setenv("IMGBUILD_CACHE", str(tmp_path / "cache"))
    data = b"\x7fELF not really" + bytes(range(256)) * 40
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as z:
        z.writestr("pkg/_k.so", data)
    w = Wheel("pkg", "1.0", "pkg-1.0-cp311-cp311-linux_x86_64.whl", None, "cache", 0, None,
              zipfile.ZipFile(io.BytesIO(buf.getvalue())))
    seen = []
    monkeypatch.setattr(kernels, "codes_in", lambda path: seen.append(
        (path.parent, path.read_bytes())) or {"code"})
    codes, sha = kernels._scan_member(w, "pkg/_k.so")
    assert codes == {"code"} and sha == hashlib.sha256(data).hexdigest()
    [(where, spooled)] = seen
    assert where == tmp_path / "cache" / "tmp" and spooled == data
    assert list(where.iterdir()) == []  # the spool is removed once scanned


def test_the_spool_is_the_cache_unless_it_is_short_of_space_or_cannot_be_made(tmp_path,
                                                                             monkeypatch):
    from collections import namedtuple

    from imgbuild.lock import kernels

    monkeypatch.setenv("IMGBUILD_CACHE", str(tmp_path / "cache"))
    usage = namedtuple("usage", "total used free")
    monkeypatch.setattr(kernels.shutil, "disk_usage", lambda d: usage(0, 0, 5 << 30))
    assert kernels._spool_dir() == str(tmp_path / "cache" / "tmp")
    monkeypatch.setattr(kernels.shutil, "disk_usage", lambda d: usage(0, 0, 4 << 30))
    assert kernels._spool_dir() is None  # the system's temp instead
    (tmp_path / "file").write_text("")
    monkeypatch.setenv("IMGBUILD_CACHE", str(tmp_path / "file" / "cache"))
    assert kernels._spool_dir() is None
