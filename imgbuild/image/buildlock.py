"""One build per content key at a time on a Docker Engine; different keys build side by side.

A second `imgbuild` asked for an image that another is building (or smoke-testing) waits for
it (and then finds the image and its report, so it builds and tests nothing) instead of racing
it into the same tags. Pushes are not under the lock (pipeline/build.py). The lock is the
Engine's (DOCKER_HOST): two Engines on one machine hold their own tags, so a build of the
same image on another Engine goes on beside it (the registry's content tag, which never
moves, settles which image the tag names).
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from ..errors import EnvError

DEFAULT_HOST = "unix:///var/run/docker.sock"


def lock_name(content_key: str, docker_host: str | None) -> str:
    """The lock file of content_key on the Engine at docker_host (None: the default socket)."""
    host = docker_host or DEFAULT_HOST
    name = content_key.replace(":", "-")
    if host == DEFAULT_HOST:
        return f"{name}.lock"
    return f"{name}-{hashlib.sha256(host.encode()).hexdigest()[:12]}.lock"


def lock_dir() -> Path:
    root = Path(os.environ.get("IMGBUILD_CACHE") or Path.home() / ".cache" / "imgbuild")
    return root / "build-locks"


@contextmanager
def exclusive(content_key: str, *, wait_s: float = 3600,
              log: Callable[[str], None] = lambda _message: None,
              directory: Path | None = None,
              docker_host: str | None = None) -> Iterator[bool]:
    """Hold the lock for content_key on the Engine at docker_host (default: DOCKER_HOST);
    yields whether we had to wait for another holder."""
    d = directory or lock_dir()
    d.mkdir(parents=True, exist_ok=True)
    path = d / lock_name(content_key, docker_host or os.environ.get("DOCKER_HOST"))
    with open(path, "a+") as f:
        waited = False
        deadline = time.monotonic() + wait_s
        while True:
            try:
                fcntl.flock(f.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if not waited:
                    f.seek(0)
                    holder = f.read().strip() or "another process"
                    log(f"another imgbuild ({holder}) is building this image; waiting for it")
                    waited = True
                if time.monotonic() > deadline:
                    raise EnvError(f"gave up waiting {wait_s:.0f} s for the build of "
                                   f"{content_key[:19]}… held by another imgbuild",
                                   hint=f"if no imgbuild runs, remove {path}") from None
                time.sleep(0.5)
        f.seek(0)
        f.truncate()
        f.write(f"pid {os.getpid()}")
        f.flush()
        try:
            yield waited
        finally:
            f.seek(0)
            f.truncate()
            fcntl.flock(f.fileno(), fcntl.LOCK_UN)
