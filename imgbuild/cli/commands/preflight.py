from __future__ import annotations

from ...pipeline.preflight import preflight
from ..args import archs, workspace
from ..views import image as views


def run(args, out) -> int:
    ws = workspace(args)
    result = preflight(ws, args.subject, model=args.model, archs=archs(args, ws),
                       flavor=args.flavor, model_dir=args.model_dir, nvidia_smi=args.nvidia_smi)
    views.preflight(out, result)
    return result.report.exit_code
