"""`imgbuild plan` and `imgbuild check-deps`: the Plan, and the dependency check on its lock."""

from __future__ import annotations

from dataclasses import dataclass

from ..checks import drift
from ..checks.deps import check_deps
from ..plan.decide import make_plan
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


def plan_target(ws: Workspace, target: str, *, model: str | None = None,
                repository: str = "imgbuild", archs: tuple[str, ...] | None = None,
                flavor: str | None = None, checks: bool = True) -> PlanReport:
    """The Plan (locking first if the lock is missing or stale), and unless checks=False the
    API drift check on what it locked."""
    plan = make_plan(ws, target, model=model, repository=repository, archs=archs, flavor=flavor)
    findings = tuple(check_deps(ws, plan.target, model=plan.model)) if checks else None
    return PlanReport(plan, findings)
