"""What imgbuild reads of an Engine when a document lacks a field (image/engine.py
`facts_from`), how `read_facts` asks the daemon and the client, and every refusal and builder
sentence word for word. The documents are the recorded ones of tests/fixtures/engines/ (real
Engines' `docker info` and `docker version`), with fields taken out; the daemon is a stand-in
that answers with them, and the client a script that prints the recorded `docker buildx`
output."""

from __future__ import annotations

import copy
import stat

import pytest

from imgbuild.image import engine
from imgbuild.image.daemon import DockerCLI
from imgbuild.image.engine import decide, facts_from, read_facts

from .test_engine_facts import BUILDX, DRIVER, FIXTURES, INFO, client_of, doc

INFO26, VERSION26 = doc(INFO["26-containerd"]), doc("version-26-containerd.json")
CLI = client_of(VERSION26)


def test_each_fact_is_read_from_the_version_then_the_info_then_said_unknown():
    server = {k: v for k, v in VERSION26["Server"].items()
              if k not in ("Version", "Os", "Arch", "ApiVersion")}
    f = facts_from(INFO26, server, CLI, BUILDX, DRIVER)
    # (`docker info` says x86_64 where `docker version` says amd64)
    assert (f.version, f.platform, f.api_version) == ("26.1.5+dfsg1", "linux/x86_64", "?")
    info = {k: v for k, v in INFO26.items()
            if k not in ("ServerVersion", "OSType", "Architecture", "Driver",
                         "OperatingSystem")}
    f = facts_from(info, server, CLI, BUILDX, DRIVER)
    assert (f.version, f.platform, f.storage_driver, f.operating_system) == ("?", "?/?", "?", "?")
    # Where the version document has them, its word counts over the info's.
    other = copy.deepcopy(VERSION26)
    other["Server"].update(Version="27.0.0", Os="windows", Arch="arm64")
    f = facts_from(INFO26, other, CLI, BUILDX, DRIVER)
    assert (f.version, f.platform) == ("27.0.0", "windows/arm64")
    assert facts_from(INFO26, VERSION26, CLI, BUILDX, DRIVER).host == ""


def test_a_client_that_builds_with_buildkit_built_in_has_no_buildx_facts():
    old = DockerCLI("/usr/bin/docker", "20.10.24+dfsg1", True)
    f = facts_from(INFO26, VERSION26, old, BUILDX, DRIVER)
    assert (f.buildx_version, f.buildx_driver, f.buildx) == (None, None, False)
    f = facts_from(INFO26, VERSION26, CLI, BUILDX, DRIVER)
    assert (f.buildx_version, f.buildx_driver, f.buildx) == (BUILDX, DRIVER, True)
    f = facts_from(INFO26, VERSION26, CLI, BUILDX, None)
    assert (f.buildx_version, f.buildx_driver) == (BUILDX, None)
    assert f.builder == f"buildx {BUILDX}, driver unknown"
    assert facts_from(INFO26, VERSION26, CLI, None, DRIVER).buildx_driver is None


def test_buildx_s_version_is_its_second_word():
    assert engine.buildx_version_from("github.com/docker/buildx 0.19.3") == "0.19.3"
    assert engine.buildx_version_from("buildx") is None


def test_each_refusal_is_said_word_for_word():
    info = copy.deepcopy(INFO26) | {"Driver": "lcfs", "DriverStatus": []}
    version = copy.deepcopy(VERSION26)
    version["Server"].update(Version="19.03.15", ApiVersion="1.40")
    f = facts_from(info, version, DockerCLI("/opt/docker", "28.2.2", False), None, host="")
    r = decide(f).refusal
    assert r.message == "imgbuild cannot build and publish with Docker Engine 19.03.15"
    assert r.facts == (
        "Docker Engine 19.03.15 speaks API 1.40: older than 20.10 (API 1.41), the oldest Engine "
        "imgbuild builds with",
        "its image store is neither Docker's classic store nor the containerd image store "
        "(Driver 'lcfs'): imgbuild reads images through `docker save`, whose layout is the "
        "store's",
        "the docker client /opt/docker (28.2.2) builds with BuildKit only through the buildx "
        "plugin, which is missing")
    assert r.hints == (
        "upgrade the Engine to 20.10 or later (Debian bookworm's docker.io is 20.10.24), or "
        "point DOCKER_HOST at one",
        "use a Docker Engine with the classic store (overlay2) or the containerd image store "
        '({"features": {"containerd-snapshotter": true}}), or point DOCKER_HOST at one',
        "install the buildx plugin (Debian: docker-buildx; Docker's packages: "
        "docker-buildx-plugin), or set IMGBUILD_DOCKER to a 20.10 client, which has BuildKit "
        "built in")
    assert decide(f).publish.why == "; ".join(r.facts)
    assert r.error().hint == "; or ".join(r.hints)
    podman = copy.deepcopy(VERSION26)
    podman["Server"]["Components"][0].update(Name="Podman Engine")
    info = copy.deepcopy(INFO26) | {"DriverStatus": [["driver-type", "x.v2"]]}
    r = decide(facts_from(info, podman, CLI, BUILDX, DRIVER, host="tcp://h:2375")).refusal
    assert r.message == "imgbuild cannot build and publish with Podman Engine 26.1.5+dfsg1 at " \
                        "tcp://h:2375"
    assert r.facts[0].startswith("its image store is neither Docker's classic store nor the "
                                 "containerd image store (Driver 'overlayfs', driver-type 'x.v2', "
                                 "answered by Podman Engine): ")


def test_the_image_id_and_timestamps_are_said_per_client():
    f = facts_from(INFO26, VERSION26, CLI, BUILDX, DRIVER)
    assert decide(f).image_id.why == (
        "under the containerd store the image id is the digest of the image's index (or "
        "manifest), not of its config; buildx adds a provenance attestation manifest to that "
        "index")
    old = DockerCLI("/usr/bin/docker", "20.10.24+dfsg1", True)
    use = decide(facts_from(INFO26, VERSION26, old, None))
    assert use.image_id.why == ("under the containerd store the image id is the digest of the "
                                "image's index (or manifest), not of its config")
    assert use.rewrite_timestamp.why == (
        "client 20.10.24+dfsg1's `docker build` cannot ask for it (only buildx passes exporter "
        "options)")


@pytest.fixture()
def docker_script(tmp_path):
    """A client that answers `docker buildx version` and `docker buildx inspect` with the
    recorded outputs, and logs what it was asked."""
    log = tmp_path / "asked"
    script = tmp_path / "docker"
    script.write_text(
        "#!/bin/sh\n"
        f'echo "$*" >> "{log}"\n'
        f'case "$2" in version) cat "{FIXTURES / "buildx-version.txt"}";; '
        f'inspect) cat "{FIXTURES / "buildx-inspect.txt"}";; *) exit 1;; esac\n')
    script.chmod(script.stat().st_mode | stat.S_IEXEC)
    return script, log


class Daemon:
    def info(self) -> dict:
        return INFO26

    def version(self) -> dict:
        return VERSION26["Server"]


def test_read_facts_asks_the_daemon_and_the_client_s_buildx(docker_script, monkeypatch):
    script, log = docker_script
    monkeypatch.setenv("DOCKER_HOST", "tcp://10.0.0.1:2376")
    f = read_facts(Daemon(), DockerCLI(str(script), "28.2.2", False))
    assert f == facts_from(INFO26, VERSION26["Server"], DockerCLI(str(script), "28.2.2", False),
                           BUILDX, DRIVER, host="tcp://10.0.0.1:2376")
    assert log.read_text().splitlines() == ["buildx version", "buildx inspect"]
    assert read_facts(Daemon(), DockerCLI(str(script), "28.2.2", False), host="ssh://h").host \
        == "ssh://h"
    monkeypatch.delenv("DOCKER_HOST")
    log.unlink()
    # A client with BuildKit built in is not asked for a plugin it does not use.
    f = read_facts(Daemon(), DockerCLI(str(script), "20.10.24", True))
    assert f.host == "unix:///var/run/docker.sock" and f.buildx_version is None
    assert not log.exists()
