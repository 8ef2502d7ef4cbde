from __future__ import annotations

from rich.markup import escape

from ...pipeline.plan import plan_index, plan_target
from ..args import archs, platforms, repository, workspace
from ..views import plan as views


def run(args, out) -> int:
    ws = workspace(args)
    asked = platforms(args)
    kw = dict(model=args.model, repository=repository(args), archs=archs(args, ws),
              flavor=args.flavor, checks=not args.no_checks)
    if ws.catalog.target(args.target).multi_platform and (asked is None or len(asked) > 1):
        report = plan_index(ws, args.target, **kw)
        source = report.reports[0].source
        alias = report.reports[0].plan.model
        views.index_plan(out, report, ws.model(alias) if alias else None)
    else:
        report = plan_target(ws, args.target, platform=asked[0] if asked else None, **kw)
        source = report.source
        views.plan(out, report, ws.model(report.plan.model) if report.plan.model else None)
    if source and not out.json:
        for line in source.shadowing:  # said once, however many platforms were planned
            out.err.print(f"[yellow]note[/]: {escape(line)}")
    return report.exit_code
