"""Which GPU code a shared object carries, read from its CUDA fat binaries without a GPU.

nvcc embeds device code in a host `.so` as fat binaries: a 16-byte header (magic 0xBA55ED50,
version 1, header size 16, size of what follows), then entries, each a header and a payload
(a cubin: SASS for one arch; or PTX text, compiled by the driver at first launch). The entry
header says what the payload is for, so the payload itself (often compressed) is never read.

Layout of an entry header, as nvcc 13.0 writes it (checked against `cuobjdump --list-elf
--list-ptx` from NVIDIA's nvidia-cuda-cuobjdump wheel on kernels compiled here for every
variant, tests/test_kernels.py):

    offset  size  field
    0       2     kind: 1 PTX, 2 ELF (cubin)
    2       2     entry format version
    4       4     header size (the payload follows it)
    8       8     payload size
    28      4     arch as a number: 90, 100, 120 …
    40      8     flags: 0x100000 arch-specific ("sm_100a": runs on exactly that arch),
                  0x200000 family-specific ("sm_100f": that major's later minors too)

The scan reads a stream (a wheel member being decompressed) once, front to back, holding only
a small window: a 1 GB kernel library costs its read time, not its size in memory. Magic bytes
found by chance are rejected by the header checks (version, sizes, entry kinds that must add
up to the declared size exactly).
"""

from __future__ import annotations

import struct
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

MAGIC = struct.pack("<I", 0xBA55ED50)
FATBIN_HEADER = struct.Struct("<IHHQ")  # magic, version, header size, size of the entries
ENTRY_HEAD = struct.Struct("<HHIQ")  # kind, version, header size, payload size
KIND_PTX, KIND_ELF = 1, 2
ARCH_SPECIFIC, FAMILY_SPECIFIC = 0x100000, 0x200000
_MAX_ENTRY_HEADER = 4096


@dataclass(frozen=True, order=True)
class Code:
    """One fat-binary entry: SASS (`sm_100a`) or PTX (`compute_120`) for one arch."""

    kind: str  # "sass" | "ptx"
    arch: int  # 100 for sm_100
    variant: str = ""  # "" | "a" (arch-specific) | "f" (family-specific)

    @property
    def name(self) -> str:
        return f"{'sm' if self.kind == 'sass' else 'compute'}_{self.arch}{self.variant}"

    @classmethod
    def parse(cls, name: str) -> Code:
        """`sm_100a` / `compute_120` back into a Code (the record stores names)."""
        prefix, _, rest = name.partition("_")
        variant = rest[-1] if rest[-1] in "af" else ""
        return cls("sass" if prefix == "sm" else "ptx", int(rest.rstrip("af")), variant)

    def runs_on(self, arch: int) -> bool:
        """Whether a GPU of compute capability `arch` (100 for sm100) can run this code.

        SASS runs on its own arch and on later minors of the same major (sm_100 on sm103,
        sm_120 on sm121), except arch-specific SASS, which runs only on its arch. PTX is
        compiled by the driver for any arch at least as new; arch-specific PTX only for its
        own arch, family-specific PTX only within its major.
        """
        same_major = arch // 10 == self.arch // 10
        if self.variant == "a":
            return arch == self.arch
        if self.kind == "sass" or self.variant == "f":
            return same_major and arch >= self.arch
        return arch >= self.arch


def _entry(head: bytes) -> Code | None:
    kind, _, size, _ = ENTRY_HEAD.unpack_from(head)
    if kind not in (KIND_PTX, KIND_ELF) or size < 48:
        return None
    arch = struct.unpack_from("<I", head, 28)[0]
    flags = struct.unpack_from("<Q", head, 40)[0]
    variant = "a" if flags & ARCH_SPECIFIC else "f" if flags & FAMILY_SPECIFIC else ""
    return Code("sass" if kind == KIND_ELF else "ptx", arch, variant)


def scan(chunks: Iterable[bytes]) -> set[Code]:
    """Every GPU code entry in the fat binaries of a byte stream."""
    found: set[Code] = set()
    for fat in _fatbins(chunks):
        found |= fat
    return found


def _fatbins(chunks: Iterable[bytes]) -> Iterator[set[Code]]:
    reader = _Window(iter(chunks))
    while True:
        at = reader.find(MAGIC)
        if at < 0:
            return
        head = reader.peek(FATBIN_HEADER.size)
        if len(head) < FATBIN_HEADER.size:
            return
        _, version, hsize, size = FATBIN_HEADER.unpack(head)
        if version != 1 or hsize != FATBIN_HEADER.size or size == 0 or size > 1 << 34:
            reader.skip(1)  # magic by chance: look further
            continue
        reader.skip(hsize)
        entries, left = set(), size
        while left > 0:
            first = reader.peek(ENTRY_HEAD.size)
            if len(first) < ENTRY_HEAD.size:
                return
            _, _, ehsize, psize = ENTRY_HEAD.unpack(first)
            if not 48 <= ehsize <= _MAX_ENTRY_HEADER or ehsize + psize > left:
                break
            code = _entry(reader.peek(ehsize))
            if code is None:
                break
            entries.add(code)
            reader.skip(ehsize + psize)
            left -= ehsize + psize
        if left == 0 and entries:
            yield entries
        # A header that did not add up: whatever was skipped was not a fat binary's entries.


class _Window:
    """A forward-only view of a stream: find, peek and skip without keeping what was passed.

    The buffer is consumed by moving an offset, not by slicing: a kernel library holds
    thousands of small entries per megabyte read.
    """

    def __init__(self, chunks: Iterator[bytes]) -> None:
        self._chunks = chunks
        self._buf = b""
        self._pos = 0
        self._skip = 0  # bytes still to drop from the stream ahead of the buffer

    def _fill(self, n: int) -> bool:
        """Make at least n bytes available at the offset; False at the end of the stream."""
        while len(self._buf) - self._pos < n:
            chunk = next(self._chunks, None)
            if chunk is None:
                return False
            if self._skip:
                drop = min(self._skip, len(chunk))
                chunk, self._skip = chunk[drop:], self._skip - drop
            self._buf = self._buf[self._pos:] + chunk
            self._pos = 0
        return True

    def peek(self, n: int) -> bytes:
        self._fill(n)
        return self._buf[self._pos:self._pos + n]

    def skip(self, n: int) -> None:
        have = len(self._buf) - self._pos
        if n <= have:
            self._pos += n
        else:
            self._skip += n - have
            self._buf, self._pos = b"", 0

    def find(self, needle: bytes) -> int:
        """Advance to the next occurrence of `needle`; -1 at the end of the stream."""
        while True:
            at = self._buf.find(needle, self._pos)
            if at >= 0:
                self._pos = at
                return 0
            # Keep the last few bytes: the needle may straddle two chunks.
            self._pos = max(self._pos, len(self._buf) - len(needle) + 1)
            if not self._fill(len(self._buf) - self._pos + 1):
                return -1
