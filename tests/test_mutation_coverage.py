"""The mutation record covers the whole package (bench/mutation.py), checked without running
mutmut: every module of imgbuild/ is in the plan, the tests a module gets are derived from
what executes it, explanations that match no survivor are reported, and the commit a run
measures is the one it started on."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from bench import mutation

ROOT = Path(__file__).resolve().parent.parent


def test_every_module_of_the_package_is_planned_or_skipped_with_why():
    on_disk = {p.relative_to(ROOT).as_posix() for p in (ROOT / "imgbuild").rglob("*.py")}
    planned, skipped = mutation.package_modules(mutation.tree_sources(ROOT))
    assert set(planned) | set(skipped) == on_disk
    assert not set(planned) & set(skipped)
    # Only a module without a function is skipped: it has no mutant to run.
    for path, why in skipped.items():
        assert "no function" in why
        assert "def " not in (ROOT / path).read_text(), path
    # The plan is the package, not a list somebody keeps: no such list is left to forget.
    assert not hasattr(mutation, "MODULES")
    assert len(planned) > 100


def test_a_module_added_tomorrow_is_planned_and_an_empty_init_is_skipped():
    planned, skipped = mutation.package_modules({
        "imgbuild/__init__.py": '"""The package."""\nfrom .x import y  # noqa\n',
        "imgbuild/tomorrow.py": "X = 1\n\nclass C:\n    def m(self):\n        return X\n",
        "imgbuild/sub/new.py": "async def f():\n    return 2\n",
    })
    assert planned == ["imgbuild/sub/new.py", "imgbuild/tomorrow.py"]
    assert list(skipped) == ["imgbuild/__init__.py"]
    # and the plan gives it the tests that reach it, or none (recorded as such, not dropped)
    plan = mutation.test_plan(planned, {"imgbuild/tomorrow.py": ["tests/t.py::test_c"]}, {})
    assert plan == {"imgbuild/sub/new.py": [], "imgbuild/tomorrow.py": ["tests/t.py::test_c"]}


def test_the_tests_of_a_module_are_those_that_run_a_line_of_its_functions():
    src = ("import os\n"                      # 1: import time, whoever imports
           "def f(x):\n"                      # 2: the def line, import time too
           "    return x + 1\n"               # 3
           "class C:\n"                       # 4
           "    def m(self):\n"               # 5
           "        return 2\n")              # 6
    assert mutation.function_lines(src) == {3, 6}
    contexts = {"imgbuild/a.py": {1: ["", "tests/t.py::test_imports|run"],
                                  2: ["tests/t.py::test_imports|run"],
                                  3: ["tests/t.py::test_f[1]|run", "tests/t.py::test_f[2]|run"],
                                  6: ["tests/u.py::TestC::test_m|setup"]},
                "imgbuild/gone.py": {3: ["tests/t.py::test_x|run"]}}
    got = mutation.tests_by_module(contexts, {"imgbuild/a.py": mutation.function_lines(src)})
    assert got == {"imgbuild/a.py": ["tests/t.py::test_f", "tests/u.py::TestC::test_m"]}
    assert mutation.test_of_context("") is None
    assert mutation.test_of_context("tests/t.py::test_f[a|b]|run") == "tests/t.py::test_f"


def test_explicit_additions_join_the_derived_tests():
    plan = mutation.test_plan(["imgbuild/image/registry.py"],
                              {"imgbuild/image/registry.py": ["tests/t.py::test_a"]})
    assert plan["imgbuild/image/registry.py"] == ["tests/t.py::test_a",
                                                  "tests/test_registry_client.py"]
    for module, tests in mutation.EXTRA_TESTS.items():
        assert (ROOT / module).exists(), module
        assert all((ROOT / t).exists() for t in tests), tests


def test_a_map_of_another_commit_falls_back_to_the_files_that_still_exist():
    tests = ["tests/a.py::test_x", "tests/a.py::test_y", "tests/gone.py::test_z"]
    assert mutation.file_level(tests, lambda f: f != "tests/gone.py") == ["tests/a.py"]


def test_order_cheapest_first_unmeasured_first_and_the_last_globs_last():
    plan = {"imgbuild/a.py": ["t"], "imgbuild/b.py": ["t"], "imgbuild/image/c.py": ["t"],
            "imgbuild/d.py": ["t"]}
    cost = {"imgbuild/a.py": 50.0, "imgbuild/b.py": 5.0, "imgbuild/image/c.py": 1.0,
            "imgbuild/d.py": 2.0}
    assert mutation.order_plan(plan, cost, measured={"imgbuild/d.py"},
                               last=["imgbuild/image/*"]) == [
        "imgbuild/b.py", "imgbuild/a.py", "imgbuild/d.py", "imgbuild/image/c.py"]


EXPLAINED_YAML = """
imgbuild/a.py:
  - function: f
    diff: ['-    return x + 1', '+    return x - 1']
    kind: harmless
    why: a fake that still survives
  - function: f
    diff: ['-    return x + 1', '+    return x + 2']
    kind: equivalent
    why: the mutant this named was killed since
imgbuild/b.py:
  - function: C.m
    diff: ['-        return 2', '+        return 3']
    kind: equivalent
    why: its module was stopped partway, so nothing can be said
imgbuild/never.py:
  - function: g
    diff: ['-    pass', '+    ...']
    kind: equivalent
    why: no record of the module at all
"""


def _record() -> dict:
    return {
        "imgbuild/a.py": {"commit": "abc1234", "counts": {"killed": 8, "survived": 2},
                          "survivors": [
                              {"mutant": "imgbuild.a.x_f__mutmut_3",
                               "diff": ["-    return x + 1", "+    return x   -   1"]},
                              {"mutant": "imgbuild.a.x_f__mutmut_9",
                               "diff": ["-    return x + 1", "+    return None"]}]},
        "imgbuild/b.py": {"commit": "abc1234", "partial": True,
                          "counts": {"killed": 1, "not checked": 9}, "survivors": []},
    }


def test_a_stale_explanation_is_reported():
    explained = mutation.load_explained(text=EXPLAINED_YAML)
    stale = mutation.stale_explanations(_record(), explained)
    assert [(s["module"], s["diff"][1]) for s in stale] == [
        ("imgbuild/a.py", "+ return x + 2"), ("imgbuild/never.py", "+ ...")]
    assert "abc1234" in stale[0]["why"]
    assert "no record" in stale[1]["why"]
    # A sampled or partial record cannot tell: the mutant explained may not have run.
    for how in ({"sample": 5}, {"partial": True}):
        rec = _record()
        rec["imgbuild/a.py"] |= how
        assert [s["module"] for s in mutation.stale_explanations(rec, explained)] == [
            "imgbuild/never.py"]


def test_the_table_judges_each_module_against_the_target():
    rec = _record()
    explained = mutation.load_explained(text=EXPLAINED_YAML)
    assert mutation.explain("imgbuild/a.py", rec["imgbuild/a.py"]["survivors"], explained) == 1
    row = mutation.module_row("imgbuild/a.py", rec["imgbuild/a.py"], "abc1234", stale=1)
    assert {k: row[k] for k in (
        "mutants", "killed", "survived", "harmless", "equivalent", "unexplained", "timeouts",
        "score", "below_target", "this_run", "stale_explanations")} == {
        "mutants": 10, "killed": 8, "survived": 2, "harmless": 1, "equivalent": 0,
        "unexplained": 1, "timeouts": 0, "score": 0.8, "below_target": True, "this_run": True,
        "stale_explanations": 1}
    ok = mutation.module_row("imgbuild/c.py", {"commit": "old0000", "counts": {
        "killed": 17, "timeout": 1, "survived": 2, "no tests": 40}, "survivors": []}, "abc1234")
    assert (ok["score"], ok["below_target"], ok["this_run"], ok["no_tests"]) == (
        0.9, False, False, 40)
    # A survivor judged equivalent is no test's to kill: out of the score, not of the raw one;
    # a harmless one stays a survivor.
    eq = mutation.module_row("imgbuild/e.py", {"commit": "abc1234", "counts": {
        "killed": 9, "survived": 2}, "survivors": [
            {"explained": {"kind": "equivalent"}}, {"explained": {"kind": "harmless"}}]},
        "abc1234")
    assert (eq["score"], eq["raw_score"], eq["below_target"], eq["judged"], eq["equivalent"]) == (
        0.9, 0.818, False, 11, 1)
    assert mutation.score({"survived": 1}, 1) is None  # nothing left to judge
    assert mutation.module_row("imgbuild/d.py", None, "abc1234")["status"] == "not measured"
    text = mutation.format_table([row, ok])
    assert "BELOW" in text.splitlines()[1] and "BELOW" not in text.splitlines()[2]


def _git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@t", *args],
                          cwd=repo, capture_output=True, text=True, check=True).stdout.strip()


def test_the_commit_is_the_one_the_run_started_on_however_head_moves(tmp_path):
    repo = tmp_path / "repo"
    repo.mkdir()
    _git(repo, "init", "-q")
    (repo / "f").write_text("1")
    _git(repo, "add", "f")
    _git(repo, "commit", "-qm", "one")
    start = mutation.start_state(repo)
    first = _git(repo, "rev-parse", "HEAD")
    assert (start["commit"], start["short"], start["dirty"]) == (first, first[:7], False)

    seen = []
    doc = {"modules": {"imgbuild/old.py": {"commit": "0ld0000", "counts": {"killed": 1}}}}

    def run_one(group, tests, commit, left):
        seen.append(commit)
        (repo / "f").write_text(group[0])  # somebody commits while the run goes on
        _git(repo, "commit", "-qam", group[0])
        return {m: {"counts": {"killed": 1}, "score": 1.0, "survivors": [], "tests": tests}
                for m in group}

    plan = {"imgbuild/a.py": ["t"], "imgbuild/b.py": ["u"], "imgbuild/c.py": []}
    summary = mutation.run_plan(doc, list(plan), plan, start, run_one, {})
    assert seen == [first, first]
    assert _git(repo, "rev-parse", "HEAD") != first
    assert {m: r["commit"] for m, r in doc["modules"].items()} == {
        "imgbuild/old.py": "0ld0000", "imgbuild/a.py": first[:7], "imgbuild/b.py": first[:7],
        "imgbuild/c.py": first[:7]}
    assert doc["modules"]["imgbuild/c.py"]["status"] == "no test reaches it"
    assert summary == {"ran": ["imgbuild/a.py", "imgbuild/b.py"],
                       "no_test_reaches": ["imgbuild/c.py"], "not_run": []}
    (repo / "g").write_text("uncommitted")
    assert mutation.start_state(repo)["dirty"] is True


def test_main_reads_the_commit_before_any_work(monkeypatch):
    class Read(Exception):
        pass

    def start_state():
        raise Read

    def no_work(*a, **k):
        raise AssertionError("work before the commit was read")

    monkeypatch.setattr(mutation, "start_state", start_state)
    for name in ("load_explained", "committed_sources", "build_imports_map",
                 "build_coverage_map", "run_plan", "run_group"):
        monkeypatch.setattr(mutation, name, no_work)
    monkeypatch.setattr("sys.argv", ["mutation.py"])
    with pytest.raises(Read):
        mutation.main()


def test_the_budget_stops_the_run_between_modules_and_the_rest_keep_their_record():
    now = [0.0]
    doc = {"modules": {"imgbuild/c.py": {"commit": "0ld0000", "counts": {"killed": 3}}}}
    lefts = []

    def run_one(group, tests, commit, left):
        lefts.append(left)
        now[0] += 40 * 60  # each module takes 40 minutes
        return {m: {"counts": {"killed": 1}, "survivors": [], "tests": tests} for m in group}

    plan = {m: [m] for m in ("imgbuild/a.py", "imgbuild/b.py", "imgbuild/c.py")}
    start = {"commit": "f" * 40, "short": "fffffff"}
    summary = mutation.run_plan(doc, list(plan), plan, start, run_one, {},
                                budget_s=60 * 60, clock=lambda: now[0])
    assert summary["ran"] == ["imgbuild/a.py", "imgbuild/b.py"]
    assert summary["not_run"] == ["imgbuild/c.py"]
    assert lefts == [3600, 1200]  # a module still running at the budget is stopped there
    assert doc["modules"]["imgbuild/c.py"] == {"commit": "0ld0000", "counts": {"killed": 3}}


def test_the_import_map_follows_imports_through_the_package():
    sources = {
        "imgbuild/__init__.py": "",
        "imgbuild/a.py": "from .b import f\n\ndef g():\n    return f()\n",
        "imgbuild/b.py": "def f():\n    return 1\n",
        "imgbuild/c.py": "def h():\n    return 2\n",
        "imgbuild/cli/main.py": "import importlib\n\ndef main(n):\n"
                                "    return importlib.import_module(f'{__package__}.commands.{n}')\n",
        "imgbuild/cli/commands/run.py": "def run():\n    return 3\n",
    }
    tests = {"tests/test_a.py": "from imgbuild.a import g\n",
             "tests/test_c.py": "import pytest\n\ndef test(monkeypatch):\n"
                                "    monkeypatch.setattr('imgbuild.c.h', None)\n",
             "tests/test_main.py": "from imgbuild.cli import main\n",
             "tests/test_none.py": "import os\n"}
    assert mutation.tests_map_from_imports(sources, tests) == {
        "imgbuild/a.py": ["tests/test_a.py"], "imgbuild/b.py": ["tests/test_a.py"],
        "imgbuild/c.py": ["tests/test_c.py"], "imgbuild/cli/main.py": ["tests/test_main.py"],
        "imgbuild/cli/commands/run.py": ["tests/test_main.py"],
        "imgbuild/__init__.py": ["tests/test_main.py"]}  # imgbuild.cli imports the package


def test_a_failed_run_keeps_the_earlier_measure():
    doc = {"modules": {"imgbuild/a.py": {"commit": "0ld0000", "counts": {"killed": 3},
                                         "score": 1.0, "survivors": []}}}
    start = {"commit": "f" * 40, "short": "fffffff"}
    kept = mutation.record_module(doc, "imgbuild/a.py",
                                  {"status": "error", "error": "boom", "seconds": 3.0}, start, {})
    assert kept["commit"] == "0ld0000" and kept["counts"] == {"killed": 3}
    assert kept["last_attempt"] == {"status": "error", "error": "boom", "seconds": 3.0,
                                    "commit": "fffffff"}
    # A run stopped at its budget before it judged any of the module's mutants: the same.
    kept = mutation.record_module(doc, "imgbuild/a.py", {"counts": {"not checked": 9},
                                                         "partial": True, "seconds": 5.0},
                                  start, {})
    assert kept["counts"] == {"killed": 3} and kept["last_attempt"] == {
        "status": "stopped before any of its mutants was judged", "error": None,
        "seconds": 5.0, "commit": "fffffff"}
    # One that judged some replaces it.
    got = mutation.record_module(doc, "imgbuild/a.py", {"counts": {"killed": 1, "not checked": 8},
                                                        "survivors": []}, start, {})
    assert got["counts"] == {"killed": 1, "not checked": 8} and got["commit"] == "fffffff"


def test_modules_with_the_same_tests_run_together_and_their_mutants_are_told_apart():
    plan = {"imgbuild/a.py": ["t1"], "imgbuild/b.py": ["t1"], "imgbuild/c.py": ["t2"],
            "imgbuild/d.py": [], "imgbuild/e.py": [], "imgbuild/f.py": ["t1"],
            "imgbuild/image/registry.py": ["t1"]}
    order = mutation.order_plan(plan, {m: 1.0 for m in plan}, set())
    assert mutation.group_plan(order, plan) == [
        ["imgbuild/d.py"], ["imgbuild/e.py"],
        ["imgbuild/a.py", "imgbuild/b.py", "imgbuild/f.py"],
        ["imgbuild/image/registry.py"],  # its tests run with the docker marker admitted
        ["imgbuild/c.py"]]
    assert [len(g) for g in mutation.group_plan(["imgbuild/a.py", "imgbuild/b.py"], plan,
                                                cap=1)] == [1, 1]
    # --together: one run per marker set, each with the union of its modules' tests
    # (a payload module apart: the golden comparisons are left out beside it, not beside others)
    plan |= {"imgbuild/payload/p.py": ["t3"]}
    order2, plan2 = mutation.together(order + ["imgbuild/payload/p.py"], plan)
    assert mutation.group_plan(order2, plan2, cap=len(order2)) == [
        ["imgbuild/a.py", "imgbuild/b.py", "imgbuild/f.py", "imgbuild/c.py"],
        ["imgbuild/payload/p.py"], ["imgbuild/image/registry.py"], ["imgbuild/d.py"],
        ["imgbuild/e.py"]]
    assert plan2["imgbuild/a.py"] == plan2["imgbuild/c.py"] == ["t1", "t2"]
    assert plan2["imgbuild/image/registry.py"] == ["t1"] and plan2["imgbuild/d.py"] == []
    assert "test_golden_tags_from_the_dev_venv" in mutation.k_for(["imgbuild/payload/p.py"])
    assert "test_golden_tags_from_the_dev_venv" not in mutation.k_for(order2[:4])
    assert "not plain_install" in mutation.k_for(order2[:4])
    group = ["imgbuild/cli/views/__init__.py", "imgbuild/cli/views/fit.py"]
    assert mutation.module_of_mutant("imgbuild.cli.views.fit.x_fit_table__mutmut_17",
                                     group) == "imgbuild/cli/views/fit.py"
    assert mutation.module_of_mutant("imgbuild.cli.views.xǁTableǁrow__mutmut_2",
                                     group) == "imgbuild/cli/views/__init__.py"


def test_the_import_map_follows_the_helpers_a_test_imports():
    # golden.run_cli imports imgbuild.cli.main inside a function; a test that calls it runs
    # main and every command, so it is among their tests though it imports neither.
    sources = {"imgbuild/__init__.py": "", "imgbuild/cli/__init__.py": "",
               "imgbuild/cli/main.py": "def main():\n    return 1\n",
               "imgbuild/a.py": "def f():\n    return 2\n",
               "imgbuild/b.py": "def g():\n    return 3\n"}
    helpers = {
        "tests/__init__.py": "",
        "tests/golden/__init__.py": "def run_cli():\n    from imgbuild.cli.main import main\n"
                                    "    return main()\n",
        "tests/conftest.py": "from tests.shared import h\n",
        "tests/shared.py": "from imgbuild.a import f\n\ndef h():\n    return f()\n",
        "tests/unused.py": "from imgbuild.b import g\n",
    }
    tests = {"tests/test_pages.py": "from . import golden\n",
             "tests/test_other.py": "from .conftest import h\n",
             "tests/test_reuses.py": "from .test_pages import golden\n"}
    got = mutation.tests_map_from_imports(sources, tests, helpers=helpers | tests)
    assert got["imgbuild/cli/main.py"] == ["tests/test_pages.py", "tests/test_reuses.py"]
    assert got["imgbuild/a.py"] == ["tests/test_other.py"]  # through conftest, then shared
    assert "imgbuild/b.py" not in got  # a helper no test imports reaches nothing
    # without the helpers, only what each test file itself imports
    assert "imgbuild/cli/main.py" not in mutation.tests_map_from_imports(sources, tests)


def test_the_whole_records_score_leaves_out_the_equivalent_survivors_and_says_how_many():
    explained = mutation.load_explained(text=EXPLAINED_YAML)
    doc = {"modules": {
        "imgbuild/a.py": {"commit": "abc1234", "counts": {"killed": 8, "survived": 2},
                          "score": 0.8, "survivors": [
                              {"mutant": "imgbuild.a.x_f__mutmut_3",
                               "diff": ["-    return x + 1", "+    return x + 2"]},
                              {"mutant": "imgbuild.a.x_f__mutmut_9",
                               "diff": ["-    return x + 1", "+    return None"]}]},
        "imgbuild/b.py": {"commit": "abc1234", "counts": {"killed": 10}, "survivors": []},
        # stopped at the budget before any of its mutants was checked: no measure yet
        "imgbuild/s.py": {"commit": "abc1234", "partial": True,
                          "counts": {"not checked": 40}, "survivors": []}}}
    mutation.finish(doc, ["imgbuild/a.py", "imgbuild/b.py", "imgbuild/c.py", "imgbuild/s.py"],
                    {}, {"short": "abc1234"}, explained)
    # a.py: its `+ 2` survivor is judged equivalent, the other not judged
    assert doc["modules"]["imgbuild/a.py"]["score"] == 0.889  # 8 of 9
    assert doc["total"] == {"modules": 4, "measured": 2, "killed": 18, "judged": 20,
                            "equivalent": 1, "score": 0.947, "raw_score": 0.9}
    assert doc["below_target"] == ["imgbuild/a.py"]
    assert doc["not_measured"] == ["imgbuild/c.py", "imgbuild/s.py"]


def test_a_sample_keeps_each_functions_first_mutant_and_one_in_k_of_the_rest():
    import fnmatch

    names = [f"imgbuild.a.x_f__mutmut_{n}" for n in range(1, 41)] + [
        "imgbuild.a.xǁCǁm__mutmut_1", "imgbuild.a.xǁCǁm__mutmut_2"]
    for k in (2, 5, 10):
        globs = mutation.sample_globs(k)
        picked = [n for n in names if any(fnmatch.fnmatch(n, g) for g in globs)]
        # The method with two mutants keeps its first; f keeps 40 / k, spread over its body.
        assert "imgbuild.a.xǁCǁm__mutmut_1" in picked
        assert "imgbuild.a.xǁCǁm__mutmut_2" not in picked
        f = [int(n.rsplit("_", 1)[1]) for n in picked if ".x_f__" in n]
        assert len(f) == 40 // k and f[0] == 1 and f[-1] > 40 - k
    assert mutation.sample_globs(1) == []
    with pytest.raises(SystemExit, match="--sample takes 1, 2, 5, 10; not 3"):
        mutation.sample_globs(3)


def test_a_sampled_module_says_so_in_its_row():
    rec = {"counts": {"killed": 9, "survived": 1, "not checked": 40}, "sample": 5,
           "commit": "abc1234", "seconds": 1.0}
    row = mutation.module_row("imgbuild/a.py", rec, "abc1234")
    assert row["sample"] == 5 and row["judged"] == 10 and row["score"] == 0.9
    assert "(1 in 5)" in mutation.format_table([row])
    narrow = mutation.module_row("imgbuild/a.py", rec | {"only_tests": ["tests/test_a*.py"]},
                                 "abc1234")
    assert narrow["only_tests"] == ["tests/test_a*.py"] and row["only_tests"] == []
    assert "(tests: tests/test_a*.py)" in mutation.format_table([narrow])
    assert mutation.module_row("imgbuild/a.py", rec | {"sample": 1}, "abc1234")["sample"] == 1


def test_only_tests_narrows_each_modules_derived_tests_to_the_files_matching():
    plan = {"imgbuild/catalog/targets.py": ["tests/test_spec.py", "tests/test_docker.py",
                                            "tests/test_decisions_catalog.py"],
            "imgbuild/plan/key.py": ["tests/test_content_key.py"]}
    assert mutation.narrowed(plan, ["tests/test_decisions_*.py", "tests/test_spec.py"]) == {
        "imgbuild/catalog/targets.py": ["tests/test_spec.py", "tests/test_decisions_catalog.py"],
        "imgbuild/plan/key.py": []}
    assert mutation.narrowed(plan, ["*"]) == plan


def test_the_explanations_file_reads_and_names_only_modules_of_the_package():
    explained = mutation.load_explained()  # a malformed file stops a run here
    modules = set(mutation.package_modules(mutation.tree_sources())[0])
    assert explained and set(explained) <= modules
    for module, entries in explained.items():
        for (function, diff), e in entries.items():
            assert function and diff and e["kind"] in ("equivalent", "harmless"), (module, e)
            assert e["why"].strip(), (module, function)
