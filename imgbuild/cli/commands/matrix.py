from __future__ import annotations

from pathlib import Path

from ...ci.matrix import document
from ..args import repository, workspace
from ..views import ci as views


def run(args, out) -> int:
    doc = document(workspace(args), args.format, changed_since=args.changed_since,
                   repository=repository(args),
                   contexts=Path(args.contexts) if args.contexts else None)
    views.matrix(out, doc, args.format)
    return 0
