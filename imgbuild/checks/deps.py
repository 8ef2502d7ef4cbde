"""The dependency check before a build: what the locked packages use must exist beside them.

Ties a target, its model profiles and its lock to checks/drift.py; the families checked are
data (images/checks/drift.yaml).
"""

from __future__ import annotations

from ..lock import wheels
from ..lock.lockfile import Lockfile
from ..workspace import Workspace
from . import drift


def check_deps(ws: Workspace, target: str, *, model: str | None,
               lock: Lockfile | None = None, platform: str | None = None) -> list[drift.Finding]:
    """Findings for the target's locked engines and the formats its models declare (on one of
    its platforms: default the first)."""
    ref = ws.target(target, platform)
    t = ref.target
    lock = lock or ref.lock()
    fams = ws.families
    formats: list[tuple[str, str]] = []
    # The model it will serve, and the smoke model every image loads.
    for alias in dict.fromkeys(a for a in (model or t.default_model, t.smoke_model) if a):
        formats += drift.profile_formats(ws.model(alias), fams)
    return drift.check(lock, fams, model_formats=formats,
                       index_urls=wheels.index_urls(ref.request.extra_index_urls))
