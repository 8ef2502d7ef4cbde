from __future__ import annotations

from ...pipeline.smokemodel import smoke_model_for
from ..args import log_dir, workspace
from ..views import image as views


def run(args, out) -> int:
    logs = log_dir(args)  # made and checked first, as for a build
    doc = smoke_model_for(workspace(args), args.alias, registry_name=args.registry,
                          push=args.push, log_dir=logs, progress=out.progress())
    views.smoke_model(out, doc)
    return 0
