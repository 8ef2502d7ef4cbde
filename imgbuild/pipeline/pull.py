"""`imgbuild pull TARGET --registry R`: the prebuilt image for this target's content tag."""

from __future__ import annotations

from dataclasses import dataclass

from ..errors import InputError, JobFailed
from ..image import attest, cosign, daemon, registry, signstore
from ..image.base import host_platform
from ..plan.decide import make_plan
from ..plan.index import IndexPlan, make_index_plan
from ..plan.plan import Plan
from ..progress import SILENT, Progress
from ..workspace import Workspace


@dataclass(frozen=True)
class PullOutcome:
    plan: Plan
    ref: str
    digest: str
    registry_digest: str
    report: dict | None = None
    verified: attest.Verification | None = None
    platform: str = ""
    platform_why: str = ""
    moving: tuple[str, ...] = ()  # the moving tags (the index's, for a multi-platform target)
    index_digest: str | None = None

    def to_dict(self) -> dict:
        return {"target": self.plan.target, "ref": self.ref, "digest": self.digest,
                "registry_digest": self.registry_digest,
                "refs": [self.ref, *self.moving], "platform": self.platform,
                "platform_why": self.platform_why, "index_digest": self.index_digest,
                "smoke_report": self.report,
                "verified": self.verified.to_dict() if self.verified else None}


def pull_target(ws: Workspace, target: str, *, model: str | None, registry_name: str,
                archs: tuple[str, ...] | None = None, flavor: str | None = None,
                platform: str | None = None, progress: Progress = SILENT) -> PullOutcome:
    """Pull by content tag; the pulled digest must be the registry's. The moving tags are set
    locally only when the registry stores a passing (or forced) smoke report for it.

    A multi-platform target is pulled through its index: the manifest it lists for this host's
    platform (or `platform`), which must be the one that platform's content tag names."""
    repo = registry.repository(registry_name, True)
    client = daemon.client()
    registry.check_reachable(repo)
    t = ws.catalog.target(target)
    chosen, why = choose_platform(t.platforms, platform, host_platform(), t.name)
    plan = make_plan(ws, target, model=model, repository=repo.name, archs=archs, flavor=flavor,
                     platform=chosen)
    index_digest = None
    tags = plan.tags
    if t.multi_platform:
        index = make_index_plan(ws, target, model=model, repository=repo.name, archs=archs,
                                flavor=flavor)
        tags = index.tags
        index_digest, want = _from_index(repo, index, chosen)
    else:
        want = registry.manifest_digest(repo, plan.content_tag)
    if want is None:
        raise JobFailed(f"no image for {plan.target} in {repo.name}",
                        facts=[f"content tag {plan.content_tag} is not in the registry"],
                        hint=f"build and push it: `imgbuild {target} --push --registry "
                             f"{repo.name}`")
    # The registry's signature policy, before a byte of the image is downloaded: what a GPU
    # host runs is what the project's CI signed.
    policy = ws.registries.policy_for(repo.name)
    if policy is None:
        progress.note(f"signatures not checked: images/registries.yaml gives {repo.name} no "
                      "signed-by policy")
    else:
        if index_digest is not None:
            # The index first: what `cosign verify` on the multi-arch tag and a cluster's
            # admission policy read (image/indexsign.py); then the image taken from it.
            signstore.enforce(repo, index_digest, policy, index.ref(),
                              what=f"the index of {index.target}, ",
                              sign_with=f"`imgbuild index {index.target} --registry {repo.name} "
                                        "--sign-key KEY`")
            progress.note(f"signature of the index {repo.name}@{index_digest[:19]}… accepted")
        signstore.enforce(repo, want, policy, plan.ref())
        progress.note(f"signature of {repo.name}@{want[:19]}… accepted ({policy.where}); cosign "
                      "checks the same: " + cosign.cosign_commands(
                          policy, cosign.key_path(policy), f"{repo.name}@{want}",
                          plain_http=repo.plain_http)[0])
    got = registry.pull(client, plan.ref(), want, progress)
    if got != want:
        raise JobFailed(f"pulled {plan.ref()} by digest {got}, but the registry holds {want}",
                        hint="the tag moved during the pull; pull again")
    img = client.images.get(plan.ref())
    verified = attest.verify(repo, plan.content_tag,
                             lock=ws.target(plan.target, plan.platform).lock(), policy=policy)
    mismatch = [(c, d) for c, ok, d in verified.checks if not ok and d != "none stored"]
    if mismatch:
        raise JobFailed(f"{plan.ref()} does not verify", facts=[f"{c}: {d}" for c, d in mismatch],
                        hint="the registry holds something other than what was built; rebuild "
                             f"and push it: `imgbuild {target} --push --registry {repo.name}`")
    report = registry.fetch_report(repo, got)
    if report is not None and (report.get("ok") or report.get("forced")):
        for tag in tags:
            img.tag(plan.repository, tag)
    return PullOutcome(plan, plan.ref(), got, want, report, verified, chosen, why,
                       tuple(f"{plan.repository}:{tag}" for tag in tags), index_digest)


def choose_platform(platforms: tuple[str, ...], asked: str | None, host: str,
                    target: str) -> tuple[str, str]:
    """(platform, why): the one asked for, else this host's, else a single-platform target's
    only one (a foreign one runs here only under emulation)."""
    if asked is not None:
        if asked not in platforms:
            raise InputError(f"target '{target}' has no image for {asked}",
                             facts=[f"it is built for {', '.join(platforms)}"],
                             hint="pass one of those to --platform")
        return asked, "asked for with --platform"
    if host in platforms:
        return host, "this host's platform"
    if len(platforms) == 1:
        return platforms[0], f"the target's only platform (this host is {host})"
    raise InputError(f"target '{target}' has no image for this host's platform {host}",
                     facts=[f"it is built for {', '.join(platforms)}"],
                     hint="pass --platform to pull one of those anyway (another CPU's image "
                          "runs here only under QEMU user emulation)")


def _from_index(repo: registry.Repository, index: IndexPlan,
                platform: str) -> tuple[str, str | None]:
    """(index digest, the manifest it lists for `platform`), checked against that platform's
    content tag."""
    found = registry.fetch_index(repo, index.content_tag)
    if found is None:
        present = [f"{p.platform}: {p.content_tag} "
                   + ("is there" if registry.manifest_digest(repo, p.content_tag) else "is not")
                   for p in index.plans]
        raise JobFailed(f"no index for {index.target} in {repo.name}",
                        facts=[f"index content tag {index.content_tag} is not in the registry",
                               *present],
                        hint=f"build and push every platform (`imgbuild {index.target} --push "
                             f"--registry {repo.name}`), or assemble the index from the "
                             f"pushed ones: `imgbuild index {index.target} --registry "
                             f"{repo.name}`")
    digest, manifests = found
    listed = manifests.get(platform)
    if listed is None:
        raise JobFailed(f"the index {index.ref()} lists no image for {platform}",
                        facts=[f"it lists {', '.join(manifests) or 'nothing'}"])
    own = registry.manifest_digest(repo, index.plan_for(platform).content_tag)
    if own != listed:
        raise JobFailed(f"the index {index.ref()} lists {listed[:19]}… for {platform}, but that "
                        f"platform's content tag names {str(own)[:19]}…",
                        hint=f"assemble it again: `imgbuild index {index.target} --registry "
                             f"{repo.name}`")
    return digest, listed
