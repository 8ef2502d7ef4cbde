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


@pytest.mark.parametrize("ref, message, hint", [
    ("tiny-cpu", "tiny-cpu: expected HOST[:PORT]/REPO:TAG or HOST[:PORT]/REPO@DIGEST",
     "e.g. 127.0.0.1:5000/imgbuild:tiny-cpu"),
    (":tag", ":tag: expected HOST[:PORT]/REPO:TAG or HOST[:PORT]/REPO@DIGEST",
     "e.g. 127.0.0.1:5000/imgbuild:tiny-cpu"),
    ("acme/serving:tiny-cpu", "acme/serving:tiny-cpu names no registry host",
     "verify checks a registry's copy"),
])
def test_a_reference_verify_cannot_read_is_refused(capsys, ref, message, hint):
    assert main(["verify", ref, "--json"]) == 2
    doc = json.loads(capsys.readouterr().out)
    assert doc["message"] == message
    assert doc["hint"] == hint


def test_key_stands_for_a_policy_of_that_key_else_the_registrys(tmp_path, monkeypatch):
    configured = SignPolicy("images/registries.yaml", key="k.pub")
    assert verify_cmd.signature_policy(None, configured) is configured
    assert verify_cmd.signature_policy(None, None) is None
    monkeypatch.chdir(tmp_path)
    got = verify_cmd.signature_policy("cosign.pub", configured)
    assert got == SignPolicy("--key", key=str(tmp_path / "cosign.pub"))
    assert got.attestations == SignPolicy("x").attestations  # both asked for


class Calls:
    """The registry, the checks and the views stood in for: each records what it was asked,
    and the registry answers only for REPO and the tag the command was given."""

    def __init__(self, monkeypatch, *, index: bool, ok: dict[str, bool], tag: str = "tiny-cpu-multi"):
        self.verified: list[tuple] = []
        self.locks: list[str | None] = []
        self.shown: list[tuple] = []
        kind = registry.OCI_INDEX if index else registry.OCI_MANIFEST

        def descriptor(repo, t):
            assert (repo.name, t) == (REPO, tag)
            return {"mediaType": kind, "digest": "sha256:top"}

        def fetch_index(repo, t):
            assert (repo.name, t) == (REPO, tag)
            return "sha256:ix", {"linux/amd64": "sha256:a", "linux/arm64": "sha256:b"}

        monkeypatch.setattr(registry, "manifest_descriptor", descriptor)
        monkeypatch.setattr(registry, "fetch_index", fetch_index)

        def verify(repo, reference, lock=None, policy=None):
            assert repo.name == REPO
            self.verified.append((reference, lock is not None, policy))
            self.locks.append(None if lock is None else lock.path.name)
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
    # each platform's image against its own platform's lock, not the target's first one
    assert c.locks == [None, "tiny-cpu-multi.py3.11-manylinux_2_36-x86_64.txt",
                       None, "tiny-cpu-multi.py3.11-manylinux_2_36-aarch64.txt"]
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
    c = Calls(monkeypatch, index=False, ok={}, tag=f"sha256:{'ab' * 32}")
    assert main(["verify", f"{REPO}@sha256:{'ab' * 32}"]) == 0
    assert c.verified[0][0] == f"sha256:{'ab' * 32}"  # the digest itself, not a tag


def test_an_images_verification_is_what_the_view_shows(monkeypatch):
    c = Calls(monkeypatch, index=False, ok={})
    assert main(["verify", f"{REPO}:tiny-cpu-multi"]) == 0
    shown = c.shown[0][1]
    assert c.shown[0][0] == "one" and isinstance(shown, Verification)
    assert shown.ref == "tiny-cpu-multi"


def test_an_index_and_each_platform_are_checked_under_the_keys_policy(monkeypatch, tmp_path):
    from imgbuild.image import signstore

    c = Calls(monkeypatch, index=True, ok={})
    asked = []
    monkeypatch.setattr(signstore, "checks", lambda repo, d, p: (
        asked.append((repo.name, d, p)) or [("signature", True, "")], None))
    assert main(["verify", f"{REPO}:tiny-cpu-multi", "--key", str(tmp_path / "k.pub")]) == 0
    policy = SignPolicy("--key", key=str(tmp_path / "k.pub"))
    assert asked == [(REPO, "sha256:ix", policy)]  # the index's own digest
    assert [p for _, _, p in c.verified] == [policy] * 4
    assert c.shown[0][4] == [("signature", True, "")]
    assert c.shown[1] == ("policy", policy, REPO, "sha256:ix")


def test_an_image_of_a_target_this_workspace_lacks_is_verified_without_a_lock(monkeypatch):
    c = Calls(monkeypatch, index=False, ok={}, tag="x")
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
