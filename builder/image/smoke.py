"""Run the smoke payload inside an image and read its report."""

from __future__ import annotations

import json
import shutil
import subprocess
import time
from dataclasses import dataclass

from ..errors import InputError
from ..plan import render
from .daemon import run_cli


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


def host_has_gpu_runtime() -> bool:
    """Whether `docker run --gpus all` can work here: the NVIDIA runtime and a driver."""
    info = run_cli(["info", "--format", "{{json .Runtimes}}"], capture_output=True, text=True)
    return "nvidia" in info.stdout and shutil.which("nvidia-smi") is not None


def run(image: str, timeout: int = 900, gpu: str = "auto") -> SmokeReport:
    """Run the payload with no network: a smoke test must not depend on anything outside.

    gpu: auto runs stage 4 (the image's engine on a GPU) where this host has one; off skips
    it; require fails the report when no GPU can be had.
    """
    start = time.monotonic()
    engine = None
    insp = run_cli(["image", "inspect", "--format", '{{index .Config.Labels "io.imgbuild.engine"}}',
                    image], capture_output=True, text=True)
    if insp.returncode != 0:
        raise InputError(f"image {image} is not here", hint="build or pull it first")
    engine = insp.stdout.strip().split("==")[0] or None
    gpus = ["--gpus", "all"] if gpu != "off" and host_has_gpu_runtime() else []
    args = ["--lock", f"{render.ASSETS}/lock.txt", "--model", f"{render.ASSETS}/smoke-model",
            "--facts", f"{render.ASSETS}/image.json", "--gpu", gpu, "--json"]
    if engine in ("sglang", "vllm", "transformers"):
        args += ["--engine", engine]
    try:
        # --entrypoint: the smoke test checks the image, not this host (that is preflight's job).
        proc = run_cli(["run", "--rm", "--network", "none", *gpus, "--entrypoint", "python",
                        image, f"{render.ASSETS}/smoke.py", *args],
                       capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return _failed(image, start, f"timed out after {timeout} s")
    secs = time.monotonic() - start
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
