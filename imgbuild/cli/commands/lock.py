from __future__ import annotations

from ...pipeline.lock import lock_targets
from ..args import workspace
from ..views import plan as views


def run(args, out) -> int:
    ws = workspace(args)
    names = list(ws.catalog.targets) if args.all else args.targets
    report = lock_targets(ws, names, check=args.check, refresh=args.refresh, jobs=args.jobs,
                          progress=out.progress())
    views.lock(out, report)
    return report.exit_code
