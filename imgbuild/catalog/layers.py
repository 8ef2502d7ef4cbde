"""The catalog's layers, and targets that extend others.

The catalog is read from one or more images/ directories, lowest first: the one built into
imgbuild, then the user's project. A name in a higher layer shadows the same name below it
(said once by `plan`); a target may name another with `extends:` and give only what differs.
Both are settled here, on the files' raw mappings, before any target is validated, so a
target reads the same to the rest of imgbuild however it was written.
"""

from __future__ import annotations

import difflib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from packaging.requirements import InvalidRequirement, Requirement
from packaging.utils import canonicalize_name

from ..errors import SpecError

BUILTIN = "built-in"
PROJECT = "project"


@dataclass(frozen=True)
class Layer:
    images: Path
    label: str  # BUILTIN or PROJECT

    def where(self, rel_path: str, layered: bool) -> str:
        """A file as provenance names it: its path under the layer, and the layer when there
        is more than one (the same path may be in both)."""
        return f"{rel_path} ({self.label})" if layered else rel_path


@dataclass(frozen=True)
class RawTarget:
    name: str
    path: str  # relative, for messages: images/<name>.yaml
    data: Any
    layer: int


def _req_name(text: Any) -> str:
    try:
        return canonicalize_name(Requirement(str(text)).name)
    except InvalidRequirement:
        return str(text)  # parse_target says what is wrong with it, naming the file


# Lists merged entry by entry, each entry known by a name: a child gives one pin or one
# override and keeps the parent's others. `patches` adds to the parent's. Mappings (`engine`,
# `smoke`) merge key by key, so `engine: {version: ...}` moves only the version. Anything else
# a child gives replaces the parent's value whole.
_BY_NAME: dict[str, Callable[[Any], str]] = {
    "requirements": _req_name,
    "overrides": lambda o: _req_name(o.get("requirement")) if isinstance(o, dict) else str(o),
    "indexes": lambda ix: str(ix.get("name")) if isinstance(ix, dict) else str(ix),
}
_ADDED = {"patches"}
_MAPPINGS = {"engine", "smoke"}


def _entries(key: str, value: Any) -> list[str] | None:
    """The provenance keys a field's entries get (`requirements[torch]`), or None: the field is
    one value."""
    if key in _BY_NAME and isinstance(value, list):
        return [f"{key}[{_BY_NAME[key](v)}]" for v in value]
    if key in _ADDED and isinstance(value, list):
        return [f"{key}[{v}]" for v in value]
    if key in _MAPPINGS and isinstance(value, dict):
        return [f"{key}.{k}" for k in value]
    return None


def _provenance(data: dict, where: str) -> dict[str, str]:
    out: dict[str, str] = {}
    for k, v in data.items():
        if k == "extends":
            continue
        for e in _entries(k, v) or [k]:
            out[e] = where
    return out


def merge(parent: dict, parent_prov: dict[str, str], child: dict,
          where: str) -> tuple[dict, dict[str, str]]:
    """The child's mapping over its parent's, and which file each field (or entry) came from."""
    out, prov = dict(parent), dict(parent_prov)
    for k, v in child.items():
        if k == "extends":
            continue
        old = out.get(k)
        if k in _BY_NAME and isinstance(v, list) and isinstance(old, list):
            name = _BY_NAME[k]
            merged = list(old)
            at = {name(x): i for i, x in enumerate(merged)}
            for item in v:
                n = name(item)
                if n in at:
                    merged[at[n]] = item
                else:
                    at[n] = len(merged)
                    merged.append(item)
                prov[f"{k}[{n}]"] = where
            out[k] = merged
        elif k in _ADDED and isinstance(v, list) and isinstance(old, list):
            out[k] = old + [p for p in v if p not in old]
            for p in v:
                prov.setdefault(f"{k}[{p}]", where)
        elif k in _MAPPINGS and isinstance(v, dict) and isinstance(old, dict):
            out[k] = {**old, **v}
            for sk in v:
                prov[f"{k}.{sk}"] = where
        else:
            out[k] = v
            for p in [p for p in prov if p == k or p.startswith((f"{k}[", f"{k}."))]:
                del prov[p]
            for e in _entries(k, v) or [k]:
                prov[e] = where
    return out, prov


def resolve_targets(layers: list[Layer], raw: list[dict[str, RawTarget]]
                    ) -> dict[str, tuple[RawTarget, dict, dict[str, str]]]:
    """Each visible target (the highest layer's of each name) with `extends:` resolved: its
    mapping as if written out whole, and the provenance of each field.

    A parent is looked for in the target's own layer and those below it, highest first; a
    target that extends its own name extends the one it shadows."""
    layered = len(layers) > 1
    done: dict[tuple[str, int], tuple[dict, dict[str, str]]] = {}

    def find(name: str, top: int) -> RawTarget | None:
        for i in range(top, -1, -1):
            if name in raw[i]:
                return raw[i][name]
        return None

    def one(t: RawTarget, chain: tuple[RawTarget, ...]) -> tuple[dict, dict[str, str]]:
        key = (t.name, t.layer)
        if key in done:
            return done[key]
        where = layers[t.layer].where(t.path, layered)
        if not isinstance(t.data, dict) or "extends" not in t.data:
            got = (t.data, _provenance(t.data, where) if isinstance(t.data, dict) else {})
            done[key] = got
            return got
        parent_name = t.data["extends"]
        if not isinstance(parent_name, str) or not parent_name:
            raise SpecError(t.path, "extends", "the name of a target to start from", parent_name)
        top = t.layer - 1 if parent_name == t.name else t.layer
        parent = find(parent_name, top)
        if parent is None and parent_name == t.name:
            raise SpecError(t.path, "extends", "another target's name (a target extends its own "
                            "name only to change the built-in one it shadows, and there is no "
                            f"built-in '{t.name}')", parent_name,
                            hint="name the target to start from (see `imgbuild list`)")
        if parent is None:
            known = sorted({n for i in range(top + 1) for n in raw[i]} - {t.name})
            close = difflib.get_close_matches(parent_name, known, n=1)
            raise SpecError(t.path, "extends", "a target of the catalog: " + ", ".join(known),
                            parent_name,
                            hint=f"did you mean '{close[0]}'?" if close else "see `imgbuild list`")
        if any((c.name, c.layer) == (parent.name, parent.layer) for c in (*chain, t)):
            loop = " -> ".join(f"{c.name} ({c.path})" for c in (*chain, t, parent)
                               if c is not None)
            raise SpecError(t.path, "extends", "a chain of targets that ends (no cycle)",
                            loop, hint="remove `extends:` from one of them")
        p_data, p_prov = one(parent, (*chain, t))
        if not isinstance(p_data, dict):
            return t.data, {}
        got = merge(p_data, p_prov, t.data, where)
        got[1]["extends"] = where
        done[key] = got
        return got

    visible: dict[str, RawTarget] = {}
    for layer in raw:
        visible.update(layer)
    return {name: (t, *one(t, ())) for name, t in visible.items()}
