from __future__ import annotations

from ..args import workspace
from ..views import plan as views


def run(args, out) -> int:
    views.catalog(out, workspace(args).catalog)
    return 0
