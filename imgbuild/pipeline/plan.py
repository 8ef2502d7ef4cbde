"""`imgbuild plan` and `imgbuild check-deps`: the Plan, and the dependency check on its lock."""

from __future__ import annotations

from dataclasses import dataclass

from ..checks import drift
from ..checks.deps import check_deps
from ..plan.decide import make_plan
from ..plan.index import IndexPlan, make_index_plan
from ..plan.plan import Plan
from ..workspace import Workspace


@dataclass(frozen=True)
class PlanReport:
    plan: Plan
    findings: tuple[drift.Finding, ...] | None  # None: the check was skipped (--no-checks)

    @property
    def ok(self) -> bool:
        return not self.findings

    @property
    def exit_code(self) -> int:
        return 1 if self.findings else 0

    def to_dict(self) -> dict:
        return self.plan.to_dict() | {"checks": None if self.findings is None else {
            "ok": self.ok, "findings": [f.to_dict() for f in self.findings]}}


@dataclass(frozen=True)
class IndexReport:
    """A multi-platform target's plan: each platform's, and the index over them."""

    index: IndexPlan
    reports: tuple[PlanReport, ...]

    @property
    def exit_code(self) -> int:
        return max(r.exit_code for r in self.reports)

    def to_dict(self) -> dict:
        return {"target": self.index.target, "content_tag": self.index.content_tag,
                "refs": list(self.index.refs), "index": self.index.to_dict(),
                "platforms": {r.plan.platform: r.to_dict() for r in self.reports}}


def plan_target(ws: Workspace, target: str, *, model: str | None = None,
                repository: str = "imgbuild", archs: tuple[str, ...] | None = None,
                flavor: str | None = None, checks: bool = True,
                platform: str | None = None) -> PlanReport:
    """One platform's Plan (locking first if the lock is missing or stale), and unless
    checks=False the API drift check on what it locked."""
    plan = make_plan(ws, target, model=model, repository=repository, archs=archs, flavor=flavor,
                     platform=platform)
    findings = tuple(check_deps(ws, plan.target, model=plan.model,
                                platform=plan.platform)) if checks else None
    return PlanReport(plan, findings)


def plan_index(ws: Workspace, target: str, *, model: str | None = None,
               repository: str = "imgbuild", archs: tuple[str, ...] | None = None,
               flavor: str | None = None, checks: bool = True) -> IndexReport:
    """Every platform's plan and the index of a multi-platform target."""
    index = make_index_plan(ws, target, model=model, repository=repository, archs=archs,
                            flavor=flavor)
    return IndexReport(index, tuple(
        PlanReport(p, tuple(check_deps(ws, target, model=p.model, platform=p.platform))
                   if checks else None) for p in index.plans))
