from __future__ import annotations

from pathlib import Path

from ...errors import InputError
from ...pipeline.run import run as run_model
from ..args import repository, workspace
from ..views import run as views


def run(args, out) -> int:
    ws = workspace(args)
    emit = None
    if args.emit:
        kind, where = args.emit
        if kind not in ("compose", "k8s"):
            raise InputError(f"--emit {kind}: not a format imgbuild writes",
                             hint="--emit compose DIR, or --emit k8s DIR")
        emit = (kind, Path(where))
    if args.port is not None and not 0 < args.port < 65536:
        raise InputError(f"--port {args.port}: not a TCP port", hint="a number from 1 to 65535")
    if args.timeout <= 0:
        raise InputError(f"--timeout {args.timeout}: not a duration", hint="seconds, above 0")
    report = run_model(
        ws, args.subject, model=args.model,
        registry_name=repository(args) if args.registry else None, port=args.port,
        dry_run=args.dry_run, emit=emit, gpus_per_node=args.gpus_per_node, keep=args.keep,
        detach=args.detach, preflight=not args.no_preflight, timeout_s=args.timeout,
        nvidia_smi=args.nvidia_smi,
        model_cache=Path(args.model_cache).expanduser() if args.model_cache else None,
        on_ready=lambda r: views.ready(out, r), progress=out.progress())
    views.report(out, report)
    return report.exit_code
