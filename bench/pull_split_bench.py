"""Where a cold containerd pull spends its time: the download alone, the unpack alone, the two
together (as a node pulls), beside the floors under them on this machine: decompressing each
layer to nothing (one core, as containerd 1.6 does it) and writing the uncompressed layers'
files to the same disk with `tar -x` (what any client must do at least).

    IMGBUILD_WHEELS=/opt/wheels .venv/bin/python bench/pull_split_bench.py [--image REF]
    PATH=/opt/containerd-1.7/usr/bin:$PATH .venv/bin/python bench/pull_split_bench.py \
        --suffix=-containerd1.7     # another containerd (a .deb unpacked with dpkg -x)

The image (default: the local tiny-cpu) is pushed with imgbuild in zstd and in gzip to a
repository of its own on the local registry (blob cache off: compressed here). Each timing runs
in a containerd started for it, on a root of its own under the data disk. Results:
bench/results/pull-split-IMAGE.json.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
import uuid
import zlib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import docker  # noqa: E402
import zstandard  # noqa: E402

from bench.machine import machine  # noqa: E402
from imgbuild.image import registry, wire  # noqa: E402
from imgbuild.image.compression import compression  # noqa: E402
from tests.containerd import containerd_daemon  # noqa: E402

REGISTRY = os.environ.get("IMGBUILD_TEST_REGISTRY", "127.0.0.1:5000")


def _timed(fn) -> float:
    t = time.perf_counter()
    fn()
    return round(time.perf_counter() - t, 2)


def _blobs(repo: str, tag: str) -> list[tuple[str, int]]:
    r = registry.Repository.parse(repo)
    _, doc = registry.get_manifest(r, tag)
    return [(layer["digest"], layer["size"]) for layer in doc["layers"]]


def _decompress(blobs: list[bytes], comp_name: str) -> None:
    """Each layer decompressed to nothing on one core, as containerd 1.6 does it."""
    for b in blobs:
        if comp_name == "zstd":
            with zstandard.ZstdDecompressor().stream_reader(io.BytesIO(b)) as s:
                while s.read(1 << 20):
                    pass
            continue
        rest = b
        while rest:  # one gzip member after another
            z = zlib.decompressobj(31)
            z.decompress(rest)
            rest = z.unused_data


def _one(client, img, comp_name: str, work: Path) -> dict:
    comp = compression(comp_name)
    repo = f"{REGISTRY}/bench-split-{comp_name}-{uuid.uuid4().hex[:8]}"
    ref = f"{repo}:t"
    img.tag(repo, "t")
    try:
        pushed = wire.push(client, ref, registry.Repository.parse(repo), comp=comp)
    finally:
        client.images.remove(ref)
    row: dict = {"compressed_bytes": pushed.sent_bytes, "digest": pushed.digest}
    r = registry.Repository.parse(repo)
    blobs = [registry.get_blob(r, dg) for dg, _ in _blobs(repo, "t")]
    row["decompress_one_core_s"] = _timed(lambda: _decompress(blobs, comp_name))
    with containerd_daemon(Path(tempfile.mkdtemp(dir=work))) as ctrd:
        row["fetch_only_s"] = _timed(lambda: ctrd.ctr("content", "fetch", "--plain-http", ref,
                                                      timeout=1800))
        row["unpack_after_fetch_s"] = _timed(lambda: ctrd.pull(ref))
    with containerd_daemon(Path(tempfile.mkdtemp(dir=work))) as ctrd:
        row["pull_s"] = _timed(lambda: ctrd.pull(ref))
    return row


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--image", default="imgbuild:tiny-cpu")
    ap.add_argument("--workdir", default="/var/lib/imgbuild/bench",
                    help="where containerd's roots and the tar floor go (the data disk)")
    ap.add_argument("--suffix", default="",
                    help="appended to the results file's name (another containerd on PATH)")
    args = ap.parse_args()
    os.environ["IMGBUILD_BLOB_CACHE_GB"] = "0"  # compressed here, as a first push does
    client = docker.from_env(timeout=3600)
    img = client.images.get(args.image)
    work = Path(args.workdir)
    work.mkdir(parents=True, exist_ok=True)
    name = args.image.split("/")[-1].replace(":", "-")
    out: dict = {"machine": machine(), "image": args.image, "image_id": img.id,
                 "unpacked_bytes": int(img.attrs["Size"]),
                 "containerd_version": subprocess.run(["containerd", "--version"],
                                                      capture_output=True,
                                                      text=True).stdout.strip(),
                 "containerd_binary": shutil.which("containerd")}

    # The floor under any client: the layers' files written to this disk (tar -x), from the
    # uncompressed tars `docker save` gives.
    with tempfile.TemporaryDirectory(dir=work) as d:
        save = Path(d) / "image.tar"
        with open(save, "wb") as f:
            for chunk in client.api.get_image(img.id, chunk_size=1 << 20):
                f.write(chunk)
        layers = Path(d) / "layers"
        with tarfile.open(save) as tf:
            members = [m for m in tf.getmembers() if m.name.endswith("layer.tar")]
            tf.extractall(layers, members=members, filter="tar")
        save.unlink()
        dest = Path(d) / "rootfs"
        dest.mkdir()
        tars = sorted(layers.rglob("layer.tar"))

        def untar() -> None:
            for t in tars:
                subprocess.run(["tar", "-xf", str(t), "-C", str(dest)], check=True)
            subprocess.run(["sync"], check=True)
        out["floor_tar_x_s"] = _timed(untar)
        out["layer_tar_bytes"] = sum(t.stat().st_size for t in tars)

        out["containerd"] = {c: _one(client, img, c, work) for c in ("zstd", "gzip")}
    out["note"] = ("fetch_only: `ctr content fetch` (blobs into the content store); "
                   "unpack_after_fetch: `ctr images pull` of the same ref then (nothing left to "
                   "fetch); pull: a cold `ctr images pull` in another fresh containerd (fetch "
                   "and unpack overlapping). floor_tar_x: `tar -x` of the uncompressed layers "
                   "onto the same disk, then sync.")
    path = ROOT / "bench" / "results" / f"pull-split-{name}{args.suffix}.json"
    path.write_text(json.dumps(out, indent=2) + "\n")
    print(json.dumps(out, indent=2))
    shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
