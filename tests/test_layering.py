"""The package's shape holds: every module imports alone, there are no import cycles, and each
stage package imports only the stages below it (pip-tools' tests/test_circular_imports.py is
the model). The graph is read from the source with `ast` (what a module imports when it is
loaded; `if TYPE_CHECKING:` blocks are not run, so they do not count)."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

from .conftest import ROOT

PKG = ROOT / "imgbuild"

# Which part of imgbuild/ may import which. A part is a top-level module or package. Read as:
# the pipeline is catalog → lock → workspace → plan → checks → image → pipeline / ci → cli;
# errors, fsutil, progress and the payload are shared by all; the payload imports nothing.
ALLOWED: dict[str, set[str]] = {
    "errors": set(),
    "fsutil": {"errors"},  # a write that fails is one error, said the same everywhere
    "progress": set(),
    "payload": set(),
    "catalog": {"errors", "fsutil", "payload"},
    "lock": {"errors", "fsutil", "catalog"},
    "workspace": {"errors", "catalog", "lock"},
    # A user's project as `imgbuild init` writes it, on the built-in catalog.
    "project": {"errors", "fsutil", "catalog", "lock", "workspace"},
    "smokemodel": {"errors", "payload", "catalog"},
    "plan": {"errors", "fsutil", "payload", "catalog", "lock", "workspace", "smokemodel"},
    "checks": {"errors", "fsutil", "payload", "catalog", "lock", "workspace", "smokemodel",
               "plan"},
    "image": {"errors", "fsutil", "progress", "payload", "catalog", "lock", "workspace", "plan"},
    "pipeline": {"errors", "fsutil", "progress", "payload", "catalog", "lock", "workspace",
                 "smokemodel", "plan", "checks", "image"},
    "ci": {"errors", "fsutil", "progress", "catalog", "lock", "workspace", "smokemodel", "plan",
           "image", "pipeline"},
    "cli": {"errors", "fsutil", "progress", "payload", "catalog", "lock", "workspace",
            "project", "smokemodel", "plan", "checks", "image", "pipeline", "ci"},
    # The documentation's generated pages: the parser, the catalog's readers, the exit codes.
    "docsgen": {"errors", "catalog", "cli"},
}
# Third-party libraries a part may use at import time. The terminal belongs to the CLI, the
# Docker Engine to image/; everything else reports through values and imgbuild.progress.
THIRD_PARTY_ONLY_IN = {
    "rich": {"cli"},
    "docker": {"image"},
    "requests": {"lock", "image", "ci"},
}
STDLIB = set(sys.stdlib_module_names)


def modules() -> dict[str, Path]:
    out = {}
    for p in sorted(PKG.rglob("*.py")):
        rel = p.relative_to(ROOT).with_suffix("")
        parts = list(rel.parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out[".".join(parts)] = p
    return out


MODULES = modules()


def _is_type_checking(node: ast.If) -> bool:
    t = node.test
    return (isinstance(t, ast.Name) and t.id == "TYPE_CHECKING") or (
        isinstance(t, ast.Attribute) and t.attr == "TYPE_CHECKING")


def _imports(name: str, path: Path, *, top_level_only: bool) -> list[tuple[str, int]]:
    """(module imported, line) for what `name` imports when loaded; with top_level_only, the
    imports inside functions are left out."""
    tree = ast.parse(path.read_text(), str(path))
    is_pkg = path.name == "__init__.py"
    here = name.split(".") if is_pkg else name.split(".")[:-1]
    out: list[tuple[str, int]] = []

    def visit(node: ast.AST) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.If) and _is_type_checking(child):
                continue
            if top_level_only and isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
                continue
            if isinstance(child, ast.Import):
                out.extend((a.name, child.lineno) for a in child.names)
            elif isinstance(child, ast.ImportFrom):
                if child.level:
                    base = here[:len(here) - (child.level - 1)]
                    mod = ".".join(base + ([child.module] if child.module else []))
                else:
                    mod = child.module or ""
                out.append((mod, child.lineno))
                # `from . import x` imports the submodule x
                for a in child.names:
                    if f"{mod}.{a.name}" in MODULES:
                        out.append((f"{mod}.{a.name}", child.lineno))
            visit(child)

    visit(tree)
    return out


def part(module: str) -> str:
    return module.split(".")[1] if module.count(".") else module


def internal_graph() -> dict[str, set[str]]:
    graph: dict[str, set[str]] = {}
    for name, path in MODULES.items():
        deps = set()
        for mod, _ in _imports(name, path, top_level_only=True):
            while mod and mod not in MODULES:
                mod = mod.rpartition(".")[0]
            if mod and mod != name and mod != "imgbuild":
                deps.add(mod)
        graph[name] = deps
    return graph


# Imports each named module in a child forked from an interpreter that has loaded only the
# third-party libraries (no builder module): the child starts as a fresh interpreter would for
# builder, without paying the interpreter's and the libraries' start-up once per module.
FORK_EACH = """
import importlib, json, os, sys, traceback
for lib in json.loads(sys.argv[1]):
    try:
        importlib.import_module(lib)
    except Exception:
        pass
assert not [m for m in sys.modules if m == "imgbuild" or m.startswith("imgbuild.")]
failed = []
for name in json.loads(sys.argv[2]):
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(r)
        try:
            importlib.import_module(name)
        except BaseException:
            os.write(w, traceback.format_exc()[-500:].encode())
            os._exit(1)
        os._exit(0)
    os.close(w)
    with os.fdopen(r, "rb") as f:
        err = f.read().decode(errors="replace")
    _, status = os.waitpid(pid, 0)
    if status != 0:
        failed.append([name, err or f"exit status {status}"])
print(json.dumps(failed))
"""


def test_every_module_imports_alone():
    """Each module in an interpreter where no other builder module was loaded first: an import
    that only works after another module was loaded (the symptom of a cycle or of import-order
    coupling) fails here."""
    import json

    names = [n for n in MODULES if not n.endswith("__main__")]
    libs = sorted({mod for name, path in MODULES.items()
                   for mod, _ in _imports(name, path, top_level_only=True)
                   if mod.split(".")[0] not in STDLIB and mod.split(".")[0] != "imgbuild"})
    r = subprocess.run([sys.executable, "-c", FORK_EACH, json.dumps(libs), json.dumps(names)],
                       cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    failed = json.loads(r.stdout.strip().splitlines()[-1])
    assert not failed, failed
    assert len(names) > 40  # the walk found the package
    assert "rich" in {lib.split(".")[0] for lib in libs}  # the libraries were read, and loaded


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []
    counter = [0]

    def strong(v: str) -> None:
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                strong(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in graph:
        if v not in index:
            strong(v)
    return out


def test_no_import_cycles():
    assert _cycles(internal_graph()) == []


def test_the_cycle_finder_finds_one():
    # The test above can fail: a two-module cycle, as plan ↔ patches ↔ render once was.
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_each_part_imports_only_the_parts_below_it():
    bad = []
    for name, path in MODULES.items():
        if name == "imgbuild":
            continue
        src = part(name)
        assert src in ALLOWED, f"{name}: imgbuild/{src} is not in the layering table"
        for mod, line in _imports(name, path, top_level_only=False):
            if mod.startswith("imgbuild."):  # `from .. import x` also lists imgbuild.x itself
                dst = part(mod)
                if dst != src and dst not in ALLOWED[src]:
                    bad.append(f"{path.relative_to(ROOT)}:{line}: {src} imports {mod}")
    assert not bad, "\n".join(bad)


def test_terminal_docker_and_http_stay_in_their_parts():
    bad = []
    for name, path in MODULES.items():
        for mod, line in _imports(name, path, top_level_only=False):
            top = mod.split(".")[0]
            if top in THIRD_PARTY_ONLY_IN and part(name) not in THIRD_PARTY_ONLY_IN[top]:
                bad.append(f"{path.relative_to(ROOT)}:{line}: {mod}")
    assert not bad, "\n".join(bad)


def test_imports_live_at_the_top_of_modules():
    """Imports inside functions are kept for what is not a dependency of imgbuild (torch and
    the smoke-model tooling, the hub client, the uv package) and for the payload, which runs
    in images that may lack them; builder's own modules and its dependencies are imported at
    the top. The CLI's dispatch (imgbuild/cli/main.py) loads lazily, and so do the places in
    DEFERRED, each with its reason."""
    deps = {"yaml", "packaging", "rich", "requests", "docker"}
    bad = []
    unused = set(DEFERRED)
    for name, path in MODULES.items():
        if part(name) == "payload":
            continue
        top = {m for m, _ in _imports(name, path, top_level_only=True)}
        for mod, line in _imports(name, path, top_level_only=False):
            if mod in top:
                continue
            root = mod.split(".")[0]
            if name == "imgbuild.cli.main" and mod == "imgbuild.cli.console":
                continue
            if (name, mod) in DEFERRED:
                unused.discard((name, mod))
                continue
            if root == "imgbuild" or root in deps or root in STDLIB:
                bad.append(f"{path.relative_to(ROOT)}:{line}: {mod}")
    assert not bad, "\n".join(bad)
    assert not unused, f"DEFERRED names imports that are no longer deferred: {sorted(unused)}"


# Imports kept inside a function on purpose, for check-model's start-up (what a user waits for
# on a 31k-module checkpoint: bench/results/checkmodel-large-ignore.json, 603 -> 312 modules
# loaded): a path needs no planner or smoke-model generator, only --image needs the Docker
# client, and a cached wheel is read without requests.
DEFERRED = {
    ("imgbuild.checks.checkmodel.report", "imgbuild"): "the smoke-model generator, for an alias",
    ("imgbuild.checks.checkmodel.report", "imgbuild.smokemodel"): "likewise",
    ("imgbuild.checks.checkmodel.report", "imgbuild.plan.decide"): "the planner, for an alias",
    ("imgbuild.cli.commands.check_model", "imgbuild.image"): "the Docker client, for --image",
    ("imgbuild.cli.commands.check_model", "imgbuild.image.schemes"): "likewise",
    # `doctor LOGFILE` loads no Docker SDK (0.25 s of its start-up); `doctor --host` does.
    ("imgbuild.cli.commands.doctor", "imgbuild.image"): "the Docker Engine's facts, for --host",
    ("imgbuild.cli.commands.doctor", "imgbuild.image.engine"): "likewise",
    ("imgbuild.lock.wheels", "requests"): "only where a request is made",
    # plan and a no-op build read a lock, never check its overrides: the proof's zip and
    # metadata readers (email.parser, zipfile) were 7 ms of plan's 200.
    ("imgbuild.lock.resolve", "imgbuild.lock.staticproof"): "the override proof, where a "
                                                            "lock is checked",
    # A build that finds its image here and the smoke report this machine made for it (the
    # no-op build, issue 46) loads none of what builds, pushes, splices or asks a registry:
    # they took longer to import than the rest of such a build (bench/startup_bench.py).
    # test_a_no_op_build_and_plan_load_nothing_heavy holds it.
    ("imgbuild.pipeline.build", "imgbuild.image.base"): "BuildKit, the wire, the Engine's "
                                                        "facts, the base images: to build or push",
    ("imgbuild.pipeline.build", "imgbuild.image.buildkit"): "likewise",
    ("imgbuild.pipeline.build", "imgbuild.image.engine"): "likewise",
    ("imgbuild.pipeline.build", "imgbuild.image.wire"): "likewise",
    ("imgbuild.pipeline.obtain", "imgbuild.image.base"): "to build or splice, likewise",
    ("imgbuild.pipeline.obtain", "imgbuild.image.buildkit"): "likewise",
    ("imgbuild.pipeline.obtain", "imgbuild.image.context"): "likewise",
    ("imgbuild.pipeline.obtain", "imgbuild.image.layercut"): "likewise",
    ("imgbuild.pipeline.obtain", "imgbuild.image.splice"): "likewise",
    ("imgbuild.pipeline.obtain", "imgbuild.image.wire"): "likewise",
    # The Engine client asks the local socket itself for what such a build asks (is the image
    # here, tag it); the docker SDK (and requests) only for the rest.
    ("imgbuild.image.daemon", "docker"): "the SDK's client, made on first use",
    ("imgbuild.image.daemon", "docker.errors"): "likewise",
    ("imgbuild.image.daemon", "uuid"): "a container's name, only where one runs",
    ("imgbuild.image.registry", "docker.errors"): "a pull through the Engine",
    ("imgbuild.image.registry", "imgbuild.image.distribution"): "a registry's requests",
    ("imgbuild.image.compression", "deflate"): "the compressors, where they run",
    ("imgbuild.image.compression", "zstandard"): "likewise",
    # Signatures (cryptography, PyNaCl) only where a key signs or a registry's policy asks:
    # never for a no-op build or a registry without a policy.
    ("imgbuild.pipeline.build", "imgbuild.image.cosign"): "to sign, with --sign-key",
    ("imgbuild.pipeline.build", "imgbuild.image.signstore"): "likewise",
    ("imgbuild.image.attest", "imgbuild.image.signstore"): "verify under a signed-by policy",
    ("imgbuild.pipeline.obtain", "imgbuild.image.signstore"): "a pull under a signed-by policy",
    ("imgbuild.cli.views.image", "imgbuild.image.cosign"): "likewise, cosign's own command",
    ("imgbuild.pipeline.index", "imgbuild.image.signstore"): "an index signed or under a policy",
    ("imgbuild.pipeline.index", "imgbuild.image.cosign"): "likewise, cosign's own command",
    ("imgbuild.cli.commands.verify", "imgbuild.image.signstore"): "an index under a policy",
    ("imgbuild.cli.views.image", "imgbuild.image.registry"): "likewise",
}

# What neither `plan` nor a no-op build loads (test_a_no_op_build_and_plan_load_nothing_heavy):
# the Docker SDK and HTTP, the compressors, and the stages that build, push and splice.
HEAVY = ("docker", "requests", "urllib3", "zstandard", "deflate", "imgbuild.image.wire",
         "imgbuild.image.buildkit", "imgbuild.image.engine", "imgbuild.image.base",
         "imgbuild.image.splice", "imgbuild.image.layercut", "imgbuild.image.context",
         "imgbuild.image.distribution", "imgbuild.image.blobcache", "imgbuild.image.exported",
         "imgbuild.image.sizes", "imgbuild.image.preflight", "imgbuild.pipeline.pull",
         "cryptography", "nacl", "imgbuild.image.cosign", "imgbuild.image.signstore",
         "imgbuild.lock.staticproof")


@pytest.mark.parametrize("module", ["imgbuild.plan.key", "imgbuild.plan.decide",
                                    "imgbuild.pipeline.plan", "imgbuild.cli.commands.plan"])
def test_planning_loads_no_terminal_or_docker(module):
    """Hashing a Plan needs neither rich nor the Docker SDK (it once imported rich)."""
    code = (f"import sys, {module}; bad = [m for m in ('docker',) + "
            f"(('rich',) if 'cli' not in '{module}' else ()) if m in sys.modules]; "
            "print(bad); sys.exit(1 if bad else 0)")
    r = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr


# `imgbuild plan tiny-cpu`, and `imgbuild tiny-cpu` where the image is here and passed its smoke
# test on this machine (the Engine faked, the report in a directory of the test's): the CLI as a
# user runs it, in a fresh interpreter; what it loaded and which processes it started.
NO_OP = """
import json, subprocess, sys
from pathlib import Path
started = []
def refuse(self, args, *a, **k):
    started.append(args if isinstance(args, str) else list(args))
    raise OSError("no process may start here")
subprocess.Popen.__init__ = refuse
from imgbuild.image import daemon, smoke
ID = "sha256:" + "5" * 64
class Image:
    id = ID
    attrs = {"Id": ID, "Size": 1}
    def tag(self, repository, tag=None, **kw):
        return True
class Images:
    def get(self, ref):
        return Image()
class Engine:
    images = Images()
daemon.client = lambda: Engine()
smoke._cache_file = lambda image_id: Path(sys.argv[3]) / "report.json"
smoke.remember(smoke.SmokeReport("imgbuild:tiny-cpu", True, ({"name": "environment",
               "status": "pass"},), 1.0, {"ok": True}, ID))
from imgbuild.cli.main import main
rc = main(json.loads(sys.argv[1]))
heavy = json.loads(sys.argv[2])
print(json.dumps({"rc": rc, "started": started,
                  "loaded": [m for m in heavy if m in sys.modules]}))
"""


def _chains(loaded: list[str], entry: str) -> list[str]:
    """For each module `loaded`, the chain of top-level imports that leads to it from `entry`
    (read from the source: the message names the import to move into its function)."""
    edges: dict[str, set[str]] = {}
    for name, path in MODULES.items():
        for mod, _ in _imports(name, path, top_level_only=True):
            while mod.count(".") and mod not in MODULES and not mod.startswith(tuple(HEAVY)):
                mod = mod.rpartition(".")[0]
            edges.setdefault(name, set()).add(mod)
    out = []
    for target in loaded:
        seen, queue = {entry: [entry]}, [entry]
        while queue:
            at = queue.pop(0)
            for nxt in sorted(edges.get(at, ())):
                if nxt not in seen:
                    seen[nxt] = seen[at] + [nxt]
                    queue.append(nxt)
        hit = next((m for m in seen if m == target or m.startswith(target + ".")), None)
        out.append(" -> ".join(seen[hit]) if hit else f"{target} (loaded at run time)")
    return out


@pytest.fixture(scope="module")
def checks_cached() -> None:
    """The dependency check's facts in this machine's cache, as after a user's first `plan`: a
    cold cache fetches wheels (requests), which is not what this is about."""
    r = subprocess.run([sys.executable, "-m", "imgbuild.cli", "plan", "tiny-cpu"], cwd=ROOT,
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]


@pytest.mark.parametrize("argv,entry", [
    (["tiny-cpu"], "imgbuild.cli.commands.build"),
    (["plan", "tiny-cpu"], "imgbuild.cli.commands.plan"),
], ids=["no-op build", "plan"])
def test_a_no_op_build_and_plan_load_nothing_heavy(checks_cached, tmp_path, argv, entry):
    """Importing the docker SDK, requests and the compressors, BuildKit's driver, the wire and
    the base images took longer than the rest of a no-op build, which was 2.2x `plan` with them
    (issue 46): neither loads them, and the no-op build starts no process (`git`, `docker`)."""
    import json

    r = subprocess.run([sys.executable, "-c", NO_OP, json.dumps(argv), json.dumps(HEAVY),
                        str(tmp_path)], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    got = json.loads(r.stdout.strip().splitlines()[-1])
    assert got["rc"] == 0, r.stdout[-3000:] + r.stderr[-3000:]
    if argv[0] == "tiny-cpu":
        assert "nothing to build" in r.stdout + r.stderr  # the path this test is about
        assert "smoke test not run again" in r.stdout + r.stderr
    assert got["started"] == []
    assert got["loaded"] == [], "\n".join(_chains(got["loaded"], entry))
