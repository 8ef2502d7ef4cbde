"""Lockfiles: resolved by uv for the target platform, verified on read, written atomically."""

from __future__ import annotations

import json
import re
import shutil

import pytest

from imgbuild.errors import LockError, ResolveError
from imgbuild.lock.lockfile import LockRequest, read_lock, write_lock
from imgbuild.lock.resolve import ensure_lock

from .conftest import ROOT, run_imgbuild

TINY_LOCK = next((ROOT / "lockfiles").glob("tiny-cpu.*.txt"))


def test_committed_locks_verify_and_pin_with_hashes(ws):
    cat = ws.catalog
    for name in cat.targets:
        lock = ws.target(name).lock()
        assert lock.path == ROOT / "lockfiles" / ws.target(name).request.filename()
        assert lock.target == name
        eng = lock.package(cat.target(name).engine)
        assert eng is not None and eng.version == cat.target(name).engine_version
        assert all(p.hashes for p in lock.packages)


def test_tiny_cpu_lock_takes_the_cpu_torch():
    lock = read_lock(TINY_LOCK)
    assert lock.package("torch").version == "2.13.0+cpu"
    assert not [p for p in lock.packages if p.name.startswith("nvidia-")]


def test_hand_edited_lock_is_refused(tmp_path):
    bad = tmp_path / TINY_LOCK.name
    bad.write_text(TINY_LOCK.read_text().replace("torch==2.13.0+cpu", "torch==2.14.0", 1))
    with pytest.raises(LockError) as e:
        read_lock(bad)
    assert "changed after it was generated" in e.value.message
    assert "imgbuild lock tiny-cpu" in e.value.hint


def test_truncated_or_hashless_lock_is_refused(tmp_path):
    req = LockRequest("t", "3.11", "x86_64-manylinux_2_36", ("six",))
    with pytest.raises(LockError, match="has no --hash"):
        write_lock(tmp_path / "t.txt", req, "six==1.17.0\n", "uv test")
    assert not (tmp_path / "t.txt").exists()
    text = TINY_LOCK.read_text()
    cut = tmp_path / TINY_LOCK.name
    cut.write_text(text[: len(text) // 2])
    with pytest.raises(LockError):
        read_lock(cut)


def test_cli_refuses_corrupted_lock_with_exit_2(images_copy):
    lock = images_copy.parent / "lockfiles" / TINY_LOCK.name
    lock.write_text(lock.read_text().replace("\n# body: sha256:", "\n# body: sha256:00", 1))
    r = run_imgbuild("plan", "tiny-cpu", "--images", str(images_copy))
    assert r.returncode == 2, r.stderr
    assert "changed after it was generated" in r.stderr
    assert "Traceback" not in r.stderr


@pytest.mark.live
def test_lock_reused_when_inputs_match_and_rewritten_when_they_change(tmp_path):
    req = LockRequest("t", "3.11", "x86_64-manylinux_2_36", ("six==1.17.0",))
    lock, written = ensure_lock(req, tmp_path)
    assert written and lock.package("six").version == "1.17.0"
    mtime = lock.path.stat().st_mtime_ns
    again, written = ensure_lock(req, tmp_path)
    assert not written and again.path.stat().st_mtime_ns == mtime
    req2 = LockRequest("t", "3.11", "x86_64-manylinux_2_36", ("six==1.16.0",))
    changed, written = ensure_lock(req2, tmp_path)
    assert written and changed.package("six").version == "1.16.0"
    assert [p.name for p in tmp_path.iterdir()] == [req.filename()]  # no temp files left


@pytest.mark.live
def test_failed_resolution_keeps_the_old_lock(tmp_path):
    req = LockRequest("t", "3.11", "x86_64-manylinux_2_36", ("six==1.17.0",))
    lock, _ = ensure_lock(req, tmp_path)
    before = lock.path.read_bytes()
    bad = LockRequest("t", "3.11", "x86_64-manylinux_2_36", ("six==999.0",))
    with pytest.raises(ResolveError) as e:
        ensure_lock(bad, tmp_path)
    assert any("six" in f for f in e.value.facts)
    assert lock.path.read_bytes() == before
    assert [p.name for p in tmp_path.iterdir()] == [req.filename()]


@pytest.mark.live
def test_plan_resolves_for_the_target_platform_not_the_host(images_copy):
    """sglang-hopper --model k2.6: a complete Plan from a real lock of PyPI metadata for
    Python 3.12 on manylinux_2_39 (the host is Python 3.11 on glibc 2.36), with the kernel
    coverage record read from the locked wheels."""
    lockdir = images_copy.parent / "lockfiles"
    shutil.rmtree(lockdir)
    r = run_imgbuild("plan", "sglang-hopper", "--model", "k2.6", "--json",
                     "--images", str(images_copy))
    assert r.returncode == 0, r.stderr
    plan = json.loads(r.stdout)
    assert plan["python"] == "3.12" and plan["platform_tag"] == "manylinux_2_39_x86_64"
    assert plan["cuda"] == "13.0" and plan["archs"] == ["sm90"]
    assert plan["model"] == "k2.6" and plan["tensor_parallel"] == 8
    assert re.fullmatch(r"sha256:[0-9a-f]{64}", plan["content_key"])
    assert plan["content_tag"].startswith("sglang-hopper-k2.6-")
    assert plan["kernel_coverage"]["sm90"]["torch"] == "sass"
    assert (lockdir / "sglang-hopper.py3.12-manylinux_2_39-x86_64.kernels.json").is_file()
    lock = read_lock(lockdir / "sglang-hopper.py3.12-manylinux_2_39-x86_64.txt")
    assert plan["lock_hash"] == lock.digest
    assert lock.package("sglang").version == "0.5.23"
    assert lock.package("torch").version == "2.14.1"  # sglang 0.5.23 pins it
    assert lock.package("compressed-tensors").version == "0.18.0"
    header = lock.path.read_text().splitlines()[:6]
    assert "# platform: x86_64-manylinux_2_39" in header and "# python: 3.12" in header
