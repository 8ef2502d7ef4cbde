from __future__ import annotations

from ...pipeline.plan import plan_target
from ..args import archs, repository, workspace
from ..views import plan as views


def run(args, out) -> int:
    ws = workspace(args)
    report = plan_target(ws, args.target, model=args.model,
                         repository=repository(args), archs=archs(args, ws),
                         flavor=args.flavor, checks=not args.no_checks)
    views.plan(out, report)
    return report.exit_code
