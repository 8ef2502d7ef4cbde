"""A layer cut out of a built filesystem: a splice's rest layer, from BuildKit's tar of the
filesystem as the rest install left it, less what the layers under that step already hold.

Why: Docker Engine 20.10 writes a new layer's files three more times before a byte of it is
pushed: into its layer store when BuildKit exports the image, into its own tmp when `docker
save` is asked for the image, and into the stream that `docker save` then sends
(bench/results/bump-sglang-blackwell-slim.json: 15 s and 22 s for SGLang's 2.9 GB rest layer,
on 2 cores). BuildKit's tar exporter streams the filesystem in one pass, which is compressed and
sent as it comes (image/wire.py send_stream).

What goes in: every entry that the layers under it do not hold as it is (type, mode, owner,
link target, and for a file its bytes), and every directory whose metadata changed (the
install adds to them), in the order BuildKit walks the filesystem. What does not fit is
refused (NotCut) and the caller makes the layer the usual way: a path the layers under it hold
that the filesystem lacks (that takes a whiteout, and no install step removes a file it did
not write), or a hard link to a file kept out of the cut.
"""

from __future__ import annotations

import hashlib
import tarfile
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import IO

READ = 1 << 20
BLOCK = tarfile.BLOCKSIZE


class NotCut(Exception):
    """The filesystem is not the layers under it plus a layer of additions."""


@dataclass(frozen=True)
class Entry:
    type: bytes
    mode: int
    uid: int
    gid: int
    size: int
    mtime: int  # seconds: only a directory's is compared (the install changes it)
    link: str
    digest: str | None  # a regular file's bytes


@dataclass
class Cut:
    """What a cut kept, filled in as the stream goes by."""

    entries: int = 0
    kept: int = 0
    kept_paths: set[str] = field(default_factory=set)


def _norm(name: str) -> str:
    while name.startswith("./"):
        name = name[2:]
    name = name.strip("/")
    return "" if name == "." else name


def _entry(m: tarfile.TarInfo, digest: str | None) -> Entry:
    link = _norm(m.linkname) if m.islnk() else m.linkname
    return Entry(m.type, m.mode, m.uid, m.gid, m.size if m.isfile() else 0, int(m.mtime), link,
                 digest)


def _digest(f: IO[bytes] | None) -> str:
    h = hashlib.sha256()
    while f is not None and (chunk := f.read(READ)):
        h.update(chunk)
    return h.hexdigest()


def lower_entries(tars: Iterable[IO[bytes]]) -> dict[str, Entry]:
    """The filesystem that layer tars make, lowest first, whiteouts applied."""
    fs: dict[str, Entry] = {}
    for f in tars:
        with tarfile.open(fileobj=f, mode="r|", bufsize=READ) as tf:
            for m in tf:
                path = _norm(m.name)
                if not path:
                    continue  # the root
                parent, _, base = path.rpartition("/")
                if base.startswith(".wh."):
                    gone = parent if base == ".wh..wh..opq" else \
                        (f"{parent}/" if parent else "") + base[4:]
                    under = f"{gone}/" if gone else ""
                    for k in [k for k in fs if k.startswith(under) and k != gone]:
                        del fs[k]
                    if base != ".wh..wh..opq":
                        fs.pop(gone, None)
                    continue
                fs[path] = _entry(m, _digest(tf.extractfile(m)) if m.isfile() else None)
    return fs


def _padded(size: int) -> int:
    return size + (-size % BLOCK)


def _read(src: IO[bytes], n: int) -> bytes:
    data = src.read(n)
    if len(data) != n:
        raise NotCut("the filesystem's tar ended early")
    return data


def _pax(data: bytes) -> dict[str, str]:
    """A PAX extended header's records ("<len> <key>=<value>\\n")."""
    out: dict[str, str] = {}
    pos = 0
    while pos < len(data):
        sp = data.index(b" ", pos)
        n = int(data[pos:sp])
        key, _, value = data[sp + 1:pos + n - 1].partition(b"=")
        out[key.decode("utf-8", "surrogateescape")] = value.decode("utf-8", "surrogateescape")
        pos += n
    return out


def _members(src: IO[bytes]) -> Iterator[tuple[tarfile.TarInfo, bytes]]:
    """Each member of a tar stream as it comes: its metadata, with any PAX or GNU long-name
    header applied, and its raw header blocks (those extended headers included), which are
    passed on as they are rather than written anew. The caller reads (or skips) its data."""
    raw: list[bytes] = []
    pax: dict[str, str] = {}
    longs: dict[bytes, str] = {}
    while True:
        block = src.read(BLOCK)
        if len(block) < BLOCK or block == b"\0" * BLOCK:
            return
        m = tarfile.TarInfo.frombuf(block, "utf-8", "surrogateescape")
        if m.type in (tarfile.XHDTYPE, tarfile.XGLTYPE, tarfile.GNUTYPE_LONGNAME,
                      tarfile.GNUTYPE_LONGLINK):
            data = _read(src, _padded(m.size))
            raw += [block, data]
            if m.type == tarfile.XHDTYPE:
                pax.update(_pax(data[:m.size]))
            elif m.type == tarfile.XGLTYPE:
                raise NotCut("the filesystem's tar has a global header")
            else:
                longs[m.type] = data[:m.size].rstrip(b"\0").decode("utf-8", "surrogateescape")
            continue
        m.name = pax.get("path") or longs.get(tarfile.GNUTYPE_LONGNAME) or m.name
        m.linkname = pax.get("linkpath") or longs.get(tarfile.GNUTYPE_LONGLINK) or m.linkname
        for key, conv in (("size", int), ("uid", int), ("gid", int), ("mtime", float)):
            if key in pax:
                setattr(m, key, conv(pax[key]))
        yield m, b"".join(raw) + block
        raw, pax, longs = [], {}, {}


def cut(src: IO[bytes], lower: dict[str, Entry], stats: Cut) -> Iterator[bytes]:
    """The layer tar, as it is made from the filesystem tar `src` (read to its end): the
    members kept are passed on byte for byte."""
    seen: set[str] = set()
    for m, header in _members(src):
        path = _norm(m.name)
        stats.entries += 1
        size = _padded(m.size) if m.isfile() else 0
        if not path:
            _read(src, size)
            continue  # the root: its metadata is the base's
        seen.add(path)
        below = lower.get(path)
        data: bytes | None = None
        if m.isdir():
            keep = below is None or _entry(m, None) != below
        elif m.isfile() and below is not None and below.type == m.type \
                and below.size == m.size:
            data = _read(src, size)
            keep = _entry(m, hashlib.sha256(data[:m.size]).hexdigest()) != below
        elif below is not None and not m.isfile():
            keep = _entry(m, None) != below
        else:
            keep = True
        if not keep:
            if data is None and size:
                _read(src, size)
            continue
        if m.islnk() and _norm(m.linkname) not in stats.kept_paths:
            raise NotCut(f"{path} is a hard link to {_norm(m.linkname)}, which the layers "
                         "under it hold: a layer's hard links point inside it")
        stats.kept += 1
        stats.kept_paths.add(path)
        yield header
        if data is not None:
            yield data
        else:
            left = size
            while left:
                chunk = _read(src, min(READ, left))
                left -= len(chunk)
                yield chunk
    gone = [p for p in lower if p not in seen]
    if gone:
        raise NotCut(f"{len(gone)} paths of the layers under it are not in the filesystem "
                     f"(e.g. /{sorted(gone)[0]}): that takes whiteouts")
    yield b"\0" * (2 * BLOCK)
