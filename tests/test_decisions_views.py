"""Decision tests for what the command line's views claim (imgbuild/cli/views/): the next steps
`init` prints, the one-line matrix CI reads, a pull's smoke row (passed, failed, forced, none),
the sizes a report rounds. Plain data in, text out: no Engine, no registry."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from imgbuild.cli.console import make_output
from imgbuild.cli.views import ci as ci_views
from imgbuild.cli.views import image as image_views
from imgbuild.cli.views import project as project_views
from imgbuild.pipeline.pull import PullOutcome
from imgbuild.plan.decide import make_plan
from imgbuild.project import ProjectSpec, Written
from imgbuild.workspace import Workspace


def spec(root: Path, *, placeholder: bool = False, size_known: bool = True) -> ProjectSpec:
    return ProjectSpec(root=root, name="my-tiny", extends="tiny-cpu", alias="my-model",
                       model_name="My Model", checkpoint="org/model", placeholder=placeholder,
                       size_gb=1.0, size_known=size_known, tensor_parallel=1,
                       pin_example="six==1.16.0", arch_example="sm100")


# ------------------------------------------------------------------------------------------------
# init's next steps
# ------------------------------------------------------------------------------------------------


def test_init_next_steps_cd_only_when_elsewhere_and_edit_only_a_placeholder(tmp_path):
    here = Written(tmp_path, ("imgbuild.yaml",), spec(tmp_path))
    assert project_views.next_steps(here, tmp_path) == [
        "imgbuild lock my-tiny", "imgbuild plan my-tiny",
        "git add . && git commit (the locks too: CI builds what is committed)"]
    away = Written(tmp_path / "new dir", ("imgbuild.yaml",), spec(tmp_path / "new dir",
                                                                  placeholder=True))
    steps = project_views.next_steps(away, tmp_path)
    assert steps[0] == "cd 'new dir'"  # quoted: pasted into a shell as it is
    assert steps[1] == "edit images/models/my-model.yaml (checkpoint, size_gb)"
    unknown = Written(tmp_path, (), spec(tmp_path, size_known=False))
    assert project_views.next_steps(unknown, tmp_path)[0].startswith("edit images/models/")


# ------------------------------------------------------------------------------------------------
# matrix: what CI reads
# ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("fmt, one_line", [("github", True), ("json", False)])
def test_the_matrix_for_github_is_one_line_and_json_either_way(capsys, fmt, one_line):
    doc = {"jobs": [{"target": "tiny-cpu"}], "include": [1, 2]}
    ci_views.matrix(make_output(False), doc, fmt)
    text = capsys.readouterr().out
    assert json.loads(text) == doc
    assert (text.count("\n") == 1) is one_line
    # --json changes nothing: the matrix is JSON already.
    ci_views.matrix(make_output(True), doc, fmt)
    assert capsys.readouterr().out == text


# ------------------------------------------------------------------------------------------------
# pull: the smoke row never claims more than the registry's report says
# ------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def plan():
    return make_plan(Workspace.open(None, None, None), "tiny-cpu", resolve=False,
                     repository="127.0.0.1:5000/imgbuild")


STAGES = [{"name": "environment", "status": "pass"}, {"name": "checkpoint-cpu",
                                                      "status": "fail"}]


@pytest.mark.parametrize("report, said", [
    (None, "no smoke report stored for this digest: moving tags not set"),
    ({"ok": True, "stages": STAGES[:1]}, "passed; environment pass"),
    ({"ok": False, "stages": STAGES}, "FAILED; environment pass, checkpoint-cpu fail"),
    ({"ok": False, "forced": True, "stages": STAGES},
     "FAILED (tags moved with --force); environment pass, checkpoint-cpu fail"),
])
def test_a_pulls_smoke_row_says_what_the_report_says(capsys, plan, report, said):
    o = PullOutcome(plan=plan, ref=plan.ref(), digest="sha256:" + "a" * 64,
                    registry_digest="sha256:" + "a" * 64, report=report,
                    platform="linux/amd64", platform_why="the target's only platform")
    image_views.pull(make_output(False), o)
    text = " ".join(capsys.readouterr().out.split())
    assert f"smoke {said}" in text
    image_views.pull(make_output(True), o)
    assert json.loads(capsys.readouterr().out)["smoke_report"] == report


@pytest.mark.parametrize("n, said", [(99_999_999, "100.0 MB"), (100_000_000, "0.10 GB"),
                                     (1_234_000_000, "1.23 GB"), (0, "0.0 MB")])
def test_sizes_switch_to_gigabytes_at_a_tenth_of_one(n, said):
    assert image_views._gb(n) == said


# ------------------------------------------------------------------------------------------------
# --version and init's report
# ------------------------------------------------------------------------------------------------


def test_version_names_the_catalog_it_carries_or_says_to_reinstall(capsys):
    info = {"version": "1.2.3", "catalog": {"digest": "sha256:" + "0123456789abcdef" * 4,
                                            "targets": 9, "model_profiles": 4}}
    project_views.version(make_output(False), info)
    assert capsys.readouterr().out == ("imgbuild 1.2.3 (built-in catalog sha256:0123456789abcdef…"
                                       ", 9 targets, 4 model profiles)\n")
    project_views.version(make_output(False), {"version": "1.2.3", "catalog": None})
    assert capsys.readouterr().out == "imgbuild 1.2.3 (no built-in catalog: reinstall imgbuild)\n"
    project_views.version(make_output(True), info)
    assert json.loads(capsys.readouterr().out) == info


def test_init_says_what_it_wrote_and_the_numbered_next_steps(capsys, tmp_path):
    w = Written(tmp_path, ("imgbuild.yaml", "images/my-tiny.yaml"), spec(tmp_path))
    project_views.init(make_output(False), w, tmp_path)
    assert capsys.readouterr().out.splitlines() == [
        f"wrote an imgbuild project in {tmp_path}:", "  imgbuild.yaml", "  images/my-tiny.yaml",
        "next:", "  1. imgbuild lock my-tiny", "  2. imgbuild plan my-tiny",
        "  3. git add . && git commit (the locks too: CI builds what is committed)"]
    project_views.init(make_output(True), w, tmp_path)
    assert json.loads(capsys.readouterr().out) == {
        "root": str(tmp_path), "written": ["imgbuild.yaml", "images/my-tiny.yaml"],
        "target": "my-tiny", "extends": "tiny-cpu", "model": "my-model",
        "checkpoint": "org/model", "placeholder": False,
        "next": project_views.next_steps(w, tmp_path)}


# --- the two layouts every view is made of ----------------------------------------------------

LONG = "sglang-blackwell-k2.6-with-a-long-name"
ROWS = [[LONG, "sm100, sm120", "the engine at 10.0.0.1 took 12 s and a cell long enough to fold"],
        ["tiny-cpu", "cpu", "ok"]]


def _console(width: int, *, terminal: bool, color: bool = False):
    import io

    from rich.console import Console

    return Console(file=io.StringIO(), width=width, force_terminal=terminal, highlight=True,
                   color_system="standard" if color else None)


def test_a_squeezed_terminal_table_keeps_its_first_column_whole():
    from imgbuild.cli.views import table

    c = _console(45, terminal=True)
    table(c, "targets", ["target", "archs", "note"], ROWS)
    body = c.file.getvalue().splitlines()
    assert any(f"│ {LONG} │" in ln for ln in body), body
    # a first column narrower than its header keeps the header whole
    c = _console(45, terminal=True)
    table(c, "t", ["a-long-header", "b"], [["x", "y" * 60]])
    assert "a-long-header" in c.file.getvalue()
    # narrower than the name itself: the cut shows, never a silent crop at the edge
    c = _console(20, terminal=True)
    table(c, "targets", ["target", "archs", "note"], ROWS)
    assert "│ sglang-blackw… │" in c.file.getvalue()


def test_plain_lines_carry_no_colour_on_a_console_that_would_colour_them():
    # Written to a pipe by a console told to colour and highlight (FORCE_COLOR-like set-ups,
    # another program's console): a line that grep or cut reads holds only its text.
    from imgbuild.cli.views import kv, table

    c = _console(200, terminal=False, color=True)
    table(c, "targets (2)", ["target", "archs", "note"], ROWS)
    kv(c, "tiny-cpu: built 3 s ago", [("image", "127.0.0.1:5000/acme:t-1"), ("size", "1.2 GB")])
    out = c.file.getvalue()
    assert "\x1b[" not in out and out.startswith("targets (2)\n")
    assert "size   1.2 GB" in out


def test_a_long_word_in_another_column_folds_whole_on_a_terminal():
    from imgbuild.cli.views import table

    digest = "sha256:" + "0123456789abcdef" * 4
    c = _console(40, terminal=True)
    table(c, "images", ["target", "digest"], [["tiny-cpu", digest]])
    cells = "".join(ln.split("│")[2].strip() for ln in c.file.getvalue().splitlines()
                    if ln.count("│") == 3)
    assert cells == digest  # every character there, over several lines: copied, not guessed
