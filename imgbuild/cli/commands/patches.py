from __future__ import annotations

from ...checks import patches
from ..args import workspace
from ..views import checks as views


def run(args, out) -> int:
    ws = workspace(args)
    report = patches.check(ws, args.target) if args.check else patches.listing(ws, args.target)
    views.patches(out, report)
    return 1 if report.failed else 0
