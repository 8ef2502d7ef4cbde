"""Layer compression that fits the client (image/wire.py, catalog/registries.py).

Without the Engine: both compressors give the same bytes whatever the number of workers and
however the stream arrives (so a layer pushed from any runner is the same blob), and the
standard tools (Debian's zstd and gzip) read what they write.

With the Engine, the registry and containerd (docker): tiny-cpu pushed both ways under the same
content tag; containerd pulls the zstd image as a Kubernetes node does, checks its digest and
runs the smoke payload in it; the Engine 20.10 is refused the zstd image before a layer moves,
pulls the gzip one, verifies and smoke-tests it; a second push sends nothing.
"""

from __future__ import annotations

import gzip
import hashlib
import json
import random
import shutil
import subprocess
import uuid
from collections.abc import Iterator

import pytest
import requests
import zstandard

from imgbuild.catalog.registries import load_registries
from imgbuild.errors import SpecError
from imgbuild.image import compression as wire
from imgbuild.image import inlinecache
from imgbuild.plan import render

from .conftest import REGISTRY_HOST, ROOT, registry_available, run_imgbuild

# --- the compressors, no Engine -------------------------------------------------------------


def _sample(n: int = 9 << 20) -> bytes:
    """Compressible and not: text-like runs between random bytes, as a layer of wheels is."""
    rnd = random.Random(7)
    parts = []
    while sum(map(len, parts)) < n:
        parts.append(rnd.randbytes(rnd.randint(1, 50_000)))
        parts.append(("def f(x):\n    return x\n" * rnd.randint(1, 3000)).encode())
    return b"".join(parts)[:n]


def _pieces(data: bytes, size: int) -> Iterator[bytes]:
    return (data[i:i + size] for i in range(0, len(data), size))


def test_zstd_gives_the_same_bytes_for_any_worker_count_and_zstd_reads_them(tmp_path):
    data = _sample()
    one = b"".join(wire._zstd(_pieces(data, 1 << 20), 3, len(data), threads=1))
    many = b"".join(wire._zstd(_pieces(data, 333_333), 3, len(data), threads=4))
    assert one == many
    assert zstandard.ZstdDecompressor().decompress(one) == data
    if shutil.which("zstd"):  # Debian's zstd, the reference reader
        (tmp_path / "l.zst").write_bytes(one)
        out = subprocess.run(["zstd", "-dc", str(tmp_path / "l.zst")], capture_output=True,
                             check=True).stdout
        assert out == data


def test_gzip_gives_the_same_bytes_for_any_worker_count_and_gzip_reads_them(tmp_path):
    data = _sample()
    one = b"".join(wire._gzip(_pieces(data, 1 << 20), 6, workers=1))
    many = b"".join(wire._gzip(_pieces(data, 100_001), 6, workers=4))
    assert one == many
    # Several gzip members (one per 4 MiB block): still one gzip file to every reader.
    assert one.count(b"\x1f\x8b\x08") >= 3
    assert gzip.decompress(one) == data
    (tmp_path / "l.gz").write_bytes(one)
    out = subprocess.run(["gzip", "-dc", str(tmp_path / "l.gz")], capture_output=True,
                         check=True).stdout
    assert out == data
    # And it is compressed: fewer bytes than the text-heavy input.
    assert len(one) < 0.8 * len(data)


def test_a_zstd_image_is_refused_by_engines_older_than_23():
    assert not wire.engine_reads(wire.ZSTD, "20.10.24+dfsg1")
    assert wire.engine_reads(wire.ZSTD, "23.0.1")
    assert wire.engine_reads(wire.ZSTD, "28.2.2")
    assert wire.engine_reads(wire.GZIP, "20.10.24+dfsg1")


def test_the_registry_rule_is_the_longest_match_and_a_project_comes_first(tmp_path):
    built_in, project = tmp_path / "b", tmp_path / "p"
    built_in.mkdir()
    project.mkdir()
    (built_in / "registries.yaml").write_text(
        "default: {compression: gzip}\n"
        "registries:\n"
        "  - {match: ghcr.io/acme, compression: zstd, reason: nodes}\n"
        "  - {match: ghcr.io/acme/legacy, compression: gzip, reason: old engines}\n")
    table = load_registries([built_in])
    assert table.rule_for("ghcr.io/acme/serving").compression == "zstd"
    assert table.rule_for("ghcr.io/acme/legacy/x").compression == "gzip"
    assert table.rule_for("ghcr.io/acmecorp/x").compression == "gzip"  # a prefix of a path only
    assert table.rule_for("127.0.0.1:5000/imgbuild").compression == "gzip"
    (project / "registries.yaml").write_text(
        "default: {compression: zstd}\n"
        "registries: [{match: ghcr.io/acme/serving, compression: gzip, reason: docker 20.10}]\n")
    both = load_registries([built_in, project])
    assert both.rule_for("ghcr.io/acme/serving").compression == "gzip"
    assert both.rule_for("127.0.0.1:5000/imgbuild").compression == "zstd"
    assert both.rule_for("ghcr.io/acme/serving").reason == "docker 20.10"


def test_an_unknown_compression_is_a_spec_error_naming_the_file(tmp_path):
    (tmp_path / "registries.yaml").write_text(
        "registries: [{match: ghcr.io/acme, compression: lz4}]\n")
    with pytest.raises(SpecError) as e:
        load_registries([tmp_path])
    assert "registries.yaml" in str(e.value) and "lz4" in str(e.value)


def test_the_shipped_table_parses_and_defaults_to_gzip():
    table = load_registries([ROOT / "images"])
    assert table.default.compression == "gzip"


# --- pushed both ways, pulled by both clients ---------------------------------------------

MANIFESTS = ("application/vnd.oci.image.manifest.v1+json, "
             "application/vnd.docker.distribution.manifest.v2+json")


def _manifest(ref: str) -> tuple[str, dict]:
    repo, _, tag = ref.removeprefix(f"{REGISTRY_HOST}/").rpartition(":")
    r = requests.get(f"http://{REGISTRY_HOST}/v2/{repo}/manifests/{tag}",
                     headers={"Accept": MANIFESTS}, timeout=30)
    r.raise_for_status()
    return r.headers["Docker-Content-Digest"], r.json()


def _build_json(*args: str) -> dict:
    r = run_imgbuild("build", "tiny-cpu", "--push", "--json", *args)
    assert r.returncode == 0, r.stderr[-3000:]
    return json.loads(r.stdout)


@pytest.fixture(scope="module")
def pushed_both_ways(docker_client) -> dict[str, dict]:
    if not registry_available():
        pytest.skip(f"skipped: no registry on {REGISTRY_HOST} (make services starts one)")
    out = {}
    for comp in ("zstd", "gzip"):
        repo = f"{REGISTRY_HOST}/imgbuild-test-{comp}-{uuid.uuid4().hex[:8]}"
        out[comp] = _build_json("--registry", repo, "--compression", comp) | {"repo": repo}
    return out


@pytest.mark.docker
def test_the_same_content_tag_goes_out_in_either_compression(pushed_both_ways):
    z, g = pushed_both_ways["zstd"], pushed_both_ways["gzip"]
    ztag = z["content_tag"].rpartition(":")[2]
    assert ztag == g["content_tag"].rpartition(":")[2]  # compression is not in the content key
    zd, zm = _manifest(f"{z['repo']}:{ztag}")
    gd, gm = _manifest(f"{g['repo']}:{ztag}")
    assert zd != gd
    assert {layer["mediaType"] for layer in zm["layers"]} == {wire.ZSTD.media_type}
    assert {layer["mediaType"] for layer in gm["layers"]} == {wire.GZIP.media_type}
    # Each push sends its image's config as the Engine keeps it (its digest is the image id).
    assert zm["config"]["digest"] == z["image_id"] and gm["config"]["digest"] == g["image_id"]
    # One content tag, two builds (one per repository): the same image, its diff ids included.
    # Only BuildKit's inline cache records may differ: a build that ran a step and one that
    # took it from the cache write them differently (seen on an Engine whose images were
    # pruned while its build cache was kept).
    zc, gc = (json.loads(requests.get(f"http://{REGISTRY_HOST}/v2/{d['repo'].split('/', 1)[1]}"
                                      f"/blobs/{m['config']['digest']}", timeout=30).content)
              for d, m in ((z, zm), (g, gm)))
    assert zc["rootfs"]["diff_ids"] and zc["rootfs"] == gc["rootfs"]
    assert {k: v for k, v in zc.items() if k != inlinecache.CONFIG_KEY} == \
        {k: v for k, v in gc.items() if k != inlinecache.CONFIG_KEY}
    assert sum(x["size"] for x in zm["layers"]) < sum(x["size"] for x in gm["layers"])
    # The report, and the moving tags, follow each pushed digest.
    assert z["push"]["compression"] == "zstd" and g["push"]["compression"] == "gzip"
    assert z["report"].endswith(zd.replace(":", "-") + ".smoke")
    assert all(p.endswith("@" + zd) for p in z["pushed"])
    assert _manifest(f"{z['repo']}:tiny-cpu")[0] == zd


@pytest.mark.docker
def test_a_zstd_image_is_no_build_cache_for_an_engine_that_cannot_read_it(pushed_both_ways,
                                                                         docker_client):
    from imgbuild.image.registry import Repository
    from imgbuild.pipeline.build import readable_cache

    z, g = pushed_both_ways["zstd"], pushed_both_ways["gzip"]
    readable = wire.engine_reads(wire.ZSTD, docker_client.version()["Version"])
    assert readable_cache(docker_client, Repository.parse(z["repo"]), tuple(z["refs"])) == (
        tuple(z["refs"]) if readable else ())
    assert readable_cache(docker_client, Repository.parse(g["repo"]), tuple(g["refs"])) == \
        tuple(g["refs"])


@pytest.mark.docker
def test_a_second_push_sends_no_layer(pushed_both_ways):
    g = pushed_both_ways["gzip"]
    again = _build_json("--registry", g["repo"], "--compression", "gzip")
    assert again["push"]["sent_bytes"] == 0
    assert again["push"]["reused_layers"] > 0
    assert again["pushed"][0] == g["pushed"][0]


@pytest.mark.docker
@pytest.mark.xdist_group("containerd")
def test_containerd_pulls_the_zstd_image_and_runs_its_smoke_payload(pushed_both_ways, tmp_path):
    from .containerd import containerd_daemon

    z = pushed_both_ways["zstd"]
    ref = z["content_tag"]
    digest = z["pushed"][0].rpartition("@")[2]
    # As a node pulls it: the kubelet's CRI PullImage, layers unpacked while others download.
    with containerd_daemon(tmp_path, cri=True) as ctrd:
        assert ctrd.kubelet_pull(ref) == digest
        a = render.ASSETS
        r = ctrd.run(ref, ["python", f"{a}/smoke.py", "--lock", f"{a}/lock.txt", "--model",
                           f"{a}/smoke-model", "--facts", f"{a}/image.json", "--gpu", "off",
                           "--engine", "transformers", "--json"], timeout=600)
    assert r.returncode == 0, (r.stdout + r.stderr)[-2000:]
    report = json.loads(r.stdout[r.stdout.index("{"):])
    stages = {s["name"]: s["status"] for s in report["stages"]}
    assert report["ok"] and stages["checkpoint-cpu"] == "pass", stages


@pytest.mark.docker
def test_the_engine_is_refused_the_zstd_image_before_the_download(pushed_both_ways,
                                                                   docker_client):
    version = docker_client.version()["Version"]
    if wire.engine_reads(wire.ZSTD, version):
        pytest.skip(f"skipped: Docker Engine {version} reads zstd")
    z = pushed_both_ways["zstd"]
    r = run_imgbuild("pull", "tiny-cpu", "--registry", z["repo"])
    assert r.returncode == 3, r.stderr
    assert "cannot unpack" in r.stderr and "zstd" in r.stderr
    assert "Engine 23" in r.stderr and "nothing was downloaded" in r.stderr
    assert "Traceback" not in r.stderr
    # Nothing of it is in the Engine: no tag, no repo digest of that repository.
    for img in docker_client.images.list():
        assert not any(d.startswith(z["repo"] + "@") for d in img.attrs.get("RepoDigests", []))


@pytest.mark.docker
def test_the_engine_pulls_the_gzip_image_verifies_it_and_it_is_the_smoke_tested_one(
        pushed_both_ways, docker_client):
    g = pushed_both_ways["gzip"]
    for t in g["refs"]:
        docker_client.images.remove(t)
    r = run_imgbuild("pull", "tiny-cpu", "--registry", g["repo"], "--json")
    assert r.returncode == 0, r.stderr[-2000:]
    got = json.loads(r.stdout)
    digest = g["pushed"][0].rpartition("@")[2]
    assert got["digest"] == digest
    v = run_imgbuild("verify", g["content_tag"])
    assert v.returncode == 0, v.stdout + v.stderr
    # The image the push's smoke test passed, not another run of it: the same image id (its
    # config's digest, naming every layer's diff id, each checked by the Engine as it unpacked
    # it), and that report stored by its digest. The smoke payload run on a pulled image is
    # test_containerd_pulls_the_zstd_image_and_runs_its_smoke_payload's.
    assert docker_client.images.get(g["content_tag"]).id == g["image_id"]
    assert got["smoke_report"]["ok"] is True



@pytest.mark.docker
def test_a_needed_layer_the_size_of_a_held_one_is_still_sent(docker_client, tmp_path):
    """Engine 20.10's `docker save` names a layer only once it is hashed, so a layer the size of
    one the registry holds is first hashed, not compressed; when it turns out to be new after
    all, a second pass sends it."""
    import os as _os

    from imgbuild.image import registry as image_registry
    from imgbuild.image import wire as push_wire
    from imgbuild.image.registry import Repository

    if not registry_available():
        pytest.skip(f"skipped: no registry on {REGISTRY_HOST} (make services starts one)")
    base = docker_client.images.list(name="imgbuild-base")
    if not base:
        pytest.skip("skipped: no imgbuild-base image here (make demo bootstraps it)")
    repo = f"{REGISTRY_HOST}/imgbuild-test-collide-{uuid.uuid4().hex[:8]}"
    ctx = tmp_path / "ctx"
    ctx.mkdir()
    (ctx / "a").write_bytes(_os.urandom(100_000))
    (ctx / "b").write_bytes(_os.urandom(100_000))  # the same size: the same tar size
    (ctx / "Dockerfile").write_text(f"FROM {base[0].tags[0]}\nCOPY a /a\n")
    docker_client.images.build(path=str(ctx), tag=f"{repo}:one", rm=True)
    (ctx / "Dockerfile").write_text(f"FROM {repo}:one\nCOPY b /b\n")
    docker_client.images.build(path=str(ctx), tag=f"{repo}:two", rm=True)
    try:
        r = Repository.parse(repo)
        gz = wire.compression("gzip")
        first = push_wire.push(docker_client, f"{repo}:one", r, comp=gz)
        second = push_wire.push(docker_client, f"{repo}:two", r, comp=gz, hint_refs=("one",))
        # The base's and /a's (the base's may have been mounted: pushed here before).
        assert second.reused_layers == first.sent_layers + first.reused_layers
        assert second.sent_layers == 1
        _, m = _manifest(f"{repo}:two")
        assert len(m["layers"]) == first.sent_layers + first.reused_layers + 1
        docker_client.images.remove(f"{repo}:two")
        image_registry.pull(docker_client, f"{repo}:two")
        got = docker_client.containers.run(f"{repo}:two", ["sha256sum", "/b"], remove=True,
                                           entrypoint=[])
        assert got.decode().split()[0] == hashlib.sha256((ctx / "b").read_bytes()).hexdigest()
    finally:
        for t in ("two", "one"):
            try:
                docker_client.images.remove(f"{repo}:{t}")
            except Exception:  # noqa: BLE001 (gone already)
                pass


@pytest.mark.docker
def test_a_push_to_another_repository_mounts_the_layers_it_pushed_before(docker_client,
                                                                         tmp_path, monkeypatch):
    """As Docker does: a layer this machine pushed to one repository of a registry is mounted
    into another (the registry links its blob; nothing read, compressed or sent), and the
    manifest is written only once every layer is there. A source that no longer holds the blob
    (the registry opens an upload instead: 202) costs nothing but a send: the upload it opened
    is cancelled, and the layer goes as it would have."""
    import json as _json
    import os as _os

    import requests as _requests

    from imgbuild.image import wire as push_wire
    from imgbuild.image.registry import Repository, manifest_digest

    if not registry_available():
        pytest.skip(f"skipped: no registry on {REGISTRY_HOST} (make services starts one)")
    base = docker_client.images.list(name="imgbuild-base")
    if not base:
        pytest.skip("skipped: no imgbuild-base image here (make demo bootstraps it)")
    monkeypatch.setenv("IMGBUILD_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("IMGBUILD_BLOB_CACHE_GB", "0")  # a send is a send: from the Engine
    ctx = tmp_path / "ctx"
    ctx.mkdir()
    (ctx / "a").write_bytes(_os.urandom(2_000_000))
    (ctx / "Dockerfile").write_text(f"FROM {base[0].tags[0]}\nCOPY a /a\n")
    name = f"imgbuild-test-mount-{uuid.uuid4().hex[:8]}"
    image, _ = docker_client.images.build(path=str(ctx), tag=f"{name}:t", rm=True)
    gz = wire.compression("gzip")

    def push_to(suffix: str):
        repo = f"{REGISTRY_HOST}/{name}-{suffix}"
        image.tag(repo, "t")
        try:
            return push_wire.push(docker_client, f"{repo}:t", Repository.parse(repo), comp=gz)
        finally:
            docker_client.images.remove(f"{repo}:t")

    try:
        first = push_to("a")
        assert first.sent_layers >= 2 and first.mounted_layers == 0
        second = push_to("b")
        assert second.sent_bytes == 0 and second.sent_layers == 0
        assert second.mounted_layers == second.reused_layers == first.sent_layers
        assert second.digest == first.digest
        assert manifest_digest(Repository.parse(f"{REGISTRY_HOST}/{name}-b"), "t") == \
            first.digest
        # Every blob the manifest names is in the second repository, at its size.
        m = _json.loads(second.manifest)
        for layer in m["layers"]:
            h = _requests.head(f"http://{REGISTRY_HOST}/v2/{name}-b/blobs/{layer['digest']}",
                               timeout=30)
            assert h.status_code == 200
            assert int(h.headers["Content-Length"]) == layer["size"]
        # The memory names a repository that never held the top layer: no mount, a send.
        memory = push_wire._memory()
        doc = _json.loads(memory.read_text())
        top = image.attrs["RootFS"]["Layers"][-1]
        doc[REGISTRY_HOST]["gzip"][top]["repos"] = [f"{name}-nowhere"]
        memory.write_text(_json.dumps(doc))
        third = push_to("c")
        assert third.sent_layers == 1 and third.mounted_layers == first.sent_layers - 1
        assert third.digest == first.digest
    finally:
        docker_client.images.remove(f"{name}:t", force=True)


@pytest.mark.docker
def test_a_layer_compressed_once_is_sent_again_from_the_blob_cache(docker_client, tmp_path,
                                                                   monkeypatch):
    """The second push of an image, to another repository, sends the bytes the first one
    compressed, from this machine's blob cache: no `docker save`, the same blobs and manifest.
    A cached blob whose bytes no longer match is dropped and compressed again; a limit of 0
    turns the cache off. Each push here forgets where the layers went before (another
    registry, to the blob cache): where it remembers, the layers are mounted, not sent (the
    test after this one)."""
    import os as _os

    from imgbuild.image import blobcache
    from imgbuild.image import wire as push_wire
    from imgbuild.image.registry import Repository

    if not registry_available():
        pytest.skip(f"skipped: no registry on {REGISTRY_HOST} (make services starts one)")
    base = docker_client.images.list(name="imgbuild-base")
    if not base:
        pytest.skip("skipped: no imgbuild-base image here (make demo bootstraps it)")
    monkeypatch.setenv("IMGBUILD_CACHE", str(tmp_path / "cache"))
    ctx = tmp_path / "ctx"
    ctx.mkdir()
    (ctx / "a").write_bytes(_os.urandom(3_000_000))
    (ctx / "Dockerfile").write_text(f"FROM {base[0].tags[0]}\nCOPY a /a\n")
    name = f"imgbuild-test-blobcache-{uuid.uuid4().hex[:8]}"
    image, _ = docker_client.images.build(path=str(ctx), tag=f"{name}:t", rm=True)
    saves = []
    real_get_image = docker_client.api.get_image

    def counted(*a, **kw):
        saves.append(a)
        return real_get_image(*a, **kw)

    monkeypatch.setattr(docker_client.api, "get_image", counted)
    gz = wire.compression("gzip")

    def push_to(suffix: str):
        repo = f"{REGISTRY_HOST}/{name}-{suffix}"
        image.tag(repo, "t")
        push_wire._memory().unlink(missing_ok=True)  # no repository to mount from
        try:
            return push_wire.push(docker_client, f"{repo}:t", Repository.parse(repo), comp=gz)
        finally:
            docker_client.images.remove(f"{repo}:t")

    try:
        first = push_to("a")
        assert first.cached_layers == 0 and first.sent_layers >= 2 and len(saves) == 1
        second = push_to("b")
        assert len(saves) == 1  # nothing exported from the Engine
        assert second.cached_layers == second.sent_layers == first.sent_layers
        assert second.digest == first.digest and second.sent_bytes == first.sent_bytes
        # A blob whose bytes changed on disk is not sent: compressed again, the same digest.
        diff_id = image.attrs["RootFS"]["Layers"][-1]
        path = blobcache._layer_path(gz.recipe, diff_id)
        data = bytearray(path.read_bytes())
        data[100] ^= 0xFF
        path.write_bytes(bytes(data))
        third = push_to("c")
        assert third.cached_layers == first.sent_layers - 1 and len(saves) == 2
        assert third.digest == first.digest
        assert blobcache.layer(gz.recipe, diff_id) is not None  # kept again, right this time
        monkeypatch.setenv("IMGBUILD_BLOB_CACHE_GB", "0")
        fourth = push_to("d")
        assert fourth.cached_layers == 0 and len(saves) == 3 and fourth.digest == first.digest
    finally:
        docker_client.images.remove(f"{name}:t", force=True)


def test_the_blob_cache_keeps_to_its_limit_dropping_the_least_recently_used(tmp_path,
                                                                           monkeypatch):
    import os as _os
    import time as _time

    from imgbuild.image import blobcache

    monkeypatch.setenv("IMGBUILD_CACHE", str(tmp_path))
    monkeypatch.setenv("IMGBUILD_BLOB_CACHE_GB", "0.000003")  # 3000 bytes
    for i in range(4):
        with blobcache.writer("gzip") as f:
            body = bytes([i]) * 1000
            f.write(body)
            blobcache.commit(f, "gzip", f"sha256:{i:064x}", "sha256:" +
                             hashlib.sha256(body).hexdigest(), 1000, 1000)
        path = blobcache._layer_path("gzip", f"sha256:{i:064x}")
        _os.utime(path, (_time.time() - 100 + i, _time.time() - 100 + i))
        if i == 1:  # 0 used again: now the most recent
            assert blobcache.layer("gzip", f"sha256:{0:064x}") is not None
    kept = {i for i in range(4) if blobcache._layer_path("gzip", f"sha256:{i:064x}").exists()}
    assert kept == {0, 2, 3}  # 3000 bytes; 1 the least recently used (0 was read again)
    assert not list((tmp_path / "blobs" / "layers" / "gzip").glob(".partial-*"))


def test_the_blob_cache_keeps_each_compressors_bytes_apart():
    """Another level or library version may write other bytes for the same layer: its blobs
    are kept under another recipe, never sent for this one."""
    import dataclasses

    assert wire.GZIP.recipe != wire.ZSTD.recipe
    assert wire.GZIP.recipe != dataclasses.replace(wire.GZIP, level=9).recipe
    assert wire.ZSTD.recipe != dataclasses.replace(wire.ZSTD, level=19).recipe
    assert "libdeflate" in wire.GZIP.recipe and "libzstd" in wire.ZSTD.recipe
