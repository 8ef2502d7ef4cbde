"""The Workspace: the images/ directory, the lockfiles/ directory and the wheel directory one
command works on.

It is made once per command and handed to every stage. The catalog, the patches, the check
tables and each target's lock are read through it, from the directories the user named (or
the defaults `Workspace.open` states), and from nowhere else.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path

from .catalog.catalog import Catalog, load_catalog
from .catalog.engines import EngineTable, load_engines
from .catalog.failures import FailureCatalog, load_failures
from .catalog.families import SymbolFamily, load_families
from .catalog.kernels import EngineKernels, load_kernel_rules
from .catalog.patches import Patch, load_patches
from .catalog.targets import Target
from .errors import InputError
from .lock.lockfile import Lockfile, LockRequest, read_lock
from .lock.request import lock_request

# The checkout this module runs from, when it runs from one (an editable install): the last
# place `open` looks for images/.
_CHECKOUT = Path(__file__).resolve().parent.parent


@dataclass(frozen=True)
class TargetRef:
    """A target and its lock: what lock, plan, the checks and CI ask a workspace for."""

    target: Target
    request: LockRequest
    lock_path: Path
    display: str  # the lock's path as messages show it (lockfiles/NAME inside the workspace)

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
    images: Path
    lockfiles: Path
    wheels: Path | None = None

    @classmethod
    def open(cls, images: str | Path | None = None, lockfiles: str | Path | None = None,
             wheels: str | Path | None = None, *, env: Mapping[str, str] | None = None,
             cwd: Path | None = None) -> Workspace:
        """The directories a command works on.

        images: the argument, else $IMGBUILD_IMAGES, else the nearest `images/` holding a
        bases.yaml in the working directory or above it, else the checkout imgbuild runs from.
        lockfiles: the argument, else $IMGBUILD_LOCKFILES, else lockfiles/ beside images/.
        wheels: the argument, else $IMGBUILD_WHEELS, else none.
        """
        env = os.environ if env is None else env
        given = images or env.get("IMGBUILD_IMAGES")
        img = Path(given) if given else _discover(cwd or Path.cwd())
        if img is None:
            raise InputError("no images/ directory found",
                             facts=[f"none in {cwd or Path.cwd()} or above it, and imgbuild "
                                    "does not run from a checkout"],
                             hint="pass --images DIR (or set IMGBUILD_IMAGES): the directory "
                                  "with bases.yaml and the targets")
        img = img.expanduser().absolute()
        if not img.is_dir():
            raise InputError(f"--images {img}: no such directory",
                             hint="point it at the directory with bases.yaml and the targets")
        locks = lockfiles or env.get("IMGBUILD_LOCKFILES")
        lock_dir = Path(locks).expanduser().absolute() if locks else img.parent / "lockfiles"
        whl = wheels or env.get("IMGBUILD_WHEELS") or None
        wheel_dir = Path(whl).expanduser().absolute() if whl else None
        if wheel_dir is not None and not wheel_dir.is_dir():
            raise InputError(f"--wheels {whl}: no such directory",
                             hint="point it at a directory of .whl files, or leave it out")
        return cls(img, lock_dir, wheel_dir)

    # Each table is read on first use, once: a command reads only what it needs.
    @cached_property
    def catalog(self) -> Catalog:
        return load_catalog(self.images)

    @cached_property
    def patches(self) -> dict[str, Patch]:
        return load_patches(self.images)

    @cached_property
    def engines(self) -> EngineTable:
        return load_engines(self.images)

    @cached_property
    def families(self) -> tuple[SymbolFamily, ...]:
        return load_families(self.images)

    @cached_property
    def kernel_rules(self) -> dict[str, EngineKernels]:
        return load_kernel_rules(self.images)

    @cached_property
    def failures(self) -> FailureCatalog:
        return load_failures(self.images)

    def target(self, name: str, platform: str | None = None) -> TargetRef:
        """A target by name (an unknown one is an error with the closest name) on one of its
        platforms (default: the first it names), with that platform's lock request and path."""
        t = self.catalog.target(name)
        t = t.on(platform or t.platforms[0])
        req = lock_request(t, self.catalog.base(t.os, t.cpu_arch), self.catalog.toolchain)
        path = self.lockfiles / req.filename()
        return TargetRef(t, req, path, self.display(path))

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
        images/) when it lies inside it."""
        try:
            return str(Path(path).relative_to(self.images.parent))
        except ValueError:
            return str(path)


def _discover(cwd: Path) -> Path | None:
    for d in (cwd, *cwd.parents):
        if (d / "images" / "bases.yaml").is_file():
            return d / "images"
    own = _CHECKOUT / "images"
    return own if (own / "bases.yaml").is_file() else None
