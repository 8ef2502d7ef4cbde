"""The OCI layout walk of `docker save` (image/exported.py) on documents made here and on the
layout recorded from Docker Engine 26 with the containerd store, without the Engine: how deep
indexes may nest, which entry is a platform's (os and architecture both, attestations left
aside), the config's size as well as its digest, what counts as an index, which image
index.json names."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest

from imgbuild.image import exported
from imgbuild.image.compression import GZIP, ZSTD

SAVED = Path(__file__).parent / "fixtures" / "saved" / "containerd-26.1.5"
IMAGE_ID = "sha256:ee6deff38308ea62d56a9071b1d47b6972f490a79d9c797cd7910b71b69088f2"
MANIFEST = "sha256:89337b7014fc6dcdb690c1b83f7aefa273253e5d5b4aab1896da3664e243c911"


def sha(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


IDS = [sha(b"tar-%d" % i) for i in range(2)]


class Layout:
    """Documents by digest, as the save's small blobs are kept."""

    def __init__(self):
        self.blobs: dict[str, bytes] = {}

    def put(self, doc) -> str:
        data = doc if isinstance(doc, bytes) else json.dumps(doc).encode()
        self.blobs[sha(data)] = data
        return sha(data)

    def image(self, ids=IDS, media_type=GZIP.media_type, config_size_off: int = 0) -> str:
        config = json.dumps({"architecture": "amd64", "os": "linux",
                             "rootfs": {"type": "layers", "diff_ids": ids}}).encode()
        c = self.put(config)
        return self.put({"schemaVersion": 2, "mediaType": "application/vnd.oci.image.manifest.v1+json",
                         "config": {"mediaType": "application/vnd.oci.image.config.v1+json",
                                    "digest": c, "size": len(config) + config_size_off},
                         "layers": [{"mediaType": media_type, "digest": sha(b"blob-%d" % i),
                                     "size": 10 + i} for i in range(len(ids))]})

    def index(self, *entries: tuple[str, str | None, dict | None]) -> str:
        ms = []
        for digest, platform, ann in entries:
            m = {"mediaType": "application/vnd.oci.image.manifest.v1+json", "digest": digest,
                 "size": len(self.blobs[digest])}
            if platform:
                os_, _, arch = platform.partition("/")
                m["platform"] = {"os": os_, "architecture": arch}
            if ann:
                m["annotations"] = ann
            ms.append(m)
        return self.put({"schemaVersion": 2, "mediaType": exported.OCI_INDEX, "manifests": ms})


def test_an_image_is_found_through_up_to_three_indexes():
    lay = Layout()
    top = m = lay.image()
    for depth in range(1, 4):
        top = lay.index((top, "linux/amd64", None))
        got = exported.resolve(top, lay.blobs.get, "linux/amd64")
        assert got.manifest_digest == m and got.diff_ids == tuple(IDS) and got.root == top
        assert [d for d, _ in got.docs][-2:] == [m, got.config_digest]
        assert len(got.docs) == depth + 2  # each index, the manifest, the config
    deeper = lay.index((top, "linux/amd64", None))
    with pytest.raises(exported.LayoutError, match="nested deeper"):
        exported.resolve(deeper, lay.blobs.get, "linux/amd64")


def test_a_platforms_entry_matches_its_os_as_well_as_its_architecture():
    lay = Layout()
    win, linux = lay.image([IDS[0]]), lay.image()
    top = lay.index((win, "windows/amd64", None), (linux, "linux/amd64", None))
    assert exported.resolve(top, lay.blobs.get, "linux/amd64").manifest_digest == linux
    assert exported.resolve(top, lay.blobs.get, "windows/amd64").manifest_digest == win
    with pytest.raises(exported.LayoutError, match=r"no linux/arm64 manifest \(it has: "
                                                   r"linux/amd64, windows/amd64\)"):
        exported.resolve(top, lay.blobs.get, "linux/arm64")


def test_an_attestation_is_passed_over_and_the_first_entry_for_the_platform_is_taken():
    lay = Layout()
    att, first, second = lay.image([IDS[1]]), lay.image(), lay.image(IDS[::-1])
    top = lay.index((att, "linux/amd64", {"vnd.docker.reference.type": "attestation-manifest"}),
                    (first, "linux/amd64", None), (second, "linux/amd64", None))
    assert exported.resolve(top, lay.blobs.get, "linux/amd64").manifest_digest == first
    doc = json.loads(lay.blobs[top])
    assert exported.platform_entry(doc, "linux/amd64")["digest"] == first
    assert exported.platform_entry(doc, "linux/s390x") is None


def test_the_config_must_be_the_size_the_manifest_gives():
    lay = Layout()
    m = lay.image(config_size_off=1)
    with pytest.raises(exported.LayoutError, match="does not hash to its name"):
        exported.resolve(m, lay.blobs.get, "linux/amd64")


def test_a_layer_blobs_compression_is_its_media_types():
    lay = Layout()
    got = exported.resolve(lay.image(media_type=ZSTD.media_type), lay.blobs.get, "linux/amd64")
    assert [la.kind for la in got.layers] == ["zstd", "zstd"]
    assert got.by_digest()[sha(b"blob-1")] == exported.LayerBlob(sha(b"blob-1"), 11,
                                                                 ZSTD.media_type, IDS[1])


def test_what_counts_as_an_index():
    assert exported.is_index({"mediaType": exported.OCI_INDEX})
    assert exported.is_index({"mediaType": exported.DOCKER_LIST})
    assert exported.is_index({"manifests": []})  # an index that names no media type
    assert not exported.is_index({"manifests": [], "layers": []})
    assert not exported.is_index({"mediaType": "application/vnd.oci.image.manifest.v1+json",
                                  "layers": []})


def test_index_json_names_the_image_by_its_id_or_as_its_only_entry():
    two = json.dumps({"manifests": [{"digest": "sha256:a"}, {"digest": IMAGE_ID}]}).encode()
    assert exported.top_entry(two, IMAGE_ID) == IMAGE_ID
    one = json.dumps({"manifests": [{"digest": "sha256:a"}]}).encode()
    assert exported.top_entry(one, IMAGE_ID) == "sha256:a"
    with pytest.raises(exported.LayoutError, match="names 2 images"):
        exported.top_entry(two, "sha256:other")
    with pytest.raises(exported.LayoutError, match="names 0 images"):
        exported.top_entry(b'{"manifests": []}', IMAGE_ID)
    for bad in (b"{", b"[]", b'{"manifests": [{}]}'):
        with pytest.raises(exported.LayoutError, match="not an OCI index"):
            exported.top_entry(bad, IMAGE_ID)


def test_the_recorded_layout_walks_from_the_image_id_to_its_manifest():
    def blob(d: str) -> bytes | None:
        p = SAVED / "blobs" / "sha256" / d.split(":", 1)[1]
        return p.read_bytes() if p.is_file() else None

    got = exported.resolve(IMAGE_ID, blob, "linux/amd64")
    assert got.manifest_digest == MANIFEST and got.docs[0][0] == IMAGE_ID
    assert all(exported.digest_of(data) == d for d, data in got.docs)
    assert len(got.layers) == len(json.loads(got.config)["rootfs"]["diff_ids"])


def _short(d: str) -> str:
    return d[:19] + "…"


def test_each_broken_layout_is_named_with_the_document_at_fault():
    lay = Layout()

    def refused(root: str, blobs=None) -> str:
        with pytest.raises(exported.LayoutError) as e:
            exported.resolve(root, (blobs or lay.blobs).get, "linux/amd64")
        return str(e.value)

    missing = sha(b"nothing")
    assert refused(missing) == f"document {_short(missing)} is not in the layout"
    lie = dict(lay.blobs)
    m = lay.image()
    lie[m] = lay.blobs[m] + b" "
    assert refused(m, lie) == f"document {_short(m)} does not hash to its name"
    odd = lay.put({"schemaVersion": 2})
    assert refused(odd) == f"document {_short(odd)} is neither an index nor an image manifest"
    assert refused(lay.index()) == "the image holds no linux/amd64 manifest (it has: none)"
    # The config: absent, not its digest, not an image config.
    doc = json.loads(lay.blobs[m])
    cfg = doc["config"]["digest"]
    gone = {k: v for k, v in lay.blobs.items() if k != cfg}
    assert refused(m, gone) == f"the config {_short(cfg)} is not in the layout"
    swapped = dict(lay.blobs, **{cfg: b"{}"})
    assert refused(m, swapped) == f"the config {_short(cfg)} does not hash to its name"
    plain = b'{"architecture": "amd64"}'
    not_image = lay.put(plain)
    bad = lay.put({**doc, "config": {**doc["config"], "digest": not_image, "size": len(plain)}})
    assert refused(bad) == f"the config {_short(not_image)} is not an image config"
    # As many diff ids as layers.
    short = lay.put({**doc, "layers": doc["layers"][:1]})
    assert refused(short) == f"the manifest {_short(short)} has 1 layers, its config 2 diff ids"


def test_media_types_and_sizes_a_manifest_leaves_out_take_their_defaults():
    lay = Layout()
    m = lay.image()
    doc = json.loads(lay.blobs[m])
    del doc["config"]["mediaType"], doc["config"]["size"]
    for la in doc["layers"]:
        del la["mediaType"]
    bare = lay.put(doc)
    got = exported.resolve(bare, lay.blobs.get, "linux/amd64")
    assert got.config_media_type == "application/vnd.oci.image.config.v1+json"
    assert [la.media_type for la in got.layers] == ["", ""]
    assert got.config == lay.blobs[doc["config"]["digest"]]  # no size: the digest decides
