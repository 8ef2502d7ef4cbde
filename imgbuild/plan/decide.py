"""Making the Plan: from a target, its lock and the options, decide the CUDA, the base, the
patches and the smoke model; then the labels and the content key (plan/key.py)."""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict

from .. import smokemodel
from ..catalog.indexes import strip_credentials
from ..catalog.models import ModelProfile
from ..catalog.prune import PruneRule
from ..catalog.targets import Target
from ..errors import InputError
from ..lock import kernels
from ..lock.lockfile import Lockfile
from ..lock.resolve import ensure_lock
from ..workspace import Workspace
from . import coverage, patchset
from .key import finalize
from .plan import Plan
from .render import VENV
from .select import select


def make_plan(ws: Workspace, target_name: str, *, model: str | None = None,
              repository: str = "imgbuild", resolve: bool = True,
              archs: tuple[str, ...] | None = None, flavor: str | None = None,
              forced: bool = False, platform: str | None = None) -> Plan:
    """Compute the Plan for one platform's image (default: the target's first platform).
    Resolves (and writes) the lock only when it is missing or stale; resolve=False takes the
    committed lock as it is (CI plans what the repository pins).

    archs / flavor override the target's (`--arch`, `--flavor`); the lock does not depend on
    either, only the CUDA base and the labels do.
    """
    cat = ws.catalog
    index_platforms = cat.target(target_name).platforms
    ref = ws.target(target_name, platform)
    target = ref.target
    model = model or target.default_model
    profile: ModelProfile | None = ws.model(model) if model else None
    base = cat.base(target.os, target.cpu_arch)
    archs = tuple(dict.fromkeys(archs)) if archs else target.archs
    flavor = flavor or target.flavor
    python = target.python or base.python
    if python != base.python and not base.python_packages:
        raise InputError(
            f"target '{target.name}' asks for Python {python}, but base '{base.key}' has "
            f"only Python {base.python}",
            facts=[f"{target.path}: python: '{python}'",
                   f"images/bases.yaml: {base.key}: python: '{base.python}'"],
            hint=f"drop `python:` from {target.path} or pick a base with Python {python}")
    req = ref.request
    if not resolve:
        lock = ref.lock()
    elif ref.builtin and ref.has_lock and (shipped := ref.lock()).inputs_hash == req.inputs_hash():
        lock = shipped  # the built-in catalog's lock, read where imgbuild is installed
    else:
        lock = ensure_lock(req, ws.lock_dir(), ws.wheels)[0]
    sel = select(cat, target, archs=archs, flavor=flavor, lock=lock, model=profile)
    cov = kernel_coverage(ws, ref, lock, tuple(a for a in archs if a != "cpu"))
    serve_flags: tuple[str, ...] = ()
    if profile is not None:
        serve_flags = profile.engine_flags.get(target.engine, ())
    known = ws.patches
    pruned = [r for r in cat.prune if flavor in r.flavors and _prunes_here(r, cov)]
    gone = {(r.package, r.pattern) for r in pruned if r.package}
    draft = Plan(
        target=target.name, description=target.description, engine=target.engine,
        engine_version=target.engine_version, model=model,
        model_name=profile.name if profile else None,
        checkpoint=profile.checkpoint if profile else None,
        model_size_gb=profile.size_gb if profile else None,
        tensor_parallel=profile.tensor_parallel if profile else None, serve_flags=serve_flags,
        archs=archs, cpu_arch=target.cpu_arch, platform=target.platforms[0],
        index_platforms=index_platforms, cuda=sel.cuda, min_driver=sel.min_driver,
        selection=sel.reasoning, base=base.key, base_image=sel.base_image, base_os=base.name,
        flavor=flavor, python=python, python_packages=base.python_packages,
        platform_tag=f"{base.manylinux}_{target.cpu_arch}", uv_platform=req.uv_platform,
        lock_path=ref.display, lock_hash=lock.digest, lock_inputs=lock.inputs_hash,
        lock_packages=len(lock.packages),
        heavy_packages=tuple(f"{p.name}=={p.version}" for p in lock.packages if p.heavy),
        overrides=target.overrides, patches=target.patches,
        applied_patches=patchset.expected_applied(target.patches, lock, known)
        if target.patches else (),
        patch_digest=_patch_digest(target.patches, lock, known),
        # Patches images/patches/ knows for the locked versions, listed by the target or not:
        # the smoke test fails an image that lacks one (an affected release without its fix).
        needed_patches=patchset.expected_applied(tuple(known), lock, known),
        # Without credentials: the plan is shown, and its URLs reach the build as arguments.
        extra_index_urls=tuple(strip_credentials(u) for u in req.extra_index_urls),
        smoke_model=target.smoke_model,
        smoke_model_key=smoke_model_key(ws, target.smoke_model, resolve=resolve)
        if target.smoke_model else None,
        base_digest=_base_digest(cat, base, sel.base_image),
        spec_digest=spec_digest(target),
        repository=repository, forced=forced,
        devel_packages=base.devel_packages if sel.toolkit_dir else (),
        cuda_home=f"{VENV}/lib/python{python}/site-packages/{sel.toolkit_dir}"
        if sel.toolkit_dir else None,
        nvcc=sel.nvcc,
        prune=tuple((r.kind, r.pattern) for r in pruned),
        split_heavy=target.split_heavy_layer,
        root_only=target.root_only,
        kernel_coverage=cov.table() if cov else (),
        # A library the plan prunes is not in the image: the smoke test's kernels stage
        # checks only what is installed.
        kernel_files=tuple(dict.fromkeys((f.package, f.member, f.sha256) for f in cov.files
                                         if (f.package, f.member) not in gone)) if cov else (),
    )
    return finalize(draft, lock)


def _prunes_here(rule: PruneRule, cov: coverage.Coverage | None) -> bool:
    """A rule for a package's GPU library applies where the kernel record says none of the
    target's archs runs any of that library's code; where the record does not list the file
    (another version, another layout), the file stays."""
    if rule.package is None:
        return True
    if cov is None or not cov.archs:
        return False
    f = next((f for f in cov.files if f.package == rule.package and f.member == rule.pattern),
             None)
    return f is not None and all(coverage.status_for(f.codes, a) == "none" for a in cov.archs)


def kernel_coverage(ws: Workspace, ref, lock: Lockfile,
                    gpu_archs: tuple[str, ...]) -> coverage.Coverage | None:
    """GPU code coverage of the target's archs by its locked kernel packages (None: a CPU
    target, or an engine with no rules). Refuses (exit 2) a required package with no code
    for an arch, before anything is built."""
    rules = coverage.rules_for(ws, ref.target, gpu_archs)
    if not rules or not gpu_archs:
        return None
    record, _ = coverage.ensure_record(ref, lock, rules)
    where = ws.display(kernels.record_path(ref.lock_path))
    return coverage.judge(record, rules, gpu_archs, lock, where)


# Keys added to targets after images were built: left at their default, a spec reads as it did
# before the key existed, so that no image's content key moves for a feature it does not use.
_LATER_KEYS = {"split_heavy_layer": False, "root_only": None, "build_from_source": False}


def spec_digest(target: Target) -> str:
    """The target's spec as read (comments and key order gone), by content. Where the file lies
    is not part of it."""
    doc = asdict(target)
    doc.pop("path")
    for key, default in _LATER_KEYS.items():
        if doc.get(key) == default:
            doc.pop(key)
    return "sha256:" + hashlib.sha256(json.dumps(doc, sort_keys=True).encode()).hexdigest()


def smoke_model_key(ws: Workspace, alias: str, *, resolve: bool = True) -> str:
    """A generated model's recipe key: its spec, and the generator image that runs it (by that
    image's own Plan's content key)."""
    profile = ws.catalog.model(alias)
    spec = smokemodel.spec_for(profile)
    generator = make_plan(ws, profile.generator_image, resolve=resolve)
    return smokemodel.recipe_key(spec, generator.content_key)


def _base_digest(cat, base, image: str) -> str | None:
    """What the FROM line's bytes are: the manifest digest a pulled base is pinned by, or the
    rootfs digest a bootstrapped base's recipe records. None: only a tag (not pinned)."""
    if "@" in image:
        return image.rsplit("@", 1)[1]
    if image == base.image and base.bootstrap:
        return base.bootstrap.get("rootfs")
    return None


def _patch_digest(ids: tuple[str, ...], lock: Lockfile, known: dict) -> str | None:
    if not ids:
        return None
    files = patchset.context_files(ids, lock, known)
    return patchset.context_digest(files) if files else None
