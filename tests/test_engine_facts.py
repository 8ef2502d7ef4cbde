"""Which Docker Engine imgbuild has, and what it does with it (imgbuild/image/engine.py).

The decisions are fed with what three real Engines said about themselves
(tests/fixtures/engines/, recorded; its README says how, and what was measured beside them):
Debian bookworm's 20.10, trixie's 26.1.5 with the classic store, the same with the containerd
image store; and the clients that meet them: each Engine's own, Docker's 28.2 client (newer than
either server, with or without buildx), bookworm's 20.10 client in front of an Engine 26. A
refusal is tested on the recorded documents with the one field changed that makes it. The one
test that asks a real daemon is marked docker.
"""

from __future__ import annotations

import copy
import io
import json

import pytest
from rich.console import Console

from imgbuild.cli.console import Output
from imgbuild.cli.views import checks as views
from imgbuild.errors import EXIT_ENV, EnvError
from imgbuild.image.daemon import DockerCLI
from imgbuild.image.engine import (
    EngineFacts,
    buildx_driver_from,
    buildx_version_from,
    decide,
    facts_from,
    read_facts,
    release,
    require_publishable,
)

from .conftest import ROOT, run_imgbuild

FIXTURES = ROOT / "tests" / "fixtures" / "engines"
INFO = {"20.10": "info-20.10.json", "26-classic": "info-26-classic.json",
        "26-containerd": "info-26-containerd.json"}
BUILDX = buildx_version_from((FIXTURES / "buildx-version.txt").read_text())
DRIVER = buildx_driver_from((FIXTURES / "buildx-inspect.txt").read_text())


def doc(name: str) -> dict:
    return json.loads((FIXTURES / name).read_text())


def client_of(version: dict, path: str = "/usr/bin/docker") -> DockerCLI:
    """The client that printed `version` (its Client part), as daemon.cli() would record it."""
    v = version["Client"]["Version"]
    return DockerCLI(path, v, 0 < release(v)[0] < 23)


def facts(engine: str, version_file: str, *, buildx: bool = True) -> EngineFacts:
    version = doc(version_file)
    cli = client_of(version)
    return facts_from(doc(INFO[engine]), version, cli, BUILDX if buildx else None,
                      DRIVER if buildx else None, host="unix:///test.sock")


# Each Engine with its own client: the three kinds users run.
BOOKWORM = ("20.10", "version-20.10.json")
CLASSIC = ("26-classic", "version-26-classic.json")
CONTAINERD = ("26-containerd", "version-26-containerd.json")


def test_the_recorded_buildx_is_read():
    assert BUILDX == "0.13.1+ds1" and DRIVER == "docker"
    # Docker's own builds say "v0.14.1 <commit>"; an inspect without a driver line says none.
    assert buildx_version_from("github.com/docker/buildx v0.14.1 59582d7\n") == "0.14.1"
    assert buildx_version_from("") is None
    assert buildx_driver_from("Name: default\n") is None


def test_the_facts_of_each_engine():
    b, c, d = facts(*BOOKWORM), facts(*CLASSIC), facts(*CONTAINERD)
    assert (b.version, b.api_version, b.store, b.storage_driver, b.driver_type) == (
        "20.10.24+dfsg1", "1.41", "classic", "overlay2", None)
    assert (c.version, c.api_version, c.store, c.storage_driver, c.driver_type) == (
        "26.1.5+dfsg1", "1.45", "classic", "overlay2", None)
    assert (d.version, d.api_version, d.store, d.storage_driver, d.driver_type) == (
        "26.1.5+dfsg1", "1.45", "containerd", "overlayfs", "io.containerd.snapshotter.v1")
    for f in (b, c, d):
        assert f.product == "Docker Engine" and f.platform == "linux/amd64"
        assert f.operating_system == "Debian GNU/Linux 12 (bookworm)"
    assert b.buildkit_env and b.buildx_version is None and not b.buildx
    assert b.builder == "BuildKit built into client 20.10.24+dfsg1 (DOCKER_BUILDKIT=1)"
    assert c.builder == d.builder == "buildx 0.13.1+ds1, docker driver" and c.buildx


def test_the_api_shape_reads_as_the_cli_shape():
    """The docker SDK's client.version() is the CLI's `Server` part; its client.info() lacks
    ClientInfo: read_facts gets those, and the facts are the same."""
    version, info = doc("version-26-containerd.json"), doc(INFO["26-containerd"])
    api_info = {k: v for k, v in info.items() if k != "ClientInfo"}
    cli = client_of(version)
    assert facts_from(api_info, version["Server"], cli, BUILDX, DRIVER) == \
        facts_from(info, version, cli, BUILDX, DRIVER)


# --- each Engine's decisions ---------------------------------------------------------------

def test_bookworm_20_10():
    use = decide(facts(*BOOKWORM))
    assert use.publishable and use.refusal is None and use.exit_code == 0
    assert use.save.value == "legacy" and "layer.tar" in use.save.why
    assert use.image_id.value == "config"
    # The 20.10 client's `docker build` has no --cache-to: whatever the store.
    assert use.cache.value == "inline" and "--cache-to" in use.cache.why
    assert use.source_date_epoch.value is False and "0.11" in use.source_date_epoch.why
    assert use.rewrite_timestamp.value is False and "0.13" in use.rewrite_timestamp.why
    assert use.zstd.value is False and "invalid tar header" in use.zstd.why
    assert use.publish.value is True and "legacy layout" in use.publish.why


def test_26_classic_store():
    use = decide(facts(*CLASSIC))
    assert use.publishable
    assert use.save.value == "oci" and "uncompressed" in use.save.why
    assert use.image_id.value == "config"
    # Measured: "Cache export is not supported for the docker driver" under the classic store.
    assert use.cache.value == "inline" and "classic store" in use.cache.why
    assert use.source_date_epoch.value is True
    # Measured: the classic store's exporter ignores rewrite-timestamp (the layer's file kept
    # its time), so imgbuild does not claim it.
    assert use.rewrite_timestamp.value is False and "ignores" in use.rewrite_timestamp.why
    assert use.zstd.value is True


def test_26_containerd_store():
    use = decide(facts(*CONTAINERD))
    assert use.publishable
    assert use.save.value == "oci-compressed" and "compressed digest" in use.save.why
    assert use.image_id.value == "manifest" and "attestation" in use.image_id.why
    assert use.cache.value == "registry" and "mode=max" in use.cache.why
    assert use.source_date_epoch.value is True
    # Measured: the image exporter fails the build, "conflicts with "unpack""
    # (moby/buildkit#4230); the OCI exporter, to an archive loaded after, rewrites the layers
    # (two builds with no cache: the same layers, byte for byte).
    assert use.rewrite_timestamp.value is True and "OCI exporter" in use.rewrite_timestamp.why
    assert "unpack" in use.rewrite_timestamp.why
    assert use.zstd.value is True


# --- clients and servers of different ages --------------------------------------------------

@pytest.mark.parametrize("engine,version_file,save,cache,zstd", [
    ("20.10", "version-client28-server20.10.json", "legacy", "inline", False),
    ("26-classic", "version-client28-server26-classic.json", "oci", "inline", True),
    ("26-containerd", "version-client28-server26-containerd.json", "oci-compressed",
     "registry", True),
])
def test_a_newer_client_with_buildx_is_judged_by_the_engine(engine, version_file, save, cache,
                                                             zstd):
    """The 28.2 client in front of each Engine: what the Engine can do decides, not the client
    (the API is negotiated down to the Engine's)."""
    f = facts(engine, version_file)
    assert f.client_version == "28.2.2" and f.builder == "buildx 0.13.1+ds1, docker driver"
    use = decide(f)
    assert use.publishable
    assert (use.save.value, use.cache.value, use.zstd.value) == (save, cache, zstd)
    assert use.source_date_epoch.value is (engine != "20.10")
    assert use.rewrite_timestamp.value is (engine == "26-containerd")


@pytest.mark.parametrize("engine,version_file", [
    ("26-classic", "version-client20.10-server26-classic.json"),
    ("26-containerd", "version-client20.10-server26-containerd.json"),
])
def test_the_20_10_client_in_front_of_an_engine_26(engine, version_file):
    """An older client than server: the Engine's BuildKit builds (SOURCE_DATE_EPOCH measured to
    reach it), but `docker build` with DOCKER_BUILDKIT=1 asks for no registry cache, not even
    under the containerd store, and no exporter option (`exporter "image" could not be
    found`, measured)."""
    f = facts(engine, version_file, buildx=False)
    assert f.buildkit_env and f.client_version == "20.10.24+dfsg1" and f.version == "26.1.5+dfsg1"
    use = decide(f)
    assert use.publishable
    assert use.cache.value == "inline" and "20.10.24+dfsg1" in use.cache.why
    assert use.source_date_epoch.value is True
    assert use.rewrite_timestamp.value is False and "exporter options" in use.rewrite_timestamp.why
    if engine == "26-containerd":
        # No buildx, so no provenance attestation is said to be added.
        assert use.image_id.value == "manifest" and "attestation" not in use.image_id.why


# --- refusals ----------------------------------------------------------------------------

def _refused(f: EngineFacts) -> EnvError:
    use = decide(f)
    assert not use.publishable and use.exit_code == EXIT_ENV
    assert use.publish.value is False
    with pytest.raises(EnvError) as e:
        require_publishable(f)
    assert e.value.exit_code == EXIT_ENV
    assert e.value.to_dict() == use.refusal.to_dict()
    return e.value


def test_a_client_from_23_without_buildx_is_refused():
    """Docker's 28.2 client alone (recorded in front of the 20.10 Engine), no plugin."""
    err = _refused(facts("20.10", "version-client28-server20.10.json", buildx=False))
    assert err.message == ("imgbuild cannot build and publish with Docker Engine "
                           "20.10.24+dfsg1 at unix:///test.sock")
    assert err.facts == ["the docker client /usr/bin/docker (28.2.2) builds with BuildKit only "
                         "through the buildx plugin, which is missing"]
    assert "docker-buildx" in err.hint and "IMGBUILD_DOCKER" in err.hint
    assert decide(facts("20.10", "version-client28-server20.10.json", buildx=False)
                  ).cache.value == "none"


def test_an_engine_older_than_20_10_is_refused():
    version = copy.deepcopy(doc("version-20.10.json"))
    version["Server"].update(Version="19.03.15", ApiVersion="1.40")
    info = doc(INFO["20.10"]) | {"ServerVersion": "19.03.15"}
    f = facts_from(info, version, client_of(version), None)
    err = _refused(f)
    assert err.facts == ["Docker Engine 19.03.15 speaks API 1.40: older than 20.10 (API 1.41), "
                         "the oldest Engine imgbuild builds with"]
    assert "20.10 or later" in err.hint


@pytest.mark.parametrize("change,said", [
    # A snapshotter type imgbuild does not know (a containerd store of another kind).
    (lambda i, v: i.update(DriverStatus=[["driver-type", "io.containerd.snapshotter.v2"]]),
     "driver-type 'io.containerd.snapshotter.v2'"),
    # No driver-type, and no graph driver of Docker's classic store.
    (lambda i, v: i.update(Driver="lcfs", DriverStatus=[]), "Driver 'lcfs'"),
    # Another product behind the same API (Podman's compat API names itself so).
    (lambda i, v: v["Server"]["Components"][0].update(Name="Podman Engine"),
     "answered by Podman Engine"),
], ids=["another-snapshotter", "another-driver", "another-product"])
def test_a_store_imgbuild_does_not_know_is_refused(change, said):
    info, version = copy.deepcopy(doc(INFO["26-classic"])), copy.deepcopy(
        doc("version-26-classic.json"))
    change(info, version)
    f = facts_from(info, version, client_of(version), BUILDX, DRIVER)
    assert f.store == "unknown"
    err = _refused(f)
    assert len(err.facts) == 1 and "neither Docker's classic store nor the containerd" in \
        err.facts[0] and said in err.facts[0]
    assert "containerd-snapshotter" in err.hint
    use = decide(f)  # nothing is said of what an unknown store does
    assert use.save.value == use.image_id.value == use.cache.value == "unknown"


def test_every_refusal_is_said_at_once():
    """An old Engine and a client without buildx: both facts, both ways out."""
    version = copy.deepcopy(doc("version-client28-server20.10.json"))
    version["Server"].update(Version="19.03.15", ApiVersion="1.40")
    err = _refused(facts_from(doc(INFO["20.10"]), version, client_of(version), None))
    assert len(err.facts) == 2 and "API 1.40" in err.facts[0] and "buildx" in err.facts[1]
    assert err.hint.count("; or ") == 1


def test_require_publishable_passes_what_decide_allows():
    for f in (facts(*BOOKWORM), facts(*CLASSIC), facts(*CONTAINERD)):
        assert require_publishable(f) == decide(f)


# --- the view and the command ----------------------------------------------------------------

def _shown(f: EngineFacts, *, as_json: bool = False) -> tuple[str, str]:
    out, err = io.StringIO(), io.StringIO()
    views.doctor_host(Output(as_json, Console(file=out, width=300), Console(file=err, width=300)),
                      f, decide(f))
    return out.getvalue(), err.getvalue()


def _json_shown(f: EngineFacts, capsys) -> dict:
    capsys.readouterr()
    _shown(f, as_json=True)  # --json is written to stdout itself
    return json.loads(capsys.readouterr().out)


def test_the_report_names_the_engine_and_every_decision(capsys):
    out, err = _shown(facts(*CONTAINERD))
    assert "Docker Engine 26.1.5+dfsg1 at unix:///test.sock" in out
    assert "containerd image store (overlayfs, io.containerd.snapshotter.v1)" in out
    assert "buildx 0.13.1+ds1, docker driver" in out
    for label in ("push reads", "image id", "build cache", "SOURCE_DATE_EPOCH",
                  "rewrite-timestamp", "pulls zstd", "publishes"):
        assert label in out
    assert "oci-compressed" in out and "ok: imgbuild can build and publish" in out and not err
    doc_ = _json_shown(facts(*CONTAINERD), capsys)
    assert doc_["engine"]["store"] == "containerd" and doc_["publishable"] is True
    assert doc_["use"]["cache"]["value"] == "registry" and doc_["refusal"] is None


def test_the_report_of_a_refusal_says_the_fix(capsys):
    f = facts("20.10", "version-client28-server20.10.json", buildx=False)
    out, err = _shown(f)
    assert "none: client 28.2.2 has no buildx plugin" in out
    assert "error" in err and "help" in err and "docker-buildx" in err
    doc_ = _json_shown(f, capsys)
    assert doc_["publishable"] is False and doc_["refusal"]["exit_code"] == EXIT_ENV


def test_doctor_wants_a_log_or_host_and_not_both(tmp_path):
    r = run_imgbuild("doctor", "--json")
    assert r.returncode == 2 and "--host" in json.loads(r.stdout)["hint"]
    log = tmp_path / "server.log"
    log.write_text("hello\n")
    r = run_imgbuild("doctor", str(log), "--host", "--json")
    assert r.returncode == 2 and "not both" in json.loads(r.stdout)["message"]
    r = run_imgbuild("doctor", str(log), "--json")  # as before
    assert r.returncode == 0, r.stderr


def test_doctor_host_without_a_daemon_says_so(tmp_path):
    r = run_imgbuild("doctor", "--host", "--json",
                     env={"DOCKER_HOST": f"unix://{tmp_path / 'no.sock'}"})
    assert r.returncode == 3, r.stdout + r.stderr
    assert json.loads(r.stdout)["message"].startswith("no Docker daemon answers")


@pytest.mark.docker
def test_doctor_host_against_the_engine(docker_client):
    """The real daemon (the shared Engine): the command reports what read_facts and decide say
    of it, and exit 0 where imgbuild can publish from it."""
    r = run_imgbuild("doctor", "--host", "--json")
    assert r.returncode in (0, 3), r.stdout + r.stderr
    got = json.loads(r.stdout)
    f = read_facts(docker_client)
    assert got["engine"]["version"] == docker_client.version()["Version"] == f.version
    assert got["engine"]["store"] in ("classic", "containerd")
    assert got["engine"]["client_path"] == f.client_path
    use = decide(f)
    assert got["use"] == use.to_dict()["use"] and r.returncode == use.exit_code
    human = run_imgbuild("doctor", "--host")
    assert human.returncode == use.exit_code
    assert "what imgbuild does with it" in human.stdout and f.version in human.stdout
