from __future__ import annotations

from ...checks.doctor import doctor, engine_given
from ..args import workspace
from ..views import checks as views


def run(args, out) -> int:
    failures = workspace(args).failures
    given = engine_given(args.engine, failures) if args.engine else None
    report = doctor(failures, args.log, engine=given)
    views.doctor_report(out, report)
    return report.exit_code
