from __future__ import annotations

from ...checks.checkmodel import check_model
from ..args import workspace
from ..views import checks as views


def run(args, out) -> int:
    report = check_model(workspace(args), args.model, args.target, args.fix)
    views.check_model(out, report)
    return report.exit_code
