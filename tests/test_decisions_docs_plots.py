"""The performance page (docsgen.plots and its charts), drawn from result files of each kind
the benchmarks write, and of kinds it must skip: which file gives which chart, which bars and
in what order, the words under each, and what each chart shows (read from the matplotlib
figure itself: its title, labels, bar values and the 20-minute line). The page is generated
when the site is built, so nothing else checks its words.

tests/test_docs.py builds the site with the committed bench/results/ and opens it in Chromium."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from imgbuild import docsgen

XEON = {"cpu": "Xeon", "cores": 2}
RESULTS = {
    "wire-tiny-cpu.json": {
        "target": "tiny-cpu", "machine": XEON | {"date": "2026-12-01T10:00:00"},
        "engine_push": {"seconds": 10.0}, "imgbuild_push_gzip": {"seconds": 5.0},
        "imgbuild_push_zstd": {"seconds": 4.0}, "engine_pull_engine_gzip_s": 3.0,
        "engine_pull_engine_gzip_unpigz_s": 2.5, "engine_pull_imgbuild_gzip_s": 2.7,
        "containerd_pull_imgbuild_gzip_s": 2.2, "containerd_pull_imgbuild_zstd_s": 2},
    "wire-untargeted.json": {"engine_push": {"seconds": 1.0},
                             "engine_pull_imgbuild_gzip_s": "n/a"},  # no number: no bar
    "pull-untargeted.json": {"layouts": {"today": {"push_s": 1.0}}},
    "wire-broken.json": "not json",
    "wire-list.json": [1],
    "wire-noengine.json": {"target": "x"},
    "pull-t.json": {
        "target": "t", "machine": XEON | {"date": "2026-12-02"},
        "layouts": {"today": {"push_s": 1.0, "cold_pull_median_s": 2.0},
                    "split": {"push_s": 3.0}}, "rounds": 3, "kept": "today"},
    "pull-empty.json": {"layouts": {"x": {}}},
    "pull-nolayouts.json": {"layouts": []},
    "bump-t.json": {
        "target": "t", "engine_pin": "sglang 0.5.23 -> 0.5.24",
        "machine": XEON | {"date": "2026-12-03"}, "today": {"seconds": 100.0},
        "imgbuild_no_splice": {"seconds": 50.0},
        "imgbuild": {"seconds": 10.0, "action": "splice", "sent_bytes": 123_000_000},
        "second_bump": {"seconds": 8.0}},
    "bump-u.json": {"today": {"seconds": 9.0}, "imgbuild": {"seconds": 3.0}},
    "bump-half.json": {"today": {"seconds": 9.0}},
    "size-tiny-cpu.json": {
        "machine": XEON | {"date": "2026-12-04"},
        "before_rules": {"by_kind": {"python": 2e9, "cuda": 1e9}},
        "with_rules": {"by_kind": {"python": 1e9}},
        "size": {"by_kind": {"python": 1.5e9, "docs": 1e8}}, "content_tag": "reg/r:tiny-cpu-abc"},
    "size-empty.json": {"size": {"by_kind": {}}},
    "test-suite.json": {
        "later": {"wall_seconds": 600, "machine": {"date": "2026-12-02", "cpu": "B", "cores": 2}},
        "earlier": {"wall_seconds": 1500,
                    "machine": {"date": "2026-12-01T09:00:00", "cpu": "A", "cores": 4}},
        "note": "not a run"},
}

PAGE = """## Push and pull against the Docker Engine

### tiny-cpu: push and cold pull

Xeon, 2 cores, 2026-12-01. One run, loopback registry. Lower is faster.

![tiny-cpu: push and cold pull](wire-tiny-cpu.svg)

Source: `bench/results/wire-tiny-cpu.json`.

### wire-untargeted: push and cold pull

a machine, ? cores, date not recorded. One run, loopback registry. Lower is faster.

![wire-untargeted: push and cold pull](wire-untargeted.svg)

Source: `bench/results/wire-untargeted.json`.

### t: layer layouts

Xeon, 2 cores, 2026-12-02. Today's layers against `split_heavy_layer: true`; the pull is the \
median of 3 rounds. Kept: today.

![t: layer layouts](pull-t.svg)

Source: `bench/results/pull-t.json`.

### pull-untargeted: layer layouts

a machine, ? cores, date not recorded. Today's layers against `split_heavy_layer: true`; the \
pull is the median of ? rounds. Kept: ?.

![pull-untargeted: layer layouts](pull-untargeted.svg)

Source: `bench/results/pull-untargeted.json`.

## An engine bump against a rebuild

### t: engine bump

Xeon, 2 cores, 2026-12-03. A fresh runner: the previous image in the registry, nothing local. \
imgbuild sent 123 MB.

![t: engine bump](bump-t.svg)

Source: `bench/results/bump-t.json`.

### bump-u: engine bump

a machine, ? cores, date not recorded. A fresh runner: the previous image in the registry, \
nothing local.

![bump-u: engine bump](bump-u.svg)

Source: `bench/results/bump-u.json`.

## The slim image's bytes by kind

### tiny-cpu: bytes by kind

Xeon, 2 cores, 2026-12-04. `imgbuild size` of the image.

![tiny-cpu: bytes by kind](size-tiny-cpu.svg)

Source: `bench/results/size-tiny-cpu.json`.

## The test suite's time per run

### make test, wall time per run

From A, 4 cores, 2026-12-01 to B, 2 cores, 2026-12-02. Each point is one run of the suite; \
the line is the 20-minute budget.

![make test, wall time per run](test-suite.svg)

Source: `bench/results/test-suite.json`.
"""


@pytest.fixture()
def drawn(tmp_path, monkeypatch):
    """plots() over RESULTS, each chart's arguments and figure recorded."""
    for name, doc in RESULTS.items():
        (tmp_path / name).write_text(doc if isinstance(doc, str) else json.dumps(doc))
    charts: list[tuple] = []
    figures = []
    for fn in ("_barh", "_stacked", "_series"):
        real = getattr(docsgen, fn)
        monkeypatch.setattr(docsgen, fn, lambda *a, _real=real, _fn=fn: (
            charts.append((_fn, *a)) or _real(*a)))
    real_svg = docsgen._svg
    monkeypatch.setattr(docsgen, "_svg", lambda fig: figures.append(fig) or real_svg(fig))
    page, figs = docsgen.plots(tmp_path)
    return page, figs, charts, figures


def test_each_result_file_gives_its_chart_and_its_words(drawn):
    page, figs, _, _ = drawn
    assert page == PAGE
    assert sorted(figs) == ["bump-t.svg", "bump-u.svg", "pull-t.svg", "pull-untargeted.svg",
                            "size-tiny-cpu.svg", "test-suite.svg", "wire-tiny-cpu.svg",
                            "wire-untargeted.svg"]
    assert all(svg.startswith(b"<?xml") and b"<svg" in svg for svg in figs.values())


def test_which_bars_each_chart_gets_in_what_order(drawn):
    _, _, charts, _ = drawn
    by_title = {c[1]: c for c in charts if c[0] != "_series"}
    wire = by_title["tiny-cpu: push and cold pull, seconds"]
    assert wire == ("_barh", "tiny-cpu: push and cold pull, seconds", [
        ("Engine push (gzip)", 10.0), ("imgbuild push (gzip)", 5.0),
        ("imgbuild push (zstd)", 4.0), ("Engine pull, its own gzip", 3.0),
        ("Engine pull, with unpigz", 2.5), ("Engine pull, imgbuild's gzip", 2.7),
        ("containerd pull, gzip", 2.2),
        ("containerd pull, zstd", 2)], "s", "Xeon, 2 cores, 2026-12-01")
    assert by_title[": push and cold pull, seconds"][2] == [("Engine push (gzip)", 1.0)]
    assert by_title[": push and pull by layer layout, seconds"][2] == [
        ("today layers: push", 1.0)]
    assert by_title["t: push and pull by layer layout, seconds"][2:] == (
        [("today layers: push", 1.0), ("today layers: cold pull", 2.0),
         ("split layers: push", 3.0)], "s", "Xeon, 2 cores, 2026-12-02")
    assert by_title["t: sglang 0.5.23 -> 0.5.24, seconds"][2:] == ([
        ("rebuild (no cache, Engine push)", 100.0), ("imgbuild, built whole", 50.0),
        ("imgbuild (splice)", 10.0), ("imgbuild, a second bump", 8.0)], "s",
        "Xeon, 2 cores, 2026-12-03")
    assert by_title[": engine bump, seconds"][2] == [
        ("rebuild (no cache, Engine push)", 9.0), ("imgbuild (bump)", 3.0)]
    assert by_title["tiny-cpu: GB by kind of file"][2:] == (
        [("before prune rules", {"python": 2e9, "cuda": 1e9}),
         ("with prune rules", {"python": 1e9}),
         ("tiny-cpu-abc", {"python": 1.5e9, "docs": 1e8})], "Xeon, 2 cores, 2026-12-04")
    [series] = [c for c in charts if c[0] == "_series"]
    assert [k for k, _ in series[1]] == ["earlier", "later"]  # by date, not by name


def _texts(ax) -> list[str]:
    return [t.get_text() for t in ax.texts]


def test_a_bar_chart_shows_each_value_with_its_unit_first_bar_on_top(drawn):
    _, _, charts, figures = drawn
    i = next(n for n, c in enumerate(charts) if c[0] == "_barh")
    ax = figures[i].axes[0]
    assert ax.get_title(loc="left") == "tiny-cpu: push and cold pull, seconds"
    assert ax.get_xlabel() == "s  (Xeon, 2 cores, 2026-12-01)"
    assert [t.get_text() for t in ax.get_yticklabels()] == [
        "containerd pull, zstd", "containerd pull, gzip", "Engine pull, imgbuild's gzip",
        "Engine pull, with unpigz",
        "Engine pull, its own gzip", "imgbuild push (zstd)", "imgbuild push (gzip)",
        "Engine push (gzip)"]  # drawn bottom up: the first on top
    assert _texts(ax) == [" 2.0 s", " 2.2 s", " 2.7 s", " 2.5 s", " 3.0 s", " 4.0 s",
                          " 5.0 s", " 10.0 s"]
    assert ax.get_xlim() == (0, 12.5)  # room for the longest bar's words


def test_a_stacked_chart_adds_each_kind_and_says_the_total(drawn):
    _, _, charts, figures = drawn
    i = next(n for n, c in enumerate(charts) if c[0] == "_stacked")
    ax = figures[i].axes[0]
    assert ax.get_title(loc="left") == "tiny-cpu: GB by kind of file"
    assert ax.get_xlabel() == "GB  (Xeon, 2 cores, 2026-12-04)"
    assert _texts(ax) == [" 3.00 GB", " 1.00 GB", " 1.60 GB"]
    assert [t.get_text() for t in ax.get_legend().get_texts()] == ["python", "cuda", "docs"]
    assert ax.get_xlim() == pytest.approx((0, 3.6))
    assert ax.yaxis_inverted()  # the first stack on top, as listed
    # a kind a stack does not have takes no room in it
    cuda = ax.containers[1]
    assert [round(b.get_width(), 9) for b in cuda] == [1.0, 0.0, 0.0]


def test_each_chart_grows_with_what_it_shows_and_keeps_its_words_clear(drawn):
    """The figure is taller by the bar (or stack), its title at the left, each value beside
    its bar, the legend under the axes, and the budget a thin dashed line."""
    _, _, charts, figures = drawn
    for (fn, *args), fig in zip(charts, figures, strict=True):
        ax = fig.axes[0]
        assert ax.get_title(loc="left") and not ax.get_title(loc="center"), fn
        w, h = fig.get_size_inches()
        if fn == "_barh":
            assert (w, h) == pytest.approx((8, 0.45 * len(args[1]) + 1.4))
            assert {t.get_va() for t in ax.texts} == {"center"}
        elif fn == "_stacked":
            assert (w, h) == pytest.approx((8, 0.6 * len(args[1]) + 1.8))
            assert {t.get_va() for t in ax.texts} == {"center"}
            anchor = ax.get_legend().get_bbox_to_anchor().transformed(ax.transAxes.inverted())
            assert anchor.y0 < 0  # under the axes, clear of the bars
        else:
            assert (w, h) == pytest.approx((8, 3.2))
            [budget] = [line for line in ax.get_lines() if line.get_marker() != "o"]
            assert (budget.get_linestyle(), budget.get_linewidth()) == ("--", 1)


def test_the_suite_series_shows_minutes_against_the_20_minute_budget(drawn):
    _, _, charts, figures = drawn
    i = next(n for n, c in enumerate(charts) if c[0] == "_series")
    ax = figures[i].axes[0]
    [run] = [line for line in ax.get_lines() if line.get_marker() == "o"]
    assert list(run.get_ydata()) == [25.0, 10.0]
    [budget] = [line for line in ax.get_lines() if line is not run]
    assert list(budget.get_ydata()) == [20, 20]
    assert ax.get_ylabel() == "minutes"
    assert ax.get_title(loc="left") == "make test: wall time per run (minutes)"
    assert ax.get_ylim() == pytest.approx((0, 27.5))
    assert [t.get_text() for t in ax.get_xticklabels()] == ["12-01"]  # every third run
    assert list(run.get_xdata()) == [0, 1]


def test_a_machine_as_the_page_names_it():
    assert docsgen._machine({"cpu": "Xeon", "cores": 2, "date": "2026-12-01T10:00:00"}) == \
        "Xeon, 2 cores, 2026-12-01"
    assert docsgen._machine(None) == "a machine, ? cores, date not recorded"


def test_a_results_directory_with_nothing_drawable_gives_the_headings_only(tmp_path):
    page, figs = docsgen.plots(tmp_path)
    assert figs == {}
    assert [ln for ln in page.splitlines() if ln] == [
        "## Push and pull against the Docker Engine", "## An engine bump against a rebuild",
        "## The slim image's bytes by kind", "## The test suite's time per run"]


def test_the_site_pages_are_generated_from_a_checkout(tmp_path):
    """generate(): each generated page by its path under docs/, the performance page with its
    introduction and its plots, the measurements page where bench/README.md is."""
    root = Path(__file__).resolve().parent.parent
    out = docsgen.generate(root)
    assert {"reference/cli.md", "reference/catalog.md", "reference/failures.md",
            "reference/exit-codes.md", "performance/index.md",
            "performance/measurements.md"} <= set(out)
    assert out["performance/index.md"].startswith(docsgen.PERFORMANCE_INTRO + "\n## Push")
    assert out["performance/measurements.md"] == (root / "bench" / "README.md").read_text()
    assert any(k.startswith("performance/") and k.endswith(".svg") for k in out)
