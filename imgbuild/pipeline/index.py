"""`imgbuild index TARGET --registry R`: assemble a multi-platform target's OCI image index.

Each platform's image is built, smoke-tested and pushed on its own (on its own runner in CI:
`imgbuild build T --platform linux/arm64 --push`), which stores its smoke report, SBOM and
provenance by that image's digest. The index is assembled after all of them passed: it lists
the registry's manifests for the platforms' content tags, goes under the index's content tag,
and only then under the moving tags. An index never lists an image without a passing report.

With a signer (`--sign-key`, IMGBUILD_SIGN_KEY: a key file or env://VAR signed here; keyless
or a KMS key through cosign) the index is signed in cosign's format (image/indexsign.py says
what it is attested with, and why): it is put in the registry by its digest, no tag naming it
yet, then signed, then checked against the registry's `signed-by` policy, and only then do its
content tag and moving tags go onto it. A signing or a check that fails moves no tag: what
stays is an index no tag names, and its attestations or signature where they were written (a
second run, the same platforms giving the same digest, adds only what is missing; cosign
appends its signature again). Before anything is written, each platform's image must pass what
is asked of it, or the index is not assembled at all:

- under a `signed-by` policy: the whole policy;
- else, signing with a key or a KMS key: a signature by that key;
- else, keyless: certificates that all name one identity, which the index's own certificate,
  read back after signing, must name too (indexsign.SAME_IDENTITY).
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from ..catalog.registries import SignPolicy
from ..errors import EnvError, JobFailed
from ..image import attest, cosigncli, indexsign, registry
from ..plan.index import IndexPlan
from ..progress import SILENT, Progress

if TYPE_CHECKING:
    from ..image.cosign import SigningKey

    Signer = SigningKey | cosigncli.Delegated  # signed here, or by cosign


@dataclass(frozen=True)
class Assembled:
    plan: IndexPlan
    digest: str
    manifests: tuple[tuple[str, str], ...]  # (platform, manifest digest)
    pushed: tuple[str, ...]  # ref@digest: the content tag, then the moving tags
    signed: tuple[str, ...] = ()  # the `.sig`/`.att` tags this run wrote for the index
    # Who signed it: {"method": "key"|"kms", "key"} or {"method": "keyless", "subject",
    # "issuer"} (the certificate read back from the registry); None: not signed by this run.
    signed_by: dict | None = None

    def to_dict(self) -> dict:
        return {"target": self.plan.target, "content_tag": self.plan.content_tag,
                "refs": list(self.plan.refs), "digest": self.digest,
                "manifests": dict(self.manifests), "pushed": list(self.pushed),
                "signed": list(self.signed), "signed_by": self.signed_by}


@dataclass(frozen=True)
class Stored:
    """What the registry holds for one platform's content tag: the manifest's descriptor (None
    when the tag is not there), its image's architecture and the smoke report stored for it."""

    platform: str  # linux/<arch>
    ref: str  # repository:content tag
    descriptor: dict | None
    architecture: str | None = None
    report: dict | None = None
    problems: tuple[str, ...] = ()  # what `verify` finds wrong with the image itself
    # The signature checks asked of the image before its index is assembled (indexsign's
    # platform_policy): () where none is asked.
    signature: tuple[tuple[str, bool, str], ...] = ()


def refusals(stored: tuple[Stored, ...]) -> list[str]:
    """Why the index may not be assembled, one line a platform's problem; [] when every
    platform's image is there, of its platform, with a passing (or forced) smoke report, and
    passes the signature checks asked of it. The decision alone, on plain data: `assemble`
    only gathers what it reads."""
    problems: list[str] = []
    for s in stored:
        if s.descriptor is None:
            problems.append(f"{s.platform}: {s.ref} is not in the registry")
            continue
        problems.extend(f"{s.platform}: {p}" for p in s.problems)
        if s.architecture != s.platform.split("/", 1)[1]:
            problems.append(f"{s.platform}: {s.ref} is an image for {s.architecture}")
        digest = s.descriptor["digest"]
        if s.report is None:
            problems.append(f"{s.platform}: no smoke report stored for {digest}")
        elif not (s.report.get("ok") or s.report.get("forced")):
            problems.append(f"{s.platform}: its smoke report for {digest} says FAILED")
        problems.extend(indexsign.platform_refusals(s.platform, digest, s.signature))
    return problems


def assemble(plan: IndexPlan, repo: registry.Repository, *, signer: Signer | None = None,
             policy: SignPolicy | None = None, commit: str | None = None,
             progress: Progress = SILENT) -> Assembled:
    """Check every platform's image in the registry (there, of its platform, with a passing or
    forced smoke report; passing `policy`, else signed as `signer` signs), then put the index
    by its digest, sign it with `signer`, check it against `policy`, and only then move its
    content tag and its moving tags onto it."""
    pub = _public_pem(signer)
    wanted = indexsign.platform_policy(policy, pub)
    # keyless with no policy: the platforms' certificates must name one identity (module doc)
    same_identity = policy is None and isinstance(signer, cosigncli.Delegated) \
        and signer.key is None
    stored: list[Stored] = []
    for p in plan.plans:
        d = registry.manifest_descriptor(repo, p.content_tag)
        if d is None:
            stored.append(Stored(p.platform, p.ref(), None))
            continue
        _, config = registry.image_config(repo, d["digest"])
        stored.append(Stored(p.platform, p.ref(), d, config.get("architecture"),
                             registry.fetch_report(repo, d["digest"]),
                             tuple(registry.image_problems(repo, d["digest"])),
                             _signature_checks(repo, d["digest"], wanted)))
    platforms_who = None
    if same_identity:
        from ..image import signstore  # imported on use: the crypto, only to sign

        present = [i for i, s in enumerate(stored) if s.descriptor is not None]
        found = [_who(signstore.keyless_identity(repo, stored[i].descriptor["digest"]))
                 for i in present]
        for i, checks in zip(present, indexsign.identity_checks(found)):
            stored[i] = replace(stored[i], signature=checks)
        platforms_who = found[0] if found and all(f == found[0] for f in found) else None
    problems = refusals(tuple(stored))
    if problems:
        unsigned = [line for s in stored if s.descriptor is not None
                    for line in indexsign.platform_refusals(s.platform, s.descriptor["digest"],
                                                            s.signature)]
        build = (f"build, smoke-test and push each platform (`imgbuild {plan.target} --platform "
                 f"PLATFORM --push --registry {repo.name}`)")
        how = "keyless" if same_identity or (wanted is not None and wanted.keyless) else "KEY"
        alike = "in the same workflow" if how == "keyless" else "with the same key"
        sign = (f"sign each platform's image {alike}: build it here (`imgbuild {plan.target} "
                f"--platform PLATFORM --push --rebuild --sign-key {how} --registry "
                f"{repo.name}`; an image only pulled back is not signed), or `cosign sign "
                f"{'' if how == 'keyless' else '--key KEY '}REPO@DIGEST` and `cosign attest` "
                "its SBOM and provenance")
        only_unsigned = len(unsigned) == len(problems)
        if unsigned and wanted is not None:
            problems.append(indexsign.asked_of_platforms(wanted, _key_named(wanted, signer,
                                                                            pub)))
        elif unsigned and same_identity:
            problems.append(indexsign.SAME_IDENTITY)
        raise JobFailed(
            f"the index of {plan.target} was not assembled; no tag moved", facts=problems,
            hint=(sign if only_unsigned else
                  f"{build}{'; ' + sign if unsigned else ''}")
            + f", then run `imgbuild index {plan.target} --registry {repo.name}` again")
    entries = [(s.platform, s.descriptor) for s in stored if s.descriptor is not None]
    manifests = tuple((p, d["digest"]) for p, d in entries)
    body = registry.index_document(entries, {
        "io.imgbuild.target": plan.target, "io.imgbuild.content-key": plan.content_key})
    digest = "sha256:" + hashlib.sha256(body).hexdigest()
    held = registry.manifest_digest(repo, plan.content_tag)
    if (why := indexsign.content_tag_refusal(held, digest)) is not None:
        raise JobFailed(f"{repo.name}:{plan.content_tag} already names another index; content "
                        "tags never move", facts=[why],
                        hint="nothing was written and no tag was moved; the registry's index "
                             "stays the one its content tag names")
    pinned = f"{repo.name}@{digest}"
    # By digest first: signed before this run moves a tag onto it.
    registry.put_index(repo, digest, body)
    signed: list[str] = []
    signed_by: dict | None = None
    if signer is not None:
        from ..image import signstore  # imported on use: the crypto, only to sign

        predicates = indexsign.index_predicates(
            repo.name, digest, target=plan.target, model=plan.model,
            content_tag=plan.content_tag, content_key=plan.content_key, manifests=manifests,
            tool_version=attest.imgbuild_version(), commit=commit)
        try:
            signed, signed_by = signstore.sign_as(repo, digest, signer, predicates)
        except (JobFailed, EnvError) as e:
            raise type(e)(f"the index {pinned} was not signed; no tag moved",
                          facts=[e.message, *e.facts,
                                 "the index is in the registry by its digest only: no tag "
                                 "names it"],
                          hint=(e.hint + "; then " if e.hint else "")
                          + f"run `imgbuild index {plan.target} --registry {repo.name} "
                            "--sign-key KEY` again: the same platforms give the same index, "
                            "and what was written is kept") from None
        index_who = (signed_by["subject"], signed_by["issuer"]) \
            if signed_by.get("method") == "keyless" else None
        progress.note(f"signed the index {repo.name}@{digest[:19]}… "
                      + (indexsign.said_who(index_who) if index_who else f"with {signer.source}")
                      + (f": {', '.join(signed)}" if signed else
                         " (its signature and attestations were there already)"))
        if same_identity and (why := indexsign.index_identity_refusal(index_who,
                                                                     platforms_who)):
            raise JobFailed(
                f"the tags of {plan.target} were not moved: the index {pinned} is not signed "
                "by the identity that signed its platform images", facts=[
                    "the index is in the registry by its digest only: no tag names it", why],
                hint=f"run `imgbuild index {plan.target} --registry {repo.name} --sign-key "
                     "keyless` in the workflow that built and signed the platform images, or "
                     "name the identity in a signed-by policy (images/registries.yaml)")
    if policy is not None:
        from ..image import signstore  # imported on use: the crypto, for a policy only

        found, path = signstore.checks(repo, digest, policy)
        bad = [f"{c}: {d}" for c, ok, d in found if not ok]
        if bad:
            from ..image import cosign

            raise JobFailed(
                f"the tags of {plan.target} were not moved: the index {pinned} is not signed "
                f"as {policy.where} asks", facts=[
                    "the index is in the registry by its digest only: no tag names it", *bad],
                hint=(f"sign it keyless as {policy.subject}: `imgbuild index {plan.target} "
                      f"--registry {repo.name} --sign-key keyless` in that workflow"
                      if policy.keyless else
                      f"sign it with the policy's key: `imgbuild index {plan.target} --registry "
                      f"{repo.name} --sign-key KEY`, or `cosign sign --key KEY {pinned}`")
                     + " (and `cosign attest` what the policy asks), then run `imgbuild index` "
                     "again; "
                     "cosign checks the same: " + cosign.cosign_commands(
                         policy, path, pinned, plain_http=repo.plain_http)[0])
    tags = (plan.content_tag,) + plan.tags
    registry.push_index(repo, tags, body)
    progress.note(f"pushed the index {plan.ref()}@{digest[:19]}… ({', '.join(plan.platforms)})"
                  f" and moved {', '.join(plan.tags)} onto it")
    return Assembled(plan, digest, manifests, tuple(f"{plan.ref(t)}@{digest}" for t in tags),
                     tuple(signed), signed_by)


def _signature_checks(repo: registry.Repository, digest: str,
                      wanted: SignPolicy | None) -> tuple[tuple[str, bool, str], ...]:
    if wanted is None:
        return ()
    from ..image import signstore  # imported on use: the crypto, only where asked

    return tuple(signstore.checks(repo, digest, wanted)[0])


def _key_named(wanted: SignPolicy, signer: Signer | None, pub: str | None) -> str:
    """The public key a platform image was asked to be signed by, as messages name it."""
    from ..image import cosign, signstore  # imported on use: a key is there to name

    if wanted.keyless:
        return "no key (keyless)"
    if signer is not None and pub is not None:
        return f"{cosign.key_id(cosign.load_public_key(pub.encode()))} ({signer.source})"
    key, path = signstore.policy_key(wanted)
    return f"{cosign.key_id(key)} ({path or 'inline PEM'})"


def _public_pem(signer: Signer | None) -> str | None:
    """The public half of the signer's key (a KMS key's read through cosign); None for keyless
    or no signer."""
    if signer is None:
        return None
    if not isinstance(signer, cosigncli.Delegated):
        return signer.public_pem().decode()
    if signer.key is None:
        return None
    from ..image import signstore  # imported on use: the crypto, only to sign

    return signstore.kms_public_key(signer)[1].decode()


def _who(identity) -> indexsign.Who | None:
    return (identity.subject, identity.issuer) if identity is not None else None
