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
    source: SpecSource | None = None  # where the target's spec came from (not in the key)

    @property
    def ok(self) -> bool:
        return not self.findings

    @property
    def exit_code(self) -> int:
        return 1 if self.findings else 0

    def to_dict(self) -> dict:
        return self.plan.to_dict() | {"checks": None if self.findings is None else {
            "ok": self.ok, "findings": [f.to_dict() for f in self.findings]}} | (
            {"source": self.source.to_dict()} if self.source else {})


@dataclass(frozen=True)
class SpecSource:
    """Where a target's spec came from: its file and layer (built-in or the project's), which
    file each field came from (a target that `extends:` another takes most from its parent),
    and the built-in names the project's shadow among those the plan uses."""

    file: str
    layer: str
    fields: tuple[tuple[str, str], ...]
    shadowing: tuple[str, ...]  # one sentence per shadowed name

    def to_dict(self) -> dict:
        return {"file": self.file, "layer": self.layer, "fields": dict(self.fields),
                "shadowing": list(self.shadowing)}


def spec_source(ws: Workspace, target: str, model: str | None = None) -> SpecSource:
    cat = ws.catalog
    t = cat.target(target)
    shadowing = []
    for kind, name in (("target", target), ("model", model or t.default_model),
                       ("model", t.smoke_model)):
        below = cat.shadowed.get(f"{kind} {name}") if name else None
        if below and not any(f"{kind} '{name}'" in s for s in shadowing):
            path = t.path if kind == "target" else cat.models[name].path
            shadowing.append(f"{kind} '{name}' is the project's ({path}), shadowing the "
                             f"built-in one ({below})")
    return SpecSource(t.path, cat.origin.get(target, "project"),
                      tuple(cat.provenance.get(target, {}).items()), tuple(shadowing))


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
    return PlanReport(plan, findings, spec_source(ws, target, model))


def plan_index(ws: Workspace, target: str, *, model: str | None = None,
               repository: str = "imgbuild", archs: tuple[str, ...] | None = None,
               flavor: str | None = None, checks: bool = True) -> IndexReport:
    """Every platform's plan and the index of a multi-platform target."""
    index = make_index_plan(ws, target, model=model, repository=repository, archs=archs,
                            flavor=flavor)
    source = spec_source(ws, target, model)
    return IndexReport(index, tuple(
        PlanReport(p, tuple(check_deps(ws, target, model=p.model, platform=p.platform))
                   if checks else None, source) for p in index.plans))
