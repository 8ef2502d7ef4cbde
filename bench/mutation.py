"""Mutation testing of the modules that decide what users trust, one module at a time, with
mutmut (from PyPI): each module's mutants run against the tests that exercise it, and what
survives is recorded with its diff.

    make mutation                                  # every module below
    .venv/bin/python bench/mutation.py imgbuild/plan/key.py ...

Each module runs in a scratch copy of the committed tree (git archive HEAD), so a run never
touches the working tree; mutmut runs only the selected tests that reach the mutated
function. Tests that need the Docker Engine, PyPI or gigabytes are left out (a mutant would
cost a build each): the modules whose deciding code is there (the smoke gate in
pipeline/build.py, the registry client) are measured by the tests that run without them.
Results: bench/results/mutation.json (score per module, survivors with their diffs), merged
with earlier runs so that a module run alone keeps the others' record.

A survivor a person has judged is explained in bench/mutation-explained.yaml (by its function
and its diff, which survive renumbering): `equivalent` (no input tells it from the code) or
`harmless` (with why). Each survivor in the record carries its explanation or none, and the
module's `unexplained` count is what is left to judge or to kill.
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.machine import machine  # noqa: E402

MUTMUT = str(ROOT / ".venv" / "bin" / "mutmut")
# module -> the tests that exercise it without Docker, PyPI or gigabytes
MODULES: dict[str, list[str]] = {
    "imgbuild/plan/key.py": ["tests/test_content_key.py", "tests/test_plan_render.py",
                            "tests/test_key_mutants.py"],
    "imgbuild/lock/conflicts.py": ["tests/test_resolver.py", "tests/test_offline_twins.py",
                                  "tests/test_conflicts_text.py", "tests/test_conflicts_mutants.py"],
    "imgbuild/checks/drift.py": ["tests/test_drift.py", "tests/test_survivors.py",
                                "tests/test_offline_twins.py", "tests/test_drift_mutants.py"],
    "imgbuild/checks/checkmodel/names.py": ["tests/test_checkmodel.py",
                                           "tests/test_checkmodel_mutants.py"],
    "imgbuild/checks/checkmodel/ignore.py": ["tests/test_checkmodel.py",
                                            "tests/test_survivors.py",
                                            "tests/test_checkmodel_mutants.py"],
    "imgbuild/checks/checkmodel/fix.py": ["tests/test_checkmodel.py", "tests/test_survivors.py",
                                         "tests/test_checkmodel_mutants.py"],
    "imgbuild/plan/patchset.py": ["tests/test_patches.py", "tests/test_survivors.py",
                                 "tests/test_patcher_behaviour.py"],
    # the smoke gate's decision (its effects, tag moves and pushes, need the Engine)
    "imgbuild/pipeline/build.py": ["tests/test_gate_decision.py"],
    "imgbuild/payload/patcher.py": ["tests/test_patches.py", "tests/test_patcher_behaviour.py",
                                   "tests/test_patcher_mutants.py"],
    # the registry client over HTTP, against the Distribution registry binary (no Engine)
    "imgbuild/image/distribution.py": ["tests/test_registry_client.py"],
    "imgbuild/image/registry.py": ["tests/test_registry_client.py"],
    # what decides trust: the index's refusals, verify's judgement, the build's inputs, the
    # pull's platform, a wheel's hashes (their registry reads and Engine steps are Engine-only)
    "imgbuild/pipeline/index.py": ["tests/test_trust_paths.py"],
    "imgbuild/pipeline/obtain.py": ["tests/test_trust_paths.py"],
    "imgbuild/pipeline/pull.py": ["tests/test_trust_paths.py"],
    # fetching and checking a wheel: hashes, Range, RECORD, against an index in the test's own
    # process (the drift check's tests reach it too, but start pypiserver: 15 s a mutant)
    "imgbuild/lock/wheels.py": ["tests/test_trust_paths.py", "tests/test_wheels_mutants.py"],
    "imgbuild/image/attest.py": ["tests/test_trust_paths.py"],
    "imgbuild/image/context.py": ["tests/test_trust_paths.py", "tests/test_plan_render.py"],
}
EXPLAINED = ROOT / "bench" / "mutation-explained.yaml"
KINDS = ("equivalent", "harmless")
DESELECT = "not live and not slow and not docker"
# The registry client's tests are marked docker (they start real Distribution registries, which
# `-m "not docker"` promises not to), but drive no Engine: its modules run them.
DESELECT_FOR = {"imgbuild/image/distribution.py": "not live and not slow",
                "imgbuild/image/registry.py": "not live and not slow"}
SHOW = ("import json, sys\n"
        "from mutmut.mutation.diff_apply import get_diff_for_mutant\n"
        "print(json.dumps({n: get_diff_for_mutant(n, path=sys.argv[1])\n"
        "                  for n in json.load(sys.stdin)}))\n")
ALSO_COPY = ["images", "lockfiles", "tests", "requirements", "README.md", "Makefile",
             "scripts", ".github", "bench"]


def function_of(mutant: str) -> str:
    """`imgbuild.x.y.x_name__mutmut_12` -> `name`; methods (`xǁClassǁname`) -> `Class.name`."""
    last = re.sub(r"__mutmut_\d+$", "", mutant.rsplit(".", 1)[-1])
    if last.startswith("xǁ"):
        return last[1:].replace("ǁ", ".").strip(".")
    return last[2:] if last.startswith("x_") else last


def _key(function: str, diff: list[str]) -> tuple[str, tuple[str, ...]]:
    return function, tuple(" ".join(ln.split()) for ln in diff)


def load_explained(path: Path = EXPLAINED) -> dict[str, dict]:
    """module -> {(function, diff): {kind, why}}; a malformed entry stops the run, named."""
    if not path.exists():
        return {}
    doc = yaml.safe_load(path.read_text()) or {}
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


def run_module(module: str, tests: list[str]) -> dict:
    with tempfile.TemporaryDirectory(prefix="mutation-") as d:
        tree = Path(d)
        archive = subprocess.run(["git", "archive", "HEAD"], cwd=ROOT, capture_output=True,
                                 check=True).stdout
        subprocess.run(["tar", "-x", "-C", str(tree)], input=archive, check=True)
        with open(tree / "pyproject.toml", "a") as f:
            f.write("\n[tool.mutmut]\n"
                    'source_paths = ["imgbuild"]\n'
                    f"only_mutate = {json.dumps([module])}\n"
                    f"also_copy = {json.dumps(ALSO_COPY)}\n"
                    f"pytest_add_cli_args_test_selection = {json.dumps(tests)}\n"
                    f'pytest_add_cli_args = ["-q", "-p", "no:cacheprovider", "-m", '
                    f'"{DESELECT_FOR.get(module, DESELECT)}", "-k", "not plain_install"]\n')
        start = time.monotonic()
        r = subprocess.run([MUTMUT, "run", "--max-children", "2"], cwd=tree,
                           capture_output=True, text=True)
        seconds = round(time.monotonic() - start, 1)
        if r.returncode != 0:
            return {"error": (r.stdout + r.stderr)[-2000:], "seconds": seconds}
        listed = subprocess.run([MUTMUT, "results", "--all", "true"], cwd=tree,
                                capture_output=True, text=True, check=True).stdout
        status = dict(ln.strip().rsplit(": ", 1) for ln in listed.splitlines() if ": " in ln)
        names = [name for name, s in sorted(status.items()) if s == "survived"]
        # Every survivor's diff (what `mutmut show` prints) from one process: a `mutmut show`
        # each took ~48 s apiece on a loaded 2-core machine, hours for lock/wheels.py's 266.
        shown = json.loads(subprocess.run(
            [str(ROOT / ".venv" / "bin" / "python"), "-c", SHOW, module], cwd=tree,
            input=json.dumps(names), capture_output=True, text=True, check=True).stdout)
        # The changed lines, a signature's too (a default argument's mutant).
        survivors = [{"mutant": name, "diff": [
            ln for ln in shown[name].splitlines() if ln[:1] in "-+" and ln[:3] not in
            ("---", "+++")]} for name in names]
        counts: dict[str, int] = {}
        for s in status.values():
            counts[s] = counts.get(s, 0) + 1
        judged = sum(v for k, v in counts.items() if k in ("killed", "survived", "timeout"))
        killed = counts.get("killed", 0) + counts.get("timeout", 0)
        return {"tests": tests, "seconds": seconds, "counts": counts,
                "score": round(killed / judged, 3) if judged else None,
                "survivors": survivors}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("modules", nargs="*", help="default: every module in MODULES")
    ap.add_argument("--explain-only", action="store_true",
                    help="re-read mutation-explained.yaml into the record; run nothing")
    args = ap.parse_args()
    out = ROOT / "bench" / "results" / "mutation.json"
    doc = json.loads(out.read_text()) if out.exists() else {"modules": {}}
    explained = load_explained()  # a malformed file stops here, before minutes of mutants
    if args.explain_only:
        for module, res in doc["modules"].items():
            if "survivors" in res:
                res["unexplained"] = explain(module, res["survivors"], explained)
                print(f"{module}: {len(res['survivors'])} survivors, "
                      f"{res['unexplained']} unexplained", file=sys.stderr)
        out.write_text(json.dumps(doc, indent=1) + "\n")
        return
    for module in args.modules or list(MODULES):
        print(f"mutation: {module} ...", file=sys.stderr, flush=True)
        res = run_module(module, MODULES.get(module, ["tests"]))
        commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT,
                                capture_output=True, text=True).stdout.strip()
        earlier = doc["modules"].get(module)
        if earlier and earlier.get("commit") != commit and "score" in earlier:
            # The first run on another commit stays as "before": what the tests added since
            # then killed is the difference.
            res["before"] = earlier.get("before") or {k: earlier[k] for k in
                                                      ("commit", "score", "counts")}
        if "survivors" in res:
            res["unexplained"] = explain(module, res["survivors"], load_explained())
        doc["modules"][module] = res | {"commit": commit}
        print(f"mutation: {module}: score {res.get('score')} {res.get('counts')} "
              f"({res.get('unexplained')} survivors unexplained) in {res.get('seconds')} s",
              file=sys.stderr, flush=True)
        doc["machine"] = machine()
        mods = [m for m in doc["modules"].values() if "counts" in m]
        killed = sum(m["counts"].get("killed", 0) + m["counts"].get("timeout", 0) for m in mods)
        judged = sum(sum(v for k, v in m["counts"].items()
                         if k in ("killed", "survived", "timeout")) for m in mods)
        doc["total"] = {"killed": killed, "judged": judged,
                        "score": round(killed / judged, 3) if judged else None}
        out.write_text(json.dumps(doc, indent=1) + "\n")


if __name__ == "__main__":
    main()
