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


SCOPE = "repository:acme:pull,push"


class Registry:
    """HEAD of a blob (held or not, at a size), PUT of a manifest (201, its digest said); each
    request checked: its scope, and a manifest's media type."""

    def __init__(self, blobs: dict[str, int] | None = None, tags: dict[str, str] | None = None,
                 said: str | None = None):
        self.blobs, self.tags, self.said, self.calls = dict(blobs or {}), dict(tags or {}), \
            said, []
        self.put_status = 201

    def request(self, method, url, *, scope, data=None, headers=None):
        assert scope == SCOPE, scope
        self.calls.append((method, url))
        if method == "HEAD":
            assert url.startswith("/v2/acme/blobs/sha256:") and data is None, url
            digest = url.rsplit("/", 1)[1]
            size = self.blobs.get(digest)
            return SimpleNamespace(status_code=200 if size is not None else 404,
                                   headers={"Content-Length": str(size or 0)}, text="")
        assert method == "PUT" and url.startswith("/v2/acme/manifests/"), (method, url)
        assert headers == {"Content-Type": "application/vnd.oci.image.manifest.v1+json"}
        if self.put_status != 201:
            return SimpleNamespace(status_code=self.put_status, headers={}, text="not now")
        self.tags[url.rsplit("/", 1)[1]] = "sha256:" + hashlib.sha256(data).hexdigest()
        return SimpleNamespace(status_code=201, headers={
            "Docker-Content-Digest": self.said or self.tags[url.rsplit("/", 1)[1]]})


@pytest.fixture()
def reg(monkeypatch):
    r = Registry()
    repo = SimpleNamespace(name="127.0.0.1:5000/acme", host="127.0.0.1:5000", path="/v2/acme",
                           api=r, scope=lambda *a: "repository:acme:" + ",".join(a))
    uploads = []

    def upload(to, blobs, scope, body, digest):
        assert (to, blobs, scope) == (repo, "/v2/acme/blobs", SCOPE)
        uploads.append((digest, b"".join(body)))
        return digest, 0

    def manifest_digest(of, tag):
        assert of is repo
        return r.tags.get(tag)
    monkeypatch.setattr(wire, "_upload", upload)
    monkeypatch.setattr(registry, "manifest_digest", manifest_digest)
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


def test_a_config_held_at_another_size_is_sent_and_a_found_layer_must_have_its_size(reg):
    reg.api.blobs[sha(CONFIG)] = len(CONFIG) + 1
    wire.checked_put(reg.repo, "t-1", MANIFEST, CONFIG, _facts(), ref="acme:t-1")
    assert reg.uploads == [(sha(CONFIG), CONFIG)]
    reg.api.blobs.update({d: n + 1 for d, n in BLOBS})  # held, but not these bytes
    with pytest.raises(JobFailed) as e:
        wire.checked_put(reg.repo, "t-2", MANIFEST, CONFIG, _facts("found"), ref="acme:t-2")
    assert len(e.value.facts) == len(BLOBS)
    assert e.value.hint == ("no manifest and no tag was written; the Engine's copy of the image "
                            "does not add up (`docker image inspect` it, rebuild it with "
                            "--rebuild), or report it with these facts")


def test_checked_put_keeps_a_content_tag_where_it_is(reg):
    assert wire.checked_put(reg.repo, "ct", MANIFEST, CONFIG, _facts(), ref="acme:ct",
                            immutable=True) == DIGEST
    other = MANIFEST.replace(b'"schemaVersion"', b' "schemaVersion"')
    with pytest.raises(wire.TagTaken) as e:
        wire.checked_put(reg.repo, "ct", other, CONFIG, _facts(), ref="acme:ct",
                         immutable=True)
    assert e.value.hint == ("nothing was written; the registry's image stays the one its "
                            "content tag names")
    assert e.value.facts == [f"the registry holds {DIGEST}",
                             "this push made    sha256:" + hashlib.sha256(other).hexdigest()]
    # Not a content tag: the same call moves it.
    assert wire.checked_put(reg.repo, "ct", other, CONFIG, _facts(), ref="acme:ct") != DIGEST


def test_a_manifest_the_registry_does_not_take_is_named(reg):
    reg.api.put_status = 202
    with pytest.raises(JobFailed) as e:
        wire.put_manifest(reg.repo, "t", MANIFEST)
    assert e.value.message == "registry 127.0.0.1:5000 answered 202 to the manifest of t"
