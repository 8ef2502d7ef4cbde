"""How a layer goes up (image/wire.py _upload, _send_chunks): the Distribution upload
protocol step by step (POST, one streamed PATCH, the closing PUT with the digest, each to the
Location the registry last gave), the digest computed on the way, what a push shows as it
goes, and the blob kept in the local cache for the next push. The registry side is scripted
as Distribution answers (each request checked: method, URL, scope, headers); against a real
Distribution registry, with real clients pulling back: tests/test_registry_client.py and
tests/test_push_refusal.py."""

from __future__ import annotations

import gzip
import hashlib
from types import SimpleNamespace

import pytest

from imgbuild.errors import EnvError, JobFailed
from imgbuild.image import blobcache, compression, wire

SCOPE = "repository:acme/serving:pull,push"


class Answer(SimpleNamespace):
    text = ""


class Distribution:
    """The registry's half of one blob upload, as Distribution answers it."""

    def __init__(self, *, patch_location: bool = True, start_query: bool = True,
                 patch_status: int = 202, drop: bool = False) -> None:
        self.calls: list[tuple[str, str]] = []
        self.received = b""
        self.blobs: dict[str, bytes] = {}
        self.patch_location, self.patch_status, self.drop = patch_location, patch_status, drop
        self.start = "/v2/acme/serving/blobs/uploads/u1" + ("?_state=a" if start_query else "")
        self.repo = SimpleNamespace(host="registry.example:5000", path="/v2/acme/serving",
                                    name="registry.example:5000/acme/serving",
                                    api=SimpleNamespace(request=self.request))

    def request(self, method, url, *, scope, data=None, headers=None):
        assert scope == SCOPE, scope
        self.calls.append((method, url))
        if method == "POST":
            assert url == "/v2/acme/serving/blobs/uploads/" and data is None
            return Answer(status_code=202, headers={"Location": self.start})
        if method == "PATCH":
            assert url == self.start
            assert headers == {"Content-Type": "application/octet-stream"}
            if self.drop:
                next(iter(data))
                raise EnvError("connection reset by peer", facts=["ECONNRESET"])
            self.received = b"".join(data)
            return Answer(status_code=self.patch_status, headers={
                "Location": "/v2/acme/serving/blobs/uploads/u1?_state=b"}
                if self.patch_location else {})
        if method == "PUT":
            base, _, digest = url.partition("digest=")
            assert headers == {"Content-Length": "0"} and data is None
            assert digest == "sha256:" + hashlib.sha256(self.received).hexdigest(), url
            self.blobs[digest] = self.received
            return Answer(status_code=201, headers={}, base=base)
        raise AssertionError(f"{method} {url}")


def test_a_blob_goes_up_in_one_patch_and_is_closed_where_the_registry_said(monkeypatch):
    reg = Distribution()
    body = [b"first ", b"second ", b"third"]
    digest, size = wire._upload(reg.repo, "/v2/acme/serving/blobs", SCOPE, iter(body), None)
    data = b"".join(body)
    assert (digest, size) == ("sha256:" + hashlib.sha256(data).hexdigest(), len(data))
    assert reg.blobs == {digest: data}
    # The PUT goes to the PATCH's Location, its query kept: `&digest=`.
    assert [m for m, _ in reg.calls] == ["POST", "PATCH", "PUT"]
    assert reg.calls[2][1] == f"/v2/acme/serving/blobs/uploads/u1?_state=b&digest={digest}"


def test_without_a_new_location_the_put_goes_to_the_first_one():
    reg = Distribution(patch_location=False, start_query=False, patch_status=204)
    digest, _ = wire._upload(reg.repo, "/v2/acme/serving/blobs", SCOPE, iter([b"x"]), None)
    assert reg.calls[2][1] == f"/v2/acme/serving/blobs/uploads/u1?digest={digest}"


def test_bytes_that_changed_while_read_are_refused_before_the_put():
    reg = Distribution()
    said = "sha256:" + "0" * 64
    with pytest.raises(JobFailed) as e:
        wire._upload(reg.repo, "/v2/acme/serving/blobs", SCOPE, iter([b"x"]), said)
    got = "sha256:" + hashlib.sha256(b"x").hexdigest()
    assert (e.value.message, e.value.facts) == (
        "push to registry.example:5000/acme/serving: a blob's bytes changed while it was read",
        [f"expected {said}", f"read     {got}"])
    assert [m for m, _ in reg.calls] == ["POST", "PATCH"] and reg.blobs == {}
    # The digest it was told, when the bytes match it, is what goes up.
    digest, _ = wire._upload(reg.repo, "/v2/acme/serving/blobs", SCOPE, iter([b"x"]), got)
    assert digest == got


def test_a_registry_that_goes_away_mid_upload_is_said_so_with_the_way_out():
    reg = Distribution(drop=True)
    with pytest.raises(EnvError) as e:
        wire._upload(reg.repo, "/v2/acme/serving/blobs", SCOPE, iter([b"a", b"b"]), None)
    assert (e.value.message, e.value.facts, e.value.hint) == (
        "registry registry.example:5000 went away during a push to /v2/acme/serving",
        ["ECONNRESET"],
        "nothing was tagged that points at a partial image; when the registry is back, run the "
        "command again (layers already pushed are not sent twice)")


@pytest.mark.parametrize("step, status", [("POST", 500), ("PATCH", 416), ("PUT", 400)])
def test_an_answer_the_protocol_does_not_allow_names_the_upload(step, status):
    reg = Distribution()
    real = reg.request

    def request(method, url, **kw):
        r = real(method, url, **kw)
        return Answer(status_code=status, headers=r.headers) if method == step else r
    reg.repo.api.request = request
    with pytest.raises(JobFailed) as e:
        wire._upload(reg.repo, "/v2/acme/serving/blobs", SCOPE, iter([b"x"]), None)
    assert e.value.message == f"registry registry.example:5000 answered {status} to a blob upload"


def test_a_layer_is_compressed_on_the_way_shown_as_it_goes_and_kept_for_the_next_push(
        tmp_path, monkeypatch):
    monkeypatch.setenv("IMGBUILD_CACHE", str(tmp_path / "cache"))
    monkeypatch.delenv("IMGBUILD_BLOB_CACHE_GB", raising=False)
    reg = Distribution()
    tar = [b"a" * 1000, b"b" * 500]
    shown: list[dict] = []
    gz = compression.compression("gzip")
    diff_id, held = wire._send_chunks(iter(tar), 1500, reg.repo, "/v2/acme/serving/blobs",
                                      SCOPE, gz, shown.append, "abc123")
    raw = b"".join(tar)
    assert diff_id == "sha256:" + hashlib.sha256(raw).hexdigest()
    [(digest, blob)] = reg.blobs.items()
    assert gzip.decompress(blob) == raw
    assert held == wire.Held(digest, len(blob), gz.media_type, 1500)
    assert shown == [
        {"id": "abc123", "status": "Pushing", "progressDetail": {"current": 1000, "total": 1500}},
        {"id": "abc123", "status": "Pushing", "progressDetail": {"current": 1500, "total": 1500}},
        {"id": "abc123", "status": "Pushed"}]
    kept = blobcache.layer(gz.recipe, diff_id)
    assert kept is not None and (kept.digest, kept.size, kept.tar_size) == (digest, len(blob), 1500)
    assert kept.path.read_bytes() == blob
    # A size not known ahead shows no total.
    shown.clear()
    wire._send_chunks(iter([b"c"]), -1, reg.repo, "/v2/acme/serving/blobs", SCOPE, gz,
                      shown.append, "def456")
    assert shown[0] == {"id": "def456", "status": "Pushing", "progressDetail": {"current": 1}}
    wire._send_chunks(iter([b"d"]), 0, reg.repo, "/v2/acme/serving/blobs", SCOPE, gz,
                      shown.append, "0")
    assert shown[-2]["progressDetail"] == {"current": 1, "total": 0}


def test_a_zstd_layer_records_the_tar_size_in_its_frame(monkeypatch, tmp_path):
    import zstandard

    monkeypatch.setenv("IMGBUILD_BLOB_CACHE_GB", "0")
    reg = Distribution()
    zs = compression.compression("zstd")
    wire._send_chunks(iter([b"z" * 3000]), 3000, reg.repo, "/v2/acme/serving/blobs", SCOPE, zs,
                      lambda e: None, "z")
    [blob] = reg.blobs.values()
    assert zstandard.get_frame_parameters(blob).content_size == 3000
