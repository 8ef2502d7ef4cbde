"""The override checks of `imgbuild lock`: answered once per set of inputs, kept in imgbuild's
cache, side by side and in order. uv runs for real against a local index (pypiserver on
loopback with wheels built here); a shim in front of it counts its resolutions."""

from __future__ import annotations

import dataclasses
import os
import stat
import sys
from pathlib import Path

import pytest

from imgbuild.errors import EnvError
from imgbuild.lock import checkcache
from imgbuild.lock import resolve as resolve_mod
from imgbuild.lock.checkcache import CheckInputs, check_key
from imgbuild.lock.lockfile import LockRequest
from imgbuild.lock.resolve import OverrideStatus, check_overrides, ensure_lock
from imgbuild.lock.uv import uv_bin

from .wheelfactory import LocalIndex, WheelSpec, free_port, make_wheel

PLAT = "x86_64-manylinux_2_36"
# Three overrides, three kinds of answer: needed (no resolution without it), removable, and
# needed because it holds a version back.
OVERRIDES = ("ctensors>=0.10", "servo>=1", "numbra==1.0")
EXPECTED = [
    OverrideStatus("ctensors>=0.10", True, "without it there is no resolution "
                   "(eng-b==1.0 requires ctensors>=0.10; eng-a==1.0 requires ctensors==0.8.1)"),
    OverrideStatus("servo>=1", False, "the resolution is the same without it: removable"),
    OverrideStatus("numbra==1.0", True, "without it: numbra 1.0 → 1.1"),
]


@pytest.fixture(scope="module")
def index(tmp_path_factory):
    ix = LocalIndex(tmp_path_factory.mktemp("checks-index"))
    for v in ("0.8.1", "0.10.0", "0.11.0"):
        ix.add(WheelSpec("ctensors", v))
    for v in ("1.0", "2.0"):
        ix.add(WheelSpec("servo", v))
    for v in ("1.0", "1.1"):
        ix.add(WheelSpec("numbra", v))
    ix.add(WheelSpec("eng-a", "1.0", requires=("ctensors==0.8.1",)))
    ix.add(WheelSpec("eng-b", "1.0", requires=("ctensors>=0.10", "servo", "numbra")))
    ix.start()
    yield ix
    ix.stop()


@pytest.fixture(scope="module")
def uv_cache(tmp_path_factory) -> Path:
    """uv's cache, shared by the module: no input of a check, and uv reads the index anew."""
    return tmp_path_factory.mktemp("uv-cache")


@dataclasses.dataclass
class Env:
    index: LocalIndex
    tmp: Path
    log: Path

    def resolutions(self) -> int:
        """How many `uv pip compile` ran since the test began."""
        if not self.log.exists():
            return 0
        return sum(1 for ln in self.log.read_text().splitlines() if ln.startswith("pip compile"))

    def cached(self) -> list[Path]:
        d = checkcache.cache_dir()
        return sorted(d.glob("*.json")) if d.is_dir() else []


@pytest.fixture()
def env(index, uv_cache, monkeypatch, tmp_path) -> Env:
    """A local index as the default, a fresh uv cache and imgbuild cache, no uv.toml of the
    machine's, and uv behind a shim that writes each command line to a log."""
    monkeypatch.setenv("UV_INDEX_URL", index.url)
    monkeypatch.setenv("UV_CACHE_DIR", str(uv_cache))
    monkeypatch.setenv("IMGBUILD_CACHE", str(tmp_path / "imgbuild-cache"))
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))
    for k in [k for k in os.environ if k.startswith("UV_") and k not in
              ("UV_INDEX_URL", "UV_CACHE_DIR", "UV_PYTHON_DOWNLOADS")]:
        monkeypatch.delenv(k)
    log = tmp_path / "uv-calls.log"
    shim = tmp_path / "uv-shim"
    shim.write_text(f'#!/bin/sh\necho "$*" >> "{log}"\nexec "{uv_bin()}" "$@"\n')
    shim.chmod(shim.stat().st_mode | stat.S_IEXEC)
    # Only the resolver's own binary is swapped: uv itself answers every question.
    monkeypatch.setattr(resolve_mod, "uv_bin", lambda: str(shim))
    # These are uv's answers and their cache: the static proof, which would answer the first
    # override from eng-a's metadata, is tested on its own (tests/test_lock_static.py).
    monkeypatch.setattr(resolve_mod, "static_proofs", lambda *a: {})
    return Env(index, tmp_path, log)


def request(requirements: tuple[str, ...] = ("eng-a==1.0", "eng-b==1.0"),
            overrides: tuple[str, ...] = OVERRIDES) -> LockRequest:
    return LockRequest("t", "3.11", PLAT, requirements, overrides)


def locked(env: Env, req: LockRequest, name: str = "locks"):
    lock, _ = ensure_lock(req, env.tmp / name)
    return lock


def test_a_second_check_answers_from_the_cache_without_uv(env):
    req = request()
    lock = locked(env, req)
    before = env.resolutions()
    first = check_overrides(req, None, lock)
    assert first == EXPECTED
    assert env.resolutions() - before == len(OVERRIDES)
    assert len(env.cached()) == len(OVERRIDES)
    again = check_overrides(req, None, lock)
    assert again == first  # the same statuses, in the same order
    assert env.resolutions() - before == len(OVERRIDES), "a hit ran uv"


def test_checks_side_by_side_answer_as_one_after_another(env):
    req = request()
    lock = locked(env, req)
    one_by_one = check_overrides(req, None, lock, jobs=1, use_cache=False)
    side_by_side = check_overrides(req, None, lock, jobs=3, use_cache=False)
    assert one_by_one == side_by_side == EXPECTED  # the request's order, not finishing order
    assert env.resolutions() == 1 + 2 * len(OVERRIDES)


def _change(name: str, env: Env, monkeypatch, req: LockRequest, wheels: Path, lock):
    """One input changed for real: what check_overrides is then called with."""
    if name == "platform":  # (not the Python version: uv looks for a 3.12 for seconds)
        return dataclasses.replace(req, uv_platform="x86_64-manylinux_2_28"), wheels, lock
    if name == "requirement":
        return request(requirements=("eng-a==1.0", "eng-b==1.0", "servo<3")), wheels, lock
    if name == "exclude_newer":  # the same answers, from another input
        monkeypatch.setenv("UV_EXCLUDE_NEWER", "2100-01-01T00:00:00Z")
    elif name == "uv_toml":
        cfg = env.tmp / "config" / "uv" / "uv.toml"
        cfg.parent.mkdir(parents=True)
        cfg.write_text('exclude-newer = "2100-01-01T00:00:00Z"\n')
    elif name == "index_url":
        monkeypatch.setenv("UV_INDEX_URL", env.index.url.replace("127.0.0.1", "localhost"))
    elif name == "lock_pins":  # a lock that took numbra 1.1, not 1.0
        return req, wheels, locked(env, request(overrides=OVERRIDES[:2]), "other")
    elif name == "wheels_dir":
        (wheels / "servo-3.0-py3-none-any.whl").write_bytes(b"a file uv would now see")
    else:
        raise AssertionError(name)
    return req, wheels, lock


@pytest.mark.parametrize("change", ["platform", "requirement", "exclude_newer", "uv_toml",
                                    "index_url", "lock_pins", "wheels_dir"])
def test_a_changed_input_asks_uv_again(env, monkeypatch, change):
    req = request()
    lock = locked(env, req)
    wheels = env.tmp / "wheels"  # --find-links: a directory with a wheel nothing asks for
    make_wheel(WheelSpec("unrelated", "1.0"), wheels)
    assert check_overrides(req, wheels, lock) == EXPECTED
    r, w, lk = _change(change, env, monkeypatch, req, wheels, lock)
    before = env.resolutions()
    check_overrides(r, w, lk)
    assert env.resolutions() - before == len(r.overrides), f"{change}: answered from the cache"


def test_a_network_failure_is_not_kept(env, monkeypatch):
    req = request()
    lock = locked(env, req)
    monkeypatch.setenv("UV_INDEX_URL", f"http://127.0.0.1:{free_port()}/simple/")
    monkeypatch.setenv("UV_HTTP_RETRIES", "0")  # refused is refused: no backoff to wait out
    with pytest.raises(EnvError):
        check_overrides(req, None, lock)
    assert env.cached() == []


def test_a_torn_cache_file_is_a_miss_and_is_rewritten(env):
    req = request()
    lock = locked(env, req)
    check_overrides(req, None, lock)
    for f in env.cached():
        f.write_text(f.read_text()[:10])
    before = env.resolutions()
    assert check_overrides(req, None, lock) == EXPECTED
    assert env.resolutions() - before == len(OVERRIDES)
    assert check_overrides(req, None, lock) == EXPECTED
    assert env.resolutions() - before == len(OVERRIDES)


# --- the key itself: a pure function of plain data -----------------------------------------

BASE = CheckInputs(
    dropped="ctensors>=0.10", python="3.11", uv_platform=PLAT,
    requirements=("eng-a==1.0", "eng-b==1.0"), overrides=("servo>=1",),
    extra_index_urls=("https://download.pytorch.org/whl/cpu",), build_from_source=False,
    default_index=None, uv_version="uv 0.13.9", uv_settings=(),
    wheels=None, locked_pins="sha256:" + "0" * 64)

OTHER = {  # another value for every field
    "dropped": "servo>=1", "python": "3.12", "uv_platform": "aarch64-manylinux_2_36",
    "requirements": ("eng-a==1.0",), "overrides": ("servo>=1", "numbra==1.0"),
    "extra_index_urls": (), "build_from_source": True,
    "default_index": "https://mirror.example/simple/", "uv_version": "uv 0.14.0",
    "uv_settings": (("UV_EXCLUDE_NEWER", "2026-01-01"),),
    "wheels": (("torch-2.13.0-cp311-cp311-linux_x86_64.whl", 1, 2),),
    "locked_pins": "sha256:" + "1" * 64, "format": checkcache.CHECK_FORMAT + 1,
}


def test_every_input_of_a_check_is_in_its_key():
    # A field added to CheckInputs needs a value here, so it is tested too.
    assert {f.name for f in dataclasses.fields(CheckInputs)} == set(OTHER)
    for name, value in OTHER.items():
        assert check_key(dataclasses.replace(BASE, **{name: value})) != check_key(BASE), name
    assert check_key(BASE) == check_key(dataclasses.replace(BASE))  # and nothing else


def test_the_wheels_directory_is_named_by_its_files(tmp_path):
    assert checkcache.wheels_signature(None) is None
    d = tmp_path / "wheels"
    d.mkdir()
    (d / "a-1.0-py3-none-any.whl").write_bytes(b"a")
    first = checkcache.wheels_signature(d)
    assert checkcache.wheels_signature(d) == first
    (d / "a-1.0-py3-none-any.whl").write_bytes(b"ab")  # rewritten in place: another size
    assert checkcache.wheels_signature(d) != first


def test_uv_settings_hold_what_changes_a_resolution_and_not_what_does_not(tmp_path):
    base = {"HOME": str(tmp_path), "XDG_CONFIG_DIRS": str(tmp_path / "none")}
    assert checkcache.uv_settings(base | {"UV_CACHE_DIR": "/x", "UV_NO_PROGRESS": "1"}) == \
        checkcache.uv_settings(base)
    assert checkcache.uv_settings(base | {"UV_EXCLUDE_NEWER": "2026-01-01"}) != \
        checkcache.uv_settings(base)
    cfg = tmp_path / ".config" / "uv" / "uv.toml"
    cfg.parent.mkdir(parents=True)
    cfg.write_text('prerelease = "allow"\n')
    assert ("file:" + str(cfg), 'prerelease = "allow"\n') in checkcache.uv_settings(base)


def test_the_interpreter_is_named_only_where_nothing_is_built(env):
    """Wheels only: uv is handed this interpreter (its search for one costs a tenth of a
    second a resolution, and the target's version and platform are given anyway); the pins are
    those of the same request where sdists may be built, which keeps uv's own search."""
    wheels_only = request()
    may_build = dataclasses.replace(wheels_only, build_from_source=True)
    pinned = locked(env, wheels_only, "wheels-only")
    searched = locked(env, may_build, "may-build")
    calls = [ln.split() for ln in env.log.read_text().splitlines()
             if ln.startswith("pip compile")]
    assert len(calls) == 2
    assert "--no-build" in calls[0] and calls[0][calls[0].index("--python") + 1] == sys.executable
    assert "--no-build" not in calls[1] and "--python" not in calls[1]
    assert [(p.name, p.version) for p in pinned.packages] == \
        [(p.name, p.version) for p in searched.packages]


# --- which uv.toml files uv reads, and the store's own decisions (no uv) --------------------

def test_the_uv_config_files_uv_reads(tmp_path):
    home = tmp_path / "home"
    files = checkcache._uv_config_files
    assert files({"UV_NO_CONFIG": "1", "UV_CONFIG_FILE": "/x.toml"}) == []
    assert files({"UV_CONFIG_FILE": "/x.toml", "HOME": str(home)}) == [Path("/x.toml")]
    assert files({"HOME": str(home)}) == [home / ".config" / "uv" / "uv.toml",
                                          Path("/etc/xdg/uv/uv.toml"), Path("/etc/uv/uv.toml")]
    assert files({"HOME": str(home), "XDG_CONFIG_HOME": "/c", "XDG_CONFIG_DIRS": "/a::/b"}) == [
        Path("/c/uv/uv.toml"), Path("/a/uv/uv.toml"), Path("/b/uv/uv.toml"),
        Path("/etc/uv/uv.toml")]
    assert files({})[0] == Path.home() / ".config" / "uv" / "uv.toml"  # no HOME: the user's


def test_uv_config_named_by_uv_config_file_is_read_and_uv_no_config_reads_none(tmp_path):
    cfg = tmp_path / "ci.toml"
    cfg.write_text('exclude-newer = "2026-01-01"\n')
    got = checkcache.uv_settings({"UV_CONFIG_FILE": str(cfg)})
    assert (f"file:{cfg}", 'exclude-newer = "2026-01-01"\n') in got
    assert ("UV_CONFIG_FILE", str(cfg)) in got
    assert not [k for k, _ in checkcache.uv_settings({"UV_NO_CONFIG": "1", "UV_CONFIG_FILE":
                                                      str(cfg)}) if k.startswith("file:")]


def test_a_mirror_url_is_kept_without_its_credentials():
    assert checkcache.clean_url(None) is None
    assert checkcache.clean_url("https://u:secret@mirror.example/simple/") == \
        "https://mirror.example/simple/"


def test_the_key_is_canonical_json(monkeypatch):
    import hashlib
    import json

    doc = json.dumps(dataclasses.asdict(BASE), sort_keys=True, separators=(",", ":"))
    assert check_key(BASE) == hashlib.sha256(doc.encode()).hexdigest()


def test_stored_answers_are_read_back_only_when_whole_and_this_checks(tmp_path, monkeypatch):
    import json

    monkeypatch.setattr(checkcache, "cache_root", lambda: tmp_path)
    assert checkcache.cache_dir() == tmp_path / "override-checks"
    answer = {"requirement": "a==1", "needed": True, "effect": "b 2 -> 1"}
    checkcache.store("k", answer)
    path = tmp_path / "override-checks" / "k.json"
    text = path.read_text()
    assert text == json.dumps({"format": checkcache.CHECK_FORMAT, **answer},
                              sort_keys=True) + "\n"
    assert checkcache.load("k", "a==1") == answer
    assert checkcache.load("k", "other==1") is None  # another check's answer
    assert checkcache.load("missing", "a==1") is None
    for bad in ([answer], {**answer, "format": checkcache.CHECK_FORMAT + 1},
                {**answer, "format": checkcache.CHECK_FORMAT, "needed": "yes"},
                {**answer, "format": checkcache.CHECK_FORMAT, "effect": 3},
                {"format": checkcache.CHECK_FORMAT, "needed": True, "effect": "x"}):
        path.write_text(json.dumps(bad))
        assert checkcache.load("k", "a==1") is None, bad
    path.write_text("{torn")
    assert checkcache.load("k", "a==1") is None
    # A cache directory that cannot be written costs only the answer.
    monkeypatch.setattr(checkcache, "cache_root", lambda: tmp_path / "file")
    (tmp_path / "file").write_text("not a directory")
    checkcache.store("k", answer)  # no error

