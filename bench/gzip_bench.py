"""Which deflate writes gzip layers: speed a core, speed on every core, and size, side by side
in one run, on the kind of bytes an engine bump sends (the rest layer's wheels, unpacked).

    .venv/bin/python bench/gzip_bench.py [--pin sglang-kernel==0.4.10 ...] [--rounds 2]

The wheels (default: the biggest of sglang-blackwell-slim's rest layer, as its lock pins them)
are downloaded from the index pip is configured with, unpacked, and tarred in memory. Each
candidate compresses that tar in image/compression.py's way: 4 MiB blocks, a gzip member each.
Per core: CPU time of one thread, best of the rounds. Every core: wall time of one thread per
core on the first 800 MB. Candidates whose library is not installed are left out (zlib-ng
and python-isal are not dependencies; install them by hand to compare). Results:
bench/results/gzip.json.
"""

from __future__ import annotations

import argparse
import io
import json
import subprocess
import sys
import tarfile
import tempfile
import time
import zipfile
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.machine import machine  # noqa: E402
from imgbuild.image.compression import GZIP, GZIP_BLOCK, cpu_workers  # noqa: E402

PINS = ["sglang-kernel==0.4.10", "flashinfer-python==0.7.2", "llvmlite==0.47.0",
        "tilelang==0.1.12", "transformers==5.19.0"]


def _member(zlib_like, level: int) -> Callable[[bytes], bytes]:
    """A block as one gzip member (wbits 31) by a zlib-shaped module."""
    def f(b: bytes) -> bytes:
        c = zlib_like.compressobj(level, zlib_like.DEFLATED, 31)
        return c.compress(b) + c.flush()
    return f


def candidates() -> dict[str, Callable[[bytes], bytes]]:
    import zlib

    import deflate
    out: dict[str, Callable[[bytes], bytes]] = {
        f"libdeflate {lv}": (lambda b, lv=lv: deflate.gzip_compress(b, lv)) for lv in (4, 5, 6)}
    try:
        from zlib_ng import zlib_ng
        out |= {f"zlib-ng {lv}": _member(zlib_ng, lv) for lv in (4, 5, 6)}
    except ImportError:
        pass
    try:
        from isal import isal_zlib
        out |= {f"isal {lv}": _member(isal_zlib, lv) for lv in (1, 3)}
    except ImportError:
        pass
    out["zlib 6"] = _member(zlib, 6)
    return out


def sample(pins: list[str], scratch: Path) -> bytes:
    subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps",
                    "--only-binary=:all:", "--python-version", "3.11",
                    "--platform", "manylinux_2_28_x86_64", "--platform", "manylinux2014_x86_64",
                    "--platform", "any", *pins, "-d", str(scratch)], check=True)
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w") as tf:
        for whl in sorted(scratch.glob("*.whl")):
            with zipfile.ZipFile(whl) as z:
                for info in z.infolist():
                    if info.is_dir():
                        continue
                    data = z.read(info)
                    m = tarfile.TarInfo(f"site-packages/{info.filename}")
                    m.size = len(data)
                    tf.addfile(m, io.BytesIO(data))
    return out.getvalue()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--pin", action="append", default=None, help=f"default: {' '.join(PINS)}")
    ap.add_argument("--rounds", type=int, default=2)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="gzip-bench-", dir="/var/tmp") as td:
        data = sample(args.pin or PINS, Path(td))
    blocks = [data[i:i + GZIP_BLOCK] for i in range(0, len(data), GZIP_BLOCK)]
    some = blocks[:(800 << 20) // GZIP_BLOCK]
    cands = candidates()
    per_core: dict[str, list[float]] = {k: [] for k in cands}
    every_core: dict[str, list[float]] = {k: [] for k in cands}
    sizes: dict[str, int] = {}
    workers = cpu_workers()
    for _ in range(args.rounds):  # candidates alternate within each round
        for name, f in cands.items():
            t = time.process_time()
            sizes[name] = sum(len(f(b)) for b in blocks)
            per_core[name].append(time.process_time() - t)
            t = time.perf_counter()
            with ThreadPoolExecutor(workers) as pool:
                for _ in pool.map(f, some):
                    pass
            every_core[name].append(time.perf_counter() - t)
    some_bytes = sum(map(len, some))
    doc = {
        "machine": machine(),
        "sample": {"pins": args.pin or PINS, "tar_bytes": len(data), "blocks": len(blocks),
                   "block_bytes": GZIP_BLOCK},
        "in_use": GZIP.recipe,
        "candidates": {
            name: {"mb_s_a_core": round(len(data) / min(per_core[name]) / 1e6, 1),
                   f"mb_s_on_{workers}_cores": round(some_bytes / min(every_core[name]) / 1e6, 1),
                   "ratio": round(sizes[name] / len(data), 4),
                   "bytes": sizes[name]} for name in cands},
        "note": "per core: CPU time of one thread over the whole sample, best of the rounds; "
                "on every core: wall time, one thread per core, over its first 800 MB",
    }
    dest = ROOT / "bench" / "results" / "gzip.json"
    dest.write_text(json.dumps(doc, indent=2) + "\n")
    print(json.dumps(doc, indent=2))


if __name__ == "__main__":
    main()
