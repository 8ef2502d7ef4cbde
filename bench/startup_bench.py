"""Start-up and the no-op build, side by side in one run: what a person waits for on a target
that is already built and smoke-tested.

- `imgbuild --help`, `imgbuild list`, `imgbuild plan tiny-cpu` (with and without the dependency
  check): wall time per run, median;
- `imgbuild tiny-cpu` on an image that is built and passed its smoke test: with the report
  reused (the default) and with `--resmoke` (the smoke test run again), and its ratio to `plan`;
- the modules `plan` imports, by cumulative import time (`python -X importtime`).

    .venv/bin/python bench/startup_bench.py [--rounds 7] [--registry 127.0.0.1:5000/imgbuild]

Needs Docker and a built tiny-cpu (`make demo` makes it); with --registry, also the no-op build
against that registry (the image pushed there first). Results: bench/results/startup.json.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.machine import machine  # noqa: E402

IMGBUILD = str(ROOT / ".venv" / "bin" / "imgbuild")
PYTHON = str(ROOT / ".venv" / "bin" / "python")

CASES = {
    "help": ["--help"],
    "list": ["list"],
    "plan": ["plan", "tiny-cpu"],
    "plan --no-checks": ["plan", "tiny-cpu", "--no-checks"],
    "no-op build": ["tiny-cpu"],
    "no-op build --resmoke": ["tiny-cpu", "--resmoke"],
}


def wall(args: list[str]) -> float:
    t = time.perf_counter()
    r = subprocess.run([IMGBUILD, *args], cwd=ROOT, capture_output=True, text=True)
    took = time.perf_counter() - t
    if r.returncode != 0:
        raise SystemExit(f"imgbuild {' '.join(args)} failed:\n{r.stderr[-2000:]}")
    return took


def import_times(args: list[str], top: int = 15) -> list[dict]:
    """The modules with the largest cumulative import time (µs), as -X importtime reports."""
    r = subprocess.run([PYTHON, "-X", "importtime", "-m", "imgbuild.cli", *args], cwd=ROOT,
                       capture_output=True, text=True, env=os.environ | {"PYTHONPATH": str(ROOT)})
    rows = []
    for line in r.stderr.splitlines():
        parts = line.removeprefix("import time:").split("|")
        if len(parts) == 3 and parts[1].strip().isdigit():
            rows.append({"module": parts[2].strip(), "cumulative_us": int(parts[1])})
    rows.sort(key=lambda x: -x["cumulative_us"])
    total = sum(x["cumulative_us"] for x in rows if not x["module"].startswith(" ")
                and "." not in x["module"])
    return [{"total_top_level_us": total}] + rows[:top]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--out", default=str(ROOT / "bench" / "results" / "startup.json"))
    ap.add_argument("--registry", help="also time plan and the no-op build against it")
    args = ap.parse_args()
    wall(["tiny-cpu"])  # built and smoke-tested before anything is timed
    if args.registry:
        wall(["tiny-cpu", "--push", "--registry", args.registry])
        CASES["plan --registry"] = ["plan", "tiny-cpu", "--registry", args.registry]
        CASES["no-op build --registry"] = ["tiny-cpu", "--registry", args.registry]
    runs: dict[str, list[float]] = {k: [] for k in CASES}
    for _ in range(args.rounds):  # interleaved: each round runs every case once
        for name, argv in CASES.items():
            runs[name].append(round(wall(argv), 3))
    med = {k: round(statistics.median(v), 3) for k, v in runs.items()}
    doc = {"machine": machine(), "rounds": args.rounds, "median_s": med, "runs_s": runs,
           "ratios": {"no-op build / plan": round(med["no-op build"] / med["plan"], 2),
                      "no-op build --resmoke / plan": round(
                          med["no-op build --resmoke"] / med["plan"], 2)} | ({
                          "no-op build --registry / plan --registry": round(
                              med["no-op build --registry"] / med["plan --registry"], 2)}
                          if args.registry else {}),
           "goals": {"no-op build / plan": "<= 2", "plan_s": "<= 0.5", "help_s": "<= 0.2"},
           "plan_imports": import_times(["plan", "tiny-cpu", "--no-checks"])}
    Path(args.out).write_text(json.dumps(doc, indent=2) + "\n")
    print(json.dumps({"median_s": med, "ratios": doc["ratios"]}, indent=2))


if __name__ == "__main__":
    main()
