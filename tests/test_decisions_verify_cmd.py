"""`imgbuild verify REF` as the command decides it (cli/commands/verify.py): how a reference is
read, which policy applies (--key over the registry's signed-by), an image against the lock of
the target it names, an index and each of its platforms, and the exit code. The registry and
the checks themselves are stood in for at their calls (tests/test_verify.py runs them against
a real registry)."""

from __future__ import annotations

import json

import pytest

from imgbuild.catalog.registries import SignPolicy
from imgbuild.cli.commands import verify as verify_cmd
from imgbuild.cli.main import main
from imgbuild.image import attest, registry
from imgbuild.image.attest import Verification

REPO = "127.0.0.1:5000/acme/serving"


@pytest.mark.parametrize("ref, message", [
    ("tiny-cpu", "tiny-cpu: expected HOST[:PORT]/REPO:TAG or HOST[:PORT]/REPO@DIGEST"),
    (":tag", ":tag: expected HOST[:PORT]/REPO:TAG or HOST[:PORT]/REPO@DIGEST"),
    ("acme/serving:tiny-cpu", "acme/serving:tiny-cpu names no registry host"),
])
def test_a_reference_verify_cannot_read_is_refused(capsys, ref, message):
    assert main(["verify", ref, "--json"]) == 2
    doc = json.loads(capsys.readouterr().out)
    assert doc["message"] == message


def test_key_stands_for_a_policy_of_that_key_else_the_registrys(tmp_path, monkeypatch):
    configured = SignPolicy("images/registries.yaml", key="k.pub")
    assert verify_cmd.signature_policy(None, configured) is configured
    assert verify_cmd.signature_policy(None, None) is None
    monkeypatch.chdir(tmp_path)
    got = verify_cmd.signature_policy("cosign.pub", configured)
    assert got == SignPolicy("--key", key=str(tmp_path / "cosign.pub"))
    assert got.attestations == SignPolicy("x").attestations  # both asked for


class Calls:
    def __init__(self, monkeypatch, *, index: bool, ok: dict[str, bool]):
        self.verified: list[tuple] = []
        self.shown: list[tuple] = []
        kind = registry.OCI_INDEX if index else registry.OCI_MANIFEST
        monkeypatch.setattr(registry, "manifest_descriptor",
                            lambda repo, tag: {"mediaType": kind, "digest": "sha256:top"})
        monkeypatch.setattr(registry, "fetch_index", lambda repo, tag: (
            "sha256:ix", {"linux/amd64": "sha256:a", "linux/arm64": "sha256:b"}))

        def verify(repo, reference, lock=None, policy=None):
            self.verified.append((reference, lock is not None, policy))
            return Verification(reference, reference, (("x", ok.get(reference, True), ""),),
                                {"io.imgbuild.target": "tiny-cpu-multi"})

        monkeypatch.setattr(attest, "verify", verify)
        views = verify_cmd.views
        monkeypatch.setattr(views, "verification", lambda out, v: self.shown.append(("one", v)))
        monkeypatch.setattr(views, "index_verification",
                            lambda out, ref, d, found, own: self.shown.append(
                                ("index", ref, d, sorted(found), own)))
        monkeypatch.setattr(views, "signature_policy",
                            lambda out, policy, name, vs, index_digest=None: self.shown.append(
                                ("policy", policy, name, index_digest)))


@pytest.mark.parametrize("ok, code", [({}, 0), ({"sha256:b": False}, 1)])
def test_an_index_is_verified_with_each_platform_against_its_lock(monkeypatch, ok, code):
    c = Calls(monkeypatch, index=True, ok=ok)
    assert main(["verify", f"{REPO}:tiny-cpu-multi"]) == code
    # Each platform's image, then again against the lock of its platform (the workspace has
    # tiny-cpu-multi and its locks).
    assert [(r, lock) for r, lock, _ in c.verified] == [
        ("sha256:a", False), ("sha256:a", True), ("sha256:b", False), ("sha256:b", True)]
    assert c.shown[0] == ("index", f"{REPO}:tiny-cpu-multi", "sha256:ix",
                          ["linux/amd64", "linux/arm64"], [])  # no policy: no own checks
    assert c.shown[1] == ("policy", None, REPO, "sha256:ix")


def test_an_image_is_verified_against_its_targets_lock_and_by_digest(monkeypatch, tmp_path):
    c = Calls(monkeypatch, index=False, ok={"tiny-cpu-multi": False})
    assert main(["verify", f"{REPO}:tiny-cpu-multi", "--key", str(tmp_path / "k.pub")]) == 1
    assert [(r, lock) for r, lock, _ in c.verified] == [("tiny-cpu-multi", False),
                                                        ("tiny-cpu-multi", True)]
    policy = c.verified[0][2]
    assert policy == SignPolicy("--key", key=str(tmp_path / "k.pub"))
    assert c.shown[0][0] == "one" and c.shown[1] == ("policy", policy, REPO, None)
    c = Calls(monkeypatch, index=False, ok={})
    assert main(["verify", f"{REPO}@sha256:{'ab' * 32}"]) == 0
    assert c.verified[0][0] == f"sha256:{'ab' * 32}"  # the digest itself, not a tag


def test_an_image_of_a_target_this_workspace_lacks_is_verified_without_a_lock(monkeypatch):
    c = Calls(monkeypatch, index=False, ok={})
    monkeypatch.setattr(attest, "verify", lambda repo, reference, lock=None, policy=None: (
        c.verified.append((reference, lock is not None, policy)) or Verification(
            reference, reference, (), {"io.imgbuild.target": "someone-elses"})))
    assert main(["verify", f"{REPO}:x"]) == 0
    assert [(r, lock) for r, lock, _ in c.verified] == [("x", False)]


def test_the_index_checks_are_none_without_a_policy_and_the_policys_with_one(monkeypatch):
    from imgbuild.image import signstore

    assert verify_cmd.index_checks(object(), "sha256:ix", None) == []
    policy = SignPolicy("p", key="k.pub")
    monkeypatch.setattr(signstore, "checks", lambda repo, d, p: (
        [("signature", d == "sha256:ix" and p is policy, "")], None))
    assert verify_cmd.index_checks(object(), "sha256:ix", policy) == [("signature", True, "")]
