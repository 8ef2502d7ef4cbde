"""`imgbuild init`'s decisions, in process, with files under tmp_path only: what it may
overwrite (nothing: every file is created, never replaced, and a refusal leaves the disk as it
was), and what the spec says (name, alias, size, placeholders) before anything is written."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import yaml

from imgbuild.errors import EnvError, InputError
from imgbuild.project import (
    PLACEHOLDER_CHECKPOINT,
    PLACEHOLDER_SIZE_GB,
    TEMPLATES,
    plan_project,
    render,
    write_project,
)
from imgbuild.workspace import builtin_catalog


def tree(d: Path) -> dict[str, bytes | None]:
    return {str(p.relative_to(d)): (p.read_bytes() if p.is_file() and not p.is_symlink()
                                    else None)
            for p in sorted(d.rglob("*"))}


@pytest.fixture(scope="module")
def builtin():
    b = builtin_catalog()
    assert b is not None
    return b


def test_the_defaults(builtin, tmp_path):
    s = plan_project(builtin, Path("proj"), extends="tiny-cpu", cwd=tmp_path)
    assert s.root == tmp_path / "proj"
    assert s.name == "my-tiny-cpu" and s.alias == "my-model"
    assert s.checkpoint == PLACEHOLDER_CHECKPOINT and s.placeholder
    assert s.size_gb == PLACEHOLDER_SIZE_GB and not s.size_known
    assert s.model_name == "your model" and s.tensor_parallel == 1
    v = s.values()
    assert "PLACEHOLDER: replace it with your checkpoint" in v["checkpoint_note"]
    assert "PLACEHOLDER: replace it with the checkpoint's size" in v["size_note"]


def test_a_hub_model_given_with_its_size(builtin, tmp_path):
    s = plan_project(builtin, tmp_path / "p", extends="sglang-blackwell", name="mine",
                     model="Qwen/Qwen3-8B", tensor_parallel=2, size_gb=16.5)
    assert (s.name, s.alias, s.checkpoint, s.model_name) == ("mine", "qwen3-8b", "Qwen/Qwen3-8B",
                                                             "Qwen3-8B")
    assert not s.placeholder and s.size_known and s.size_gb == 16.5
    v = s.values()
    assert v["checkpoint_note"] == "" and v["size_note"] == ""
    assert v["size_gb"] == "16.5" and v["tp"] == "2"
    assert s.arch_example == "sm100"  # the built-in target's first arch
    assert s.pin_example.startswith("transformers==")


def test_an_alias_the_built_in_catalog_has_is_not_shadowed(builtin, tmp_path):
    s = plan_project(builtin, tmp_path / "p", extends="tiny-cpu", model="org/tiny-nvfp4")
    assert s.alias == "my-tiny-nvfp4"
    s = plan_project(builtin, tmp_path / "p", extends="tiny-cpu", model="org/K2.6")
    assert s.alias == "my-k2.6"


def test_a_local_checkpoint_is_measured_unless_a_size_is_given(builtin, tmp_path):
    ck = tmp_path / "p" / "ckpt" / "My-Model"
    ck.mkdir(parents=True)
    (ck / "w.bin").write_bytes(b"x" * 30_000_000)
    s = plan_project(builtin, tmp_path / "p", extends="tiny-cpu", model=str(ck))
    assert s.checkpoint == "ckpt/My-Model" and s.alias == "my-model"
    assert s.size_gb == 0.03 and s.size_known
    s = plan_project(builtin, tmp_path / "p", extends="tiny-cpu", model=str(ck), size_gb=2)
    assert s.size_gb == 2 and s.size_known


@pytest.mark.parametrize("kw, said", [
    ({"tensor_parallel": 0}, "not a GPU count"), ({"size_gb": 0.0}, "not a size"),
    ({"size_gb": float("inf")}, "not a size"), ({"size_gb": float("nan")}, "not a size"),
    ({"name": "smoke-model"}, "imgbuild itself runs"),
    ({"extends": "nope"}, "not a built-in target"),
])
def test_refusals_before_anything_is_written(builtin, tmp_path, kw, said):
    kw = {"extends": "tiny-cpu", **kw}
    with pytest.raises(InputError, match=said):
        plan_project(builtin, tmp_path / "p", **kw)
    assert list(tmp_path.iterdir()) == []


def test_tp_1_and_a_tiny_size_are_accepted(builtin, tmp_path):
    s = plan_project(builtin, tmp_path / "p", extends="tiny-cpu", tensor_parallel=1,
                     size_gb=0.001)
    assert s.tensor_parallel == 1 and s.size_gb == 0.001


def test_init_writes_every_file_into_an_existing_empty_directory(builtin, tmp_path):
    (tmp_path / "p" / "images").mkdir(parents=True)
    (tmp_path / "p" / "notes.txt").write_text("mine\n")
    s = plan_project(builtin, tmp_path / "p", extends="tiny-cpu", name="t")
    w = write_project(s)
    assert set(w.files) == set(render(s)) and "images/t.yaml" in w.files
    assert ".github/workflows/imgbuild.yml" in w.files  # dot- names become dot files
    assert (tmp_path / "p" / "notes.txt").read_text() == "mine\n"
    assert yaml.safe_load((tmp_path / "p" / "images" / "t.yaml").read_text())["extends"] == \
        "tiny-cpu"
    # Run again: every file is in the way now; nothing is replaced.
    (tmp_path / "p" / "README.md").write_text("edited\n")
    before = tree(tmp_path)
    with pytest.raises(InputError) as e:
        write_project(s)
    assert "nothing was written" in e.value.facts
    assert len(e.value.facts) == len(w.files) + 1
    assert tree(tmp_path) == before


def test_a_file_that_appears_while_writing_is_never_replaced(builtin, tmp_path):
    """Two template directories, one of them a symlink in the project to the other: the check
    sees two free paths, the second write finds the first's file. It is refused (O_EXCL), and
    what this run wrote is removed."""
    templates = tmp_path / "templates"
    (templates / "a").mkdir(parents=True)
    (templates / "a" / "x.txt").write_text("from a\n")
    (templates / "b").mkdir()
    (templates / "b" / "x.txt").write_text("from b\n")
    root = tmp_path / "p"
    (root / "a").mkdir(parents=True)
    (root / "b").symlink_to(root / "a")
    before = tree(tmp_path)
    s = plan_project(builtin, root, extends="tiny-cpu")
    with pytest.raises(InputError) as e:
        write_project(s, templates)
    assert "appeared while the project was written" in e.value.message
    assert e.value.facts == ["nothing was written"]
    assert not (root / "a" / "x.txt").exists()
    assert tree(tmp_path) == before


def test_a_failed_write_removes_only_the_directories_it_made(builtin, tmp_path):
    templates = tmp_path / "templates"
    shutil.copytree(TEMPLATES, templates)
    (templates / "zz" / "deep").mkdir(parents=True)
    (templates / "zz" / "deep" / ("@{name}" * 6 + ".txt")).write_text("x")
    root = tmp_path / "p"
    (root / "lockfiles").mkdir(parents=True)  # was there: stays, empty
    s = plan_project(builtin, root, extends="tiny-cpu", name="n" * 48)
    with pytest.raises(EnvError, match="File name too long"):
        write_project(s, templates)
    assert tree(root) == {"lockfiles": None}


def test_the_project_file_names_the_version_and_the_values_fill_every_template(builtin, tmp_path):
    s = plan_project(builtin, tmp_path / "p", extends="tiny-cpu", name="t", model="org/m")
    files = render(s)
    assert not any("@{" in k or "@{" in v for k, v in files.items())
    assert json.dumps(sorted(files)) == json.dumps(sorted(
        [".github/workflows/imgbuild.yml", "README.md", "images/models/m.yaml", "images/t.yaml",
         "imgbuild.yaml", "lockfiles/README.md"]))
    model = yaml.safe_load(files["images/models/m.yaml"])
    assert model["checkpoint"] == "org/m"
