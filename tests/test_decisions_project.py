"""`extends:` merging (catalog/layers.py merge, resolve_targets) on plain mappings, and the
decisions of a project (project.py: names, the checkpoint, the alias, what is in the way),
with files only under tmp_path."""

from __future__ import annotations

from pathlib import Path

import pytest

from imgbuild import project as P
from imgbuild.catalog.layers import BUILTIN, PROJECT, Layer, RawTarget, merge, resolve_targets
from imgbuild.errors import InputError, SpecError

PARENT = {
    "engine": {"name": "sglang", "version": "0.5.16"},
    "smoke": {"model": "tiny", "timeout": 60},
    "requirements": ["torch==2.10.0", "Transformers>=4.50", "sglang==0.5.16"],
    "overrides": [{"requirement": "compressed-tensors==0.9", "reason": "r"}],
    "indexes": [{"name": "pytorch", "url": "u1"}],
    "patches": ["p1", "p2"],
    "archs": ["sm100", "sm120"],
    "flavor": "devel",
}


def _merge(child, parent=PARENT):
    from imgbuild.catalog.layers import _provenance
    return merge(parent, _provenance(parent, "parent.yaml"), child, "child.yaml")


def test_a_requirement_is_replaced_by_name_in_place_and_new_ones_append():
    out, prov = _merge({"requirements": ["transformers==4.57.1", "accelerate"]})
    assert out["requirements"] == ["torch==2.10.0", "transformers==4.57.1", "sglang==0.5.16",
                                   "accelerate"]
    assert prov["requirements[transformers]"] == "child.yaml"
    assert prov["requirements[accelerate]"] == "child.yaml"
    assert prov["requirements[torch]"] == "parent.yaml"
    assert PARENT["requirements"][1] == "Transformers>=4.50"  # the parent is not changed


def test_overrides_and_indexes_merge_by_their_names():
    out, prov = _merge({"overrides": [{"requirement": "compressed-tensors==0.10", "reason": "x"},
                                      {"requirement": "numpy<2", "reason": "y"}],
                        "indexes": [{"name": "pytorch", "url": "u2"}]})
    assert out["overrides"] == [{"requirement": "compressed-tensors==0.10", "reason": "x"},
                                {"requirement": "numpy<2", "reason": "y"}]
    assert out["indexes"] == [{"name": "pytorch", "url": "u2"}]
    assert prov["overrides[compressed-tensors]"] == "child.yaml"
    assert prov["indexes[pytorch]"] == "child.yaml"


def test_patches_add_to_the_parents_without_duplicates_and_keep_their_origin():
    out, prov = _merge({"patches": ["p2", "p3"]})
    assert out["patches"] == ["p1", "p2", "p3"]
    assert prov["patches[p2]"] == "parent.yaml"  # the parent's already
    assert prov["patches[p3]"] == "child.yaml"


def test_mappings_merge_key_by_key_the_childs_winning():
    out, prov = _merge({"engine": {"version": "0.5.23"}})
    assert out["engine"] == {"name": "sglang", "version": "0.5.23"}
    assert prov["engine.version"] == "child.yaml" and prov["engine.name"] == "parent.yaml"
    assert PARENT["engine"]["version"] == "0.5.16"


def test_anything_else_is_replaced_whole_and_its_old_provenance_goes():
    out, prov = _merge({"archs": ["sm90"], "flavor": "slim", "smoke": None})
    assert out["archs"] == ["sm90"] and out["flavor"] == "slim"
    assert prov["archs"] == "child.yaml" and prov["flavor"] == "child.yaml"
    assert out["smoke"] is None
    assert prov["smoke"] == "child.yaml"
    assert not [p for p in prov if p.startswith("smoke.")]
    # A list given where the parent had no list replaces it too, its entries the child's.
    out, prov = _merge({"requirements": ["a"]}, parent={"requirements": "x"})
    assert out["requirements"] == ["a"] and prov == {"requirements[a]": "child.yaml"}


def test_extends_itself_is_not_a_field():
    out, prov = _merge({"extends": "parent", "flavor": "slim"})
    assert "extends" not in out and "extends" not in prov


def _raw(layer: int, **targets) -> dict[str, RawTarget]:
    return {n: RawTarget(n, f"images/{n}.yaml", d, layer) for n, d in targets.items()}


LAYERS = [Layer(Path("/b"), BUILTIN), Layer(Path("/p"), PROJECT)]


def test_a_chain_resolves_grandparent_first_and_the_project_shadows():
    raw = [_raw(0, a={"flavor": "devel", "archs": ["sm100"], "patches": ["x"]},
                b={"extends": "a", "flavor": "slim"}),
           _raw(1, c={"extends": "b", "archs": ["sm120"], "patches": ["y"]},
                a={"extends": "a", "patches": ["z"]})]
    got = resolve_targets(LAYERS, raw)
    assert got["a"][1] == {"flavor": "devel", "archs": ["sm100"], "patches": ["x", "z"]}
    assert got["a"][0].layer == 1
    # b (built-in) extends the built-in a: a parent is looked for in its own layer and below.
    assert got["b"][1] == {"flavor": "slim", "archs": ["sm100"], "patches": ["x"]}
    # c (project) extends b, whose parent in the built-in layer is the built-in a.
    assert got["c"][1] == {"flavor": "slim", "archs": ["sm120"], "patches": ["x", "y"]}
    prov = got["c"][2]
    assert prov["flavor"] == "images/b.yaml (built-in)"
    assert prov["archs"] == "images/c.yaml (project)"
    assert prov["patches[x]"] == "images/a.yaml (built-in)"
    assert prov["extends"] == "images/c.yaml (project)"


def test_a_project_target_extending_a_name_finds_the_projects_first():
    raw = [_raw(0, a={"flavor": "devel"}), _raw(1, a={"flavor": "slim"},
                                                 c={"extends": "a"})]
    assert resolve_targets(LAYERS, raw)["c"][1] == {"flavor": "slim"}


def test_one_layer_names_no_layer():
    got = resolve_targets(LAYERS[:1], [_raw(0, a={"flavor": "x"}, b={"extends": "a"})])
    assert got["b"][2] == {"flavor": "images/a.yaml", "extends": "images/b.yaml"}


@pytest.mark.parametrize("raw, expected", [
    ([_raw(0, a={"extends": "a"})], "another target's name"),
    ([_raw(0, a={"extends": "b"}, b={"extends": "a"})], "no cycle"),
    ([_raw(0, a={"extends": "zzz"})], "a target of the catalog"),
    ([_raw(0, a={"extends": ""})], "the name of a target"),
    ([_raw(0, a={"extends": 3})], "the name of a target"),
])
def test_bad_chains_are_spec_errors(raw, expected):
    with pytest.raises(SpecError) as e:
        resolve_targets(LAYERS[:1], raw)
    assert expected in e.value.expected and e.value.key == "extends"


def test_a_built_in_target_cannot_extend_a_project_one():
    raw = [_raw(0, b={"extends": "p"}), _raw(1, p={"flavor": "x"})]
    with pytest.raises(SpecError) as e:
        resolve_targets(LAYERS, raw)
    assert e.value.expected.startswith("a target of the catalog") and "p" not in e.value.expected


# --- project.py ----------------------------------------------------------------------------

@pytest.mark.parametrize("name, ok", [
    ("my-sglang", True), ("a", True), ("0a", True), ("a" * 48, True), ("a" * 49, False),
    ("-a", False), ("A", False), ("a/b", False), ("a b", False), ("", False), ("a.b_c-d", True)])
def test_names_imgbuild_can_use(name, ok):
    if ok:
        assert P.check_name(name, "--name") == name
    else:
        with pytest.raises(InputError, match="not a name imgbuild can use"):
            P.check_name(name, "--name")


def test_a_command_word_is_not_a_target_name():
    with pytest.raises(InputError, match="is an imgbuild command"):
        P.check_name("run", "--name", frozenset({"run", "build"}))
    assert P.check_name("runner", "--name", frozenset({"run"})) == "runner"


@pytest.mark.parametrize("text, alias", [
    ("Qwen/Qwen3-8B", "qwen3-8b"), ("org/Model_Name.v2/", "model_name.v2"),
    ("/data/ckpts/My Model!", "my-model"), ("!!!", "my-model"), ("org/" + "x" * 60, "x" * 48)])
def test_the_alias_of_a_checkpoint(text, alias):
    assert P._alias_of(text) == alias


def test_the_checkpoint_as_the_profile_writes_it(tmp_path):
    root = tmp_path / "proj"
    (root / "ckpt").mkdir(parents=True)
    (tmp_path / "outside").mkdir()
    assert P._checkpoint(None, root, tmp_path) == (P.PLACEHOLDER_CHECKPOINT, None)
    assert P._checkpoint("Qwen/Qwen3-8B", root, tmp_path) == ("Qwen/Qwen3-8B", None)
    assert P._checkpoint("gpt2", root, tmp_path) == ("gpt2", None)
    # A local directory inside the project: relative to it; outside: absolute.
    assert P._checkpoint("proj/ckpt", root, tmp_path) == ("ckpt", root / "ckpt")
    assert P._checkpoint("./outside", root, tmp_path) == (str(tmp_path / "outside"),
                                                          tmp_path / "outside")
    with pytest.raises(InputError, match="no such directory"):
        P._checkpoint("./missing", root, tmp_path)
    with pytest.raises(InputError, match="neither a local directory"):
        P._checkpoint("a/b/c", root, tmp_path)
    with pytest.raises(InputError, match="--model is empty"):
        P._checkpoint("  ", root, tmp_path)


def test_a_local_checkpoints_size_is_measured_rounded_up(tmp_path):
    (tmp_path / "a.bin").write_bytes(b"x" * 10)
    assert P._dir_size_gb(tmp_path) == 0.01
    (tmp_path / "b.bin").write_bytes(b"x" * 10_000_000)
    assert P._dir_size_gb(tmp_path) == 0.02  # 0.01000001 GB rounds up


def test_fill_refuses_an_unknown_placeholder():
    assert P.fill("a @{name} b @{x}", {"name": "n", "x": "1"}, "f") == "a n b 1"
    assert P.fill("${{ github.sha }} {name}", {}, "f") == "${{ github.sha }} {name}"
    with pytest.raises(KeyError, match="f: unknown placeholder @{nope}"):
        P.fill("@{nope}", {}, "f")


def test_what_is_in_the_way_of_a_project(tmp_path):
    files = {"imgbuild.yaml": "", "images/t.yaml": "", "images/models/m.yaml": ""}
    root = tmp_path / "p"
    assert P._clashes(root, files) == []
    (root / "images").mkdir(parents=True)
    assert P._clashes(root, files) == []  # an empty directory on the way is fine
    (root / "imgbuild.yaml").write_text("mine")
    (root / "images" / "models").write_text("a file")
    assert P._clashes(root, files) == [f"{root / 'imgbuild.yaml'} exists",
                                       f"{root / 'images' / 'models'} is a file, not a directory"]
    f = tmp_path / "file"
    f.write_text("x")
    assert P._clashes(f / "p", files)[0] == f"{f} is a file, not a directory"
    (root / "images" / "t.yaml").symlink_to(tmp_path / "dangling")
    assert f"{root / 'images' / 't.yaml'} exists" in P._clashes(root, files)


# --- workspace.py: which project, which files ------------------------------------------------

from imgbuild.workspace import (  # noqa: E402
    PROJECT_FILE,
    Builtin,
    Workspace,
    _discover,
    builtin_catalog,
    read_project,
)

from .conftest import ROOT  # noqa: E402


def _project(d: Path, text: str = "") -> Path:
    (d / "images").mkdir(parents=True, exist_ok=True)
    (d / PROJECT_FILE).write_text(text)
    return d


def test_the_nearest_project_or_whole_catalog_wins(tmp_path):
    outer = _project(tmp_path / "outer")
    inner = outer / "a" / "inner"
    (inner / "images").mkdir(parents=True)
    (inner / "images" / "bases.yaml").write_text("")
    deep = inner / "x" / "y"
    deep.mkdir(parents=True)
    assert _discover(deep) == (inner / "images", inner / "lockfiles")
    assert _discover(outer / "a") == ((outer / "images").absolute(),
                                      (outer / "lockfiles").absolute())
    # A project file and a catalog in one directory: the project file.
    _project(inner)
    assert _discover(deep)[0] == (inner / "images").absolute()
    assert _discover(tmp_path) is None


def test_a_project_file_may_move_images_and_lockfiles(tmp_path):
    p = tmp_path / "p"
    (p / "specs").mkdir(parents=True)
    (p / PROJECT_FILE).write_text("images: specs\nlockfiles: ../locks\n")
    assert read_project(p / PROJECT_FILE) == ((p / "specs").absolute(),
                                              (p / "../locks").absolute())
    (p / PROJECT_FILE).write_text("images: nowhere\n")
    with pytest.raises(InputError, match="is not a directory"):
        read_project(p / PROJECT_FILE)
    (p / PROJECT_FILE).write_text("image: specs\n")
    with pytest.raises(SpecError):
        read_project(p / PROJECT_FILE)


def test_open_takes_arguments_then_environment_then_discovery(tmp_path):
    a, b = _project(tmp_path / "a"), _project(tmp_path / "b")
    env = {"IMGBUILD_IMAGES": str(b / "images"), "IMGBUILD_LOCKFILES": str(tmp_path / "envlocks")}
    ws = Workspace.open(a / "images", env=env, cwd=tmp_path)
    assert ws.images == (a / "images").absolute()
    assert ws.lockfiles == (tmp_path / "envlocks").absolute()  # not given: the environment's
    ws = Workspace.open(env=env, cwd=a)
    assert ws.images == (b / "images").absolute()
    ws = Workspace.open(env={}, cwd=a)
    assert ws.images == (a / "images").absolute() and ws.lockfiles == (a / "lockfiles").absolute()
    ws = Workspace.open(a / "images", tmp_path / "mine", env=env, cwd=b)
    assert ws.lockfiles == (tmp_path / "mine").absolute()
    # --images without a project file: lockfiles/ beside it.
    assert Workspace.open(a / "images", env={}, cwd=tmp_path).lockfiles == a / "lockfiles"
    with pytest.raises(InputError, match="no such directory"):
        Workspace.open(tmp_path / "none", env={}, cwd=tmp_path)
    with pytest.raises(InputError, match="--wheels"):
        Workspace.open(a / "images", wheels=tmp_path / "nowheels", env={}, cwd=tmp_path)


def test_a_project_adds_to_the_built_in_catalog_a_whole_catalog_replaces_it(tmp_path):
    if builtin_catalog() is None:
        pytest.skip("no built-in catalog")
    a = _project(tmp_path / "a")
    ws = Workspace.open(env={}, cwd=a)
    assert ws.base is not None and [x.label for x in ws.layers] == [BUILTIN, PROJECT]
    (a / "images" / "bases.yaml").write_text("")
    ws = Workspace.open(env={}, cwd=a)
    assert ws.base is None and [x.label for x in ws.layers] == [PROJECT]


def test_a_built_in_file_is_not_rewritten_from_a_project(tmp_path):
    b = builtin_catalog()
    if b is None:
        pytest.skip("no built-in catalog")
    a = _project(tmp_path / "a")
    ws = Workspace.open(env={}, cwd=a)
    with pytest.raises(InputError, match="built-in catalog's") as e:
        ws.spec_file("sglang-blackwell.yaml", "pin")
    assert "with `extends: sglang-blackwell`" in e.value.hint
    with pytest.raises(InputError) as e:
        ws.spec_file("bases.yaml", "base")
    assert "(a copy)" in e.value.hint
    (a / "images" / "mine.yaml").write_text("x: 1\n")
    assert ws.spec_file("mine.yaml", "pin") == a / "images" / "mine.yaml"
    assert ws.lock_dir() == a / "lockfiles"
    ro = Workspace(b.images, b.lockfiles, read_only=True)
    with pytest.raises(InputError, match="read-only"):
        ro.lock_dir()
    with pytest.raises(InputError, match="built-in catalog's") as e:
        ro.spec_file("sglang-blackwell.yaml", "pin")
    assert "(read-only)" in e.value.facts[0] and e.value.hint.startswith("run `imgbuild init`")
    assert ro.layers[0].label == BUILTIN


def test_paths_are_shown_relative_to_their_layer(tmp_path):
    b = builtin_catalog()
    if b is None:
        pytest.skip("no built-in catalog")
    a = _project(tmp_path / "a")
    ws = Workspace.open(env={}, cwd=a)
    assert ws.display(a / "lockfiles" / "x.txt") == "lockfiles/x.txt"
    assert ws.display(b.lockfiles / "x.txt") == "lockfiles/x.txt (built-in)"
    assert ws.display(tmp_path / "elsewhere") == str(tmp_path / "elsewhere")


def test_the_highest_layer_with_a_check_table_is_read(tmp_path):
    if builtin_catalog() is None:
        pytest.skip("no built-in catalog")
    a = _project(tmp_path / "a")
    ws = Workspace.open(env={}, cwd=a)
    assert ws._table("checks/launch.yaml") == ws.base.images
    (a / "images" / "checks").mkdir()
    (a / "images" / "checks" / "launch.yaml").write_text("")
    assert ws._table("checks/launch.yaml") == a / "images"
    assert ws._table("no-such.yaml") == ws.base.images  # none: the lowest


def test_locking_a_built_in_target_in_a_project_starts_from_the_shipped_lock(tmp_path):
    p = _project(tmp_path / "p")
    ws = Workspace.open(env={}, cwd=p)
    [gpu] = ws.platform_refs("sglang-blackwell")
    [cpu] = ws.platform_refs("tiny-cpu")
    assert gpu.builtin and cpu.builtin and not ws.lockfiles.exists()
    shipped = gpu.lock_path.parent
    done = ws.adopt_builtin_locks([gpu, cpu])
    name = gpu.lock_path.name
    kernels = name.removesuffix(".txt") + ".kernels.json"
    # the lock and its kernel record (tiny-cpu has none), copied byte for byte, each said
    assert sorted(f.name for f in ws.lockfiles.iterdir()) == sorted(
        [name, kernels, cpu.lock_path.name])
    for f in (name, kernels, cpu.lock_path.name):
        assert (ws.lockfiles / f).read_bytes() == (shipped / f).read_bytes()
    assert done == [f"{ws.display(shipped / name)} -> {ws.display(ws.lockfiles / name)}",
                    f"{ws.display(shipped / kernels)} -> {ws.display(ws.lockfiles / kernels)}",
                    f"{ws.display(cpu.lock_path)} -> "
                    f"{ws.display(ws.lockfiles / cpu.lock_path.name)}"]
    # the project's own now: adopted again, nothing to copy
    assert not ws.platform_refs("tiny-cpu")[0].builtin
    assert ws.adopt_builtin_locks(ws.platform_refs("tiny-cpu")) == []
    # one of its own first does not stop the built-in ones after it
    later = ws.adopt_builtin_locks([*ws.platform_refs("tiny-cpu"),
                                    *ws.platform_refs("vllm-blackwell")])
    assert later and all("vllm-blackwell" in line for line in later)


def test_a_project_whose_lockfiles_are_deeper_gets_the_folder_made(tmp_path):
    # (its parents made too)
    p = _project(tmp_path / "p", "lockfiles: locks/a/b\n")
    ws = Workspace.open(env={}, cwd=p)
    assert ws.adopt_builtin_locks(ws.platform_refs("tiny-cpu"))
    assert (p / "locks" / "a" / "b").is_dir()


@pytest.fixture()
def installed(tmp_path, monkeypatch):
    """imgbuild as the wheel installs it: the built-in catalog inside the package
    (imgbuild/builtin/images and lockfiles), no checkout beside it."""
    import shutil

    from imgbuild import workspace

    pkg = tmp_path / "site-packages" / "imgbuild"
    shutil.copytree(ROOT / "images", pkg / "builtin" / "images")
    shutil.copytree(ROOT / "lockfiles", pkg / "builtin" / "lockfiles")
    monkeypatch.setattr(workspace, "_PACKAGE", pkg)
    monkeypatch.setattr(workspace, "_CHECKOUT", tmp_path / "site-packages")
    return pkg


def test_an_installed_imgbuild_reads_its_own_catalog_read_only(installed, tmp_path):
    b = builtin_catalog()
    assert b == Builtin(installed / "builtin" / "images", installed / "builtin" / "lockfiles",
                        packaged=True)
    nowhere = tmp_path / "elsewhere"
    nowhere.mkdir()
    ws = Workspace.open(env={}, cwd=nowhere)
    assert (ws.images, ws.lockfiles, ws.read_only) == (b.images, b.lockfiles, True)
    with pytest.raises(InputError) as e:
        ws.lock_dir()
    assert e.value.message == "the built-in catalog is read-only"
    assert e.value.facts == [
        f"no project here: no {PROJECT_FILE} in this directory or above it, and no --images",
        f"the built-in locks are in {b.lockfiles}, inside the installed imgbuild"]
    assert e.value.hint == ("run `imgbuild init` to make a project (or pass --images DIR / "
                            "--lockfiles DIR): its lockfiles/ takes the locks, and a built-in "
                            "target's lock is copied there when you lock it")
    # --lockfiles names where locks go: the catalog is read, the locks written there.
    ws = Workspace.open(lockfiles=tmp_path / "mine", env={}, cwd=nowhere)
    assert (ws.images, ws.lockfiles, ws.read_only) == (b.images, tmp_path / "mine", False)


def test_a_broken_install_says_what_is_missing(installed, tmp_path):
    import shutil

    shutil.rmtree(installed / "builtin")
    assert builtin_catalog() is None
    nowhere = tmp_path / "elsewhere"
    nowhere.mkdir()
    with pytest.raises(InputError) as e:
        Workspace.open(env={}, cwd=nowhere)
    assert e.value.message == ("no images/ directory found, and imgbuild has no built-in "
                               "catalog")
    assert e.value.facts == [f"none in {nowhere} or above it",
                             f"{installed / 'builtin'} is missing"]
    assert e.value.hint == "reinstall imgbuild from its wheel, or pass --images DIR"
    with pytest.raises(InputError) as e:
        Workspace.open(tmp_path / "none", env={}, cwd=nowhere)
    assert e.value.hint == ("point it at your project's images/ directory (the one with the "
                            "targets), or leave --images out")


def test_a_project_rewrite_of_a_built_in_file_is_not_sent_to_init(tmp_path):
    """Under a project, the way out is the project's own file; `imgbuild init` is for a
    workspace with no project."""
    if builtin_catalog() is None:
        pytest.skip("no built-in catalog")
    ws = Workspace.open(env={}, cwd=_project(tmp_path / "a"))
    with pytest.raises(InputError) as e:
        ws.spec_file("sglang-blackwell.yaml", "pin")
    assert e.value.hint == ("make it the project's own: images/sglang-blackwell.yaml in the "
                            "project with `extends: sglang-blackwell` (and only what differs)")


def test_a_project_target_of_a_built_in_name_asking_otherwise_gets_its_own_lock(tmp_path):
    """The shipped lock answers a project target only where it asks exactly what the lock
    was made for."""
    p = _project(tmp_path / "p")
    (p / "images" / "tiny-cpu.yaml").write_text(
        "extends: tiny-cpu\nrequirements: [torch==2.13.0, safetensors, numpy]\n")
    ref = Workspace.open(env={}, cwd=p).target("tiny-cpu")
    assert not ref.builtin and ref.lock_path == p / "lockfiles" / ref.request.filename()


def test_a_target_with_no_lock_says_where_it_was_looked_for(tmp_path):
    p = _project(tmp_path / "p")
    (p / "images" / "mine.yaml").write_text(
        "extends: tiny-cpu\nrequirements: [torch==2.13.0, safetensors, numpy]\n")
    ref = Workspace.open(env={}, cwd=p).target("mine")
    with pytest.raises(InputError) as e:
        ref.lock()
    assert e.value.message == "target 'mine' has no lock yet"
    assert e.value.facts == [f"expected lockfiles/{ref.request.filename()}"]
    assert e.value.hint == ("run `imgbuild lock mine` (and commit lockfiles/: CI builds what "
                            "the repository pins)")


def test_the_built_in_catalog_s_digest_leaves_out_compiled_python(installed):
    b = builtin_catalog()
    before = b.digest()
    (b.images / "stray.pyc").write_bytes(b"\x00compiled")
    (b.images / "__pycache__").mkdir()
    (b.images / "__pycache__" / "x.cpython-311.pyc").write_bytes(b"\x00compiled")
    assert b.digest() == before
    (b.images / "new.yaml").write_text("x: 1\n")
    assert b.digest() != before
