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


# What the user reads: each refusal's sentence and its way out, as the uv-style errors give
# them (the chain of facts, then what to do), and the files' mode.

def test_each_refusal_says_what_and_the_way_out(builtin, tmp_path):
    def refused(**kw) -> InputError:
        with pytest.raises(InputError) as e:
            plan_project(builtin, tmp_path / "p", **{"extends": "tiny-cpu", **kw})
        return e.value

    e = refused(extends="tiny-cpux")
    assert e.message == "--extends tiny-cpux: not a built-in target"
    assert e.facts and e.facts[0].startswith("known built-in targets: ")
    assert "tiny-cpu" in e.facts[0] and e.hint == "did you mean 'tiny-cpu'?"
    e = refused(name="Not A Name")
    assert e.message == "--name 'Not A Name': not a name imgbuild can use"
    e = refused(name="smoke-model")
    assert e.hint == "choose another name, e.g. my-smoke-model"
    e = refused(tensor_parallel=0)
    assert (e.message, e.hint) == ("--tp 0: not a GPU count",
                                   "give the number of GPUs the model is sharded over (1 or more)")
    e = refused(size_gb=-1.0)
    assert (e.message, e.hint) == ("--size-gb -1: not a size",
                                   "give the checkpoint's size on disk in GB, e.g. 16")


def test_the_model_name_is_the_checkpoints_last_part(builtin, tmp_path):
    s = plan_project(builtin, tmp_path / "p", extends="tiny-cpu", model="acme/Model-X")
    assert s.model_name == "Model-X"
    # A local checkpoint outside the project: its absolute path, its directory's name.
    outside = tmp_path / "store" / "ckpts" / "Deep-One"
    outside.mkdir(parents=True)
    (outside / "w.bin").write_bytes(b"x")
    s = plan_project(builtin, tmp_path / "p", extends="tiny-cpu", model=str(outside))
    assert (s.checkpoint, s.model_name) == (str(outside), "Deep-One")
    # Inside the project, at its top: a bare relative path.
    inside = tmp_path / "p" / "ckpt"
    inside.mkdir(parents=True)
    (inside / "w.bin").write_bytes(b"x")
    s = plan_project(builtin, tmp_path / "p", extends="tiny-cpu", model=str(inside))
    assert (s.checkpoint, s.model_name) == ("ckpt", "ckpt")


def test_the_arch_example_is_the_targets_first_arch(builtin, tmp_path):
    assert plan_project(builtin, tmp_path / "p", extends="tiny-cpu").arch_example == "cpu"
    assert plan_project(builtin, tmp_path / "p",
                        extends="sglang-hopper").arch_example == "sm90"


def test_what_is_in_the_way_is_counted_and_the_way_out_named(builtin, tmp_path):
    s = plan_project(builtin, tmp_path / "p", extends="tiny-cpu", name="t")
    (tmp_path / "p").mkdir()
    (tmp_path / "p" / "imgbuild.yaml").write_text("mine\n")
    with pytest.raises(InputError) as e:
        write_project(s)
    assert e.value.message == f"cannot write the project into {tmp_path / 'p'}: 1 path in the way"
    assert e.value.facts == [f"{tmp_path / 'p' / 'imgbuild.yaml'} exists", "nothing was written"]
    assert e.value.hint == ("choose another directory (imgbuild init DIR) or another --name, "
                            "or move those files away")
    (tmp_path / "p" / "README.md").write_text("mine\n")
    with pytest.raises(InputError) as e:
        write_project(s)
    assert e.value.message == f"cannot write the project into {tmp_path / 'p'}: 2 paths in the way"


def test_files_are_written_readable_by_all_writable_by_the_owner(builtin, tmp_path):
    import os

    s = plan_project(builtin, tmp_path / "p", extends="tiny-cpu", name="t")
    old = os.umask(0o022)
    try:
        w = write_project(s)
    finally:
        os.umask(old)
    modes = {rel: (tmp_path / "p" / rel).stat().st_mode & 0o777 for rel in w.files}
    assert set(modes.values()) == {0o644}, modes


def test_a_file_that_appears_is_named_with_the_way_out(builtin, tmp_path):
    templates = tmp_path / "templates"
    for d in ("a", "b"):
        (templates / d).mkdir(parents=True)
        (templates / d / "x.txt").write_text(d)
    root = tmp_path / "p"
    (root / "a").mkdir(parents=True)
    (root / "b").symlink_to(root / "a")
    with pytest.raises(InputError) as e:
        write_project(plan_project(builtin, root, extends="tiny-cpu"), templates)
    assert e.value.message == f"{root / 'b' / 'x.txt'} appeared while the project was written"
    assert e.value.hint == "run `imgbuild init` again"


def test_a_refused_write_names_the_file_it_could_not_write(builtin, tmp_path):
    templates = tmp_path / "templates"
    (templates / "zz").mkdir(parents=True)
    (templates / "zz" / ("@{name}" * 6 + ".txt")).write_text("x")
    s = plan_project(builtin, tmp_path / "p", extends="tiny-cpu", name="n" * 48)
    with pytest.raises(EnvError) as e:
        write_project(s, templates)
    path = tmp_path / "p" / "zz" / ("n" * 288 + ".txt")
    assert e.value.message.startswith(f"cannot write the project file {path}: ")
    assert e.value.facts == [f"{path} is as it was before this command"]


def test_each_checkpoint_refusal_says_what_and_the_way_out(builtin, tmp_path):
    def refused(model: str) -> InputError:
        with pytest.raises(InputError) as e:
            plan_project(builtin, tmp_path / "p", extends="tiny-cpu", model=model)
        return e.value

    e = refused("  ")
    assert (e.message, e.hint) == ("--model is empty", "give a Hugging Face repo id (org/name) "
                                   "or a local directory, or leave --model out")
    # Absolute and home paths are local, there or not: no such directory, not a bad repo id.
    for given, path in (("/no/such/ckpt", Path("/no/such/ckpt")),
                        ("~/no-such-ckpt", Path("~/no-such-ckpt").expanduser())):
        e = refused(given)
        assert e.message == f"--model {given}: no such directory"
        assert e.facts == [f"looked for {path}"]
        assert e.hint == ("give a checkpoint directory (with its config.json) or a Hugging Face "
                          "repo id (org/name)")
    e = refused("org/a b")
    assert e.message == "--model org/a b: neither a local directory nor a Hugging Face repo id"
    assert e.hint == ("a repo id is org/name (letters, digits, '.', '_', '-'), e.g. "
                      "Qwen/Qwen3-8B")


def test_each_name_refusal_gives_its_reason(builtin, tmp_path):
    with pytest.raises(InputError) as e:
        plan_project(builtin, tmp_path / "p", extends="tiny-cpu", name="Bad")
    assert e.value.facts == ["it names a file under images/, its locks and its image tags"]
    assert e.value.hint == ("use lowercase letters, digits, '.', '_' and '-', starting with a "
                            "letter or digit (at most 48 characters), e.g. my-sglang")
    with pytest.raises(InputError) as e:
        plan_project(builtin, tmp_path / "p", extends="tiny-cpu", name="build",
                     reserved=frozenset({"build"}))
    assert e.value.message == "--name 'build' is an imgbuild command"
    assert e.value.facts == ["`imgbuild build` runs the command, not a build of the target"]
    assert e.value.hint == "choose another name, e.g. my-build"


@pytest.mark.parametrize("model, alias, model_name", [
    ("acme/Model-X", "model-x", "Model-X"),
    ("gpt2", "gpt2", "gpt2"),  # a repo id without an org
    # Cut at 48 characters, at a '-': the '-' goes too.
    ("acme/" + "a" * 47 + "-b", "a" * 47, "a" * 47 + "-b"),
])
def test_the_alias_and_model_name_of_a_repo_id(builtin, tmp_path, model, alias, model_name):
    s = plan_project(builtin, tmp_path / "p", extends="tiny-cpu", model=model)
    assert (s.alias, s.model_name) == (alias, model_name)


def test_a_local_checkpoints_odd_name_gives_a_clean_alias(builtin, tmp_path):
    ck = tmp_path / "_Odd Name_"
    ck.mkdir()
    (ck / "w.bin").write_bytes(b"x")
    s = plan_project(builtin, tmp_path / "p", extends="tiny-cpu", model=str(ck))
    assert s.alias == "odd-name"


def test_the_pin_example_is_the_locked_version_or_a_placeholder(builtin, tmp_path):
    from imgbuild.project import _pin_example
    from imgbuild.workspace import Workspace

    ws = Workspace(builtin.images, builtin.lockfiles)
    locked = ws.target("tiny-cpu").lock().package("transformers")
    assert _pin_example(ws, "tiny-cpu") == f"transformers=={locked.version}"
    no_locks = Workspace(builtin.images, tmp_path / "no-lockfiles")
    assert _pin_example(no_locks, "tiny-cpu") == "transformers==VERSION"


def test_a_file_on_the_way_to_a_nested_file_is_in_the_way(builtin, tmp_path):
    root = tmp_path / "p"
    root.mkdir()
    (root / ".github").write_text("a file\n")
    s = plan_project(builtin, root, extends="tiny-cpu", name="t")
    with pytest.raises(InputError) as e:
        write_project(s)
    assert e.value.facts == [f"{root / '.github'} is a file, not a directory",
                             "nothing was written"]


def test_the_notes_a_placeholder_leaves_in_the_files(builtin, tmp_path):
    v = plan_project(builtin, tmp_path / "p", extends="tiny-cpu").values()
    assert v["checkpoint_note"] == ("\n# PLACEHOLDER: replace it with your checkpoint (the "
                                    "profile cannot be used before).")
    assert v["size_note"] == ("\n# PLACEHOLDER: replace it with the checkpoint's size "
                              "(`imgbuild init --size-gb G` writes it).")


def test_the_version_named_is_the_installed_ones(monkeypatch):
    from importlib.metadata import PackageNotFoundError, version

    import imgbuild.project as project

    assert project.imgbuild_version() == version("imgbuild")

    def missing(name):
        raise PackageNotFoundError(name)

    monkeypatch.setattr(project, "version", missing)
    assert project.imgbuild_version() == "unknown"


def test_templates_dot_names_at_any_depth_and_no_bytecode(builtin, tmp_path):
    templates = tmp_path / "templates"
    (templates / "sub" / "__pycache__").mkdir(parents=True)
    (templates / "sub" / "dot-env").write_text("@{name}\n")
    (templates / "sub" / "__pycache__" / "x.pyc").write_text("junk")
    s = plan_project(builtin, tmp_path / "p", extends="tiny-cpu", name="t")
    assert render(s, templates) == {"sub/.env": "t\n"}
    (templates / "sub" / "bad.txt").write_text("@{nope}\n")
    with pytest.raises(KeyError, match=r"sub/bad.txt: unknown placeholder @\{nope\}"):
        render(s, templates)
    (templates / "sub" / "bad.txt").unlink()
    (templates / "sub" / "@{nope}.txt").write_text("x\n")
    with pytest.raises(KeyError, match=r"sub/@\{nope\}.txt: unknown placeholder"):
        render(s, templates)


def test_missing_templates_say_to_reinstall(builtin, tmp_path):
    s = plan_project(builtin, tmp_path / "p", extends="tiny-cpu", name="t")
    (tmp_path / "empty").mkdir()
    with pytest.raises(InputError) as e:
        render(s, tmp_path / "empty")
    assert e.value.message == f"imgbuild's project templates are missing: {tmp_path / 'empty'}"
    assert e.value.hint == "reinstall imgbuild from its wheel"
