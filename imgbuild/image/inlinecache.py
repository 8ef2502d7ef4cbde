"""What an image's inline build cache lets a fresh builder skip.

Every image is built with BUILDKIT_INLINE_CACHE=1: its config carries BuildKit's cache records
(`moby.buildkit.cache.v0`), each naming the layer that holds a step's result. A builder with an
empty cache that reads the image (--cache-from) can skip a step only where the record has that
result. The Engine 20.10's BuildKit leaves out the results of steps that it took from an
imported cache rather than ran (moby/buildkit#1981, #1992): an engine-only bump that reused the
heavy layer from the registry carries no result for it, so the bump after it on a fresh runner
installs torch and the CUDA wheels again, every second time. The build keeps a tag of its own
on the last image that carries the heavy steps' results (pipeline/build.py), and reads it.
"""

from __future__ import annotations

import base64
import binascii
import json

from ..plan.render import ASSETS, HEAVY_LAYERS

CONFIG_KEY = "moby.buildkit.cache.v0"

# The lock parts the heavy install steps read (render.py): one step, or one per heavy layer.
_HEAVY_PARTS = ("heavy", *HEAVY_LAYERS)


def cached_layers(config: dict) -> frozenset[int]:
    """Indexes into rootfs.diff_ids whose step results the inline cache carries; empty when
    the image has none or it cannot be read (no result is then assumed)."""
    raw = config.get(CONFIG_KEY)
    if not raw:
        return frozenset()
    try:
        doc = json.loads(base64.b64decode(raw))
    except (binascii.Error, ValueError):
        return frozenset()
    # 20.10 writes a list of records with "layers"; later BuildKit {"records": [...]} with
    # "results".
    records = doc.get("records", []) if isinstance(doc, dict) else doc
    out = set()
    for rec in records if isinstance(records, list) else ():
        for res in (rec.get("layers") or rec.get("results") or ()) if isinstance(rec, dict) else ():
            if isinstance(res, dict) and isinstance(res.get("layer"), int):
                out.add(res["layer"])
    return frozenset(out)


def heavy_layers(config: dict) -> tuple[int, ...]:
    """Indexes into rootfs.diff_ids of the layers the heavy install steps made (from the
    config's history: one entry per step, the layer-making ones in layer order)."""
    made = [h for h in config.get("history", []) if not h.get("empty_layer")]
    marks = tuple(f"-r {ASSETS}/{part}.txt" for part in _HEAVY_PARTS)
    return tuple(i for i, h in enumerate(made)
                 if any(m in h.get("created_by", "") for m in marks))


def carries_heavy(config: dict) -> bool:
    """True when a fresh builder reading this image can skip every heavy install step."""
    return set(heavy_layers(config)) <= cached_layers(config)
