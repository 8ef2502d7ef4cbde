"""Registries that ask for credentials, as real ones do: the Distribution registry with
htpasswd (Basic), with token auth (Bearer, a token issuer of the tests' own with a pull-only
account), and with TLS from a CA only Docker's certs.d names. Every registry call imgbuild makes
(lookups, smoke reports, artifacts) finds credentials where `docker login` put them, answers
the challenge, and when refused says which registry and where the credential came from,
never the secret."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from imgbuild.image.registry import Repository

from .conftest import ROOT, WHEELS
from .registries import (
    Registry,
    TokenIssuer,
    docker_login,
    htpasswd,
    make_ca,
    random_password,
    write_docker_config,
)

# Registries of their own (ports of their own) and repositories of their own: a group beside
# the other docker tests under xdist.
pytestmark = [pytest.mark.docker, pytest.mark.xdist_group("private-registries")]


def imgbuild(*args: str, config: Path, timeout: int = 1800) -> subprocess.CompletedProcess:
    env = dict(os.environ, DOCKER_CONFIG=str(config), UV_PYTHON_DOWNLOADS="never",
               HF_HUB_OFFLINE="1") | ({"IMGBUILD_WHEELS": WHEELS} if WHEELS else {})
    return subprocess.run([sys.executable, "-m", "imgbuild.cli", *args], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=timeout)


def said(r: subprocess.CompletedProcess) -> str:
    return " ".join((r.stdout + r.stderr).split())


@pytest.fixture()
def basic(tmp_path, docker_client):
    users = {"alice": random_password()}
    reg = Registry(tmp_path / "reg", auth={"htpasswd": {
        "realm": "imgbuild-test", "path": str(htpasswd(tmp_path / "htpasswd", users))}}).start()
    yield reg, users
    reg.stop()
    shutil.rmtree(reg.root, ignore_errors=True)


def test_basic_auth_push_pull_and_a_wrong_password(basic, tmp_path):
    reg, users = basic
    repo = f"{reg.host}/imgbuild"
    nobody = tmp_path / "nobody"
    nobody.mkdir()
    r = imgbuild("pull", "tiny-cpu", "--registry", repo, config=nobody)
    assert r.returncode == 3, said(r)
    assert f"registry {reg.host} asks for credentials" in said(r) and "docker login" in said(r)
    alice = tmp_path / "alice"
    docker_login(alice, reg.host, "alice", users["alice"])
    r = imgbuild("tiny-cpu", "--push", "--registry", repo, "--json", config=alice)
    assert r.returncode == 0, said(r)[-3000:]
    built = json.loads(r.stdout)
    assert built["report"] and built["moved"]  # the report went through the API, with auth
    r = imgbuild("pull", "tiny-cpu", "--registry", repo, "--json", config=alice)
    assert r.returncode == 0, said(r)[-3000:]
    pulled = json.loads(r.stdout)
    assert pulled["digest"] == built["pushed"][0].split("@")[1]
    assert pulled["smoke_report"]["ok"] is True
    wrong = tmp_path / "wrong"
    secret = random_password()
    write_docker_config(wrong, reg.host, "alice", secret)
    r = imgbuild("pull", "tiny-cpu", "--registry", repo, config=wrong)
    assert r.returncode == 3, said(r)
    assert f"registry {reg.host} refused the credentials for user 'alice'" in said(r)
    assert str(wrong / "config.json") in said(r)
    assert secret not in r.stdout + r.stderr
    # A credential helper (credHelpers), as GHCR/ECR users configure: a real executable that
    # speaks the docker-credential protocol, found on PATH by the docker SDK's lookup.
    helped = tmp_path / "helped"
    helped.mkdir()
    (helped / "config.json").write_text(json.dumps({"credHelpers": {reg.host: "imgbuildtest"}}))
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    helper = bin_dir / "docker-credential-imgbuildtest"
    answer = json.dumps({"ServerURL": reg.host, "Username": "alice",
                         "Secret": users["alice"]})
    helper.write_text(f"#!/bin/sh\n[ \"$1\" = get ] || exit 1\ncat >/dev/null\n"
                      f"echo '{answer}'\n")
    helper.chmod(0o755)
    path = f"{bin_dir}:{os.environ['PATH']}"
    r = subprocess.run([sys.executable, "-m", "imgbuild.cli", "pull", "tiny-cpu", "--registry",
                        repo, "--json"], cwd=ROOT, capture_output=True, text=True, timeout=600,
                       env=dict(os.environ, DOCKER_CONFIG=str(helped), PATH=path))
    assert r.returncode == 0, said(r)[-2000:]
    helper.write_text(helper.read_text().replace(users["alice"], "not-" + users["alice"]))
    r = subprocess.run([sys.executable, "-m", "imgbuild.cli", "pull", "tiny-cpu", "--registry",
                        repo], cwd=ROOT, capture_output=True, text=True, timeout=600,
                       env=dict(os.environ, DOCKER_CONFIG=str(helped), PATH=path))
    assert r.returncode == 3, said(r)
    assert "credential helper docker-credential-imgbuildtest" in said(r)
    assert users["alice"] not in r.stdout + r.stderr


@pytest.fixture()
def token(tmp_path, docker_client):
    accounts = {"pusher": (random_password(), ("pull", "push")),
                "reader": (random_password(), ("pull",))}
    issuer = TokenIssuer(tmp_path / "issuer", accounts, anonymous=()).start()
    reg = Registry(tmp_path / "reg", auth={"token": {
        "realm": issuer.realm, "service": issuer.service, "issuer": issuer.issuer,
        "rootcertbundle": str(issuer.root / "sign.crt")}}).start()
    yield reg, issuer, accounts
    reg.stop()
    issuer.stop()
    shutil.rmtree(reg.root, ignore_errors=True)


def test_token_auth_pull_only_account_pulls_and_may_not_push(token, tmp_path):
    reg, issuer, accounts = token
    repo = f"{reg.host}/imgbuild"
    pusher, reader = tmp_path / "pusher", tmp_path / "reader"
    docker_login(pusher, reg.host, "pusher", accounts["pusher"][0])
    docker_login(reader, reg.host, "reader", accounts["reader"][0])
    r = imgbuild("tiny-cpu", "--push", "--registry", repo, "--json", config=pusher)
    assert r.returncode == 0, said(r)[-3000:]
    assert any(a["user"] == "pusher" and a["scope"].endswith(":pull,push") for a in issuer.asked)
    r = imgbuild("pull", "tiny-cpu", "--registry", repo, "--json", config=reader)
    assert r.returncode == 0, said(r)[-3000:]
    assert json.loads(r.stdout)["smoke_report"]["ok"] is True  # fetched with a Bearer token
    r = imgbuild("tiny-cpu", "--push", "--registry", f"{reg.host}/other", config=reader)
    assert r.returncode == 3, said(r)[-2000:]
    assert f"registry {reg.host} refused" in said(r) and "push" in said(r)
    assert accounts["reader"][0] not in r.stdout + r.stderr
    nobody = tmp_path / "nobody"
    nobody.mkdir()
    r = imgbuild("pull", "tiny-cpu", "--registry", repo, config=nobody)
    assert r.returncode == 3 and "asks for credentials" in said(r), said(r)


@pytest.fixture()
def tls(tmp_path, docker_client):
    """A registry on this machine's non-loopback address with a certificate from a CA of its
    own: trusted only where certs.d names it (Docker's convention, read by the Engine too)."""
    ip = next((a for a in subprocess.run(["hostname", "-I"], capture_output=True, text=True)
               .stdout.split() if a.count(".") == 3 and not a.startswith("127.")), None)
    if ip is None:
        pytest.skip("skipped: this machine has no non-loopback IPv4 address")
    ca, cert, key = make_ca(tmp_path / "pki", "imgbuild-test", ip)
    reg = Registry(tmp_path / "reg", tls=(cert, key), addr=ip).start()
    certs_d = Path("/etc/docker/certs.d") / reg.host
    certs_d.mkdir(parents=True, exist_ok=True)
    shutil.copy(ca, certs_d / "ca.crt")
    yield reg, certs_d
    reg.stop()
    shutil.rmtree(certs_d, ignore_errors=True)
    shutil.rmtree(reg.root, ignore_errors=True)


def test_tls_with_the_ca_in_certs_d(tls, tmp_path):
    reg, certs_d = tls
    repo = f"{reg.host}/imgbuild"
    conf = tmp_path / "conf"
    conf.mkdir()
    assert Repository.parse(repo).base_url == f"https://{reg.host}"
    r = imgbuild("tiny-cpu", "--push", "--registry", repo, "--json", config=conf)
    assert r.returncode == 0, said(r)[-3000:]
    r = imgbuild("pull", "tiny-cpu", "--registry", repo, "--json", config=conf)
    assert r.returncode == 0, said(r)[-3000:]
    shutil.rmtree(certs_d)  # the CA gone: the same registry is not trusted
    r = imgbuild("pull", "tiny-cpu", "--registry", repo, config=conf)
    assert r.returncode == 3, said(r)
    assert "does not present a certificate this machine trusts" in said(r)
    assert "certs.d" in said(r)


@pytest.mark.parametrize("bad, why", [
    ("a b", "spaces"), ("::::", "not a repository path"),
    ("http://127.0.0.1:5000/x", "scheme"), ("127.0.0.1:5000/", "not a repository path"),
])
def test_registry_names_are_checked(bad, why, tmp_path):
    for cmd in (["plan", "tiny-cpu", "--no-checks"], ["pull", "tiny-cpu"], ["tiny-cpu"]):
        r = imgbuild(*cmd, "--registry", bad, config=tmp_path)
        assert r.returncode == 2, (cmd, said(r))
        assert why in said(r) and "--push needs" not in said(r)


def test_registry_killed_mid_push_moves_no_tag_and_a_rerun_completes(tmp_path):
    """The registry dies while the image's layers upload: exit 3, no moving tag names anything
    (a moving tag moves only after the content tag and the smoke report are in); after a
    restart on the same storage, the same command completes."""
    import signal

    from .registries import Registry

    reg = Registry(tmp_path / "reg").start()
    repo = f"{reg.host}/imgbuild"
    conf = tmp_path / "conf"
    conf.mkdir()
    env = dict(os.environ, DOCKER_CONFIG=str(conf), UV_PYTHON_DOWNLOADS="never",
               HF_HUB_OFFLINE="1",
               # compressed as it goes, not sent from the blob cache: slow enough to kill
               IMGBUILD_BLOB_CACHE_GB="0") | ({"IMGBUILD_WHEELS": WHEELS} if WHEELS else {})
    proc = subprocess.Popen([sys.executable, "-m", "imgbuild.cli", "tiny-cpu", "--push",
                             "--registry", repo], cwd=ROOT, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    reg.wait_for_upload(proc)
    reg.proc.send_signal(signal.SIGKILL)
    reg.proc.wait()
    out, err = proc.communicate(timeout=600)
    assert proc.returncode == 3, " ".join((out + err).split())[-2000:]
    reg = Registry(reg.root, port=reg.port).start()  # the same storage, back
    try:
        from imgbuild.image.registry import Repository, manifest_digest

        r = Repository.parse(repo)
        assert manifest_digest(r, "tiny-cpu") is None
        assert manifest_digest(r, "tiny-cpu-transformers5.17.0") is None
        # The rerun as the user runs it, with the blob cache on: it was off above only to
        # make the push slow enough to kill.
        rerun = {k: v for k, v in env.items() if k != "IMGBUILD_BLOB_CACHE_GB"}
        done = subprocess.run([sys.executable, "-m", "imgbuild.cli", "tiny-cpu", "--push",
                               "--registry", repo, "--json"], cwd=ROOT, env=rerun,
                              capture_output=True, text=True, timeout=1800)
        assert done.returncode == 0, done.stderr[-3000:]
        content = json.loads(done.stdout)["content_tag"].rsplit(":", 1)[1]
        assert manifest_digest(r, "tiny-cpu") == manifest_digest(r, content) is not None
    finally:
        reg.stop()
        shutil.rmtree(reg.root, ignore_errors=True)
