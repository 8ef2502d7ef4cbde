"""In-image check: the image works as any user on a read-only root filesystem.

Clusters that serve for others run pods as a random UID with group 0 (Kubernetes' restricted
Pod Security standard, OpenShift's restricted SCC), often on a read-only root, with only a few
places mounted writable. The smoke test runs this file that way:

    docker run --user 1000770000:0 --read-only --tmpfs /tmp:rw,exec,nosuid,nodev ... \
        IMAGE python /opt/imgbuild/anyuser.py --engine sglang --json [-- SMOKE ARGS]

(through the image's entrypoint, so the host preflight runs as that user too). It checks:

- who: the UID and GID, and that getpass answers for a UID with no passwd entry (torch's
  inductor cache directory asks for it);
- where: HOME and every cache and JIT directory the engines write (each resolved as the engine
  resolves it: its variable, else its default under HOME) can be made and written;
- the engine imports (its modules are read, never written: no bytecode is written);
- with SMOKE ARGS: the smoke payload itself, run as this user, passes.

Standard library only. Exit status 0 when every check passed, 1 otherwise.
"""

from __future__ import annotations

import argparse
import getpass
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

# Where each tool writes, as it resolves it: (name, variable, default relative to HOME or
# absolute). A variable set in the image (or by the caller) wins.
CACHES = (
    ("home", "HOME", None),
    ("xdg-cache", "XDG_CACHE_HOME", ".cache"),
    ("tmp", "TMPDIR", "/tmp"),
    ("triton", "TRITON_CACHE_DIR", ".triton/cache"),
    ("torchinductor", "TORCHINDUCTOR_CACHE_DIR", None),  # /tmp/torchinductor_<user>
    ("torch-extensions", "TORCH_EXTENSIONS_DIR", ".cache/torch_extensions"),
    ("flashinfer", "FLASHINFER_WORKSPACE_BASE", ".cache/flashinfer"),
    ("deep-gemm", "DG_JIT_CACHE_DIR", ".deep_gemm"),
    ("tvm-ffi", "TVM_FFI_CACHE_DIR", ".cache/tvm-ffi"),
    ("cuda", "CUDA_CACHE_PATH", ".nv/ComputeCache"),
    ("hf", "HF_HOME", ".cache/huggingface"),
    ("numba", "NUMBA_CACHE_DIR", ".cache/numba"),
)
ENGINE_MODULE = {"sglang": "sglang", "vllm": "vllm", "transformers": "transformers"}


def _resolve(var: str, default: str | None, user: str) -> str | None:
    if os.environ.get(var):
        return os.environ[var]
    if var == "TORCHINDUCTOR_CACHE_DIR":
        return os.path.join(tempfile.gettempdir(), f"torchinductor_{user}")
    if default is None:
        return None
    return default if default.startswith("/") else os.path.join(os.path.expanduser("~"), default)


def _writable(path: str) -> str | None:
    """None when a file can be made in `path` (made if missing); else why not."""
    try:
        Path(path).mkdir(parents=True, exist_ok=True)
        probe = Path(path) / f".imgbuild-probe-{os.getpid()}"
        probe.write_bytes(b"ok")
        probe.unlink()
        return None
    except OSError as e:
        return f"{type(e).__name__}: {e.strerror or e} ({path})"


def check(engine: str | None) -> list[dict]:
    checks: list[dict] = []
    try:
        user = getpass.getuser()
        checks.append({"name": "user", "status": "pass",
                       "reason": f"uid {os.getuid()} gid {os.getgid()} groups "
                                 f"{sorted(os.getgroups())}; getpass: {user}"})
    except Exception as e:  # noqa: BLE001 (KeyError: getpwuid(): uid not found)
        user = str(os.getuid())
        checks.append({"name": "user", "status": "fail",
                       "reason": f"getpass.getuser() failed for uid {os.getuid()}: {e!r} (set "
                                 "USER or LOGNAME in the image)"})
    for name, var, default in CACHES:
        path = _resolve(var, default, user)
        if path is None:
            checks.append({"name": f"writable:{name}", "status": "fail",
                           "reason": f"{var} is not set"})
            continue
        why = _writable(path)
        said = f"{var}={path}" if os.environ.get(var) else f"{path} ({var} unset: the default)"
        checks.append({"name": f"writable:{name}", "status": "fail" if why else "pass",
                       "reason": why or said})
    here = Path(__file__).resolve().parent
    facts = here / "image.json"
    if (here / "preflight.py").is_file() and facts.is_file():
        # The entrypoint's host check, as this user: its verdict is about the host (0 pass or
        # skip, 1 a failed check); 2 and 3 are its own breakage (a file it cannot read or
        # write), which is this check's business.
        r = subprocess.run([sys.executable, str(here / "preflight.py"), "--facts", str(facts)],
                           capture_output=True, text=True)
        checks.append({"name": "preflight", "status": "pass" if r.returncode in (0, 1) else "fail",
                       "reason": f"ran, exit {r.returncode}" if r.returncode in (0, 1) else
                       (r.stderr.strip().splitlines() or [f"exit {r.returncode}"])[-1][:300]})
    if engine:
        mod = ENGINE_MODULE[engine]
        t = time.monotonic()
        r = subprocess.run([sys.executable, "-c", f"import {mod}"], capture_output=True,
                           text=True)
        checks.append({"name": f"import:{mod}", "status": "pass" if r.returncode == 0 else "fail",
                       "reason": f"{time.monotonic() - t:.1f} s" if r.returncode == 0 else
                       (r.stderr.strip().splitlines() or ["no output"])[-1][:300]})
    return checks


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    smoke_args: list[str] = []
    if "--" in argv:
        i = argv.index("--")
        argv, smoke_args = argv[:i], argv[i + 1:]
    ap = argparse.ArgumentParser(description="imgbuild in-image check: any user, read-only root")
    ap.add_argument("--engine", choices=tuple(ENGINE_MODULE))
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    checks = check(args.engine)
    smoke = None
    if smoke_args:
        here = Path(__file__).resolve().parent
        r = subprocess.run([sys.executable, str(here / "smoke.py"), *smoke_args, "--json"],
                           capture_output=True, text=True)
        try:
            smoke = json.loads(r.stdout[r.stdout.index("{"):])
        except ValueError:
            smoke = {"ok": False, "stages": [], "error": (r.stdout + r.stderr)[-1500:]}
        checks.append({"name": "smoke", "status": "pass" if smoke.get("ok") and r.returncode == 0
                       else "fail",
                       "reason": ", ".join(f"{s['name']} {s['status']}"
                                           for s in smoke.get("stages", []))
                       or smoke.get("error", "")[-300:]})
    ok = all(c["status"] == "pass" for c in checks)
    doc = {"ok": ok, "uid": os.getuid(), "gid": os.getgid(), "checks": checks}
    if smoke is not None:
        doc["smoke"] = smoke
    if args.json:
        print(json.dumps(doc))
    else:
        for c in checks:
            print(f"{c['status']:5} {c['name']}: {c['reason']}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
