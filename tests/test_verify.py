"""Attestations beside the image (SBOM, provenance) and `imgbuild verify`: a pushed image
verifies; an SBOM that does not list what the lock pins, or a provenance that names another
image, makes verify and pull fail. Real Engine, real registry."""

from __future__ import annotations

import gzip
import json
import os
import subprocess
import sys
import uuid
from pathlib import Path

import pytest
import requests

from imgbuild.image import attest, registry

from .conftest import REGISTRY_HOST, ROOT, WHEELS, registry_available

pytestmark = pytest.mark.docker


KEYS = Path(__file__).parent / "fixtures" / "cosign"  # made by cosign 2.5; password below
COSIGN = Path(os.environ.get("IMGBUILD_STATE", "/var/lib/imgbuild")) / "cosign" / "bin" / "cosign"


def imgbuild(*args: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, UV_PYTHON_DOWNLOADS="never", HF_HUB_OFFLINE="1",
               COSIGN_PASSWORD="imgbuild-test") | ({"IMGBUILD_WHEELS": WHEELS} if WHEELS else {})
    return subprocess.run([sys.executable, "-m", "imgbuild.cli", *args], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=1800)


def test_pushed_image_verifies_and_tampered_attestations_do_not(docker_client):
    if not registry_available():
        pytest.skip(f"skipped: no registry on {REGISTRY_HOST} (make services starts one)")
    name = f"{REGISTRY_HOST}/imgbuild-verify-{uuid.uuid4().hex[:8]}"
    # Signed after the smoke gate, with a password-protected cosign key (tests/fixtures/cosign).
    r = imgbuild("tiny-cpu", "--push", "--registry", name, "--json",
                 "--sign-key", str(KEYS / "cosign.key"))
    assert r.returncode == 0, r.stderr[-3000:]
    digest = json.loads(r.stdout)["pushed"][0].split("@")[1]
    assert json.loads(r.stdout)["signed"] == [f"{digest.replace(':', '-')}.{kind}"
                                              for kind in ("sig", "att")]
    # What imgbuild signed, real cosign accepts: the signature, and the SBOM and provenance as
    # signed attestations about this digest.
    if COSIGN.exists():
        for check in (["verify"], ["verify-attestation", "--type", "cyclonedx"],
                      ["verify-attestation", "--type", "slsaprovenance1"]):
            c = subprocess.run([str(COSIGN), *check, "--key", str(KEYS / "cosign.pub"),
                                "--insecure-ignore-tlog=true", "--allow-insecure-registry",
                                "--allow-http-registry", f"{name}@{digest}"],
                               capture_output=True, text=True, timeout=120)
            assert c.returncode == 0, c.stderr
    r = imgbuild("verify", f"{name}:tiny-cpu", "--json", "--key", str(KEYS / "cosign.pub"))
    assert r.returncode == 0, r.stdout + r.stderr
    assert [c["check"] for c in json.loads(r.stdout)["checks"]][-3:] == [
        "signature", "attestation cyclonedx", "attestation slsaprovenance1"]
    r = imgbuild("verify", f"{name}:tiny-cpu", "--json")
    assert r.returncode == 0, r.stdout + r.stderr
    doc = json.loads(r.stdout)
    assert doc["digest"] == digest and doc["ok"]
    assert [c["check"] for c in doc["checks"]] == ["digest", "image", "smoke report", "sbom",
                                                  "lock", "provenance"]
    repo = registry.Repository.parse(name)
    _, sbom, _ = registry.fetch_artifact(repo, attest.tag(digest, "sbom"), attest.SBOM_TYPE)
    pypi = [c for c in sbom["components"] if c["purl"].startswith("pkg:pypi/")]
    debs = [c for c in sbom["components"] if c["purl"].startswith("pkg:deb/")]
    assert {c["name"] for c in pypi} >= {"torch", "transformers", "compressed-tensors"}
    assert any(c["name"] == "libc6" for c in debs) and all(c["version"] for c in debs)
    # An SBOM missing one locked package no longer matches the image's lock.
    tampered = dict(sbom, components=[c for c in sbom["components"] if c["name"] != "torch"])
    registry.push_artifact(repo, attest.tag(digest, "sbom"), attest.SBOM_TYPE, tampered, b"{}",
                           "application/vnd.oci.empty.v1+json", subject=digest)
    r = imgbuild("verify", f"{name}:tiny-cpu", "--json")
    assert r.returncode == 1
    failed = {c["check"]: c["detail"] for c in json.loads(r.stdout)["checks"] if not c["ok"]}
    assert list(failed) == ["sbom"] and "differ from the image's lock label" in failed["sbom"]
    r = imgbuild("pull", "tiny-cpu", "--registry", name)
    assert r.returncode == 1 and "does not verify" in " ".join(r.stderr.split())
    # Provenance that names another image.
    registry.push_artifact(repo, attest.tag(digest, "sbom"), attest.SBOM_TYPE, sbom, b"{}",
                           "application/vnd.oci.empty.v1+json", subject=digest)
    _, prov, _ = registry.fetch_artifact(repo, attest.tag(digest, "provenance"),
                                         attest.PROVENANCE_TYPE)
    prov["subject"][0]["digest"] = {"sha256": "0" * 64}
    registry.push_artifact(repo, attest.tag(digest, "provenance"), attest.PROVENANCE_TYPE, prov,
                           b"{}", "application/vnd.oci.empty.v1+json", subject=digest)
    r = imgbuild("verify", f"{name}:tiny-cpu", "--json")
    failed = [c["check"] for c in json.loads(r.stdout)["checks"] if not c["ok"]]
    assert r.returncode == 1 and failed == ["provenance"]


@pytest.mark.docker
def test_a_manifest_whose_config_is_a_manifest_does_not_verify(own_repo):
    """What the containerd store's push used to publish (issue 45): a manifest whose config
    blob is another manifest. verify names it, before anything is pulled."""
    repo = registry.Repository.parse(own_repo)
    layer = gzip.compress(b"not much of a layer")
    other = json.dumps({"schemaVersion": 2, "mediaType": registry.OCI_MANIFEST,
                        "config": {"mediaType": "application/vnd.oci.image.config.v1+json",
                                   "digest": "sha256:" + "0" * 64, "size": 2},
                        "layers": []}).encode()
    body = json.dumps({"schemaVersion": 2, "mediaType": registry.OCI_MANIFEST,
                       "config": {"mediaType": "application/vnd.oci.image.config.v1+json",
                                  "digest": registry.put_blob(repo, other), "size": len(other)},
                       "layers": [{"mediaType": "application/vnd.oci.image.layer.v1.tar+gzip",
                                   "digest": registry.put_blob(repo, layer),
                                   "size": len(layer)}]}).encode()
    r = requests.put(f"http://{repo.host}/v2/{repo.path}/manifests/broken", data=body,
                     headers={"Content-Type": registry.OCI_MANIFEST}, timeout=30)
    assert r.status_code == 201, r.text
    r = imgbuild("verify", f"{own_repo}:broken", "--json")
    assert r.returncode == 1, r.stdout + r.stderr
    checks = {c["check"]: c for c in json.loads(r.stdout)["checks"]}
    assert not checks["image"]["ok"]
    assert "not an image config: it is an image manifest" in checks["image"]["detail"]
