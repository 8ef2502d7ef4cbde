"""Signatures in cosign's format decided on plain data (image/cosign.py, the policy in
catalog/registries.py, the key checks of pipeline/build.py and image/signstore.py): no Docker,
no registry. The keys in tests/fixtures/cosign were made by cosign 2.5 itself (its README)."""

from __future__ import annotations

import base64
import json
from pathlib import Path

import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa

from imgbuild.catalog.registries import SignPolicy, load_registries
from imgbuild.errors import EXIT_FAILED, EXIT_INPUT, InputError, JobFailed, SpecError
from imgbuild.image import cosign, signstore
from imgbuild.image.registry import Repository
from imgbuild.pipeline.build import signing_key

KEYS = Path(__file__).parent / "fixtures" / "cosign"
PASSWORD = b"imgbuild-test"
DIGEST = "sha256:" + "ab" * 32
OTHER = "sha256:" + "cd" * 32
REPO = "127.0.0.1:5000/acme/serving"


@pytest.fixture(scope="module")
def key() -> cosign.SigningKey:
    return cosign.load_private_key((KEYS / "cosign.key").read_bytes(), PASSWORD, "cosign.key")


@pytest.fixture(scope="module")
def other() -> cosign.SigningKey:
    return cosign.load_private_key((KEYS / "other.key").read_bytes(), PASSWORD, "other.key")


def pub(k: cosign.SigningKey):
    return k.key.public_key()


# --- what is signed ---------------------------------------------------------------------------

def test_simple_signing_payload_is_cosigns_bytes():
    assert cosign.simple_signing(REPO, DIGEST) == (
        b'{"critical":{"identity":{"docker-reference":"127.0.0.1:5000/acme/serving"},'
        b'"image":{"docker-manifest-digest":"' + DIGEST.encode() + b'"},'
        b'"type":"cosign container image signature"},"optional":null}')


def test_pae_is_dsses_encoding():
    # The DSSE specification's own example.
    assert cosign.pae("http://example.com/HelloWorld", b"hello world") == \
        b"DSSEv1 29 http://example.com/HelloWorld 11 hello world"


def test_tags_follow_cosigns_scheme():
    assert cosign.sig_tag(DIGEST) == "sha256-" + "ab" * 32 + ".sig"
    assert cosign.att_tag(DIGEST) == "sha256-" + "ab" * 32 + ".att"


def test_statement_names_the_image_as_its_subject():
    s = cosign.statement(REPO, DIGEST, "https://cyclonedx.org/bom", {"bomFormat": "CycloneDX"})
    assert s["subject"] == [{"name": REPO, "digest": {"sha256": "ab" * 32}}]
    assert s["_type"] == "https://in-toto.io/Statement/v1"
    assert s["predicateType"] == "https://cyclonedx.org/bom"


def test_manifest_lists_layers_with_their_annotations_and_config_diff_ids(key):
    la = cosign.signature_layer(key, REPO, DIGEST)
    manifest, config = cosign.manifest_parts([la])
    m, c = json.loads(manifest), json.loads(config)
    assert m["layers"] == [{"mediaType": cosign.SIG_LAYER, "size": len(la.blob),
                            "digest": la.digest, "annotations": la.annotations}]
    assert c["rootfs"]["diff_ids"] == [la.digest]
    assert m["config"]["mediaType"] == "application/vnd.oci.image.config.v1+json"


# --- keys -------------------------------------------------------------------------------------

def test_cosigns_encrypted_key_opens_with_its_password(key):
    assert key.public_pem() == (KEYS / "cosign.pub").read_bytes()
    assert "cosign.key" in repr(key) and "BEGIN" not in repr(key)


@pytest.mark.parametrize("password,said", [(b"wrong", "wrong password"),
                                           (None, "COSIGN_PASSWORD is not set")])
def test_an_encrypted_key_without_its_password_is_refused(password, said):
    with pytest.raises(cosign.KeyProblem, match=said):
        cosign.load_private_key((KEYS / "cosign.key").read_bytes(), password, "k")


def test_garbled_and_wrong_keys_are_refused_saying_why():
    with pytest.raises(cosign.KeyProblem, match="not a PEM"):
        cosign.load_private_key(b"hello", None, "k")
    with pytest.raises(cosign.KeyProblem, match="not a private key"):
        cosign.load_private_key((KEYS / "cosign.pub").read_bytes(), None, "k")
    garbled = b"-----BEGIN ENCRYPTED SIGSTORE PRIVATE KEY-----\nAAAA\n" \
              b"-----END ENCRYPTED SIGSTORE PRIVATE KEY-----\n"
    with pytest.raises(cosign.KeyProblem, match="garbled"):
        cosign.load_private_key(garbled, b"x", "k")
    huge = base64.b64encode(json.dumps({
        "kdf": {"name": "scrypt", "params": {"N": 1 << 30, "r": 8, "p": 1}, "salt": ""},
        "cipher": {"name": "nacl/secretbox", "nonce": ""}, "ciphertext": ""}).encode())
    with pytest.raises(cosign.KeyProblem, match="N=1073741824"):
        cosign.load_private_key(b"-----BEGIN ENCRYPTED COSIGN PRIVATE KEY-----\n" + huge +
                                b"\n-----END ENCRYPTED COSIGN PRIVATE KEY-----\n", b"x", "k")
    rsa_pem = rsa.generate_private_key(public_exponent=65537, key_size=2048).private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption())
    with pytest.raises(cosign.KeyProblem, match="ECDSA"):
        cosign.load_private_key(rsa_pem, None, "k")


def test_a_plain_pkcs8_key_signs_too():
    pem = ec.generate_private_key(ec.SECP256R1()).private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption())
    k = cosign.load_private_key(pem, None, "plain")
    assert cosign.signature_ok(pub(k), b"data", cosign.sign(k, b"data"))


def test_sign_key_spec_file_env_and_kms(tmp_path):
    env = {"COSIGN_PASSWORD": PASSWORD.decode(), "K": (KEYS / "cosign.key").read_text()}
    assert signstore.load_signing_key("env://K", env).public_pem() == \
        (KEYS / "cosign.pub").read_bytes()
    assert signstore.load_signing_key(str(KEYS / "cosign.key"), env).source.endswith("cosign.key")
    for spec, said in [("env://NONE", "is empty or not set"),
                       (str(tmp_path / "missing.key"), "cannot read the signing key"),
                       ("awskms:///alias/x", "a KMS key is no key file imgbuild can open")]:
        with pytest.raises(InputError, match=said) as e:
            signstore.load_signing_key(spec, env)
        assert e.value.exit_code == EXIT_INPUT and e.value.hint
    with pytest.raises(InputError, match="cannot be used") as e:
        signstore.load_signing_key(str(KEYS / "cosign.key"), {"COSIGN_PASSWORD": "no"})
    assert "COSIGN_PASSWORD" in e.value.hint


def test_signing_key_is_checked_before_the_build(monkeypatch, key):
    monkeypatch.setenv("COSIGN_PASSWORD", PASSWORD.decode())
    assert signing_key(None, push=True, policy=None) is None
    with pytest.raises(InputError, match="signs what is pushed"):
        signing_key(str(KEYS / "cosign.key"), push=False, policy=None)
    trusts_other = SignPolicy(str(KEYS / "registries.yaml"), key="other.pub")
    with pytest.raises(InputError, match="is not the key") as e:
        signing_key(str(KEYS / "cosign.key"), push=True, policy=trusts_other)
    assert cosign.key_id(pub(key)) in e.value.facts[0]
    trusts_it = SignPolicy(str(KEYS / "registries.yaml"), key="cosign.pub")
    got = signing_key(str(KEYS / "cosign.key"), push=True, policy=trusts_it)
    assert got.public_pem() == key.public_pem()


def test_policy_key_path_or_inline_pem(tmp_path):
    pem = (KEYS / "cosign.pub").read_text()
    k, path = signstore.policy_key(SignPolicy(str(tmp_path / "r.yaml"), key=pem))
    assert path is None and cosign.public_pem(k).decode() == pem
    k, path = signstore.policy_key(SignPolicy(str(KEYS / "r.yaml"), key="cosign.pub"))
    assert path == str(KEYS / "cosign.pub")
    with pytest.raises(InputError, match="cannot read"):
        signstore.policy_key(SignPolicy(str(tmp_path / "r.yaml"), key="nope.pub"))
    with pytest.raises(InputError, match="cannot be used"):
        signstore.policy_key(SignPolicy(str(KEYS / "r.yaml"), key="cosign.key"))


# --- the signature --------------------------------------------------------------------------

def test_a_signature_by_the_policys_key_of_this_digest_passes(key):
    ok = cosign.check_signature(DIGEST, [cosign.signature_layer(key, REPO, DIGEST)], pub(key))
    assert ok[:2] == ("signature", True)


def test_no_signature_is_refused(key):
    for layers in (None, []):
        what, ok, detail = cosign.check_signature(DIGEST, layers, pub(key))
        assert not ok and "holds no sha256-" in detail


def test_another_keys_signature_is_refused(key, other):
    what, ok, detail = cosign.check_signature(
        DIGEST, [cosign.signature_layer(other, REPO, DIGEST)], pub(key))
    assert not ok and "a signature by another key" in detail
    # One good signature among others is enough (cosign appends signers).
    both = [cosign.signature_layer(other, REPO, DIGEST), cosign.signature_layer(key, REPO, DIGEST)]
    assert cosign.check_signature(DIGEST, both, pub(key))[1]


def test_a_signature_of_another_image_is_refused(key):
    # The manifest re-pushed after signing has another digest: its predecessor's signature
    # names the old one.
    la = cosign.signature_layer(key, REPO, OTHER)
    what, ok, detail = cosign.check_signature(DIGEST, [la], pub(key))
    assert not ok and f"another image, {OTHER}" in detail


def test_a_payload_changed_after_signing_is_refused(key):
    la = cosign.signature_layer(key, REPO, OTHER)
    forged = cosign.Layer(la.media_type, la.annotations, la.blob.replace(OTHER.encode(),
                                                                         DIGEST.encode()))
    assert not cosign.check_signature(DIGEST, [forged], pub(key))[1]
    unsigned = cosign.Layer(la.media_type, {}, cosign.simple_signing(REPO, DIGEST))
    assert "no signature" in cosign.check_signature(DIGEST, [unsigned], pub(key))[2]


# --- the attestations -------------------------------------------------------------------------

def att(k: cosign.SigningKey, digest: str, kind: str = "cyclonedx") -> cosign.Layer:
    ptype = cosign.ATTESTATION_TYPES[kind]
    return cosign.attestation_layer(k, cosign.statement(REPO, digest, ptype, {"x": 1}))


def test_an_attestation_of_this_image_by_the_key_passes(key):
    la = att(key, DIGEST)
    assert la.annotations == {cosign.SIG_ANNOTATION: "",
                              "predicateType": "https://cyclonedx.org/bom"}
    assert cosign.check_attestation(DIGEST, [la], pub(key), "cyclonedx")[1]


def test_an_attestation_swapped_from_another_image_is_refused(key):
    what, ok, detail = cosign.check_attestation(DIGEST, [att(key, OTHER)], pub(key), "cyclonedx")
    assert not ok and f"about another image ({OTHER})" in detail


def test_an_attestation_by_another_key_or_of_another_type_is_refused(key, other):
    assert "not signed by" in cosign.check_attestation(DIGEST, [att(other, DIGEST)], pub(key),
                                                       "cyclonedx")[2]
    what, ok, detail = cosign.check_attestation(DIGEST, [att(key, DIGEST, "slsaprovenance1")],
                                                pub(key), "cyclonedx")
    assert not ok and "none of that type" in detail


def test_an_envelope_changed_after_signing_is_refused(key):
    la = att(key, OTHER)
    env = json.loads(la.blob)
    body = base64.b64decode(env["payload"]).replace(b"cd" * 32, b"ab" * 32)
    env["payload"] = base64.b64encode(body).decode()
    forged = cosign.Layer(la.media_type, la.annotations, json.dumps(env).encode())
    assert not cosign.check_attestation(DIGEST, [forged], pub(key), "cyclonedx")[1]


# --- the policy's judgement -----------------------------------------------------------------

def test_judge_asks_what_the_policy_asks(key):
    sigs = [cosign.signature_layer(key, REPO, DIGEST)]
    atts = [att(key, DIGEST), att(key, DIGEST, "slsaprovenance1")]
    policy = SignPolicy("r.yaml", key="k.pub")
    got = cosign.judge(policy, DIGEST, sigs, atts, pub(key))
    assert [(c, ok) for c, ok, _ in got] == [("signature", True), ("attestation cyclonedx", True),
                                             ("attestation slsaprovenance1", True)]
    only_sig = SignPolicy("r.yaml", key="k.pub", attestations=())
    assert [c for c, _, _ in cosign.judge(only_sig, DIGEST, sigs, None, pub(key))] == ["signature"]
    missing = cosign.judge(policy, DIGEST, sigs, atts[:1], pub(key))
    assert [ok for _, ok, _ in missing] == [True, True, False]


def test_keyless_without_a_trust_root_is_refused_saying_what_it_needs():
    # The keyless checks themselves: tests/test_keyless.py.
    policy = SignPolicy("r.yaml", issuer="https://token.actions.githubusercontent.com",
                        subject="https://github.com/acme/x/.github/workflows/ci.yml@refs/heads/main")
    [(what, ok, detail)] = cosign.judge(policy, DIGEST, None, None, None)
    assert not ok and "names no trust-root" in detail


def test_merged_keeps_other_signers_and_adds_nothing_twice(key, other):
    theirs = cosign.signature_layer(other, REPO, DIGEST)
    mine = cosign.signature_layer(key, REPO, DIGEST)
    same = lambda la: cosign.check_signature(DIGEST, [la], pub(key))[1]  # noqa: E731
    assert cosign.merged([theirs], mine, same) == [theirs, mine]
    assert cosign.merged([theirs, mine], cosign.signature_layer(key, REPO, DIGEST), same) is None


def test_enforce_names_digest_found_and_expected(monkeypatch, key, other):
    held = {cosign.sig_tag(DIGEST): [cosign.signature_layer(other, REPO, DIGEST)],
            cosign.att_tag(DIGEST): [att(key, OTHER)]}
    monkeypatch.setattr(signstore, "fetch_layers", lambda repo, tag: held.get(tag))
    repo = Repository.parse(REPO)
    policy = SignPolicy(str(KEYS / "registries.yaml"), key="cosign.pub",
                        attestations=("cyclonedx",))
    assert signstore.enforce(repo, DIGEST, None, f"{REPO}:t") == []
    with pytest.raises(JobFailed) as e:
        signstore.enforce(repo, DIGEST, policy, f"{REPO}:t")
    err = e.value
    assert err.exit_code == EXIT_FAILED
    assert f"{REPO}@{DIGEST}" in err.message and "nothing was pulled" in err.message
    assert err.facts[0] == f"{REPO}:t names {DIGEST}"
    assert "signed by the key" in err.facts[1] and "cosign.pub" in err.facts[1]
    assert any(f.startswith("signature: ") and "another key" in f for f in err.facts)
    assert any("about another image" in f for f in err.facts)
    assert f"cosign verify --key {KEYS / 'cosign.pub'} --insecure-ignore-tlog=true " \
           f"--allow-insecure-registry --allow-http-registry {REPO}@{DIGEST}" in err.hint
    held[cosign.sig_tag(DIGEST)] = [cosign.signature_layer(key, REPO, DIGEST)]
    held[cosign.att_tag(DIGEST)] = [att(key, DIGEST)]
    assert all(ok for _, ok, _ in signstore.enforce(repo, DIGEST, policy, f"{REPO}:t"))


# --- images/registries.yaml -------------------------------------------------------------------

def registries(tmp_path: Path, text: str):
    d = tmp_path / "images"
    d.mkdir(exist_ok=True)
    (d / "registries.yaml").write_text(text)
    return load_registries([d])


def test_signed_by_rules_and_compression_rules_apart(tmp_path):
    t = registries(tmp_path, """
default: {compression: gzip}
registries:
  - match: 127.0.0.1:5000/acme
    compression: zstd
  - match: 127.0.0.1:5000/acme/serving
    signed-by: {key: keys/cosign.pub, attestations: [cyclonedx]}
  - match: ghcr.io/acme
    signed-by:
      keyless: {issuer: https://i, subject: s, trust-root: /etc/root.json}
""")
    # A signed-by rule alone says nothing of compression: the rule below it does.
    assert t.rule_for("127.0.0.1:5000/acme/serving").compression == "zstd"
    p = t.policy_for("127.0.0.1:5000/acme/serving/x")
    assert p.key == "keys/cosign.pub" and p.attestations == ("cyclonedx",) and not p.keyless
    assert cosign.key_path(p) == str(tmp_path / "images" / "keys" / "cosign.pub")
    assert t.policy_for("127.0.0.1:5000/acme") is None
    k = t.policy_for("ghcr.io/acme/x")
    assert k.keyless and (k.issuer, k.subject, k.trust_root) == ("https://i", "s",
                                                                 "/etc/root.json")
    assert k.attestations == ("cyclonedx", "slsaprovenance1")


@pytest.mark.parametrize("entry,said", [
    ("signed-by: {key: a.pub, keyless: {issuer: i, subject: s}}", "exactly one of"),
    ("signed-by: {}", "exactly one of"),
    ("signed-by: {key: a.pub, attestations: [spdx]}", "a list of: cyclonedx, slsaprovenance1"),
    ("signed-by: {kee: a.pub}", "kee"),
    ("signed-by: {key: a.pub, attestations: [{x: 1}]}", "a list of"),
    ("signed-by: [a.pub]", "signed-by"),
    ("signed-by: {keyless: {issuer: i}}", "subject"),
])
def test_a_bad_signed_by_is_a_spec_error(tmp_path, entry, said):
    with pytest.raises(SpecError, match=said):
        registries(tmp_path, f"registries:\n  - match: r.example/x\n    {entry}\n")


def _refusal(tmp_path, entry: str) -> str:
    with pytest.raises(SpecError) as e:
        registries(tmp_path, f"registries:\n  - match: r.example/x\n    {entry}\n")
    return e.value.message


def test_each_bad_signed_by_is_refused_word_for_word(tmp_path):
    """Where in which file, what was expected, and what was there."""
    f = tmp_path / "images" / "registries.yaml"
    both = "exactly one of `key` (a public key: path or PEM) and `keyless` (issuer, subject, " \
           "trust-root)"
    assert _refusal(tmp_path, "signed-by: {key: a.pub, keyless: {issuer: i, subject: s}}") == \
        f"{f}: registries[0].signed-by: expected {both}"
    assert _refusal(tmp_path, "signed-by: {attestations: [cyclonedx]}") == \
        f"{f}: registries[0].signed-by: expected {both}"
    assert _refusal(tmp_path, "signed-by: {key: a.pub, attestations: [cyclonedx, spdx]}") == \
        f"{f}: registries[0].signed-by.attestations: expected a list of: cyclonedx, " \
        "slsaprovenance1, got 'spdx'"
    assert _refusal(tmp_path, "signed-by: {key: '  '}") == \
        f"{f}: registries[0].signed-by.key: expected a public key's path or PEM, got ''"
    assert _refusal(tmp_path, "signed-by: {keyless: {issuer: i, subject: s, tlog: 'no'}}") \
        .startswith(f"{f}: registries[0].signed-by.keyless.tlog: expected ")


def test_a_keyless_policy_keeps_every_field_it_was_given(tmp_path):
    t = registries(tmp_path, """
registries:
  - match: r.example/x
    signed-by:
      attestations: [slsaprovenance1]
      keyless: {issuer: https://i, subject: s, tlog: false, sct: false}
  - match: r.example/y
    signed-by: {key: "  keys/a.pub  ", attestations: []}
""")
    where = str(tmp_path / "images" / "registries.yaml")
    assert t.policy_for("r.example/x") == SignPolicy(
        where, issuer="https://i", subject="s", trust_root=None, tlog=False, sct=False,
        attestations=("slsaprovenance1",))
    assert t.policy_for("r.example/y") == SignPolicy(where, key="keys/a.pub", attestations=())


def test_the_registry_table_s_defaults_and_refusals_word_for_word(tmp_path):
    from imgbuild.catalog.registries import RegistryRule

    assert load_registries([tmp_path / "none"]).default == RegistryRule(
        "", "gzip", "every client reads gzip", "(built in)")
    f = tmp_path / "images" / "registries.yaml"
    t = registries(tmp_path, "default: {compression: zstd}\n")
    assert t.default == RegistryRule("", "zstd", "", str(f)) and t.rules == ()
    t = registries(tmp_path, "default: {compression: gzip, reason: mirrors}\n"
                             "registries:\n  - {match: 'r.example/acme/ ', compression: zstd}\n"
                             "  - {match: r.example, compression: gzip, reason: old pullers}\n")
    assert t.default.reason == "mirrors"
    assert t.rules == (RegistryRule("r.example/acme", "zstd", "", str(f)),
                       RegistryRule("r.example", "gzip", "old pullers", str(f)))
    assert t.rule_for("r.example/acme/x").compression == "zstd"
    with pytest.raises(SpecError) as e:
        registries(tmp_path, "registries:\n  - {match: ' / ', compression: gzip}\n")
    assert e.value.message == (f"{f}: registries[0].match: expected a registry host or "
                               "repository, got ''")
    with pytest.raises(SpecError) as e:
        registries(tmp_path, "registries:\n  - {match: r.example, compression: lz4}\n")
    assert e.value.message == (f"{f}: registries[0].compression: expected one of: gzip, zstd, "
                               "got 'lz4'")


def test_the_longest_matching_signed_by_rule_is_the_policy(tmp_path):
    t = registries(tmp_path, """
registries:
  - {match: r.example/acme/serving/x, compression: zstd}
  - match: r.example/acme
    signed-by: {key: a.pub}
  - match: r.example/acme/serving
    signed-by: {key: b.pub}
  - match: r.example
    signed-by: {key: c.pub}
""")
    assert t.policy_for("r.example/acme/serving/x").key == "b.pub"
    assert t.policy_for("r.example/acme/other").key == "a.pub"
    assert t.policy_for("r.example/zzz").key == "c.pub"
    assert t.policy_for("q.example/acme") is None


# --- the publish order ------------------------------------------------------------------------

class _Image:
    def __init__(self, moved: list):
        self.moved = moved

    def tag(self, repository, tag=None, **kw):
        self.moved.append(("local", tag))


class _Engine:
    def __init__(self, moved: list):
        self.images = self
        self.moved = moved

    def get(self, ref):
        return _Image(self.moved)


@pytest.mark.parametrize("fails", [False, True])
def test_signing_comes_after_the_gate_and_a_failed_signing_moves_no_tag(monkeypatch, key,
                                                                       fails):
    """publish(), its registry calls faked: the content tag held for this very image, a passing
    gate. The image is signed before any moving tag moves; a signing that fails moves none."""
    from imgbuild.image import attest
    from imgbuild.image import registry as reg
    from imgbuild.image.smoke import SmokeReport
    from imgbuild.pipeline import build
    from imgbuild.plan.decide import make_plan

    from .conftest import checkout_workspace

    plan = make_plan(checkout_workspace(), "tiny-cpu", repository=REPO)
    events: list = []
    monkeypatch.setattr(reg, "manifest_digest", lambda repo, tag: DIGEST)
    monkeypatch.setattr(build, "held_is_this_image", lambda *a, **k: True)
    monkeypatch.setattr(reg, "image_config", lambda repo, d: ({"layers": []}, {}))
    monkeypatch.setattr(reg, "fetch_report", lambda repo, d: {"ok": True})
    monkeypatch.setattr(attest, "stored", lambda repo, d: True)
    monkeypatch.setattr(attest, "verify", lambda repo, d, **k: attest.Verification(
        REPO, d, (("signature", True, ""),)))

    def tag_manifest(repo, digest, tag):
        events.append(("registry", tag))
        return digest

    def sign_published(repo, digest, signer):
        events.append(("signed", digest))
        if fails:
            raise JobFailed("registry refused the signature")
        return [cosign.sig_tag(digest)], {"method": "key", "key": signer.source}

    monkeypatch.setattr(reg, "tag_manifest", tag_manifest)
    monkeypatch.setattr(build, "sign_published", sign_published)
    gate = build.Gate(SmokeReport(plan.ref(), True, (), 1.0, {"ok": True}, "sha256:1"), True)
    repo = Repository.parse(REPO)
    if fails:
        with pytest.raises(JobFailed):
            build.publish(plan, gate, _Engine(events), repo, push=True, signer=key)
        assert events == [("signed", DIGEST)]  # no tag moved, here or in the registry
        return
    got = build.publish(plan, gate, _Engine(events), repo, push=True, signer=key)
    assert events[0] == ("signed", DIGEST) and len(events) == 1 + 2 * len(plan.tags)
    assert got.signed == (cosign.sig_tag(DIGEST),)
    assert got.signed_by == {"method": "key", "key": "cosign.key"}
    # A gate that is not open signs nothing (a signature vouches for a passing smoke test).
    events.clear()
    build.publish(plan, build.Gate(None, False, "no smoke test ran"), _Engine(events), repo,
                  push=True, signer=key)
    assert events == []


def test_only_what_this_run_made_and_passed_is_signed():
    from imgbuild.image.smoke import SmokeReport
    from imgbuild.pipeline.build import Gate, why_not_sign

    passed = Gate(SmokeReport("r", True, (), 1.0, {"ok": True}, "sha256:1"), True)
    for action in ("built", "local", "spliced", None):
        assert why_not_sign(action, passed) is None
    assert "pulled from the registry" in why_not_sign("pulled", passed)
    assert "--force" in why_not_sign("built", Gate(passed.report, True, forced=True))
    assert "no smoke test ran" in why_not_sign("built", Gate(None, False, "no smoke test ran"))
    theirs = SmokeReport("r", True, (), 1.0, {"ok": True}, "sha256:1",
                         reused="registry, r@sha256:1")
    assert "the registry stores" in why_not_sign("local", Gate(theirs, True))
    mine = SmokeReport("r", True, (), 1.0, {"ok": True}, "sha256:1", reused="local cache, run x")
    assert why_not_sign("local", Gate(mine, True)) is None
