"""Shared fixtures. Tests talk to real services: the Docker Engine and the registry that
`make test` starts (scripts/services.sh), uv against real PyPI (marker `live`)."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import uuid
from pathlib import Path

import pytest
import requests

from imgbuild.workspace import Workspace

from . import cpu_record  # CPU-seconds per test, summed up after the run

# The docker marker's two checks (at collection and while a test runs): hooks and fixtures
# that pytest finds here because they are names of this module.
from .docker_guard import (  # noqa: F401
    _no_docker_outside_the_marker,
    docker_trap,
    engine_lock_waits,
    pytest_collection_modifyitems,
    pytest_configure_node,
    pytest_runtest_call,
    pytest_runtest_protocol,
    pytest_sessionstart,
    pytest_xdist_make_scheduler,
)

# A test run started in the background by a script (`make test &`, nohup) inherits SIGINT
# ignored, as would every imgbuild a test starts: imgbuild keeps an ignored SIGINT ignored, as
# a background job should, so the tests' Ctrl-C would never arrive and they would hang. The
# tests stand for a user at a terminal, whose Ctrl-C reaches imgbuild; the one that checks the
# ignored case asks for it.
if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)

ROOT = Path(__file__).resolve().parent.parent
REGISTRY_HOST = os.environ.get("IMGBUILD_TEST_REGISTRY", "127.0.0.1:5000")
WHEELS = os.environ.get("IMGBUILD_WHEELS") or ("/opt/wheels" if Path("/opt/wheels").is_dir() else "")


def run_imgbuild(*args: str, env: dict | None = None, timeout: int = 1800,
                 cwd: Path | None = None) -> subprocess.CompletedProcess:
    """The CLI as a user runs it: a subprocess, its exit code and its two streams."""
    e = dict(os.environ)
    e.setdefault("UV_PYTHON_DOWNLOADS", "never")
    e["HF_HUB_OFFLINE"] = "1"
    if WHEELS:
        e.setdefault("IMGBUILD_WHEELS", WHEELS)
    e.update(env or {})
    return subprocess.run([sys.executable, "-m", "imgbuild.cli", *args], cwd=cwd or ROOT, env=e,
                          capture_output=True, text=True, timeout=timeout)


def docker_available() -> bool:
    try:
        import docker

        docker.from_env().ping()
        return True
    except Exception:
        return False


def registry_available() -> bool:
    try:
        return requests.get(f"http://{REGISTRY_HOST}/v2/", timeout=3).status_code == 200
    except requests.RequestException:
        return False


@pytest.fixture(scope="session")
def docker_client():
    if not docker_available():
        pytest.skip("skipped: no Docker daemon (make services starts one)")
    import docker

    return docker.from_env(timeout=600)


@pytest.fixture(scope="session")
def registry_repo(docker_client) -> str:
    """A repository of its own per test session, so the first build in it is a real one."""
    if not registry_available():
        pytest.skip(f"skipped: no registry on {REGISTRY_HOST} (make services starts one)")
    return f"{REGISTRY_HOST}/imgbuild-test-{uuid.uuid4().hex[:8]}"


@pytest.fixture()
def own_repo(docker_client) -> str:
    """A repository of this test's own: nothing another test pushed is found in it (where
    registry_repo, shared by the session, may hold an index or tag another test made)."""
    if not registry_available():
        pytest.skip(f"skipped: no registry on {REGISTRY_HOST} (make services starts one)")
    return f"{REGISTRY_HOST}/imgbuild-test-{uuid.uuid4().hex[:8]}"


@pytest.fixture()
def images_copy(tmp_path) -> Path:
    """A scratch copy of images/ and lockfiles/ to break on purpose."""
    shutil.copytree(ROOT / "images", tmp_path / "images")
    shutil.copytree(ROOT / "lockfiles", tmp_path / "lockfiles")
    return tmp_path / "images"


# The smoke-model generator's code: a change to any of these makes new test checkpoints.
SMOKE_GENERATOR_SOURCES = ("imgbuild/payload/smokegen.py", "imgbuild/payload/smoke.py",
                           "imgbuild/smokemodel.py")


def persistent_test_cache() -> Path:
    """Where generated test checkpoints persist across pytest processes (mutmut runs one per
    mutant): $IMGBUILD_TEST_CACHE, else ~/.cache/imgbuild-tests."""
    env = os.environ.get("IMGBUILD_TEST_CACHE")
    return Path(env) if env else Path.home() / ".cache" / "imgbuild-tests"


def smoke_checkpoint(spec, area: str) -> Path:
    """A smoke checkpoint made by the real generator in this interpreter
    (imgbuild.smokemodel.ensure), kept under <test cache>/<area>/<generator key16>/.

    ensure already names the entry by the spec's recipe key and the installed tooling's
    versions, checks it file by file (sha256 against its reference) before reuse, and renames
    a complete entry into place in one step. The directory above it adds the generator's own
    source, so an edit to the generator regenerates; a lock file makes concurrent processes
    wait for the one generating instead of generating twice."""
    import fcntl
    import hashlib

    from imgbuild import smokemodel

    h = hashlib.sha256()
    for rel in SMOKE_GENERATOR_SOURCES:
        h.update(rel.encode() + b"\0" + (ROOT / rel).read_bytes() + b"\0")
    cache = persistent_test_cache() / area / h.hexdigest()[:16]
    cache.mkdir(parents=True, exist_ok=True)
    with open(cache / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            return smokemodel.ensure(spec, cache_dir=cache)
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def checkout_workspace(wheels: bool = False) -> Workspace:
    """The checkout's images/ and lockfiles/ (and the local wheel directory when asked)."""
    return Workspace(ROOT / "images", ROOT / "lockfiles",
                     Path(WHEELS) if wheels and WHEELS else None)


@pytest.fixture(scope="module")
def ws() -> Workspace:
    return checkout_workspace()


@pytest.fixture()
def ws_copy(images_copy) -> Workspace:
    """A Workspace on the scratch copy of images/ and lockfiles/."""
    return Workspace(images_copy, images_copy.parent / "lockfiles")


@pytest.fixture(scope="session")
def arm64_base(docker_client) -> str:
    """The arm64 Debian base, made here under QEMU the first time (about 100 s), then reused:
    what an arm64 image builds FROM."""
    r = run_imgbuild("base", "bootstrap", "--cpu-arch", "aarch64", "--json", timeout=1800)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    return json.loads(r.stdout)["image"]


# What the wheel is built from: the sdist's files (MANIFEST.in), copied so that two workers
# building at once do not share setuptools' build/ directory in the checkout.
WHEEL_SOURCES = ("pyproject.toml", "setup.py", "MANIFEST.in", "README.md", "imgbuild", "images",
                 "lockfiles")


def build_wheel(dest: Path) -> Path:
    """The wheel a user installs (`uv build --wheel`), built from a copy of the sources."""
    uv = shutil.which("uv")
    if uv is None:
        pytest.skip("skipped: uv is not installed (make setup installs it)")
    src = dest / "src"
    src.mkdir(parents=True)
    for name in WHEEL_SOURCES:
        if (ROOT / name).is_dir():
            shutil.copytree(ROOT / name, src / name,
                            ignore=shutil.ignore_patterns("__pycache__", "*.pyc", "builtin"))
        else:
            shutil.copy(ROOT / name, src / name)
    cmd = [uv, "build", "-q", "--wheel", "-o", str(dest / "dist"), str(src)]
    r = subprocess.run([*cmd, "--offline"], capture_output=True, text=True)  # setuptools cached
    if r.returncode != 0:
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-2000:]
    return next((dest / "dist").glob("imgbuild-*.whl"))


@pytest.fixture(scope="session")
def imgbuild_wheel(tmp_path_factory) -> Path:
    return build_wheel(tmp_path_factory.mktemp("wheel"))


@pytest.fixture(scope="session")
def plain_install(tmp_path_factory, imgbuild_wheel) -> Path:
    """The built wheel installed into a fresh venv outside the checkout (no torch, no tests):
    what a user's `uv tool install` holds."""
    venv = tmp_path_factory.mktemp("plain") / "venv"
    uv = shutil.which("uv")
    subprocess.run([uv, "venv", "-q", "--python", sys.executable, str(venv)], check=True,
                   env=dict(os.environ, UV_PYTHON_DOWNLOADS="never"))
    cmd = [uv, "pip", "install", "-q", "--python", str(venv / "bin" / "python"),
           str(imgbuild_wheel)]
    r = subprocess.run([*cmd, "--offline"], capture_output=True, text=True)  # uv's cache first
    if r.returncode != 0:
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    if r.returncode != 0:
        pytest.skip(f"skipped: imgbuild's dependencies cannot be installed here: {r.stderr[-300:]}")
    site = subprocess.run([str(venv / "bin" / "python"), "-c",
                           "import imgbuild, sys; print(imgbuild.__file__)"],
                          capture_output=True, text=True, cwd="/").stdout.strip()
    assert site and not site.startswith(str(ROOT)), site  # the copy in site-packages
    return venv


def pytest_collection_finish(session) -> None:
    """`make test-slow` (-m slow) that collects nothing passes while testing nothing: fail it."""
    expr = (session.config.option.markexpr or "").strip()
    if expr == "slow" and not session.items:
        raise pytest.UsageError("the slow group (-m slow) collected no test: a marker was lost")


# Reports a test wants printed after the run whether it passed or not (the doctor corpus's
# precision and recall): test modules append (title, lines) here.
SUMMARIES: list[tuple[str, list[str]]] = []


def pytest_sessionfinish(session) -> None:
    """Under xdist a worker's summaries travel to the controller, which prints them."""
    out = getattr(session.config, "workeroutput", None)
    if out is not None:
        out["summaries"] = json.dumps(SUMMARIES)


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node, error) -> None:
    for title, lines in json.loads(getattr(node, "workeroutput", {}).get("summaries", "[]")):
        SUMMARIES.append((title, lines))


def pytest_configure(config: pytest.Config) -> None:
    cpu_record.register(config)


def pytest_terminal_summary(terminalreporter, config: pytest.Config) -> None:
    for title, lines in SUMMARIES:
        terminalreporter.section(title)
        for line in lines:
            terminalreporter.write_line(line)
    engine_lock_waits(terminalreporter, config)
    if spent := cpu_record.lines(config):
        terminalreporter.section("CPU-seconds by test (tests/cpu_record.py)")
        for line in spent:
            terminalreporter.write_line(line)


# --- the Sigstore stand-in (tests/sigstore_standin.py), for the keyless tests ---------------------

@pytest.fixture(scope="module")
def standin():
    """A TEST STAND-IN for Fulcio, Rekor and the CT log, one per test module (its leaf
    certificates are valid for minutes, from when each is made)."""
    from .sigstore_standin import StandIn

    return StandIn.make()


@pytest.fixture(scope="module")
def standin_root(standin):
    """The stand-in's trusted_root.json, read as a policy's would be (its source: "stand-in")."""
    import json

    from imgbuild.image import keyless

    return keyless.load_trust_root(json.dumps(standin.trusted_root()).encode(), "stand-in")
