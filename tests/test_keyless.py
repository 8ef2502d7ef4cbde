"""Keyless signatures decided on plain data (image/keyless.py, the keyless half of
image/cosign.py): no Docker, no registry, no network.

Two sources. Recorded real output of Sigstore's public-good instance (tests/data/sigstore, its
README says where each file came from): a GitHub Actions `cosign sign` of an image and a
`cosign attest`, with the trust root that covers them; they pass, and each tampering fails.
And a TEST STAND-IN for Fulcio, Rekor and the CT log (tests/sigstore_standin.py), for what
recorded data cannot show: a log entry dated outside the certificate's validity, `tlog: false`."""

from __future__ import annotations

import base64
import hashlib
import json
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric import ec

from imgbuild.catalog.registries import SignPolicy, load_registries
from imgbuild.errors import InputError
from imgbuild.image import cosign, keyless, signstore
from imgbuild.plan.imagepolicy import cluster_image_policy, trust_root_note

from .sigstore_standin import GHA_ISSUER, GHA_SUBJECT, StandIn, cert_pem, hashedrekord, intoto

DATA = Path(__file__).parent / "data" / "sigstore"
NOW = datetime(2026, 8, 1, tzinfo=UTC)  # any time: with the log, only the log's time counts

# The recorded GitHub Actions signature (README: salrashid123/go-bazel-github-workflow).
GHA_DIGEST = "sha256:c05263d2ff654c3a94243662440913f045075d59c436e2c69e9145ec2b87a321"
GHA_WHO = ("https://github.com/salrashid123/go-bazel-github-workflow/.github/workflows/"
           "release.yaml@refs/tags/v0.0.30")
# The recorded attestation (README: sigstore/cosign pkg/cosign/testdata).
ATT_DIGEST = "sha256:732112270d7e59418a8c080b134b24cabd67d250d0d0147a97ed95ba5c280aa4"
ATT_TYPE = "https://cosign.sigstore.dev/attestation/v1"


@pytest.fixture(scope="module")
def root() -> keyless.TrustRoot:
    return keyless.load_trust_root((DATA / "trusted_root_pgi.json").read_bytes(),
                                   "trusted_root_pgi.json")


@pytest.fixture(scope="module")
def gha_layer() -> cosign.Layer:
    desc = json.loads((DATA / "gha-release.sig-manifest.json").read_text())["layers"][0]
    blob = (DATA / "gha-release.sig-payload.json").read_bytes()
    layer = cosign.Layer(desc["mediaType"], desc["annotations"], blob)
    # The blob is the recorded one: the descriptor's digest and size.
    assert (layer.digest, len(blob)) == (desc["digest"], desc["size"])
    return layer


@pytest.fixture(scope="module")
def att_layer() -> cosign.Layer:
    b = json.loads((DATA / "oci-attestation.sigstore.json").read_text())
    e, vm = b["dsseEnvelope"], b["verificationMaterial"]
    t = vm["tlogEntries"][0]
    envelope = json.dumps({"payloadType": e["payloadType"], "payload": e["payload"],
                           "signatures": [{"keyid": "", "sig": e["signatures"][0]["sig"]}]},
                          separators=(",", ":")).encode()
    body = json.loads(base64.b64decode(t["canonicalizedBody"]))
    assert hashlib.sha256(envelope).hexdigest() == body["spec"]["envelopeHash"]["value"]
    bundle = json.dumps({"SignedEntryTimestamp": t["inclusionPromise"]["signedEntryTimestamp"],
                         "Payload": {"body": t["canonicalizedBody"],
                                     "integratedTime": int(t["integratedTime"]),
                                     "logIndex": int(t["logIndex"]),
                                     "logID": base64.b64decode(t["logId"]["keyId"]).hex()}})
    pem = ("-----BEGIN CERTIFICATE-----\n" + vm["certificate"]["rawBytes"]
           + "\n-----END CERTIFICATE-----\n")
    return cosign.Layer(cosign.DSSE_LAYER, {cosign.SIG_ANNOTATION: "",
                                            cosign.PREDICATE_ANNOTATION: ATT_TYPE,
                                            keyless.CERT_ANNOTATION: pem,
                                            keyless.BUNDLE_ANNOTATION: bundle}, envelope)


def policy(subject: str = GHA_WHO, issuer: str = GHA_ISSUER, **kw) -> SignPolicy:
    return SignPolicy("images/registries.yaml", issuer=issuer, subject=subject,
                      trust_root="root.json", attestations=(), **kw)


def sig_check(layer, pol, root, digest=GHA_DIGEST, now=NOW):
    return cosign.check_keyless_signature(digest, [layer], pol, root, now)


def annotated(layer: cosign.Layer, **changes) -> cosign.Layer:
    return replace(layer, annotations={**layer.annotations, **changes})


# --- the recorded real signatures --------------------------------------------------------------

def test_recorded_github_actions_signature_passes(root, gha_layer):
    what, ok, detail = sig_check(gha_layer, policy(), root)
    assert ok, detail
    assert GHA_WHO in detail and "trusted_root_pgi.json" in detail
    who = keyless.leaf_identity(gha_layer.annotations)
    assert (who.subject, who.issuer) == (GHA_WHO, GHA_ISSUER)


def test_recorded_attestation_passes(root, att_layer):
    pol = policy("cody@soyland.com", "https://github.com/login/oauth")
    what, ok, detail = cosign.check_keyless_attestation(ATT_DIGEST, [att_layer], pol, root, NOW,
                                                         "custom", ATT_TYPE)
    assert ok, detail
    # The same envelope is about one image only.
    _, ok, detail = cosign.check_keyless_attestation(GHA_DIGEST, [att_layer], pol, root, NOW,
                                                     "custom", ATT_TYPE)
    assert not ok and "about another image" in detail


@pytest.mark.parametrize("change, said", [
    ({"subject": "https://github.com/acme/serving/.github/workflows/images.yml@refs/heads/main"},
     f"a certificate for {GHA_WHO} (issuer {GHA_ISSUER}), not https://github.com/acme"),
    ({"issuer": "https://accounts.google.com"}, "not " + GHA_WHO + " (issuer https://accounts"),
])
def test_another_identity_is_refused(root, gha_layer, change, said):
    _, ok, detail = sig_check(gha_layer, policy(**{"subject": GHA_WHO, "issuer": GHA_ISSUER,
                                                   **change}), root)
    assert not ok and said in detail, detail
    assert detail.startswith("no keyless signature by ")


def test_a_flipped_signature_byte_is_refused(root, gha_layer):
    sig = bytearray(base64.b64decode(gha_layer.annotations[cosign.SIG_ANNOTATION]))
    sig[-3] ^= 0x01
    bad = annotated(gha_layer, **{cosign.SIG_ANNOTATION: base64.b64encode(sig).decode()})
    _, ok, detail = sig_check(bad, policy(), root)
    assert not ok and "a signature that the key of the certificate" in detail, detail


def test_a_changed_payload_is_refused(root, gha_layer):
    bad = replace(gha_layer, blob=gha_layer.blob.replace(b"server_image", b"server_imagf"))
    _, ok, detail = sig_check(bad, policy(), root)
    assert not ok and "did not make" in detail, detail


def test_a_bundle_from_another_entry_is_refused(root, gha_layer, att_layer):
    # A real bundle, signed by the real log: for another entry.
    bad = annotated(gha_layer, **{keyless.BUNDLE_ANNOTATION:
                                  att_layer.annotations[keyless.BUNDLE_ANNOTATION]})
    _, ok, detail = sig_check(bad, policy(), root)
    assert not ok and "a Rekor bundle (log index 175508996) of an entry for other content" \
        in detail, detail


def test_a_redated_bundle_is_refused(root, gha_layer):
    b = json.loads(gha_layer.annotations[keyless.BUNDLE_ANNOTATION])
    b["Payload"]["integratedTime"] -= 3600  # an hour earlier: outside the leaf's ten minutes
    bad = annotated(gha_layer, **{keyless.BUNDLE_ANNOTATION: json.dumps(b)})
    _, ok, detail = sig_check(bad, policy(), root)
    assert not ok and "signed entry timestamp" in detail and "does not verify" in detail, detail


def test_no_bundle_is_refused_unless_the_policy_opts_out(root, gha_layer):
    bare = replace(gha_layer, annotations={k: v for k, v in gha_layer.annotations.items()
                                           if k != keyless.BUNDLE_ANNOTATION})
    _, ok, detail = sig_check(bare, policy(), root)
    assert not ok and "no Rekor bundle" in detail and "tlog: false" in detail
    # Without the log nothing dates the signature: the ten-minute leaf expired long ago.
    _, ok, detail = sig_check(bare, policy(tlog=False), root)
    assert not ok and "not now" in detail, detail
    at = datetime(2026, 2, 27, 18, 25, tzinfo=UTC)  # inside its validity
    assert sig_check(bare, policy(tlog=False), root, now=at)[1]


def test_a_signature_of_another_image_is_refused(root, gha_layer):
    _, ok, detail = sig_check(gha_layer, policy(), root, digest="sha256:" + "ab" * 32)
    assert not ok and f"of another image, {GHA_DIGEST}" in detail


def test_a_trust_root_without_its_ca_or_logs_is_refused(root, gha_layer):
    _, ok, detail = sig_check(gha_layer, policy(), replace(root, cas=root.cas[:1]))
    assert not ok and "which no Fulcio CA in trusted_root_pgi.json issued" in detail, detail
    _, ok, detail = sig_check(gha_layer, policy(), replace(root, tlogs=()))
    assert not ok and "which trusted_root_pgi.json does not name (0 tlogs" in detail, detail
    _, ok, detail = sig_check(gha_layer, policy(), replace(root, ctlogs=()))
    assert not ok and "an SCT from log dd3d306ac6c71132" in detail, detail
    assert sig_check(gha_layer, policy(sct=False), replace(root, ctlogs=()))[1]
    # A CA the trust root dates to end before the leaf was issued.
    ended = keyless.Window(root.cas[1].valid.start, datetime(2025, 1, 1, tzinfo=UTC))
    cas = (root.cas[0], replace(root.cas[1], valid=ended))
    assert not sig_check(gha_layer, policy(), replace(root, cas=cas))[1]


def test_an_sct_that_does_not_verify_is_refused(root, gha_layer):
    # The real CT log's id with another key: the SCT's signature cannot verify.
    other = ec.generate_private_key(ec.SECP256R1()).public_key()
    ctlogs = tuple(replace(k, key=other) for k in root.ctlogs)
    _, ok, detail = sig_check(gha_layer, policy(), replace(root, ctlogs=ctlogs))
    assert not ok and "an SCT of log dd3d306ac6c71132... that does not verify" in detail, detail


def test_judge_without_a_trust_root_refuses_naming_it():
    [(what, ok, detail)] = cosign.judge(policy(), GHA_DIGEST, None, None, None, None)
    assert not ok and "names no trust-root" in detail and "offline" in detail


def test_a_policy_without_trust_root_is_exit_2_naming_it(tmp_path):
    pol = replace(policy(), trust_root=None)
    with pytest.raises(InputError) as e:
        signstore.policy_trust_root(pol)
    assert "has no trust-root" in e.value.message and "trusted_root.json" in e.value.hint
    with pytest.raises(InputError) as e:
        signstore.policy_trust_root(replace(pol, where=str(tmp_path / "r.yaml"),
                                            trust_root="root.json"))
    assert "cannot read" in e.value.message and str(tmp_path / "root.json") in e.value.message
    (tmp_path / "root.json").write_text('{"mediaType": "x"}')
    with pytest.raises(InputError) as e:
        signstore.policy_trust_root(replace(pol, where=str(tmp_path / "r.yaml"),
                                            trust_root="root.json"))
    assert "cannot be used" in e.value.message and "mediaType" in e.value.facts[0]


# --- the stand-in: what recorded data cannot show ---------------------------------------------

# The stand-in (`standin`) and its trust root (`standin_root`): tests/conftest.py.


def signed_layer(standin: StandIn, *, integrated: int | None = None, digest: str = GHA_DIGEST,
                 **leaf) -> cosign.Layer:
    key = ec.generate_private_key(ec.SECP256R1())
    cert = standin.leaf(key, **leaf)
    blob = cosign.simple_signing("127.0.0.1:5000/acme/serving", digest)
    sig = key.sign(blob, ec.ECDSA(hashes.SHA256()))
    when = integrated if integrated is not None else int(cert.not_valid_before_utc.timestamp()) + 30
    return cosign.Layer(cosign.SIG_LAYER, {
        cosign.SIG_ANNOTATION: base64.b64encode(sig).decode(),
        keyless.CERT_ANNOTATION: cert_pem(cert),
        keyless.CHAIN_ANNOTATION: standin.chain_pem(),
        keyless.BUNDLE_ANNOTATION: standin.bundle(hashedrekord(blob, sig, cert), when)}, blob)


def test_standin_signature_passes_and_a_log_time_outside_the_leaf_is_refused(standin,
                                                                             standin_root):
    pol = policy(GHA_SUBJECT)
    assert sig_check(signed_layer(standin), pol, standin_root)[1]
    late = int((datetime.now(UTC) + timedelta(hours=1)).timestamp())
    _, ok, detail = sig_check(signed_layer(standin, integrated=late), pol, standin_root)
    assert not ok and "outside the certificate's validity" in detail, detail


def test_standin_leaf_without_sct_needs_sct_false(standin, standin_root):
    layer = signed_layer(standin, sct=False)
    _, ok, detail = sig_check(layer, policy(GHA_SUBJECT), standin_root)
    assert not ok and "no SCT embedded" in detail and "sct: false" in detail
    assert sig_check(layer, policy(GHA_SUBJECT, sct=False), standin_root)[1]


def test_standin_attestation_passes_and_a_swapped_one_is_refused(standin, standin_root):
    key = ec.generate_private_key(ec.SECP256R1())
    cert = standin.leaf(key)
    signer = cosign.SigningKey(key, "leaf")
    stmt = cosign.statement("r", GHA_DIGEST, cosign.ATTESTATION_TYPES["cyclonedx"], {})
    env = cosign.envelope(signer, stmt)
    payload = base64.b64decode(json.loads(env)["payload"])
    when = int(cert.not_valid_before_utc.timestamp()) + 5
    layer = cosign.Layer(cosign.DSSE_LAYER, {
        cosign.SIG_ANNOTATION: "", cosign.PREDICATE_ANNOTATION: stmt["predicateType"],
        keyless.CERT_ANNOTATION: cert_pem(cert),
        keyless.BUNDLE_ANNOTATION: standin.bundle(intoto(env, payload, cert), when)}, env)
    pol = replace(policy(GHA_SUBJECT), attestations=("cyclonedx",))
    checks = cosign.judge(pol, GHA_DIGEST, [signed_layer(standin)], [layer], None, standin_root)
    assert all(ok for _, ok, _ in checks), checks
    _, ok, detail = cosign.check_keyless_attestation("sha256:" + "ef" * 32, [layer], pol,
                                                     standin_root, NOW, "cyclonedx")
    assert not ok and "about another image" in detail


def test_the_standin_trust_root_is_sigstores_format(standin):
    doc = standin.trusted_root()
    root = keyless.load_trust_root(json.dumps(doc).encode(), "x")
    assert len(root.cas) == 1 and len(root.cas[0].chain) == 2 and root.tlogs and root.ctlogs


# --- the policy: keys, the cluster, cosign's line --------------------------------------------

def test_keyless_policy_reads_tlog_and_sct(tmp_path):
    (tmp_path / "registries.yaml").write_text("""
registries:
  - match: ghcr.io/acme
    signed-by:
      keyless: {issuer: https://i, subject: s, trust-root: root.json, tlog: false, sct: false}
  - match: ghcr.io/other
    signed-by:
      keyless: {issuer: https://i, subject: s}
""")
    table = load_registries([tmp_path])
    p = table.policy_for("ghcr.io/acme/x")
    assert (p.tlog, p.sct, p.trust_root) == (False, False, "root.json")
    q = table.policy_for("ghcr.io/other/x")
    assert (q.tlog, q.sct, q.trust_root) == (True, True, None)
    assert cosign.trust_root_path(p) == str(tmp_path / "root.json")


def test_cosign_line_and_cluster_policy_say_the_same():
    p = SignPolicy("/p/registries.yaml", issuer=GHA_ISSUER, subject=GHA_SUBJECT,
                   trust_root="root.json", tlog=False, sct=False)
    [line, *_] = cosign.cosign_commands(p, None, "r@sha256:x")
    assert f"--certificate-identity {GHA_SUBJECT} --certificate-oidc-issuer {GHA_ISSUER}" in line
    assert "--trusted-root /p/root.json --insecure-ignore-tlog=true --insecure-ignore-sct=true" \
        in line
    doc = cluster_image_policy("ghcr.io/acme", p, None)
    name = doc["metadata"]["name"]
    a = doc["spec"]["authorities"][0]
    assert a["keyless"]["trustRootRef"] == name and a["keyless"]["insecureIgnoreSCT"] is True
    assert "ctlog" not in a
    assert f"TrustRoot named {name}" in trust_root_note(p, name)
    strict = cluster_image_policy("ghcr.io/acme", replace(p, tlog=True, sct=True), None)
    a = strict["spec"]["authorities"][0]
    assert a["ctlog"] == {"trustRootRef": name} and "insecureIgnoreSCT" not in a["keyless"]
    assert "--insecure-ignore" not in cosign.cosign_commands(replace(p, tlog=True, sct=True),
                                                            None, "r")[0]


# --- the verdicts, word for word ----------------------------------------------------------------

def test_a_keyless_signature_verdict_names_each_layer_found_and_the_good_one_wins(standin,
                                                                                  standin_root):
    pol = policy(GHA_SUBJECT)
    good = signed_layer(standin)
    theirs = signed_layer(standin, subject="https://github.com/mallory/x/.github/workflows/"
                                           "ci.yml@refs/heads/main")
    why_theirs = keyless.examine(keyless.Evidence(theirs.blob, theirs.blob, base64.b64decode(
        theirs.annotations[cosign.SIG_ANNOTATION]), theirs.annotations),
        cosign._keyless_want(pol), standin_root, NOW)
    assert why_theirs
    found = [cosign.Layer("application/octet-stream", {}, b"x"),
             cosign.Layer(cosign.SIG_LAYER, {}, b"not json"),
             # base64 with a stray character: refused as is, not read past it
             annotated(good, **{cosign.SIG_ANNOTATION: "c2ln*"}),
             theirs,
             signed_layer(standin, digest="sha256:" + "ef" * 32)]
    assert cosign.check_keyless_signature(GHA_DIGEST, found, pol, standin_root, NOW) == (
        "signature", False,
        f"no keyless signature by {GHA_SUBJECT} (issuer {GHA_ISSUER}) that stand-in accepts: "
        "5 found, " + "; ".join(sorted([
            "a layer of type application/octet-stream",
            "a payload that is not cosign's simple signing",
            f"a signature by {GHA_SUBJECT} of another image, sha256:" + "ef" * 32,
            why_theirs])))
    assert cosign.check_keyless_signature(GHA_DIGEST, [*found, good], pol, standin_root,
                                          NOW) == (
        "signature", True, f"signed by {GHA_SUBJECT} (issuer {GHA_ISSUER}), Fulcio CA and Rekor "
        "entry checked against stand-in")
    assert cosign.check_keyless_signature(GHA_DIGEST, [], pol, standin_root, NOW) == (
        "signature", False, f"none: the registry holds no {cosign.sig_tag(GHA_DIGEST)}")


def test_a_keyless_pass_without_the_log_says_the_log_was_not_asked(standin, standin_root):
    pol = policy(GHA_SUBJECT, tlog=False)
    layer = annotated(signed_layer(standin), **{keyless.BUNDLE_ANNOTATION: ""})
    # Without the log's time, the certificate must be valid now: the stand-in's is, for minutes.
    now = datetime.now(UTC)
    assert cosign.check_keyless_signature(GHA_DIGEST, [layer], pol, standin_root, now)[2] == (
        f"signed by {GHA_SUBJECT} (issuer {GHA_ISSUER}), Fulcio CA and Rekor entry checked "
        "against stand-in (transparency log not asked)")
    here = [{"name": "r", "digest": {"sha256": GHA_DIGEST.split(":")[1]}}]
    att = annotated(_keyless_att(standin, {
        "_type": "https://in-toto.io/Statement/v1", "predicateType": "https://cyclonedx.org/bom",
        "subject": here, "predicate": {}}), **{keyless.BUNDLE_ANNOTATION: ""})
    assert cosign.check_keyless_attestation(GHA_DIGEST, [att], pol, standin_root, now,
                                            "cyclonedx")[1]


def _keyless_att(standin: StandIn, stmt: dict, *, payload_type: str = cosign.INTOTO_PAYLOAD,
                 subject: str = GHA_SUBJECT) -> cosign.Layer:
    key = ec.generate_private_key(ec.SECP256R1())
    cert = standin.leaf(key, subject=subject)
    body = json.dumps(stmt).encode()
    sig = key.sign(cosign.pae(cosign.INTOTO_PAYLOAD, body), ec.ECDSA(hashes.SHA256()))
    env = json.dumps({"payloadType": payload_type, "payload": base64.b64encode(body).decode(),
                      "signatures": [{"keyid": "", "sig": base64.b64encode(sig).decode()}]})
    when = int(cert.not_valid_before_utc.timestamp()) + 5
    return cosign.Layer(cosign.DSSE_LAYER, {
        cosign.SIG_ANNOTATION: "", keyless.CERT_ANNOTATION: cert_pem(cert),
        keyless.BUNDLE_ANNOTATION: standin.bundle(intoto(env.encode(), body, cert), when)},
        env.encode())


def test_a_keyless_attestation_verdict_names_each_envelope_found(standin, standin_root):
    pol = replace(policy(GHA_SUBJECT), attestations=("cyclonedx",))
    cdx = cosign.ATTESTATION_TYPES["cyclonedx"]

    def stmt(subjects, ptype=cdx):
        return {"_type": "https://in-toto.io/Statement/v1", "predicateType": ptype,
                "subject": subjects, "predicate": {}}
    here = [{"name": "r", "digest": {"sha256": GHA_DIGEST.split(":")[1]}}]
    other = "https://github.com/mallory/x/.github/workflows/ci.yml@refs/heads/main"
    theirs = _keyless_att(standin, stmt(here), subject=other)
    env = json.loads(theirs.blob)
    why_theirs = keyless.examine(keyless.Evidence(
        theirs.blob, cosign.pae(cosign.INTOTO_PAYLOAD, base64.b64decode(env["payload"])),
        base64.b64decode(env["signatures"][0]["sig"]), theirs.annotations),
        cosign._keyless_want(pol), standin_root, NOW)
    found = [cosign.Layer(cosign.SIG_LAYER, {}, b"{}"),  # not an envelope: not counted
             cosign.Layer(cosign.DSSE_LAYER, {}, b"not json"),
             _keyless_att(standin, stmt(here, "https://slsa.dev/provenance/v1")),
             _keyless_att(standin, stmt(here), payload_type="text/plain"),
             theirs,
             _keyless_att(standin, stmt([{"name": "r", "digest": {"sha256": "ef" * 32}}])),
             _keyless_att(standin, stmt([{"name": "r"}]))]
    assert cosign.check_keyless_attestation(GHA_DIGEST, found, pol, standin_root, NOW,
                                            "cyclonedx") == (
        "attestation cyclonedx", False,
        f"no {cdx} statement about this digest signed by {GHA_SUBJECT} (issuer {GHA_ISSUER}): "
        + "; ".join(sorted([
            "a cyclonedx envelope of payload type 'text/plain'",
            "a cyclonedx statement about another image (no subject)",
            "a cyclonedx statement about another image (sha256:" + "ef" * 32 + ")",
            "an envelope that is not DSSE over an in-toto statement", why_theirs])))
    good = _keyless_att(standin, stmt(here))
    assert cosign.check_keyless_attestation(GHA_DIGEST, [*found, good], pol, standin_root, NOW,
                                            "cyclonedx")[:2] == ("attestation cyclonedx", True)
    assert cosign.check_keyless_attestation(GHA_DIGEST, found[:1], pol, standin_root, NOW,
                                            "cyclonedx")[2] == (
        f"no {cdx} statement about this digest signed by {GHA_SUBJECT} (issuer {GHA_ISSUER}) "
        "(none of that type)")
    assert cosign.check_keyless_attestation(GHA_DIGEST, None, pol, standin_root, NOW,
                                            "cyclonedx") == (
        "attestation cyclonedx", False, f"none: the registry holds no "
        f"{cosign.att_tag(GHA_DIGEST)}")
