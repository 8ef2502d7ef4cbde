from __future__ import annotations

from ...pipeline.smokemodel import smoke_model_for
from ..args import workspace
from ..views import image as views


def run(args, out) -> int:
    doc = smoke_model_for(workspace(args), args.alias, registry_name=args.registry,
                          push=args.push, progress=out.progress())
    views.smoke_model(out, doc)
    return 0
