"""What `imgbuild --version` and `imgbuild init` report."""

from __future__ import annotations

import os
import shlex
from pathlib import Path

from ...project import Written
from ..console import Output


def version(out: Output, info: dict) -> None:
    if out.json:
        out.print_json(info)
        return
    cat = info["catalog"]
    if cat is None:
        out.out.print(f"imgbuild {info['version']} (no built-in catalog: reinstall imgbuild)")
        return
    out.out.print(f"imgbuild {info['version']} (built-in catalog {cat['digest'][:7 + 16]}…, "
                  f"{cat['targets']} targets, {cat['model_profiles']} model profiles)")


def next_steps(w: Written, cwd: Path) -> list[str]:
    s = w.spec
    steps = []
    if w.root.resolve() != cwd.resolve():
        steps.append(f"cd {shlex.quote(os.path.relpath(w.root, cwd))}")
    if s.placeholder or not s.size_known:
        steps.append(f"edit images/models/{s.alias}.yaml (checkpoint, size_gb)")
    steps += [f"imgbuild lock {s.name}", f"imgbuild plan {s.name}",
              "git add . && git commit (the locks too: CI builds what is committed)"]
    return steps


def init(out: Output, w: Written, cwd: Path) -> None:
    steps = next_steps(w, cwd)
    if out.json:
        out.print_json({"root": str(w.root), "written": list(w.files), "target": w.spec.name,
                        "extends": w.spec.extends, "model": w.spec.alias,
                        "checkpoint": w.spec.checkpoint, "placeholder": w.spec.placeholder,
                        "next": steps})
        return
    out.out.print(f"wrote an imgbuild project in {w.root}:")
    for f in w.files:
        out.out.out(f"  {f}", highlight=False)
    out.out.print("next:")
    for i, step in enumerate(steps, 1):
        out.out.out(f"  {i}. {step}", highlight=False)
