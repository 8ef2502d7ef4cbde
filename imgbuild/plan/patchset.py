"""The patch layer of an image: which patches it applies, the files it copies, and the RUN
lines that apply and probe them (imgbuild/payload/patcher.py does the work in the image)."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from pathlib import Path

from ..catalog.patches import Patch
from ..errors import SpecError
from ..lock.lockfile import Lockfile
from ..payload import patcher

ASSETS = "/opt/imgbuild"  # where the payload lives in the image (render.ASSETS)
PATCHER = Path(patcher.__file__)


def context_files(plan_patches: Sequence[str], lock: Lockfile,
                  known: dict[str, Patch]) -> dict[str, str]:
    """Files for the patch layer, by path relative to the context directory that is copied to
    /opt/imgbuild/: `patcher.py` and `patches/<id>.json` for each listed patch whose package
    is in the lock (every variant: the patcher picks by the installed version, and tells an
    upstream fix from a broken patch). Empty when nothing is to be patched."""
    out: dict[str, str] = {}
    for pid in plan_patches:
        if pid not in known:
            raise SpecError("images/patches", f"{pid}.yaml", "a patch file for the plan's patch id",
                            pid)
        p = known[pid]
        if lock.package(p.package) is None:
            continue
        out[f"patches/{pid}.json"] = json.dumps(p.to_json(), indent=2, sort_keys=True) + "\n"
    if out:
        out["patcher.py"] = PATCHER.read_text(encoding="utf-8")
    return dict(sorted(out.items()))


def expected_applied(plan_patches: Sequence[str], lock: Lockfile,
                     known: dict[str, Patch]) -> tuple[str, ...]:
    """The ids the patch layer will apply: those whose `versions` cover the locked version of
    their package. No network; for the image's labels. (An in-range patch that upstream has
    backported would be reported obsolete by the build instead; `patches --check` tells.)"""
    out = []
    for pid in plan_patches:
        p = known.get(pid)
        pkg = lock.package(p.package) if p else None
        if pkg is not None and p.covers(pkg.version):
            out.append(pid)
    return tuple(out)


def context_digest(files: dict[str, str]) -> str:
    """A hash of context_files(): put it in the plan's content key."""
    h = hashlib.sha256()
    for k, v in sorted(files.items()):
        h.update(k.encode() + b"\0" + v.encode() + b"\0")
    return "sha256:" + h.hexdigest()


def write_context(files: dict[str, str], dest: Path) -> None:
    """Write context_files() under `dest` (e.g. <context>/patchset)."""
    for rel, text in files.items():
        p = Path(dest) / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(text, encoding="utf-8")


def apply_command(python: str = "python") -> str:
    """The RUN line of the patch layer (after COPY <patchset>/ /opt/imgbuild/)."""
    return (f"{python} {ASSETS}/patcher.py --patches {ASSETS}/patches "
            f"--report {ASSETS}/patches.json")


def probe_command(python: str = "python") -> list[str]:
    """What the smoke test runs in the image: prints JSON, exits 1 if a probe fails."""
    return [python, f"{ASSETS}/patcher.py", "--probe", "--patches", f"{ASSETS}/patches",
            "--report", f"{ASSETS}/patches.json"]

