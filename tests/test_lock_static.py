"""The static proof against real indexes: pypiserver on loopback with wheels built here (it
serves no metadata files, so a wheel's METADATA is read by HTTP Range, as uv reads it), and a
plain directory index behind Python's own HTTP server (PEP 658 metadata files, no Range).
The decisions themselves: tests/test_decisions_lock_static.py."""

from __future__ import annotations

import hashlib
import http.server
import threading
from functools import partial
from pathlib import Path

import pytest

from imgbuild.lock import resolve as resolve_mod
from imgbuild.lock import staticproof as sp
from imgbuild.lock.lockfile import LockedPackage, LockRequest
from imgbuild.lock.resolve import OverrideStatus, check_overrides, ensure_lock

from .wheelfactory import LocalIndex, WheelSpec, make_wheel

PLAT = "x86_64-manylinux_2_36"
X86 = WheelSpec("plat", "1.0", requires=("ctensors==0.8.1",),
                tag="py3-none-manylinux_2_17_x86_64")
ARM = WheelSpec("plat", "1.0", requires=("ctensors==0.10.0",),
                tag="py3-none-manylinux_2_17_aarch64")


@pytest.fixture(scope="module")
def index(tmp_path_factory):
    ix = LocalIndex(tmp_path_factory.mktemp("static-index"))
    for v in ("0.8.1", "0.10.0", "0.11.0"):
        ix.add(WheelSpec("ctensors", v))
    for v in ("1.0", "2.0"):
        ix.add(WheelSpec("servo", v))
    ix.add(WheelSpec("eng-a", "1.0", requires=("ctensors==0.8.1",)))
    ix.add(WheelSpec("eng-b", "1.0", requires=("ctensors>=0.10", "servo")))
    ix.add(X86)
    ix.add(ARM)
    ix.start()
    yield ix
    ix.stop()


@pytest.fixture()
def env(index, monkeypatch, tmp_path):
    monkeypatch.setenv("UV_INDEX_URL", index.url)
    monkeypatch.setenv("UV_CACHE_DIR", str(tmp_path / "uv-cache"))
    monkeypatch.setenv("IMGBUILD_CACHE", str(tmp_path / "imgbuild-cache"))
    return index


def locked_pkg(path: Path) -> LockedPackage:
    name, version = path.name.split("-")[:2]
    return LockedPackage(name.replace("_", "-"), version,
                         ("sha256:" + hashlib.sha256(path.read_bytes()).hexdigest(),))


def test_an_override_the_metadata_proves_is_answered_without_uv_and_kept(env, monkeypatch,
                                                                       tmp_path):
    req = LockRequest("t", "3.11", PLAT, ("eng-a==1.0", "eng-b==1.0", "servo"),
                      ("ctensors>=0.10", "servo>=1"))
    lock, _ = ensure_lock(req, tmp_path / "locks")
    assert lock.package("ctensors").version == "0.11.0"
    asked: list[str] = []
    real = resolve_mod._check_one

    def uv_check(without, ov, wheels, locked):
        asked.append(ov)
        return real(without, ov, wheels, locked)

    monkeypatch.setattr(resolve_mod, "_check_one", uv_check)
    want = [OverrideStatus("ctensors>=0.10", True, "without it: eng-a 1.0 requires "
                           "ctensors==0.8.1, the lock has ctensors 0.11.0"),
            OverrideStatus("servo>=1", False, "the resolution is the same without it: "
                           "removable")]
    assert check_overrides(req, None, lock) == want
    assert asked == ["servo>=1"]  # uv only where the proof found nothing
    # Both answers are kept: the next lock reads neither the index's metadata nor uv.
    monkeypatch.setattr(sp, "read_metadata", lambda *a, **k: pytest.fail("read again"))
    assert check_overrides(req, None, lock) == want
    assert asked == ["servo>=1"]


def test_the_wheel_read_is_the_one_for_the_requests_platform(env):
    """Two wheels of plat 1.0 with different requirements: each platform reads its own."""
    files = (locked_pkg(make_wheel(X86, env.root)), locked_pkg(make_wheel(ARM, env.root)))
    pkg = LockedPackage("plat", "1.0", files[0].hashes + files[1].hashes)
    urls = (env.url,)
    assert sp.file_requirements(pkg, python="3.11", uv_platform=PLAT, index_urls=urls,
                                wheels=None) == (("ctensors==0.8.1",),)
    assert sp.file_requirements(pkg, python="3.11", uv_platform="aarch64-manylinux_2_36",
                                index_urls=urls, wheels=None) == (("ctensors==0.10.0",),)
    # Only the files the lock pins: the x86_64 wheel's hash alone leaves aarch64 with none.
    assert sp.file_requirements(files[0], python="3.11", uv_platform="aarch64-manylinux_2_36",
                                index_urls=urls, wheels=None) is None
    # A file the lock pins that the index does not list came from elsewhere: uv may have
    # read that one's metadata.
    elsewhere = LockedPackage("plat", "1.0", pkg.hashes + ("sha256:" + "0" * 64,))
    assert sp.file_requirements(elsewhere, python="3.11", uv_platform=PLAT, index_urls=urls,
                                wheels=None) is None
    # A glibc too old for the wheel, or a project the index does not have: no proof.
    assert sp.file_requirements(pkg, python="3.11", uv_platform="x86_64-manylinux_2_12",
                                index_urls=urls, wheels=None) is None
    assert sp.file_requirements(LockedPackage("absent", "1.0", pkg.hashes), python="3.11",
                                uv_platform=PLAT, index_urls=urls, wheels=None) is None


def test_a_wheel_in_the_find_links_directory_is_read_from_its_zip(tmp_path):
    wheels = tmp_path / "wheels"
    a = locked_pkg(make_wheel(WheelSpec("eng-a", "1.0", requires=("ctensors==0.8.1",)),
                              wheels))
    make_wheel(WheelSpec("eng-a", "2.0", requires=("ctensors==9",)), wheels)  # another version
    assert sp.file_requirements(a, python="3.11", uv_platform=PLAT, index_urls=(),
                                wheels=wheels) == (("ctensors==0.8.1",),)
    # Not there, and no index: nothing known.
    assert sp.file_requirements(a, python="3.11", uv_platform=PLAT, index_urls=(),
                                wheels=tmp_path / "empty") is None


@pytest.fixture()
def plain_index(tmp_path):
    """A PEP 503 directory index served as static files: no JSON, no Range (Python's server
    answers every request whole), metadata files only where a link says so."""
    root = tmp_path / "plain"
    whl = make_wheel(WheelSpec("eng-a", "1.0", requires=("ctensors==0.8.1",)), root / "files")

    def page(with_metadata: bool) -> None:
        d = root / "simple" / "eng-a"
        d.mkdir(parents=True, exist_ok=True)
        meta = ' data-core-metadata="true"' if with_metadata else ""
        sha = hashlib.sha256(whl.read_bytes()).hexdigest()
        (d / "index.html").write_text(
            f'<a href="../../files/{whl.name}#sha256={sha}"{meta}>{whl.name}</a>\n')

    (root / "files" / f"{whl.name}.metadata").write_text(
        "Metadata-Version: 2.1\nName: eng-a\nVersion: 1.0\nRequires-Dist: ctensors==0.8.1\n")
    server = http.server.ThreadingHTTPServer(
        ("127.0.0.1", 0), partial(_Quiet, directory=str(root)))
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_port}/simple/", locked_pkg(whl), page
    server.shutdown()
    server.server_close()


class _Quiet(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args) -> None:
        pass


def test_a_metadata_file_is_read_and_without_one_a_server_that_ignores_range_proves_nothing(
        plain_index, monkeypatch):
    url, pkg, page = plain_index
    # Each case on its own: the pages read are kept for the life of the process.
    monkeypatch.setattr(sp.wh, "_pages", {})
    page(with_metadata=True)
    assert sp.file_requirements(pkg, python="3.11", uv_platform=PLAT, index_urls=(url,),
                                wheels=None) == (("ctensors==0.8.1",),)
    monkeypatch.setattr(sp.wh, "_pages", {})
    page(with_metadata=False)
    # The server answers the Range request with the whole file: that is not read, no proof.
    assert sp.file_requirements(pkg, python="3.11", uv_platform=PLAT, index_urls=(url,),
                                wheels=None) is None


def test_a_wheel_whose_metadata_is_not_in_the_tail_read_is_read_by_more_ranges(env,
                                                                                 monkeypatch):
    """The tail read first cut to 64 bytes: the zip's directory is not all in it, and the
    member is read by Range requests through zipfile (the long way), with the same answer."""
    pkg = locked_pkg(make_wheel(X86, env.root))
    monkeypatch.setattr(sp.wh, "RANGE_TAIL", 64)
    assert sp.file_requirements(pkg, python="3.11", uv_platform=PLAT, index_urls=(env.url,),
                                wheels=None) == (("ctensors==0.8.1",),)


def test_a_requirement_whose_marker_fits_the_target_proves_the_override(env, tmp_path):
    env.add(WheelSpec("eng-m", "1.0",
                      requires=("ctensors==0.8.1; sys_platform == 'linux' and "
                                "platform_machine == 'x86_64'",)))
    req = LockRequest("t", "3.11", PLAT, ("eng-m==1.0",), ("ctensors>=0.10",))
    lock, _ = ensure_lock(req, tmp_path / "locks")
    assert resolve_mod.static_proofs(req, req.overrides, None, lock) == {
        "ctensors>=0.10": "without it: eng-m 1.0 requires ctensors==0.8.1, the lock has "
                          "ctensors 0.11.0"}
    # For an aarch64 image the requirement does not apply: nothing to prove, uv answers.
    arm = LockRequest("t", "3.11", "aarch64-manylinux_2_36", ("eng-m==1.0",),
                      ("ctensors>=0.10",))
    lock, _ = ensure_lock(arm, tmp_path / "locks")
    assert resolve_mod.static_proofs(arm, arm.overrides, None, lock) == {}


def test_a_lock_whose_inputs_match_is_read_back_and_a_torn_one_refused(env, tmp_path):
    from imgbuild.errors import LockError
    req = LockRequest("t", "3.11", PLAT, ("servo",), ())
    lock, written = ensure_lock(req, tmp_path / "locks")
    assert written
    again, written = ensure_lock(req, tmp_path / "locks")
    assert (again, written) == (lock, False)
    path = tmp_path / "locks" / req.filename()
    path.write_text(path.read_text()[:-40])
    with pytest.raises(LockError):
        ensure_lock(req, tmp_path / "locks")
