"""What a manifest must be before a registry is given it (image/imagecheck.py), the cases
tests/test_publish_checks.py leaves open: each part of an image config, a layer count that
only the facts get wrong, a wrong config size that still lets the layers be compared, and
digests that are nearly sha256's."""

from __future__ import annotations

import hashlib
import json

from imgbuild.image import imagecheck, wire
from imgbuild.image.compression import GZIP


def sha(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


IDS = [sha(b"tar-%d" % i) for i in range(2)]
BLOBS = [(sha(b"blob-%d" % i), 10 + i) for i in range(2)]


def cfg(**over) -> bytes:
    doc = {"architecture": "amd64", "os": "linux", "rootfs": {"type": "layers", "diff_ids": IDS}}
    doc.update(over)
    return json.dumps(doc).encode()


def manifest(config: bytes, blobs=BLOBS, size: int | None = None) -> dict:
    return json.loads(wire.image_manifest(sha(config), len(config) if size is None else size,
                                          [{"mediaType": GZIP.media_type, "digest": d, "size": n}
                                           for d, n in blobs]))


def facts(ids=IDS, blobs=BLOBS) -> list[imagecheck.LayerFact]:
    return [imagecheck.LayerFact(d, n, i, "sent") for i, (d, n) in zip(ids, blobs)]


def test_an_image_config_names_os_and_architecture_both():
    assert imagecheck.config_problems(cfg()) == []
    assert imagecheck.config_problems(cfg(os="")) == ["the config names no os and architecture"]
    assert imagecheck.config_problems(cfg(architecture=None)) == \
        ["the config names no os and architecture"]


def test_its_rootfs_is_of_layers_with_a_list_of_sha256_digests():
    assert "not an image config" in imagecheck.config_problems(
        cfg(rootfs={"type": "other", "diff_ids": IDS}))[0]
    assert "not an image config" in imagecheck.config_problems(
        cfg(rootfs={"type": "layers", "diff_ids": "sha256:x"}))[0]
    assert "not an image config: it is an image index" in imagecheck.config_problems(
        json.dumps({"manifests": []}).encode())[0]
    assert imagecheck.config_problems(b"[1]") == ["the config is not a JSON object"]
    assert imagecheck.config_problems(b"{") == ["the config is not JSON"]
    for bad in ("sha256:" + "a" * 63, "sha256:" + "a" * 65, "sha256:" + "A" * 64,
                "sha512:" + "a" * 64, " sha256:" + "a" * 64, "sha256:" + "a" * 64 + "\n", 5):
        got = imagecheck.config_problems(cfg(rootfs={"type": "layers", "diff_ids": [IDS[0], bad]}))
        assert got == ["the config's rootfs.diff_ids hold 1 entries that are not sha256 "
                       "digests"], bad


def test_layers_sent_or_found_must_be_as_many_as_the_config_and_manifest_name():
    c = cfg()
    assert imagecheck.check(manifest(c), c, facts()) == []
    got = imagecheck.check(manifest(c), c, facts()[:1])
    assert got == ["the config lists 2 diff ids, the manifest 2 layers, and 1 layers were sent "
                   "or found"]
    got = imagecheck.check(manifest(c), c, facts() + facts()[:1])
    assert len(got) == 1 and "3 layers were sent" in got[0]


def test_a_wrong_config_size_does_not_hide_a_wrong_layer():
    c = cfg()
    bad = facts(ids=[IDS[0], sha(b"other")])
    got = imagecheck.check(manifest(c, size=len(c) + 1), c, bad)
    assert got[0].startswith(f"the manifest gives the config {len(c) + 1} bytes")
    assert len(got) == 2 and got[1].startswith("layer 1: the config says")


def test_diff_ids_read_from_any_config():
    assert imagecheck.diff_ids(cfg()) == IDS
    assert imagecheck.diff_ids(b"{") == [] and imagecheck.diff_ids(b"[1]") == []
    assert imagecheck.diff_ids(b"null") == [] and imagecheck.diff_ids(b"{}") == []


def test_every_problem_of_a_manifest_is_said_word_for_word():
    """What the push prints before it refuses a manifest: each digest shortened to its first
    19 characters ("sha256:" and 12 hex), each count and size as it is."""
    c = cfg()
    m = manifest(c)
    m["config"] = {"digest": IDS[1], "size": len(c)}
    assert imagecheck.check(m, c, facts()) == [
        f"the manifest names config {IDS[1][:19]}…, the config in hand is {sha(c)[:19]}…"]
    m["config"] = {"size": len(c)}
    assert imagecheck.check(m, c, facts()) == [
        f"the manifest names config None…, the config in hand is {sha(c)[:19]}…"]
    m["config"] = {"digest": sha(c)}
    assert imagecheck.check(m, c, facts()) == [
        f"the manifest gives the config None bytes, it has {len(c)}"]

    bad = facts(ids=[IDS[0], sha(b"other")])
    assert imagecheck.check(manifest(c), c, bad) == [
        f"layer 1: the config says {IDS[1][:19]}…, the layer sent hashes to "
        f"{sha(b'other')[:19]}…"]
    elsewhere = [imagecheck.LayerFact(BLOBS[0][0], BLOBS[0][1], None, "registry"),
                 imagecheck.LayerFact(sha(b"x"), 99, None, "mounted")]
    assert imagecheck.check(manifest(c), c, elsewhere) == [
        f"layer 1: the manifest names {BLOBS[1][0][:19]}… ({BLOBS[1][1]} bytes), the blob "
        f"mounted is {sha(b'x')[:19]}… (99 bytes)"]
    m = manifest(c)
    m["layers"][0] = {"mediaType": GZIP.media_type}
    assert imagecheck.check(m, c, facts()) == [
        f"layer 0: the manifest names None… (None bytes), the blob sent is "
        f"{BLOBS[0][0][:19]}… ({BLOBS[0][1]} bytes)"]
    m = manifest(c)
    m["layers"][1]["size"] += 1
    assert imagecheck.check(m, c, facts()) == [
        f"layer 1: the manifest names {BLOBS[1][0][:19]}… ({BLOBS[1][1] + 1} bytes), the blob "
        f"sent is {BLOBS[1][0][:19]}… ({BLOBS[1][1]} bytes)"]


def test_a_config_that_is_no_image_config_stops_the_check_there():
    """With no diff ids to compare, the layers are not counted against them."""
    idx = json.dumps({"manifests": [], "schemaVersion": 2}).encode()
    assert imagecheck.check(manifest(idx), idx, facts()) == [
        "the config is not an image config: it is an image index (keys: manifests, "
        "schemaVersion)"]
    m = manifest(cfg())
    assert imagecheck.check(m, b"{", facts()) == [
        "the config is not JSON",
        f"the manifest names config {m['config']['digest'][:19]}…, the config in hand is "
        f"{sha(b'{')[:19]}…",
        f"the manifest gives the config {m['config']['size']} bytes, it has 1"]
    # A config that is an image config but wrong in part still has its layers compared.
    c = cfg(os="")
    assert imagecheck.check(manifest(c), c, facts()[:1]) == [
        "the config names no os and architecture",
        "the config lists 2 diff ids, the manifest 2 layers, and 1 layers were sent or found"]


def test_what_a_config_that_is_not_one_is_named():
    def said(doc) -> list[str]:
        return imagecheck.config_problems(json.dumps(doc).encode())

    assert said({"layers": [], "config": {}, "schemaVersion": 2}) == [
        "the config is not an image config: it is an image manifest (keys: config, layers, "
        "schemaVersion)"]
    assert said({"layers": []}) == [
        "the config is not an image config: it is another document (keys: layers)"]
    assert said({"config": {}}) == [
        "the config is not an image config: it is another document (keys: config)"]
    assert said({}) == ["the config is not an image config: it is another document (keys: none)"]
    assert said({"rootfs": {"type": "layers"}, "os": "linux"}) == [
        "the config is not an image config: it is another document (keys: os, rootfs)"]
    assert said({"rootfs": ["layers"]}) == [
        "the config is not an image config: it is another document (keys: rootfs)"]
    assert said({"architecture": "amd64", "rootfs": {"type": "layers", "diff_ids": IDS}}) == [
        "the config names no os and architecture"]
    assert said({"os": "linux", "architecture": "arm64",
                 "rootfs": {"type": "layers", "diff_ids": ["x", 1, IDS[0]]}}) == [
        "the config's rootfs.diff_ids hold 2 entries that are not sha256 digests"]
