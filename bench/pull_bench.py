"""Push and cold pull of a target's image through a registry, with today's layer layout: what
a user waits for, and what each layer weighs compressed (what travels) and unpacked.

    IMGBUILD_WHEELS=/opt/wheels .venv/bin/python bench/pull_bench.py \
        [--target sglang-blackwell-slim] [--registry 127.0.0.1:5000]

The image is built (or found) first; then tagged into a repository of its own, pushed with the
Engine (`docker push`: the Engine gzips each layer; a layer the registry holds already is
mounted, not sent, and the count of layers sent says so), removed from the Engine with
BuildKit's cache (which holds its layers too), and pulled back (`docker pull`). Results:
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


def docker(*args: str) -> tuple[float, str]:
    t = time.perf_counter()
    r = subprocess.run(["docker", *args], capture_output=True, text=True)
    if r.returncode != 0:
        raise SystemExit(f"docker {' '.join(args)} failed:\n{r.stderr[-2000:]}")
    return round(time.perf_counter() - t, 1), r.stdout


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
    push_s, said = docker("push", ref)
    # Layers the registry had already (another repository's blob, mounted) are not traffic.
    pushed_layers = sum(1 for ln in said.splitlines() if ln.endswith(": Pushed"))
    m = repo.api.request("GET", f"{repo.path}/manifests/{ref.rsplit(':', 1)[1]}",
                         scope=repo.scope("pull"), headers={"Accept": MANIFEST_TYPES}).json()
    compressed = [la["size"] for la in m["layers"]]
    history = json.loads(subprocess.run(["docker", "image", "inspect", ref], capture_output=True,
                                        text=True).stdout)[0]
    # Cold: every tag of the image gone, and BuildKit's cache with it (it holds the layers too);
    # the base's layer stays.
    for tag in history.get("RepoTags", []):
        subprocess.run(["docker", "rmi", tag], capture_output=True)
    subprocess.run(["docker", "builder", "prune", "-af"], capture_output=True)
    pull_s, said = docker("pull", ref)
    pulled_layers = sum(1 for ln in said.splitlines() if ln.endswith(": Pull complete"))
    doc = {"machine": machine(), "target": args.target, "image_size_bytes": built["size_bytes"],
           "layout": "today's: base, venv, heavy (torch, triton, CUDA wheels), rest, patches, "
                     "payload, smoke model",
           "layers": len(compressed), "layer_compressed_bytes": sorted(compressed, reverse=True),
           "compressed_total_bytes": sum(compressed), "push_s": push_s,
           "push_layers_sent": pushed_layers, "cold_pull_s": pull_s,
           "pull_layers_fetched": pulled_layers}
    out = ROOT / "bench" / "results" / f"pull-{args.target}.json"
    out.write_text(json.dumps(doc, indent=2) + "\n")
    print(json.dumps({k: doc[k] for k in ("layers", "compressed_total_bytes", "push_s",
                                          "push_layers_sent", "cold_pull_s",
                                          "pull_layers_fetched")}, indent=2))
    subprocess.run(["docker", "rmi", ref], capture_output=True)


if __name__ == "__main__":
    main()
