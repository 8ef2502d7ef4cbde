"""How imgbuild reads an Engine and its client (image/engine.py read_facts, facts_from,
_buildx) and what it says when it refuses one. The daemon's answers are the recorded ones in
tests/fixtures/engines/ (`docker info` and `docker version` of real Engines), handed over by a
stand-in with the docker SDK client's two calls; the docker client is a script that answers
`docker buildx version` and `docker buildx inspect` as the real one did. Against real Engines
this path runs in tests/test_engines.py (the docker group)."""

from __future__ import annotations

import json
import stat
from dataclasses import replace
from pathlib import Path

import pytest

from imgbuild.image import daemon, engine
from imgbuild.image.daemon import DockerCLI

ENGINES = Path(__file__).parent / "fixtures" / "engines"


class API:
    """The docker SDK client's info() and version(), answering as the recorded Engine did."""

    def __init__(self, info: str, version: str) -> None:
        self._info = json.loads((ENGINES / info).read_text())
        self._version = json.loads((ENGINES / version).read_text())

    def info(self) -> dict:
        return self._info

    def version(self) -> dict:
        return self._version["Server"] | {}  # the API's /version is the Server part


def _client(tmp_path: Path, *, version_ok: bool = True, inspect_ok: bool = True) -> Path:
    """A docker client that answers the buildx questions as Debian's docker-buildx did, and
    writes down each question it was asked."""
    asked = tmp_path / "asked"
    script = tmp_path / "docker"
    script.write_text(f"""#!/bin/sh
echo "$*" >> {asked}
case "$2" in
  version) {'cat ' + str(ENGINES / 'buildx-version.txt') if version_ok else 'exit 1'} ;;
  inspect) {'cat ' + str(ENGINES / 'buildx-inspect.txt') if inspect_ok else 'exit 1'} ;;
esac
""")
    script.chmod(script.stat().st_mode | stat.S_IXUSR)
    return script


@pytest.fixture()
def no_daemon(monkeypatch):
    """Nothing may reach for the machine's own daemon or client."""
    def refuse(*a, **k):
        raise AssertionError("the machine's daemon or client was asked")

    monkeypatch.setattr(daemon, "client", refuse)
    monkeypatch.setattr(engine, "_docker_cli", refuse)
    monkeypatch.delenv("DOCKER_HOST", raising=False)


def test_the_facts_come_from_the_engine_and_the_client_given(tmp_path, no_daemon):
    docker = _client(tmp_path)
    f = engine.read_facts(API("info-26-containerd.json", "version-26-containerd.json"),
                          DockerCLI(str(docker), "26.1.5", False), host="tcp://gpu-1:2376")
    assert (f.host, f.product, f.store, f.version) == (
        "tcp://gpu-1:2376", "Docker Engine", "containerd", "26.1.5+dfsg1")
    assert (f.client_path, f.client_version) == (str(docker), "26.1.5")
    assert (f.buildx_version, f.buildx_driver) == ("0.13.1+ds1", "docker")
    assert (tmp_path / "asked").read_text() == "buildx version\nbuildx inspect\n"
    assert f.builder == "buildx 0.13.1+ds1, docker driver"


def test_a_client_with_buildkit_built_in_is_not_asked_about_buildx(tmp_path, no_daemon):
    docker = _client(tmp_path)
    f = engine.read_facts(API("info-20.10.json", "version-20.10.json"),
                          DockerCLI(str(docker), "20.10.24", True))
    assert not (tmp_path / "asked").exists()
    assert f.buildx_version is None and f.buildkit_env
    assert f.host == "unix:///var/run/docker.sock"  # no DOCKER_HOST: the default socket


def test_the_host_said_is_docker_host_unless_one_is_given(tmp_path, no_daemon, monkeypatch):
    monkeypatch.setenv("DOCKER_HOST", "ssh://builder")
    cli = DockerCLI(str(_client(tmp_path)), "20.10.24", True)
    api = API("info-20.10.json", "version-20.10.json")
    assert engine.read_facts(api, cli).host == "ssh://builder"
    assert engine.read_facts(api, cli, host="unix:///run/user.sock").host == "unix:///run/user.sock"


def test_a_buildx_that_does_not_answer_is_none_and_an_inspect_that_fails_no_driver(tmp_path):
    for d in "abc":
        (tmp_path / d).mkdir()
    assert engine._buildx(str(_client(tmp_path / "c"))) == ("0.13.1+ds1", "docker")
    assert engine._buildx(str(_client(tmp_path / "a", version_ok=False))) == (None, None)
    assert engine._buildx(str(_client(tmp_path / "b", inspect_ok=False))) == ("0.13.1+ds1", None)
    assert engine._buildx(str(tmp_path / "no-such-docker")) == (None, None)


def test_what_info_says_stands_in_for_what_version_leaves_out():
    cli = DockerCLI("/usr/bin/docker", "26.1.5", False)
    info = {"ServerVersion": "26.1.5", "OSType": "linux", "Architecture": "aarch64",
            "Driver": "overlay2"}
    f = engine.facts_from(info, {"Server": {}}, cli, "0.13.1", "docker")
    assert (f.version, f.platform, f.api_version) == ("26.1.5", "linux/aarch64", "?")
    f = engine.facts_from({}, {}, cli, None)
    assert (f.version, f.platform, f.storage_driver, f.operating_system) == ("?", "?/?", "?", "?")
    assert f.buildx_driver is None and f.builder == "none: client 26.1.5 has no buildx plugin"
    f = engine.facts_from(info, {}, cli, "0.13.1", None)
    assert f.builder == "buildx 0.13.1, driver unknown"


def test_buildx_version_is_its_second_word():
    assert engine.buildx_version_from("buildx v0.11") == "0.11"
    assert engine.buildx_version_from("buildx") is None


def _facts(**kw) -> engine.EngineFacts:
    cli = DockerCLI("/usr/bin/docker", "26.1.5", False)
    f = engine.facts_from(json.loads((ENGINES / "info-26-classic.json").read_text()),
                          json.loads((ENGINES / "version-26-classic.json").read_text()), cli,
                          "0.13.1", "docker", host="unix:///var/run/docker.sock")
    return replace(f, **kw)


def test_an_engine_too_old_and_a_store_unknown_are_refused_in_full():
    f = _facts(api_version="1.40", store="unknown", storage_driver="zfs", driver_type="x",
               product="Podman Engine")
    r = engine.decide(f).refusal
    assert r.message == ("imgbuild cannot build and publish with Podman Engine 26.1.5+dfsg1 at "
                         "unix:///var/run/docker.sock")
    assert r.facts == (
        "Podman Engine 26.1.5+dfsg1 speaks API 1.40: older than 20.10 (API 1.41), the oldest "
        "Engine imgbuild builds with",
        "its image store is neither Docker's classic store nor the containerd image store "
        "(Driver 'zfs', driver-type 'x', answered by Podman Engine): imgbuild reads images "
        "through `docker save`, whose layout is the store's")
    assert r.error().hint == (
        "upgrade the Engine to 20.10 or later (Debian bookworm's docker.io is 20.10.24), or "
        "point DOCKER_HOST at one; or use a Docker Engine with the classic store (overlay2) or "
        "the containerd image store ({\"features\": {\"containerd-snapshotter\": true}}), or "
        "point DOCKER_HOST at one")
    assert engine.decide(f).publish == engine.Decision(False, "; ".join(r.facts))
    # a Docker Engine's own unknown store, no driver-type, no host: said without them
    r = engine.decide(_facts(store="unknown", storage_driver="zfs", driver_type=None,
                             host="")).refusal
    assert r.message == "imgbuild cannot build and publish with Docker Engine 26.1.5+dfsg1"
    assert "(Driver 'zfs'): imgbuild reads" in r.facts[0]


def test_the_engines_own_version_answer_comes_before_infos():
    cli = DockerCLI("/usr/bin/docker", "20.10.24", True)
    info = {"ServerVersion": "from-info", "OSType": "info-os", "Architecture": "info-arch"}
    f = engine.facts_from(info, {"Server": {"Version": "26.1.5", "Os": "linux",
                                            "Arch": "x86_64"}}, cli, "0.13.1", "docker")
    assert (f.version, f.platform) == ("26.1.5", "linux/x86_64")
    # a client with BuildKit built in uses no buildx: neither its version nor its driver
    assert (f.buildx_version, f.buildx_driver) == (None, None)
    assert f.host == ""  # where it points is said only when known
