"""Keeps the `docker` marker honest: `-m "not docker"` is what offline runs, mutation runs and a
run beside other work select, so a test outside the marker must not reach the Docker Engine or
a registry (one that does may restart the daemon under whatever else runs on the machine).

Two checks, both loaded by tests/conftest.py:

- at collection, a test that asks for a fixture which drives the Engine or starts a registry
  and is not marked `docker` is an error, named;
- while it runs, a test outside the marker has DOCKER_HOST pointed at a trap socket of this
  session's (the docker SDK, the docker CLI and every `imgbuild` subprocess read it) and
  in-process connections to the shared registry refused; a test that reached either fails,
  saying which.

It also runs the docker tests side by side safely under xdist: each group (xdist_group) on one
worker, every docker test holding the Engine shared and an engine_exclusive one holding it alone.
"""

from __future__ import annotations

import fcntl
import json
import os
import socket
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import pytest

ENGINE_GROUP = "engine"  # the xdist group of a docker test whose file names none
# The docker tests of these modules are a second such group, beside the first on another
# worker (each module's tests still together, in their order): the two halves measured about
# the same in a `make test` (junit times, 2 cores), and one group of all of them was the whole
# run's critical path. test_workflow joins test_platforms' group: both build under QEMU.
ENGINE_GROUP_B = "engine-b"
ENGINE_B_MODULES = frozenset({"test_hardening", "test_anywhere", "test_run", "test_anyuser",
                              "test_installed", "test_init", "test_workspace",
                              "test_compression"})
MODULE_GROUPS = {"test_workflow": "qemu"}
# The longest groups first (longest-processing-time first): xdist hands a group to a worker
# when it reaches the group's first test in collection order, so a long group collected late
# runs alone at the end. test_splice's (test #1817 of 1921) did: 3 min of one worker busy and
# two idle. Test-seconds per group in a fresh-clone `make test` on 2 cores (junit): engine-b
# 945, engines-26 501, engine 472, qemu 270, fresh-engine-splice 185, private-registries 126,
# fresh-engine 125, containerd 122. The order only; a group not named here comes after them.
LONGEST_FIRST = ("engine-b", "engines-26", "engine", "qemu", "fresh-engine-splice",
                 "private-registries", "fresh-engine", "containerd")
# Fixtures that drive the Engine (every fixture built on them asks for them too).
ENGINE_FIXTURES = frozenset({"docker_client", "registry_repo", "own_repo", "arm64_base", "private_registry"})
# The modules' own fixtures that start a real Distribution registry (tests/registries.py); the
# names are too plain (`basic`, `tls`) to mean a registry elsewhere.
REGISTRY_FIXTURES = {
    "test_registry_client": frozenset({"plain", "basic", "token", "odd_token", "tls",
                                       "tls_token"}),
    "test_registry_auth": frozenset({"basic", "token", "tls"}),
}


def _shared_registry() -> tuple[str, int]:
    host, _, port = os.environ.get("IMGBUILD_TEST_REGISTRY", "127.0.0.1:5000").rpartition(":")
    return host, int(port)


class Trap:
    """A unix socket that stands where the Engine's would and records who knocks."""

    def __init__(self, path: Path):
        self.path = path
        self.knocks = 0
        self._lock = threading.Lock()
        self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self._sock.bind(str(path))
        self._sock.listen(16)
        threading.Thread(target=self._serve, daemon=True, name="docker-trap").start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self._sock.accept()
            except OSError:
                return
            with self._lock:
                self.knocks += 1
            conn.close()  # no Engine here: the client sees a daemon that hung up

    def count(self) -> int:
        with self._lock:
            return self.knocks

    def close(self) -> None:
        self._sock.close()


def _needs_docker(item: pytest.Item) -> str | None:
    names = set(getattr(item, "fixturenames", ()))
    module = item.module.__name__.rsplit(".", 1)[-1] if item.module is not None else ""
    hits = names & (ENGINE_FIXTURES | REGISTRY_FIXTURES.get(module, frozenset()))
    return ", ".join(sorted(hits)) or None


# Before xdist's own hook reads the groups (--dist loadgroup).
@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    wrong = [f"{item.nodeid} (uses {fx})" for item in items
             if (fx := _needs_docker(item)) and item.get_closest_marker("docker") is None]
    if wrong:
        raise pytest.UsageError(
            "these tests drive the Docker Engine or a registry but are not marked docker, so "
            "-m 'not docker' would run them:\n  " + "\n  ".join(wrong)
            + "\nmark them @pytest.mark.docker (or the module's pytestmark)")
    # Under xdist (make test: -n 3 --dist loadgroup) the docker tests of one group run one
    # after another on one worker: a module's tests share its images, repositories and
    # session fixtures and expect each other's order. A test file picks its group with
    # pytestmark (GROUPS); the rest share ENGINE_GROUP. Groups run beside each other and beside
    # the tests outside the marker, which the trap keeps off Docker.
    for item in items:
        if item.get_closest_marker("docker") is not None and \
                item.get_closest_marker("xdist_group") is None:
            module = item.module.__name__.rsplit(".", 1)[-1] if item.module is not None else ""
            group = MODULE_GROUPS.get(module) or (
                ENGINE_GROUP_B if module in ENGINE_B_MODULES else ENGINE_GROUP)
            item.add_marker(pytest.mark.xdist_group(group))
    if hasattr(config, "workerinput"):  # under xdist: the long groups are handed out first
        rank = {g: i for i, g in enumerate(LONGEST_FIRST)}

        def order(item: pytest.Item) -> int:
            mark = item.get_closest_marker("xdist_group")
            return rank.get(str(mark.args[0]) if mark is not None and mark.args else "",
                            len(rank))

        items.sort(key=order)  # stable: each group's tests, and the rest, keep their order
    if path := getattr(config, "workerinput", {}).get(GROUPS_FILE):
        groups = {item.nodeid: str(mark.args[0]) for item in items
                  if (mark := item.get_closest_marker("xdist_group")) is not None and mark.args}
        tmp = Path(f"{path}.{os.getpid()}")
        tmp.write_text(json.dumps(groups))
        os.replace(tmp, path)  # every worker collects the same tests: the last one stays


# pytest-xdist 3.8 puts a test in its group by appending "@group" to the test's node id, which
# pytest 9 no longer lets a plugin change: its loadgroup scheduling sees no group and spreads
# them. So the workers write which test is in which group (above) into a file the controller
# named, and the controller's scheduler reads its groups from there.
GROUPS_FILE = "imgbuild_xdist_groups"
_GROUPS_PATH = pytest.StashKey[Path]()


def _groups_path(config: pytest.Config) -> Path:
    if _GROUPS_PATH not in config.stash:
        config.stash[_GROUPS_PATH] = Path(tempfile.mkdtemp(prefix="xdist-groups-")) / "groups"
    return config.stash[_GROUPS_PATH]


@pytest.hookimpl(optionalhook=True)
def pytest_configure_node(node) -> None:
    node.workerinput[GROUPS_FILE] = str(_groups_path(node.config))


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log):
    if config.getvalue("dist") != "loadgroup":
        return None
    from xdist.scheduler import LoadGroupScheduling

    path = _groups_path(config)

    class MarkedGroups(LoadGroupScheduling):
        _groups: dict[str, str] | None = None

        def _split_scope(self, nodeid: str) -> str:
            if nodeid.rfind("@") > nodeid.rfind("]"):  # a pytest that kept xdist's suffix
                return super()._split_scope(nodeid)
            if self._groups is None:  # read once every worker has collected
                self._groups = json.loads(path.read_text()) if path.exists() else {}
            return self._groups.get(nodeid, nodeid)

    return MarkedGroups(config, log)


# Every docker test holds the Engine shared for its whole run, session fixtures included; one
# marked engine_exclusive (it restarts the daemon) holds it alone. A file lock, so that xdist
# workers and a second pytest run on the machine take turns the same way. A pytest run inside
# a test (tests/test_markers.py) names a lock of its own: the outer run's docker tests hold
# this one.
def engine_lock() -> Path:
    return Path(os.environ.get("IMGBUILD_TEST_ENGINE_LOCK")
                or Path(tempfile.gettempdir()) / "imgbuild-tests-engine.lock")


def _waits_file() -> Path:
    return engine_lock().with_suffix(".waits")


@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem):
    if item.get_closest_marker("docker") is None:
        return (yield)
    exclusive = item.get_closest_marker("engine_exclusive") is not None
    with open(engine_lock(), "a") as lock:
        start = time.monotonic()
        fcntl.flock(lock, fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH)
        waited = time.monotonic() - start
        if waited >= 1:  # a worker idle behind the lock: the summary adds these up
            with open(_waits_file(), "a") as f:
                f.write(f"{waited:.1f} {item.nodeid}\n")
        try:
            return (yield)
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def pytest_sessionstart(session: pytest.Session) -> None:
    if not hasattr(session.config, "workerinput"):  # the controller (or a run without xdist)
        _waits_file().unlink(missing_ok=True)


def engine_lock_waits(terminalreporter, config: pytest.Config) -> None:
    """How long tests waited for the Engine lock (an engine_exclusive test waits for every
    docker test in flight; the others wait while it runs): time their workers sat idle."""
    if hasattr(config, "workerinput"):
        return
    try:
        rows = [ln.split(" ", 1) for ln in _waits_file().read_text().splitlines() if ln]
    except OSError:
        return
    waits = sorted(((float(w), n) for w, n in rows), reverse=True)
    if waits:
        terminalreporter.write_line(
            f"engine lock: {len(waits)} docker tests waited {sum(w for w, _ in waits):.0f} s "
            "in all; longest: " + "; ".join(f"{n} {w:.0f} s" for w, n in waits[:3]))


@pytest.fixture(scope="session")
def docker_trap():
    d = tempfile.mkdtemp(prefix="docker-trap-")
    trap = Trap(Path(d) / "docker.sock")
    yield trap
    trap.close()


@dataclass
class Watch:
    """What one unmarked test has reached so far."""
    trap: Trap
    knocks_before: int
    reached: list[str] = field(default_factory=list)

    def verdict(self) -> str | None:
        what = (["the Docker Engine's socket"] if self.trap.count() > self.knocks_before else [])
        what += self.reached
        return f"reached {what[0]} but is not marked docker" if what else None


_WATCH = pytest.StashKey[Watch]()
_ADVICE = ": mark it @pytest.mark.docker, so that -m 'not docker' leaves it out"


@pytest.fixture(autouse=True)
def _no_docker_outside_the_marker(request: pytest.FixtureRequest, monkeypatch):
    if request.node.get_closest_marker("docker") is not None:
        yield
        return
    trap: Trap = request.getfixturevalue("docker_trap")
    monkeypatch.setenv("DOCKER_HOST", f"unix://{trap.path}")
    host, port = _shared_registry()
    watch = Watch(trap, trap.count())
    real_connect = socket.socket.connect

    def connect(sock, address):
        if sock.family in (socket.AF_INET, socket.AF_INET6) and isinstance(address, tuple) and \
                address[0] in (host, "localhost") and address[1] == port:
            watch.reached.append(f"the registry at {address[0]}:{address[1]}")
            raise ConnectionRefusedError(f"{request.node.nodeid} is not marked docker")
        return real_connect(sock, address)

    monkeypatch.setattr(socket.socket, "connect", connect)
    request.node.stash[_WATCH] = watch
    yield
    # A fixture's teardown or a thread the test left running counts too.
    if (said := watch.verdict()) is not None and not request.node.stash.get(_SAID, False):
        pytest.fail(f"{request.node.nodeid} {said}{_ADVICE}", pytrace=False)


_SAID = pytest.StashKey[bool]()


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item: pytest.Item):
    """Fails the test itself, not only its teardown, when its body reached Docker unmarked."""
    result = yield
    watch = item.stash.get(_WATCH, None)
    if watch is not None and (said := watch.verdict()) is not None:
        item.stash[_SAID] = True
        pytest.fail(f"{item.nodeid} {said}{_ADVICE}", pytrace=False)
    return result
