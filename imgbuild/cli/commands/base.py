from __future__ import annotations

from ...image import base, digests
from ..args import workspace
from ..views import image as views


def run(args, out) -> int:
    ws = workspace(args)
    if args.base_command == "refresh-digests":
        views.digests(out, digests.refresh_catalog(ws, mirror=args.mirror))
        return 0
    res = base.bootstrap_base(ws, args.base, registry=args.registry, rebuild=args.rebuild,
                              record=args.record, cpu_arch=args.cpu_arch,
                              progress=out.progress())
    views.base(out, args.base, res)
    return 0
