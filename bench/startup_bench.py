"""Start-up and the no-op build, side by side in one run: what a person waits for on a target
that is already built and smoke-tested.

- `imgbuild --help`, `imgbuild list`, `imgbuild plan tiny-cpu` (with and without the dependency
  check): wall time per run, median;
- `imgbuild tiny-cpu` on an image that is built and passed its smoke test: with the report
  reused (the default) and with `--resmoke` (the smoke test run again), and its ratio to `plan`
  (`ratios`, goal <= 1.2: a no-op build does what `plan` does, then asks the Engine whether the
  image is here and tags it);
- the modules `plan` and the no-op build import, by cumulative import time
  (`python -X importtime`), and what the no-op build imports that `plan` does not.

    .venv/bin/python bench/startup_bench.py [--rounds 7] [--registry 127.0.0.1:5000/imgbuild]

Needs Docker and a built tiny-cpu (`make demo` makes it); with --registry, also the no-op build
against that registry (the image pushed there first). Results: bench/results/startup.json.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
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


def wall(args: list[str]) -> tuple[float, float]:
    """Wall time of `imgbuild ARGS`, and the CPU time (user + system) it and the processes it
    waited for (`docker`, `git`) used: on a machine shared with other work the CPU time moves
    less with the load than the wall time does. The Engine's own work is in neither."""
    used = resource.getrusage(resource.RUSAGE_CHILDREN)
    t = time.perf_counter()
    r = subprocess.run([IMGBUILD, *args], cwd=ROOT, capture_output=True, text=True)
    took = time.perf_counter() - t
    now = resource.getrusage(resource.RUSAGE_CHILDREN)
    if r.returncode != 0:
        raise SystemExit(f"imgbuild {' '.join(args)} failed:\n{r.stderr[-2000:]}")
    return took, (now.ru_utime - used.ru_utime) + (now.ru_stime - used.ru_stime)


def import_rows(args: list[str]) -> list[dict]:
    """Every module `imgbuild ARGS` imports: its own and cumulative import time (µs), as
    -X importtime reports them."""
    r = subprocess.run([PYTHON, "-X", "importtime", "-m", "imgbuild.cli", *args], cwd=ROOT,
                       capture_output=True, text=True, env=os.environ | {"PYTHONPATH": str(ROOT)})
    rows = []
    for line in r.stderr.splitlines():
        parts = line.removeprefix("import time:").split("|")
        if len(parts) == 3 and parts[1].strip().isdigit():
            rows.append({"module": parts[2].strip(), "self_us": int(parts[0]),
                         "cumulative_us": int(parts[1]), "top_level": parts[2][1:2] != " "})
    return rows


def import_times(rows: list[dict], top: int = 15) -> list[dict]:
    """The modules with the largest cumulative import time (µs)."""
    total = sum(x["cumulative_us"] for x in rows if x["top_level"])
    biggest = sorted(rows, key=lambda x: -x["cumulative_us"])[:top]
    return [{"total_top_level_us": total, "modules": len(rows)}] + [
        {"module": x["module"], "cumulative_us": x["cumulative_us"]} for x in biggest]


def imported_beyond(rows: list[dict], base: list[dict], top: int = 15) -> dict:
    """What `rows` imports that `base` does not: how many modules, their own time (µs)."""
    known = {x["module"] for x in base}
    extra = sorted((x for x in rows if x["module"] not in known), key=lambda x: -x["self_us"])
    return {"modules": len(extra), "self_us": sum(x["self_us"] for x in extra),
            "largest": [{"module": x["module"], "self_us": x["self_us"]} for x in extra[:top]]}


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
    cpu: dict[str, list[float]] = {k: [] for k in CASES}
    for _ in range(args.rounds):  # interleaved: each round runs every case once
        for name, argv in CASES.items():
            took, used = wall(argv)
            runs[name].append(round(took, 3))
            cpu[name].append(round(used, 3))
    med = {k: round(statistics.median(v), 3) for k, v in runs.items()}
    med_cpu = {k: round(statistics.median(v), 3) for k, v in cpu.items()}
    # Each round ran plan and the no-op build one after the other: the ratio of a round's pair
    # is less at the mercy of the machine's load than that of the two medians.
    paired = [b / p for b, p in zip(runs["no-op build"], runs["plan"])]
    plan_rows = import_rows(["plan", "tiny-cpu"])
    noop_rows = import_rows(["tiny-cpu"])
    doc = {"machine": machine() | {"load_average": os.getloadavg()}, "rounds": args.rounds,
           "median_s": med, "runs_s": runs, "cpu_median_s": med_cpu, "cpu_runs_s": cpu,
           "ratios": {"no-op build / plan": round(med["no-op build"] / med["plan"], 2),
                      "no-op build / plan, CPU time": round(
                          med_cpu["no-op build"] / med_cpu["plan"], 2),
                      "no-op build / plan, median of each round's": round(
                          statistics.median(paired), 2),
                      "no-op build --resmoke / plan": round(
                          med["no-op build --resmoke"] / med["plan"], 2)} | ({
                          "no-op build --registry / plan --registry": round(
                              med["no-op build --registry"] / med["plan --registry"], 2)}
                          if args.registry else {}),
           "goals": {"no-op build / plan": "<= 1.2", "plan_s": "<= 0.5", "help_s": "<= 0.2"},
           "plan_imports": import_times(import_rows(["plan", "tiny-cpu", "--no-checks"])),
           "no-op_build_imports": import_times(noop_rows),
           "no-op_build_imports_beyond_plan": imported_beyond(noop_rows, plan_rows)}
    Path(args.out).write_text(json.dumps(doc, indent=2) + "\n")
    print(json.dumps({"median_s": med, "cpu_median_s": med_cpu, "ratios": doc["ratios"]},
                     indent=2))
    print(f"no-op build / plan: {doc['ratios']['no-op build / plan']}x "
          f"({med['no-op build']} s / {med['plan']} s, medians of {args.rounds} rounds; "
          f"goal {doc['goals']['no-op build / plan']})")


if __name__ == "__main__":
    main()
