"""What several commands read from their arguments: the Workspace and the GPU archs."""

from __future__ import annotations

import argparse

from ..catalog.archs import parse_arch
from ..image.reference import parse_name
from ..workspace import Workspace


def workspace(args: argparse.Namespace) -> Workspace:
    return Workspace.open(args.images, args.lockfiles, args.wheels)


def repository(args: argparse.Namespace) -> str:
    """--registry, checked as Docker checks a repository name (exit 2 with the reason)."""
    if not getattr(args, "registry", None):
        return "imgbuild"
    parse_name(args.registry)
    return args.registry


def archs(args: argparse.Namespace, ws: Workspace) -> tuple[str, ...] | None:
    """--arch B200 --arch 'RTX PRO 6000' or --arch sm100,12.0 -> ("sm100", "sm120")."""
    given = [a for v in (getattr(args, "arch", None) or []) for a in v.split(",") if a.strip()]
    return tuple(parse_arch(a, ws.catalog) for a in given) or None
