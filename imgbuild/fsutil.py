"""Writing files so that a reader sees the old content or the new, never half of either."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

from .errors import EnvError


def atomic_write_text(path: Path, text: str, *, mode: int = 0o644) -> None:
    """Write beside the target, fsync, rename over it. mkstemp makes 0600 files; locks, configs
    and caches are shared, so the mode is set explicitly."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        os.fchmod(fd, mode)
        with os.fdopen(fd, "w") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def cannot_write(path: Path, err: OSError, what: str, *, scratch: bool = False) -> EnvError:
    """A write the machine refused (read-only, full, no permission), as the one error a user
    sees: the file, the reason, and that nothing there changed (or, for a scratch directory,
    that it is gone)."""
    return EnvError(f"cannot write {what} {path}: {err.strerror or err}",
                    facts=[f"{path} is removed" if scratch else
                           f"{path} is as it was before this command"],
                    hint="make the directory writable or free space on its disk, then run the "
                         "command again")


def make_writable_dir(directory: Path) -> None:
    """Make `directory` as `mkdir -p` does and prove a file can be written in it (a probe file
    is created and removed); OSError when it cannot be made or written in."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    fd, probe = tempfile.mkstemp(prefix=".imgbuild-probe-", dir=directory)
    os.close(fd)
    os.unlink(probe)


def check_writable(directory: Path, what: str) -> None:
    """Fail now, before the work whose result would go there, when nothing can be written in
    `directory` (made if missing): a probe file is created and removed."""
    try:
        make_writable_dir(directory)
    except OSError as e:
        raise cannot_write(Path(directory), e, what) from None
