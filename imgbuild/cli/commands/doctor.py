from __future__ import annotations

from ...checks.doctor import doctor, engine_given
from ...errors import InputError
from ..args import workspace
from ..views import checks as views


def run(args, out) -> int:
    if args.host:
        if args.log is not None or args.engine:
            # Two reports with their own exit codes (a log's finding, the host's refusal), and
            # --json gives one document: one question at a time.
            raise InputError("doctor reads a log or this host, not both at once",
                             facts=[f"given: {args.log or '--engine ' + args.engine} and --host"],
                             hint="run `imgbuild doctor LOGFILE` and `imgbuild doctor --host` "
                                  "one after the other")
        return _host(out)
    if args.log is None:
        raise InputError("doctor needs a LOGFILE (or - for stdin), or --host",
                         hint="`imgbuild doctor server.log` reads a log; `imgbuild doctor "
                              "--host` says what imgbuild does with this machine's Docker Engine")
    failures = workspace(args).failures
    given = engine_given(args.engine, failures) if args.engine else None
    report = doctor(failures, args.log, engine=given)
    views.doctor_report(out, report)
    return report.exit_code


def _host(out) -> int:
    # Here, not at the top: `doctor LOGFILE` loads no Docker SDK (a quarter of a second).
    from ...image import engine

    facts = engine.read_facts()
    use = engine.decide(facts)
    views.doctor_host(out, facts, use)
    return use.exit_code
