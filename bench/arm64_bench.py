"""arm64 under QEMU user emulation against amd64 natively, side by side in one run: the
multi-platform demo target (tiny-cpu-multi) built from a cold layer cache for each platform
(linux/amd64 natively, linux/arm64 under QEMU), its smoke test, its size; with --registry, the
push of both and the index; with --base, the arm64 base's debootstrap.

    IMGBUILD_WHEELS=/opt/wheels .venv/bin/python bench/arm64_bench.py [--rounds 2] [--base] \
        [--registry 127.0.0.1:5000/bench]

Each round builds both with `--rebuild --no-cache` (the uv cache mount stays: wheel downloads
are not what is compared). Results: bench/results/arm64.json, with the machine.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.machine import machine  # noqa: E402

IMGBUILD = str(ROOT / ".venv" / "bin" / "imgbuild")
TARGET = "tiny-cpu-multi"
PLATFORMS = {"amd64": "linux/amd64", "arm64": "linux/arm64"}


def run(*args: str) -> dict:
    r = subprocess.run([IMGBUILD, TARGET, *args, "--json"], cwd=ROOT, capture_output=True,
                       text=True)
    if r.returncode != 0:
        raise SystemExit(f"{TARGET} {' '.join(args)} failed:\n{r.stderr[-3000:]}")
    return json.loads(r.stdout)


def build(platform: str) -> dict:
    t = time.perf_counter()
    d = run("--platform", platform, "--rebuild", "--no-cache")["platforms"][platform]
    return {"wall_s": round(time.perf_counter() - t, 1), "build_s": d["build"]["seconds"],
            "smoke_s": d["smoke"]["seconds"], "size_bytes": d["size_bytes"],
            "stages": {s["name"]: s["duration_s"] for s in d["smoke"]["stages"]}}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--base", action="store_true", help="also debootstrap the arm64 base")
    ap.add_argument("--registry", help="also push both platforms and the index there")
    ap.add_argument("--out", default=str(ROOT / "bench" / "results" / "arm64.json"))
    args = ap.parse_args()
    doc: dict = {"machine": machine(), "rounds": []}
    for _ in range(args.rounds):
        row = {cpu: build(platform) for cpu, platform in PLATFORMS.items()}
        row["build_ratio_arm64_over_amd64"] = round(row["arm64"]["build_s"]
                                                    / row["amd64"]["build_s"], 2)
        row["smoke_ratio_arm64_over_amd64"] = round(row["arm64"]["smoke_s"]
                                                    / row["amd64"]["smoke_s"], 2)
        doc["rounds"].append(row)
        print(json.dumps(row))
    if args.registry:
        # Both images are local by now: this times the pushes (the Engine gzips each layer)
        # and the index (checked and assembled through the registry's API).
        t = time.perf_counter()
        d = run("--push", "--registry", args.registry)
        doc["push_both_and_index_s"] = round(time.perf_counter() - t, 1)
        doc["index"] = {"content_tag": d["index"]["content_tag"], "digest": d["index"]["digest"]}
        t = time.perf_counter()
        subprocess.run([IMGBUILD, "index", TARGET, "--registry", args.registry], cwd=ROOT,
                       check=True, capture_output=True)
        doc["index_again_s"] = round(time.perf_counter() - t, 1)
        print(f"push both + index: {doc['push_both_and_index_s']} s; index again: "
              f"{doc['index_again_s']} s")
    if args.base:
        t = time.perf_counter()
        subprocess.run([IMGBUILD, "base", "bootstrap", "--cpu-arch", "aarch64", "--rebuild"],
                       cwd=ROOT, check=True, capture_output=True)
        doc["arm64_base_bootstrap_s"] = round(time.perf_counter() - t, 1)
        print(f"arm64 base: {doc['arm64_base_bootstrap_s']} s")
    Path(args.out).write_text(json.dumps(doc, indent=2) + "\n")


if __name__ == "__main__":
    main()
