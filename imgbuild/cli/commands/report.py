from __future__ import annotations

from ...errors import InputError
from ...pipeline.report import collect
from ..args import workspace
from ..views import report_html


def run(args, out) -> int:
    if not args.html and not args.json:
        raise InputError("imgbuild report writes a page or JSON: neither was asked for",
                         hint="pass --html DIR (writes DIR/index.html) or --json")
    if args.html is not None and not args.html.strip():
        raise InputError("--html is empty", hint="name the directory for index.html")
    ws = workspace(args)
    registry = args.registry or None
    if registry is not None:
        from ..args import repository

        repository(args)  # checked as Docker checks a name: exit 2 with the reason
    report = collect(ws, registry=registry, targets=tuple(args.targets) or None)
    path = report_html.write(report, args.html) if args.html else None
    if out.json:
        out.print_json(report.to_dict() | ({"html": str(path)} if path else {}))
    elif path is not None:
        out.out.print(f"wrote {path} ({len(report.targets)} targets x {len(report.gpus)} GPUs)",
                      highlight=False)
    return 0
