"""A patch-only change against a cold build, side by side in one run: how much of the image a
one-hunk edit of a compatibility patch rebuilds.

    IMGBUILD_WHEELS=/opt/wheels .venv/bin/python bench/patch_rebuild_bench.py \
        [--target sglang-0516-blackwell] [--rounds 1]

Each round: the target built with BuildKit's layer cache unused (`--rebuild --no-cache`; uv's
wheel cache stays warm: downloads are not what is compared), then the same target from a copy
of images/ in which one added line of a patch's hunk is reworded (the hunk still applies), built
normally. Smoke tests are not run (they are the same work either way). Results:
bench/results/patch-rebuild-TARGET.json.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.machine import machine  # noqa: E402

IMGBUILD = str(ROOT / ".venv" / "bin" / "imgbuild")
PATCH = "patches/sglang-ct-ignore-exact-match.diff"
EDIT = ("+    A plain (non-regex) target", "+    A plain target")


def build(*args: str) -> dict:
    t = time.perf_counter()
    r = subprocess.run([IMGBUILD, *args, "--no-smoke", "--json"], cwd=ROOT, capture_output=True,
                       text=True)
    if r.returncode != 0:
        said = (r.stderr + r.stdout)[-3000:]  # with --json the error is on stdout
        raise SystemExit(f"imgbuild {' '.join(args)} failed:\n{said}")
    d = json.loads(r.stdout)
    return {"wall_s": round(time.perf_counter() - t, 1), "action": d["action"],
            "content_tag": d["content_tag"], "size_bytes": d["size_bytes"],
            "build_s": d["build"]["seconds"], "steps": d["build"]["steps"],
            "cached_steps": d["build"]["cached_steps"]}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--target", default="sglang-0516-blackwell")
    ap.add_argument("--rounds", type=int, default=1)
    args = ap.parse_args()
    rounds = []
    for _ in range(args.rounds):
        cold = build(args.target, "--rebuild", "--no-cache")
        with tempfile.TemporaryDirectory() as td:
            images = Path(td) / "images"
            shutil.copytree(ROOT / "images", images)
            diff = images / PATCH
            text = diff.read_text()
            if EDIT[0] not in text:
                raise SystemExit(f"{PATCH} no longer has the line this bench edits")
            diff.write_text(text.replace(*EDIT, 1))
            patched = build(args.target, "--images", str(images), "--lockfiles",
                            str(ROOT / "lockfiles"))
        subprocess.run(["docker", "rmi", patched["content_tag"]], capture_output=True)
        rounds.append({"cold": cold, "patch_only": patched,
                       "build_ratio_patch_over_cold": round(patched["build_s"] / cold["build_s"],
                                                            4)})
        print(json.dumps(rounds[-1], indent=2))
    doc = {"machine": machine(), "target": args.target, "edit": {"file": PATCH, "from": EDIT[0],
                                                                   "to": EDIT[1]},
           "goal": "patch-only build <= 5% of the cold build", "rounds": rounds}
    out = ROOT / "bench" / "results" / f"patch-rebuild-{args.target}.json"
    out.write_text(json.dumps(doc, indent=2) + "\n")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
