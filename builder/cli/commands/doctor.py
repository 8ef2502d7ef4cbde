from __future__ import annotations

from ...checks.doctor import doctor
from ..args import workspace
from ..views import checks as views


def run(args, out) -> int:
    report = doctor(workspace(args).failures, args.log)
    views.doctor_report(out, report)
    return report.exit_code
