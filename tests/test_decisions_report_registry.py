"""What the compatibility report reads of a registry for one platform's content tag
(pipeline/report.py _published, _signature), without a registry: a scripted one answers as
Distribution does (the tag's digest, the manifest, the config's history, the stored smoke
report, the signatures). What is decided: each layer is named by the build step that made it
(steps that made no layer skipped), the stored report is read, and the signature is judged by
the registry's policy where there is one, else counted.

tests/test_report.py builds the whole page with a real registry."""

from __future__ import annotations

import pytest

from imgbuild.image import registry as reg
from imgbuild.image import signstore
from imgbuild.pipeline import report
from imgbuild.plan.decide import make_plan

from .conftest import checkout_workspace

REPO = reg.Repository.parse("registry.example/acme")
DIGEST = "sha256:" + "d" * 64
HISTORY = [
    {"created_by": "", "comment": "debootstrap bookworm"},
    {"created_by": "ENV PATH=/opt/venv/bin:$PATH", "empty_layer": True},
    {"created_by": "RUN |1 IMGBUILD_INDEX_FLAGS= /bin/sh -c uv pip install -r heavy.txt "
                   "# buildkit"},
    {"created_by": "/bin/sh -c #(nop) COPY dir:abc in /opt/imgbuild "},
]
LAYERS = [{"digest": f"sha256:{c * 64}", "size": n,
           "mediaType": "application/vnd.oci.image.layer.v1.tar+zstd"}
          for c, n in (("1", 30_000_000), ("2", 900_000_000), ("3", 12_000))]


@pytest.fixture(scope="module")
def plan():
    return make_plan(checkout_workspace(), "tiny-cpu", repository=REPO.name, resolve=False)


@pytest.fixture()
def registry(monkeypatch, plan):
    """What the scripted registry holds: the content tag, and what was asked of it."""
    held = {"tag": {plan.content_tag: DIGEST}, "report": None, "sigs": []}

    def ours(repo, digest=DIGEST):
        # it answers for this repository and the digest its tag names, nothing else
        assert repo.name == REPO.name and digest == DIGEST, (repo, digest)

    monkeypatch.setattr(reg, "manifest_digest",
                        lambda repo, tag: ours(repo) or held["tag"].get(tag))
    monkeypatch.setattr(reg, "get_manifest",
                        lambda repo, d: ours(repo, d) or (d, {"config": {}, "layers": LAYERS}))
    monkeypatch.setattr(reg, "image_config",
                        lambda repo, d: ours(repo, d) or ({}, {"history": HISTORY}))
    monkeypatch.setattr(reg, "fetch_report", lambda repo, d: ours(repo, d) or held["report"])
    monkeypatch.setattr(signstore, "fetch_layers", lambda repo, tag: (
        ours(repo) or tag == signstore.cosign.sig_tag(DIGEST) and held["sigs"] or []))
    return held


def test_a_content_tag_the_registry_does_not_hold_is_said_so(plan, registry):
    registry["tag"] = {}
    got = report._published(REPO, plan)
    assert (got.digest, got.ref, got.layers, got.smoke) == (
        None, f"{REPO.name}:{plan.content_tag}", (), None)


def test_each_layer_is_named_by_the_build_step_that_made_it(plan, registry):
    got = report._published(REPO, plan)
    assert got.digest == DIGEST and got.repository == REPO.name
    assert [(la.size, la.step) for la in got.layers] == [
        (30_000_000, "base layer (debootstrap bookworm)"),
        (900_000_000, "RUN uv pip install -r heavy.txt"),
        (12_000, "COPY dir:abc in /opt/imgbuild")]
    assert got.total_bytes == 930_012_000
    assert got.smoke is None and got.smoke_tag is None
    assert got.signature == "not signed"


def test_a_layer_the_history_does_not_name_has_no_step(plan, registry, monkeypatch):
    monkeypatch.setattr(reg, "image_config", lambda repo, d: ({}, {"history": HISTORY[:1]}))
    got = report._published(REPO, plan)
    assert [la.step for la in got.layers] == ["base layer (debootstrap bookworm)", "", ""]


def test_an_index_under_the_tag_has_no_layers_of_its_own(plan, registry, monkeypatch):
    monkeypatch.setattr(reg, "get_manifest", lambda repo, d: (d, {"manifests": []}))
    assert report._published(REPO, plan).layers == ()


def test_the_stored_smoke_report_is_read_and_where_it_is_stored_said(plan, registry):
    registry["report"] = {"ok": True, "image": "x", "stages": [
        {"name": "gpu-engine", "status": "pass",
         "details": {"gpu": "NVIDIA B200", "sm": "sm100"}}]}
    got = report._published(REPO, plan)
    assert got.smoke.ok and got.smoke.gpu == "NVIDIA B200 (sm100)"
    assert got.smoke_tag == reg.report_tag(DIGEST)


@pytest.mark.parametrize("stored, said", [
    (0, "not signed"),
    (1, "1 cosign signature stored; no signed-by policy for registry.example/acme names a key "
        "to check them against"),
    (2, "2 cosign signatures stored; no signed-by policy for registry.example/acme names a "
        "key to check them against"),
])
def test_without_a_policy_signatures_are_only_counted(plan, registry, stored, said):
    registry["sigs"] = [object()] * stored
    assert report._published(REPO, plan).signature == said


def test_with_a_policy_the_signature_is_checked_against_it(plan, registry, monkeypatch):
    from imgbuild.catalog.registries import SignPolicy

    policy = SignPolicy("images/registries.yaml", key="keys/ci.pub")
    asked = []

    def checks(repo, digest, pol):
        asked.append((repo.name, digest, pol))
        return [], None
    monkeypatch.setattr(signstore, "checks", checks)
    monkeypatch.setattr(report, "signature_words", lambda pol, checks, stored, repository: (
        f"judged by {pol.key} for {repository}, {stored} counted"))
    # judged, not counted: with a policy the stored signatures are not what is said
    assert report._published(REPO, plan, policy).signature == \
        f"judged by keys/ci.pub for {REPO.name}, 0 counted"
    assert asked == [(REPO.name, DIGEST, policy)]


def test_a_layer_is_its_digest_size_and_media_type_as_the_manifest_gives_them(plan, registry,
                                                                              monkeypatch):
    got = report._published(REPO, plan)
    assert [(la.digest, la.media_type) for la in got.layers] == [
        (x["digest"], x["mediaType"]) for x in LAYERS]
    # a descriptor without size or media type (none should lack them) is 0 bytes, untyped
    monkeypatch.setattr(reg, "get_manifest", lambda repo, d: (d, {"config": {}, "layers": [
        {"digest": "sha256:" + "9" * 64}]}))
    [layer] = report._published(REPO, plan).layers
    assert (layer.size, layer.media_type) == (0, "")
    # a manifest the registry no longer serves: no layers
    monkeypatch.setattr(reg, "get_manifest", lambda repo, d: None)
    assert report._published(REPO, plan).layers == ()


def test_a_platform_with_a_registry_gives_the_pull_lines_of_what_it_holds(plan, registry):
    ws = checkout_workspace()
    sec = report._platform(ws, "tiny-cpu", plan, REPO)
    assert sec.pull == f"imgbuild pull tiny-cpu --registry {REPO.name}"
    assert sec.docker_pull == f"docker pull {REPO.name}@{DIGEST}"
    assert sec.published.digest == DIGEST
    registry["tag"] = {}
    assert report._platform(ws, "tiny-cpu", plan, REPO).docker_pull is None  # not there
    none = report._platform(ws, "tiny-cpu", plan, None)
    assert (none.pull, none.docker_pull, none.published) == (
        "imgbuild pull tiny-cpu --registry REGISTRY/REPO", None, None)
