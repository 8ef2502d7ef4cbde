"""Build the image from a Plan with the Docker Engine's BuildKit.

The build context is assembled in a scratch directory: the rendered Dockerfile, the lock in
the two parts the layers install, uv (bind-mounted, never copied into a layer), the wheels the
lock names that come from a local wheel directory, and the smoke assets.
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import subprocess
import time
from collections import deque
from dataclasses import dataclass
from pathlib import Path

from . import render
from .dockerenv import cli
from .errors import EnvError, JobFailed
from .lock import Lockfile, uv_bin
from .plan import Plan

CA_BUNDLES = ("/etc/ssl/certs/ca-certificates.crt", "/etc/pki/tls/certs/ca-bundle.crt")


@dataclass(frozen=True)
class Secrets:
    """Files handed to the build as BuildKit secrets: mounted for one step, in no layer."""

    cacert: Path | None = None
    netrc: Path | None = None

    @classmethod
    def from_host(cls) -> Secrets:
        ca = os.environ.get("IMGBUILD_CA_BUNDLE") or os.environ.get("SSL_CERT_FILE")
        ca = ca or next((c for c in CA_BUNDLES if os.path.exists(c)), None)
        netrc = os.environ.get("IMGBUILD_NETRC") or os.path.expanduser("~/.netrc")
        return cls(Path(ca) if ca and os.path.exists(ca) else None,
                   Path(netrc) if os.path.exists(netrc) else None)

    def args(self) -> list[str]:
        out = []
        if self.cacert:
            out += ["--secret", f"id=cacert,src={self.cacert}"]
        if self.netrc:
            out += ["--secret", f"id=netrc,src={self.netrc}"]
        return out


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return "sha256:" + h.hexdigest()


def _link_or_copy(src: Path, dst: Path) -> None:
    dst.parent.mkdir(parents=True, exist_ok=True)
    try:
        os.link(src, dst)
    except OSError:
        shutil.copy2(src, dst)


def local_wheels(lock: Lockfile, wheels: Path | None) -> list[Path]:
    """Wheels in the local directory whose sha256 is one the lock pins (others are ignored)."""
    if wheels is None:
        return []
    wanted = {h for p in lock.packages for h in p.hashes}
    return [w for w in sorted(wheels.glob("*.whl")) if _sha256(w) in wanted]


def index_flags(plan: Plan, has_wheels: bool) -> str:
    if has_wheels:
        # The wheelhouse stands in for the extra indexes (the CPU torch index, say).
        return f"--find-links {render.WHEELS} --index-strategy unsafe-best-match"
    flags = [f"--extra-index-url {u}" for u in plan.extra_index_urls]
    if plan.extra_index_urls:
        flags.append("--index-strategy unsafe-best-match")
    return " ".join(flags)


def prepare_context(plan: Plan, lock: Lockfile, dest: Path, *, wheels: Path | None,
                    smoke_model_dir: Path | None) -> list[Path]:
    """Write the build context; return the wheels it carries."""
    (dest / "lock").mkdir(parents=True)
    (dest / "Dockerfile").write_text(render.dockerfile(plan))
    (dest / "lock" / "heavy.txt").write_text(lock.requirements_text(heavy=True))
    (dest / "lock" / "rest.txt").write_text(lock.requirements_text(heavy=False))
    shutil.copy2(lock.path, dest / "lock" / "lock.txt")
    (dest / "tools").mkdir()
    _link_or_copy(Path(uv_bin()), dest / "tools" / "uv")
    (dest / "wheels").mkdir()
    carried = local_wheels(lock, wheels)
    for w in carried:
        _link_or_copy(w, dest / "wheels" / w.name)
    (dest / "payload").mkdir()
    for name in render.PAYLOAD_FILES:
        shutil.copy2(render.PAYLOAD_DIR / name, dest / "payload" / name)
    (dest / "payload" / "entrypoint.sh").write_text(render.entrypoint_sh())
    (dest / "payload" / "image.json").write_text(render.image_facts(plan))
    if plan.patch_digest:
        from . import patches

        patches.write_context(patches.context_files(plan.patches, lock), dest / "patchset")
    (dest / "smoke").mkdir()
    if smoke_model_dir is not None:
        shutil.copytree(smoke_model_dir, dest / "smoke" / "model")
    else:
        (dest / "smoke" / "model").mkdir()
    return carried


_STEP = re.compile(r"^#(\d+) \[(?:[^\]]*?)(\d+)/(\d+)\] (.*)$")
_STEP_LINE = re.compile(r"^#(\d+) ")


def _title(instruction: str) -> str:
    """A step as a person reads it: mounts and flags dropped, one line, short."""
    words = [w for w in instruction.split() if not w.startswith("--mount=")]
    text = " ".join(words)
    return text if len(text) <= 80 else text[:79] + "…"


@dataclass(frozen=True)
class BuildResult:
    image_id: str
    seconds: float
    steps: int
    cached_steps: int


def docker_build(plan: Plan, context: Path, *, secrets: Secrets, flags: str,
                 console=None, log_path: Path | None = None, no_cache: bool = False) -> BuildResult:
    """Run `docker build`; show the current step; on failure raise with that step's log tail."""
    from rich.console import Console

    console = console or Console(stderr=True)
    iid = context / "image-id"
    args = ["build", "--progress=plain", "--iidfile", str(iid), "-t", plan.ref(),
            "--build-arg", f"IMGBUILD_INDEX_FLAGS={flags}",
            "--label", f"io.imgbuild.content-key={plan.content_key}",
            *secrets.args(), *(["--no-cache"] if no_cache else []), str(context)]
    d = cli()
    env = dict(os.environ)
    if d.buildkit_env:
        env["DOCKER_BUILDKIT"] = "1"
    start = time.monotonic()
    by_step: dict[str, deque[str]] = {}
    titles: dict[str, str] = {}
    cached: set[str] = set()
    total = 0
    log = open(log_path, "w") if log_path else None
    try:
        proc = subprocess.Popen([d.path, *args], env=env, stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, text=True, bufsize=1)
    except OSError as e:
        raise EnvError(f"cannot run {d.path}: {e}") from None
    tail: deque[str] = deque(maxlen=40)
    with console.status(f"building {plan.ref()}", spinner="dots") as status:
        assert proc.stdout is not None
        for line in proc.stdout:
            line = line.rstrip("\n")
            tail.append(line)
            if log:
                log.write(line + "\n")
            m = _STEP.match(line)
            if m:
                sid, n, total = m.group(1), int(m.group(2)), int(m.group(3))
                titles[sid] = f"[{n}/{total}] {_title(m.group(4))}"
                status.update(f"building {plan.content_tag}: {titles[sid]}")
                continue
            sm = _STEP_LINE.match(line)
            if sm:
                sid = sm.group(1)
                by_step.setdefault(sid, deque(maxlen=30)).append(line)
                if line.endswith(" CACHED"):
                    cached.add(sid)
                elif line.endswith(" DONE") or " DONE " in line:
                    if sid in titles:
                        console.print(f"  [green]done[/] {titles[sid]}"
                                      f"{' (cached)' if sid in cached else ''}", highlight=False)
    rc = proc.wait()
    if log:
        log.close()
    secs = time.monotonic() - start
    if rc != 0:
        failed = next((sid for sid, lines in by_step.items()
                       if any(" ERROR" in ln for ln in lines)), None)
        step_tail = list(by_step.get(failed, tail)) if failed else list(tail)
        title = titles.get(failed or "", "the build")
        raise JobFailed(f"docker build failed at {title} (exit code {rc})",
                        facts=[f"image {plan.ref()} was not tagged"],
                        hint="the log tail above shows the failing step"
                             + (f"; full log in {log_path}" if log_path else ""),
                        log_tail=step_tail)
    image_id = iid.read_text().strip() if iid.exists() else ""
    return BuildResult(image_id, secs, len(titles), len(cached & set(titles)))
