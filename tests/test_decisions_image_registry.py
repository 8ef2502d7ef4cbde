"""Registry decisions (image/registry.py, image/distribution.py) on plain data, without a
registry or the Docker Engine: which index entry is a platform's, which zstd layers refuse a
pull before a byte moves (and that the Engine is asked its version only then), which of an
image's RepoDigests a pull took, which hosts are spoken to in plain HTTP, how a registry's
refusal reads, and the index document's bytes."""

from __future__ import annotations

import hashlib
import json
from types import SimpleNamespace

import pytest

from imgbuild.errors import EnvError, InputError, JobFailed
from imgbuild.image import distribution, registry
from imgbuild.image.compression import GZIP, ZSTD


def entry(digest: str, os_: str | None = "linux", arch: str | None = "amd64", **extra) -> dict:
    plat = {k: v for k, v in (("os", os_), ("architecture", arch)) if v is not None}
    return {"mediaType": registry.OCI_MANIFEST_TYPE, "digest": digest, "size": 1,
            **({"platform": plat} if plat else {}), **extra}


# --- which index entry is a platform's -------------------------------------------------------

def test_a_platforms_entry_matches_both_its_os_and_its_architecture():
    manifests = [entry("sha256:win", "windows", "amd64"), entry("sha256:arm", "linux", "arm64"),
                 entry("sha256:amd", "linux", "amd64"), entry("sha256:amd2", "linux", "amd64")]
    assert registry.platform_entry(manifests, "linux/amd64") == "sha256:amd"
    assert registry.platform_entry(manifests, "linux/arm64") == "sha256:arm"
    assert registry.platform_entry(manifests, "windows/amd64") == "sha256:win"
    assert registry.platform_entry(manifests, "linux/s390x") is None
    assert registry.platform_entry([entry("sha256:att", None, None)], "linux/amd64") is None


def test_the_engines_architecture_picks_the_first_entry_for_it():
    manifests = [entry("sha256:att", None, None), entry("sha256:arm", "linux", "arm64"),
                 entry("sha256:amd", "linux", "amd64"), entry("sha256:amd2", "linux", "amd64")]
    assert registry.arch_entry(manifests, "amd64")["digest"] == "sha256:amd"
    assert registry.arch_entry(manifests, "arm64")["digest"] == "sha256:arm"
    assert registry.arch_entry(manifests, "riscv64") is None


def test_an_index_lists_each_platform_once_and_no_attestation():
    doc = {"manifests": [entry("sha256:att", None, None,
                               annotations={"vnd.docker.reference.type": "attestation-manifest"}),
                         entry("sha256:unknown", "unknown", "unknown"),
                         entry("sha256:amd", "linux", "amd64"), entry("sha256:arm", "linux", "arm64"),
                         entry("sha256:amd2", "linux", "amd64"),
                         entry("sha256:noarch", "linux", None),
                         entry("sha256:noos", None, "riscv64")]}
    assert registry.index_platforms(doc) == {"unknown/unknown": "sha256:unknown",
                                             "linux/amd64": "sha256:amd",
                                             "linux/arm64": "sha256:arm"}
    assert registry.index_platforms({}) == {}


# --- which pull is refused for zstd -----------------------------------------------------------

def layers(*types: str) -> dict:
    return {"layers": [{"mediaType": t, "digest": f"sha256:{i:064x}", "size": 10}
                       for i, t in enumerate(types)]}


def test_zstd_layers_refuse_a_pull_only_by_an_engine_older_than_23():
    doc = layers(GZIP.media_type, ZSTD.media_type, "application/vnd.docker.image.rootfs.diff.tar.zstd")
    got = registry.unreadable_zstd(doc, lambda: "20.10.24+dfsg1")
    assert [la["digest"] for la in got] == [f"sha256:{1:064x}", f"sha256:{2:064x}"]
    assert registry.unreadable_zstd(doc, lambda: "22.06.2") is not None
    assert registry.unreadable_zstd(doc, lambda: "23.0.0") is None
    assert registry.unreadable_zstd(doc, lambda: "26.1.5+dfsg1") is None


def test_a_gzip_image_is_never_refused_and_the_engine_is_not_asked():
    def never() -> str:
        raise AssertionError("the Engine's version is asked only for an image with zstd layers")

    assert registry.unreadable_zstd(layers(GZIP.media_type, registry.OCI_MANIFEST_TYPE), never) \
        is None
    assert registry.unreadable_zstd({}, never) is None


# --- which digest a pull took ------------------------------------------------------------------

def test_the_pulls_digest_is_this_repositorys_and_the_one_asked_for():
    rds = ["other.io/x@sha256:o", "reg:5000/imgbuild-extra@sha256:e",
           "reg:5000/imgbuild@sha256:a", "reg:5000/imgbuild@sha256:b"]
    assert registry.repo_digest(rds, "reg:5000/imgbuild", None) == "sha256:a"
    assert registry.repo_digest(rds, "reg:5000/imgbuild", "sha256:b") == "sha256:b"
    assert registry.repo_digest(rds, "reg:5000/imgbuild", "sha256:c") is None
    assert registry.repo_digest(rds, "reg:5000/imgbuild-extra", None) == "sha256:e"
    assert registry.repo_digest(rds, "reg:5000/imgbuil", None) is None
    assert registry.repo_digest([], "reg:5000/imgbuild", None) is None


# --- which host is spoken to how ---------------------------------------------------------------

@pytest.mark.parametrize("name,plain", [
    ("127.0.0.1:5000/imgbuild", True), ("localhost:5000/r", True), ("localhost/r", True),
    ("127.1.2.3:443/r", True), ("[::1]:5000/r", True),
    ("10.0.0.5:5000/r", False), ("ghcr.io/acme/imgbuild", False),
    ("registry.local:5000/r", False), ("localhost.example.com/r", False),
])
def test_plain_http_is_for_loopback_only(name, plain, monkeypatch):
    monkeypatch.delenv("IMGBUILD_INSECURE_REGISTRIES", raising=False)
    assert registry.Repository.parse(name).plain_http is plain


def test_a_host_named_insecure_is_spoken_to_in_plain_http(monkeypatch):
    monkeypatch.setenv("IMGBUILD_INSECURE_REGISTRIES", " registry.local:5000 , ,10.0.0.5:5000")
    assert distribution.insecure_hosts() == {"registry.local:5000", "10.0.0.5:5000"}
    assert registry.Repository.parse("registry.local:5000/r").plain_http
    assert registry.Repository.parse("10.0.0.5:5000/r").plain_http
    assert not registry.Repository.parse("registry.local/r").plain_http  # another port


def test_a_repository_names_its_host_path_and_scope():
    r = registry.Repository.parse("ghcr.io/acme/imgbuild")
    assert (r.host, r.path) == ("ghcr.io", "acme/imgbuild")
    assert r.scope() == "repository:acme/imgbuild:pull"
    assert r.scope("pull", "push") == "repository:acme/imgbuild:pull,push"
    local = registry.repository(None, push=False)
    assert local.host is None and local.path == "imgbuild"
    with pytest.raises(InputError, match="--push needs a registry"):
        registry.repository("imgbuild", push=True)
    assert registry.repository("127.0.0.1:5000/x", push=True).host == "127.0.0.1:5000"


# --- how a registry's answer reads ------------------------------------------------------------

def answer(code: int, text: str = "") -> SimpleNamespace:
    return SimpleNamespace(status_code=code, text=text)


def test_a_refusal_to_push_is_told_apart_from_other_failures():
    repo = registry.Repository.parse("127.0.0.1:5000/r")
    registry.expect(answer(201), (201,), repo, "x")
    registry.expect(answer(200), (200, 201), repo, "x")
    with pytest.raises(EnvError, match="may pull but not push"):
        registry.expect(answer(403), (201,), repo, "a blob upload")
    with pytest.raises(EnvError, match="may pull but not push"):
        registry.expect(answer(401, '{"errors":[{"code":"DENIED"}]}'), (201,), repo, "x")
    with pytest.raises(EnvError, match="may pull but not push"):
        registry.expect(answer(404, "denied: requested access"), (201,), repo, "x")
    for code, text in ((404, "blob unknown"), (500, ""), (200, ""), (401, "unauthorized")):
        with pytest.raises(JobFailed) as e:
            registry.expect(answer(code, text), (201,), repo, "the thing")
        assert not isinstance(e.value, EnvError) and f"answered {code}" in str(e.value)


def test_a_challenge_is_read_as_the_registry_gives_it():
    how, params = distribution._challenge(
        'Bearer realm="https://auth.example/token",service="registry.example",'
        'scope="repository:a/b:pull"')
    assert how == "bearer"
    assert params == {"realm": "https://auth.example/token", "service": "registry.example",
                      "scope": "repository:a/b:pull"}
    assert distribution._challenge('Basic realm="r"') == ("basic", {"realm": "r"})
    assert distribution._challenge("") == ("", {})


def test_a_credential_never_prints_its_secret():
    cred = distribution.Credential("me", "s3cret-token", "/home/me/.docker/config.json")
    assert "s3cret" not in repr(cred) and "s3cret" not in str(cred) and "me" in repr(cred)


# --- the index and the report tag -------------------------------------------------------------

def test_the_same_entries_make_the_same_index_bytes():
    d1 = {"mediaType": registry.OCI_MANIFEST_TYPE, "digest": "sha256:a", "size": 5}
    d2 = {"mediaType": registry.OCI_MANIFEST_TYPE, "digest": "sha256:b", "size": 6}
    one = registry.index_document([("linux/amd64", d1), ("linux/arm64", d2)], {"b": "2", "a": "1"})
    two = registry.index_document([("linux/amd64", d1), ("linux/arm64", d2)], {"a": "1", "b": "2"})
    assert one == two
    doc = json.loads(one)
    assert doc["mediaType"] == registry.OCI_INDEX and doc["schemaVersion"] == 2
    assert [m["platform"] for m in doc["manifests"]] == [
        {"os": "linux", "architecture": "amd64"}, {"os": "linux", "architecture": "arm64"}]
    assert [(m["digest"], m["size"]) for m in doc["manifests"]] == [("sha256:a", 5), ("sha256:b", 6)]
    assert list(doc["annotations"]) == ["a", "b"]
    assert registry.index_platforms(doc) == {"linux/amd64": "sha256:a", "linux/arm64": "sha256:b"}


def test_a_report_is_tagged_by_the_images_digest():
    digest = "sha256:" + hashlib.sha256(b"m").hexdigest()
    assert registry.report_tag(digest) == "sha256-" + digest[7:] + ".smoke"


def test_a_token_is_asked_for_the_scope_the_request_needs():
    params = {"realm": "https://auth/token", "service": "reg", "scope": "repository:a:pull"}
    assert distribution.token_query(params, "repository:b:pull,push") == \
        {"service": "reg", "scope": "repository:b:pull,push"}
    assert distribution.token_query(params, None) == {"service": "reg",
                                                      "scope": "repository:a:pull"}
    assert distribution.token_query({"realm": "r"}, None) == {"service": ""}
    # A mount: push on this repository, pull on the one the blob comes from; two parameters.
    assert distribution.token_query(params, "repository:b:pull,push repository:a:pull") == \
        {"service": "reg", "scope": ["repository:b:pull,push", "repository:a:pull"]}


def test_a_refusal_says_what_was_asked_on_which_repository():
    assert distribution.scope_words("repository:acme/imgbuild:pull,push") == \
        ("pull,push", "acme/imgbuild")
    assert distribution.scope_words(None) == ("access", "it")
    assert distribution.scope_words("repository:x") == ("x", "it")
