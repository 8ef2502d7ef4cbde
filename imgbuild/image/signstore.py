"""Signatures and signed attestations in a registry, in cosign's layout (image/cosign.py
decides; this reads and writes): sign an image and attest its SBOM and provenance after its
smoke gate, check an image against its registry's policy before a layer of it is pulled."""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from pathlib import Path

from ..catalog.registries import ATTESTATION_TYPES, SignPolicy
from ..errors import InputError, JobFailed
from . import cosign, cosigncli, keyless, registry
from .cosigncli import KMS_SCHEMES

MAX_LAYERS = 64  # signatures or attestations read per image: a tag that holds more is odd
MAX_BLOB = 64 << 20  # a payload or envelope larger than this is not read (an SBOM is ~100 kB)


def load_signing_key(spec: str, env: Mapping[str, str] | None = None) -> cosign.SigningKey:
    """The private key `--sign-key` / IMGBUILD_SIGN_KEY names: a PEM file, or `env://VAR` (a
    variable holding the PEM, as cosign's --key takes it); an encrypted cosign key is opened
    with COSIGN_PASSWORD. Anything wrong is exit 2, before anything is built or pushed."""
    env = os.environ if env is None else env
    fix = ("make one with `cosign generate-key-pair` (its cosign.key, with COSIGN_PASSWORD set "
           "to its password), then pass --sign-key cosign.key or --sign-key env://VAR")
    if spec.startswith(KMS_SCHEMES):  # the build hands these to cosign (image/cosigncli.py)
        raise InputError(f"{spec}: a KMS key is no key file imgbuild can open",
                         facts=["a KMS key signs only through its provider's API, which "
                                "cosign calls (`--sign-key` in a build does)"], hint=fix)
    if spec.startswith("env://"):
        var = spec[len("env://"):]
        pem, source = env.get(var, "").encode(), f"${var}"
        if not pem.strip():
            raise InputError(f"--sign-key {spec}: ${var} is empty or not set", hint=fix)
    else:
        path = Path(spec).expanduser()
        source = str(path)
        try:
            pem = path.read_bytes()
        except OSError as e:
            raise InputError(f"cannot read the signing key {path}",
                             facts=[f"{type(e).__name__}: {e.strerror or e}"], hint=fix) from None
    password = env.get("COSIGN_PASSWORD")
    try:
        return cosign.load_private_key(pem, password.encode() if password is not None else None,
                                       source)
    except cosign.KeyProblem as e:
        raise InputError(f"the signing key {source} cannot be used", facts=[str(e)],
                         hint="set COSIGN_PASSWORD to the key's password (`cosign "
                              "generate-key-pair` asked for it)" if "password" in str(e).lower()
                         else fix) from None


def policy_key(policy: SignPolicy) -> tuple[object, str | None]:
    """(public key, its path or None where inline) of a key policy; exit 2 where unusable."""
    assert policy.key is not None
    path = cosign.key_path(policy)
    if path is None:
        pem = policy.key.encode()
    else:
        try:
            pem = Path(path).read_bytes()
        except OSError as e:
            raise InputError(f"{policy.where}: signed-by.key: cannot read {path}",
                             facts=[f"{type(e).__name__}: {e.strerror or e}"],
                             hint="give the public key's path (from the directory of "
                                  f"{Path(policy.where).name}, or absolute) or its PEM "
                                  "(`cosign public-key --key cosign.key`)") from None
    try:
        return cosign.load_public_key(pem), path
    except cosign.KeyProblem as e:
        raise InputError(f"{policy.where}: signed-by.key: {path or 'the inline PEM'} cannot be "
                         "used", facts=[str(e)],
                         hint="the key cosign.pub `cosign generate-key-pair` wrote") from None


def fetch_layers(repo: registry.Repository, tag: str) -> list[cosign.Layer] | None:
    """The layers of the `.sig` / `.att` manifest under `tag`, each blob checked against its
    digest; None where the registry holds no such tag."""
    got = registry.get_manifest(repo, tag)
    if got is None:
        return None
    _, doc = got
    out = []
    for d in (doc.get("layers") or [])[:MAX_LAYERS]:
        if not isinstance(d, dict) or not 0 <= int(d.get("size") or 0) <= MAX_BLOB:
            continue
        out.append(cosign.Layer(str(d.get("mediaType")), dict(d.get("annotations") or {}),
                                registry.get_blob(repo, str(d.get("digest")))))
    return out


def _put(repo: registry.Repository, tag: str, layers: list[cosign.Layer]) -> str:
    """PUT a `.sig`/`.att` manifest, its blobs uploaded first (the registry holds every part
    before the manifest names it)."""
    manifest, config = cosign.manifest_parts(layers)
    registry.put_blob(repo, config)
    for la in layers:
        registry.put_blob(repo, la.blob)
    r = repo.api.request("PUT", f"{repo.path}/manifests/{tag}", scope=repo.scope("pull", "push"),
                         data=manifest, headers={"Content-Type": registry.OCI_MANIFEST_TYPE})
    registry.expect(r, (200, 201), repo, f"manifest {tag}")
    return tag


def sign(repo: registry.Repository, image_digest: str, key: cosign.SigningKey,
         predicates: Mapping[str, dict]) -> list[str]:
    """Sign image_digest and attest each predicate ({predicate type: predicate}) with `key`,
    cosign's way; what the registry holds under `.sig`/`.att` is kept (other signers' too) and
    nothing is added where this key's is there already. The tags written, `.sig` first.

    The attestations are written first and the signature last: a signing cut short leaves no
    signature over a digest whose attestations are missing (a `.att` alone is what a second
    run completes), so whoever checks the signature alone never accepts a half-signed image."""
    pub = key.key.public_key()
    written = []
    held = fetch_layers(repo, cosign.att_tag(image_digest)) or []
    added = False
    for ptype, predicate in predicates.items():
        kind = next(k for k, v in cosign.ATTESTATION_TYPES.items() if v == ptype)
        stmt = cosign.statement(repo.name, image_digest, ptype, predicate)
        more = cosign.merged(held, cosign.attestation_layer(key, stmt),
                             lambda la, kind=kind: cosign.check_attestation(
                                 image_digest, [la], pub, kind)[1])
        if more is not None:
            held, added = more, True
    if added:
        written.append(_put(repo, cosign.att_tag(image_digest), held))
    sigs = fetch_layers(repo, cosign.sig_tag(image_digest)) or []
    layers = cosign.merged(sigs, cosign.signature_layer(key, repo.name, image_digest),
                           lambda la: cosign.check_signature(image_digest, [la], pub)[1])
    if layers is not None:
        written.insert(0, _put(repo, cosign.sig_tag(image_digest), layers))
    return written


def sign_as(repo: registry.Repository, digest: str,
            signer: cosign.SigningKey | cosigncli.Delegated,
            predicates: Mapping[str, dict]) -> tuple[list[str], dict]:
    """Sign `digest` and attest each predicate ({predicate type: predicate}): with a key here,
    or through cosign (keyless, a KMS key). (The tags written, who signed: for keyless, the
    identity of the certificate read back from the registry, not the one the job meant to
    have.) An image and an index are signed alike."""
    if not isinstance(signer, cosigncli.Delegated):
        return sign(repo, digest, signer, predicates), {"method": "key", "key": signer.source}
    kinds = {ptype: kind for kind, ptype in ATTESTATION_TYPES.items()}
    cosigncli.sign(signer, f"{repo.name}@{digest}",
                   {kinds[t]: p for t, p in predicates.items()}, plain_http=repo.plain_http,
                   cacert=registry.ca_file(repo))
    tags = [cosign.sig_tag(digest)] + ([cosign.att_tag(digest)] if predicates else [])
    if signer.key is not None:
        return tags, {"method": "kms", "key": signer.key}
    who = keyless_identity(repo, digest)
    if who is None:
        raise JobFailed(f"cosign signed {repo.name}@{digest[:19]}… keyless, and the registry "
                        "holds no certificate-bearing signature of it under "
                        f"{cosign.sig_tag(digest)}; no tag moved",
                        facts=[f"cosign: {signer.cosign}", "imgbuild reads the `.sig` tags "
                               "cosign 2 writes; cosign 3 writes Sigstore bundles as OCI "
                               "referrers"],
                        hint="sign with cosign 2.x (sigstore/cosign-installer: cosign-release "
                             "v2.5.0, or IMGBUILD_COSIGN)")
    return tags, {"method": "keyless", "subject": who.subject, "issuer": who.issuer}


def kms_public_key(signer: cosigncli.Delegated) -> tuple[object, bytes]:
    """(public key, its PEM) of a KMS signer, as `cosign public-key` reads it from the
    provider; exit 2 where the answer is no usable key (checked before anything is written)."""
    pem = cosigncli.public_key_pem(signer)
    try:
        return cosign.load_public_key(pem), pem
    except cosign.KeyProblem as e:
        raise InputError(f"cosign public-key --key {signer.key} gave no usable key",
                         facts=[str(e), "nothing was written and no tag was moved"],
                         hint="check the KMS key reference") from None


def keyless_identity(repo: registry.Repository, image_digest: str) -> keyless.Identity | None:
    """Who signed image_digest keyless, read back from the registry: the certificate of the
    last signature under its `.sig` tag whose payload names this very image (cosign appends
    its layer; a re-sign by another identity comes after). None where none carries one."""
    found = None
    for la in fetch_layers(repo, cosign.sig_tag(image_digest)) or []:
        try:
            named = json.loads(la.blob)["critical"]["image"]["docker-manifest-digest"]
        except (ValueError, KeyError, TypeError):
            continue
        who = keyless.leaf_identity(la.annotations) if named == image_digest else None
        found = who or found
    return found


def policy_trust_root(policy: SignPolicy) -> keyless.TrustRoot:
    """The trust root file a keyless policy names, read; exit 2 where it names none or the
    file cannot be used (nothing could be checked: the policy is incomplete, not the image)."""
    fix_file = ("name a Sigstore trusted_root.json in signed-by.keyless.trust-root (a path from "
                f"the directory of {Path(policy.where).name}, or absolute): Sigstore's public "
                "one is the trusted_root.json target of its TUF repository, which `cosign "
                "initialize` caches under ~/.sigstore/root/; a private Fulcio's is made with "
                "`cosign trusted-root create`")
    path = cosign.trust_root_path(policy)
    if path is None:
        raise InputError(f"{policy.where}: signed-by.keyless has no trust-root",
                         facts=[cosign.no_trust_root(policy),
                                "Sigstore's public trust root is fetched over the network "
                                "(TUF), which imgbuild does not do"], hint=fix_file)
    try:
        data = Path(path).read_bytes()
    except OSError as e:
        raise InputError(f"{policy.where}: signed-by.keyless.trust-root: cannot read {path}",
                         facts=[f"{type(e).__name__}: {e.strerror or e}"],
                         hint=fix_file) from None
    try:
        return keyless.load_trust_root(data, path)
    except keyless.TrustRootProblem as e:
        raise InputError(f"{policy.where}: signed-by.keyless.trust-root: {path} cannot be used",
                         facts=[str(e)], hint=fix_file) from None


def checks(repo: registry.Repository, image_digest: str,
           policy: SignPolicy) -> tuple[list[cosign.Check], str | None]:
    """(the policy's checks of image_digest, the public key's path) from what the registry
    holds; no layer of the image is read."""
    if policy.keyless:
        root = policy_trust_root(policy)
        key, path = None, None
    else:
        root = None
        key, path = policy_key(policy)
    sigs = fetch_layers(repo, cosign.sig_tag(image_digest))
    atts = fetch_layers(repo, cosign.att_tag(image_digest)) if policy.attestations else None
    return cosign.judge(policy, image_digest, sigs, atts, key, root), path  # type: ignore[arg-type]


def enforce(repo: registry.Repository, image_digest: str, policy: SignPolicy | None,
            ref: str, *, what: str = "",
            sign_with: str = "`imgbuild TARGET --push --sign-key KEY`") -> list[cosign.Check]:
    """Refuse (exit 1) an image its registry's policy does not accept, before anything of it
    is downloaded; [] where no policy applies. `what` names it in the message ("the index "
    for a multi-platform tag's index), `sign_with` the command that signs it."""
    if policy is None:
        return []
    found, path = checks(repo, image_digest, policy)
    bad = [(c, d) for c, ok, d in found if not ok]
    if bad:
        pinned = f"{repo.name}@{image_digest}"
        raise JobFailed(
            f"{what}{pinned} is not signed as {policy.where} asks; nothing was pulled",
            facts=[f"{ref} names {image_digest}",
                   ("policy: " + (f"signed by the key {path or '(inline PEM)'}" if not
                                  policy.keyless else f"keyless, {policy.subject} (issuer "
                                  f"{policy.issuer}), trust root "
                                  f"{cosign.trust_root_path(policy)}")
                    + (", attestations " + ", ".join(policy.attestations)
                       if policy.attestations else "")),
                   *[f"{c}: {d}" for c, d in bad]],
            hint=f"pull {'an index' if what else 'an image'} the project's CI signed, or sign "
                 "this one " + (f"with the policy's key ({sign_with})" if not policy.keyless else
                                f"as {policy.subject} (`--sign-key keyless` in that workflow)")
                 + "; cosign checks the same: "
                 + cosign.cosign_commands(policy, path, pinned, plain_http=repo.plain_http)[0])
    return found

