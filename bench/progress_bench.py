"""What the progress display costs: the Engine's events of a real pull, fed through each
display side by side in one run (none, plain, json, the terminal display drawn to a file).

    .venv/bin/python bench/progress_bench.py [--registry 127.0.0.1:5000] [--mb 200]

An image of its own (the shared base and MB of random bytes, which do not compress) is built,
pushed, removed and pulled back cold through the Engine, recording every event it streams.
Then the recorded events are replayed through each display ROUNDS times, alternating: the cost
per event, and per pulled GB. Results: bench/results/progress.json.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import docker  # noqa: E402
from rich.console import Console  # noqa: E402

from bench.machine import machine  # noqa: E402
from imgbuild.cli.console import JsonProgress, PlainProgress, RichProgress  # noqa: E402
from imgbuild.progress import SILENT  # noqa: E402

ROUNDS = 5


def displays() -> dict:
    return {"none": SILENT,
            "plain": PlainProgress(Console(file=io.StringIO(), width=120)),
            "json": JsonProgress(io.StringIO()),
            "tty": RichProgress(Console(file=io.StringIO(), width=120, force_terminal=True))}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--registry", default="127.0.0.1:5000")
    ap.add_argument("--mb", type=int, default=200)
    args = ap.parse_args()
    client = docker.from_env(timeout=600)
    ref = f"{args.registry}/bench-progress-{uuid.uuid4().hex[:8]}:one"
    with tempfile.TemporaryDirectory() as d:
        base = client.images.list(name="imgbuild-base")[0].tags[0]
        for i in range(4):
            (Path(d) / f"p{i}").write_bytes(os.urandom(args.mb * 250_000))
        (Path(d) / "Dockerfile").write_text(
            f"FROM {base}\n" + "".join(f"COPY p{i} /p{i}\n" for i in range(4)))
        client.images.build(path=d, tag=ref, rm=True)
    repo, _, tag = ref.rpartition(":")
    for _ in client.images.push(repo, tag=tag, stream=True, decode=True):
        pass
    client.images.remove(ref)
    t = time.perf_counter()
    recorded = list(client.api.pull(repo, tag=tag, stream=True, decode=True))
    pull_s = time.perf_counter() - t
    client.images.remove(ref)
    costs: dict[str, list[float]] = {k: [] for k in displays()}
    for _ in range(ROUNDS):
        for name, shown in displays().items():
            t = time.perf_counter()
            with shown.transfer("pull", ref) as moving:
                for ev in recorded:
                    moving.feed(ev)
            costs[name].append(time.perf_counter() - t)
    per_event = {k: statistics.median(v) / len(recorded) * 1e6 for k, v in costs.items()}
    doc = {"machine": machine(), "image_mb": args.mb, "events": len(recorded),
           "pull_s": round(pull_s, 2), "rounds": ROUNDS,
           "replay_s_median": {k: round(statistics.median(v), 4) for k, v in costs.items()},
           "us_per_event": {k: round(v, 1) for k, v in per_event.items()},
           "share_of_the_pull": {k: round(statistics.median(v) / pull_s, 4)
                                 for k, v in costs.items()}}
    (ROOT / "bench" / "results" / "progress.json").write_text(json.dumps(doc, indent=2) + "\n")
    print(json.dumps(doc, indent=2))


if __name__ == "__main__":
    main()
