from __future__ import annotations

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
        views.index_plan(out, report)
    else:
        report = plan_target(ws, args.target, platform=asked[0] if asked else None, **kw)
        views.plan(out, report)
    return report.exit_code
