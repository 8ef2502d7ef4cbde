"""The decisions of publishing, tested without the Docker Engine or a registry: what the
registry may be given (image/imagecheck.py), how an image is found in `docker save` under each
image store (image/exported.py, on a layout recorded from a real Engine 26 with the containerd
store), which blob goes as it is and which is compressed again (image/wire.py), which cached
config is trusted, and what a content tag the registry holds already allows (pipeline/build.py).

The bug these guard against, seen on Engine 26 with the containerd image store: the image id is
the manifest's (or index's) digest there, not the config's; the push took the save's blob of
that digest (the image's manifest, for an image pulled by digest) for the config, found every
layer in the registry already and published a manifest whose config was that manifest. Every later pull failed "number of layers
and diffIDs don't match: 9 != 0"."""

from __future__ import annotations

import hashlib
import io
import json
import zlib
from pathlib import Path

import pytest
import zstandard

from imgbuild.image import blobcache, exported, imagecheck, wire
from imgbuild.image.compression import GZIP, ZSTD, Inflater, _gzip, decompressed, kind_of, sniff
from imgbuild.image.registry import Repository
from imgbuild.pipeline.build import content_tag_way

SAVED = Path(__file__).parent / "fixtures" / "saved" / "containerd-26.1.5"
IMAGE_ID = "sha256:ee6deff38308ea62d56a9071b1d47b6972f490a79d9c797cd7910b71b69088f2"
CONFIG = "sha256:14eca0a571fb0902a838675525c6d5b076b10c2c627ee91c3070324f9d5d9ae6"
MANIFEST = "sha256:89337b7014fc6dcdb690c1b83f7aefa273253e5d5b4aab1896da3664e243c911"


def sha(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


def saved_blob(digest: str) -> bytes | None:
    p = SAVED / "blobs" / "sha256" / digest.split(":", 1)[1]
    return p.read_bytes() if p.is_file() else None


def image_config(diff_ids: list[str]) -> bytes:
    return json.dumps({"architecture": "amd64", "os": "linux",
                       "rootfs": {"type": "layers", "diff_ids": diff_ids}}).encode()


def manifest_for(config: bytes, layers: list[tuple[str, int]]) -> dict:
    return json.loads(wire.image_manifest(sha(config), len(config), [
        {"mediaType": GZIP.media_type, "digest": d, "size": n} for d, n in layers]))


IDS = [sha(b"layer-%d" % i) for i in range(3)]
BLOBS = [(sha(b"blob-%d" % i), 100 + i) for i in range(3)]


def facts(ids=IDS, blobs=BLOBS, how="sent") -> list[imagecheck.LayerFact]:
    return [imagecheck.LayerFact(d, n, i, how) for i, (d, n) in zip(ids, blobs)]


# --- what the registry may be given ---------------------------------------------------------

def test_a_manifest_that_describes_its_image_passes():
    config = image_config(IDS)
    assert imagecheck.check(manifest_for(config, BLOBS), config, facts()) == []


def test_the_old_images_manifest_as_the_config_is_refused():
    # The registry's corruption, as it happened: the config descriptor named a manifest.
    old_manifest = (SAVED / "blobs" / "sha256" / MANIFEST.split(":")[1]).read_bytes()
    got = imagecheck.check(manifest_for(old_manifest, BLOBS), old_manifest, facts())
    assert got and "not an image config: it is an image manifest" in got[0]
    # An index there is named as one too.
    index = saved_blob(IMAGE_ID)
    assert "it is an image index" in imagecheck.check(manifest_for(index, BLOBS), index,
                                                      facts())[0]


def test_diff_ids_must_match_the_layers_in_number():
    config = image_config(IDS[:1])  # "9 != 0" in miniature
    got = imagecheck.check(manifest_for(config, BLOBS), config, facts())
    assert any("lists 1 diff ids, the manifest 3 layers" in p for p in got), got


def test_diff_ids_must_match_the_layers_hashed_in_order():
    config = image_config(IDS)
    swapped = facts(ids=[IDS[1], IDS[0], IDS[2]])
    got = imagecheck.check(manifest_for(config, BLOBS), config, swapped)
    assert [p.split(":")[0] for p in got] == ["layer 0", "layer 1"], got


def test_each_layer_is_the_blob_sent_or_found():
    config = image_config(IDS)
    other = facts(blobs=[BLOBS[0], (BLOBS[1][0], 999), BLOBS[2]])
    assert any(p.startswith("layer 1: the manifest names") for p in
               imagecheck.check(manifest_for(config, BLOBS), config, other))
    elsewhere = facts(blobs=[BLOBS[0], BLOBS[1], (sha(b"x"), 102)])
    assert any(p.startswith("layer 2: the manifest names") for p in
               imagecheck.check(manifest_for(config, BLOBS), config, elsewhere))


def test_the_manifest_must_name_the_config_in_hand():
    config = image_config(IDS)
    m = manifest_for(config, BLOBS)
    m["config"]["digest"] = sha(b"another config")
    assert any("names config" in p for p in imagecheck.check(m, config, facts()))
    m = manifest_for(config, BLOBS)
    m["config"]["size"] += 1
    assert any("gives the config" in p for p in imagecheck.check(m, config, facts()))


def test_verify_compares_what_it_can_without_downloading_layers():
    config = image_config(IDS)
    unhashed = facts(ids=[None, None, None], how="registry")
    assert imagecheck.check(manifest_for(config, BLOBS), config, unhashed) == []
    missing = [imagecheck.LayerFact(d, -1, None, "registry") for d, _ in BLOBS]
    assert len(imagecheck.check(manifest_for(config, BLOBS), config, missing)) == 3


def test_a_config_without_platform_or_with_bad_diff_ids_is_no_image_config():
    assert imagecheck.config_problems(b"not json") == ["the config is not JSON"]
    assert imagecheck.config_problems(b"[]") == ["the config is not a JSON object"]
    no_os = json.dumps({"rootfs": {"type": "layers", "diff_ids": IDS}}).encode()
    assert imagecheck.config_problems(no_os) == ["the config names no os and architecture"]
    bad = image_config(["sha256:zz"])
    assert "not sha256 digests" in imagecheck.config_problems(bad)[0]


# --- the image in `docker save`, by store -----------------------------------------------------

def test_the_containerd_stores_save_resolves_to_the_platforms_manifest_and_config():
    found = exported.resolve(exported.top_entry((SAVED / "index.json").read_bytes(), IMAGE_ID),
                             saved_blob, "linux/amd64")
    assert (found.root, found.manifest_digest, found.config_digest) == (IMAGE_ID, MANIFEST,
                                                                        CONFIG)
    # The attestation manifest beside it (unknown/unknown) is not the image.
    assert len(found.layers) == 9 and all(la.kind == "gzip" for la in found.layers)
    assert list(found.diff_ids) == json.loads(found.config)["rootfs"]["diff_ids"]
    # Each layer by the blob name the save gives it, of the size the save sent.
    sizes = dict(line.split()[::-1] for line in (SAVED / "members.txt").read_text().splitlines())
    for la in found.layers:
        assert int(sizes[f"blobs/sha256/{la.digest.split(':')[1]}"]) == la.size
    # The documents read on the way, for the blob cache: the index, the manifest, the config.
    assert [d for d, _ in found.docs] == [IMAGE_ID, MANIFEST, CONFIG]


def test_the_layout_comes_in_an_order_that_names_layers_last():
    # Why the push cannot map a blob to its diff id as it comes: the recorded stream sends the
    # blobs sorted by digest, and index.json after all of them.
    names = [line.split()[1] for line in (SAVED / "members.txt").read_text().splitlines()]
    blobs = [n for n in names if n.startswith("blobs/")]
    assert blobs == sorted(blobs) and names.index("index.json") > names.index(blobs[-1])
    first_layer = min(names.index(f"blobs/sha256/{la.digest.split(':')[1]}")
                      for la in exported.resolve(IMAGE_ID, saved_blob, "linux/amd64").layers)
    assert first_layer < names.index(f"blobs/sha256/{MANIFEST.split(':')[1]}")


def test_a_document_that_does_not_hash_to_its_name_is_refused():
    def tampered(digest: str) -> bytes | None:
        data = saved_blob(digest)
        return data.replace(b'"amd64"', b'"arm64"') if digest == IMAGE_ID and data else data

    def changed_config(digest: str) -> bytes | None:
        return b"{}" if digest == CONFIG else saved_blob(digest)

    with pytest.raises(exported.LayoutError, match="does not hash to its name"):
        exported.resolve(IMAGE_ID, tampered, "linux/amd64")
    with pytest.raises(exported.LayoutError, match="does not hash to its name"):
        exported.resolve(IMAGE_ID, changed_config, "linux/amd64")


def test_an_image_without_the_platform_says_which_it_has():
    with pytest.raises(exported.LayoutError, match=r"no linux/arm64 manifest \(it has: .*"
                                                   r"linux/amd64"):
        exported.resolve(IMAGE_ID, saved_blob, "linux/arm64")


def test_index_json_names_the_saved_image():
    body = json.dumps({"manifests": [{"digest": "sha256:" + "1" * 64},
                                     {"digest": IMAGE_ID}]}).encode()
    assert exported.top_entry(body, IMAGE_ID) == IMAGE_ID
    one = json.dumps({"manifests": [{"digest": MANIFEST}]}).encode()
    assert exported.top_entry(one, IMAGE_ID) == MANIFEST  # the classic store: id = config's
    with pytest.raises(exported.LayoutError, match="names 2 images"):
        exported.top_entry(body, CONFIG)
    with pytest.raises(exported.LayoutError):
        exported.top_entry(b"[]", IMAGE_ID)


def test_the_classic_stores_layout_names_layers_by_diff_id_uncompressed():
    config = image_config(IDS)
    manifest = json.dumps({"schemaVersion": 2, "config": {
        "mediaType": "application/vnd.oci.image.config.v1+json", "digest": sha(config),
        "size": len(config)}, "layers": [{"mediaType": "application/vnd.oci.image.layer.v1.tar",
                                           "digest": d, "size": 10} for d in IDS]}).encode()
    docs = {sha(manifest): manifest, sha(config): config}
    found = exported.resolve(sha(manifest), docs.get, "linux/amd64")
    assert found.config_digest == sha(config) and [la.kind for la in found.layers] == ["tar"] * 3
    assert [la.digest for la in found.layers] == IDS
    # A manifest whose config lists fewer diff ids than it has layers is no image.
    short = image_config(IDS[:2])
    bad = manifest.replace(sha(config).encode(), sha(short).encode()).replace(
        b'"size": %d' % len(config), b'"size": %d' % len(short))
    with pytest.raises(exported.LayoutError, match="has 3 layers, its config 2 diff ids"):
        exported.resolve(sha(bad), {sha(bad): bad, sha(short): short}.get, "linux/amd64")


# --- which blob goes as it is ---------------------------------------------------------------

def test_a_blob_goes_as_it_is_only_in_the_compression_wanted():
    assert wire.as_it_is("gzip", GZIP) and wire.as_it_is("zstd", ZSTD)
    assert not wire.as_it_is("gzip", ZSTD) and not wire.as_it_is("tar", GZIP)
    assert kind_of("application/vnd.docker.image.rootfs.diff.tar.gzip") == "gzip"
    assert kind_of(ZSTD.media_type) == "zstd"
    assert kind_of("application/vnd.oci.image.layer.v1.tar") == "tar"


def test_a_blob_before_its_manifest_is_held_sent_or_kept_aside():
    def never() -> bool:
        raise AssertionError("the registry is asked only for a blob in the compression wanted")

    assert wire.early_blob("gzip", GZIP, False, lambda: True) == "held"
    assert wire.early_blob("gzip", GZIP, True, lambda: True) == "held"
    # Not held: everything needed means it goes at once; otherwise it may be a layer the
    # registry holds in another compression, so it is hashed on disk first.
    assert wire.early_blob("gzip", GZIP, True, lambda: False) == "send"
    assert wire.early_blob("gzip", GZIP, False, lambda: False) == "spool"
    assert wire.early_blob("gzip", ZSTD, True, never) == "send"
    assert wire.early_blob("tar", GZIP, False, never) == "spool"


def test_compressed_layers_read_back_whole_in_any_chunking():
    data = bytes(range(256)) * 40000
    two = zlib.compressobj(wbits=31)
    member = two.compress(data[:5000]) + two.flush()
    g = b"".join(_gzip([data], 5)) + member  # libdeflate's blocks, then one more member
    chunks = [g[i:i + 7] for i in range(0, 203, 7)] + [g[203:]]
    assert b"".join(decompressed(chunks, "gzip")) == data + data[:5000]
    z = zstandard.ZstdCompressor().compress(data)
    assert b"".join(decompressed([z + z], "zstd")) == data + data
    assert sniff(g) == "gzip" and sniff(z) == "zstd" and sniff(b"ustar") == "tar"
    for cut, kind in ((g[:-9], "gzip"), (z[:-9], "zstd")):
        with pytest.raises(ValueError, match="ends inside"):
            list(decompressed([cut], kind))
    with pytest.raises(ValueError):
        Inflater("lz4")


# --- which cached bytes are trusted -----------------------------------------------------------

def test_a_cached_config_is_trusted_only_as_this_images_config(tmp_path, monkeypatch):
    monkeypatch.setenv("IMGBUILD_CACHE", str(tmp_path))
    local = Repository.parse("imgbuild")  # no registry: the cache alone
    config = image_config(IDS)
    blobcache.keep_config(sha(config), config)
    assert wire._classic_config(local, sha(config), IDS) == (config, sha(config))
    # Another image's diff ids, or a manifest kept under the id: not this image's config.
    assert wire._classic_config(local, sha(config), IDS[:2]) == (None, None)
    manifest = saved_blob(MANIFEST)
    blobcache.keep_config(MANIFEST, manifest)
    assert wire._classic_config(local, MANIFEST, IDS) == (None, None)


def test_the_documents_a_push_kept_give_the_image_back_only_while_they_hash(tmp_path,
                                                                            monkeypatch):
    monkeypatch.setenv("IMGBUILD_CACHE", str(tmp_path))
    assert wire.saved_image(IMAGE_ID, "linux/amd64") is None
    for d in (IMAGE_ID, MANIFEST, CONFIG):
        blobcache.keep_config(d, saved_blob(d))
    assert wire.saved_image(IMAGE_ID, "linux/amd64").config_digest == CONFIG
    # A classic image's id is its config's: no layout to walk.
    assert wire.saved_image(CONFIG, "linux/amd64") is None
    path = tmp_path / "blobs" / "configs" / MANIFEST.replace(":", "-")
    path.write_bytes(path.read_bytes() + b" ")
    assert wire.saved_image(IMAGE_ID, "linux/amd64") is None


# --- a content tag the registry holds already -------------------------------------------------

def test_a_content_tag_is_pushed_only_where_the_registry_lacks_it():
    new = content_tag_way(None, False, pulled=False)
    assert new.push and new.attach
    pulled = content_tag_way(MANIFEST, True, pulled=True)
    assert not pulled.push and pulled.attach and "pulled from there" in pulled.said
    same = content_tag_way(MANIFEST, True, pulled=False)
    assert not same.push and same.attach
    # Another image under the tag (the same inputs built elsewhere): left alone, and nothing
    # this run made is put beside it (its report is about another digest).
    other = content_tag_way(MANIFEST, False, pulled=False)
    assert not other.push and not other.attach and "never move" in other.said


def test_the_push_paths_are_stream_safe(tmp_path):
    # _chunks replays the first bytes read for the sniff, then the rest of the member.
    f = io.BytesIO(b"rest")
    assert b"".join(wire._chunks(f, b"head-")) == b"head-rest"
    with wire._spooled(iter([b"\x1f\x8b" + b"x"]), "tar") as (spool, diff_id):
        assert spool.read() == b"\x1f\x8bx" and diff_id == sha(b"\x1f\x8bx")


def test_an_attestation_manifest_is_never_taken_for_the_image():
    # BuildKit marks its attestation manifests by annotation; one listed first, even under the
    # image's own platform, is passed over.
    index = json.loads(saved_blob(IMAGE_ID))
    att = next(m for m in index["manifests"]
               if m.get("annotations", {}).get("vnd.docker.reference.type"))
    att["platform"] = {"os": "linux", "architecture": "amd64"}
    index["manifests"].sort(key=lambda m: m is not att)
    body = json.dumps(index).encode()
    found = exported.resolve(sha(body), lambda d: body if d == sha(body) else saved_blob(d),
                             "linux/amd64")
    assert found.manifest_digest == MANIFEST
