"""A fresh CI runner's build with the registry build cache (mode=max) against today's inline
cache, side by side in one run, on Docker Engine 26 with the containerd image store.

    IMGBUILD_WHEELS=/opt/wheels .venv/bin/python bench/registry_cache_bench.py

Every build runs on a Docker Engine of its own, started empty (tests/fresh_engine.py with the
Engine 26 that scripts/engines.sh installs, `containerd_store=True`): a fresh runner, with no
image and no BuildKit cache, nothing pruned on this machine's Engines.

1. The previous image: tiny-cpu, built, smoke-tested and pushed into two repositories of the
   bench's own: one with the registry cache (`--registry-cache`: `TARGET-buildcache-max`,
   written with mode=max on --push, every stage's layers; read alone where it exists), one
   without (the image's inline cache only, today's way and the default).
2. Two engine-only bumps, one after the other (one more package in the rest of the lock
   each time), each on the next fresh runner, each way: built and pushed with --no-smoke
   --no-splice, and the moving tags then moved onto it (as its smoke test's pass would). The
   second bump is the one an inline cache alone can get wrong (moby/buildkit#1981: a step
   taken from the cache is not exported into the new image's inline cache).
3. A cold build (no cache read at all) on a fresh runner, for scale.

Recorded per build: wall time, BuildKit's steps and how many were CACHED, and whether the heavy
install step was. Results: bench/results/registry-cache-tiny-cpu.json.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.machine import machine  # noqa: E402
from imgbuild.image.registry import Repository, tag_manifest  # noqa: E402
from tests.engines import engine26_bin_dir  # noqa: E402
from tests.fresh_engine import fresh_engine, missing  # noqa: E402

IMGBUILD = [sys.executable, "-m", "imgbuild.cli"]
REGISTRY = os.environ.get("IMGBUILD_TEST_REGISTRY", "127.0.0.1:5000")
OUT = ROOT / "bench" / "results" / "registry-cache-tiny-cpu.json"
HEAVY = re.compile(r"^#(\d+) \[.*-r /opt/imgbuild/heavy\.txt")


def imgbuild(*args: str, cwd: Path, env: dict[str, str]) -> tuple[float, dict]:
    t = time.perf_counter()
    r = subprocess.run([*IMGBUILD, *args, "--json"], cwd=cwd, capture_output=True, text=True,
                       env=dict(os.environ, **env))
    if r.returncode != 0:
        raise SystemExit(f"imgbuild {' '.join(args)} failed:\n{(r.stderr + r.stdout)[-3000:]}")
    return round(time.perf_counter() - t, 1), json.loads(r.stdout)


def heavy_cached(log: Path) -> bool:
    text = log.read_text(errors="replace").splitlines()
    ids = {m.group(1) for line in text if (m := HEAVY.match(line))}
    return any(line.startswith(f"#{i} ") and line.endswith(" CACHED") for i in ids
               for line in text)


def project(root: Path, extra: list[str]) -> Path:
    (root / "images").mkdir(parents=True, exist_ok=True)
    (root / "imgbuild.yaml").write_text("# the bench's project\n")
    (root / "images" / "tiny-cpu.yaml").write_text(
        "extends: tiny-cpu\n" + ("requirements:\n" + "".join(f"  - {p}\n" for p in extra)
                                 if extra else ""))
    r = subprocess.run([*IMGBUILD, "lock", "tiny-cpu"], cwd=root, capture_output=True, text=True)
    if r.returncode != 0:
        raise SystemExit(f"lock failed:\n{r.stderr[-2000:]}")
    return root


def on_a_fresh_runner(bin_dir: Path, work: Path, name: str, repos: list[str], args: list[str],
                      proj: Path) -> dict:
    """One build on an Engine started empty, the base pulled from the registry first."""
    logs = work / f"logs-{name}"
    logs.mkdir()
    with fresh_engine(bin_dir=bin_dir, containerd_store=True) as engine:
        env = dict(engine.env, IMGBUILD_BLOB_CACHE_GB="0")
        imgbuild("base", "bootstrap", "--base", "debian-bookworm", "--registry", repos[0],
                 cwd=proj, env=env)
        secs, out = imgbuild("tiny-cpu", *args, "--log-dir", str(logs), cwd=proj, env=env)
        build = out.get("build") or {}
        log = next(logs.glob("*.build.log"), None)
        return {"seconds": secs, "build_seconds": build.get("seconds"),
                "steps": build.get("steps"), "cached_steps": build.get("cached_steps"),
                "heavy_cached": heavy_cached(log) if log else None,
                "cache_imported": build.get("cache_imported"),
                "content_tag": out.get("content_tag")}


def main() -> None:
    if why := missing():
        raise SystemExit(f"cannot run: {why}")
    bin_dir = engine26_bin_dir()
    if bin_dir is None:
        raise SystemExit("cannot run: no Engine 26 installed (make services installs it)")
    work = Path(tempfile.mkdtemp(prefix="ibrcb-"))
    run = uuid.uuid4().hex[:8]
    repos = {"inline": f"{REGISTRY}/bench-rc-inline-{run}",
             "registry": f"{REGISTRY}/bench-rc-max-{run}"}
    way_args = {"inline": [], "registry": ["--registry-cache"]}
    results: dict = {"machine": machine(), "engine": "Docker Engine 26.1.5 (Debian trixie), "
                     "containerd image store, buildx 0.13.1 (docker driver)", "builds": {}}
    try:
        # The base once, from this machine's Engine, into both repositories (the workflow's
        # base job); each fresh runner pulls it from there.
        for repo in repos.values():
            subprocess.run([*IMGBUILD, "base", "bootstrap", "--base", "debian-bookworm",
                            "--registry", repo], check=True, capture_output=True)
        proj = project(work / "p0", [])
        previous = {}
        for way, repo in repos.items():
            previous[way] = on_a_fresh_runner(bin_dir, work, f"previous-{way}", [repo],
                                              ["--push", "--registry", repo, *way_args[way]],
                                              proj)
            results["builds"][f"previous ({way})"] = previous[way]
        for n, extra in enumerate((["six"], ["six", "attrs"]), start=1):
            proj = project(work / f"p{n}", extra)
            for way, repo in repos.items():
                got = on_a_fresh_runner(bin_dir, work, f"bump{n}-{way}", [repo],
                                        ["--push", "--no-smoke", "--no-splice", "--registry",
                                         repo, *way_args[way]], proj)
                results["builds"][f"bump {n} ({way})"] = got
                # What a passing smoke test does: the moving tags go onto the bump.
                r = Repository.parse(repo)
                for t in ("tiny-cpu", "tiny-cpu-transformers5.17.0"):
                    tag_manifest(r, got["content_tag"].rsplit(":", 1)[1], t)
        results["builds"]["cold (no cache read)"] = on_a_fresh_runner(
            bin_dir, work, "cold", [repos["inline"]],
            ["--no-smoke", "--no-cache-from", "--rebuild", "--registry", repos["inline"]],
            project(work / "p3", ["six", "attrs", "idna"]))
    finally:
        shutil.rmtree(work, ignore_errors=True)
    b = results["builds"]
    results["side_by_side"] = {
        f"bump {n}": {"inline_s": b[f"bump {n} (inline)"]["build_seconds"],
                      "registry_s": b[f"bump {n} (registry)"]["build_seconds"],
                      "ratio": round(b[f"bump {n} (registry)"]["build_seconds"]
                                     / b[f"bump {n} (inline)"]["build_seconds"], 3),
                      "cached_steps": {w: f"{b[f'bump {n} ({w})']['cached_steps']} of "
                                          f"{b[f'bump {n} ({w})']['steps']}"
                                       for w in ("inline", "registry")},
                      "heavy_cached": {w: b[f"bump {n} ({w})"]["heavy_cached"]
                                       for w in ("inline", "registry")}}
        for n in (1, 2)}
    OUT.write_text(json.dumps(results, indent=1) + "\n")
    print(json.dumps(results["side_by_side"], indent=1))


if __name__ == "__main__":
    main()
