"""How signatures are read from and written to a registry in cosign's layout
(image/signstore.py fetch_layers, _put, keyless_identity), with the registry scripted as
Distribution answers. Decided and tested: a `.sig`/`.att` tag's layers are read with a bound
on how many and how large (a registry is read, never trusted to fill memory); blobs go up
before the manifest that names them; the keyless signer read back is the last signature that
names this very image.

Signing and verifying against a real registry, with cosign itself on the other end, is in
tests/test_sign_interop.py."""

from __future__ import annotations

import base64
import hashlib
import json
from pathlib import Path
from types import SimpleNamespace

import pytest

from imgbuild.image import cosign, keyless, registry, signstore

DIGEST = "sha256:" + "d" * 64


def _ours(repo) -> None:
    # Every call names the repository it is about: one that lost it (None, another) fails.
    assert repo is not None and repo.name == "127.0.0.1:5000/acme", repo


@pytest.fixture()
def held(monkeypatch):
    h = {"manifests": {}, "blobs": {}, "put": []}
    monkeypatch.setattr(registry, "get_manifest",
                        lambda repo, tag: _ours(repo) or h["manifests"].get(tag))
    monkeypatch.setattr(registry, "get_blob", lambda repo, d: _ours(repo) or h["blobs"][d])
    monkeypatch.setattr(registry, "put_blob",
                        lambda repo, blob: _ours(repo) or h["put"].append(("blob", blob)))
    monkeypatch.setattr(registry, "expect", lambda r, ok, repo, what: _ours(repo) or h[
        "put"].append(("expect", r, ok, what)))
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
    # an unreadable payload between two signatures is passed over, not the end of the reading
    held["manifests"][cosign.sig_tag(DIGEST)][1]["layers"].insert(1, _layer(5, who="unreadable"))
    assert signstore.keyless_identity(REPO, DIGEST) == "re-signer"
    assert signstore.keyless_identity(REPO, "sha256:" + "f" * 64) is None


def test_a_layer_of_size_zero_or_none_is_read_with_its_media_type(held):
    held["manifests"]["t.sig"] = ("sha256:m", {"layers": [
        _layer(1, size=0), {"mediaType": "application/x-odd", "digest": f"sha256:{2:064x}"}]})
    held["blobs"] = {f"sha256:{1:064x}": b"", f"sha256:{2:064x}": b"two"}
    got = signstore.fetch_layers(REPO, "t.sig")
    assert [(la.media_type, la.blob) for la in got] == [
        ("application/vnd.dev.cosign.simplesigning.v1+json", b""), ("application/x-odd", b"two")]


# --- signing, against a registry held in memory --------------------------------------------------

class Memory:
    """The registry's side of signing, in memory: blobs by digest, manifests by tag (as
    registry.get_manifest hands them), and the order things went up. Every call must name
    the repository it is about."""

    def __init__(self, monkeypatch):
        self.blobs: dict[str, bytes] = {}
        self.manifests: dict[str, dict] = {}
        self.order: list[str] = []
        self.repo = SimpleNamespace(name="127.0.0.1:5000/acme", path="/v2/acme",
                                    scope=lambda *a: "scope",
                                    api=SimpleNamespace(request=self._request))
        monkeypatch.setattr(registry, "get_manifest", lambda repo, tag: self._mine(repo) or (
            ("sha256:m", self.manifests[tag]) if tag in self.manifests else None))
        monkeypatch.setattr(registry, "get_blob", lambda repo, d: self._mine(repo) or
                            self.blobs[d])
        monkeypatch.setattr(registry, "put_blob", self._put_blob)
        monkeypatch.setattr(registry, "expect", lambda r, ok, repo, what: self._mine(repo) or
                            (r in ok or pytest.fail(f"{what}: {r}")))

    def _mine(self, repo) -> None:
        assert repo is self.repo, repo

    def _put_blob(self, repo, blob: bytes) -> str:
        self._mine(repo)
        d = "sha256:" + hashlib.sha256(blob).hexdigest()
        self.blobs[d] = blob
        return d

    def _request(self, method, url, **kw):
        assert method == "PUT" and url.startswith("/v2/acme/manifests/"), (method, url)
        doc = json.loads(kw["data"])
        missing = [d["digest"] for d in [doc["config"], *doc["layers"]]
                   if d["digest"] not in self.blobs]
        assert not missing, f"the manifest names blobs not there yet: {missing}"
        tag = url.rsplit("/", 1)[1]
        self.manifests[tag] = doc
        self.order.append(tag)
        return 201


@pytest.fixture(scope="module")
def keys() -> tuple[cosign.SigningKey, cosign.SigningKey]:
    d = Path(__file__).parent / "fixtures" / "cosign"
    return tuple(cosign.load_private_key((d / f"{n}.key").read_bytes(), b"imgbuild-test", n)
                 for n in ("cosign", "other"))


PREDICATES = {cosign.ATTESTATION_TYPES["cyclonedx"]: {"bomFormat": "CycloneDX"}}


def test_signing_attests_first_signs_last_and_names_this_repository(monkeypatch, keys):
    mine, _ = keys
    m = Memory(monkeypatch)
    assert signstore.sign(m.repo, DIGEST, mine, PREDICATES) == [cosign.sig_tag(DIGEST),
                                                                 cosign.att_tag(DIGEST)]
    assert m.order == [cosign.att_tag(DIGEST), cosign.sig_tag(DIGEST)]
    sigs = signstore.fetch_layers(m.repo, cosign.sig_tag(DIGEST))
    atts = signstore.fetch_layers(m.repo, cosign.att_tag(DIGEST))
    pub = mine.key.public_key()
    assert cosign.check_signature(DIGEST, sigs, pub)[1]
    assert cosign.check_attestation(DIGEST, atts, pub, "cyclonedx")[1]
    # cosign's payload and the in-toto subject both name the repository signed in.
    [sig] = sigs
    assert json.loads(sig.blob)["critical"]["identity"]["docker-reference"] == m.repo.name
    envelope = json.loads(atts[0].blob)
    stmt = json.loads(base64.b64decode(envelope["payload"]))
    assert stmt["subject"] == [{"name": m.repo.name, "digest": {"sha256": "d" * 64}}]


def test_a_second_signing_writes_nothing_and_another_signer_is_kept(monkeypatch, keys):
    mine, theirs = keys
    m = Memory(monkeypatch)
    signstore.sign(m.repo, DIGEST, theirs, PREDICATES)
    m.order.clear()
    assert signstore.sign(m.repo, DIGEST, mine, PREDICATES) == [cosign.sig_tag(DIGEST),
                                                                 cosign.att_tag(DIGEST)]
    assert len(signstore.fetch_layers(m.repo, cosign.sig_tag(DIGEST))) == 2
    assert len(signstore.fetch_layers(m.repo, cosign.att_tag(DIGEST))) == 2
    m.order.clear()
    assert signstore.sign(m.repo, DIGEST, mine, PREDICATES) == [] and m.order == []
    # Signed before without attestations: the second run adds only what is missing.
    m2 = Memory(monkeypatch)
    signstore.sign(m2.repo, DIGEST, mine, {})
    assert m2.order == [cosign.sig_tag(DIGEST)]
    assert signstore.sign(m2.repo, DIGEST, mine, PREDICATES) == [cosign.att_tag(DIGEST)]


def test_a_kms_signers_public_key_that_cannot_be_used_stops_before_anything_is_written(
        monkeypatch):
    from imgbuild.errors import InputError
    from imgbuild.image import cosigncli

    signer = cosigncli.Delegated("/usr/bin/cosign", "gcpkms://projects/p/keys/k")
    monkeypatch.setattr(cosigncli, "public_key_pem",
                        lambda s: b"no key" if s is signer else pytest.fail(repr(s)))
    with pytest.raises(cosign.KeyProblem) as why:
        cosign.load_public_key(b"no key")
    with pytest.raises(InputError) as e:
        signstore.kms_public_key(signer)
    assert (e.value.message, e.value.facts, e.value.hint) == (
        "cosign public-key --key gcpkms://projects/p/keys/k gave no usable key",
        [str(why.value), "nothing was written and no tag was moved"],
        "check the KMS key reference")
    pem = (Path(__file__).parent / "fixtures" / "cosign" / "cosign.pub").read_bytes()
    monkeypatch.setattr(cosigncli, "public_key_pem", lambda s: pem)
    key, got = signstore.kms_public_key(signer)
    assert got == pem and cosign.public_pem(key) == pem
