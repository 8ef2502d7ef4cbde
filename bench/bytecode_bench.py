"""What the suite's processes cost with and without Python's bytecode caches, side by side in
one run: where PYTHONDONTWRITEBYTECODE is set and no .pyc was written at install (uv does not
compile unless asked), every process compiles every module it imports, every time.

Cases, each the CPU-seconds of the process and its children (median of --rounds):

- `import torch, transformers, compressed_tensors` (what the smoke payload and the checkpoint
  tools import on the host);
- `imgbuild plan tiny-cpu` (a command's start-up and its plan);
- pytest collecting tests/test_decisions_init.py (a worker rewrites each test file's asserts).

"compiled" first removes every cache under the dev venv, imgbuild/ and tests/ and runs with
PYTHONDONTWRITEBYTECODE=1, which is what each such process paid; "cached" runs once to write
the caches, then measures. The dev venv's caches are left written afterwards.

    .venv/bin/python bench/bytecode_bench.py [--rounds 3]

Results: bench/results/bytecode.json.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.machine import machine  # noqa: E402

PYTHON = str(ROOT / ".venv" / "bin" / "python")
CASES = {
    "import torch, transformers, compressed_tensors":
        [PYTHON, "-c", "import torch, transformers, compressed_tensors"],
    "imgbuild plan tiny-cpu": [PYTHON, "-m", "imgbuild.cli", "plan", "tiny-cpu"],
    "pytest collects tests/test_decisions_init.py":
        [PYTHON, "-m", "pytest", "--collect-only", "-q", "-p", "no:xdist", "-p", "no:cacheprovider",
         "tests/test_decisions_init.py"],
}


def cpu_of(argv: list[str], env: dict[str, str]) -> float:
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    subprocess.run(argv, cwd=ROOT, env=env, check=True, capture_output=True)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def drop_caches() -> None:
    for top in (ROOT / ".venv" / "lib", ROOT / "imgbuild", ROOT / "tests"):
        for d in top.rglob("__pycache__"):
            shutil.rmtree(d, ignore_errors=True)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args(argv)
    base = dict(os.environ, OMP_NUM_THREADS="1", HF_HUB_OFFLINE="1")
    compiled_env = dict(base, PYTHONDONTWRITEBYTECODE="1")
    cached_env = dict(base, PYTHONDONTWRITEBYTECODE="")
    rows = {}
    drop_caches()
    for name, cmd in CASES.items():
        compiled = [cpu_of(cmd, compiled_env) for _ in range(args.rounds)]
        rows[name] = {"compiled_cpu_s": round(statistics.median(compiled), 2)}
    for name, cmd in CASES.items():
        first = cpu_of(cmd, cached_env)  # writes the caches
        cached = [cpu_of(cmd, cached_env) for _ in range(args.rounds)]
        rows[name] |= {"first_run_cpu_s": round(first, 2),
                       "cached_cpu_s": round(statistics.median(cached), 2)}
        rows[name]["ratio_cached_to_compiled"] = round(
            rows[name]["cached_cpu_s"] / rows[name]["compiled_cpu_s"], 2)
    doc = {"machine": machine(), "rounds": args.rounds, "cases": rows}
    out = ROOT / "bench" / "results" / "bytecode.json"
    out.write_text(json.dumps(doc, indent=2) + "\n")
    for name, r in rows.items():
        print(f"{name:50s} compiled {r['compiled_cpu_s']:6.2f} CPU-s  cached "
              f"{r['cached_cpu_s']:6.2f}  ({r['ratio_cached_to_compiled']:.2f}x)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
