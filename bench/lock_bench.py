"""Lock every shipped target: imgbuild against raw `uv pip compile` of the same inputs.

Side by side in one run (this machine is noisy), each variant with a cold uv cache (a fresh
UV_CACHE_DIR) and then warm (one shared cache, after a warm-up pass), sequential and with
4 locks at once. Results: bench/results/lock.json and a table on stdout.

    .venv/bin/python bench/lock_bench.py [--rounds 3]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.machine import machine  # noqa: E402
from imgbuild.lock.lockfile import LockRequest  # noqa: E402
from imgbuild.lock.resolve import lock_many  # noqa: E402
from imgbuild.lock.uv import index_args, uv_bin, uv_env  # noqa: E402
from imgbuild.workspace import Workspace  # noqa: E402


def raw_uv(req: LockRequest, wheels: Path | None, env: dict) -> float:
    """The same resolution as imgbuild.lock.resolve, spelled as a user would type it."""
    with tempfile.TemporaryDirectory() as td:
        (Path(td) / "requirements.in").write_text("\n".join(req.requirements) + "\n")
        cmd = [uv_bin(), "pip", "compile", f"{td}/requirements.in", "--generate-hashes",
               "--no-header", "--python-version", req.python, "--python-platform",
               req.uv_platform, "--quiet", "-o", f"{td}/out.txt"]
        if req.overrides:
            (Path(td) / "overrides.txt").write_text("\n".join(req.overrides) + "\n")
            cmd += ["--overrides", f"{td}/overrides.txt"]
        cmd += index_args(req, wheels)
        t = time.perf_counter()
        subprocess.run(cmd, env=env, check=True, capture_output=True)
        return time.perf_counter() - t


def run_uv(reqs, wheels, env, jobs) -> float:
    t = time.perf_counter()
    with ThreadPoolExecutor(max_workers=jobs) as pool:
        list(pool.map(lambda r: raw_uv(r, wheels, env), reqs))
    return time.perf_counter() - t


def run_imgbuild(reqs, wheels, jobs) -> float:
    with tempfile.TemporaryDirectory() as td:
        t = time.perf_counter()
        results = lock_many(reqs, Path(td), wheels, refresh=True, jobs=jobs)
        dt = time.perf_counter() - t
    errs = [e for _, _, e in results if e]
    if errs:
        raise SystemExit(f"lock failed: {errs[0]}")
    return dt


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--out", default=str(ROOT / "bench" / "results" / "lock.json"))
    args = ap.parse_args()
    wheels = os.environ.get("IMGBUILD_WHEELS") or ("/opt/wheels" if Path("/opt/wheels").is_dir() else None)
    wheels = Path(wheels) if wheels else None
    ws = Workspace.open(ROOT / "images")
    # Every lock the catalog has: one per target and platform.
    reqs = [r.request for n in sorted(ws.catalog.targets) for r in ws.platform_refs(n)]
    samples: dict[str, list[float]] = {}

    def record(name: str, secs: float) -> None:
        samples.setdefault(name, []).append(secs)
        print(f"  {name:28s} {secs:7.2f} s", flush=True)

    for rnd in range(args.rounds):
        print(f"round {rnd + 1}: cold caches")
        for jobs in (1, 4):
            for variant in ("uv", "imgbuild"):
                with tempfile.TemporaryDirectory() as cache:
                    os.environ["UV_CACHE_DIR"] = cache
                    env = uv_env()
                    secs = run_uv(reqs, wheels, env, jobs) if variant == "uv" else \
                        run_imgbuild(reqs, wheels, jobs)
                    record(f"cold {variant} x{jobs}", secs)
        print(f"round {rnd + 1}: warm cache")
        with tempfile.TemporaryDirectory() as cache:
            os.environ["UV_CACHE_DIR"] = cache
            env = uv_env()
            run_uv(reqs, wheels, env, 4)  # warm-up
            for jobs in (1, 4):
                for variant in ("uv", "imgbuild"):
                    secs = run_uv(reqs, wheels, env, jobs) if variant == "uv" else \
                        run_imgbuild(reqs, wheels, jobs)
                    record(f"warm {variant} x{jobs}", secs)
    os.environ.pop("UV_CACHE_DIR", None)
    med = {k: statistics.median(v) for k, v in samples.items()}
    rows = []
    for cache in ("cold", "warm"):
        for jobs in (1, 4):
            u, i = med[f"{cache} uv x{jobs}"], med[f"{cache} imgbuild x{jobs}"]
            rows.append({"cache": cache, "jobs": jobs, "uv_s": round(u, 2),
                         "imgbuild_s": round(i, 2), "overhead": round(i / u - 1, 3)})
    speedup = {c: round(med[f"{c} imgbuild x1"] / med[f"{c} imgbuild x4"], 2) for c in ("cold", "warm")}
    doc = {"benchmark": "lock every shipped target", "targets": [r.target for r in reqs],
           "rounds": args.rounds, "machine": machine(), "median": rows,
           "parallel_speedup_x4": speedup, "samples": samples}
    Path(args.out).write_text(json.dumps(doc, indent=2) + "\n")
    print(f"\n{len(reqs)} targets, median of {args.rounds} rounds ({doc['machine']['cores']} cores)")
    print(f"{'cache':6s} {'jobs':>4s} {'uv':>8s} {'imgbuild':>9s} {'overhead':>9s}")
    for r in rows:
        print(f"{r['cache']:6s} {r['jobs']:4d} {r['uv_s']:7.2f}s {r['imgbuild_s']:8.2f}s "
              f"{r['overhead'] * 100:8.1f}%")
    print(f"imgbuild x4 vs x1: cold {speedup['cold']}x, warm {speedup['warm']}x")


if __name__ == "__main__":
    main()
