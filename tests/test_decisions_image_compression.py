"""Compression decisions (image/compression.py) on real gzip and zstd bytes, without the Docker
Engine: which Engine reads zstd (the version boundary itself), what a media type and a blob's
first bytes say, which blob goes as it is, the fixed gzip blocks, the compressors' output read
back, and a stream that ends inside a member or frame."""

from __future__ import annotations

import dataclasses
import gzip
import zlib

import pytest
import zstandard

from imgbuild.errors import InputError
from imgbuild.image import compression as c
from imgbuild.image.compression import GZIP, ZSTD


@pytest.mark.parametrize("version,reads", [
    ("20.10.24+dfsg1", False), ("22.06.2", False), ("22.99", False),
    ("23.0.0", True), ("23.0", True), ("23.0.0-rc.1", True), ("23.0.6+dfsg1", True),
    ("26.1.5+dfsg1", True), ("100.0", True),
    # what follows the first + is not read: a build suffix that is no valid local version
    ("20.10.24+dfsg1+b1", False), ("26.1.5+dfsg1+b1", True),
    ("", True), ("dev", True),  # unknown: the Engine says for itself
])
def test_zstd_is_read_from_engine_23_exactly(version, reads):
    assert c.engine_reads(ZSTD, version) is reads


@pytest.mark.parametrize("version", ["20.10.24", "1.13.1", "", "junk"])
def test_gzip_is_read_by_every_engine(version):
    assert c.engine_reads(GZIP, version) is True


def test_a_media_type_names_its_compression():
    assert c.kind_of(GZIP.media_type) == "gzip"
    assert c.kind_of(c.DOCKER_GZIP) == "gzip"
    assert c.kind_of(ZSTD.media_type) == "zstd"
    assert c.kind_of("application/vnd.docker.image.rootfs.diff.tar.zstd") == "zstd"
    assert c.kind_of("application/vnd.oci.image.layer.v1.tar") == "tar"
    assert c.kind_of("application/vnd.docker.image.rootfs.diff.tar") == "tar"
    assert c.SAME == {c.DOCKER_GZIP: GZIP.media_type}


def test_a_blobs_first_bytes_name_its_compression():
    data = b"a layer tar, or near enough " * 100
    assert c.sniff(gzip.compress(data)) == "gzip"
    assert c.sniff(b"".join(c._gzip([data], 5, workers=1))) == "gzip"
    assert c.sniff(zstandard.ZstdCompressor().compress(data)) == "zstd"
    assert c.sniff(data) == "tar"
    assert c.sniff(b"") == "tar"
    assert c.sniff(b"\x1f") == "tar"  # half gzip's magic is no gzip
    assert c.sniff(b"\x28\xb5\x2f") == "tar"  # three of zstd's four bytes are no zstd
    assert c.sniff(b"\x28\xb5\x2f\xfe") == "tar"
    assert c.sniff(b"x\x1f\x8b") == "tar"  # the magic is at the start or nowhere


def test_a_compression_is_named_or_refused():
    assert c.compression("gzip") is GZIP and c.compression("zstd") is ZSTD
    with pytest.raises(InputError) as e:
        c.compression("lz4")
    assert "lz4" in str(e.value)
    assert GZIP.media_type.endswith("+gzip") and ZSTD.media_type.endswith("+zstd")
    assert "23" in ZSTD.read_by


def test_the_recipe_names_level_and_library_and_block():
    assert GZIP.recipe.startswith("gzip-5-4MiB-libdeflate-py")
    assert ZSTD.recipe.startswith("zstd-3-libzstd")
    assert dataclasses.replace(GZIP, level=6).recipe.startswith("gzip-6-")
    assert dataclasses.replace(ZSTD, level=19).recipe.startswith("zstd-19-")


def test_gzip_blocks_are_cut_at_fixed_offsets_whatever_the_chunking():
    data = bytes(range(256)) * 100  # 25600 bytes
    for chunking in (1, 7, 1000, 25600, 99999):
        chunks = [data[i:i + chunking] for i in range(0, len(data), chunking)]
        blocks = list(c._blocks(chunks, 1024))
        assert [len(b) for b in blocks] == [1024] * 25
        assert b"".join(blocks) == data
    assert [len(b) for b in c._blocks([data[:2050]], 1024)] == [1024, 1024, 2]
    assert list(c._blocks([], 1024)) == [] and list(c._blocks([b""], 1024)) == []


def test_each_compressor_writes_its_own_format_that_reads_back():
    data = (b"def f(x):\n    return x\n" * 20000) + bytes(range(256)) * 300
    g = b"".join(GZIP.compressor(len(data))(iter([data[:1000], data[1000:]])))
    z = b"".join(ZSTD.compressor(len(data))(iter([data[:1000], data[1000:]])))
    assert c.sniff(g) == "gzip" and c.sniff(z) == "zstd"
    assert gzip.decompress(g) == data and zstandard.ZstdDecompressor().decompress(z) == data
    assert len(g) < len(data) and len(z) < len(data)
    # The zstd frame records its content size (a reader allocates once).
    assert zstandard.get_frame_parameters(z).content_size == len(data)
    # gzip's members have no time and no name: the same layer, the same bytes.
    assert g[4:8] == b"\0\0\0\0" and g == b"".join(GZIP.compressor(len(data))(iter([data])))
    # Level: the compression's own; another level, other bytes (so another recipe).
    g1 = b"".join(dataclasses.replace(GZIP, level=1).compressor(len(data))(iter([data])))
    assert g1 != g and gzip.decompress(g1) == data
    z1 = b"".join(dataclasses.replace(ZSTD, level=1).compressor(len(data))(iter([data])))
    assert z1 != z


def test_an_inflater_reads_every_member_and_refuses_a_stream_cut_short():
    data = b"layer " * 5000
    two = gzip.compress(data[:100]) + gzip.compress(data[100:])
    assert b"".join(c.decompressed([two[i:i + 3] for i in range(0, len(two), 3)], "gzip")) == data
    zz = zstandard.ZstdCompressor().compress(data[:10]) + \
        zstandard.ZstdCompressor().compress(data[10:])
    assert b"".join(c.decompressed([zz], "zstd")) == data
    # A tar is passed through, and can end anywhere.
    assert b"".join(c.decompressed([b"ab", b"", b"c"], "tar")) == b"abc"
    # Nothing fed at all is no stream cut short; a member cut short is.
    assert list(c.decompressed([], "gzip")) == []
    with pytest.raises(ValueError, match="inside a member"):
        list(c.decompressed([two[:-4]], "gzip"))
    with pytest.raises(ValueError, match="inside a frame"):
        list(c.decompressed([zz[:-2]], "zstd"))
    # A stream that ends just where a member ends is whole.
    one = zlib.compressobj(wbits=31)
    whole = one.compress(data) + one.flush()
    assert b"".join(c.decompressed([whole], "gzip")) == data


def test_an_unknown_compression_is_refused_naming_the_ones_there_are():
    with pytest.raises(InputError) as e:
        c.compression("lz4")
    assert e.value.message == "unknown layer compression 'lz4'"
    assert e.value.hint == "choose one of: " + ", ".join(c.COMPRESSIONS)
    assert ", " in e.value.hint and "gzip" in e.value.hint and "zstd" in e.value.hint


def test_the_bytes_do_not_follow_the_number_of_cores():
    """A layer's blob digest must not depend on the machine that compressed it: zstd writes
    the same frame for any number of workers from one (not the single-threaded format), and
    gzip's blocks are compressed apart and joined in order."""
    import random

    data = b"layer " * 200_000 + random.Random(5).randbytes(1 << 20)
    z = b"".join(ZSTD.compressor(len(data))(iter([data])))
    for threads in (1, 2, 3):
        assert b"".join(c._zstd(iter([data]), ZSTD.level, len(data), threads)) == z, threads

    def streamed(**kw) -> bytes:  # as the push streams a layer: one chunk at a time
        ch = zstandard.ZstdCompressor(level=ZSTD.level, write_content_size=True, **kw).chunker(
            size=len(data), chunk_size=c.READ_CHUNK)
        return b"".join(ch.compress(data)) + b"".join(ch.finish())

    # One worker or more writes these bytes; libzstd without workers writes others.
    assert z == streamed(threads=1) and z != streamed()
    assert zstandard.ZstdDecompressor().decompress(z) == data
    big = data * 3  # more than two of gzip's blocks
    one = b"".join(c._gzip(iter([big]), GZIP.level, workers=1))
    assert b"".join(c._gzip(iter([big[:5], big[5:]]), GZIP.level, workers=3)) == one
    assert gzip.decompress(one) == big


def test_the_cores_counted_are_those_this_process_may_run_on(monkeypatch):
    monkeypatch.setattr(c.os, "sched_getaffinity", lambda pid: {0, 3, 5}, raising=False)
    monkeypatch.setattr(c.os, "cpu_count", lambda: 64)
    assert c.cpu_workers() == 3
    monkeypatch.delattr(c.os, "sched_getaffinity")
    assert c.cpu_workers() == 64
    monkeypatch.setattr(c.os, "cpu_count", lambda: None)
    assert c.cpu_workers() == 1
