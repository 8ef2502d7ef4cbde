"""Push and cold pull of a target's image, side by side in one run: the Engine's own push and
pull (gzip on one core: today's), imgbuild's push in gzip and in zstd (every core), and cold
pulls by the Docker Engine (with and without unpigz on its PATH) and by containerd's `ctr images
pull` (which fetches every blob before unpacking: bench/node_pull_bench.py pulls as a kubelet
does, through containerd's CRI).

    IMGBUILD_WHEELS=/opt/wheels .venv/bin/python bench/wire_bench.py \
        [--target sglang-blackwell-slim] [--model k2.6]

The image is built (or found) first. Each way of pushing goes to a registry of its own
(docker-registry on loopback, its storage in a scratch directory, removed when its pulls are
done: these machines have little disk). A cold pull: every tag of the image gone from the
Engine with BuildKit's cache (which holds its layers too), then `docker pull`; containerd
pulls into a daemon started for the pull, on a socket and root of its own (tests/containerd.py)
and removed after. The base image's layers stay in the Engine, as on a node that ran images of
this base before. Results: bench/results/wire-TARGET.json.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from contextlib import contextmanager
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import docker  # noqa: E402

from bench.machine import machine  # noqa: E402
from imgbuild.image import registry, wire  # noqa: E402
from imgbuild.image.compression import compression  # noqa: E402
from tests.containerd import containerd_daemon  # noqa: E402

IMGBUILD = str(ROOT / ".venv" / "bin" / "imgbuild")
DOCKER = "/usr/bin/docker"  # the Engine's own client (20.10 here)


def sh(*args: str, check: bool = True) -> tuple[float, str]:
    t = time.perf_counter()
    r = subprocess.run(list(args), capture_output=True, text=True)
    if check and r.returncode != 0:
        raise SystemExit(f"{' '.join(args)} failed:\n{(r.stderr + r.stdout)[-2000:]}")
    return round(time.perf_counter() - t, 1), r.stdout


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextmanager
def scratch_registry(root: Path):
    """docker-registry (CNCF distribution) on loopback, storing under `root`; gone after."""
    port = free_port()
    root.mkdir(parents=True)
    (root / "config.yml").write_text(
        "version: 0.1\nlog: {level: error}\n"
        f"storage: {{filesystem: {{rootdirectory: {root / 'data'}}}, delete: {{enabled: true}}}}\n"
        f"http: {{addr: 127.0.0.1:{port}}}\n")
    proc = subprocess.Popen(["docker-registry", "serve", str(root / "config.yml")],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        for _ in range(100):
            try:
                socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
                break
            except OSError:
                time.sleep(0.1)
        yield f"127.0.0.1:{port}"
    finally:
        proc.terminate()
        proc.wait(timeout=30)
        shutil.rmtree(root, ignore_errors=True)


def dir_bytes(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def drop_image(image_id: str) -> None:
    """Every tag of the image gone, and BuildKit's cache (it holds the layers too)."""
    r = subprocess.run([DOCKER, "image", "inspect", image_id], capture_output=True, text=True)
    if r.returncode == 0:
        for tag in json.loads(r.stdout)[0].get("RepoTags", []):
            subprocess.run([DOCKER, "rmi", tag], capture_output=True)
        subprocess.run([DOCKER, "rmi", image_id], capture_output=True)
    subprocess.run([DOCKER, "builder", "prune", "-af"], capture_output=True)


def engine_pull(ref: str, image_id: str, unpigz: bool) -> float:
    """A cold pull by the Engine; unpigz: with /usr/bin/unpigz on its PATH or not (the Engine
    looks it up at each pull)."""
    hidden = Path("/usr/bin/unpigz.bench-hidden")
    real = Path("/usr/bin/unpigz")
    drop_image(image_id)
    if not unpigz and real.exists():
        real.rename(hidden)
    try:
        secs, _ = sh(DOCKER, "pull", ref)
    finally:
        if hidden.exists():
            hidden.rename(real)
    return secs


def containerd_pull(ref: str, scratch: Path) -> tuple[float, str]:
    with containerd_daemon(scratch) as ctrd:
        t = time.perf_counter()
        digest = ctrd.pull(ref)
        return round(time.perf_counter() - t, 1), digest


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--target", default="sglang-blackwell-slim")
    ap.add_argument("--model", default="k2.6")
    args = ap.parse_args()
    # Every push compresses what it sends, as a fresh runner's first push does: this
    # machine's blob cache (image/blobcache.py) would send a later round's bytes from disk.
    os.environ["IMGBUILD_BLOB_CACHE_GB"] = "0"
    client = docker.from_env(timeout=3600)
    t = time.perf_counter()
    r = subprocess.run([IMGBUILD, "build", args.target, "--model", args.model, "--no-smoke",
                        "--json"], cwd=ROOT, capture_output=True, text=True)
    if r.returncode != 0:
        raise SystemExit((r.stderr + r.stdout)[-3000:])
    built = json.loads(r.stdout)
    build_s = round(time.perf_counter() - t, 1)
    subprocess.run([DOCKER, "builder", "prune", "-af"], capture_output=True)  # disk: uv's cache
    image_id, tag = built["image_id"], built["content_tag"].rsplit(":", 1)[1]
    have_unpigz = shutil.which("unpigz") is not None
    res: dict = {"image_size_bytes": built["size_bytes"], "build_s": build_s,
                 "content_tag": built["content_tag"], "unpigz_on_host": have_unpigz}
    with tempfile.TemporaryDirectory(prefix="wire-bench-", dir="/var/tmp") as td:
        scratch = Path(td)
        # One registry at a time where it can be: these machines have little disk.
        with scratch_registry(scratch / "r-engine") as r_eng:
            # 1. today's push: the Engine, gzip on one core, into an empty registry
            ref_eng = f"{r_eng}/bench:{tag}"
            client.images.get(image_id).tag(f"{r_eng}/bench", tag)
            push_s, _ = sh(DOCKER, "push", ref_eng)
            res["engine_push"] = {"seconds": push_s,
                                  "stored_bytes": dir_bytes(scratch / "r-engine" / "data")}
            res["engine_pull_engine_gzip_s"] = engine_pull(ref_eng, image_id, unpigz=False)
            if have_unpigz:
                res["engine_pull_engine_gzip_unpigz_s"] = engine_pull(ref_eng, image_id,
                                                                      unpigz=True)
        with scratch_registry(scratch / "r-gzip") as r_gz:
            # 2. imgbuild's push, gzip on every core (the image is here from the last pull)
            ref_gz = f"{r_gz}/bench:{tag}"
            client.images.get(image_id).tag(f"{r_gz}/bench", tag)
            t = time.perf_counter()
            p = wire.push(client, ref_gz, registry.Repository.parse(f"{r_gz}/bench"),
                          comp=compression("gzip"))
            res["imgbuild_push_gzip"] = {"seconds": round(time.perf_counter() - t, 1),
                                         "sent_bytes": p.sent_bytes, "digest": p.digest}
            res["engine_pull_imgbuild_gzip_s"] = engine_pull(ref_gz, image_id, unpigz=False)
            drop_image(image_id)
            res["containerd_pull_imgbuild_gzip_s"], _ = containerd_pull(ref_gz, scratch / "c1")
            shutil.rmtree(scratch / "c1", ignore_errors=True)
            # the image back in the Engine for the zstd push (a pull with unpigz, if here)
            key = "engine_pull_imgbuild_gzip_unpigz_s" if have_unpigz else \
                "engine_pull_imgbuild_gzip_again_s"
            res[key] = engine_pull(ref_gz, image_id, unpigz=have_unpigz)
        with scratch_registry(scratch / "r-zstd") as r_z:
            # 3. imgbuild's push, zstd on every core
            ref_z = f"{r_z}/bench:{tag}"
            client.images.get(image_id).tag(f"{r_z}/bench", tag)
            t = time.perf_counter()
            p = wire.push(client, ref_z, registry.Repository.parse(f"{r_z}/bench"),
                          comp=compression("zstd"))
            res["imgbuild_push_zstd"] = {"seconds": round(time.perf_counter() - t, 1),
                                         "sent_bytes": p.sent_bytes, "digest": p.digest}
            drop_image(image_id)  # a node has no copy of it: the disk is containerd's
            secs, digest = containerd_pull(ref_z, scratch / "c2")
            res["containerd_pull_imgbuild_zstd_s"] = secs
            assert digest == p.digest, (digest, p.digest)
    base = res["engine_push"]["seconds"]
    pull_base = res["engine_pull_engine_gzip_s"]
    res["ratios"] = {
        "push_imgbuild_zstd_over_engine": round(res["imgbuild_push_zstd"]["seconds"] / base, 3),
        "push_imgbuild_gzip_over_engine": round(res["imgbuild_push_gzip"]["seconds"] / base, 3),
        "pull_containerd_zstd_over_engine_gzip":
            round(res["containerd_pull_imgbuild_zstd_s"] / pull_base, 3),
        "pull_containerd_gzip_over_engine_gzip":
            round(res["containerd_pull_imgbuild_gzip_s"] / pull_base, 3),
        "pull_engine_imgbuild_gzip_over_engine_gzip":
            round(res["engine_pull_imgbuild_gzip_s"] / pull_base, 3),
    }
    if have_unpigz:
        res["ratios"]["pull_engine_unpigz_over_engine_gzip"] = round(
            res["engine_pull_engine_gzip_unpigz_s"] / pull_base, 3)
    doc = {"machine": machine(), "target": args.target, "model": args.model,
           "engine": client.version()["Version"],
           "containerd": sh("containerd", "--version")[1].strip()} | res
    out = ROOT / "bench" / "results" / f"wire-{args.target}.json"
    out.write_text(json.dumps(doc, indent=2) + "\n")
    print(json.dumps(doc, indent=2))
    os.sync()


if __name__ == "__main__":
    main()
