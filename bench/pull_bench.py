"""Push and cold pull of a target's image through a registry, in two layer layouts side by
side: today's (one heavy layer: torch, Triton and the CUDA wheels) and split (the heavy layer
as two, CUDA wheels then torch and Triton: the target's `split_heavy_layer: true`). What a user
waits for, and what each layer weighs compressed (what travels).

    IMGBUILD_WHEELS=/opt/wheels .venv/bin/python bench/pull_bench.py \
        [--target sglang-blackwell-slim] [--registry 127.0.0.1:5000] [--rounds 2]

Each layout's image is built (or found) first; the split one from a copy of images/ whose
target says `split_heavy_layer: true`, against the same lockfiles. Each is tagged into a
repository of its own and pushed with the Engine (`docker push`: the Engine gzips each layer).
Then, round by round and alternating, each is removed from the Engine with BuildKit's cache
(which holds its layers too) and pulled back (`docker pull`). The base's layer stays.
Results: bench/results/pull-TARGET.json.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.machine import machine  # noqa: E402
from imgbuild.image.registry import MANIFEST_TYPES, Repository  # noqa: E402

IMGBUILD = str(ROOT / ".venv" / "bin" / "imgbuild")
LAYOUTS = {
    "today": "base, venv, heavy (torch, Triton, CUDA wheels), rest, patches, payload, smoke model",
    "split": "base, venv, heavy-cuda (CUDA wheels), heavy-torch (torch, Triton), rest, patches, "
             "payload, smoke model",
}


def docker(*args: str) -> tuple[float, str]:
    t = time.perf_counter()
    r = subprocess.run(["docker", *args], capture_output=True, text=True)
    if r.returncode != 0:
        raise SystemExit(f"docker {' '.join(args)} failed:\n{r.stderr[-2000:]}")
    return round(time.perf_counter() - t, 1), r.stdout


def build(target: str, layout: str, scratch: Path) -> dict:
    env = dict(os.environ, IMGBUILD_LOCKFILES=str(ROOT / "lockfiles"))
    if layout == "split":
        images = scratch / "images"
        shutil.copytree(ROOT / "images", images)
        with open(images / f"{target}.yaml", "a") as f:
            f.write("\nsplit_heavy_layer: true\n")
        env["IMGBUILD_IMAGES"] = str(images)
    t = time.perf_counter()
    r = subprocess.run([IMGBUILD, target, "--json"], cwd=ROOT, capture_output=True, text=True,
                       env=env)
    if r.returncode != 0:
        raise SystemExit((r.stderr + r.stdout)[-3000:])
    return json.loads(r.stdout) | {"build_s": round(time.perf_counter() - t, 1)}


def cold_pull(ref: str) -> tuple[float, int]:
    """Every tag of the image gone, BuildKit's cache with it; then `docker pull`."""
    inspect = subprocess.run(["docker", "image", "inspect", ref], capture_output=True, text=True)
    if inspect.returncode == 0:
        for tag in json.loads(inspect.stdout)[0].get("RepoTags", []):
            subprocess.run(["docker", "rmi", tag], capture_output=True)
    subprocess.run(["docker", "builder", "prune", "-af"], capture_output=True)
    pull_s, said = docker("pull", ref)
    return pull_s, sum(1 for ln in said.splitlines() if ln.endswith(": Pull complete"))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--target", default="sglang-blackwell-slim")
    ap.add_argument("--registry", default="127.0.0.1:5000")
    ap.add_argument("--rounds", type=int, default=2)
    args = ap.parse_args()
    results: dict[str, dict] = {}
    refs: dict[str, str] = {}
    with tempfile.TemporaryDirectory(prefix="pull-bench-") as scratch:
        for layout in LAYOUTS:
            built = build(args.target, layout, Path(scratch))
            repo = Repository.parse(f"{args.registry}/bench-pull-{uuid.uuid4().hex[:8]}")
            ref = f"{repo.name}:{built['content_tag'].rsplit(':', 1)[1]}"
            docker("tag", built["content_tag"], ref)
            push_s, said = docker("push", ref)
            m = repo.api.request("GET", f"{repo.path}/manifests/{ref.rsplit(':', 1)[1]}",
                                 scope=repo.scope("pull"),
                                 headers={"Accept": MANIFEST_TYPES}).json()
            compressed = [la["size"] for la in m["layers"]]
            results[layout] = {
                "layout": LAYOUTS[layout], "content_tag": built["content_tag"],
                "image_size_bytes": built["size_bytes"], "build_s": built["build_s"],
                "layers": len(compressed),
                "layer_compressed_bytes": sorted(compressed, reverse=True),
                "compressed_total_bytes": sum(compressed), "push_s": push_s,
                # A layer the registry holds already (another repository's) is mounted, not sent.
                "push_layers_sent": sum(1 for ln in said.splitlines() if ln.endswith(": Pushed")),
                "cold_pull_s": []}
            refs[layout] = ref
            subprocess.run(["docker", "rmi", built["content_tag"]], capture_output=True)
    for _ in range(args.rounds):  # alternating, so that drift on the machine hits both alike
        for layout, ref in refs.items():
            pull_s, fetched = cold_pull(ref)
            results[layout]["cold_pull_s"].append(pull_s)
            results[layout]["pull_layers_fetched"] = fetched
    for r in results.values():
        r["cold_pull_median_s"] = statistics.median(r["cold_pull_s"])
    ratio = round(results["split"]["cold_pull_median_s"] / results["today"]["cold_pull_median_s"],
                  3)
    doc = {"machine": machine(), "target": args.target, "rounds": args.rounds,
           "engine_max_concurrent_downloads": 3, "layouts": results,
           "split_over_today_cold_pull": ratio,
           "kept": "split" if ratio < 1 else "today"}
    out = ROOT / "bench" / "results" / f"pull-{args.target}.json"
    out.write_text(json.dumps(doc, indent=2) + "\n")
    print(json.dumps({k: {f: v[f] for f in ("layers", "compressed_total_bytes", "push_s",
                                            "cold_pull_s")} for k, v in results.items()}
                     | {"split_over_today_cold_pull": ratio}, indent=2))
    for ref in refs.values():
        subprocess.run(["docker", "rmi", ref], capture_output=True)


if __name__ == "__main__":
    main()
