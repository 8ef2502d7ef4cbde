"""The override checks' cache: one answer per (request without one override, environment, lock).

`imgbuild lock` says which overrides a lock still needs by resolving again without each one
(resolve.check_overrides). Each of those is a full uv resolution, so a target with eight
overrides paid eight resolutions on every `imgbuild lock`, even when nothing had changed.
An answer is kept under `$IMGBUILD_CACHE/override-checks/<sha256>.json`, named by the digest
of everything that can change it (CheckInputs); a changed input is a new name, so a miss.

What the key cannot see is the index growing new releases under the same inputs. The key
holds the digest of the lock the answer was compared with, so the answer lives as long as the
lock's own pins do: a lock re-resolved to other pins (`--refresh`, new inputs) asks uv again,
exactly as the lock itself is only re-resolved when its inputs change. Deleting the directory
forgets every answer.
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import asdict, dataclass
from pathlib import Path

from ..catalog.indexes import strip_credentials
from ..fsutil import atomic_write_text
from .wheels import cache_root

# Bump when what a check computes or how its effect is worded changes: older answers then miss.
CHECK_FORMAT = 2

# UV_* variables that change how uv works, never what it resolves: kept out of the key so a
# bigger download pool or another cache directory does not throw every answer away.
_UV_VARS_NOT_INPUTS = frozenset({
    "UV_CACHE_DIR", "UV_NO_CACHE", "UV_NO_PROGRESS", "UV_CONCURRENT_DOWNLOADS",
    "UV_CONCURRENT_BUILDS", "UV_CONCURRENT_INSTALLS", "UV_HTTP_TIMEOUT", "UV_HTTP_RETRIES",
    "UV_PYTHON_DOWNLOADS", "UV_COLOR", "UV_NO_WRAP",
})


@dataclass(frozen=True)
class CheckInputs:
    """Everything that decides one override check's answer, as plain data. Not the target's
    name (it decides no resolution), nor paths (the wheels directory is named by its files)."""

    dropped: str  # the override this check leaves out
    python: str
    uv_platform: str
    requirements: tuple[str, ...]
    overrides: tuple[str, ...]  # the ones kept, in the request's order
    extra_index_urls: tuple[str, ...]  # credentials stripped: a new password keeps the answer
    build_from_source: bool
    default_index: str | None  # the host's mirror (credentials stripped), None: PyPI
    uv_version: str
    uv_settings: tuple[tuple[str, str], ...]  # UV_* variables and uv.toml files uv reads
    wheels: tuple[tuple[str, int, int], ...] | None  # --find-links: (name, size, mtime_ns)
    locked_pins: str  # the digest of the lock the resolution is compared with
    format: int = CHECK_FORMAT


def check_key(inputs: CheckInputs) -> str:
    """sha256 over every field, by name: a pure function of the inputs."""
    doc = json.dumps(asdict(inputs), sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(doc.encode()).hexdigest()


def wheels_signature(wheels: Path | None) -> tuple[tuple[str, int, int], ...] | None:
    """The --find-links directory as uv sees it: its files by name, size and mtime. Not their
    sha256: a torch wheel is gigabytes, read on every lock; a rewritten file has a new mtime."""
    if wheels is None:
        return None
    out = []
    try:
        for e in os.scandir(wheels):
            if e.is_file():
                st = e.stat()
                out.append((e.name, st.st_size, st.st_mtime_ns))
    except FileNotFoundError:
        return ()  # uv finds nothing there either
    return tuple(sorted(out))


def uv_settings(env: dict[str, str]) -> tuple[tuple[str, str], ...]:
    """What uv reads besides its arguments that can change a resolution: UV_* variables
    (UV_EXCLUDE_NEWER, UV_PRERELEASE, UV_INDEX_STRATEGY ...) and the user and system uv.toml
    (`exclude-newer` there too). uv runs in a scratch directory, so no project file applies."""
    out = [(k, v) for k, v in env.items() if k.startswith("UV_") and k not in _UV_VARS_NOT_INPUTS]
    for cfg in _uv_config_files(env):
        try:
            out.append((f"file:{cfg}", cfg.read_text()))
        except OSError:
            pass  # absent or unreadable: uv does not read it either
    return tuple(sorted(out))


def _uv_config_files(env: dict[str, str]) -> list[Path]:
    if env.get("UV_NO_CONFIG"):
        return []
    if env.get("UV_CONFIG_FILE"):
        return [Path(env["UV_CONFIG_FILE"])]
    home = Path(env["HOME"]) if env.get("HOME") else Path.home()
    user = Path(env.get("XDG_CONFIG_HOME") or home / ".config") / "uv" / "uv.toml"
    system = [Path(d) / "uv" / "uv.toml"
              for d in (env.get("XDG_CONFIG_DIRS") or "/etc/xdg").split(":") if d]
    return [user, *system, Path("/etc/uv/uv.toml")]


def clean_url(url: str | None) -> str | None:
    return None if url is None else strip_credentials(url)


# --- the store ------------------------------------------------------------------------------

def cache_dir() -> Path:
    return cache_root() / "override-checks"


def load(key: str, dropped: str) -> dict | None:
    """The answer stored under `key`, or None: absent, unreadable, or not this check's (a
    torn or foreign file is a miss, never an error: uv answers again)."""
    try:
        doc = json.loads((cache_dir() / f"{key}.json").read_text())
    except (OSError, ValueError):
        return None
    if (not isinstance(doc, dict) or doc.get("format") != CHECK_FORMAT
            or doc.get("requirement") != dropped or not isinstance(doc.get("needed"), bool)
            or not isinstance(doc.get("effect"), str)):
        return None
    return {"requirement": doc["requirement"], "needed": doc["needed"], "effect": doc["effect"]}


def store(key: str, answer: dict) -> None:
    """Keep an answer: written beside its name and renamed over it, so a reader (another lock
    running at once) sees the whole file or none. A cache that cannot be written only costs
    the next lock its resolution, so the lock goes on."""
    try:
        atomic_write_text(cache_dir() / f"{key}.json",
                          json.dumps({"format": CHECK_FORMAT, **answer}, sort_keys=True) + "\n")
    except OSError:
        pass
