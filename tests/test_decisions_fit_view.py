"""What `imgbuild fit` / `run` shows of the targets judged for a host (cli/views/fit.py), and
how a user's GPU words become an sm name (catalog/archs.py). Plain data in, text out: the
judging itself is tests/test_fit.py's."""

from __future__ import annotations

import pytest

from imgbuild.catalog.archs import gpu_named, parse_arch
from imgbuild.cli.console import make_output
from imgbuild.cli.views import fit as fit_views
from imgbuild.errors import InputError
from imgbuild.payload.preflight import Gpu, Host
from imgbuild.plan.fit import FitReport, TargetFit, describe_host

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


# -- the host in one line, and the report's document ------------------------------------------

def _gpu(i: int, name: str = "NVIDIA B200", cap: str | None = "10.0",
         mib: int | None = 183359) -> Gpu:
    return Gpu(i, f"GPU-{i}", name, cap, "nvidia-smi", mib, 0)


def test_the_host_in_one_line_groups_like_gpus():
    h = Host(gpus=(_gpu(0), _gpu(1), _gpu(2, "NVIDIA GB10", "12.1", None)), driver="580.65.06",
             cpu_arch="aarch64")
    assert describe_host(h) == ("2x NVIDIA B200 (sm100, 179.1 GiB), 1x NVIDIA GB10 (sm121, "
                                "memory [N/A]), driver 580.65.06, CPU aarch64")
    odd = Host(gpus=(_gpu(0, "Mystery", None),))
    assert describe_host(odd) == ("1x Mystery (capability unknown, 179.1 GiB), driver unknown, "
                                  "CPU unknown (`uname -m` did not answer)")
    assert describe_host(Host(error="nvidia-smi: not found", cpu_arch="x86_64")) == \
        "no NVIDIA GPU visible: nvidia-smi: not found, CPU x86_64"
    assert describe_host(Host(cpu_arch="x86_64")) == \
        "no NVIDIA GPU visible: nvidia-smi lists no device, CPU x86_64"


def test_a_rows_document_carries_every_field():
    r = TargetFit("t", "linux/arm64", "k2.6", True, ("first", "second"), blocked=("disk",),
                  rank=(1, "a"), failed=("x",), candidate=False)
    assert r.to_dict() == {
        "target": "t", "platform": "linux/arm64", "model": "k2.6", "fits": True,
        "ready": False, "reasons": ["first", "second"], "blocked": ["disk"], "failed": ["x"],
        "candidate": False, "rank": [1, "a"], "facts": None, "verdicts": []}
    assert _fit("u").to_dict()["rank"] is None and _fit("u").to_dict()["ready"] is True


def test_the_reports_document_names_the_chosen_row_and_the_refusal():
    host = Host(gpus=(_gpu(0),), driver="580.65.06", cpu_arch="x86_64")
    ok = FitReport(host, "k2.6", (_fit("a", platform="linux/arm64"), _fit("b", fits=False)),
                   others=(_fit("c", fits=False),))
    d = ok.to_dict()
    assert d["ok"] is True and d["model"] == "k2.6" and d["refusal"] is None
    assert (d["chosen"], d["chosen_platform"]) == ("a", "linux/arm64")
    assert d["host"] == "1x NVIDIA B200 (sm100, 179.1 GiB), driver 580.65.06, CPU x86_64"
    assert [x["target"] for x in d["rows"]] == ["a", "b"]
    assert [x["target"] for x in d["others"]] == ["c"]
    none = FitReport(host, None, (_fit("b", fits=False, short=("sm90 code",)),))
    d = none.to_dict()
    assert d["ok"] is False and d["chosen"] is None and d["chosen_platform"] is None
    assert d["refusal"]["message"] == "no target fits this host"
    assert "b: sm90 code" in d["refusal"]["facts"]
