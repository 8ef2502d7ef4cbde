"""`imgbuild verify` and the check `pull` makes before it tags (image/attest.py verify, stored,
push), with the registry scripted as Distribution answers: a tag the registry does not hold,
one naming a digest it does not hold, an image whose parts do not add up, a config that is not
JSON, and a signature policy, each decided and said. judge() (what the stored report, SBOM and
provenance say against the lock) is tested on its own in tests/test_decisions_image_attest.py;
the whole path runs against a real registry in tests/test_verify.py."""

from __future__ import annotations

import json

import pytest

from imgbuild.catalog.registries import SignPolicy
from imgbuild.errors import JobFailed
from imgbuild.image import attest, registry, signstore

REPO = registry.Repository.parse("127.0.0.1:5000/acme")
DIGEST = "sha256:" + "d" * 64
MANIFEST = {"config": {"digest": "sha256:" + "c" * 64}, "layers": [{}, {}, {}]}
CONFIG = {"config": {"Labels": {"io.imgbuild.target": "tiny-cpu"}}}


@pytest.fixture()
def held(monkeypatch):
    h = {"tags": {"t": DIGEST}, "descriptor": {"digest": DIGEST}, "config": json.dumps(CONFIG),
         "problems": [], "artifacts": {}, "pushed": []}
    monkeypatch.setattr(registry, "manifest_digest",
                        lambda repo, ref: ref if ref.startswith("sha256:") else h["tags"].get(ref))
    monkeypatch.setattr(registry, "manifest_descriptor", lambda repo, d: h["descriptor"])
    monkeypatch.setattr(registry, "image_parts", lambda repo, d: (MANIFEST, h["config"]))
    monkeypatch.setattr(registry, "image_problems", lambda repo, d: h["problems"])
    monkeypatch.setattr(registry, "fetch_report", lambda repo, d: None)
    monkeypatch.setattr(registry, "fetch_artifact", lambda repo, t, kind: h["artifacts"].get(t))
    monkeypatch.setattr(registry, "push_artifact",
                        lambda repo, t, kind, doc, layer, layer_type, subject: h["pushed"].append(
                            (t, kind, doc, layer, layer_type, subject)))
    return h


def test_a_tag_the_registry_does_not_hold_is_refused(held):
    with pytest.raises(JobFailed) as e:
        attest.verify(REPO, "other")
    assert e.value.message == f"{REPO.name}:other is not in the registry"


def test_a_tag_naming_a_digest_the_registry_does_not_hold_is_refused(held):
    held["descriptor"] = None
    with pytest.raises(JobFailed) as e:
        attest.verify(REPO, DIGEST)
    assert e.value.message == (f"{REPO.name}@{DIGEST} names {DIGEST}, which the registry does "
                               "not hold")


def test_an_image_whose_parts_add_up_passes_its_own_checks(held):
    got = attest.verify(REPO, "t")
    assert (got.ref, got.digest, got.labels) == (f"{REPO.name}:t", DIGEST,
                                                 CONFIG["config"]["Labels"])
    checks = {c: (ok, d) for c, ok, d in got.checks}
    assert checks["digest"] == (True, f"manifest {DIGEST} matches its bytes; config "
                                      f"{MANIFEST['config']['digest'][:19]}…")
    assert checks["image"] == (True, "an image config whose 3 diff ids are the manifest's "
                                     "layers, each held at its size")


def test_an_image_with_problems_fails_its_image_check_naming_them(held):
    held["problems"] = ["layer 2 is not held", "diff ids: 2 for 3 layers"]
    got = attest.verify(REPO, "t")
    assert ("image", False, "layer 2 is not held; diff ids: 2 for 3 layers") in got.checks
    assert not got.ok


@pytest.mark.parametrize("config", ["not json", "[]", json.dumps({"config": None})])
def test_a_config_that_says_no_labels_has_none(held, config):
    held["config"] = config
    assert attest.verify(REPO, "t").labels == {}


def test_with_a_policy_the_signature_checks_are_added(held, monkeypatch):
    policy = SignPolicy("images/registries.yaml", key="keys/ci.pub")
    monkeypatch.setattr(signstore, "checks", lambda repo, d, p: (
        [("signature", True, f"signed with {p.key}")], None))
    got = attest.verify(REPO, "t", policy=policy)
    assert got.checks[-1] == ("signature", True, "signed with keys/ci.pub")
    assert "signature" not in [c for c, _, _ in attest.verify(REPO, "t").checks]


def test_the_sbom_and_provenance_are_stored_as_artifacts_referring_to_the_image(held):
    tags = attest.push(REPO, DIGEST, {"sbom": {"s": 1}, "provenance": {"p": 1}})
    assert tags == [attest.tag(DIGEST, "sbom"), attest.tag(DIGEST, "provenance")]
    assert [(t, kind, layer, subject) for t, kind, _, layer, _, subject in held["pushed"]] == [
        (attest.tag(DIGEST, "sbom"), attest.SBOM_TYPE, b"{}", DIGEST),
        (attest.tag(DIGEST, "provenance"), attest.PROVENANCE_TYPE, b"{}", DIGEST)]


def test_both_must_be_there_for_an_image_to_have_them_stored(held):
    assert not attest.stored(REPO, DIGEST)
    held["tags"][attest.tag(DIGEST, "sbom")] = "sha256:s"
    assert not attest.stored(REPO, DIGEST)
    held["tags"][attest.tag(DIGEST, "provenance")] = "sha256:p"
    assert attest.stored(REPO, DIGEST)
