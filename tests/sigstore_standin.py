"""A TEST STAND-IN for Sigstore's public services, made with `cryptography`: a CA in Fulcio's
place (root + intermediate) issuing short-lived leaves with Fulcio's extensions and an SCT, a
CT log key, a Rekor log key that signs bundles (SETs), and the trusted_root.json naming them.
It is not Sigstore: it lets the keyless checks run offline, with real cosign signing by a
leaf it issued (tests/test_sign_interop.py), and lets a test date a log entry where it likes.
The recorded real signatures are in tests/data/sigstore (their README)."""

from __future__ import annotations

import base64
import hashlib
import json
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID, ObjectIdentifier

from imgbuild.image.keyless import ISSUER_V1, ISSUER_V2, canonical_set_payload

SCT_OID = ObjectIdentifier("1.3.6.1.4.1.11129.2.4.2")
GHA_ISSUER = "https://token.actions.githubusercontent.com"
GHA_SUBJECT = ("https://github.com/acme/serving/.github/workflows/images.yml"
               "@refs/heads/main")
EPOCH = datetime(2026, 1, 1, tzinfo=UTC)


def _spki(key) -> bytes:
    return key.public_bytes(serialization.Encoding.DER,
                            serialization.PublicFormat.SubjectPublicKeyInfo)


def _pem(cert: x509.Certificate) -> str:
    return cert.public_bytes(serialization.Encoding.PEM).decode()


def _der_octets(b: bytes) -> bytes:
    n = len(b)
    head = bytes([n]) if n < 128 else bytes([0x80 | ((n.bit_length() + 7) // 8)]) + \
        n.to_bytes((n.bit_length() + 7) // 8, "big")
    return b"\x04" + head + b


def _der_utf8(s: str) -> bytes:
    b = s.encode()
    return b"\x0c" + bytes([len(b)]) + b  # short: the identities here are < 128 bytes


def _ca(name: str, key, issuer_name: x509.Name | None, issuer_key, path_len: int | None
        ) -> x509.Certificate:
    subject = x509.Name([x509.NameAttribute(NameOID.ORGANIZATION_NAME, "imgbuild-test"),
                         x509.NameAttribute(NameOID.COMMON_NAME, name)])
    return (x509.CertificateBuilder().subject_name(subject)
            .issuer_name(issuer_name or subject).public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(EPOCH).not_valid_after(EPOCH + timedelta(days=3650))
            .add_extension(x509.BasicConstraints(ca=True, path_length=path_len), critical=True)
            .add_extension(x509.KeyUsage(False, False, False, False, False, True, True, False,
                                         False), critical=True)
            .sign(issuer_key or key, hashes.SHA384()))


@dataclass
class StandIn:
    """Keys and certificates of the stand-in; one per test module (EC P-256/P-384)."""

    root_key: ec.EllipticCurvePrivateKey
    root: x509.Certificate
    inter_key: ec.EllipticCurvePrivateKey
    inter: x509.Certificate
    ct_key: ec.EllipticCurvePrivateKey
    rekor_key: ec.EllipticCurvePrivateKey

    @classmethod
    def make(cls) -> StandIn:
        root_key = ec.generate_private_key(ec.SECP384R1())
        root = _ca("stand-in fulcio root (TEST ONLY)", root_key, None, None, 1)
        inter_key = ec.generate_private_key(ec.SECP384R1())
        inter = _ca("stand-in fulcio intermediate (TEST ONLY)", inter_key, root.subject,
                    root_key, 0)
        return cls(root_key, root, inter_key, inter, ec.generate_private_key(ec.SECP256R1()),
                   ec.generate_private_key(ec.SECP256R1()))

    # -- the trust root ---------------------------------------------------------------------

    def trusted_root(self, *, ctlogs: bool = True, tlogs: bool = True,
                     ca_start: datetime = EPOCH) -> dict:
        def log(key, url: str) -> dict:
            return {"baseUrl": url, "hashAlgorithm": "SHA2_256",
                    "publicKey": {"rawBytes": base64.b64encode(_spki(key.public_key())).decode(),
                                  "keyDetails": "PKIX_ECDSA_P256_SHA_256",
                                  "validFor": {"start": "2025-01-01T00:00:00Z"}},
                    "logId": {"keyId": base64.b64encode(
                        hashlib.sha256(_spki(key.public_key())).digest()).decode()}}
        return {"mediaType": "application/vnd.dev.sigstore.trustedroot+json;version=0.1",
                "tlogs": [log(self.rekor_key, "https://rekor.stand-in.test")] if tlogs else [],
                "certificateAuthorities": [{
                    "subject": {"organization": "imgbuild-test", "commonName": "stand-in fulcio"},
                    "uri": "https://fulcio.stand-in.test",
                    "certChain": {"certificates": [
                        {"rawBytes": base64.b64encode(c.public_bytes(
                            serialization.Encoding.DER)).decode()} for c in (self.inter,
                                                                             self.root)]},
                    "validFor": {"start": ca_start.strftime("%Y-%m-%dT%H:%M:%SZ")}}],
                "ctlogs": [log(self.ct_key, "https://ctfe.stand-in.test")] if ctlogs else []}

    def ct_public_pem(self) -> str:
        return self.ct_key.public_key().public_bytes(
            serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo).decode()

    def chain_pem(self) -> str:
        return _pem(self.inter) + _pem(self.root)

    # -- a leaf, as Fulcio issues it --------------------------------------------------------

    def leaf(self, key: ec.EllipticCurvePrivateKey, *, subject: str = GHA_SUBJECT,
             issuer: str = GHA_ISSUER, not_before: datetime | None = None,
             minutes: int = 10, sct: bool = True) -> x509.Certificate:
        nb = (not_before or datetime.now(UTC) - timedelta(minutes=1)).replace(microsecond=0)
        serial = x509.random_serial_number()
        san = (x509.RFC822Name(subject) if "@" in subject and "://" not in subject
               else x509.UniformResourceIdentifier(subject))

        def build(extra: list[x509.ExtensionType]) -> x509.Certificate:
            b = (x509.CertificateBuilder().subject_name(x509.Name([]))
                 .issuer_name(self.inter.subject).public_key(key.public_key())
                 .serial_number(serial).not_valid_before(nb)
                 .not_valid_after(nb + timedelta(minutes=minutes))
                 .add_extension(x509.KeyUsage(True, False, False, False, False, False, False,
                                              False, False), critical=True)
                 .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.CODE_SIGNING]),
                                critical=False)
                 .add_extension(x509.SubjectAlternativeName([san]), critical=True)
                 .add_extension(x509.UnrecognizedExtension(ISSUER_V1, issuer.encode()),
                                critical=False)
                 .add_extension(x509.UnrecognizedExtension(ISSUER_V2, _der_utf8(issuer)),
                                critical=False))
            for e in extra:
                b = b.add_extension(e, critical=False)
            return b.sign(self.inter_key, hashes.SHA384())

        pre = build([])
        if not sct:
            return pre
        # RFC 6962: the log signs the precertificate's TBS (the final certificate's, less the
        # SCT list), with the issuer's key hash; the SCT list then goes into the certificate.
        ms = int(datetime.now(UTC).timestamp() * 1000)
        tbs = pre.tbs_certificate_bytes
        key_hash = hashlib.sha256(_spki(self.inter.public_key())).digest()
        signed = (b"\x00\x00" + ms.to_bytes(8, "big") + b"\x00\x01" + key_hash
                  + len(tbs).to_bytes(3, "big") + tbs + b"\x00\x00")
        sig = self.ct_key.sign(signed, ec.ECDSA(hashes.SHA256()))
        one = (b"\x00" + hashlib.sha256(_spki(self.ct_key.public_key())).digest()
               + ms.to_bytes(8, "big") + b"\x00\x00" + b"\x04\x03"
               + len(sig).to_bytes(2, "big") + sig)
        lst = len(one).to_bytes(2, "big") + one
        lst = len(lst).to_bytes(2, "big") + lst
        cert = build([x509.UnrecognizedExtension(SCT_OID, _der_octets(lst))])
        assert cert.tbs_precertificate_bytes == tbs, "the SCT must cover the final TBS"
        return cert

    # -- a Rekor bundle -----------------------------------------------------------------------

    def bundle(self, body: dict, integrated_time: int, log_index: int = 7) -> str:
        body_b64 = base64.b64encode(json.dumps(body, separators=(",", ":")).encode()).decode()
        log_id = hashlib.sha256(_spki(self.rekor_key.public_key())).hexdigest()
        set_ = self.rekor_key.sign(canonical_set_payload(body_b64, integrated_time, log_id,
                                                         log_index), ec.ECDSA(hashes.SHA256()))
        return json.dumps({"SignedEntryTimestamp": base64.b64encode(set_).decode(),
                           "Payload": {"body": body_b64, "integratedTime": integrated_time,
                                       "logIndex": log_index, "logID": log_id}})


def hashedrekord(blob: bytes, sig: bytes, cert: x509.Certificate) -> dict:
    """The Rekor entry body cosign makes for a signature (hashedrekord 0.0.1)."""
    return {"apiVersion": "0.0.1", "kind": "hashedrekord", "spec": {
        "data": {"hash": {"algorithm": "sha256", "value": hashlib.sha256(blob).hexdigest()}},
        "signature": {"content": base64.b64encode(sig).decode(),
                      "publicKey": {"content": base64.b64encode(
                          _pem(cert).encode()).decode()}}}}


def intoto(envelope: bytes, payload: bytes, cert: x509.Certificate) -> dict:
    """The Rekor entry body for an attestation (intoto 0.0.1, as cosign 2.x uploads it)."""
    return {"apiVersion": "0.0.1", "kind": "intoto", "spec": {
        "content": {"hash": {"algorithm": "sha256",
                             "value": hashlib.sha256(envelope).hexdigest()},
                    "payloadHash": {"algorithm": "sha256",
                                    "value": hashlib.sha256(payload).hexdigest()}},
        "publicKey": base64.b64encode(_pem(cert).encode()).decode()}}


def cert_pem(cert: x509.Certificate) -> str:
    return _pem(cert)
