"""The cluster's side of a registry's signed-by policy: an admission policy that admits, for the
images of a repository, only those signed as images/registries.yaml asks, with the attestations
it asks for, so a cluster runs only what the project's CI signed, as `imgbuild pull` does on a
host. Two admission controllers read it, the user's choice (`run --emit k8s --admission`):

- Sigstore's policy-controller: a ClusterImagePolicy (policy.sigstore.dev/v1beta1);
- Kyverno: a ClusterPolicy (kyverno.io/v1) with a verifyImages rule, for Kyverno 1.13 or later.

A keyless policy's trust root goes with it: inline in Kyverno's; for policy-controller, as a
TrustRoot (policy.sigstore.dev/v1alpha1) the ClusterImagePolicy refers to by name.

Plain data in, documents out (`imgbuild run --emit k8s` writes them beside the Deployment).
Checked in tests against each CRD's published schema (tests/fixtures/crds: sigstore/
policy-controller config/300-clusterimagepolicy.yaml and config/300-trustroot.yaml; kyverno/
kyverno config/crds/kyverno/kyverno.io_clusterpolicies.yaml)."""

from __future__ import annotations

import base64
import hashlib
import itertools
import re
import textwrap
from dataclasses import dataclass

from ..catalog.registries import ATTESTATION_TYPES, SignPolicy
from ..errors import InputError

API_VERSION = "policy.sigstore.dev/v1beta1"
# The TrustRoot kind exists in this version only (policy-controller's config/300-trustroot.yaml).
TRUST_ROOT_API_VERSION = "policy.sigstore.dev/v1alpha1"
# A trust root file's names for a log's Merkle tree hash, as policy-controller spells them
# (pkg/apis/config HashStringToHashAlgorithm: any other string it reads as unspecified).
HASH_NAMES = {"SHA2_256": "sha-256", "SHA2_384": "sha-384", "SHA2_512": "sha-512"}
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
    """What the ClusterImagePolicy of a keyless policy with a trust root refers to: the
    TrustRoot resource (policy.sigstore.dev/v1alpha1) of the same name, written beside it
    (trust_root_resource). None where it refers to nothing."""
    if not (policy.keyless and policy.trust_root):
        return None
    tlog = "" if policy.tlog else (" With tlog: false there is no ctlog entry: policy-controller "
                                   "then skips the transparency log, as imgbuild does.")
    return (f"checks keyless signatures against the policy-controller TrustRoot named {name}, "
            f"written beside it ({trust_root_file(name)}) from the trust root "
            f"{policy.trust_root}: apply both.{tlog}")


def trust_root_file(name: str) -> str:
    """The TrustRoot's file name, as the manifests are named (NAME-KIND.yaml)."""
    return f"{name}-trustroot.yaml"


def cluster_image_policy(match: str, policy: SignPolicy, public_pem: str | None) -> dict:
    """The ClusterImagePolicy for a signed-by policy: its key (inline PEM), or its keyless
    identity (checked by policy-controller against the policy's trust root, by reference to a
    TrustRoot resource: trust_root_resource; without one, against Sigstore's public root, which
    policy-controller fetches), and one attestation entry per predicate type required."""
    name = policy_name(match)
    if policy.keyless:
        keyless: dict = {"identities": [{"issuer": policy.issuer, "subject": policy.subject}]}
        if policy.trust_root:
            # The same trust root as the hosts', as a policy-controller TrustRoot resource of
            # this name, written beside this policy (trust_root_resource).
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


@dataclass(frozen=True)
class TrustedCA:
    """A certificate authority (Fulcio) of a keyless policy's trust root, as plain text."""

    organization: str  # its subject, as the trust root names it (else its root certificate)
    common_name: str
    uri: str
    chain: tuple[str, ...]  # PEM certificates: the issuer of a leaf first, the root last


@dataclass(frozen=True)
class TrustedLog:
    """A transparency log (Rekor) or certificate-transparency log of a trust root."""

    base_url: str
    hash_algorithm: str  # as the trust root file names it: SHA2_256
    public_pem: str  # SubjectPublicKeyInfo, PEM
    ecdsa: bool
    end: str | None  # the end of its validity window in the trust root (RFC 3339); None: open


@dataclass(frozen=True)
class TrustData:
    """A keyless policy's trust root file (a Sigstore trusted_root.json), as plain text, in its
    order: what an admission policy needs of it."""

    source: str  # the file, for messages
    cas: tuple[TrustedCA, ...]
    tlogs: tuple[TrustedLog, ...]
    ctlogs: tuple[TrustedLog, ...]


def inline_of(trust: TrustData) -> InlineTrust:
    """The trust root as Kyverno's keyless attestor carries it: every CA certificate once, and
    the log keys with no end to their validity (the ones that sign new entries)."""
    return InlineTrust(
        roots="".join(dict.fromkeys(pem for ca in trust.cas for pem in ca.chain)),
        rekor=tuple((t.base_url, t.public_pem) for t in trust.tlogs if t.end is None),
        ctlog=tuple(t.public_pem for t in trust.ctlogs if t.end is None))


def _left_out(log: TrustedLog, rekor: bool) -> str | None:
    """Why a log key of the trust root is not in its TrustRoot; None where it is. A TrustRoot
    (v1alpha1) has no validity window: policy-controller takes each key as valid at any time,
    so a key whose window ends would be trusted past its end (the Kyverno policy leaves the
    same ones out)."""
    if log.end is not None:
        return f"its validity in the trust root ends ({log.end})"
    if rekor and not log.ecdsa:
        # policy-controller's reconciler fails the whole TrustRoot on such a key (cosign needs
        # an ecdsa.PublicKey for Rekor), which would leave every image refused.
        return "not an ECDSA key, which policy-controller requires of a Rekor key"
    return None


def trust_root_left_out(trust: TrustData) -> list[str]:
    """The trust root's log keys its TrustRoot does not carry, each with why."""
    return [f"{what} {t.base_url}: {why}"
            for what, logs in (("Rekor", trust.tlogs), ("CT log", trust.ctlogs))
            for t in logs if (why := _left_out(t, what == "Rekor")) is not None]


def _b64(text: str) -> str:
    # policy-controller's certChain and publicKey are Go []byte fields: JSON (and so YAML)
    # carries them base64-encoded, and they decode to PEM.
    return base64.b64encode(text.encode()).decode()


def _missing(trust: TrustData) -> list[str]:
    """The fields of the trust root policy-controller's TrustRoot webhook requires and the file
    leaves empty (trustroot_validation.go: a CA's subject organization and commonName and its
    uri; a log's baseURL)."""
    out = [f"certificateAuthorities[{i}] has no {field}"
           for i, ca in enumerate(trust.cas)
           for field, value in (("subject.organization", ca.organization),
                                ("subject.commonName", ca.common_name), ("uri", ca.uri))
           if not value]
    out += [f"{what}[{i}] has no baseUrl" for what, logs in (("tlogs", trust.tlogs),
                                                           ("ctlogs", trust.ctlogs))
            for i, t in enumerate(logs) if not t.base_url]
    return out


def trust_root_resource(name: str, trust: TrustData) -> dict:
    """The policy-controller TrustRoot (policy.sigstore.dev/v1alpha1) the ClusterImagePolicy
    `name` refers to: the trust root as spec.sigstoreKeys, so the cluster checks against the
    hosts' trust root with nothing fetched. Every CA, its chain as PEM (the root last); the
    log keys _left_out does not leave out, as PEM. policy-controller derives each log's ID from
    its key (the SHA-256 of its DER), as the trust root's logId is. Validity windows have no
    field here (policy-controller gives every entry an open one): see _left_out.

    Refused (exit 2) where the file leaves empty a field policy-controller's webhook requires:
    the TrustRoot would not apply, and the ClusterImagePolicy would then refuse every image."""
    if missing := _missing(trust):
        raise InputError(
            f"the trust root {trust.source} cannot be written as a policy-controller TrustRoot",
            facts=[*missing, "policy-controller refuses a TrustRoot without them"],
            hint="give each CA of the trust root file its subject and uri and each log its "
                 "baseUrl (Sigstore's public trust root has them), or pass --admission kyverno, "
                 "whose policy carries the trust root without them")

    def logs(entries: tuple[TrustedLog, ...], rekor: bool) -> list[dict]:
        return [{"baseURL": t.base_url,
                 # The trust root's own name where policy-controller knows none: every log
                 # Sigstore runs hashes with SHA-256, and the offline checks read only the key.
                 "hashAlgorithm": HASH_NAMES.get(t.hash_algorithm, "sha-256"),
                 "publicKey": _b64(t.public_pem)}
                for t in entries if _left_out(t, rekor) is None]

    keys: dict = {"certificateAuthorities": [
        {"subject": {"organization": ca.organization, "commonName": ca.common_name},
         "uri": ca.uri, "certChain": _b64("".join(ca.chain))} for ca in trust.cas]}
    # Both lists are optional in the CRD (omitempty): an empty one is left out, as Go writes it.
    if tlogs := logs(trust.tlogs, rekor=True):
        keys["tLogs"] = tlogs
    if ctlogs := logs(trust.ctlogs, rekor=False):
        keys["ctLogs"] = ctlogs
    return {"apiVersion": TRUST_ROOT_API_VERSION, "kind": "TrustRoot",
            "metadata": {"name": name}, "spec": {"sigstoreKeys": keys}}


def trust_root_header(policy: SignPolicy, name: str, trust: TrustData) -> str:
    """The comment at the top of the written TrustRoot: where it came from, what refers to it,
    and what of the trust root it does not carry."""
    said = (f"The trust root {policy.trust_root} as a policy-controller TrustRoot: the "
            f"ClusterImagePolicy {name} checks keyless signatures against it (trustRootRef); "
            "apply both. TrustRoot has no validity windows (policy-controller takes every "
            "entry as valid at any time): the CAs are all here, each certificate's own "
            "validity still checked; a log key whose window ends is not.")
    left = trust_root_left_out(trust)
    if left:
        said += " Left out: " + "; ".join(left) + "."
    return (f"# Generated by imgbuild from the signed-by policy of {policy.where}.\n"
            + "".join(f"# {line}\n" for line in textwrap.wrap(said, 90, break_on_hyphens=False)))


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
    resource by name instead (trust_root_resource)."""
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
