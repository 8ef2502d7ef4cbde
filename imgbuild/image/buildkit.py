"""Build the image from its context with the Docker Engine's BuildKit (the CLI: the SDK builds
only with the legacy builder, which has no build secrets), showing the step that runs."""

from __future__ import annotations

import io
import os
import re
import subprocess
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import IO

from ..catalog.hardware import DEBIAN_ARCH
from ..errors import EnvError, JobFailed
from ..plan.plan import Plan
from ..progress import SILENT, Progress, human_bytes
from .base import PROXY_VARS, host_cpu
from .context import Secrets
from .daemon import cli, run_cli

_STEP = re.compile(r"^#(\d+) \[(?:[^\]]*?)(\d+)/(\d+)\] (.*)$")
_STEP_LINE = re.compile(r"^#(\d+) ")
# BuildKit's own step for each --cache-from: it fetches that image's config and reads the
# inline cache (the `moby.buildkit.cache.v0` key) from it. A ref that does not exist or cannot
# be reached ends this step with ERROR and the build goes on without it (exit 0).
_IMPORTING = re.compile(r"^#(\d+) importing cache manifest from (\S+)\s*$")

# Every image carries its cache metadata in its config, so that a machine with an empty
# BuildKit cache (a fresh CI runner) can reuse its layers by naming it in --cache-from.
INLINE_CACHE = ("--build-arg", "BUILDKIT_INLINE_CACHE=1")

# Docker's predefined proxy arguments: uv inside the build reaches the index through the proxy
# this host uses. BuildKit keeps them out of the image's history and of its cache key, and they
# are no input of the content key. Each is named without a value, so the docker CLI reads it
# from the environment it is given and a proxy's password never shows on a command line.
# (PROXY_VARS, from base.py: the same settings reach debootstrap there.)


# The time a reproducible build sets every file of its layers to, and its config's times:
# 1980-01-01, the earliest a zip (a wheel) records. A constant: the same on every Engine, and no
# input of any content key.
SOURCE_DATE_EPOCH = 315532800


@dataclass(frozen=True)
class Export:
    """What a build asks of BuildKit beyond its default, where the Engine offers it (image/
    engine.py decides which; the default asks for nothing more, as Engine 20.10 needs).

    reproducible: the image goes to an OCI archive with `rewrite-timestamp=true` and
    SOURCE_DATE_EPOCH (the layers' files all get that time, so a rebuild with no cache gives
    the same layers byte for byte), in `compression`, and is then loaded into the Engine. The
    containerd store's own image exporter refuses rewrite-timestamp (it unpacks), and the
    classic store's ignores it; the OCI exporter needs the containerd store.
    cache_to / cache_from: a registry build cache written with mode=max (every stage's
    layers, not only the final image's: what a fresh runner needs) and read back; read, it
    takes the place of the images' inline caches (docker_build)."""

    reproducible: bool = False
    compression: str = "gzip"
    cache_to: str | None = None
    cache_from: tuple[str, ...] = ()

    def describe(self) -> list[str]:
        out = []
        if self.reproducible:
            out.append(f"layers rewritten to SOURCE_DATE_EPOCH={SOURCE_DATE_EPOCH}, "
                       f"{self.compression}, through an OCI archive")
        if self.cache_to:
            out.append(f"registry cache (mode=max) to {self.cache_to}")
        return out


def export_args(export: Export, tag: str, archive: Path) -> list[str]:
    """The buildx arguments for `export` (none for the default)."""
    args: list[str] = []
    if export.reproducible:
        args += ["--output", f"type=oci,dest={archive},name={tag},rewrite-timestamp=true,"
                 f"compression={export.compression},force-compression=true",
                 # BuildKit's own provenance attestation carries the build's time: an index
                 # around the image that no rebuild gives again. imgbuild's provenance is
                 # pushed beside the image instead (image/attest.py).
                 "--provenance=false",
                 "--build-arg", f"SOURCE_DATE_EPOCH={SOURCE_DATE_EPOCH}"]
    for ref in export.cache_from:
        args += ["--cache-from", f"type=registry,ref={ref}"]
    if export.cache_to:
        # A cache that cannot be written (no push right, say) costs the next build time, not
        # this build: BuildKit says so and goes on.
        args += ["--cache-to", f"type=registry,ref={export.cache_to},mode=max,"
                 "ignore-error=true"]
    return args


def build_args(plan: Plan, context: Path, *, secrets: Secrets, flags: str, no_cache: bool,
               cache_from: tuple[str, ...], tag: str | None, sink: bool, export: Export,
               environ: dict[str, str], host: str) -> tuple[list[str], Export]:
    """The `docker build` arguments of docker_build, and the export they ask for (with a tar
    sink, only the registry cache to read): the image tagged `tag` (default: the content tag)
    with its id in context/image-id, or written to an OCI archive beside the context
    (reproducible), or its filesystem streamed as a tar to stdout (`sink`); on a `host` CPU
    other than the plan's, the plan's platform."""
    iid = context / "image-id"
    archive = context.parent / f"{context.name}.oci.tar"
    if sink:
        output = ["-o", "type=tar,dest=-"]
        export = Export(cache_from=export.cache_from)
    elif export.reproducible:
        output = []
    else:
        output = ["--iidfile", str(iid), "-t", tag or plan.ref()]
    output += export_args(export, tag or plan.ref(), archive)
    args = ["build", "--progress=plain", *output,
            "--build-arg", f"IMGBUILD_INDEX_FLAGS={flags}",
            # No image, no inline cache: asked for, it has the Engine put the last step's
            # layer into its layer store (its diff read and hashed) before the tar is sent.
            *(INLINE_CACHE if not sink else ()),
            *proxy_args(environ),
            "--label", f"io.imgbuild.content-key={plan.content_key}",
            *secrets.args(), *(["--no-cache"] if no_cache else []),
            # The registry cache, where there is one, is read alone (pipeline/build.py
            # build_export says why).
            *[a for ref in (() if export.cache_from else cache_from)
              for a in ("--cache-from", ref)],
            # Another CPU's image: BuildKit runs its steps under QEMU (binfmt_misc).
            *(["--platform", f"linux/{DEBIAN_ARCH[plan.cpu_arch]}"]
              if plan.cpu_arch != host else []),
            str(context)]
    return args, export


def proxy_args(env: dict[str, str]) -> list[str]:
    """`--build-arg NAME` for each proxy variable set in `env`."""
    return [a for v in PROXY_VARS if env.get(v) for a in ("--build-arg", v)]


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
    # The --cache-from refs whose image BuildKit read (their inline cache, if they carry one);
    # those it could not (no such tag yet, unreachable) are left out: it built on without.
    cache_imported: tuple[str, ...] = ()
    flags: str = ""  # IMGBUILD_INDEX_FLAGS: the value its RUN steps record in the history


def docker_build(plan: Plan, context: Path, *, secrets: Secrets, flags: str,
                 progress: Progress = SILENT, log_path: Path | None = None,
                 no_cache: bool = False, cache_from: tuple[str, ...] = (),
                 tag: str | None = None,
                 tar_sink: Callable[[IO[bytes]], None] | None = None,
                 export: Export = Export()) -> BuildResult:
    """Run `docker build`, tagging `tag` (default: the content tag); show the current step; on
    failure raise with that step's log tail.

    cache_from: images (in a registry) whose inline cache BuildKit may reuse layers from
    when its own cache lacks them; one that does not exist is skipped, not an error.

    tar_sink: no image; the built filesystem, as BuildKit's tar exporter streams it, is handed
    to tar_sink as it comes (an exception there stops the build and is raised).

    export: what more the Engine offers (Export); a reproducible build is loaded into the
    Engine once BuildKit has written it."""
    iid = context / "image-id"
    archive = context.parent / f"{context.name}.oci.tar"
    args, export = build_args(plan, context, secrets=secrets, flags=flags, no_cache=no_cache,
                              cache_from=cache_from, tag=tag, sink=tar_sink is not None,
                              export=export, environ=dict(os.environ), host=host_cpu())
    d = cli()
    env = dict(os.environ)
    if d.buildkit_env:
        env["DOCKER_BUILDKIT"] = "1"
    start = time.monotonic()
    by_step: dict[str, deque[str]] = {}
    titles: dict[str, str] = {}
    cached: set[str] = set()
    importing: dict[str, str] = {}  # step -> the --cache-from ref it reads
    fetching: dict[str, int] = {}  # uv: package -> bytes it said it downloads
    fetched = 0
    total = 0
    log = open(log_path, "w") if log_path else None
    try:
        # With a tar sink, stdout is the tar and BuildKit's progress comes on stderr.
        proc = subprocess.Popen([d.path, *args], env=env, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE if tar_sink else subprocess.STDOUT,
                                bufsize=(1 << 20) if tar_sink else -1)
    except OSError as e:
        raise EnvError(f"cannot run {d.path}: {e}") from None
    tail: deque[str] = deque(maxlen=40)
    tag = tag or plan.ref()
    sink_error: list[BaseException] = []
    with progress.status(f"building {tag}") as status:
        assert proc.stdout is not None
        lines = proc.stderr if tar_sink else proc.stdout
        assert lines is not None
        if tar_sink:
            def streamed(n: int) -> None:
                status(f"building {tag}: the built filesystem streamed out",
                       f"{human_bytes(n)} read")

            def drain() -> None:
                try:
                    tar_sink(_Counted(proc.stdout, streamed))
                    while proc.stdout.read(1 << 20):  # the tar's padding: BuildKit ends well
                        pass
                except BaseException as e:  # raised below, once the build is stopped
                    sink_error.append(e)
                    proc.kill()
                finally:
                    proc.stdout.close()
            sinking = threading.Thread(target=drain, name="build-tar", daemon=True)
            sinking.start()
        for raw in lines:
            line = raw.decode(errors="replace").rstrip("\n")
            tail.append(line)
            if log:
                log.write(line + "\n")
            if (im := _IMPORTING.match(line)) is not None:
                importing[im.group(1)] = im.group(2)
                status(f"building {plan.content_tag}: reading the cache of {im.group(2)}")
            m = _STEP.match(line)
            if m:
                sid, n, total = m.group(1), int(m.group(2)), int(m.group(3))
                titles[sid] = f"[{n}/{total}] {_title(m.group(4))}"
                status(f"building {plan.content_tag}: {titles[sid]}")
                continue
            sm = _STEP_LINE.match(line)
            if sm:
                sid = sm.group(1)
                by_step.setdefault(sid, deque(maxlen=30)).append(line)
                # uv's own words in an install step: the bytes it fetches, as they come.
                if (dm := _UV_DOWNLOADING.search(line)) is not None:
                    fetching[dm.group(1)] = _size(dm.group(2), dm.group(3))
                elif (dm := _UV_DOWNLOADED.search(line)) is not None and dm.group(1) in fetching:
                    fetched += fetching[dm.group(1)]
                if fetching and sid in titles:
                    status(f"building {plan.content_tag}: {titles[sid]}",
                           f"uv fetched {human_bytes(fetched)} of "
                           f"{human_bytes(sum(fetching.values()))}")
                if line.endswith(" CACHED"):
                    cached.add(sid)
                elif line.endswith(" DONE") or " DONE " in line:
                    if sid in titles:
                        progress.note(f"  done {titles[sid]}"
                                      f"{' (cached)' if sid in cached else ''}")
    if tar_sink:
        sinking.join()
    rc = proc.wait()
    if log:
        log.close()
    secs = time.monotonic() - start
    missed = missed_caches(importing, by_step)
    for sid in sorted(missed):
        why = next(ln.split(" ERROR: ", 1)[-1] for ln in by_step[sid] if " ERROR" in ln)
        # "not found": a tag not pushed yet, the usual case. Anything else (no login, the
        # registry unreachable) costs a full build and is worth a line.
        if not why.rstrip().endswith("not found"):
            progress.note(f"no cache read from {importing[sid]}: {why[:200]}", level="warn")
    if rc != 0:
        # A cache that could not be read is not why a build failed: BuildKit went on without it.
        failed = failed_step(by_step, importing)
        if sink_error and failed is None:
            raise sink_error[0]  # the sink stopped the build; a failed step stops the sink
        step_tail = list(by_step.get(failed, tail)) if failed else list(tail)
        title = titles.get(failed or "", "the build")
        unpullable = _unpullable_base(plan, step_tail)
        if unpullable is not None:
            raise unpullable
        if failed is None and _DAEMON_GONE.search("\n".join(list(tail)[-5:])):
            # No step failed: the Engine stopped answering (restarted, killed, out of memory).
            raise EnvError("the Docker daemon went away during the build",
                           facts=[f"image {tag} was not tagged",
                                  *[ln for ln in list(tail)[-3:] if ln.strip()]],
                           hint="check that dockerd runs (`docker info`; make services starts "
                                "it), then run the command again: the steps that finished are "
                                "in BuildKit's cache")
        raise JobFailed(f"docker build failed at {title} (exit code {rc})",
                        facts=[f"image {tag} was not tagged"],
                        hint="the log tail above shows the failing step"
                             + (f"; full log in {log_path}" if log_path else ""),
                        log_tail=step_tail)
    if sink_error:
        raise sink_error[0]
    if export.reproducible:
        image_id = _load(archive, tag, progress)
    else:
        image_id = iid.read_text().strip() if iid.exists() and not tar_sink else ""
    imported = tuple(ref for sid, ref in importing.items() if sid not in missed)
    for ref in imported:
        progress.note(f"  cache read from {ref}")
    return BuildResult(image_id, secs, len(titles), len(cached & set(titles)), imported, flags)


def missed_caches(importing: dict[str, str], by_step: dict[str, deque[str]]) -> set[str]:
    """The --cache-from steps (step -> ref) whose log says ERROR: caches not read."""
    return {sid for sid in importing
            if any(" ERROR" in ln for ln in by_step.get(sid, ()))}


def failed_step(by_step: dict[str, deque[str]], importing: dict[str, str]) -> str | None:
    """The first step whose log says ERROR, a cache that could not be read left aside (BuildKit
    goes on without it: it is not why a build failed)."""
    return next((sid for sid, lines in by_step.items() if sid not in importing
                 and any(" ERROR" in ln for ln in lines)), None)


def _load(archive: Path, tag: str, progress: Progress) -> str:
    """The OCI archive a reproducible build wrote, loaded into the Engine (tagged `tag`, the
    name the archive's index gives it) and removed; the image id."""
    try:
        with progress.status(f"loading {tag} into the Engine"):
            r = run_cli(["load", "-i", str(archive)], capture_output=True, text=True)
        if r.returncode != 0:
            raise JobFailed(f"the Engine did not load the image BuildKit built ({tag})",
                            facts=[(r.stderr or r.stdout).strip()[-300:]],
                            hint=f"image {tag} was not tagged; run the command again")
        got = run_cli(["image", "inspect", "--format", "{{.Id}}", tag], capture_output=True,
                      text=True)
        if got.returncode != 0:
            raise JobFailed(f"the Engine loaded the image BuildKit built, but not as {tag}",
                            facts=[r.stdout.strip()[-300:]])
        return got.stdout.strip()
    finally:
        archive.unlink(missing_ok=True)


class _Counted(io.RawIOBase):
    """A stream whose reads are counted and said at most once a second: the status line while
    BuildKit's tar streams out (its own log is silent from "sending tarball" to its end)."""

    def __init__(self, f: IO[bytes], say: Callable[[int], None]) -> None:
        super().__init__()
        self.f = f
        self.say = say
        self.read_bytes = 0
        self.said = 0.0

    def readable(self) -> bool:
        return True

    def read(self, n: int = -1) -> bytes:
        data = self.f.read(n)
        self.read_bytes += len(data)
        if (now := time.monotonic()) - self.said >= 1.0:
            self.said = now
            self.say(self.read_bytes)
        return data


# uv, where its output is not a terminal: " Downloading torch (174.8MiB)", " Downloaded torch".
_UV_DOWNLOADING = re.compile(r"\bDownloading (\S+) \(([\d.]+)\s*([KMGT]i?B)\)")
_UV_DOWNLOADED = re.compile(r"\bDownloaded (\S+)\s*$")
_UNITS = {"K": 2**10, "M": 2**20, "G": 2**30, "T": 2**40}


def _size(number: str, unit: str) -> int:
    return int(float(number) * _UNITS[unit[0]] if unit[0] in _UNITS else float(number))


# What the docker client says when the daemon goes away under a running build.
_DAEMON_GONE = re.compile(r"server did not provide an image ID|error reading from server|"
                          r"connection reset by peer|Cannot connect to the Docker daemon|"
                          r"transport is closing|code = Unavailable|unexpected EOF", re.I)


# What BuildKit says when it cannot fetch a FROM image's metadata: the network, DNS, a proxy,
# or the registry's refusal. None of these is the build's fault.
_METADATA = re.compile(r"load metadata for (\S+)")
_UNREACHABLE = re.compile(r"no such host|i/o timeout|connection refused|network is unreachable|"
                          r"TLS handshake timeout|pull access denied|unauthorized|"
                          r"failed to do request|server misbehaving", re.I)


def _unpullable_base(plan: Plan, lines: list[str]) -> EnvError | None:
    """The base image could not be pulled: an environment problem (exit 3) with the ways out."""
    text = "\n".join(lines)
    m = _METADATA.search(text)
    if m is None or " ERROR" not in text or not _UNREACHABLE.search(text):
        return None
    error = next((ln.split(" ERROR: ", 1)[-1] for ln in lines if " ERROR" in ln), "")
    return EnvError(
        f"the base image {plan.base_image} cannot be pulled from this machine",
        facts=[f"BuildKit: load metadata for {m.group(1)}: {error[:300]}",
               f"target {plan.target} builds FROM it ({plan.flavor} flavor)"],
        hint="give the Engine a registry mirror that holds it (`registry-mirrors` in "
             "/etc/docker/daemon.json); or build another flavor on a base made here: "
             "`--flavor devel` (nvcc from NVIDIA's wheels on PyPI) or `--flavor slim` (no nvcc)"
             + ("" if plan.base == "debian-bookworm" else
                ", with `os: debian-bookworm` in the target"))
