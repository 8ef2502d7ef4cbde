"""Image size by flavor, measured on images built here.

slim: a plain OS base; the CUDA libraries come from the torch wheels alone.
devel: nvidia/cuda's cudnn-devel base under the same layers. That base cannot be pulled on
these machines (no Docker Hub), so its figure is the slim image's layers above the OS base
plus the devel base's size, given with `--devel-base-gb` from a machine that can pull it, and
labelled as such.

    .venv/bin/python bench/flavor_sizes.py IMAGE [--devel-base-gb N]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.machine import machine  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("image")
    ap.add_argument("--devel-base-gb", type=float)
    ap.add_argument("--out", default=str(ROOT / "bench" / "results" / "flavors.json"))
    args = ap.parse_args()
    import docker

    c = docker.from_env()
    img = c.images.get(args.image)
    labels = img.labels
    hist = img.history()
    layers = [{"bytes": h["Size"], "step": h["CreatedBy"][:100]} for h in hist]
    base_bytes = hist[-1]["Size"]
    du = subprocess.run(
        ["/usr/bin/docker", "run", "--rm", "--network", "none", args.image, "sh", "-c",
         "cd /opt/venv/lib/python3.*/site-packages && for d in nvidia torch triton; do "
         "[ -d $d ] && echo $d $(du -s --apparent-size --block-size=1 $d | cut -f1); done; "
         "echo venv $(du -s --apparent-size --block-size=1 /opt/venv | cut -f1)"],
        capture_output=True, text=True, check=True).stdout
    parts = {k: int(v) for k, v in (ln.split() for ln in du.splitlines())}
    slim = img.attrs["Size"]
    above_base = slim - base_bytes
    doc = {
        "image": args.image, "target": labels.get("io.imgbuild.target"),
        "flavor": labels.get("io.imgbuild.flavor"), "cuda": labels.get("io.imgbuild.cuda"),
        "machine": machine(),
        "slim": {"image_bytes": slim, "os_base_bytes": base_bytes, "layers_above_base": above_base,
                 "measured": True},
        "contents": {f"{k}_bytes": v for k, v in parts.items()},
        "cuda_libraries_from_wheels_bytes": parts.get("nvidia", 0),
        "layers": layers,
        "devel": ({"image_bytes": int(above_base + args.devel_base_gb * 1e9),
                   "devel_base_bytes": int(args.devel_base_gb * 1e9), "measured": False,
                   "how": "the devel base's size (given) plus the same layers as slim"}
                  if args.devel_base_gb else
                  {"measured": False,
                   "how": "not measured: nvidia/cuda cannot be pulled here; devel = that base "
                          "+ layers_above_base, and ships the CUDA libraries twice (the base's "
                          "toolkit and the wheels' nvidia/*)"}),
    }
    Path(args.out).write_text(json.dumps(doc, indent=2) + "\n")
    gb = lambda b: f"{b / 1e9:.2f} GB"  # noqa: E731
    print(f"slim {doc['target']}: {gb(slim)} (OS base {gb(base_bytes)}, ours {gb(above_base)}); "
          f"CUDA libraries from wheels {gb(parts.get('nvidia', 0))}, torch {gb(parts.get('torch', 0))}")
    print("devel: " + (gb(doc["devel"]["image_bytes"]) + " (estimated)" if args.devel_base_gb
                       else doc["devel"]["how"]))


if __name__ == "__main__":
    main()
