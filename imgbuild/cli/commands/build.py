from __future__ import annotations

from ...pipeline.build import BuildOptions, MultiOutcome, build_target
from ..args import archs, cache_from_refs, log_dir, platforms, workspace
from ..views import image as views


def run(args, out) -> int:
    logs = log_dir(args)  # made and checked first: a build must not start with nowhere to log
    ws = workspace(args)
    opts = BuildOptions(target=args.target, model=args.model, registry=args.registry,
                        archs=archs(args, ws), flavor=args.flavor, push=args.push,
                        platforms=platforms(args),
                        rebuild=args.rebuild, smoke=not args.no_smoke, force=args.force,
                        no_cache=args.no_cache, cache_from=not args.no_cache_from,
                        cache_from_refs=cache_from_refs(args),
                        resmoke=args.resmoke, compression=args.compression,
                        splice=not args.no_splice, registry_cache=args.registry_cache,
                        sign_key=args.sign_key, log_dir=logs)
    outcome = build_target(ws, opts, out.progress())
    if isinstance(outcome, MultiOutcome):
        views.build_index(out, outcome)
    else:
        views.build(out, outcome)
    return 0
