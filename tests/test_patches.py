"""Compatibility patches: the data, the strict applier, RECORD consistency, probes.

The unit tests build a small installed package in a scratch site-packages. The `live` tests
use the real SGLang wheels: 0.5.16 (affected; the lock of images/sglang-0516-blackwell.yaml)
and 0.5.23 (unaffected: it ships both fixes; the lock of sglang-blackwell-slim), plus one
release of each diff variant's family.
"""

from __future__ import annotations

import base64
import csv
import dataclasses
import difflib
import hashlib
import importlib.metadata
import importlib.util
import io
import json
import py_compile
import subprocess
import sys
from pathlib import Path

import pytest
from packaging.specifiers import SpecifierSet
from packaging.version import Version
from rich.console import Console

from imgbuild.catalog import patches as patchdata
from imgbuild.catalog.catalog import load_catalog
from imgbuild.checks import patches
from imgbuild.errors import InputError, SpecError
from imgbuild.lock import wheels
from imgbuild.payload import patcher
from imgbuild.plan import patchset
from imgbuild.workspace import Workspace

from .conftest import ROOT, checkout_workspace

WS = checkout_workspace()

PATCHER = Path(patcher.__file__)
UTILS = "sglang/srt/layers/quantization/compressed_tensors/utils.py"
CT = "sglang/srt/layers/quantization/compressed_tensors/compressed_tensors.py"
IGNORE = "sglang-ct-ignore-exact-match"
MIXED = "sglang-ct-mixed-precision-format"


# --- a small installed package ------------------------------------------------------------

ORIGINAL = """\
import re


def matches(name, target):
    # substring match: the defect
    return target in name


def unrelated():
    return 1


def scale(x):
    return x * 2
"""

INIT = '"""demo."""\n'

PATCHED = ORIGINAL.replace("    # substring match: the defect\n    return target in name\n",
                           "    # exact or dotted suffix\n"
                           "    return name == target or name.endswith('.' + target)\n"
                           ).replace("return x * 2", "return x * 3")


def _hash(data: bytes) -> str:
    return "sha256=" + base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()


def make_site(root: Path, version: str = "1.2.0", text: str = ORIGINAL,
              terminator: str = "\n") -> Path:
    """site-packages with `demo` installed the way an installer leaves it (RECORD and all)."""
    site = root / "site-packages"
    (site / "demo").mkdir(parents=True)
    (site / "demo" / "__init__.py").write_text(INIT)
    (site / "demo" / "mod.py").write_bytes(text.encode())
    di = site / f"demo-{version}.dist-info"
    di.mkdir()
    (di / "METADATA").write_text(f"Metadata-Version: 2.1\nName: demo\nVersion: {version}\n")
    rows = []
    for rel in ("demo/__init__.py", "demo/mod.py", f"{di.name}/METADATA"):
        data = (site / rel).read_bytes()
        rows.append([rel, _hash(data), str(len(data))])
    rows.append([f"{di.name}/RECORD", "", ""])
    buf = io.StringIO()
    csv.writer(buf, lineterminator=terminator).writerows(rows)
    (di / "RECORD").write_text(buf.getvalue(), newline="")
    return site


def unified(old: str, new: str, path: str = "demo/mod.py") -> str:
    return "".join(difflib.unified_diff(old.splitlines(keepends=True),
                                        new.splitlines(keepends=True), f"a/{path}", f"b/{path}"))


def doc(pid: str = "demo-fix", versions: str = ">=1.0,<2", diff: str | None = None,
        probe: str = "") -> dict:
    return {"id": pid, "package": "demo", "versions": versions, "fixes": "x", "upstream": "unknown",
            "variants": [{"versions": versions, "diff": diff or unified(ORIGINAL, PATCHED)}],
            "probe": probe}


def tree(site: Path) -> dict[str, bytes]:
    return {str(p.relative_to(site)): p.read_bytes() for p in sorted(site.rglob("*")) if p.is_file()}


def write_docs(d: Path, docs: list[dict]) -> Path:
    d.mkdir(parents=True, exist_ok=True)
    for x in docs:
        (d / f"{x['id']}.json").write_text(json.dumps(x))
    return d


def run_patcher(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(PATCHER), *args], capture_output=True, text=True,
                          timeout=300)


# --- the applier ----------------------------------------------------------------------------

def test_applies_updates_record_and_reports(tmp_path):
    site = make_site(tmp_path)
    report = tmp_path / "patches.json"
    out = patcher.apply([doc()], site, report)
    assert (site / "demo" / "mod.py").read_text() == PATCHED
    dist = patcher.find_dist(site, "demo")
    assert patcher.verify_record(dist, site) == []
    row = next(r for r in csv.reader(io.StringIO(dist.record.read_text())) if r[0] == "demo/mod.py")
    assert row[1:] == [_hash(PATCHED.encode()), str(len(PATCHED.encode()))]
    rep = json.loads(report.read_text())
    assert rep["applied"] == ["demo-fix"] and out["applied"] == ["demo-fix"]
    (entry,) = rep["patches"]
    assert entry["status"] == "applied" and entry["version"] == "1.2.0"
    assert entry["files"] == {"demo/mod.py": _hash(PATCHED.encode())}


def test_applying_twice_changes_nothing(tmp_path):
    site = make_site(tmp_path)
    report = tmp_path / "patches.json"
    patcher.apply([doc()], site, report)
    before, rep = tree(site), report.read_bytes()
    patcher.apply([doc()], site, report)
    assert tree(site) == before
    assert report.read_bytes() == rep  # still "applied", byte for byte


def test_broken_hunk_fails_naming_patch_file_and_hunk_and_writes_nothing(tmp_path):
    site = make_site(tmp_path)
    good = doc("a-good", diff=unified(INIT, INIT + "VERSION = 1\n", "demo/__init__.py"))
    broken = unified(ORIGINAL, PATCHED).replace(" def scale(x):", " def scale(y):")
    before = tree(site)
    with pytest.raises(patcher.PatchError) as e:
        patcher.apply([good, doc("b-broken", diff=broken)], site, tmp_path / "patches.json")
    msg = str(e.value)
    assert "patch b-broken" in msg and "demo/mod.py" in msg and "hunk #2" in msg
    assert "def scale(y):" in msg and "def scale(x):" in msg  # expected vs found
    assert tree(site) == before  # the good patch was not written either
    assert not (tmp_path / "patches.json").exists()


def test_cli_exits_1_on_a_broken_hunk(tmp_path):
    site = make_site(tmp_path)
    broken = unified(ORIGINAL, PATCHED).replace(" def unrelated():", " def related():")
    d = write_docs(tmp_path / "patches", [doc(diff=broken)])
    r = run_patcher("--patches", str(d), "--site-packages", str(site))
    assert r.returncode == 1
    assert "patch demo-fix" in r.stderr and "demo/mod.py" in r.stderr and "hunk #" in r.stderr
    r = run_patcher("--patches", str(write_docs(tmp_path / "ok", [doc()])),
                    "--site-packages", str(site))
    assert r.returncode == 0, r.stderr
    assert "demo-fix: applied (demo 1.2.0)" in r.stdout
    assert json.loads((tmp_path / "patches.json").read_text())["applied"] == ["demo-fix"]


def test_change_already_present_is_obsolete_in_and_out_of_range(tmp_path):
    site = make_site(tmp_path / "in", text=PATCHED)
    (d,) = patcher.plan([doc()], site)
    assert d.status == patcher.OBSOLETE and not d.new_texts
    before = tree(site)
    rep = patcher.apply([doc()], site, tmp_path / "in.json")
    assert tree(site) == before and rep["patches"][0]["status"] == "obsolete"
    site = make_site(tmp_path / "out", version="2.1.0", text=PATCHED)
    (d,) = patcher.plan([doc()], site)
    assert d.status == patcher.OBSOLETE and "fixed upstream" in d.detail


def test_outside_the_range_and_not_present_is_not_applicable(tmp_path):
    site = make_site(tmp_path, version="0.9")
    (d,) = patcher.plan([doc()], site)
    assert d.status == patcher.NOT_APPLICABLE and not d.new_texts
    (d,) = patcher.plan([dict(doc(), package="other")], site)
    assert d.status == patcher.NOT_APPLICABLE and "not installed" in d.detail


def test_partly_present_fails(tmp_path):
    half = ORIGINAL.replace("return x * 2", "return x * 3")  # upstream took one hunk of two
    (d,) = patcher.plan([doc()], make_site(tmp_path, text=half))
    assert d.status == patcher.FAILS
    assert "partly present" in d.detail and "hunk #2" in d.detail


def test_in_range_without_a_variant_fails(tmp_path):
    x = doc(versions=">=1.0,<3")
    x["variants"][0]["versions"] = ">=1.0,<1.1"
    (d,) = patcher.plan([x], make_site(tmp_path))
    assert d.status == patcher.FAILS and "no diff variant" in d.detail


def test_hunks_may_move_but_context_must_match_exactly(tmp_path):
    moved = "# a new header line\n\n" + ORIGINAL
    (d,) = patcher.plan([doc()], make_site(tmp_path / "a", text=moved))
    assert d.status == patcher.APPLIES
    assert d.new_texts["demo/mod.py"] == "# a new header line\n\n" + PATCHED
    fuzzy = ORIGINAL.replace("def unrelated():", "def unrelated():  ")  # whitespace only
    (d,) = patcher.plan([doc()], make_site(tmp_path / "b", text=fuzzy))
    assert d.status == patcher.FAILS


def test_record_lines_keep_their_terminator_and_other_rows_their_bytes(tmp_path):
    site = make_site(tmp_path, terminator="\r\n")
    record = patcher.find_dist(site, "demo").record
    before = record.read_bytes().split(b"\r\n")
    patcher.apply([doc()], site, None)
    after = record.read_bytes().split(b"\r\n")
    assert len(after) == len(before)
    assert [a == b for a, b in zip(before, after)] == [True, False, True, True, True]
    assert patcher.verify_record(patcher.find_dist(site, "demo"), site) == []


def test_record_must_list_the_patched_file(tmp_path):
    site = make_site(tmp_path)
    record = patcher.find_dist(site, "demo").record
    record.write_text("".join(ln for ln in record.read_text().splitlines(keepends=True)
                              if not ln.startswith("demo/mod.py")))
    with pytest.raises(patcher.PatchError, match="does not list demo/mod.py"):
        patcher.apply([doc()], site, None)


def test_existing_bytecode_is_recompiled(tmp_path):
    site = make_site(tmp_path)
    src = site / "demo" / "mod.py"
    py_compile.compile(str(src), doraise=True,
                       invalidation_mode=py_compile.PycInvalidationMode.CHECKED_HASH)
    (pyc,) = patcher._pycs(src)
    patcher.apply([doc()], site, None)
    data = pyc.read_bytes()
    assert int.from_bytes(data[4:8], "little") == 3  # still checked-hash
    assert data[8:16] == importlib.util.source_hash(src.read_bytes())


def test_form_feed_inside_a_line_is_not_a_line_break(tmp_path):
    text = ORIGINAL.replace("import re\n", "import re  # \x0c page\n")
    patched = PATCHED.replace("import re\n", "import re  # \x0c page\n")
    (d,) = patcher.plan([doc(diff=unified(text, patched))], make_site(tmp_path, text=text))
    assert d.status == patcher.APPLIES and d.new_texts["demo/mod.py"] == patched


@pytest.mark.parametrize("bad, why", [
    ("--- a/x.py\n+++ b/x.py\n@@ -1,2 +1,2 @@\n-a\n+b\n", "header says"),
    ("--- a/x.py\n+++ b/x.py\n@@ -1 +1 @@\n-a\n+b\n", "needs context"),
    ("--- /dev/null\n+++ b/x.py\n@@ -0,0 +1 @@\n+a\n", "existing files only"),
    ("--- a/../x.py\n+++ b/../x.py\n@@ -1,2 +1,2 @@\n c\n-a\n+b\n", "relative to site-packages"),
    ("just text\n", "no file"),
])
def test_malformed_diffs_are_refused(bad, why):
    with pytest.raises(ValueError, match=why):
        patcher.parse_diff(bad)


def test_version_specifiers_agree_with_packaging():
    versions = ["0.5.6", "0.5.7", "0.5.8", "0.5.8.post1", "0.5.10rc0", "0.5.10", "0.5.16",
                "0.5.16.post1", "0.5.17rc1", "0.5.17.dev3", "0.5.17", "0.5.17.post2", "0.5.23",
                "0.5", "0.6", "1.0", "1.0.0"]
    specs = [">=0.5.7,<0.5.17", ">=0.5.8", ">0.5.16", "<0.5.17", "==0.5.16", "!=0.5.16",
             "~=0.5.8", "~=0.5", "==0.5.*", "!=0.5.*", "<=0.5.16", "<0.5.17rc1", "==1.0.0"]
    for v in versions:
        for s in specs:
            want = SpecifierSet(s).contains(Version(v), prereleases=True)
            assert patcher.version_in(v, s) == want, (v, s)


def test_load_source_takes_functions_and_methods_without_importing_the_package(tmp_path):
    src = tmp_path / "m.py"
    src.write_text("from __future__ import annotations\nimport re\nimport not_installed_pkg\n"
                   "from .sibling import thing\n\n"
                   "def f(x: Undefined) -> int:\n    return len(re.findall('a', x))\n\n"
                   "class C(NotDefinedBase):\n    @classmethod\n"
                   "    def m(cls, y):\n        return helper(y)\n")
    ns = patcher.load_source(src, ("f", "C.m"), env={"helper": lambda y: y + 1})
    assert ns["f"]("banana") == 3
    assert ns["C.m"](None, 1) == 2
    with pytest.raises(LookupError, match="no method 'gone'"):
        patcher.load_source(src, ("C.gone",))


def test_probe_mode_reports_and_exit_codes(tmp_path):
    probe = ("ns = load('demo/mod.py', 'matches')\n"
             "assert not ns['matches']('a.bc', 'b'), 'substring match'\n")
    site = make_site(tmp_path)
    d = write_docs(tmp_path / "patches", [doc(probe=probe)])
    ok, detail = patcher.run_probe(doc(probe=probe), site)
    assert not ok and "substring match" in detail  # fails on the unpatched package
    r = run_patcher("--probe", "--patches", str(d), "--site-packages", str(site))
    assert r.returncode == 1 and json.loads(r.stdout)["probes"][0]["status"] == "not-applied"
    assert run_patcher("--patches", str(d), "--site-packages", str(site)).returncode == 0
    r = run_patcher("--probe", "--patches", str(d), "--site-packages", str(site))
    assert r.returncode == 0, r.stdout
    assert json.loads(r.stdout)["probes"][0] == {
        "id": "demo-fix", "status": "applied", "probe": "pass", "detail": "passed",
        "version": "1.2.0"}


# --- the data under images/patches -----------------------------------------------------------

def test_shipped_patch_set_loads_and_the_target_uses_it():
    ps = patchdata.load_patches(ROOT / "images")
    assert {IGNORE, MIXED} <= set(ps)
    for p in ps.values():
        assert p.package == "sglang" and p.covers("0.5.16") and not p.covers("0.5.17")
        assert p.upstream == "https://github.com/sgl-project/sglang/pull/32736"
        assert p.probe.strip() and p.fixes
        for v in ("0.5.7", "0.5.8.post1", "0.5.12", "0.5.15.post1", "0.5.16"):
            assert p.variant_for(v) is not None, (p.id, v)
    assert len(ps[MIXED].variants) == 4 and ps[MIXED].files() == [CT]
    assert ps[IGNORE].files() == [UTILS]
    cat = WS.catalog
    t = cat.target("sglang-0516-blackwell")
    assert (t.engine_version, t.os, t.flavor, t.archs, t.smoke_model) == (
        "0.5.16", "debian-bookworm", "slim", ("sm100", "sm120"), "tiny-nvfp4")
    assert [p.id for p in patchdata.target_patches(t, WS.patches)] == [MIXED, IGNORE]
    for other in cat.targets.values():
        patchdata.target_patches(other, WS.patches)  # every listed id exists


def _patch_files(tmp_path: Path) -> Path:
    images = tmp_path / "images"
    (images / "patches").mkdir(parents=True)
    (images / "patches" / "p.diff").write_text(unified(ORIGINAL, PATCHED))
    return images


GOOD = ("package: demo\nversions: '>=1.0,<2'\nfixes: it breaks\nupstream: unknown\n"
        "diff: p.diff\nprobe: assert True\n")


@pytest.mark.parametrize("old, new, key, expected", [
    ("versions: '>=1.0,<2'", "versions: '>=1.0,<<2'", "versions", "PEP 440 specifier"),
    ("fixes: it breaks\n", "", "fixes", "required key is missing"),
    ("upstream: unknown", "upstream: github.com/x", "upstream", "https://"),
    ("diff: p.diff", "diff: missing.diff", "diff", "missing"),
    ("diff: p.diff", "diff: '--- a/x\n\n  +++ b/x\n\n  junk'", "diff", "unified diff"),
    ("probe: assert True", "probe: 'def ('", "probe", "Python source"),
    ("package: demo", "package: demo\nid: other", "id", "the file's name"),
    ("diff: p.diff", "diff: p.diff\nvariants: []", "diff", "exactly one of"),
    ("diff: p.diff", "variants: [{versions: '>=1', diff: p.diff, extra: 1}]", "variants[0].extra",
     "known keys"),
    ("fixes: it breaks", "fixes: it breaks\nfix: typo", "fix", "known keys"),
])
def test_patch_spec_errors_name_file_and_key(tmp_path, old, new, key, expected):
    images = _patch_files(tmp_path)
    assert old in GOOD
    (images / "patches" / "p.yaml").write_text(GOOD.replace(old, new))
    with pytest.raises(SpecError) as e:
        patchdata.load_patches(images)
    assert e.value.path == "images/patches/p.yaml" and e.value.key == key
    assert expected in str(e.value)


W = "images/patches/p.yaml"


@pytest.mark.parametrize("old, new, said", [
    ("package: demo", "package: demo\nid: other",
     f"{W}: id: expected the file's name, 'p', got 'other'"),
    ("package: demo", "package: 'Demo pkg'",
     f"{W}: package: expected a package name such as 'sglang', got 'Demo pkg'"),
    ("package: demo", "package: 1", f"{W}: package: expected a package name such as 'sglang'"),
    ("versions: '>=1.0,<2'", "versions: 3", f"{W}: versions: expected a PEP 440 specifier"),
    ("fixes: it breaks", "fixes: '  '",
     f"{W}: fixes: expected the error the patch fixes, in the user's words, got '  '"),
    ("fixes: it breaks", "fixes: [1]",
     f"{W}: fixes: expected the error the patch fixes, in the user's words"),
    ("diff: p.diff", "diff: p.diff\nvariants: []",
     f"{W}: diff: expected exactly one of `diff:` or `variants:`, got 'both'"),
    ("diff: p.diff", "variants: []",
     f"{W}: variants: expected at least one {{versions, diff}}, got []"),
    ("diff: p.diff", "variants: 1", f"{W}: variants: expected a list of {{versions, diff}}"),
    ("diff: p.diff", "variants: [{versions: '>=1', diff: ../p.diff}]",
     f"{W}: variants[0].diff: expected a path inside images/patches/, got '../p.diff'"),
    ("diff: p.diff", "variants: [{versions: '>>1', diff: p.diff}]",
     f"{W}: variants[0].versions: expected a PEP 440 specifier"),
    ("diff: p.diff", "diff: /etc/p.diff",
     f"{W}: diff: expected a path inside images/patches/, got '/etc/p.diff'"),
    ("probe: assert True", "probe: 3",
     f"{W}: probe: expected a few lines of Python that fail without the patch"),
    ("upstream: unknown", "upstream: github.com/x",
     f"{W}: upstream: expected an https:// URL of the upstream issue or pull request, or "
     "'unknown', got 'github.com/x'"),
    ("diff: p.diff", "diff: [1]",
     f"{W}: diff: expected a unified diff (inline, or a path to a .diff file next to the YAML) "
     "whose paths are relative to site-packages, got [1]"),
    ("diff: p.diff", "diff: '--- a/x\n\n  junk'",
     f"{W}: diff: expected a unified diff (inline, or a path to a .diff file next to the YAML) "
     "whose paths are relative to site-packages, got \"<inline>: line 1: '--- ' not followed by "
     "'+++ '\""),
    ("diff: p.diff", "diff: 'x/../p.diff'",
     f"{W}: diff: expected a path inside images/patches/, got 'x/../p.diff'"),
    ("versions: '>=1.0,<2'", "versions: ' '",
     f"{W}: versions: expected a PEP 440 specifier in quotes, such as '>=0.5.7,<0.5.17', "
     "got ' '"),
    ("versions: '>=1.0,<2'", "versions: '>=2,<1'",
     f"{W}: versions: expected a range some version falls in, got \"'>=2,<1' (no version "
     "satisfies all of it: check the bounds' order)\""),
])
def test_patch_spec_errors_word_for_word(tmp_path, old, new, said):
    images = _patch_files(tmp_path)
    assert old in GOOD
    (images / "patches" / "p.yaml").write_text(GOOD.replace(old, new))
    with pytest.raises(SpecError) as e:
        patchdata.load_patches(images)
    assert e.value.message.startswith(said), e.value.message


def test_a_package_name_may_be_written_with_capitals(tmp_path):
    images = _patch_files(tmp_path)
    (images / "patches" / "p.yaml").write_text(GOOD.replace("package: demo", "package: Demo_X"))
    assert patchdata.load_patches(images)["p"].package == "demo-x"


def test_a_patch_file_neither_diff_nor_variants_is_said_so(tmp_path):
    images = _patch_files(tmp_path)
    (images / "patches" / "p.yaml").write_text(GOOD.replace("diff: p.diff\n", ""))
    with pytest.raises(SpecError) as e:
        patchdata.load_patches(images)
    assert e.value.message == f"{W}: diff: expected exactly one of `diff:` or `variants:`, got 'neither'"


def test_unknown_patch_id_in_a_target_names_the_target(images_copy):
    t = (images_copy / "sglang-0516-blackwell.yaml")
    t.write_text(t.read_text().replace(f"- {IGNORE}", "- sglang-ct-ignore-exact"))
    target = load_catalog(images_copy).target("sglang-0516-blackwell")
    with pytest.raises(SpecError) as e:
        patchdata.target_patches(target, patchdata.load_patches(images_copy))
    assert e.value.key == "patches[1]" and "sglang-0516-blackwell.yaml" in e.value.path
    assert f"did you mean '{IGNORE}'" in e.value.hint


def test_context_files_carry_the_patcher_and_each_patch_as_json():
    t = WS.catalog.target("sglang-0516-blackwell")
    lock = WS.target(t.name).lock()
    files = patchset.context_files(t.patches, lock, WS.patches)
    assert sorted(files) == ["patcher.py", f"patches/{IGNORE}.json", f"patches/{MIXED}.json"]
    assert files["patcher.py"] == PATCHER.read_text()
    mixed = json.loads(files[f"patches/{MIXED}.json"])
    assert mixed["package"] == "sglang" and len(mixed["variants"]) == 4
    assert mixed["variants"][3]["diff"].startswith(f"--- a/{CT}")
    assert patchset.context_digest(files) == patchset.context_digest(dict(files))
    assert patchset.context_files((), lock, WS.patches) == {}
    assert patchset.expected_applied(t.patches, lock, WS.patches) == (MIXED, IGNORE)
    assert patchset.context_files(t.patches, WS.target("tiny-cpu").lock(),
                                  WS.patches) == {}  # no sglang there
    assert patchset.apply_command("/opt/venv/bin/python") == (
        "/opt/venv/bin/python /opt/imgbuild/patcher.py --patches /opt/imgbuild/patches "
        "--report /opt/imgbuild/patches.json")


def test_listing_needs_no_network_and_render_and_json(tmp_path):
    from imgbuild.cli.console import Output
    from imgbuild.cli.views import checks as views

    report = patches.listing(WS, "sglang-0516-blackwell")
    rows = report.results
    assert [(r.id, r.status, r.version) for r in rows] == [
        (MIXED, "unchecked", "0.5.16"), (IGNORE, "unchecked", "0.5.16")]
    assert rows[0].variant == ">=0.5.16,<0.5.17"
    buf = io.StringIO()
    views.patches(Output(False, Console(file=buf, width=200), Console(file=io.StringIO())),
                  report)
    assert MIXED in buf.getvalue() and "unchecked" in buf.getvalue()
    doc_ = report.to_dict()
    assert doc_["ok"] and doc_["target"] == "sglang-0516-blackwell"
    assert doc_["patches"][0]["files"] == [CT]
    with pytest.raises(InputError, match="no lock yet"):
        patches.listing(Workspace(ROOT / "images", tmp_path), "sglang-0516-blackwell")


# --- live: the real SGLang wheels ------------------------------------------------------------

@pytest.fixture(scope="module")
def live_wheels():
    wheels._pages.clear()  # the user's cache (reruns are fast), PyPI unless a mirror is set
    out = {}
    for name in ("sglang-0516-blackwell", "sglang-blackwell-slim"):
        req = WS.target(name).request
        pkg = WS.target(name).lock().package("sglang")
        out[pkg.version] = wheels.fetch_locked(pkg, wheels.index_urls(req.extra_index_urls),
                                               python=req.python, platform=req.uv_platform)
    assert set(out) == {"0.5.16", "0.5.23"}
    yield out
    for w in out.values():
        w.close()


def _site(tmp_path: Path, wheel, members=None) -> Path:
    return patches.extract(wheel, tmp_path / "site-packages", members)


def _all_patches() -> list[patchdata.Patch]:
    ps = WS.patches
    return [ps[MIXED], ps[IGNORE]]


@pytest.mark.live
def test_live_check_of_the_target_applies_both(live_wheels):
    results = patches.check(WS, "sglang-0516-blackwell").results
    assert [(r.id, r.status, r.version) for r in results] == [
        (MIXED, "applies", "0.5.16"), (IGNORE, "applies", "0.5.16")], results
    assert not patches.failed(results)


@pytest.mark.live
def test_live_affected_0_5_16_applies_record_consistent_idempotent(live_wheels, tmp_path):
    site = _site(tmp_path, live_wheels["0.5.16"])  # the whole wheel, as installed
    dist = patcher.find_dist(site, "sglang")
    assert dist.version == "0.5.16" and patcher.verify_record(dist, site) == []
    pristine = tree(site)
    d = write_docs(tmp_path / "patches", [p.to_json() for p in _all_patches()])
    r = run_patcher("--patches", str(d), "--site-packages", str(site))
    assert r.returncode == 0, r.stderr
    report = json.loads((tmp_path / "patches.json").read_text())
    assert sorted(report["applied"]) == sorted([MIXED, IGNORE])
    after = tree(site)
    changed = sorted(k for k in after if after[k] != pristine.get(k))
    assert changed == sorted([CT, UTILS, f"{dist.dist_info.name}/RECORD"])
    # RECORD: every row matches its file, by our reader and by importlib.metadata's.
    assert patcher.verify_record(dist, site) == []
    (md,) = [x for x in importlib.metadata.distributions(path=[str(site)])
             if x.metadata["Name"] == "sglang"]
    checked = 0
    for f in md.files:
        if f.hash is not None:
            data = (site / f).read_bytes()
            assert f.hash.mode == "sha256" and f.size == len(data), f
            assert base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode() \
                == f.hash.value, f
            checked += 1
    assert checked > 1000
    # Twice: nothing changes, not even the report.
    rep_bytes = (tmp_path / "patches.json").read_bytes()
    r = run_patcher("--patches", str(d), "--site-packages", str(site))
    assert r.returncode == 0, r.stderr
    assert tree(site) == after and (tmp_path / "patches.json").read_bytes() == rep_bytes
    # The probes, as the smoke test runs them.
    pytest.importorskip("compressed_tensors")
    r = run_patcher("--probe", "--patches", str(d), "--site-packages", str(site))
    assert r.returncode == 0, r.stdout + r.stderr
    assert {p["id"]: p["probe"] for p in json.loads(r.stdout)["probes"]} == {
        MIXED: "pass", IGNORE: "pass"}


@pytest.mark.live
def test_live_probes_fail_unpatched_and_pass_patched(live_wheels, tmp_path):
    pytest.importorskip("compressed_tensors")
    ps = _all_patches()
    site = _site(tmp_path, live_wheels["0.5.16"], {f for p in ps for f in p.files()})
    for p in ps:
        ok, detail = patcher.run_probe(p.to_json(), site)
        assert not ok, (p.id, detail)
    assert "input activations were dropped" in patcher.run_probe(ps[0].to_json(), site)[1]
    assert "parent module" in patcher.run_probe(ps[1].to_json(), site)[1]
    assert [r.status for r in patches.check_site(ps, site)] == ["applies", "applies"]
    for p in ps:
        assert patcher.run_probe(p.to_json(), site) == (True, "passed"), p.id


@pytest.mark.live
def test_live_unaffected_0_5_23_is_obsolete_and_untouched(live_wheels, tmp_path):
    ps = _all_patches()
    site = _site(tmp_path, live_wheels["0.5.23"], {f for p in ps for f in p.files()})
    before = tree(site)
    results = patches.check_site(ps, site)
    assert [(r.id, r.status, r.version) for r in results] == [
        (MIXED, "obsolete", "0.5.23"), (IGNORE, "obsolete", "0.5.23")], results
    assert all("fixed upstream" in r.detail for r in results)
    rep = patcher.apply([p.to_json() for p in ps], site, tmp_path / "patches.json")
    assert rep["applied"] == [] and tree(site) == before
    if importlib.util.find_spec("compressed_tensors"):
        for p in ps:  # upstream's own fix satisfies the probe
            assert patcher.run_probe(p.to_json(), site) == (True, "passed"), p.id


@pytest.mark.live
def test_live_broken_hunk_in_a_real_diff_fails_the_build(live_wheels, tmp_path):
    ps = _all_patches()
    site = _site(tmp_path, live_wheels["0.5.16"], {f for p in ps for f in p.files()})
    mixed = ps[0].to_json()
    diff = mixed["variants"][3]["diff"]
    # Damage hunk #3's context the way a drifted release would.
    mixed["variants"][3]["diff"] = diff.replace(
        ' "Other method (CompressedTensorsW4A16Sparse24) is not supported now"',
        ' "Other method (CompressedTensorsW4A16Sparse24) is not supported"')
    before = tree(site)
    d = write_docs(tmp_path / "patches", [mixed, ps[1].to_json()])
    r = run_patcher("--patches", str(d), "--site-packages", str(site))
    assert r.returncode == 1
    assert f"patch {MIXED}" in r.stderr and CT in r.stderr and "hunk #3" in r.stderr
    assert tree(site) == before  # nor was the good patch written
    damaged = dataclasses.replace(ps[0], variants=(
        patchdata.Variant(">=0.5.16,<0.5.17", mixed["variants"][3]["diff"], "<test>"),))
    results = patches.check_site([damaged, ps[1]], site)
    assert [r.status for r in results] == ["fails", "applies"]
    assert "hunk #3" in results[0].detail


@pytest.mark.live
@pytest.mark.parametrize("version, status", [
    ("0.5.7", "applies"), ("0.5.8", "applies"), ("0.5.9", "applies"),
    ("0.5.15.post1", "applies"), ("0.5.17", "obsolete"), ("0.5.6", "not-applicable"),
])
def test_live_each_variant_family(version, status, tmp_path):
    ps = _all_patches()
    w = wheels.fetch_version("sglang", version)
    try:
        site = _site(tmp_path, w, {f for p in ps for f in p.files()})
    finally:
        w.close()
    results = patches.check_site(ps, site)
    assert [r.status for r in results] == [status, status], results
    if status == "applies" and importlib.util.find_spec("compressed_tensors"):
        for p in ps:
            assert patcher.run_probe(p.to_json(), site) == (True, "passed"), (p.id, version)
