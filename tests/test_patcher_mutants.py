"""payload/patcher.py, what bench/mutation.py found untested after test_patcher_behaviour.py:
deterministic examples (no hypothesis) for where a hunk lands when its text repeats, presence
beside one context line, the closest-place message, "\\ No newline" and odd header lines,
versions at their edges, RECORD rows of every shape, bytecode of every level and of truncated
files, what a Decision carries, probes and the command line's help and JSON, each pinned."""

from __future__ import annotations

import csv
import importlib.util
import io
import json
import marshal
import py_compile
from pathlib import Path

import pytest

from imgbuild.payload import patcher
from imgbuild.payload.patcher import Decision, FileResult

from .test_patches import INIT, ORIGINAL, PATCHED, _hash, doc, make_site, unified, write_docs

HDR = "--- a/m.py\n+++ b/m.py\n"


def one_file(diff: str) -> patcher.FileDiff:
    (fd,) = patcher.parse_diff(diff)
    return fd


def lines(*xs: str) -> str:
    return "".join(x + "\n" for x in xs)


def ls(*xs: str) -> list[str]:
    return [x + "\n" for x in xs]


# --- where a hunk lands when its text repeats ------------------------------------------------

def test_a_first_hunk_lands_at_its_own_line_among_repeats():
    # [a, a] is at lines 1, 2 and 3: the header's line decides which one changes.
    fd = one_file(HDR + "@@ -1,2 +1,2 @@\n a\n-a\n+b\n")
    assert patcher.apply_file(fd, lines("a", "a", "a")).new_text == lines("a", "b", "a")
    fd = one_file(HDR + "@@ -2,2 +2,2 @@\n a\n-a\n+b\n")
    assert patcher.apply_file(fd, lines("a", "a", "a", "a")).new_text == \
        lines("a", "a", "b", "a")


def test_a_second_hunk_lands_as_far_after_the_first_as_the_diff_says():
    text = lines("x", "y", *["a"] * 8)
    fd = one_file(HDR + "@@ -1,2 +1,2 @@\n x\n-y\n+Y\n@@ -4,2 +4,2 @@\n a\n-a\n+b\n")
    r = patcher.apply_file(fd, text)
    assert r == FileResult("m.py", ["apply", "apply"], lines("x", "Y", "a", "a", "b",
                                                             *["a"] * 5))
    # The first hunk already there: the second still counts from where the first ends.
    fd2 = one_file(HDR + "@@ -1,2 +1,2 @@\n x\n-y0\n+y\n@@ -4,2 +4,2 @@\n a\n-a\n+b\n")
    r = patcher.apply_file(fd2, text)
    assert r == FileResult("m.py", ["present", "apply"], lines("x", "y", "a", "a", "b",
                                                               *["a"] * 5))


def test_both_sides_in_the_file_is_a_result_with_no_states_and_no_text():
    fd = one_file(HDR + "@@ -1,2 +1,2 @@\n c\n-a\n+b\n")
    r = patcher.apply_file(fd, lines("c", "a", "c", "b"))
    assert r == FileResult("m.py", [], None, "hunk #1 (@@ -1,2 +1,2 @@): both the original and "
                           "the patched text are in the file (at lines 1 and 3); refusing to "
                           "guess")


# --- present amid other code, beside one of its own context lines ----------------------------

CHANGE = HDR + "@@ -1,3 +1,3 @@\n c1\n-o\n+n\n c2\n"


def test_present_beside_its_leading_context_only():
    r = patcher.apply_file(one_file(CHANGE), lines("c1", "n", "zz"))
    assert r == FileResult("m.py", ["present"], None)


def test_the_last_line_of_the_file_is_not_the_first_lines_neighbour():
    r = patcher.apply_file(one_file(CHANGE), lines("n", "zz", "c1"))
    assert r.states == [] and r.error == (
        "hunk #1 (@@ -1,3 +1,3 @@) does not apply: closest at line 1 (0 of 3 lines match); "
        "line 1: expected 'c1', found 'n'")


def test_a_change_at_the_end_of_the_file_has_no_following_neighbour():
    r = patcher.apply_file(one_file(CHANGE), lines("zz", "n"))
    assert r.states == [] and r.error == (
        "hunk #1 (@@ -1,3 +1,3 @@) does not apply: closest at line 1 (0 of 3 lines match); "
        "line 1: expected 'c1', found 'zz'")


def test_an_added_span_is_present_though_the_context_inside_it_is_there_too():
    fd = one_file(HDR + "@@ -1,3 +1,5 @@\n c1\n+A\n m\n+B\n c2\n")
    r = patcher.apply_file(fd, lines("c1", "A", "m", "B", "zz"))
    assert r == FileResult("m.py", ["present"], None)


def test_a_removal_that_matches_neither_side_is_named():
    fd = one_file(HDR + "@@ -1,3 +1,2 @@\n a\n-b\n c\n")
    r = patcher.apply_file(fd, lines("a", "X", "c"))
    assert r == FileResult("m.py", [], None, "hunk #1 (@@ -1,3 +1,2 @@) does not apply: "
                           "closest at line 1 (2 of 3 lines match); line 2: expected 'b', "
                           "found 'X'")


def test_a_later_hunk_never_matches_inside_an_earlier_present_one():
    fd = one_file(CHANGE + "@@ -5,2 +5,2 @@\n n\n-zz\n+ZZ\n")
    r = patcher.apply_file(fd, lines("c1", "n", "zz"))
    assert r.states == ["present"] and r.new_text is None
    assert r.error.startswith("hunk #2 (@@ -5,2 +5,2 @@) does not apply: ")


# --- the closest place ------------------------------------------------------------------------

def test_the_closest_place_is_searched_only_where_the_whole_block_fits():
    assert patcher._mismatch(ls("x", "x", "a", "b"), ls("a", "b", "c"), 0) == (
        "closest at line 1 (0 of 3 lines match); line 1: expected 'a', found 'x'")


def test_a_worse_match_is_never_closest_however_near():
    assert patcher._mismatch(ls("a", "b", "X", "q", "q", "q", "q"), ls("a", "b", "c"),
                             4) == ("closest at line 1 (2 of 3 lines match); line 3: expected "
                                    "'c', found 'X'")


def test_equal_matches_at_equal_distance_take_the_upper():
    assert patcher._mismatch(ls("a", "X", "q", "q", "a", "Y"), ls("a", "b"), 2) == (
        "closest at line 1 (1 of 2 lines match); line 2: expected 'b', found 'X'")
    assert patcher._mismatch(ls("q", "a", "X", "q", "a", "Y"), ls("a", "b"), 2) == (
        "closest at line 2 (1 of 2 lines match); line 3: expected 'b', found 'X'")


def test_a_block_longer_than_the_file_meets_its_end():
    assert patcher._mismatch(ls("a"), ls("a", "b", "c"), 0) == (
        "closest at line 1 (1 of 3 lines match); line 2: expected 'b', found end of file")


def test_the_mismatch_shows_a_lines_own_trailing_blanks_and_letters():
    assert patcher._mismatch(ls("a", "v = X  "), ls("a", "w = 1 \t"), 0) == (
        "closest at line 1 (1 of 2 lines match); line 2: expected 'w = 1 \\t', "
        "found 'v = X  '")
    assert patcher._mismatch(ls("a", "v = X"), ls("a", "w = X"), 0) == (
        "closest at line 1 (1 of 2 lines match); line 2: expected 'w = X', found 'v = X'")


# --- parsing ------------------------------------------------------------------------------

@pytest.mark.parametrize("last", ["end X", "end \t"])
def test_no_newline_markers_strip_only_the_line_ending(last):
    between = HDR + f"@@ -1,2 +1,2 @@\n x\n-{last}\n\\ No newline at end of file\n+w\n"
    (h,) = one_file(between).hunks
    assert h.old == ["x\n", last] and h.body[1] == ("-", last)
    at_end = HDR + f"@@ -1,2 +1,2 @@\n x\n-y\n+{last}\n\\ No newline at end of file\n"
    (h,) = one_file(at_end).hunks
    assert h.new == ["x\n", last] and h.body[-1] == ("+", last)


def test_a_no_newline_marker_at_a_hunks_end_is_followed_by_the_next_hunk():
    diff = HDR + ("@@ -1,2 +1,2 @@\n x\n-y\n+q\n\\ No newline at end of file\n"
                  "@@ -9,2 +9,2 @@\n k\n-u\n+v\n")
    assert [h.new for h in one_file(diff).hunks] == [["x\n", "q"], ["k\n", "v\n"]]


def test_a_bare_crlf_line_in_a_hunk_is_an_empty_context_line():
    (h,) = one_file(HDR + "@@ -1,3 +1,3 @@\n a\r\n\r\n-b\r\n+c\r\n").hunks
    assert h.old == ["a\r\n", "\r\n", "b\r\n"] and h.context == 2


@pytest.mark.parametrize("bad, message", [
    (HDR + "@@ -1,2 +1,2 @@\n c\nXa\n+b\n",
     "line 5: unexpected line in '@@ -1,2 +1,2 @@': 'Xa\\n'"),
    (HDR + "@@ -1,2 +1,2 @@\n c\n" + "?" * 50 + "\n",
     "line 5: unexpected line in '@@ -1,2 +1,2 @@': '" + "?" * 40 + "'"),
    (HDR + "@@ -1,2 +1,2 @@\n c\n-a\n+b\n" + "t" * 50 + "\n",
     "line 7: text after a hunk that is not a hunk: '" + "t" * 40 + "'"),
    (HDR + "@@ -1,3 +1,2 @@ def f(): \n c\n-a\n+b\n",
     "m.py: @@ -1,3 +1,2 @@ def f(): : the hunk has 2 old and 2 new lines, its header says 3 "
     "and 2"),
    (HDR + "@@ -1,3 +1,2 @@ X\n c\n-a\n+b\n",
     "m.py: @@ -1,3 +1,2 @@ X: the hunk has 2 old and 2 new lines, its header says 3 and 2"),
])
def test_more_malformed_diffs_say_where_and_what(bad, message):
    with pytest.raises(ValueError) as e:
        patcher.parse_diff(bad)
    assert str(e.value) == message


def test_a_path_is_all_before_the_first_tab():
    diff = ("--- a/demo/my mod.py\t2024-01-01 00:00:00\t+0000\n"
            "+++ b/demo/my mod.py\t2024-01-02 00:00:00\t+0000\n@@ -1,2 +1,2 @@\n c\n-x\n+y\n")
    assert one_file(diff).path == "demo/my mod.py"


def test_core_and_neighbours_span_every_changed_line():
    (h,) = one_file(HDR + "@@ -1,6 +1,6 @@\n c1\n-x\n k\n+y\n k2\n-z\n c3\n".replace(
        "-1,6 +1,6", "-1,6 +1,5")).hunks
    assert h.core("new") == ["k\n", "y\n", "k2\n"]
    assert h.core("old") == ["x\n", "k\n", "k2\n", "z\n"]
    assert h.core_neighbours() == ("c1\n", "c3\n")
    (e,) = one_file(HDR + "@@ -1,3 +1,2 @@\n c\n-x\n-z\n+y\n").hunks
    assert e.core_neighbours() == ("c\n", None)


# --- versions at their edges (packaging agrees with each) ----------------------------------

@pytest.mark.parametrize("version, spec, want", [
    ("1.0rc0", "==1.0rc", True),  # a pre-release without a number is number 0
    ("1.0rc", "<1.0", False),  # and still a pre-release of 1.0
    ("1.0rc", ">=1.0rc0,<=1.0rc0", True),
    ("1.0.dev0", "<1.0", False),  # <V admits no dev-release of V either
    ("1", "~=1.0.0", True),  # 1 == 1.0.0: the missing numbers are zeros
    ("1.0rc1", "===1.0RC1", True),  # arbitrary equality ignores case
    ("1.0RC1", "===1.0rc1", True),
    ("3", ",<2", False),  # an empty clause is skipped, not the end
    ("3", "<2,,", False),
])
def test_versions_at_their_edges(version, spec, want):
    assert patcher.version_in(version, spec) is want


# --- the installed distribution --------------------------------------------------------------

def test_find_dist_reads_metadata_with_bad_bytes_and_without_name_or_version(tmp_path):
    site = tmp_path / "sp"
    for name, meta in (("a-1.dist-info", b"Metadata-Version: 2.1\nVersion: 1\n"),
                       ("b-2.dist-info", b"Metadata-Version: 2.1\nName: b\n"),
                       ("c-3.dist-info", b"Metadata-Version: 2.1\nName: c\nVersion: 3\n"
                                         b"Summary: caf\xe9 \xff\n")):
        (site / name).mkdir(parents=True)
        (site / name / "METADATA").write_bytes(meta)
    assert patcher.find_dist(site, "b") == patcher.Dist("b", "", site / "b-2.dist-info")
    assert patcher.find_dist(site, "c") == patcher.Dist("c", "3", site / "c-3.dist-info")
    assert patcher.find_dist(site, "a") is None
    assert patcher.find_dist(site, "XXXX") is None  # a METADATA without a Name matches none


# --- RECORD rows of every shape ----------------------------------------------------------------

def _record(site: Path) -> Path:
    return patcher.find_dist(site, "demo").record


def test_other_rows_keep_their_bytes_even_for_files_that_are_elsewhere_or_gone(tmp_path):
    site = make_site(tmp_path)
    rec = _record(site)
    extra = ("../../bin/demo-cli,sha256=AAAA,12\n"
             "demo/gone.py,sha256=BBBB,5\n")
    rec.write_text(rec.read_text() + extra, newline="")
    patcher.apply([doc()], site, None)
    text = rec.read_bytes().decode()
    assert text.endswith(extra) and "\r" not in text
    row = next(r for r in csv.reader(io.StringIO(text)) if r[0] == "demo/mod.py")
    assert row == ["demo/mod.py", _hash(PATCHED.encode()), str(len(PATCHED.encode()))]


def test_a_patched_files_row_without_a_size_gets_one(tmp_path):
    site = make_site(tmp_path)
    rec = _record(site)
    rows = [r for r in csv.reader(io.StringIO(rec.read_text()))]
    rows = [[r[0], r[1]] if r[0] == "demo/mod.py" else r for r in rows]
    rec.write_text("".join(",".join(r) + "\n" for r in rows), newline="")
    patcher.apply([doc()], site, None)
    assert f"demo/mod.py,{_hash(PATCHED.encode())},{len(PATCHED.encode())}\n" in rec.read_text()


def test_a_bytecode_row_with_a_hash_but_no_size_is_rewritten(tmp_path):
    site = make_site(tmp_path)
    src = site / "demo" / "mod.py"
    py_compile.compile(str(src), doraise=True)
    pyc = Path(importlib.util.cache_from_source(str(src)))
    rel = pyc.relative_to(site).as_posix()
    rec = _record(site)
    rec.write_text(rec.read_text() + f"{rel},sha256=stale,\n", newline="")
    patcher.apply([doc()], site, None)
    assert f"{rel},{_hash(pyc.read_bytes())},{len(pyc.read_bytes())}\n" in rec.read_text()
    assert patcher.verify_record(patcher.find_dist(site, "demo"), site) == []


def test_verify_record_reads_every_row_shape(tmp_path):
    site = make_site(tmp_path)
    rec = _record(site)
    data = (site / "demo" / "__init__.py").read_bytes()
    rec.write_text("demo/nohash.py,,\n"
                   f"demo/__init__.py,{_hash(data)}\n"
                   "demo/mod.py,sha256=wrong\n"
                   f"demo/__init__.py,{_hash(b'other')},\n", newline="")
    assert patcher.verify_record(patcher.find_dist(site, "demo"), site) == [
        f"demo/mod.py: RECORD says sha256=wrong, file is {_hash(ORIGINAL.encode())}",
        f"demo/__init__.py: RECORD says {_hash(b'other')}, file is {_hash(data)}"]


# --- bytecode ------------------------------------------------------------------------------

def _level_consts(pyc: Path) -> bool:
    """What `__debug__` compiled to in a pyc: True unoptimized, False at -O and -OO."""
    code = marshal.loads(pyc.read_bytes()[16:])
    return next(c for c in code.co_consts if isinstance(c, bool))


def test_each_optimization_level_is_recompiled_at_its_own_level(tmp_path):
    src = tmp_path / "m.py"
    src.write_text("DEBUG = __debug__\n")
    pycs = {}
    for opt in ("", 1, 2):
        p = Path(importlib.util.cache_from_source(str(src), optimization=opt))
        py_compile.compile(str(src), cfile=str(p), doraise=True,
                           optimize={"": 0, 1: 1, 2: 2}[opt])
        pycs[opt] = p
    src.write_text("DEBUG = __debug__\nX = 1234567\n")
    patcher._recompile(src)
    for opt, p in pycs.items():
        assert _level_consts(p) is (opt == ""), p.name
        assert 1234567 in marshal.loads(p.read_bytes()[16:]).co_consts, p.name


@pytest.mark.parametrize("head, mode", [
    (b"\x00" * 4, py_compile.PycInvalidationMode.TIMESTAMP),  # too short to say: timestamp
    (b"\x00" * 4 + b"\x01\x00", py_compile.PycInvalidationMode.TIMESTAMP),
    (b"\x00" * 4 + b"\x01\x00\x00\x00", py_compile.PycInvalidationMode.UNCHECKED_HASH),
    (b"\x00" * 4 + b"\x02\x00\x00\x00", py_compile.PycInvalidationMode.TIMESTAMP),  # unknown
])
def test_truncated_or_odd_bytecode_is_recompiled_in_the_mode_its_flags_say(tmp_path, head,
                                                                           mode, monkeypatch):
    # SOURCE_DATE_EPOCH (reproducible builds) makes py_compile's own default CHECKED_HASH.
    monkeypatch.setenv("SOURCE_DATE_EPOCH", "1")
    src = tmp_path / "m.py"
    src.write_text("X = 1\n")
    pyc = Path(importlib.util.cache_from_source(str(src)))
    pyc.parent.mkdir()
    pyc.write_bytes(head)
    patcher._recompile(src)
    flags = int.from_bytes(pyc.read_bytes()[4:8], "little")
    assert flags == {py_compile.PycInvalidationMode.TIMESTAMP: 0,
                     py_compile.PycInvalidationMode.UNCHECKED_HASH: 1}[mode]


def test_a_patched_file_that_does_not_compile_fails_loudly(tmp_path):
    src = tmp_path / "m.py"
    src.write_text("X = 1\n")
    py_compile.compile(str(src), doraise=True)
    src.write_text("def broken(:\n")
    with pytest.raises(py_compile.PyCompileError):
        patcher._recompile(src)


# --- variants and decisions, whole ---------------------------------------------------------

def test_a_variant_that_cannot_apply_is_a_fail_outcome():
    def read(rel):
        return {"m.py": lines("c", "z")}.get(rel)

    assert patcher.apply_variant("junk", read) == patcher.Outcome(
        "fail", error="the diff is malformed: no file in the diff (expected '--- a/PATH' and "
                      "'+++ b/PATH' lines)")
    assert patcher.apply_variant(HDR + "@@ -1,2 +1,2 @@\n c\n-a\n+b\n", read) == \
        patcher.Outcome("fail", error="m.py: hunk #1 (@@ -1,2 +1,2 @@) does not apply: closest "
                                      "at line 1 (1 of 2 lines match); line 2: expected 'a', "
                                      "found 'z'")


def test_partly_present_lists_every_hunk_on_each_side():
    old = lines("c1", "a", "c2", "c3", "b", "c4", "c5", "c", "c6", "c7", "d", "c8")
    fd = (HDR + "@@ -1,3 +1,3 @@\n c1\n-a\n+A\n c2\n@@ -4,3 +4,3 @@\n c3\n-b\n+B\n c4\n"
          "@@ -7,3 +7,3 @@\n c5\n-c\n+C\n c6\n@@ -10,3 +10,3 @@\n c7\n-d\n+D\n c8\n")
    text = old.replace("a\n", "A\n").replace("b\n", "B\n")
    o = patcher.apply_variant(fd, lambda rel: text)
    assert o.state == "fail" and o.error == (
        "partly present: m.py hunk #1 (@@ -1,3 +1,3 @@), m.py hunk #2 (@@ -4,3 +4,3 @@) "
        "already in the package, but m.py hunk #3 (@@ -7,3 +7,3 @@), m.py hunk #4 "
        "(@@ -10,3 +10,3 @@) not; the package has part of the change, so this version needs "
        "its own diff variant")


def test_every_decision_carries_its_package_version_variant_and_files(tmp_path):
    site = make_site(tmp_path)
    files = ["demo/mod.py"]
    gone = dict(doc(), package="zz")
    assert patcher.decide(gone, site, {}) == Decision(
        "demo-fix", "zz", None, "not-applicable", "zz is not installed")
    assert patcher.decide(doc(versions=">=3"), site, {}) == Decision(
        "demo-fix", "demo", "1.2.0", "not-applicable",
        "demo 1.2.0 is outside the patch's versions (>=3)", files=files)
    x = doc(versions=">=1.0,<3")
    x["variants"][0]["versions"] = "<1.1"
    assert patcher.decide(x, site, {}) == Decision(
        "demo-fix", "demo", "1.2.0", "fails", "demo 1.2.0 is in the patch's versions "
        "(>=1.0,<3) but no diff variant covers it", files=files)
    broken = doc(diff=unified(ORIGINAL, PATCHED).replace(" def unrelated():", " def x():"))
    d = patcher.decide(broken, site, {})
    assert (d.package, d.version, d.status, d.variant, d.files, d.new_texts) == (
        "demo", "1.2.0", "fails", ">=1.0,<2", files, {})
    there = make_site(tmp_path / "p", text=PATCHED)
    assert patcher.decide(doc(), there, {}) == Decision(
        "demo-fix", "demo", "1.2.0", "obsolete", "demo 1.2.0 already has the change; not "
        "applied", ">=1.0,<2", files=files)
    assert patcher.decide(doc(), there, {}, {"status": "applied", "version": "1.2.0",
                                             "detail": "applied cleanly"}) == Decision(
        "demo-fix", "demo", "1.2.0", "applied", "applied cleanly", ">=1.0,<2", files=files)
    later = make_site(tmp_path / "q", version="2.0", text=PATCHED)
    assert patcher.decide(doc(), later, {}) == Decision(
        "demo-fix", "demo", "2.0", "obsolete", "demo 2.0 is outside >=1.0,<2 and already has "
        "the change (fixed upstream)", ">=1.0,<2", files=files)


def test_a_patch_on_a_file_that_is_not_there_fails_by_name(tmp_path):
    site = make_site(tmp_path)
    x = doc(diff=unified(INIT, INIT + "X = 1\n", "demo/absent.py"))
    d = patcher.decide(x, site, {})
    assert (d.status, d.detail) == (
        "fails", "patch demo-fix: demo/absent.py: no such file in site-packages")
    (site / "demo" / "dir.py").mkdir()
    d = patcher.decide(doc(diff=unified(INIT, INIT + "X = 1\n", "demo/dir.py")), site, {})
    assert d.detail == "patch demo-fix: demo/dir.py: no such file in site-packages"


# --- writing ----------------------------------------------------------------------------------

def test_the_report_names_each_variant_and_its_directories_are_made(tmp_path):
    site = make_site(tmp_path)
    report = tmp_path / "a" / "b" / "patches.json"
    out = patcher.apply([doc(), dict(doc("z-gone"), package="zz")], site, report)
    assert [(e["id"], e["variant"]) for e in out["patches"]] == [
        ("demo-fix", ">=1.0,<2"), ("z-gone", None)]
    assert json.loads(report.read_text()) == out


def test_the_scratch_file_is_made_beside_the_target_not_in_tmpdir(tmp_path, monkeypatch):
    import tempfile

    # A rename is atomic only within one filesystem: where TMPDIR points plays no part.
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "no-such-dir"))
    target = tmp_path / "t.txt"
    patcher._atomic_write(target, b"data")
    assert target.read_bytes() == b"data" and sorted(tmp_path.iterdir()) == [target]


# --- probes ---------------------------------------------------------------------------------

def test_an_applied_patch_whose_probe_fails_fails_the_probe_run(tmp_path):
    site = make_site(tmp_path)
    report = tmp_path / "r.json"
    x = doc(probe="assert False, 'still broken'")
    patcher.apply([x], site, report)
    assert patcher.probe([x], site, report) == {"ok": False, "probes": [
        {"id": "demo-fix", "status": "applied", "probe": "fail", "version": "1.2.0",
         "detail": "assertion failed: still broken (line 1)"}]}


def test_a_change_found_present_is_obsolete_whatever_an_old_report_said(tmp_path):
    site = make_site(tmp_path, text=PATCHED)
    report = tmp_path / "r.json"
    report.write_text(json.dumps({"patches": [{"id": "demo-fix", "status": "applied",
                                               "version": "1.1.0"}]}))
    out = patcher.probe([doc(probe="assert True")], site, report)
    assert out == {"ok": True, "probes": [{"id": "demo-fix", "status": "obsolete",
                                           "probe": "pass", "detail": "passed",
                                           "version": "1.2.0"}]}


def test_run_probe_edges(tmp_path):
    site = make_site(tmp_path)
    assert patcher.run_probe(doc(probe=""), site) == (True, "passed")
    bad = "x = = 1\n"
    try:
        compile(bad, "<probe demo-fix>", "exec")
    except SyntaxError as e:
        said = f"SyntaxError: {e}"
    assert patcher.run_probe(doc(probe=bad), site) == (False, said)  # no line of its own
    # A probe is plain Python: the patcher's own `from __future__` does not reach it.
    assert patcher.run_probe(doc(probe="x: no_such_name = 1\n"), site) == (
        False, "NameError: name 'no_such_name' is not defined (line 1)")


def test_a_probe_loads_with_modules_and_env(tmp_path):
    site = make_site(tmp_path)
    (site / "demo" / "x.py").write_text("import yaml\n\ndef f():\n    return yaml.__name__, Z\n")
    probe = ("f = load('demo/x.py', 'f', modules=('yaml',), env={'Z': 5})['f']\n"
             "assert f() == ('yaml', 5), f()\n")
    assert patcher.run_probe(doc(probe=probe), site) == (True, "passed")


def test_loaded_source_keeps_its_file_name_and_module(tmp_path):
    src = tmp_path / "m.py"
    src.write_text("from os.path import sep\nfrom .json import loads\n\n"
                   "def f():\n    return sep, __file__, __name__\n")
    ns = patcher.load_source(src, ("f",))
    f = ns["f"]
    assert f() == ("/", str(src), "imgbuild_probe_m")
    assert f.__module__ == "imgbuild_probe_m" and f.__code__.co_filename == str(src)
    (tmp_path / "bad.py").write_text("def f(:\n")
    with pytest.raises(SyntaxError) as e:
        patcher.load_source(tmp_path / "bad.py", ("f",))
    assert e.value.filename == str(tmp_path / "bad.py")


# --- the command line ---------------------------------------------------------------------

HELP = """\
usage: patcher.py [-h] --patches PATCHES [--site-packages SITE_PACKAGES] [--report REPORT]
                  [--probe] [--dry-run]

Apply (or probe) imgbuild's patches.

options:
  -h, --help            show this help message and exit
  --patches PATCHES     directory of <id>.json patches
  --site-packages SITE_PACKAGES
                        where the package is installed (default: this interpreter's purelib)
  --report REPORT       patches.json to write/read (default: next to the patches directory)
  --probe               run the probes; print a JSON report
  --dry-run             decide and report; write nothing
"""


def test_the_command_lines_help_word_for_word(monkeypatch, capsys):
    import sys

    monkeypatch.setattr(sys, "argv", ["patcher.py"])
    monkeypatch.setenv("COLUMNS", "100")
    with pytest.raises(SystemExit) as e:
        patcher.main(["--help"])
    assert e.value.code == 0 and capsys.readouterr().out == HELP
    with pytest.raises(SystemExit) as e:
        patcher.main([])
    assert e.value.code == 2
    assert capsys.readouterr().err.endswith(
        "error: the following arguments are required: --patches\n")


def test_the_probe_command_prints_sorted_json_from_the_report(tmp_path, capsys):
    site = make_site(tmp_path)
    d = write_docs(tmp_path / "patches", [doc(probe="assert True")])
    assert patcher.main(["--patches", str(d), "--site-packages", str(site)]) == 0
    capsys.readouterr()
    assert patcher.main(["--probe", "--patches", str(d), "--site-packages", str(site)]) == 0
    assert capsys.readouterr().out == (
        '{\n  "ok": true,\n  "probes": [\n    {\n      "detail": "passed",\n'
        '      "id": "demo-fix",\n      "probe": "pass",\n      "status": "applied",\n'
        '      "version": "1.2.0"\n    }\n  ]\n}\n')


def test_bytecode_levels_do_not_follow_the_interpreter_running_the_patcher(tmp_path):
    """Under PYTHONOPTIMIZE (or -O) the plain .pyc is still compiled unoptimized: the image's
    Python, run without it, loads that file with its asserts."""
    import os
    import subprocess
    import sys

    src = tmp_path / "m.py"
    src.write_text("DEBUG = __debug__\n")
    pycs = {}
    for opt in ("", 1):
        p = Path(importlib.util.cache_from_source(str(src), optimization=opt))
        py_compile.compile(str(src), cfile=str(p), doraise=True, optimize=opt or 0)
        pycs[opt] = p
    src.write_text("DEBUG = __debug__\nX = 7654321\n")
    root = Path(patcher.__file__).resolve().parents[2]
    r = subprocess.run([sys.executable, "-c", "import sys; from imgbuild.payload import patcher; "
                        "patcher._recompile(__import__('pathlib').Path(sys.argv[1]))", str(src)],
                       env=dict(os.environ, PYTHONOPTIMIZE="1", PYTHONPATH=str(root)),
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    for opt, p in pycs.items():
        assert 7654321 in marshal.loads(p.read_bytes()[16:]).co_consts, p.name
        assert _level_consts(p) is (opt == ""), p.name


def test_a_marker_after_an_empty_hunk_is_a_malformed_diff_not_a_crash():
    with pytest.raises(ValueError) as e:
        patcher.parse_diff("--- a/x.py\n+++ b/x.py\n@@ -0,0 +0,0 @@\n"
                           "\\ No newline at end of file\n")
    assert str(e.value) == ("x.py: @@ -0,0 +0,0 @@: a hunk needs context lines (make the diff "
                            "with `diff -u`)")
