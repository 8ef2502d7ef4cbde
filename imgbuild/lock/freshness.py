"""`imgbuild lock --check`: does a committed lock still match its spec?

Stale means the lock no longer matches what its target asks for: resolve again *keeping the
locked versions* where they still fit. Upstream releases alone are `imgbuild outdated`'s news,
not staleness (a push must not fail because numpy released).
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass
from pathlib import Path

from ..errors import ResolveError
from .lockfile import LockRequest, parse_body, pins_digest, read_lock
from .resolve import resolve, resolve_explained


@dataclass(frozen=True)
class Freshness:
    stale: bool
    diff: tuple[str, ...]  # the pins that would change, as unified-diff lines


def freshness(req: LockRequest, path: Path, wheels: Path | None = None) -> Freshness:
    """Compare the committed lock at `path` (missing: stale) with a resolution that prefers its
    versions. Raises ResolveError (with uv's chain) when the spec no longer resolves."""
    current = read_lock(path).body if path.exists() else ""
    try:
        body = resolve(req, wheels, prefer=current or None)
    except ResolveError:
        body = resolve_explained(req, wheels)
    diff = [d for d in difflib.unified_diff(
        current.splitlines(), body.splitlines(), f"{path.name} (committed)",
        f"{path.name} (resolved now)", lineterm="", n=0)
        if d.startswith(("---", "+++")) or (d[:1] in "+-" and "==" in d)]
    # Only what gets installed counts: `# via` annotations that differ are no drift.
    stale = not current or pins_digest(parse_body(body, "resolution")) != \
        pins_digest(parse_body(current, str(path)))
    return Freshness(stale, tuple(diff))
