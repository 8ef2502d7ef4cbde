from __future__ import annotations

from ...pipeline.pull import pull_target
from ..args import archs, workspace
from ..views import image as views


def run(args, out) -> int:
    ws = workspace(args)
    outcome = pull_target(ws, args.target, model=args.model, registry_name=args.registry,
                          archs=archs(args, ws), flavor=args.flavor)
    views.pull(out, outcome)
    return 0
