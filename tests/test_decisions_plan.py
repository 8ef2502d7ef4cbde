"""Decision tests for imgbuild/plan/ helpers on the shipped catalog and its locks: which patches
an image's patch layer carries and applies, and what its content digest covers. No Docker."""

from __future__ import annotations

import pytest

from imgbuild.errors import SpecError
from imgbuild.plan import patchset
from imgbuild.workspace import Workspace


@pytest.fixture(scope="module")
def ws() -> Workspace:
    return Workspace.open(None, None, None)


def _ids(ws):
    return sorted(ws.patches)


def test_patches_apply_where_the_locked_version_is_in_their_range(ws):
    lock = ws.target("sglang-0516-blackwell").lock()
    assert lock.package("sglang").version == "0.5.16"
    assert patchset.expected_applied(_ids(ws), lock, ws.patches) == tuple(_ids(ws))
    fixed = ws.target("sglang-blackwell").lock()  # 0.5.17 and later fix both
    assert patchset.expected_applied(_ids(ws), fixed, ws.patches) == ()
    # Unknown ids are not applied (context_files is the one that refuses them).
    assert patchset.expected_applied(["no-such-patch"], lock, ws.patches) == ()


def test_patch_layer_files_for_a_locked_package_only(ws):
    ids = _ids(ws)
    files = patchset.context_files(ids, ws.target("sglang-blackwell").lock(), ws.patches)
    # Out of range still ships: the patcher tells an upstream fix from a broken patch.
    assert list(files) == ["patcher.py"] + [f"patches/{i}.json" for i in ids]
    assert files["patcher.py"] == patchset.PATCHER.read_text()
    assert patchset.context_files(ids, ws.target("tiny-cpu").lock(), ws.patches) == {}
    with pytest.raises(SpecError, match="no-such-patch"):
        patchset.context_files(["no-such-patch"], ws.target("tiny-cpu").lock(), ws.patches)


def test_context_digest_covers_names_and_contents(tmp_path):
    base = {"patcher.py": "x", "patches/a.json": "{}"}
    d = patchset.context_digest(base)
    assert d.startswith("sha256:") and d == patchset.context_digest(dict(reversed(base.items())))
    assert patchset.context_digest({**base, "patches/a.json": "{ }"}) != d
    assert patchset.context_digest({"patcher.py": "x", "patches/b.json": "{}"}) != d
    # The separator keeps name and content apart.
    assert patchset.context_digest({"ab": "c"}) != patchset.context_digest({"a": "bc"})
    patchset.write_context(base, tmp_path)
    assert (tmp_path / "patches" / "a.json").read_text() == "{}"


def test_probe_and_apply_read_the_same_files():
    probe = patchset.probe_command("python3")
    assert probe[:3] == ["python3", "/opt/imgbuild/patcher.py", "--probe"]
    assert " ".join(probe[3:]) in patchset.apply_command("python3")


def test_what_pins_a_bases_bytes_is_its_digest_or_its_recorded_rootfs(ws):
    from imgbuild.plan.decide import _base_digest
    boot = ws.catalog.bases["debian-bookworm"]
    pulled = ws.catalog.bases["ubuntu24.04"]
    assert boot.bootstrap and not pulled.bootstrap
    assert _base_digest(ws.catalog, pulled, "ubuntu:24.04@sha256:ab") == "sha256:ab"
    # A bootstrapped base's own tag is pinned by the rootfs its recipe records ...
    assert _base_digest(ws.catalog, boot, boot.image) == boot.bootstrap["rootfs"]
    # ... another image on it (nvidia/cuda's, by tag) is not, and neither is a pulled base's tag.
    assert _base_digest(ws.catalog, boot, "nvidia/cuda:13.0.1-cudnn-devel-ubuntu24.04") is None
    assert _base_digest(ws.catalog, pulled, pulled.image) is None
