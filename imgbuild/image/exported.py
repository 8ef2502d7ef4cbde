"""The image as `docker save` lays it out, read as plain data: which blob is the config, which
are the layers, in which compression, for which diff id.

Three layouts, by Engine and image store:

- Docker Engine 20.10: the legacy layout (`<v1 id>/layer.tar`, `<image id>.json`): layers are
  uncompressed tars known only once hashed (image/wire.py reads it as it streams).
- Engine >= 25, classic store: an OCI layout whose layers are uncompressed tars named by their
  diff id, and whose config's digest is the image id.
- The containerd image store (Engine 29's default, Docker Desktop's since 4.34): an OCI layout
  whose layers are the compressed blobs of the Engine's content store, named by their
  compressed digest; the image id is the digest of a manifest or of an index (BuildKit adds a
  provenance attestation manifest beside the platform's), reached from index.json. The blobs
  come sorted by name, index.json after them: the mapping from a blob to its diff id is known
  only at the end of the stream.

`resolve` walks from index.json (or from a digest) to the platform's manifest and config, each
document checked against its digest, the config's diff ids matched to the manifest's layers by
position.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from dataclasses import dataclass

from .compression import kind_of

OCI_INDEX = "application/vnd.oci.image.index.v1+json"
DOCKER_LIST = "application/vnd.docker.distribution.manifest.list.v2+json"
ATTESTATION = "attestation-manifest"


class LayoutError(ValueError):
    """The layout does not hold a readable image for the platform (the message says what)."""


@dataclass(frozen=True)
class LayerBlob:
    """One layer of the image as the layout holds it."""

    digest: str  # the blob's digest: its name in the layout (compressed, where it is)
    size: int
    media_type: str
    diff_id: str  # the config's, at this layer's position

    @property
    def kind(self) -> str:
        """gzip | zstd | tar: the blob's compression."""
        return kind_of(self.media_type)


@dataclass(frozen=True)
class Exported:
    """The platform's image in the layout: its manifest, its config, its layers."""

    root: str  # the digest the walk started from (the image id under the containerd store)
    manifest_digest: str
    config_digest: str
    config_media_type: str
    config: bytes
    layers: tuple[LayerBlob, ...]
    docs: tuple[tuple[str, bytes], ...]  # every document read on the way, by digest

    def by_digest(self) -> dict[str, LayerBlob]:
        return {la.digest: la for la in self.layers}

    @property
    def diff_ids(self) -> tuple[str, ...]:
        return tuple(la.diff_id for la in self.layers)


def digest_of(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


def _doc(blob: Callable[[str], bytes | None], digest: str, what: str) -> tuple[bytes, dict]:
    data = blob(digest)
    if data is None:
        raise LayoutError(f"{what} {digest[:19]}… is not in the layout")
    if digest_of(data) != digest:
        raise LayoutError(f"{what} {digest[:19]}… does not hash to its name")
    try:
        doc = json.loads(data)
    except ValueError:
        raise LayoutError(f"{what} {digest[:19]}… is not JSON") from None
    if not isinstance(doc, dict):
        raise LayoutError(f"{what} {digest[:19]}… is not a JSON object")
    return data, doc


def is_index(doc: dict) -> bool:
    return doc.get("mediaType") in (OCI_INDEX, DOCKER_LIST) or (
        "manifests" in doc and "layers" not in doc)


def platform_entry(doc: dict, platform: str) -> dict | None:
    """The index's entry for `platform` ("linux/amd64"), attestation manifests left aside."""
    os_, _, arch = platform.partition("/")
    for m in doc.get("manifests") or []:
        if (m.get("annotations") or {}).get("vnd.docker.reference.type") == ATTESTATION:
            continue
        p = m.get("platform") or {}
        if p.get("os") == os_ and p.get("architecture") == arch:
            return m
    return None


def top_entry(index_json: bytes, image_id: str) -> str:
    """The digest index.json names for the saved image: the entry that is `image_id`, or its
    only entry."""
    try:
        doc = json.loads(index_json)
        entries = [m["digest"] for m in doc.get("manifests") or []]
    except (ValueError, AttributeError, KeyError, TypeError):
        raise LayoutError("index.json is not an OCI index") from None
    if image_id in entries:
        return image_id
    if len(entries) == 1:
        return entries[0]
    raise LayoutError(f"index.json names {len(entries)} images, none of them {image_id[:19]}…")


def resolve(root: str, blob: Callable[[str], bytes | None], platform: str) -> Exported:
    """The platform's image reached from document `root` (an index, a manifest): every
    document checked against its digest, the config's diff ids matched to the layers."""
    docs: list[tuple[str, bytes]] = []
    digest = root
    for _ in range(4):  # an index, a nested index, the manifest
        data, doc = _doc(blob, digest, "document")
        docs.append((digest, data))
        if not is_index(doc):
            break
        entry = platform_entry(doc, platform)
        if entry is None:
            found = sorted({f"{(m.get('platform') or {}).get('os')}/"
                            f"{(m.get('platform') or {}).get('architecture')}"
                            for m in doc.get("manifests") or []})
            raise LayoutError(f"the image holds no {platform} manifest "
                              f"(it has: {', '.join(found) or 'none'})")
        digest = entry["digest"]
    else:
        raise LayoutError("indexes nested deeper than the layout allows")
    if "config" not in doc or "layers" not in doc:
        raise LayoutError(f"document {digest[:19]}… is neither an index nor an image manifest")
    cdesc = doc["config"]
    config = blob(cdesc["digest"])
    if config is None:
        raise LayoutError(f"the config {cdesc['digest'][:19]}… is not in the layout")
    if digest_of(config) != cdesc["digest"] or len(config) != cdesc.get("size", len(config)):
        raise LayoutError(f"the config {cdesc['digest'][:19]}… does not hash to its name")
    docs.append((cdesc["digest"], config))
    try:
        ids = list(json.loads(config)["rootfs"]["diff_ids"])
    except (ValueError, KeyError, TypeError):
        raise LayoutError(f"the config {cdesc['digest'][:19]}… is not an image config") \
            from None
    layers = doc["layers"]
    if len(ids) != len(layers):
        raise LayoutError(f"the manifest {digest[:19]}… has {len(layers)} layers, its config "
                          f"{len(ids)} diff ids")
    return Exported(root, digest, cdesc["digest"],
                    cdesc.get("mediaType", "application/vnd.oci.image.config.v1+json"),
                    config,
                    tuple(LayerBlob(la["digest"], int(la["size"]), la.get("mediaType", ""), d)
                          for la, d in zip(layers, ids)),
                    tuple(docs))
