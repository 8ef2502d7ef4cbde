"""The CI matrix: one job per target and platform, for an existing CI engine to run.

imgbuild does not schedule builds; GitHub Actions (or Buildx Bake on a BuildKit fleet) does.
This module turns images/ into what those engines read:

- `jobs()`: one job per target and platform (its CPU arch and GPU archs, its default model or
  none), each with the Plan's content key. With `changed_since=REF` only the jobs whose
  content key (or patch files) differ from the same job computed from REF's images/ and
  lockfiles/.
- `github()`: a `strategy.matrix` value (`{"include": [...]}`), with the runner each job needs:
  a GPU runner labelled with its CPU arch and the GPU arch it smoke-tests on, or a hosted CPU
  runner of the platform's arch (arm64 builds natively on `ubuntu-24.04-arm`).
- `bake()`: a Buildx Bake file (JSON) with one target per job: the Dockerfile imgbuild renders
  (`dockerfile-inline`), the content tag, the labels `imgbuild build` sets, the build argument,
  the platform; groups per engine and `default`.

Why one job per target and not per GPU arch: a target is one image whose kernels cover all
its archs (sm100 and sm120 in the same wheels); per-arch jobs would build the same bytes twice
and race for the same tags. The platform is the real variant: another lock, another base,
another runner. A target that names several platforms gets a job per platform, each pushing
its own content tag; the workflow's `index` job assembles their OCI image index after all of
them passed (`imgbuild index`), which is when the target's moving tags move.

How CI uses the bake file: Bake builds and pushes the *content tag* only; the context each
target names is assembled by imgbuild (`write_contexts`: the lock in two parts, uv, the
payload, the smoke checkpoint, carried wheels: the same files `imgbuild build` uses), then
`docker buildx bake -f bake.json --push`. With a registry host in the repository, each
target reads the inline cache of its images there (`cache-from`: content tag, moving tags) and
writes its own into the image it pushes (`cache-to: type=inline`), so a fresh runner reuses
the previous image's heavy layer on an engine bump. The moving tags are not in the bake file
on purpose: they move only after a passing smoke report, which `imgbuild build TARGET --push
--registry R` does next on a runner of the job's kind (it finds the image by its content tag in
the registry instead of building it, smoke-tests it, stores the report and moves the tags).
"""

from __future__ import annotations

import hashlib
import io
import re
import shutil
import subprocess
import tarfile
import tempfile
from dataclasses import dataclass, field, replace
from pathlib import Path

from ..errors import ImgbuildError, InputError
from ..image import daemon, registry
from ..image.context import index_flags, local_wheels, prepare_context
from ..lock.wheels import mirror_index
from ..pipeline.smokemodel import smoke_model
from ..plan import render
from ..plan.decide import make_plan
from ..plan.labels import LABEL_NS
from ..plan.plan import Plan
from ..workspace import Workspace

DEFAULT_CONTEXT_DIR = "imgbuild-contexts"
NO_PREVIOUS_COMMIT = "0" * 40  # what GitHub sends as `before` for a new branch
CPU_RUNNERS = {"x86_64": "ubuntu-latest", "aarch64": "ubuntu-24.04-arm"}
RUNNER_ARCH = {"x86_64": "x64", "aarch64": "arm64"}
_BAKE_NAME = re.compile(r"^[a-zA-Z0-9_-]+$")


@dataclass(frozen=True)
class Job:
    name: str  # a CI- and Bake-safe id: target[-model], dots as underscores
    target: str
    model: str | None
    engine: str
    engine_version: str
    archs: tuple[str, ...]
    cpu_arch: str
    platform: str  # linux/arm64: the image this job builds
    multi_platform: bool  # one of several platforms: the `index` job assembles them after
    gpu: bool
    smoke_arch: str | None  # the GPU arch the job's runner has
    content_key: str
    content_tag: str
    refs: tuple[str, ...]  # content tag first, then the moving tags
    lock: str
    base_image: str
    flavor: str
    smoke_model: str | None
    changed: str | None = None  # with changed_since: why the job is in the list
    plan: Plan | None = field(default=None, compare=False, repr=False)

    @property
    def runner(self) -> str | list[str]:
        if not self.gpu:
            return CPU_RUNNERS[self.cpu_arch]
        return ["self-hosted", "linux", RUNNER_ARCH[self.cpu_arch], "gpu", self.smoke_arch or "gpu"]

    def to_dict(self) -> dict:
        return {"name": self.name, "target": self.target, "model": self.model,
                "engine": self.engine, "engine_version": self.engine_version,
                "archs": list(self.archs), "cpu_arch": self.cpu_arch, "platform": self.platform,
                "multi_platform": self.multi_platform,
                "gpu": self.gpu, "smoke_arch": self.smoke_arch, "runner": self.runner,
                "content_key": self.content_key, "content_tag": self.content_tag,
                "refs": list(self.refs), "lock": self.lock, "base_image": self.base_image,
                "flavor": self.flavor, "smoke_model": self.smoke_model, "changed": self.changed}


def job_name(target: str, model: str | None, platform: str | None = None) -> str:
    """target[-model][-arch]: the arch only for one platform of several."""
    arch = f"-{platform.split('/', 1)[1]}" if platform else ""
    return re.sub(r"[^a-zA-Z0-9_-]", "_", target + (f"-{model}" if model else "") + arch)


def _job(ws: Workspace, name: str, repository: str, platform: str) -> Job:
    t = ws.catalog.target(name)
    # resolve=False: CI builds what the repository pins; a missing lock is an error that says so.
    plan = make_plan(ws, name, model=t.default_model, resolve=False, repository=repository,
                     platform=platform)
    gpu = plan.archs != ("cpu",)
    return Job(name=job_name(plan.target, plan.model,
                             platform if t.multi_platform else None),
               target=plan.target, model=plan.model,
               engine=plan.engine, engine_version=plan.engine_version, archs=plan.archs,
               cpu_arch=plan.cpu_arch, platform=plan.platform,
               multi_platform=t.multi_platform, gpu=gpu, smoke_arch=plan.archs[0] if gpu else None,
               content_key=plan.content_key, content_tag=plan.content_tag, refs=plan.refs,
               lock=plan.lock_path, base_image=plan.base_image, flavor=plan.flavor,
               smoke_model=plan.smoke_model, plan=plan)


def jobs(ws: Workspace, *, changed_since: str | None = None,
         repository: str = "imgbuild") -> list[Job]:
    """Every target's job, from the committed locks (nothing is resolved).

    changed_since: a git ref; keep the jobs whose content key or patch files differ from the
    same job computed from the ref's images/ and lockfiles/ (with this checkout's imgbuild, so
    a change of imgbuild itself does not rebuild everything: only spec, lock, patch and base
    changes count). A target new since the ref, or one the ref cannot plan, is kept.
    """
    out = [_job(ws, n, repository, p) for n in sorted(ws.catalog.targets)
           for p in ws.catalog.target(n).platforms]
    if changed_since is None:
        return out
    if changed_since.strip("0") == "":
        return [_with(j, "no previous commit: every job") for j in out]
    return _changed(ws, out, changed_since, repository)


def _with(j: Job, why: str) -> Job:
    return replace(j, changed=why)


# --- changed since a git ref ------------------------------------------------------------------

def _git(root: Path, *args: str, binary: bool = False) -> subprocess.CompletedProcess:
    try:
        return subprocess.run(["git", "-C", str(root), *args], capture_output=True,
                              text=not binary, timeout=120)
    except FileNotFoundError:
        raise InputError("--changed-since needs git, which is not installed",
                         hint="install git, or leave --changed-since out") from None


def _repo_rel(path: Path, top: Path, what: str) -> str:
    try:
        return str(path.resolve().relative_to(top))
    except ValueError:
        raise InputError(f"{what} {path} is not inside the git checkout at {top}",
                         hint="--changed-since compares files the repository tracks") from None


def patch_digest(images: Path, patches: tuple[str, ...]) -> str:
    """The bytes of a target's patch files (images/patches/NAME.yaml, NAME.diff, NAME/**)."""
    h = hashlib.sha256()
    pdir = images / "patches"
    for name in patches:
        files = [p for p in (pdir / f"{name}.yaml", pdir / f"{name}.diff") if p.is_file()]
        if (pdir / name).is_dir():
            files += sorted(p for p in (pdir / name).rglob("*") if p.is_file())
        for p in files:
            h.update(str(p.relative_to(pdir)).encode() + b"\0" + p.read_bytes() + b"\0")
    return h.hexdigest()


def _changed(ws: Workspace, current: list[Job], ref: str, repository: str) -> list[Job]:
    top_p = _git(ws.images, "rev-parse", "--show-toplevel")
    if top_p.returncode != 0:
        raise InputError(f"--changed-since {ref}: {ws.images} is not in a git checkout",
                         facts=[top_p.stderr.strip()[:200]])
    top = Path(top_p.stdout.strip()).resolve()
    if _git(top, "rev-parse", "--verify", "--quiet", f"{ref}^{{commit}}").returncode != 0:
        raise InputError(f"--changed-since {ref}: no such commit in this checkout",
                         hint="fetch more history (actions/checkout with fetch-depth: 0), or "
                              "leave --changed-since out to list every job")
    images_rel = _repo_rel(ws.images, top, "images/")
    locks_rel = _repo_rel(ws.lockfiles, top, "lockfiles/")
    present = [p for p in (images_rel, locks_rel)
               if _git(top, "cat-file", "-e", f"{ref}:{p}").returncode == 0]
    if images_rel not in present:
        return [_with(j, f"{images_rel}/ does not exist at {ref}") for j in current]
    with tempfile.TemporaryDirectory(prefix="imgbuild-ref-") as td:
        arch = _git(top, "archive", "--format=tar", ref, "--", *present, binary=True)
        if arch.returncode != 0:
            raise InputError(f"--changed-since {ref}: git archive failed",
                             facts=[arch.stderr.decode(errors="replace").strip()[:300]])
        try:
            with tarfile.open(fileobj=io.BytesIO(arch.stdout)) as tf:
                # "data": a committed link that points outside images/ (or an absolute one)
                # is refused, not followed out of the scratch directory.
                tf.extractall(td, filter="data")
        except tarfile.FilterError as e:
            raise InputError(f"--changed-since {ref}: {images_rel}/ or {locks_rel}/ at {ref} "
                             f"holds a file imgbuild will not unpack", facts=[str(e)],
                             hint="a spec or lock is a plain file; remove the link from the "
                                  "commit, or leave --changed-since out") from None
        # The same layers as now: a project at REF over the built-in catalog installed now.
        old = Workspace(Path(td) / images_rel, Path(td) / locks_rel, base=ws.base)
        try:
            old.catalog  # noqa: B018  (loads and validates it)
        except ImgbuildError as e:
            return [_with(j, f"images/ at {ref} does not load: {e.message}") for j in current]
        out = []
        for j in current:
            why = _why_changed(ws, old, j, ref, repository)
            if why:
                out.append(_with(j, why))
        return out


def _why_changed(ws: Workspace, old_ws: Workspace, j: Job, ref: str,
                 repository: str) -> str | None:
    if j.target not in old_ws.catalog.targets:
        return f"new since {ref}"
    if j.platform not in old_ws.catalog.target(j.target).platforms:
        return f"platform {j.platform} new since {ref}"
    try:
        old = make_plan(old_ws, j.target, model=j.model, resolve=False, repository=repository,
                        platform=j.platform)
    except ImgbuildError as e:
        return f"cannot be planned at {ref}: {e.message}"
    if old.content_key != j.content_key:
        what = [k for k, a, b in (("lock", old.lock_hash, j.plan.lock_hash),
                                  ("engine", old.engine_version, j.engine_version),
                                  ("base", old.base_image, j.base_image),
                                  ("archs", old.archs, j.archs),
                                  ("patches", old.patches, j.plan.patches)) if a != b]
        return f"content key changed since {ref}" + (f" ({', '.join(what)})" if what else "")
    if patch_digest(old_ws.images, old.patches) != patch_digest(ws.images, j.plan.patches):
        return f"patch files changed since {ref}"
    return None


# --- GitHub Actions ---------------------------------------------------------------------------

def github(job_list: list[Job]) -> dict:
    """`strategy.matrix` for GitHub Actions: `matrix: ${{ fromJSON(needs.matrix.outputs.matrix) }}`.

    Values are what the workflow's steps read: the target, the model ("" for none), whether
    the job needs a GPU, and the runner (`runs-on: ${{ matrix.runner }}`).
    """
    return {"include": [{
        "name": j.name, "target": j.target, "model": j.model or "", "engine": j.engine,
        "engine_version": j.engine_version, "archs": ",".join(j.archs), "platform": j.platform,
        "multi_platform": j.multi_platform,
        "gpu": j.gpu, "smoke_arch": j.smoke_arch or "", "runner": j.runner,
        "content_tag": j.content_tag, **({"changed": j.changed} if j.changed else {}),
    } for j in job_list]}


# --- Buildx Bake ------------------------------------------------------------------------------

def bake(job_list: list[Job], ws: Workspace, *, context_dir: str = DEFAULT_CONTEXT_DIR) -> dict:
    """A Bake file (JSON form): one target per job, groups per engine and `default`.

    The contexts are `<context_dir>/<job name>`, written by `write_contexts()`. With `wheels`
    (the workspace's wheel directory, standing in for a target's extra index), the build
    argument says to install from the context's wheelhouse, as `imgbuild build --wheels` does.
    """
    targets: dict[str, dict] = {}
    groups: dict[str, list[str]] = {}
    for j in job_list:
        plan = _plan(j)
        carried = bool(ws.wheels) and bool(local_wheels(ws.target(j.target, j.platform).lock(),
                                                        ws.wheels))
        labels = dict(plan.labels) | {f"{LABEL_NS}.content-key": plan.content_key}
        targets[j.name] = {
            "context": f"{context_dir.rstrip('/')}/{j.name}",
            "dockerfile-inline": render.dockerfile(plan),
            "tags": [plan.ref()],
            "labels": labels,
            "args": {"IMGBUILD_INDEX_FLAGS": index_flags(plan, carried, mirror_index())},
            "platforms": [j.platform],
            **bake_cache(plan),
        }
        groups.setdefault(j.engine, []).append(j.name)
    out_groups = {"default": {"targets": list(targets)}}
    for engine, names in sorted(groups.items()):
        gname = engine if engine not in targets and engine != "default" else f"engine-{engine}"
        out_groups[gname] = {"targets": names}
    return {"group": out_groups, "target": targets}


def bake_cache(plan: Plan) -> dict[str, list[str]]:
    """Where a fresh runner's BuildKit finds the layers it may reuse: the inline cache of this
    target's images in the registry (its content tag, for a rerun; its moving tags, the
    previous image, for an engine bump that keeps the heavy layer; its cache tag, which
    `imgbuild build --push` keeps on the newest image carrying the heavy steps' results).
    `cache-to: inline` writes that cache into the image Bake pushes. Nothing without a
    registry host to read it from."""
    if registry.Repository.parse(plan.repository).host is None:
        return {}
    return {"cache-from": [f"type=registry,ref={r}"
                           for r in (*plan.refs, plan.ref(plan.cache_tag))],
            "cache-to": ["type=inline"]}


def _plan(j: Job) -> Plan:
    if j.plan is None:
        raise InputError(f"job {j.name} carries no plan", hint="make jobs with matrix.jobs()")
    return j.plan


def write_contexts(job_list: list[Job], ws: Workspace, dest: Path, *,
                   repository: str = "imgbuild") -> dict[str, Path]:
    """Assemble each job's build context under dest/<job name>, as `imgbuild build` does.

    The smoke checkpoint is made (or read from the cache) first: it lands in the image.
    """
    out: dict[str, Path] = {}
    for j in job_list:
        plan = _plan(j)
        smoke_dir = None
        if plan.smoke_model:
            # By its recipe key: the cache, the registry, or the pinned generator image.
            smoke_dir = smoke_model(ws, plan.smoke_model, plan.smoke_model_key, daemon.client(),
                                    registry.repository(repository, False))
        ctx = dest / j.name
        if ctx.exists():
            shutil.rmtree(ctx)
        ctx.mkdir(parents=True)
        prepare_context(plan, ws.target(j.target, j.platform).lock(), ctx, wheels=ws.wheels,
                        smoke_model_dir=smoke_dir, patches=ws.patches)
        out[j.name] = ctx
    return out


# --- checking a Bake file ---------------------------------------------------------------------

# The attributes of a Bake target (docs.docker.com/build/bake/reference/#target).
BAKE_TARGET_ATTRS = {
    "args": dict, "annotations": list, "attest": list, "cache-from": list, "cache-to": list,
    "call": str, "context": str, "contexts": dict, "description": str, "dockerfile": str,
    "dockerfile-inline": str, "entitlements": list, "extra-hosts": dict, "inherits": list,
    "labels": dict, "matrix": dict, "name": str, "network": str, "no-cache": bool,
    "no-cache-filter": list, "output": list, "platforms": list, "pull": bool, "secret": list,
    "shm-size": str, "ssh": list, "tags": list, "target": str, "ulimits": list,
}
_TAG = re.compile(r"^(?:[a-zA-Z0-9.-]+(?::\d+)?/)?[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*"
                  r"(?:/[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*)*:[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}$")
_PLATFORM = re.compile(r"^linux/(amd64|arm64|arm/v7|ppc64le|s390x|riscv64)$")
# An image reference: a tag, a digest, or both (cache-from/cache-to `ref=`).
_REF = re.compile(r"^(?:[a-zA-Z0-9.-]+(?::\d+)?/)?[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*"
                  r"(?:/[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*)*"
                  r"(?::[A-Za-z0-9_][A-Za-z0-9_.-]{0,127})?(?:@sha256:[a-f0-9]{64})?$")
# The cache backends and the attribute each needs (docs.docker.com/build/cache/backends/):
# to import (cache-from), and to export (cache-to). inline exports only: it is read back
# through type=registry.
_CACHE_NEEDS = {"cache-from": {"registry": "ref", "local": "src", "gha": None, "s3": None,
                               "azblob": None},
                "cache-to": {"registry": "ref", "local": "dest", "inline": None, "gha": None,
                             "s3": None, "azblob": None}}


def _cache_problems(where: str, attr: str, entry: str) -> list[str]:
    """One cache-from/cache-to entry: `type=T,key=value,...`, or a bare image reference
    (short for type=registry,ref=REF)."""
    if "=" not in entry:
        return [] if _REF.match(entry) else [f"{where}: {attr} {entry!r} is not an image "
                                             "reference nor type=...,key=value"]
    pairs = [kv.split("=", 1) for kv in entry.split(",")]
    if any(len(kv) != 2 or not kv[0] for kv in pairs):
        return [f"{where}: {attr} {entry!r} is not a list of key=value"]
    fields = dict(pairs)
    kind = fields.get("type", "registry")
    if kind not in _CACHE_NEEDS[attr]:
        return [f"{where}: {attr} type {kind!r} is not one of "
                f"{', '.join(sorted(_CACHE_NEEDS[attr]))}"]
    need = _CACHE_NEEDS[attr][kind]
    if need and need not in fields:
        return [f"{where}: {attr} type={kind} needs {need}="]
    if need == "ref" and not _REF.match(fields["ref"]):
        return [f"{where}: {attr} ref {fields['ref']!r} is not a valid image reference"]
    return []


def check_bake(doc: dict) -> list[str]:
    """Problems with a Bake JSON document, by Bake's file format; [] when it is well formed.

    Used where `docker buildx bake --print` cannot run (no buildx plugin): every key known to
    Bake with the type Bake reads, names Bake accepts, tags Docker accepts, groups that name
    existing targets.
    """
    problems: list[str] = []
    if not isinstance(doc, dict):
        return ["the document is not a JSON object"]
    for k in doc:
        if k not in ("group", "target", "variable", "function"):
            problems.append(f"unknown top-level block {k!r}")
    targets = doc.get("target") or {}
    groups = doc.get("group") or {}
    if not isinstance(targets, dict) or not targets:
        return problems + ["no targets"]
    for name, t in targets.items():
        where = f"target {name!r}"
        if not _BAKE_NAME.match(name):
            problems.append(f"{where}: name must match {_BAKE_NAME.pattern}")
        if not isinstance(t, dict):
            problems.append(f"{where}: not an object")
            continue
        for k, v in t.items():
            typ = BAKE_TARGET_ATTRS.get(k)
            if typ is None:
                problems.append(f"{where}: unknown attribute {k!r}")
            elif not isinstance(v, typ) or (typ is not bool and isinstance(v, bool)):
                problems.append(f"{where}: {k} must be {typ.__name__}, got {type(v).__name__}")
            elif typ is list and not all(isinstance(x, str) for x in v):
                problems.append(f"{where}: {k} must be a list of strings")
            elif typ is dict and k in ("args", "labels", "contexts") and not all(
                    isinstance(a, str) and isinstance(b, str) for a, b in v.items()):
                problems.append(f"{where}: {k} must map strings to strings")
        if "dockerfile" in t and "dockerfile-inline" in t:
            problems.append(f"{where}: both dockerfile and dockerfile-inline")
        inline = t.get("dockerfile-inline")
        if isinstance(inline, str) and not re.search(r"^FROM \S+", inline, re.M):
            problems.append(f"{where}: dockerfile-inline has no FROM")
        for tag in t.get("tags", []) if isinstance(t.get("tags"), list) else []:
            if not isinstance(tag, str) or not _TAG.match(tag):
                problems.append(f"{where}: {tag!r} is not a valid image reference")
        for attr in ("cache-from", "cache-to"):
            for entry in t.get(attr, []) if isinstance(t.get(attr), list) else []:
                if isinstance(entry, str):
                    problems += _cache_problems(where, attr, entry)
        for p in t.get("platforms", []) if isinstance(t.get("platforms"), list) else []:
            if not isinstance(p, str) or not _PLATFORM.match(p):
                problems.append(f"{where}: platform {p!r} is not os/arch")
        if "context" not in t:
            problems.append(f"{where}: no context")
    if not isinstance(groups, dict):
        return problems + ["group must be an object"]
    for name, g in groups.items():
        where = f"group {name!r}"
        if not _BAKE_NAME.match(name):
            problems.append(f"{where}: name must match {_BAKE_NAME.pattern}")
        if name in targets:
            problems.append(f"{where}: a target has the same name")
        if not isinstance(g, dict) or not isinstance(g.get("targets"), list):
            problems.append(f"{where}: needs a list of targets")
            continue
        for k in g:
            if k not in ("targets", "description", "name"):
                problems.append(f"{where}: unknown attribute {k!r}")
        for ref in g["targets"]:
            if ref not in targets and ref not in groups:
                problems.append(f"{where}: names {ref!r}, which is neither a target nor a group")
    return problems


def document(ws: Workspace, fmt: str, *, changed_since: str | None = None,
             repository: str = "imgbuild", contexts: Path | None = None) -> dict:
    """`imgbuild matrix --format github|bake|json`: the document CI reads (with bake and
    `contexts`, each job's build context is written there too)."""
    job_list = jobs(ws, changed_since=changed_since, repository=repository)
    if fmt == "github":
        return github(job_list)
    if fmt == "bake":
        if contexts is not None:
            write_contexts(job_list, ws, contexts, repository=repository)
        return bake(job_list, ws)
    return {"jobs": [j.to_dict() for j in job_list]}
