"""`imgbuild init [DIR]`: a project (imgbuild.yaml, a target that extends a built-in one, its
model profile, lockfiles/, a CI workflow, a README), written all or nothing."""

from __future__ import annotations

from pathlib import Path

from ...errors import InputError
from ...project import plan_project, write_project
from ...workspace import builtin_catalog
from ..parser import COMMANDS
from ..views import project as views


def run(args, out) -> int:
    builtin = builtin_catalog()
    if builtin is None:
        raise InputError("imgbuild has no built-in catalog to extend",
                         hint="reinstall imgbuild from its wheel")
    spec = plan_project(builtin, Path(args.dir), extends=args.extends, name=args.name,
                        model=args.model, tensor_parallel=args.tp, size_gb=args.size_gb,
                        reserved=frozenset(COMMANDS))
    views.init(out, write_project(spec), Path.cwd())
    return 0
