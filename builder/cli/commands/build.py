from __future__ import annotations

from pathlib import Path

from ...pipeline.build import BuildOptions, MultiOutcome, build_target
from ..args import archs, platforms, workspace
from ..views import image as views


def run(args, out) -> int:
    ws = workspace(args)
    opts = BuildOptions(target=args.target, model=args.model, registry=args.registry,
                        archs=archs(args, ws), flavor=args.flavor, push=args.push,
                        platforms=platforms(args),
                        rebuild=args.rebuild, smoke=not args.no_smoke, force=args.force,
                        no_cache=args.no_cache, resmoke=args.resmoke,
                        log_dir=Path(args.log_dir) if args.log_dir else None)
    outcome = build_target(ws, opts, out.progress())
    if isinstance(outcome, MultiOutcome):
        views.build_index(out, outcome)
    else:
        views.build(out, outcome)
    return 0
