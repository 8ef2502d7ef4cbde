"""Each command's layering, in this process: a command parses, hands its arguments to its stage,
hands the stage's result to its view with the command's output, and returns the exit code the
result decides. The stage and the view are replaced by recorders here, so nothing is resolved,
built or fetched: what is tested is the command's own glue (pip-tools tests its commands the
same way). The stages themselves are tested on their own; the commands run end to end in
tests/test_installed.py and tests/test_docker.py."""

from __future__ import annotations

import importlib
from dataclasses import dataclass, field

import pytest

from imgbuild.cli.console import Output
from imgbuild.cli.main import main

from .conftest import ROOT

CATALOG = ["--images", str(ROOT / "images"), "--lockfiles", str(ROOT / "lockfiles")]


@dataclass
class Recorder:
    """Stands for a stage or a view: records each call, returns `result`."""

    result: object = None
    calls: list[tuple[tuple, dict]] = field(default_factory=list)

    def __call__(self, *args, **kw):
        self.calls.append((args, kw))
        return self.result


def _replace(monkeypatch, module: str, name: str, result: object = None) -> Recorder:
    rec = Recorder(result)
    monkeypatch.setattr(importlib.import_module(module), name, rec)
    return rec


def _view_got(view: Recorder, result: object) -> Output:
    [(args, kw)] = view.calls
    assert len(args) == 2 and args[1] is result and not kw
    assert isinstance(args[0], Output)
    return args[0]


def test_relock_hands_the_target_and_the_upgrades_to_the_stage_and_its_result_to_the_view(
        monkeypatch):
    result = object()
    stage = _replace(monkeypatch, "imgbuild.cli.commands.relock", "relock", result)
    view = _replace(monkeypatch, "imgbuild.cli.views.ci", "relock")
    assert main(["relock", "tiny-cpu", "--upgrade", "torch", "--upgrade", "numpy==2.1.0",
                 *CATALOG]) == 0
    [(args, kw)] = stage.calls
    assert args[1:] == ("tiny-cpu", ["torch", "numpy==2.1.0"]) and not kw
    _view_got(view, result)


@pytest.mark.parametrize("targets, asked", [([], None), (["tiny-cpu"], ["tiny-cpu"])])
def test_outdated_reports_news_and_news_is_no_failure(monkeypatch, targets, asked):
    result = object()
    stage = _replace(monkeypatch, "imgbuild.cli.commands.outdated", "outdated", result)
    view = _replace(monkeypatch, "imgbuild.cli.views.ci", "outdated_news")
    assert main(["outdated", *targets, *CATALOG]) == 0
    [(_, kw)] = stage.calls
    assert kw == {"targets": asked}  # none named: every target
    _view_got(view, result)


@dataclass
class _LockReport:
    exit_code: int


@pytest.mark.parametrize("code", [0, 1, 4])
def test_lock_returns_the_reports_exit_code_and_shows_progress(monkeypatch, code):
    report = _LockReport(code)
    stage = _replace(monkeypatch, "imgbuild.cli.commands.lock", "lock_targets", report)
    view = _replace(monkeypatch, "imgbuild.cli.views.plan", "lock")
    assert main(["lock", "tiny-cpu", "--check", "--jobs", "3", *CATALOG]) == code
    [(args, kw)] = stage.calls
    assert args[1] == ["tiny-cpu"]
    assert kw["check"] is True and kw["refresh"] is False and kw["jobs"] == 3
    assert hasattr(kw["progress"], "note")  # the command's progress, not None
    _view_got(view, report)


def test_lock_all_names_every_target_of_the_catalog(monkeypatch):
    stage = _replace(monkeypatch, "imgbuild.cli.commands.lock", "lock_targets", _LockReport(0))
    _replace(monkeypatch, "imgbuild.cli.views.plan", "lock")
    assert main(["lock", "--all", *CATALOG]) == 0
    [(args, _)] = stage.calls
    assert set(args[1]) == set(args[0].catalog.targets) and len(args[1]) > 3


@pytest.mark.parametrize("multi", [False, True])
def test_build_shows_an_image_or_an_index_by_what_the_stage_built(monkeypatch, tmp_path, multi):
    from imgbuild.pipeline.build import MultiOutcome

    outcome = object.__new__(MultiOutcome) if multi else object()
    stage = _replace(monkeypatch, "imgbuild.cli.commands.build", "build_target", outcome)
    one = _replace(monkeypatch, "imgbuild.cli.views.image", "build")
    index = _replace(monkeypatch, "imgbuild.cli.views.image", "build_index")
    assert main(["build", "tiny-cpu", "--no-smoke", "--log-dir", str(tmp_path / "logs"),
                 *CATALOG]) == 0
    [(args, kw)] = stage.calls
    opts = args[1]
    assert (opts.target, opts.smoke, opts.push) == ("tiny-cpu", False, False)
    assert opts.log_dir == tmp_path / "logs" and not kw
    assert hasattr(args[2], "note")  # the command's progress, not None
    _view_got(index if multi else one, outcome)
    assert (one if multi else index).calls == []


def test_index_assembles_each_target_against_the_registrys_policy_with_the_key(monkeypatch):
    policy, signer, commit = object(), object(), "abc123"
    plans = _replace(monkeypatch, "imgbuild.cli.commands.index", "make_index_plan", "PLAN")
    done = _replace(monkeypatch, "imgbuild.cli.commands.index", "assemble", "DONE")
    key = _replace(monkeypatch, "imgbuild.cli.commands.index", "signing_key", signer)
    reach = _replace(monkeypatch, "imgbuild.image.registry", "check_reachable")
    git = _replace(monkeypatch, "imgbuild.image.attest", "git_commit", commit)
    view = _replace(monkeypatch, "imgbuild.cli.views.image", "indexes")
    monkeypatch.setattr("imgbuild.catalog.registries.RegistryTable.policy_for",
                        lambda self, name: policy)
    assert main(["index", "tiny-cpu-multi", "--model", "m1", "--sign-key", "k.key",
                 "--registry", "127.0.0.1:5000/acme", *CATALOG]) == 0
    [(args, kw)] = key.calls
    assert args == ("k.key",) and kw == {"push": True, "policy": policy}
    [(args, _)] = reach.calls
    assert args[0].name == "127.0.0.1:5000/acme"
    [(args, _)] = git.calls
    assert args[0] == ROOT / "images"  # the commit of the catalog the images came from
    [(args, kw)] = plans.calls
    assert args[1] == "tiny-cpu-multi"
    assert kw == {"model": "m1", "repository": "127.0.0.1:5000/acme", "resolve": False}
    [(args, kw)] = done.calls
    assert args[0] == "PLAN" and kw["signer"] is signer and kw["policy"] is policy
    assert kw["commit"] == commit and hasattr(kw["progress"], "note")
    [(args, _)] = view.calls
    assert args[1] == ["DONE"]


@pytest.mark.parametrize("fmt", ["github", "json", "bake"])
def test_matrix_writes_one_line_for_github_and_indented_json_otherwise(capsys, fmt):
    import json

    assert main(["matrix", "--format", fmt, *CATALOG]) == 0
    text = capsys.readouterr().out
    doc = json.loads(text)
    if fmt == "github":  # one line, for $GITHUB_OUTPUT: no space after a separator
        assert text == json.dumps(doc, separators=(",", ":")) + "\n"
    else:
        assert text == json.dumps(doc, indent=2) + "\n"
