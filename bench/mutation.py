"""Mutation testing of every module of imgbuild/, one module at a time, with mutmut (from
PyPI): each module's mutants run against the tests that reach it, and what survives is
recorded with its diff and judged.

    make mutation                                    # every module, cheapest first
    make mutation MUTATION_ARGS="--budget-min 60"    # stop between modules after an hour
    .venv/bin/python bench/mutation.py imgbuild/plan/key.py ...
    .venv/bin/python bench/mutation.py --explain-only   # re-judge the record, run nothing

The plan is every imgbuild/**/*.py of the commit the run started on, not a chosen list; a
module that defines no function (a package's __init__.py of imports and a docstring,
cli/__main__.py) is skipped and named as skipped: mutmut 3 mutates only inside functions, so
it has no mutant. The commit is read once, before any work (`git rev-parse HEAD`, and whether
the working tree was dirty), and every module runs in a scratch copy of that commit
(git archive), so a run never touches the working tree and a commit made meanwhile does not
leak into half of it; uncommitted edits are not measured.

Which tests a module gets is derived, not chosen (bench/results/mutation-tests-map.json, with
the commit it was made on; `--remap` makes it again), from the tests that need no Docker
Engine, PyPI or gigabytes (`-m "not live and not slow and not docker"`):

- `--map imports` (the default, seconds to make): the test files that import the module,
  directly or through the modules they import (and cli/main.py's commands, imported by name),
  their own or those of the tests/ files they import (tests/golden's run_cli runs cli/main.py);
  a superset of those that run it.
- `--map coverage`: one coverage run of those tests with a context per test, each module ->
  the test functions that execute a line inside one of its functions. Tighter (each mutmut run
  collects less), but the run is the whole suite's (an hour on 2 loaded cores).

Tests that need the Engine are left out (a mutant would cost a build each), except the
explicit additions in EXTRA_TESTS (the registry client's tests are docker-marked, for the
Distribution registries they start, but drive no Engine). mutmut then runs, for each mutant,
only the tests that reached the mutated function; modules with the same tests run in one
mutmut run (one collection, one clean run for all of them). Modules run cheapest test set
first, those never measured before those measured before, and `--last GLOB` ones at the end;
`--budget-min` stops the run between runs (a run still going at the budget is stopped, and
what it measured is recorded as partial), and the modules not run keep their earlier record,
marked with the commit it was measured on.

Results: bench/results/mutation.json: per module its mutants, killed, survivors with their
diffs (explained or not), timeouts, its score (killed + timeouts over the mutants judged, that
is killed + timeouts + survived, less the survivors judged equivalent: no test can tell those
from the code, so none is a test's to kill; `raw_score` beside it counts them as survivors),
whether it is below TARGET, and the table of every module; merged with earlier runs so that a
module run alone keeps the others' record.

A survivor a person has judged is explained in bench/mutation-explained.yaml (by its function
and its diff, which survive renumbering): `equivalent` (no input tells it from the code) or
`harmless` (with why). Each survivor in the record carries its explanation or none, and the
module's `unexplained` count is what is left to judge or to kill. An explanation that matches
no survivor in its module's record is stale (the mutant was killed, or the code changed): the
record lists it under `stale_explanations`, and the run prints it.
"""

from __future__ import annotations

import argparse
import ast
import fnmatch
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

MUTMUT = str(ROOT / ".venv" / "bin" / "mutmut")
PYTHON = str(ROOT / ".venv" / "bin" / "python")
RECORD = ROOT / "bench" / "results" / "mutation.json"
TESTS_MAP = ROOT / "bench" / "results" / "mutation-tests-map.json"
EXPLAINED = ROOT / "bench" / "mutation-explained.yaml"
PACKAGE = "imgbuild"
TARGET = 0.90  # killed over judged, per module
KINDS = ("equivalent", "harmless")
DESELECT = "not live and not slow and not docker"
# Tests the coverage run cannot see, added by hand: the registry client's tests are marked
# docker (they start real Distribution registries, which `-m "not docker"` promises not to),
# but drive no Engine; their modules run them with the docker marker admitted.
EXTRA_TESTS: dict[str, list[str]] = {
    "imgbuild/image/distribution.py": ["tests/test_registry_client.py"],
    "imgbuild/image/registry.py": ["tests/test_registry_client.py"],
}
DESELECT_FOR = {"imgbuild/image/distribution.py": "not live and not slow",
                "imgbuild/image/registry.py": "not live and not slow"}
# Imports the import map cannot read: cli/main.py imports the command it runs by name.
DYNAMIC_IMPORTS: dict[str, str] = {"imgbuild/cli/main.py": "imgbuild/cli/commands/*.py"}
# Tests left out under mutmut: the plain install needs PyPI; the payload's own check that it
# imports only the standard library reads the module mutmut rewrote (which imports mutmut);
# `imgbuild --version` run from another directory imports the venv's editable install (the
# working tree), not the scratch copy, and names its images directory.
# (A subprocess test elsewhere runs the working tree's imgbuild too: it kills no mutant.)
# The tests of the installed wheel are left out too: a wheel built from the mutated copy
# imports mutmut, which a plain install lacks.
NOT_UNDER_MUTMUT = ["plain_install", "test_module_level_imports_are_standard_library_only",
                    "test_version_names_the_built_in_catalog_by_digest",
                    "test_an_installed_imgbuild_writes_the_same_project",
                    "test_the_workflow_steps_run_as_written",
                    "test_the_wheel_carries_the_catalog_and_nothing_of_the_tests",
                    # the workflow's matrix job installs the package built from the copy
                    "test_push_of_one_spec_selects_exactly_that_target",
                    "test_outdated_job_relocks_when_the_index_gains_a_release"]
# Test files left out under mutmut: they check imgbuild as a user installs it (a wheel, a
# plain venv, a fresh directory), which runs the working tree's or a wheel's code, not the
# mutated copy's. tests/test_markers.py checks the test harness's Docker guard, not imgbuild:
# its inner runs start imgbuild only as a subprocess (which kills no mutant), and under mutmut's
# environment that subprocess does not reach the Engine, so its clean run fails.
NOT_UNDER_MUTMUT_FILES = ["tests/test_installed.py", "tests/test_anywhere.py",
                          "tests/test_markers.py"]
# Left out where a payload module is mutated: a content key hashes the payload's files, and
# mutmut rewrites a mutated module's file (every mutant in one trampolined copy), so every
# content tag moves for all of its mutants alike and these comparisons with the reviewed tags
# and pages fail in mutmut's first, unmutated run. They judge keys and pages, not the payload:
# what the payload does is tested by running it (tests/test_decisions_payload.py and others).
PAYLOAD = "imgbuild/payload/"
NOT_WITH_PAYLOAD = ["test_golden_tags_from_the_dev_venv", "test_golden_tags_from_a_plain_install",
                    "test_a_patch_changes_only_the_target_that_applies_it",
                    "test_the_nvidia_cuda_digest_changes_exactly_the_cuda_devel_targets_on_it",
                    "test_the_debian_rootfs_changes_the_slim_targets_and_every_smoke_model",
                    "test_one_lock_line_changes_only_its_target",
                    "test_what_is_not_an_input_changes_nothing",
                    "test_what_a_build_shows_when_it_ends_is_what_was_reviewed",
                    "test_the_emitted_files_are_the_reviewed_ones",
                    "test_the_report_and_its_page_are_the_reviewed_ones",
                    "test_list_and_plan_show_what_they_showed_when_reviewed",
                    "test_the_matrix_documents_are_the_reviewed_ones",
                    "test_a_target_that_extends_its_own_name_reads_as_the_one_it_shadows",
                    # runs the payload with the system's python as another user: the rewritten
                    # file imports mutmut, which that python has not
                    "test_a_uid_without_a_passwd_entry_fails_the_user_check_and_the_run",
                    # read the payload's source for its imports: the rewritten one imports mutmut
                    "test_payload_imports_only_the_standard_library",
                    # tests/test_smokemodel.py runs smoke.py as a script in a subprocess, from
                    # /: the rewritten file kills no mutant, and their first, unmutated run
                    # failed under mutmut (f16f3ec, db148b9). In-process tests of the same
                    # stages are in tests/test_decisions_payload.py.
                    "test_payload_passes_on_the_host",
                    "test_payload_fails_on_a_version_that_differs_from_the_lock",
                    "test_payload_fails_on_a_tampered_checkpoint",
                    "test_payload_fails_on_a_tampered_reference",
                    "test_payload_human_output_and_missing_inputs"]


def k_for(modules: list[str]) -> str:
    """The -k expression of a run over `modules`."""
    left = NOT_UNDER_MUTMUT + (NOT_WITH_PAYLOAD if any(m.startswith(PAYLOAD) for m in modules)
                               else [])
    return " and ".join(f"not {k}" for k in left)
MAP_PYTEST = ["-q", "-p", "no:cacheprovider", "-m", DESELECT, "-k", "not plain_install",
              "--cov=" + PACKAGE, "--cov-context=test", "--cov-report="]
SHOW = ("import json, sys\n"
        "from mutmut.mutation.diff_apply import get_diff_for_mutant\n"
        "print(json.dumps({n: get_diff_for_mutant(n, path=sys.argv[1])\n"
        "                  for n in json.load(sys.stdin)}))\n")
# What mutmut copies into mutants/ beside the package: every top-level entry of the commit
# (git archive), read from the scratch tree, so a new one (docs/ and mkdocs.yml, which
# tests/test_docs.py builds) is not missing there and failing every clean run that reaches it.
NOT_COPIED = {PACKAGE, "pyproject.toml"}  # mutmut lays out the package; the config is read here


def also_copy(tree: Path) -> list[str]:
    return sorted(p.name for p in tree.iterdir() if p.name not in NOT_COPIED)


JUDGED = ("killed", "survived", "timeout")


# --- the start: the commit, read once --------------------------------------------------------

def start_state(root: Path = ROOT, now: Callable[[], datetime] | None = None) -> dict:
    """The commit the run measures and whether the tree had uncommitted edits (not measured),
    read once before any work."""
    def git(*a: str) -> str:
        return subprocess.run(["git", *a], cwd=root, capture_output=True, text=True,
                              check=True).stdout.strip()
    commit = git("rev-parse", "HEAD")
    dirty = [ln for ln in git("status", "--porcelain").splitlines() if ln.strip()]
    return {"commit": commit, "short": commit[:7], "dirty": bool(dirty),
            "dirty_paths": len(dirty),
            "started": (now or (lambda: datetime.now(UTC)))().isoformat(
                timespec="seconds")}


def committed_sources(commit: str, root: Path = ROOT, under: str = PACKAGE) -> dict[str, str]:
    """path -> source of every .py under `under` (imgbuild/**) at `commit`."""
    names = subprocess.run(["git", "ls-tree", "-r", "--name-only", commit, under], cwd=root,
                           capture_output=True, text=True, check=True).stdout.split()
    return {n: subprocess.run(["git", "show", f"{commit}:{n}"], cwd=root, capture_output=True,
                              text=True, check=True).stdout
            for n in names if n.endswith(".py")}


def tree_sources(root: Path = ROOT) -> dict[str, str]:
    """path -> source of every imgbuild/**/*.py in a directory (the working tree)."""
    return {p.relative_to(root).as_posix(): p.read_text(encoding="utf-8")
            for p in sorted((root / PACKAGE).rglob("*.py"))}


# --- the plan: every module, the tests that reach it ------------------------------------------

def _functions(tree: ast.AST) -> list[ast.AST]:
    return [n for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))]


def package_modules(sources: dict[str, str]) -> tuple[list[str], dict[str, str]]:
    """Every module is planned, but one that defines no function, which is skipped with why
    (mutmut 3 mutates only inside functions and methods: such a module has no mutant)."""
    planned, skipped = [], {}
    for path in sorted(sources):
        if not _functions(ast.parse(sources[path])):
            skipped[path] = ("defines no function: mutmut 3 mutates only inside functions, "
                             "so it has no mutant")
        else:
            planned.append(path)
    return planned, skipped


def function_lines(source: str) -> set[int]:
    """The lines inside function bodies (a def's own line runs at import, whoever imports)."""
    lines: set[int] = set()
    for f in _functions(ast.parse(source)):
        lines.update(range(f.body[0].lineno, f.end_lineno + 1))
    return lines


def test_of_context(context: str) -> str | None:
    """A coverage context from pytest-cov (`tests/t.py::C::test_x[p]|run`) -> the test
    function's id (`tests/t.py::C::test_x`); none for the collection's empty context."""
    nodeid = context.split("|", 1)[0]
    if "::" not in nodeid:
        return None
    return nodeid.split("[", 1)[0]


def tests_by_module(contexts_by_line: dict[str, dict[int, list[str]]],
                    lines_by_module: dict[str, set[int]]) -> dict[str, list[str]]:
    """module -> the tests (function ids) whose run executed a line inside its functions."""
    out: dict[str, list[str]] = {}
    for module, by_line in contexts_by_line.items():
        body = lines_by_module.get(module)
        if body is None:
            continue
        tests = {t for line, ctxs in by_line.items() if line in body
                 for t in map(test_of_context, ctxs) if t}
        out[module] = sorted(tests)
    return out


def _dotted(path: str) -> str:
    return path[:-3].replace("/", ".").removesuffix(".__init__")


def imports_of(source: str, dotted: str = "", package: bool = False, root: str = PACKAGE) -> set[str]:
    """The names under `root` a source imports or names (`from imgbuild.a import b` ->
    `imgbuild.a.b`, relative imports resolved from `dotted`, and dotted names in strings, as
    monkeypatch takes)."""
    out: set[str] = set()
    for n in ast.walk(ast.parse(source)):
        if isinstance(n, ast.ImportFrom):
            base = n.module or ""
            if n.level:
                pkg = dotted.split(".") if package else dotted.split(".")[:-1]
                pkg = pkg[:len(pkg) - (n.level - 1)]
                base = ".".join(pkg + ([n.module] if n.module else []))
            if base.split(".")[0] == root:
                out.update(f"{base}.{a.name}" for a in n.names)
        elif isinstance(n, ast.Import):
            out.update(a.name for a in n.names if a.name.split(".")[0] == root)
    out.update(re.findall(rf"\b{root}(?:\.\w+)+", source))
    return out


def _test_helpers(test: str, src: str, local: dict[str, str]) -> set[str]:
    """The files of tests/ that a test file's code runs by importing them, followed through
    each other: tests/golden/__init__.py, conftest.py's helpers, another test file's. An
    imgbuild module that only a helper imports (golden.run_cli imports imgbuild.cli.main)
    is still reached by the test."""
    by_dotted = {_dotted(p): p for p in local}
    seen: set[str] = set()
    todo = [(test, src)]
    while todo:
        path, text = todo.pop()
        for name in imports_of(text, _dotted(path), path.endswith("__init__.py"), root="tests"):
            # `from .conftest import x` names tests.conftest.x: the longest prefix that is a file
            parts = name.split(".")
            q = next((by_dotted[d] for i in range(len(parts), 0, -1)
                      if (d := ".".join(parts[:i])) in by_dotted), None)
            if q is not None and q not in seen and q != test:
                seen.add(q)
                todo.append((q, local[q]))
    return seen


def tests_map_from_imports(sources: dict[str, str], test_sources: dict[str, str],
                           dynamic: dict[str, str] = DYNAMIC_IMPORTS,
                           helpers: dict[str, str] | None = None) -> dict[str, list[str]]:
    """module -> the test files that import it, directly or through the modules they import,
    theirs or the helpers' in tests/ they import (`helpers`: every file of tests/, by path): a
    superset of those that run it, since mutmut keeps, per mutant, the tests that reach it."""
    by_dotted = {_dotted(p): p for p in sources}

    def resolve(name: str) -> str | None:
        parts = name.split(".")
        for i in range(len(parts), 0, -1):
            if ".".join(parts[:i]) in by_dotted:
                return by_dotted[".".join(parts[:i])]
        return None

    graph = {p: {r for r in map(resolve, imports_of(src, _dotted(p), p.endswith("__init__.py")))
                 if r and r != p} for p, src in sources.items()}
    for p, glob in dynamic.items():
        graph.get(p, set()).update(q for q in sources if fnmatch.fnmatch(q, glob) and q != p)
    out: dict[str, set[str]] = {}
    local = {**(helpers or {}), **test_sources}
    for test, src in test_sources.items():
        names = imports_of(src).union(*(imports_of(local[h]) for h in _test_helpers(test, src, local)))
        todo = [r for r in map(resolve, names) if r]
        seen: set[str] = set()
        while todo:
            p = todo.pop()
            if p not in seen:
                seen.add(p)
                todo.extend(graph.get(p, ()))
        for p in seen:
            out.setdefault(p, set()).add(test)
    return {p: sorted(t) for p, t in sorted(out.items())}


def test_plan(modules: list[str], tests_map: dict[str, list[str]],
              extras: dict[str, list[str]] = EXTRA_TESTS) -> dict[str, list[str]]:
    """module -> its tests: the derived ones, and the explicit additions (less the files
    left out under mutmut)."""
    return {m: sorted(t for t in set(tests_map.get(m, [])) | set(extras.get(m, []))
                      if t.split("::", 1)[0] not in NOT_UNDER_MUTMUT_FILES) for m in modules}


def file_level(tests: list[str], exists: Callable[[str], bool]) -> list[str]:
    """Test ids -> their files that still exist (a map made on another commit may name tests
    that have moved; a file is the selection that survives that)."""
    return sorted({t.split("::", 1)[0] for t in tests if exists(t.split("::", 1)[0])})


def order_plan(plan: dict[str, list[str]], cost: dict[str, float], measured: set[str],
               last: list[str] = ()) -> list[str]:
    """Cheapest first; those never measured before those with a record; `last` globs last;
    modules with the same tests side by side (they run together)."""
    def key(m: str) -> tuple:
        return (any(fnmatch.fnmatch(m, g) for g in last), m in measured,
                cost.get(m, float(len(plan[m]))), plan[m], m)
    return sorted(plan, key=key)


# --- judging: explanations, stale ones, the table ---------------------------------------------

def function_of(mutant: str) -> str:
    """`imgbuild.x.y.x_name__mutmut_12` -> `name`; methods (`xǁClassǁname`) -> `Class.name`."""
    last = re.sub(r"__mutmut_\d+$", "", mutant.rsplit(".", 1)[-1])
    if last.startswith("xǁ"):
        return last[1:].replace("ǁ", ".").strip(".")
    return last[2:] if last.startswith("x_") else last


def _key(function: str, diff: list[str]) -> tuple[str, tuple[str, ...]]:
    return function, tuple(" ".join(ln.split()) for ln in diff)


def load_explained(path: Path = EXPLAINED, text: str | None = None) -> dict[str, dict]:
    """module -> {(function, diff): {kind, why}}; a malformed entry stops the run, named."""
    if text is None:
        if not path.exists():
            return {}
        text = path.read_text()
    doc = yaml.safe_load(text) or {}
    out: dict[str, dict] = {}
    for module, entries in doc.items():
        for i, e in enumerate(entries or []):
            where = f"{path.name}: {module}[{i}]"
            if not isinstance(e, dict) or set(e) != {"function", "diff", "kind", "why"}:
                raise SystemExit(f"{where}: needs exactly function, diff, kind, why")
            if e["kind"] not in KINDS or not str(e["why"]).strip():
                raise SystemExit(f"{where}: kind is one of {KINDS}, and why says why")
            out.setdefault(module, {})[_key(e["function"], e["diff"])] = {
                "kind": e["kind"], "why": " ".join(str(e["why"]).split())}
    return out


def explain(module: str, survivors: list[dict], explained: dict[str, dict]) -> int:
    """Attach each survivor's explanation; returns how many have none."""
    known = explained.get(module, {})
    left = 0
    for s in survivors:
        s["explained"] = known.get(_key(function_of(s["mutant"]), s["diff"]))
        left += s["explained"] is None
    return left


def stale_explanations(records: dict[str, dict], explained: dict[str, dict]) -> list[dict]:
    """Explanations that match no survivor of their module's record: the mutant was killed
    since, or the code it named changed. A module stopped partway (partial) or sampled
    (`--sample`: the mutant explained may be one not run) cannot tell."""
    stale = []
    for module, entries in sorted(explained.items()):
        rec = records.get(module)
        for (function, diff) in entries:
            if rec is None or "survivors" not in rec:
                why = "no record of the module's survivors"
            elif rec.get("partial") or rec.get("sample", 1) > 1:
                continue
            elif any(_key(function_of(s["mutant"]), s["diff"]) == (function, diff)
                     for s in rec["survivors"]):
                continue
            else:
                why = f"matches no survivor (measured on {rec.get('commit')})"
            stale.append({"module": module, "function": function, "diff": list(diff),
                          "why": why})
    return stale


def score(counts: dict[str, int], equivalent: int = 0) -> float | None:
    """Killed over judged, the `equivalent` survivors (each explained as such) left out of
    both: a mutant no input tells from the code is no test's to kill. Harmless ones count as
    survivors: some test could tell them."""
    judged = sum(counts.get(k, 0) for k in JUDGED) - equivalent
    killed = counts.get("killed", 0) + counts.get("timeout", 0)
    return round(killed / judged, 3) if judged > 0 else None


def _equivalent(rec: dict) -> int:
    return sum(1 for s in rec.get("survivors", [])
               if (s.get("explained") or {}).get("kind") == "equivalent")


def module_row(module: str, rec: dict | None, run_commit: str, stale: int = 0) -> dict:
    """One line of the table: what a module's record says, and whether it is below target."""
    row: dict = {"module": module}
    if rec is None or "counts" not in rec:
        row["status"] = rec.get("status", "error") if rec else "not measured"
        row["below_target"] = None
        row["stale_explanations"] = stale
        return row
    c = rec["counts"]
    kinds = [(s.get("explained") or {}).get("kind") for s in rec.get("survivors", [])]
    s = score(c, kinds.count("equivalent"))
    row |= {
        "status": "partial" if rec.get("partial") else "measured",
        "commit": rec.get("commit"), "this_run": rec.get("commit") == run_commit,
        "mutants": sum(c.values()), "killed": c.get("killed", 0),
        "survived": c.get("survived", 0), "equivalent": kinds.count("equivalent"),
        "harmless": kinds.count("harmless"), "unexplained": kinds.count(None),
        "timeouts": c.get("timeout", 0), "no_tests": c.get("no tests", 0),
        "not_checked": c.get("not checked", 0),
        "judged": sum(c.get(k, 0) for k in JUDGED), "score": s, "raw_score": score(c),
        "below_target": s is not None and s < TARGET, "stale_explanations": stale,
        "seconds": rec.get("seconds"), "sample": rec.get("sample", 1),
        "only_tests": rec.get("only_tests") or [],
    }
    return row


def table(planned: list[str], records: dict[str, dict], run_commit: str,
          stale: list[dict]) -> list[dict]:
    n_stale = {m: sum(1 for s in stale if s["module"] == m) for m in planned}
    return [module_row(m, records.get(m), run_commit, n_stale[m]) for m in planned]


def format_table(rows: list[dict]) -> str:
    head = (f"{'module':44} {'mutants':>7} {'killed':>6} {'surv':>5} {'eq':>3} {'harm':>4} "
            f"{'unexpl':>6} {'tmo':>3} {'notest':>6} {'score':>6}  below  commit   secs")
    lines = [head]
    for r in rows:
        if "mutants" not in r:
            lines.append(f"{r['module']:44} {r['status']}")
            continue
        sc = "-" if r["score"] is None else f"{r['score']:.3f}"
        flag = "BELOW" if r["below_target"] else ""
        lines.append(
            f"{r['module']:44} {r['mutants']:7} {r['killed']:6} {r['survived']:5} "
            f"{r['equivalent']:3} {r['harmless']:4} {r['unexplained']:6} {r['timeouts']:3} "
            f"{r['no_tests']:6} {sc:>6}  {flag:5}  {r['commit'] or '':7} {r['seconds'] or ''}"
            + ("  (partial)" if r["status"] == "partial" else "")
            + (f"  (1 in {r['sample']})" if r.get("sample", 1) > 1 else "")
            + (f"  (tests: {' '.join(r['only_tests'])})" if r.get("only_tests") else "")
            + ("" if r["this_run"] else "  (earlier run)"))
    return "\n".join(lines)


# --- running ---------------------------------------------------------------------------------

def _archive(commit: str, into: Path) -> None:
    archive = subprocess.run(["git", "archive", commit], cwd=ROOT, capture_output=True,
                             check=True).stdout
    subprocess.run(["tar", "-x", "-C", str(into)], input=archive, check=True)


def _junit_seconds(path: Path, tree: Path) -> dict[str, float]:
    """test function id -> seconds, from pytest's junit xml (params summed)."""
    out: dict[str, float] = {}
    if not path.exists():
        return out
    for case in ET.parse(path).getroot().iter("testcase"):
        parts = case.get("classname", "").split(".")
        for i in range(len(parts), 0, -1):
            if (tree / ("/".join(parts[:i]) + ".py")).exists():
                nodeid = "::".join(["/".join(parts[:i]) + ".py", *parts[i:],
                                    case.get("name", "").split("[", 1)[0]])
                out[nodeid] = out.get(nodeid, 0.0) + float(case.get("time", 0) or 0)
                break
    return out


def build_imports_map(start: dict) -> dict:
    """The test map from imports, at the run's commit: seconds to make."""
    files = committed_sources(start["commit"], under="tests")
    tests = {p: src for p, src in files.items() if Path(p).name.startswith("test_")}
    count = {p: len(re.findall(r"^\s*(?:async )?def test_", src, re.M)) for p, src in tests.items()}
    by_module = tests_map_from_imports(committed_sources(start["commit"]), tests, helpers=files)
    return {"commit": start["commit"], "dirty": start["dirty"], "built": start["started"],
            "how": "imports", "cost_unit": "test functions",
            "modules": {m: {"tests": t, "cost": sum(count[x] for x in t)}
                        for m, t in by_module.items()}}


def build_coverage_map(start: dict, workers: int = 2) -> dict:
    """One coverage run of the tests without Engine, PyPI or gigabytes, at the run's commit,
    a context per test -> module -> the tests that execute a line inside its functions."""
    with tempfile.TemporaryDirectory(prefix="mutation-map-") as d:
        tree = Path(d) / "tree"
        tree.mkdir()
        _archive(start["commit"], tree)
        env = dict(os.environ, COVERAGE_FILE=str(Path(d) / ".coverage"), OMP_NUM_THREADS="1")
        xdist = ["-n", str(workers), "--dist", "loadgroup"] if workers else ["-p", "no:xdist"]
        t0 = time.monotonic()
        r = subprocess.run([PYTHON, "-m", "pytest", *MAP_PYTEST, *xdist,
                            f"--junitxml={d}/junit.xml"], cwd=tree, env=env,
                           capture_output=True, text=True)
        seconds = round(time.monotonic() - t0, 1)
        tail = (r.stdout + r.stderr).strip().splitlines()[-1:] or [""]
        return tests_map_from_coverage(Path(d) / ".coverage", tree, Path(d) / "junit.xml",
                                       start) | {"seconds": seconds, "pytest": tail[0]}


def tests_map_from_coverage(db: Path, tree: Path, junit: Path, start: dict) -> dict:
    import coverage

    data = coverage.CoverageData(basename=str(db))
    data.read()
    contexts: dict[str, dict[int, list[str]]] = {}
    lines: dict[str, set[int]] = {}
    for f in data.measured_files():
        rel = Path(f).resolve().relative_to(tree.resolve()).as_posix() \
            if Path(f).resolve().is_relative_to(tree.resolve()) else None
        if not rel or not rel.startswith(PACKAGE + "/"):
            continue
        contexts[rel] = data.contexts_by_lineno(f)
        lines[rel] = function_lines((tree / rel).read_text(encoding="utf-8"))
    by_module = tests_by_module(contexts, lines)
    secs = _junit_seconds(junit, tree)
    return {"commit": start["commit"], "dirty": start["dirty"], "built": start["started"],
            "how": "coverage: pytest " + " ".join(MAP_PYTEST), "cost_unit": "seconds",
            "modules": {m: {"tests": t, "cost": round(sum(secs.get(x, 0.0) for x in t), 1)}
                        for m, t in sorted(by_module.items())}}


def module_of_mutant(mutant: str, modules: list[str]) -> str | None:
    """`imgbuild.a.b.x_f__mutmut_3` (or `imgbuild.a.b.xǁCǁm__mutmut_3`) -> `imgbuild/a/b.py`."""
    dotted = mutant.rsplit(".", 1)[0]
    return next((m for m in modules if _dotted(m) == dotted), None)


def group_plan(order: list[str], plan: dict[str, list[str]], cap: int = 12) -> list[list[str]]:
    """Consecutive modules with the same tests (and markers) run as one mutmut run: one
    collection of which test reaches which function, one clean run, for all of them."""
    groups: list[list[str]] = []
    for m in order:
        g = groups[-1] if groups else None
        if (g and plan[m] and plan[g[0]] == plan[m] and len(g) < cap
                and DESELECT_FOR.get(g[0], DESELECT) == DESELECT_FOR.get(m, DESELECT)):
            g.append(m)
        else:
            groups.append([m])
    return groups


def together(order: list[str], plan: dict[str, list[str]]) -> tuple[list[str], dict[str, list[str]]]:
    """`--together`: every module a test reaches in one mutmut run per marker set, with the
    union of their tests. A run's fixed cost (collecting which test reaches which function,
    the clean run: about 8 minutes of the suite here) is paid once, not per group; mutmut
    still runs each mutant against only the tests that reach its function, cheapest first,
    so a run stopped at the budget has measured every module's cheap mutants (partial).
    Payload modules run apart: beside them the golden comparisons are left out (k_for), and
    the other modules keep those tests."""
    def kind(m: str) -> tuple[bool, bool]:
        return DESELECT_FOR.get(m, DESELECT) != DESELECT, m.startswith(PAYLOAD)

    tested = [m for m in order if plan[m]]
    union: dict[tuple[bool, bool], list[str]] = {}
    for m in tested:
        union[kind(m)] = sorted(set(union.get(kind(m), [])) | set(plan[m]))
    return (sorted(tested, key=kind) + [m for m in order if not plan[m]],
            {m: union[kind(m)] if plan[m] else [] for m in order})


# One mutant in k of each function, by the last digit of its number (mutmut numbers a
# function's mutants 1, 2, ...): every function with a mutant has its first one in the sample,
# and the rest spread evenly over its body, not bunched at its start.
SAMPLE_DIGITS = {2: "13579", 5: "16", 10: "1"}


def sample_globs(k: int) -> list[str]:
    """`--sample k` -> the mutant names `mutmut run` is given (fnmatch globs); [] for all."""
    if k == 1:
        return []
    if k not in SAMPLE_DIGITS:
        raise SystemExit(f"--sample takes 1, {', '.join(map(str, SAMPLE_DIGITS))}; not {k}")
    digits = SAMPLE_DIGITS[k]
    return [f"*__mutmut_*{digits if len(digits) == 1 else '[' + digits + ']'}"]


def narrowed(plan: dict[str, list[str]], globs: list[str]) -> dict[str, list[str]]:
    """`--only-tests GLOB`: each module's derived tests, only those whose file matches a glob.
    For modules that nearly every test reaches (the catalog's), where a run over all of them
    costs hours: fewer tests can only kill fewer mutants, so the score is a lower bound, and
    the record names the globs."""
    return {m: [t for t in tests if any(fnmatch.fnmatch(t, g) for g in globs)]
            for m, tests in plan.items()}


def run_group(modules: list[str], tests: list[str], commit: str, limit_s: float | None = None,
              max_children: int = 2, sample: int = 1,
              only_tests: list[str] | None = None) -> dict[str, dict]:
    """One mutmut run over modules that share their tests -> module -> its result. With
    `sample` k > 1 only one mutant in k of each function runs (sample_globs); the others stay
    "not checked", and the module's record says it was sampled."""
    with tempfile.TemporaryDirectory(prefix="mutation-") as d:
        tree = Path(d)
        _archive(commit, tree)
        with open(tree / "pyproject.toml", "a") as f:
            f.write("\n[tool.mutmut]\n"
                    f'source_paths = ["{PACKAGE}"]\n'
                    f"only_mutate = {json.dumps(modules)}\n"
                    f"also_copy = {json.dumps(also_copy(tree))}\n"
                    f"pytest_add_cli_args_test_selection = {json.dumps(tests)}\n"
                    f'pytest_add_cli_args = ["-q", "-p", "no:cacheprovider", "-m", '
                    f'"{DESELECT_FOR.get(modules[0], DESELECT)}", "-k", "{k_for(modules)}"]\n')
        # What the tests find at their ROOT besides the files: a git checkout (they list its
        # files with `git ls-files`) and the venv's entry points (they run
        # .venv/bin/imgbuild). mutmut runs them in mutants/, which it fills without removing
        # what is there. The venv is the working tree's (an editable install): a test that
        # runs imgbuild in a subprocess runs the unmutated code, so it cannot kill a mutant,
        # but it runs instead of failing the stats run.
        (tree / "mutants").mkdir(exist_ok=True)
        (tree / "mutants" / ".venv").symlink_to(ROOT / ".venv")
        subprocess.run(["git", "init", "-q"], cwd=tree / "mutants", check=True)
        start = time.monotonic()
        p = subprocess.Popen([MUTMUT, "run", "--max-children", str(max_children),
                              *sample_globs(sample)], cwd=tree,
                             stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                             start_new_session=True)
        partial = False
        try:
            out, _ = p.communicate(timeout=limit_s)
        except subprocess.TimeoutExpired:
            partial = True
            out = ""
            for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGKILL):
                try:
                    os.killpg(p.pid, sig)
                    out, _ = p.communicate(timeout=20)
                    break
                except (subprocess.TimeoutExpired, ProcessLookupError):
                    continue
            out = out or ""
        seconds = round(time.monotonic() - start, 1)
        shared = {"tests": tests, "seconds": seconds} | (
            {"run_with": len(modules)} if len(modules) > 1 else {}) | (
            {"sample": sample} if sample > 1 else {}) | (
            {"only_tests": only_tests} if only_tests else {})
        if p.returncode != 0 and not partial:
            return {m: shared | {"status": "error", "error": out[-2000:]} for m in modules}
        r = subprocess.run([MUTMUT, "results", "--all", "true"], cwd=tree,
                           capture_output=True, text=True)
        if r.returncode != 0:
            return {m: shared | {"status": "stopped at the budget" if partial else "error",
                                 "error": (r.stdout + r.stderr)[-2000:]} for m in modules}
        status = dict(ln.strip().rsplit(": ", 1) for ln in r.stdout.splitlines() if ": " in ln)
        out_by: dict[str, dict] = {}
        for module in modules:
            mine = {n: s for n, s in status.items() if module_of_mutant(n, modules) == module}
            names = [name for name, s in sorted(mine.items()) if s == "survived"]
            # Every survivor's diff (what `mutmut show` prints) from one process: a `mutmut
            # show` each took ~48 s apiece on a loaded 2-core machine.
            shown = json.loads(subprocess.run(
                [PYTHON, "-c", SHOW, module], cwd=tree,
                input=json.dumps(names), capture_output=True, text=True, check=True).stdout)
            # The changed lines, a signature's too (a default argument's mutant).
            survivors = [{"mutant": name, "diff": [
                ln for ln in shown[name].splitlines() if ln[:1] in "-+" and ln[:3] not in
                ("---", "+++")]} for name in names]
            counts: dict[str, int] = {}
            for s in mine.values():
                counts[s] = counts.get(s, 0) + 1
            out_by[module] = shared | {"counts": counts, "score": score(counts),
                                       "survivors": survivors} | (
                {"partial": True} if partial else {})
        return out_by


def record_module(doc: dict, module: str, res: dict, start: dict,
                  explained: dict[str, dict]) -> dict:
    """Put one module's result in the record, measured on the run's commit."""
    commit = start["short"]
    earlier = doc["modules"].get(module)
    judged_now = sum((res.get("counts") or {}).get(k, 0) for k in JUDGED)
    judged_before = sum(((earlier or {}).get("counts") or {}).get(k, 0) for k in JUDGED)
    if earlier and "counts" in earlier and ("counts" not in res or (
            judged_now == 0 and judged_before > 0)):
        # A run that failed, or was stopped before it judged any of this module's mutants,
        # keeps the module's earlier measure, with what happened this time beside it.
        earlier["last_attempt"] = {k: res.get(k) for k in ("status", "error", "seconds")} | {
            "commit": commit} | ({"status": "stopped before any of its mutants was judged"}
                                 if "counts" in res else {})
        return earlier
    if earlier and earlier.get("commit") != commit and "score" in earlier:
        # The first run on another commit stays as "before": what the tests added since
        # then killed is the difference.
        res["before"] = earlier.get("before") or {k: earlier.get(k) for k in
                                                  ("commit", "score", "counts")}
    if "survivors" in res:
        res["unexplained"] = explain(module, res["survivors"], explained)
    doc["modules"][module] = res | {"commit": commit}
    return doc["modules"][module]


def run_plan(doc: dict, order: list[str], plan: dict[str, list[str]], start: dict,
             run_one: Callable[..., dict[str, dict]], explained: dict[str, dict],
             budget_s: float | None = None, clock: Callable[[], float] = time.monotonic,
             save: Callable[[dict], None] = lambda doc: None, cap: int = 12) -> dict:
    """Run the modules in order, those sharing their tests together (group_plan), until the
    budget is spent, between runs; a module with no test reaching it is recorded as such,
    unrun. Returns the run's summary (which ran, which did not: those keep their earlier
    record)."""
    t0 = clock()
    ran, not_run, untested = [], [], []
    for group in group_plan(order, plan, cap):
        left = None if budget_s is None else budget_s - (clock() - t0)
        if left is not None and left <= 0:
            not_run.extend(group)
            continue
        if not plan[group[0]]:
            doc["modules"][group[0]] = {"status": "no test reaches it", "tests": [],
                                        "commit": start["short"]}
            untested.append(group[0])
            continue
        print(f"mutation: {' '.join(group)} ({len(plan[group[0]])} tests) ...",
              file=sys.stderr, flush=True)
        results = run_one(group, plan[group[0]], start["commit"], left)
        for module in group:
            res = record_module(doc, module, results[module], start, explained)
            ran.append(module)
            print(f"mutation: {module}: score {res.get('score')} {res.get('counts')} "
                  f"({res.get('unexplained')} survivors unexplained) in {res.get('seconds')} s"
                  + (f" (with {res['run_with'] - 1} others)" if res.get("run_with") else "")
                  + (" (stopped at the budget: partial)" if res.get("partial") else "")
                  + (f" ({res['last_attempt']['status']})" if "last_attempt" in res
                     and res["last_attempt"]["commit"] == start["short"] else ""),
                  file=sys.stderr, flush=True)
        save(doc)
    return {"ran": ran, "no_test_reaches": untested, "not_run": not_run}


def finish(doc: dict, planned: list[str], skipped: dict[str, str], start: dict,
           explained: dict[str, dict]) -> None:
    """The judgement of the whole record: the table, who is below target, stale explanations."""
    for module, res in doc["modules"].items():
        if "survivors" in res:
            res["unexplained"] = explain(module, res["survivors"], explained)
            res["score"] = score(res["counts"], _equivalent(res))
    stale = stale_explanations(doc["modules"], explained)
    rows = table(planned, doc["modules"], start["short"], stale)
    # A module stopped at the budget before any of its mutants was checked has no measure yet.
    mods = [r for r in rows if "mutants" in r and r["judged"]]
    killed = sum(r["killed"] + r["timeouts"] for r in mods)
    judged = sum(r["judged"] for r in mods)
    equivalent = sum(r["equivalent"] for r in mods)
    doc["target"] = TARGET
    doc["skipped"] = skipped
    doc["table"] = rows
    doc["below_target"] = [r["module"] for r in rows if r["below_target"]]
    doc["not_measured"] = [r["module"] for r in rows if "mutants" not in r or not r["judged"]]
    doc["stale_explanations"] = stale
    doc["total"] = {"modules": len(planned), "measured": len(mods), "killed": killed,
                    "judged": judged, "equivalent": equivalent,
                    "score": round(killed / (judged - equivalent), 3)
                    if judged > equivalent else None,
                    "raw_score": round(killed / judged, 3) if judged else None}


def _save(doc: dict) -> None:
    from bench.machine import machine

    doc["machine"] = machine()
    RECORD.write_text(json.dumps(doc, indent=1, ensure_ascii=False) + "\n")


def main() -> None:
    start = start_state()  # before any work: the commit every module is measured on
    ap = argparse.ArgumentParser()
    ap.add_argument("modules", nargs="*", help="default: every module of imgbuild/")
    ap.add_argument("--explain-only", action="store_true",
                    help="re-read mutation-explained.yaml into the record; run nothing")
    ap.add_argument("--budget-min", type=float, default=None,
                    help="stop between modules after this many minutes")
    ap.add_argument("--last", action="append", default=[], metavar="GLOB",
                    help="run the modules matching GLOB after the others")
    ap.add_argument("--map", choices=("imports", "coverage"), default="imports",
                    help="which tests reach a module: those importing it, directly or not "
                         "(seconds to make, the default), or those executing a line of its "
                         "functions (a coverage run of the tests, a context per test)")
    ap.add_argument("--remap", action="store_true", help="make the test map again")
    ap.add_argument("--plan", action="store_true", help="print the plan in order; run nothing")
    ap.add_argument("--max-children", type=int, default=2)
    ap.add_argument("--sample", type=int, default=1, metavar="K",
                    help="run one mutant in K (2, 5 or 10) of each function: for modules whose "
                         "functions most tests reach, where every mutant would take hours")
    ap.add_argument("--only-tests", action="append", default=[], metavar="GLOB",
                    help="of each module's derived tests, only the files matching GLOB (a lower "
                         "bound on its score; the record names the globs)")
    ap.add_argument("--together", action="store_true",
                    help="one mutmut run for all the modules chosen, with the union of their "
                         "tests: the run's fixed cost once (see together())")
    args = ap.parse_args()
    sample_globs(args.sample)  # a wrong K stops here, before minutes of work
    doc = json.loads(RECORD.read_text()) if RECORD.exists() else {"modules": {}}
    doc.pop("total", None)
    explained = load_explained()  # a malformed file stops here, before minutes of mutants
    planned, skipped = package_modules(committed_sources(start["commit"]))
    if args.explain_only:
        # The record is judged as of the run that made it (its commit's modules).
        if doc.get("run", {}).get("commit") not in (None, start["commit"]):
            start = doc["run"]
            planned, skipped = package_modules(committed_sources(start["commit"]))
        finish(doc, planned, skipped, start, explained)
        print(format_table(doc["table"]), file=sys.stderr)
        _report_stale(doc)
        _save(doc)
        return
    tmap = json.loads(TESTS_MAP.read_text()) if TESTS_MAP.exists() else None
    if args.map == "coverage" and (args.remap or not tmap or tmap["how"] == "imports"):
        print("mutation: mapping tests to modules (one coverage run of the tests) ...",
              file=sys.stderr, flush=True)
        tmap = build_coverage_map(start)
        print(f"mutation: mapped in {tmap['seconds']} s: {tmap['pytest']}", file=sys.stderr)
    elif args.map == "imports" and (args.remap or not tmap or tmap["how"] != "imports"
                                    or tmap["commit"] != start["commit"]):
        tmap = build_imports_map(start)
    TESTS_MAP.write_text(json.dumps(tmap, indent=1) + "\n")
    derived = {m: v["tests"] for m, v in tmap["modules"].items()}
    if tmap["commit"] != start["commit"]:
        names = set(committed_sources(start["commit"], under="tests"))
        print(f"mutation: the test map is of {tmap['commit'][:7]}, not {start['short']}: "
              "its tests by file (--remap makes it again)", file=sys.stderr)
        derived = {m: file_level(t, names.__contains__) for m, t in derived.items()}
    plan = test_plan(planned, derived)
    if args.only_tests:
        plan = narrowed(plan, args.only_tests)
    chosen = args.modules or planned
    unknown = [m for m in chosen if m not in plan]
    if unknown:
        raise SystemExit(f"not a module with functions at {start['short']}: {unknown}")
    order = order_plan({m: plan[m] for m in chosen},
                       {m: v["cost"] for m, v in tmap["modules"].items()},
                       {m for m, r in doc["modules"].items() if "counts" in r}, args.last)
    cap = 12
    if args.together:
        order, plan = together(order, plan)
        cap = len(order)
    if args.plan:
        for m in order:
            print(f"{tmap['modules'].get(m, {}).get('cost', 0):8.1f} {tmap['cost_unit']}  "
                  f"{len(plan[m]):4} tests  {m}")
        print(f"skipped: {skipped}")
        return
    # The run's commit is in the record from the first module on (a run killed midway says so).
    doc["run"] = start | {"finished": None, "budget_min": args.budget_min, "sample": args.sample,
                          "only_tests": args.only_tests,
                          "tests_map": tmap["how"], "tests_map_commit": tmap["commit"]}
    summary = run_plan(doc, order, plan, start,
                       lambda g, t, c, left: run_group(g, t, c, left, args.max_children,
                                                       args.sample, args.only_tests),
                       explained, None if args.budget_min is None else args.budget_min * 60,
                       save=lambda d: (finish(d, planned, skipped, start, explained),
                                       _save(d)), cap=cap)
    doc["run"] |= summary | {
        "finished": datetime.now(UTC).isoformat(timespec="seconds")}
    finish(doc, planned, skipped, start, explained)
    _save(doc)
    print(format_table(doc["table"]), file=sys.stderr)
    _report_stale(doc)
    if summary["not_run"]:
        print(f"mutation: not run this time (budget): {len(summary['not_run'])} modules: "
              + " ".join(summary["not_run"]), file=sys.stderr)


def _report_stale(doc: dict) -> None:
    for s in doc["stale_explanations"]:
        print(f"mutation: stale explanation: {s['module']} {s['function']}: {s['why']}",
              file=sys.stderr)
    if doc["below_target"]:
        print(f"mutation: below {TARGET:.0%}: " + " ".join(doc["below_target"]),
              file=sys.stderr)


if __name__ == "__main__":
    main()
