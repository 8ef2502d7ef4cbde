from __future__ import annotations

from ...ci.outdated import relock
from ..args import workspace
from ..views import ci as views


def run(args, out) -> int:
    views.relock(out, relock(workspace(args), args.target, args.upgrade))
    return 0
