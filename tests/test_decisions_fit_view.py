"""What `imgbuild fit` / `run` shows of the targets judged for a host (cli/views/fit.py), and
how a user's GPU words become an sm name (catalog/archs.py). Plain data in, text out: the
judging itself is tests/test_fit.py's."""

from __future__ import annotations

import pytest

from imgbuild.catalog.archs import gpu_named, parse_arch
from imgbuild.cli.console import make_output
from imgbuild.cli.views import fit as fit_views
from imgbuild.errors import InputError
from imgbuild.plan.fit import FitReport, TargetFit

from .conftest import checkout_workspace


def _fit(name: str, fits: bool = True, *, platform: str = "linux/amd64",
         reasons: tuple[str, ...] = ("ranked first",), blocked: tuple[str, ...] = (),
         short: tuple[str, ...] = ()) -> TargetFit:
    return TargetFit(name, platform, "k2.6", fits, reasons, blocked=blocked, short=short)


def _report(*rows: TargetFit, model: str | None = "k2.6") -> FitReport:
    return FitReport(host=None, model=model, rows=rows)


# -- fits: yes, busy, no; the chosen one says so ---------------------------------------------

def test_the_verdict_word_of_each_row():
    a, b = _fit("a"), _fit("b")
    busy = _fit("c", blocked=("GPU 0 is in use",))
    no = _fit("d", fits=False)
    rep = _report(a, b, busy, no)
    assert fit_views._verdict(rep, a) == "yes (chosen)"
    assert fit_views._verdict(rep, b) == "yes"  # fits, not chosen
    assert fit_views._verdict(rep, busy) == "busy"
    assert fit_views._verdict(rep, no) == "no"
    first_busy = _fit("e", blocked=("disk",))
    assert fit_views._verdict(_report(first_busy), first_busy) == "busy (chosen)"
    # The chosen row is that very row, not one equal to it.
    twin = _fit("a")
    assert fit_views._verdict(rep, twin) == "yes"


# -- why --------------------------------------------------------------------------------------

def test_why_a_fitting_row_gives_its_ranking_facts_and_the_memory_numbers_in_short():
    r = _fit("a", reasons=("sm100 code, runs natively", "model fits: 600 GB in 8x 180 GB; "
                           "weights only, no KV cache counted", "cpu: not checked (no lscpu)",
                           "driver ok"))
    assert fit_views._why(_report(r), r).splitlines() == [
        "sm100 code, runs natively", "model fits: 600 GB in 8x 180 GB",
        "cpu: not checked (no lscpu)"]
    # The first reason is the summary; it is not said twice even when it matches.
    first = _fit("b", reasons=("model fits: 1 GB; weights only", "model fits: 2 GB"))
    assert fit_views._why(_report(first), first).splitlines() == [
        "model fits: 1 GB; weights only", "model fits: 2 GB"]


def test_why_a_row_that_does_not_fit_is_its_short_facts():
    r = _fit("a", fits=False, reasons=("model fits: no", "arch: sm90 only"),
             short=("sm90 code, none runs on sm100",))
    assert fit_views._why(_report(r), r) == "sm90 code, none runs on sm100"
    long = _fit("b", fits=False, reasons=("arch: sm90 only", "driver too old"))
    assert fit_views._why(_report(long), long) == "arch: sm90 only; driver too old"


def test_why_busy_is_said_once_on_the_chosen_row_and_first():
    host = ("GPU 0 is in use", "disk: 20 GB free")
    chosen = _fit("a", reasons=("best",), blocked=host)
    same = _fit("b", reasons=("second",), blocked=host)
    own = _fit("c", reasons=("third",), blocked=("GPU 1 is in use",))
    rep = _report(chosen, same, own)
    assert fit_views._why(rep, chosen).splitlines() == [
        "busy: GPU 0 is in use", "busy: disk: 20 GB free", "best"]
    assert fit_views._why(rep, same).splitlines() == ["busy: as above", "second"]
    assert fit_views._why(rep, own).splitlines() == ["busy: GPU 1 is in use", "third"]
    # No chosen row (none fits): each says its own.
    no = _fit("d", fits=False, reasons=("x",), blocked=host)
    assert fit_views._why(_report(no), no).splitlines()[0] == "busy: GPU 0 is in use"


# -- the table --------------------------------------------------------------------------------

def test_the_table_names_a_platform_only_where_a_target_has_several(capsys, monkeypatch):
    monkeypatch.setattr(fit_views, "describe_host", lambda host: "8x B200 (sm100)")
    rows = (_fit("multi", platform="linux/amd64"), _fit("multi", fits=False,
                                                         platform="linux/arm64",
                                                         short=("arm64 image",)),
            _fit("one", fits=False, short=("sm90",)))
    fit_views.fit_table(make_output(False), _report(*rows))
    said = capsys.readouterr().out.splitlines()
    assert said[0] == "targets for k2.6 on this host: 8x B200 (sm100)"
    assert said[1].split() == ["target", "fits", "why"]
    assert said[2].split()[:4] == ["multi", "(linux/amd64)", "yes", "(chosen)"]
    assert said[3].split()[:3] == ["multi", "(linux/arm64)", "no"]
    assert said[4].split()[:3] == ["one", "no", "sm90"]
    fit_views.fit_table(make_output(False), _report(_fit("a"), model=None))
    assert capsys.readouterr().out.splitlines()[0] == "targets on this host: 8x B200 (sm100)"


def test_the_table_under_json_is_the_reports_document(capsys, monkeypatch):
    import json

    rep = _report(_fit("a"))
    monkeypatch.setattr(FitReport, "to_dict", lambda self: {"rows": ["a"]})
    fit_views.fit_table(make_output(True), rep)
    assert json.loads(capsys.readouterr().out) == {"rows": ["a"]}


# -- GPU words to sm names --------------------------------------------------------------------

@pytest.fixture(scope="module")
def cat():
    return checkout_workspace().catalog


@pytest.mark.parametrize("text, sm", [
    ("sm100", "sm100"), ("SM_90", "sm90"), ("sm_120", "sm120"), (" sm121 ", "sm121"),
    ("10.0", "sm100"), ("9.0", "sm90"),
    ("B200", "sm100"), ("nvidia b200", "sm100"), ("GeForce RTX 4090", "sm89"),
    ("rtx_4090", "sm89"), ("H100-SXM", "sm90"), ("GB200 NVL72", "sm100"),
])
def test_what_users_type_becomes_an_sm_name(cat, text, sm):
    assert parse_arch(text, cat) == sm


def test_an_unknown_arch_is_refused_with_the_closest_name(cat):
    with pytest.raises(InputError) as e:
        parse_arch("B2000", cat)
    assert e.value.message == "unknown GPU architecture 'B2000'"
    assert e.value.facts == ["give an sm name (sm90, sm100, sm103, sm120, sm121), a compute "
                             "capability (9.0, 10.0, 12.0) or a GPU name from images/gpus.yaml"]
    assert e.value.hint in ("did you mean 'B200'?", "did you mean 'GB200'?")
    with pytest.raises(InputError) as e:
        parse_arch("qqqqqqqq", cat)
    assert e.value.hint == "see images/gpus.yaml"
    # An sm name the catalog does not know is not taken on faith.
    with pytest.raises(InputError):
        parse_arch("sm999", cat)


def test_a_gpu_name_is_matched_whole_after_the_vendor_words(cat):
    assert gpu_named("NVIDIA GeForce RTX 4090", cat).sm == "sm89"
    assert gpu_named("sm100", cat) is None and gpu_named("10.0", cat) is None
    assert gpu_named("GeForce", cat) is None  # the vendor word alone names nothing
