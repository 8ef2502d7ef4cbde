"""The cluster's side of a registry's signed-by policy: a Sigstore policy-controller
ClusterImagePolicy (policy.sigstore.dev/v1beta1) that admits, for the images of a repository,
only those signed as images/registries.yaml asks, with the attestations it asks for, so a
cluster runs only what the project's CI signed, as `imgbuild pull` does on a host.

Plain data in, a document out (`imgbuild run --emit k8s` writes it beside the Deployment).
Checked in tests against the CRD's published schema (sigstore/policy-controller
config/300-clusterimagepolicy.yaml)."""

from __future__ import annotations

import hashlib
import re

from ..catalog.registries import ATTESTATION_TYPES, SignPolicy

API_VERSION = "policy.sigstore.dev/v1beta1"


def globs(match: str) -> list[str]:
    """policy-controller globs for the images of `match` (a repository, or a prefix of one),
    as its glob matcher reads a full reference: `*` stops at `/`, `**` does not. Tagged,
    pinned, and below it; not a sibling whose name only starts the same."""
    m = match.rstrip("/")
    return [f"{m}:*", f"{m}@*", f"{m}/**"]


def trust_root_note(policy: SignPolicy, name: str) -> str | None:
    """What the cluster needs beside the ClusterImagePolicy of a keyless policy with a trust
    root: a TrustRoot resource (policy.sigstore.dev/v1alpha1) of the same name holding it,
    which imgbuild does not write. None where nothing more is needed."""
    if not (policy.keyless and policy.trust_root):
        return None
    tlog = "" if policy.tlog else (" With tlog: false there is no ctlog entry: policy-controller "
                                   "then skips the transparency log, as imgbuild does.")
    return (f"needs a policy-controller TrustRoot named {name} holding the trust root "
            f"{policy.trust_root} (spec.sigstoreKeys, or spec.repository for a TUF mirror); "
            f"imgbuild does not write it.{tlog}")


def cluster_image_policy(match: str, policy: SignPolicy, public_pem: str | None) -> dict:
    """The ClusterImagePolicy for a signed-by policy: its key (inline PEM), or its keyless
    identity (checked by policy-controller against the policy's trust root, by reference to a
    TrustRoot resource: trust_root_note; without one, against Sigstore's public root, which
    policy-controller fetches), and one attestation entry per predicate type required."""
    slug = re.sub(r"[^a-z0-9-]+", "-", match.lower()).strip("-")[:40].strip("-")
    name = f"imgbuild-{slug}-{hashlib.sha256(match.encode()).hexdigest()[:8]}"
    if policy.keyless:
        keyless: dict = {"identities": [{"issuer": policy.issuer, "subject": policy.subject}]}
        if policy.trust_root:
            # The same trust root as the hosts', as a policy-controller TrustRoot resource of
            # this name (the cluster's operator makes it from the file: trust_root_note).
            keyless["trustRootRef"] = name
        if not policy.sct:
            keyless["insecureIgnoreSCT"] = True
        authority: dict = {"name": "ci-keyless", "keyless": keyless}
        if policy.trust_root and policy.tlog:
            # With a trustRootRef, policy-controller checks the Rekor entry only where the
            # authority names a ctlog (Rekor, in its words) from the same TrustRoot.
            authority["ctlog"] = {"trustRootRef": name}
    else:
        assert public_pem is not None
        # No ctlog: imgbuild's key signatures have no transparency-log entry, and an authority
        # without one is checked offline (as `cosign verify --insecure-ignore-tlog`).
        authority = {"name": "ci-key", "key": {"data": public_pem, "hashAlgorithm": "sha256"}}
    if policy.attestations:
        authority["attestations"] = [{"name": kind, "predicateType": ATTESTATION_TYPES[kind]}
                                     for kind in policy.attestations]
    return {"apiVersion": API_VERSION, "kind": "ClusterImagePolicy",
            "metadata": {"name": name},
            "spec": {"images": [{"glob": g} for g in globs(match)],
                     "authorities": [authority]}}
