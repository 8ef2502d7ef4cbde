"""Base images made offline: debootstrap a Debian root, `docker import` it, tag, push."""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from docker.errors import APIError, ImageNotFound, NotFound

from ..catalog.hardware import Base
from ..errors import EnvError, InputError, JobFailed
from ..progress import SILENT, Progress
from ..workspace import Workspace
from . import daemon
from .daemon import run_cli
from .registry import Repository, check_reachable, manifest_digest, push


@dataclass(frozen=True)
class BaseResult:
    image: str
    image_id: str
    seconds: float
    size_bytes: int
    built: bool
    pushed: tuple[str, ...] = ()


def registry_tag(base: Base) -> str:
    """The tag a bootstrapped base gets in a registry repository."""
    return "base-" + base.image.split(":", 1)[1]


def bootstrap(client, base: Base, *, registry: Repository | None = None, rebuild: bool = False,
              progress: Progress = SILENT) -> BaseResult:
    if not base.bootstrap:
        raise InputError(f"base '{base.key}' ({base.image}) is pulled, not bootstrapped",
                         hint="users pull it with `docker pull`; only bases with a `bootstrap:` "
                              "recipe in images/bases.yaml are made here")
    if registry:
        check_reachable(registry)
    start = time.monotonic()
    built = False
    try:
        img = None if rebuild else client.images.get(base.image)
    except ImageNotFound:
        img = None
    if img is None and registry and not rebuild:
        img = _pull_from(client, base, registry, progress)
    if img is None:
        img = _debootstrap_import(client, base, progress)
        built = True
    pushed: tuple[str, ...] = ()
    if registry:
        ref = f"{registry.name}:{registry_tag(base)}"
        img.tag(ref)
        digest = push(client, ref)
        pushed = (f"{ref}@{digest}",)
    return BaseResult(base.image, img.id, time.monotonic() - start, img.attrs.get("Size", 0),
                      built, pushed)


def _pull_from(client, base: Base, registry: Repository, progress: Progress = SILENT):
    tag = registry_tag(base)
    if manifest_digest(registry, tag) is None:
        return None
    try:
        img = client.images.pull(registry.name, tag=tag)
    except (NotFound, APIError):
        return None
    img.tag(base.image)
    progress.note(f"pulled {registry.name}:{tag} as {base.image}")
    return img


def ensure_local(client, base: Base, registry: Repository | None) -> None:
    """Make the base available to the builder: local already, or pulled from the registry."""
    try:
        client.images.get(base.image)
        return
    except ImageNotFound:
        pass
    if base.bootstrap:
        if registry and _pull_from(client, base, registry) is not None:
            return
        raise EnvError(f"base image {base.image} is not here",
                       facts=[f"base '{base.key}' is made by `imgbuild base bootstrap`"],
                       hint="run `imgbuild base bootstrap"
                            + (f" --registry {registry.name}`" if registry else "`"))
    # Pulled bases (nvidia/cuda) come from their registry like any FROM.


def _debootstrap_import(client, base: Base, progress: Progress):
    recipe = base.bootstrap or {}
    exe = shutil.which("debootstrap")
    if not exe:
        raise EnvError("debootstrap is not installed",
                       hint="as root: `apt-get install -y debootstrap` (or `make setup`)")
    if os.geteuid() != 0:
        raise EnvError("debootstrap needs root", hint="run `imgbuild base bootstrap` as root")
    with tempfile.TemporaryDirectory(prefix="imgbuild-base-") as td:
        root = Path(td) / "rootfs"
        cmd = [exe, f"--variant={recipe.get('variant', 'minbase')}"]
        if recipe.get("include"):
            cmd.append("--include=" + ",".join(recipe["include"]))
        cmd += [recipe["suite"], str(root), recipe.get("mirror", "http://deb.debian.org/debian")]
        progress.note(f"debootstrap {recipe['suite']} ({recipe.get('variant', 'minbase')}, "
            f"+{','.join(recipe.get('include', []))}) ...")
        proc = subprocess.run(cmd, capture_output=True, text=True)
        if proc.returncode != 0:
            raise JobFailed("debootstrap failed", log_tail=(proc.stdout + proc.stderr).splitlines()[-20:],
                            hint="check that Debian's mirror is reachable")
        # What debootstrap leaves for apt's own use is no part of a base image.
        for sub in ("var/cache/apt/archives", "var/lib/apt/lists", "var/log"):
            for p in (root / sub).glob("*"):
                if p.is_file():
                    p.unlink()
        tar = subprocess.Popen(["tar", "-C", str(root), "--numeric-owner", "-c", "."],
                               stdout=subprocess.PIPE)
        assert tar.stdout is not None
        imp = run_cli(["import", "--change", 'CMD ["/bin/bash"]', "-", base.image],
                      stdin=tar.stdout, capture_output=True, text=True)
        tar.stdout.close()
        tar.wait()
        if imp.returncode != 0:
            raise JobFailed("docker import failed", log_tail=imp.stderr.splitlines()[-10:])
    return client.images.get(base.image)


def bootstrap_base(ws: Workspace, key: str, *, registry: str | None = None, rebuild: bool = False,
                   progress: Progress = SILENT) -> BaseResult:
    """`imgbuild base bootstrap`: the catalog's base `key`, made here (or reused), and pushed
    to `registry` when one is named."""
    bases = ws.catalog.bases
    if key not in bases:
        raise InputError(f"unknown base '{key}'", facts=["bases: " + ", ".join(sorted(bases))])
    repo = Repository.parse(registry) if registry else None
    if repo is not None and repo.host is None:
        raise InputError(f"--registry {registry} names no registry host",
                         hint="e.g. --registry 127.0.0.1:5000/imgbuild")
    client = daemon.client()
    return bootstrap(client, bases[key], registry=repo, rebuild=rebuild, progress=progress)
