"""`imgbuild [build] TARGET`: the main job as separate steps that return values.

    plan → dependency check → obtain (reuse by content tag, or build) → gate (smoke) → publish

`build_target` only sequences them and decides what to skip; each step can be called on its
own (CI's bake path builds elsewhere and calls gate and publish through `build_target` on the
image it finds by content tag).
"""

from __future__ import annotations

import os
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

from .. import smokemodel
from ..checks import drift
from ..checks.deps import check_deps
from ..errors import InputError, JobFailed
from ..image import base as base_image
from ..image import buildlock, daemon, registry, smoke
from ..image.buildkit import BuildResult, docker_build
from ..image.context import Secrets, index_flags, prepare_context
from ..lock.lockfile import Lockfile
from ..plan.decide import make_plan
from ..plan.plan import Plan
from ..progress import SILENT, Progress
from ..workspace import Workspace

T = TypeVar("T")


@dataclass(frozen=True)
class BuildOptions:
    """What the user asked `imgbuild build` for."""

    target: str
    model: str | None = None
    registry: str | None = None  # HOST[:PORT]/REPO, or a local repository name
    archs: tuple[str, ...] | None = None
    flavor: str | None = None
    push: bool = False
    rebuild: bool = False  # build even if the content tag exists
    smoke: bool = True
    force: bool = False  # move the moving tags even if the smoke test fails
    no_cache: bool = False
    log_dir: Path | None = None


@dataclass(frozen=True)
class Built:
    """The image for the plan's content tag, and how it was had."""

    action: str  # built | local | pulled
    image_id: str
    size_bytes: int
    build: BuildResult | None = None
    registry_digest: str | None = None  # when pulled: the digest the registry holds


@dataclass(frozen=True)
class Gate:
    """What the smoke gate decided: whether the moving tags may move, and why not."""

    report: smoke.SmokeReport | None
    open: bool  # the moving tags may move
    held: str | None = None  # why they may not
    forced: bool = False  # --force: they move whatever the smoke test says


@dataclass(frozen=True)
class Published:
    pushed: tuple[str, ...] = ()  # ref@digest
    moved: tuple[str, ...] = ()  # moving tags set (locally, and in the registry when pushed)
    report_ref: str | None = None


@dataclass(frozen=True)
class Outcome:
    plan: Plan
    built: Built
    gate: Gate
    published: Published
    seconds: float

    @property
    def action(self) -> str:
        return self.built.action

    def to_dict(self) -> dict:
        b, g, p = self.built, self.gate, self.published
        return {
            "target": self.plan.target, "action": b.action, "image_id": b.image_id,
            "content_tag": self.plan.ref(), "refs": list(self.plan.refs),
            "seconds": round(self.seconds, 1), "size_bytes": b.size_bytes,
            "smoke": g.report.to_dict() if g.report else None, "pushed": list(p.pushed),
            "moved": list(p.moved), "held": g.held, "report": p.report_ref,
            "build": None if b.build is None else {
                "seconds": round(b.build.seconds, 1), "steps": b.build.steps,
                "cached_steps": b.build.cached_steps},
        }


def repository(name: str | None, push: bool) -> registry.Repository:
    """The repository tags are for; pushing needs one with a registry host."""
    repo = registry.Repository.parse(name or "imgbuild")
    if push and repo.host is None:
        raise InputError("--push needs a registry",
                         facts=[f"repository '{repo.name}' names no registry host"],
                         hint="pass --registry HOST[:PORT]/REPO, e.g. "
                              "--registry 127.0.0.1:5000/imgbuild")
    return repo


def build_target(ws: Workspace, opts: BuildOptions, progress: Progress = SILENT) -> Outcome:
    start = time.monotonic()
    repo = repository(opts.registry, opts.push)
    plan = make_plan(ws, opts.target, model=opts.model, repository=repo.name, archs=opts.archs,
                     flavor=opts.flavor, forced=opts.force)
    lock = ws.target(plan.target).lock()
    # Before anything is built: a symbol the engine uses that its locked dependency lacks
    # would fail at model load, after the download. Needs no Docker, so it comes first.
    err = drift.as_error(check_deps(ws, plan.target, model=plan.model, lock=lock))
    if err is not None:
        raise err
    client = daemon.client()
    registry.check_reachable(repo)
    with buildlock.exclusive(plan.content_key, log=progress.note):
        built = obtain(ws, plan, lock, client, repo, rebuild=opts.rebuild,
                       no_cache=opts.no_cache, log_dir=opts.log_dir, progress=progress)
        gated = gate(plan, built, client, repo, run_smoke=opts.smoke, force=opts.force,
                     progress=progress)
        published = publish(plan, gated, client, repo, push=opts.push, progress=progress)
    return Outcome(plan, built, gated, published, time.monotonic() - start)


def obtain(ws: Workspace, plan: Plan, lock: Lockfile, client, repo: registry.Repository, *,
           rebuild: bool = False, no_cache: bool = False, log_dir: Path | None = None,
           progress: Progress = SILENT) -> Built:
    """The image for the content tag: already here, in the registry (pulled), or built."""
    if not rebuild:
        if (img := daemon.local_image(client, plan.ref())) is not None:
            progress.note(f"{plan.ref()} is already here: nothing to build")
            return Built("local", img.id, img.attrs.get("Size", 0))
        if repo.host and (digest := registry.manifest_digest(repo, plan.content_tag)):
            registry.pull(client, plan.ref())
            img = client.images.get(plan.ref())
            progress.note(f"{plan.ref()} found in the registry: pulled instead of building")
            return Built("pulled", img.id, img.attrs.get("Size", 0), registry_digest=digest)
    result = build_image(ws, plan, lock, client, repo, no_cache=no_cache, log_dir=log_dir,
                         progress=progress)
    img = client.images.get(plan.ref())
    return Built("built", img.id, img.attrs.get("Size", 0), result)


def build_image(ws: Workspace, plan: Plan, lock: Lockfile, client, repo: registry.Repository,
                *, no_cache: bool = False, log_dir: Path | None = None,
                progress: Progress = SILENT) -> BuildResult:
    """Base, smoke checkpoint, context, `docker build`: tags the content tag on success only."""
    os_base = ws.catalog.base(plan.base)
    if plan.base_image == os_base.image:  # a devel image's nvidia/cuda base is pulled as usual
        base_image.ensure_local(client, os_base, repo if repo.host else None)
    smoke_dir = None
    if plan.smoke_model:
        spec = smokemodel.spec_for(ws.catalog.model(plan.smoke_model))
        smoke_dir = _quietly(lambda: smokemodel.ensure(spec), progress,
                             f"smoke model {plan.smoke_model} ({plan.smoke_model_key[:12]})")
    with tempfile.TemporaryDirectory(prefix="imgbuild-ctx-") as td:
        ctx = Path(td)
        carried = prepare_context(plan, lock, ctx, wheels=ws.wheels, smoke_model_dir=smoke_dir,
                                  patches=ws.patches)
        flags = index_flags(plan, bool(carried))
        log_path = (log_dir / f"{plan.content_tag}.build.log") if log_dir else None
        try:
            return docker_build(plan, ctx, secrets=Secrets.from_host(), flags=flags,
                                progress=progress, log_path=log_path, no_cache=no_cache)
        except JobFailed as e:
            unreachable = [u for u in plan.extra_index_urls
                           if any(f"Failed to fetch: {u}" in ln for ln in e.log_tail)]
            if unreachable and not carried:
                e.hint = (f"{unreachable[0]} is out of reach from the build; a local "
                          "directory holding the same wheels can stand in for it: "
                          "--wheels DIR (or IMGBUILD_WHEELS)")
            raise


def gate(plan: Plan, built: Built, client, repo: registry.Repository, *, run_smoke: bool = True,
         force: bool = False, progress: Progress = SILENT) -> Gate:
    """Smoke-test the image (or take the report the registry stores for a pulled one) and
    decide whether its moving tags may move. A failed smoke test moves the content tag aside
    (`…-smoke-failed`) and raises, unless forced."""
    report = None
    stored = registry.fetch_report(repo, built.registry_digest) \
        if built.action == "pulled" and built.registry_digest else None
    if stored is not None:
        report = smoke.SmokeReport(plan.ref(), bool(stored.get("ok")),
                                   tuple(stored.get("stages", [])), 0.0, stored)
    elif run_smoke and plan.smoke_model:
        report = smoke.run(plan.ref())
    if report is None:
        held = "no smoke test ran (--no-smoke)" if plan.smoke_model else \
            "the target has no smoke model"
        if force:
            return Gate(None, True, None, forced=True)
        progress.note(f"moving tags not moved: {held}")
        return Gate(None, False, held)
    if report.ok:
        return Gate(report, True, forced=force)
    facts = [f"{s_['name']}: {s_['status']}: {s_.get('reason') or ''}" for s_ in report.stages]
    if not force:
        # The content tag must not claim a finished, good image: move it aside.
        failed_ref = plan.ref(plan.content_tag + "-smoke-failed")
        client.images.get(plan.ref()).tag(*failed_ref.rsplit(":", 1))
        client.images.remove(plan.ref())
        raise JobFailed(f"smoke test failed for {plan.target}; no tag was moved", facts=facts,
                        hint=f"the image is kept as {failed_ref} to inspect; "
                             f"`imgbuild smoke {failed_ref}` reruns the check")
    progress.note(f"FORCED: the smoke test FAILED for {plan.ref()} and --force moves its tags "
                  "anyway; the image is labelled io.imgbuild.smoke-gate=forced", level="warn")
    return Gate(report, True, None, forced=True)


def publish(plan: Plan, gated: Gate, client, repo: registry.Repository, *, push: bool = False,
            progress: Progress = SILENT) -> Published:
    """Push the content tag first, then the report that refers to its digest, then move the
    moving tags: a moving tag never points at something the registry does not fully hold, nor
    at an image without a passing report."""
    img = client.images.get(plan.ref())
    pushed: list[str] = []
    report_ref = None
    if push:
        progress.note(f"pushing {plan.ref()}")
        digest = registry.push(client, plan.ref())
        pushed.append(f"{plan.ref()}@{digest}")
        if gated.report is not None:
            report_ref = f"{repo.name}:" + registry.push_report(
                repo, digest, gated.report.to_dict() | {"ok": gated.report.ok,
                                                         "forced": gated.forced})
    moved: list[str] = []
    if gated.open:
        for t in plan.tags:
            img.tag(plan.repository, t)
            moved.append(plan.ref(t))
            if push:
                pushed.append(f"{plan.ref(t)}@{registry.push(client, plan.ref(t))}")
    return Published(tuple(pushed), tuple(moved), report_ref)


def _quietly(fn: Callable[[], T], progress: Progress, what: str) -> T:
    """Run fn with its stdout/stderr (llmcompressor's progress bars) sent to a log file."""
    with tempfile.NamedTemporaryFile("w+", prefix="imgbuild-smokegen-", suffix=".log",
                                     delete=False) as f:
        sys.stdout.flush()
        sys.stderr.flush()
        saved = os.dup(1), os.dup(2)
        os.dup2(f.fileno(), 1)
        os.dup2(f.fileno(), 2)
        t0 = time.monotonic()
        try:
            return fn()
        except Exception as e:
            raise JobFailed(f"could not make {what}", facts=[f"{type(e).__name__}: {e}"],
                            hint=f"its output is in {f.name}") from None
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
            os.dup2(saved[0], 1)
            os.dup2(saved[1], 2)
            os.close(saved[0])
            os.close(saved[1])
            progress.note(f"{what}: ready in {time.monotonic() - t0:.1f} s")
