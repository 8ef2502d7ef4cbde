"""`imgbuild run --emit k8s` under a signed-by policy writes an admission policy
(plan/imagepolicy.py), for the admission controller the user chose: a Sigstore policy-controller
ClusterImagePolicy or a Kyverno ClusterPolicy. Each is checked against its CRD's published
schema (tests/fixtures/crds: sigstore/policy-controller config/300-clusterimagepolicy.yaml,
v1beta1, and config/300-trustroot.yaml, v1alpha1, for the TrustRoot a keyless policy's
ClusterImagePolicy refers to; kyverno/kyverno config/crds/kyverno/kyverno.io_clusterpolicies.yaml,
v1, at v1.19.0), every field one the CRD declares (an undeclared one the API server would
prune: a policy that silently checks less), and the image patterns read as each controller's
matcher reads them."""

from __future__ import annotations

import base64
import copy
import hashlib
import json
import re
from pathlib import Path

import jsonschema
import pytest
import yaml
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec

from imgbuild.catalog.registries import ATTESTATION_TYPES, SignPolicy
from imgbuild.errors import InputError
from imgbuild.plan.imagepolicy import (
    ADMISSION,
    PUBLIC_REKOR,
    InlineTrust,
    TrustData,
    TrustedCA,
    TrustedLog,
    cluster_image_policy,
    globs,
    image_references,
    kyverno_cluster_policy,
    trust_root_left_out,
    trust_root_resource,
)

from .conftest import ROOT

FIXTURES = Path(__file__).parent / "fixtures"
CRD = json.loads((FIXTURES / "crds" / "clusterimagepolicy-v1beta1.json").read_text())
KYVERNO_CRD = json.loads((FIXTURES / "crds" / "clusterpolicy-kyverno-v1.json").read_text())
TRUSTROOT_CRD = json.loads((FIXTURES / "crds" / "trustroot-v1alpha1.json").read_text())
# Sigstore's public-good trust root, recorded (tests/data/sigstore/README.md).
PGI = Path(__file__).parent / "data" / "sigstore" / "trusted_root_pgi.json"
PEM = (FIXTURES / "cosign" / "cosign.pub").read_text()
REPO = "127.0.0.1:5000/acme/serving"
KEY = SignPolicy("r.yaml", key="k.pub")
KEYLESS = SignPolicy("r.yaml", issuer="https://i.example",
                     subject="repo:acme/x:ref:refs/heads/main")


def strict(schema: dict) -> dict:
    """The CRD's schema with every object closed to undeclared fields (structural schemas
    prune them: the manifest would apply, checking less than it says), except where the CRD
    keeps unknown fields itself (x-kubernetes-preserve-unknown-fields)."""
    s = copy.deepcopy(schema)

    def close(node):
        if isinstance(node, dict):
            if node.get("type") == "object" and "properties" in node and \
                    not node.get("x-kubernetes-preserve-unknown-fields"):
                node.setdefault("additionalProperties", False)
            for v in node.values():
                close(v)
        elif isinstance(node, list):
            for v in node:
                close(v)

    close(s)
    return s


def valid(doc: dict, crd: dict = CRD) -> None:
    assert (doc["apiVersion"], doc["kind"]) == (f"{crd['group']}/{crd['version']}", crd["kind"])
    jsonschema.validate({"spec": doc["spec"]}, strict(crd["schema"]))
    assert re.fullmatch(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?", doc["metadata"]["name"])
    assert len(doc["metadata"]["name"]) <= 63


def glob_match(glob: str, image: str) -> bool:
    """policy-controller's pkg/apis/glob Compile + Match, as written there."""
    g = glob.replace(".", r"\.").replace("**", "#").replace("*", "[^/]*").replace("#", ".*")
    return re.fullmatch(g, image) is not None


# --- policy-controller ------------------------------------------------------------------------

def test_a_key_policy_is_a_valid_cluster_image_policy():
    doc = cluster_image_policy(REPO, KEY, PEM)
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
    doc = cluster_image_policy(REPO, KEYLESS, None)
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
    doc = cluster_image_policy(REPO, KEY, PEM)
    doc["spec"]["authorities"][0]["key"]["pem"] = doc["spec"]["authorities"][0]["key"].pop("data")
    with pytest.raises(jsonschema.ValidationError):
        valid(doc)


@pytest.mark.parametrize("image,matched", [
    (f"{REPO}:tiny-cpu", True), (f"{REPO}@sha256:{'a' * 64}", True),
    (f"{REPO}:tiny-cpu@sha256:{'a' * 64}", True), (f"{REPO}/sub:t", True),
    (f"{REPO}-other:t", False), ("127.0.0.1:5000/acme/other:t", False)])
def test_the_globs_cover_the_repository_and_nothing_beside_it(image, matched):
    assert any(glob_match(g, image) for g in globs(REPO)) is matched


# --- policy-controller's TrustRoot -------------------------------------------------------------

def pem_blocks(data: bytes) -> list[tuple[str, bytes]]:
    """(type, DER) of each PEM block, in order: what Go's pem.Decode loop reads (policy-
    controller's DeserializeCertChain), and nothing else is allowed between them."""
    rx = re.compile(rb"-----BEGIN ([A-Z ]+)-----\n([A-Za-z0-9+/=\n]+)-----END \1-----\n")
    out, at = [], 0
    for m in rx.finditer(data):
        assert data[at:m.start()].strip() == b"", "text between PEM blocks"
        out.append((m.group(1).decode(), base64.b64decode(m.group(2))))
        at = m.end()
    assert data[at:].strip() == b"" and out
    return out


def trust_root_valid(doc: dict) -> None:
    """The TrustRoot against the v1alpha1 schema, closed; the checks policy-controller's
    webhook makes beyond it (pkg/apis/policy/v1alpha1 trustroot_validation.go at f925c0c1);
    and what its reconciler needs to turn it into the keys it checks with
    (pkg/apis/config/sigstore_keys.go ConvertSigstoreKeys, pkg/reconciler/trustroot)."""
    valid(doc, TRUSTROOT_CRD)
    spec = doc["spec"]
    assert len({"remote", "repository", "sigstoreKeys"} & set(spec)) == 1
    keys = spec["sigstoreKeys"]
    assert keys["certificateAuthorities"], "certificateAuthority is required"
    for ca in keys["certificateAuthorities"]:
        assert ca["subject"]["organization"] and ca["subject"]["commonName"] and ca["uri"]
        # []byte in Go: base64 in JSON, decoding to a PEM chain of certificates
        blocks = pem_blocks(base64.b64decode(ca["certChain"], validate=True))
        assert {t for t, _ in blocks} == {"CERTIFICATE"}
        for _, der in blocks:
            x509.load_der_x509_certificate(der)
    for kind in ("tLogs", "ctLogs"):
        for t in keys.get(kind, []):
            assert t["baseURL"] and t["publicKey"]
            # HashStringToHashAlgorithm: any other name is HASH_ALGORITHM_UNSPECIFIED
            assert t["hashAlgorithm"] in ("sha-256", "sha256", "sha-384", "sha384",
                                          "sha-512", "sha512")
            [(typ, der)] = pem_blocks(base64.b64decode(t["publicKey"], validate=True))
            key = serialization.load_der_public_key(der)
            assert typ == "PUBLIC KEY"
            if kind == "tLogs":  # the reconciler refuses a Rekor key that is not ECDSA
                assert isinstance(key, ec.EllipticCurvePublicKey)


def pgi_trust() -> TrustData:
    from imgbuild.image import keyless
    from imgbuild.pipeline.run import trust_data

    return trust_data(keyless.load_trust_root(PGI.read_bytes(), str(PGI)))


def test_the_trustroot_schema_is_the_published_one_with_its_provenance():
    src = TRUSTROOT_CRD["source"]
    assert src["repository"] == "https://github.com/sigstore/policy-controller"
    assert src["path"] == "config/300-trustroot.yaml"
    assert re.fullmatch(r"[0-9a-f]{40}", src["commit"])
    assert re.fullmatch(r"\d{4}-\d\d-\d\d", src["date"]) and len(src["sha256"]) == 64
    assert (TRUSTROOT_CRD["group"], TRUSTROOT_CRD["version"], TRUSTROOT_CRD["kind"]) == (
        "policy.sigstore.dev", "v1alpha1", "TrustRoot")
    # the version the ClusterImagePolicy's trustRootRef names a TrustRoot of
    assert "trustRootRef" in json.dumps(CRD["schema"])


def test_the_public_trust_root_round_trips_through_its_trustroot():
    """Sigstore's recorded public-good trust root, as a TrustRoot: every CA with its chain in
    the file's order (the root last), and each current log key, decode back to the bytes of
    the file; the log IDs policy-controller derives from the keys are the file's."""
    raw = json.loads(PGI.read_text())
    doc = trust_root_resource("imgbuild-x", pgi_trust())
    trust_root_valid(doc)
    assert doc["metadata"] == {"name": "imgbuild-x"}
    keys = doc["spec"]["sigstoreKeys"]
    assert len(keys["certificateAuthorities"]) == len(raw["certificateAuthorities"])
    for got, want in zip(keys["certificateAuthorities"], raw["certificateAuthorities"],
                         strict=True):
        assert got["subject"] == want["subject"] and got["uri"] == want["uri"]
        ders = [der for _, der in pem_blocks(base64.b64decode(got["certChain"]))]
        assert ders == [base64.b64decode(c["rawBytes"])
                        for c in want["certChain"]["certificates"]]
    for kind, raw_kind in (("tLogs", "tlogs"), ("ctLogs", "ctlogs")):
        current = [t for t in raw[raw_kind] if "end" not in t["publicKey"].get("validFor", {})]
        assert current and len(keys[kind]) == len(current)
        for got, want in zip(keys[kind], current, strict=True):
            assert got["baseURL"] == want["baseUrl"]
            assert (want["hashAlgorithm"], got["hashAlgorithm"]) == ("SHA2_256", "sha-256")
            [(_, der)] = pem_blocks(base64.b64decode(got["publicKey"]))
            assert der == base64.b64decode(want["publicKey"]["rawBytes"])
            # cosign.GetTransparencyLogID: SHA-256 of the key's DER, as logId.keyId is
            assert hashlib.sha256(der).digest() == base64.b64decode(want["logId"]["keyId"])


def test_a_log_key_whose_window_ends_is_left_out_and_said():
    """A TrustRoot has no validity windows: the CT log key that stopped signing in 2022 would be
    trusted for ever, so it is left out, as from the Kyverno policy; the header says so."""
    trust = pgi_trust()
    [ended] = [t for t in trust.ctlogs if t.end is not None]
    urls = [t["baseURL"] for t in
            trust_root_resource("n", trust)["spec"]["sigstoreKeys"]["ctLogs"]]
    assert ended.base_url not in urls and urls
    assert trust_root_left_out(trust) == [
        f"CT log {ended.base_url}: its validity in the trust root ends ({ended.end})"]


def standin_trust(**ca_fields) -> TrustData:
    """A trust root of Sigstore's recorded keys under other names, to vary one field."""
    pgi = pgi_trust()
    ca = TrustedCA(**{"organization": "acme", "common_name": "acme-ca",
                      "uri": "https://fulcio.acme", "chain": pgi.cas[-1].chain,
                      **ca_fields})
    ed = TrustedLog("https://log2025.rekor.acme", "SHA2_256", "-----BEGIN PUBLIC KEY-----\n"
                    "MCowBQYDK2VwAyEAt8rlp1knGwjfbcXAYPYAkn0XiLz1x8O4t0YkEhie244=\n"
                    "-----END PUBLIC KEY-----\n", ecdsa=False, end=None)
    return TrustData("acme.json", (ca,), (pgi.tlogs[0], ed), ())


def test_a_rekor_key_policy_controller_cannot_use_is_left_out_not_fatal():
    """policy-controller's reconciler fails the whole TrustRoot on a Rekor key that is not ECDSA
    (Rekor v2's Ed25519): written, it would leave every image refused."""
    trust = standin_trust()
    doc = trust_root_resource("n", trust)
    trust_root_valid(doc)
    keys = doc["spec"]["sigstoreKeys"]
    assert [t["baseURL"] for t in keys["tLogs"]] == [trust.tlogs[0].base_url]
    assert "ctLogs" not in keys  # optional, and empty: left out as Go's omitempty does
    assert trust_root_left_out(trust) == [
        "Rekor https://log2025.rekor.acme: not an ECDSA key, which policy-controller requires "
        "of a Rekor key"]


@pytest.mark.parametrize("field,fact", [("uri", "certificateAuthorities[0] has no uri"),
                                        ("organization",
                                         "certificateAuthorities[0] has no subject.organization")])
def test_a_trust_root_the_trustroot_webhook_would_refuse_is_refused_here(field, fact):
    with pytest.raises(InputError) as e:
        trust_root_resource("n", standin_trust(**{field: ""}))
    assert "acme.json cannot be written as a policy-controller TrustRoot" in str(e.value)
    assert fact in e.value.facts and "--admission kyverno" in e.value.hint


def test_a_misspelt_field_is_caught_by_the_trustroot_check():
    doc = trust_root_resource("n", pgi_trust())
    t = doc["spec"]["sigstoreKeys"]["tLogs"][0]
    t["logID"] = "x"  # no such field in v1alpha1: the API server would prune it
    with pytest.raises(jsonschema.ValidationError):
        trust_root_valid(doc)
    doc = trust_root_resource("n", pgi_trust())
    ca = doc["spec"]["sigstoreKeys"]["certificateAuthorities"][0]
    ca["certChain"] = base64.b64decode(ca["certChain"]).decode()  # PEM, not base64 of it
    with pytest.raises((AssertionError, ValueError)):
        trust_root_valid(doc)


# --- Kyverno ----------------------------------------------------------------------------------

def kyverno_valid(doc: dict) -> None:
    """The ClusterPolicy against the v1 schema, closed; and the checks Kyverno's own policy
    webhook makes beyond the schema (pkg/validation/policy and api/kyverno/v1's Validate
    methods at v1.19.0), for what this policy uses."""
    valid(doc, KYVERNO_CRD)
    spec = doc["spec"]
    for rule in spec["rules"]:
        for iv in rule["verifyImages"]:
            assert iv["imageReferences"], "An image reference is required"
            # mutateDigest under Audit is refused ("mutateDigest must be set to false for
            # 'Audit' failure action"); the rule's failureAction wins over the policy's.
            action = iv.get("failureAction", spec.get("validationFailureAction", "Audit"))
            assert not (iv.get("mutateDigest", True) and action != "Enforce")
            sets = iv.get("attestors", []) + [s for a in iv.get("attestations", [])
                                              for s in a["attestors"]]
            for s in sets:
                assert s["entries"], "An entry is required"
                assert s.get("count", 1) <= len(s["entries"])
                for e in s["entries"]:
                    assert len({"keys", "certificates", "keyless", "attestor"} & set(e)) == 1
                    if "keys" in e:
                        assert e["keys"].get("publicKeys") or e["keys"].get("kms") \
                            or e["keys"].get("secret")
                    if "keyless" in e:
                        # "Either Rekor URL or roots are required"; "An URL is required"
                        k = e["keyless"]
                        assert ("rekor" in k and k["rekor"].get("url")) or k.get("roots")


def deprecated_fields(doc: dict, schema: dict, path: str = "") -> list[str]:
    """The fields of doc whose schema node the CRD marks deprecated (the vendored schema keeps
    exactly those descriptions): a field the current Kyverno reads only as a fallback, or may
    stop reading."""
    out = []
    if str(schema.get("description", "")).lower().startswith("deprecated"):
        out.append(path)
    if isinstance(doc, dict):
        for k, v in doc.items():
            if k in schema.get("properties", {}):
                out += deprecated_fields(v, schema["properties"][k], f"{path}.{k}")
    elif isinstance(doc, list) and "items" in schema:
        for v in doc:
            out += deprecated_fields(v, schema["items"], f"{path}[]")
    return out


def test_the_kyverno_schema_is_the_published_one_with_its_provenance():
    src = KYVERNO_CRD["source"]
    assert src["repository"] == "https://github.com/kyverno/kyverno"
    assert src["path"] == "config/crds/kyverno/kyverno.io_clusterpolicies.yaml"
    assert re.fullmatch(r"[0-9a-f]{40}", src["commit"]) and src["tag"] == "v1.19.0"
    assert re.fullmatch(r"\d{4}-\d\d-\d\d", src["date"]) and len(src["sha256"]) == 64
    rules = KYVERNO_CRD["schema"]["properties"]["spec"]["properties"]["rules"]
    verify = rules["items"]["properties"]["verifyImages"]["items"]["properties"]
    assert verify["failureAction"]["enum"] == ["Audit", "Enforce"]


def test_a_key_policy_is_a_valid_kyverno_cluster_policy():
    doc = kyverno_cluster_policy(REPO, KEY, PEM)
    kyverno_valid(doc)
    [rule] = doc["spec"]["rules"]
    [iv] = rule["verifyImages"]
    key = {"keys": {"publicKeys": PEM, "rekor": {"ignoreTlog": True},
                    "ctlog": {"ignoreSCT": True}}}
    assert iv["attestors"] == [{"entries": [key]}]
    assert iv["attestations"] == [
        {"type": "https://cyclonedx.org/bom", "attestors": [{"entries": [key]}]},
        {"type": "https://slsa.dev/provenance/v1", "attestors": [{"entries": [key]}]}]
    assert [a["type"] for a in iv["attestations"]] == list(ATTESTATION_TYPES.values())
    only = kyverno_cluster_policy(REPO, SignPolicy("r.yaml", key="k.pub", attestations=()), PEM)
    kyverno_valid(only)
    assert "attestations" not in only["spec"]["rules"][0]["verifyImages"][0]
    one = kyverno_cluster_policy(REPO, SignPolicy("r.yaml", key="k.pub",
                                                  attestations=("slsaprovenance1",)), PEM)
    assert [a["type"] for a in one["spec"]["rules"][0]["verifyImages"][0]["attestations"]] == \
        ["https://slsa.dev/provenance/v1"]


def test_a_keyless_kyverno_policy_names_its_identity_and_the_public_rekor():
    doc = kyverno_cluster_policy(REPO, KEYLESS, None)
    kyverno_valid(doc)
    [iv] = doc["spec"]["rules"][0]["verifyImages"]
    keyless = {"keyless": {"subject": "repo:acme/x:ref:refs/heads/main",
                           "issuer": "https://i.example", "rekor": {"url": PUBLIC_REKOR}}}
    assert iv["attestors"] == [{"entries": [keyless]}]
    assert all(a["attestors"] == [{"entries": [keyless]}] for a in iv["attestations"])
    # the certificate's SCT and the log entry are checked: nothing tells Kyverno to skip them
    assert "ctlog" not in keyless["keyless"] and "ignoreTlog" not in keyless["keyless"]["rekor"]


TRUST = InlineTrust(roots="ROOTS-PEM", rekor=(("https://rekor.example", "REKOR-PEM"),),
                    ctlog=("CT-PEM",))


def keyless_policy(**kw) -> SignPolicy:
    return SignPolicy("r.yaml", issuer="https://i.example",
                      subject="repo:acme/x:ref:refs/heads/main", trust_root="root.json", **kw)


def test_a_keyless_kyverno_policy_with_a_trust_root_carries_it_inline():
    """Kyverno's keyless attestor refers to no trust-root resource: the CAs and the log keys
    go into the policy, so the cluster checks against the hosts' trust root, not Sigstore's."""
    doc = kyverno_cluster_policy(REPO, keyless_policy(), None, TRUST)
    kyverno_valid(doc)
    [iv] = doc["spec"]["rules"][0]["verifyImages"]
    [entry] = iv["attestors"][0]["entries"]
    assert entry["keyless"]["roots"] == "ROOTS-PEM"
    assert entry["keyless"]["rekor"] == {"url": "https://rekor.example", "pubkey": "REKOR-PEM"}
    assert entry["keyless"]["ctlog"] == {"pubkey": "CT-PEM"}
    assert all(a["attestors"] == iv["attestors"] for a in iv["attestations"])


@pytest.mark.parametrize("tlog,sct", [(False, True), (True, False), (False, False)])
def test_the_opt_outs_reach_the_kyverno_policy(tlog, sct):
    doc = kyverno_cluster_policy(REPO, keyless_policy(tlog=tlog, sct=sct), None, TRUST)
    kyverno_valid(doc)
    [entry] = doc["spec"]["rules"][0]["verifyImages"][0]["attestors"][0]["entries"]
    assert (entry["keyless"]["rekor"] == {"ignoreTlog": True}) == (not tlog)
    assert (entry["keyless"]["ctlog"] == {"ignoreSCT": True}) == (not sct)


def test_several_current_log_keys_are_alternatives_not_all_required():
    two = InlineTrust(roots="R", rekor=(("https://a", "A"), ("https://b", "B")),
                      ctlog=("C1", "C2"))
    doc = kyverno_cluster_policy(REPO, keyless_policy(), None, two)
    kyverno_valid(doc)
    [att] = doc["spec"]["rules"][0]["verifyImages"][0]["attestors"]
    # Kyverno needs every entry of a set unless count says otherwise: any one pair suffices
    assert att["count"] == 1
    assert {(e["keyless"]["rekor"]["pubkey"], e["keyless"]["ctlog"]["pubkey"])
            for e in att["entries"]} == {("A", "C1"), ("A", "C2"), ("B", "C1"), ("B", "C2")}


def test_inline_trust_takes_every_ca_and_only_the_current_log_keys():
    """On Sigstore's recorded public trust root (tests/data/sigstore): its CT log key that
    stopped signing in 2022 is left out, the current ones kept."""
    from imgbuild.image import keyless
    from imgbuild.pipeline.run import inline_trust

    path = Path(__file__).parent / "data" / "sigstore" / "trusted_root_pgi.json"
    root = keyless.load_trust_root(path.read_bytes(), str(path))
    got = inline_trust(root)
    n_certs = len({c.fingerprint(hashes.SHA256()) for ca in root.cas for c in ca.chain})
    assert got.roots.count("BEGIN CERTIFICATE") == n_certs > 0
    ended = [k for k in root.ctlogs if k.valid.end is not None]
    assert ended and len(got.ctlog) == len(root.ctlogs) - len(ended) > 0
    assert [url for url, _ in got.rekor] == [k.name for k in root.tlogs if k.valid.end is None]
    assert all(p.startswith("-----BEGIN PUBLIC KEY-----") for _, p in got.rekor)


def test_run_emit_kyverno_inlines_the_policys_trust_root(tmp_path):
    from imgbuild.pipeline.run import run
    from imgbuild.workspace import Workspace

    images = tmp_path / "images"
    images.mkdir()
    root = Path(__file__).parent / "data" / "sigstore" / "trusted_root_pgi.json"
    (images / "registries.yaml").write_text(
        f"registries:\n  - match: {REPO}\n    signed-by:\n      keyless:\n"
        f"        issuer: https://token.actions.githubusercontent.com\n"
        f"        subject: https://github.com/acme/x/.github/workflows/images.yml@refs/heads/main\n"
        f"        trust-root: {root}\n")
    ws = Workspace.open(images, ROOT / "lockfiles", env={}, cwd=tmp_path)
    got = run(ws, "tiny-cpu", registry_name=REPO, emit=("k8s", tmp_path / "k8s"),
              admission="kyverno")
    [path] = [Path(f) for f in got.files if f.endswith("-clusterpolicy.yaml")]
    doc = yaml.safe_load(path.read_text())
    kyverno_valid(doc)
    entries = doc["spec"]["rules"][0]["verifyImages"][0]["attestors"][0]["entries"]
    assert entries and all("BEGIN CERTIFICATE" in e["keyless"]["roots"] for e in entries)
    assert all(e["keyless"]["rekor"]["pubkey"].startswith("-----BEGIN PUBLIC KEY")
               for e in entries)


@pytest.mark.parametrize("policy", [KEY, KEYLESS], ids=["key", "keyless"])
def test_the_kyverno_policy_enforces_with_fields_the_current_release_reads(policy):
    doc = kyverno_cluster_policy(REPO, policy, None if policy.keyless else PEM)
    spec = doc["spec"]
    [iv] = spec["rules"][0]["verifyImages"]
    # Enforced by the rule's own failureAction (Kyverno 1.13+), not the deprecated policy-wide
    # validationFailureAction, whose default is Audit.
    assert iv["failureAction"] == "Enforce" and "validationFailureAction" not in spec
    assert (iv["mutateDigest"], iv["verifyDigest"], iv["required"]) == (True, True, True)
    assert iv["type"] == "Cosign"
    assert spec["webhookConfiguration"] == {"failurePolicy": "Fail", "timeoutSeconds": 30}
    assert spec["background"] is False
    assert deprecated_fields(doc["spec"], KYVERNO_CRD["schema"]["properties"]["spec"]) == []


def test_the_deprecation_check_sees_a_deprecated_field():
    doc = kyverno_cluster_policy(REPO, KEY, PEM)
    doc["spec"]["validationFailureAction"] = "Enforce"
    doc["spec"]["rules"][0]["verifyImages"][0]["attestations"][0]["predicateType"] = "x"
    assert deprecated_fields(doc["spec"], KYVERNO_CRD["schema"]["properties"]["spec"]) == [
        ".rules[].verifyImages[].attestations[].predicateType", ".validationFailureAction"]


def test_the_kyverno_rule_matches_pods_so_that_autogen_covers_their_controllers():
    """Kyverno's autogen (pkg/autogen/v1 CanAutoGen at v1.19.0) adds the rule for DaemonSet,
    Deployment, Job, StatefulSet, ReplicaSet, ReplicationController and CronJob when every
    resource description names Pod alone (or Pod controllers), with no name, names, selector
    or annotations, and no autogen annotation turns it off."""
    doc = kyverno_cluster_policy(REPO, KEY, PEM)
    assert "pod-policies.kyverno.io/autogen-controllers" not in doc["metadata"].get(
        "annotations", {})
    [rule] = doc["spec"]["rules"]
    assert set(rule["match"]) == {"any"} and "exclude" not in rule
    for d in rule["match"]["any"]:
        r = d["resources"]
        assert r["kinds"] == ["Pod"]
        assert not {"name", "names", "selector", "annotations"} & set(r)


def test_a_misspelt_field_is_caught_by_the_kyverno_check():
    doc = kyverno_cluster_policy(REPO, KEY, PEM)
    keys = doc["spec"]["rules"][0]["verifyImages"][0]["attestors"][0]["entries"][0]["keys"]
    keys["publicKey"] = keys.pop("publicKeys")
    with pytest.raises(jsonschema.ValidationError):
        valid(doc, KYVERNO_CRD)
    doc = kyverno_cluster_policy(REPO, KEY, PEM)
    doc["spec"]["rules"][0]["verifyImages"][0]["failureAction"] = "enforce"  # not in the enum
    with pytest.raises(jsonschema.ValidationError):
        valid(doc, KYVERNO_CRD)


def kyverno_image(ref: str) -> str:
    """The string Kyverno matches imageReferences against (pkg/utils/image GetImageInfo, then
    ImageInfo.String, at v1.19.0): the default registry put before a name without one;
    REGISTRY/PATH@DIGEST when there is a digest (the tag dropped), else REGISTRY/PATH:TAG
    (latest when none)."""
    first, slash, _ = ref.partition("/")
    if not slash or (not any(c in first for c in ".:") and first != "localhost"
                     and first == first.lower()):
        ref = "docker.io/" + ref
    name, at, digest = ref.partition("@")
    slash = name.rfind("/")
    colon = name.rfind(":")
    repo, tag = (name[:colon], name[colon + 1:]) if colon > slash else (name, "latest")
    return f"{repo}@{digest}" if at else f"{repo}:{tag}"


def wildcard_match(pattern: str, text: str) -> bool:
    """github.com/IGLOU-EU/go-wildcard v1.0.3 Match, which Kyverno's ext/wildcard calls: `*`
    any run of characters (`/` too, or none), `?` exactly one character, the rest literal."""
    rx = "".join(".*" if c == "*" else "." if c == "?" else re.escape(c) for c in pattern)
    return re.fullmatch(rx, text, flags=re.S) is not None


def test_the_wildcard_port_agrees_with_kyvernos_own_cases():
    # ext/wildcard/match_test.go at v1.19.0
    assert wildcard_match("my-bucket/In*", "my-bucket/India/Karnataka/")
    assert not wildcard_match("my-bucket/In*", "my-bucket/Karnataka/India/")
    assert wildcard_match("my-bucket?abc*", "my-bucket/abc")
    assert not wildcard_match("my-bucket/abc?", "my-bucket/abc")
    assert not wildcard_match("my-bucket/mnop*?and", "my-bucket/mnopand")
    assert wildcard_match("my-bucket/oo*", "my-bucket/oo")


D = "sha256:" + "a" * 64


@pytest.mark.parametrize("repo,image,matched", [
    (REPO, f"{REPO}:tiny-cpu", True), (REPO, f"{REPO}@{D}", True),
    (REPO, f"{REPO}:tiny-cpu@{D}", True), (REPO, f"{REPO}/sub:t", True),
    (REPO, f"{REPO}/sub/deeper@{D}", True), (REPO, REPO, True),  # :latest
    (REPO, f"{REPO}-other:t", False), (REPO, f"{REPO}-other@{D}", False),
    (REPO, f"{REPO}x/y:t", False), (REPO, "127.0.0.1:5000/acme/other:t", False),
    (REPO, "127.0.0.1:5001/acme/serving:t", False),
    # Docker Hub, as the user named it and as Kyverno spells it
    ("acme/serving", "acme/serving:t", True), ("acme/serving", "docker.io/acme/serving:t", True),
    ("acme/serving", "acme/serving-other:t", False),
    ("docker.io/acme/serving", "acme/serving@" + D, True),
    ("localhost:5000/serving", "localhost:5000/serving:t", True),
])
def test_the_image_references_cover_the_repository_and_nothing_beside_it(repo, image, matched):
    seen = kyverno_image(image)
    assert any(wildcard_match(p, seen) for p in image_references(repo)) is matched, seen


def test_a_prefix_pattern_would_take_a_sibling():
    """Why the references are three: Kyverno's `*` crosses `/` and has no word boundary."""
    assert wildcard_match(f"{REPO}*", kyverno_image(f"{REPO}-other:t"))
    assert image_references(REPO + "/") == image_references(REPO)


# --- run --emit k8s ---------------------------------------------------------------------------

@pytest.fixture()
def signed_ws(tmp_path):
    from imgbuild.workspace import Workspace

    images = tmp_path / "images"
    images.mkdir()
    (images / "registries.yaml").write_text(
        f"registries:\n  - match: {REPO}\n"
        f"    signed-by: {{key: {FIXTURES / 'cosign' / 'cosign.pub'}}}\n")
    return Workspace.open(images, ROOT / "lockfiles", env={}, cwd=tmp_path)


def test_run_emit_k8s_writes_it_under_a_policy_only(signed_ws, tmp_path):
    from imgbuild.pipeline.run import run

    got = run(signed_ws, "tiny-cpu", registry_name=REPO, emit=("k8s", tmp_path / "k8s"))
    [cip] = [Path(f) for f in got.files if f.endswith("-clusterimagepolicy.yaml")]
    doc = yaml.safe_load(cip.read_text())
    valid(doc)
    assert doc["spec"]["authorities"][0]["key"]["data"] == PEM
    assert cip.read_text().startswith("# Generated by imgbuild from the signed-by policy of ")
    assert "data: |\n" in cip.read_text()  # the PEM as a block a person can read and paste
    other = run(signed_ws, "tiny-cpu", registry_name="127.0.0.1:5000/elsewhere",
                emit=("k8s", tmp_path / "k8s2"))
    assert not [f for f in other.files if f.endswith("-clusterimagepolicy.yaml")]


def test_run_emit_k8s_writes_the_kyverno_policy_when_asked(signed_ws, tmp_path):
    from imgbuild.pipeline.run import run

    got = run(signed_ws, "tiny-cpu", registry_name=REPO, emit=("k8s", tmp_path / "k8s"),
              admission="kyverno")
    policies = [Path(f) for f in got.files if "polic" in Path(f).name]
    assert [p.name.rsplit("-", 1)[-1] for p in policies] == ["clusterpolicy.yaml"]
    [path] = policies
    doc = yaml.safe_load(path.read_text())
    kyverno_valid(doc)
    assert path.name == f"{doc['metadata']['name']}-clusterpolicy.yaml"
    assert doc["spec"]["rules"][0]["verifyImages"][0]["attestors"][0]["entries"][0][
        "keys"]["publicKeys"] == PEM
    assert "Needs Kyverno 1.13 or later" in path.read_text()
    # the Deployment beside it names an image the references take
    [dep] = [yaml.safe_load(Path(f).read_text()) for f in got.files
             if f.endswith("-deployment.yaml")]
    [c] = dep["spec"]["template"]["spec"]["containers"]
    assert any(wildcard_match(p, kyverno_image(c["image"]))
               for p in doc["spec"]["rules"][0]["verifyImages"][0]["imageReferences"])


def header(path: Path) -> str:
    """A written file's comment header as one line of prose."""
    head = path.read_text().split("apiVersion:")[0]
    return " ".join(line.removeprefix("# ") for line in head.splitlines())


def keyless_ws(tmp_path, root: Path):
    from imgbuild.workspace import Workspace

    images = tmp_path / "images"
    images.mkdir()
    (images / "registries.yaml").write_text(
        f"registries:\n  - match: {REPO}\n    signed-by:\n      keyless:\n"
        f"        issuer: https://token.actions.githubusercontent.com\n"
        f"        subject: https://github.com/acme/x/.github/workflows/images.yml@refs/heads/main\n"
        f"        trust-root: {root}\n")
    return Workspace.open(images, ROOT / "lockfiles", env={}, cwd=tmp_path)


def test_run_emit_k8s_writes_the_trustroot_the_policy_refers_to(tmp_path):
    from imgbuild.pipeline.run import run

    got = run(keyless_ws(tmp_path, PGI), "tiny-cpu", registry_name=REPO,
              emit=("k8s", tmp_path / "k8s"))
    [cip_path] = [Path(f) for f in got.files if f.endswith("-clusterimagepolicy.yaml")]
    [tr_path] = [Path(f) for f in got.files if f.endswith("-trustroot.yaml")]
    cip, tr = yaml.safe_load(cip_path.read_text()), yaml.safe_load(tr_path.read_text())
    valid(cip)
    trust_root_valid(tr)
    name = tr["metadata"]["name"]
    assert tr_path.name == f"{name}-trustroot.yaml" and tr_path.parent == cip_path.parent
    [a] = cip["spec"]["authorities"]
    assert a["keyless"]["trustRootRef"] == a["ctlog"]["trustRootRef"] == name
    assert tr == trust_root_resource(name, pgi_trust())
    head = header(cip_path)
    assert f"TrustRoot named {name}" in head and tr_path.name in head
    assert "does not write" not in head and "by hand" not in head
    assert "Left out: CT log https://ctfe.sigstore.dev/test" in header(tr_path)


def test_a_trust_root_that_cannot_be_a_trustroot_leaves_no_manifest_behind(tmp_path):
    """The TrustRoot is made with the policy, before any launch file is written."""
    from imgbuild.pipeline.run import run

    raw = json.loads(PGI.read_text())
    del raw["certificateAuthorities"][0]["uri"]
    root = tmp_path / "root.json"
    root.write_text(json.dumps(raw))
    out = tmp_path / "k8s"
    with pytest.raises(InputError) as e:
        run(keyless_ws(tmp_path, root), "tiny-cpu", registry_name=REPO, emit=("k8s", out))
    assert "certificateAuthorities[0] has no uri" in e.value.facts
    assert not out.exists() or not list(out.iterdir())


@pytest.mark.parametrize("admission", [None, "kyverno"])
def test_a_policy_key_that_cannot_be_read_leaves_no_manifest_behind(tmp_path, admission):
    """The key is read before any launch file is written: a Deployment without the policy
    that was meant to guard it is not left for a user to apply."""
    from imgbuild.pipeline.run import run
    from imgbuild.workspace import Workspace

    images = tmp_path / "images"
    images.mkdir()
    (images / "registries.yaml").write_text(
        f"registries:\n  - match: {REPO}\n    signed-by: {{key: keys/missing.pub}}\n")
    ws = Workspace.open(images, ROOT / "lockfiles", env={}, cwd=tmp_path)
    out = tmp_path / "k8s"
    with pytest.raises(InputError) as e:
        run(ws, "tiny-cpu", registry_name=REPO, emit=("k8s", out), admission=admission)
    assert "missing.pub" in str(e.value) + " ".join(e.value.facts)
    assert not out.exists() or not list(out.iterdir())


def test_run_refuses_an_admission_asked_for_where_there_is_no_policy(signed_ws, tmp_path):
    from imgbuild.pipeline.run import run

    with pytest.raises(InputError) as e:
        run(signed_ws, "tiny-cpu", registry_name="127.0.0.1:5000/elsewhere",
            emit=("k8s", tmp_path / "k8s"), admission="kyverno")
    assert "127.0.0.1:5000/elsewhere has no signed-by policy" in str(e.value)
    assert "drop --admission" in e.value.hint
    assert not (tmp_path / "k8s").exists()  # refused before a file was written


def test_the_cli_offers_the_admission_controllers_the_plan_writes():
    from imgbuild.cli.parser import parser

    run_parser = next(a for a in parser()._actions if a.dest == "command").choices["run"]
    [opt] = [a for a in run_parser._actions if "--admission" in a.option_strings]
    assert tuple(opt.choices) == ADMISSION and opt.default is None
