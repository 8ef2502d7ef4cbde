"""Which layers a push sends (image/wire.py), decided on plain data, without the Docker Engine
or a registry: what the registry's manifests say it holds, in which compression; which of
those it still holds (a HEAD); what is sent; what the push reports; the legacy save's
size shortcut; what this machine remembers it pushed."""

from __future__ import annotations

import hashlib
import json

import pytest

from imgbuild.image import imagecheck, wire
from imgbuild.image.compression import DOCKER_GZIP, GZIP, ZSTD


def sha(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


IDS = [sha(b"tar-%d" % i) for i in range(4)]


def layer(n: int, media_type: str = GZIP.media_type, tar_size: int | None = None) -> dict:
    d = {"mediaType": media_type, "digest": sha(b"blob-%d" % n), "size": 100 + n}
    if tar_size is not None:
        d["annotations"] = {wire.TAR_SIZE: str(tar_size)}
    return d


def config(ids: list[str]) -> dict:
    return {"architecture": "amd64", "os": "linux", "rootfs": {"type": "layers", "diff_ids": ids}}


# --- what the registry's manifests hold ------------------------------------------------------

def test_a_manifest_names_its_layers_by_diff_id_in_the_compression_wanted_only():
    doc = {"layers": [layer(0, tar_size=5000), layer(1, DOCKER_GZIP), layer(2, ZSTD.media_type),
                      layer(3)]}
    got = wire.held_in(doc, config(IDS), GZIP)
    # The diff id at i names the blob at i; Docker's gzip is gzip; zstd is not gzip.
    assert set(got) == {IDS[0], IDS[1], IDS[3]}
    assert got[IDS[0]] == wire.Held(sha(b"blob-0"), 100, GZIP.media_type, 5000)
    assert got[IDS[3]] == wire.Held(sha(b"blob-3"), 103, GZIP.media_type, None)
    # The layer's own media type is kept (the manifest put later names what the registry has).
    assert got[IDS[1]].media_type == DOCKER_GZIP and got[IDS[1]].digest == sha(b"blob-1")
    z = wire.held_in(doc, config(IDS), ZSTD)
    assert set(z) == {IDS[2]} and z[IDS[2]].digest == sha(b"blob-2") and z[IDS[2]].size == 102


def test_the_first_image_that_holds_a_layer_names_its_blob():
    first = wire.held_in({"layers": [layer(0)]}, config(IDS[:1]), GZIP)
    both = wire.held_in({"layers": [layer(7), layer(8)]}, config(IDS[:2]), GZIP, first)
    assert both is first
    assert both[IDS[0]].digest == sha(b"blob-0") and both[IDS[1]].digest == sha(b"blob-8")
    # Twice in one manifest: the first entry.
    twice = wire.held_in({"layers": [layer(0), layer(1)]}, config([IDS[0], IDS[0]]), GZIP)
    assert twice[IDS[0]].digest == sha(b"blob-0")


def test_a_manifest_without_diff_ids_names_nothing():
    assert wire.held_in({"layers": [layer(0)]}, {"rootfs": {}}, GZIP) == {}
    assert wire.held_in({"layers": [layer(0)]}, {}, GZIP) == {}


# --- which layers are sent -------------------------------------------------------------------

def held(n: int, tar_size: int | None = None) -> wire.Held:
    return wire.Held(sha(b"blob-%d" % n), 100 + n, GZIP.media_type, tar_size)


def test_only_the_layers_the_registry_lacks_are_sent():
    known = {IDS[1]: held(1), IDS[2]: held(2)}
    asked = []

    def holds(h: wire.Held) -> bool:
        asked.append(h.digest)
        return h.digest == sha(b"blob-1")

    have, needed = wire.layers_to_send(IDS, known, holds)
    assert have == {IDS[1]: held(1)}
    # Known but no longer held (a wiped registry) is sent; unknown ones are sent, in order.
    assert needed == [IDS[0], IDS[2], IDS[3]]
    # Only what is known is asked about, once each.
    assert asked == [sha(b"blob-1"), sha(b"blob-2")]


def test_a_layer_twice_in_an_image_is_sent_or_found_once():
    have, needed = wire.layers_to_send([IDS[0], IDS[1], IDS[0]], {}, lambda h: True)
    assert have == {} and needed == [IDS[0], IDS[1]]
    have, needed = wire.layers_to_send([IDS[0], IDS[0]], {IDS[0]: held(0)}, lambda h: True)
    assert have == {IDS[0]: held(0)} and needed == []


def test_a_blob_is_held_only_where_the_head_says_so_at_its_size():
    assert wire.head_holds(200, "100", 100)
    assert not wire.head_holds(200, "99", 100)  # another blob's size: not this one
    assert not wire.head_holds(200, "101", 100)
    assert not wire.head_holds(404, "100", 100)
    assert not wire.head_holds(307, "100", 100)  # only a 200 says it holds the blob
    assert not wire.head_holds(401, None, None)
    assert wire.head_holds(200, None, 100)  # a registry that gives no length: trusted
    assert wire.head_holds(200, "5", None)  # no size asked


def test_what_a_push_reports_counts_only_what_it_sent():
    have = {IDS[0]: held(0, 1000)}
    sent = {IDS[1]: held(1, 2000), IDS[2]: held(2)}
    how = {IDS[1]: "sent", IDS[2]: "cached"}
    ids = IDS[:3]
    got = wire.layers_of("sha256:img", ids, have, sent, how, b"{}", "sha256:cfg")
    assert got.sent_bytes == 101 + 102 and got.sent_layers == 2
    assert got.reused_layers == 1 and got.cached_layers == 1
    assert got.diff_ids == tuple(ids) and got.config == b"{}" and got.config_digest == "sha256:cfg"
    assert [d["digest"] for d in got.descriptors] == [sha(b"blob-%d" % i) for i in range(3)]
    assert got.descriptors[0]["annotations"] == {wire.TAR_SIZE: "1000"}
    assert "annotations" not in got.descriptors[2]
    assert got.facts == (imagecheck.LayerFact(sha(b"blob-0"), 100, IDS[0], "found"),
                         imagecheck.LayerFact(sha(b"blob-1"), 101, IDS[1], "sent"),
                         imagecheck.LayerFact(sha(b"blob-2"), 102, IDS[2], "cached"))


def test_a_layer_held_and_sent_is_described_as_held():
    got = wire.layers_of("i", IDS[:1], {IDS[0]: held(0)}, {IDS[0]: held(5)}, {}, None, None)
    assert got.descriptors[0]["digest"] == sha(b"blob-0") and got.facts[0].how == "found"


def test_the_descriptor_and_manifest_say_what_the_registry_holds():
    assert wire.descriptor(held(3, 77)) == {"mediaType": GZIP.media_type, "digest": sha(b"blob-3"),
                                            "size": 103,
                                            "annotations": {wire.TAR_SIZE: "77"}}
    assert wire.descriptor(held(3, 0))["annotations"] == {wire.TAR_SIZE: "0"}
    doc = json.loads(wire.image_manifest("sha256:c", 12, [{"a": 1}, {"b": 2}]))
    assert doc["config"] == {"mediaType": wire.OCI_CONFIG, "digest": "sha256:c", "size": 12}
    assert doc["layers"] == [{"a": 1}, {"b": 2}] and doc["mediaType"] == wire.OCI_MANIFEST
    assert doc["schemaVersion"] == 2


# --- the legacy save: which members are hashed before they are compressed --------------------

def test_a_member_the_size_of_a_held_layer_is_hashed_first_only_while_sizes_are_trusted():
    have = {IDS[0]: held(0, 1000), IDS[1]: held(1), IDS[2]: held(2, 3000)}
    assert wire.held_tar_sizes(have, True) == {1000, 3000}
    assert wire.held_tar_sizes(have, False) == set()  # the second pass compresses all it cannot name
    want = {IDS[3]}
    assert not wire.legacy_compress(1000, {1000, 3000}, want)
    assert wire.legacy_compress(1001, {1000, 3000}, want)
    assert not wire.legacy_compress(1001, {1000}, set())  # nothing wanted: only hashed


# --- which Engine names images by manifest digest --------------------------------------------

def test_the_containerd_store_is_told_by_its_snapshotter_driver_type():
    assert wire.containerd_ids({"DriverStatus": [["driver-type", "io.containerd.snapshotter.v1"]]})
    assert not wire.containerd_ids({"DriverStatus": [["Backing Filesystem", "extfs"],
                                                     ["Supports d_type", "true"]]})
    assert not wire.containerd_ids({"DriverStatus": None})
    assert not wire.containerd_ids({})
    assert not wire.containerd_ids({"DriverStatus": [["a", "b", "c"], ["x"]]})
    assert not wire.containerd_ids({"DriverStatus": 5})


# --- what this machine remembers it pushed ----------------------------------------------------

@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("IMGBUILD_CACHE", str(tmp_path))
    return tmp_path


def test_what_was_pushed_is_remembered_per_registry_and_compression(cache):
    assert wire.pushed_before("r:5000", GZIP) == {}
    wire.remember_pushed("r:5000", GZIP, {IDS[0]: held(0, 1000)})
    wire.remember_pushed("r:5000", GZIP, {IDS[1]: held(1)})
    wire.remember_pushed("other:5000", GZIP, {IDS[2]: held(2)})
    got = wire.pushed_before("r:5000", GZIP)
    assert got == {IDS[0]: held(0, 1000), IDS[1]: held(1)}
    assert wire.pushed_before("r:5000", ZSTD) == {}
    assert set(wire.pushed_before("other:5000", GZIP)) == {IDS[2]}
    z = wire.Held(sha(b"z"), 9, ZSTD.media_type, 10)
    wire.remember_pushed("r:5000", ZSTD, {IDS[0]: z})
    assert wire.pushed_before("r:5000", ZSTD) == {IDS[0]: z}
    assert wire.pushed_before("r:5000", GZIP)[IDS[0]] == held(0, 1000)


def test_nothing_sent_writes_nothing_and_a_damaged_record_is_no_hint(cache):
    wire.remember_pushed("r", GZIP, {})
    assert not (cache / "pushed-layers.json").exists()
    (cache / "pushed-layers.json").write_text("[1, 2")
    assert wire.pushed_before("r", GZIP) == {}
    wire.remember_pushed("r", GZIP, {IDS[0]: held(0)})  # a damaged record is started again
    assert wire.pushed_before("r", GZIP) == {IDS[0]: held(0)}
    (cache / "pushed-layers.json").write_text(json.dumps({"r": {"gzip": {IDS[0]: {"digest": 1}}}}))
    assert wire.pushed_before("r", GZIP) == {}


def test_where_a_blob_went_is_remembered_latest_first_and_only_for_that_blob(cache):
    wire.remember_pushed("r", GZIP, {IDS[0]: held(0), IDS[1]: held(1)}, "team/a")
    wire.remember_pushed("r", GZIP, {IDS[0]: held(0)}, "team/b")
    wire.remember_pushed("r", GZIP, {IDS[0]: held(0)}, "team/a")  # again: first, once
    assert wire.mount_sources("r", GZIP) == {IDS[0]: ("team/a", "team/b"), IDS[1]: ("team/a",)}
    assert wire.mount_sources("r", ZSTD) == {} and wire.mount_sources("s", GZIP) == {}
    for n in range(6):
        wire.remember_pushed("r", GZIP, {IDS[1]: held(1)}, f"r{n}")
    assert wire.mount_sources("r", GZIP)[IDS[1]] == ("r5", "r4", "r3", "r2")  # the latest 4
    # Another blob for the same layer (compressed again, other bytes): the repositories that
    # held the old one are no source of the new.
    wire.remember_pushed("r", GZIP, {IDS[1]: held(2)}, "team/c")
    assert wire.mount_sources("r", GZIP)[IDS[1]] == ("team/c",)
    assert wire.pushed_before("r", GZIP)[IDS[1]] == held(2)
    # A record written before mounts (no repositories) is no source, and still a hint.
    (cache / "pushed-layers.json").write_text(json.dumps(
        {"r": {"gzip": {IDS[0]: {"digest": held(0).digest, "size": held(0).size}}}}))
    assert wire.mount_sources("r", GZIP) == {IDS[0]: ()}
    assert wire.pushed_before("r", GZIP) == {IDS[0]: held(0)}
    wire.remember_pushed("r", GZIP, {IDS[0]: held(0)})  # no repository named: none added
    assert wire.mount_sources("r", GZIP) == {IDS[0]: ()}


def test_a_layer_is_mounted_only_from_another_repository_that_had_its_blob():
    known = {IDS[0]: held(0), IDS[1]: held(1), IDS[2]: held(2)}
    sources = {IDS[0]: ("team/a", "team/b"), IDS[1]: ("team/x",), IDS[3]: ("team/a",)}
    got = wire.mounts_to_try([IDS[0], IDS[1], IDS[2], IDS[3]], known, sources, "team/a")
    # IDS[0]: not from the target itself; IDS[2]: no source known; IDS[3]: no blob known.
    assert got == [(IDS[0], held(0), ("team/b",)), (IDS[1], held(1), ("team/x",))]
    assert wire.mounts_to_try([], known, sources, "team/c") == []
    assert wire.mounts_to_try([IDS[0]], known, sources, "team/c") == \
        [(IDS[0], held(0), ("team/a", "team/b"))]


def test_only_a_201_for_that_blob_is_a_mount():
    d = sha(b"blob-0")
    assert wire.mount_took(201, d, d) and wire.mount_took(201, None, d)
    assert not wire.mount_took(201, sha(b"other"), d)
    assert not wire.mount_took(202, d, d)  # an upload opened instead
    assert not wire.mount_took(404, None, d) and not wire.mount_took(401, None, d)


# --- before the manifest is put ----------------------------------------------------------------

def test_a_layer_found_rather_than_sent_is_asked_for_again():
    facts = [imagecheck.LayerFact(sha(b"blob-0"), 100, IDS[0], "found"),
             imagecheck.LayerFact(sha(b"blob-1"), 101, IDS[1], "sent"),
             imagecheck.LayerFact(sha(b"blob-2"), 102, IDS[2], "cached"),
             imagecheck.LayerFact(sha(b"blob-3"), 103, IDS[3], "found")]
    asked = []

    def holds(digest: str, size: int) -> bool:
        asked.append((digest, size))
        return digest != sha(b"blob-3")

    got = wire.gone_layers(facts, holds)
    assert asked == [(sha(b"blob-0"), 100), (sha(b"blob-3"), 103)]  # only what was found
    assert got == [f"layer 3: the registry no longer holds {sha(b'blob-3')[:19]}… of 103 bytes"]
    assert wire.gone_layers(facts[1:3], lambda d, n: False) == []
    # A mounted layer is the registry's too: asked for again as well.
    mounted = [imagecheck.LayerFact(sha(b"blob-0"), 100, IDS[0], "mounted")]
    assert wire.gone_layers(mounted, lambda d, n: False) == \
        [f"layer 0: the registry no longer holds {sha(b'blob-0')[:19]}… of 100 bytes"]
    assert wire.layers_of("i", [IDS[0]], {IDS[0]: held(0)}, {}, {IDS[0]: "mounted"}, None,
                          None).mounted_layers == 1


def test_a_content_tag_is_put_once_and_never_moved():
    assert wire.content_tag_put(None, "sha256:a") == "put"
    assert wire.content_tag_put("sha256:a", "sha256:a") == "there"
    assert wire.content_tag_put("sha256:b", "sha256:a") == "taken"
