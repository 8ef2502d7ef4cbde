"""uv, the resolver and installer: which binary, with which environment, which index flags."""

from __future__ import annotations

import os
import shutil
import subprocess
import threading
from functools import cache
from pathlib import Path

from ..errors import EnvError
from .lockfile import LockRequest

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
    out = subprocess.run([uv_bin(), "--version"], capture_output=True, text=True, env=uv_env())
    return out.stdout.strip() or "uv (unknown version)"


def index_args(req: LockRequest, wheels: Path | None) -> list[str]:
    """Index flags shared by resolve and install, so both see the same candidates."""
    args: list[str] = []
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

