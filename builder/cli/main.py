"""`imgbuild`: parse, run one command, map known errors to their exit codes."""

from __future__ import annotations

import importlib
import os
import sys

from ..errors import ImgbuildError
from .parser import COMMANDS, parser


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and not argv[0].startswith("-") and argv[0] not in COMMANDS:
        argv.insert(0, "build")  # `imgbuild TARGET ...` is `imgbuild build TARGET ...`
    args = parser().parse_args(argv)
    if getattr(args, "insecure_registry", None):
        # Read by every registry call this process makes (image/distribution.py).
        known = os.environ.get("IMGBUILD_INSECURE_REGISTRIES", "")
        os.environ["IMGBUILD_INSECURE_REGISTRIES"] = ",".join(
            [h for h in known.split(",") if h] + args.insecure_registry)
    # The one lazy import: a command loads only the stages it runs.
    command = importlib.import_module(f"{__package__}.commands.{COMMANDS[args.command]}")
    from .console import make_output

    out = make_output(getattr(args, "json", False))
    try:
        return command.run(args, out)
    except ImgbuildError as e:
        out.error(e)
        return e.exit_code
    except KeyboardInterrupt:
        out.err.print("interrupted")
        return 130
