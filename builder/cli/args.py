"""What several commands read from their arguments: the Workspace and the GPU archs."""

from __future__ import annotations

import argparse

from ..catalog.archs import gpu_named, parse_arch
from ..errors import InputError
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
    out = tuple(parse_arch(a, ws.catalog) for a in given) or None
    name = getattr(args, "target", None)
    if out and isinstance(name, str):
        _same_cpu(given, ws, name)
    return out


def _same_cpu(given: list[str], ws: Workspace, name: str) -> None:
    """A GPU named by its product sits in hosts of one CPU (GB10 and GB200 in Grace, aarch64):
    an image for the other CPU would never start there."""
    try:
        target = ws.catalog.target(name)
    except InputError:
        return  # the command says the target is unknown
    for a in given:
        gpu = gpu_named(a, ws.catalog)
        if gpu is not None and gpu.cpu_arch != target.cpu_arch:
            others = sorted(n for n, t in ws.catalog.targets.items()
                            if t.cpu_arch == gpu.cpu_arch and gpu.sm in t.archs)
            raise InputError(
                f"{a} sits in {gpu.cpu_arch} hosts, and {name} is an {target.cpu_arch} image",
                facts=[f"images/gpus.yaml: {', '.join(gpu.names)}: {gpu.sm}, cpu_arch "
                       f"{gpu.cpu_arch}",
                       f"{target.path}: cpu_arch {target.cpu_arch}"],
                hint=(f"use {' or '.join(others)}" if others else
                      f"use a target with `cpu_arch: {gpu.cpu_arch}`")
                + f", or --arch {gpu.sm} for {target.cpu_arch} hosts with that GPU")
