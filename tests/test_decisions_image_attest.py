"""What `verify` decides from an SBOM and a provenance statement (image/attest.py), the cases
tests/test_trust_paths.py leaves open: only PyPI components count as locked packages (an OS
package whose purl mentions pypi does not), a forced smoke report passes only as forced, the
provenance names this digest; plain data, no registry."""

from __future__ import annotations

from imgbuild.image import attest
from imgbuild.lock.lockfile import LockedPackage, pins_digest

PKGS = (LockedPackage("torch", "2.13.0", ("sha256:" + "a" * 64,)),
        LockedPackage("six", "1.17.0", ("sha256:" + "b" * 64, "sha256:" + "c" * 64)))
DIGEST = "sha256:" + "d" * 64


def sbom_doc(extra=()) -> dict:
    comps = [{"type": "library", "name": p.name, "version": p.version,
              "purl": f"pkg:pypi/{p.name}@{p.version}",
              "hashes": [{"alg": "SHA-256", "content": h.split(":", 1)[1]} for h in p.hashes]}
             for p in PKGS]
    return {"components": comps + list(extra)}


def test_only_pypi_components_are_the_locked_packages():
    want = pins_digest(PKGS)
    deb = {"type": "library", "name": "python3-pypi-helper", "version": "1",
           "purl": "pkg:deb/debian/python3-pypi-helper@1?arch=amd64"}
    name, ok, said = attest.check_sbom(sbom_doc([deb]), want)
    assert name == "sbom" and ok and said.startswith("2 locked packages, 1 OS packages")
    assert not attest.check_sbom(sbom_doc(), pins_digest(PKGS[:1]))[1]
    assert attest.check_sbom(None, want) == ("sbom", False, "none stored")


def test_each_judgement_on_plain_data():
    labels = {"io.imgbuild.lock.hash": pins_digest(PKGS)}
    prov = {"subject": [{"digest": {"sha256": "d" * 64}}]}
    checks = dict((c, (ok, d)) for c, ok, d in
                  attest.judge(DIGEST, labels, {"ok": True}, sbom_doc(), prov))
    assert checks["smoke report"] == (True, "passed")
    assert checks["sbom"][0] and checks["provenance"] == (True, "names this digest")
    forced = dict((c, (ok, d)) for c, ok, d in
                  attest.judge(DIGEST, labels, {"ok": False, "forced": True}, None, None))
    assert forced["smoke report"] == (True, "FAILED (tags moved with --force)")
    failed = dict((c, (ok, d)) for c, ok, d in
                  attest.judge(DIGEST, labels, {"ok": False}, None, {"subject": []}))
    assert failed["smoke report"] == (False, "FAILED") and not failed["provenance"][0]
    other = {"subject": [{"digest": {"sha256": "e" * 64}}]}
    assert not dict((c, ok) for c, ok, _ in
                    attest.judge(DIGEST, labels, None, None, other))["provenance"]
    assert attest._digest(DIGEST) == {"sha256": "d" * 64} and attest._digest(None) == {}


def test_the_artifacts_are_tagged_by_the_images_digest_and_kind():
    assert attest.tag(DIGEST, "sbom") == "sha256-" + "d" * 64 + ".sbom"
    assert attest._uuid_of(DIGEST) == attest._uuid_of(DIGEST) != attest._uuid_of("sha256:x")
    assert attest._uuid_of(DIGEST)[14] == "5" and attest._uuid_of(DIGEST)[19] == "8"
