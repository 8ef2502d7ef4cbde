from __future__ import annotations

from ...pipeline.plan import plan_target
from ..args import workspace
from ..views import plan as views


def run(args, out) -> int:
    report = plan_target(workspace(args), args.target, model=args.model, checks=True)
    views.check_deps(out, report)
    return report.exit_code
