"""An engine-only bump on a fresh CI runner, side by side in one run: today's rebuild (no build
cache, the Engine's push) and imgbuild's (the previous image's inline cache read from the
registry, only the layers that changed pushed); then a second bump after the first, the one
Engine 20.10's inline cache alone gets wrong (image/inlinecache.py).

    IMGBUILD_WHEELS=/opt/wheels .venv/bin/python bench/bump_bench.py --target tiny-cpu \
        --model '' --engine-pin transformers==5.16.0 --second-pin transformers==5.15.0 \
        --base-bootstrap debian-bookworm

Every build runs on a Docker Engine of its own, started empty (tests/fresh_engine.py): a fresh
runner, with no image and no BuildKit cache (uv's cache mount included), and nothing pruned
on this machine's Engine.

1. The previous image: the target as shipped, built, smoke-tested and pushed (gzip: what
   Docker Engine 20.10's BuildKit reads as a cache) to a registry of the bench's own, so its
   moving tags and its cache tag name it there. A bootstrapped base (--base-bootstrap) is
   pushed there first, as the workflow's base job does; a pulled one comes from its registry.
2. The bump: a project that extends the target with an override of the engine pin only
   (`--engine-pin`), locked with uv: the heavy layer's pins (torch, Triton, CUDA wheels) stay,
   the rest lock changes.
3. Today's rebuild: `imgbuild build --no-cache-from`, then `docker push` (the Engine's push),
   into a second registry: every layer is new bytes (timestamps), so all of them go; the
   registry that holds the previous image would have saved the base's layers only.
4. imgbuild's rebuild: `imgbuild build --push --no-smoke --registry R`: the layers above the
   heavy ones built alone (cache from R) and spliced onto the previous image's heavy layers
   in R (image/splice.py); then the same with --no-splice --rebuild, built whole (the heavy
   layers pulled as cache) and pushed from the Engine, as before the splice.
5. With --second-pin: the bump after that one, the same way as 4, once the target's moving tags
   are moved onto the first bump (as its smoke test's pass would move them); whether its heavy
   step was CACHED is recorded (the first bump's inline cache has no result for that step on
   Engine 20.10: it comes from the cache tag).

Bytes fetched from the package index: the sizes uv reports for what it downloads ("Downloading
X (N MiB)") in the build log. Bytes sent to the registry: its storage before and after.
The changed layers: those of the new manifest whose blobs the previous image's lacks.
Results: bench/results/bump-TARGET.json.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.machine import machine  # noqa: E402
from bench.wire_bench import DOCKER, dir_bytes, scratch_registry, sh  # noqa: E402
from imgbuild.image.registry import Repository, get_manifest, tag_manifest  # noqa: E402
from tests.fresh_engine import fresh_engine, missing  # noqa: E402

IMGBUILD = str(ROOT / ".venv" / "bin" / "imgbuild")
_DOWNLOADING = re.compile(r"\bDownloading (\S+) \(([\d.]+)\s*([KMGT]i?B)\)")
_UNITS = {"K": 2**10, "M": 2**20, "G": 2**30, "T": 2**40}


def fetched_bytes(logs: Path) -> int:
    """What uv said it downloads, over every build log in `logs` (each package once)."""
    seen: dict[str, int] = {}
    for log in logs.glob("*.build.log"):
        for m in _DOWNLOADING.finditer(log.read_text(errors="replace")):
            seen[m.group(1)] = int(float(m.group(2)) * _UNITS[m.group(3)[0]])
    return sum(seen.values())


def imgbuild(*args: str, cwd: Path) -> tuple[float, dict]:
    t = time.perf_counter()
    r = subprocess.run([IMGBUILD, *args, "--json"], cwd=cwd, capture_output=True, text=True)
    if r.returncode != 0:
        raise SystemExit(f"imgbuild {' '.join(args)} failed:\n{(r.stderr + r.stdout)[-3000:]}")
    return round(time.perf_counter() - t, 1), json.loads(r.stdout)


@contextlib.contextmanager
def fresh_runner():
    """A Docker Engine started empty, which imgbuild and docker use while in here."""
    with fresh_engine() as engine:
        os.environ["DOCKER_HOST"] = engine.host
        try:
            yield engine
        finally:
            del os.environ["DOCKER_HOST"]


def main_log(logs: Path) -> str:
    """The build's log. A cut splice builds its top beside the rest install, in a log of its
    own (*.top.build.log): its time is inside the rest install's."""
    return next(p for p in logs.glob("*.build.log") if not p.name.endswith(".top.build.log")
                ).read_text(errors="replace")


# uv's own account of an install step, and BuildKit's of the tar it streams out.
_UV_TOOK = re.compile(r"^#(\d+) [\d.]+ (Prepared \d+ packages?|Installed \d+ packages?|"
                      r"Bytecode compiled \d+ files?) in (?:(\d+)m )?([\d.]+)(ms|s)$", re.M)
_STREAMED = re.compile(r"^#\d+ sending tarball ([\d.]+)s done$", re.M)
_PHASES = {"Prepared": "fetch_s", "Installed": "copy_s", "Bytecode": "compile_s"}


def rest_install_phases(logs: Path) -> dict:
    """The rest install's time as uv gives it (fetch: download and unpack into its cache;
    copy: into the venv; compile: bytecode), and the streamed tar's (a cut splice)."""
    log = main_log(logs)
    step = re.search(r"^#(\d+) \[[^\]]*\] RUN .*-r /opt/imgbuild/rest\.txt", log, re.M)
    out: dict = {}
    for m in _UV_TOOK.finditer(log):
        if step and m.group(1) == step.group(1):
            secs = float(m.group(4)) / (1000 if m.group(5) == "ms" else 1)
            out[_PHASES[m.group(2).split()[0]]] = round(int(m.group(3) or 0) * 60 + secs, 1)
    if streamed := _STREAMED.search(log):
        out["tar_streamed_cut_sent_s"] = float(streamed.group(1))
    return out


def heavy_cached(logs: Path) -> bool:
    """Whether the build log says the heavy install step came from the cache."""
    log = main_log(logs)
    step = re.search(r"^#(\d+) \[[^\]]*\] RUN .*-r /opt/imgbuild/heavy", log, re.M)
    return bool(step) and re.search(rf"^#{step.group(1)} CACHED$", log, re.M) is not None


_PULLED = re.compile(r"^#\d+ pulling sha256:\w+ ([\d.]+)s done$", re.M)
_DONE = re.compile(r"^#\d+ DONE ([\d.]+)s$", re.M)


def cache_layer_times(logs: Path, build_s: float) -> dict:
    """Where the build's time went, from BuildKit's log: the longest pull of a cached layer
    from the registry (they run side by side), the steps that ran, and what the log does not
    itemise (BuildKit 0.8 logs no time for unpacking the pulled layers, nor for exporting)."""
    log = main_log(logs)
    pull = max((float(x) for x in _PULLED.findall(log)), default=0.0)
    steps = round(sum(float(x) for x in _DONE.findall(log)), 1)
    return {"pull_s": pull, "steps_s": steps, "unitemised_s": round(build_s - pull - steps, 1)}


def layers(repo: Repository, tag: str) -> list[dict]:
    got = get_manifest(repo, tag)
    assert got is not None, tag
    return got[1]["layers"]


def bump(args_target: str, model: list[str], repo_name: str, proj: Path, logs: Path,
         prev_blobs: set[str], repo: Repository, scratch: Path, *extra: str) -> dict:
    """imgbuild's rebuild on a fresh runner: cache from the registry, its own push (spliced
    onto the previous image's heavy layers unless `extra` says --no-splice)."""
    before = dir_bytes(scratch / "r")
    secs, new = imgbuild("build", args_target, *model, "--no-smoke", "--push", *extra,
                         "--registry", repo_name, "--log-dir", str(logs), cwd=proj)
    new_layers = layers(repo, new["content_tag"].rsplit(":", 1)[1])
    changed = [la for la in new_layers if la["digest"] not in prev_blobs]
    if keep := os.environ.get("BUMP_BENCH_KEEP_LOGS"):  # to read where the time went
        shutil.copytree(logs, Path(keep) / logs.name, dirs_exist_ok=True)
    build_s = new["build"]["seconds"]
    return {"action": new["action"], "seconds": secs, "build_s": build_s,
            # all but `docker build`: the push (the image read out of the Engine, compressed,
            # sent) and, before the build, the plan and the smoke model fetched by its key
            "push_s": round(secs - build_s, 1), "build_time": cache_layer_times(logs, build_s),
            "rest_install": rest_install_phases(logs),
            "index_bytes": fetched_bytes(logs),
            "sent_bytes": dir_bytes(scratch / "r") - before,
            "pushed_layer_bytes": new["push"]["sent_bytes"],
            "reused_layers": new["push"]["reused_layers"],
            "build_cache_moved": new["push"]["build_cache"] is not None,
            "cache_imported": new["build"]["cache_imported"],
            "cached_steps": new["build"]["cached_steps"], "steps": new["build"]["steps"],
            "heavy_step_cached": heavy_cached(logs),
            "changed_layers": {"count": len(changed),
                               "bytes": sum(la["size"] for la in changed),
                               "of": len(new_layers)},
            "content_tag": new["content_tag"], "moving_refs": new["refs"][1:]}


def pin_project(proj: Path, target: str, pins: list[str]) -> float:
    """The target with its engine pin overridden (and any pin that keeps the heavy layer's
    packages where they were), locked; the seconds the lock took."""
    (proj / "images" / f"{target}.yaml").write_text(
        f"extends: {target}\noverrides:\n" + "".join(
            f"  - requirement: {pin}\n"
            "    reason: \"bench/bump_bench.py: an engine release apart, the same torch\"\n"
            for pin in pins))
    t = time.perf_counter()
    subprocess.run([IMGBUILD, "lock", target], cwd=proj, check=True, capture_output=True)
    secs = round(time.perf_counter() - t, 1)
    # An engine-only bump or nothing: a relock that moved a heavy pin measures another thing.
    heavy = [set(json.loads(subprocess.run(
        [IMGBUILD, "plan", target, "--no-checks", "--json"], cwd=cwd, check=True,
        capture_output=True, text=True).stdout)["heavy_packages"]) for cwd in (ROOT, proj)]
    if heavy[0] != heavy[1]:
        raise SystemExit(f"{', '.join(pins)} moves the heavy layer's pins: "
                         f"{sorted(heavy[1] - heavy[0])} in place of {sorted(heavy[0] - heavy[1])}"
                         "; pin those back with another --engine-pin")
    return secs


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--target", default="sglang-blackwell-slim")
    ap.add_argument("--model", default="k2.6")
    # Repeatable: the engine's pin, then any that keep the heavy layer's packages as they were
    # (SGLang 0.5.22 alone would take cuda-tile 1.6.0rc5, a stub that installs from
    # pypi.nvidia.com: a heavy-layer change, and out of reach here).
    ap.add_argument("--engine-pin", action="append", default=None,
                    help="default: sglang==0.5.22 and cuda-tile==1.7.0")
    ap.add_argument("--second-pin", default=None, help="a second bump after the first")
    ap.add_argument("--base-bootstrap", default=None,
                    help="the target's bootstrapped base (imgbuild base bootstrap --base KEY)")
    args = ap.parse_args()
    if why := missing():
        raise SystemExit(f"bump_bench needs a fresh Docker Engine per build: {why}")
    # Every push compresses what it sends, as a fresh runner's first push does: this
    # machine's blob cache (image/blobcache.py) would send a later round's bytes from disk.
    os.environ["IMGBUILD_BLOB_CACHE_GB"] = "0"
    model = ["--model", args.model] if args.model else []
    pins = args.engine_pin or ["sglang==0.5.22", "cuda-tile==1.7.0"]
    out: dict = {"target": args.target, "model": args.model, "engine_pin": ", ".join(pins),
                 "second_pin": args.second_pin, "runner": "a Docker Engine started empty "
                 "for each build (tests/fresh_engine.py)"}
    with tempfile.TemporaryDirectory(prefix="bump-bench-", dir="/var/tmp") as td:
        scratch = Path(td)
        proj = scratch / "project"
        proj.mkdir()
        (proj / "imgbuild.yaml").write_text("{}\n")
        (proj / "images").mkdir()
        (proj / "lockfiles").mkdir()
        out["relock_s"] = pin_project(proj, args.target, pins)
        with scratch_registry(scratch / "r") as reg:
            repo_name = f"{reg}/bench"
            repo = Repository.parse(repo_name)
            if args.base_bootstrap:
                imgbuild("base", "bootstrap", "--base", args.base_bootstrap,
                         "--registry", repo_name, cwd=ROOT)
            # 1. the previous image, with its moving tags in the registry
            with fresh_runner():
                secs, prev = imgbuild("build", args.target, *model, "--push",
                                      "--registry", repo_name, "--compression", "gzip",
                                      cwd=ROOT)
                assert prev["moved"], "the smoke test did not pass: no moving tag to read"
                out["previous"] = {"seconds": secs, "content_tag": prev["content_tag"],
                                   "pushed_bytes": prev["push"]["sent_bytes"],
                                   "build_cache_moved": prev["push"]["build_cache"] is not None}
                prev_blobs = {la["digest"] for la in
                              layers(repo, prev["content_tag"].rsplit(":", 1)[1])}
                # What the image weighs, and where (the slim image against SGLang's own
                # runtime image): `imgbuild size`, kept beside the bump's numbers.
                r = subprocess.run([IMGBUILD, "size", prev["content_tag"], "--json"],
                                   cwd=ROOT, capture_output=True, text=True)
                if r.returncode == 0:
                    (ROOT / "bench" / "results" / f"size-{args.target}-now.json").write_text(
                        json.dumps({"machine": machine(), "content_tag": prev["content_tag"],
                                    "size": json.loads(r.stdout)}, indent=2) + "\n")

            # 3. today's rebuild, into a registry of its own (see the docstring)
            with fresh_runner(), scratch_registry(scratch / "r-today") as reg_today:
                logs = scratch / "logs-today"
                secs_build, today = imgbuild(
                    "build", args.target, *model, "--no-smoke", "--no-cache-from",
                    "--registry", repo_name, "--log-dir", str(logs), cwd=proj)
                ref_today = f"{reg_today}/bench:{today['content_tag'].rsplit(':', 1)[1]}"
                sh(DOCKER, "tag", today["content_tag"], ref_today)
                push_s, _ = sh(DOCKER, "push", ref_today)
                out["today"] = {"seconds": round(secs_build + push_s, 1),
                                "build_s": secs_build, "push_s": push_s,
                                "index_bytes": fetched_bytes(logs),
                                "sent_bytes": dir_bytes(scratch / "r-today")}
            # 4. imgbuild's rebuild: the layers above the heavy ones built alone, spliced onto
            # the previous image's heavy layers in the registry (image/splice.py)
            with fresh_runner():
                out["imgbuild"] = bump(args.target, model, repo_name, proj,
                                       scratch / "logs-imgbuild", prev_blobs, repo, scratch)
            out["changed_layers"] = out["imgbuild"].pop("changed_layers")
            # 4b. the same rebuild built whole (--no-splice: the heavy layers pulled as
            # BuildKit's cache, the image pushed from the Engine), which the splice replaces;
            # --rebuild, as the content tag is in the registry now
            with fresh_runner():
                out["imgbuild_no_splice"] = bump(
                    args.target, model, repo_name, proj, scratch / "logs-no-splice",
                    prev_blobs, repo, scratch, "--no-splice", "--rebuild")
            for k in ("changed_layers", "moving_refs"):
                out["imgbuild_no_splice"].pop(k)
            if not args.second_pin:
                out["imgbuild"].pop("moving_refs")
            # 5. the bump after it
            if args.second_pin:
                # The first bump's moving tags move, as its passing smoke test would have moved
                # them (the bench leaves the smoke test out of every rebuild it times): the
                # second bump reads the first one's image there, as on CI.
                for ref in out["imgbuild"].pop("moving_refs"):
                    tag_manifest(repo, out["imgbuild"]["content_tag"].rsplit(":", 1)[1],
                                 ref.rsplit(":", 1)[1])
                out["relock_second_s"] = pin_project(proj, args.target,
                                                     [args.second_pin, *pins[1:]])
                blobs1 = {la["digest"] for la in layers(
                    repo, out["imgbuild"]["content_tag"].rsplit(":", 1)[1])}
                with fresh_runner():
                    out["second_bump"] = bump(args.target, model, repo_name, proj,
                                              scratch / "logs-second", blobs1, repo, scratch)
                out["second_bump"].pop("moving_refs")
    out["ratios"] = {
        "time_imgbuild_over_today": round(out["imgbuild"]["seconds"] / out["today"]["seconds"], 3),
        "time_no_splice_over_today": round(out["imgbuild_no_splice"]["seconds"]
                                           / out["today"]["seconds"], 3),
        "sent_over_changed_layers": round(out["imgbuild"]["pushed_layer_bytes"]
                                          / max(1, out["changed_layers"]["bytes"]), 3),
        "index_bytes_imgbuild_over_today": round(out["imgbuild"]["index_bytes"]
                                                 / max(1, out["today"]["index_bytes"]), 3),
    }
    if "second_bump" in out:
        sb = out["second_bump"]
        out["ratios"] |= {
            "time_second_bump_over_today": round(sb["seconds"] / out["today"]["seconds"], 3),
            "second_sent_over_changed_layers": round(
                sb["pushed_layer_bytes"] / max(1, sb["changed_layers"]["bytes"]), 3)}
    doc = {"machine": machine()} | out
    dest = ROOT / "bench" / "results" / f"bump-{args.target}.json"
    dest.write_text(json.dumps(doc, indent=2) + "\n")
    print(json.dumps(doc, indent=2))
    shutil.rmtree(scratch, ignore_errors=True)


if __name__ == "__main__":
    main()
