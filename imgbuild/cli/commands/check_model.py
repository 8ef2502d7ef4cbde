from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from ...checks.checkmodel import check_model
from ...errors import InputError
from ..args import workspace
from ..views import checks as views


def run(args, out) -> int:
    target = args.target
    if args.image:
        # Only --image reads an image: the Docker client's import stays off the rest.
        from ...image import schemes

        _, _, _, labelled = schemes.image_engine(args.image)
        target = target or labelled
    if not target:
        raise InputError("check-model needs the target whose engine to check against",
                         hint="pass --target TARGET (or --image IMAGE of an imgbuild image)")
    report = check_model(workspace(args), args.model, target, args.fix)
    if args.image:
        where = report.checkpoint.config_path
        if where is None:
            raise InputError(f"--image needs the checkpoint on this machine: {args.model} is not "
                             "a local directory", hint="download its config.json and "
                             "model.safetensors.index.json (no weights) and pass that directory")
        report = replace(report, in_image=schemes.probe(args.image, Path(where).parent),
                         image=args.image)
    views.check_model(out, report)
    return report.exit_code
