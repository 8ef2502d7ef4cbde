"""The registry client over HTTP only, against the real Distribution registry (docker-registry)
and no Docker Engine: fast enough to run once per mutant of imgbuild/image/distribution.py and
imgbuild/image/registry.py. Registries start once per module: a plain one, one with htpasswd
(Basic), one with token auth (Bearer; a pull-only and a push account), one whose token
service misbehaves on demand, and one with TLS from a CA of the tests' own."""

from __future__ import annotations

import base64
import hashlib
import json
import shutil
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
import requests

from imgbuild.errors import EnvError, InputError, JobFailed
from imgbuild.image import distribution, registry
from imgbuild.image.distribution import Client, Credential, ca_for, credential_for, insecure_hosts
from imgbuild.image.registry import Repository

from .registries import (
    Registry,
    TokenIssuer,
    free_port,
    htpasswd,
    make_ca,
    random_password,
    write_docker_config,
)

# Registries of their own on ports of their own, no Engine: a group beside the docker tests.
pytestmark = pytest.mark.xdist_group("registry-client")

if shutil.which("docker-registry") is None:
    pytest.skip("skipped: docker-registry is not installed", allow_module_level=True)

OCI_MANIFEST = "application/vnd.oci.image.manifest.v1+json"
CONFIG_TYPE = "application/vnd.oci.image.config.v1+json"
LAYER_TYPE = "application/vnd.oci.image.layer.v1.tar"
ART = "application/vnd.imgbuild.test.v1+json"


def sha(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


# --- registries, once per module ------------------------------------------------------------

@pytest.fixture(scope="module")
def plain(tmp_path_factory):
    reg = Registry(tmp_path_factory.mktemp("plain")).start()
    yield reg
    reg.stop()


@pytest.fixture(scope="module")
def basic(tmp_path_factory):
    d = tmp_path_factory.mktemp("basic")
    users = {"alice": random_password()}
    reg = Registry(d / "reg", auth={"htpasswd": {
        "realm": "imgbuild-test", "path": str(htpasswd(d / "htpasswd", users))}}).start()
    yield reg, users
    reg.stop()


@pytest.fixture(scope="module")
def token(tmp_path_factory):
    d = tmp_path_factory.mktemp("token")
    accounts = {"pusher": (random_password(), ("pull", "push")),
                "reader": (random_password(), ("pull",))}
    issuer = TokenIssuer(d / "issuer", accounts, anonymous=()).start()
    reg = Registry(d / "reg", auth={"token": {
        "realm": issuer.realm, "service": issuer.service, "issuer": issuer.issuer,
        "rootcertbundle": str(issuer.root / "sign.crt")}}).start()
    yield reg, issuer, accounts
    reg.stop()
    issuer.stop()


class Odd:
    """A token service that answers as told: (status, JSON body)."""

    answer: tuple[int, dict] = (200, {})


@pytest.fixture(scope="module")
def odd_token(tmp_path_factory):
    """A registry with token auth whose token service answers what a test sets in Odd."""
    d = tmp_path_factory.mktemp("odd")
    issuer = TokenIssuer(d / "issuer", {}, anonymous=("pull", "push"))

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *a):
            pass

        def do_GET(self):
            status, doc = Odd.answer
            body = json.dumps(doc).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.end_headers()
            self.wfile.write(body)

    server = ThreadingHTTPServer(("127.0.0.1", issuer.port), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    reg = Registry(d / "reg", auth={"token": {
        "realm": issuer.realm, "service": issuer.service, "issuer": issuer.issuer,
        "rootcertbundle": str(issuer.root / "sign.crt")}}).start()
    yield reg, issuer
    reg.stop()
    server.shutdown()
    server.server_close()


@pytest.fixture(scope="module")
def tls(tmp_path_factory):
    d = tmp_path_factory.mktemp("tls")
    ca, cert, key = make_ca(d / "pki", "imgbuild-test", "127.0.0.1")
    reg = Registry(d / "reg", tls=(cert, key)).start()
    yield reg, ca
    reg.stop()


@pytest.fixture(scope="module")
def not_a_registry(tmp_path_factory):
    """An HTTP server that is no registry: 404 for /v2/."""
    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *a):
            pass

        def do_GET(self):
            self.send_response(404)
            self.end_headers()

    server = ThreadingHTTPServer(("127.0.0.1", free_port()), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


@pytest.fixture()
def config(tmp_path, monkeypatch):
    """An empty Docker config directory, DOCKER_CONFIG pointing at it."""
    d = tmp_path / "docker-config"
    d.mkdir()
    monkeypatch.setenv("DOCKER_CONFIG", str(d))
    for var in ("IMGBUILD_CA_BUNDLE", "REQUESTS_CA_BUNDLE", "SSL_CERT_FILE",
                "IMGBUILD_INSECURE_REGISTRIES"):
        monkeypatch.delenv(var, raising=False)
    return d


def login(config: Path, host: str, user: str, password: str) -> None:
    write_docker_config(config, host, user, password)


def upload_image(repo: Repository, label: str) -> tuple[str, bytes, dict]:
    """A tiny OCI image (config + one layer) pushed through the client: (digest, bytes, config)."""
    config = {"architecture": "amd64", "os": "linux", "label": label}
    cfg = json.dumps(config).encode()
    layer = f"layer of {label}".encode()
    manifest = {"schemaVersion": 2, "mediaType": OCI_MANIFEST,
                "config": {"mediaType": CONFIG_TYPE, "digest": registry.put_blob(repo, cfg),
                           "size": len(cfg)},
                "layers": [{"mediaType": LAYER_TYPE, "digest": registry.put_blob(repo, layer),
                            "size": len(layer)}]}
    body = json.dumps(manifest).encode()
    r = repo.api.request("PUT", f"{repo.path}/manifests/{label}", scope=repo.scope("pull", "push"),
                         data=body, headers={"Content-Type": OCI_MANIFEST})
    assert r.status_code == 201, r.text
    return sha(body), body, config


# --- names ------------------------------------------------------------------------------------

def test_repository_parse_and_scope():
    r = Repository.parse("127.0.0.1:5000/team/imgbuild")
    assert (r.name, r.host, r.path) == ("127.0.0.1:5000/team/imgbuild", "127.0.0.1:5000",
                                        "team/imgbuild")
    assert r.scope() == "repository:team/imgbuild:pull"
    assert r.scope("pull", "push") == "repository:team/imgbuild:pull,push"
    local = Repository.parse("imgbuild")
    assert (local.host, local.path) == (None, "imgbuild")


def test_repository_needs_a_host_to_push():
    assert registry.repository(None, False) == Repository("imgbuild", None, "imgbuild")
    assert registry.repository("127.0.0.1:5000/x", True).host == "127.0.0.1:5000"
    with pytest.raises(InputError) as e:
        registry.repository("imgbuild", True)
    assert e.value.message == "--push needs a registry"
    assert e.value.facts == ["repository 'imgbuild' names no registry host"]
    assert e.value.hint == ("pass --registry HOST[:PORT]/REPO, e.g. "
                            "--registry 127.0.0.1:5000/imgbuild")
    with pytest.raises(InputError) as e:
        registry.repository(None, True)
    assert e.value.facts == ["repository 'imgbuild' names no registry host"]
    with pytest.raises(InputError, match="is not a registry repository"):
        registry.repository("a b", False)


@pytest.mark.parametrize("name, plain", [
    ("127.0.0.1:5000/x", True), ("localhost:5000/x", True), ("localhost/x", True),
    ("[::1]:5000/x", True), ("127.1.2.3:80/x", True), ("10.0.0.1:5000/x", False),
    ("registry.example:5000/x", False), ("ghcr.io/acme/x", False), ("imgbuild", False),
])
@pytest.mark.docker
def test_plain_http_only_to_loopback(name, plain, monkeypatch):
    monkeypatch.delenv("IMGBUILD_INSECURE_REGISTRIES", raising=False)
    assert Repository.parse(name).plain_http is plain
    assert Repository.parse(name).api.plain_http_allowed is plain


def test_insecure_hosts(monkeypatch):
    monkeypatch.setenv("IMGBUILD_INSECURE_REGISTRIES", " registry.example:5000, ,10.0.0.1:80 ")
    assert insecure_hosts() == {"registry.example:5000", "10.0.0.1:80"}
    assert Repository.parse("registry.example:5000/x").plain_http is True
    assert Repository.parse("10.0.0.1:80/x").plain_http is True
    assert Repository.parse("registry.example/x").plain_http is False
    monkeypatch.delenv("IMGBUILD_INSECURE_REGISTRIES")
    assert insecure_hosts() == set()


def test_challenge_parsing():
    assert distribution._challenge(
        'Bearer realm="https://auth.example/token",service="reg",scope="repository:a/b:pull"'
    ) == ("bearer", {"realm": "https://auth.example/token", "service": "reg",
                     "scope": "repository:a/b:pull"})
    assert distribution._challenge('Basic realm="imgbuild test"') == (
        "basic", {"realm": "imgbuild test"})
    assert distribution._challenge("") == ("", {})


def test_index_document_and_report_tag():
    a = {"mediaType": OCI_MANIFEST, "digest": "sha256:" + "a" * 64, "size": 10}
    b = {"mediaType": OCI_MANIFEST, "digest": "sha256:" + "b" * 64, "size": 20}
    body = registry.index_document([("linux/amd64", a), ("linux/arm64", b)],
                                   {"z": "1", "a": "2"})
    assert body == registry.index_document([("linux/amd64", a), ("linux/arm64", b)],
                                           {"a": "2", "z": "1"})
    assert body == json.dumps({"schemaVersion": 2, "mediaType": registry.OCI_INDEX,
                               "manifests": [
        {"mediaType": OCI_MANIFEST, "digest": a["digest"], "size": 10,
         "platform": {"os": "linux", "architecture": "amd64"}},
        {"mediaType": OCI_MANIFEST, "digest": b["digest"], "size": 20,
         "platform": {"os": "linux", "architecture": "arm64"}}],
        "annotations": {"a": "2", "z": "1"}}, indent=2).encode()
    assert registry.report_tag("sha256:abc") == "sha256-abc.smoke"


def test_no_host_is_local_only(config):
    local = Repository.parse("imgbuild")
    assert registry.manifest_descriptor(local, "x") is None
    assert registry.manifest_digest(local, "x") is None
    assert registry.fetch_artifact(local, "x", ART) is None
    assert registry.check_reachable(local) is None


# --- credentials and CAs ----------------------------------------------------------------------

def test_credentials_from_docker_config(config):
    assert credential_for("127.0.0.1:1") is None
    secret = random_password()
    login(config, "127.0.0.1:1", "alice", secret)
    c = credential_for("127.0.0.1:1")
    assert c == Credential("alice", secret, str(config / "config.json"))
    assert secret not in repr(c) and repr(c) == (
        f"Credential('alice', source={str(config / 'config.json')!r})")
    assert credential_for("127.0.0.1:2") is None
    (config / "config.json").write_text(json.dumps({"auths": {"127.0.0.1:1": {
        "identitytoken": "tok-123"}}}))
    assert credential_for("127.0.0.1:1") == Credential("", "tok-123",
                                                       str(config / "config.json"))
    (config / "config.json").write_text(json.dumps({"auths": {"127.0.0.1:1": {
        "username": "bob", "password": ""}}}))
    assert credential_for("127.0.0.1:1") is None
    # a user name with an empty password is no credential
    (config / "config.json").write_text(json.dumps({"auths": {"127.0.0.1:1": {
        "auth": base64.b64encode(b"bob:").decode()}}}))
    assert credential_for("127.0.0.1:1") is None


def helper(tmp_path, monkeypatch, answer: str, rc: int = 0) -> None:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    h = bin_dir / "docker-credential-imgbuildtest"
    h.write_text(f"#!/bin/sh\n[ \"$1\" = get ] || exit 1\ncat >/dev/null\necho '{answer}'\n"
                 f"exit {rc}\n")
    h.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:{__import__('os').environ['PATH']}")


def test_credentials_from_a_credential_helper(config, tmp_path, monkeypatch):
    host = "127.0.0.1:7"
    (config / "config.json").write_text(json.dumps({"credHelpers": {host: "imgbuildtest"}}))
    helper(tmp_path, monkeypatch, json.dumps({"ServerURL": host, "Username": "carol",
                                              "Secret": "s3cret"}))
    assert credential_for(host) == Credential(
        "carol", "s3cret",
        f"{config / 'config.json'} (credential helper docker-credential-imgbuildtest)")
    helper(tmp_path, monkeypatch, "the keychain is locked", rc=1)
    with pytest.raises(EnvError) as e:
        credential_for(host)
    assert e.value.message == f"cannot read the credentials for {host}"
    assert len(e.value.facts) == 1 and e.value.facts[0].startswith(
        f"{config / 'config.json'}: ")
    assert "the keychain is locked" in e.value.facts[0]
    helper(tmp_path, monkeypatch, "locked " * 100, rc=1)  # one long line: 200 characters of it
    with pytest.raises(EnvError) as e:
        credential_for(host)
    assert len(e.value.facts[0]) == len(f"{config / 'config.json'}: ") + 200
    assert e.value.hint == ("check the docker-credential-* helper your Docker config names, "
                            f"or `docker login {host}` again")


def test_ca_selection(tmp_path, monkeypatch, config):
    certs_d = tmp_path / "certs.d"
    monkeypatch.setattr(distribution, "CERTS_D", certs_d)
    bundle = tmp_path / "bundle.pem"
    bundle.write_text("x")
    system = tmp_path / "system.pem"
    system.write_text("x")
    monkeypatch.setattr(distribution, "SYSTEM_CA", (str(tmp_path / "none.pem"), str(system)))
    assert ca_for("reg:5000") == str(system)
    monkeypatch.setenv("SSL_CERT_FILE", str(tmp_path / "missing.pem"))
    assert ca_for("reg:5000") == str(system)
    monkeypatch.setenv("SSL_CERT_FILE", str(bundle))
    assert ca_for("reg:5000") == str(bundle)
    other = tmp_path / "other.pem"
    other.write_text("x")
    monkeypatch.setenv("IMGBUILD_CA_BUNDLE", str(other))
    assert ca_for("reg:5000") == str(other)
    (certs_d / "reg:5000").mkdir(parents=True)
    (certs_d / "reg:5000" / "ca.crt").write_text("x")
    assert ca_for("reg:5000") == str(certs_d / "reg:5000" / "ca.crt")
    assert ca_for("reg:5001") == str(other)
    monkeypatch.delenv("IMGBUILD_CA_BUNDLE")
    monkeypatch.delenv("SSL_CERT_FILE")
    monkeypatch.setenv("REQUESTS_CA_BUNDLE", str(bundle))
    assert ca_for("reg:5001") == str(bundle)
    monkeypatch.delenv("REQUESTS_CA_BUNDLE")
    monkeypatch.setattr(distribution, "SYSTEM_CA", (str(tmp_path / "none.pem"),))
    assert ca_for("reg:5001") is True


# --- a plain registry: manifests, blobs, artifacts, reports, indexes ---------------------------

@pytest.mark.docker
def test_plain_registry_is_spoken_to_over_http(plain, config):
    repo = Repository.parse(f"{plain.host}/imgbuild")
    assert repo.base_url == f"http://{plain.host}"
    registry.check_reachable(repo)
    assert repo.api.ping().status_code == 200


@pytest.mark.docker
def test_artifacts_and_reports(plain, config):
    repo = Repository.parse(f"{plain.host}/art")
    assert registry.fetch_artifact(repo, "nothing", ART) is None
    digest = registry.push_artifact(repo, "t1", ART, {"b": 1, "a": [2]}, b"payload",
                                    "application/x-test", annotations={"k": "v"},
                                    subject="sha256:" + "c" * 64)
    got = registry.fetch_artifact(repo, "t1", ART)
    assert got == (digest, {"a": [2], "b": 1}, b"payload")
    doc = json.loads(repo.api.request("GET", f"{repo.path}/manifests/{digest}",
                                      headers={"Accept": OCI_MANIFEST}).content)
    cfg = json.dumps({"b": 1, "a": [2]}, indent=2, sort_keys=True).encode()
    assert doc == {"schemaVersion": 2, "mediaType": OCI_MANIFEST, "artifactType": ART,
                   "config": {"mediaType": ART, "digest": sha(cfg), "size": len(cfg)},
                   "layers": [{"mediaType": "application/x-test", "digest": sha(b"payload"),
                               "size": 7}],
                   "subject": {"mediaType":
                               "application/vnd.docker.distribution.manifest.v2+json",
                               "digest": "sha256:" + "c" * 64},
                   "annotations": {"k": "v"}}
    assert registry.manifest_digest(repo, "t1") == digest
    assert registry.manifest_descriptor(repo, "t1") == {
        "mediaType": OCI_MANIFEST, "digest": digest,
        "size": len(repo.api.request("GET", f"{repo.path}/manifests/t1",
                                     headers={"Accept": OCI_MANIFEST}).content)}
    # another kind of artifact under the tag is none of this kind
    assert registry.fetch_artifact(repo, "t1", ART + ".other") is None
    # the same blob again is not uploaded twice; without subject and annotations neither key
    d2 = registry.push_artifact(repo, "t2", ART, {"b": 1, "a": [2]}, b"payload",
                                "application/x-test")
    doc2 = json.loads(repo.api.request("GET", f"{repo.path}/manifests/{d2}",
                                       headers={"Accept": OCI_MANIFEST}).content)
    assert "subject" not in doc2 and "annotations" not in doc2
    assert registry.fetch_artifact(repo, "t2", ART)[1:] == ({"a": [2], "b": 1}, b"payload")


@pytest.mark.docker
def test_an_artifact_with_two_layers_is_not_one(plain, config):
    repo = Repository.parse(f"{plain.host}/art2")
    layer = registry.put_blob(repo, b"one")
    cfg = registry.put_blob(repo, b"{}")
    manifest = {"schemaVersion": 2, "mediaType": OCI_MANIFEST, "artifactType": ART,
                "config": {"mediaType": ART, "digest": cfg, "size": 2},
                "layers": [{"mediaType": "x/y", "digest": layer, "size": 3}] * 2}
    r = repo.api.request("PUT", f"{repo.path}/manifests/two", data=json.dumps(manifest),
                         scope=repo.scope("pull", "push"),
                         headers={"Content-Type": OCI_MANIFEST})
    assert r.status_code == 201
    assert registry.fetch_artifact(repo, "two", ART) is None
    manifest["layers"] = []
    repo.api.request("PUT", f"{repo.path}/manifests/zero", data=json.dumps(manifest),
                     headers={"Content-Type": OCI_MANIFEST})
    assert registry.fetch_artifact(repo, "zero", ART) is None
    manifest["layers"] = manifest["layers"] + [{"mediaType": "x/y", "digest": layer, "size": 3}]
    repo.api.request("PUT", f"{repo.path}/manifests/one", data=json.dumps(manifest),
                     headers={"Content-Type": OCI_MANIFEST})
    assert registry.fetch_artifact(repo, "one", ART)[1:] == ({}, b"one")


@pytest.mark.docker
def test_smoke_reports(plain, config):
    repo = Repository.parse(f"{plain.host}/reports")
    image, _, _ = upload_image(repo, "img")
    assert registry.fetch_report(repo, image) is None
    tag = registry.push_report(repo, image, {"ok": True, "checks": ["load"]})
    assert tag == image.replace(":", "-") + ".smoke"
    assert registry.fetch_report(repo, image) == {"ok": True, "checks": ["load"]}
    doc = json.loads(repo.api.request("GET", f"{repo.path}/manifests/{tag}",
                                      headers={"Accept": OCI_MANIFEST}).content)
    assert doc["annotations"] == {"io.imgbuild.smoke.ok": "true"}
    assert doc["subject"]["digest"] == image
    assert doc["layers"] == [{"mediaType": "application/vnd.oci.empty.v1+json",
                              "digest": sha(b"{}"), "size": 2}]
    assert doc["artifactType"] == registry.REPORT_TYPE
    other, _, _ = upload_image(repo, "img2")
    registry.push_report(repo, other, {"ok": False})
    doc = json.loads(repo.api.request("GET", f"{repo.path}/manifests/{registry.report_tag(other)}",
                                      headers={"Accept": OCI_MANIFEST}).content)
    assert doc["annotations"] == {"io.imgbuild.smoke.ok": "false"}
    registry.push_report(repo, other, {})
    assert registry.fetch_report(repo, other) == {}


@pytest.mark.docker
def test_image_config_and_manifests_by_digest(plain, config):
    repo = Repository.parse(f"{plain.host}/images")
    digest, body, cfg = upload_image(repo, "v1")
    manifest, got = registry.image_config(repo, digest)
    assert manifest == json.loads(body) and got == cfg
    assert registry.manifest_descriptor(repo, digest) == {
        "mediaType": OCI_MANIFEST, "digest": digest, "size": len(body)}
    assert registry.manifest_digest(repo, "v1") == digest
    assert registry.manifest_digest(repo, "v2") is None
    assert registry.manifest_descriptor(Repository.parse(f"{plain.host}/none"), "v1") is None


@pytest.mark.docker
def test_indexes(plain, config):
    repo = Repository.parse(f"{plain.host}/multi")
    amd, amd_body, _ = upload_image(repo, "amd")
    arm, _, _ = upload_image(repo, "arm")
    entries = [("linux/amd64", registry.manifest_descriptor(repo, "amd")),
               ("linux/arm64", registry.manifest_descriptor(repo, "arm"))]
    assert entries[0][1] == {"mediaType": OCI_MANIFEST, "digest": amd, "size": len(amd_body)}
    body = registry.index_document(entries, {"io.imgbuild.key": "k1"})
    digest = registry.push_index(repo, ("content", "latest"), body)
    assert digest == sha(body)
    want = (digest, {"linux/amd64": amd, "linux/arm64": arm})
    assert registry.fetch_index(repo, "content") == want
    assert registry.fetch_index(repo, "latest") == want
    assert registry.fetch_index(repo, "missing") is None
    assert registry.manifest_descriptor(repo, "latest") == {
        "mediaType": registry.OCI_INDEX, "digest": digest, "size": len(body)}
    # an OCI image manifest is not served to a client that accepts only indexes
    assert registry.fetch_index(repo, "amd") is None
    with pytest.raises(JobFailed) as e:
        registry.image_config(repo, digest)
    assert e.value.message == f"{repo.name}@{digest} is not an image manifest (an index?)"
    # an entry without a platform is not listed; the first of two same platforms wins
    odd = json.dumps({"schemaVersion": 2, "mediaType": registry.OCI_INDEX, "manifests": [
        {"mediaType": OCI_MANIFEST, "digest": amd, "size": len(amd_body)},
        {"mediaType": OCI_MANIFEST, "digest": amd, "size": len(amd_body),
         "platform": {"os": "linux"}},
        {"mediaType": OCI_MANIFEST, "digest": arm, "size": entries[1][1]["size"],
         "platform": {"os": "linux", "architecture": "amd64"}},
        {"mediaType": OCI_MANIFEST, "digest": amd, "size": len(amd_body),
         "platform": {"os": "linux", "architecture": "amd64"}}]}).encode()
    d = registry.push_index(repo, ("odd",), odd)
    assert registry.fetch_index(repo, "odd") == (d, {"linux/amd64": arm})


@pytest.mark.docker
def test_an_index_of_manifests_the_registry_lacks_is_refused(plain, config):
    repo = Repository.parse(f"{plain.host}/lacks")
    body = registry.index_document([("linux/amd64", {"mediaType": OCI_MANIFEST,
                                                      "digest": "sha256:" + "d" * 64,
                                                      "size": 5})], {})
    with pytest.raises(JobFailed) as e:
        registry.push_index(repo, ("x",), body)
    assert e.value.message == f"registry {plain.host} answered 400 to index x"
    assert "MANIFEST_BLOB_UNKNOWN" in e.value.facts[0] or "manifest" in e.value.facts[0].lower()


@pytest.mark.docker
def test_a_manifest_the_registry_refuses(plain, config):
    repo = Repository.parse(f"{plain.host}/refused")
    with pytest.raises(JobFailed) as e:  # not a tag: no route there, 404
        registry.push_artifact(repo, "-bad", ART, {}, b"x", "x/y")
    assert e.value.message == f"registry {plain.host} answered 404 to manifest -bad"
    assert e.value.facts == ["404 page not found\n"]


@pytest.mark.docker
def test_blob_fetch_checks_and_missing_blob(plain, config):
    repo = Repository.parse(f"{plain.host}/blobs")
    d = registry.put_blob(repo, b"hello")
    assert d == sha(b"hello") and registry._get_blob(repo, d) == b"hello"
    assert registry.put_blob(repo, b"hello") == d  # already there
    missing = sha(b"absent")
    with pytest.raises(JobFailed) as e:
        registry._get_blob(repo, missing)
    assert e.value.message == f"registry {plain.host} answered 404 to blob {missing[:19]}…"
    assert "BLOB_UNKNOWN" in e.value.facts[0]
    with pytest.raises(JobFailed) as e:
        registry.image_config(repo, missing)
    assert e.value.message == f"registry {plain.host} answered 404 to manifest {missing[:19]}…"


def test_unreachable_and_not_a_registry(not_a_registry, config):
    repo = Repository.parse(f"{not_a_registry}/x")
    with pytest.raises(EnvError) as e:
        registry.check_reachable(repo)
    assert e.value.message == (f"{not_a_registry} does not answer as a registry (404 for /v2/)")
    assert e.value.hint == f"check --registry {not_a_registry}/x"
    with pytest.raises(EnvError) as e:  # it answers no HEAD: 501
        registry.manifest_descriptor(repo, "t")
    assert e.value.message == f"registry {not_a_registry} answered 501 for x:t"
    assert e.value.hint == "check the registry's logs and the repository name"
    dead = f"127.0.0.1:{free_port()}"
    with pytest.raises(EnvError) as e:
        registry.check_reachable(Repository.parse(f"{dead}/x"))
    assert e.value.message == f"registry {dead} is unreachable"
    assert e.value.facts[0].startswith("ConnectionError: ")
    assert "Max retries exceeded" in e.value.facts[0]  # what requests said
    assert e.value.hint == f"start it, or check the registry name ({dead})"


@pytest.mark.docker
def test_other_statuses_are_errors(plain, config):
    repo = Repository.parse(f"{plain.host}/status")
    cfg = registry.put_blob(repo, b'{"os":"linux"}')
    v2 = {"schemaVersion": 2, "mediaType": "application/vnd.docker.distribution.manifest.v2+json",
          "config": {"mediaType": "application/vnd.docker.container.image.v1+json",
                     "digest": cfg, "size": 15}, "layers": []}
    r = repo.api.request("PUT", "status/manifests/d2", data=json.dumps(v2),
                         headers={"Content-Type": v2["mediaType"]})
    assert r.status_code == 201
    # a Docker image manifest asked for as an index: the registry answers 400
    with pytest.raises(EnvError) as e:
        registry.fetch_index(repo, "d2")
    assert e.value.message == f"registry {plain.host} answered 400 for index d2"
    assert len(e.value.facts) == 1
    assert "MANIFEST" in e.value.facts[0].upper()
    assert registry.manifest_descriptor(repo, "d2")["mediaType"] == v2["mediaType"]


# --- Basic ------------------------------------------------------------------------------------

@pytest.mark.docker
def test_basic_auth(basic, config):
    reg, users = basic
    repo = Repository.parse(f"{reg.host}/imgbuild")
    registry.check_reachable(repo)  # 401 is an answer
    assert repo.api.ping().status_code == 401
    with pytest.raises(EnvError) as e:
        registry.manifest_digest(repo, "t")
    assert e.value.message == (f"registry {reg.host} asks for credentials, and none are "
                               "configured for it")
    assert e.value.facts == ["looked in ~/.docker/config.json"]  # DOCKER_CONFIG has none
    assert e.value.hint == f"`docker login {reg.host}`, then run the command again"
    login(config, "127.0.0.1:1", "alice", users["alice"])  # a config, for another registry
    repo = Repository.parse(f"{reg.host}/imgbuild")
    with pytest.raises(EnvError) as e:
        registry.manifest_digest(repo, "t")
    assert e.value.facts == [f"looked in {config / 'config.json'}"]
    login(config, reg.host, "alice", users["alice"])
    repo = Repository.parse(f"{reg.host}/imgbuild")
    digest = registry.push_artifact(repo, "a", ART, {"x": 1}, b"l", "x/y")
    assert registry.manifest_digest(repo, "a") == digest
    assert registry.fetch_artifact(repo, "a", ART) == (digest, {"x": 1}, b"l")
    assert repo.api.tokens == {}
    wrong = random_password()
    login(config, reg.host, "alice", wrong)
    repo = Repository.parse(f"{reg.host}/imgbuild")
    with pytest.raises(EnvError) as e:
        registry.manifest_digest(repo, "a")
    assert e.value.message == f"registry {reg.host} refused the credentials for user 'alice'"
    assert e.value.facts == [f"they come from {config / 'config.json'}"]
    assert e.value.hint == (f"`docker login {reg.host}` with the right password or token, "
                            "then run the command again")
    assert wrong not in json.dumps(e.value.to_dict())


@pytest.mark.docker
def test_basic_auth_through_a_credential_helper(basic, config, tmp_path, monkeypatch):
    reg, users = basic
    (config / "config.json").write_text(json.dumps({"credHelpers": {reg.host: "imgbuildtest"}}))
    helper(tmp_path, monkeypatch, json.dumps({"ServerURL": reg.host, "Username": "alice",
                                              "Secret": users["alice"]}))
    repo = Repository.parse(f"{reg.host}/helped")
    assert registry.manifest_digest(repo, "t") is None
    helper(tmp_path, monkeypatch, json.dumps({"ServerURL": reg.host, "Username": "alice",
                                              "Secret": "not-" + users["alice"]}))
    repo = Repository.parse(f"{reg.host}/helped")
    with pytest.raises(EnvError) as e:
        registry.manifest_digest(repo, "t")
    assert e.value.facts == [f"they come from {config / 'config.json'} (credential helper "
                             "docker-credential-imgbuildtest)"]


# --- Bearer -----------------------------------------------------------------------------------

@pytest.mark.docker
def test_token_auth_push_and_pull_only(token, config, tmp_path):
    reg, issuer, accounts = token
    login(config, reg.host, "pusher", accounts["pusher"][0])
    repo = Repository.parse(f"{reg.host}/imgbuild")
    registry.check_reachable(repo)
    digest = registry.push_artifact(repo, "a", ART, {"x": 1}, b"l", "x/y")
    assert {"user": "pusher", "scope": "repository:imgbuild:pull,push", "service": issuer.service} in issuer.asked
    assert set(repo.api.tokens) == {"repository:imgbuild:pull,push"}
    assert registry.fetch_artifact(repo, "a", ART) == (digest, {"x": 1}, b"l")
    assert set(repo.api.tokens) == {"repository:imgbuild:pull,push", "repository:imgbuild:pull"}
    # the reader pulls, with a token for pull
    login(config, reg.host, "reader", accounts["reader"][0])
    repo = Repository.parse(f"{reg.host}/imgbuild")
    n = len(issuer.asked)
    assert registry.fetch_artifact(repo, "a", ART) == (digest, {"x": 1}, b"l")
    assert issuer.asked[n] == {"user": "reader", "scope": "repository:imgbuild:pull", "service": issuer.service}
    # ... and may not push
    with pytest.raises(EnvError) as e:
        registry.push_artifact(repo, "b", ART, {"y": 2}, b"m", "x/y")
    assert e.value.message == (f"registry {reg.host} refused pull,push on imgbuild to user "
                               "'reader': the token it was given does not grant it")
    assert e.value.facts == [f"the credential comes from {config / 'config.json'}"]
    assert e.value.hint == (f"`docker login {reg.host}` with an account that may pull and push "
                            "there")
    assert accounts["reader"][0] not in json.dumps(e.value.to_dict())


@pytest.mark.docker
def test_token_auth_images_and_indexes(token, config):
    """Each call asks for the scope it needs: an index push needs pull and push, reads pull."""
    reg, issuer, accounts = token
    login(config, reg.host, "pusher", accounts["pusher"][0])
    repo = Repository.parse(f"{reg.host}/multi")
    amd, body, cfg = upload_image(repo, "amd")
    index = registry.index_document([("linux/amd64", registry.manifest_descriptor(repo, "amd"))],
                                    {})
    digest = registry.push_index(repo, ("v1",), index)
    login(config, reg.host, "reader", accounts["reader"][0])
    repo = Repository.parse(f"{reg.host}/multi")
    assert registry.fetch_index(repo, "v1") == (digest, {"linux/amd64": amd})
    assert registry.image_config(repo, amd) == (json.loads(body), cfg)
    assert set(repo.api.tokens) == {"repository:multi:pull"}
    with pytest.raises(EnvError, match="refused pull,push on multi to user 'reader'"):
        registry.push_index(repo, ("v2",), index)


@pytest.mark.docker
def test_token_auth_without_or_with_wrong_credentials(token, config):
    reg, issuer, accounts = token
    repo = Repository.parse(f"{reg.host}/imgbuild")
    with pytest.raises(EnvError) as e:
        registry.manifest_digest(repo, "a")
    assert e.value.message == (f"registry {reg.host} asks for credentials, and none are "
                               "configured for it")
    assert issuer.asked[-1] == {"user": None, "scope": "repository:imgbuild:pull", "service": issuer.service}
    wrong = random_password()
    login(config, reg.host, "pusher", wrong)
    repo = Repository.parse(f"{reg.host}/imgbuild")
    with pytest.raises(EnvError) as e:
        registry.manifest_digest(repo, "a")
    assert e.value.message == (f"registry {reg.host} refused the credentials for user 'pusher' "
                               f"(token service {issuer.realm})")
    assert e.value.facts == [f"they come from {config / 'config.json'}"]
    assert wrong not in json.dumps(e.value.to_dict())


@pytest.mark.docker
def test_an_expired_or_refused_token_is_fetched_again(token, config):
    reg, issuer, accounts = token
    login(config, reg.host, "pusher", accounts["pusher"][0])
    repo = Repository.parse(f"{reg.host}/fresh")
    digest = registry.push_artifact(repo, "a", ART, {"x": 1}, b"l", "x/y")
    scope = repo.scope("pull")
    issuer.lifetime = -120
    try:
        expired = issuer.token("pusher", scope)
    finally:
        issuer.lifetime = 300
    repo.api.tokens[scope] = expired
    n = len(issuer.asked)
    assert registry.manifest_digest(repo, "a") == digest
    assert issuer.asked[n:] == [{"user": "pusher", "scope": scope, "service": issuer.service}]
    assert repo.api.tokens[scope] != expired
    repo.api.tokens[scope] = "not-a-token"
    assert registry.fetch_artifact(repo, "a", ART)[0] == digest
    assert repo.api.tokens[scope] != "not-a-token"
    # the token is kept for the scope: a second lookup asks the issuer nothing
    n = len(issuer.asked)
    assert registry.manifest_digest(repo, "a") == digest
    assert len(issuer.asked) == n


@pytest.mark.docker
def test_a_request_without_scope_uses_the_challenges(token, config):
    reg, issuer, accounts = token
    login(config, reg.host, "pusher", accounts["pusher"][0])
    repo = Repository.parse(f"{reg.host}/scopeless")
    registry.push_artifact(repo, "a", ART, {"x": 1}, b"l", "x/y")
    api = Client(reg.host, plain_http_allowed=True)
    r = api.request("GET", "scopeless/tags/list")
    assert r.status_code == 200 and r.json()["tags"] == ["a"]
    assert issuer.asked[-1] == {"user": "pusher", "scope": "repository:scopeless:pull", "service": issuer.service}
    assert set(api.tokens) == {""}


@pytest.mark.docker
def test_token_service_failures(odd_token, config):
    reg, issuer = odd_token
    repo = Repository.parse(f"{reg.host}/x")
    Odd.answer = (200, {"access_token": "whatever"})
    with pytest.raises(EnvError) as e:  # a token the registry cannot verify: never granted
        registry.manifest_digest(repo, "t")
    assert e.value.message == (f"registry {reg.host} asks for credentials, and none are "
                               "configured for it")
    assert repo.api.tokens == {repo.scope("pull"): "whatever"}
    good = issuer.token(None, repo.scope("pull"))
    Odd.answer = (200, {"access_token": good})
    repo = Repository.parse(f"{reg.host}/x")
    assert registry.manifest_digest(repo, "t") is None
    Odd.answer = (200, {"token": good, "access_token": "other"})
    repo = Repository.parse(f"{reg.host}/x")
    assert registry.manifest_digest(repo, "t") is None
    assert repo.api.tokens[repo.scope("pull")] == good
    for status, doc, message in [
        (200, {}, f"the token service of registry {reg.host} gave no token"),
        (200, {"token": ""}, f"the token service of registry {reg.host} gave no token"),
        (500, {"e": 1}, f"the token service of registry {reg.host} answered 500"),
        (404, {}, f"the token service of registry {reg.host} answered 404"),
        (403, {}, f"registry {reg.host} asks for credentials (token service {issuer.realm}), "
                  "and none are configured for it"),
        (401, {}, f"registry {reg.host} asks for credentials (token service {issuer.realm}), "
                  "and none are configured for it"),
    ]:
        Odd.answer = (status, doc)
        repo = Repository.parse(f"{reg.host}/x")
        with pytest.raises(EnvError) as e:
            registry.manifest_digest(repo, "t")
        assert e.value.message == message, status
        if status == 500:
            assert e.value.facts == [f'{issuer.realm}: {{"e": 1}}']
    api = Client(reg.host, plain_http_allowed=True)
    with pytest.raises(EnvError) as e:
        api._token({"service": "s"}, "repository:x:pull")
    assert e.value.message == f"registry {reg.host} asks for a token but names no realm"
    dead = f"http://127.0.0.1:{free_port()}/token"
    with pytest.raises(EnvError) as e:
        api._token({"realm": dead}, "repository:x:pull")
    assert e.value.message == f"the token service of registry {reg.host} is unreachable"
    assert e.value.facts[0].startswith(f"{dead}: ConnectionError: ")
    assert "Max retries exceeded" in e.value.facts[0]  # what requests said, not "None"


@pytest.fixture(scope="module")
def tls_token(tmp_path_factory):
    """Token auth whose token service speaks TLS with a certificate from a CA of the tests'."""
    d = tmp_path_factory.mktemp("tlstoken")
    ca, cert, key = make_ca(d / "pki", "imgbuild-token", "127.0.0.1")
    issuer = TokenIssuer(d / "issuer", {}, anonymous=("pull",), tls=(cert, key)).start()
    reg = Registry(d / "reg", auth={"token": {
        "realm": issuer.realm, "service": issuer.service, "issuer": issuer.issuer,
        "rootcertbundle": str(issuer.root / "sign.crt")}}).start()
    yield reg, issuer, ca
    reg.stop()
    issuer.stop()


@pytest.mark.docker
def test_a_token_service_over_tls_is_verified_with_its_ca(tls_token, config, monkeypatch):
    reg, issuer, ca = tls_token
    monkeypatch.setattr(distribution, "CERTS_D", config / "no-certs.d")
    repo = Repository.parse(f"{reg.host}/t")
    with pytest.raises(EnvError) as e:
        registry.manifest_digest(repo, "x")
    assert e.value.message == f"the token service of registry {reg.host} is unreachable"
    assert e.value.facts[0].startswith(f"{issuer.realm}: SSLError: ")
    monkeypatch.setenv("IMGBUILD_CA_BUNDLE", str(ca))
    repo = Repository.parse(f"{reg.host}/t")
    assert registry.manifest_digest(repo, "x") is None
    assert issuer.asked[-1]["scope"] == "repository:t:pull"


# --- TLS --------------------------------------------------------------------------------------

@pytest.mark.docker
def test_tls_loopback_is_https_without_a_trusted_ca(tls, config):
    reg, ca = tls
    repo = Repository.parse(f"{reg.host}/secure")
    assert repo.base_url == f"https://{reg.host}"
    registry.check_reachable(repo)
    d = registry.push_artifact(repo, "a", ART, {"x": 1}, b"l", "x/y")
    assert registry.fetch_artifact(repo, "a", ART)[0] == d


@pytest.mark.docker
def test_tls_verified_with_the_ca_given(tls, config, tmp_path, monkeypatch):
    reg, ca = tls
    monkeypatch.setattr(distribution, "CERTS_D", tmp_path / "certs.d")
    api = Client(reg.host)
    assert api.base_url == f"https://{reg.host}"
    with pytest.raises(EnvError) as e:
        api.request("GET", "/v2/")
    assert e.value.message == (f"registry {reg.host} does not present a certificate this "
                               "machine trusts")
    assert e.value.facts[0].startswith("SSLError: ")
    assert "CERTIFICATE_VERIFY_FAILED" in e.value.facts[0]  # what requests said
    assert e.value.hint == (f"put its CA in {tmp_path / 'certs.d' / reg.host / 'ca.crt'} "
                            "(Docker reads it too) or in IMGBUILD_CA_BUNDLE")
    monkeypatch.setenv("IMGBUILD_CA_BUNDLE", str(ca))
    assert Client(reg.host).request("GET", "/v2/").status_code == 200
    monkeypatch.delenv("IMGBUILD_CA_BUNDLE")
    (tmp_path / "certs.d" / reg.host).mkdir(parents=True)
    shutil.copy(ca, tmp_path / "certs.d" / reg.host / "ca.crt")
    assert Client(reg.host).request("GET", "/v2/").status_code == 200
    # a loopback TLS registry whose CA is trusted is verified, not merely accepted
    api = Client(reg.host, plain_http_allowed=True)
    assert api.base_url == f"https://{reg.host}" and api._verify_tls is True


@pytest.mark.docker
def test_plain_http_only_where_allowed(plain, config):
    with pytest.raises(EnvError) as e:
        Client(plain.host).request("GET", "/v2/")
    assert e.value.message == (f"registry {plain.host} does not present a certificate this "
                               "machine trusts")
    api = Client(plain.host, plain_http_allowed=True)
    assert api.request("GET", "/v2/").status_code == 200
    assert api.base_url == f"http://{plain.host}" and api._verify_tls is True
    assert api.request("GET", f"http://{plain.host}/v2/").status_code == 200


def test_requests_are_not_sent_where_nothing_listens(config):
    dead = f"127.0.0.1:{free_port()}"
    api = Client(dead, plain_http_allowed=True)
    assert api.base_url == f"http://{dead}"
    with pytest.raises(EnvError, match=f"registry {dead} is unreachable"):
        api.request("GET", "/v2/")
    with pytest.raises(requests.RequestException):
        requests.get(f"http://{dead}/v2/", timeout=2)


# --- a registry (or a proxy in between) that serves other bytes --------------------------------

class Routes(dict):
    seen: list


@pytest.fixture(scope="module")
def canned():
    """An HTTP server that answers what a test puts in its routes: path -> (status, headers,
    body); 404 elsewhere. It stands for a registry, or a proxy in front of one, that serves
    other bytes than it names: what the digest checks are for."""
    routes = Routes()
    seen: list[tuple[str, str, str | None]] = []  # (method, path, Authorization)

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *a):
            pass

        def answer(self, body_too: bool):
            seen.append((self.command, self.path, self.headers.get("Authorization")))
            if self.command in ("POST", "PUT"):
                self.rfile.read(int(self.headers.get("Content-Length") or 0))
            status, headers, body = routes.get(f"{self.command} {self.path}",
                                               routes.get(self.path, (404, {}, b"")))
            self.send_response(status)
            for k, v in headers.items():
                if v is not None:  # None: the header left out
                    self.send_header(k, v)
            if "Content-Length" not in headers:
                self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            if body_too:
                self.wfile.write(body)

        def do_GET(self):
            self.answer(True)

        def do_HEAD(self):
            self.answer(False)

        def do_POST(self):
            self.answer(True)

        def do_PUT(self):
            self.answer(True)

    server = ThreadingHTTPServer(("127.0.0.1", free_port()), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    routes.seen = seen  # type: ignore[attr-defined]
    yield f"127.0.0.1:{server.server_address[1]}", routes
    server.shutdown()
    server.server_close()


def test_other_bytes_than_the_digest_are_refused(canned, config):
    host, routes = canned
    routes.clear()
    repo = Repository.parse(f"{host}/p")
    image = json.dumps({"schemaVersion": 2, "mediaType": OCI_MANIFEST, "config": {
        "mediaType": CONFIG_TYPE, "digest": sha(b"{}"), "size": 2}, "layers": []}).encode()
    # a single image served to an index lookup (a registry that ignores Accept)
    routes["/v2/p/manifests/single"] = (200, {"Content-Type": OCI_MANIFEST,
                                              "Docker-Content-Digest": sha(image)}, image)
    with pytest.raises(JobFailed) as e:
        registry.fetch_index(repo, "single")
    assert e.value.message == f"{host}/p:single is a single image, not an index"
    assert e.value.hint == "it was pushed by something other than `imgbuild index`"
    # an index without its mediaType is still an index; without a digest header, still checked
    index = json.dumps({"schemaVersion": 2, "manifests": [
        {"mediaType": OCI_MANIFEST, "digest": sha(image), "size": len(image),
         "platform": {"os": "linux", "architecture": "arm64"}}]}).encode()
    routes["/v2/p/manifests/bare"] = (200, {"Content-Type": registry.OCI_INDEX}, index)
    assert registry.fetch_index(repo, "bare") == (sha(index), {"linux/arm64": sha(image)})
    # a Docker manifest list is an index too
    listed = json.dumps({"schemaVersion": 2, "mediaType": registry.INDEX_TYPES[1],
                         "manifests": []}).encode()
    routes["/v2/p/manifests/list"] = (200, {}, listed)
    assert registry.fetch_index(repo, "list") == (sha(listed), {})
    # an index that lists nothing, without even the key
    empty = json.dumps({"schemaVersion": 2, "mediaType": registry.OCI_INDEX}).encode()
    routes["/v2/p/manifests/empty"] = (200, {}, empty)
    assert registry.fetch_index(repo, "empty") == (sha(empty), {})
    # other answers: the registry's text, when it gives one, in at most 300 characters
    routes["/v2/p/manifests/silent"] = (500, {}, b"")
    with pytest.raises(EnvError) as e:
        registry.fetch_index(repo, "silent")
    assert e.value.message == f"registry {host} answered 500 for index silent"
    assert e.value.facts == []
    routes["/v2/p/manifests/talks"] = (502, {}, b"x" * 400)
    with pytest.raises(EnvError) as e:
        registry.fetch_artifact(repo, "talks", ART)
    assert e.value.message == f"registry {host} answered 502 for manifest talks"
    assert e.value.facts == ["x" * 300]
    # an index whose bytes are not those of the digest the registry names
    routes["/v2/p/manifests/lying"] = (200, {"Docker-Content-Digest": sha(b"other")}, index)
    with pytest.raises(JobFailed) as e:
        registry.fetch_index(repo, "lying")
    assert e.value.message == (f"registry {host} served index lying with other bytes than its "
                               f"digest {sha(b'other')}")
    assert e.value.hint == "nothing was used"
    routes["/v2/p/manifests/art"] = (200, {"Docker-Content-Digest": sha(b"other")}, image)
    with pytest.raises(JobFailed, match="served manifest art with other bytes than its digest"):
        registry.fetch_artifact(repo, "art", ART)
    # an image manifest asked for by digest, served with other bytes
    asked = sha(b"what was asked")
    routes[f"/v2/p/manifests/{asked}"] = (200, {"Content-Type": OCI_MANIFEST}, image)
    with pytest.raises(JobFailed) as e:
        registry.image_config(repo, asked)
    assert e.value.message == f"registry {host} served manifest {asked[:19]}… with other bytes"
    assert e.value.facts == [f"asked for {asked}", f"got       {sha(image)}"]
    assert e.value.hint == "the registry or a proxy in between changed the content"
    # a blob served with other bytes
    routes[f"/v2/p/manifests/{sha(image)}"] = (200, {"Content-Type": OCI_MANIFEST}, image)
    other = b'{"x": 1}'
    routes[f"/v2/p/blobs/{sha(b'{}')}"] = (200, {}, other)
    with pytest.raises(JobFailed) as e:
        registry.image_config(repo, sha(image))
    assert e.value.message == f"registry {host} served blob {sha(b'{}')[:19]}… with other bytes"
    assert e.value.facts == [f"asked for {sha(b'{}')}", f"got       {sha(other)}"]
    assert e.value.hint == ("the registry or a proxy in between changed the content; "
                            "nothing was used")
    routes[f"/v2/p/blobs/{sha(b'{}')}"] = (200, {}, b"{}")
    assert registry.image_config(repo, sha(image)) == (json.loads(image), {})
    # a descriptor without the headers a registry sends
    routes["/v2/p/manifests/headless"] = (200, {}, b"")
    assert registry.manifest_descriptor(repo, "headless") == {
        "mediaType": "", "digest": None, "size": 0}
    routes["/v2/p/manifests/typed"] = (200, {"Content-Type": f"{OCI_MANIFEST}; charset=utf-8",
                                             "Docker-Content-Digest": sha(image)}, image)
    assert registry.manifest_descriptor(repo, "typed") == {
        "mediaType": OCI_MANIFEST, "digest": sha(image), "size": len(image)}


def test_refusals_are_told_from_other_failures(canned, config):
    host, routes = canned
    routes.clear()
    repo = Repository.parse(f"{host}/p")
    d = sha(b"x")
    for status, text, refused in [
        (403, "", True),
        (404, '{"errors":[{"code":"denied"}]}', True), (404, "BLOB_UNKNOWN", False),
        (500, "DENIED", False), (400, "", False),
    ]:
        routes[f"/v2/p/blobs/{d}"] = (status, {}, text.encode())
        try:
            registry._get_blob(repo, d)
        except EnvError as e:
            assert refused, (status, text)
            assert e.message == (f"registry {host} refused blob {d[:19]}… in p: the account may "
                                 "pull but not push")
            assert e.facts == [text]
            assert e.hint == "log in with an account that may push to this repository"
        except JobFailed as e:
            assert not refused, (status, text)
            assert e.message == f"registry {host} answered {status} to blob {d[:19]}…"
            assert e.facts == [text]


def test_redirects_are_followed(canned, config):
    host, routes = canned
    routes.clear()
    repo = Repository.parse(f"{host}/p")
    routes[f"/v2/p/blobs/{sha(b'moved')}"] = (307, {"Location": "/storage/moved"}, b"")
    routes["/storage/moved"] = (200, {}, b"moved")
    assert registry._get_blob(repo, sha(b"moved")) == b"moved"


def test_challenges_the_client_cannot_answer(canned, config):
    host, routes = canned
    routes.clear()
    routes["/v2/p/manifests/t"] = (401, {"WWW-Authenticate": 'Negotiate realm="x"'}, b"")
    repo = Repository.parse(f"{host}/p")
    with pytest.raises(EnvError) as e:
        registry.manifest_digest(repo, "t")
    assert e.value.message == f"registry {host} asks for credentials, and none are configured for it"
    routes["/v2/p/manifests/t"] = (401, {"WWW-Authenticate": 'Basic realm="x"'}, b"")
    repo = Repository.parse(f"{host}/p")
    routes.seen.clear()
    with pytest.raises(EnvError) as e:
        registry.manifest_digest(repo, "t")
    assert e.value.message == f"registry {host} asks for credentials, and none are configured for it"
    assert [a for m, p, a in routes.seen if p == "/v2/p/manifests/t"] == [None]
    # with a credential: sent on the second try, then refused (no token service named)
    login(config, host, "dave", "pw-dave")
    for how in ('Basic realm="x"', 'Negotiate realm="x"'):
        routes["/v2/p/manifests/t"] = (401, {"WWW-Authenticate": how}, b"")
        repo = Repository.parse(f"{host}/p")
        routes.seen.clear()
        with pytest.raises(EnvError) as e:
            registry.manifest_digest(repo, "t")
        assert e.value.message == f"registry {host} refused the credentials for user 'dave'"
        sent = [a for m, p, a in routes.seen if p == "/v2/p/manifests/t"]
        assert sent == ([None, "Basic ZGF2ZTpwdy1kYXZl"] if how.startswith("Basic") else [None])
    # a Basic challenge after a token: the token is dropped, the credential sent
    routes["/v2/p/manifests/t"] = (401, {"WWW-Authenticate": 'Basic realm="x"'}, b"")
    api = Client(host, plain_http_allowed=True)
    api.tokens["s"] = "tok"
    routes.seen.clear()
    with pytest.raises(EnvError):
        api.request("HEAD", "p/manifests/t", scope="s")
    assert [a for m, p, a in routes.seen if p == "/v2/p/manifests/t"] == [
        "Bearer tok", "Basic ZGF2ZTpwdy1kYXZl"]
    assert api.tokens == {}
    # the granted-or-not message names what the scope asks, or says "access"
    assert api._not_granted(None).message == (f"registry {host} refused access on it to user "
                                              "'dave': the token it was given does not grant it")
    assert api._not_granted("repository:a/b:push").hint == (
        f"`docker login {host}` with an account that may push there")
    anon = Client("127.0.0.1:1", plain_http_allowed=True)
    e = anon._not_granted("repository:a/b:pull")
    assert e.message == ("registry 127.0.0.1:1 refused pull on a/b to anonymous access: the "
                         "token it was given does not grant it")
    assert e.facts == ["no credential is configured for it"]


def test_blob_uploads_as_the_registry_answers(canned, config):
    host, routes = canned
    routes.clear()
    repo = Repository.parse(f"{host}/p")
    d = sha(b"data")
    routes["POST /v2/p/blobs/uploads/"] = (500, {}, b"storage full")
    with pytest.raises(JobFailed) as e:
        registry.put_blob(repo, b"data")
    assert e.value.message == f"registry {host} answered 500 to a blob upload"
    assert e.value.facts == ["storage full"]
    routes["POST /v2/p/blobs/uploads/"] = (403, {}, b"")
    with pytest.raises(EnvError) as e:
        registry.put_blob(repo, b"data")
    assert e.value.message == (f"registry {host} refused a blob upload in p: the account may "
                               "pull but not push")
    # a Location without a query: the digest is its query
    routes["POST /v2/p/blobs/uploads/"] = (202, {"Location": f"http://{host}/up/1"}, b"")
    routes[f"PUT /up/1?digest={d}"] = (201, {}, b"")
    routes.seen.clear()
    assert registry.put_blob(repo, b"data") == d
    assert [(m, p) for m, p, a in routes.seen] == [
        ("HEAD", f"/v2/p/blobs/{d}"), ("POST", "/v2/p/blobs/uploads/"),
        ("PUT", f"/up/1?digest={d}")]
    routes[f"PUT /up/1?digest={d}"] = (400, {}, b"DIGEST_INVALID")
    with pytest.raises(JobFailed) as e:
        registry.put_blob(repo, b"data")
    assert e.value.message == f"registry {host} answered 400 to a blob upload"
    assert e.value.facts == ["DIGEST_INVALID"]


def test_a_401_without_a_challenge_and_a_head_without_a_length(canned, config):
    host, routes = canned
    routes.clear()
    repo = Repository.parse(f"{host}/p")
    routes["/v2/p/manifests/t"] = (401, {}, b"")
    with pytest.raises(EnvError) as e:
        registry.manifest_digest(repo, "t")
    assert e.value.message == f"registry {host} asks for credentials, and none are configured for it"
    routes["/v2/p/manifests/t"] = (200, {"Content-Type": OCI_MANIFEST, "Content-Length": None,
                                         "Docker-Content-Digest": sha(b"m")}, b"")
    assert registry.manifest_descriptor(repo, "t")["size"] == 0


# --- a splice's cut rest layer (image/layercut.py) behind credentials ------------------------

def _tar(*files: tuple[str, bytes]) -> bytes:
    import io
    import tarfile
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w", format=tarfile.PAX_FORMAT) as tf:
        for name, data in files:
            m = tarfile.TarInfo(name)
            m.size = len(data)
            tf.addfile(m, io.BytesIO(data))
    return out.getvalue()


@pytest.mark.parametrize("auth", ["basic", "token"])
def test_a_cut_layer_is_read_and_streamed_behind_credentials(auth, request, config):
    """The cut reads the layers under the rest install from the registry and streams the layer
    it cuts into it, its size unknown until its end (a body that cannot be sent twice): both
    with the credentials a user logged in with, Basic or a Bearer token for push."""
    import gzip
    import io

    from imgbuild.image import layercut, splice, wire
    from imgbuild.image.compression import GZIP

    if auth == "basic":
        reg, users = request.getfixturevalue("basic")
        user, password = "alice", users["alice"]
    else:
        reg, _, accounts = request.getfixturevalue("token")
        user, password = "pusher", accounts["pusher"][0]
    login(config, reg.host, user, password)
    repo = Repository.parse(f"{reg.host}/cut-{auth}")
    lower_tar = _tar(("etc/os-release", b"debian"), ("usr/bin/python3", b"ELF"))
    lower = registry.put_blob(repo, gzip.compress(lower_tar, mtime=0))
    below = layercut.lower_entries([io.BytesIO(splice.decompressed(
        GZIP.media_type, registry.get_blob(repo, lower)))])
    assert set(below) == {"etc/os-release", "usr/bin/python3"}
    fs = _tar(("etc/os-release", b"debian"), ("usr/bin/python3", b"ELF"),
              ("opt/venv/six.py", b"x = 1\n" * 50_000))
    stats = layercut.Cut()
    diff_id, held = wire.send_stream(layercut.cut(io.BytesIO(fs), below, stats), repo, GZIP,
                                     lambda e: None, "rest")
    assert stats.kept == 1
    got = gzip.decompress(registry.get_blob(repo, held.digest))
    assert sha(got) == diff_id and b"x = 1\n" * 50_000 in got and b"debian" not in got
