"""imgbuild as a user installs it: the wheel's size, and start-up from the installed wheel beside
the checkout's editable install, in one run (interleaved, so load on the machine hits both).

- the wheel `uv build --wheel` makes: its size, files, and the built-in catalog's share;
- `uv pip install --compile-bytecode` of it into a fresh venv (uv's cache warm);
- `imgbuild --help`, `imgbuild --version`, `imgbuild list`, `imgbuild plan tiny-cpu` and
  `imgbuild plan sglang-blackwell --model k2.6`, from an empty directory with a fresh HOME
  (installed) and from the checkout (editable): wall time per run, median.

    .venv/bin/python bench/install_bench.py [--rounds 9]

Results: bench/results/install.json.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.machine import machine  # noqa: E402

CASES = {
    "--help": ["--help"],
    "--version": ["--version"],
    "list": ["list"],
    "plan tiny-cpu": ["plan", "tiny-cpu"],
    "plan sglang-blackwell --model k2.6": ["plan", "sglang-blackwell", "--model", "k2.6"],
}


def wall(binary: str, args: list[str], cwd: Path, env: dict) -> float:
    t = time.perf_counter()
    r = subprocess.run([binary, *args], cwd=cwd, env=env, capture_output=True, text=True)
    took = time.perf_counter() - t
    if r.returncode != 0:
        raise SystemExit(f"{binary} {' '.join(args)} failed:\n{r.stderr[-2000:]}")
    return took


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=9)
    rounds = ap.parse_args().rounds
    tmp = Path(tempfile.mkdtemp(prefix="install-bench-"))
    try:
        uv = shutil.which("uv") or "uv"
        t = time.perf_counter()
        subprocess.run([uv, "build", "-q", "--wheel", "-o", str(tmp / "dist"), str(ROOT)],
                       check=True, capture_output=True)
        build_s = time.perf_counter() - t
        wheel = next((tmp / "dist").glob("imgbuild-*.whl"))
        with zipfile.ZipFile(wheel) as z:
            infos = z.infolist()
        catalog = [i for i in infos if i.filename.startswith("imgbuild/builtin/")]
        subprocess.run([uv, "venv", "-q", "--python", sys.executable, str(tmp / "venv")],
                       check=True, env=os.environ | {"UV_PYTHON_DOWNLOADS": "never"})
        t = time.perf_counter()
        # --compile-bytecode: what pip does by default and `uv tool install --compile-bytecode`
        # does (README); without it, a machine with PYTHONDONTWRITEBYTECODE set (this one)
        # compiles every module on every run.
        subprocess.run([uv, "pip", "install", "-q", "--compile-bytecode", "--python",
                        str(tmp / "venv" / "bin" / "python"), str(wheel)], check=True)
        install_s = time.perf_counter() - t
        empty, home = tmp / "empty", tmp / "home"
        empty.mkdir()
        home.mkdir()
        clean = {k: v for k, v in os.environ.items() if not k.startswith("IMGBUILD_")}
        sides = {
            "installed wheel (empty dir, fresh HOME)": (str(tmp / "venv" / "bin" / "imgbuild"),
                                                        empty, clean | {"HOME": str(home)}),
            "checkout (editable)": (str(ROOT / ".venv" / "bin" / "imgbuild"), ROOT, clean),
        }
        runs: dict[str, dict[str, list[float]]] = {s: {c: [] for c in CASES} for s in sides}
        for binary, cwd, env in sides.values():  # warm both (bytecode, caches)
            for args in CASES.values():
                wall(binary, args, cwd, env)
        for _ in range(rounds):
            for case, args in CASES.items():
                for side, (binary, cwd, env) in sides.items():
                    runs[side][case].append(round(wall(binary, args, cwd, env), 3))
        result = {
            "machine": machine(),
            "wheel": {"file": wheel.name, "bytes": wheel.stat().st_size, "files": len(infos),
                      "catalog_files": len(catalog),
                      "catalog_bytes_compressed": sum(i.compress_size for i in catalog),
                      "catalog_bytes": sum(i.file_size for i in catalog),
                      "build_s": round(build_s, 2)},
            "install_s_warm_uv_cache": round(install_s, 2),
            "rounds": rounds,
            "median_s": {s: {c: statistics.median(v) for c, v in r.items()}
                         for s, r in runs.items()},
            "runs_s": runs,
        }
        out = ROOT / "bench" / "results" / "install.json"
        out.write_text(json.dumps(result, indent=2) + "\n")
        print(json.dumps({k: result[k] for k in ("wheel", "install_s_warm_uv_cache",
                                                 "median_s")}, indent=2))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
