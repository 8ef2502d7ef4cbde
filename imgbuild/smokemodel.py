"""The smoke checkpoint on the host: its recipe key, and the cache it lives in.

A smoke model is a content-addressed artifact. Its recipe is the generator's spec (scheme,
seed, sizes, the fixed texts: imgbuild/payload/smokegen.py) and the generator that runs it, named
by the generator image's content key (images/generators/smoke-model.yaml, locked like a
target). Same recipe, same key: in a local cache (`<cache>/smoke-models/<name>-<key16>`), and
in a registry as an OCI artifact tagged `smoke-model-<name>-<key16>` (pipeline/smokemodel.py
fetches it, or runs the generator image when it is nowhere). Nothing installed on the machine
imgbuild runs on enters the key.

`ensure` runs the generator in this interpreter instead: for the generator's own tests and for
work on it, with the smoke-model tooling installed (the dev venv). Builds never do.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from pathlib import Path

from .catalog.models import ModelProfile
from .errors import InputError
from .payload import smoke as payload
from .payload.smokegen import (  # noqa: F401  (the generator's names, for callers of the host side)
    PROMPTS,
    SCHEMES,
    SmokeModelSpec,
    check_nvfp4_layout,
    generate,
    library_versions,
    nvfp4_linears,
)

RECIPE_FORMAT = 1


def spec_for(profile: ModelProfile) -> SmokeModelSpec:
    """The generator's spec for a generated model profile (images/models/tiny-nvfp4.yaml)."""
    if not profile.generated:
        raise InputError(f"model '{profile.alias}' is not generated; a smoke model must be",
                         facts=[f"{profile.path} has no `generator:`"],
                         hint="point the target's smoke.model at a generated profile such as "
                              "tiny-nvfp4")
    return SmokeModelSpec(name=profile.alias, scheme=profile.generator_scheme,
                          seed=profile.generator_seed)


def recipe_key(spec: SmokeModelSpec, generator: str) -> str:
    """The smoke model's content key: its spec's key and the generator image's content key."""
    doc = {"format": RECIPE_FORMAT, "spec": spec.key(), "generator": generator}
    return hashlib.sha256(json.dumps(doc, sort_keys=True).encode()).hexdigest()


def host_key(spec: SmokeModelSpec) -> str:
    """The key of a checkpoint `ensure` generates in this interpreter: the host's tooling
    versions stand in for the generator image, so such entries never pass for a build's."""
    doc = {"format": RECIPE_FORMAT, "spec": spec.key(), "host": library_versions()}
    return hashlib.sha256(json.dumps(doc, sort_keys=True).encode()).hexdigest()


def cache_root(cache_dir: Path | None = None) -> Path:
    """cache_dir, else $IMGBUILD_CACHE, else ~/.cache/imgbuild."""
    if cache_dir is not None:
        return Path(cache_dir)
    env = os.environ.get("IMGBUILD_CACHE")
    return Path(env) if env else Path.home() / ".cache" / "imgbuild"


def cache_path(spec: SmokeModelSpec, cache_dir: Path | None = None, *,
               key: str | None = None) -> Path:
    """<cache root>/smoke-models/<name>-<key16> (key: the recipe key; default the host's)."""
    key = key or host_key(spec)
    return cache_root(cache_dir) / "smoke-models" / f"{spec.name}-{key[:16]}"


def is_complete(path: Path, spec: SmokeModelSpec, key: str | None = None) -> bool:
    """The reference is present, carries this key, and every checkpoint file it lists is there
    with its recorded sha256 (so a corrupted cache entry is made again, not shipped)."""
    ref_json = path / payload.REFERENCE_DIR / payload.REFERENCE_JSON
    try:
        ref = json.loads(ref_json.read_text())
    except (OSError, ValueError):
        return False
    if ref.get("key") != (key or host_key(spec)) or ref.get("schema") != payload.REFERENCE_SCHEMA:
        return False
    if not (path / payload.REFERENCE_DIR / payload.REFERENCE_TENSORS).is_file():
        return False
    try:
        return payload.file_manifest(path) == ref.get("files")
    except OSError:
        return False


def ensure(spec: SmokeModelSpec, cache_dir: Path | None = None) -> Path:
    """The checkpoint generated in this interpreter (host key), made on first use."""
    key = host_key(spec)
    path = cache_path(spec, cache_dir, key=key)
    if is_complete(path, spec, key):
        return path
    if path.exists():  # incomplete or corrupted: a complete entry is only ever renamed in whole
        shutil.rmtree(path)
    try:
        generate(spec, path, key=key)
    except FileExistsError:
        if not is_complete(path, spec, key):
            raise
    return path


def checkpoint_size(path: Path) -> int:
    """Bytes on disk of the checkpoint directory (reference included)."""
    return sum(p.stat().st_size for p in Path(path).rglob("*") if p.is_file())
