"""The Plan: one immutable value computed from the spec and the options.

Everything downstream (render, build, smoke, publish) reads the Plan and nothing else; its
content key hashes everything that determines the image's bytes, so the same inputs always
give the same content tag and an image is never built twice.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

from . import patches, render
from .errors import InputError
from .lock import Lockfile, LockRequest, ensure_lock, read_lock
from .spec import Catalog, ModelProfile, Override, Target

PLAN_FORMAT = 1
LABEL_NS = "io.imgbuild"


@dataclass(frozen=True)
class Plan:
    target: str
    description: str
    engine: str
    engine_version: str
    model: str | None
    model_name: str | None
    checkpoint: str | None
    model_size_gb: float | None
    tensor_parallel: int | None
    serve_flags: tuple[str, ...]
    archs: tuple[str, ...]
    cpu_arch: str
    cuda: str | None
    min_driver: str | None
    selection: tuple[str, ...]  # why this CUDA and base: the reasoning `plan` shows
    base: str  # the OS key in images/bases.yaml
    base_image: str
    base_os: str
    flavor: str
    python: str
    python_packages: tuple[str, ...]
    platform_tag: str  # manylinux_2_36_x86_64: what wheels the image can take
    uv_platform: str  # the same, as uv's --python-platform spells it
    lock_path: str
    lock_hash: str
    lock_inputs: str
    lock_packages: int
    heavy_packages: tuple[str, ...]
    overrides: tuple[Override, ...]
    patches: tuple[str, ...]  # what the target lists
    applied_patches: tuple[str, ...]  # those that cover the locked version: the patch layer
    needed_patches: tuple[str, ...]  # every known patch that covers a locked version
    patch_digest: str | None  # the patch layer's files, by content (None: no patch layer)
    extra_index_urls: tuple[str, ...]
    smoke_model: str | None
    smoke_model_key: str | None
    repository: str
    forced: bool = False  # --force: moving tags move even if the smoke test fails
    content_key: str = ""
    content_tag: str = ""
    tags: tuple[str, ...] = ()
    labels: tuple[tuple[str, str], ...] = field(default=())

    def ref(self, tag: str | None = None) -> str:
        return f"{self.repository}:{tag or self.content_tag}"

    @property
    def refs(self) -> tuple[str, ...]:
        """Every tag the image gets: the content tag first, then the moving ones."""
        return (self.ref(),) + tuple(self.ref(t) for t in self.tags)

    def to_dict(self) -> dict:
        d = asdict(self)
        d["overrides"] = [asdict(o) for o in self.overrides]
        d["labels"] = dict(self.labels)
        d["refs"] = list(self.refs)
        return d


def uv_platform(cpu_arch: str, glibc: str) -> str:
    major, minor = glibc.split(".")
    return f"{cpu_arch}-manylinux_{major}_{minor}"


def lock_request(cat: Catalog, target: Target) -> LockRequest:
    base = cat.base(target.os)
    python = target.python or base.python
    reqs = (target.engine_requirement,) + target.requirements
    return LockRequest(
        target=target.name, python=python, uv_platform=uv_platform(target.cpu_arch, base.glibc),
        requirements=reqs, overrides=tuple(o.requirement for o in target.overrides),
        extra_index_urls=tuple(ix.url for ix in target.indexes),
    )


def _needed_patches(lock: Lockfile) -> tuple[str, ...]:
    """Patches images/patches/ knows for the locked versions, listed by the target or not:
    the smoke test fails an image that lacks one (an affected release without its fix)."""
    return patches.expected_applied(tuple(patches.load_patches()), lock)


def _patch_digest(ids: tuple[str, ...], lock: Lockfile) -> str | None:
    if not ids:
        return None
    files = patches.context_files(ids, lock)
    return patches.context_digest(files) if files else None


def smoke_model_spec(profile: ModelProfile):
    """The generator's spec for a generated model profile (tiny-nvfp4)."""
    from .smokemodel import SmokeModelSpec

    if not profile.generated:
        raise InputError(f"model '{profile.alias}' is not generated; a smoke model must be",
                         facts=[f"{profile.path} has no `generator:`"],
                         hint="point the target's smoke.model at a generated profile such as tiny-nvfp4")
    return SmokeModelSpec(name=profile.alias, scheme=profile.generator_scheme,
                          seed=profile.generator_seed)


def _smoke_key(cat: Catalog, target: Target) -> str | None:
    if not target.smoke_model:
        return None
    return smoke_model_spec(cat.model(target.smoke_model)).key()


def make_plan(cat: Catalog, target_name: str, *, model: str | None = None,
              lock_dir: Path, wheels: Path | None = None, repository: str = "imgbuild",
              resolve: bool = True, archs: tuple[str, ...] | None = None,
              flavor: str | None = None, forced: bool = False) -> Plan:
    """Compute the Plan. Resolves (and writes) the lock only when it is missing or stale.

    archs / flavor override the target's (`--arch`, `--flavor`); the lock does not depend on
    either, only the CUDA base and the labels do.
    """
    from .select import select

    target = cat.target(target_name)
    model = model or target.default_model
    profile: ModelProfile | None = cat.model(model) if model else None
    base = cat.base(target.os)
    archs = tuple(dict.fromkeys(archs)) if archs else target.archs
    flavor = flavor or target.flavor
    python = target.python or base.python
    if python != base.python and not base.python_packages:
        raise InputError(
            f"target '{target.name}' asks for Python {python}, but base '{base.key}' has "
            f"only Python {base.python}",
            facts=[f"{target.path}: python: '{python}'", f"images/bases.yaml: {base.key}: python: '{base.python}'"],
            hint=f"drop `python:` from {target.path} or pick a base with Python {python}")
    req = lock_request(cat, target)
    if resolve:
        lock, _ = ensure_lock(req, lock_dir, wheels)
    else:
        lock = read_lock(lock_dir / req.filename())
    sel = select(cat, target, archs=archs, flavor=flavor, lock=lock, model=profile)
    serve_flags: tuple[str, ...] = ()
    if profile is not None:
        serve_flags = profile.engine_flags.get(target.engine, ())
    draft = Plan(
        target=target.name, description=target.description, engine=target.engine,
        engine_version=target.engine_version, model=model,
        model_name=profile.name if profile else None,
        checkpoint=profile.checkpoint if profile else None,
        model_size_gb=profile.size_gb if profile else None,
        tensor_parallel=profile.tensor_parallel if profile else None, serve_flags=serve_flags,
        archs=archs, cpu_arch=target.cpu_arch, cuda=sel.cuda, min_driver=sel.min_driver,
        selection=sel.reasoning, base=base.key, base_image=sel.base_image, base_os=base.name,
        flavor=flavor, python=python, python_packages=base.python_packages,
        platform_tag=f"{base.manylinux}_{target.cpu_arch}", uv_platform=req.uv_platform,
        lock_path=_display_path(lock.path, lock_dir), lock_hash=lock.digest, lock_inputs=lock.inputs_hash,
        lock_packages=len(lock.packages),
        heavy_packages=tuple(f"{p.name}=={p.version}" for p in lock.packages if p.heavy),
        overrides=target.overrides, patches=target.patches,
        applied_patches=patches.expected_applied(target.patches, lock) if target.patches else (),
        patch_digest=_patch_digest(target.patches, lock),
        needed_patches=_needed_patches(lock),
        extra_index_urls=req.extra_index_urls, smoke_model=target.smoke_model,
        smoke_model_key=_smoke_key(cat, target), repository=repository, forced=forced,
    )
    return finalize(draft, lock)


def finalize(draft: Plan, lock: Lockfile) -> Plan:
    """Attach labels, the content key and the tags."""
    labels = {
        "org.opencontainers.image.title": f"imgbuild {draft.target}",
        "org.opencontainers.image.description": draft.description[:200],
        "org.opencontainers.image.base.name": draft.base_image,
        "org.opencontainers.image.vendor": "imgbuild",
        f"{LABEL_NS}.target": draft.target,
        f"{LABEL_NS}.engine": f"{draft.engine}=={draft.engine_version}",
        f"{LABEL_NS}.archs": ",".join(draft.archs),
        f"{LABEL_NS}.cuda": draft.cuda or "none",
        f"{LABEL_NS}.driver-min": draft.min_driver or "none",
        f"{LABEL_NS}.flavor": draft.flavor,
        f"{LABEL_NS}.python": draft.python,
        f"{LABEL_NS}.platform": draft.platform_tag,
        f"{LABEL_NS}.lock.hash": draft.lock_hash,
        f"{LABEL_NS}.patches": ",".join(draft.applied_patches) or "none",
        f"{LABEL_NS}.model": draft.model or "none",
        f"{LABEL_NS}.model-size-gb": f"{draft.model_size_gb:g}" if draft.model_size_gb else "none",
        f"{LABEL_NS}.tp": str(draft.tensor_parallel or "none"),
        f"{LABEL_NS}.smoke-model": draft.smoke_model_key or "none",
        # A forced image says so in its own metadata, and gets a content key of its own.
        f"{LABEL_NS}.smoke-gate": "forced" if draft.forced else "required",
    }
    with_labels = replace(draft, labels=tuple(sorted(labels.items())))
    dockerfile = render.dockerfile(with_labels)
    key_doc = {
        "format": PLAN_FORMAT,
        "dockerfile": dockerfile,
        # Context files that land in layers, by content. Wheels are covered by the lock's
        # hashes and uv by nothing: it runs at build time and leaves no bytes in the image.
        "lock": lock.body_hash,
        "payload": render.payload_digest(),
        "entrypoint": render.entrypoint_sh(),
        "facts": render.image_facts(with_labels),
        "smoke_model": draft.smoke_model_key,
        "patches": draft.patch_digest,
    }
    key = hashlib.sha256(json.dumps(key_doc, sort_keys=True).encode()).hexdigest()
    stem = draft.target + (f"-{draft.model}" if draft.model else "")
    tags = (stem, f"{stem}-{draft.engine}{draft.engine_version}")
    return replace(with_labels, content_key=f"sha256:{key}", content_tag=f"{stem}-{key[:16]}",
                   tags=tags)


def _display_path(p: Path, lock_dir: Path) -> str:
    """lockfiles/NAME when the lock lies in a checkout's lockfiles/, else the full path."""
    if lock_dir.resolve() == (Path(__file__).resolve().parent.parent / "lockfiles"):
        return f"lockfiles/{p.name}"
    return str(p)
