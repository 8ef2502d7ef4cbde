"""Push and cold pull of a target's image through a registry, with today's layer layout: what
a user waits for, and what each layer weighs compressed (what travels) and unpacked.

    IMGBUILD_WHEELS=/opt/wheels .venv/bin/python bench/pull_bench.py \
        [--target sglang-blackwell-slim] [--registry 127.0.0.1:5000]

The image is built (or found) first; then tagged into a repository of its own, pushed with the
Engine (`docker push`: the Engine gzips each layer), removed from the Engine with everything
that shares its layers except its base, and pulled back (`docker pull`). Results:
bench/results/pull-TARGET.json.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.machine import machine  # noqa: E402
from builder.image.registry import MANIFEST_TYPES, Repository  # noqa: E402

IMGBUILD = str(ROOT / ".venv" / "bin" / "imgbuild")


def docker(*args: str) -> float:
    t = time.perf_counter()
    r = subprocess.run(["docker", *args], capture_output=True, text=True)
    if r.returncode != 0:
        raise SystemExit(f"docker {' '.join(args)} failed:\n{r.stderr[-2000:]}")
    return round(time.perf_counter() - t, 1)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--target", default="sglang-blackwell-slim")
    ap.add_argument("--registry", default="127.0.0.1:5000")
    args = ap.parse_args()
    r = subprocess.run([IMGBUILD, args.target, "--json"], cwd=ROOT, capture_output=True, text=True)
    if r.returncode != 0:
        raise SystemExit((r.stderr + r.stdout)[-3000:])
    built = json.loads(r.stdout)
    repo = Repository.parse(f"{args.registry}/bench-pull-{uuid.uuid4().hex[:8]}")
    ref = f"{repo.name}:{built['content_tag'].rsplit(':', 1)[1]}"
    docker("tag", built["content_tag"], ref)
    push_s = docker("push", ref)
    m = repo.api.request("GET", f"{repo.path}/manifests/{ref.rsplit(':', 1)[1]}",
                         scope=repo.scope("pull"), headers={"Accept": MANIFEST_TYPES}).json()
    compressed = [la["size"] for la in m["layers"]]
    history = json.loads(subprocess.run(["docker", "image", "inspect", ref], capture_output=True,
                                        text=True).stdout)[0]
    # Cold: the image and every tag of it gone from the Engine (the base's layer stays).
    for tag in history.get("RepoTags", []):
        subprocess.run(["docker", "rmi", tag], capture_output=True)
    pull_s = docker("pull", ref)
    doc = {"machine": machine(), "target": args.target, "image_size_bytes": built["size_bytes"],
           "layout": "today's: base, venv, heavy (torch, triton, CUDA wheels), rest, patches, "
                     "payload, smoke model",
           "layers": len(compressed), "layer_compressed_bytes": sorted(compressed, reverse=True),
           "compressed_total_bytes": sum(compressed), "push_s": push_s, "cold_pull_s": pull_s}
    out = ROOT / "bench" / "results" / f"pull-{args.target}.json"
    out.write_text(json.dumps(doc, indent=2) + "\n")
    print(json.dumps({k: doc[k] for k in ("layers", "compressed_total_bytes", "push_s",
                                          "cold_pull_s")}, indent=2))
    subprocess.run(["docker", "rmi", ref], capture_output=True)


if __name__ == "__main__":
    main()
