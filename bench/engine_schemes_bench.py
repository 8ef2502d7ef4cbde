"""What the smoke stage "engine-schemes" costs: its time inside the whole smoke test, per image,
side by side in one run, and how many layers it asked the engine about.

    .venv/bin/python bench/engine_schemes_bench.py IMAGE [IMAGE ...] [--rounds 3]

Each round runs `imgbuild smoke IMAGE` (it always runs the test, never reuses a report) for every
image in turn. The stage imports the engine once (the checkpoint stage has imported torch by
then) and asks about the smoke model and the scheme probes on each of the image's archs.
Results: bench/results/engine-schemes.json.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.machine import machine  # noqa: E402

IMGBUILD = str(ROOT / ".venv" / "bin" / "imgbuild")


def smoke(image: str) -> dict:
    r = subprocess.run([IMGBUILD, "smoke", image, "--json"], cwd=ROOT, capture_output=True,
                       text=True)
    doc = json.loads(r.stdout)
    stage = next(s for s in doc["stages"] if s["name"] == "engine-schemes")
    cks = stage["details"].get("checkpoints", {})
    return {"smoke_s": doc["seconds"], "stage_s": stage["duration_s"], "status": stage["status"],
            "layers": sum(c["modules_checked"] for c in cks.values()),
            "mismatches": sum(len(c["mismatches"]) for c in cks.values()),
            "engine_import_s": max((c["seconds"]["import"] for c in cks.values()), default=None)}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("images", nargs="+")
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    runs: dict[str, list[dict]] = {i: [] for i in args.images}
    for _ in range(args.rounds):
        for image in args.images:
            runs[image].append(smoke(image))
            print(image, runs[image][-1], file=sys.stderr, flush=True)
    out = {"machine": machine(), "rounds": args.rounds, "images": {
        image: {"runs": rs, "median_stage_s": statistics.median(r["stage_s"] for r in rs),
                "median_smoke_s": statistics.median(r["smoke_s"] for r in rs),
                "stage_share": round(statistics.median(r["stage_s"] / r["smoke_s"] for r in rs), 3)}
        for image, rs in runs.items()}}
    path = ROOT / "bench" / "results" / "engine-schemes.json"
    path.write_text(json.dumps(out, indent=1) + "\n")
    print(f"wrote {path.relative_to(ROOT)}", file=sys.stderr)


if __name__ == "__main__":
    main()
