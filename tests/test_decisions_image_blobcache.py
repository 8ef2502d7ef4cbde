"""Which cached bytes a push trusts (image/blobcache.py), on real files under a cache of the
test's own: a layer only while its file is the size and digest recorded beside it, kept apart
by compressor recipe and diff id; a config only while it hashes to its id; the cache's limit
read from the environment, and kept to by dropping the least recently used entries."""

from __future__ import annotations

import hashlib
import json
import os
import time

import pytest

from imgbuild.image import blobcache


def sha(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


DIFF = "sha256:" + "a" * 64
OTHER = "sha256:" + "b" * 64
BODY = b"compressed layer bytes " * 50


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("IMGBUILD_CACHE", str(tmp_path))
    monkeypatch.delenv("IMGBUILD_BLOB_CACHE_GB", raising=False)
    return tmp_path


def keep(recipe: str, diff_id: str, body: bytes = BODY, tar_size: int | None = 4321,
         digest: str | None = None, size: int | None = None) -> None:
    with blobcache.writer(recipe) as f:
        f.write(body)
        blobcache.commit(f, recipe, diff_id, digest or sha(body),
                         len(body) if size is None else size, tar_size)


def test_a_layer_kept_is_given_back_with_what_was_recorded(cache):
    keep("gzip-5", DIFF)
    got = blobcache.layer("gzip-5", DIFF)
    assert got is not None
    assert got.path.read_bytes() == BODY
    assert (got.digest, got.size, got.tar_size) == (sha(BODY), len(BODY), 4321)
    keep("gzip-5", OTHER, tar_size=None)
    assert blobcache.layer("gzip-5", OTHER).tar_size is None
    assert not list(cache.glob("blobs/layers/gzip-5/.partial-*"))


def test_another_recipe_or_diff_id_is_never_given_this_layer(cache):
    keep("gzip-5", DIFF)
    assert blobcache.layer("gzip-9", DIFF) is None
    assert blobcache.layer("zstd-3", DIFF) is None
    assert blobcache.layer("gzip-5", OTHER) is None
    assert blobcache.layer("gzip-5", DIFF) is not None


@pytest.mark.parametrize("damage", ["flip", "truncate", "extend", "meta-size", "meta-digest",
                                    "meta-gone", "meta-garbage", "meta-no-size"])
def test_a_damaged_entry_is_not_trusted_and_is_dropped(cache, damage):
    keep("gzip-5", DIFF)
    path = blobcache._layer_path("gzip-5", DIFF)
    meta = path.with_suffix(".json")
    data = path.read_bytes()
    m = json.loads(meta.read_text())
    if damage == "flip":  # the same size, one byte changed
        path.write_bytes(data[:10] + bytes([data[10] ^ 1]) + data[11:])
    elif damage == "truncate":
        path.write_bytes(data[:-1])
    elif damage == "extend":
        path.write_bytes(data + b"\0")
    elif damage == "meta-size":
        meta.write_text(json.dumps({**m, "size": m["size"] + 1}))
    elif damage == "meta-digest":
        meta.write_text(json.dumps({**m, "digest": sha(b"another blob")}))
    elif damage == "meta-gone":
        meta.unlink()
    elif damage == "meta-garbage":
        meta.write_text("{")
    elif damage == "meta-no-size":
        meta.write_text(json.dumps({"digest": m["digest"]}))
    assert blobcache.layer("gzip-5", DIFF) is None
    assert not path.exists() and not meta.exists()


def test_a_size_recorded_that_is_not_the_files_is_not_trusted_even_when_the_digest_is(cache):
    keep("gzip-5", DIFF, size=len(BODY) - 1)
    assert blobcache.layer("gzip-5", DIFF) is None


def test_a_blob_whose_bytes_are_not_its_recorded_digest_is_not_trusted(cache):
    keep("gzip-5", DIFF, digest=sha(BODY + b"x"))
    assert blobcache.layer("gzip-5", DIFF) is None


def test_a_layer_read_is_used_again_as_the_most_recent(cache):
    keep("gzip-5", DIFF)
    path = blobcache._layer_path("gzip-5", DIFF)
    os.utime(path, (1000, 1000))
    assert blobcache.layer("gzip-5", DIFF) is not None
    assert path.stat().st_mtime > time.time() - 60


def test_a_config_is_trusted_only_while_it_hashes_to_its_id(cache):
    data = b'{"rootfs": {"diff_ids": []}}'
    blobcache.keep_config(sha(data), data)
    assert blobcache.config(sha(data)) == data
    assert blobcache.config(sha(b"other")) is None
    path = blobcache._config_path(sha(data))
    path.write_bytes(data + b" ")
    assert blobcache.config(sha(data)) is None and not path.exists()
    blobcache.keep_config(sha(b"other"), data)  # kept under another's id: never given back
    assert blobcache.config(sha(b"other")) is None


def test_the_limit_is_read_in_gb_and_zero_turns_the_cache_off(cache, monkeypatch):
    assert blobcache.limit_bytes() == 8 * 10**9 and blobcache.enabled()
    for raw, want in (("0.5", 5 * 10**8), (" 2 ", 2 * 10**9), ("junk", 8 * 10**9), ("", 8 * 10**9),
                      ("-1", 0), ("0", 0), ("0.000000001", 1)):
        monkeypatch.setenv("IMGBUILD_BLOB_CACHE_GB", raw)
        assert blobcache.limit_bytes() == want, raw
        assert blobcache.enabled() is (want > 0)


def test_with_the_cache_off_nothing_is_kept_or_given_back(cache, monkeypatch):
    keep("gzip-5", DIFF)
    data = b"{}"
    blobcache.keep_config(sha(data), data)
    monkeypatch.setenv("IMGBUILD_BLOB_CACHE_GB", "0")
    assert blobcache.layer("gzip-5", DIFF) is None
    assert blobcache.config(sha(data)) is None
    with blobcache.writer("gzip-5") as f:
        assert f is None
        blobcache.commit(f, "gzip-5", OTHER, sha(b""), 0, 0)
    blobcache.keep_config(sha(b"x"), b"x")
    monkeypatch.delenv("IMGBUILD_BLOB_CACHE_GB")
    assert blobcache.config(sha(b"x")) is None
    # Turned off, what was kept is not dropped: it is there when the cache is on again.
    assert blobcache.layer("gzip-5", DIFF) is not None and blobcache.config(sha(data)) == data


def test_an_uncommitted_write_leaves_nothing(cache):
    with blobcache.writer("gzip-5") as f:
        f.write(b"half a layer")
    assert blobcache.layer("gzip-5", DIFF) is None
    assert [p for p in (cache / "blobs" / "layers" / "gzip-5").iterdir()] == []
    with pytest.raises(RuntimeError):
        with blobcache.writer("gzip-5") as f:
            f.write(b"x")
            raise RuntimeError("upload failed")
    assert [p for p in (cache / "blobs" / "layers" / "gzip-5").iterdir()] == []


def test_trim_keeps_exactly_the_limit_and_counts_configs_too(cache):
    for i, diff in enumerate((DIFF, OTHER)):
        keep("gzip-5", diff, bytes([i]) * 1000)
        os.utime(blobcache._layer_path("gzip-5", diff), (2000 + i, 2000 + i))
    cfg = b"c" * 500
    blobcache.keep_config(sha(cfg), cfg)
    os.utime(blobcache._config_path(sha(cfg)), (1000, 1000))  # the oldest
    blobcache.trim(2500)  # all of it: nothing goes
    assert blobcache.config(sha(cfg)) == cfg
    os.utime(blobcache._config_path(sha(cfg)), (1000, 1000))
    assert blobcache.layer("gzip-5", DIFF) and blobcache.layer("gzip-5", OTHER)
    os.utime(blobcache._layer_path("gzip-5", DIFF), (2000, 2000))
    os.utime(blobcache._layer_path("gzip-5", OTHER), (2001, 2001))
    blobcache.trim(2499)  # one byte over: the oldest (the config) goes, and only it
    assert blobcache.config(sha(cfg)) is None
    assert blobcache._layer_path("gzip-5", DIFF).exists()
    assert blobcache._layer_path("gzip-5", OTHER).exists()
    blobcache.trim(1500)  # the older layer next, its record with it
    assert not blobcache._layer_path("gzip-5", DIFF).exists()
    assert not blobcache._layer_path("gzip-5", DIFF).with_suffix(".json").exists()
    assert blobcache._layer_path("gzip-5", OTHER).exists()
    blobcache.trim(0)
    assert not blobcache._layer_path("gzip-5", OTHER).exists()


def test_a_layer_being_written_is_not_trimmed_or_counted(cache):
    keep("r", "sha256:" + "1" * 64, body=b"x" * 100)
    with blobcache.writer("r") as f:
        f.write(b"y" * 1000)  # another push's layer, half sent
        f.flush()
        blobcache.trim(limit=150)
        assert os.path.exists(f.name)
    assert blobcache.layer("r", "sha256:" + "1" * 64) is not None  # 100 bytes: under the limit
