"""Keyless (Sigstore) signatures checked offline against a trust root file, on plain bytes: the
checks `cosign verify --certificate-identity I --certificate-oidc-issuer O --trusted-root F`
makes of a signature cosign 2.x left under `sha256-<hex>.sig` / `.att` (sigstore/cosign
pkg/cosign/verify.go, pkg/oci/static), with no network and no extra binary.

A keyless layer carries, beside its signature, the annotations
`dev.sigstore.cosign/certificate` (the Fulcio leaf, PEM), `dev.sigstore.cosign/chain` (its
issuers, PEM; never trusted: the chain is built from the trust root) and
`dev.sigstore.cosign/bundle` (Rekor's signed entry timestamp, SET, over the log entry's body,
integrated time, log index and log id). Checked, in order:

1. the leaf chains to a Fulcio CA of the trust root (each link's signature, each issuer a CA
   valid when the leaf was issued, the CA's validity window in the trust root);
2. its identity is the policy's: a SAN (URI or email) equal to `subject`, and the issuer from
   Fulcio's extension 1.3.6.1.4.1.57264.1.8 (or the deprecated .1.1) equal to `issuer`;
3. the leaf's key made the signature;
4. the Rekor bundle's SET verifies with a tlog key of the trust root (valid at that time), its
   body is an entry for this very signature, payload and certificate, and the integrated time
   lies within the leaf's validity (minutes: the log is what dates the signature);
5. an SCT embedded in the leaf verifies with a ctlog key of the trust root (RFC 6962 over the
   precertificate), as cosign does unless --insecure-ignore-sct.

What this does not do, said where it matters: no inclusion proof against a signed checkpoint
(the SET is Rekor's promise, which is what cosign checks offline too); no RFC 3161 timestamps;
no Rekor v2 or new-bundle (referrer) signatures."""

from __future__ import annotations

import base64
import hashlib
import json
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from cryptography import x509
from cryptography.exceptions import InvalidSignature, UnsupportedAlgorithm
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, ed25519, padding, rsa
from cryptography.x509.oid import ExtendedKeyUsageOID, ObjectIdentifier

CERT_ANNOTATION = "dev.sigstore.cosign/certificate"
CHAIN_ANNOTATION = "dev.sigstore.cosign/chain"
BUNDLE_ANNOTATION = "dev.sigstore.cosign/bundle"
ISSUER_V2 = ObjectIdentifier("1.3.6.1.4.1.57264.1.8")  # DER UTF8String
ISSUER_V1 = ObjectIdentifier("1.3.6.1.4.1.57264.1.1")  # deprecated: raw bytes
USERNAME_SAN = ObjectIdentifier("1.3.6.1.4.1.57264.1.7")  # an OtherName SAN: DER UTF8String
TRUSTED_ROOT_TYPE = "application/vnd.dev.sigstore.trustedroot"


class TrustRootProblem(ValueError):
    """A trust root file that cannot be used: what is wrong with it (exit 2 at the caller)."""


# --- the trust root -----------------------------------------------------------------------

@dataclass(frozen=True)
class Window:
    """A validity window of the trust root (validFor): no end is open."""

    start: datetime | None
    end: datetime | None

    def holds(self, t: datetime) -> bool:
        return (self.start is None or self.start <= t) and (self.end is None or t <= self.end)

    def __str__(self) -> str:
        start = _when(self.start) if self.start else "-"
        return f"{start} to {_when(self.end) if self.end else '-'}"


@dataclass(frozen=True)
class CA:
    name: str  # subject organization/commonName, for messages
    chain: tuple[x509.Certificate, ...]  # the issuer of a leaf first, the root last
    valid: Window
    # As the file gives them (empty where it does not): a TrustRoot resource carries them.
    organization: str = ""
    common_name: str = ""
    uri: str = ""


@dataclass(frozen=True)
class LogKey:
    name: str  # the log's base URL, for messages
    key_id: bytes
    key: object  # a public key of `cryptography`
    valid: Window
    hash_algorithm: str = ""  # the log's Merkle tree hash, as the file names it (SHA2_256)


@dataclass(frozen=True)
class TrustRoot:
    source: str
    cas: tuple[CA, ...]
    tlogs: tuple[LogKey, ...]
    ctlogs: tuple[LogKey, ...]


def _time(s: str | None, where: str) -> datetime | None:
    if not s:
        return None
    try:
        return datetime.fromisoformat(s.replace("Z", "+00:00")).astimezone(UTC)
    except ValueError:
        raise TrustRootProblem(f"{where}: {s!r} is not an RFC 3339 time") from None


def _window(d: dict, where: str) -> Window:
    v = d.get("validFor") or {}
    return Window(_time(v.get("start"), where + ".validFor.start"),
                  _time(v.get("end"), where + ".validFor.end"))


def _log_keys(entries: list, what: str) -> tuple[LogKey, ...]:
    out = []
    for i, t in enumerate(entries or []):
        where = f"{what}[{i}]"
        try:
            pk = t["publicKey"]
            der = base64.b64decode(pk["rawBytes"])
            key = serialization.load_der_public_key(der)
            key_id = base64.b64decode(t["logId"]["keyId"])
        except (KeyError, TypeError, ValueError, UnsupportedAlgorithm) as e:
            raise TrustRootProblem(f"{where}: no usable publicKey.rawBytes / logId.keyId "
                                   f"({type(e).__name__})") from None
        out.append(LogKey(str(t.get("baseUrl", "")), key_id, key,
                          _window(pk, where + ".publicKey"), str(t.get("hashAlgorithm") or "")))
    return tuple(out)


def load_trust_root(data: bytes, source: str) -> TrustRoot:
    """A Sigstore trusted_root.json (the format `cosign verify --trusted-root` and
    sigstore-python read: certificateAuthorities, tlogs, ctlogs, each with its validFor)."""
    try:
        doc = json.loads(data)
    except ValueError as e:
        raise TrustRootProblem(f"not JSON: {e}") from None
    if not isinstance(doc, dict) or not str(doc.get("mediaType", "")).startswith(
            TRUSTED_ROOT_TYPE):
        got = doc.get("mediaType") if isinstance(doc, dict) else None
        raise TrustRootProblem(f"mediaType is {got!r}, not {TRUSTED_ROOT_TYPE}+json;version=0.1")
    cas = []
    for i, ca in enumerate(doc.get("certificateAuthorities") or []):
        where = f"certificateAuthorities[{i}]"
        try:
            chain = tuple(x509.load_der_x509_certificate(base64.b64decode(c["rawBytes"]))
                          for c in ca["certChain"]["certificates"])
        except (KeyError, TypeError, ValueError) as e:
            raise TrustRootProblem(f"{where}: no usable certChain.certificates "
                                   f"({type(e).__name__})") from None
        if not chain:
            raise TrustRootProblem(f"{where}: an empty certChain")
        subj = ca.get("subject") or {}
        name = "/".join(x for x in (subj.get("organization"), subj.get("commonName")) if x) \
            or chain[0].subject.rfc4514_string()
        cas.append(CA(name, chain, _window(ca, where), str(subj.get("organization") or ""),
                      str(subj.get("commonName") or ""), str(ca.get("uri") or "")))
    if not cas:
        raise TrustRootProblem("no certificateAuthorities: nothing a keyless certificate can "
                               "chain to")
    return TrustRoot(source, tuple(cas), _log_keys(doc.get("tlogs"), "tlogs"),
                     _log_keys(doc.get("ctlogs"), "ctlogs"))


# --- what a certificate says ----------------------------------------------------------------

@dataclass(frozen=True)
class Identity:
    """Who a Fulcio certificate names: its SANs (URI, email, other) and its OIDC issuer."""

    sans: tuple[str, ...]
    issuer: str | None

    @property
    def subject(self) -> str:
        return self.sans[0] if self.sans else "(no SAN)"


def _der_utf8(value: bytes) -> str | None:
    # A DER UTF8String (tag 12) with a short or long length.
    if len(value) < 2 or value[0] != 0x0C:
        return None
    n, off = value[1], 2
    if n & 0x80:
        k = n & 0x7F
        n, off = int.from_bytes(value[2:2 + k], "big"), 2 + k
    return value[off:off + n].decode("utf-8", errors="replace")


def identity(cert: x509.Certificate) -> Identity:
    sans: list[str] = []
    try:
        san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
        sans += san.get_values_for_type(x509.UniformResourceIdentifier)
        sans += san.get_values_for_type(x509.RFC822Name)
        # Fulcio's username identity: an OtherName whose value is a DER UTF8String (cosign
        # reads it so, UnmarshalOtherNameSAN); the tag and length are not part of the name.
        sans += [name for o in san.get_values_for_type(x509.OtherName)
                 if o.type_id == USERNAME_SAN and (name := _der_utf8(o.value)) is not None]
    except x509.ExtensionNotFound:
        pass
    issuer = None
    for oid, der in ((ISSUER_V2, True), (ISSUER_V1, False)):
        try:
            raw = cert.extensions.get_extension_for_oid(oid).value.value
        except x509.ExtensionNotFound:
            continue
        issuer = _der_utf8(raw) if der else raw.decode("utf-8", errors="replace")
        break
    return Identity(tuple(sans), issuer)


def certificate(pem: str) -> x509.Certificate | None:
    try:
        return x509.load_pem_x509_certificate(pem.encode())
    except ValueError:
        return None


def leaf_identity(annotations: dict) -> Identity | None:
    """The identity a keyless layer's certificate names (for a report: who signed); None where
    the layer carries none."""
    cert = certificate(str(annotations.get(CERT_ANNOTATION) or ""))
    return identity(cert) if cert is not None else None


# --- the checks ---------------------------------------------------------------------------------

@dataclass(frozen=True)
class Expect:
    """What a keyless policy asks: the identity, and whether the transparency log (Rekor
    bundle) and the certificate transparency (SCT) are required."""

    subject: str
    issuer: str
    tlog: bool = True
    sct: bool = True


@dataclass(frozen=True)
class Evidence:
    """One keyless signature as a layer carries it."""

    blob: bytes  # the layer's blob: what the Rekor entry's hash covers
    signed: bytes  # what the signature covers (the payload; DSSE's PAE for an envelope)
    signature: bytes
    annotations: dict


def _when(t: datetime) -> str:
    return t.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _utc(t: datetime) -> datetime:
    return t if t.tzinfo else t.replace(tzinfo=UTC)


def _verify(key: object, sig: bytes, data: bytes, hash_alg: hashes.HashAlgorithm | None = None
            ) -> bool:
    try:
        if isinstance(key, ec.EllipticCurvePublicKey):
            h = hash_alg or (hashes.SHA384() if key.curve.key_size == 384 else
                             hashes.SHA512() if key.curve.key_size > 384 else hashes.SHA256())
            key.verify(sig, data, ec.ECDSA(h))
        elif isinstance(key, ed25519.Ed25519PublicKey):
            key.verify(sig, data)
        elif isinstance(key, rsa.RSAPublicKey):
            key.verify(sig, data, padding.PKCS1v15(), hash_alg or hashes.SHA256())
        else:
            return False
        return True
    except (InvalidSignature, ValueError, TypeError, UnsupportedAlgorithm):
        return False


def _issued_by(cert: x509.Certificate, issuer: x509.Certificate) -> bool:
    try:
        cert.verify_directly_issued_by(issuer)
        return True
    except (ValueError, TypeError, InvalidSignature, UnsupportedAlgorithm):
        return False


def _is_ca(cert: x509.Certificate) -> bool:
    try:
        return cert.extensions.get_extension_for_class(x509.BasicConstraints).value.ca
    except x509.ExtensionNotFound:
        return False


def chain_to(leaf: x509.Certificate, root: TrustRoot) -> CA | None:
    """The trust root's CA that issued `leaf`: every link's signature verifies, every issuer is
    a CA valid when the leaf was issued, the chain ends at a self-signed root, and the trust
    root's validity window for that CA holds the leaf's issuance."""
    t = _utc(leaf.not_valid_before_utc)
    for ca in root.cas:
        if not ca.valid.holds(t):
            continue
        links = (leaf, *ca.chain)
        if all(_issued_by(links[i], links[i + 1]) for i in range(len(links) - 1)) \
                and _issued_by(ca.chain[-1], ca.chain[-1]) \
                and all(_is_ca(c) and c.not_valid_before_utc <= t <= c.not_valid_after_utc
                        for c in ca.chain):
            return ca
    return None


def canonical_set_payload(body: str, integrated_time: int, log_id: str, log_index: int) -> bytes:
    """What Rekor's signed entry timestamp signs: the canonical JSON (RFC 8785: sorted keys, no
    spaces) of the entry's body, integrated time, log id (hex) and log index."""
    return json.dumps({"body": body, "integratedTime": integrated_time, "logID": log_id,
                       "logIndex": log_index}, sort_keys=True, separators=(",", ":")).encode()


def _pem_der(b64_pem: str) -> bytes | None:
    """The DER of a base64 PEM certificate (or public key) as a Rekor body holds it."""
    try:
        pem = base64.b64decode(b64_pem)
        if b"CERTIFICATE" in pem:
            return x509.load_pem_x509_certificate(pem).public_bytes(serialization.Encoding.DER)
        return serialization.load_pem_public_key(pem).public_bytes(
            serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo)
    except (ValueError, TypeError, UnsupportedAlgorithm):
        return None


def entry_mismatch(body: dict, ev: Evidence, leaf: x509.Certificate) -> str | None:
    """Whether a Rekor entry's body is about this signature: the kinds cosign writes
    (hashedrekord, rekord for a signature; intoto, dsse for an attestation), compared as
    cosign's VerifyBundle does: the hash of the layer's blob, the signature, the certificate.
    None where it is; else what differs."""
    kind, spec = body.get("kind"), body.get("spec") or {}
    blob_hash = hashlib.sha256(ev.blob).hexdigest()
    leaf_der = leaf.public_bytes(serialization.Encoding.DER)
    sig_b64 = base64.b64encode(ev.signature).decode()
    try:
        if kind in ("hashedrekord", "rekord"):
            hashed = spec["data"]["hash"]
            sig, key = spec["signature"]["content"], spec["signature"]["publicKey"]["content"]
            sigs = [sig]
        elif kind == "intoto":
            content = spec["content"]
            hashed = content["hash"]
            if "envelope" in content:  # 0.0.2: the signatures with their keys
                pairs = content["envelope"]["signatures"]
                key = pairs[0]["publicKey"]
                sigs = [base64.b64decode(s["sig"]).decode() for s in pairs]
            else:  # 0.0.1: the key only
                key, sigs = spec["publicKey"], [sig_b64]
        elif kind == "dsse":
            hashed = spec["envelopeHash"]
            pairs = spec["signatures"]
            key, sigs = pairs[0]["verifier"], [s["signature"] for s in pairs]
        else:
            return f"an entry of kind {kind!r}, which imgbuild does not read"
        if hashed.get("algorithm") != "sha256" or hashed.get("value") != blob_hash:
            return (f"an entry for other content (sha256 {str(hashed.get('value'))[:16]}..., "
                    f"this layer's is {blob_hash[:16]}...)")
        if sig_b64 not in sigs:
            return "an entry for another signature"
        if _pem_der(key) != leaf_der:
            return "an entry for another certificate"
    except (KeyError, TypeError, IndexError, ValueError, AttributeError):
        return f"a {kind or 'garbled'} entry without the fields cosign writes"
    return None


def check_tlog(bundle_json: str, ev: Evidence, leaf: x509.Certificate, root: TrustRoot
               ) -> tuple[str | None, datetime | None]:
    """(what is wrong, or None; the time the log dates the signature) for a Rekor bundle."""
    try:
        b = json.loads(bundle_json)
        set_sig = base64.b64decode(b["SignedEntryTimestamp"])
        p = b["Payload"]
        body_b64, it, idx, log_id = p["body"], int(p["integratedTime"]), int(p["logIndex"]), \
            str(p["logID"])
        body = json.loads(base64.b64decode(body_b64))
    except (ValueError, KeyError, TypeError):
        return "a Rekor bundle that is not cosign's (SignedEntryTimestamp, Payload)", None
    logs = [k for k in root.tlogs if k.key_id.hex() == log_id.lower()]
    if not logs:
        return (f"a Rekor bundle from log {log_id[:16]}..., which {root.source} does not name "
                f"({len(root.tlogs)} tlogs there)"), None
    when = datetime.fromtimestamp(it, UTC)
    if not any(k.valid.holds(when) for k in logs):
        return (f"a Rekor bundle logged {_when(when)}, outside the validity of its log's key in "
                f"the trust root ({logs[0].valid})"), None
    payload = canonical_set_payload(body_b64, it, log_id, idx)
    if not any(_verify(k.key, set_sig, payload) for k in logs):
        return (f"a Rekor bundle whose signed entry timestamp the key of log {log_id[:16]}... "
                "does not verify"), None
    bad = entry_mismatch(body, ev, leaf)
    if bad:
        return f"a Rekor bundle (log index {idx}) of {bad}", None
    nb, na = _utc(leaf.not_valid_before_utc), _utc(leaf.not_valid_after_utc)
    if not nb <= when <= na:
        return (f"a Rekor entry logged {_when(when)}, outside the certificate's validity "
                f"({_when(nb)} to {_when(na)})"), None
    return None, when


def _sct_signed(sct: x509.certificate_transparency.SignedCertificateTimestamp,
                leaf: x509.Certificate, issuer: x509.Certificate) -> bytes:
    """RFC 6962's digitally-signed struct of a precertificate SCT."""
    ms = (_utc(sct.timestamp) - datetime(1970, 1, 1, tzinfo=UTC)) // timedelta(milliseconds=1)
    tbs = leaf.tbs_precertificate_bytes
    key_hash = hashlib.sha256(issuer.public_key().public_bytes(
        serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo)).digest()
    ext = sct.extension_bytes
    return (b"\x00\x00" + ms.to_bytes(8, "big") + b"\x00\x01" + key_hash
            + len(tbs).to_bytes(3, "big") + tbs + len(ext).to_bytes(2, "big") + ext)


def check_sct(leaf: x509.Certificate, ca: CA, root: TrustRoot) -> str | None:
    """Whether an SCT embedded in the leaf verifies with a ctlog key of the trust root."""
    try:
        scts = list(leaf.extensions.get_extension_for_class(
            x509.PrecertificateSignedCertificateTimestamps).value)
    except x509.ExtensionNotFound:
        return "no SCT embedded in the certificate (the policy asks for one; sct: false opts out)"
    seen = []
    for sct in scts:
        logs = [k for k in root.ctlogs if k.key_id == sct.log_id]
        if not logs:
            seen.append(f"an SCT from log {sct.log_id.hex()[:16]}..., which the trust root "
                        "does not name")
            continue
        when = _utc(sct.timestamp)
        signed = _sct_signed(sct, leaf, ca.chain[0])
        if any(k.valid.holds(when) and _verify(k.key, sct.signature, signed,
                                               sct.signature_hash_algorithm) for k in logs):
            return None
        seen.append(f"an SCT of log {sct.log_id.hex()[:16]}... that does not verify")
    return "; ".join(seen) or "an empty SCT list"


def examine(ev: Evidence, want: Expect, root: TrustRoot, now: datetime) -> str | None:
    """Every check of one keyless signature; None where all pass, else the first that fails,
    in words (what was found, against what was expected)."""
    leaf = certificate(str(ev.annotations.get(CERT_ANNOTATION) or ""))
    if leaf is None:
        return "no Fulcio certificate (dev.sigstore.cosign/certificate): not a keyless signature"
    ca = chain_to(leaf, root)
    if ca is None:
        return (f"a certificate issued by {leaf.issuer.rfc4514_string() or '(no name)'}, which "
                f"no Fulcio CA in {root.source} issued")
    try:
        eku = leaf.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
        code_signing = ExtendedKeyUsageOID.CODE_SIGNING in eku
    except x509.ExtensionNotFound:
        code_signing = False
    if not code_signing:
        return "a certificate without the code-signing key usage Fulcio gives"
    who = identity(leaf)
    if want.subject not in who.sans or who.issuer != want.issuer:
        return (f"a certificate for {', '.join(who.sans) or '(no SAN)'} (issuer "
                f"{who.issuer or 'none'}), not {want.subject} (issuer {want.issuer})")
    if not _verify(leaf.public_key(), ev.signature, ev.signed):
        return f"a signature that the key of the certificate for {who.subject} did not make"
    bundle = ev.annotations.get(BUNDLE_ANNOTATION)
    nb, na = _utc(leaf.not_valid_before_utc), _utc(leaf.not_valid_after_utc)
    if want.tlog:
        if not bundle:
            return ("no Rekor bundle (dev.sigstore.cosign/bundle): the policy asks for the "
                    "transparency log; `tlog: false` opts out, as cosign's "
                    "--insecure-ignore-tlog")
        bad, _ = check_tlog(str(bundle), ev, leaf, root)
        if bad:
            return bad
    elif not nb <= _utc(now) <= na:
        # No log dates the signature, so the certificate must be valid now (cosign's rule).
        return (f"a certificate valid {_when(nb)} to {_when(na)}, not now ({_when(now)}), and "
                "no transparency log (tlog: false) to date the signature")
    if want.sct:
        bad = check_sct(leaf, ca, root)
        if bad:
            return bad
    return None
