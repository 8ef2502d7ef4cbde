"""Decision tests for imgbuild/checks/patches.py on a scratch site-packages made here (a `demo`
package installed with its RECORD, as tests/test_patches.py makes it): which status each patch
gets, when a patch that applies is turned into a failure, and what `patches` (without --check)
says from the version ranges alone. No network, no Docker."""

from __future__ import annotations

from dataclasses import replace

import pytest

from imgbuild.catalog.patches import Patch, Variant
from imgbuild.checks import patches
from imgbuild.workspace import Workspace

from .conftest import checkout_workspace
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


def test_a_result_carries_the_patch_and_the_decision_field_by_field(tmp_path):
    site = make_site(tmp_path)
    p = replace(_patch(), upstream="https://example.org/pr/1", fixes="the substring match")
    (r,) = patches.check_site([p], site)
    assert r == patches.PatchResult("demo-fix", "applies", "applies cleanly", "demo", "1.2.0",
                                    ">=1.0,<2", ("demo/mod.py",), "https://example.org/pr/1",
                                    "the substring match")
    # A decision that names no file (out of range): the patch's own files are listed.
    (r,) = patches.check_site([p], make_site(tmp_path / "v3", version="3.0"))
    assert (r.status, r.files, r.variant) == ("not-applicable", ("demo/mod.py",), None)


def test_after_applying_only_the_patchs_own_files_record_problems_fail_it(tmp_path, monkeypatch):
    """The patcher keeps RECORD right; this is the guard against it not doing so. A problem in
    a file the patch did not change is the wheel's, not the patch's."""
    from imgbuild.payload import patcher

    site = make_site(tmp_path)
    monkeypatch.setattr(patcher, "verify_record", lambda dist, s: [
        "demo/mod.py: sha256: a != b", "demo/__init__.py: size differs",
        "demo/mod.py: size 1 != 2"])
    (r,) = patches.check_site([_patch(), _patch("other", versions=">=9")], site)[:1]
    assert r.status == "fails"
    assert r.detail == ("RECORD inconsistent after patching: demo/mod.py: sha256: a != b; "
                        "demo/mod.py: size 1 != 2")  # a problem's path is before its first ':'

    monkeypatch.setattr(patcher, "verify_record", lambda dist, s: [
        "demo/__init__.py: size differs"])
    assert patches.check_site([_patch()], make_site(tmp_path / "b"))[0].status == "applies"


def test_a_patch_that_applies_in_a_site_without_its_distribution_fails(tmp_path, monkeypatch):
    from imgbuild.payload import patcher

    site = make_site(tmp_path)
    real_find, real_apply, applied = patcher.find_dist, patcher.apply, []

    def apply(*a, **kw):
        out = real_apply(*a, **kw)
        applied.append(True)
        return out

    # Gone once applied: the check after the apply finds no distribution to verify.
    monkeypatch.setattr(patcher, "apply", apply)
    monkeypatch.setattr(patcher, "find_dist", lambda s, package: None if applied else
                        real_find(s, package))
    (r,) = patches.check_site([_patch()], site)
    assert applied
    assert (r.status, r.detail) == ("fails", "RECORD inconsistent after patching: not installed")


def test_an_apply_error_fails_only_the_patches_that_applied(tmp_path, monkeypatch):
    from imgbuild.payload import patcher

    def refuse(docs, site, report):
        raise patcher.PatchError("demo/mod.py: not in RECORD")

    monkeypatch.setattr(patcher, "apply", refuse)
    results = patches.check_site([_patch(), _patch("later", versions=">=9")],
                                 make_site(tmp_path))
    assert [(r.status, r.detail) for r in results] == [
        ("fails", "demo/mod.py: not in RECORD"),
        ("obsolete", results[1].detail)]  # the first one's change is seen: left as decided
    assert results[1].detail != "demo/mod.py: not in RECORD"


def test_listing_says_which_patches_the_lock_leaves_out_or_puts_out_of_range(monkeypatch):
    ws = Workspace.open(None, None, None)
    p = _patch()
    absent = replace(p, id="absent", package="no-such-package", upstream="u1", fixes="f1")
    out = replace(p, id="out", package="sglang", versions="<0.5", upstream="u2", fixes="f2",
                  variants=(Variant("<0.5", p.variants[0].diff, "<test>"),))
    inside = replace(p, id="in", package="sglang", versions=">=0.5.7,<0.5.17", upstream="u3",
                     fixes="f3", variants=(Variant(">=0.5.7,<0.5.17", p.variants[0].diff,
                                                   "<test>"),))
    monkeypatch.setattr(patches, "target_patches", lambda target, known: [absent, out, inside])
    report = patches.listing(ws, "sglang-0516-blackwell")
    assert report.target == "sglang-0516-blackwell" and report.checked is False
    assert report.results == (
        patches.PatchResult("absent", "not-applicable", "no-such-package is not in the lock",
                            "no-such-package", upstream="u1", fixes="f1"),
        patches.PatchResult("out", "unchecked", "sglang 0.5.16 is outside <0.5; `--check` tells "
                            "obsolete from not-applicable", "sglang", "0.5.16", None,
                            ("demo/mod.py",), "u2", "f2"),
        patches.PatchResult("in", "unchecked", "sglang 0.5.16 is in >=0.5.7,<0.5.17; `--check` "
                            "applies it to the locked wheel", "sglang", "0.5.16",
                            ">=0.5.7,<0.5.17", ("demo/mod.py",), "u3", "f3"))
    monkeypatch.setattr(patches, "target_patches", lambda target, known: [])
    assert patches.listing(ws, "sglang-0516-blackwell") == patches.PatchReport(
        "sglang-0516-blackwell", False, ())


# --- what of a wheel is unpacked to check a patch ----------------------------------------------

def _wheel(members: dict[str, bytes]):
    import io
    import zipfile

    from imgbuild.lock.wheels import Wheel

    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as z:
        for name, data in members.items():
            z.writestr(zipfile.ZipInfo(name), data)
    return Wheel("pkg", "1.0", "pkg-1.0-py3-none-any.whl", None, "cache", 0, None,
                 zipfile.ZipFile(io.BytesIO(buf.getvalue())))


def test_only_the_patched_files_and_the_dist_info_are_unpacked(tmp_path):
    from imgbuild.checks.patches import extract

    w = _wheel({"pkg/": b"", "pkg/a.py": b"a", "pkg/b.py": b"b", "pkg/sub/c.py": b"c",
                "pkg-1.0.dist-info/RECORD": b"r", "pkg-1.0.dist-info/METADATA": b"m",
                "other.dist-info.txt": b"x"})
    got = extract(w, tmp_path, ["pkg/sub/c.py"])
    assert got == tmp_path
    files = sorted(str(p.relative_to(tmp_path)) for p in tmp_path.rglob("*") if p.is_file())
    assert files == ["pkg-1.0.dist-info/METADATA", "pkg-1.0.dist-info/RECORD", "pkg/sub/c.py"]
    assert (tmp_path / "pkg/sub/c.py").read_bytes() == b"c"
    every = tmp_path / "every"
    extract(w, every)  # None: every member (a directory entry is no file)
    assert sorted(str(p.relative_to(every)) for p in every.rglob("*") if p.is_file()) == [
        "other.dist-info.txt", "pkg-1.0.dist-info/METADATA", "pkg-1.0.dist-info/RECORD",
        "pkg/a.py", "pkg/b.py", "pkg/sub/c.py"]


def test_a_member_that_would_land_outside_the_scratch_site_is_not_written(tmp_path):
    from imgbuild.checks.patches import extract

    site = tmp_path / "site"
    # an absolute name that points into tmp_path: were it written, it would be seen here
    w = _wheel({"../evil.py": b"x", "pkg/../../evil2.py": b"y",
                f"{tmp_path}/outside/abs.py": b"z", "pkg/ok.py": b"ok"})
    extract(w, site)
    assert [p.name for p in tmp_path.rglob("*.py")] == ["ok.py"]


# --- what the dependency check is asked to check --------------------------------------------

def test_the_dependency_check_reads_the_served_and_the_smoke_models_formats(monkeypatch):
    from imgbuild.checks import deps, drift

    ws = checkout_workspace()
    asked, checked = [], []
    monkeypatch.setattr(drift, "profile_formats",
                        lambda profile, fams: asked.append(profile.alias) or [(profile.alias, "f")])
    monkeypatch.setattr(drift, "check", lambda lock, fams, model_formats, index_urls: checked.append(
        (lock, model_formats, index_urls)) or [])
    t = ws.catalog.target("sglang-blackwell")
    deps.check_deps(ws, "sglang-blackwell", model=None)
    # no model asked for: the target's default, then the smoke model every image loads
    assert asked == [a for a in dict.fromkeys((t.default_model, t.smoke_model)) if a]
    [(lock, formats, urls)] = checked
    assert formats == [(a, "f") for a in asked] and lock == ws.target("sglang-blackwell").lock()
    from imgbuild.lock import wheels

    # the indexes the target's lock was made from: the drift check reads those wheels
    assert urls == wheels.index_urls(ws.target("sglang-blackwell").request.extra_index_urls)
    asked.clear()
    deps.check_deps(ws, "sglang-blackwell", model=t.smoke_model)  # the same model once
    assert asked == [t.smoke_model]


def test_the_dependency_check_reads_the_lock_of_the_platform_asked_for(monkeypatch):
    from imgbuild.checks import deps, drift

    ws = checkout_workspace()
    checked = []
    monkeypatch.setattr(drift, "check", lambda lock, fams, model_formats, index_urls: checked.append(
        lock) or [])
    deps.check_deps(ws, "tiny-cpu-multi", model=None, platform="linux/arm64")
    deps.check_deps(ws, "tiny-cpu-multi", model=None)
    assert checked == [ws.target("tiny-cpu-multi", "linux/arm64").lock(),
                       ws.target("tiny-cpu-multi").lock()]
    assert checked[0] != checked[1]
