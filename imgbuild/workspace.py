"""The Workspace: the catalog one command works on, its locks, and the wheel directory.

It is made once per command and handed to every stage. The catalog, the patches, the check
tables and each target's lock are read through it, from two layers at most: the catalog built
into imgbuild (the repository's images/ and lockfiles/, which the wheel carries), and the
user's project above it (their own targets, model profiles, patches and failure entries, which
add to the built-in ones or shadow them by name). Nothing is read from anywhere else, and
nothing is written into the built-in layer of an installed imgbuild.
"""

from __future__ import annotations

import hashlib
import os
import shutil
from collections.abc import Mapping
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path

from .catalog.catalog import Catalog, load_catalog
from .catalog.checkpoints import resolve_profile
from .catalog.engines import ENGINE_FILES, EngineTable, load_engines
from .catalog.failures import FailureCatalog, load_failures
from .catalog.families import FAMILY_FILES, SymbolFamily, load_families
from .catalog.kernels import KERNELS_FILE, EngineKernels, load_kernel_rules
from .catalog.launch import LaunchTable, load_launch
from .catalog.layers import BUILTIN, PROJECT, Layer
from .catalog.models import ModelProfile
from .catalog.patches import Patch, load_patches
from .catalog.registries import RegistryTable, load_registries
from .catalog.schema import Doc, read_yaml
from .catalog.targets import Target
from .errors import InputError
from .lock.lockfile import Lockfile, LockRequest, read_lock
from .lock.request import lock_request

# The package this module runs from: an installed imgbuild carries its catalog in builtin/
# (setup.py copies it there when the wheel is built); a checkout (an editable install) reads
# the repository's own images/ and lockfiles/ beside the package.
_PACKAGE = Path(__file__).resolve().parent
_CHECKOUT = _PACKAGE.parent
# The file that marks a user's project (`imgbuild init` writes it): images/ and lockfiles/
# beside it, or where it says.
PROJECT_FILE = "imgbuild.yaml"


@dataclass(frozen=True)
class Builtin:
    """The catalog imgbuild ships with."""

    images: Path
    lockfiles: Path
    packaged: bool  # inside the installed package: read-only (a checkout's is the repository's)

    def digest(self) -> str:
        """Every file of the built-in catalog (images/ and lockfiles/), by path and content:
        what `imgbuild --version` names, the same from the wheel and from the checkout."""
        h = hashlib.sha256()
        for top in (self.images, self.lockfiles):
            for f in sorted(p for p in top.rglob("*") if p.is_file()
                            and "__pycache__" not in p.parts and p.suffix != ".pyc"):
                h.update(f"{top.name}/{f.relative_to(top).as_posix()}\0".encode())
                h.update(hashlib.sha256(f.read_bytes()).digest())
        return "sha256:" + h.hexdigest()


def builtin_catalog() -> Builtin | None:
    """The built-in catalog: the package's copy, else the checkout's; None when neither is
    there (a broken install)."""
    packaged = _PACKAGE / "builtin"
    if (packaged / "images" / "bases.yaml").is_file():
        return Builtin(packaged / "images", packaged / "lockfiles", packaged=True)
    if (_CHECKOUT / "images" / "bases.yaml").is_file():
        return Builtin(_CHECKOUT / "images", _CHECKOUT / "lockfiles", packaged=False)
    return None


@dataclass(frozen=True)
class TargetRef:
    """A target and its lock: what lock, plan, the checks and CI ask a workspace for."""

    target: Target
    request: LockRequest
    lock_path: Path
    display: str  # the lock's path as messages show it (lockfiles/NAME inside the workspace)
    # The lock is the built-in catalog's, read where imgbuild is installed: `lock` copies it
    # into the project before it writes anything (Workspace.lock_dir).
    builtin: bool = False

    @property
    def name(self) -> str:
        return self.target.name

    @property
    def has_lock(self) -> bool:
        return self.lock_path.is_file()

    def lock(self) -> Lockfile:
        """The committed lock, verified (a hand-edited or truncated one is refused)."""
        if not self.lock_path.exists():
            raise InputError(f"target '{self.name}' has no lock yet",
                             facts=[f"expected {self.display}"],
                             hint=f"run `imgbuild lock {self.name}` (and commit lockfiles/: "
                                  "CI builds what the repository pins)")
        return read_lock(self.lock_path)


@dataclass(frozen=True)
class Workspace:
    """images/ and lockfiles/ of the top layer (the project's, or the built-in catalog's when
    there is no project), and below them the built-in catalog's when it is a layer of its own."""

    images: Path
    lockfiles: Path
    wheels: Path | None = None
    base: Builtin | None = None  # the built-in layer under a project (None: one layer)
    read_only: bool = False  # the top layer is an installed imgbuild's built-in catalog

    @classmethod
    def open(cls, images: str | Path | None = None, lockfiles: str | Path | None = None,
             wheels: str | Path | None = None, *, env: Mapping[str, str] | None = None,
             cwd: Path | None = None) -> Workspace:
        """The directories a command works on.

        The project: --images DIR (or $IMGBUILD_IMAGES), else the nearest directory at or above
        the working one with an imgbuild.yaml (a project, `imgbuild init`) or an images/ with a
        bases.yaml (a catalog of its own, such as this repository), else none.
        lockfiles: the argument, else $IMGBUILD_LOCKFILES, else lockfiles/ beside images/.
        wheels: the argument, else $IMGBUILD_WHEELS, else none.

        A project's images/ adds to the built-in catalog; one with its own bases.yaml is a
        whole catalog and replaces it. With no project, the built-in catalog is the workspace,
        read-only when it is an installed imgbuild's.
        """
        env = os.environ if env is None else env
        here = cwd or Path.cwd()
        given = images or env.get("IMGBUILD_IMAGES")
        locks = lockfiles or env.get("IMGBUILD_LOCKFILES")
        lock_dir = Path(locks).expanduser().absolute() if locks else None
        whl = wheels or env.get("IMGBUILD_WHEELS") or None
        wheel_dir = Path(whl).expanduser().absolute() if whl else None
        if wheel_dir is not None and not wheel_dir.is_dir():
            raise InputError(f"--wheels {whl}: no such directory",
                             hint="point it at a directory of .whl files, or leave it out")
        builtin = builtin_catalog()
        if given:
            img = Path(given).expanduser().absolute()
            if not img.is_dir():
                raise InputError(f"--images {img}: no such directory",
                                 hint="point it at your project's images/ directory (the one "
                                      "with the targets), or leave --images out")
        else:
            found = _discover(here)
            img = found[0] if found else None
            lock_dir = lock_dir or (found[1] if found else None)
        if img is None:
            if builtin is None:
                raise InputError("no images/ directory found, and imgbuild has no built-in "
                                 "catalog", facts=[f"none in {here} or above it",
                                                   f"{_PACKAGE / 'builtin'} is missing"],
                                 hint="reinstall imgbuild from its wheel, or pass --images DIR")
            return cls(builtin.images, lock_dir or builtin.lockfiles, wheel_dir,
                       read_only=builtin.packaged and lock_dir is None)
        lock_dir = lock_dir or img.parent / "lockfiles"
        whole = (img / "bases.yaml").is_file() or builtin is None \
            or img.resolve() == builtin.images.resolve()
        return cls(img, lock_dir, wheel_dir, base=None if whole else builtin)

    @property
    def layers(self) -> tuple[Layer, ...]:
        """The catalog's images/ directories, lowest first."""
        top = Layer(self.images, BUILTIN if self.read_only else PROJECT)
        return (Layer(self.base.images, BUILTIN), top) if self.base else (top,)

    @property
    def builtin(self) -> Builtin | None:
        """The built-in catalog, where this workspace reads it (as a layer, or as itself)."""
        return self.base or builtin_catalog()

    # Each table is read on first use, once: a command reads only what it needs.
    @cached_property
    def catalog(self) -> Catalog:
        return load_catalog(list(self.layers))

    @cached_property
    def patches(self) -> dict[str, Patch]:
        out: dict[str, Patch] = {}
        for layer in self.layers:
            out |= load_patches(layer.images)  # a project's patch shadows one of its id
        return out

    # The check tables are whole files: the highest layer that has one is read.
    def _table(self, *names: str) -> Path:
        for layer in reversed(self.layers):
            if any((layer.images / n).is_file() for n in names):
                return layer.images
        return self.layers[0].images

    @cached_property
    def engines(self) -> EngineTable:
        return load_engines(self._table(*ENGINE_FILES))

    @cached_property
    def families(self) -> tuple[SymbolFamily, ...]:
        return load_families(self._table(*FAMILY_FILES))

    @cached_property
    def kernel_rules(self) -> dict[str, EngineKernels]:
        return load_kernel_rules(self._table(KERNELS_FILE))

    @cached_property
    def launch(self) -> LaunchTable:
        return load_launch([layer.images for layer in self.layers])

    @cached_property
    def registries(self) -> RegistryTable:
        """How pushes to each registry are written (layer compression)."""
        return load_registries([layer.images for layer in self.layers])

    @cached_property
    def failures(self) -> FailureCatalog:
        # Failure entries add up: a project's own are matched beside the catalog's.
        return load_failures([layer.images for layer in self.layers])

    def model(self, alias: str) -> ModelProfile:
        """A model profile by alias (an unknown one is an error with the closest name), its
        quantization read from the checkpoint when the profile leaves it out."""
        return resolve_profile(self.catalog.model(alias), self.images.parent)

    def target(self, name: str, platform: str | None = None) -> TargetRef:
        """A target by name (an unknown one is an error with the closest name) on one of its
        platforms (default: the first it names), with that platform's lock request and path."""
        t = self.catalog.target(name)
        t = t.on(platform or t.platforms[0])
        req = lock_request(t, self.catalog.base(t.os, t.cpu_arch), self.catalog.toolchain)
        path = self.lockfiles / req.filename()
        shipped = self.base.lockfiles / req.filename() if self.base else None
        # A built-in target the project has not locked itself, or a project target that asks
        # exactly what a built-in lock answers (one that shadows its own name and changes only
        # what the lock does not depend on): the shipped lock, read in place.
        if shipped is not None and not path.exists() and shipped.exists() and (
                self.catalog.origin.get(name) == BUILTIN
                or read_lock(shipped).inputs_hash == req.inputs_hash()):
            return TargetRef(t, req, shipped, self.display(shipped), builtin=True)
        return TargetRef(t, req, path, self.display(path), builtin=self.read_only)

    def platform_refs(self, name: str,
                      platforms: tuple[str, ...] | None = None) -> tuple[TargetRef, ...]:
        """The target on each of its platforms (or on those asked for, in the target's order):
        one lock per platform."""
        t = self.catalog.target(name)
        for p in platforms or ():
            t.on(p)  # refuses a platform the target does not name
        return tuple(self.target(name, p) for p in t.platforms
                     if platforms is None or p in platforms)

    def display(self, path: Path) -> str:
        """A path as messages show it: relative to the workspace (the directory that holds
        images/) when it lies inside it; a built-in layer's file says so."""
        for root, tail in ((self.images.parent, ""),
                           (self.base.images.parent if self.base else None, " (built-in)")):
            if root is None:
                continue
            try:
                return str(Path(path).relative_to(root)) + tail
            except ValueError:
                continue
        return str(path)

    def lock_dir(self) -> Path:
        """Where locks are written: the project's lockfiles/. Refused (exit 2) where the only
        catalog is an installed imgbuild's: that one is read-only."""
        if self.read_only:
            raise InputError(
                "the built-in catalog is read-only",
                facts=[f"no project here: no {PROJECT_FILE} in this directory or above it, and "
                       "no --images", f"the built-in locks are in {self.lockfiles}, inside the "
                       "installed imgbuild"],
                hint="run `imgbuild init` to make a project (or pass --images DIR / --lockfiles "
                     "DIR): its lockfiles/ takes the locks, and a built-in target's lock is "
                     "copied there when you lock it")
        return self.lockfiles

    def spec_file(self, relative: str, what: str) -> Path:
        """A catalog file a command is about to rewrite (a target's spec, bases.yaml), in the
        top layer; refused (exit 2) when that file is the built-in catalog's: an installed
        imgbuild's is read-only, and under a project the change belongs in the project."""
        path = self.images / relative
        if self.read_only or (self.base is not None and not path.is_file()):
            shipped = (self.base.images if self.base else self.images) / relative
            raise InputError(
                f"{what} would rewrite images/{relative}, which is the built-in catalog's",
                facts=[f"{shipped} ships with imgbuild" + (" (read-only)" if self.read_only
                                                           else "")],
                hint=("run `imgbuild init` to make a project, then " if self.read_only else "")
                + f"make it the project's own: images/{relative} in the project"
                + (f" with `extends: {Path(relative).stem}` (and only what differs)"
                   if "/" not in relative and relative != "bases.yaml" else " (a copy)"))
        return path

    def adopt_builtin_locks(self, refs: list[TargetRef] | tuple[TargetRef, ...]) -> list[str]:
        """Copy each built-in lock of `refs` into the project's lockfiles/ (with its kernel
        record): locking a built-in target in a project starts from the shipped lock. Returns
        what was copied, as messages show it."""
        done = []
        for ref in refs:
            if not ref.builtin or self.read_only:
                continue
            self.lockfiles.mkdir(parents=True, exist_ok=True)
            for src in (ref.lock_path, ref.lock_path.with_name(ref.lock_path.stem
                                                                + ".kernels.json")):
                if src.is_file():
                    dst = self.lockfiles / src.name
                    shutil.copyfile(src, dst)
                    done.append(f"{self.display(src)} -> {self.display(dst)}")
        return done


def _discover(cwd: Path) -> tuple[Path, Path] | None:
    """The nearest project (imgbuild.yaml) or whole catalog (images/bases.yaml) at or above
    cwd: its images/ and lockfiles/."""
    for d in (cwd, *cwd.parents):
        if (d / PROJECT_FILE).is_file():
            return read_project(d / PROJECT_FILE)
        if (d / "images" / "bases.yaml").is_file():
            return d / "images", d / "lockfiles"
    return None


def read_project(path: Path) -> tuple[Path, Path]:
    """A project file: where its images/ and lockfiles/ are (default: beside it)."""
    root = path.parent
    data = read_yaml(path, root) or {}
    doc = Doc(path.name, data)
    doc.reject_unknown({"images", "lockfiles"})
    out = []
    for key in ("images", "lockfiles"):
        d = (root / doc.get(key, str, key)).absolute()
        if key == "images" and not d.is_dir():
            raise InputError(f"{path}: images: {d} is not a directory",
                             hint=f"create it, or fix `images:` in {path.name}")
        out.append(d)
    return out[0], out[1]
