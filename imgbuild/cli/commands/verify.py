from __future__ import annotations

from pathlib import Path

from ...catalog.registries import SignPolicy
from ...errors import InputError
from ...image import attest, indexsign, registry
from ...image.registry import Repository
from ..args import workspace
from ..views import image as views


def run(args, out) -> int:
    if "@" in args.ref:  # REPO@sha256:…: the manifest itself, whatever tags name it
        name, _, tag = args.ref.partition("@")
    else:
        name, _, tag = args.ref.rpartition(":")
    if not name or "/" in tag:
        raise InputError(f"{args.ref}: expected HOST[:PORT]/REPO:TAG or HOST[:PORT]/REPO@DIGEST",
                         hint="e.g. 127.0.0.1:5000/imgbuild:tiny-cpu")
    repo = Repository.parse(name)
    if repo.host is None:
        raise InputError(f"{args.ref} names no registry host", hint="verify checks a registry's copy")
    ws = workspace(args)
    policy = signature_policy(args.key, ws.registries.policy_for(repo.name))
    d = registry.manifest_descriptor(repo, tag)
    if d is not None and d["mediaType"] in registry.INDEX_TYPES:
        # An index: its own signature and attestations (what `cosign verify` on the tag
        # reads), then each platform's image, with its own report, SBOM and provenance.
        digest, manifests = registry.fetch_index(repo, tag)
        own = index_checks(repo, digest, policy)
        found = {p: _verify(ws, repo, m, p, policy) for p, m in manifests.items()}
        views.index_verification(out, args.ref, digest, found, own)
        views.signature_policy(out, policy, repo.name, found.values(), index_digest=digest)
        return 0 if indexsign.verified(own, [v.ok for v in found.values()]) else 1
    first = _verify(ws, repo, tag, None, policy)
    views.verification(out, first)
    views.signature_policy(out, policy, repo.name, [first])
    return 0 if first.ok else 1


def index_checks(repo: Repository, digest: str,
                 policy: SignPolicy | None) -> list[tuple[str, bool, str]]:
    """The index's own checks: its signature and attestations under the policy ([]: none)."""
    if policy is None:
        return []
    from ...image import signstore  # imported on use: the crypto, for a policy only

    return signstore.checks(repo, digest, policy)[0]


def signature_policy(key: str | None, configured: SignPolicy | None) -> SignPolicy | None:
    """--key PUB stands for a policy of that key (both attestations asked for); else the
    registry's signed-by policy, if any."""
    if key is None:
        return configured
    return SignPolicy("--key", key=str(Path(key).expanduser().absolute()))


def _verify(ws, repo: Repository, reference: str, platform: str | None = None,
            policy: SignPolicy | None = None):
    first = attest.verify(repo, reference, policy=policy)
    # The lock the image names, where this workspace has that target: compare it too.
    target = first.labels.get("io.imgbuild.target")
    if target and target in ws.catalog.targets:
        t = ws.catalog.target(target)
        if platform is None or platform in t.platforms:
            ref = ws.target(target, platform)
            if ref.has_lock:
                first = attest.verify(repo, reference, lock=ref.lock(), policy=policy)
    return first
