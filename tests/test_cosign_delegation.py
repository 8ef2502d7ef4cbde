"""imgbuild signing through the real cosign 2.5 (Debian trixie's, scripts/cosign.sh) against
real registries: a KMS key and keyless, each as a build signs (pipeline/build.py's
sign_published: the SBOM and provenance the registry holds, attested), then checked by
imgbuild's verify and by cosign's own.

What needs the internet is stood in for at cosign's boundary by tests/cosign_shim.py, found
through IMGBUILD_COSIGN as any cosign would be: the KMS by a key file, Fulcio by the stand-in CA
of tests/sigstore_standin.py, Rekor by no log. The OIDC token, Fulcio, Rekor and the KMS
themselves cannot run here. Tiny images written through the registry API: seconds in all."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest

from imgbuild.catalog.registries import SignPolicy
from imgbuild.errors import EnvError
from imgbuild.image import attest, cosign, signstore
from imgbuild.image.registry import Repository
from imgbuild.pipeline import build

from .test_sign_interop import COSIGN, HTTP, KEYS, PASSWORD, PREDICATES, cosign_cli, push_image

pytestmark = pytest.mark.docker

SHIM = Path(__file__).parent / "cosign_shim.py"
KMS = "hashivault://ci-signing"  # the shim signs with tests/fixtures/cosign/cosign.key


@pytest.fixture()
def shim(tmp_path, monkeypatch) -> Path:
    return shim_env(tmp_path, monkeypatch)


def shim_env(tmp_path: Path, monkeypatch) -> Path:
    """The environment a build signs in: IMGBUILD_COSIGN is the shim; its argv log."""
    if not COSIGN.exists():
        pytest.skip("skipped: no cosign (make services installs it)")
    log = tmp_path / "cosign-argv.log"
    for k, v in {"IMGBUILD_COSIGN": str(SHIM), "COSIGN_SHIM_REAL": str(COSIGN),
                 "COSIGN_SHIM_KEY": str(KEYS / "cosign.key"), "COSIGN_SHIM_LOG": str(log),
                 "COSIGN_PASSWORD": PASSWORD}.items():
        monkeypatch.setenv(k, v)
    return log


def argvs(log: Path) -> list[list[str]]:
    return [json.loads(x) for x in log.read_text().splitlines()]


def with_evidence(repo: Repository, content: bytes) -> str:
    """A tiny image with an SBOM and a provenance statement beside it, as a push leaves them."""
    digest = push_image(repo, "v1", content)
    [sbom, prov] = PREDICATES.values()
    attest.push(repo, digest, {"sbom": sbom, "provenance": {
        "_type": "https://in-toto.io/Statement/v1", "predicateType": attest.PROVENANCE_TYPE,
        "subject": [], "predicate": prov}})
    return digest


def test_a_kms_key_signs_through_cosign_and_both_verify(own_repo, shim):
    repo = Repository.parse(own_repo)
    digest = with_evidence(repo, b"signed through cosign with a KMS key")
    policy = SignPolicy(str(KEYS / "registries.yaml"), key="cosign.pub")
    # The preflight a build makes: cosign found, its release, the KMS key's public half read
    # through `cosign public-key` and checked against the policy's key.
    signer = build.signing_key(KMS, push=True, policy=policy)
    assert signer == build.cosigncli.Delegated(str(SHIM), KMS)
    tags, by = build.sign_published(repo, digest, signer)
    assert tags == [cosign.sig_tag(digest), cosign.att_tag(digest)]
    assert by == {"method": "kms", "key": KMS}
    got = argvs(shim)
    assert [a[0] for a in got] == ["version", "public-key", "sign", "attest", "attest"]
    for a in got[2:]:
        assert a[1] == "--yes" and a[a.index("--key") + 1] == KMS and "--tlog-upload=false" in a
        assert a[-1] == f"{repo.name}@{digest}" and all(h in a for h in HTTP)
    # COSIGN_PASSWORD stays in the environment (the repository's name may hold the word)
    assert not any(PASSWORD in x for a in got for x in a[:-1])
    # imgbuild's verify (the function behind `imgbuild verify`) accepts it...
    v = attest.verify(repo, digest, policy=policy)
    assert {c: ok for c, ok, _ in v.checks if c.startswith(("signature", "attestation"))} == {
        "signature": True, "attestation cyclonedx": True, "attestation slsaprovenance1": True}
    # ...and so does cosign, with the key's public half.
    ref, pub = f"{repo.name}@{digest}", str(KEYS / "cosign.pub")
    r = cosign_cli("verify", "--key", pub, "--insecure-ignore-tlog=true", *HTTP, ref)
    assert r.returncode == 0, r.stderr
    for kind in ("cyclonedx", "slsaprovenance1"):
        r = cosign_cli("verify-attestation", "--key", pub, "--insecure-ignore-tlog=true", *HTTP,
                       "--type", kind, ref)
        assert r.returncode == 0, r.stderr
    # A KMS key the policy does not trust is refused before anything is built.
    with pytest.raises(build.InputError, match="is not the key"):
        build.signing_key(KMS, push=True, policy=SignPolicy(str(KEYS / "r.yaml"),
                                                            key="other.pub"))


def keyless_as(tmp_path: Path, monkeypatch, standin, subject: str | None = None) -> None:
    """The shim signs keyless as `subject` (default: the workflow's GitHub Actions identity)
    from now on: a leaf the stand-in CA issued for it (one leaf key in tmp_path, a certificate
    per subject), its chain, the CT log's key; and what a job with `permissions: id-token:
    write` has in its environment (the shim takes no token). The trust root for a keyless
    policy is tmp_path/trusted_root.json."""
    from .sigstore_standin import GHA_SUBJECT, cert_pem

    subject = subject or GHA_SUBJECT
    key = tmp_path / "leaf.key"
    if not key.exists():
        r = cosign_cli("generate-key-pair", "--output-key-prefix", str(tmp_path / "leaf"))
        assert r.returncode == 0, r.stderr
    leaf_key = cosign.load_private_key(key.read_bytes(), PASSWORD.encode(), "leaf.key").key
    cert = tmp_path / f"leaf-{len(list(tmp_path.glob('leaf-*.pem')))}.pem"
    cert.write_text(cert_pem(standin.leaf(leaf_key, subject=subject)))
    (tmp_path / "chain.pem").write_text(standin.chain_pem())
    (tmp_path / "trusted_root.json").write_text(json.dumps(standin.trusted_root()))
    (tmp_path / "ct.pub").write_text(standin.ct_public_pem())
    for k, v in {"COSIGN_SHIM_KEY": str(key), "COSIGN_SHIM_CERT": str(cert),
                 "COSIGN_SHIM_CHAIN": str(tmp_path / "chain.pem"),
                 "SIGSTORE_CT_LOG_PUBLIC_KEY_FILE": str(tmp_path / "ct.pub"),
                 "ACTIONS_ID_TOKEN_REQUEST_URL": "http://127.0.0.1:9/token?x=1",
                 "ACTIONS_ID_TOKEN_REQUEST_TOKEN": "stand-in"}.items():
        monkeypatch.setenv(k, v)


def test_keyless_through_cosign_records_the_identity_read_back(own_repo, shim, tmp_path,
                                                               monkeypatch):
    """`--sign-key keyless` as the CI job runs it: cosign with no key; the shim answers with a
    leaf the stand-in CA issued for the workflow's identity. The identity recorded is the one
    read back from the registry's signature."""
    from .sigstore_standin import GHA_ISSUER, GHA_SUBJECT, StandIn

    keyless_as(tmp_path, monkeypatch, StandIn.make())
    repo = Repository.parse(own_repo)
    digest = with_evidence(repo, b"signed keyless through cosign")
    policy = SignPolicy(str(tmp_path / "registries.yaml"), issuer=GHA_ISSUER,
                        subject=GHA_SUBJECT, trust_root="trusted_root.json", tlog=False)
    signer = build.signing_key("keyless", push=True, policy=policy)
    tags, by = build.sign_published(repo, digest, signer)
    assert by == {"method": "keyless", "subject": GHA_SUBJECT, "issuer": GHA_ISSUER}
    assert tags == [cosign.sig_tag(digest), cosign.att_tag(digest)]
    got = argvs(shim)
    assert [a[0] for a in got] == ["version", "sign", "attest", "attest"]
    assert all(a[1] == "--yes" and "--key" not in a and "--tlog-upload=false" not in a
               for a in got[1:])
    found, _ = signstore.checks(repo, digest, policy)
    assert [ok for _, ok, _ in found] == [True, True, True], found


def test_cosign_pushes_with_the_docker_config_credentials_and_its_failure_is_shown(
        tmp_path, shim, monkeypatch, docker_client):
    """A registry that asks for a password (htpasswd): cosign finds it where imgbuild does,
    DOCKER_CONFIG, and never on its command line. Without it cosign fails, and what it said
    ends the error."""
    from .registries import Registry, htpasswd, random_password, write_docker_config

    if shutil.which("docker-registry") is None:
        pytest.skip("skipped: no docker-registry (make services installs it)")
    users = {"alice": random_password()}
    reg = Registry(tmp_path / "reg", auth={"htpasswd": {
        "realm": "imgbuild-test", "path": str(htpasswd(tmp_path / "htpasswd", users))}}).start()
    try:
        write_docker_config(tmp_path / "docker", reg.host, "alice", users["alice"])
        monkeypatch.setenv("DOCKER_CONFIG", str(tmp_path / "docker"))
        repo = Repository.parse(f"{reg.host}/imgbuild")
        digest = with_evidence(repo, b"behind a password")
        signer = build.signing_key(KMS, push=True, policy=None)
        assert build.sign_published(repo, digest, signer)[1] == {"method": "kms", "key": KMS}
        assert users["alice"] not in shim.read_text()
        found, _ = signstore.checks(repo, digest, SignPolicy(str(KEYS / "r.yaml"),
                                                             key="cosign.pub"))
        assert all(ok for _, ok, _ in found), found
        # The same signing with no credentials where cosign looks: its own words end the error.
        (tmp_path / "empty").mkdir()
        monkeypatch.setenv("DOCKER_CONFIG", str(tmp_path / "empty"))
        other = Repository.parse(f"{reg.host}/imgbuild")  # a client with no credential cached
        with pytest.raises(EnvError, match="cosign sign failed") as e:
            build.cosigncli.sign(signer, f"{other.name}@{digest}", {}, plain_http=True)
        said = " ".join(e.value.facts)
        assert "UNAUTHORIZED" in said or "401" in said, said
    finally:
        reg.stop()
        shutil.rmtree(reg.root, ignore_errors=True)
        os.environ.pop("DOCKER_CONFIG", None)
