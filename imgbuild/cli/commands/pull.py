from __future__ import annotations

from ...errors import InputError
from ...pipeline.pull import pull_target
from ..args import archs, platforms, workspace
from ..views import image as views


def run(args, out) -> int:
    ws = workspace(args)
    asked = platforms(args)
    if asked and len(asked) > 1:
        raise InputError("pull takes one --platform", facts=[f"asked for {', '.join(asked)}"],
                         hint="the Engine holds one image per tag: pull each platform on its own")
    outcome = pull_target(ws, args.target, model=args.model, registry_name=args.registry,
                          archs=archs(args, ws), flavor=args.flavor,
                          platform=asked[0] if asked else None, progress=out.progress())
    views.pull(out, outcome)
    return 0
