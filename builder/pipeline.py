"""The main job, stage after stage: plan, lock, build (or reuse), smoke, tag, push.

Each stage is its own module; this one only sequences them and decides what to skip.
"""

from __future__ import annotations

import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from . import base as base_mod
from . import build as build_mod
from . import buildlock, dockerenv, drift, registry, smoke
from .deps import check_deps
from .errors import InputError, JobFailed
from .lock import read_lock
from .plan import Plan, make_plan
from .spec import Catalog


@dataclass(frozen=True)
class Outcome:
    plan: Plan
    action: str  # built | local | pulled
    image_id: str
    seconds: float
    size_bytes: int
    smoke: smoke.SmokeReport | None = None
    pushed: tuple[str, ...] = ()  # ref@digest
    build: build_mod.BuildResult | None = None
    moved: tuple[str, ...] = ()  # moving tags set (locally, and in the registry when pushed)
    held: str | None = None  # why the moving tags were not moved
    report_ref: str | None = None

    def to_dict(self) -> dict:
        return {
            "target": self.plan.target, "action": self.action, "image_id": self.image_id,
            "content_tag": self.plan.ref(), "refs": list(self.plan.refs),
            "seconds": round(self.seconds, 1), "size_bytes": self.size_bytes,
            "smoke": self.smoke.to_dict() if self.smoke else None, "pushed": list(self.pushed),
            "moved": list(self.moved), "held": self.held, "report": self.report_ref,
            "build": None if self.build is None else {
                "seconds": round(self.build.seconds, 1), "steps": self.build.steps,
                "cached_steps": self.build.cached_steps},
        }


def _repo(name: str | None, push: bool) -> registry.Repository:
    repo = registry.Repository.parse(name or "imgbuild")
    if push and repo.host is None:
        raise InputError("--push needs a registry", facts=[f"repository '{repo.name}' names no registry host"],
                         hint="pass --registry HOST[:PORT]/REPO, e.g. --registry 127.0.0.1:5000/imgbuild")
    return repo


def build_target(cat: Catalog, target: str, *, model: str | None, registry_name: str | None,
                 archs: tuple[str, ...] | None = None, flavor: str | None = None,
                 push: bool, rebuild: bool, wheels: Path | None, lock_dir: Path,
                 run_smoke: bool = True, console=None, log=print,
                 log_dir: Path | None = None, no_cache: bool = False,
                 force: bool = False) -> Outcome:
    start = time.monotonic()
    repo = _repo(registry_name, push)
    plan = make_plan(cat, target, model=model, lock_dir=lock_dir, wheels=wheels,
                     repository=repo.name, archs=archs, flavor=flavor, forced=force)
    lock = read_lock(lock_dir / Path(plan.lock_path).name)
    # Before anything is built: a symbol the engine uses that its locked dependency lacks
    # would fail at model load, after the download. Needs no Docker, so it comes first.
    err = drift.as_error(check_deps(cat, target, model=plan.model, lock_dir=lock_dir, lock=lock))
    if err is not None:
        raise err
    client = dockerenv.client()
    registry.check_reachable(repo)
    with buildlock.exclusive(plan.content_key, log=log):
        return _build_locked(cat, plan, lock, client, repo, push=push, rebuild=rebuild,
                             wheels=wheels, run_smoke=run_smoke, console=console, log=log,
                             log_dir=log_dir, no_cache=no_cache, force=force, start=start)


def _build_locked(cat: Catalog, plan: Plan, lock, client, repo: registry.Repository, *,
                  push: bool, rebuild: bool, wheels: Path | None, run_smoke: bool, console, log,
                  log_dir: Path | None, no_cache: bool, force: bool, start: float) -> Outcome:
    from docker.errors import ImageNotFound

    img = None
    action = "built"
    result = None
    report = None
    if not rebuild:
        try:
            img = client.images.get(plan.ref())
            action = "local"
            log(f"{plan.ref()} is already here: nothing to build")
        except ImageNotFound:
            img = None
        if img is None and repo.host and registry.manifest_digest(repo, plan.content_tag):
            registry.pull(client, plan.ref())
            img = client.images.get(plan.ref())
            action = "pulled"
            log(f"{plan.ref()} found in the registry: pulled instead of building")
    if img is None:
        os_base = cat.base(plan.base)
        if plan.base_image == os_base.image:  # a devel image's nvidia/cuda base is pulled as usual
            base_mod.ensure_local(client, os_base, repo if repo.host else None)
        smoke_dir = None
        if plan.smoke_model:
            from .plan import smoke_model_spec
            from .smokemodel import ensure

            spec = smoke_model_spec(cat.model(plan.smoke_model))
            smoke_dir = _quietly(lambda: ensure(spec), log,
                                 f"smoke model {plan.smoke_model} ({plan.smoke_model_key[:12]})")
        with tempfile.TemporaryDirectory(prefix="imgbuild-ctx-") as td:
            ctx = Path(td)
            carried = build_mod.prepare_context(plan, lock, ctx, wheels=wheels,
                                                smoke_model_dir=smoke_dir)
            flags = build_mod.index_flags(plan, bool(carried))
            log_path = (log_dir / f"{plan.content_tag}.build.log") if log_dir else None
            try:
                result = build_mod.docker_build(plan, ctx, secrets=build_mod.Secrets.from_host(),
                                                flags=flags, console=console, log_path=log_path,
                                                no_cache=no_cache)
            except JobFailed as e:
                unreachable = [u for u in plan.extra_index_urls
                               if any(f"Failed to fetch: {u}" in ln for ln in e.log_tail)]
                if unreachable and not carried:
                    e.hint = (f"{unreachable[0]} is out of reach from the build; a local "
                              "directory holding the same wheels can stand in for it: "
                              "--wheels DIR (or IMGBUILD_WHEELS)")
                raise
        img = client.images.get(plan.ref())
    stored = registry.fetch_report(repo, registry.manifest_digest(repo, plan.content_tag)) \
        if action == "pulled" else None
    if stored is not None:
        report = smoke.SmokeReport(plan.ref(), bool(stored.get("ok")),
                                   tuple(stored.get("stages", [])), 0.0, stored)
    elif run_smoke and plan.smoke_model:
        report = smoke.run(plan.ref())
    if report is not None and not report.ok:
        facts = [f"{s_['name']}: {s_['status']}: {s_.get('reason') or ''}" for s_ in report.stages]
        if not force:
            # The content tag must not claim a finished, good image: move it aside.
            failed_ref = plan.ref(plan.content_tag + "-smoke-failed")
            img.tag(*failed_ref.rsplit(":", 1))
            client.images.remove(plan.ref())
            raise JobFailed(
                f"smoke test failed for {plan.target}; no tag was moved", facts=facts,
                hint=f"the image is kept as {failed_ref} to inspect; "
                     f"`imgbuild smoke {failed_ref}` reruns the check")
        log(f"[bold red]FORCED[/]: the smoke test FAILED for {plan.ref()} and --force moves "
            "its tags anyway; the image is labelled io.imgbuild.smoke-gate=forced")
    gate_ok = report is not None and (report.ok or force)
    held = None if gate_ok else (
        "no smoke test ran (--no-smoke)" if plan.smoke_model else "the target has no smoke model")
    if not gate_ok and force:
        gate_ok, held = True, None
    pushed: list[str] = []
    report_ref = None
    if push:
        # The content tag first, then the report that refers to its digest, then the moving
        # tags: a moving tag never points at something the registry does not fully hold, nor
        # at an image without a passing report.
        digest = registry.push(client, plan.ref())
        pushed.append(f"{plan.ref()}@{digest}")
        if report is not None:
            report_ref = f"{repo.name}:" + registry.push_report(
                repo, digest, report.to_dict() | {"ok": report.ok, "forced": force})
    moved: list[str] = []
    if gate_ok:
        for t in plan.tags:
            img.tag(plan.repository, t)
            moved.append(plan.ref(t))
            if push:
                pushed.append(f"{plan.ref(t)}@{registry.push(client, plan.ref(t))}")
    elif held:
        log(f"moving tags not moved: {held}")
    img.reload()
    return Outcome(plan, action, img.id, time.monotonic() - start, img.attrs.get("Size", 0),
                   report, tuple(pushed), result, tuple(moved), held, report_ref)


def _quietly(fn, log, what: str):
    """Run fn with its stdout/stderr (llmcompressor's progress bars) sent to a log file."""
    import os
    import sys

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
            log(f"{what}: ready in {time.monotonic() - t0:.1f} s")


@dataclass(frozen=True)
class PullOutcome:
    plan: Plan
    ref: str
    digest: str
    registry_digest: str
    report: dict | None = None

    def to_dict(self) -> dict:
        return {"target": self.plan.target, "ref": self.ref, "digest": self.digest,
                "registry_digest": self.registry_digest, "refs": list(self.plan.refs),
                "smoke_report": self.report}


def pull_target(cat: Catalog, target: str, *, model: str | None, registry_name: str,
                lock_dir: Path, wheels: Path | None, archs: tuple[str, ...] | None = None,
                flavor: str | None = None) -> PullOutcome:
    repo = _repo(registry_name, True)
    client = dockerenv.client()
    registry.check_reachable(repo)
    plan = make_plan(cat, target, model=model, lock_dir=lock_dir, wheels=wheels,
                     repository=repo.name, archs=archs, flavor=flavor)
    want = registry.manifest_digest(repo, plan.content_tag)
    if want is None:
        raise JobFailed(f"no image for {plan.target} in {repo.name}",
                        facts=[f"content tag {plan.content_tag} is not in the registry"],
                        hint=f"build and push it: `imgbuild {target} --push --registry {repo.name}`")
    got = registry.pull(client, plan.ref())
    if got != want:
        raise JobFailed(f"pulled {plan.ref()} by digest {got}, but the registry holds {want}",
                        hint="the tag moved during the pull; pull again")
    img = client.images.get(plan.ref())
    report = registry.fetch_report(repo, got)
    if report is not None and (report.get("ok") or report.get("forced")):
        for t in plan.tags:
            img.tag(plan.repository, t)
    return PullOutcome(plan, plan.ref(), got, want, report)
