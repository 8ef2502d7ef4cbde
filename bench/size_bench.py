"""Image size with and without the dead-weight rules (images/prune.yaml), side by side in one
run, and where the bytes are (`imgbuild size`).

    IMGBUILD_WHEELS=/opt/wheels .venv/bin/python bench/size_bench.py [--target sglang-blackwell-slim]

Builds the target twice: from a copy of images/ whose prune.yaml has no rules (today's image
before the rules), then as images/ says (smoke-tested: nothing the engine needs at run time may
go). SGLang's own runtime image is the yardstick the fast-paths issue names (20 GB).
Results: bench/results/size-TARGET.json.
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
SGLANG_RUNTIME_BYTES = 20e9  # lmsysorg/sglang's runtime image, as the issue measured it


def imgbuild(*args: str) -> dict:
    r = subprocess.run([IMGBUILD, *args, "--json"], cwd=ROOT, capture_output=True, text=True)
    if r.returncode != 0:
        said = (r.stderr + r.stdout)[-3000:]  # with --json the error is on stdout
        raise SystemExit(f"imgbuild {' '.join(args)} failed:\n{said}")
    return json.loads(r.stdout)


def measure(target: str, images: Path, smoke: bool) -> dict:
    t = time.perf_counter()
    built = imgbuild(target, "--images", str(images), "--lockfiles", str(ROOT / "lockfiles"),
                     *(() if smoke else ("--no-smoke",)))
    took = time.perf_counter() - t
    size = imgbuild("size", built["content_tag"])
    out = {"content_tag": built["content_tag"], "size_bytes": built["size_bytes"],
           "wall_s": round(took, 1), "files": size["files"], "by_kind": size["by_kind"],
           "dead_weight": size["dead_weight"],
           "largest_packages": dict(list(size["by_owner"].items())[:12]),
           "duplicates": [{k: d[k] for k in ("size", "owners", "paths")}
                          for d in size["duplicates"][:10]]}
    if smoke:
        out["smoke"] = {s["name"]: s["status"] for s in built["smoke"]["stages"]}
        out["smoke_ok"] = built["smoke"]["ok"]
    return out


# What the bytecode (the largest removable kind) buys: SGLang's server modules imported with
# the .pyc files the image carries, and with them out of reach (compiled from source on import).
IMPORT = ("import time; t = time.perf_counter(); import sglang.srt.server_args, "
          "sglang.srt.model_executor.model_runner; print(round(time.perf_counter() - t, 2))")


def import_seconds(image: str, rounds: int = 3) -> dict:
    out: dict[str, list[float]] = {"with bytecode": [], "without bytecode": []}
    for _ in range(rounds):
        for name, env in (("with bytecode", []),
                          ("without bytecode", ["-e", "PYTHONPYCACHEPREFIX=/nonexistent"])):
            r = subprocess.run(["docker", "run", "--rm", "--network", "none", *env,
                                "--entrypoint", "python", image, "-c", IMPORT],
                               capture_output=True, text=True)
            if r.returncode != 0:
                return {"error": r.stderr.strip().splitlines()[-1:]}
            out[name].append(float(r.stdout.strip().splitlines()[-1]))
    return {k: sorted(v)[len(v) // 2] for k, v in out.items()} | {"runs": out}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--target", default="sglang-blackwell-slim")
    ap.add_argument("--keep", action="store_true", help="keep both images (about 2x its size)")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as td:
        bare = Path(td) / "images"
        shutil.copytree(ROOT / "images", bare)
        (bare / "prune.yaml").write_text("rules: []\n")
        before = measure(args.target, bare, smoke=False)
        if not args.keep:
            subprocess.run(["docker", "rmi", before["content_tag"]], capture_output=True)
    after = measure(args.target, ROOT / "images", smoke=True)
    if "sglang" in after["largest_packages"] or args.target.startswith("sglang"):
        after["sglang_import_s"] = import_seconds(after["content_tag"])
    doc = {"machine": machine(), "target": args.target, "before_rules": before,
           "with_rules": after,
           "saved_bytes": before["size_bytes"] - after["size_bytes"],
           "ratio_with_rules_over_before": round(after["size_bytes"] / before["size_bytes"], 4),
           "ratio_to_sglang_runtime_image": {
               "before_rules": round(before["size_bytes"] / SGLANG_RUNTIME_BYTES, 3),
               "with_rules": round(after["size_bytes"] / SGLANG_RUNTIME_BYTES, 3)}}
    out = ROOT / "bench" / "results" / f"size-{args.target}.json"
    out.write_text(json.dumps(doc, indent=2) + "\n")
    print(json.dumps({k: doc[k] for k in ("saved_bytes", "ratio_with_rules_over_before",
                                          "ratio_to_sglang_runtime_image")}, indent=2))
    print(f"before {before['size_bytes'] / 1e9:.2f} GB, with rules {after['size_bytes'] / 1e9:.2f}"
          f" GB; smoke {'passed' if after.get('smoke_ok') else 'FAILED'}; wrote {out}")


if __name__ == "__main__":
    main()
