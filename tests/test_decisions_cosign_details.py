"""cosign's formats byte for byte, and every check's verdict word for word (image/cosign.py):
what imgbuild writes must be what cosign writes, and what a refused pull says must name each
thing found under the tag. The manifest is compared with one cosign wrote (tests/data/sigstore,
recorded real output, its README says where from); the rest runs on the keys cosign 2.5 made
in tests/fixtures/cosign."""

from __future__ import annotations

import base64
import json
from datetime import UTC, datetime
from pathlib import Path

import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import rsa

from imgbuild.catalog.registries import SignPolicy
from imgbuild.image import cosign, keyless

KEYS = Path(__file__).parent / "fixtures" / "cosign"
SIGSTORE = Path(__file__).parent / "data" / "sigstore"
DIGEST = "sha256:" + "ab" * 32
OTHER = "sha256:" + "cd" * 32
REPO = "127.0.0.1:5000/acme/serving"
GHA = "https://token.actions.githubusercontent.com"
WHO = "https://github.com/acme/serving/.github/workflows/ci.yml@refs/heads/main"
CDX = "https://cyclonedx.org/bom"


@pytest.fixture(scope="module")
def key() -> cosign.SigningKey:
    return cosign.load_private_key((KEYS / "cosign.key").read_bytes(), b"imgbuild-test",
                                   "cosign.key")


@pytest.fixture(scope="module")
def other() -> cosign.SigningKey:
    return cosign.load_private_key((KEYS / "other.key").read_bytes(), b"imgbuild-test",
                                   "other.key")


# --- what goes to the registry ------------------------------------------------------------------

def test_the_signature_manifest_is_the_one_cosign_wrote_byte_for_byte():
    recorded = json.loads((SIGSTORE / "gha-release.sig-manifest.json").read_bytes())
    d = recorded["layers"][0]
    layer = cosign.Layer(d["mediaType"], d["annotations"],
                         (SIGSTORE / "gha-release.sig-payload.json").read_bytes())
    manifest, config = cosign.manifest_parts([layer])
    # cosign (go-containerregistry) writes compact JSON in this key order; the config blob
    # is its too: the recorded manifest names it by this very digest and size.
    assert manifest == json.dumps(recorded, separators=(",", ":")).encode()
    assert json.loads(config) == {
        "architecture": "", "created": "0001-01-01T00:00:00Z",
        "history": [{"created": "0001-01-01T00:00:00Z"}], "os": "",
        "rootfs": {"type": "layers", "diff_ids": [d["digest"]]}, "config": {}}


def test_the_envelope_is_dsse_as_cosign_lays_it_out_and_its_statement_is_canonical(key):
    first = {"_type": "https://in-toto.io/Statement/v1", "predicateType": CDX,
             "subject": [{"name": REPO, "digest": {"sha256": "ab" * 32}}],
             "predicate": {"bomFormat": "CycloneDX", "specVersion": "1.5"}}
    reordered = dict(reversed(list(first.items())))
    reordered["predicate"] = {"specVersion": "1.5", "bomFormat": "CycloneDX"}
    a, b = cosign.envelope(key, first), cosign.envelope(key, reordered)
    env = json.loads(a)
    # cosign's layout (the recorded attestation's envelope hashes to its Rekor entry so).
    assert list(env) == ["payloadType", "payload", "signatures"]
    assert env["payloadType"] == "application/vnd.in-toto+json"
    assert [list(s) for s in env["signatures"]] == [["keyid", "sig"]]
    assert env["signatures"][0]["keyid"] == ""
    assert a == json.dumps(env, separators=(",", ":")).encode()
    # The statement's bytes follow from the statement, not the order a dict was built in.
    body = base64.b64decode(env["payload"])
    assert body == base64.b64decode(json.loads(b)["payload"])
    assert body == (b'{"_type":"https://in-toto.io/Statement/v1","predicate":{"bomFormat":'
                    b'"CycloneDX","specVersion":"1.5"},"predicateType":"https://cyclonedx.org/bom",'
                    b'"subject":[{"digest":{"sha256":"' + b"ab" * 32 + b'"},"name":"'
                    + REPO.encode() + b'"}]}')


def test_a_key_id_is_sha256_of_the_public_key_cut_to_16_hex(key):
    der = key.key.public_key().public_bytes(serialization.Encoding.DER,
                                            serialization.PublicFormat.SubjectPublicKeyInfo)
    import hashlib
    assert cosign.key_id(key.key.public_key()) == "sha256:" + hashlib.sha256(der).hexdigest()[:16]
    assert len(cosign.key_id(key.key.public_key())) == len("sha256:") + 16


def test_a_public_key_that_is_not_ecdsa_or_not_pem_says_which():
    rsa_pem = rsa.generate_private_key(public_exponent=65537, key_size=2048).public_key() \
        .public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
    with pytest.raises(cosign.KeyProblem) as e:
        cosign.load_public_key(rsa_pem)
    assert str(e.value) == "a RSAPublicKey; imgbuild checks ECDSA keys"
    with pytest.raises(cosign.KeyProblem) as e:
        cosign.load_public_key(b"-----BEGIN PUBLIC KEY-----\n" + b"A" * 400
                               + b"\n-----END PUBLIC KEY-----\n")
    message = str(e.value)
    assert message.startswith("not a PEM public key: ") and "\n" not in message
    assert len(message) <= len("not a PEM public key: ") + 160


# --- the verdicts a refused pull shows ----------------------------------------------------------

def test_a_signature_check_names_everything_found_and_passes_over_what_is_not_it(key, other):
    pub = key.key.public_key()
    good = cosign.signature_layer(key, REPO, DIGEST)
    odd_type = cosign.Layer("application/octet-stream", {}, b"x")
    not_json = cosign.Layer(cosign.SIG_LAYER, {cosign.SIG_ANNOTATION: "c2ln"}, b"not json")
    unsigned = cosign.Layer(cosign.SIG_LAYER, {}, good.blob)
    theirs = cosign.signature_layer(other, REPO, DIGEST)
    elsewhere = cosign.signature_layer(key, REPO, OTHER)
    found = [odd_type, not_json, unsigned, theirs, elsewhere]
    kid = cosign.key_id(pub)
    assert cosign.check_signature(DIGEST, found, pub) == (
        "signature", False,
        f"no signature by {kid} (the policy's key): 5 found, a layer of type "
        "application/octet-stream; a payload that is not cosign's simple signing; a payload "
        f"with no signature; a signature by another key; a signature by this key of another "
        f"image, {OTHER}")
    # Whatever comes before it, the good one is found.
    assert cosign.check_signature(DIGEST, [*found, good], pub, "the signing key") == (
        "signature", True, f"signed by {kid} (the signing key)")
    assert cosign.check_signature(DIGEST, None, pub) == (
        "signature", False, f"none: the registry holds no {cosign.sig_tag(DIGEST)}")


def _att(key: cosign.SigningKey, stmt: dict, payload_type: str = "application/vnd.in-toto+json",
         ) -> cosign.Layer:
    body = json.dumps(stmt).encode()
    env = {"payloadType": payload_type, "payload": base64.b64encode(body).decode(),
           "signatures": [{"keyid": "", "sig": cosign.sign(key, cosign.pae(
               "application/vnd.in-toto+json", body))}]}
    return cosign.Layer(cosign.DSSE_LAYER, {}, json.dumps(env).encode())


def test_an_attestation_check_names_everything_found_and_passes_over_what_is_not_it(key,
                                                                                     other):
    pub = key.key.public_key()
    kid = cosign.key_id(pub)

    def stmt(digests: list[str] | None, ptype: str = CDX) -> dict:
        return {"_type": "https://in-toto.io/Statement/v1", "predicateType": ptype,
                "subject": None if digests is None else
                [{"name": REPO, "digest": {"sha256": d}} for d in digests], "predicate": {}}
    found = [
        cosign.Layer(cosign.SIG_LAYER, {}, b"{}"),  # not an envelope: not counted
        cosign.Layer(cosign.DSSE_LAYER, {}, b"not json"),
        _att(key, {"subject": [{"name": "x"}], "predicateType": CDX}),  # no digest: no image
        _att(key, stmt(["ab" * 32], "https://slsa.dev/provenance/v1")),  # another type
        _att(key, stmt(["ab" * 32]), payload_type="text/plain"),
        _att(other, stmt(["ab" * 32])),
        _att(key, stmt(["cd" * 32, "ef" * 32])),
        _att(key, stmt(None)),
    ]
    assert cosign.check_attestation(DIGEST, found, pub, "cyclonedx") == (
        "attestation cyclonedx", False,
        f"no {CDX} statement about this digest signed by {kid}: a cyclonedx envelope of "
        "payload type 'text/plain'; a cyclonedx statement about another image (no subject); "
        "a cyclonedx statement about another image (sha256:" + "cd" * 32 + ", sha256:"
        + "ef" * 32 + f"); a cyclonedx statement not signed by {kid}; an envelope that is not "
        "DSSE over an in-toto statement")
    assert cosign.check_attestation(DIGEST, [*found, _att(key, stmt(["ab" * 32]))], pub,
                                    "cyclonedx") == (
        "attestation cyclonedx", True, f"{CDX}, signed by {kid}, about this digest")
    # A subject that names no digest is about no image, not a broken envelope.
    assert cosign.check_attestation(DIGEST, [found[2]], pub, "cyclonedx")[2] == (
        f"no {CDX} statement about this digest signed by {kid}: a cyclonedx statement about "
        "another image (no subject)")
    assert cosign.check_attestation(DIGEST, found[:1], pub, "cyclonedx")[2] == (
        f"no {CDX} statement about this digest signed by {kid} (none of that type)")
    assert cosign.check_attestation(DIGEST, [], pub, "cyclonedx")[2] == (
        f"none: the registry holds no {cosign.att_tag(DIGEST)}")


def test_a_digest_of_another_algorithm_is_matched_by_its_own(key):
    pub = key.key.public_key()
    digest = "sha512:" + "ab" * 64
    stmt = {"_type": "https://in-toto.io/Statement/v1", "predicateType": CDX,
            "subject": [{"name": REPO, "digest": {"sha512": "ab" * 64, "sha256": "00" * 32}}],
            "predicate": {}}
    assert cosign.check_attestation(digest, [_att(key, stmt)], pub, "cyclonedx")[1]


# --- judge and the cosign line --------------------------------------------------------------------

def test_a_keyless_policy_without_a_trust_root_is_one_failed_signature_check():
    policy = SignPolicy("/etc/imgbuild/registries.yaml", issuer=GHA, subject=WHO)
    assert cosign.judge(policy, DIGEST, None, None, None) == [
        ("signature", False, cosign.no_trust_root(policy))]
    assert cosign.no_trust_root(policy) == (
        f"the policy (/etc/imgbuild/registries.yaml) asks for a keyless signature by {WHO} "
        f"(issuer {GHA}) but names no trust-root; imgbuild checks keyless signatures offline, "
        "against a trusted_root.json the policy names (signed-by.keyless.trust-root)")


def test_judge_checks_keyless_at_the_time_it_is_given_or_now(monkeypatch):
    root = keyless.load_trust_root((SIGSTORE / "trusted_root_pgi.json").read_bytes(), "r")
    policy = SignPolicy("r.yaml", issuer=GHA, subject=WHO, trust_root="r.json", tlog=False,
                        attestations=("cyclonedx",))
    seen = []
    monkeypatch.setattr(cosign, "check_keyless_signature",
                        lambda d, la, p, r, now: seen.append(("sig", r, now)) or ("s", 1, ""))
    monkeypatch.setattr(cosign, "check_keyless_attestation",
                        lambda d, la, p, r, now, k: seen.append((k, r, now)) or ("a", 1, ""))
    when = datetime(2026, 8, 1, tzinfo=UTC)
    cosign.judge(policy, DIGEST, [], [], None, root, when)
    assert seen == [("sig", root, when), ("cyclonedx", root, when)]
    seen.clear()
    before = datetime.now(UTC)
    cosign.judge(policy, DIGEST, [], [], None, root)
    assert all(r is root and now.tzinfo is UTC and now >= before for _, r, now in seen)


def test_the_cosign_line_carries_every_opt_out_and_only_those():
    keyless_policy = SignPolicy("/p/registries.yaml", issuer=GHA, subject=WHO,
                                trust_root="root.json", tlog=False, sct=False,
                                attestations=("cyclonedx",))
    ref = f"{REPO}@{DIGEST}"
    who = (f"--certificate-identity {WHO} --certificate-oidc-issuer {GHA} --trusted-root "
           "/p/root.json --insecure-ignore-tlog=true --insecure-ignore-sct=true")
    assert cosign.cosign_commands(keyless_policy, None, ref) == [
        f"cosign verify {who} {ref}",
        f"cosign verify-attestation --type cyclonedx {who} {ref}"]
    strict = SignPolicy("/p/registries.yaml", issuer=GHA, subject=WHO, attestations=())
    assert cosign.cosign_commands(strict, None, ref) == [
        f"cosign verify --certificate-identity {WHO} --certificate-oidc-issuer {GHA} {ref}"]
    key_policy = SignPolicy("/p/registries.yaml", key="-----BEGIN PUBLIC KEY-----",
                            attestations=())
    assert cosign.cosign_commands(key_policy, None, ref) == [
        f"cosign verify --key KEY.pub --insecure-ignore-tlog=true {ref}"]
    assert cosign.cosign_commands(key_policy, "/p/cosign.pub", ref, plain_http=True) == [
        "cosign verify --key /p/cosign.pub --insecure-ignore-tlog=true "
        f"--allow-insecure-registry --allow-http-registry {ref}"]


def test_a_signature_with_a_stray_character_is_not_read_past_it(key):
    sig = cosign.sign(key, b"data")
    pub = key.key.public_key()
    assert cosign.signature_ok(pub, b"data", sig)
    assert not cosign.signature_ok(pub, b"data", sig[:8] + "*" + sig[8:])
    assert not cosign.signature_ok(pub, b"data", "")
