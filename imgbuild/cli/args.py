"""What several commands read from their arguments: the Workspace and the GPU archs."""

from __future__ import annotations

import argparse
import errno
from pathlib import Path

from ..catalog.archs import gpu_named, parse_arch
from ..catalog.targets import PLATFORMS
from ..errors import InputError
from ..fsutil import make_writable_dir
from ..image.reference import parse_cache_ref, parse_name
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
    given = [a.strip() for v in (getattr(args, "arch", None) or []) for a in v.split(",")]
    if any(not a for a in given):
        # `--arch ""` (an unset variable) would otherwise build for the target's own archs.
        raise InputError("--arch has an empty entry",
                         facts=[f"--arch {v!r}" for v in args.arch if any(
                             not a.strip() for a in v.split(","))],
                         hint="name a GPU or an arch (B200, sm100, 12.0), comma-separated, or "
                              "leave --arch out for the target's archs")
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
    cpus = {PLATFORMS[p] for p in target.platforms}
    for a in given:
        gpu = gpu_named(a, ws.catalog)
        if gpu is not None and gpu.cpu_arch not in cpus:
            others = sorted(n for n, t in ws.catalog.targets.items()
                            if gpu.cpu_arch in {PLATFORMS[p] for p in t.platforms}
                            and gpu.sm in t.archs)
            want = next(p for p, c in PLATFORMS.items() if c == gpu.cpu_arch)
            raise InputError(
                f"{a} sits in {gpu.cpu_arch} hosts, and {name} has no {want} image",
                facts=[f"images/gpus.yaml: {', '.join(gpu.names)}: {gpu.sm}, cpu_arch "
                       f"{gpu.cpu_arch}",
                       f"{target.path}: platforms: [{', '.join(target.platforms)}]"],
                hint=(f"use {' or '.join(others)}" if others else
                      f"use a target with `platforms: [{want}]`")
                + f", or --arch {gpu.sm} for {', '.join(target.platforms)} hosts with that GPU")


def platforms(args: argparse.Namespace) -> tuple[str, ...] | None:
    """--platform linux/arm64 (repeat or comma-separate) -> ("linux/arm64",); a bare arch
    (arm64, aarch64) is read as its linux platform. None: the target's platforms."""
    given = [p.strip() for v in (getattr(args, "platform", None) or []) for p in v.split(",")]
    if any(not p for p in given):
        raise InputError("--platform has an empty entry",
                         hint="name a platform: " + ", ".join(PLATFORMS))
    out = []
    for p in given:
        full = p if "/" in p else next((k for k, c in PLATFORMS.items()
                                        if p in (c, k.split("/")[1])), p)
        if full not in PLATFORMS:
            raise InputError(f"--platform {p}: not a platform imgbuild builds",
                             hint="one of " + ", ".join(PLATFORMS))
        out.append(full)
    return tuple(dict.fromkeys(out)) or None


def cache_from_refs(args: argparse.Namespace) -> tuple[str, ...]:
    """--cache-from's images, each checked (HOST/REPO:TAG), in the order given."""
    refs = tuple(getattr(args, "cache_from", None) or ())
    if refs and getattr(args, "no_cache_from", False):
        raise InputError("--cache-from and --no-cache-from ask for opposite things",
                         facts=[f"--cache-from {refs[0]}", "--no-cache-from: reuse no image's "
                                "layers from a registry"],
                         hint="drop one of them")
    for ref in refs:
        parse_cache_ref(ref)
    return refs


def log_dir(args: argparse.Namespace) -> Path | None:
    """--log-dir DIR: made now if missing (as `mkdir -p`) and proven writable, before a build
    starts whose log goes there. A DIR that cannot be that directory (a file, below a file, on
    a read-only disk, not ours to write) is a bad argument: exit 2, said before any work."""
    given = getattr(args, "log_dir", None)
    if given is None:
        return None
    hint = "name a directory imgbuild can create and write in, or leave --log-dir out"
    if not given.strip():
        # `--log-dir "$LOGS"` with LOGS unset would otherwise keep no log, silently.
        raise InputError("--log-dir is empty", hint=hint)
    path = Path(given).expanduser()
    try:
        make_writable_dir(path)
    except OSError as e:
        if path.exists() and not path.is_dir():
            why = "it is a file, not a directory"
        elif e.errno == errno.ENOTDIR:
            why = "a part of the path is a file, not a directory"
        else:
            why = f"cannot create it or write in it: {e.strerror or e}"
        raise InputError(f"--log-dir {given}: {why}", facts=["nothing was built"],
                         hint=hint) from None
    return path
