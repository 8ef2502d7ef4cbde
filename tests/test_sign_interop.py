"""Signatures against the real client and the local registry: Sigstore's cosign 2.5 (Debian
trixie's, scripts/cosign.sh) accepts what imgbuild signs, imgbuild accepts what cosign signs,
and `verify`, `pull` and `run` refuse what the registry's signed-by policy does not accept
before any layer moves. The images are tiny ones written through the registry API (a config
and one small layer): no build, a few seconds in all."""

from __future__ import annotations

import base64
import gzip
import hashlib
import json
import os
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from imgbuild.catalog.registries import SignPolicy
from imgbuild.errors import JobFailed
from imgbuild.image import cosign, keyless, registry, signstore
from imgbuild.image.registry import Repository

from .conftest import ROOT, checkout_workspace

pytestmark = pytest.mark.docker

KEYS = Path(__file__).parent / "fixtures" / "cosign"
PASSWORD = "imgbuild-test"
COSIGN = Path(os.environ.get("IMGBUILD_STATE", "/var/lib/imgbuild")) / "cosign" / "bin" / "cosign"
OCI = "application/vnd.oci.image.manifest.v1+json"
HTTP = ["--allow-insecure-registry", "--allow-http-registry"]
PREDICATES = {"https://cyclonedx.org/bom": {"bomFormat": "CycloneDX", "specVersion": "1.5",
                                             "components": []},
              # cosign attest checks a SLSA v1 predicate's required fields
              "https://slsa.dev/provenance/v1": {
                  "buildDefinition": {"buildType": "https://github.com/imgbuild/imgbuild/build/v1",
                                      "externalParameters": {"target": "tiny-cpu"}},
                  "runDetails": {"builder": {"id": "imgbuild test"}}}}


def cosign_cli(*args: str, password: str = PASSWORD, env: dict | None = None
               ) -> subprocess.CompletedProcess:
    if not COSIGN.exists():
        pytest.skip("skipped: no cosign (make services installs it)")
    return subprocess.run([str(COSIGN), *args], capture_output=True, text=True, timeout=120,
                          env=dict(os.environ, COSIGN_PASSWORD=password,
                                   HOME=os.environ.get("HOME", "/tmp"), **(env or {})))


def imgbuild(*args: str, images: Path | None = None) -> subprocess.CompletedProcess:
    env = dict(os.environ, COSIGN_PASSWORD=PASSWORD)
    if images is not None:
        env["IMGBUILD_IMAGES"] = str(images)
    return subprocess.run([sys.executable, "-m", "imgbuild.cli", *args], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=300)


def push_image(repo: Repository, tag: str, content: bytes, *, architecture: str = "amd64",
               labels: dict[str, str] | None = None) -> str:
    """A tiny image under `tag` (a config, one gzip layer of `content`); its digest."""
    layer = gzip.compress(content, mtime=0)
    diff = "sha256:" + hashlib.sha256(content).hexdigest()
    cfg = json.dumps({"architecture": architecture, "os": "linux",
                      "config": {"Labels": labels} if labels else {},
                      "rootfs": {"type": "layers", "diff_ids": [diff]}}).encode()
    body = json.dumps({"schemaVersion": 2, "mediaType": OCI,
                       "config": {"mediaType": "application/vnd.oci.image.config.v1+json",
                                  "digest": registry.put_blob(repo, cfg), "size": len(cfg)},
                       "layers": [{"mediaType": "application/vnd.oci.image.layer.v1.tar+gzip",
                                   "digest": registry.put_blob(repo, layer),
                                   "size": len(layer)}]}).encode()
    r = repo.api.request("PUT", f"{repo.path}/manifests/{tag}", scope=repo.scope("pull", "push"),
                         data=body, headers={"Content-Type": OCI})
    assert r.status_code == 201, r.text
    return "sha256:" + hashlib.sha256(body).hexdigest()


def layer_of(repo: Repository, digest: str) -> str:
    return registry.image_parts(repo, digest)[0]["layers"][0]["digest"]


def copy_tag(repo: Repository, src: str, dst: str) -> None:
    """What an attacker with push rights does: the manifest under `src` put under `dst`."""
    got = repo.api.request("GET", f"{repo.path}/manifests/{src}", scope=repo.scope("pull"),
                           headers={"Accept": OCI})
    r = repo.api.request("PUT", f"{repo.path}/manifests/{dst}", scope=repo.scope("pull", "push"),
                         data=got.content, headers={"Content-Type": OCI})
    assert r.status_code == 201, r.text


@pytest.fixture(scope="module")
def key() -> cosign.SigningKey:
    return cosign.load_private_key((KEYS / "cosign.key").read_bytes(), PASSWORD.encode(), "k")


@pytest.fixture()
def repo(own_repo) -> Repository:
    return Repository.parse(own_repo)


def test_cosign_accepts_what_imgbuild_signed(repo, key):
    digest = push_image(repo, "v1", b"signed by imgbuild")
    assert signstore.sign(repo, digest, key, PREDICATES) == [cosign.sig_tag(digest),
                                                             cosign.att_tag(digest)]
    # Signing again adds nothing: this key's signature and attestations are there.
    assert signstore.sign(repo, digest, key, PREDICATES) == []
    ref = f"{repo.name}@{digest}"
    pub = str(KEYS / "cosign.pub")
    r = cosign_cli("verify", "--key", pub, "--insecure-ignore-tlog=true", *HTTP, ref)
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)[0]["critical"]["image"]["docker-manifest-digest"] == digest
    for kind in ("cyclonedx", "slsaprovenance1"):
        r = cosign_cli("verify-attestation", "--key", pub, "--insecure-ignore-tlog=true", *HTTP,
                       "--type", kind, ref)
        assert r.returncode == 0, r.stderr
        stmt = json.loads(base64.b64decode(json.loads(r.stdout.splitlines()[0])["payload"]))
        assert stmt["predicateType"] == cosign.ATTESTATION_TYPES[kind]
    other = str(KEYS / "other.pub")
    assert cosign_cli("verify", "--key", other, "--insecure-ignore-tlog=true", *HTTP,
                      ref).returncode != 0
    assert cosign_cli("verify-attestation", "--key", other, "--insecure-ignore-tlog=true", *HTTP,
                      "--type", "cyclonedx", ref).returncode != 0


def test_imgbuild_accepts_what_cosign_signed(repo, tmp_path):
    digest = push_image(repo, "v1", b"signed by cosign")
    ref = f"{repo.name}@{digest}"
    k = str(KEYS / "cosign.key")
    r = cosign_cli("sign", "--key", k, "--tlog-upload=false", "--yes", *HTTP, ref)
    assert r.returncode == 0, r.stderr
    for kind, predicate in zip(("cyclonedx", "slsaprovenance1"), PREDICATES.values()):
        (tmp_path / f"{kind}.json").write_text(json.dumps(predicate))
        r = cosign_cli("attest", "--key", k, "--tlog-upload=false", "--yes", *HTTP,
                       "--type", kind, "--predicate", str(tmp_path / f"{kind}.json"), ref)
        assert r.returncode == 0, r.stderr

    r = imgbuild("verify", ref, "--key", str(KEYS / "cosign.pub"), "--json")
    assert r.returncode == 1, r.stderr  # a synthetic image: no smoke report, SBOM, ...
    assert {c["check"]: c["ok"] for c in json.loads(r.stdout)["checks"]
            if c["check"].startswith(("signature", "attestation"))} == {
        "signature": True, "attestation cyclonedx": True, "attestation slsaprovenance1": True}
    # The same with another key (in this process: a CLI start costs seconds here).
    from imgbuild.catalog.registries import SignPolicy

    got, _ = signstore.checks(repo, digest, SignPolicy("t", key=str(KEYS / "other.pub")))
    assert [ok for _, ok, _ in got] == [False, False, False]


# --- refused before any layer moves ---------------------------------------------------------

@pytest.fixture(scope="module")
def content_tag() -> str:
    from imgbuild.plan.decide import make_plan

    return make_plan(checkout_workspace(), "tiny-cpu").content_tag


def policy_project(tmp_path: Path, repo: Repository) -> Path:
    images = tmp_path / "images"
    images.mkdir()
    (images / "registries.yaml").write_text(
        f"registries:\n  - match: {repo.name}\n"
        f"    signed-by: {{key: {KEYS / 'cosign.pub'}}}\n")
    return images


def unsigned(repo, key, tag):
    return push_image(repo, tag, b"nobody signed this"), "none: the registry holds no"


def other_key(repo, key, tag):
    theirs = cosign.load_private_key((KEYS / "other.key").read_bytes(), PASSWORD.encode(), "o")
    d = push_image(repo, tag, b"signed by another key")
    signstore.sign(repo, d, theirs, PREDICATES)
    return d, "a signature by another key"


def swapped_attestation(repo, key, tag):
    a = push_image(repo, "a", b"image a")
    signstore.sign(repo, a, key, PREDICATES)
    d = push_image(repo, tag, b"image b")
    signstore.sign(repo, d, key, {})  # signed, its own attestations missing...
    copy_tag(repo, cosign.att_tag(a), cosign.att_tag(d))  # ...and a's put in their place
    return d, f"statement about another image ({a})"


def repushed(repo, key, tag):
    a = push_image(repo, tag, b"as signed")
    signstore.sign(repo, a, key, PREDICATES)
    # The manifest changed after signing, under the same tag; its old signature copied along.
    d = push_image(repo, tag, b"changed after signing")
    copy_tag(repo, cosign.sig_tag(a), cosign.sig_tag(d))
    copy_tag(repo, cosign.att_tag(a), cosign.att_tag(d))
    return d, f"a signature by this key of another image, {a}"


@pytest.mark.parametrize("make", [unsigned, other_key, swapped_attestation, repushed])
def test_verify_and_pull_refuse_before_any_layer_moves(repo, key, tmp_path, content_tag, make):
    """In this process (a CLI start costs seconds here; the CLI itself: the run test below)."""
    from imgbuild.image import attest
    from imgbuild.pipeline.pull import pull_target
    from imgbuild.workspace import Workspace

    digest, said = make(repo, key, content_tag)
    # The image's one layer is taken out of the registry: a pull that went ahead would fail
    # on it (exit 3, "pull ... failed"), not on the policy.
    r = repo.api.request("DELETE", f"{repo.path}/blobs/{layer_of(repo, digest)}",
                         scope=repo.scope("pull", "push"))
    assert r.status_code == 202, r.text
    ws = Workspace.open(policy_project(tmp_path, repo), ROOT / "lockfiles", env={},
                        cwd=tmp_path)
    policy = ws.registries.policy_for(repo.name)
    assert policy is not None
    v = attest.verify(repo, content_tag, policy=policy)
    assert not v.ok
    assert said in " ".join(d for c, ok, d in v.checks if not ok and c.startswith(
        ("signature", "attestation")))
    with pytest.raises(JobFailed) as e:
        pull_target(ws, "tiny-cpu", model=None, registry_name=repo.name)
    err = e.value
    assert err.exit_code == 1
    assert err.message == f"{repo.name}@{digest} is not signed as {policy.where} asks; " \
                          "nothing was pulled"
    assert said in " ".join(err.facts) and "cosign verify --key" in err.hint


# `imgbuild run tiny-cpu` refuses while a container of the run label serves the same model
# (tiny-nvfp4): test_run's servers, in group engine-b, would meet this one on another worker.
# In their group the two take turns.
@pytest.mark.xdist_group("engine-b")
def test_run_refuses_an_image_swapped_under_a_signed_tag(repo, key, tmp_path, content_tag):
    signed = push_image(repo, content_tag, b"what CI signed")
    signstore.sign(repo, signed, key, PREDICATES)
    images = policy_project(tmp_path, repo)
    from imgbuild.catalog.registries import load_registries

    policy = load_registries([images]).policy_for(repo.name)
    assert all(ok for _, ok, _ in signstore.checks(repo, signed, policy)[0])
    swapped = push_image(repo, content_tag, b"swapped in later")
    r = imgbuild("run", "tiny-cpu", "--registry", repo.name, "--no-preflight", images=images)
    assert r.returncode == 1, r.stdout + r.stderr
    assert f"{repo.name}@{swapped} is not signed as" in r.stderr
    assert "none: the registry holds no" in r.stderr and "nothing was pulled" in r.stderr
    assert "pull of" not in r.stderr  # the Engine was never asked
    # A build that finds the content tag in the registry pulls it instead of building: the
    # same policy first.
    from imgbuild.image import daemon
    from imgbuild.pipeline.obtain import obtain
    from imgbuild.plan.decide import make_plan
    from imgbuild.workspace import Workspace

    ws = Workspace.open(images, ROOT / "lockfiles", env={}, cwd=tmp_path)
    plan = make_plan(ws, "tiny-cpu", repository=repo.name)
    with pytest.raises(JobFailed, match=f"{repo.name}@{swapped} is not signed as"):
        obtain(ws, plan, ws.target("tiny-cpu", plan.platform).lock(), daemon.client(), repo)


# --- keyless: real cosign signing with a leaf of the TEST STAND-IN CA ---------------------------

def test_cosign_keyless_with_a_standin_ca_is_accepted_and_checked_by_both(repo, tmp_path):
    """Real cosign signs and attests with a short-lived leaf the stand-in CA issued in Fulcio's
    place (a GitHub Actions workflow identity, an SCT from the stand-in CT log), no
    transparency log (--tlog-upload=false: nothing leaves the machine). imgbuild accepts it
    under a keyless policy that opts out of the log (`tlog: false`), refuses it under the
    default (the log required), and cosign verifies it against the same trusted_root.json."""
    from .sigstore_standin import GHA_ISSUER, GHA_SUBJECT, StandIn, cert_pem

    standin = StandIn.make()
    # The signing key is cosign's own (the leaf's key pair); the stand-in certifies it.
    r = cosign_cli("generate-key-pair", "--output-key-prefix", str(tmp_path / "leaf"))
    assert r.returncode == 0, r.stderr
    leaf_key = cosign.load_private_key((tmp_path / "leaf.key").read_bytes(), PASSWORD.encode(),
                                       "leaf.key").key
    (tmp_path / "leaf.pem").write_text(cert_pem(standin.leaf(leaf_key)))
    (tmp_path / "chain.pem").write_text(standin.chain_pem())
    (tmp_path / "trusted_root.json").write_text(json.dumps(standin.trusted_root()))
    # cosign checks the leaf's SCT when it signs: the stand-in CT log's key, not Sigstore's TUF.
    (tmp_path / "ct.pub").write_text(standin.ct_public_pem())
    ct_env = {"SIGSTORE_CT_LOG_PUBLIC_KEY_FILE": str(tmp_path / "ct.pub")}
    digest = push_image(repo, "v1", b"signed keyless by cosign")
    ref = f"{repo.name}@{digest}"
    with_cert = ["--key", str(tmp_path / "leaf.key"), "--certificate", str(tmp_path / "leaf.pem"),
                 "--certificate-chain", str(tmp_path / "chain.pem"), "--tlog-upload=false",
                 "--yes", *HTTP]
    r = cosign_cli("sign", *with_cert, ref, env=ct_env)
    assert r.returncode == 0, r.stderr
    for ptype, predicate in PREDICATES.items():
        kind = next(k for k, v in cosign.ATTESTATION_TYPES.items() if v == ptype)
        (tmp_path / f"{kind}.json").write_text(json.dumps(predicate))
        r = cosign_cli("attest", *with_cert, "--type", kind, "--predicate",
                       str(tmp_path / f"{kind}.json"), ref, env=ct_env)
        assert r.returncode == 0, r.stderr

    policy = SignPolicy(str(tmp_path / "registries.yaml"), issuer=GHA_ISSUER,
                                  subject=GHA_SUBJECT, trust_root="trusted_root.json", tlog=False)
    found, _ = signstore.checks(repo, digest, policy)
    assert [ok for _, ok, _ in found] == [True, True, True], found
    # What a keyless build records: the identity read back from the signature.
    [layer] = signstore.fetch_layers(repo, cosign.sig_tag(digest))
    who = keyless.leaf_identity(layer.annotations)
    assert (who.subject, who.issuer) == (GHA_SUBJECT, GHA_ISSUER)

    # The log is required unless the policy opts out: cosign's signature has no bundle.
    strict = replace(policy, tlog=True)
    with pytest.raises(JobFailed) as e:
        signstore.enforce(repo, digest, strict, ref)
    assert "no Rekor bundle" in " ".join(e.value.facts)
    other = replace(policy, subject="https://github.com/evil/x/.github/workflows/a.yml"
                                              "@refs/heads/main")
    with pytest.raises(JobFailed) as e:
        signstore.enforce(repo, digest, other, ref)
    assert f"a certificate for {GHA_SUBJECT}" in " ".join(e.value.facts)

    # cosign checks the same. Measured with cosign 2.5: for these (annotation-format)
    # signatures its verify reaches Sigstore's TUF for the Fulcio roots even with
    # --trusted-root, so offline it is given the CA chain and the CT log key instead.
    line = cosign.cosign_commands(policy, None, ref, plain_http=True)
    assert "--trusted-root" in line[0] and "--insecure-ignore-tlog=true" in line[0]
    offline = ["--certificate-chain", str(tmp_path / "chain.pem"), "--insecure-ignore-tlog=true",
               *HTTP]
    r = cosign_cli("verify", "--certificate-identity", GHA_SUBJECT, "--certificate-oidc-issuer",
                   GHA_ISSUER, *offline, ref, env=ct_env)
    assert r.returncode == 0, r.stderr
    r = cosign_cli("verify", "--certificate-identity", "https://github.com/evil/x",
                   "--certificate-oidc-issuer", GHA_ISSUER, *offline, ref, env=ct_env)
    assert r.returncode != 0
    r = cosign_cli("verify-attestation", "--type", "cyclonedx", "--certificate-identity",
                   GHA_SUBJECT, "--certificate-oidc-issuer", GHA_ISSUER, *offline, ref,
                   env=ct_env)
    assert r.returncode == 0, r.stderr
