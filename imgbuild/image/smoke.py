"""Run the smoke payload inside an image and read its report."""

from __future__ import annotations

import json
import shutil
import subprocess
import time
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

from ..errors import InputError
from ..fsutil import atomic_write_text
from ..lock.wheels import cache_root
from ..plan import labels, render
from .daemon import run_cli, run_container

CACHE_FORMAT = 1
GPU_STAGE = "gpu-engine"


@dataclass(frozen=True)
class SmokeReport:
    image: str
    ok: bool
    stages: tuple[dict, ...]
    seconds: float
    raw: dict
    image_id: str | None = None  # the image's config digest: what the report is about
    reused: str | None = None  # where an earlier report for this image came from; None: ran now

    def to_dict(self) -> dict:
        return {"image": self.image, "ok": self.ok, "seconds": round(self.seconds, 2),
                "stages": list(self.stages), "reused": self.reused}


def host_has_gpu_runtime() -> bool:
    """Whether `docker run --gpus all` can work here: the NVIDIA runtime and a driver."""
    if shutil.which("nvidia-smi") is None:
        return False  # no driver: the Engine is not asked (two `docker` runs, on every reuse)
    info = run_cli(["info", "--format", "{{json .Runtimes}}"], capture_output=True, text=True)
    return "nvidia" in info.stdout


def run(image: str, timeout: int = 900, gpu: str = "auto",
        env: dict[str, str] | None = None) -> SmokeReport:
    """Run the payload with no network: a smoke test must not depend on anything outside.

    gpu: auto runs stage 4 (the image's engine on a GPU) where this host has one; off skips
    it; require fails the report when no GPU can be had.
    """
    start = time.monotonic()
    engine = None
    insp = run_cli(["image", "inspect", "--format",
                    '{{.Id}}\t{{index .Config.Labels "io.imgbuild.engine"}}\t'
                    '{{index .Config.Labels "io.imgbuild.user"}}', image],
                   capture_output=True, text=True)
    if insp.returncode != 0:
        raise InputError(f"image {image} is not here", hint="build or pull it first")
    image_id, engine, user = (insp.stdout.rstrip("\n").split("\t") + ["", ""])[:3]
    engine = engine.split("==")[0] or None
    # A target that cannot run as any user says why (its `smoke: root_only:`, in the image's
    # io.imgbuild.user label): the payload runs as root, and the any-user stage says it was not.
    root_only = labels.root_only_reason(user)
    gpus = ["--gpus", "all"] if gpu != "off" and host_has_gpu_runtime() else []
    engine_args = ["--engine", engine] if engine in ("sglang", "vllm", "transformers") else []
    smoke_args = ["--lock", f"{render.ASSETS}/lock.txt", "--model", f"{render.ASSETS}/smoke-model",
                  "--facts", f"{render.ASSETS}/image.json", "--gpu", gpu, *engine_args]
    # One container, as a restricted pod runs it: the any-user checks, then every stage of the
    # payload as that user on a read-only root (image/smoke.py ANY_USER_FLAGS).
    doc, failure = _as_any_user(image, engine, smoke_args, gpus=gpus, timeout=timeout, env=env,
                                as_root=root_only is not None)
    if failure is not None:
        return _failed(image, start, failure)
    raw = doc.get("smoke") or {}
    if not raw.get("stages"):
        return _failed(image, start, "the payload printed no report: "
                       + str(raw.get("error", ""))[-1500:])
    stage = _any_user_stage(doc) if root_only is None else _root_only_stage(root_only, doc)
    stages = [*raw["stages"], stage]
    ok = bool(raw.get("ok")) and stage["status"] != "fail"
    secs = time.monotonic() - start
    report = SmokeReport(image, ok, tuple(stages), secs, raw | {"stages": stages}, image_id)
    remember(report)
    return report


ANY_USER_STAGE = "any-user"
# What a restricted pod gives a container: a read-only root, /tmp writable (a tmpfs here, an
# emptyDir there), no capabilities, no privilege escalation. exec: Triton and the JIT caches
# load the code they compile from there.
ANY_USER = labels.ANY_USER
ANY_USER_FLAGS = ("--user", ANY_USER, "--read-only",
                  "--tmpfs", "/tmp:rw,exec,nosuid,nodev", "--cap-drop", "ALL",
                  "--security-opt", "no-new-privileges")


def any_user(image: str, engine: str | None, smoke_args: list[str], *, timeout: int = 900,
             env: dict[str, str] | None = None) -> dict:
    """The any-user stage alone (its checks, and the smoke payload run as that user)."""
    doc, failure = _as_any_user(image, engine, smoke_args, gpus=[], timeout=timeout, env=env)
    if failure is not None:
        return {"name": ANY_USER_STAGE, "status": "fail", "reason": failure, "checks": []}
    stage = _any_user_stage(doc)
    smoke_ok = bool((doc.get("smoke") or {}).get("ok"))
    if stage["status"] == "pass" and not smoke_ok:
        stage = stage | {"status": "fail", "reason": stage["reason"] + "; the smoke payload "
                         "failed as this user"}
    return stage


def _as_any_user(image: str, engine: str | None, smoke_args: list[str], *, gpus: list[str],
                 timeout: int, env: dict[str, str] | None,
                 as_root: bool = False) -> tuple[dict, str | None]:
    """Through the image's entrypoint, as UID 1000770000 with group 0 on a read-only root:
    payload/anyuser.py (getpass, every cache directory written, the host preflight, the engine
    imported), then the smoke payload. Its report, or why there is none. as_root: the same
    run as root on a writable root (a root-only image)."""
    who = ANY_USER if not as_root else "0:0"
    cmd = ["python", f"{render.ASSETS}/anyuser.py", "--json",
           *(["--engine", engine] if engine in ("sglang", "vllm", "transformers") else []),
           "--", *smoke_args]
    extra = [x for k, v in sorted((env or {}).items()) for x in ("-e", f"{k}={v}")]
    try:
        # The entrypoint runs (as this user), its host check left to anyuser.py, which runs
        # it and judges only whether it could run: the host's verdict is preflight's business.
        proc = run_container("imgbuild-smoke", ["--network", "none", *gpus,
                                                *(ANY_USER_FLAGS if not as_root else ()),
                                                *extra, "-e", "IMGBUILD_PREFLIGHT=0", image,
                                                *cmd],
                             capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return {}, f"timed out after {timeout} s"
    try:
        return json.loads(proc.stdout[proc.stdout.rindex('{"ok"'):]), None
    except ValueError:
        tail = " | ".join((proc.stdout + proc.stderr).strip().splitlines()[-15:])
        return {}, f"the payload printed no report (as {who}): {tail[-1500:]}"


def _root_only_stage(reason: str, doc: dict) -> dict:
    who = f"uid {doc.get('uid', '?')} gid {doc.get('gid', '?')}"
    return {"name": ANY_USER_STAGE, "status": "skipped",
            "reason": f"skipped: the image runs as root only ({reason[:600]}); the smoke test "
                      f"ran as {who}", "checks": []}


def _any_user_stage(doc: dict) -> dict:
    checks = [c for c in doc.get("checks", []) if c.get("name") != "smoke"]
    failed = [c for c in checks if c.get("status") != "pass"]
    reason = (f"as {labels.ANY_USER} on a read-only root: " +
              ("; ".join(f"{c['name']}: {c['reason']}" for c in failed) if failed else
               f"{len(checks)} checks passed"))
    return {"name": ANY_USER_STAGE, "status": "fail" if failed else "pass",
            "reason": reason[:1500], "checks": checks}


# --- earlier reports, by image ID -----------------------------------------------------------
# An image ID is the digest of the image's config, which lists every layer by content: the
# same ID is the same bytes, payload included. A passing report for it stays true; the one
# thing that can change is the host, so a report whose GPU stage was skipped for want of a GPU
# is not reused where there is one now.

def _cache_file(image_id: str) -> Path:
    return cache_root() / "smoke" / f"{image_id.replace(':', '-')}.json"


def remember(report: SmokeReport) -> None:
    """Keep the report by its image ID (the local cache `reusable` reads first)."""
    if not report.image_id or report.reused:
        return
    doc = {"format": CACHE_FORMAT, "image_id": report.image_id, "ok": report.ok,
           "stages": list(report.stages), "seconds": report.seconds, "raw": report.raw,
           "ran_at": datetime.now(UTC).isoformat(timespec="seconds")}
    path = _cache_file(report.image_id)
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(path, json.dumps(doc, indent=1))


def recall(image: str, image_id: str) -> SmokeReport | None:
    """The passing report this machine made for the image ID, where it still holds here."""
    try:
        doc = json.loads(_cache_file(image_id).read_text())
    except (OSError, ValueError):
        return None  # none, or unreadable: the test runs again
    if not isinstance(doc, dict) or doc.get("format") != CACHE_FORMAT \
            or doc.get("image_id") != image_id:
        return None
    return reusable(image, image_id, doc, f"local cache, run {doc.get('ran_at', '?')}")


def reusable(image: str, image_id: str | None, doc: dict, where: str) -> SmokeReport | None:
    """An earlier report (local cache or registry) as this run's, if it passed and its GPU
    stage did not skip for want of a GPU that this host has."""
    stages = doc.get("stages")
    if not doc.get("ok") or not isinstance(stages, list):
        return None
    gpu = next((s_ for s_ in stages if isinstance(s_, dict) and s_.get("name") == GPU_STAGE), {})
    if gpu.get("status") in ("skip", "skipped") and host_has_gpu_runtime():
        return None
    return SmokeReport(image, True, tuple(stages), 0.0, doc.get("raw") or doc, image_id, where)


def _failed(image: str, start: float, reason: str) -> SmokeReport:
    stage = {"name": "payload", "status": "fail", "reason": reason, "duration_s": 0}
    return SmokeReport(image, False, (stage,), time.monotonic() - start, {"stages": [stage]})
