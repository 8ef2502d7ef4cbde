"""`imgbuild pull TARGET --registry R`: the prebuilt image for this target's content tag."""

from __future__ import annotations

from dataclasses import dataclass

from ..errors import JobFailed
from ..image import attest, daemon, registry
from ..plan.decide import make_plan
from ..plan.plan import Plan
from ..workspace import Workspace


@dataclass(frozen=True)
class PullOutcome:
    plan: Plan
    ref: str
    digest: str
    registry_digest: str
    report: dict | None = None
    verified: attest.Verification | None = None

    def to_dict(self) -> dict:
        return {"target": self.plan.target, "ref": self.ref, "digest": self.digest,
                "registry_digest": self.registry_digest, "refs": list(self.plan.refs),
                "smoke_report": self.report,
                "verified": self.verified.to_dict() if self.verified else None}


def pull_target(ws: Workspace, target: str, *, model: str | None, registry_name: str,
                archs: tuple[str, ...] | None = None, flavor: str | None = None) -> PullOutcome:
    """Pull by content tag; the pulled digest must be the registry's. The moving tags are set
    locally only when the registry stores a passing (or forced) smoke report for it."""
    repo = registry.repository(registry_name, True)
    client = daemon.client()
    registry.check_reachable(repo)
    plan = make_plan(ws, target, model=model, repository=repo.name, archs=archs, flavor=flavor)
    want = registry.manifest_digest(repo, plan.content_tag)
    if want is None:
        raise JobFailed(f"no image for {plan.target} in {repo.name}",
                        facts=[f"content tag {plan.content_tag} is not in the registry"],
                        hint=f"build and push it: `imgbuild {target} --push --registry "
                             f"{repo.name}`")
    got = registry.pull(client, plan.ref(), want)
    if got != want:
        raise JobFailed(f"pulled {plan.ref()} by digest {got}, but the registry holds {want}",
                        hint="the tag moved during the pull; pull again")
    img = client.images.get(plan.ref())
    verified = attest.verify(repo, plan.content_tag, lock=ws.target(plan.target).lock())
    mismatch = [(c, d) for c, ok, d in verified.checks if not ok and d != "none stored"]
    if mismatch:
        raise JobFailed(f"{plan.ref()} does not verify", facts=[f"{c}: {d}" for c, d in mismatch],
                        hint="the registry holds something other than what was built; rebuild "
                             f"and push it: `imgbuild {target} --push --registry {repo.name}`")
    report = registry.fetch_report(repo, got)
    if report is not None and (report.get("ok") or report.get("forced")):
        for t in plan.tags:
            img.tag(plan.repository, t)
    return PullOutcome(plan, plan.ref(), got, want, report, verified)
