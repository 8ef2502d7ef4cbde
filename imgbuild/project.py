"""A user's project, as `imgbuild init` writes it: the project file, one target that extends a
built-in one, its model profile, lockfiles/, a CI workflow and a README.

The files' texts are data (imgbuild/templates/project/, shipped in the wheel): the tree there
is the project's tree, with `@{key}` placeholders in names and texts (not `{key}`: YAML flow
mappings and GitHub's `${{ }}` expressions use braces), and a leading `dot-` for a name that
starts with a dot (setuptools' package-data globs skip dot directories).
"""

from __future__ import annotations

import math
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

from .catalog.schema import unknown
from .errors import InputError
from .fsutil import cannot_write
from .workspace import Builtin, Workspace

TEMPLATES = Path(__file__).resolve().parent / "templates" / "project"
_PLACEHOLDER = re.compile(r"@\{([a-z_]+)\}")

# Target and model names become file names, lock names, command-line words and image tags:
# TARGET-MODEL-<16 hex> and TARGET-MODEL-<engine><version> stay within Docker's 128 characters.
NAME_MAX = 48
NAME_RE = re.compile(rf"^[a-z0-9][a-z0-9._-]{{0,{NAME_MAX - 1}}}$")
# org/name, or a bare name (older Hugging Face repos); a local directory is told apart first.
HF_REPO_RE = re.compile(r"^(?:[A-Za-z0-9][A-Za-z0-9._-]*/)?[A-Za-z0-9][A-Za-z0-9._-]*$")
PLACEHOLDER_CHECKPOINT = "your-org/your-model"
PLACEHOLDER_SIZE_GB = 1.0


def imgbuild_version() -> str:
    try:
        return version("imgbuild")
    except PackageNotFoundError:
        return "unknown"


@dataclass(frozen=True)
class ProjectSpec:
    """What `imgbuild init` writes, decided and checked before anything is written."""

    root: Path
    name: str  # the example target
    extends: str  # the built-in target it starts from
    alias: str  # its model profile
    model_name: str
    checkpoint: str  # as the profile says it (a local directory relative to root when inside)
    placeholder: bool  # the checkpoint is the placeholder to replace
    size_gb: float
    size_known: bool  # given, or measured from a local checkpoint
    tensor_parallel: int
    pin_example: str  # a requirements entry for the commented example
    arch_example: str

    def values(self) -> dict[str, str]:
        notes = {
            "checkpoint_note": ("\n# PLACEHOLDER: replace it with your checkpoint (the profile "
                                "cannot be used before)." if self.placeholder else ""),
            "size_note": "" if self.size_known else (
                "\n# PLACEHOLDER: replace it with the checkpoint's size (`imgbuild init "
                "--size-gb G` writes it)."),
        }
        return {"name": self.name, "extends": self.extends, "alias": self.alias,
                "model_name": self.model_name, "checkpoint": self.checkpoint,
                "size_gb": f"{self.size_gb:g}", "tp": str(self.tensor_parallel),
                "pin_example": self.pin_example, "arch_example": self.arch_example,
                "version": imgbuild_version(), **notes}


@dataclass(frozen=True)
class Written:
    root: Path
    files: tuple[str, ...]  # relative to root, in the order written
    spec: ProjectSpec


def check_name(value: str, what: str, reserved: frozenset[str] = frozenset()) -> str:
    if not NAME_RE.match(value):
        raise InputError(f"{what} {value!r}: not a name imgbuild can use",
                         facts=["it names a file under images/, its locks and its image tags"],
                         hint="use lowercase letters, digits, '.', '_' and '-', starting with a "
                              f"letter or digit (at most {NAME_MAX} characters), e.g. my-sglang")
    if value in reserved:
        raise InputError(f"{what} {value!r} is an imgbuild command",
                         facts=[f"`imgbuild {value}` runs the command, not a build of the target"],
                         hint=f"choose another name, e.g. my-{value}")
    return value


def _alias_of(text: str) -> str:
    tail = text.rstrip("/").rsplit("/", 1)[-1].lower()
    alias = re.sub(r"[^a-z0-9._-]+", "-", tail).strip("-._")[:NAME_MAX].rstrip("-._")
    return alias or "my-model"


def _dir_size_gb(path: Path) -> float:
    # Symlinks followed: a Hugging Face cache snapshot links each file to its blob.
    total = sum(p.stat().st_size for p in path.rglob("*") if p.is_file())
    return max(0.01, math.ceil(total / 1e9 * 100) / 100)


def _checkpoint(given: str | None, root: Path, cwd: Path) -> tuple[str, Path | None]:
    """The checkpoint as the profile writes it, and the local directory when it is one."""
    if given is None:
        return PLACEHOLDER_CHECKPOINT, None
    if not given.strip():
        raise InputError("--model is empty", hint="give a Hugging Face repo id (org/name) or a "
                                                  "local directory, or leave --model out")
    path = (cwd / Path(given).expanduser()).absolute()
    looks_local = given.startswith(("/", ".", "~")) or path.exists()
    if looks_local:
        if not path.is_dir():
            raise InputError(f"--model {given}: no such directory",
                             facts=[f"looked for {path}"],
                             hint="give a checkpoint directory (with its config.json) or a "
                                  "Hugging Face repo id (org/name)")
        try:
            return path.relative_to(root.absolute()).as_posix(), path
        except ValueError:
            return str(path), path
    if not HF_REPO_RE.match(given):
        raise InputError(f"--model {given}: neither a local directory nor a Hugging Face repo id",
                         hint="a repo id is org/name (letters, digits, '.', '_', '-'), e.g. "
                              "Qwen/Qwen3-8B")
    return given, None


def plan_project(builtin: Builtin, root: Path, *, extends: str, name: str | None = None,
                 model: str | None = None, tensor_parallel: int = 1,
                 size_gb: float | None = None, reserved: frozenset[str] = frozenset(),
                 cwd: Path | None = None) -> ProjectSpec:
    """Check every argument against the built-in catalog; nothing is written."""
    cwd = cwd or Path.cwd()
    root = (cwd / root).absolute()
    ws = Workspace(builtin.images, builtin.lockfiles)
    targets = ws.catalog.targets
    if extends not in targets:
        e = unknown("built-in target", extends, targets)
        raise InputError(f"--extends {extends}: not a built-in target", facts=e.facts,
                         hint=e.hint)
    name = check_name(name if name is not None else f"my-{extends}", "--name", reserved)
    if name in ws.catalog.generators:
        raise InputError(f"--name {name}: a built-in image imgbuild itself runs has that name",
                         hint=f"choose another name, e.g. my-{name}")
    if tensor_parallel < 1:
        raise InputError(f"--tp {tensor_parallel}: not a GPU count",
                         hint="give the number of GPUs the model is sharded over (1 or more)")
    if size_gb is not None and not (size_gb > 0 and math.isfinite(size_gb)):
        raise InputError(f"--size-gb {size_gb:g}: not a size",
                         hint="give the checkpoint's size on disk in GB, e.g. 16")
    checkpoint, local = _checkpoint(model, root, cwd)
    placeholder = model is None
    alias = "my-model" if placeholder else _alias_of(checkpoint)
    if alias in ws.catalog.models:
        # Not shadowed by accident: the built-in profiles include the smoke model every target
        # is tested with.
        alias = f"my-{alias}"[:NAME_MAX].rstrip("-._")
    target = targets[extends]
    measured = _dir_size_gb(local) if local is not None and size_gb is None else None
    return ProjectSpec(
        root=root, name=name, extends=extends, alias=alias,
        model_name="your model" if placeholder else checkpoint.rstrip("/").rsplit("/", 1)[-1],
        checkpoint=checkpoint, placeholder=placeholder,
        size_gb=size_gb or measured or PLACEHOLDER_SIZE_GB,
        size_known=size_gb is not None or measured is not None,
        tensor_parallel=tensor_parallel, pin_example=_pin_example(ws, extends),
        arch_example=target.archs[0] if target.archs else "sm100")


def _pin_example(ws: Workspace, target: str) -> str:
    """A real pin for the commented example: the version the built-in lock holds."""
    ref = ws.target(target)
    lock = ref.lock() if ref.has_lock else None
    for package in ("transformers", ws.catalog.targets[target].engine):
        locked = lock.package(package) if lock is not None else None
        if locked is not None:
            return f"{package}=={locked.version}"
    return "transformers==VERSION"


def fill(text: str, values: Mapping[str, str], where: str) -> str:
    def one(m: re.Match) -> str:
        if m.group(1) not in values:
            raise KeyError(f"{where}: unknown placeholder @{{{m.group(1)}}}")
        return values[m.group(1)]

    return _PLACEHOLDER.sub(one, text)


def render(spec: ProjectSpec, templates: Path = TEMPLATES) -> dict[str, str]:
    """Each file of the project (its path relative to the project, posix) -> its text."""
    values = spec.values()
    out: dict[str, str] = {}
    for src in sorted(p for p in templates.rglob("*") if p.is_file()
                      and "__pycache__" not in p.parts):
        rel = src.relative_to(templates).as_posix()
        parts = ["." + p[4:] if p.startswith("dot-") else p for p in rel.split("/")]
        out[fill("/".join(parts), values, rel)] = fill(src.read_text(), values, rel)
    out = dict(sorted(out.items()))
    if not out:
        raise InputError(f"imgbuild's project templates are missing: {templates}",
                         hint="reinstall imgbuild from its wheel")
    return out


def _clashes(root: Path, files: Mapping[str, str]) -> list[str]:
    """What is in the way: a file to write that exists already (of any kind), or a path on the
    way to one that is not a directory."""
    out: list[str] = []
    for d in [root, *root.parents]:
        if d.exists() or d.is_symlink():
            if not d.is_dir():
                out.append(f"{d} is a file, not a directory")
            break
    for rel in files:
        dest = root / rel
        if dest.exists() or dest.is_symlink():
            out.append(f"{dest} exists")
            continue
        for d in list(dest.parents)[:len(Path(rel).parts) - 1]:
            if (d.exists() or d.is_symlink()) and not d.is_dir():
                out.append(f"{d} is a file, not a directory")
                break
    return list(dict.fromkeys(out))


def write_project(spec: ProjectSpec, templates: Path = TEMPLATES) -> Written:
    """Write the project under spec.root, all or nothing: every path is checked first, a file
    is only ever created (never replaced), and on any error what was made is removed."""
    files = render(spec, templates)
    root = spec.root
    clashes = _clashes(root, files)
    if clashes:
        raise InputError(f"cannot write the project into {root}: {len(clashes)} path"
                         f"{'s' if len(clashes) > 1 else ''} in the way",
                         facts=[*clashes, "nothing was written"],
                         hint="choose another directory (imgbuild init DIR) or another --name, "
                              "or move those files away")
    made_dirs: list[Path] = []
    made_files: list[Path] = []

    def mkdirs(d: Path) -> None:
        missing = [p for p in [d, *d.parents] if not p.exists()]
        for p in reversed(missing):
            p.mkdir()
            made_dirs.append(p)

    current = root
    try:
        for rel, text in files.items():
            current = root / rel
            mkdirs(current.parent)
            # O_EXCL: a file that appeared since the check is an error, never overwritten.
            fd = os.open(current, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
            made_files.append(current)
            with os.fdopen(fd, "w") as f:
                f.write(text)
    except BaseException as e:
        for p in reversed(made_files):
            p.unlink(missing_ok=True)
        for d in reversed(made_dirs):
            try:
                d.rmdir()
            except OSError:
                pass
        if isinstance(e, FileExistsError):
            raise InputError(f"{current} appeared while the project was written",
                             facts=["nothing was written"],
                             hint="run `imgbuild init` again") from None
        if isinstance(e, OSError):
            raise cannot_write(current, e, "the project file") from None
        raise
    return Written(root, tuple(files), spec)
