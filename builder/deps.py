"""The dependency check before a build: what the locked packages use must exist beside them.

Ties the target, its model profiles and its lock to builder/drift.py; the families checked
are data (images/checks/drift.yaml).
"""

from __future__ import annotations

from pathlib import Path

from . import drift, wheels
from .lock import Lockfile, read_lock
from .plan import lock_request
from .spec import Catalog


def check_deps(cat: Catalog, target: str, *, model: str | None, lock_dir: Path,
               lock: Lockfile | None = None) -> list[drift.Finding]:
    t = cat.target(target)
    req = lock_request(cat, t)
    lock = lock or read_lock(lock_dir / req.filename())
    fams = drift.load_families(cat.root)
    formats: list[tuple[str, str]] = []
    # The model it will serve, and the smoke model every image loads.
    for alias in dict.fromkeys(a for a in (model or t.default_model, t.smoke_model) if a):
        formats += drift.profile_formats(cat.model(alias), fams)
    findings = drift.check(lock, fams, model_formats=formats,
                           index_urls=wheels.index_urls(req.extra_index_urls))
    return findings
