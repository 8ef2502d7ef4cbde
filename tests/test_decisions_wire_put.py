"""The last step of a push (image/wire.py checked_put, put_manifest), with the registry
scripted as Distribution answers: a manifest is written only once it describes the config in
hand and the layers as they were sent or found (a found layer asked again: is it still held),
the config goes up first where the registry lacks it, and a content tag never moves: the same
manifest is not sent again, another is refused with nothing written. The whole push runs
against real registries in tests/test_docker.py and tests/test_push_refusal.py."""

from __future__ import annotations

import hashlib
from types import SimpleNamespace

import pytest

from imgbuild.errors import JobFailed
from imgbuild.image import imagecheck, registry, wire

from .test_decisions_image_imagecheck import BLOBS, IDS, cfg, sha

CONFIG = cfg()
MANIFEST = wire.image_manifest(sha(CONFIG), len(CONFIG),
                               [{"mediaType": "application/vnd.oci.image.layer.v1.tar+gzip",
                                 "digest": d, "size": n} for d, n in BLOBS])
DIGEST = "sha256:" + hashlib.sha256(MANIFEST).hexdigest()


class Registry:
    """HEAD of a blob (held or not, at a size), PUT of a manifest (201, its digest said)."""

    def __init__(self, blobs: dict[str, int] | None = None, tags: dict[str, str] | None = None,
                 said: str | None = None):
        self.blobs, self.tags, self.said, self.calls = dict(blobs or {}), dict(tags or {}), \
            said, []

    def request(self, method, url, **kw):
        self.calls.append((method, url))
        if method == "HEAD":
            digest = url.rsplit("/", 1)[1]
            size = self.blobs.get(digest)
            return SimpleNamespace(status_code=200 if size is not None else 404,
                                   headers={"Content-Length": str(size or 0)})
        assert method == "PUT"
        data = kw["data"]
        self.tags[url.rsplit("/", 1)[1]] = "sha256:" + hashlib.sha256(data).hexdigest()
        return SimpleNamespace(status_code=201, headers={
            "Docker-Content-Digest": self.said or self.tags[url.rsplit("/", 1)[1]]})


@pytest.fixture()
def reg(monkeypatch):
    r = Registry()
    repo = SimpleNamespace(name="127.0.0.1:5000/acme", host="127.0.0.1:5000", path="/v2/acme",
                           api=r, scope=lambda *a: "scope")
    uploads = []
    monkeypatch.setattr(wire, "_upload", lambda repo, blobs, scope, body, digest: uploads.append(
        (digest, b"".join(body))) or (digest, 0))
    monkeypatch.setattr(registry, "manifest_digest", lambda repo, tag: r.tags.get(tag))
    monkeypatch.setattr(registry, "expect", lambda resp, ok, repo, what: None)
    return SimpleNamespace(repo=repo, api=r, uploads=uploads)


def _facts(how="sent"):
    return [imagecheck.LayerFact(d, n, i, how) for i, (d, n) in zip(IDS, BLOBS)]


def _puts(reg) -> list[str]:
    return [url for m, url in reg.api.calls if m == "PUT"]


def test_a_manifest_that_describes_the_image_is_put_after_its_config(reg):
    got = wire.checked_put(reg.repo, "t-1", MANIFEST, CONFIG, _facts(), ref="acme:t-1")
    assert got == DIGEST and _puts(reg) == ["/v2/acme/manifests/t-1"]
    assert reg.uploads == [(sha(CONFIG), CONFIG)]  # the registry lacked the config: sent first


def test_a_config_the_registry_holds_is_not_sent_again(reg):
    reg.api.blobs[sha(CONFIG)] = len(CONFIG)
    wire.checked_put(reg.repo, "t-1", MANIFEST, CONFIG, _facts(), ref="acme:t-1")
    assert reg.uploads == []


def test_a_manifest_that_does_not_describe_the_image_is_refused_and_nothing_written(reg):
    other = cfg(architecture="arm64", rootfs={"type": "layers", "diff_ids": IDS[:1]})
    with pytest.raises(JobFailed) as e:
        wire.checked_put(reg.repo, "t-1", MANIFEST, other, _facts(), ref="acme:t-1")
    assert e.value.message == "push of acme:t-1 refused: the manifest would not describe the image"
    assert e.value.facts and e.value.hint.startswith("no manifest and no tag was written")
    assert _puts(reg) == [] and reg.uploads == []


def test_a_layer_found_in_the_registry_must_still_be_there(reg):
    held = dict(BLOBS[:1])  # the second found layer went away meanwhile
    reg.api.blobs.update(held)
    with pytest.raises(JobFailed) as e:
        wire.checked_put(reg.repo, "t-1", MANIFEST, CONFIG, _facts("found"), ref="acme:t-1")
    assert e.value.facts == [f"layer 1: the registry no longer holds {BLOBS[1][0][:19]}… of "
                             f"{BLOBS[1][1]} bytes"]
    assert _puts(reg) == []
    reg.api.blobs.update(dict(BLOBS))
    assert wire.checked_put(reg.repo, "t-1", MANIFEST, CONFIG, _facts("found"),
                            ref="acme:t-1") == DIGEST


def test_a_content_tag_is_put_once_and_never_moved(reg):
    assert wire.put_manifest(reg.repo, "ct", MANIFEST, immutable=True) == DIGEST
    assert wire.put_manifest(reg.repo, "ct", MANIFEST, immutable=True) == DIGEST  # there: no PUT
    assert _puts(reg) == ["/v2/acme/manifests/ct"]
    other = MANIFEST.replace(b'"schemaVersion"', b' "schemaVersion"')
    with pytest.raises(wire.TagTaken) as e:
        wire.put_manifest(reg.repo, "ct", other, immutable=True)
    assert e.value.message == "127.0.0.1:5000/acme:ct already names another image; content " \
                              "tags never move"
    assert e.value.facts[0] == f"the registry holds {DIGEST}"
    assert _puts(reg) == ["/v2/acme/manifests/ct"] and reg.api.tags["ct"] == DIGEST
    # a moving tag moves
    wire.put_manifest(reg.repo, "latest", MANIFEST)
    wire.put_manifest(reg.repo, "latest", other)
    assert reg.api.tags["latest"] != DIGEST


def test_a_registry_that_stored_other_bytes_than_were_sent_is_said_so(reg):
    reg.api.said = "sha256:" + "e" * 64
    with pytest.raises(JobFailed) as e:
        wire.put_manifest(reg.repo, "t", MANIFEST)
    assert e.value.message == f"registry 127.0.0.1:5000 stored the manifest of t as {reg.api.said}"
    assert e.value.facts == [f"imgbuild sent {DIGEST}"]
