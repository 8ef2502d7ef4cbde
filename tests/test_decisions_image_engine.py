"""What imgbuild does with each Docker Engine (image/engine.py), at each version boundary
itself, on plain facts without an Engine: the zstd pull from 23.0, SOURCE_DATE_EPOCH from 24.0,
the OCI save from 25.0, rewrite-timestamp from 26.0, the oldest API 1.41; the store told from
`docker info`. (tests/test_engine_facts.py judges the recorded Engines 20.10 and 26.)"""

from __future__ import annotations

import dataclasses

import pytest

from imgbuild.image import engine
from imgbuild.image.engine import EngineFacts, decide, release


def facts(version: str = "26.1.5", *, store: str = "classic", api: str = "1.45",
          buildkit_env: bool = False, buildx: str | None = "0.13.1") -> EngineFacts:
    return EngineFacts(host="unix:///t.sock", product="Docker Engine", version=version,
                       api_version=api, store=store,
                       storage_driver="overlay2" if store == "classic" else "overlayfs",
                       driver_type=engine.SNAPSHOTTER if store == "containerd" else None,
                       platform="linux/amd64", operating_system="Debian", client_path="/d",
                       client_version="28.2.2", buildkit_env=buildkit_env,
                       buildx_version=None if buildkit_env else buildx,
                       buildx_driver="docker" if buildx and not buildkit_env else None,
                       builder="b")


@pytest.mark.parametrize("version,zstd", [("22.06.0", False), ("22.99.9", False),
                                          ("23.0.0", True), ("23.0.6+dfsg1", True)])
def test_the_engine_pulls_zstd_from_23_0(version, zstd):
    assert decide(facts(version)).zstd.value is zstd


@pytest.mark.parametrize("version,sde", [("23.0.6", False), ("24.0.0", True), ("25.0.1", True)])
def test_source_date_epoch_from_24_0(version, sde):
    assert decide(facts(version)).source_date_epoch.value is sde


@pytest.mark.parametrize("version,save", [("20.10.24", "legacy"), ("24.0.9", "legacy"),
                                          ("25.0.0", "oci"), ("26.1.5", "oci")])
def test_the_classic_stores_save_is_an_oci_layout_from_25_0(version, save):
    assert decide(facts(version)).save.value == save


def test_the_containerd_stores_save_is_compressed_whatever_the_version():
    assert decide(facts("24.0.0", store="containerd")).save.value == "oci-compressed"
    assert decide(facts("24.0.0", store="containerd")).image_id.value == "manifest"
    assert decide(facts("24.0.0", store="classic")).image_id.value == "config"
    use = decide(facts("26.1.5", store="unknown"))
    assert use.save.value == "unknown" and use.image_id.value == "unknown"
    assert use.cache.value == "unknown" and not use.publishable


@pytest.mark.parametrize("version,store,rewrite", [
    ("25.0.5", "containerd", False), ("26.0.0", "containerd", True),
    ("26.0.0", "classic", False), ("27.0.0", "unknown", "unknown"),
])
def test_rewrite_timestamp_from_26_0_through_the_containerd_store_only(version, store, rewrite):
    assert decide(facts(version, store=store)).rewrite_timestamp.value == rewrite


def test_rewrite_timestamp_is_not_asked_of_a_client_with_buildkit_built_in():
    assert decide(facts("26.0.0", store="containerd", buildkit_env=True)) \
        .rewrite_timestamp.value is False


@pytest.mark.parametrize("store,buildkit_env,buildx,cache", [
    ("containerd", False, "0.13.1", "registry"), ("classic", False, "0.13.1", "inline"),
    ("containerd", True, None, "inline"), ("containerd", False, None, "none"),
])
def test_the_build_cache_exported_depends_on_store_and_client(store, buildkit_env, buildx, cache):
    assert decide(facts(store=store, buildkit_env=buildkit_env, buildx=buildx)).cache.value == cache


@pytest.mark.parametrize("api,refused", [("1.40", True), ("1.41", False), ("1.45", False),
                                         ("2.0", False), ("", True)])
def test_the_oldest_api_is_1_41(api, refused):
    use = decide(facts(api=api))
    assert (use.refusal is not None) is refused
    assert use.publishable is not refused and use.exit_code == (3 if refused else 0)


def test_a_client_without_buildx_or_buildkit_is_refused_and_each_refusal_is_said():
    use = decide(facts(buildx=None))
    assert use.refusal is not None and "buildx" in use.refusal.facts[0]
    assert decide(facts(buildkit_env=True, buildx=None)).refusal is None
    both = decide(facts(api="1.40", buildx=None, store="unknown"))
    assert len(both.refusal.facts) == 3 and len(both.refusal.hints) == 3
    assert both.publish.value is False


@pytest.mark.parametrize("info,product,store", [
    ({"Driver": "overlay2", "DriverStatus": [["Backing Filesystem", "extfs"]]},
     "Docker Engine", "classic"),
    ({"Driver": "overlayfs", "DriverStatus": [["driver-type", engine.SNAPSHOTTER]]},
     "Docker Engine", "containerd"),
    ({"Driver": "overlayfs", "DriverStatus": [["driver-type", "io.containerd.other"]]},
     "Docker Engine", "unknown"),
    ({"Driver": "overlay2", "DriverStatus": [["driver-type", "x"]]}, "Docker Engine", "unknown"),
    ({"Driver": "something"}, "Docker Engine", "unknown"),
    ({"Driver": "overlay2"}, "Podman Engine", "unknown"),
])
def test_the_store_is_told_from_docker_info(info, product, store):
    assert engine._store(info, product)[0] == store


@pytest.mark.parametrize("text,want", [("26.1.5+dfsg1", (26, 1)), ("v0.13.1", (0, 13)),
                                       ("1.45", (1, 45)), ("", (0, 0)), (None, (0, 0)),
                                       ("dev", (0, 0)), ("20.10.24", (20, 10))])
def test_a_release_is_major_and_minor(text, want):
    assert release(text) == want


def test_the_buildx_plugin_builds_only_without_buildkit_built_in():
    f = facts()
    assert f.buildx
    assert not dataclasses.replace(f, buildkit_env=True).buildx
    assert not dataclasses.replace(f, buildx_version=None).buildx


# --- which client ------------------------------------------------------------------------------
# (what a client is asked about buildx, and its answers: tests/test_decisions_engine_read.py)

def test_with_no_client_that_can_build_the_first_found_is_named(monkeypatch):
    from imgbuild.errors import EnvError
    from imgbuild.image import daemon

    def none_builds():
        raise EnvError("no docker client here can build")
    monkeypatch.setattr(daemon, "cli", none_builds)
    monkeypatch.setattr(daemon, "candidates", lambda: ["/a/docker", "/b/docker", "/c/docker"])
    monkeypatch.setattr(daemon, "client_version", lambda p: {"/b/docker": "29.0.1",
                                                             "/c/docker": "28.0.0"}.get(p))
    got = engine._docker_cli()
    assert (got.path, got.version, got.buildkit_env) == ("/b/docker", "29.0.1", False)
    monkeypatch.setattr(daemon, "client_version", lambda p: None)
    with pytest.raises(EnvError):
        engine._docker_cli()
