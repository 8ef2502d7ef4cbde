"""uv, the resolver and installer: which binary, with which environment, which index flags."""

from __future__ import annotations

import os
import shutil
import subprocess
import threading
from functools import cache
from pathlib import Path

from packaging.utils import parse_wheel_filename

from ..errors import EnvError
from . import wheels
from .lockfile import LockRequest
from .wheels import mirror_index

_UV_LOCK = threading.Lock()


def uv_bin() -> str:
    """The uv binary (not a pyenv shim: we copy it into build contexts)."""
    # sysconfig's first use (inside uv.find_uv_bin) is not thread-safe; locks resolve in threads.
    with _UV_LOCK:
        return _uv_bin()


@cache
def _uv_bin() -> str:
    try:
        import uv  # the PyPI package ships the binary

        path = uv.find_uv_bin()
        if path:
            return path
    except (ImportError, FileNotFoundError):
        pass
    found = shutil.which("uv")
    if not found:
        raise EnvError("uv is not installed", hint="install it: `pip install uv` (or `make setup`)")
    return found


def uv_env() -> dict[str, str]:
    env = dict(os.environ)
    # Managed Python downloads are unreachable here and cost ~10 s each; the target's
    # interpreter is named with --python-version and never needs to exist on the host.
    env.setdefault("UV_PYTHON_DOWNLOADS", "never")
    return env


def uv_version() -> str:
    """What `uv --version` says, e.g. "uv 0.13.9 (x86_64-unknown-linux-gnu)"."""
    return _version_of(uv_bin())


@cache
def _version_of(binary: str) -> str:
    # Once per binary and process: a lock asks it for the lockfile's header and again for
    # the override-check keys, and each ask is a process start (70 ms here).
    out = subprocess.run([binary, "--version"], capture_output=True, text=True, env=uv_env())
    return out.stdout.strip() or "uv (unknown version)"


def index_args(req: LockRequest, wheels: Path | None, *, mirror: bool = True) -> list[str]:
    """Index flags shared by resolve and install, so both see the same candidates; `mirror`:
    name the host's PyPI mirror as the default index (False: the caller names one)."""
    # Named outright: uv reads UV_DEFAULT_INDEX and UV_INDEX_URL itself, not PIP_INDEX_URL,
    # and the build must use the index the lock was made from.
    mirror_url = mirror_index() if mirror else None
    args: list[str] = ["--default-index", mirror_url] if mirror_url else []
    if wheels is not None:
        args += ["--find-links", str(Path(wheels).absolute())]  # uv runs in a scratch dir
    for url in req.extra_index_urls:
        if wheels is None:
            args += ["--extra-index-url", url]
    if req.extra_index_urls:
        # With several indexes, take the best version from any of them (the CPU torch index
        # mirrors numpy & co.); first-match would make the lock depend on which index is up.
        args += ["--index-strategy", "unsafe-best-match"]
    return args



def uv_bin_for(cpu_arch: str, host_cpu: str) -> str:
    """uv for the CPU an image is built for: this machine's, or the same uv release's binary
    for the other CPU, taken from its wheel on the index (its sha256 checked against the
    index's) and kept in the cache: builds run uv inside the image, under emulation there."""
    if cpu_arch == host_cpu:
        return uv_bin()
    version = uv_version().split()[1]
    dest = wheels.cache_root() / "tools" / f"uv-{version}-{cpu_arch}" / "uv"
    if dest.is_file():
        return str(dest)
    files = [f for u in wheels.index_urls() for f in wheels.project_files("uv", u)
             if f.is_wheel and str(f.version) == version
             and any(t.platform.startswith("manylinux") and t.platform.endswith(cpu_arch)
                     for t in parse_wheel_filename(f.filename)[3])]
    if not files:
        raise EnvError(f"no uv {version} wheel for {cpu_arch} on the index",
                       facts=[f"indexes asked: {', '.join(wheels.index_urls())}"],
                       hint="use an index that mirrors PyPI's uv wheels")
    with wheels.open_file(files[0], expect=None, what=f"uv=={version} ({cpu_arch})",
                          mode="full") as w:
        member = next(n for n in w.names() if n.endswith(".data/scripts/uv"))
        data = w.read(member)
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = dest.with_name(".uv.tmp")
    tmp.write_bytes(data)
    tmp.chmod(0o755)
    tmp.replace(dest)
    return str(dest)
