"""A user's project over the built-in catalog (imgbuild/workspace.py, catalog/layers.py): its
targets, model profiles, patches and failure entries add to the built-in ones or shadow them
by name, a target extends another and gives only what differs, and nothing is written into the
built-in layer. The CLI runs from inside the project, as a user runs it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from imgbuild.catalog.catalog import load_catalog
from imgbuild.catalog.layers import BUILTIN, PROJECT, Layer
from imgbuild.errors import SpecError
from imgbuild.plan.decide import spec_digest
from imgbuild.workspace import Workspace

from . import golden
from .conftest import ROOT, WHEELS


def project(root: Path, files: dict[str, str]) -> Path:
    """A project: imgbuild.yaml and the given files under it."""
    root.mkdir(parents=True, exist_ok=True)
    (root / "imgbuild.yaml").write_text("# an imgbuild project\n")
    (root / "images").mkdir(exist_ok=True)
    for rel, text in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
    return root


def cli(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith("IMGBUILD_")}
    env |= {"UV_PYTHON_DOWNLOADS": "never", "HF_HUB_OFFLINE": "1"}
    if WHEELS:
        env["IMGBUILD_WHEELS"] = WHEELS
    return subprocess.run([sys.executable, "-m", "imgbuild.cli", *args], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=900)


def layers(proj: Path) -> list[Layer]:
    return [Layer(ROOT / "images", BUILTIN), Layer(proj / "images", PROJECT)]


def _tree(d: Path) -> dict[str, bytes]:
    return {str(p.relative_to(d)): p.read_bytes() for p in sorted(d.rglob("*")) if p.is_file()
            and "__pycache__" not in p.parts}


# --- extends ----------------------------------------------------------------------------------

def test_a_target_gives_only_what_differs_from_its_parent(tmp_path):
    proj = project(tmp_path / "p", {"images/mine.yaml": """
extends: tiny-cpu
engine: {version: "5.18.0"}
requirements:
  - compressed-tensors==0.20.0
  - my-extra-package
""", "images/old.yaml": """
extends: sglang-0516-blackwell
archs: [sm120]
patches: [sglang-ct-mixed-precision-format, my-patch]
"""})
    cat = load_catalog(layers(proj))
    parent, mine = cat.targets["tiny-cpu"], cat.targets["mine"]
    assert (mine.engine, mine.engine_version) == ("transformers", "5.18.0")  # the name kept
    assert (mine.archs, mine.os, mine.flavor, mine.smoke_model, mine.indexes) == (
        parent.archs, parent.os, parent.flavor, parent.smoke_model, parent.indexes)
    # One pin replaced where it stood, one added after the parent's.
    assert parent.requirements == ("torch==2.13.0", "compressed-tensors==0.19.0", "safetensors")
    assert mine.requirements == ("torch==2.13.0", "compressed-tensors==0.20.0", "safetensors",
                                 "my-extra-package")
    # Patches add to the parent's, each once; archs replace the parent's.
    old, base = cat.targets["old"], cat.targets["sglang-0516-blackwell"]
    assert old.archs == ("sm120",) and base.archs != old.archs
    assert old.patches == base.patches + ("my-patch",) and len(base.patches) >= 2
    prov = cat.provenance["mine"]
    assert prov["engine.version"] == "images/mine.yaml (project)"
    assert prov["engine.name"] == prov["os"] == "images/tiny-cpu.yaml (built-in)"
    assert prov["requirements[torch]"] == "images/tiny-cpu.yaml (built-in)"
    assert prov["requirements[compressed-tensors]"] == "images/mine.yaml (project)"
    assert prov["requirements[my-extra-package]"] == "images/mine.yaml (project)"
    assert prov["extends"] == "images/mine.yaml (project)"
    assert cat.provenance["old"]["patches[my-patch]"] == "images/old.yaml (project)"
    assert cat.provenance["old"]["archs"] == "images/old.yaml (project)"


def test_a_target_that_extends_its_own_name_reads_as_the_one_it_shadows(tmp_path):
    """No change but the `extends:` line: the same spec, so the same content key."""
    proj = project(tmp_path / "p", {"images/tiny-cpu.yaml": "extends: tiny-cpu\n"})
    mine = load_catalog(layers(proj)).targets["tiny-cpu"]
    shipped = load_catalog(ROOT / "images").targets["tiny-cpu"]
    assert spec_digest(mine) == spec_digest(shipped)
    r = cli("plan", "tiny-cpu", "--json", cwd=proj)
    assert r.returncode == 0, r.stderr[-2000:]
    doc = json.loads(r.stdout)
    assert doc["content_tag"] == golden.recorded()["tiny-cpu"]
    assert doc["source"]["layer"] == "project"
    assert doc["lock_path"].endswith("(built-in)")  # the shipped lock answers it: none written
    assert not (proj / "lockfiles").exists()
    assert doc["source"]["shadowing"] == [
        "target 'tiny-cpu' is the project's (images/tiny-cpu.yaml), shadowing the built-in one "
        "(images/tiny-cpu.yaml (built-in))"]
    # Said once on the terminal, as a note.
    r = cli("plan", "tiny-cpu", cwd=proj)
    assert r.returncode == 0 and r.stderr.count("shadowing the built-in one") == 1


@pytest.mark.parametrize("files, expect", [
    ({"images/a.yaml": "extends: b\n", "images/b.yaml": "extends: a\n"},
     "a chain of targets that ends"),
    ({"images/a.yaml": "extends: a\n"}, "there is no built-in 'a'"),
    ({"images/a.yaml": "extends: sglang-blackwel\n"}, "did you mean 'sglang-blackwell'?"),
    ({"images/a.yaml": "extends: [tiny-cpu]\n"}, "the name of a target to start from"),
])
def test_cycles_and_unknown_parents_are_clear_errors(tmp_path, files, expect):
    proj = project(tmp_path / "p", files)
    with pytest.raises(SpecError):
        load_catalog(layers(proj))
    r = cli("list", cwd=proj)
    said = " ".join(r.stderr.split())
    assert r.returncode == 2 and expect in said and "images/a.yaml" in said, said
    assert "Traceback" not in said


def test_a_cycle_through_the_built_in_layer_names_each_file(tmp_path):
    proj = project(tmp_path / "p", {"images/x.yaml": "extends: y\n",
                                    "images/y.yaml": "extends: z\n",
                                    "images/z.yaml": "extends: x\n"})
    with pytest.raises(SpecError) as e:
        load_catalog(layers(proj))
    assert "x (images/x.yaml) -> y (images/y.yaml) -> z (images/z.yaml) -> x" in str(e.value)


# --- the layers -------------------------------------------------------------------------------

def test_project_entries_add_to_the_built_in_ones(tmp_path):
    failure = """failures:
  - id: widget-missing
    title: a widget is missing
    severity: error
    match:
      - regex: 'WidgetError: no widget (?P<name>\\w+)'
        contains: "WidgetError: no widget "
    cause: the {name} widget was not installed
    fix: install it
    sources:
      - {in: widgets==1.0, at: widgets/core.py:10}
"""
    model = (ROOT / "images" / "models" / "k2.6.yaml").read_text().replace(
        "name: Kimi K2.6", "name: Kimi K2.6 (our mirror)")
    proj = project(tmp_path / "p", {"images/checks/failures.yaml": failure,
                                    "images/models/k2.6.yaml": model})
    ws = Workspace.open(env={}, cwd=proj)
    assert ws.base is not None and ws.images == proj / "images"
    ids = [f.id for f in ws.failures.fingerprints]
    assert ids[0] == "widget-missing" and "vllm-no-compatible-scheme" in ids
    assert ws.catalog.models["k2.6"].name == "Kimi K2.6 (our mirror)"
    assert ws.catalog.shadowed == {"model k2.6": "images/models/k2.6.yaml (built-in)"}
    assert set(ws.catalog.targets) == set(load_catalog(ROOT / "images").targets)
    (proj / "server.log").write_text("boot\nWidgetError: no widget gear\n")
    r = cli("doctor", "server.log", "--json", cwd=proj)
    assert r.returncode == 1, r.stderr[-2000:]
    assert json.loads(r.stdout)["diagnoses"][0]["id"] == "widget-missing"
    r = cli("plan", "sglang-blackwell", "--model", "k2.6", cwd=proj)
    assert r.returncode == 0, r.stderr[-2000:]
    assert "model 'k2.6' is the project's (images/models/k2.6.yaml), shadowing" in " ".join(
        r.stderr.split())


def test_a_whole_catalog_replaces_the_built_in_one(tmp_path):
    """An images/ with its own bases.yaml (a fork, this repository) is not layered."""
    ws = Workspace.open(ROOT / "images", env={})
    assert ws.base is None and len(ws.layers) == 1
    assert ws.catalog.shadowed == {}


def test_locking_a_built_in_target_in_a_project_copies_its_lock(tmp_path):
    proj = project(tmp_path / "p", {})
    before = _tree(ROOT / "lockfiles")
    r = cli("lock", "tiny-cpu", cwd=proj)
    assert r.returncode == 0, r.stderr[-2000:]
    name = "tiny-cpu.py3.11-manylinux_2_36-x86_64.txt"
    assert "copied the built-in lock into the project" in " ".join(r.stderr.split())
    assert (proj / "lockfiles" / name).read_bytes() == (ROOT / "lockfiles" / name).read_bytes()
    assert _tree(ROOT / "lockfiles") == before
    # From now on the project's lock is the one read.
    r = cli("plan", "tiny-cpu", "--json", cwd=proj)
    assert json.loads(r.stdout)["lock_path"] == f"lockfiles/{name}"


def test_relock_of_a_built_in_target_asks_for_the_projects_own(tmp_path):
    """relock rewrites a target's spec and lock: for a built-in target, that is the project's
    job (a target of its own that extends it), said before anything is resolved."""
    proj = project(tmp_path / "p", {})
    before = _tree(ROOT / "images") | _tree(ROOT / "lockfiles")
    r = cli("relock", "tiny-cpu", "--upgrade", "torch", cwd=proj)
    said = " ".join(r.stderr.split())
    assert r.returncode == 2, said
    assert "would rewrite images/tiny-cpu.yaml, which is the built-in catalog's" in said
    assert "`extends: tiny-cpu`" in said and "Traceback" not in said
    assert sorted(p.name for p in proj.iterdir()) == ["images", "imgbuild.yaml"]
    assert not list((proj / "images").iterdir())
    assert _tree(ROOT / "images") | _tree(ROOT / "lockfiles") == before
