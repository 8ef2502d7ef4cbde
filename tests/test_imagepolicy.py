"""`imgbuild run --emit k8s` under a signed-by policy writes a Sigstore policy-controller
ClusterImagePolicy (plan/imagepolicy.py), checked against the CRD's published schema
(tests/fixtures/crds: sigstore/policy-controller config/300-clusterimagepolicy.yaml, v1beta1),
every field one the CRD declares (an undeclared one the API server would prune: a policy that
silently checks less), and its globs read as policy-controller's matcher reads them."""

from __future__ import annotations

import copy
import json
import re
from pathlib import Path

import jsonschema
import pytest
import yaml

from imgbuild.catalog.registries import SignPolicy
from imgbuild.plan.imagepolicy import cluster_image_policy, globs

from .conftest import ROOT

FIXTURES = Path(__file__).parent / "fixtures"
CRD = json.loads((FIXTURES / "crds" / "clusterimagepolicy-v1beta1.json").read_text())
PEM = (FIXTURES / "cosign" / "cosign.pub").read_text()
REPO = "127.0.0.1:5000/acme/serving"


def strict(schema: dict) -> dict:
    """The CRD's schema with every object closed to undeclared fields (structural schemas
    prune them: the manifest would apply, checking less than it says)."""
    s = copy.deepcopy(schema)

    def close(node):
        if isinstance(node, dict):
            if node.get("type") == "object" and "properties" in node:
                node.setdefault("additionalProperties", False)
            for v in node.values():
                close(v)
        elif isinstance(node, list):
            for v in node:
                close(v)

    close(s)
    return s


def valid(doc: dict) -> None:
    assert (doc["apiVersion"], doc["kind"]) == (f"{CRD['group']}/{CRD['version']}", CRD["kind"])
    jsonschema.validate({"spec": doc["spec"]}, strict(CRD["schema"]))
    assert re.fullmatch(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?", doc["metadata"]["name"])
    assert len(doc["metadata"]["name"]) <= 63


def glob_match(glob: str, image: str) -> bool:
    """policy-controller's pkg/apis/glob Compile + Match, as written there."""
    g = glob.replace(".", r"\.").replace("**", "#").replace("*", "[^/]*").replace("#", ".*")
    return re.fullmatch(g, image) is not None


def test_a_key_policy_is_a_valid_cluster_image_policy():
    doc = cluster_image_policy(REPO, SignPolicy("r.yaml", key="k.pub"), PEM)
    valid(doc)
    [auth] = doc["spec"]["authorities"]
    assert auth["key"] == {"data": PEM, "hashAlgorithm": "sha256"}
    assert "ctlog" not in auth  # no transparency-log entry to look for
    assert auth["attestations"] == [
        {"name": "cyclonedx", "predicateType": "https://cyclonedx.org/bom"},
        {"name": "slsaprovenance1", "predicateType": "https://slsa.dev/provenance/v1"}]
    only = cluster_image_policy(REPO, SignPolicy("r.yaml", key="k.pub", attestations=()), PEM)
    valid(only)
    assert "attestations" not in only["spec"]["authorities"][0]


def test_a_keyless_policy_names_its_identity():
    doc = cluster_image_policy(REPO, SignPolicy("r.yaml", issuer="https://i.example",
                                                subject="repo:acme/x:ref:refs/heads/main"),
                               None)
    valid(doc)
    assert doc["spec"]["authorities"][0]["keyless"] == {
        "identities": [{"issuer": "https://i.example",
                        "subject": "repo:acme/x:ref:refs/heads/main"}]}


@pytest.mark.parametrize("tlog, sct", [(True, True), (False, False)])
def test_a_keyless_policy_with_a_trust_root_refers_to_it(tlog, sct):
    doc = cluster_image_policy(REPO, SignPolicy("r.yaml", issuer="https://i.example",
                                                subject="s", trust_root="root.json",
                                                tlog=tlog, sct=sct), None)
    valid(doc)
    a = doc["spec"]["authorities"][0]
    assert a["keyless"]["trustRootRef"] == doc["metadata"]["name"]
    assert ("ctlog" in a) is tlog and ("insecureIgnoreSCT" in a["keyless"]) is not sct


def test_a_misspelt_field_is_caught_by_the_check():
    doc = cluster_image_policy(REPO, SignPolicy("r.yaml", key="k.pub"), PEM)
    doc["spec"]["authorities"][0]["key"]["pem"] = doc["spec"]["authorities"][0]["key"].pop("data")
    with pytest.raises(jsonschema.ValidationError):
        valid(doc)


@pytest.mark.parametrize("image,matched", [
    (f"{REPO}:tiny-cpu", True), (f"{REPO}@sha256:{'a' * 64}", True),
    (f"{REPO}:tiny-cpu@sha256:{'a' * 64}", True), (f"{REPO}/sub:t", True),
    (f"{REPO}-other:t", False), ("127.0.0.1:5000/acme/other:t", False)])
def test_the_globs_cover_the_repository_and_nothing_beside_it(image, matched):
    assert any(glob_match(g, image) for g in globs(REPO)) is matched


def test_run_emit_k8s_writes_it_under_a_policy_only(tmp_path):
    from imgbuild.pipeline.run import run
    from imgbuild.workspace import Workspace

    images = tmp_path / "images"
    images.mkdir()
    (images / "registries.yaml").write_text(
        f"registries:\n  - match: {REPO}\n"
        f"    signed-by: {{key: {FIXTURES / 'cosign' / 'cosign.pub'}}}\n")
    ws = Workspace.open(images, ROOT / "lockfiles", env={}, cwd=tmp_path)
    got = run(ws, "tiny-cpu", registry_name=REPO, emit=("k8s", tmp_path / "k8s"))
    [cip] = [Path(f) for f in got.files if f.endswith("-clusterimagepolicy.yaml")]
    doc = yaml.safe_load(cip.read_text())
    valid(doc)
    assert doc["spec"]["authorities"][0]["key"]["data"] == PEM
    other = run(ws, "tiny-cpu", registry_name="127.0.0.1:5000/elsewhere",
                emit=("k8s", tmp_path / "k8s2"))
    assert not [f for f in other.files if f.endswith("-clusterimagepolicy.yaml")]
