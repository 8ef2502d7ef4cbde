"""The patcher's contract, checked against real tools and to the letter.

- Diffs made by GNU `diff -u` (the tool a patch author uses) over generated files, with
  repeated lines, CRLF endings and missing final newlines, are applied exactly as GNU `patch`
  applies them, or refused by name when the file is ambiguous.
- Versions and specifiers agree with `packaging` over generated cases.
- The messages a build prints on failure are pinned word for word: a user reads them in a
  failed CI log, with nothing else to go on.
- The command line, the RECORD rows, the bytecode and the probes, in process.
"""

from __future__ import annotations

import csv
import importlib.util
import io
import json
import os
import py_compile
import subprocess
from pathlib import Path

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st
from packaging.specifiers import SpecifierSet
from packaging.version import Version

from imgbuild.payload import patcher

from .test_patches import INIT, ORIGINAL, PATCHED, _hash, doc, make_site, tree, unified, write_docs

# --- diffs made by GNU diff, applied as GNU patch applies them ----------------------------

# Few distinct lines, so blocks repeat and a hunk's place is decided by its line numbers.
LINES = ["a = 1\n", "b = 2\n", "\n", "    return x\n", "# note\n", "\tpass\n", "a = 1\r\n",
         "def f():\n"]


@st.composite
def edited(draw):
    old = draw(st.lists(st.sampled_from(LINES), min_size=1, max_size=30))
    new = list(old)
    for _ in range(draw(st.integers(1, 4))):
        op = draw(st.sampled_from(["insert", "delete", "replace"]))
        at = draw(st.integers(0, len(new)))
        if op == "insert" or not new:
            new[at:at] = draw(st.lists(st.sampled_from(LINES), min_size=1, max_size=3))
        elif op == "delete":
            del new[min(at, len(new) - 1)]
        else:
            new[min(at, len(new) - 1)] = draw(st.sampled_from(LINES + ["c = 3\n"]))
    a, b = "".join(old), "".join(new)
    # A file may end without a newline: diff then writes "\ No newline at end of file".
    if draw(st.booleans()):
        a = a.rstrip("\r\n")
    if draw(st.booleans()):
        b = b.rstrip("\r\n")
    return a, b


def gnu_diff(tmp: Path, a: str, b: str, path: str = "demo/mod.py") -> str:
    (tmp / "old").write_bytes(a.encode())
    (tmp / "new").write_bytes(b.encode())
    r = subprocess.run(["diff", "-u", "--label", f"a/{path}", "--label", f"b/{path}",
                        str(tmp / "old"), str(tmp / "new")], capture_output=True)
    assert r.returncode in (0, 1), r.stderr
    return r.stdout.decode()


def gnu_patch(tmp: Path, a: str, diff: str) -> str | None:
    (tmp / "target").write_bytes(a.encode())
    r = subprocess.run(["patch", "--fuzz=0", "--batch", "--silent", "-o", str(tmp / "out"),
                        str(tmp / "target")], input=diff.encode(), capture_output=True)
    return (tmp / "out").read_bytes().decode() if r.returncode == 0 else None


@settings(max_examples=150, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(case=edited())
def test_diffs_from_gnu_diff_apply_as_gnu_patch_applies_them(case, tmp_path):
    a, b = case
    assume(a != b)
    diff = gnu_diff(tmp_path, a, b)
    try:
        (fd,) = patcher.parse_diff(diff)
    except ValueError as e:
        # diff -u writes a hunk without context only when nothing is left unchanged.
        assert "a hunk needs context lines" in str(e)
        assert not set(patcher.split_lines(a)) & set(patcher.split_lines(b)) or \
            len(patcher.split_lines(a)) <= 1 or len(patcher.split_lines(b)) <= 1, diff
        return
    assert [(h.old_start, h.old_len, h.new_start, h.new_len) for h in fd.hunks] == [
        tuple(int(x) for x in (h.old_start, h.old_len, h.new_start, h.new_len))
        for h in fd.hunks]
    assert "".join(fd.hunks[0].old) in a and "".join(fd.hunks[-1].new) in b
    r = patcher.apply_file(fd, a)
    if r.error is not None:
        # The only refusal for the file the diff was made from: the patched text is in it too.
        assert "both the original and the patched text are in the file" in r.error, r.error
        assert r.error.endswith("refusing to guess")
        return
    assert r.states == ["apply"] * len(fd.hunks)
    assert r.new_text == b
    assert gnu_patch(tmp_path, a, diff) == b  # the oracle agrees with the diff itself
    # The patched file: every hunk is there and the original of some is not, or it is refused.
    again = patcher.apply_file(fd, b)
    assert again.new_text is None or again.error


@settings(max_examples=60, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(case=edited(), shift=st.lists(st.sampled_from(["# moved\n", "x = 0\n"]), min_size=1,
                                     max_size=6))
def test_a_file_moved_down_gets_the_same_change_where_the_hunks_moved(case, shift, tmp_path):
    a, b = case
    assume(a != b)
    diff = gnu_diff(tmp_path, a, b)
    try:
        (fd,) = patcher.parse_diff(diff)
    except ValueError:
        return
    head = "".join(shift)
    r = patcher.apply_file(fd, head + a)
    assume(r.error is None)
    # (GNU patch at --fuzz=0 would refuse some of these: a hunk whose leading context is cut
    # short by the file's start stays anchored there. The patcher lets every hunk move.)
    assert r.new_text == head + b


def test_hunk_headers_without_counts_mean_one_line():
    diff = "--- a/x.py\n+++ b/x.py\n@@ -3 +3,2 @@\n c\n+d\n"
    (fd,) = patcher.parse_diff(diff)
    (h,) = fd.hunks
    assert (h.old_start, h.old_len, h.new_start, h.new_len) == (3, 1, 3, 2)
    assert h.old == ["c\n"] and h.new == ["c\n", "d\n"] and h.context == 1
    assert h.label == "hunk #1 (@@ -3 +3,2 @@)"
    assert h.body == [(" ", "c\n"), ("+", "d\n")]


def test_no_newline_marker_strips_the_line_it_follows():
    a, b = "x\ny\nz", "x\ny\nw\n"
    diff = ("--- a/m.py\n+++ b/m.py\n@@ -1,3 +1,3 @@\n x\n y\n-z\n"
            "\\ No newline at end of file\n+w\n")
    (fd,) = patcher.parse_diff(diff)
    (h,) = fd.hunks
    assert h.old == ["x\n", "y\n", "z"] and h.new == ["x\n", "y\n", "w\n"]
    assert h.body[-2] == ("-", "z")
    assert patcher.apply_file(fd, a).new_text == b
    # The marker after the last line of a hunk (the new side has no final newline).
    diff2 = "--- a/m.py\n+++ b/m.py\n@@ -1,2 +1,2 @@\n x\n-y\n+q\n\\ No newline at end of file\n"
    (h2,) = patcher.parse_diff(diff2)[0].hunks
    assert h2.new == ["x\n", "q"] and h2.old == ["x\n", "y\n"] and h2.body[-1] == ("+", "q")


def test_an_empty_line_in_a_hunk_body_is_context():
    diff = "--- a/m.py\n+++ b/m.py\n@@ -1,3 +1,3 @@\n a\n\n-b\n+c\n"
    (h,) = patcher.parse_diff(diff)[0].hunks
    assert h.old == ["a\n", "\n", "b\n"] and h.new == ["a\n", "\n", "c\n"] and h.context == 2


def test_core_and_neighbours_take_the_changed_span():
    diff = "--- a/m.py\n+++ b/m.py\n@@ -1,6 +1,6 @@\n c1\n c2\n-x\n k\n+y\n c3\n c4\n"
    (h,) = patcher.parse_diff(diff)[0].hunks
    assert h.core("old") == ["x\n", "k\n"] and h.core("new") == ["k\n", "y\n"]
    assert h.core("old", pad=1) == ["c2\n", "x\n", "k\n", "c3\n"]
    assert h.core("new", pad=9) == ["c1\n", "c2\n", "k\n", "y\n", "c3\n", "c4\n"]
    assert h.core_neighbours() == ("c2\n", "c3\n")
    edge = "--- a/m.py\n+++ b/m.py\n@@ -1,2 +1,2 @@\n-x\n+y\n c\n"
    (e,) = patcher.parse_diff(edge)[0].hunks
    assert e.core_neighbours() == (None, "c\n")
    edge2 = "--- a/m.py\n+++ b/m.py\n@@ -1,2 +1,2 @@\n c\n-x\n+y\n"
    assert patcher.parse_diff(edge2)[0].hunks[0].core_neighbours() == ("c\n", None)


def test_paths_lose_their_a_b_prefix_and_timestamp():
    diff = ("diff -u a/p/m.py b/p/m.py\n--- a/p/m.py\t2024-01-01 00:00:00\n"
            "+++ b/p/m.py\t2024-01-02 00:00:00\n@@ -1,2 +1,2 @@\n c\n-x\n+y\n")
    (fd,) = patcher.parse_diff(diff)
    assert fd.path == "p/m.py"
    assert patcher._strip_prefix("  m.py  ") == "m.py"
    assert patcher._strip_prefix("c/m.py") == "c/m.py"


def test_two_files_and_several_hunks_keep_their_order_and_numbers():
    one = unified(ORIGINAL, PATCHED)
    two = unified(INIT, INIT + "X = 1\n", "demo/__init__.py")
    files = patcher.parse_diff(one + two)
    assert [f.path for f in files] == ["demo/mod.py", "demo/__init__.py"]
    assert [[h.index for h in f.hunks] for f in files] == [[1, 2], [1]]


@pytest.mark.parametrize("bad, message", [
    ("--- a/x.py\nnot plus\n", "line 1: '--- ' not followed by '+++ '"),
    ("--- a/x.py\n", "line 1: '--- ' not followed by '+++ '"),
    ("--- a/x.py\n+++ /dev/null\n@@ -1,2 +0,0 @@\n-a\n-b\n",
     "line 1: patches change existing files only (no created or deleted files)"),
    ("--- a/x.py\n+++ b/y.py\n@@ -1,2 +1,2 @@\n c\n-a\n+b\n",
     "line 1: old and new paths differ (x.py vs y.py)"),
    ("--- a//etc/x.py\n+++ b//etc/x.py\n@@ -1,2 +1,2 @@\n c\n-a\n+b\n",
     "line 1: path must be relative to site-packages: /etc/x.py"),
    ("--- a/p/../../x.py\n+++ b/p/../../x.py\n@@ -1,2 +1,2 @@\n c\n-a\n+b\n",
     "line 1: path must be relative to site-packages: p/../../x.py"),
    ("intro\n@@ -1,2 +1,2 @@\n c\n-a\n+b\n",
     "line 2: hunk before any '--- '/'+++ ' file header"),
    ("--- a/x.py\n+++ b/x.py\n@@ -1,2 +1,2 @@\n c\n?a\n+b\n",
     "line 5: unexpected line in '@@ -1,2 +1,2 @@': '?a\\n'"),
    ("--- a/x.py\n+++ b/x.py\n@@ -1,3 +1,2 @@\n c\n-a\n+b\n",
     "x.py: @@ -1,3 +1,2 @@: the hunk has 2 old and 2 new lines, its header says 3 and 2"),
    ("--- a/x.py\n+++ b/x.py\n@@ -1,1 +1,1 @@\n-a\n+b\n",
     "x.py: @@ -1,1 +1,1 @@: a hunk needs context lines (make the diff with `diff -u`)"),
    ("--- a/x.py\n+++ b/x.py\n@@ -1,2 +1,2 @@\n c\n-a\n+b\ntrailing words\n",
     "line 7: text after a hunk that is not a hunk: 'trailing words\\n'"),
    ("no diff here\n", "no file in the diff (expected '--- a/PATH' and '+++ b/PATH' lines)"),
    ("--- a/x.py\n+++ b/x.py\n", "x.py: no hunks"),
])
def test_malformed_diffs_say_where_and_what(bad, message):
    with pytest.raises(ValueError) as e:
        patcher.parse_diff(bad)
    assert str(e.value) == message


def test_blank_lines_after_the_last_hunk_are_allowed():
    diff = "--- a/x.py\n+++ b/x.py\n@@ -1,2 +1,2 @@\n c\n-a\n+b\n\n\n"
    (fd,) = patcher.parse_diff(diff)
    assert fd.hunks[0].new == ["c\n", "b\n"]


# --- the messages of a failed patch, word for word ----------------------------------------

def test_a_mismatch_names_the_closest_place_and_the_first_differing_line():
    (fd,) = patcher.parse_diff(unified(ORIGINAL, PATCHED))
    broken = ORIGINAL.replace("def scale(x):", "def scale(y):")
    r = patcher.apply_file(fd, broken)
    assert r.states == ["apply"] and r.new_text is None
    assert r.error == ("hunk #2 (@@ -11,4 +11,4 @@) does not apply: closest at line 11 "
                       "(3 of 4 lines match); line 13: expected 'def scale(x):', "
                       "found 'def scale(y):'")
    short = "import re\n"
    r = patcher.apply_file(fd, short)
    assert r.error == ("hunk #1 (@@ -2,8 +2,8 @@) does not apply: closest at line 1 "
                       "(0 of 8 lines match); line 1: expected '', found 'import re'")


def test_mismatch_prefers_the_best_match_then_the_nearest():
    lines = ["a\n", "b\n", "x\n", "a\n", "b\n", "y\n"]
    assert patcher._mismatch(lines, ["a\n", "b\n", "c\n"], 4) == (
        "closest at line 4 (2 of 3 lines match); line 6: expected 'c', found 'y'")
    assert patcher._mismatch(lines, ["a\n", "b\n", "c\n"], 0) == (
        "closest at line 1 (2 of 3 lines match); line 3: expected 'c', found 'x'")
    assert patcher._mismatch(lines, ["q\n", "b\n", "y\n"], 0) == (
        "closest at line 4 (2 of 3 lines match); line 4: expected 'q', found 'a'")
    assert patcher._mismatch([], ["a\r\n"], 3) == (
        "closest at line 1 (0 of 1 lines match); line 1: expected 'a', found end of file")
    assert patcher._mismatch(lines, lines[:2], 0) == "the context is ambiguous"


def test_nearest_breaks_ties_toward_the_top():
    assert patcher._nearest([2, 8], 5) == 2
    assert patcher._nearest([8, 3], 5) == 3
    assert patcher._nearest([9], 0) == 9


def test_both_sides_in_the_file_is_refused_with_both_places():
    (fd,) = patcher.parse_diff(unified(ORIGINAL, PATCHED))
    r = patcher.apply_file(fd, ORIGINAL + "\n" + PATCHED)
    assert r.error == ("hunk #1 (@@ -2,8 +2,8 @@): both the original and the patched text are "
                       "in the file (at lines 2 and 17); refusing to guess")


def test_partly_present_names_what_is_there_and_what_is_not(tmp_path):
    half = ORIGINAL.replace("return x * 2", "return x * 3")
    o = patcher.apply_variant(unified(ORIGINAL, PATCHED), lambda rel: half)
    assert o.state == "fail" and o.error == (
        "partly present: demo/mod.py hunk #2 (@@ -11,4 +11,4 @@) already in the package, but "
        "demo/mod.py hunk #1 (@@ -2,8 +2,8 @@) not; the package has part of the change, so "
        "this version needs its own diff variant")
    o = patcher.apply_variant(unified(ORIGINAL, PATCHED), lambda rel: None)
    assert (o.state, o.error) == ("fail", "demo/mod.py: no such file in site-packages")
    o = patcher.apply_variant("nonsense\n", lambda rel: "")
    assert o.error == ("the diff is malformed: no file in the diff (expected '--- a/PATH' and "
                       "'+++ b/PATH' lines)")
    o = patcher.apply_variant(unified(ORIGINAL, PATCHED), lambda rel: "import os\n")
    assert o.error.startswith("demo/mod.py: hunk #1 (@@ -2,8 +2,8 @@) does not apply: ")


def test_two_files_one_changed_one_present_is_partly_present():
    one = unified(ORIGINAL, PATCHED)
    init, init2 = "A = 1\nB = 2\nC = 3\n", "A = 1\nB = 20\nC = 3\n"
    two = unified(init, init2, "demo/__init__.py")
    texts = {"demo/mod.py": ORIGINAL, "demo/__init__.py": init2}
    o = patcher.apply_variant(one + two, texts.get)
    assert o.state == "fail" and "demo/__init__.py hunk #1" in o.error.split("but")[0]
    assert "demo/mod.py hunk #1" in o.error.split("but")[1]
    texts["demo/__init__.py"] = init
    o = patcher.apply_variant(one + two, texts.get)
    assert o.state == "apply" and o.new_texts == {"demo/mod.py": PATCHED,
                                                  "demo/__init__.py": init2}
    o = patcher.apply_variant(one + two, {"demo/mod.py": PATCHED, "demo/__init__.py": init2}.get)
    assert (o.state, o.new_texts, o.error) == ("present", {}, None)


def test_upstream_change_amid_other_code_counts_as_present_only_beside_its_context():
    old = "a\nb\nc\nd\ne\nf\ng\n"
    new = "a\nb\nc\nD\ne\nf\ng\n"
    (fd,) = patcher.parse_diff(unified(old, new))
    # Upstream has the change, with other code three lines away on each side.
    upstream = "a\nZZ\nc\nD\ne\nYY\ng\n"
    r = patcher.apply_file(fd, upstream)
    assert (r.error, r.states, r.new_text) == (None, ["present"], None)
    # The changed line alone, away from any of its context: not the change.
    alone = "q\nD\nr\n"
    assert patcher.apply_file(fd, alone).error.startswith("hunk #1 (@@ -1,7 +1,7 @@) does not ")
    # The changed line beside its context but the removed line still there: not present.
    both = "c\nD\ne\nd\n"
    assert patcher.apply_file(fd, both).error is not None
    # Beside the context after it only.
    after = "x\nD\ne\n"
    assert patcher.apply_file(fd, after).states == ["present"]


def test_hunks_are_searched_in_order_after_the_previous_one():
    old = "k\nx\nk\n" + "f\n" * 6 + "k\nx\nk\n"
    new = "k\nX\nk\n" + "f\n" * 6 + "k\nX\nk\n"
    (fd,) = patcher.parse_diff(unified(old, new))
    assert len(fd.hunks) == 2
    r = patcher.apply_file(fd, old)
    assert r.new_text == new and r.states == ["apply", "apply"]
    # The second hunk's original sits only before the first: not found after it.
    only_top = "k\nx\nk\n" + "f\n" * 6 + "k\nX\nk\n"
    r = patcher.apply_file(fd, only_top)
    assert r.error is not None or r.states == ["apply", "present"]
    assert patcher.apply_file(fd, only_top).new_text in (None, new)


# --- versions ----------------------------------------------------------------------------

release = st.lists(st.integers(0, 3), min_size=1, max_size=3).map(lambda r: ".".join(map(str, r)))
suffix = st.sampled_from(["", "a1", "b2", "rc1", ".post1", ".dev2", "rc1.dev1", ".post1.dev3",
                          "-1", "a0", "c1", "alpha2", "pre1", ".post", "rc"])
version = st.builds(lambda r, s: r + s, release, suffix)
op = st.sampled_from(["==", "!=", "<", "<=", ">", ">=", "~="])


@settings(max_examples=400, deadline=None, derandomize=True)
@given(v=version, clauses=st.lists(st.tuples(op, version), min_size=1, max_size=3),
       star=st.sampled_from([None, "==", "!="]), star_release=release)
def test_version_in_agrees_with_packaging(v, clauses, star, star_release):
    parts = []
    for o, w in clauses:
        if o == "~=":
            w = "0." + w  # ~= needs two release numbers
        parts.append(o + w)
    if star:
        parts.append(f"{star}{star_release}.*")
    spec = ",".join(parts)
    try:
        want = SpecifierSet(spec).contains(Version(v), prereleases=True)
    except Exception:  # noqa: BLE001 - a specifier packaging refuses is not a case
        assume(False)
    assert patcher.version_in(v, spec) == want, (v, spec)


def test_version_edge_cases_agree_with_packaging():
    cases = [("1.0", "==1.0.0"), ("1.0.post1", ">1.0"), ("1.0rc1", "<1.0"), ("1.0.dev1", "<1.0"),
             ("1.0", ">1.0.dev1"), ("1.0.post1", ">=1.0.post1"), ("1.0a1", "<1.0a2"),
             ("1!1.0", ">=1.0"), ("1.0+local", "==1.0"), ("v1.0", "==1.0"), ("1.0", "===1.0"),
             ("1.0", "===1.0.0"), ("2.0", "~=1.9"), ("1.9.9", "~=1.9.1"), ("1", "==1.0.*"),
             ("1.0.dev1", "!=1.0"), ("1.0-1", "==1.0.post1"), ("1.0.post1.dev1", "<1.0.post1"),
             ("1.0.post1.dev1", ">1.0"), ("1.0rc1.post1", "<1.0")]
    for v, s in cases:
        want = SpecifierSet(s).contains(Version(v), prereleases=True)
        assert patcher.version_in(v, s) == want, (v, s)


@pytest.mark.parametrize("spec, message", [
    (">=1,foo", "not a version specifier: 'foo'"),
    (">=1.*", "'.*' only goes with == or !=: '>=1.*'"),
    ("~=1", "~= needs at least two release numbers: '~=1'"),
    ("==nope", "not a PEP 440 version: 'nope'"),
])
def test_bad_specifiers_are_named(spec, message):
    with pytest.raises(ValueError) as e:
        patcher.version_in("1.0", spec)
    assert str(e.value) == message
    assert patcher.version_in("1.0", " , ") is True  # empty clauses are nothing


def test_parsed_versions_keep_what_ordering_needs():
    v = patcher._parse_version("v1.2.0rc3.post4.dev5+abc")
    assert (v.release, v.pre, v.post, v.dev) == ((1, 2), (2, 3), 4, 5)
    assert patcher._parse_version("1.0-7").post == 7
    assert patcher._parse_version("1.0.post").post == 0
    assert patcher._parse_version("1.0.dev").dev == 0
    assert patcher._parse_version("0.0").release == (0,)
    assert patcher._parse_version("1.0B2").pre == (1, 2)


# --- the installed package: finding it, its RECORD, its bytecode ----------------------------

def test_find_dist_matches_canonical_names_and_skips_a_dist_info_without_metadata(tmp_path):
    site = make_site(tmp_path)
    (site / "aaa-1.0.dist-info").mkdir()  # sorted first, no METADATA
    di = site / "Zed_Pkg-3.0.dist-info"
    di.mkdir()
    (di / "METADATA").write_text("Metadata-Version: 2.1\nName: Zed_Pkg\nVersion: 3.0\n")
    d = patcher.find_dist(site, "zed.pkg")
    assert (d.name, d.version, d.dist_info) == ("Zed_Pkg", "3.0", di)
    assert d.record == di / "RECORD"
    assert patcher.find_dist(site, "DEMO").version == "1.2.0"
    assert patcher.find_dist(site, "aaa") is None
    assert patcher.canonical("A_b-.C") == "a-b-c"


def test_record_rows_for_bytecode_are_rewritten_with_the_source(tmp_path):
    site = make_site(tmp_path)
    src = site / "demo" / "mod.py"
    py_compile.compile(str(src), doraise=True,
                       invalidation_mode=py_compile.PycInvalidationMode.CHECKED_HASH)
    (pyc,) = patcher._pycs(src)
    rel_pyc = pyc.relative_to(site).as_posix()
    dist = patcher.find_dist(site, "demo")
    rows = dist.record.read_text().splitlines(keepends=True)
    old_pyc = pyc.read_bytes()
    # One row for the bytecode with its hash, as an installer that compiles writes it, and
    # one unrelated row without a hash.
    rows.insert(2, f"{rel_pyc},{_hash(old_pyc)},{len(old_pyc)}\n")
    rows.insert(0, "demo/extra.txt,,\n")
    dist.record.write_text("".join(rows))
    patcher.apply([doc()], site, None)
    new_pyc = pyc.read_bytes()
    assert new_pyc != old_pyc
    got = {r[0]: r[1:] for r in csv.reader(io.StringIO(dist.record.read_text()))}
    assert got[rel_pyc] == [_hash(new_pyc), str(len(new_pyc))]
    assert got["demo/extra.txt"] == ["", ""]
    assert got["demo/mod.py"] == [_hash(PATCHED.encode()), str(len(PATCHED.encode()))]
    assert got["demo/__init__.py"] == [_hash(INIT.encode()), str(len(INIT.encode()))]


def test_a_listed_row_without_a_hash_is_given_one_only_for_a_patched_file(tmp_path):
    site = make_site(tmp_path)
    dist = patcher.find_dist(site, "demo")
    text = dist.record.read_text()
    mod = next(ln for ln in text.splitlines() if ln.startswith("demo/mod.py,"))
    dist.record.write_text(text.replace(mod, "demo/mod.py,,"))
    patcher.update_record(dist, site, ["demo/mod.py"])
    row = next(r for r in csv.reader(io.StringIO(dist.record.read_text()))
               if r[0] == "demo/mod.py")
    assert row == ["demo/mod.py", _hash(ORIGINAL.encode()), str(len(ORIGINAL.encode()))]


def test_record_paths_are_normalized_but_parent_paths_kept():
    assert patcher._norm("./demo//mod.py") == "demo/mod.py"
    assert patcher._norm("../../bin/x") == "../../bin/x"


def test_the_record_must_list_each_patched_file_by_name(tmp_path):
    site = make_site(tmp_path)
    dist = patcher.find_dist(site, "demo")
    with pytest.raises(patcher.PatchError) as e:
        patcher.update_record(dist, site, ["demo/mod.py", "demo/gone.py", "demo/also.py"])
    assert str(e.value) == ("demo-1.2.0.dist-info/RECORD does not list demo/gone.py, "
                            "demo/also.py: the package's RECORD cannot be kept consistent")


def test_verify_record_names_each_problem(tmp_path):
    site = make_site(tmp_path)
    dist = patcher.find_dist(site, "demo")
    assert patcher.verify_record(dist, site) == []
    (site / "demo" / "mod.py").write_text(PATCHED)
    (site / "demo" / "__init__.py").unlink()
    rows = dist.record.read_text().splitlines(keepends=True)
    meta = (dist.dist_info / "METADATA").read_bytes()
    rows = [r if "METADATA" not in r else
            f"{dist.dist_info.name}/METADATA,{_hash(meta)},{len(meta) + 1}\n" for r in rows]
    dist.record.write_text("".join(rows))
    assert patcher.verify_record(dist, site) == [
        "demo/__init__.py: listed in RECORD, missing",
        f"demo/mod.py: RECORD says {_hash(ORIGINAL.encode())}, file is {_hash(PATCHED.encode())}",
        f"{dist.dist_info.name}/METADATA: RECORD says {len(meta) + 1} bytes, "
        f"file has {len(meta)}",
    ]


@pytest.mark.parametrize("mode", list(py_compile.PycInvalidationMode))
@pytest.mark.parametrize("optimize", [-1, 1, 2])
def test_bytecode_is_recompiled_in_its_own_mode_and_level(tmp_path, mode, optimize):
    site = make_site(tmp_path, text='"""doc."""\n' + ORIGINAL)
    src = site / "demo" / "mod.py"
    pyc = Path(importlib.util.cache_from_source(str(src),
                                                optimization="" if optimize < 1 else optimize))
    py_compile.compile(str(src), cfile=str(pyc), doraise=True, invalidation_mode=mode,
                       optimize=optimize)
    patched = '"""doc."""\n' + PATCHED
    d = doc(diff=unified('"""doc."""\n' + ORIGINAL, patched))
    patcher.apply([d], site, None)
    assert src.read_text() == patched
    got = pyc.read_bytes()
    want = tmp_path / "want.pyc"
    py_compile.compile(str(src), cfile=str(want), doraise=True, invalidation_mode=mode,
                       optimize=optimize)
    assert got == want.read_bytes()


def test_atomic_write_keeps_the_mode_and_leaves_no_scratch(tmp_path):
    p = tmp_path / "f.py"
    p.write_text("old")
    os.chmod(p, 0o751)
    patcher._atomic_write(p, b"new")
    assert p.read_bytes() == b"new" and (p.stat().st_mode & 0o7777) == 0o751
    q = tmp_path / "fresh.json"
    patcher._atomic_write(q, b"{}")
    assert (q.stat().st_mode & 0o7777) == 0o644
    assert sorted(x.name for x in tmp_path.iterdir()) == ["f.py", "fresh.json"]
    with pytest.raises(TypeError):
        patcher._atomic_write(p, "not bytes")  # type: ignore[arg-type]
    assert p.read_bytes() == b"new"
    assert sorted(x.name for x in tmp_path.iterdir()) == ["f.py", "fresh.json"]


# --- deciding, applying and reporting -------------------------------------------------------

def test_decisions_say_why_word_for_word(tmp_path):
    site = make_site(tmp_path)
    (d,) = patcher.plan([doc()], site)
    assert (d.status, d.detail, d.variant, d.files) == (
        "applies", "applies cleanly", ">=1.0,<2", ["demo/mod.py"])
    (d,) = patcher.plan([dict(doc(), package="other")], site)
    assert (d.status, d.detail, d.version) == ("not-applicable", "other is not installed", None)
    (d,) = patcher.plan([doc(versions=">=3")], site)
    assert d.detail == "demo 1.2.0 is outside the patch's versions (>=3)"
    assert d.files == ["demo/mod.py"] and d.variant is None
    x = doc(versions=">=1.0,<3")
    x["variants"][0]["versions"] = ">=1.0,<1.1"
    (d,) = patcher.plan([x], site)
    assert d.detail == ("demo 1.2.0 is in the patch's versions (>=1.0,<3) but no diff variant "
                        "covers it")
    site2 = make_site(tmp_path / "p", text=PATCHED)
    (d,) = patcher.plan([doc()], site2)
    assert d.detail == "demo 1.2.0 already has the change; not applied"
    site3 = make_site(tmp_path / "q", version="2.0", text=PATCHED)
    (d,) = patcher.plan([doc()], site3)
    assert (d.detail, d.variant) == (
        "demo 2.0 is outside >=1.0,<2 and already has the change (fixed upstream)", ">=1.0,<2")


def test_each_matching_variant_is_tried_and_all_their_errors_reported(tmp_path):
    site = make_site(tmp_path)
    bad1 = unified(ORIGINAL, PATCHED).replace(" def unrelated():", " def one():")
    bad2 = unified(ORIGINAL, PATCHED).replace(" def unrelated():", " def two():")
    x = doc()
    x["variants"] = [{"versions": ">=1.0", "diff": bad1}, {"versions": ">=1.1", "diff": bad2},
                     {"versions": ">=1.5", "diff": unified(ORIGINAL, PATCHED)}]
    (d,) = patcher.plan([x], site)
    assert d.status == "fails" and d.variant == ">=1.0"
    assert d.detail.startswith("patch demo-fix: demo/mod.py: hunk #1")
    assert "; demo/mod.py: hunk #1" in d.detail and "'def one():'" in d.detail \
        and "'def two():'" in d.detail
    x["variants"].insert(1, {"versions": ">=1.0", "diff": unified(ORIGINAL, PATCHED)})
    (d,) = patcher.plan([x], site)
    assert (d.status, d.variant) == ("applies", ">=1.0")
    # Outside the range, the newest variant that is present makes it obsolete.
    y = doc(versions="<1")
    y["variants"] = [{"versions": "<0.5", "diff": bad1},
                     {"versions": ">=0.5,<1", "diff": unified(ORIGINAL, PATCHED)}]
    (d,) = patcher.plan([y], make_site(tmp_path / "o", text=PATCHED))
    assert (d.status, d.variant) == ("obsolete", ">=0.5,<1")


def test_a_previous_run_makes_a_present_change_applied_only_for_the_same_version(tmp_path):
    site = make_site(tmp_path, text=PATCHED)
    prev = {"status": "applied", "version": "1.2.0", "detail": "applied cleanly"}
    (d,) = patcher.plan([doc()], site, {"demo-fix": prev})
    assert (d.status, d.detail) == ("applied", "applied cleanly")
    (d,) = patcher.plan([doc()], site, {"demo-fix": dict(prev, detail="")})
    assert d.detail == "applied"
    (d,) = patcher.plan([doc()], site, {"demo-fix": dict(prev, version="1.1.0")})
    assert d.status == "obsolete"
    (d,) = patcher.plan([doc()], site, {"demo-fix": dict(prev, status="obsolete")})
    assert d.status == "obsolete"


def test_later_patches_see_what_earlier_ones_wrote(tmp_path):
    site = make_site(tmp_path)
    mid = ORIGINAL.replace("return x * 2", "return x * 3")
    first = doc("a-first", diff=unified(ORIGINAL, mid))
    second = doc("b-second", diff=unified(mid, mid.replace("return 1", "return 2")))
    ds = patcher.plan([first, second], site)
    assert [d.status for d in ds] == ["applies", "applies"]
    assert ds[1].new_texts["demo/mod.py"] == mid.replace("return 1", "return 2")
    out = patcher.apply([first, second], site, tmp_path / "r.json")
    assert (site / "demo" / "mod.py").read_text() == mid.replace("return 1", "return 2")
    assert out["applied"] == ["a-first", "b-second"]
    assert patcher.verify_record(patcher.find_dist(site, "demo"), site) == []


def test_apply_failure_lists_each_failed_patch(tmp_path):
    site = make_site(tmp_path)
    x = doc("a-x", versions=">=1.0,<3")
    x["variants"][0]["versions"] = "<1"
    broken = unified(ORIGINAL, PATCHED).replace(" def unrelated():", " def other():")
    with pytest.raises(patcher.PatchError) as e:
        patcher.apply([x, doc("b-y", diff=broken)], site, None)
    first, second = str(e.value).split("\n")
    assert first == ("patch a-x: demo 1.2.0 is in the patch's versions (>=1.0,<3) but no diff "
                     "variant covers it")
    assert second.startswith("patch b-y: demo/mod.py: hunk #1 (@@ -2,8 +2,8 @@) does not apply")


def test_a_dry_run_decides_and_writes_nothing(tmp_path):
    site = make_site(tmp_path)
    before = tree(site)
    report = tmp_path / "sub" / "patches.json"
    out = patcher.apply([doc()], site, report, dry_run=True)
    assert tree(site) == before and not report.exists()
    (e,) = out["patches"]
    assert (e["status"], e["detail"]) == ("applies", "applies cleanly")
    assert out["applied"] == [] and out["format"] == 1 and out["site_packages"] == str(site)
    assert e["files"] == {"demo/mod.py": _hash(ORIGINAL.encode())}
    out = patcher.apply([doc()], site, report)
    assert json.loads(report.read_text()) == out  # the report's directory is made
    assert report.read_text() == json.dumps(out, indent=2, sort_keys=True) + "\n"


@pytest.mark.parametrize("text", ["not json", "[]", '{"patches": [{"no": "id"}]}',
                                  '{"patches": 3}'])
def test_an_unreadable_previous_report_is_no_report(tmp_path, text):
    p = tmp_path / "r.json"
    p.write_text(text)
    assert patcher.read_report(p) == {}
    assert patcher.read_report(None) == {}
    assert patcher.read_report(tmp_path / "none.json") == {}
    p.write_text('{"patches": [{"id": "x", "status": "applied"}]}')
    assert patcher.read_report(p) == {"x": {"id": "x", "status": "applied"}}


def test_a_patch_directory_is_read_in_id_order_and_checked(tmp_path):
    d = write_docs(tmp_path / "p", [doc("b"), doc("a")])
    (d / "notes.txt").write_text("ignored")
    assert [x["id"] for x in patcher.load_patch_dir(d)] == ["a", "b"]
    (d / "c.json").write_text(json.dumps({"id": "c", "package": "x", "versions": ""}))
    with pytest.raises(patcher.PatchError) as e:
        patcher.load_patch_dir(d)
    assert str(e.value) == f"{d / 'c.json'}: not a patch (no 'variants')"


def test_files_of_a_patch_skip_a_malformed_variant_and_repeat_no_path():
    x = doc()
    x["variants"] = [{"versions": "", "diff": "junk"},
                     {"versions": "", "diff": unified(ORIGINAL, PATCHED)},
                     {"versions": "", "diff": unified(ORIGINAL, PATCHED) +
                      unified(INIT, INIT + "X\n", "demo/__init__.py")}]
    assert patcher._files_of(x) == ["demo/mod.py", "demo/__init__.py"]


# --- probes --------------------------------------------------------------------------------

def test_probe_results_say_what_failed_and_where(tmp_path):
    site = make_site(tmp_path)
    ok, detail = patcher.run_probe(doc(probe="assert version == '1.2.0'\n"), site)
    assert (ok, detail) == (True, "passed")
    ok, detail = patcher.run_probe(doc(probe="x = 1\nassert x == 2\n"), site)
    assert (ok, detail) == (False, "assertion failed: assert x == 2 (line 2)")
    ok, detail = patcher.run_probe(doc(probe="x = 1\nassert x == 2, 'x is one'\n"), site)
    assert (ok, detail) == (False, "assertion failed: x is one (line 2)")
    ok, detail = patcher.run_probe(doc(probe="\n\n{}['k']\n"), site)
    assert (ok, detail) == (False, "KeyError: 'k' (line 3)")
    ok, detail = patcher.run_probe(doc(probe="load('demo/mod.py', 'nope')\n"), site)
    assert not ok and detail == (f"LookupError: {site / 'demo' / 'mod.py'}: no top-level "
                                 "'nope' (line 1)")
    ok, detail = patcher.run_probe(dict(doc(probe="assert version is None\n"), package="zz"),
                                   site)
    assert (ok, detail) == (True, "passed")
    ok, detail = patcher.run_probe(doc(probe="assert __name__ == 'imgbuild_probe_demo-fix'\n"
                                              "assert site_packages.name == 'site-packages'\n"),
                                   site)
    assert (ok, detail) == (True, "passed")


def test_probe_reports_each_status(tmp_path):
    site = make_site(tmp_path)
    gone = dict(doc("c-gone", probe="assert False"), package="zz")
    broken = doc("d-broken", diff=unified(ORIGINAL, PATCHED).replace(" def unrelated():",
                                                                      " def x():"))
    docs = [doc("a-fix", probe="assert True"), doc("b-noprobe"), gone]
    out = patcher.probe(docs, site, None)
    assert out["ok"] is False
    assert out["probes"] == [
        {"id": "a-fix", "status": "not-applied", "probe": "fail", "version": "1.2.0",
         "detail": "the patch applies but is not in effect: the patch layer did not run or was "
                   "undone"},
        # The same change: with the first decided, the second sees it present (obsolete).
        {"id": "b-noprobe", "status": "obsolete", "probe": "pass", "version": "1.2.0",
         "detail": "no probe"},
        {"id": "c-gone", "status": "not-applicable", "probe": "skipped", "version": None,
         "detail": "zz is not installed"},
    ]
    assert patcher.probe([broken], site, None) == {"ok": False, "probes": [
        {"id": "d-broken", "status": "fails", "probe": "fail", "version": "1.2.0",
         "detail": patcher.plan([broken], site)[0].detail}]}
    assert patcher.plan([broken], site)[0].status == "fails"
    report = tmp_path / "r.json"
    patcher.apply(docs[:2], site, report)
    out = patcher.probe(docs[:3], site, report)
    assert out["ok"] is True
    assert [(p["status"], p["probe"], p["detail"]) for p in out["probes"]] == [
        ("applied", "pass", "passed"), ("obsolete", "pass", "no probe"),
        ("not-applicable", "skipped", "zz is not installed")]


def test_load_source_runs_only_stdlib_and_named_imports(tmp_path):
    src = tmp_path / "m.py"
    src.write_text("import os.path, json\nimport yaml\nfrom collections import abc\n"
                   "from __future__ import annotations\nfrom . import rel\nfrom yaml import dump\n"
                   "X = 1\n\ndef f():\n    return os.path.sep, json.__name__, abc.__name__\n\n"
                   "def g():\n    return yaml.__name__\n")
    ns = patcher.load_source(src, ("f", "g"))
    assert ns["f"]() == ("/", "json", "collections.abc")
    with pytest.raises(NameError):
        ns["g"]()
    ns = patcher.load_source(src, ("g",), modules=("yaml",))
    assert ns["g"]() == "yaml"
    with pytest.raises(LookupError) as e:
        patcher.load_source(src, ("Nope.m",))
    assert str(e.value) == f"{src}: no top-level 'Nope'"


# --- the command line, in process ------------------------------------------------------------

def test_main_applies_reports_and_exits(tmp_path, capsys):
    site = make_site(tmp_path)
    d = write_docs(tmp_path / "patches", [doc(probe="assert True")])
    assert patcher.main(["--patches", str(d), "--site-packages", str(site), "--dry-run"]) == 0
    assert capsys.readouterr().out == \
        "imgbuild patcher: demo-fix: applies (demo 1.2.0): applies cleanly\n"
    assert not (tmp_path / "patches.json").exists()
    assert patcher.main(["--patches", str(d), "--site-packages", str(site)]) == 0
    assert capsys.readouterr().out == \
        "imgbuild patcher: demo-fix: applied (demo 1.2.0): applied cleanly\n"
    report = tmp_path / "patches.json"  # next to the patches directory by default
    assert json.loads(report.read_text())["applied"] == ["demo-fix"]
    assert patcher.main(["--probe", "--patches", str(d), "--site-packages", str(site)]) == 0
    out = capsys.readouterr().out
    assert json.loads(out)["ok"] is True and out.startswith('{\n  "ok": true')
    broken = write_docs(tmp_path / "broken", [doc(diff=unified(ORIGINAL, PATCHED).replace(
        " def unrelated():", " def x():"))])
    site2 = make_site(tmp_path / "two")
    assert patcher.main(["--patches", str(broken), "--site-packages", str(site2)]) == 1
    err = capsys.readouterr().err
    assert err.startswith("imgbuild patcher: FAILED\npatch demo-fix: demo/mod.py: hunk #1")
    assert patcher.main(["--probe", "--patches", str(d), "--site-packages", str(site2),
                         "--report", str(tmp_path / "none.json")]) == 1
    assert json.loads(capsys.readouterr().out)["probes"][0]["status"] == "not-applied"


def test_main_uses_this_interpreters_site_packages_by_default(tmp_path, capsys):
    import sysconfig

    assert patcher.default_site_packages() == Path(sysconfig.get_paths()["purelib"])
    d = write_docs(tmp_path / "patches", [dict(doc(), package="surely-not-installed-pkg")])
    assert patcher.main(["--patches", str(d), "--dry-run"]) == 0
    assert "surely-not-installed-pkg is not installed" in capsys.readouterr().out


# --- the patch layer's files (plan/patchset.py) ---------------------------------------------

def test_patch_layer_files_skip_unlocked_packages_and_name_an_unknown_id():
    import dataclasses

    from imgbuild.errors import SpecError
    from imgbuild.plan import patchset

    from .test_patches import IGNORE, MIXED, WS

    lock = WS.target("sglang-0516-blackwell").lock()
    other = dataclasses.replace(WS.patches[MIXED], id="a-other", package="not-in-the-lock")
    known = dict(WS.patches, **{"a-other": other})
    # A patch for a package the lock lacks is skipped, and the ones after it still count.
    files = patchset.context_files(("a-other", MIXED, IGNORE), lock, known)
    assert sorted(files) == ["patcher.py", f"patches/{IGNORE}.json", f"patches/{MIXED}.json"]
    # What the image reads is what a reviewer reads: indented, keys sorted, one final newline.
    text = files[f"patches/{MIXED}.json"]
    assert text == json.dumps(json.loads(text), indent=2, sort_keys=True) + "\n"
    assert text.startswith('{\n  "fixes": ')
    assert files["patcher.py"] == Path(patcher.__file__).read_bytes().decode("utf-8")
    assert patchset.expected_applied(("a-other", "unknown-id", MIXED), lock, known) == (MIXED,)
    with pytest.raises(SpecError) as e:
        patchset.context_files(("no-such-patch",), lock, known)
    assert str(e.value) == ("images/patches: no-such-patch.yaml: expected a patch file for the "
                            "plan's patch id, got 'no-such-patch'")


def test_the_patch_layer_digest_is_stable_and_frames_each_file():
    import hashlib

    from imgbuild.plan import patchset

    # The framing is part of every content key with patches: changing it rebuilds every
    # image, so it is pinned here (name NUL text NUL, in name order).
    files = {"b": "2", "a": "1"}
    want = hashlib.sha256(b"a\x001\x00b\x002\x00").hexdigest()
    assert patchset.context_digest(files) == f"sha256:{want}"
    assert patchset.context_digest({"a": "1b"}) != patchset.context_digest({"a1": "b"})
    assert patchset.probe_command("/v/bin/python") == [
        "/v/bin/python", "/opt/imgbuild/patcher.py", "--probe", "--patches",
        "/opt/imgbuild/patches", "--report", "/opt/imgbuild/patches.json"]
    assert patchset.probe_command()[:2] == ["python", "/opt/imgbuild/patcher.py"]
    assert patchset.apply_command() == (
        "python /opt/imgbuild/patcher.py --patches /opt/imgbuild/patches "
        "--report /opt/imgbuild/patches.json")


def test_the_patch_layer_is_written_where_the_dockerfile_copies_it(tmp_path):
    from imgbuild.plan import patchset

    patchset.write_context({"patches/x.json": "{}\n", "patcher.py": "é\n"}, tmp_path / "ps")
    assert (tmp_path / "ps" / "patches" / "x.json").read_text() == "{}\n"
    assert (tmp_path / "ps" / "patcher.py").read_bytes() == "é\n".encode()
