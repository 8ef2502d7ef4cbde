"""Layer compressions: what each is called on the wire, who reads it, and the compressors, on
every core.

- zstd (`application/vnd.oci.image.layer.v1.tar+zstd`): libzstd's own worker threads, one per
  core. Read by containerd >= 1.5 and Docker Engine >= 23 only.
- gzip (`application/vnd.oci.image.layer.v1.tar+gzip`): the layer cut into 4 MiB blocks, each
  deflated on its own by libdeflate at level 5 (it frees the GIL, so the blocks compress on
  every core) and written as one gzip member. On 2.08 GB of SGLang's rest-layer wheels
  (bench/gzip_bench.py, results/gzip.json): 163 MB/s a core against zlib-ng's 128 at the same
  level (zlib-ng's, before it, was itself 3x zlib's) and 366 against 306 MB/s on two cores,
  output 0.9% smaller. ISA-L is faster again (438 MB/s a core at its level 3) but its output
  11% larger, which every pull pays.
  A gzip stream of several members is still one gzip file, which every
  client's reader takes (Go's compress/gzip reads multistream by default, so do unpigz and
  containerd). Read by every client.

Both are deterministic: the same layer gives the same bytes on any machine, whatever its number
of cores (zstd's multi-threaded output does not depend on the worker count; the gzip blocks are
fixed), so a registry that holds a layer from one runner has it for the next.
"""

from __future__ import annotations

import os
import zlib
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from packaging.version import InvalidVersion, Version

from ..errors import InputError

DOCKER_GZIP = "application/vnd.docker.image.rootfs.diff.tar.gzip"
READ_CHUNK = 1 << 20
GZIP_BLOCK = 4 << 20


@dataclass(frozen=True)
class Compression:
    name: str  # gzip | zstd
    media_type: str
    level: int
    read_by: str  # who can pull it, for messages

    @property
    def recipe(self) -> str:
        """What decides the bytes: the compression, its level, the library that writes them
        and its version (another libdeflate or libzstd may write other bytes for the same
        layer, so the blob cache keeps their blobs apart; the deflate package bundles its
        libdeflate)."""
        # The compressors are imported where they run: naming a compression (a build that finds
        # its image does) needs neither.
        import deflate
        import zstandard

        if self.name == "zstd":
            return f"zstd-{self.level}-libzstd{'.'.join(map(str, zstandard.ZSTD_VERSION))}"
        return f"gzip-{self.level}-{GZIP_BLOCK >> 20}MiB-libdeflate-py{deflate.__version__}"

    def compressor(self, size: int) -> Callable[[Iterable[bytes]], Iterator[bytes]]:
        if self.name == "zstd":
            return lambda chunks: _zstd(chunks, self.level, size)
        return lambda chunks: _gzip(chunks, self.level)


GZIP = Compression("gzip", "application/vnd.oci.image.layer.v1.tar+gzip", 5,
                   "every client (Docker Engine, containerd, Podman, CRI-O)")
ZSTD = Compression("zstd", "application/vnd.oci.image.layer.v1.tar+zstd", 3,
                   "containerd >= 1.5 and Docker Engine >= 23")
COMPRESSIONS = {c.name: c for c in (GZIP, ZSTD)}
# Media types that name the same compression (Docker's schema 2 gzip layers are gzip too).
SAME = {DOCKER_GZIP: GZIP.media_type}


def compression(name: str) -> Compression:
    try:
        return COMPRESSIONS[name]
    except KeyError:
        raise InputError(f"unknown layer compression '{name}'",
                         hint=f"choose one of: {', '.join(COMPRESSIONS)}") from None


def cpu_workers() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def _zstd(chunks: Iterable[bytes], level: int, size: int, threads: int = -1) -> Iterator[bytes]:
    # threads=-1: one worker per core. The frame records the content size, so a reader can
    # allocate once; the output is the same for any number of workers >= 1.
    import zstandard  # imported on use: see Compression.recipe

    cctx = zstandard.ZstdCompressor(level=level, threads=threads, write_content_size=True)
    chunker = cctx.chunker(size=size, chunk_size=READ_CHUNK)
    for chunk in chunks:
        yield from chunker.compress(chunk)
    yield from chunker.finish()


def _deflate_block(block: bytes, level: int) -> bytes:
    # A gzip member with a fixed header (mtime 0, no name), so equal blocks give equal bytes.
    import deflate  # imported on use: see Compression.recipe

    return deflate.gzip_compress(block, level)


def _blocks(chunks: Iterable[bytes], size: int) -> Iterator[bytes]:
    """The stream cut at fixed offsets, whatever sizes it arrives in."""
    buf = bytearray()
    for chunk in chunks:
        buf += chunk
        while len(buf) >= size:
            yield bytes(buf[:size])
            del buf[:size]
    if buf:
        yield bytes(buf)


def _gzip(chunks: Iterable[bytes], level: int, workers: int | None = None) -> Iterator[bytes]:
    n = workers or cpu_workers()
    with ThreadPoolExecutor(max_workers=n, thread_name_prefix="gzip") as pool:
        pending: deque = deque()
        for block in _blocks(chunks, GZIP_BLOCK):
            pending.append(pool.submit(_deflate_block, block, level))
            if len(pending) > 2 * n:  # bounded look-ahead: memory stays a few blocks per core
                yield pending.popleft().result()
        while pending:
            yield pending.popleft().result()


def engine_reads(comp: Compression, engine_version: str) -> bool:
    """Whether Docker Engine `engine_version` unpacks layers in `comp` (zstd from 23.0)."""
    if comp.name != "zstd":
        return True
    try:
        return Version(engine_version.split("+")[0].split("-")[0]) >= Version("23.0")
    except InvalidVersion:
        return True  # unknown: let the Engine say


# --- reading layers in any compression -------------------------------------------------------

# The first bytes of each compression: a layer blob read from `docker save` under the
# containerd image store is named by its compressed digest only, and its media type is in a
# manifest that the save may send after it.
GZIP_MAGIC = b"\x1f\x8b"
ZSTD_MAGIC = b"\x28\xb5\x2f\xfd"


def kind_of(media_type: str) -> str:
    """gzip | zstd | tar: the compression a layer media type names (Docker's and OCI's)."""
    if media_type.endswith("zstd"):
        return "zstd"
    if media_type.endswith("gzip"):
        return "gzip"
    return "tar"


def sniff(head: bytes) -> str:
    """gzip | zstd | tar: the compression a blob's first bytes show."""
    if head.startswith(GZIP_MAGIC):
        return "gzip"
    if head.startswith(ZSTD_MAGIC):
        return "zstd"
    return "tar"


class Inflater:
    """A layer blob in `kind` (gzip | zstd | tar) turned back into its tar, fed a chunk at a
    time. Every member of a multi-member gzip and every frame of a multi-frame zstd stream is
    read, as Go's and containerd's readers do; `close` raises where the stream ends inside one."""

    def __init__(self, kind: str):
        if kind not in ("gzip", "zstd", "tar"):
            raise ValueError(f"unknown layer compression {kind!r}")
        self.kind = kind
        self._d = self._new()
        self._fed = False

    def _new(self):
        if self.kind == "gzip":
            return zlib.decompressobj(wbits=31)
        if self.kind == "zstd":
            import zstandard  # imported on use: see Compression.recipe

            return zstandard.ZstdDecompressor().decompressobj()
        return None

    def feed(self, chunk: bytes) -> Iterator[bytes]:
        if self._d is None:
            if chunk:
                yield chunk
            return
        while chunk:
            out = self._d.decompress(chunk)
            self._fed = True
            if out:
                yield out
            if self._d.eof:  # the next member (frame) starts in what is left
                chunk = self._d.unused_data
                self._d, self._fed = self._new(), False
            else:
                chunk = b""

    def close(self) -> None:
        if self._d is not None and self._fed and not self._d.eof:
            raise ValueError(f"the {self.kind} stream ends inside a "
                             f"{'member' if self.kind == 'gzip' else 'frame'}")


def decompressed(chunks: Iterable[bytes], kind: str) -> Iterator[bytes]:
    """The layer tar of a blob in `kind`, as its chunks come (see Inflater)."""
    inflater = Inflater(kind)
    for chunk in chunks:
        yield from inflater.feed(chunk)
    inflater.close()
