"""The content key: one hash over everything that decides an image's bytes, computed here and
nowhere else. Same inputs, same key, same content tag: an image is never built twice."""

from __future__ import annotations

import hashlib
import json
from dataclasses import replace

from ..lock.lockfile import Lockfile
from . import render
from .labels import labels
from .plan import Plan

PLAN_FORMAT = 2


def key_document(plan: Plan, lock: Lockfile) -> dict:
    """What the key hashes: declared inputs only (`plan` already carries its labels).

    The target's spec, the lock (its pins and hashes: not where it lies, not uv's comments),
    the patch layer's files, the payload, the base by digest, the smoke model's recipe, and the
    Dockerfile rendered from them. Nothing of the machine imgbuild runs on: no path, no
    environment variable, no installed package, no credential.
    """
    return {
        "format": PLAN_FORMAT,
        "spec": plan.spec_digest,
        "dockerfile": render.dockerfile(plan),
        # Context files that land in layers, by content. Wheels are covered by the lock's
        # hashes and uv by nothing: it runs at build time and leaves no bytes in the image.
        "lock": lock.digest,
        "payload": render.payload_digest(),
        "entrypoint": render.entrypoint_sh(),
        "facts": render.image_facts(plan),
        "smoke_model": plan.smoke_model_key,
        "patches": plan.patch_digest,
        "base": {"image": plan.base_image, "digest": plan.base_digest},
    }


def finalize(draft: Plan, lock: Lockfile) -> Plan:
    """Attach labels, the content key and the tags."""
    with_labels = replace(draft, labels=tuple(sorted(labels(draft).items())))
    key = hashlib.sha256(json.dumps(key_document(with_labels, lock),
                                    sort_keys=True).encode()).hexdigest()
    stem = tag_stem(draft.target, draft.model)
    if len(draft.index_platforms) > 1:
        # One manifest of an index: its content tag names its arch, and the moving tags are
        # the index's (plan/index.py), so no tag claims one platform for all of them.
        arch = draft.platform.split("/", 1)[1]
        return replace(with_labels, content_key=f"sha256:{key}",
                       content_tag=f"{stem}-{arch}-{key[:16]}", tags=())
    return replace(with_labels, content_key=f"sha256:{key}", content_tag=f"{stem}-{key[:16]}",
                   tags=moving_tags(stem, draft.engine, draft.engine_version))


def tag_stem(target: str, model: str | None) -> str:
    return target + (f"-{model}" if model else "")


def moving_tags(stem: str, engine: str, engine_version: str) -> tuple[str, ...]:
    """The tags that follow the newest good image: the target's name, and with the engine's
    version."""
    return (stem, f"{stem}-{engine}{engine_version}")
