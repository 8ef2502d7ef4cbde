"""Small, real wheels for a local index: the resolver cases reproduced exactly.

A wheel is a zip with METADATA, WHEEL and RECORD; these are built here byte for byte as the
wheel spec says, so uv, pip and pypiserver take them like any other.
"""

from __future__ import annotations

import base64
import hashlib
import socket
import subprocess
import sys
import time
import zipfile
from dataclasses import dataclass, field
from pathlib import Path

import requests


def _record_hash(data: bytes) -> str:
    return "sha256=" + base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()


@dataclass(frozen=True)
class WheelSpec:
    name: str
    version: str
    requires: tuple[str, ...] = ()
    files: dict[str, str] = field(default_factory=dict, hash=False)  # path in wheel -> text
    tag: str = "py3-none-any"
    requires_python: str | None = None


def make_wheel(spec: WheelSpec, dest: Path) -> Path:
    dist = spec.name.replace("-", "_")
    fname = f"{dist}-{spec.version}-{spec.tag}.whl"
    info = f"{dist}-{spec.version}.dist-info"
    meta = ["Metadata-Version: 2.1", f"Name: {spec.name}", f"Version: {spec.version}"]
    if spec.requires_python:
        meta.append(f"Requires-Python: {spec.requires_python}")
    meta += [f"Requires-Dist: {r}" for r in spec.requires]
    files = dict(spec.files) or {f"{dist}/__init__.py": f'__version__ = "{spec.version}"\n'}
    files[f"{info}/METADATA"] = "\n".join(meta) + "\n"
    py, abi, plat = spec.tag.split("-")
    files[f"{info}/WHEEL"] = ("Wheel-Version: 1.0\nGenerator: imgbuild-tests\n"
                              f"Root-Is-Purelib: {'true' if plat == 'any' else 'false'}\n"
                              f"Tag: {spec.tag}\n")
    record = [f"{p},{_record_hash(t.encode())},{len(t.encode())}" for p, t in files.items()]
    record.append(f"{info}/RECORD,,")
    files[f"{info}/RECORD"] = "\n".join(record) + "\n"
    dest.mkdir(parents=True, exist_ok=True)
    path = dest / fname
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as z:
        for p, t in files.items():
            zi = zipfile.ZipInfo(p, date_time=(2020, 1, 1, 0, 0, 0))
            zi.external_attr = 0o644 << 16
            z.writestr(zi, t)
    return path


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class LocalIndex:
    """pypiserver on loopback serving a directory; packages can be added while it runs."""

    def __init__(self, root: Path, *, fallback: bool = False):
        """fallback: packages the directory lacks are redirected to PyPI (so one index serves
        a project's real dependencies and the test's own packages)."""
        self.fallback = fallback
        self.root = root
        root.mkdir(parents=True, exist_ok=True)
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}/simple/"
        self.proc: subprocess.Popen | None = None

    def add(self, spec: WheelSpec) -> Path:
        return make_wheel(spec, self.root)

    def start(self) -> LocalIndex:
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "pypiserver", "run", "-p", str(self.port), "-i", "127.0.0.1",
             "-a", ".", "-P", ".", *([] if self.fallback else ["--disable-fallback"]),
             "--hash-algo", "sha256",
             # The directory is read on every request. The default backend caches its listing
             # and learns of a new file from a watchdog thread: a wheel added during a test
             # could be missing from the next answer, and was once in CI (test_outdated).
             "--backend", "simple-dir", str(self.root)],
            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            try:
                if requests.get(self.url, timeout=1).status_code == 200:
                    return self
            except requests.RequestException:
                time.sleep(0.1)
        self.stop()
        raise RuntimeError("pypiserver did not start")

    def stop(self) -> None:
        if self.proc:
            self.proc.terminate()
            self.proc.wait(timeout=10)
            self.proc = None
