"""doctor's decisions on a small catalog written here (imgbuild/checks/doctor.py): which line is
the engine's evidence, what a sentence may say when a rank or a count is known, which failure
another engine's log keeps and which becomes "another cause", what a line around the match
gives, the order of equal diagnoses, and how a log's bytes are decoded. No Docker."""

from __future__ import annotations

import copy
import io

from imgbuild.catalog.failures import load_failures
from imgbuild.checks import doctor

from .test_decisions_catalog_failure_refusals import GOOD, _write


def _catalog(tmp_path, edit):
    data = copy.deepcopy(GOOD)
    edit(data)
    return load_failures(_write(tmp_path, data))


def _engine(log: str, cat):
    found: list = []
    diags = doctor.diagnose(log, cat, found)
    return diags, found[0]


def test_a_sign_seen_twice_is_evidence_at_its_first_line(tmp_path):
    """Each sign counts once, at the first line that shows it (the second sign of the first
    engine: its place in the catalog is not its engine's)."""
    def edit(d):
        d["engines"][0]["signs"].append({"regex": r"widgets-frame", "contains": "widgets-frame"})
    cat = _catalog(tmp_path, edit)
    _, e = _engine("widgets-frame a\nnothing\nwidgets-frame b\n", cat)
    assert (e.name, e.evidence.line, e.evidence.text) == ("widgets", 1, "widgets-frame a")


def test_a_prefix_other_programs_write_is_a_probable_engine_with_its_line(tmp_path):
    cat = _catalog(tmp_path, lambda d: None)
    _, e = _engine("starting\n[12:00] hello\n", cat)
    assert (e.name, e.version, e.only_hint) == ("widgets", None, "any logger writes it")
    assert (e.evidence.line, e.evidence.text, e.evidence.role) == (2, "[12:00] hello", "engine")


def test_a_segment_with_the_count_or_the_ranks_is_said_when_the_log_gives_them(tmp_path):
    def edit(d):
        d["failures"][0]["cause"] = "gone[[ {occurrences} times||]][[ on {ranks}||, rank unknown]]"
    cat = _catalog(tmp_path, edit)
    d, = doctor.diagnose("widgets 1.5 ready\nloading spokes\n[W3] WidgetError: no widget gear\n",
                         cat)
    assert d.cause == "gone 1 times on TP3"
    d, = doctor.diagnose("widgets 1.5 ready\nloading spokes\nWidgetError: no widget gear\n"
                         "WidgetError: no widget gear\n", cat)
    assert d.cause == "gone 2 times, rank unknown"


def _two_failures(d):
    """widget-missing (Widgets <2) and gear-jam (Widgets >=2 and Gadgets), and a Gadgets
    engine, so a Widgets 1.5 log keeps the first and gives the second another cause."""
    d["engines"].append({"name": "gadgets", "title": "Gadgets",
                         "signs": [{"regex": "gadgets ready", "contains": "gadgets ready"}]})
    jam = copy.deepcopy(d["failures"][0])
    jam.update(id="gear-jam", title="the gear jammed", cause="it jammed", fix="oil it",
               applies_to={"widgets": ">=2", "gadgets": ""}, sources=[], examples=[],
               match=[{"regex": r"GearJam", "contains": "GearJam"}], derive={}, around=[],
               dedupe_by=None)
    jam.pop("dedupe_by")
    d["failures"].append(jam)


def test_a_failure_another_engine_prints_is_another_cause_after_the_ones_that_fit(tmp_path):
    cat = _catalog(tmp_path, _two_failures)
    log = "widgets 1.5 ready\nloading spokes\nWidgetError: no widget gear\nGearJam\n"
    diags, e = _engine(log, cat)
    assert (e.name, e.version) == ("widgets", "1.5")
    assert [(d.id, d.line) for d in diags] == [("widget-missing", 3), (doctor.OTHER_CAUSE, 4)]
    other = diags[1]
    assert other.sentence_of == "gear-jam"
    assert other.cause == (
        "This line is the message imgbuild knows as gear-jam (the gear jammed), which "
        "Widgets >=2, Gadgets print for that cause. This log was written by Widgets 1.5 "
        "(line 1), where the same words have another cause, and imgbuild has no diagnosis for "
        "it.")


def test_every_line_around_the_match_that_gives_a_missing_value_is_read(tmp_path):
    """The first `around` line's value is already captured; the second's is not, and is read."""
    def edit(d):
        fp = d["failures"][0]
        fp["around"] = [{"regex": r"widget (?P<name>\w+) here", "contains": "here", "before": 3},
                        {"regex": r"port (?P<port>\d+)", "contains": "port ", "before": 3}]
    cat = _catalog(tmp_path, edit)
    d, = doctor.diagnose("port 30000\nloading spokes\nWidgetError: no widget gear\n", cat)
    assert d.captures["port"] == "30000"
    assert "(1 times, not named in the log) on port 30000 (" in d.cause


def test_a_near_lines_evidence_carries_its_own_rank(tmp_path):
    cat = _catalog(tmp_path, lambda d: None)
    d, = doctor.diagnose("[W2] loading spokes\n[W5] WidgetError: no widget gear\n", cat)
    assert [(ev.line, ev.role, ev.rank) for ev in d.evidence] == \
        [(2, "match", "5"), (1, "loader", "2")]


def test_equal_diagnoses_are_in_the_order_of_their_lines(tmp_path):
    """Both warnings, both matched by one line: the earlier line first, whatever the
    catalog's order."""
    def edit(d):
        _two_failures(d)
        d["failures"][0]["match"][0].pop("near")
        d["failures"][0]["derive"].pop("label")  # it used the near line's capture
    cat = _catalog(tmp_path, edit)
    diags = doctor.diagnose("GearJam\nWidgetError: no widget gear\n", cat)
    assert [(d.id, d.line) for d in diags] == [("gear-jam", 1), ("widget-missing", 2)]


def test_text_that_starts_with_a_zero_byte_is_utf8_not_utf16():
    """UTF-16-BE without a BOM shows as zeros at 0 and 2 with letters at 1 and 3; one zero
    byte at the start is not that."""
    assert list(doctor._text_stream(io.BytesIO(b"\x00abc\n"))) == ["\x00abc"]
    assert list(doctor._text_stream(io.BytesIO("hi\n".encode("utf-16-be")))) == ["hi"]
