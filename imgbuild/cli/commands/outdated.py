from __future__ import annotations

from ...ci.outdated import outdated
from ..args import workspace
from ..views import ci as views


def run(args, out) -> int:
    views.outdated_news(out, outdated(workspace(args), targets=args.targets or None))
    return 0  # a report, not a check: news is not a failure
