"""Decision tests for imgbuild/checks/patches.py on a scratch site-packages made here (a `demo`
package installed with its RECORD, as tests/test_patches.py makes it): which status each patch
gets, when a patch that applies is turned into a failure, and what `patches` (without --check)
says from the version ranges alone. No network, no Docker."""

from __future__ import annotations

import pytest

from imgbuild.catalog.patches import Patch, Variant
from imgbuild.checks import patches
from imgbuild.workspace import Workspace

from .test_patches import ORIGINAL, PATCHED, make_site, tree, unified


def _patch(pid: str = "demo-fix", versions: str = ">=1.0,<2", diff: str | None = None) -> Patch:
    return Patch(pid, f"images/patches/{pid}.yaml", "demo", versions, "x", "unknown",
                 (Variant(versions, diff or unified(ORIGINAL, PATCHED), "<test>"),), "")


def test_a_patch_in_range_applies_and_the_record_is_checked(tmp_path):
    site = make_site(tmp_path)
    (r,) = patches.check_site([_patch()], site)
    assert (r.status, r.version, r.files) == ("applies", "1.2.0", ("demo/mod.py",))
    assert not patches.failed([r])
    assert (site / "demo" / "mod.py").read_text() == PATCHED  # applied to the scratch copy


def test_out_of_range_and_fixed_upstream(tmp_path):
    site = make_site(tmp_path, version="3.0")
    assert patches.check_site([_patch()], site)[0].status == "not-applicable"
    fixed = make_site(tmp_path / "fixed", text=PATCHED)
    assert patches.check_site([_patch()], fixed)[0].status == "obsolete"


def test_a_patch_whose_context_drifted_fails_and_nothing_is_written(tmp_path):
    site = make_site(tmp_path)
    drifted = unified(ORIGINAL.replace("def matches", "def matches_v2"),
                      PATCHED.replace("def matches", "def matches_v2"))
    before = tree(site)
    results = patches.check_site([_patch(diff=drifted), _patch("second")], site)
    assert results[0].status == "fails" and patches.failed(results)
    assert results[1].status == "applies"  # decided, not written: the build fails first
    assert tree(site) == before  # all or nothing: the good one was not written either


def test_without_verify_only_the_decision_is_made(tmp_path):
    site = make_site(tmp_path)
    before = tree(site)
    (r,) = patches.check_site([_patch()], site, verify=False)
    assert r.status == "applies" and tree(site) == before


def test_an_apply_that_breaks_the_record_is_a_failure(tmp_path):
    site = make_site(tmp_path)
    record = next(site.glob("demo-*.dist-info")) / "RECORD"
    record.write_text("".join(ln for ln in record.read_text().splitlines(keepends=True)
                              if not ln.startswith("demo/mod.py")))
    (r,) = patches.check_site([_patch()], site)
    assert r.status == "fails" and "RECORD" in r.detail


def test_a_record_mismatch_elsewhere_does_not_fail_the_patch(tmp_path):
    site = make_site(tmp_path)
    (site / "demo" / "__init__.py").write_text("changed after install\n")
    (r,) = patches.check_site([_patch()], site)
    assert r.status == "applies"  # __init__.py is not a file this patch changes


def test_listing_reads_the_version_ranges_only():
    ws = Workspace.open(None, None, None)
    report = patches.listing(ws, "sglang-0516-blackwell")
    assert not report.checked and report.results
    assert all(r.status == "unchecked" and r.version == "0.5.16" and "is in" in r.detail
               for r in report.results)
    assert patches.listing(ws, "sglang-blackwell").results == ()  # lists no patches
    assert patches.listing(ws, "tiny-cpu").results == ()
    assert patches.to_dict(report.results, target="t")["ok"] is True


@pytest.mark.parametrize(("statuses", "failed"), [
    (["applies", "obsolete"], False), (["not-applicable", "unchecked"], False),
    (["applies", "fails"], True)])
def test_only_a_failing_patch_fails_the_job(statuses, failed):
    rs = [patches.PatchResult(str(i), s, "", "demo") for i, s in enumerate(statuses)]
    assert patches.failed(rs) is failed
    assert patches.PatchReport("t", True, tuple(rs)).failed is failed
    assert patches.to_dict(rs)["ok"] is (not failed)
