"""A model profile for the user's own checkpoint: `checkpoint:` a Hugging Face repo id or a local
path, and no `quantization:`. The quantization is then the checkpoint's config.json's, read as
check-model reads it (imgbuild/catalog/checkpoints.py), when a command uses the profile.

The checkpoints are real: the smoke-model generator's (llmcompressor on CPU, as
test_checkmodel.py makes them: NVFP4 W4A4, FP8 attention + NVFP4 MLP, NVFP4 weights only). A
hub id is read through huggingface_hub itself, offline, from a cache laid out as
huggingface_hub lays it out (models--org--name/refs/main, snapshots/<commit>/config.json), in a
fresh interpreter: huggingface_hub reads HF_HOME and HF_HUB_OFFLINE when it is imported."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from dataclasses import fields
from pathlib import Path

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

from imgbuild.catalog.checkpoints import quantization_of, resolve_profile  # noqa: E402
from imgbuild.catalog.models import parse_model  # noqa: E402
from imgbuild.checks import checkmodel as cm  # noqa: E402
from imgbuild.errors import EXIT_ENV, EXIT_INPUT, EnvError, InputError, SpecError  # noqa: E402
from imgbuild.workspace import Workspace  # noqa: E402

from .conftest import ROOT, WHEELS, checkout_workspace, smoke_checkpoint  # noqa: E402

COMMIT = "0123456789abcdef0123456789abcdef01234567"
HINT = "state `quantization:` in the profile"


@pytest.fixture(scope="session")
def checkpoints() -> dict[str, Path]:
    """The generator's checkpoints; nvfp4 and mixed are test_checkmodel.py's (same names, same
    cache area: made once for both)."""
    from imgbuild import smokemodel

    out = {key: smoke_checkpoint(smokemodel.SmokeModelSpec(name=f"ckm-{key}", scheme=scheme),
                                 "checkmodel")
           for key, scheme in (("nvfp4", "NVFP4"), ("mixed", "FP8-ATTN+NVFP4-MLP"))}
    out["w4a16"] = smoke_checkpoint(
        smokemodel.SmokeModelSpec(name="mp-nvfp4a16", scheme="NVFP4A16"), "model-profiles")
    return out


def project(root: Path, profile: str, config: Path | str | None = None,
            at: str = "ckpt") -> Path:
    """A project (imgbuild.yaml, images/models/mine.yaml) and, when given, a checkpoint
    directory `at` (relative to the project) holding config.json (a real one copied, or text)."""
    (root / "images" / "models").mkdir(parents=True)
    (root / "imgbuild.yaml").write_text("{}\n")
    (root / "images" / "models" / "mine.yaml").write_text(profile)
    if config is not None:
        d = root / at
        d.mkdir(parents=True)
        if isinstance(config, Path):
            shutil.copy2(config, d / "config.json")
        else:
            (d / "config.json").write_text(config)
    return root


def mine(root: Path):
    return Workspace.open(cwd=root, env={}).model("mine")


# --- local checkpoints ---------------------------------------------------------------------

def test_nvfp4_w4a4_from_a_path_relative_to_the_project(tmp_path, checkpoints):
    root = project(tmp_path / "proj", "checkpoint: ./ckpt\nsize_gb: 0.002\n",
                   checkpoints["nvfp4"] / "config.json")
    assert not (Path.cwd() / "ckpt").exists()  # the project's ckpt/, not the current directory's
    ws = Workspace.open(cwd=root, env={})
    raw = ws.catalog.model("mine")
    assert raw.quant_from_checkpoint and raw.quant_formats == () and raw.quant_summary == ""
    m = ws.model("mine")
    assert m.quant_method == "compressed-tensors"
    assert m.quant_formats == ("nvfp4-pack-quantized",)
    assert m.activations == "fp4" and m.w4a4_nvfp4
    assert m.quant_summary == "NVFP4 W4A4 (from config.json)"
    assert m.architecture == "Qwen3ForCausalLM" and m.name == "ckpt"
    # check-model, given the alias, reads the same directory (the project's, not the cwd's)
    assert cm.resolve_checkpoint("mine", ws).source == str(root / "ckpt")


def test_a_project_directory_spelled_like_a_repo_id_is_local(tmp_path, checkpoints):
    """`imgbuild init --model models/qwen` writes it so: the directory is read, not the hub
    (offline, and nothing of that name cached)."""
    root = project(tmp_path, "checkpoint: models/qwen\nsize_gb: 1\n",
                   checkpoints["nvfp4"] / "config.json", at="models/qwen")
    ws = Workspace.open(cwd=root, env={})
    m = ws.model("mine")
    assert m.quant_formats == ("nvfp4-pack-quantized",) and m.name == "qwen"
    assert cm.resolve_checkpoint("mine", ws).source == str(root / "models/qwen")


def test_check_deps_names_config_json_for_read_formats(tmp_path, checkpoints):
    """check-deps checks a profile's formats against the locked compressed-tensors; formats
    read from the checkpoint are said to be config.json's, not the profile's."""
    from imgbuild.checks import drift

    root = project(tmp_path, "checkpoint: ./ckpt\nsize_gb: 1\n",
                   checkpoints["nvfp4"] / "config.json")
    ws = Workspace.open(cwd=root, env={})
    assert drift.profile_formats(ws.model("mine"), ws.families) == [
        ("images/models/mine.yaml: checkpoint ./ckpt: config.json formats[0]",
         "nvfp4-pack-quantized")]
    tiny = ws.model("tiny-nvfp4")
    assert drift.profile_formats(tiny, ws.families) == [
        (f"{tiny.path}: quantization.formats[0]", "nvfp4-pack-quantized")]


def test_absolute_path_and_stated_fields_kept(tmp_path, checkpoints):
    root = project(tmp_path, f"checkpoint: {checkpoints['mixed']}\nname: Mine\nsize_gb: 1\n"
                             "architecture: tiny Qwen3\ntensor_parallel: 2\n")
    m = mine(root)
    # two groups: FP8 W8A8 attention, NVFP4 W4A4 MLP; the MLP's FP4 activations set the bar
    assert m.quant_formats == ("mixed-precision", "float-quantized", "nvfp4-pack-quantized")
    assert m.activations == "fp4" and m.w4a4_nvfp4
    assert m.quant_summary == "FP8 W8A8 + NVFP4 W4A4 (from config.json)"
    assert (m.name, m.architecture, m.tensor_parallel) == ("Mine", "tiny Qwen3", 2)


def test_weights_only_is_bf16(tmp_path, checkpoints):
    cfg = json.loads((checkpoints["w4a16"] / "config.json").read_text())
    (group,) = cfg["quantization_config"]["config_groups"].values()
    assert group["input_activations"] is None  # the generator made a weights-only checkpoint
    root = project(tmp_path, "checkpoint: ckpt\nsize_gb: 1\n", checkpoints["w4a16"] / "config.json")
    m = mine(root)
    assert m.quant_formats == ("nvfp4-pack-quantized",)
    assert m.activations == "bf16" and not m.w4a4_nvfp4
    assert m.quant_summary == "NVFP4 W4A16 (from config.json)"


def test_no_quantization_config_is_unquantized(tmp_path):
    root = project(tmp_path, "checkpoint: ./ckpt\nsize_gb: 1\n",
                   json.dumps({"architectures": ["LlamaForCausalLM"]}))
    m = mine(root)
    assert (m.quant_method, m.quant_formats, m.activations) == (None, (), None)
    assert m.quant_summary == "unquantized (config.json has no quantization_config)"


def test_other_methods_best_effort():
    fp8 = quantization_of({"quantization_config": {"quant_method": "fp8",
                                                   "weight_block_size": [128, 128]}})
    assert (fp8.method, fp8.formats, fp8.activations) == ("fp8", ("fp8",), "fp8")
    awq = quantization_of({"quantization_config": {"quant_method": "awq", "bits": 4,
                                                   "version": "gemm"}})
    assert (awq.formats, awq.activations, awq.summary) == (
        ("gemm",), "bf16", "AWQ INT4 W4A16 (from config.json)")
    mo = quantization_of({"quantization_config": {"quant_method": "modelopt",
                                                  "quant_algo": "NVFP4"}})
    assert (mo.formats, mo.activations) == (("nvfp4",), "fp4")
    # a checkpoint whose quantization config sits under text_config, as check-model finds it
    vl = quantization_of({"text_config": {"quantization_config": {
        "quant_method": "compressed-tensors", "format": "pack-quantized",
        "config_groups": {"g": {"weights": {"num_bits": 4, "type": "int"},
                                "input_activations": None}}}}})
    assert (vl.formats, vl.activations, vl.summary) == (
        ("pack-quantized",), "bf16", "INT4 W4A16 (from config.json)")


# --- profiles that state their quantization, and the built-in ones --------------------------

def test_a_stated_quantization_is_not_read(tmp_path):
    """The checkpoint path does not exist: a profile that states quantization never reads it."""
    text = ("checkpoint: ./not-downloaded\nname: Mine\nsize_gb: 1\n"
            "quantization: {method: compressed-tensors, formats: [pack-quantized], "
            "summary: INT4, activations: bf16}\n")
    root = project(tmp_path, text)
    ws = Workspace.open(cwd=root, env={})
    m = ws.model("mine")
    assert m is ws.catalog.model("mine") and not m.quant_from_checkpoint
    assert (m.quant_formats, m.activations, m.quant_summary) == (("pack-quantized",), "bf16",
                                                                 "INT4")


def test_builtin_profiles_parse_as_before():
    ws = checkout_workspace()
    for alias, m in ws.catalog.models.items():
        assert not m.quant_from_checkpoint and m.revision is None, alias
        assert ws.model(alias) is m  # nothing read, nothing replaced
    k2 = ws.catalog.model("k2.6")
    assert (k2.name, k2.quant_formats, k2.activations) == ("Kimi K2.6", ("pack-quantized",),
                                                           "bf16")
    # a field added to ModelProfile keeps the positional order tests and callers rely on
    assert [f.name for f in fields(k2)][:9] == [
        "alias", "path", "name", "checkpoint", "size_gb", "quant_method", "quant_formats",
        "quant_summary", "tensor_parallel"]


def test_generated_checkpoints_still_need_a_name_and_take_no_revision():
    with pytest.raises(SpecError, match="name"):
        parse_model("g", {"checkpoint": "generated:x", "size_gb": 1}, "images/models/g.yaml")
    with pytest.raises(SpecError, match="revision"):
        parse_model("p", {"checkpoint": "./ckpt", "size_gb": 1, "revision": "main"},
                    "images/models/p.yaml")
    g = parse_model("g", {"checkpoint": "generated:x", "name": "G", "size_gb": 1,
                          "generator": {"scheme": "NVFP4"}}, "images/models/g.yaml")
    assert not g.quant_from_checkpoint and resolve_profile(g, Path("/nonexistent")) is g
    hub = parse_model("h", {"checkpoint": "my-org/My-Model-NVFP4", "size_gb": 1,
                            "revision": "v1"}, "images/models/h.yaml")
    assert (hub.name, hub.revision, hub.quant_from_checkpoint) == ("My-Model-NVFP4", "v1", True)


# --- errors ---------------------------------------------------------------------------------

@pytest.mark.parametrize("case", ["missing", "no-config", "bad-json", "not-a-mapping"])
def test_local_errors_name_the_profile_and_the_checkpoint(tmp_path, case):
    config = {"missing": None, "no-config": None, "bad-json": '{"architectures": [',
              "not-a-mapping": json.dumps({"quantization_config": "nvfp4"})}[case]
    root = project(tmp_path, "checkpoint: ./ckpt\nsize_gb: 1\n", config)
    if case == "no-config":
        (root / "ckpt").mkdir()
    with pytest.raises(InputError) as e:
        mine(root)
    err = e.value
    assert err.exit_code == EXIT_INPUT
    assert err.message.startswith("images/models/mine.yaml: checkpoint ./ckpt: ")
    assert HINT in err.hint
    said = err.message + "\n" + "\n".join(err.facts)
    assert {"missing": "no such directory", "no-config": "no config.json in",
            "bad-json": "not valid JSON",
            "not-a-mapping": "quantization_config is str"}[case] in said
    if case in ("missing", "no-config"):
        assert f"looked for {root / 'ckpt'}" in err.facts


# --- hub ids, through huggingface_hub's own cache --------------------------------------------

RESOLVE = """
import json, sys
from pathlib import Path
from imgbuild.errors import ImgbuildError
from imgbuild.workspace import Workspace
try:
    m = Workspace.open(cwd=Path(sys.argv[1]), env={}).model("mine")
except ImgbuildError as e:
    print(json.dumps(e.to_dict()))
    sys.exit(e.exit_code)
print(json.dumps({"formats": m.quant_formats, "activations": m.activations,
                  "summary": m.quant_summary, "name": m.name, "architecture": m.architecture}))
"""


def hub_cache(home: Path, repo: str, config: Path) -> Path:
    """config.json of `repo` at main, where huggingface_hub keeps it under HF_HOME."""
    d = home / "hub" / ("models--" + repo.replace("/", "--"))
    (d / "refs").mkdir(parents=True)
    (d / "refs" / "main").write_text(COMMIT)
    snap = d / "snapshots" / COMMIT
    snap.mkdir(parents=True)
    shutil.copy2(config, snap / "config.json")
    return snap / "config.json"


def resolve_offline(root: Path, home: Path) -> tuple[int, dict]:
    env = dict(os.environ, HF_HOME=str(home), HF_HUB_OFFLINE="1")
    env.pop("HF_HUB_CACHE", None)
    env.pop("HUGGINGFACE_HUB_CACHE", None)
    r = subprocess.run([sys.executable, "-c", RESOLVE, str(root)], env=env, capture_output=True,
                       text=True, timeout=120, cwd=ROOT)
    assert r.stdout.strip(), r.stderr
    return r.returncode, json.loads(r.stdout.strip().splitlines()[-1])


def test_hub_id_read_from_the_huggingface_hub_cache(tmp_path, checkpoints):
    pytest.importorskip("huggingface_hub")
    home = tmp_path / "hf"
    hub_cache(home, "my-org/My-Model-NVFP4", checkpoints["nvfp4"] / "config.json")
    root = project(tmp_path / "proj", "checkpoint: my-org/My-Model-NVFP4\nsize_gb: 40\n"
                                      "tensor_parallel: 2\n")
    rc, got = resolve_offline(root, home)
    assert rc == 0, got
    assert got == {"formats": ["nvfp4-pack-quantized"], "activations": "fp4",
                   "summary": "NVFP4 W4A4 (from config.json)", "name": "My-Model-NVFP4",
                   "architecture": "Qwen3ForCausalLM"}
    # pinned to the cached commit: the same file
    (root / "images/models/mine.yaml").write_text(
        f"checkpoint: my-org/My-Model-NVFP4\nrevision: {COMMIT}\nsize_gb: 40\n")
    rc, pinned = resolve_offline(root, home)
    assert rc == 0 and pinned["formats"] == ["nvfp4-pack-quantized"], pinned


@pytest.mark.parametrize("revision", [None, "v2"])
def test_hub_id_not_cached_offline_is_a_clear_env_error(tmp_path, checkpoints, revision):
    """Offline with nothing cached (or not the revision asked for): exit 3, the profile, the
    repo and the way out."""
    pytest.importorskip("huggingface_hub")
    home = tmp_path / "hf"
    hub_cache(home, "my-org/My-Model-NVFP4", checkpoints["nvfp4"] / "config.json")
    repo = "my-org/Other-Model" if revision is None else "my-org/My-Model-NVFP4"
    root = project(tmp_path / "proj", f"checkpoint: {repo}\nsize_gb: 40\n"
                   + (f"revision: {revision}\n" if revision else ""))
    rc, err = resolve_offline(root, home)
    assert rc == EXIT_ENV and err["error"] == EnvError.__name__, err
    assert err["message"] == (f"images/models/mine.yaml: checkpoint {repo}: cannot read "
                              "config.json from the Hugging Face hub")
    assert "HF_HUB_OFFLINE=1" in err["facts"] and HINT in err["hint"]
    assert any("LocalEntryNotFoundError" in f for f in err["facts"]), err["facts"]


# --- the CLI: list stays offline, plan shows what it read -----------------------------------

def cli(root: Path, *args: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, HF_HUB_OFFLINE="1", UV_PYTHON_DOWNLOADS="never")
    if WHEELS:
        env.setdefault("IMGBUILD_WHEELS", WHEELS)
    return subprocess.run([str(ROOT / ".venv/bin/imgbuild"), *args], cwd=root, env=env,
                          capture_output=True, text=True, timeout=900)


def test_list_says_from_config_json_without_reading(tmp_path):
    """The checkpoint is not there at all: list does not look."""
    root = project(tmp_path, "checkpoint: ./not-downloaded-yet\nsize_gb: 1\n")
    r = cli(root, "list", "--json")
    assert r.returncode == 0, r.stderr
    q = json.loads(r.stdout)["models"]["mine"]["quantization"]
    assert q == {"method": None, "formats": [], "activations": None,
                 "summary": "from config.json", "from_checkpoint": True}
    assert json.loads(r.stdout)["models"]["k2.6"]["quantization"]["summary"] == \
        "INT4 (W4A16) routed experts, BF16 attention"
    text = cli(root, "list")
    assert text.returncode == 0, text.stderr
    (row,) = [ln for ln in text.stdout.splitlines() if ln.startswith("mine ")]
    assert row.rstrip().endswith("from config.json")


def test_plan_json_shows_the_checkpoints_quantization(tmp_path, checkpoints):
    root = project(tmp_path, "checkpoint: ./ckpt\nsize_gb: 0.002\n",
                   checkpoints["nvfp4"] / "config.json")
    (root / "images" / "mine-cpu.yaml").write_text("extends: tiny-cpu\nmodel: mine\n")
    r = cli(root, "plan", "mine-cpu", "--json")
    assert r.returncode == 0, r.stdout + r.stderr
    plan = json.loads(r.stdout)
    assert (plan["model"], plan["checkpoint"]) == ("mine", "./ckpt")
    assert plan["quantization"] == {
        "method": "compressed-tensors", "formats": ["nvfp4-pack-quantized"],
        "activations": "fp4", "summary": "NVFP4 W4A4 (from config.json)",
        "from_checkpoint": True}
