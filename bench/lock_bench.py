"""Lock every shipped target: imgbuild against raw `uv pip compile` of the same inputs.

Side by side in one run (this machine is noisy), each variant with a cold uv cache (a fresh
UV_CACHE_DIR) and then warm (one shared cache, after a warm-up pass), sequential and with
4 locks at once. Results: bench/results/lock.json and a table on stdout.

    .venv/bin/python bench/lock_bench.py [--rounds 3]

`--target T`: one target the way a user locks it, `imgbuild lock T --refresh` (the CLI: the
resolution, the override checks and the kernel record) against raw uv of the same inputs,
with uv's cache cold and warm, and imgbuild's override-check cache cold and warm; plus a
re-lock with nothing changed (no --refresh). Results go under the key `target` of the same
file; the all-targets results are kept.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
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
from imgbuild.lock.lockfile import LockRequest, parse_body, read_lock  # noqa: E402
from imgbuild.lock.resolve import lock_many  # noqa: E402
from imgbuild.lock.uv import index_args, uv_bin, uv_env  # noqa: E402
from imgbuild.workspace import Workspace  # noqa: E402


def raw_uv(req: LockRequest, wheels: Path | None, env: dict,
           pins_out: list | None = None) -> float:
    """The same resolution as imgbuild.lock.resolve, spelled as a user would type it."""
    with tempfile.TemporaryDirectory() as td:
        (Path(td) / "requirements.in").write_text("\n".join(req.requirements) + "\n")
        cmd = [uv_bin(), "pip", "compile", f"{td}/requirements.in", "--generate-hashes",
               "--no-header", "--python-version", req.python, "--python-platform",
               req.uv_platform, "--quiet", "-o", f"{td}/out.txt"]
        if not req.build_from_source:
            cmd.append("--no-build")  # as imgbuild resolves: wheels only
        if req.overrides:
            (Path(td) / "overrides.txt").write_text("\n".join(req.overrides) + "\n")
            cmd += ["--overrides", f"{td}/overrides.txt"]
        cmd += index_args(req, wheels)
        t = time.perf_counter()
        subprocess.run(cmd, env=env, check=True, capture_output=True)
        dt = time.perf_counter() - t
        if pins_out is not None:
            pins_out.append(pins(Path(td, "out.txt").read_text()))
        return dt


def pins(body: str) -> tuple[str, ...]:
    """name==version and hashes, one package a line: what a lock installs (not uv's `# via`
    comments, which name the input file's path)."""
    return tuple(p.line() for p in parse_body(body, "bench"))


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


def one_target(name: str, rounds: int, wheels: Path | None, out: Path) -> None:
    """`imgbuild lock NAME` as a user runs it against raw uv on the same inputs, in one run."""
    ws = Workspace.open(ROOT / "images")
    [ref] = ws.platform_refs(name)
    req = ref.request
    work = Path(tempfile.mkdtemp(prefix="lock-bench-"))
    # A scratch project: the committed lock and its kernel record are copied, never written.
    shutil.copytree(ROOT / "images", work / "images")
    (work / "lockfiles").mkdir()
    for f in (ROOT / "lockfiles").glob(f"{name}.*"):
        shutil.copy(f, work / "lockfiles")
    lock_path = work / "lockfiles" / req.filename()
    # imgbuild's cache of the run: the kernel records it reads from wheels stay warm (a new lock
    # is read once, in the warm-up), the override checks are emptied for "check cache cold".
    ib_cache = work / "imgbuild-cache"
    checks = ib_cache / "override-checks"
    samples: dict[str, list[float]] = {}
    same_pins: list[bool] = []

    def imgbuild(uv_cache: Path, *refresh: str) -> float:
        env = dict(os.environ, UV_CACHE_DIR=str(uv_cache), IMGBUILD_CACHE=str(ib_cache),
                   UV_PYTHON_DOWNLOADS="never")
        if wheels:
            env["IMGBUILD_WHEELS"] = str(wheels)
        cmd = [sys.executable, "-m", "imgbuild.cli", "lock", name, *refresh, "--json",
               "--images", str(work / "images"), "--lockfiles", str(work / "lockfiles")]
        t = time.perf_counter()
        proc = subprocess.run(cmd, env=env, capture_output=True, text=True, cwd=work)
        dt = time.perf_counter() - t
        if proc.returncode != 0:
            raise SystemExit(f"imgbuild lock failed:\n{proc.stdout}\n{proc.stderr}")
        doc = json.loads(proc.stdout)
        if len(doc["locks"][0].get("overrides", ())) != len(req.overrides):
            raise SystemExit(f"imgbuild lock said nothing about the overrides:\n{proc.stdout}")
        return dt

    def uv(uv_cache: Path) -> float:
        got: list = []
        dt = raw_uv(req, wheels, dict(uv_env(), UV_CACHE_DIR=str(uv_cache)), got)
        # The same pins as the lock imgbuild wrote from the same index moments before.
        same_pins.append(got[0] == pins(read_lock(lock_path).body))
        return dt

    def record(key: str, secs: float) -> None:
        samples.setdefault(key, []).append(secs)
        print(f"  {key:34s} {secs:7.2f} s", flush=True)

    warm_uv = work / "uv-warm"
    print("warm-up: uv's cache, and the kernel record of today's resolution")
    imgbuild(warm_uv, "--refresh")
    for rnd in range(rounds):
        # Every other round in the other order: no variant always runs first, or last.
        order = (lambda vs: vs) if rnd % 2 == 0 else (lambda vs: vs[::-1])
        print(f"round {rnd + 1}: uv cache cold (a fresh one per run)")
        for variant in order(("uv", "checks-cold", "checks-warm")):
            with tempfile.TemporaryDirectory(dir=work) as cold:
                if variant == "checks-cold":
                    shutil.rmtree(checks, ignore_errors=True)
                secs = uv(Path(cold)) if variant == "uv" else imgbuild(Path(cold), "--refresh")
                record(f"cold {variant}", secs)
        print(f"round {rnd + 1}: uv cache warm")
        for variant in order(("uv", "checks-cold", "checks-warm", "relock")):
            if variant == "checks-cold":
                shutil.rmtree(checks, ignore_errors=True)
            refresh = () if variant == "relock" else ("--refresh",)
            secs = uv(warm_uv) if variant == "uv" else imgbuild(warm_uv, *refresh)
            record(f"warm {variant}", secs)
    shutil.rmtree(work, ignore_errors=True)
    med = {k: statistics.median(v) for k, v in samples.items()}
    rows = []
    for cache in ("cold", "warm"):
        u = med[f"{cache} uv"]
        for variant in ("checks-cold", "checks-warm") + (("relock",) if cache == "warm" else ()):
            i = med[f"{cache} {variant}"]
            # Also each round's imgbuild over the same round's uv, a minute apart: the index,
            # the network and the neighbours' load drift less within a round than across.
            paired = statistics.median(a / b for a, b in zip(samples[f"{cache} {variant}"],
                                                              samples[f"{cache} uv"]))
            rows.append({"uv_cache": cache, "imgbuild": variant, "uv_s": round(u, 2),
                         "imgbuild_s": round(i, 2), "ratio": round(i / u, 2),
                         "ratio_paired": round(paired, 2)})
    doc = json.loads(out.read_text()) if out.exists() else {}
    doc["target"] = {
        "benchmark": f"imgbuild lock {name} --refresh (resolution, {len(req.overrides)} "
                     "override checks, kernel record) vs raw uv pip compile of the same inputs",
        "target": name, "overrides": len(req.overrides), "rounds": rounds, "machine": machine(),
        "goal_ratio": 1.2, "same_pins_as_raw_uv": all(same_pins), "median": rows,
        "samples": samples}
    out.write_text(json.dumps(doc, indent=2) + "\n")
    print(f"\n{name}: median of {rounds} rounds ({doc['target']['machine']['cores']} cores); "
          f"pins the same as raw uv's: {all(same_pins)}")
    print(f"{'uv cache':8s} {'imgbuild':12s} {'uv':>8s} {'imgbuild':>9s} {'ratio':>6s} "
          f"{'paired':>6s}")
    for r in rows:
        print(f"{r['uv_cache']:8s} {r['imgbuild']:12s} {r['uv_s']:7.2f}s {r['imgbuild_s']:8.2f}s "
              f"{r['ratio']:5.2f}x {r['ratio_paired']:5.2f}x")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--target", help="one target, the CLI with its override checks")
    ap.add_argument("--out", default=str(ROOT / "bench" / "results" / "lock.json"))
    args = ap.parse_args()
    wheels = os.environ.get("IMGBUILD_WHEELS") or ("/opt/wheels" if Path("/opt/wheels").is_dir() else None)
    wheels = Path(wheels) if wheels else None
    if args.target:
        # As a user locks it: a wheel directory only when one is named (IMGBUILD_WHEELS).
        named = os.environ.get("IMGBUILD_WHEELS")
        one_target(args.target, args.rounds, Path(named) if named else None, Path(args.out))
        return
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
    old = json.loads(Path(args.out).read_text()) if Path(args.out).exists() else {}
    if "target" in old:  # the one-target results (--target) stay beside these
        doc["target"] = old["target"]
    Path(args.out).write_text(json.dumps(doc, indent=2) + "\n")
    print(f"\n{len(reqs)} targets, median of {args.rounds} rounds ({doc['machine']['cores']} cores)")
    print(f"{'cache':6s} {'jobs':>4s} {'uv':>8s} {'imgbuild':>9s} {'overhead':>9s}")
    for r in rows:
        print(f"{r['cache']:6s} {r['jobs']:4d} {r['uv_s']:7.2f}s {r['imgbuild_s']:8.2f}s "
              f"{r['overhead'] * 100:8.1f}%")
    print(f"imgbuild x4 vs x1: cold {speedup['cold']}x, warm {speedup['warm']}x")


if __name__ == "__main__":
    main()
