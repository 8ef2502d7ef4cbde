"""How long `make test` takes and where the time goes: runs the suite as `make test` does (or
reads a JUnit XML that such a run wrote, --junit) and records in results/test-suite.json, under
a label, the wall time, the counts, the slowest tests and the seconds per file, with the
machine; and the CPU-seconds the tests cost and the costliest of them (tests/cpu_record.py:
each test's process and its subprocesses, not the Docker Engine's or the registry's).

    .venv/bin/python bench/suite_bench.py --label after              # runs make test's pytest
    .venv/bin/python bench/suite_bench.py --label before --junit run.xml --wall 2610
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from bench.machine import machine  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "bench" / "results" / "test-suite.json"


def summarize(junit: Path, top: int = 20) -> dict:
    """Counts, the slowest test cases (setup, call and teardown together, as JUnit records
    them) and the seconds per test file."""
    root = ET.parse(junit).getroot()
    cases = []
    cpu: list[tuple[float, str]] = []
    counts = {"passed": 0, "failed": 0, "error": 0, "skipped": 0}
    for tc in root.iter("testcase"):
        outcome = next((c.tag for c in tc if c.tag in ("failure", "error", "skipped")), "passed")
        counts[{"failure": "failed"}.get(outcome, outcome)] += 1
        name = f"{tc.get('classname')}::{tc.get('name')}"
        cases.append((float(tc.get("time", 0)), name))
        # tests/cpu_record.py: the test's process and its waited-for children, in CPU-seconds
        cpu += [(float(p.get("value")), name) for p in tc.iter("property")
                if p.get("name") == "cpu_s"]
    per_file: dict[str, float] = {}
    for t, name in cases:
        f = name.split("::")[0].replace(".", "/") + ".py"
        per_file[f] = per_file.get(f, 0.0) + t
    cases.sort(reverse=True)
    cpu.sort(reverse=True)
    return {"counts": counts, "tests": len(cases),
            "test_seconds": round(sum(t for t, _ in cases), 1),
            **({"test_cpu_seconds": round(sum(t for t, _ in cpu), 1),
                "costliest": [{"cpu_seconds": round(t, 2), "test": n} for t, n in cpu[:top]]}
               if cpu else {}),
            "slowest": [{"seconds": round(t, 2), "test": n} for t, n in cases[:top]],
            "per_file": {f: round(t, 1) for f, t in
                         sorted(per_file.items(), key=lambda kv: -kv[1])}}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--label", required=True, help="the name of this run in the results")
    ap.add_argument("--junit", type=Path, help="read this run's JUnit XML instead of running")
    ap.add_argument("--wall", type=float, help="with --junit: the run's wall seconds")
    ap.add_argument("--workers", default=os.environ.get("WORKERS", "2"))
    ap.add_argument("--note", default="", help="what else ran on the machine, and so on")
    args = ap.parse_args()
    wall = args.wall
    junit = args.junit
    if junit is None:
        junit = Path(tempfile.mkdtemp(prefix="suite-")) / "junit.xml"
        xdist = ["-p", "no:xdist"] if args.workers == "0" else \
            ["-n", args.workers, "--dist", "loadgroup"]
        start = time.monotonic()
        subprocess.run([sys.executable, "-m", "pytest", "-q", "-m", "not slow", *xdist,
                        f"--junitxml={junit}"], cwd=ROOT)
        wall = round(time.monotonic() - start, 1)
    doc = json.loads(RESULTS.read_text()) if RESULTS.exists() else {}
    doc[args.label] = {"machine": machine(), "wall_seconds": wall, "workers": args.workers,
                       "note": args.note, **summarize(junit)}
    RESULTS.write_text(json.dumps(doc, indent=2) + "\n")
    s = doc[args.label]
    print(f"{args.label}: {wall} s wall, {s['tests']} tests {s['counts']}, "
          f"{s['test_seconds']} s in tests")
    for row in s["slowest"]:
        print(f"  {row['seconds']:8.2f}  {row['test']}")


if __name__ == "__main__":
    main()
