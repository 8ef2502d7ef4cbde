"""Run the smoke payload inside an image and read its report."""

from __future__ import annotations

import json
import subprocess
import time
from dataclasses import dataclass

from . import render
from .dockerenv import run_cli
from .errors import InputError


@dataclass(frozen=True)
class SmokeReport:
    image: str
    ok: bool
    stages: tuple[dict, ...]
    seconds: float
    raw: dict

    def to_dict(self) -> dict:
        return {"image": self.image, "ok": self.ok, "seconds": round(self.seconds, 2),
                "stages": list(self.stages)}


def run(image: str, timeout: int = 900) -> SmokeReport:
    """Run the payload with no network: a smoke test must not depend on anything outside."""
    start = time.monotonic()
    try:
        # --entrypoint: the smoke test checks the image, not this host (that is preflight's job).
        proc = run_cli(["run", "--rm", "--network", "none", "--entrypoint", "python", image,
                        f"{render.ASSETS}/smoke.py", "--lock", f"{render.ASSETS}/lock.txt",
                        "--model", f"{render.ASSETS}/smoke-model", "--json"],
                       capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return _failed(image, start, f"timed out after {timeout} s")
    secs = time.monotonic() - start
    if proc.returncode == 125 and "Unable to find image" in proc.stderr or \
            "No such image" in proc.stderr:
        raise InputError(f"image {image} is not here", hint="build or pull it first")
    try:
        raw = json.loads(proc.stdout[proc.stdout.index("{"):])
    except ValueError:
        tail = (proc.stdout + proc.stderr).strip().splitlines()[-15:]
        return _failed(image, start, "the payload printed no report: " + " | ".join(tail))
    return SmokeReport(image, bool(raw.get("ok")) and proc.returncode == 0,
                       tuple(raw.get("stages", [])), secs, raw)


def _failed(image: str, start: float, reason: str) -> SmokeReport:
    stage = {"name": "payload", "status": "fail", "reason": reason, "duration_s": 0}
    return SmokeReport(image, False, (stage,), time.monotonic() - start, {"stages": [stage]})
