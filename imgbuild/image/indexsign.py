"""A multi-platform target's OCI image index, signed in cosign's format: what it is attested
with and when it may be signed, decided on plain data (pipeline/index.py reads and writes).

`cosign verify --key K REPO:TAG` on a multi-arch tag checks the signature of the digest the tag
names, the index's, and never looks into it (cosign has no recursive verify); so the index is
signed as its platform images are, under `sha256-<index hex>.sig`.

What the index carries besides its signature, decided here: the same two attestation types as
each platform image, about the index's own digest. cosign 2.5's `verify-attestation` takes no
`--platform` (sigstore/cosign#3552, #2356): on a multi-arch tag it reads the index digest's
`.att` and nothing else, and so do the sigstore policy-controller and Kyverno when a pod names
the tag. An index with no attestations would fail every `signed-by` policy that asks for them,
in imgbuild, in cosign and in the cluster (`run --emit k8s` writes those policies). Their
content is what is true of an index and no more:

- cyclonedx: the index's own bill of materials: its components are the platform images (a
  `container` each, by digest and platform), not their packages; each image's full SBOM is the
  one attested on that image's digest (`cosign verify-attestation --type cyclonedx REPO@<image
  digest>`). A union of the platforms' packages would say that an amd64 host runs aarch64
  wheels.
- slsaprovenance1: how the index was made: `imgbuild index` from exactly these platform
  manifests (its resolved dependencies, by digest), for this target and content key.

Both are deterministic (the same index gives the same statements), like the index itself.

An index is signed only over platform images that are themselves signed by the same key
(`platform_policy`): a signature on the index vouches for every image it lists by digest, and
cosign on the multi-arch tag would pass while the image a node pulls was never vouched for (one
whose smoke test failed or was forced, or one pushed by someone without the key). Under a
`signed-by` policy each platform image must pass the whole policy (its attestations too), the
same check `pull` makes of it later."""

from __future__ import annotations

import hashlib
from collections.abc import Sequence

from ..catalog.registries import ATTESTATION_TYPES, SIGNING_KEY, SignPolicy

INDEX_BUILD_TYPE = "https://github.com/imgbuild/imgbuild/index/v1"

Check = tuple[str, bool, str]


def _hex(digest: str) -> str:
    return digest.split(":", 1)[1]


def _uuid_of(digest: str) -> str:
    h = hashlib.sha256(digest.encode()).hexdigest()
    return f"{h[:8]}-{h[8:12]}-5{h[13:16]}-8{h[17:20]}-{h[20:32]}"


def _purl(repository: str, digest: str, platform: str) -> str:
    """The package URL of an OCI image by digest (purl-spec's `oci` type): its last path part
    as name, the repository it is in as repository_url."""
    os_, _, arch = platform.partition("/")
    name = repository.rsplit("/", 1)[-1].lower()
    return (f"pkg:oci/{name}@sha256%3A{_hex(digest)}?arch={arch}&os={os_}"
            f"&repository_url={repository}")


def index_sbom(repository: str, index_digest: str, content_tag: str, content_key: str,
               manifests: Sequence[tuple[str, str]], tool_version: str) -> dict:
    """The CycloneDX 1.5 document the index is attested with: the index, and its platform
    images as its components (their packages are in each image's own SBOM)."""
    comps = [{"type": "container", "name": repository, "version": digest, "bom-ref": digest,
              "purl": _purl(repository, digest, platform),
              "hashes": [{"alg": "SHA-256", "content": _hex(digest)}],
              "properties": [{"name": "io.imgbuild.platform", "value": platform},
                             {"name": "io.imgbuild.sbom",
                              "value": "attested on this image's digest"}]}
             for platform, digest in manifests]
    return {
        "bomFormat": "CycloneDX", "specVersion": "1.5", "version": 1,
        # The same index has the same SBOM: its serial number comes from its digest.
        "serialNumber": "urn:uuid:" + _uuid_of(index_digest),
        "metadata": {
            "tools": {"components": [{"type": "application", "name": "imgbuild",
                                      "version": tool_version}]},
            "component": {"type": "container", "name": repository, "version": content_tag,
                          "bom-ref": index_digest,
                          "properties": [{"name": "io.imgbuild.content-key",
                                          "value": content_key},
                                         {"name": "io.imgbuild.kind",
                                          "value": "OCI image index"}]}},
        "components": comps,
        "dependencies": [{"ref": index_digest, "dependsOn": [d for _, d in manifests]}],
    }


def index_provenance(repository: str, target: str, model: str | None, content_key: str,
                     manifests: Sequence[tuple[str, str]], tool_version: str,
                     commit: str | None) -> dict:
    """The SLSA v1 provenance predicate the index is attested with: assembled by `imgbuild
    index` from exactly these platform manifests."""
    return {
        "buildDefinition": {
            "buildType": INDEX_BUILD_TYPE,
            "externalParameters": {"target": target, "model": model,
                                   "content_key": content_key,
                                   "platforms": [p for p, _ in manifests]},
            "resolvedDependencies": [{"uri": f"{repository}@{digest}", "name": platform,
                                      "digest": {"sha256": _hex(digest)}}
                                     for platform, digest in manifests]},
        "runDetails": {"builder": {"id": f"imgbuild {tool_version}"},
                       "metadata": {"source": {"git_commit": commit}}},
    }


def index_predicates(repository: str, index_digest: str, *, target: str, model: str | None,
                     content_tag: str, content_key: str, manifests: Sequence[tuple[str, str]],
                     tool_version: str, commit: str | None) -> dict[str, dict]:
    """{predicate type: predicate} the index is attested with, by cosign's types."""
    return {
        ATTESTATION_TYPES["cyclonedx"]: index_sbom(repository, index_digest, content_tag,
                                                   content_key, manifests, tool_version),
        ATTESTATION_TYPES["slsaprovenance1"]: index_provenance(
            repository, target, model, content_key, manifests, tool_version, commit)}


def platform_policy(policy: SignPolicy | None, signer_pem: str | None) -> SignPolicy | None:
    """What each platform image must pass before its index is assembled: the registry's
    `signed-by` policy where there is one (the check `pull` makes of it), else, when the index
    is to be signed, a signature by the signing key itself (the public half, inline); None
    where nothing is asked (no policy, no key: today's unsigned index)."""
    if policy is not None:
        return policy
    if signer_pem is None:
        return None
    return SignPolicy(SIGNING_KEY, key=signer_pem, attestations=())


# Who signed keyless, as policies match it: (certificate subject, OIDC issuer).
Who = tuple[str, str | None]

# Keyless with no `signed-by` policy: nothing names the identity in advance, and there is no
# trust root to check a certificate against. The index is then signed only over platform
# images whose certificates all name one identity, and the index's own certificate, read back
# after cosign signed, must name it too: the CI's build jobs and its index job are one
# workflow (GitHub Actions: one workflow file at one ref, one subject). That is the key path's
# "the same key", said of identities; a policy with a trust root checks the chain as well.
SAME_IDENTITY = ("asked of each platform image: a keyless signature by the identity that signs "
                 "the index, one for all (no signed-by policy: each certificate's identity is "
                 "read, not checked against a trust root)")


def said_who(who: Who) -> str:
    return f"keyless as {who[0]} (issuer {who[1] or 'not named'})"


def identity_checks(found: Sequence[Who | None]) -> list[tuple[Check, ...]]:
    """Per platform image, in order: the check that it is signed keyless by the one identity
    all of them share (`found`: each one's certificate identity, None where it has none)."""
    named = {w for w in found if w is not None}
    out: list[tuple[Check, ...]] = []
    for who in found:
        if who is None:
            check = ("signature", False, "none: no keyless signature (a certificate) of it is "
                                         "in the registry")
        elif len(named) > 1:
            check = ("signature", False, f"{said_who(who)}; the platform images name "
                                         f"{len(named)} identities, and one signs the index")
        else:
            check = ("signature", True, said_who(who))
        out.append((check,))
    return out


def index_identity_refusal(index: Who | None, platforms: Who | None) -> str | None:
    """Why the index's keyless signature does not vouch for its platform images (None: it
    does): its certificate, read back, names no identity, or not theirs."""
    if index is None:
        return "the registry holds no keyless signature of the index (no certificate)"
    if platforms is not None and index != platforms:
        return f"the index was signed {said_who(index)}; its platform images {said_who(platforms)}"
    return None


def asked_of_platforms(wanted: SignPolicy, key: str) -> str:
    """What each platform image was asked for, said beside what was found: `key` names the
    public key (its id and where it comes from)."""
    if wanted.where == SIGNING_KEY:
        return f"asked of each platform image: a signature by {key}, the key that signs the index"
    what = (f"a keyless signature of {wanted.subject} ({wanted.issuer})" if wanted.keyless
            else f"a signature by {key}")
    atts = (", attestations " + ", ".join(wanted.attestations)) if wanted.attestations else ""
    return f"asked of each platform image by {wanted.where}: {what}{atts}"


def platform_refusals(platform: str, digest: str, checks: Sequence[Check]) -> list[str]:
    """One line per check a platform image failed, for the index's refusal: the platform, the
    digest, the check and what was found."""
    return [f"{platform}: {digest}: {what}: {detail}" for what, ok, detail in checks if not ok]


def verified(own: Sequence[Check], platforms: Sequence[bool]) -> bool:
    """Whether `verify` accepts an index: it lists an image, its own checks (signature and
    attestations under the policy) pass, and every platform's image verifies."""
    return bool(platforms) and all(ok for _, ok, _ in own) and all(platforms)


def content_tag_refusal(held: str | None, digest: str) -> str | None:
    """Why the index may not go under its content tag (None: it may): the tag names another
    index already, and a content tag never moves."""
    if held is None or held == digest:
        return None
    return f"the content tag names {held}, the index assembled now is {digest}"
