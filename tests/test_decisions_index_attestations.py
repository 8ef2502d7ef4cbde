"""What a multi-platform index is attested with (image/indexsign.py index_predicates): its
CycloneDX SBOM (the index and its platform images as components, each by digest, purl and
hash) and its SLSA provenance (what `imgbuild index` assembled it from), as reviewed in
tests/golden/attest/ (`make golden` records them after a change meant to change them). A
verifier reads every field: a renamed key is a broken attestation.

cosign verifies what is signed with these against a real registry in
tests/test_sign_interop.py."""

from __future__ import annotations

import json

from imgbuild.catalog.registries import ATTESTATION_TYPES
from imgbuild.image import indexsign

from . import golden

INDEX = "sha256:" + "1" * 64
MANIFESTS = (("linux/amd64", "sha256:" + "a" * 64), ("linux/arm64", "sha256:" + "b" * 64))


GOLDEN = golden.page_folder(__name__)


def pages() -> dict[str, str]:
    got = indexsign.index_predicates(
        "registry.example/Acme/Serving", INDEX, target="tiny-cpu-multi", model="tiny-nvfp4",
        content_tag="tiny-cpu-multi-4dca5e925a30e6a7", content_key="sha256:" + "c" * 64,
        manifests=MANIFESTS, tool_version="0.9.0", commit="0123456789abcdef")
    names = {ATTESTATION_TYPES["cyclonedx"]: "sbom.json",
             ATTESTATION_TYPES["slsaprovenance1"]: "provenance.json"}
    return {names[kind]: json.dumps(doc, indent=1, sort_keys=True) + "\n"
            for kind, doc in got.items()}




def test_the_index_attestations_are_the_reviewed_ones():
    GOLDEN.check(pages())


def test_each_platform_image_is_named_by_its_digest_in_a_package_url():
    assert indexsign._purl("registry.example/Acme/Serving", MANIFESTS[1][1], "linux/arm64") == (
        "pkg:oci/serving@sha256%3A" + "b" * 64 + "?arch=arm64&os=linux"
        "&repository_url=registry.example/Acme/Serving")
    # a platform with a variant keeps it in the arch
    assert "arch=arm64/v8&os=linux" in indexsign._purl("r/x", INDEX, "linux/arm64/v8")


def test_an_sboms_serial_is_a_name_based_uuid_of_the_index():
    import uuid

    got = indexsign._uuid_of(INDEX)
    u = uuid.UUID(got)
    assert (u.version, str(u)) == (5, got) and got == indexsign._uuid_of(INDEX)
    assert got != indexsign._uuid_of(MANIFESTS[0][1])
