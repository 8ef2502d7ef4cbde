"""Cold pulls as a Kubernetes node does them, side by side with today's Docker Engine pull.

A kubelet does not run `ctr images pull`: it calls the CRI plugin's ImageService/PullImage,
which pulls with unpack on, so each layer is applied while later ones still download.
containerd 1.6's `ctr images pull` fetches every blob first and unpacks after. This times,
alternating, --rounds times, each into a daemon started empty:

  engine_gzip       today's: the Engine's own push (gzip, one core), pulled by a fresh Engine
  ctr_zstd          imgbuild's zstd push, `ctr images pull` (fetch, then unpack)
  kubelet_zstd      the same image through CRI PullImage (tests/containerd.py kubelet_pull)
  kubelet_gzip      today's image through CRI PullImage (a node given the Engine's push)
  kubelet2_zstd, kubelet2_gzip   the same two by the containerd in --containerd-bin (another
                    release unpacked beside the system's, e.g. Debian trixie's 1.7)
  kubelet2p_zstd    kubelet2_zstd with --unpacks N: that containerd (>= 2.2) applies up to N
                    layers at once (its transfer service's max_concurrent_unpacks)
  kubelet2p_zstd_split  the same, of the zstd push with its largest layer cut at file
                    boundaries into --split-gib parts (bench/layer_split_bench.py)

and, from /proc, the CPU seconds the pulling daemon spent (its children included: the
Engine's unpigz) and the machine's idle time during each pull.

    IMGBUILD_WHEELS=/opt/wheels .venv/bin/python bench/node_pull_bench.py \\
        --image imgbuild:sglang-blackwell-slim-k2.6-… [--rounds 2] \
        [--containerd-bin DIR [--unpacks N [--split-gib G]]] [--ways engine_gzip,…]

Each push goes to a registry of its own on loopback, removed at the end. Results:
bench/results/node-pull-IMAGE.json (IMAGE: the repository and tag, ':' as '-', a content
tag's hash left out).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ["IMGBUILD_BLOB_CACHE_GB"] = "0"  # compressed here, as a first push does

import docker  # noqa: E402

from bench.layer_split_bench import split_image  # noqa: E402
from bench.machine import machine  # noqa: E402
from bench.wire_bench import scratch_registry  # noqa: E402
from imgbuild.image import registry, wire  # noqa: E402
from imgbuild.image.compression import compression  # noqa: E402
from tests import fresh_engine as fe  # noqa: E402
from tests.containerd import Containerd, CtrFailed  # noqa: E402

DOCKER = "/usr/bin/docker"
HZ = os.sysconf("SC_CLK_TCK")
# torch imports and its directory tree is whole: the pulled image is usable, not just present.
CHECK = ["python", "-c", "import torch, os; print(torch.__version__, "
         "sum(len(f) for _, _, f in os.walk(os.path.dirname(torch.__file__))))"]


def tree_cpu(pid: int) -> float:
    """CPU seconds of `pid` and its reaped children (utime, stime, cutime, cstime)."""
    f = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return sum(int(x) for x in f[11:15]) / HZ


def idle() -> float:
    f = Path("/proc/stat").read_text().splitlines()[0].split()
    return (int(f[4]) + int(f[5])) / HZ  # idle + iowait, all cores


def timed(pid: int, fn) -> dict:
    c, i, t = tree_cpu(pid), idle(), time.perf_counter()
    out = fn()
    wall = time.perf_counter() - t
    row = {"wall_s": round(wall, 1), "daemon_cpu_s": round(tree_cpu(pid) - c, 1),
           "machine_idle_s": round(idle() - i, 1)}
    return row | (out or {})


def engine_pull(ref: str) -> dict:
    with fe.fresh_engine() as eng:
        def pull():
            subprocess.run([DOCKER, "-H", eng.host, "pull", "-q", ref], check=True,
                           capture_output=True)
        row = timed(eng.pid, pull)
        r = subprocess.run([DOCKER, "-H", eng.host, "run", "--rm", "--entrypoint", CHECK[0],
                            ref, *CHECK[1:]], capture_output=True, text=True)
        return row | {"check": r.stdout.strip() or r.stderr.strip()[-200:]}


def containerd_pull(ref: str, work: Path, kubelet: bool, bin_dir: Path | None = None,
                    unpacks: int = 1) -> dict:
    with Containerd(Path(tempfile.mkdtemp(dir=work)), cri=kubelet, bin_dir=bin_dir,
                    unpacks=unpacks) as c:
        got: dict = {}

        def pull():
            got["digest"] = c.kubelet_pull(ref) if kubelet else c.pull(ref, timeout=3600)
        row = timed(c.pid, pull)
        if unpacks > 1:  # what containerd did, from its debug log, not what was asked
            row["parallel_unpack"] = c.unpack_modes()[-1:] == ["parallel=true"]
        try:
            r = c.run(ref, CHECK, timeout=600)
            check = r.stdout.strip() or r.stderr.strip()[-200:]
        except CtrFailed as e:
            check = str(e)[-200:]
        return row | got | {"check": check}


def version(binary: str) -> str:
    return subprocess.run([binary, "--version"], capture_output=True, text=True).stdout.strip()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--image", required=True, help="a local image (its tag or id)")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--workdir", default="/var/lib/imgbuild/bench")
    ap.add_argument("--containerd-bin", type=Path,
                    help="a directory with another release's containerd, ctr and shims")
    ap.add_argument("--unpacks", type=int, default=0,
                    help="with --containerd-bin (>= 2.2): the kubelet2p ways, N layers at once")
    ap.add_argument("--split-gib", type=float, default=0,
                    help="with --unpacks: kubelet2p_zstd_split, the largest layer cut in parts")
    ap.add_argument("--ways", help="comma-separated, of the ways above (default: all there are)")
    args = ap.parse_args()
    work = Path(args.workdir)
    work.mkdir(parents=True, exist_ok=True)
    client = docker.from_env(timeout=3600)
    img = client.images.get(args.image)
    out: dict = {"machine": machine(), "image": args.image, "image_id": img.id,
                 "unpacked_bytes": int(img.attrs["Size"]),
                 "engine": client.version()["Version"],
                 "containerd": version("containerd")}
    if args.containerd_bin:
        out["containerd2"] = version(str(args.containerd_bin / "containerd"))
        out["unpacks"] = args.unpacks or 1
    with tempfile.TemporaryDirectory(prefix="node-pull-", dir=work) as td, \
            scratch_registry(Path(td) / "r-gzip") as r_gz, \
            scratch_registry(Path(td) / "r-zstd") as r_z:
        gz, z = f"{r_gz}/bench:pull", f"{r_z}/bench:pull"
        img.tag(f"{r_gz}/bench", "pull")
        t = time.perf_counter()
        subprocess.run([DOCKER, "push", gz], check=True, capture_output=True)
        out["engine_push_s"] = round(time.perf_counter() - t, 1)
        img.tag(f"{r_z}/bench", "pull")
        t = time.perf_counter()
        pushed = wire.push(client, z, registry.Repository.parse(f"{r_z}/bench"),
                           comp=compression("zstd"))
        out["imgbuild_zstd_push"] = {"seconds": round(time.perf_counter() - t, 1),
                                     "sent_bytes": pushed.sent_bytes, "digest": pushed.digest}
        client.images.remove(gz)
        client.images.remove(z)
        ways = {"engine_gzip": lambda: engine_pull(gz),
                "ctr_zstd": lambda: containerd_pull(z, work, kubelet=False),
                "kubelet_zstd": lambda: containerd_pull(z, work, kubelet=True),
                "kubelet_gzip": lambda: containerd_pull(gz, work, kubelet=True)}
        if args.containerd_bin:
            b = args.containerd_bin
            ways["kubelet2_zstd"] = lambda: containerd_pull(z, work, kubelet=True, bin_dir=b)
            ways["kubelet2_gzip"] = lambda: containerd_pull(gz, work, kubelet=True, bin_dir=b)
            if args.unpacks > 1:
                u = args.unpacks
                ways["kubelet2p_zstd"] = lambda: containerd_pull(z, work, kubelet=True,
                                                                 bin_dir=b, unpacks=u)
                if args.split_gib:
                    zs, made = split_image("bench", "zstd", int(args.split_gib * (1 << 30)),
                                           reg=r_z, tag="pull")
                    out["split_layers"] = made
                    ways["kubelet2p_zstd_split"] = lambda: containerd_pull(
                        zs, work, kubelet=True, bin_dir=b, unpacks=u)
        if args.ways:
            ways = {w: ways[w] for w in args.ways.split(",")}  # a KeyError names a bad one
        rows = []
        for n in range(args.rounds):
            for way, pull in ways.items():
                subprocess.run(["sync"])
                row = {"round": n + 1, "way": way} | pull()
                print(json.dumps(row), flush=True)
                rows.append(row)
    out["pulls"] = rows
    mean = {w: round(sum(r["wall_s"] for r in rows if r["way"] == w) / args.rounds, 1)
            for w in ways}
    out["mean_wall_s"] = mean
    if "engine_gzip" in mean:
        out["over_engine_gzip"] = {w: round(mean[w] / mean["engine_gzip"], 3) for w in ways}
    out["digests_match"] = all(r["digest"] == pushed.digest for r in rows
                               if r["way"].endswith("zstd"))
    out["same_check"] = len({r["check"] for r in rows}) == 1
    # The repository and tag, without a content tag's hash: one file per target, rewritten.
    name = re.sub(r"-[0-9a-f]{16}$", "", args.image.split("/")[-1]).replace(":", "-")
    path = ROOT / "bench" / "results" / f"node-pull-{name}.json"
    path.write_text(json.dumps(out, indent=2) + "\n")
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
