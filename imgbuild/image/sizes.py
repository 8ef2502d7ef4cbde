"""`imgbuild size IMAGE`: where an image's bytes are, and which of them are dead weight.

Runs imgbuild/image/sizeprobe.py inside the image (its source as `python3 -c`, so any image with
Python works, built by imgbuild or not) with no network, and reads the Engine's layer history.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from ..errors import InputError, JobFailed
from . import sizeprobe
from .daemon import client as docker_client
from .daemon import run_cli

# What the breakdown calls dead weight in an image that serves a model: bytes no program in it
# reads at run time. Static libraries are for linking; a second copy of the same file serves
# nothing the first does not; test suites are not imported by the engines.
DEAD_KINDS = ("static library", "test file")


@dataclass(frozen=True)
class SizeReport:
    image: str
    total: int  # bytes of regular files, each once
    files: int
    layers: tuple[tuple[str, int], ...]  # (created by, bytes), oldest first
    by_kind: tuple[tuple[str, int], ...]
    by_owner: tuple[tuple[str, int], ...]  # largest first
    by_owner_kind: dict
    duplicates: tuple[dict, ...]

    @property
    def dead_weight(self) -> dict[str, int]:
        kinds = dict(self.by_kind)
        out = {k: kinds.get(k, 0) for k in DEAD_KINDS}
        out["duplicate copies"] = sum(d["size"] * (len(d["paths"]) - 1) for d in self.duplicates)
        return out

    def to_dict(self) -> dict:
        return {"image": self.image, "total": self.total, "files": self.files,
                "layers": [{"created_by": c, "size": s} for c, s in self.layers],
                "by_kind": dict(self.by_kind), "by_owner": dict(self.by_owner),
                "by_owner_kind": self.by_owner_kind, "duplicates": list(self.duplicates),
                "dead_weight": self.dead_weight}


def measure(image: str) -> SizeReport:
    """Walk the image's filesystem inside a container of it, and read its layer history."""
    engine = docker_client()
    try:
        history = engine.api.history(image)
    except Exception as e:  # noqa: BLE001 - docker-py raises several kinds for a missing image
        raise InputError(f"image {image} is not here", facts=[str(e)[:200]],
                         hint="build or pull it first") from None
    src = Path(sizeprobe.__file__).read_text()
    proc = None
    for python in ("python3", "python"):
        proc = run_cli(["run", "--rm", "--network", "none", "--user", "0", "--entrypoint",
                        python, image, "-c", src], capture_output=True, text=True, timeout=1800)
        if proc.returncode == 0:
            break
    if proc is None or proc.returncode != 0:
        raise JobFailed(f"could not read {image}'s files",
                        facts=[ln for ln in (proc.stderr if proc else "").splitlines()[-5:]],
                        hint="the breakdown runs Python inside the image; an image without "
                             "python3 or python cannot be measured this way")
    return report_of(image, history, json.loads(proc.stdout))


def report_of(image: str, history: list[dict], doc: dict) -> SizeReport:
    """The report from the Engine's layer `history` (newest first, as it gives it) and the
    probe's `doc` (image/sizeprobe.py): layers oldest first, kinds and owners largest first."""
    layers = tuple((h.get("CreatedBy", "")[:200], int(h.get("Size") or 0))
                   for h in reversed(history))
    return SizeReport(image, doc["total"], doc["files"], layers,
                      tuple(sorted(doc["by_kind"].items(), key=lambda kv: -kv[1])),
                      tuple(sorted(doc["by_owner"].items(), key=lambda kv: -kv[1])),
                      doc["by_owner_kind"], tuple(doc["duplicates"]))
