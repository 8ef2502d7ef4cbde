"""The docker marker tells the truth (tests/docker_guard.py): a test outside it that reaches the
Docker Engine or the shared registry fails, and one that asks for an Engine fixture unmarked is
refused at collection. Each case runs pytest on a small test file of its own, with the guard
loaded as tests/conftest.py loads it; none reaches a real daemon."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

from .conftest import ROOT

CONFTEST = """
import pytest
from tests.docker_guard import (_no_docker_outside_the_marker, docker_trap,
                                pytest_collection_modifyitems, pytest_runtest_call,
                                pytest_runtest_protocol, pytest_configure_node,
                                pytest_xdist_make_scheduler)

@pytest.fixture
def docker_client():
    return object()
"""


def inner(tmp_path: Path, body: str, *args: str) -> subprocess.CompletedProcess:
    (tmp_path / "conftest.py").write_text(CONFTEST)
    (tmp_path / "test_inner.py").write_text("import pytest\n" + textwrap.dedent(body))
    (tmp_path / "pytest.ini").write_text("[pytest]\nmarkers =\n    docker: the Engine\n"
                                         "    engine_exclusive: alone\n")
    # A lock of its own: the docker tests of the run this test is part of hold the shared one.
    env = dict(os.environ, PYTHONPATH=str(ROOT),
               IMGBUILD_TEST_ENGINE_LOCK=str(tmp_path / "engine.lock"))
    env.pop("DOCKER_HOST", None)
    return subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                           *args, str(tmp_path)], cwd=tmp_path, env=env, capture_output=True,
                          text=True, timeout=120)


SDK = """
def test_it():
    import docker
    try:
        docker.from_env().ping()
    except Exception:
        pass  # as docker_available() does: a test that only looks still reached the socket
"""
CLI = """
def test_it():
    import subprocess
    subprocess.run(["docker", "info"], capture_output=True)
"""
IMGBUILD = """
def test_it():
    import subprocess, sys
    subprocess.run([sys.executable, "-m", "imgbuild.cli", "size", "no-such-image:latest"],
                   capture_output=True)
"""
REGISTRY = """
def test_it():
    import requests
    try:
        requests.get("http://127.0.0.1:5000/v2/", timeout=2)
    except requests.RequestException:
        pass
"""


CASES = {"docker_sdk": (SDK, "the Docker Engine's socket"),
         "docker_cli": (CLI, "the Docker Engine's socket"),
         "imgbuild_subprocess": (IMGBUILD, "the Docker Engine's socket"),
         "shared_registry": (REGISTRY, "the registry at 127.0.0.1:5000")}
CLEAN = """
def test_clean():
    import os
    assert "docker-trap-" in os.environ["DOCKER_HOST"]  # the trap is where the Engine was
"""


def test_a_test_outside_the_marker_that_reaches_docker_fails(tmp_path):
    """Each way in, once unmarked (fails, saying what it reached) and once marked (left
    alone), in one inner run; a test that stays off Docker passes beside the trap."""
    body = CLEAN
    for name, (code, _) in CASES.items():
        body += code.replace("def test_it", f"def test_{name}")
        body += code.replace("def test_it", f"@pytest.mark.docker\ndef test_marked_{name}")
    r = inner(tmp_path, body, "-rA")
    out = r.stdout
    assert r.returncode == 1, out[-3000:]
    assert "PASSED test_inner.py::test_clean" in out, out[-3000:]
    assert "ERROR" not in out, out[-3000:]  # the test fails, not its teardown
    for name, (_, reached) in CASES.items():
        if name == "docker_cli" and shutil.which("docker") is None:
            continue
        assert f"test_inner.py::test_{name} reached {reached} but is not marked docker" in out, \
            out[-3000:]
        assert f"FAILED test_inner.py::test_{name} - Failed:" in out, out[-3000:]
        assert f"test_marked_{name} reached" not in out, out[-3000:]


def test_an_engine_fixture_without_the_marker_is_refused_at_collection(tmp_path):
    r = inner(tmp_path, """
def test_it(docker_client):
    pass

@pytest.mark.docker
def test_marked(docker_client):
    pass
""", "-m", "not docker")
    assert r.returncode == 4, r.stdout + r.stderr  # a usage error, before any test ran
    said = r.stdout + r.stderr
    assert "test_inner.py::test_it (uses docker_client)" in said
    assert "test_marked" not in said



def test_under_xdist_the_docker_tests_run_one_after_another_on_one_worker(tmp_path):
    """make test's -n 2 --dist loadgroup: every docker test on one worker (they share the
    Engine, and some restart it), the others spread beside them."""
    log = tmp_path / "workers"
    log.mkdir()
    body = "".join(f"""
@pytest.mark.docker
def test_engine_{i}():
    import os, pathlib, time
    pathlib.Path({str(log)!r}, "engine-{i}").write_text(os.environ["PYTEST_XDIST_WORKER"])
    time.sleep(0.2)

def test_plain_{i}():
    import os, pathlib, time
    pathlib.Path({str(log)!r}, "plain-{i}").write_text(os.environ["PYTEST_XDIST_WORKER"])
    time.sleep(0.2)
""" for i in range(6))
    r = inner(tmp_path, body, "-n", "2", "--dist", "loadgroup")
    assert r.returncode == 0 and "12 passed" in r.stdout, r.stdout[-3000:]
    seen = {p.name: p.read_text() for p in log.iterdir()}
    engine = {w for n, w in seen.items() if n.startswith("engine-")}
    assert len(engine) == 1, seen
    assert {w for n, w in seen.items() if n.startswith("plain-")} - engine, seen  # spread


def test_a_test_that_restarts_the_engine_runs_while_no_other_docker_test_does(tmp_path):
    """Docker tests of two groups run beside each other on two workers, but never beside one
    marked engine_exclusive (a test that would restart or empty the shared Engine); tests
    outside the marker may."""
    log = tmp_path / "spans"
    log.mkdir()
    step = """
def test_{name}():
    import pathlib, time
    start = time.monotonic()
    time.sleep({secs})
    pathlib.Path({log!r}, "{name}").write_text(f"{{start}} {{time.monotonic()}}")
"""
    body = ""
    for i in range(3):
        body += '@pytest.mark.docker\n@pytest.mark.xdist_group("a")' + \
            step.format(name=f"a{i}", secs=0.5, log=str(log))
        body += '@pytest.mark.docker\n@pytest.mark.xdist_group("b")' + \
            step.format(name=f"b{i}", secs=0.5, log=str(log))
    body += '@pytest.mark.docker\n@pytest.mark.engine_exclusive\n@pytest.mark.xdist_group("b")' + \
        step.format(name="restart", secs=1.0, log=str(log))
    r = inner(tmp_path, body, "-n", "2", "--dist", "loadgroup")
    assert r.returncode == 0 and "7 passed" in r.stdout, r.stdout[-3000:]
    spans = {p.name: tuple(map(float, p.read_text().split())) for p in log.iterdir()}
    alone = spans.pop("restart")
    overlapping = [n for n, (a, b) in spans.items() if a < alone[1] and alone[0] < b]
    assert not overlapping, (alone, spans)
    # The two groups did run at once at some point (else the check above proves nothing).
    assert any(a1 < b2 and a2 < b1 for n1, (a1, b1) in spans.items() if n1.startswith("a")
               for n2, (a2, b2) in spans.items() if n2.startswith("b")), spans
