"""list, plan, check-deps and lock reports."""

from __future__ import annotations

from rich.markup import escape

from ...catalog.catalog import Catalog
from ...catalog.models import ModelProfile
from ...checks import drift
from ...pipeline.lock import LockReport
from ...pipeline.plan import IndexReport, PlanReport
from ...plan.labels import ANY_USER
from ..console import Output
from . import kv, lines, table
from .models import quantization, quantization_cell


def catalog(out: Output, cat: Catalog) -> None:
    if out.json:
        out.print_json({
            "targets": {n: {"engine": f"{t.engine}=={t.engine_version}", "archs": list(t.archs),
                            "os": t.os, "flavor": t.flavor, "platforms": list(t.platforms),
                            "description": t.description,
                            # built-in or project: where the (visible) file is
                            "layer": cat.origin.get(n)}
                        for n, t in cat.targets.items()},
            "models": {a: {"name": m.name, "checkpoint": m.checkpoint, "size_gb": m.size_gb,
                           "tensor_parallel": m.tensor_parallel,
                           "layer": cat.model_origin.get(a), "quantization": quantization(m)}
                       for a, m in cat.models.items()}})
        return
    table(out.out, "targets", ["target", "engine", "archs", "platforms", "os", "flavor"],
          [[n, f"{t.engine} {t.engine_version}", " ".join(t.archs),
            " ".join(p.split("/")[1] for p in t.platforms), t.os, t.flavor]
           for n, t in cat.targets.items()])
    table(out.out, "model profiles", ["model", "name", "checkpoint", "size", "TP", "quantization"],
          [[a, m.name, m.checkpoint, f"{m.size_gb:g} GB", m.tensor_parallel, quantization_cell(m)]
           for a, m in cat.models.items()])


def index_plan(out: Output, report: IndexReport, model: ModelProfile | None = None) -> None:
    if out.json:
        out.print_json(report.to_dict() | _model_json(model))
        return
    for r in report.reports:
        plan(out, r, model)
    ix = report.index
    kv(out.out, f"index for {ix.target}", [
        ("platforms", "\n".join(f"{p.platform}: {p.ref()}" for p in ix.plans)),
        ("content key", ix.content_key), ("tags", "\n".join(ix.refs))])


def _model_json(model: ModelProfile | None) -> dict:
    """The served model's quantization (as the plan used it: a profile that leaves it out has
    it from its checkpoint's config.json); not part of the Plan, so not of its content key."""
    return {"quantization": quantization(model)} if model is not None else {}


def plan(out: Output, report: PlanReport, model: ModelProfile | None = None) -> None:
    if out.json:
        out.print_json(report.to_dict() | _model_json(model))
        return
    p = report.plan
    rows = [
        ("target", f"{p.target}  ({p.description[:70]})"),
        ("engine", f"{p.engine} {p.engine_version}"),
        ("model", f"{p.model}: {p.model_name} ({p.checkpoint}), TP {p.tensor_parallel}"
         if p.model else "none"),
        *([("quantization", quantization_cell(model))] if model is not None else []),
        ("archs", ", ".join(p.archs)),
        ("CUDA", p.cuda or "none (CPU)"),
        ("driver", f"≥ {p.min_driver}" if p.min_driver else "none (CPU)"),
        ("base", f"{p.base_image}  [{p.flavor}, {p.base_os}]"),
        ("why", "\n".join(p.selection)),
        ("python", p.python),
        ("platform", f"{p.platform} ({p.platform_tag})"),
        ("lock", f"{p.lock_path}  ({p.lock_packages} packages, {p.lock_hash[:19]}…)"),
        ("heavy layer", ", ".join(p.heavy_packages) or "none"),
        ("overrides", "none" if not p.overrides else
         "\n".join(f"{o.requirement}: {o.reason}" + (f" ({o.link})" if o.link else "")
                   for o in p.overrides)),
        ("patches", ", ".join(p.patches) or "none"),
        ("smoke model", f"{p.smoke_model} ({(p.smoke_model_key or '')[:12]})"
         if p.smoke_model else "none"),
        ("runs as", f"root only: {p.root_only} (the smoke test's any-user stage is skipped; "
         "its Kubernetes manifests ask for root)" if p.root_only else
         f"root, or any UID with group 0 on a read-only root (the smoke test runs as "
         f"{ANY_USER})"),
        ("content key", p.content_key),
        ("tags", "\n".join(p.refs)),
        ("dependency check", "skipped (--no-checks)" if report.findings is None else
         "ok: every symbol the engines use exists in the locked versions" if report.ok
         else f"{len(report.findings)} finding(s): see below"),
    ]
    kv(out.out, f"plan for {p.target}", rows)
    if p.kernel_coverage:
        kernel_table(out, p)
    if report.findings:
        lines(out.out, drift.explain(report.findings))


WORDS = {"sass": "SASS", "ptx": "PTX only: JIT at first launch", "none": "nothing",
         "jit": "JIT at first use"}


def kernel_table(out: Output, p) -> None:
    """GPU code per package and arch, read from the locked wheels."""
    by_arch = {a: dict(rows) for a, rows in p.kernel_coverage}
    packages = sorted({pkg for rows in by_arch.values() for pkg in rows},
                      key=lambda n: (by_arch[p.archs[0]].get(n) == "jit", "(shown)" in n, n))
    table(out.out, "GPU code in the locked wheels (required packages refuse a build on "
          "'nothing'; shown ones are for the record)", ["package", *by_arch],
          [[pkg, *(WORDS.get(by_arch[a].get(pkg, "-"), "-") for a in by_arch)]
           for pkg in packages])


def check_deps(out: Output, report: PlanReport) -> None:
    p = report.plan
    if out.json:
        out.print_json({"target": p.target, "model": p.model, "lock": p.lock_path,
                        "ok": report.ok, "findings": [f.to_dict() for f in report.findings]})
    elif report.findings:
        lines(out.out, drift.explain(report.findings))
    else:
        out.out.print(f"[green]ok[/]: {p.target} ({escape(p.lock_path)}): every symbol the "
                      f"locked engines use and every format {p.model or 'the smoke model'} "
                      "declares exists in the locked versions")


# --- lock ---

def lock(out: Output, report: LockReport) -> None:
    if out.json:
        out.print_json(report.to_dict())
        return
    c = out.out
    for e in report.entries:
        if e.error is not None:
            c.print(f"[red]failed[/]  {e.target}  {escape(e.error.message)}")
        elif report.check:
            c.print(f"{'[red]stale[/]' if e.stale else '[green]fresh[/]'}  {e.target}  "
                    f"{escape(e.lock)}")
            lines(c, ["    " + d for d in e.diff])
        else:
            c.print(f"{'[green]wrote[/]' if e.written else 'up to date'}  {e.target}  "
                    f"{escape(e.lock)}  ({e.packages} packages)")
        for ov in e.overrides:
            mark = "[green]needed[/]   " if ov["needed"] else "[yellow]removable[/]"
            c.print(f"    override {mark} {escape(ov['requirement'])}: {escape(ov['effect'])}")
    for err in report.failed:
        out.error(err)

