"""The build context: assembled in a scratch directory from the Plan: the rendered Dockerfile,
the lock in the two parts the layers install, uv (bind-mounted, never copied into a layer), the
wheels the lock names that come from a local wheel directory, the payload, the patch layer's
files and the smoke checkpoint. Secrets travel beside it, never in it.
"""

from __future__ import annotations

import hashlib
import os
import shutil
from dataclasses import dataclass
from pathlib import Path

from ..catalog.indexes import credential_of, strip_credentials
from ..catalog.patches import Patch
from ..fsutil import cannot_write
from ..lock.lockfile import Lockfile
from ..lock.uv import uv_bin_for
from ..plan import patchset, render
from ..plan.plan import Plan
from .base import host_cpu

CA_BUNDLES = ("/etc/ssl/certs/ca-certificates.crt", "/etc/pki/tls/certs/ca-bundle.crt")


@dataclass(frozen=True)
class Secrets:
    """Files handed to the build as BuildKit secrets: mounted for one step, in no layer."""

    cacert: Path | None = None
    netrc: Path | None = None

    @classmethod
    def from_host(cls) -> Secrets:
        ca = os.environ.get("IMGBUILD_CA_BUNDLE") or os.environ.get("SSL_CERT_FILE")
        ca = ca or next((c for c in CA_BUNDLES if os.path.exists(c)), None)
        netrc = os.environ.get("IMGBUILD_NETRC") or os.path.expanduser("~/.netrc")
        return cls(Path(ca) if ca and os.path.exists(ca) else None,
                   Path(netrc) if os.path.exists(netrc) else None)

    def with_index_credentials(self, urls: tuple[str, ...], scratch: Path) -> Secrets:
        """The host's netrc and a `machine` entry for each index URL that carries credentials,
        written to a 0600 file in `scratch` (the build's temporary directory): uv inside the
        build reads it for those hosts, and it lands in no layer."""
        creds = [c for c in (credential_of(u) for u in urls) if c is not None]
        if not creds:
            return self
        path = scratch / "netrc"
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as f:
            for c in creds:
                f.write(c.netrc())
            if self.netrc is not None:
                f.write(self.netrc.read_text())
        return Secrets(self.cacert, path)

    def args(self) -> list[str]:
        out = []
        if self.cacert:
            out += ["--secret", f"id=cacert,src={self.cacert}"]
        if self.netrc:
            out += ["--secret", f"id=netrc,src={self.netrc}"]
        return out


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return "sha256:" + h.hexdigest()


def _link_or_copy(src: Path, dst: Path) -> None:
    dst.parent.mkdir(parents=True, exist_ok=True)
    try:
        os.link(src, dst)
    except OSError:
        shutil.copy2(src, dst)


def local_wheels(lock: Lockfile, wheels: Path | None) -> list[Path]:
    """Wheels in the local directory whose sha256 is one the lock pins (others are ignored)."""
    if wheels is None:
        return []
    wanted = {h for p in lock.packages for h in p.hashes}
    return [w for w in sorted(wheels.glob("*.whl")) if _sha256(w) in wanted]


def index_flags(plan: Plan, has_wheels: bool, mirror: str | None = None) -> str:
    """uv's index flags inside the build (IMGBUILD_INDEX_FLAGS). `mirror`: the index the host
    names in place of PyPI (wheels.mirror_index()); the build reaches the same index the lock
    did, named without its credentials (they go in the netrc secret)."""
    flags = [f"--default-index {strip_credentials(mirror)}"] if mirror else []
    if has_wheels:
        # The wheelhouse stands in for the extra indexes (the CPU torch index, say).
        return " ".join([*flags, f"--find-links {render.WHEELS}",
                         "--index-strategy unsafe-best-match"])
    flags += [f"--extra-index-url {u}" for u in plan.extra_index_urls]
    if plan.extra_index_urls:
        flags.append("--index-strategy unsafe-best-match")
    return " ".join(flags)


def prepare_context(plan: Plan, lock: Lockfile, dest: Path, *, wheels: Path | None,
                    smoke_model_dir: Path | None, patches: dict[str, Patch],
                    with_heavy: bool = True, rest: str = "install") -> list[Path]:
    """Write the build context; return the wheels it carries."""
    (dest / "lock").mkdir(parents=True)
    (dest / "Dockerfile").write_text(render.dockerfile(plan, with_heavy=with_heavy, rest=rest))
    (dest / "lock" / "heavy.txt").write_text(lock.requirements_text(heavy=True))
    (dest / "lock" / "rest.txt").write_text(lock.requirements_text(heavy=False))
    if plan.split_heavy:
        for layer in render.HEAVY_LAYERS:
            (dest / "lock" / f"{layer}.txt").write_text(lock.requirements_text(layer=layer))
    shutil.copy2(lock.path, dest / "lock" / "lock.txt")
    (dest / "tools").mkdir()
    # uv runs inside the image: the image's CPU's uv (under QEMU when it is not this machine's).
    _link_or_copy(Path(uv_bin_for(plan.cpu_arch, host_cpu())), dest / "tools" / "uv")
    (dest / "wheels").mkdir()
    carried = local_wheels(lock, wheels)
    for w in carried:
        _link_or_copy(w, dest / "wheels" / w.name)
    (dest / "payload").mkdir()
    for name in render.PAYLOAD_FILES:
        shutil.copy2(render.PAYLOAD_DIR / name, dest / "payload" / name)
    (dest / "payload" / "entrypoint.sh").write_text(render.entrypoint_sh())
    (dest / "payload" / "image.json").write_text(render.image_facts(plan))
    if plan.patch_digest:
        patchset.write_context(patchset.context_files(plan.patches, lock, patches),
                               dest / "patchset")
    (dest / "smoke").mkdir()
    if smoke_model_dir is not None:
        shutil.copytree(smoke_model_dir, dest / "smoke" / "model")
    else:
        (dest / "smoke" / "model").mkdir()
    return carried




@dataclass(frozen=True)
class BuildInputs:
    """What a build is handed: the context directory (sent whole to the builder, so it must
    hold nothing secret), the wheels it carries, and the secrets, which lie beside it."""

    context: Path
    carried: tuple[Path, ...]
    secrets: Secrets


def prepare_build(plan: Plan, lock: Lockfile, scratch: Path, *, wheels: Path | None,
                  smoke_model_dir: Path | None, patches: dict[str, Patch],
                  index_urls: tuple[str, ...], host: Secrets,
                  with_heavy: bool = True, rest: str = "install") -> BuildInputs:
    """The context in `scratch/context` and the secrets (the host's, plus a netrc for the
    index URLs that carry credentials) in `scratch/secrets`, a 0700 sibling: every byte under
    the context reaches the builder, and could reach a layer by a careless COPY, so the
    credentials never go there."""
    ctx, sd = scratch / "context", scratch / "secrets"
    try:
        carried = prepare_context(plan, lock, ctx, wheels=wheels,
                                  smoke_model_dir=smoke_model_dir, patches=patches,
                                  with_heavy=with_heavy, rest=rest)
    except OSError as e:  # a full or read-only TMPDIR: the caller removes the scratch
        raise cannot_write(ctx, e, "the build context", scratch=True) from None
    sd.mkdir(mode=0o700)
    return BuildInputs(ctx, tuple(carried), host.with_index_credentials(index_urls, sd))
