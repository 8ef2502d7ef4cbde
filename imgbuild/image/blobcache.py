"""This machine's copies of the compressed layers and image configs it pushed, by diff id and
compression: the next push of the same layer, to another registry or repository (a mirror, a
test registry, a registry whose storage was wiped), sends these bytes again instead of
exporting the image from the Engine and compressing it a second time.

Why it is sound: a layer's diff id names its uncompressed tar; imgbuild's compressors give the
same bytes for the same tar (image/compression.py), so a cached blob, kept under its
compressor's recipe (compression, level, library and version), is the blob a fresh compression
would send, digest included. Each entry is checked against its recorded digest
before it is used; one that does not match is dropped and the layer is compressed again.

Bounded: IMGBUILD_BLOB_CACHE_GB (default 8; 0 turns it off), the least recently used entries
going first. It lives under imgbuild's cache root (IMGBUILD_CACHE), beside the others.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import IO

from ..lock.wheels import cache_root

DEFAULT_GB = 8.0
READ_CHUNK = 1 << 20


@dataclass(frozen=True)
class Cached:
    """A compressed layer kept here: its blob digest and size, and the tar size it came from."""

    path: Path
    digest: str
    size: int
    tar_size: int | None


def limit_bytes() -> int:
    raw = os.environ.get("IMGBUILD_BLOB_CACHE_GB", "").strip()
    try:
        gb = float(raw) if raw else DEFAULT_GB
    except ValueError:
        gb = DEFAULT_GB
    return max(0, int(gb * 1e9))


def enabled() -> bool:
    return limit_bytes() > 0


def _root() -> Path:
    return cache_root() / "blobs"


def _layer_path(recipe: str, diff_id: str) -> Path:
    return _root() / "layers" / recipe / diff_id.replace(":", "-")


def _config_path(image_id: str) -> Path:
    return _root() / "configs" / image_id.replace(":", "-")


def _sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(READ_CHUNK):
            h.update(chunk)
    return "sha256:" + h.hexdigest()


def layer(recipe: str, diff_id: str) -> Cached | None:
    """The cached blob of `diff_id` by compressor `recipe`, checked against its digest (None: none kept, or
    one that no longer matches, which is dropped)."""
    if not enabled():
        return None
    path = _layer_path(recipe, diff_id)
    try:
        meta = json.loads(path.with_suffix(".json").read_text())
        cached = Cached(path, str(meta["digest"]), int(meta["size"]), meta.get("tar_size"))
        ok = path.stat().st_size == cached.size and _sha256_file(path) == cached.digest
    except (OSError, ValueError, KeyError, TypeError):
        ok, cached = False, None
    if not ok:
        _drop(path)
        return None
    _touch(path)
    return cached


def config(image_id: str) -> bytes | None:
    """The image config whose digest is `image_id`, as the Engine exported it."""
    if not enabled():
        return None
    path = _config_path(image_id)
    try:
        data = path.read_bytes()
    except OSError:
        return None
    if "sha256:" + hashlib.sha256(data).hexdigest() != image_id:
        _drop(path)
        return None
    _touch(path)
    return data


def keep_config(image_id: str, data: bytes) -> None:
    if not enabled():
        return
    path = _config_path(image_id)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}")
    tmp.write_bytes(data)
    os.replace(tmp, path)


@contextmanager
def writer(recipe: str) -> Iterator[IO[bytes] | None]:
    """A file to tee a layer's compressed bytes into as they are sent (None: the cache is off).
    `commit` names it once the upload is done; left uncommitted, it is removed."""
    if not enabled():
        yield None
        return
    d = _root() / "layers" / recipe
    d.mkdir(parents=True, exist_ok=True)
    f = tempfile.NamedTemporaryFile(dir=d, prefix=".partial-", delete=False)
    try:
        yield f
    finally:
        f.close()
        Path(f.name).unlink(missing_ok=True)  # committed: already renamed away


def commit(f: IO[bytes] | None, recipe: str, diff_id: str, digest: str, size: int,
           tar_size: int | None) -> None:
    """Keep the written blob as diff_id's by `recipe`, then trim the cache to its limit."""
    if f is None:
        return
    f.flush()
    path = _layer_path(recipe, diff_id)
    meta = path.with_suffix(".json")
    meta.write_text(json.dumps({"digest": digest, "size": size, "tar_size": tar_size}))
    os.replace(f.name, path)
    trim()


def trim(limit: int | None = None) -> None:
    """Drop the least recently used entries until the cache holds at most `limit` bytes."""
    limit = limit_bytes() if limit is None else limit
    files = []
    for p in _root().glob("*/*/*") if _root().is_dir() else ():
        if p.suffix == ".json" or p.name.startswith(".") or not p.is_file():
            continue
        st = p.stat()
        files.append((st.st_mtime, st.st_size, p))
    files += [(p.stat().st_mtime, p.stat().st_size, p)
              for p in (_root() / "configs").glob("sha256-*") if p.is_file()]
    total = sum(s for _, s, _ in files)
    for _, size, p in sorted(files, key=lambda t: t[0]):
        if total <= limit:
            break
        _drop(p)
        total -= size


def _touch(path: Path) -> None:
    try:
        os.utime(path)
    except OSError:
        pass


def _drop(path: Path) -> None:
    path.unlink(missing_ok=True)
    path.with_suffix(".json").unlink(missing_ok=True)
