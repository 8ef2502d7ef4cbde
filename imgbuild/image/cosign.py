"""Signatures and signed attestations in Sigstore cosign's format, on plain data: what is
signed, how, and whether what a registry holds is signed as a policy asks. No registry here
(image/signstore.py reads and writes them), so every decision is a function of bytes.

cosign's layout, as `cosign sign`/`attest` 2.x write it and `cosign verify`/`verify-attestation`
read it (sigstore/cosign pkg/oci/static, pkg/cosign/verify.go, pkg/types):

- the signature of image `sha256:<hex>` is an OCI manifest under the tag `sha256-<hex>.sig`,
  one layer per signature: its blob the *simple-signing payload* (media type
  application/vnd.dev.cosign.simplesigning.v1+json), which names the image's repository and
  manifest digest, and its annotation `dev.cosignproject.cosign/signature` the base64 ASN.1
  ECDSA signature of the payload's SHA-256;
- an attestation is a layer of `sha256-<hex>.att` (application/vnd.dsse.envelope.v1+json, its
  annotation `predicateType`): a DSSE envelope whose payload is an in-toto statement about the
  image (its subject the image's digest), signed over DSSE's pre-authentication encoding.

Keys: ECDSA P-256 (cosign's default). A cosign key pair's private half is a PEM `ENCRYPTED
SIGSTORE PRIVATE KEY` (`ENCRYPTED COSIGN PRIVATE KEY` before 2.0): a JSON envelope of
secure-systems-lab's `encrypted` package, the PKCS#8 key sealed with NaCl secretbox under a key
scrypt derives from the password (cosign's COSIGN_PASSWORD).

Keyless signatures (a Fulcio certificate, a Rekor bundle) are checked in image/keyless.py
against the policy's trust root file; this module picks the layers and the payloads."""

from __future__ import annotations

import base64
import hashlib
import json
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

from cryptography.exceptions import InvalidSignature, UnsupportedAlgorithm
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec

from ..catalog.registries import ATTESTATION_TYPES, SIGNING_KEY, SignPolicy
from . import keyless

SIG_LAYER = "application/vnd.dev.cosign.simplesigning.v1+json"
SIG_ANNOTATION = "dev.cosignproject.cosign/signature"
DSSE_LAYER = "application/vnd.dsse.envelope.v1+json"
PREDICATE_ANNOTATION = "predicateType"
INTOTO_PAYLOAD = "application/vnd.in-toto+json"
INTOTO_STATEMENT = "https://in-toto.io/Statement/v1"
SIGNATURE_TYPE = "cosign container image signature"
OCI_CONFIG = "application/vnd.oci.image.config.v1+json"
ENCRYPTED_PEM_TYPES = ("ENCRYPTED SIGSTORE PRIVATE KEY", "ENCRYPTED COSIGN PRIVATE KEY")


class KeyProblem(ValueError):
    """A key that cannot be used: what is wrong with it, for the caller's error (exit 2)."""


def sig_tag(image_digest: str) -> str:
    return image_digest.replace(":", "-") + ".sig"


def att_tag(image_digest: str) -> str:
    return image_digest.replace(":", "-") + ".att"


# --- what is signed -----------------------------------------------------------------------

def simple_signing(repository: str, image_digest: str) -> bytes:
    """The payload cosign signs for an image: its repository (no tag) and manifest digest;
    compact JSON, as cosign's Go encoder writes it."""
    doc = {"critical": {"identity": {"docker-reference": repository},
                        "image": {"docker-manifest-digest": image_digest},
                        "type": SIGNATURE_TYPE},
           "optional": None}
    return json.dumps(doc, separators=(",", ":")).encode()


def pae(payload_type: str, body: bytes) -> bytes:
    """DSSE's pre-authentication encoding: what an envelope's signature covers."""
    t = payload_type.encode()
    return b"DSSEv1 %d %s %d %s" % (len(t), t, len(body), body)


def statement(name: str, image_digest: str, predicate_type: str, predicate: dict) -> dict:
    """An in-toto statement about the image `image_digest` (its subject)."""
    algo, _, hexdigest = image_digest.partition(":")
    return {"_type": INTOTO_STATEMENT, "subject": [{"name": name, "digest": {algo: hexdigest}}],
            "predicateType": predicate_type, "predicate": predicate}


# --- keys ---------------------------------------------------------------------------------

@dataclass(frozen=True)
class SigningKey:
    key: ec.EllipticCurvePrivateKey
    source: str  # where it came from, for messages (never the key itself)

    def __repr__(self) -> str:  # nothing that prints a SigningKey prints the key
        return f"SigningKey(source={self.source!r})"

    def public_pem(self) -> bytes:
        return self.key.public_key().public_bytes(serialization.Encoding.PEM,
                                                  serialization.PublicFormat.SubjectPublicKeyInfo)


def _pem_type(pem: bytes) -> str | None:
    head = pem.strip().split(b"\n", 1)[0].strip()
    if head.startswith(b"-----BEGIN ") and head.endswith(b"-----"):
        return head[len(b"-----BEGIN "):-len(b"-----")].decode(errors="replace")
    return None


def _pem_body(pem: bytes) -> bytes:
    lines = [ln.strip() for ln in pem.strip().splitlines()]
    return base64.b64decode(b"".join(ln for ln in lines if ln and not ln.startswith(b"-----")))


def load_private_key(pem: bytes, password: bytes | None, source: str) -> SigningKey:
    """An ECDSA private key from a PEM: cosign's encrypted key (password needed), or a plain
    PKCS#8 / SEC1 one. KeyProblem says what is wrong."""
    kind = _pem_type(pem)
    if kind is None:
        raise KeyProblem("not a PEM private key (no -----BEGIN ...----- line)")
    if kind in ENCRYPTED_PEM_TYPES:
        if password is None:
            raise KeyProblem(f"an encrypted cosign key ({kind}) and no password: COSIGN_PASSWORD "
                             "is not set")
        der = _decrypt(_pem_body(pem), password)
        try:
            key = serialization.load_der_private_key(der, None)
        except (ValueError, UnsupportedAlgorithm) as e:
            raise KeyProblem(f"the decrypted key is not a PKCS#8 key: {e}") from None
    elif kind in ("PRIVATE KEY", "EC PRIVATE KEY"):
        try:
            key = serialization.load_pem_private_key(pem, password or None)
        except TypeError as e:  # an encrypted PKCS#8 key without a password, or the reverse
            raise KeyProblem(str(e)) from None
        except (ValueError, UnsupportedAlgorithm) as e:
            raise KeyProblem(f"unreadable {kind}: {str(e).splitlines()[0][:160]}") from None
    else:
        raise KeyProblem(f"a PEM of type {kind!r}, not a private key")
    if not isinstance(key, ec.EllipticCurvePrivateKey):
        raise KeyProblem(f"a {type(key).__name__.lstrip('_')}; imgbuild signs with ECDSA keys "
                         "(cosign's default, `cosign generate-key-pair`)")
    return SigningKey(key, source)


def _decrypt(envelope_bytes: bytes, password: bytes) -> bytes:
    """Open secure-systems-lab's encrypted envelope (scrypt + nacl/secretbox) cosign writes."""
    from nacl.exceptions import CryptoError  # imported on use: only an encrypted key needs it
    from nacl.secret import SecretBox

    try:
        env = json.loads(envelope_bytes)
        kdf, cipher = env["kdf"], env["cipher"]
        if kdf["name"] != "scrypt" or cipher["name"] != "nacl/secretbox":
            raise KeyProblem(f"encrypted with {kdf['name']} + {cipher['name']}; cosign's keys "
                             "use scrypt + nacl/secretbox")
        p = kdf["params"]
        salt = base64.b64decode(kdf["salt"])
        nonce = base64.b64decode(cipher["nonce"])
        sealed = base64.b64decode(env["ciphertext"])
        n, r, par = int(p["N"]), int(p["r"]), int(p["p"])
    except (ValueError, KeyError, TypeError) as e:
        raise KeyProblem(f"the encrypted key's envelope is garbled ({type(e).__name__})") from None
    # cosign uses N=65536, r=8, p=1 (64 MiB); a file that asks for far more is not cosign's.
    need = 128 * r * (n + par + 2)
    if n < 2 or n & (n - 1) or not 0 < need <= 1 << 30:
        raise KeyProblem(f"the encrypted key asks for scrypt N={n}, r={r}, p={par}; cosign's "
                         "keys use N=65536, r=8, p=1")
    try:
        secret = hashlib.scrypt(password, salt=salt, n=n, r=r, p=par, dklen=32,
                                maxmem=need + (1 << 20))
    except ValueError as e:
        raise KeyProblem(f"scrypt refused the key's parameters: {e}") from None
    try:
        return SecretBox(secret).decrypt(sealed, nonce)
    except CryptoError:
        raise KeyProblem("wrong password (COSIGN_PASSWORD) for this encrypted key") from None


def load_public_key(pem: bytes) -> ec.EllipticCurvePublicKey:
    try:
        key = serialization.load_pem_public_key(pem)
    except (ValueError, UnsupportedAlgorithm) as e:
        raise KeyProblem(f"not a PEM public key: {str(e).splitlines()[0][:160]}") from None
    if not isinstance(key, ec.EllipticCurvePublicKey):
        raise KeyProblem(f"a {type(key).__name__.lstrip('_')}; imgbuild checks ECDSA keys")
    return key


def public_pem(key: ec.EllipticCurvePublicKey) -> bytes:
    return key.public_bytes(serialization.Encoding.PEM,
                            serialization.PublicFormat.SubjectPublicKeyInfo)


def key_id(key: ec.EllipticCurvePublicKey) -> str:
    """A short name for a public key in messages: sha256 of its DER, as `cosign` users compare
    `cosign public-key` output by eye."""
    der = key.public_bytes(serialization.Encoding.DER,
                           serialization.PublicFormat.SubjectPublicKeyInfo)
    return "sha256:" + hashlib.sha256(der).hexdigest()[:16]


def same_key(public: ec.EllipticCurvePublicKey, private: SigningKey) -> bool:
    """Whether `private` is the private half of `public`."""
    return public_pem(public) == private.public_pem()


def sign(key: SigningKey, data: bytes) -> str:
    """The base64 ASN.1 ECDSA signature of data's SHA-256, as cosign writes it."""
    return base64.b64encode(key.key.sign(data, ec.ECDSA(hashes.SHA256()))).decode()


def signature_ok(key: ec.EllipticCurvePublicKey, data: bytes, sig_b64: str) -> bool:
    try:
        key.verify(base64.b64decode(sig_b64, validate=True), data, ec.ECDSA(hashes.SHA256()))
        return True
    except (InvalidSignature, ValueError, TypeError):
        return False


def envelope(key: SigningKey, stmt: dict) -> bytes:
    """A DSSE envelope of an in-toto statement, signed as `cosign attest` signs it."""
    body = json.dumps(stmt, separators=(",", ":"), sort_keys=True).encode()
    return json.dumps({"payloadType": INTOTO_PAYLOAD,
                       "payload": base64.b64encode(body).decode(),
                       "signatures": [{"keyid": "", "sig": sign(key, pae(INTOTO_PAYLOAD, body))}]},
                      separators=(",", ":")).encode()


# --- the manifests under .sig and .att --------------------------------------------------------

@dataclass(frozen=True)
class Layer:
    """One layer of a `.sig` or `.att` manifest: its descriptor's parts and its blob (read from
    the registry and checked against its digest by the caller)."""

    media_type: str
    annotations: dict
    blob: bytes

    @property
    def digest(self) -> str:
        return "sha256:" + hashlib.sha256(self.blob).hexdigest()

    def descriptor(self) -> dict:
        return {"mediaType": self.media_type, "size": len(self.blob), "digest": self.digest,
                "annotations": dict(self.annotations)}


def signature_layer(key: SigningKey, repository: str, image_digest: str) -> Layer:
    payload = simple_signing(repository, image_digest)
    return Layer(SIG_LAYER, {SIG_ANNOTATION: sign(key, payload)}, payload)


def attestation_layer(key: SigningKey, stmt: dict) -> Layer:
    # cosign writes an empty signature annotation on attestation layers; its verify reads it.
    return Layer(DSSE_LAYER, {SIG_ANNOTATION: "", PREDICATE_ANNOTATION: stmt["predicateType"]},
                 envelope(key, stmt))


def merged(held: list[Layer], new: Layer, same: Callable[[Layer], bool]) -> list[Layer] | None:
    """The layers of a `.sig`/`.att` manifest once `new` is added to those the registry holds:
    the others' signatures kept (cosign appends too); None where one held is `same` already."""
    if any(same(la) for la in held):
        return None
    return [*held, new]


def manifest_parts(layers: list[Layer]) -> tuple[bytes, bytes]:
    """(manifest, config) for a `.sig`/`.att` manifest over `layers`, as cosign makes it: an OCI
    image manifest whose config lists the layers' digests as diff ids (they are not
    compressed)."""
    config = json.dumps({"architecture": "", "created": "0001-01-01T00:00:00Z",
                         "history": [{"created": "0001-01-01T00:00:00Z"}] * len(layers),
                         "os": "", "rootfs": {"type": "layers",
                                              "diff_ids": [la.digest for la in layers]},
                         "config": {}}, separators=(",", ":")).encode()
    manifest = json.dumps({"schemaVersion": 2,
                           "mediaType": "application/vnd.oci.image.manifest.v1+json",
                           "config": {"mediaType": OCI_CONFIG, "size": len(config),
                                      "digest": "sha256:" + hashlib.sha256(config).hexdigest()},
                           "layers": [la.descriptor() for la in layers]},
                          separators=(",", ":")).encode()
    return manifest, config


# --- the decisions ----------------------------------------------------------------------------

Check = tuple[str, bool, str]  # (what, ok, detail), as verify's checks


def check_signature(image_digest: str, layers: list[Layer] | None,
                    key: ec.EllipticCurvePublicKey, whose: str = "the policy's key") -> Check:
    """Whether one signature under `.sig` is `key`'s over a payload that names this digest;
    `whose` says in the detail what the key is to the caller."""
    if not layers:
        return ("signature", False, f"none: the registry holds no {sig_tag(image_digest)}")
    seen = []
    for la in layers:
        if la.media_type != SIG_LAYER:
            seen.append(f"a layer of type {la.media_type}")
            continue
        try:
            named = json.loads(la.blob)["critical"]
            digest = named["image"]["docker-manifest-digest"]
            kind = named["type"]
        except (ValueError, KeyError, TypeError):
            seen.append("a payload that is not cosign's simple signing")
            continue
        good = signature_ok(key, la.blob, str(la.annotations.get(SIG_ANNOTATION, "")))
        if not good:
            seen.append("a signature by another key" if la.annotations.get(SIG_ANNOTATION)
                        else "a payload with no signature")
        elif kind != SIGNATURE_TYPE:
            seen.append(f"a payload of type {kind!r}")
        elif digest != image_digest:
            seen.append(f"a signature by this key of another image, {digest}")
        else:
            return ("signature", True, f"signed by {key_id(key)} ({whose})")
    return ("signature", False, f"no signature by {key_id(key)} ({whose}): "
            f"{len(layers)} found, " + "; ".join(sorted(set(seen))))


def check_attestation(image_digest: str, layers: list[Layer] | None,
                      key: ec.EllipticCurvePublicKey, kind: str) -> Check:
    """Whether an attestation of predicate type `kind` (cosign's name, e.g. cyclonedx) under
    `.att` is signed by `key` and is about this very image (its statement's subject)."""
    want = ATTESTATION_TYPES[kind]
    what = f"attestation {kind}"
    if not layers:
        return (what, False, f"none: the registry holds no {att_tag(image_digest)}")
    seen = []
    algo, _, hexdigest = image_digest.partition(":")
    for la in layers:
        if la.media_type != DSSE_LAYER:
            continue
        try:
            env = json.loads(la.blob)
            body = base64.b64decode(env["payload"])
            sigs = [s["sig"] for s in env.get("signatures") or []]
            stmt = json.loads(body)
            ptype = stmt.get("predicateType")
            subjects = [s.get("digest", {}).get(algo) for s in stmt.get("subject") or []]
        except (ValueError, KeyError, TypeError, AttributeError):
            seen.append("an envelope that is not DSSE over an in-toto statement")
            continue
        if ptype != want:
            continue
        if env.get("payloadType") != INTOTO_PAYLOAD:
            seen.append(f"a {kind} envelope of payload type {env.get('payloadType')!r}")
        elif not any(signature_ok(key, pae(INTOTO_PAYLOAD, body), s) for s in sigs):
            seen.append(f"a {kind} statement not signed by {key_id(key)}")
        elif hexdigest not in subjects:
            seen.append(f"a {kind} statement about another image "
                        f"({', '.join(f'{algo}:{s}' for s in subjects if s) or 'no subject'})")
        else:
            return (what, True, f"{want}, signed by {key_id(key)}, about this digest")
    return (what, False, f"no {want} statement about this digest signed by {key_id(key)}"
            + (": " + "; ".join(sorted(set(seen))) if seen else " (none of that type)"))


def _keyless_want(policy: SignPolicy) -> keyless.Expect:
    return keyless.Expect(str(policy.subject), str(policy.issuer), policy.tlog, policy.sct)


def _who(policy: SignPolicy) -> str:
    return f"{policy.subject} (issuer {policy.issuer})"


def check_keyless_signature(image_digest: str, layers: list[Layer] | None, policy: SignPolicy,
                            root: keyless.TrustRoot, now: datetime) -> Check:
    """Whether one signature under `.sig` is a keyless one by the policy's identity, over a
    payload that names this digest, that the trust root accepts (image/keyless.py)."""
    if not layers:
        return ("signature", False, f"none: the registry holds no {sig_tag(image_digest)}")
    seen = []
    for la in layers:
        if la.media_type != SIG_LAYER:
            seen.append(f"a layer of type {la.media_type}")
            continue
        try:
            named = json.loads(la.blob)["critical"]
            digest = named["image"]["docker-manifest-digest"]
            kind = named["type"]
            sig = base64.b64decode(str(la.annotations.get(SIG_ANNOTATION, "")), validate=True)
        except (ValueError, KeyError, TypeError):
            seen.append("a payload that is not cosign's simple signing")
            continue
        bad = keyless.examine(keyless.Evidence(la.blob, la.blob, sig, la.annotations),
                              _keyless_want(policy), root, now)
        if bad:
            seen.append(bad)
        elif kind != SIGNATURE_TYPE:
            seen.append(f"a payload of type {kind!r}")
        elif digest != image_digest:
            seen.append(f"a signature by {policy.subject} of another image, {digest}")
        else:
            return ("signature", True, f"signed by {_who(policy)}, Fulcio CA and Rekor entry "
                    f"checked against {root.source}" + ("" if policy.tlog else
                                                         " (transparency log not asked)"))
    return ("signature", False, f"no keyless signature by {_who(policy)} that {root.source} "
            f"accepts: {len(layers)} found, " + "; ".join(sorted(set(seen))))


def check_keyless_attestation(image_digest: str, layers: list[Layer] | None, policy: SignPolicy,
                              root: keyless.TrustRoot, now: datetime, kind: str,
                              predicate_type: str | None = None) -> Check:
    """Whether an attestation of type `kind` under `.att` is a DSSE envelope signed keyless by
    the policy's identity (the same checks as the signature, over DSSE's PAE) whose statement
    is about this very image. `predicate_type` overrides the type `kind` names."""
    want = predicate_type or ATTESTATION_TYPES[kind]
    what = f"attestation {kind}"
    if not layers:
        return (what, False, f"none: the registry holds no {att_tag(image_digest)}")
    seen = []
    algo, _, hexdigest = image_digest.partition(":")
    for la in layers:
        if la.media_type != DSSE_LAYER:
            continue
        try:
            env = json.loads(la.blob)
            body = base64.b64decode(env["payload"])
            sigs = [base64.b64decode(s["sig"]) for s in env.get("signatures") or []]
            stmt = json.loads(body)
            ptype = stmt.get("predicateType")
            subjects = [s.get("digest", {}).get(algo) for s in stmt.get("subject") or []]
        except (ValueError, KeyError, TypeError, AttributeError):
            seen.append("an envelope that is not DSSE over an in-toto statement")
            continue
        if ptype != want:
            continue
        ptype_env = str(env.get("payloadType"))
        if ptype_env != INTOTO_PAYLOAD:
            seen.append(f"a {kind} envelope of payload type {ptype_env!r}")
            continue
        bads = [keyless.examine(keyless.Evidence(la.blob, pae(ptype_env, body), s,
                                                 la.annotations),
                                _keyless_want(policy), root, now) for s in sigs]
        if all(bads):
            seen.extend(b for b in bads if b)
        elif hexdigest not in subjects:
            seen.append(f"a {kind} statement about another image "
                        f"({', '.join(f'{algo}:{s}' for s in subjects if s) or 'no subject'})")
        else:
            return (what, True, f"{want}, signed by {_who(policy)}, about this digest")
    return (what, False, f"no {want} statement about this digest signed by {_who(policy)}"
            + (": " + "; ".join(sorted(set(seen))) if seen else " (none of that type)"))


def no_trust_root(policy: SignPolicy) -> str:
    """Why a keyless policy without `trust-root` checks nothing: the public Sigstore root is
    fetched over the network (TUF), which imgbuild does not do; a policy names the file."""
    return (f"the policy ({policy.where}) asks for a keyless signature by {_who(policy)} but "
            "names no trust-root; imgbuild checks keyless signatures offline, against a "
            "trusted_root.json the policy names (signed-by.keyless.trust-root)")


def judge(policy: SignPolicy, image_digest: str, sig_layers: list[Layer] | None,
          att_layers: list[Layer] | None, key: ec.EllipticCurvePublicKey | None,
          root: keyless.TrustRoot | None = None, now: datetime | None = None) -> list[Check]:
    """Every check the policy asks of an image, on what the registry holds under its `.sig`
    and `.att` tags (None: nothing there): by the policy's key, or keyless against the trust
    root `root` at time `now` (which matters only where the policy opts out of the log)."""
    if policy.keyless:
        if root is None:
            return [("signature", False, no_trust_root(policy))]
        now = now or datetime.now(UTC)
        checks = [check_keyless_signature(image_digest, sig_layers, policy, root, now)]
        return checks + [check_keyless_attestation(image_digest, att_layers, policy, root, now,
                                                   kind) for kind in policy.attestations]
    assert key is not None
    # The policy `imgbuild index --sign-key` asks of each platform image is the signing key's.
    whose = "the signing key" if policy.where == SIGNING_KEY else "the policy's key"
    checks = [check_signature(image_digest, sig_layers, key, whose)]
    checks += [check_attestation(image_digest, att_layers, key, kind)
               for kind in policy.attestations]
    return checks


def key_path(policy: SignPolicy) -> str | None:
    """The file a key policy's public key is in (a relative path is from the directory of the
    file that gives the policy); None for an inline PEM or a keyless policy."""
    if policy.key is None or "-----BEGIN" in policy.key:
        return None
    p = Path(policy.key).expanduser()
    return str(p if p.is_absolute() else Path(policy.where).parent / p)


def trust_root_path(policy: SignPolicy) -> str | None:
    """The trust root file of a keyless policy (a relative path is from the directory of the
    file that gives the policy)."""
    if not policy.trust_root:
        return None
    p = Path(policy.trust_root).expanduser()
    return str(p if p.is_absolute() else Path(policy.where).parent / p)


def cosign_commands(policy: SignPolicy, key_path: str | None, ref: str, *,
                    plain_http: bool = False) -> list[str]:
    """What a user runs to check the same with cosign itself. imgbuild's key signatures carry
    no transparency-log entry (nothing leaves the machine), hence --insecure-ignore-tlog; a
    plain-HTTP registry (loopback) needs cosign's flags for it."""
    http = " --allow-insecure-registry --allow-http-registry" if plain_http else ""
    if policy.keyless:
        # The same trust root file (cosign 2.4+ reads it), and the same opt-outs.
        who = (f"--certificate-identity {policy.subject} "
               f"--certificate-oidc-issuer {policy.issuer}"
               + (f" --trusted-root {trust_root_path(policy)}" if policy.trust_root else "")
               + ("" if policy.tlog else " --insecure-ignore-tlog=true")
               + ("" if policy.sct else " --insecure-ignore-sct=true") + http)
        return [f"cosign verify {who} {ref}"] + [
            f"cosign verify-attestation --type {a} {who} {ref}" for a in policy.attestations]
    k = (key_path or "KEY.pub") + " --insecure-ignore-tlog=true" + http
    return [f"cosign verify --key {k} {ref}"] + [
        f"cosign verify-attestation --key {k} --type {a} {ref}" for a in policy.attestations]
