"""Ask an image's own engine which quantization scheme each layer of a checkpoint gets.

`imgbuild check-model PATH --image IMAGE` runs the image's imgbuild/payload/engine_schemes.py
(copied into every image beside the smoke test) on the checkpoint's config.json and tensor
names, in a container with no network and the checkpoint mounted read-only: the engine's
CompressedTensorsConfig parses the config, its scheme selection answers for every layer on
each of the image's GPU archs. No weights are read (the safetensors headers, or the index).
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

from ..errors import InputError, JobFailed
from ..plan import render
from ..plan.labels import LABEL_NS, facts_from_labels
from .daemon import run_container
from .preflight import image_labels

MOUNT = "/imgbuild-checkpoint"


def image_engine(image: str) -> tuple[str, str | None, list[str], str | None]:
    """(engine, version, GPU archs, target) from the image's labels (the ones preflight reads)."""
    return engine_of(image_labels(image))


def engine_of(labels: dict) -> tuple[str, str | None, list[str], str | None]:
    """(engine, version, GPU archs, target) from an image's labels: the engine label's
    `name==version`, the archs label's GPU archs only (sm*), the target label."""
    engine, _, version = (labels.get(f"{LABEL_NS}.engine") or "").partition("==")
    archs = [a for a in facts_from_labels(labels).archs if a.startswith("sm")]
    return engine, version or None, archs, labels.get(f"{LABEL_NS}.target")


def probe(image: str, checkpoint: Path, *, timeout: int = 900) -> dict:
    """The engine's answer for every layer (engine_schemes.py's JSON report)."""
    engine, _, archs, _ = image_engine(image)
    if engine not in ("sglang", "vllm"):
        raise InputError(f"image {image} has no serving engine to ask "
                         f"(io.imgbuild.engine: {engine or 'none'})",
                         hint="name an SGLang or vLLM image built by imgbuild")
    if not archs:
        raise InputError(f"image {image} names no GPU arch ({LABEL_NS}.archs)")
    args = ["--network", "none", "-e", "IMGBUILD_PREFLIGHT=0", "--entrypoint", "python",
            "-v", f"{checkpoint.resolve()}:{MOUNT}:ro", image,
            f"{render.ASSETS}/engine_schemes.py", "--model", MOUNT, "--engine", engine,
            *[x for a in archs for x in ("--arch", a)], "--json"]
    try:
        proc = run_container("imgbuild-schemes", args, capture_output=True, text=True,
                             timeout=timeout)
    except subprocess.TimeoutExpired:
        raise JobFailed(f"the engine in {image} did not answer in {timeout} s") from None
    if "engine_schemes.py" in proc.stderr and "No such file" in proc.stderr:
        raise InputError(f"image {image} carries no engine_schemes.py: it was built by an "
                         "older imgbuild", hint="rebuild it (`imgbuild TARGET --rebuild`)")
    try:
        return json.loads(proc.stdout[proc.stdout.index("{"):])
    except ValueError:
        tail = (proc.stdout + proc.stderr).strip().splitlines()[-8:]
        raise JobFailed(f"the engine in {image} printed no report",
                        facts=tail or ["(no output)"]) from None
