"""`outdated` and `relock` against an upstream index that publishes while the test runs
(pypiserver on loopback, small real wheels), and once against real PyPI (marker `live`)."""

from __future__ import annotations

import shutil
import uuid

import pytest
import requests

from imgbuild.ci import outdated as od
from imgbuild.lock.lockfile import read_lock
from imgbuild.lock.resolve import ensure_lock
from imgbuild.workspace import Workspace

from .conftest import REGISTRY_HOST, ROOT, registry_available
from .wheelfactory import LocalIndex, WheelSpec

SPEC = """\
description: a test target on a local index
engine:
  name: vllm
  version: "1.0"  # the engine under test; relock moves this line
archs: [cpu]
os: debian-bookworm
requirements:
  # pinned on purpose: the newest engine wants another one
  - compressed-tensors==0.10.0
"""


@pytest.fixture()
def upstream(tmp_path, monkeypatch):
    ix = LocalIndex(tmp_path / "index")
    ix.add(WheelSpec("compressed-tensors", "0.10.0"))
    ix.add(WheelSpec("compressed-tensors", "0.11.0"))
    ix.add(WheelSpec("transformers", "4.0"))
    ix.add(WheelSpec("vllm", "1.0", requires=("compressed-tensors==0.10.0", "transformers>=4.0")))
    ix.start()
    monkeypatch.setenv("UV_INDEX_URL", ix.url)
    monkeypatch.setenv("UV_CACHE_DIR", str(tmp_path / "uv-cache"))
    yield ix
    ix.stop()


@pytest.fixture()
def catalog(tmp_path, upstream):
    """images/ with the shared data (bases, gpus, cuda, models) and one target, locked."""
    images = tmp_path / "images"
    images.mkdir()
    for name in ("bases.yaml", "gpus.yaml", "cuda.yaml"):
        shutil.copy(ROOT / "images" / name, images / name)
    shutil.copytree(ROOT / "images" / "models", images / "models")
    shutil.copytree(ROOT / "images" / "generators", images / "generators")
    (images / "t.yaml").write_text(SPEC)
    ws = Workspace(images, tmp_path / "lockfiles")
    lock, written = ensure_lock(ws.target("t").request, ws.lockfiles)
    assert written and lock.package("vllm").version == "1.0"
    return ws


def _news(ws) -> dict[str, od.PackageNews]:
    [tn] = od.outdated(ws, check_bases=False)
    assert tn.target == "t" and not tn.errors, tn.errors
    return {p.package: p for p in tn.packages}


def test_newer_engine_published_during_the_test_is_available_with_its_lock_diff(catalog, upstream):
    ws = catalog
    before = _news(ws)
    assert before["vllm"].status == "current" and before["vllm"].role == "engine"
    assert before["transformers"].status == "current"
    upstream.add(WheelSpec("vllm", "1.1", requires=("compressed-tensors==0.10.0", "transformers>=4.0")))
    news = _news(ws)["vllm"]
    assert news.status == "available" and news.available == "1.1" and news.latest == "1.1"
    assert od.diff_lines(news.changes) == ["-vllm==1.0", "+vllm==1.1"]
    # JSON as the CLI prints it
    d = od.to_dict(od.outdated(ws, check_bases=False))["targets"][0]
    [v] = [p for p in d["packages"] if p["package"] == "vllm"]
    assert v["status"] == "available" and v["diff"] == ["-vllm==1.0", "+vllm==1.1"]


def test_newer_engine_blocked_by_the_targets_exact_pin(catalog, upstream):
    ws = catalog
    upstream.add(WheelSpec("vllm", "1.1", requires=("compressed-tensors==0.10.0", "transformers>=4.0")))
    upstream.add(WheelSpec("vllm", "1.2", requires=("compressed-tensors==0.11.0", "transformers>=4.0")))
    news = _news(ws)
    v = news["vllm"]
    assert v.latest == "1.2" and v.status == "blocked"
    assert v.blocked_by == ("images/t.yaml requires compressed-tensors==0.10.0",)
    assert v.needs == ("vllm==1.2 requires compressed-tensors==0.11.0",)
    # ... and the newest one it can take is still reported, with its diff.
    assert v.available == "1.1" and od.diff_lines(v.changes) == ["-vllm==1.0", "+vllm==1.1"]
    assert "1.2 blocked by images/t.yaml requires compressed-tensors==0.10.0" in od.summary(v)
    # The target's own pin of compressed-tensors: 0.11.0 exists, the locked engine pins 0.10.0.
    ct = news["compressed-tensors"]
    assert ct.role == "pinned" and ct.status == "blocked" and ct.latest == "0.11.0"
    assert ct.blocked_by == ("vllm==1.0 requires compressed-tensors==0.10.0",)


def test_relock_engine_edits_the_spec_and_writes_the_expected_diff(catalog, upstream):
    ws = catalog
    upstream.add(WheelSpec("vllm", "1.1", requires=("compressed-tensors==0.10.0", "transformers>=4.0")))
    upstream.add(WheelSpec("vllm", "1.2", requires=("compressed-tensors==0.11.0", "transformers>=4.0")))
    old = read_lock(next(ws.lockfiles.glob("t.*.txt")))
    res = od.relock(ws, "t", ["vllm"])
    assert res.written
    assert res.spec_edits == ("images/t.yaml: engine.version 1.0 → 1.1",)
    assert res.diff[2:] == ["-vllm==1.0", "+vllm==1.1"]
    spec = (ws.images / "t.yaml").read_text()
    assert spec == SPEC.replace('version: "1.0"  # the engine', 'version: "1.1"  # the engine')
    # The lock was written for the edited spec: `plan`/`build` reuse it without resolving.
    ws2 = Workspace(ws.images, ws.lockfiles)  # the edited spec
    lock, written = ensure_lock(ws2.target("t").request, ws.lockfiles)
    assert not written and lock.package("vllm").version == "1.1"
    assert {p.name: p.version for p in lock.packages if p.name != "vllm"} == \
        {p.name: p.version for p in old.packages if p.name != "vllm"}
    # Asking for the blocked one explains itself and leaves everything as it was.
    with pytest.raises(od.ResolveError) as e:
        od.relock(ws2, "t", ["vllm==1.2"])
    assert "images/t.yaml requires compressed-tensors==0.10.0" in e.value.facts
    assert (ws.images / "t.yaml").read_text() == spec and read_lock(lock.path).body == lock.body


def test_relock_of_a_multi_platform_target_moves_every_platforms_lock(catalog, upstream):
    ws = catalog
    (ws.images / "t.yaml").write_text(SPEC + "platforms: [linux/amd64, linux/arm64]\n")
    ws = Workspace(ws.images, ws.lockfiles)
    for ref in ws.platform_refs("t"):
        ensure_lock(ref.request, ws.lockfiles)
    upstream.add(WheelSpec("vllm", "1.1", requires=("compressed-tensors==0.10.0", "transformers>=4.0")))
    res = od.relock(ws, "t", ["vllm"])
    assert res.written and res.spec_edits == ("images/t.yaml: engine.version 1.0 → 1.1",)
    ws2 = Workspace(ws.images, ws.lockfiles)  # the edited spec
    for ref in ws2.platform_refs("t"):
        lock, written = ensure_lock(ref.request, ws.lockfiles)
        assert not written, ref.lock_path.name  # written for the edited spec, both of them
        assert lock.package("vllm").version == "1.1", ref.lock_path.name


def test_relock_dependency_with_upgrade_package(catalog, upstream):
    ws = catalog
    upstream.add(WheelSpec("transformers", "4.1"))
    tr = _news(ws)["transformers"]
    assert tr.role == "dependency" and tr.status == "available"
    assert od.diff_lines(tr.changes) == ["-transformers==4.0", "+transformers==4.1"]
    spec = (ws.images / "t.yaml").read_text()
    res = od.relock(ws, "t", ["transformers"])
    assert res.spec_edits == () and [(c.package, c.old, c.new) for c in res.changes] == \
        [("transformers", "4.0", "4.1")]
    assert (ws.images / "t.yaml").read_text() == spec
    again = od.relock(ws, "t", ["transformers"])
    assert not again.written and "nothing to do" in again.note


def test_override_holds_a_package(catalog, upstream):
    ws = catalog
    upstream.add(WheelSpec("transformers", "4.1"))
    (ws.images / "t.yaml").write_text(SPEC + "overrides:\n  - requirement: transformers==4.0\n"
                                     "    reason: kept for the test\n")
    ws = Workspace(ws.images, ws.lockfiles)  # the edited spec
    ensure_lock(ws.target("t").request, ws.lockfiles)
    tr = _news(ws)["transformers"]
    assert tr.status == "held" and "kept for the test" in tr.note
    with pytest.raises(od.InputError, match="held by an override"):
        od.relock(ws, "t", ["transformers"])


def test_spec_text_edits_keep_comments_and_refuse_ambiguity():
    text = 'engine:\n  name: sglang\n  version: "0.5.23"   # pinned\narchs: [sm100]\n'
    assert od.edit_engine_version(text, "0.5.23", "0.5.24") == text.replace("0.5.23", "0.5.24")
    inline = "engine: {name: vllm, version: '0.33.0'}\n"
    assert od.edit_engine_version(inline, "0.33.0", "0.34.0") == inline.replace("0.33.0", "0.34.0")
    assert od.edit_engine_version("engine:\n  name: x\n", "1", "2") is None
    reqs = "requirements:\n  - vllm==0.33.0  # vllm==0.33.0 too\n  - torch\n"
    assert od.edit_requirement(reqs, "vllm==0.33.0", "vllm==0.34.0") == \
        "requirements:\n  - vllm==0.34.0  # vllm==0.33.0 too\n  - torch\n"
    assert od.edit_requirement(reqs + "  - vllm==0.33.0\n", "vllm==0.33.0", "vllm==1") is None


def _push_tag(repo_path: str, tag: str) -> None:
    """A tag in the local registry without Docker: an OCI manifest over an empty config."""
    import json

    from imgbuild.image.registry import Repository, put_blob

    repo = Repository.parse(f"{REGISTRY_HOST}/{repo_path}")
    empty = put_blob(repo, b"{}")
    manifest = {"schemaVersion": 2, "mediaType": "application/vnd.oci.image.manifest.v1+json",
                "config": {"mediaType": "application/vnd.oci.empty.v1+json", "digest": empty,
                           "size": 2}, "layers": []}
    r = requests.put(f"{repo.base_url}/v2/{repo.path}/manifests/{tag}",
                     data=json.dumps(manifest).encode(),
                     headers={"Content-Type": "application/vnd.oci.image.manifest.v1+json"},
                     timeout=30)
    assert r.status_code in (200, 201), r.text


@pytest.mark.docker
def test_base_image_tags_from_a_registry_that_answers(images_copy):
    if not registry_available():
        pytest.skip(f"skipped: no registry on {REGISTRY_HOST} (make services starts one)")
    path = f"imgbuild-test-{uuid.uuid4().hex[:8]}/cuda"
    bases = images_copy / "bases.yaml"
    bases.write_text(bases.read_text().replace("repository: nvidia/cuda",
                                               f"repository: {REGISTRY_HOST}/{path}"))
    cat = Workspace(images_copy, images_copy.parent / "lockfiles").catalog
    image = f"{REGISTRY_HOST}/{path}:13.0.0-cudnn-devel-ubuntu24.04"
    for tag in ("13.0.0-cudnn-devel-ubuntu24.04", "13.0.2-cudnn-devel-ubuntu24.04",
                "13.0.2-runtime-ubuntu24.04", "13.1.0-cudnn-devel-ubuntu24.04",
                "13.0.2-cudnn-devel-ubuntu22.04"):
        _push_tag(path, tag)
    b = od.base_news(cat, image)
    assert b.status == "newer"
    assert b.newer == ("13.0.2-cudnn-devel-ubuntu24.04", "13.1.0-cudnn-devel-ubuntu24.04")
    assert "1 newer patch release(s) of CUDA 13.0" in b.note


def test_base_image_on_an_unreachable_registry_says_not_checked(ws):
    cat = ws.catalog
    b = od.base_news(cat, "nvidia/cuda:13.0.0-cudnn-devel-ubuntu24.04", timeout=3)
    # Docker Hub cannot be reached from these machines; where it can, the tags are read.
    assert b.status in ("not checked", "newer", "current")
    if b.status == "not checked":
        assert "registry registry-1.docker.io unreachable" in b.note
    local = od.base_news(cat, cat.base("debian-bookworm").image)
    assert local.status == "not checked" and "imgbuild base bootstrap" in local.note


@pytest.mark.live
def test_live_outdated_for_a_shipped_target(ws):
    [tn] = od.outdated(ws, targets=["sglang-hopper"])  # cuda-devel: an nvidia/cuda base
    d = tn.to_dict()
    assert d["target"] == "sglang-hopper" and d["engine"] == "sglang"
    by = {p["package"]: p for p in d["packages"]}
    assert by["sglang"]["role"] == "engine" and by["sglang"]["locked"] == "0.5.23"
    assert {"torch", "compressed-tensors", "flashinfer-python"} <= set(by)
    for p in d["packages"]:
        assert p["status"] in ("current", "available", "blocked", "held", "unknown")
        if p["status"] == "blocked":
            assert p["blocked_by"], p
        if p["status"] == "available":
            assert p["diff"], p
    [base] = d["bases"]
    assert base["image"].startswith("nvidia/cuda:")
