"""Where containerd's CPU goes in a cold pull: the fetch (blobs into the content store) and the
unpack (layers into the overlayfs snapshotter) timed apart, the daemon's CPU seconds for each
(from /proc), and a CPU profile of the unpack from the daemon's own pprof endpoint, grouped by
what the time is spent on (hashing, system calls and which, decompression, the Go runtime).

    IMGBUILD_WHEELS=/opt/wheels .venv/bin/python bench/pull_profile_bench.py \\
        --image imgbuild:sglang-blackwell-tiny-nvfp4 [--profile-seconds 40]
    .venv/bin/python bench/pull_profile_bench.py --ref 127.0.0.1:5000/repo:tag

--image pushes a local image in zstd (imgbuild's push) to a repository of its own first.
Grouping the profile needs Go's `go tool pprof` (Debian: golang-go); without it the raw profile
is kept beside the results and the groups are left out. The profile covers the first
--profile-seconds of the unpack (the pprof endpoint samples for a fixed time): set it below
the unpack's wall time. Results: bench/results/pull-profile-IMAGE.json (and .pprof).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.machine import machine  # noqa: E402
from tests.containerd import Containerd  # noqa: E402

REGISTRY = os.environ.get("IMGBUILD_TEST_REGISTRY", "127.0.0.1:5000")
HZ = os.sysconf("SC_CLK_TCK")

# What a flat sample is spent on, by the function's name (first match wins).
GROUPS = (
    ("sha256 (hashing: the unpack hashes each uncompressed layer for its diff id)", r"^crypto/sha256\."),
    ("system calls", r"^(runtime/internal/syscall\.|syscall\.|golang\.org/x/sys/unix\.)"),
    ("zstd decoding", r"^github\.com/klauspost/compress/(zstd|huff0|fse)"),
    ("gzip decoding", r"^(compress/flate|compress/gzip|github\.com/klauspost/compress/flate)"),
    ("memory copies", r"^runtime\.mem(move|clr)"),
    ("Go runtime (scheduler, GC, allocation)", r"^runtime\."),
)


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / HZ  # utime + stime, every thread


def timed(pid: int, fn) -> dict:
    c, t = cpu_seconds(pid), time.perf_counter()
    fn()
    wall = time.perf_counter() - t
    return {"wall_s": round(wall, 1), "cpu_s": round(cpu_seconds(pid) - c, 1),
            "cores_busy": round((cpu_seconds(pid) - c) / wall, 2)}


def pprof_rows(profile: Path, *args: str) -> list[tuple[float, float, str]]:
    """(flat s, cum s, function) rows of `go tool pprof -top`."""
    out = subprocess.run(["go", "tool", "pprof", "-top", "-nodecount=1000", *args, str(profile)],
                         capture_output=True, text=True, check=True).stdout
    rows = []
    for line in out.splitlines():
        m = re.match(r"\s*([\d.]+)(m?s)?\s+[\d.]+%\s+[\d.]+%\s+([\d.]+)(m?s)?\s+[\d.]+%\s+"
                     r"(.+?)( \(inline\))?$", line)
        if m:
            def sec(v: str, unit: str | None) -> float:
                return float(v) / (1000 if unit == "ms" else 1)
            rows.append((sec(m[1], m[2]), sec(m[3], m[4]), m[5].strip()))
    return rows


def grouped(profile: Path) -> dict:
    rows = pprof_rows(profile)
    total = sum(flat for flat, _, _ in rows)
    groups: dict[str, float] = {name: 0.0 for name, _ in GROUPS}
    groups["other"] = 0.0
    for flat, _, fn in rows:
        name = next((n for n, pat in GROUPS if re.search(pat, fn)), "other")
        groups[name] += flat
    # Which system calls: the cumulative time of each syscall wrapper under the raw syscall.
    calls = {}
    for _, cum, fn in pprof_rows(profile, "-focus=runtime/internal/syscall"):
        m = re.match(r"^(?:syscall|golang\.org/x/sys/unix)\.(\w+)$", fn)
        if m and m[1][0].islower():  # the raw wrappers (write, openat), not their callers
            calls[m[1]] = max(calls.get(m[1], 0.0), cum)
    return {"sampled_cpu_s": round(total, 1),
            "groups_s": {k: round(v, 1) for k, v in groups.items()},
            "syscalls_s": {k: round(v, 1) for k, v in sorted(calls.items(),
                                                             key=lambda kv: -kv[1])[:8]},
            "top": [{"fn": fn, "flat_s": round(flat, 2)} for flat, _, fn in rows[:12]]}


def push_zstd(image: str) -> str:
    import docker

    from imgbuild.image import registry, wire
    from imgbuild.image.compression import compression

    os.environ["IMGBUILD_BLOB_CACHE_GB"] = "0"
    client = docker.from_env(timeout=3600)
    repo = f"{REGISTRY}/bench-profile-{uuid.uuid4().hex[:8]}"
    client.images.get(image).tag(repo, "t")
    try:
        wire.push(client, f"{repo}:t", registry.Repository.parse(repo),
                  comp=compression("zstd"))
    finally:
        client.images.remove(f"{repo}:t")
    return f"{repo}:t"


def main() -> None:
    ap = argparse.ArgumentParser()
    src = ap.add_mutually_exclusive_group(required=True)
    src.add_argument("--image", help="a local image, pushed in zstd first")
    src.add_argument("--ref", help="an image already in the (plain-http) registry")
    ap.add_argument("--profile-seconds", type=int, default=40)
    ap.add_argument("--workdir", default="/var/lib/imgbuild/bench",
                    help="where containerd's root goes (the data disk)")
    args = ap.parse_args()
    ref = args.ref or push_zstd(args.image)
    name = (args.image or ref).split("/")[-1].replace(":", "-")
    work = Path(args.workdir)
    work.mkdir(parents=True, exist_ok=True)
    out: dict = {"machine": machine(), "image": args.image or ref, "ref": ref,
                 "containerd_version": subprocess.run(["containerd", "--version"],
                                                      capture_output=True,
                                                      text=True).stdout.strip()}
    profile = ROOT / "bench" / "results" / f"pull-profile-{name}.pprof"
    with Containerd(Path(tempfile.mkdtemp(dir=work)), debug=True) as c:
        out["fetch"] = timed(c.pid, lambda: c.ctr("content", "fetch", "--plain-http", ref,
                                                  timeout=3600))

        def sample() -> None:
            subprocess.run(["curl", "-sf", "--unix-socket", c.debug_sock, "-o", str(profile),
                            f"http://x/debug/pprof/profile?seconds={args.profile_seconds}"],
                           check=True)
        sampler = threading.Thread(target=sample)
        sampler.start()
        out["unpack"] = timed(c.pid, lambda: c.pull(ref, timeout=3600))
        sampler.join()
    out["unpack"]["profile_s"] = args.profile_seconds
    if shutil.which("go"):
        out["unpack"]["profile"] = grouped(profile)
    else:
        out["unpack"]["profile"] = "go is not on PATH: the raw profile is " + profile.name
    out["note"] = ("fetch: `ctr content fetch` (blobs into the content store, nothing unpacked); "
                   "unpack: `ctr images pull` of the same ref then (nothing left to fetch). "
                   "cpu_s: the daemon's user+system CPU over each (every thread). profile: "
                   "flat CPU of the unpack's first profile_s seconds, grouped by function.")
    path = ROOT / "bench" / "results" / f"pull-profile-{name}.json"
    path.write_text(json.dumps(out, indent=2) + "\n")
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
