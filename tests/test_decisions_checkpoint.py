"""Reading a checkpoint (catalog/checkpoints.py, checks/checkmodel/checkpoint.py) on config
mappings and files under tmp_path: where the quantization config is, which activations a mixed
checkpoint needs, how a scheme is named, which module is quantized or W4A4, which directory a
profile's checkpoint is, what is refused."""

from __future__ import annotations

import json
import struct
from pathlib import Path

import pytest

from imgbuild.catalog import checkpoints as C
from imgbuild.catalog.models import ModelProfile
from imgbuild.checks.checkmodel import checkpoint as K
from imgbuild.errors import InputError

NVFP4 = {"num_bits": 4, "type": "float", "group_size": 16}
FP8 = {"num_bits": 8, "type": "float"}


def test_where_engines_find_the_quantization_config():
    q = {"quant_method": "x"}
    assert C.quant_config({"quantization_config": q}) == (q, ("quantization_config",))
    assert C.quant_config({"compression_config": q}) == (q, ("compression_config",))
    # quantization_config first, when both are there.
    assert C.quant_config({"compression_config": {"a": 1}, "quantization_config": q})[0] is q
    assert C.quant_config({"text_config": {"quantization_config": q}}) == \
        (q, ("text_config", "quantization_config"))
    assert C.quant_config({"quantization_config": q, "text_config": {
        "quantization_config": {"b": 2}}})[0] is q
    assert C.quant_config({"quantization_config": "nope"}) == (None, ())
    assert C.quant_config({}) == (None, ())


@pytest.mark.parametrize("args, act", [
    (None, "bf16"), ({"num_bits": 4, "type": "float"}, "fp4"), (FP8, "fp8"),
    ({"num_bits": 8}, "int8"), ({"num_bits": 8, "type": "int"}, "int8"),
    ({"num_bits": 4, "type": "int"}, "int4"), ("x", None), ({"type": "float"}, None)])
def test_what_activations_compute_in(args, act):
    assert C._act(args) == act


@pytest.mark.parametrize("weights, act, label", [
    (NVFP4, "fp4", "NVFP4 W4A4"), (NVFP4, "bf16", "NVFP4 W4A16"),
    ({"num_bits": 4, "type": "float", "group_size": 32}, "fp4", "FP4 W4A4"),
    (FP8, "fp8", "FP8 W8A8"), ({"num_bits": 4}, "bf16", "INT4 W4A16"),
    ({"num_bits": 8, "type": "int"}, "int8", "INT8 W8A8"), ({"num_bits": 4}, None, "INT4 W4A?"),
    ({"type": "int"}, "bf16", None), (None, "bf16", None)])
def test_a_schemes_name(weights, act, label):
    assert C._label(weights, act) == label


def test_the_most_demanding_activation_wins():
    assert C._most_demanding(["bf16", "fp8", "fp4"]) == "fp4"
    assert C._most_demanding(["bf16", "fp8"]) == "fp8"
    assert C._most_demanding(["bf16", "int8"]) == "int8"
    assert C._most_demanding([None, "int4", "bf16"]) == "bf16"
    assert C._most_demanding([None]) is None


def test_a_mixed_compressed_tensors_checkpoint():
    q = C.quantization_of({"quantization_config": {
        "quant_method": "compressed-tensors", "format": "mixed-precision", "config_groups": {
            "g0": {"format": "nvfp4-pack-quantized", "weights": NVFP4,
                   "input_activations": {"num_bits": 4, "type": "float"}},
            "g1": {"format": "float-quantized", "weights": FP8, "input_activations": FP8},
            "g2": {"format": "nvfp4-pack-quantized", "weights": NVFP4},
            "g3": "junk"}}})
    assert q.method == "compressed-tensors"
    assert q.formats == ("mixed-precision", "nvfp4-pack-quantized", "float-quantized")
    assert q.activations == "fp4"
    assert q.summary == "NVFP4 W4A4 + FP8 W8A8 + NVFP4 W4A16 (from config.json)"


def test_presets_and_older_configs():
    q = C.quantization_of({"compression_config": {"config_groups": {
        "W4A16": ["Linear"], "FP8_DYNAMIC": ["re:.*attn.*"], "UNKNOWN": ["x"]}}})
    assert q.method == "compressed-tensors"  # no quant_method: an older compression_config
    assert q.activations == "fp8" and q.summary == "INT4 W4A16 + FP8 W8A8 (from config.json)"
    assert C.quantization_of({}).activations is None
    assert C.quantization_of({}).summary.startswith("unquantized")
    q = C.quantization_of({"quantization_config": {"quant_method": "bitsandbytes",
                                                   "format": "nf4"}})
    assert (q.method, q.formats, q.activations, q.summary) == \
        ("bitsandbytes", ("nf4",), None, "bitsandbytes (from config.json)")
    q = C.quantization_of({"quantization_config": {"quant_method": "gptq", "bits": 8}})
    assert q.formats == ("gptq",) and q.summary == "GPTQ INT8 W8A16 (from config.json)"
    q = C.quantization_of({"quantization_config": {"quant_method": "fp8",
                                                   "weight_block_size": [128, 128]}})
    assert q.summary == "FP8 W8A8 block-wise (from config.json)" and q.activations == "fp8"
    q = C.quantization_of({"quantization_config": {"quant_method": "modelopt",
                                                   "quant_algo": "W4A16_AWQ"}})
    assert q.activations == "bf16" and q.formats == ("w4a16_awq",)


# --- which directory a profile's checkpoint is -----------------------------------------------

def _profile(checkpoint: str, revision: str | None = None) -> ModelProfile:
    return ModelProfile(alias="m", path="images/models/m.yaml", name="m", checkpoint=checkpoint,
                        size_gb=1.0, quant_method=None, quant_formats=(), quant_summary="",
                        tensor_parallel=1, revision=revision, quant_from_checkpoint=True)


def test_a_local_checkpoint_is_read_from_the_project_root(tmp_path):
    root = tmp_path / "proj"
    (root / "models" / "qwen").mkdir(parents=True)
    assert C.checkpoint_dir(_profile("models/qwen"), root) == root / "models" / "qwen"
    assert C.checkpoint_dir(_profile(str(tmp_path / "abs")), root) == tmp_path / "abs"
    # A directory in the project spelled like a repo id is that directory ...
    assert C.local_checkpoint(_profile("models/qwen"), root) == root / "models" / "qwen"
    # ... unless a revision says the hub, or no such directory exists.
    assert C.local_checkpoint(_profile("models/qwen", revision="main"), root) is None
    assert C.local_checkpoint(_profile("Qwen/Qwen3-8B"), root) is None
    assert C.local_checkpoint(_profile("./models/missing"), root) == root / "models" / "missing"


def test_resolve_profile_reads_the_local_config(tmp_path):
    d = tmp_path / "ck"
    d.mkdir()
    (d / "config.json").write_text(json.dumps({"architectures": ["Qwen3ForCausalLM"],
                                               "quantization_config": {
                                                   "quant_method": "fp8"}}))
    p = C.resolve_profile(_profile(str(d)), tmp_path)
    assert p.quant_method == "fp8" and p.architecture == "Qwen3ForCausalLM"
    assert p.activations == "fp8"
    # A profile that states its quantization is not read.
    import dataclasses
    stated = dataclasses.replace(_profile(str(tmp_path / "nowhere")), quant_from_checkpoint=False)
    assert C.resolve_profile(stated, tmp_path) is stated
    # A stated architecture stays.
    p = C.resolve_profile(dataclasses.replace(_profile(str(d)), architecture="X"), tmp_path)
    assert p.architecture == "X"
    (d / "config.json").write_text(json.dumps({"quantization_config": ["x"]}))
    with pytest.raises(InputError, match="quantization_config is not a mapping"):
        C.resolve_profile(_profile(str(d)), tmp_path)
    with pytest.raises(InputError, match="no config.json in"):
        C.resolve_profile(_profile(str(tmp_path)), tmp_path)
    with pytest.raises(InputError, match="no such directory"):
        C.resolve_profile(_profile("./gone"), tmp_path)


def test_read_json_bounds_and_refusals(tmp_path):
    f = tmp_path / "c.json"
    f.write_text('{"a": 1}')
    assert C.read_json(f) == ({"a": 1}, '{"a": 1}')
    f.write_text("[1]")
    with pytest.raises(InputError, match="expected a JSON object, got list"):
        C.read_json(f)
    f.write_bytes(b"\xff{}")
    with pytest.raises(InputError, match=r"not UTF-8 text \(byte 0\)"):
        C.read_json(f)
    f.write_text("{")
    with pytest.raises(InputError, match="not valid JSON"):
        C.read_json(f)
    with pytest.raises(InputError, match="cannot read"):
        C.read_json(tmp_path / "missing.json")
    big = tmp_path / "big.json"
    with open(big, "wb") as fh:
        fh.truncate(C.MAX_JSON_BYTES + 1)
    with pytest.raises(InputError, match="more than check-model reads"):
        C.read_json(big)
    with open(big, "r+b") as fh:
        fh.truncate(C.MAX_JSON_BYTES)
    with pytest.raises(InputError, match="not valid JSON"):  # at the cap: read, then judged
        C.read_json(big)


# --- check-model's checkpoint ----------------------------------------------------------------

def test_which_modules_are_quantized_and_w4a4():
    ck = K.Checkpoint.from_tensors({"architectures": ["A", "B"]}, [
        "lm_head.weight", "model.layers.0.mlp.weight_packed", "model.layers.0.mlp.weight_scale",
        "model.layers.0.mlp.input_global_scale", "model.layers.1.mlp.weight_scale",
        "model.layers.2.attn.input_global_scale", "model.layers.2.attn.weight", "bias"], "src")
    assert ck.module_names == ("lm_head", "model.layers.0.mlp", "model.layers.1.mlp",
                               "model.layers.2.attn")
    assert ck.quantized == {"model.layers.0.mlp", "model.layers.1.mlp"}
    # W4A4: an input_global_scale beside the packed weights; not on an unquantized module.
    assert ck.w4a4 == {"model.layers.0.mlp"}
    assert ck.architecture == "A"
    assert K.Checkpoint.from_tensors({"architectures": []}, [], "s").architecture is None
    assert K.Checkpoint.from_tensors({"architectures": [3]}, [], "s").architecture is None


def _safetensors(path: Path, names: list[str], meta: bool = True) -> None:
    header = {n: {"dtype": "F16", "shape": [1], "data_offsets": [0, 2]} for n in names}
    if meta:
        header["__metadata__"] = {"format": "pt"}
    raw = json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(raw)) + raw + b"\0\0")


def test_safetensors_headers_and_the_index(tmp_path):
    _safetensors(tmp_path / "a.safetensors", ["x.weight", "y.weight_packed"])
    assert K.safetensors_keys(tmp_path / "a.safetensors") == ["x.weight", "y.weight_packed"]
    (tmp_path / "bad.bin").write_bytes(b"\1\2")
    with pytest.raises(InputError, match="shorter than its header"):
        K.safetensors_keys(tmp_path / "bad.bin")
    (tmp_path / "huge.bin").write_bytes(struct.pack("<Q", 512 * 1024 * 1024 + 1))
    with pytest.raises(InputError, match="header length"):
        K.safetensors_keys(tmp_path / "huge.bin")
    (tmp_path / "list.bin").write_bytes(struct.pack("<Q", 2) + b"[]")
    with pytest.raises(InputError, match="its header is JSON list"):
        K.safetensors_keys(tmp_path / "list.bin")

    d = tmp_path / "ck"
    d.mkdir()
    (d / "config.json").write_text("{}")
    for i in range(4):
        _safetensors(d / f"m-{i}.safetensors", [f"l{i}.weight_scale"])
    ck = K.load_checkpoint(d)
    assert ck.names_from == ("m-0.safetensors, m-1.safetensors, m-2.safetensors ... (headers)")
    assert ck.quantized == {"l0", "l1", "l2", "l3"}
    # The index, when there is one, is read instead of the headers.
    (d / "model.safetensors.index.json").write_text(json.dumps(
        {"weight_map": {"only.weight": "m-0.safetensors"}}))
    ck = K.load_checkpoint(d)
    assert ck.module_names == ("only",) and ck.names_from == "model.safetensors.index.json"
    # config.json itself: the names beside it are read too.
    assert K.load_checkpoint(d / "config.json").module_names == ("only",)
    (d / "model.safetensors.index.json").write_text("{}")
    with pytest.raises(InputError, match="no weight_map"):
        K.load_checkpoint(d)


def test_what_load_checkpoint_takes(tmp_path):
    (tmp_path / "other.json").write_text('{"architectures": ["X"]}')
    _safetensors(tmp_path / "a.safetensors", ["z.weight"])
    ck = K.load_checkpoint(tmp_path / "other.json")  # not config.json: nothing beside is read
    assert ck.module_names == () and ck.names_from is None and ck.architecture == "X"
    with pytest.raises(InputError, match="no config.json"):
        K.load_checkpoint(tmp_path)
    for p in ("./org/name", "no/such/path/x", "justaname"):
        with pytest.raises(InputError, match="no checkpoint at"):
            K.load_checkpoint(p)


def test_malformed_quantization_configs_are_named_by_key():
    keys = ("quantization_config",)
    assert K.malformed({"format": "x", "ignore": ["lm_head", "re:.*gate"],
                        "config_groups": {"g": {"targets": ["Linear"], "weights": {}},
                                          "NVFP4": ["re:.*"]}}, keys) == []
    got = K.malformed({"format": 3, "ignore": "lm_head", "config_groups": {
        "g": {"weights": [4], "format": 1}, "h": 5, "p": ["re:("]}}, keys)
    assert got[0].startswith("quantization_config.format is int 3, not a string")
    assert any(s.startswith("quantization_config.ignore is str") for s in got)
    assert any(s.startswith("quantization_config.config_groups.g.targets is missing") for s in got)
    assert any(s.startswith("quantization_config.config_groups.g.weights is list") for s in got)
    assert any(s.startswith("quantization_config.config_groups.g.format is int") for s in got)
    assert any(s.startswith("quantization_config.config_groups.h is int 5") for s in got)
    assert any("config_groups.p[0] 're:(' is not a regular expression" in s for s in got)
    assert K.malformed({"config_groups": []}, keys)[0].startswith(
        "quantization_config.config_groups is list")
    assert K.malformed({"ignore": [1]}, ("text_config", "quantization_config")) == [
        "text_config.quantization_config.ignore[0] is int 1, not a name or `re:` expression"]
