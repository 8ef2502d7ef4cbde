"""Base images made offline: debootstrap a Debian root, `docker import` it, tag, push."""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from .errors import EnvError, InputError, JobFailed
from .registry import Repository, check_reachable, push
from .spec import Base


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
              log=print) -> BaseResult:
    if not base.bootstrap:
        raise InputError(f"base '{base.key}' ({base.image}) is pulled, not bootstrapped",
                         hint="users pull it with `docker pull`; only bases with a `bootstrap:` "
                              "recipe in images/bases.yaml are made here")
    if registry:
        check_reachable(registry)
    from docker.errors import ImageNotFound

    start = time.monotonic()
    built = False
    try:
        img = None if rebuild else client.images.get(base.image)
    except ImageNotFound:
        img = None
    if img is None and registry and not rebuild:
        img = _pull_from(client, base, registry, log)
    if img is None:
        img = _debootstrap_import(client, base, log)
        built = True
    pushed: tuple[str, ...] = ()
    if registry:
        ref = f"{registry.name}:{registry_tag(base)}"
        img.tag(ref)
        digest = push(client, ref)
        pushed = (f"{ref}@{digest}",)
    return BaseResult(base.image, img.id, time.monotonic() - start, img.attrs.get("Size", 0),
                      built, pushed)


def _pull_from(client, base: Base, registry: Repository, log):
    from docker.errors import APIError, NotFound

    from .registry import manifest_digest

    tag = registry_tag(base)
    if manifest_digest(registry, tag) is None:
        return None
    try:
        img = client.images.pull(registry.name, tag=tag)
    except (NotFound, APIError):
        return None
    img.tag(base.image)
    log(f"pulled {registry.name}:{tag} as {base.image}")
    return img


def ensure_local(client, base: Base, registry: Repository | None) -> None:
    """Make the base available to the builder: local already, or pulled from the registry."""
    from docker.errors import ImageNotFound

    try:
        client.images.get(base.image)
        return
    except ImageNotFound:
        pass
    if base.bootstrap:
        if registry and _pull_from(client, base, registry, lambda *_: None) is not None:
            return
        raise EnvError(f"base image {base.image} is not here",
                       facts=[f"base '{base.key}' is made by `imgbuild base bootstrap`"],
                       hint="run `imgbuild base bootstrap"
                            + (f" --registry {registry.name}`" if registry else "`"))
    # Pulled bases (nvidia/cuda) come from their registry like any FROM.


def _debootstrap_import(client, base: Base, log):
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
        log(f"debootstrap {recipe['suite']} ({recipe.get('variant', 'minbase')}, "
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
        from .dockerenv import run_cli

        imp = run_cli(["import", "--change", 'CMD ["/bin/bash"]', "-", base.image],
                      stdin=tar.stdout, capture_output=True, text=True)
        tar.stdout.close()
        tar.wait()
        if imp.returncode != 0:
            raise JobFailed("docker import failed", log_tail=imp.stderr.splitlines()[-10:])
    return client.images.get(base.image)
