"""The cluster's side of a registry's signed-by policy: an admission policy that admits, for the
images of a repository, only those signed as images/registries.yaml asks, with the attestations
it asks for, so a cluster runs only what the project's CI signed, as `imgbuild pull` does on a
host. Two admission controllers read it, the user's choice (`run --emit k8s --admission`):

- Sigstore's policy-controller: a ClusterImagePolicy (policy.sigstore.dev/v1beta1);
- Kyverno: a ClusterPolicy (kyverno.io/v1) with a verifyImages rule, for Kyverno 1.13 or later.

Plain data in, a document out (`imgbuild run --emit k8s` writes it beside the Deployment).
Checked in tests against each CRD's published schema (tests/fixtures/crds: sigstore/
policy-controller config/300-clusterimagepolicy.yaml; kyverno/kyverno
config/crds/kyverno/kyverno.io_clusterpolicies.yaml)."""

from __future__ import annotations

import hashlib
import itertools
import re
from dataclasses import dataclass

from ..catalog.registries import ATTESTATION_TYPES, SignPolicy

API_VERSION = "policy.sigstore.dev/v1beta1"
KYVERNO_API_VERSION = "kyverno.io/v1"
# The admission controllers a policy can be written for; the first is the default.
ADMISSION = ("policy-controller", "kyverno")
# Sigstore's public transparency log: where a keyless signature's entry is looked up.
PUBLIC_REKOR = "https://rekor.sigstore.dev"
# Kyverno's default registry (its ConfigMap's defaultRegistry): the one it puts before an image
# named without a registry, before matching imageReferences.
KYVERNO_DEFAULT_REGISTRY = "docker.io"


def policy_name(match: str) -> str:
    """The policy's metadata.name: readable, a DNS label, and one per repository (the hash
    tells apart two repositories the slug makes alike)."""
    slug = re.sub(r"[^a-z0-9-]+", "-", match.lower()).strip("-")[:40].strip("-")
    return f"imgbuild-{slug}-{hashlib.sha256(match.encode()).hexdigest()[:8]}"


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
    name = policy_name(match)
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
            "metadata": {"name": policy_name(match)},
            "spec": {"images": [{"glob": g} for g in globs(match)],
                     "authorities": [authority]}}


def kyverno_name(repository: str) -> str:
    """A repository as Kyverno spells it when it matches imageReferences: an image named
    without a registry (`acme/serving`, the Docker Hub shorthand) gets Kyverno's default
    registry first (its addDefaultRegistry), so a pattern without it would match nothing, and
    an unsigned image would be admitted."""
    first, slash, _ = repository.partition("/")
    if not slash or (not any(c in first for c in ".:") and first != "localhost"
                     and first == first.lower()):
        return f"{KYVERNO_DEFAULT_REGISTRY}/{repository}"
    return repository


def image_references(match: str) -> list[str]:
    """Kyverno imageReferences for the images of `match`, as Kyverno matches them: against
    `REGISTRY/PATH:TAG`, or `REGISTRY/PATH@DIGEST` when the image has a digest (its tag is then
    dropped), with `*` any run of characters, `/` included, and `?` any one. So `REPO*` would
    also take a sibling (`REPO-other`); these take tagged, pinned, and below it."""
    m = kyverno_name(match.rstrip("/"))
    return [f"{m}:*", f"{m}@*", f"{m}/*"]


@dataclass(frozen=True)
class InlineTrust:
    """A keyless policy's trust root as PEM text, for an admission policy that carries it
    inline (Kyverno's keyless attestor has no reference to a trust-root resource): the Fulcio
    CAs' certificates, and the public keys of the transparency logs (Rekor) and of the
    certificate-transparency logs current now (their validity has no end)."""

    roots: str  # every certificate of every CA's chain, PEM, concatenated
    rekor: tuple[tuple[str, str], ...]  # (base URL, public key PEM)
    ctlog: tuple[str, ...]  # public key PEM


def _keyless_attestors(policy: SignPolicy, trust: InlineTrust | None) -> list[dict]:
    """Kyverno keyless attestor entries for a policy: against Sigstore's public roots where the
    policy names no trust root; against its own (inline) where it does, one entry per
    combination of current Rekor and CT-log keys, since Kyverno takes one key of each per
    entry (the attestor set then needs any one of them: count 1)."""
    who = {"subject": policy.subject, "issuer": policy.issuer}
    if trust is None:
        # Checked against Sigstore's public roots: the Fulcio chain, the certificate's SCT in
        # the public CT log, and the signature's entry in the public Rekor.
        return [{"keyless": {**who, "rekor": {"url": PUBLIC_REKOR}}}]
    rekors: list[dict] = ([{"url": url, "pubkey": pem} for url, pem in trust.rekor]
                          if policy.tlog else [{"ignoreTlog": True}])
    ctlogs: list[dict] = ([{"pubkey": pem} for pem in trust.ctlog]
                          if policy.sct else [{"ignoreSCT": True}])
    # A trust root without a current key of a log the policy requires gives no entry: Kyverno
    # then admits nothing, which is what the hosts' check does with that trust root.
    return [{"keyless": {**who, "roots": trust.roots, "rekor": r, "ctlog": c}}
            for r, c in itertools.product(rekors, ctlogs)]


def kyverno_cluster_policy(match: str, policy: SignPolicy, public_pem: str | None,
                           trust: InlineTrust | None = None) -> dict:
    """The Kyverno ClusterPolicy for a signed-by policy: one verifyImages rule on Pods (and,
    by Kyverno's autogen, on the controllers that make Pods: Deployment, StatefulSet, DaemonSet,
    Job, CronJob, ReplicaSet, ReplicationController), whose attestor is the policy's key (inline
    PEM) or its keyless identity, with one attestation entry per predicate type the policy
    requires, each signed by the same attestor.

    Only fields Kyverno 1.13 and later read, none the v1 schema marks deprecated. Enforcing is
    the rule's own `failureAction: Enforce` (1.13+); the policy-wide
    `spec.validationFailureAction` is deprecated, and not written. An older Kyverno prunes the
    field it does not know, falls back to Audit, and refuses the policy at apply (its own check:
    mutateDigest needs Enforce), so it never runs as a mere audit."""
    if policy.keyless:
        entries = _keyless_attestors(policy, trust)
        attestors: list[dict] = [{"count": 1, "entries": entries} if len(entries) > 1
                                 else {"entries": entries}]
    else:
        assert public_pem is not None
        # imgbuild's key signatures have no transparency-log entry and no certificate: look for
        # neither (as `cosign verify --insecure-ignore-tlog`); the key alone decides.
        attestors = [{"entries": [{"keys": {"publicKeys": public_pem,
                                            "rekor": {"ignoreTlog": True},
                                            "ctlog": {"ignoreSCT": True}}}]}]
    verify: dict = {
        "imageReferences": image_references(match),
        # imgbuild signs in cosign's format (signatures and attestations under the digest's
        # sha256-<hex>.sig / .att tags), not as Sigstore bundles.
        "type": "Cosign",
        "failureAction": "Enforce",
        # The defaults, written because they are the point of the rule: the tag is replaced by
        # the digest that was verified, so the node pulls exactly those bytes (a tag moved after
        # admission changes nothing); an image that reaches the node must name a digest; and
        # an image that matched must have passed the check (no way round it by an update).
        "mutateDigest": True,
        "verifyDigest": True,
        "required": True,
        "attestors": attestors,
    }
    if policy.attestations:
        verify["attestations"] = [{"type": ATTESTATION_TYPES[kind], "attestors": attestors}
                                  for kind in policy.attestations]
    return {"apiVersion": KYVERNO_API_VERSION, "kind": "ClusterPolicy",
            "metadata": {"name": policy_name(match)},
            "spec": {
                # Admission only: a background scan would re-verify every running Pod against
                # the registry on each cycle, and could only report.
                "background": False,
                # A Kyverno that does not answer refuses the Pod, not admits it unchecked; a
                # signature and two attestations are three registry round trips, so the
                # webhook gets the most time Kubernetes allows (default 10 s).
                "webhookConfiguration": {"failurePolicy": "Fail", "timeoutSeconds": 30},
                "rules": [{"name": "signed-by",
                           # Pods alone, so that Kyverno's autogen adds the Pod controllers.
                           "match": {"any": [{"resources": {"kinds": ["Pod"]}}]},
                           "verifyImages": [verify]}]}}


def admission_policy(admission: str, match: str, policy: SignPolicy,
                     public_pem: str | None, trust: InlineTrust | None = None) -> dict:
    """The policy for the admission controller the user chose (one of ADMISSION). A keyless
    policy's trust root goes inline into Kyverno's; policy-controller's refers to a TrustRoot
    resource by name instead (trust_root_note)."""
    if admission == "kyverno":
        return kyverno_cluster_policy(match, policy, public_pem, trust)
    return cluster_image_policy(match, policy, public_pem)


def admission_header(admission: str, policy: SignPolicy) -> str:
    """The comment at the top of the written policy: where it came from, what the cluster must
    run for it to take effect."""
    head = f"# Generated by imgbuild from the signed-by policy of {policy.where}.\n"
    if admission == "kyverno":
        return head + (
            "# Needs Kyverno 1.13 or later in the cluster (an older one refuses this policy at\n"
            "# apply). A Pod, or a Deployment, StatefulSet, Job or other Pod controller, whose\n"
            "# image the policy does not accept is refused at admission; an accepted image is\n"
            "# pinned to the digest that was verified.\n")
    return head + (
        "# Needs Sigstore's policy-controller in the cluster, and the namespace labelled\n"
        "# policy.sigstore.dev/include=true: then a pod whose image the policy does not\n"
        "# accept is refused at admission.\n")
