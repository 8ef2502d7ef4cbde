"""The index Plan: a multi-platform target's images, as one OCI image index.

A target that names several platforms (`platforms: [linux/amd64, linux/arm64]`) is one image
per platform (each its own Plan, lock and content tag: `tiny-cpu-arm64-<key>`) and one index
that lists them. The index's content key hashes the platform images' keys, so it changes
exactly when one of them does; its content tag and the moving tags (`tiny-cpu`,
`tiny-cpu-transformers5.17.0`) are the index's: a client pulls them and gets its own platform.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass

from ..workspace import Workspace
from .decide import make_plan
from .key import moving_tags, tag_stem
from .plan import Plan

INDEX_FORMAT = 1


@dataclass(frozen=True)
class IndexPlan:
    target: str
    model: str | None
    repository: str
    plans: tuple[Plan, ...]  # one per platform, in the target's order
    content_key: str
    content_tag: str
    tags: tuple[str, ...]

    @property
    def platforms(self) -> tuple[str, ...]:
        return tuple(p.platform for p in self.plans)

    def ref(self, tag: str | None = None) -> str:
        return f"{self.repository}:{tag or self.content_tag}"

    @property
    def refs(self) -> tuple[str, ...]:
        return (self.ref(),) + tuple(self.ref(t) for t in self.tags)

    def plan_for(self, platform: str) -> Plan:
        return next(p for p in self.plans if p.platform == platform)

    def to_dict(self) -> dict:
        return {"target": self.target, "model": self.model, "content_key": self.content_key,
                "content_tag": self.content_tag, "refs": list(self.refs),
                "platforms": {p.platform: {"content_key": p.content_key, "ref": p.ref()}
                              for p in self.plans}}


def index_key(plans: tuple[Plan, ...]) -> str:
    """The index's content key: each platform's image key, by platform."""
    doc = {"format": INDEX_FORMAT, "platforms": {p.platform: p.content_key for p in plans}}
    return "sha256:" + hashlib.sha256(json.dumps(doc, sort_keys=True).encode()).hexdigest()


def make_index_plan(ws: Workspace, target: str, *, model: str | None = None,
                    repository: str = "imgbuild", resolve: bool = True,
                    archs: tuple[str, ...] | None = None, flavor: str | None = None,
                    forced: bool = False) -> IndexPlan:
    """Every platform's Plan of a target, and the index over them."""
    plans = tuple(make_plan(ws, target, model=model, repository=repository, resolve=resolve,
                            archs=archs, flavor=flavor, forced=forced, platform=p)
                  for p in ws.catalog.target(target).platforms)
    first = plans[0]
    key = index_key(plans)
    stem = tag_stem(first.target, first.model)
    return IndexPlan(first.target, first.model, repository, plans, key,
                     f"{stem}-{key.split(':', 1)[1][:16]}",
                     moving_tags(stem, first.engine, first.engine_version))
