"""The doctor's attribution decisions (checks/doctor.py) on small catalogs written as data
under tmp_path (the same YAML images/checks/failures.yaml is): which failure a log is
attributed to, in which order when several match, which lines are evidence, which engine wrote
the log, and what a failure bound to another engine becomes."""

from __future__ import annotations

from pathlib import Path

import pytest

from imgbuild.catalog.failures import load_failures
from imgbuild.checks import doctor
from imgbuild.errors import InputError

HEAD = """
engines:
  - name: alpha
    title: Alpha
    signs:
      - {regex: 'alpha (?P<version>\\d+\\.\\d+)', contains: "alpha ", weight: 3}
      - {regex: 'alpha-frame', contains: "alpha-frame"}
      - {regex: 'alpha-server', contains: "alpha-server", weight: 3}
      - {regex: 'alpha-pkg==(?P<version>\\d+\\.\\d+)', contains: "alpha-pkg=="}
  - name: beta
    title: Beta
    signs:
      - {regex: 'beta (?P<version>\\d+\\.\\d+)', contains: "beta ", weight: 3}
      - {regex: 'beta-frame', contains: "beta-frame"}
prefixes:
  - {name: rank, regex: '^\\[TP(?P<rank>\\d+)\\] '}
  - {name: alpha-log, regex: '^ALPHA\\| ', engine: alpha}
  - {name: shared-log, regex: '^INFO: ', engine: beta, generic: "many servers write INFO:"}
failures:
"""


def cat(tmp_path: Path, body: str):
    (tmp_path / "checks").mkdir(exist_ok=True)
    (tmp_path / "checks" / "failures.yaml").write_text(HEAD + body)
    return load_failures(tmp_path)


def fail(fid, regex, contains, *, severity=None, near=None, extra="", alts=None):
    lines = [f"  - id: {fid}", f"    title: {fid} title"]
    if severity:
        lines.append(f"    severity: {severity}")
    lines.append("    match:")
    for rx, c, nr, sev in alts or [(regex, contains, near, None)]:
        lines.append(f"      - regex: '{rx}'")
        lines.append(f'        contains: "{c}"')
        if sev:
            lines.append(f"        severity: {sev}")
        if nr:
            lines.append("        near:")
            for nrx, nc, before, after in nr:
                lines.append(f"          - {{regex: '{nrx}', contains: \"{nc}\", before: {before}, "
                             f"after: {after}, role: ctx}}")
    lines += [f"    cause: cause of {fid}", f"    fix: fix {fid}"]
    return "\n".join(lines) + ("\n" + extra if extra else "") + "\n"


def ids(diags):
    return [d.id for d in diags]


# --- order when several match ---------------------------------------------------------------

def test_errors_before_warnings_then_more_lines_then_earlier(tmp_path):
    c = cat(tmp_path, fail("w-early", "WARNX", "WARNX", severity="warning")
            + fail("e-plain", "ERRA", "ERRA")
            + fail("e-context", "ERRB", "ERRB", near=[("CTXB", "CTXB", 2, 0)]))
    log = "WARNX\nERRA\nCTXB\nERRB\n"
    assert ids(doctor.diagnose(log, c)) == ["e-context", "e-plain", "w-early"]
    # Without its context line, ERRB does not match at all (never a guess).
    assert ids(doctor.diagnose("WARNX\nERRA\nERRB\n", c)) == ["e-plain", "w-early"]
    # Same severity and lines: the earlier in the log first.
    c2 = cat(tmp_path, fail("a", "AAA", "AAA") + fail("b", "BBB", "BBB"))
    assert ids(doctor.diagnose("BBB\nAAA\n", c2)) == ["b", "a"]
    assert ids(doctor.diagnose("AAA\nBBB\n", c2)) == ["a", "b"]


def test_a_group_ranks_by_its_most_specific_match(tmp_path):
    """One failure seen twice, first with its context line, then without: one diagnosis, as
    specific as its best match, so it goes before a one-line failure seen earlier."""
    c = cat(tmp_path, fail("one-line", "ONE", "ONE")
            + fail("two-ways", "", "", alts=[("XERR", "XERR", [("CTX", "CTX", 1, 0)], None),
                                             ("XERR2", "XERR2", None, None)]))
    log = "ONE\nCTX\nXERR\nXERR2\n"
    got = doctor.diagnose(log, c)
    assert ids(got) == ["two-ways", "one-line"]
    assert got[0].occurrences == 2 and got[0].line == 3


def test_an_alternatives_severity_overrides_the_failures(tmp_path):
    c = cat(tmp_path, fail("mixed", "", "", severity="warning",
                           alts=[("SOFT", "SOFT", None, None), ("HARD", "HARD", None, "error")])
            + fail("other", "OTHER", "OTHER", severity="warning"))
    d = doctor.diagnose("OTHER\nSOFT\n", c)
    assert [x.severity for x in d] == ["warning", "warning"] and ids(d) == ["other", "mixed"]
    d = doctor.diagnose("OTHER\nHARD\n", c)
    assert ids(d) == ["mixed", "other"] and d[0].severity == "error"


# --- evidence -------------------------------------------------------------------------------

def test_evidence_is_the_matched_line_and_its_context_by_line_number(tmp_path):
    c = cat(tmp_path, fail("ctx", "BOOM (?P<what>\\w+)", "BOOM ",
                           near=[("because (?P<why>\\w+)", "because", 3, 2)]))
    log = "start\nbecause far\nx\nx\nBOOM gear\nx\nbecause near\n"
    d, = doctor.diagnose(log, c)
    assert d.line == 5
    assert [(e.line, e.role) for e in d.evidence] == [(5, "match"), (7, "ctx")]
    assert dict(d.captures) == {"what": "gear", "why": "near"}
    # Equally near before and after: the line before wins.
    d, = doctor.diagnose("because before\nBOOM gear\nbecause after\n", c)
    assert d.captures["why"] == "before"
    # Outside the window: no match.
    assert doctor.diagnose("because a\nx\nx\nx\nBOOM gear\n", c) == []


def test_a_context_line_must_agree_with_the_captures(tmp_path):
    c = cat(tmp_path, fail("agree", "FAIL (?P<n>\\d+)", "FAIL ",
                           near=[("ok (?P<n>\\d+)", "ok ", 2, 0)]))
    assert doctor.diagnose("ok 2\nFAIL 1\n", c) == []
    d, = doctor.diagnose("ok 1\nok 2\nFAIL 1\n", c)
    assert d.evidence[1].line == 1


def test_the_same_failure_on_several_ranks_is_one_diagnosis_with_the_first_line(tmp_path):
    c = cat(tmp_path, fail("r", "BAD (?P<x>\\w+)", "BAD "))
    log = "[TP1] BAD a\n[TP10] BAD a\n[TP2] BAD a\n[TP0] BAD b\n"
    d = doctor.diagnose(log, c)
    assert [(x.line, x.occurrences, x.ranks) for x in d] == [(1, 3, ("1", "2", "10")),
                                                            (4, 1, ("0",))]
    assert doctor.ranks_text(["10", "2", "1", "2"]) == "TP1, TP2, TP10"
    assert doctor.ranks_text([]) == "not named in the log"


def test_dedupe_by_names_the_captures_that_make_two_failures_one(tmp_path):
    c = cat(tmp_path, fail("d", "OOM on (?P<gpu>\\d+) at (?P<t>\\d+)", "OOM on ",
                           extra="    dedupe_by: [gpu]"))
    d = doctor.diagnose("OOM on 0 at 1\nOOM on 0 at 2\nOOM on 1 at 3\n", c)
    assert [(x.line, x.occurrences) for x in d] == [(1, 2), (3, 1)]


def test_a_failure_that_explains_another_drops_it_and_takes_its_lines(tmp_path):
    c = cat(tmp_path, fail("root", "ROOT", "ROOT", extra="    supersedes: [symptom]")
            + fail("symptom", "SYM (?P<n>\\d+)", "SYM "))
    log = "SYM 1\nSYM 2\nROOT\nSYM 3\nSYM 4\n"
    d, = doctor.diagnose(log, c)
    assert d.id == "root"
    assert [(e.line, e.role) for e in d.evidence] == [(3, "match"), (1, "related"),
                                                      (2, "related"), (4, "related")]
    # Without the root cause, the symptom stands.
    assert set(ids(doctor.diagnose("SYM 1\n", c))) == {"symptom"}


# --- which engine wrote the log -------------------------------------------------------------

def engine_of(c, log):
    out: list = []
    doctor.diagnose(log, c, out)
    return out[0]


def test_the_engine_is_the_one_with_the_heavier_signs(tmp_path):
    c = cat(tmp_path, fail("x", "XX", "XX"))
    e = engine_of(c, "alpha-frame\nbeta-frame\nalpha 1.2\n")
    assert (e.name, e.version, e.evidence.line) == ("alpha", "1.2", 3)
    assert e.certain
    # A tie is no answer.
    assert engine_of(c, "alpha-frame\nbeta-frame\n") is None
    assert engine_of(c, "nothing here\n") is None
    # A prefix only one engine writes counts 2: it beats one frame of the other.
    e = engine_of(c, "ALPHA| hello\nbeta-frame\n")
    assert e.name == "alpha" and e.evidence.line == 0 and e.certain
    # ... and loses to a sign of weight 3.
    assert engine_of(c, "ALPHA| hello\nbeta 2.0\n").name == "beta"


def test_a_prefix_other_programs_write_is_a_guess(tmp_path):
    c = cat(tmp_path, fail("x", "XX", "XX"))
    e = engine_of(c, "INFO: hello\nINFO: again\n")
    assert e.name == "beta" and not e.certain
    assert e.evidence.line == 1 and e.only_hint == "many servers write INFO:"


def test_the_earliest_of_the_heaviest_signs_is_the_evidence(tmp_path):
    c = cat(tmp_path, fail("x", "XX", "XX"))
    e = engine_of(c, "alpha-frame\nalpha 1.0\nalpha-frame\n")
    assert e.evidence.line == 2 and e.version == "1.0"
    e = engine_of(c, "alpha-frame\nalpha-server\nalpha 1.0\n")
    assert e.evidence.line == 2 and e.version == "1.0"
    e = engine_of(c, "alpha 1.0\nalpha-server\n")
    assert e.evidence.line == 1


def test_the_version_is_the_earliest_line_that_names_one(tmp_path):
    c = cat(tmp_path, fail("x", "XX", "XX"))
    assert engine_of(c, "alpha-pkg==1.1\nx\nalpha 2.0\n").version == "1.1"
    assert engine_of(c, "alpha 2.0\nalpha-pkg==1.1\n").version == "2.0"


# --- a failure only some engines print ------------------------------------------------------

BOUND = fail("alpha-only", "KeyError: (?P<k>\\w+)", "KeyError: ",
             extra='    applies_to: {alpha: ">=1.0,<2.0"}')


def test_a_bound_failure_holds_in_its_engines_range(tmp_path):
    c = cat(tmp_path, BOUND)
    d, = doctor.diagnose("alpha 1.5\nKeyError: w\n", c)
    assert d.id == "alpha-only" and d.certain and not d.title.startswith("possibly")
    # Its engine, no version: possibly.
    d, = doctor.diagnose("alpha-frame\nKeyError: w\n", c)
    assert d.id == "alpha-only" and not d.certain and "does not say which Alpha version" in d.cause
    # Unknown engine: possibly, naming where it holds.
    d, = doctor.diagnose("KeyError: w\n", c)
    assert not d.certain and d.title == "possibly: alpha-only title"
    assert "Alpha >=1.0,<2.0" in d.cause


@pytest.mark.parametrize("log", ["alpha 2.1\nKeyError: w\n", "beta 1.5\nKeyError: w\n"])
def test_outside_its_range_or_engine_it_is_another_cause(tmp_path, log):
    c = cat(tmp_path, BOUND)
    d, = doctor.diagnose(log, c)
    assert d.id == doctor.OTHER_CAUSE and d.sentence_of == "alpha-only"
    assert d.evidence[-1].role == "engine" and d.evidence[-1].line == 1


def test_another_cause_is_not_given_for_a_line_a_kept_failure_explains(tmp_path):
    c = cat(tmp_path, BOUND + fail("any-keyerror", "KeyError: (?P<k>\\w+)", "KeyError: ",
                                   severity="warning"))
    d = doctor.diagnose("beta 1.5\nKeyError: w\n", c)
    assert ids(d) == ["any-keyerror"]
    # Another cause goes after the real diagnoses, errors or not.
    c = cat(tmp_path, BOUND + fail("warn", "WW", "WW", severity="warning"))
    d = doctor.diagnose("beta 1.5\nKeyError: w\nWW\n", c)
    assert ids(d) == ["warn", doctor.OTHER_CAUSE]


def test_an_empty_range_means_every_version_of_that_engine(tmp_path):
    c = cat(tmp_path, fail("alpha-any", "KeyError: (?P<k>\\w+)", "KeyError: ",
                           extra='    applies_to: {alpha: ""}'))
    d, = doctor.diagnose("alpha-frame\nKeyError: w\n", c)
    assert d.id == "alpha-any" and d.certain
    d, = doctor.diagnose("alpha 9.9\nKeyError: w\n", c)
    assert d.id == "alpha-any" and d.certain


# --- catalog/failures.py: sentences and layers ----------------------------------------------

from imgbuild.catalog import failures as F  # noqa: E402


def test_a_segment_takes_its_first_wording_only_when_the_log_gave_every_value():
    t = "load [[{model} on {gpu}||the model]] failed{why}"
    assert F.fill(t, {"model": "m", "gpu": "g", "why": "!"}, {"model", "gpu"}) == \
        "load m on g failed!"
    assert F.fill(t, {"model": "m", "gpu": "a GPU"}, {"model"}) == "load the model failed"
    assert F.fill("a [[only {x}]] b {y}", {}, set()) == "a  b "
    assert F.fill("{x}", {"x": "1"}, set()) == "1"  # a plain placeholder: its value, given or not


def test_a_derived_value_is_given_only_from_the_log():
    tpl = F.Derived("arch", template="sm{major}{minor}")
    assert tpl.value({"major": "9", "minor": "0"}) == "sm90"
    assert tpl.value({"major": "9"}) == "sm9"
    assert tpl.given({}, {"major", "minor"}) and not tpl.given({}, {"major"})
    table = F.Derived("arch", source="cc", table=(("90", "sm90"), ("100", "sm100")),
                      default="the GPU's arch")
    assert table.value({"cc": "100"}) == "sm100" and table.value({"cc": "75"}) == "the GPU's arch"
    assert table.given({"cc": "90"}, {"cc"})
    assert not table.given({"cc": "75"}, {"cc"})  # the default stands in: not from the log
    assert not table.given({"cc": "90"}, set())


def test_a_projects_failures_add_to_the_catalogs_and_replace_by_id():
    lower = {"prefixes": [{"name": "p", "regex": "a"}],
             "failures": [{"id": "a", "v": 1}, {"id": "b", "v": 1}], "engines": [{"name": "e"}]}
    upper = {"failures": [{"id": "b", "v": 2}, {"id": "c", "v": 2}],
             "prefixes": [{"name": "p", "regex": "z"}]}
    out = F._merged(lower, upper)
    assert out["failures"] == [{"id": "b", "v": 2}, {"id": "c", "v": 2}, {"id": "a", "v": 1}]
    assert out["prefixes"] == [{"name": "p", "regex": "z"}]
    assert out["engines"] == [{"name": "e"}]
    assert lower["failures"] == [{"id": "a", "v": 1}, {"id": "b", "v": 1}]
    assert F._merged(lower, {"engines": "x"})["engines"] == "x"


def test_layers_of_failure_files_load_as_one(tmp_path):
    low, high = tmp_path / "low", tmp_path / "high"
    low.mkdir()
    cat(low, fail("shared", "OLD", "OLD") + fail("low-only", "LOW", "LOW"))
    (high / "checks").mkdir(parents=True)
    (high / "checks" / "failures.yaml").write_text("failures:\n" + fail("shared", "NEW", "NEW"))
    c = load_failures([low, high])
    assert [fp.id for fp in c.fingerprints] == ["shared", "low-only"]
    assert ids(doctor.diagnose("OLD\nNEW\nLOW\n", c)) == ["shared", "low-only"]
    assert doctor.diagnose("OLD\n", c) == []
    assert [e.name for e in c.engines] == ["alpha", "beta"]  # the lower layer's, kept
    # A layer without the file is skipped.
    (tmp_path / "empty").mkdir()
    assert [fp.id for fp in load_failures([low, tmp_path / "empty"]).fingerprints] == \
        ["shared", "low-only"]


# --- how a log's bytes become lines -----------------------------------------------------------

LOG_TEXT = "INFO serving on 0.0.0.0:30000  \nCUDA error: out of memory é\nlast X"


def _gz(b: bytes) -> bytes:
    import gzip

    return gzip.compress(b)


@pytest.mark.parametrize("raw", [
    LOG_TEXT.encode("utf-8"),
    LOG_TEXT.encode("utf-8-sig"),
    LOG_TEXT.encode("utf-16"),  # with its byte-order mark (little-endian here)
    b"\xfe\xff" + LOG_TEXT.encode("utf-16-be"),
    LOG_TEXT.encode("utf-16-le"),  # no mark: the zero bytes of ASCII text say which
    LOG_TEXT.encode("utf-16-be"),
    _gz(LOG_TEXT.encode("utf-8")),
    _gz(LOG_TEXT.encode("utf-16-le")),
], ids=["utf-8", "utf-8-bom", "utf-16-bom-le", "utf-16-bom-be", "utf-16-le", "utf-16-be",
        "gzip", "gzip-utf-16-le"])
@pytest.mark.parametrize("peekable", [False, True], ids=["stream", "buffered"])
def test_a_log_reads_as_its_lines_whatever_its_encoding(raw, peekable):
    import io

    stream = io.BytesIO(raw)
    got = list(doctor._text_stream(io.BufferedReader(stream) if peekable else stream))
    # trailing spaces kept: only the newline goes
    assert got == ["INFO serving on 0.0.0.0:30000  ", "CUDA error: out of memory é", "last X"]


def test_a_line_longer_than_the_limit_is_cut_and_the_rest_of_it_skipped():
    import io

    m = doctor.MAX_LINE
    lines = ["a" * m, "b" * (m + 1), "c" * (m + 2), "d" * (m + 3 * (1 << 16)), "after"]
    got = list(doctor._text_stream(io.BytesIO("\n".join(lines).encode())))
    assert got == ["a" * m, "b" * (m + 1), "c" * (m + 1), "d" * (m + 1), "after"]


def test_a_log_on_standard_input_is_read_from_the_stream_given():
    import io

    failures = load_failures(Path(__file__).resolve().parents[1] / "images")
    r = doctor.doctor(failures, "-", io.BytesIO(b"INFO ok\n"))
    assert r.source == "standard input" and r.diagnoses == ()
    assert r.to_dict()["log"] == "standard input"


def test_a_truncated_gzip_log_is_refused_with_what_to_pass(tmp_path):
    import gzip
    import io

    failures = load_failures(Path(__file__).resolve().parents[1] / "images")
    whole = gzip.compress(b"INFO a line\n" * 5000)
    (tmp_path / "server.log.gz").write_bytes(whole[: len(whole) // 2])
    with pytest.raises(InputError) as e:
        doctor.doctor(failures, str(tmp_path / "server.log.gz"))
    assert e.value.message == (f"cannot read {tmp_path / 'server.log.gz'}: Compressed file "
                               "ended before the end-of-stream marker was reached")
    assert e.value.hint == "pass the server's log as text or gzip"
    with pytest.raises(InputError) as e:
        doctor.doctor(failures, "-", io.BytesIO(whole[: len(whole) // 2]))
    assert e.value.message.startswith("cannot read standard input: Compressed file ended")


def test_an_os_error_is_said_in_its_own_words():
    class Broken:
        def read(self, n=-1):
            raise OSError(5, "Input/output error")

        readinto = peek = read

        def readable(self):
            return True

    failures = load_failures(Path(__file__).resolve().parents[1] / "images")
    with pytest.raises(InputError) as e:
        doctor.doctor(failures, "-", Broken())
    assert e.value.message == "cannot read standard input: Input/output error"


def test_an_engine_the_user_names_is_taken_as_said_or_refused_with_the_way_to_write_it():
    failures = load_failures(Path(__file__).resolve().parents[1] / "images")
    e = doctor.engine_given("SGLang == 0.5.16 ", failures)
    assert (e.name, e.version, e.certain) == ("sglang", "0.5.16", True)
    assert e.evidence == doctor.Evidence(0, "--engine SGLang == 0.5.16 ", "engine")
    assert doctor.engine_given("vllm", failures).version is None
    with pytest.raises(InputError) as x:
        doctor.engine_given("tgi==2.0", failures)
    assert x.value.message == "--engine tgi==2.0: not an engine doctor knows"
    assert x.value.facts == [f"engines: {', '.join(sorted(e.name for e in failures.engines))}"]
    assert x.value.hint == "write NAME or NAME==VERSION, e.g. --engine sglang==0.5.16"
    with pytest.raises(InputError) as x:
        doctor.engine_given("sglang==latest", failures)
    assert x.value.message == "--engine sglang==latest: 'latest' is not a version"
    assert x.value.hint == "write NAME==VERSION, e.g. --engine sglang==0.5.16"


def test_a_progress_bar_line_is_what_a_terminal_would_show():
    got = [shown for shown, _msg, _rank in doctor._clean(
        ["Loading  10%\rLoading  50%\rLoading 100%", "\r\r", "plain"], ())]
    assert got == ["Loading 100%", "", "plain"]


def test_bytes_that_are_not_utf8_are_read_as_replacements():
    import io

    got = list(doctor._text_stream(io.BytesIO(b"ok\n\xff\xfe bad\nend\n")))
    assert got == ["ok", "\ufffd\ufffd bad", "end"]
