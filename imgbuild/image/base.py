"""Base images made offline: debootstrap a Debian root, `docker import` it, tag, push."""

from __future__ import annotations

import hashlib
import io
import json
import os
import platform
import re
import shutil
import subprocess
import tarfile
import tempfile
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from docker.errors import APIError, NotFound

from ..catalog.hardware import DEBIAN_ARCH, Base
from ..errors import EnvError, InputError, JobFailed
from ..fsutil import atomic_write_text
from ..progress import SILENT, Progress
from ..workspace import Workspace
from . import buildlock, daemon
from .registry import Repository, check_reachable, manifest_digest
from .wire import push_ref


@dataclass(frozen=True)
class BaseResult:
    image: str
    image_id: str
    seconds: float
    size_bytes: int
    built: bool
    pushed: tuple[str, ...] = ()
    rootfs: str | None = None  # the filesystem's digest (what the recipe records)


# Every file's mtime in a bootstrapped base, unless its recipe says otherwise (2023-11-14).
DEFAULT_EPOCH = 1700000000
# The proxy settings, in both spellings: the route to a mirror or an index, never what comes
# from it. Of the caller's environment, only these reach debootstrap (bootstrap_env) and a
# build (image/buildkit.py).
PROXY_VARS = tuple(v for name in ("HTTP_PROXY", "HTTPS_PROXY", "NO_PROXY", "ALL_PROXY")
                   for v in (name, name.lower()))


def bootstrap_env(epoch: str, host: Mapping[str, str]) -> dict[str, str]:
    """The environment a base is made in: declared here, not inherited. The caller's leaked
    into the bytes: python3's postinst imports Debian's own helpers, and whether that import
    writes their bytecode follows PYTHONDONTWRITEBYTECODE (make exports it empty, a shell may
    set it), so the same recipe on the same mirror gave two digests. Debian's root PATH; the C
    locale; bytecode only where the packages compile it themselves."""
    env = {k: host[k] for k in PROXY_VARS if k in host}
    env.update(PATH="/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", LC_ALL="C",
               PYTHONDONTWRITEBYTECODE="1", SOURCE_DATE_EPOCH=epoch)
    return env


def registry_tag(base: Base) -> str:
    """The tag a bootstrapped base gets in a registry repository: its own tag, the part after
    the last colon (a name with a registry port has another before it)."""
    return "base-" + base.image.rsplit(":", 1)[1]


def rootfs_of(img) -> str | None:
    """The digest of a one-layer image's filesystem (its layer's diff_id): what a bootstrapped
    base's recipe records and the content key covers."""
    layers = (img.attrs.get("RootFS") or {}).get("Layers") or []
    return layers[0] if len(layers) == 1 else None


def _check_rootfs(img, base: Base, where: str) -> None:
    want = (base.bootstrap or {}).get("rootfs")
    got = rootfs_of(img)
    if want and got != want:
        raise EnvError(
            f"base image {base.image} {where} is not the one images/bases.yaml records",
            facts=[f"its filesystem is {got}", f"the recipe records {want}",
                   "content tags name the recorded base, so an image built on this one would "
                   "carry a tag that says otherwise"],
            hint="`imgbuild base bootstrap --rebuild` makes it again from the recipe; if Debian's "
                 "mirror has moved since it was recorded, `--record` writes the new digest into "
                 "images/bases.yaml (every slim target gets a new content tag)")


def bootstrap(client, base: Base, *, registry: Repository | None = None, rebuild: bool = False,
              record: Path | None = None, progress: Progress = SILENT) -> BaseResult:
    """The base made from its recipe here (or reused: local, else pulled from `registry`),
    checked against the rootfs digest the recipe records, and pushed to `registry`.

    record: images/bases.yaml, to write the digest of a base made here into it (a new recipe
    state: Debian's mirror moved) instead of refusing it."""
    if not base.bootstrap:
        raise InputError(f"base '{base.key}' ({base.image}) is pulled, not bootstrapped",
                         hint="users pull it with `docker pull`; only bases with a `bootstrap:` "
                              "recipe in images/bases.yaml are made here")
    if registry:
        check_reachable(registry)
    start = time.monotonic()
    built = False
    # One bootstrap of a base at a time on this machine: `docker import` stamps the image with
    # the moment, so two made side by side are two image ids for one rootfs, and the second
    # tag would move the base under a build that started FROM the first. The one that waited
    # finds the base made and reuses it.
    with buildlock.exclusive(f"base-{base.key}-{base.cpu_arch}", log=progress.note):
        img = None if rebuild else daemon.local_image(client, base.image)
        if img is not None and record is None:
            _check_rootfs(img, base, "on this machine")
        if img is None and registry and not rebuild:
            img = _pull_from(client, base, registry, progress)
            if img is not None:
                _check_rootfs(img, base, f"in {registry.name}")
        if img is None:
            img, rootfs = _debootstrap_import(client, base, progress)
            built = True
            want = base.bootstrap.get("rootfs")
            if record is not None and rootfs != want:
                record_rootfs(record, base.key, rootfs, base.cpu_arch)
                progress.note(f"recorded {base.key}'s rootfs {rootfs} in {record}")
            elif want and rootfs != want:
                client.images.remove(base.image)  # no tag may name a base the recipe does not
                raise JobFailed(
                    f"the base made from {base.key}'s recipe is not the one images/bases.yaml "
                    "records",
                    facts=[f"made here: {rootfs}", f"recorded:  {want}",
                           f"the recipe installs {base.bootstrap['suite']} from "
                           f"{base.bootstrap.get('mirror', 'deb.debian.org')}, which moves with "
                           "each Debian point release"],
                    hint="if the mirror moved, `imgbuild base bootstrap --record` writes the new "
                         "digest into images/bases.yaml (commit it: every slim target gets a new "
                         "content tag); or pull the recorded base from a registry that holds it "
                         "(`--registry`)")
    pushed: tuple[str, ...] = ()
    if registry:
        ref = f"{registry.name}:{registry_tag(base)}"
        img.tag(ref)
        digest = push_ref(client, ref)
        pushed = (f"{ref}@{digest}",)
    return BaseResult(base.image, img.id, time.monotonic() - start, img.attrs.get("Size", 0),
                      built, pushed, rootfs_of(img))


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
    """Make the base available to the builder: local already, or pulled from the registry; a
    bootstrapped base must be the one its recipe records."""
    img = daemon.local_image(client, base.image)
    if img is not None:
        _check_rootfs(img, base, "on this machine")
        return
    if base.bootstrap:
        if registry and (img := _pull_from(client, base, registry)) is not None:
            _check_rootfs(img, base, f"in {registry.name}")
            return
        raise EnvError(f"base image {base.image} is not here",
                       facts=[f"base '{base.key}' is made by `imgbuild base bootstrap`"],
                       hint="run `imgbuild base bootstrap"
                            + (f" --registry {registry.name}`" if registry else "`"))
    # Pulled bases (nvidia/cuda) come from their registry like any FROM, by digest.


def _normalize(root: Path) -> None:
    """What debootstrap leaves that depends on the machine or the moment, not the packages:
    apt's downloads and lists, logs, ldconfig's cache, and the build host's name and resolver
    (Docker mounts its own over both at run time)."""
    for sub in ("var/cache/apt/archives", "var/lib/apt/lists", "var/log", "var/cache/apt"):
        for p in (root / sub).glob("*"):
            if p.is_file() or p.is_symlink():
                p.unlink()
    (root / "var/cache/ldconfig/aux-cache").unlink(missing_ok=True)
    (root / "etc/hostname").write_text("localhost\n")
    (root / "etc/resolv.conf").write_text("")


def _debootstrap_import(client, base: Base, progress: Progress) -> tuple[object, str]:
    """debootstrap the recipe, normalize, tar reproducibly (sorted names, one mtime, numeric
    owners) and `docker import` it. Returns the image and the tar's digest, which is the
    imported layer's diff_id: the same recipe on the same mirror state gives the same digest
    on any machine."""
    recipe = base.bootstrap or {}
    exe = shutil.which("debootstrap")
    if not exe:
        raise EnvError("debootstrap is not installed",
                       hint="as root: `apt-get install -y debootstrap` (or `make setup`)")
    if os.geteuid() != 0:
        raise EnvError("debootstrap needs root", hint="run `imgbuild base bootstrap` as root")
    epoch = str(recipe.get("source_date_epoch", DEFAULT_EPOCH))
    foreign = base.cpu_arch != host_cpu()
    if foreign:
        check_emulation(base.cpu_arch)
    with tempfile.TemporaryDirectory(prefix="imgbuild-base-") as td:
        root = Path(td) / "rootfs"
        cmd = [exe, f"--variant={recipe.get('variant', 'minbase')}"]
        if foreign:  # debootstrap's second stage runs the target's binaries: under QEMU
            cmd.append(f"--arch={base.debian_arch}")
        if recipe.get("include"):
            cmd.append("--include=" + ",".join(recipe["include"]))
        cmd += [recipe["suite"], str(root), recipe.get("mirror", "http://deb.debian.org/debian")]
        progress.note(f"debootstrap {recipe['suite']} ({recipe.get('variant', 'minbase')}, "
                      f"+{','.join(recipe.get('include', []))}, {base.debian_arch}) ...")
        proc = subprocess.run(cmd, capture_output=True, text=True,
                              env=bootstrap_env(epoch, os.environ))
        if proc.returncode != 0:
            raise JobFailed("debootstrap failed",
                            log_tail=(proc.stdout + proc.stderr).splitlines()[-20:],
                            hint="check that Debian's mirror is reachable")
        _normalize(root)
        if foreign:
            return _load_foreign(client, base, root, epoch, Path(td))
        tar = _tar(root, epoch)
        imp = subprocess.Popen(daemon.cli_command(["import", "--change", 'CMD ["/bin/bash"]',
                                                   "-", base.image]),
                               stdin=subprocess.PIPE, stdout=subprocess.DEVNULL,
                               stderr=subprocess.PIPE)
        assert tar.stdout is not None and imp.stdin is not None
        h = hashlib.sha256()
        for chunk in iter(lambda: tar.stdout.read(1 << 20), b""):
            h.update(chunk)
            imp.stdin.write(chunk)
        imp.stdin.close()
        err = imp.stderr.read() if imp.stderr else b""
        imp.wait()
        if tar.wait() != 0 or imp.returncode != 0:
            raise JobFailed("docker import failed",
                            log_tail=err.decode(errors="replace").splitlines()[-10:])
    img = client.images.get(base.image)
    rootfs = "sha256:" + h.hexdigest()
    if rootfs_of(img) != rootfs:
        raise JobFailed(f"docker import stored {rootfs_of(img)}, not the tar it was given "
                        f"({rootfs})", hint="report this: the Engine changed the layer")
    return img, rootfs


def _tar(root: Path, epoch: str) -> subprocess.Popen:
    """The base's one layer, streamed on stdout: the root tarred reproducibly (names sorted,
    every mtime the recipe's epoch, owners by number), in the declared environment."""
    return subprocess.Popen(["tar", "-C", str(root), "--sort=name", f"--mtime=@{epoch}",
                             "--numeric-owner", "--format=gnu", "-c", "."],
                            stdout=subprocess.PIPE, env=bootstrap_env(epoch, os.environ))


def host_cpu() -> str:
    m = platform.machine()
    return {"amd64": "x86_64", "arm64": "aarch64"}.get(m, m)


def host_platform() -> str:
    """This machine's OCI platform (linux/amd64), as an index lists it."""
    cpu = host_cpu()
    return f"linux/{DEBIAN_ARCH.get(cpu, cpu)}"


BINFMT = Path("/proc/sys/fs/binfmt_misc")


def check_emulation(cpu_arch: str, binfmt: Path = BINFMT) -> None:
    """A foreign CPU's binaries run here only through QEMU user emulation registered with
    binfmt_misc (the F flag, so that it works inside chroots and containers)."""
    entry = binfmt / f"qemu-{cpu_arch}"
    try:
        text = entry.read_text()
    except OSError:
        text = ""
    if not text.startswith("enabled") or "F" not in \
            next((ln for ln in text.splitlines() if ln.startswith("flags:")), ""):
        raise EnvError(
            f"this {host_cpu()} machine cannot run {cpu_arch} programs",
            facts=[f"{entry}: " + ("not registered" if not text else text.splitlines()[0])],
            hint="as root: `apt-get install -y qemu-user-static`, then `mount -t binfmt_misc "
                 "binfmt_misc /proc/sys/fs/binfmt_misc` if it is not mounted and register "
                 f"/usr/lib/binfmt.d/qemu-{cpu_arch}.conf's line into "
                 "/proc/sys/fs/binfmt_misc/register (`make setup` does all of this)")


def _load_foreign(client, base: Base, root: Path, epoch: str, work: Path) -> tuple[object, str]:
    """A foreign CPU's base: `docker import` would label it with this machine's CPU (the
    Engine ignores --platform there), so the image is assembled as a docker-archive whose
    config names the CPU, and loaded. Its one layer is the same reproducible tar."""
    layer = work / "layer.tar"
    h = hashlib.sha256()
    with layer.open("wb") as out:
        tar = _tar(root, epoch)
        assert tar.stdout is not None
        for chunk in iter(lambda: tar.stdout.read(1 << 20), b""):
            h.update(chunk)
            out.write(chunk)
        if tar.wait() != 0:
            raise JobFailed("tar of the bootstrapped root failed")
    rootfs = "sha256:" + h.hexdigest()
    created = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(int(epoch)))
    config = json.dumps({
        "architecture": base.debian_arch, "os": "linux", "created": created,
        "config": {"Cmd": ["/bin/bash"]},
        "rootfs": {"type": "layers", "diff_ids": [rootfs]},
        "history": [{"created": created, "created_by": "imgbuild base bootstrap"}],
    }, sort_keys=True).encode()
    manifest = json.dumps([{"Config": "config.json", "RepoTags": [base.image],
                            "Layers": ["layer.tar"]}]).encode()
    archive = work / "image.tar"
    with tarfile.open(archive, "w") as t:
        for name, data in (("config.json", config), ("manifest.json", manifest)):
            info = tarfile.TarInfo(name)
            info.size = len(data)
            t.addfile(info, io.BytesIO(data))
        t.add(layer, "layer.tar")
    proc = subprocess.run(daemon.cli_command(["load", "-i", str(archive)]),
                          capture_output=True, text=True)
    if proc.returncode != 0:
        raise JobFailed("docker load of the bootstrapped base failed",
                        log_tail=proc.stderr.splitlines()[-10:])
    img = client.images.get(base.image)
    if rootfs_of(img) != rootfs or img.attrs.get("Architecture") != base.debian_arch:
        raise JobFailed(f"docker load stored {rootfs_of(img)} for "
                        f"{img.attrs.get('Architecture')}, not {rootfs} for {base.debian_arch}",
                        hint="report this: the Engine changed the layer")
    return img, rootfs


def record_rootfs(bases_yaml: Path, key: str, rootfs: str, cpu_arch: str = "x86_64") -> None:
    """Write `rootfs: DIGEST` (`rootfs_aarch64:` for another CPU) into os.<key>.bootstrap of
    images/bases.yaml, keeping every other line and comment."""
    field_name = "rootfs" if cpu_arch == "x86_64" else f"rootfs_{cpu_arch}"
    text = bases_yaml.read_text()
    m = re.search(rf"^  {re.escape(key)}:\n(?:    .*\n|\s*#.*\n|\n)*?    bootstrap:\n"
                  r"((?:      .*\n)*)", text, re.M)
    if m is None:
        raise InputError(f"{bases_yaml}: no os.{key}.bootstrap block to record the rootfs in")
    block = m.group(1)
    new_block = re.sub(rf"^      {field_name}: .*\n", "", block, flags=re.M) + \
        f"      {field_name}: {rootfs}\n"
    atomic_write_text(bases_yaml, text[:m.start(1)] + new_block + text[m.end(1):])


def bootstrap_base(ws: Workspace, key: str, *, registry: str | None = None, rebuild: bool = False,
                   record: bool = False, cpu_arch: str = "x86_64",
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
    recorded = ws.spec_file("bases.yaml", "base bootstrap --record") if record else None
    client = daemon.client()
    return bootstrap(client, bases[key].for_cpu(cpu_arch), registry=repo,
                     rebuild=rebuild or record, record=recorded, progress=progress)
