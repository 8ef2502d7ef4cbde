"""What an image manifest must be before a registry is given it, and what `verify` checks of
one a registry holds: plain data in, the problems out, in words.

A registry keeps whatever manifest it is sent, as long as the blobs it names exist. One whose
config is not this image's config (the image's own manifest, uploaded as a config blob, say)
or whose layers are not the config's diff ids is accepted, tagged and served, and every later
pull fails ("number of layers and diffIDs don't match"). So before any manifest PUT
the push checks, on what it holds in hand:

- the config is an image config (rootfs of type `layers`, an os and an architecture) and the
  manifest names it by its own digest and size;
- the config's `rootfs.diff_ids` are the layers' diff ids, in number and in order, where each
  diff id is the one hashed from the layer's bytes (sent now, or when the blob was cached) or
  read from the registry's own record of that blob;
- each layer's digest and size in the manifest are what was sent or found.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Sequence
from dataclasses import dataclass

# fullmatch, not match with $: "$" also matches before a final newline, which a registry
# would store as part of the diff id.
DIGEST = re.compile(r"sha256:[0-9a-f]{64}")


@dataclass(frozen=True)
class LayerFact:
    """One layer as the push knows it: the blob the registry holds, and the diff id of its
    uncompressed tar (None where nothing was hashed: `verify` downloads no layer)."""

    digest: str
    size: int
    diff_id: str | None
    # sent | cached | found (the registry held it) | mounted (from another repository of the
    # registry) | registry (read by verify)
    how: str


def config_problems(config: bytes) -> list[str]:
    """Why `config` is not an image config; [] when it is one."""
    try:
        doc = json.loads(config)
    except ValueError:
        return ["the config is not JSON"]
    if not isinstance(doc, dict):
        return ["the config is not a JSON object"]
    rootfs = doc.get("rootfs")
    if not isinstance(rootfs, dict) or rootfs.get("type") != "layers" \
            or not isinstance(rootfs.get("diff_ids"), list):
        kind = ("an image manifest" if "layers" in doc and "config" in doc else
                "an image index" if "manifests" in doc else "another document")
        return [f"the config is not an image config: it is {kind} "
                f"(keys: {', '.join(sorted(doc)) or 'none'})"]
    out = []
    if not doc.get("os") or not doc.get("architecture"):
        out.append("the config names no os and architecture")
    bad = [d for d in rootfs["diff_ids"] if not isinstance(d, str) or not DIGEST.fullmatch(d)]
    if bad:
        out.append(f"the config's rootfs.diff_ids hold {len(bad)} entries that are not "
                   "sha256 digests")
    return out


def diff_ids(config: bytes) -> list[str]:
    """The config's rootfs.diff_ids ([] where it has none)."""
    try:
        return list(((json.loads(config) or {}).get("rootfs") or {}).get("diff_ids") or [])
    except (ValueError, AttributeError):
        return []


def check(manifest: dict, config: bytes, layers: Sequence[LayerFact]) -> list[str]:
    """The problems of publishing `manifest` with this config and these layers ([]: none)."""
    out = config_problems(config)
    desc = manifest.get("config") or {}
    got = "sha256:" + hashlib.sha256(config).hexdigest()
    if desc.get("digest") != got:
        out.append(f"the manifest names config {str(desc.get('digest'))[:19]}…, the config "
                   f"in hand is {got[:19]}…")
    if desc.get("size") != len(config):
        out.append(f"the manifest gives the config {desc.get('size')} bytes, it has "
                   f"{len(config)}")
    if out and out[0].startswith("the config is not"):
        return out  # no diff ids to compare with
    ids = diff_ids(config)
    named = manifest.get("layers") or []
    if not (len(ids) == len(named) == len(layers)):
        out.append(f"the config lists {len(ids)} diff ids, the manifest {len(named)} layers, "
                   f"and {len(layers)} layers were sent or found")
    for i, (d, entry, fact) in enumerate(zip(ids, named, layers)):
        if fact.diff_id is not None and fact.diff_id != d:
            out.append(f"layer {i}: the config says {d[:19]}…, the layer {fact.how} hashes to "
                       f"{fact.diff_id[:19]}…")
        if entry.get("digest") != fact.digest or entry.get("size") != fact.size:
            out.append(f"layer {i}: the manifest names {str(entry.get('digest'))[:19]}… "
                       f"({entry.get('size')} bytes), the blob {fact.how} is "
                       f"{fact.digest[:19]}… ({fact.size} bytes)")
    return out
