"""Would cutting an image's largest layer into parts let a cold pull overlap its download
with its unpack? Both clients unpack layers one after another, each only once its blob is
whole, so a 6.6 GB layer is first downloaded, then unpacked. This cuts it at file boundaries
into parts of about --part-gib uncompressed (each part carries its members' parent
directories again, so every client recreates them as they were), pushes that as a second
image beside the first (zstd and gzip, imgbuild's push), and times cold pulls of both by
containerd (zstd) and by a Docker Engine started empty (gzip), alternating, --rounds times.
A check in each pulled Engine image (torch imports; the parent directories' metadata) shows
the two images hold the same files.

    IMGBUILD_WHEELS=/opt/wheels .venv/bin/python bench/layer_split_bench.py \
        --image imgbuild:sglang-blackwell-tiny-nvfp4 [--part-gib 1] [--rounds 2] [--kubelet]

--kubelet: containerd pulls through its CRI plugin as a kubelet does, which applies a layer
while later ones still download; without it, `ctr images pull`, which in containerd 1.6
fetches every blob before unpacking any (so parts cannot overlap there at all).
Results: bench/results/layer-split-IMAGE.json (-kubelet.json with --kubelet).
"""
import argparse
import gzip
import io
import json
import os
import re
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ["IMGBUILD_BLOB_CACHE_GB"] = "0"  # compressed here, as a first push does

import docker  # noqa: E402
import requests  # noqa: E402
import zstandard  # noqa: E402

from bench.machine import machine  # noqa: E402
from imgbuild.image import registry, wire  # noqa: E402
from imgbuild.image.compression import compression  # noqa: E402
from imgbuild.image.layercut import BLOCK, _members, _norm, _padded  # noqa: E402
from tests import fresh_engine as fe  # noqa: E402
from tests.containerd import Containerd  # noqa: E402

REG = os.environ.get("IMGBUILD_TEST_REGISTRY", "127.0.0.1:5000")
# Not `ls -l`: overlayfs reports a link count of 1 for a directory merged from several
# layers, which the split image has and the whole one does not; mode, owner and mtime only.
CHECK = ("python -c 'import torch; print(torch.__version__)' && "
         "stat -c '%n %a %U %G %Y' /opt /opt/venv/lib/python3.11/site-packages "
         "/opt/venv/lib/python3.11/site-packages/torch | md5sum")


def parts(src, part: int):
    """The layer tar `src` as a run of part tars, each a generator of its bytes (read each to
    its end before the next): members in order, a new part begun once one holds `part` bytes
    (never before a hard link, which must sit in its target's part), and each member's parent
    directories written into its part again where the part lacks them."""
    dirs: dict[str, bytes] = {}  # a directory's raw header, by path
    it = _members(src)
    state: dict = {"done": False, "pending": None}

    def one():
        emitted: set[str] = set()
        size = 0
        while True:
            if state["pending"] is not None:
                m, header = state["pending"]
                state["pending"] = None
            else:
                try:
                    m, header = next(it)
                except StopIteration:
                    state["done"] = True
                    break
            path = _norm(m.name)
            data_len = _padded(m.size) if m.isfile() else 0
            if size >= part and emitted and not m.islnk():
                state["pending"] = (m, header)
                break
            above = path.split("/")[:-1]
            for i in range(1, len(above) + 1):
                p = "/".join(above[:i])
                if p in dirs and p not in emitted:
                    emitted.add(p)
                    size += len(dirs[p])
                    yield dirs[p]
            if m.isdir():
                dirs[path] = header
            emitted.add(path)
            yield header
            left = data_len
            while left:
                chunk = src.read(min(1 << 20, left))
                left -= len(chunk)
                yield chunk
            size += len(header) + data_len
        yield b"\0" * (2 * BLOCK)

    while not state["done"]:
        yield one()


def split_image(repo_name: str, comp_name: str, part: int, *, reg: str = REG,
                tag: str = "whole") -> tuple[str, list[dict]]:
    """Push `repo_name:TAG` again as `repo_name:split`, its largest layer cut into parts."""
    repo = registry.Repository.parse(f"{reg}/{repo_name}")
    _, man = registry.get_manifest(repo, tag)
    cfg = json.loads(registry.get_blob(repo, man["config"]["digest"]))
    big = max(range(len(man["layers"])), key=lambda i: man["layers"][i]["size"])
    r = requests.get(f"http://{reg}/v2/{repo_name}/blobs/{man['layers'][big]['digest']}",
                     stream=True)
    r.raw.decode_content = False
    if comp_name == "zstd":
        src = io.BufferedReader(zstandard.ZstdDecompressor().stream_reader(
            r.raw, read_across_frames=True), 1 << 20)
    else:
        src = gzip.GzipFile(fileobj=r.raw)
    comp = compression(comp_name)
    new = []
    for k, body in enumerate(parts(src, part)):
        diff_id, held = wire.send_stream(body, repo, comp, lambda _: None, f"part{k}")
        new.append((diff_id, wire.descriptor(held)))
    layers = man["layers"][:big] + [d for _, d in new] + man["layers"][big + 1:]
    ids = cfg["rootfs"]["diff_ids"]
    cfg["rootfs"]["diff_ids"] = ids[:big] + [d for d, _ in new] + ids[big + 1:]
    history, seen = [], -1
    for h in cfg["history"]:  # one entry per layer: the cut layer's, once per part
        if not h.get("empty_layer"):
            seen += 1
            if seen == big:
                history += [dict(h, comment=f"part {k + 1} of {len(new)}")
                            for k in range(len(new))]
                continue
        history.append(h)
    cfg["history"] = history
    body = json.dumps(cfg, separators=(",", ":")).encode()
    digest = registry.put_blob(repo, body)
    wire.put_manifest(repo, "split", wire.image_manifest(digest, len(body), layers))
    return f"{reg}/{repo_name}:split", [{"compressed": d["size"],
                                          "tar": int(d["annotations"][wire.TAR_SIZE])}
                                         for _, d in new]


def engine_pull(ref: str) -> tuple[float, str]:
    with fe.fresh_engine() as eng:
        t = time.perf_counter()
        subprocess.run(["/usr/bin/docker", "-H", eng.host, "pull", "-q", ref], check=True,
                       capture_output=True)
        secs = round(time.perf_counter() - t, 1)
        r = subprocess.run(["/usr/bin/docker", "-H", eng.host, "run", "--rm", "--entrypoint",
                            "sh", ref, "-c", CHECK], capture_output=True, text=True)
        return secs, " ".join(r.stdout.split())[:60]


def containerd_pull(ref: str, work: Path, kubelet: bool, bin_dir: Path | None) -> float:
    with Containerd(Path(tempfile.mkdtemp(dir=work)), cri=kubelet, bin_dir=bin_dir) as c:
        t = time.perf_counter()
        if kubelet:
            c.kubelet_pull(ref, timeout=3600)
        else:
            c.pull(ref, timeout=3600)
        return round(time.perf_counter() - t, 1)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--image", default="imgbuild:sglang-blackwell-tiny-nvfp4")
    ap.add_argument("--part-gib", type=float, default=1.0)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--workdir", default="/var/lib/imgbuild/bench")
    ap.add_argument("--kubelet", action="store_true",
                    help="containerd pulls as a kubelet does (CRI PullImage: each layer unpacked "
                         "while later ones download), not by `ctr images pull`")
    ap.add_argument("--containerd-bin", type=Path,
                    help="a directory with another release's containerd, ctr and shims")
    args = ap.parse_args()
    work = Path(args.workdir)
    work.mkdir(parents=True, exist_ok=True)
    client = docker.from_env(timeout=3600)
    img = client.images.get(args.image)
    out: dict = {"machine": machine(), "image": args.image, "image_id": img.id,
                 "unpacked_bytes": int(img.attrs["Size"]), "part_gib": args.part_gib,
                 "containerd_client": "CRI PullImage" if args.kubelet else "ctr images pull",
                 "containerd": subprocess.run([str(args.containerd_bin / "containerd")
                                               if args.containerd_bin else "containerd",
                                               "--version"], capture_output=True,
                                              text=True).stdout.strip()}
    refs = {}
    for c in ("zstd", "gzip"):
        repo = f"bench-split-{c}-{uuid.uuid4().hex[:8]}"
        img.tag(f"{REG}/{repo}", "whole")
        try:
            wire.push(client, f"{REG}/{repo}:whole", registry.Repository.parse(f"{REG}/{repo}"),
                      comp=compression(c))
        finally:
            client.images.remove(f"{REG}/{repo}:whole")
        split_ref, made = split_image(repo, c, int(args.part_gib * (1 << 30)))
        refs[c] = {"whole": f"{REG}/{repo}:whole", "split": split_ref}
        out.setdefault("parts", {})[c] = made
    rows = []
    for _ in range(args.rounds):
        for v in ("whole", "split"):
            row = {"image": v, "containerd_zstd_s": containerd_pull(refs["zstd"][v], work,
                                                                 args.kubelet,
                                                                 args.containerd_bin)}
            row["engine_gzip_s"], row["check"] = engine_pull(refs["gzip"][v])
            print(json.dumps(row), flush=True)
            rows.append(row)
    out["pulls"] = rows
    for v in ("whole", "split"):
        for k in ("containerd_zstd_s", "engine_gzip_s"):
            got = [r[k] for r in rows if r["image"] == v]
            out.setdefault("mean", {}).setdefault(v, {})[k] = round(sum(got) / len(got), 1)
    out["same_files"] = len({r["check"] for r in rows}) == 1
    # another containerd's results beside the system's: -containerd1.7.24
    other = ("-containerd" + re.search(r" v?(\d+\.\d+\.\d+)", out["containerd"])[1]
             if args.containerd_bin else "")
    # The repository and tag, without a content tag's hash: one file per image, rewritten.
    name = re.sub(r"-[0-9a-f]{16}$", "", args.image.split("/")[-1]).replace(":", "-")
    path = ROOT / "bench" / "results" / (f"layer-split-{name}" + ("-kubelet" if args.kubelet
                                                                   else "") + other + ".json")
    path.write_text(json.dumps(out, indent=2) + "\n")
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
