"""How signatures are read from and written to a registry in cosign's layout
(image/signstore.py fetch_layers, _put, keyless_identity), with the registry scripted as
Distribution answers. Decided and tested: a `.sig`/`.att` tag's layers are read with a bound
on how many and how large (a registry is read, never trusted to fill memory); blobs go up
before the manifest that names them; the keyless signer read back is the last signature that
names this very image.

Signing and verifying against a real registry, with cosign itself on the other end, is in
tests/test_sign_interop.py."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest

from imgbuild.image import cosign, keyless, registry, signstore

DIGEST = "sha256:" + "d" * 64


@pytest.fixture()
def held(monkeypatch):
    h = {"manifests": {}, "blobs": {}, "put": []}
    monkeypatch.setattr(registry, "get_manifest", lambda repo, tag: h["manifests"].get(tag))
    monkeypatch.setattr(registry, "get_blob", lambda repo, d: h["blobs"][d])
    monkeypatch.setattr(registry, "put_blob", lambda repo, blob: h["put"].append(("blob", blob)))
    monkeypatch.setattr(registry, "expect", lambda r, ok, repo, what: h["put"].append(
        ("expect", r, ok, what)))
    return h


def _layer(n: int, size: int = 10, **annotations) -> dict:
    return {"mediaType": "application/vnd.dev.cosign.simplesigning.v1+json",
            "digest": f"sha256:{n:064x}", "size": size, "annotations": annotations}


REPO = SimpleNamespace(name="127.0.0.1:5000/acme", path="/v2/acme")


def test_a_tag_the_registry_does_not_hold_has_no_layers(held):
    assert signstore.fetch_layers(REPO, "sha256-x.sig") is None


def test_layers_are_read_in_order_with_their_annotations(held):
    held["manifests"]["t.sig"] = ("sha256:m", {"layers": [_layer(1, sig="A"), _layer(2)]})
    held["blobs"] = {f"sha256:{1:064x}": b"one", f"sha256:{2:064x}": b"two"}
    got = signstore.fetch_layers(REPO, "t.sig")
    assert [(la.blob, la.annotations) for la in got] == [(b"one", {"sig": "A"}), (b"two", {})]


def test_odd_or_oversized_layers_are_not_read_and_the_count_is_bounded(held):
    layers = [_layer(1, size=signstore.MAX_BLOB + 1), "not a descriptor", _layer(2, size=-1),
              _layer(3, size=signstore.MAX_BLOB)]
    layers += [_layer(10 + n) for n in range(signstore.MAX_LAYERS + 5)]
    held["manifests"]["t.sig"] = ("sha256:m", {"layers": layers})
    held["blobs"] = {f"sha256:{n:064x}": b"x" for n in range(200)}
    got = signstore.fetch_layers(REPO, "t.sig")
    # of the first MAX_LAYERS descriptors, the four odd ones are left out but one
    assert len(got) == signstore.MAX_LAYERS - 3


def test_a_signature_manifest_goes_up_after_every_blob_it_names(held):
    asked = []
    api = SimpleNamespace(request=lambda method, url, **kw: asked.append((method, url, kw))
                          or "answer")
    repo = SimpleNamespace(name="127.0.0.1:5000/acme", path="/v2/acme", api=api,
                           scope=lambda *a: "repository:acme:" + ",".join(a))
    layers = [cosign.Layer("application/vnd.dev.cosign.simplesigning.v1+json", {}, b"payload")]
    assert signstore._put(repo, "sha256-x.sig", layers) == "sha256-x.sig"
    manifest, config = cosign.manifest_parts(layers)
    assert held["put"][:2] == [("blob", config), ("blob", b"payload")]
    [(method, url, kw)] = asked
    assert (method, url, kw["data"], kw["scope"]) == (
        "PUT", "/v2/acme/manifests/sha256-x.sig", manifest, "repository:acme:pull,push")
    assert kw["headers"] == {"Content-Type": registry.OCI_MANIFEST_TYPE}
    assert held["put"][2] == ("expect", "answer", (200, 201), "manifest sha256-x.sig")


def _signed(n: int, names: str, who: str | None) -> tuple[dict, bytes]:
    payload = json.dumps({"critical": {"image": {"docker-manifest-digest": names}}}).encode()
    return _layer(n, **({"who": who} if who else {})), payload


def test_the_keyless_signer_is_the_last_signature_naming_this_image(held, monkeypatch):
    monkeypatch.setattr(keyless, "leaf_identity", lambda annotations: annotations.get("who"))
    # a signature for another image, last: its signer is not this image's
    sigs = [_signed(1, DIGEST, "first signer"), _signed(3, DIGEST, "re-signer"),
            _signed(4, DIGEST, None), _signed(2, "sha256:" + "e" * 64, "elsewhere")]
    held["manifests"][cosign.sig_tag(DIGEST)] = ("sha256:m", {"layers": [d for d, _ in sigs]})
    held["blobs"] = {d["digest"]: p for d, p in sigs}
    held["blobs"][f"sha256:{5:064x}"] = b"not json"
    held["manifests"][cosign.sig_tag(DIGEST)][1]["layers"].append(_layer(5, who="unreadable"))
    assert signstore.keyless_identity(REPO, DIGEST) == "re-signer"
    assert signstore.keyless_identity(REPO, "sha256:" + "f" * 64) is None
