"""Who a Fulcio certificate names, and the first check of a keyless signature that fails, in
the words a refused pull shows (image/keyless.py identity, examine). Certificates are made here
with `cryptography`, or by the TEST STAND-IN for Fulcio (tests/sigstore_standin.py), so that
each check can be the one that fails; the recorded real signatures are in tests/test_keyless.py.
"""

from __future__ import annotations

import base64
import copy
import hashlib
from datetime import UTC, datetime, timedelta

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID, ObjectIdentifier

from imgbuild.image import keyless

from .sigstore_standin import GHA_ISSUER, GHA_SUBJECT, StandIn, cert_pem, hashedrekord

KEY = ec.generate_private_key(ec.SECP256R1())
V1, V2 = keyless.ISSUER_V1, keyless.ISSUER_V2


def cert(*extensions: x509.ExtensionType, issuer: str = "elsewhere", key=KEY,
         signer=KEY, not_before: datetime | None = None) -> x509.Certificate:
    nb = not_before or datetime.now(UTC) - timedelta(minutes=1)
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, issuer)] if issuer else [])
    b = (x509.CertificateBuilder().subject_name(x509.Name([])).issuer_name(name)
         .public_key(key.public_key()).serial_number(x509.random_serial_number())
         .not_valid_before(nb).not_valid_after(nb + timedelta(minutes=10)))
    for e in extensions:
        b = b.add_extension(e, critical=False)
    return b.sign(signer, hashes.SHA256())


def der_utf8(s: str) -> bytes:
    raw = s.encode()
    return b"\x0c" + bytes([len(raw)]) + raw


# --- identity: the SANs and the OIDC issuer -----------------------------------------------------

def test_every_kind_of_san_is_read_in_order_uri_email_username():
    c = cert(x509.SubjectAlternativeName([
        x509.OtherName(keyless.USERNAME_SAN, der_utf8("dev!oidc.example")),
        x509.RFC822Name("dev@example.com"),
        x509.UniformResourceIdentifier("https://github.com/acme/x")]))
    assert keyless.identity(c).sans == ("https://github.com/acme/x", "dev@example.com",
                                        "dev!oidc.example")


def test_a_username_san_is_its_utf8_string_not_its_der_bytes():
    # Fulcio's username identity is an OtherName holding a DER UTF8String: the name is the
    # string (cosign's UnmarshalOtherNameSAN), so a policy's subject can match it.
    def sans(*names: x509.OtherName) -> tuple[str, ...]:
        return keyless.identity(cert(x509.SubjectAlternativeName(list(names)))).sans
    assert sans(x509.OtherName(keyless.USERNAME_SAN, der_utf8("dev@repo"))) == ("dev@repo",)
    assert sans(x509.OtherName(keyless.USERNAME_SAN, b"\x0c\x02\xff\xfe")) == (
        "\ufffd\ufffd",)
    # Another kind of OtherName, or not a UTF8String: no identity cosign would match either.
    assert sans(x509.OtherName(ObjectIdentifier("1.2.3.4"), der_utf8("dev@repo"))) == ()
    assert sans(x509.OtherName(keyless.USERNAME_SAN, b"\x13\x03dev")) == ()


def test_the_issuer_is_the_der_extension_else_the_raw_one_else_none():
    both = cert(x509.UnrecognizedExtension(V1, b"https://v1.example"),
                x509.UnrecognizedExtension(V2, der_utf8("https://v2.example")))
    assert keyless.identity(both).issuer == "https://v2.example"
    only_v1 = cert(x509.UnrecognizedExtension(V1, b"https://v1.example/\xff"))
    assert keyless.identity(only_v1) == keyless.Identity((), "https://v1.example/\ufffd")
    assert keyless.identity(cert()) == keyless.Identity((), None)
    assert keyless.identity(cert()).subject == "(no SAN)"


# --- examine: the first check that fails, in words ----------------------------------------------

@pytest.fixture(scope="module")
def root(standin_root) -> keyless.TrustRoot:
    return standin_root  # the stand-in's trust root (tests/conftest.py), named "stand-in"


WANT = keyless.Expect(GHA_SUBJECT, GHA_ISSUER)


def evidence(leaf: x509.Certificate | None, key=KEY, bundle: str | None = None,
             blob: bytes = b"payload") -> keyless.Evidence:
    annotations = {} if leaf is None else {keyless.CERT_ANNOTATION: cert_pem(leaf)}
    if bundle is not None:
        annotations[keyless.BUNDLE_ANNOTATION] = bundle
    return keyless.Evidence(blob, blob, key.sign(blob, ec.ECDSA(hashes.SHA256())), annotations)


def fulcio_like(standin: StandIn, *extensions: x509.ExtensionType, key=KEY) -> x509.Certificate:
    """A certificate the stand-in's Fulcio CA issued, with only the given extensions."""
    nb = datetime.now(UTC) - timedelta(minutes=1)
    b = (x509.CertificateBuilder().subject_name(x509.Name([]))
         .issuer_name(standin.inter.subject).public_key(key.public_key())
         .serial_number(x509.random_serial_number()).not_valid_before(nb)
         .not_valid_after(nb + timedelta(minutes=10)))
    for e in extensions:
        b = b.add_extension(e, critical=False)
    return b.sign(standin.inter_key, hashes.SHA384())


def test_no_certificate_or_one_no_fulcio_ca_issued(root):
    now = datetime.now(UTC)
    assert keyless.examine(evidence(None), WANT, root, now) == (
        "no Fulcio certificate (dev.sigstore.cosign/certificate): not a keyless signature")
    assert keyless.examine(evidence(cert(issuer="Mallory CA")), WANT, root, now) == (
        "a certificate issued by CN=Mallory CA, which no Fulcio CA in stand-in issued")
    assert keyless.examine(evidence(cert(issuer="")), WANT, root, now) == (
        "a certificate issued by (no name), which no Fulcio CA in stand-in issued")


def test_a_certificate_without_code_signing_is_refused(standin, root):
    now = datetime.now(UTC)
    said = "a certificate without the code-signing key usage Fulcio gives"
    assert keyless.examine(evidence(fulcio_like(standin)), WANT, root, now) == said
    server = x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH])
    assert keyless.examine(evidence(fulcio_like(standin, server)), WANT, root, now) == said


def test_a_certificate_for_someone_else_names_both(standin, root):
    now = datetime.now(UTC)
    signing = x509.ExtendedKeyUsage([ExtendedKeyUsageOID.CODE_SIGNING])
    bare = fulcio_like(standin, signing)
    assert keyless.examine(evidence(bare), WANT, root, now) == (
        f"a certificate for (no SAN) (issuer none), not {GHA_SUBJECT} (issuer {GHA_ISSUER})")
    two = fulcio_like(standin, signing, x509.SubjectAlternativeName([
        x509.UniformResourceIdentifier("https://a.example"), x509.RFC822Name("b@example.com")]),
        x509.UnrecognizedExtension(V2, der_utf8("https://issuer.example")))
    assert keyless.examine(evidence(two), WANT, root, now) == (
        "a certificate for https://a.example, b@example.com (issuer https://issuer.example), "
        f"not {GHA_SUBJECT} (issuer {GHA_ISSUER})")


def test_the_log_is_asked_for_unless_the_policy_opts_out_and_then_the_time_is_now(standin,
                                                                                 root):
    key = ec.generate_private_key(ec.SECP256R1())
    leaf = standin.leaf(key)
    ev = evidence(leaf, key)
    assert keyless.examine(ev, WANT, root, datetime.now(UTC)) == (
        "no Rekor bundle (dev.sigstore.cosign/bundle): the policy asks for the transparency "
        "log; `tlog: false` opts out, as cosign's --insecure-ignore-tlog")
    no_log = keyless.Expect(GHA_SUBJECT, GHA_ISSUER, tlog=False)
    nb, na = leaf.not_valid_before_utc, leaf.not_valid_after_utc
    # The certificate's own first and last second are inside it.
    assert keyless.examine(ev, no_log, root, nb) is None
    assert keyless.examine(ev, no_log, root, na) is None
    late = na + timedelta(seconds=1)
    assert keyless.examine(ev, no_log, root, late) == (
        f"a certificate valid {nb:%Y-%m-%dT%H:%M:%SZ} to {na:%Y-%m-%dT%H:%M:%SZ}, not now "
        f"({late:%Y-%m-%dT%H:%M:%SZ}), and no transparency log (tlog: false) to date the "
        "signature")
    # With the log, its entry dates the signature (any `now`).
    sig = ev.signature
    logged = evidence(leaf, key, standin.bundle(hashedrekord(ev.blob, sig, leaf),
                                                int(nb.timestamp()) + 5))
    logged = keyless.Evidence(ev.blob, ev.signed, sig, logged.annotations)
    assert keyless.examine(logged, WANT, root, late + timedelta(days=365)) is None


# --- entry_mismatch: is a Rekor entry about this very signature? --------------------------------

def _b64(b: bytes | str) -> str:
    return base64.b64encode(b.encode() if isinstance(b, str) else b).decode()


@pytest.fixture(scope="module")
def signed() -> tuple[keyless.Evidence, x509.Certificate, str]:
    leaf = cert(issuer="Fulcio")
    ev = evidence(leaf, blob=b"the layer's blob")
    return ev, leaf, _b64(cert_pem(leaf))


def bodies(ev: keyless.Evidence, pem_b64: str) -> dict[str, dict]:
    """The entry kinds cosign writes, each about `ev`, as Rekor returns their bodies."""
    h = {"algorithm": "sha256", "value": hashlib.sha256(ev.blob).hexdigest()}
    sig = _b64(ev.signature)
    other_sig = _b64(b"someone else's signature")
    return {
        "hashedrekord": {"kind": "hashedrekord", "spec": {"data": {"hash": h}, "signature": {
            "content": sig, "publicKey": {"content": pem_b64}}}},
        "rekord": {"kind": "rekord", "spec": {"data": {"hash": h}, "signature": {
            "content": sig, "publicKey": {"content": pem_b64}}}},
        "intoto 0.0.1": {"kind": "intoto", "spec": {"content": {"hash": h},
                                                    "publicKey": pem_b64}},
        # 0.0.2: each signature base64'd once more, with its key; this one is the second
        "intoto 0.0.2": {"kind": "intoto", "spec": {"content": {"hash": h, "envelope": {
            "signatures": [{"sig": _b64(other_sig), "publicKey": pem_b64},
                           {"sig": _b64(sig), "publicKey": "not this one"}]}}}},
        "dsse": {"kind": "dsse", "spec": {"envelopeHash": h, "signatures": [
            {"signature": other_sig, "verifier": pem_b64}, {"signature": sig}]}},
    }


def test_each_kind_cosign_writes_is_read(signed):
    ev, leaf, pem = signed
    for name, body in bodies(ev, pem).items():
        assert keyless.entry_mismatch(body, ev, leaf) is None, name


def test_an_entry_about_something_else_says_what_differs(signed):
    ev, leaf, pem = signed
    want = hashlib.sha256(ev.blob).hexdigest()
    for name, body in bodies(ev, pem).items():
        spec = body["spec"]
        hashed = (spec.get("data") or spec.get("content") or {}).get("hash") \
            or spec.get("envelopeHash")
        other = copy.deepcopy(body)
        h = (other["spec"].get("data") or other["spec"].get("content") or {}).get("hash") \
            or other["spec"]["envelopeHash"]
        h["value"] = "f" * 64
        assert keyless.entry_mismatch(other, ev, leaf) == (
            f"an entry for other content (sha256 {'f' * 16}..., this layer's is "
            f"{want[:16]}...)"), name
        h["value"], h["algorithm"] = hashed["value"], "sha512"
        assert keyless.entry_mismatch(other, ev, leaf).startswith(
            f"an entry for other content (sha256 {want[:16]}..."), name
    b = bodies(ev, pem)
    b["hashedrekord"]["spec"]["signature"]["content"] = _b64(b"forged")
    assert keyless.entry_mismatch(b["hashedrekord"], ev, leaf) == "an entry for another signature"
    stranger = _b64(cert_pem(cert(issuer="Fulcio", key=ec.generate_private_key(ec.SECP256R1()))))
    b = bodies(ev, stranger)
    for name in ("rekord", "intoto 0.0.1", "intoto 0.0.2", "dsse"):
        assert keyless.entry_mismatch(b[name], ev, leaf) == "an entry for another certificate", \
            name


def test_an_entry_of_another_kind_or_without_cosigns_fields_is_named(signed):
    ev, leaf, pem = signed
    assert keyless.entry_mismatch({"kind": "alpine", "spec": {}}, ev, leaf) == (
        "an entry of kind 'alpine', which imgbuild does not read")
    assert keyless.entry_mismatch({"kind": "hashedrekord", "spec": {"data": {}}}, ev, leaf) == (
        "a hashedrekord entry without the fields cosign writes")
    assert keyless.entry_mismatch({"kind": "intoto", "spec": {"content": {
        "hash": {}, "envelope": {"signatures": []}}}}, ev, leaf) == (
        "a intoto entry without the fields cosign writes")
    assert keyless.entry_mismatch({"spec": None}, ev, leaf) == (
        "an entry of kind None, which imgbuild does not read")
    assert keyless.entry_mismatch({"kind": "", "spec": {}}, ev, leaf) == (
        "an entry of kind '', which imgbuild does not read")
    assert keyless.entry_mismatch({"kind": "dsse", "spec": []}, ev, leaf) == (
        "a dsse entry without the fields cosign writes")


# --- _verify: each kind of key a trust root can hold --------------------------------------------

def test_each_key_kind_verifies_with_the_hash_its_size_calls_for():
    from cryptography.hazmat.primitives.asymmetric import ed25519, padding, rsa

    data = b"signed entry timestamp"
    for curve, h in ((ec.SECP256R1(), hashes.SHA256()), (ec.SECP384R1(), hashes.SHA384()),
                     (ec.SECP521R1(), hashes.SHA512())):
        k = ec.generate_private_key(curve)
        sig = k.sign(data, ec.ECDSA(h))
        assert keyless._verify(k.public_key(), sig, data), curve.name
        assert not keyless._verify(k.public_key(), sig, data + b"!"), curve.name
        # An explicit hash is used instead of the curve's.
        other = k.sign(data, ec.ECDSA(hashes.SHA256()))
        assert keyless._verify(k.public_key(), other, data, hashes.SHA256()), curve.name
    ed = ed25519.Ed25519PrivateKey.generate()
    assert keyless._verify(ed.public_key(), ed.sign(data), data)
    assert not keyless._verify(ed.public_key(), ed.sign(data), b"other")
    r = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    assert keyless._verify(r.public_key(), r.sign(data, padding.PKCS1v15(), hashes.SHA256()),
                           data)
    assert keyless._verify(r.public_key(), r.sign(data, padding.PKCS1v15(), hashes.SHA384()),
                           data, hashes.SHA384())
    assert not keyless._verify(r.public_key(), r.sign(data, padding.PKCS1v15(),
                                                      hashes.SHA384()), data)
    assert not keyless._verify(object(), b"sig", data)


# --- the small parts: windows, CA flags, issuers, a layer's signer --------------------------------

def test_a_window_holds_its_own_ends_and_an_open_end_holds_everything_that_side():
    a, b = datetime(2026, 1, 1, tzinfo=UTC), datetime(2026, 2, 1, tzinfo=UTC)
    w = keyless.Window(a, b)
    assert w.holds(a) and w.holds(b)
    assert not w.holds(a - timedelta(seconds=1)) and not w.holds(b + timedelta(seconds=1))
    assert keyless.Window(None, b).holds(datetime(1970, 1, 1, tzinfo=UTC))
    assert keyless.Window(a, None).holds(datetime(2999, 1, 1, tzinfo=UTC))
    assert str(keyless.Window(None, None)) == "- to -"


def test_a_ca_flag_and_an_issuer_are_refused_where_absent_or_wrong():
    assert not keyless._is_ca(cert())
    assert keyless._is_ca(cert(x509.BasicConstraints(ca=True, path_length=None)))
    mine = cert(issuer="Issuer")
    other = ec.generate_private_key(ec.SECP256R1())
    assert not keyless._issued_by(mine, cert(issuer="Issuer", key=other, signer=other))


def test_who_signed_a_layer_is_none_without_a_certificate():
    assert keyless.leaf_identity({}) is None
    assert keyless.leaf_identity({keyless.CERT_ANNOTATION: "not a PEM"}) is None
    leaf = cert(x509.SubjectAlternativeName([x509.RFC822Name("dev@example.com")]))
    assert keyless.leaf_identity({keyless.CERT_ANNOTATION: cert_pem(leaf)}).sans == (
        "dev@example.com",)


def test_rekors_signed_payload_is_canonical_json():
    assert keyless.canonical_set_payload("Ym9keQ==", 1700000000, "c0d2", 7) == (
        b'{"body":"Ym9keQ==","integratedTime":1700000000,"logID":"c0d2","logIndex":7}')
