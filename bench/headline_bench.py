"""The headline target, measured here: the kernel-coverage scan of its lock (cold and cached),
the toolchain smoke stage, and `imgbuild sglang-blackwell --model k2.6` (cold, then a no-op).

    .venv/bin/python bench/headline_bench.py [--skip-cold-build]

Cold scan: an empty imgbuild cache (a fresh IMGBUILD_CACHE), every required and shown kernel
library Range-read from PyPI. Cached: the same scan again, from the cache (no network). Cold
build: `docker builder prune -af` first (BuildKit's layer cache and its uv cache mount: every
wheel downloaded again), the base image and the smoke model kept. No-op: the same command
again (the image exists: nothing is built, the smoke gate runs again before tags move).
Results: bench/results/headline.json, with the machine.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.machine import machine  # noqa: E402

TARGET, MODEL = "sglang-blackwell", "k2.6"


def scan(cache: str) -> dict:
    """One coverage read of the headline lock, in a child process with its own cache."""
    code = (
        "import json, time\n"
        "from imgbuild.workspace import Workspace\n"
        "from imgbuild.lock import kernels\n"
        f"ws = Workspace.open(None, None, None)\nref = ws.target({TARGET!r})\n"
        "rules = ws.kernel_rules[ref.target.engine]\nt = time.perf_counter()\n"
        "doc, scans = kernels.make_record(ref.lock(), [(r.package, r.files) for r in rules.rules],"
        " rules.digest(), python=ref.request.python, platform=ref.request.uv_platform)\n"
        "print(json.dumps({'seconds': round(time.perf_counter() - t, 2), 'packages': {s.package:"
        " {'seconds': round(s.seconds, 2), 'transferred_bytes': s.transferred, 'files':"
        " len(s.files)} for s in scans}, 'transferred_bytes': sum(s.transferred for s in scans),"
        " 'coverage': {p: {m: f['codes'] for m, f in v['files'].items() if f['codes']}"
        " for p, v in doc['packages'].items()}}))\n")
    env = dict(os.environ, IMGBUILD_CACHE=cache)
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, check=True,
                         capture_output=True, text=True).stdout
    return json.loads(out)


def imgbuild(*args: str) -> tuple[float, dict]:
    t = time.perf_counter()
    r = subprocess.run([str(ROOT / ".venv" / "bin" / "imgbuild"), *args, "--json"], cwd=ROOT,
                       capture_output=True, text=True)
    took = time.perf_counter() - t
    if r.returncode != 0:
        raise SystemExit(f"imgbuild {' '.join(args)} failed:\n{r.stderr[-3000:]}")
    return took, json.loads(r.stdout)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--skip-cold-build", action="store_true")
    ap.add_argument("--out", default=str(ROOT / "bench" / "results" / "headline.json"))
    args = ap.parse_args()
    doc: dict = {"target": TARGET, "model": MODEL, "machine": machine()}

    with tempfile.TemporaryDirectory(prefix="imgbuild-bench-") as cache:
        cold = scan(cache)
        cached = scan(cache)
    doc["coverage_scan"] = {
        "cold_s": cold["seconds"], "cached_s": cached["seconds"],
        "cold_transferred_bytes": cold["transferred_bytes"],
        "cached_transferred_bytes": cached["transferred_bytes"],
        "per_package_cold": cold["packages"], "coverage": cold["coverage"]}
    print(f"coverage scan: cold {cold['seconds']} s ({cold['transferred_bytes'] / 1e6:.0f} MB "
          f"read), cached {cached['seconds']} s ({cached['transferred_bytes']} bytes)")

    if not args.skip_cold_build:
        subprocess.run(["docker", "builder", "prune", "-af"], check=True, capture_output=True)
        took, cold_build = imgbuild(TARGET, "--model", MODEL, "--rebuild")
        build = cold_build.get("build") or {}
        doc["build_cold"] = {"wall_s": round(took, 1), "action": cold_build["action"],
                             "build": {k: build.get(k) for k in ("seconds", "steps", "cached_steps")},
                             "size_bytes": cold_build["size_bytes"],
                             "smoke_s": cold_build["smoke"]["seconds"]}
        print(f"cold build: {took:.1f} s, {cold_build['size_bytes'] / 1e9:.2f} GB")
    took, noop = imgbuild(TARGET, "--model", MODEL)
    stages = {s["name"]: s for s in noop["smoke"]["stages"]}
    doc["build_noop"] = {"wall_s": round(took, 1), "action": noop["action"],
                         "size_bytes": noop["size_bytes"], "smoke_s": noop["smoke"]["seconds"]}
    tc = stages["toolchain"]
    doc["toolchain_stage"] = {"seconds": tc["duration_s"], "status": tc["status"],
                              "reason": tc["reason"], "details": tc["details"]}
    doc["smoke_stages"] = {n: {"status": s["status"], "seconds": s["duration_s"]}
                           for n, s in stages.items()}
    print(f"no-op: {took:.1f} s ({noop['action']}; smoke {noop['smoke']['seconds']} s); "
          f"toolchain stage {tc['duration_s']} s: {tc['reason']}")
    Path(args.out).write_text(json.dumps(doc, indent=2) + "\n")


if __name__ == "__main__":
    main()
