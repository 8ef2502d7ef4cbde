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


def test_awq_and_gptq_name_their_checkpoint_format_and_bits_as_far_as_given():
    q = C.quantization_of({"quantization_config": {
        "quant_method": "gptq", "bits": 4, "checkpoint_format": "gptq_v2", "version": "x"}})
    assert q.formats == ("gptq_v2",)  # the format over the version
    q = C.quantization_of({"quantization_config": {"quant_method": "awq", "version": "gemm"}})
    assert q.formats == ("gemm",) and q.summary == "AWQ (from config.json)"  # no bits: no INT
    assert q.activations == "bf16"


def test_a_quantization_config_that_names_no_method_is_quantized_still():
    q = C.quantization_of({"quantization_config": {"format": "something-new"}})
    assert (q.method, q.formats, q.summary) == (
        None, ("something-new",), "quantized (from config.json)")


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


# --- what is said, whole ----------------------------------------------------------------------

def test_a_malformed_config_is_said_key_by_key_in_full():
    long = ["x" * 70]
    got = K.malformed({
        "format": 3, "quant_method": ["compressed-tensors"], "quantization_status": {"a": 1},
        "config_groups": {
            "preset": ["re:.*"],  # a preset's targets, then a scheme: both are read
            "g": {"targets": "Linear", "format": 1, "weights": long,
                  "input_activations": 4, "output_activations": "fp8"},
            "h": {"targets": ["Linear", 2]}}}, ("quantization_config",))
    assert got == [
        "quantization_config.format is int 3, not a string",
        'quantization_config.quant_method is list ["compressed-tensors"], not a string',
        'quantization_config.quantization_status is dict {"a": 1}, not a string',
        'quantization_config.config_groups.g.targets is str "Linear"; compressed-tensors reads '
        "a list of names or `re:` expressions",
        "quantization_config.config_groups.g.format is int 1, not a string",
        'quantization_config.config_groups.g.weights is list ["' + "x" * 55 + "..., not a "
        "mapping (num_bits, type, strategy ...)",
        "quantization_config.config_groups.g.input_activations is int 4, not a mapping "
        "(num_bits, type, strategy ...)",
        'quantization_config.config_groups.g.output_activations is str "fp8", not a mapping '
        "(num_bits, type, strategy ...)",
        "quantization_config.config_groups.h.targets[1] is int 2, not a name or `re:` "
        "expression"]
    assert K.malformed({"config_groups": "all"}, ("q",)) == [
        'q.config_groups is str "all"; compressed-tensors reads a mapping of group name to '
        "scheme"]


def test_a_value_is_shown_whole_up_to_sixty_characters():
    assert K._short("x" * 58) == '"' + "x" * 58 + '"'  # 60 with its quotes
    assert K._short("x" * 59) == '"' + "x" * 56 + "..."  # 61: cut to 57, then ...


def test_what_a_missing_or_truncated_checkpoint_is_told(tmp_path):
    with pytest.raises(InputError) as e:
        K.load_checkpoint(tmp_path)
    assert e.value.message == f"{tmp_path}: no config.json"
    assert e.value.hint == ("point check-model at the checkpoint directory (the one with "
                            "config.json and the .safetensors files)")
    (tmp_path / "config.json").write_text("{}")
    (tmp_path / "model.safetensors.index.json").write_text('{"weight_map": []}')
    with pytest.raises(InputError) as e:
        K.load_checkpoint(tmp_path)
    assert e.value.message == f"{tmp_path / 'model.safetensors.index.json'}: no weight_map"
    assert e.value.hint == "the index is truncated; download it again"
    with pytest.raises(InputError) as e:
        K.load_checkpoint("no/such/path/x")
    assert e.value.message == "no checkpoint at no/such/path/x"
    assert e.value.hint == ("pass a checkpoint directory, its config.json, a model alias from "
                            "`imgbuild list`, or a Hugging Face repo id")


def test_three_safetensors_files_are_all_named(tmp_path):
    (tmp_path / "config.json").write_text("{}")
    for i in range(3):
        _safetensors(tmp_path / f"m-{i}.safetensors", [f"l{i}.weight"])
    assert K.load_checkpoint(tmp_path).names_from == (
        "m-0.safetensors, m-1.safetensors, m-2.safetensors (headers)")


def test_where_a_checkpoint_was_read_from_is_kept(tmp_path):
    text = '{"architectures": ["X"]}\n'
    (tmp_path / "config.json").write_text(text)
    _safetensors(tmp_path / "a.safetensors", ["z.weight"])
    for given, cfg in ((tmp_path, tmp_path / "config.json"),
                       (tmp_path / "config.json", tmp_path / "config.json")):
        ck = K.load_checkpoint(given)
        assert (ck.source, ck.config_path, ck.config_text) == (str(given), cfg, text)
        assert ck.names_from == "a.safetensors (headers)"


def test_a_tensor_outside_any_module_is_passed_over_not_the_end():
    ck = K.Checkpoint.from_tensors({}, ["step", "a.weight_packed", "b.weight"], "s",
                                   config_path=Path("c.json"))
    assert ck.module_names == ("a", "b") and ck.quantized == {"a"}
    assert ck.config_path == Path("c.json")


def test_a_safetensors_header_length_is_read_unsigned_and_bounded(tmp_path):
    # exactly the bound: read (here, the two bytes there are), not refused for its length
    (tmp_path / "edge.bin").write_bytes(struct.pack("<Q", 512 * 1024 * 1024) + b"{}")
    assert K.safetensors_keys(tmp_path / "edge.bin") == []
    # a length with its top bit set is a huge length, never a negative one
    (tmp_path / "top.bin").write_bytes(struct.pack("<Q", 2**63 + 2) + b"{}")
    with pytest.raises(InputError) as e:
        K.safetensors_keys(tmp_path / "top.bin")
    assert e.value.message == f"{tmp_path / 'top.bin'}: not a safetensors file (header length " \
                              f"{2**63 + 2})"


# --- a Hugging Face repo id, through huggingface_hub's own cache, offline ---------------------

COMMIT = "c" * 40


@pytest.fixture()
def hub(tmp_path, monkeypatch):
    """huggingface_hub's cache under tmp_path, offline: hf_hub_download answers from it as it
    would from a real download, and a file it lacks is an EntryNotFoundError."""
    hh = pytest.importorskip("huggingface_hub")
    from huggingface_hub import constants

    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)

    def put(repo: str, files: dict[str, str], ref: str = "main", commit: str = COMMIT) -> None:
        d = tmp_path / "hub" / ("models--" + repo.replace("/", "--"))
        (d / "refs").mkdir(parents=True, exist_ok=True)
        (d / "refs" / ref).write_text(commit)
        for name, text in files.items():
            (d / "snapshots" / commit).mkdir(parents=True, exist_ok=True)
            (d / "snapshots" / commit / name).write_text(text)

    return hh, put


def test_a_repo_id_is_read_from_the_hub_with_its_index(hub):
    _, put = hub
    text = '{"architectures": ["Qwen3MoeForCausalLM"]}'
    put("acme/tiny", {"config.json": text, "model.safetensors.index.json": json.dumps(
        {"weight_map": {"a.weight_packed": "1", "b.weight": "1"}})})
    ck = K.load_checkpoint("acme/tiny")
    assert (ck.source, ck.names_from, ck.config_text) == (
        "acme/tiny", "acme/tiny: model.safetensors.index.json", text)
    assert ck.module_names == ("a", "b") and ck.quantized == {"a"}
    assert ck.architecture == "Qwen3MoeForCausalLM"


def test_a_repo_id_is_read_at_the_revision_asked(hub):
    _, put = hub
    put("acme/tiny", {"config.json": '{"architectures": ["Old"]}'})
    put("acme/tiny", {"config.json": '{"architectures": ["New"]}',
                      "model.safetensors.index.json": '{"weight_map": {"n.weight": "1"}}'},
        ref="v2", commit="d" * 40)
    assert K.load_checkpoint("acme/tiny").architecture == "Old"
    ck = K.load_checkpoint("acme/tiny", revision="v2")
    assert ck.architecture == "New" and ck.module_names == ("n",)


def test_a_repo_without_an_index_is_read_from_its_safetensors_headers(hub, monkeypatch):
    hh, put = hub
    from huggingface_hub.utils import SafetensorsFileMetadata, SafetensorsRepoMetadata, TensorInfo

    put("acme/tiny", {"config.json": "{}"})
    asked = []

    def metadata(repo, revision=None):  # the hub's answer, in huggingface_hub's own types
        asked.append((repo, revision))
        info = TensorInfo(dtype="U8", shape=[1], data_offsets=(0, 1))
        return SafetensorsRepoMetadata(
            metadata=None, sharded=False, weight_map={"x.weight_packed": "model.safetensors"},
            files_metadata={"model.safetensors": SafetensorsFileMetadata(
                metadata={}, tensors={"x.weight_packed": info, "x.weight_scale": info})})

    monkeypatch.setattr(hh, "get_safetensors_metadata", metadata)
    ck = K.load_checkpoint("acme/tiny")
    assert ck.names_from == "acme/tiny: safetensors headers" and ck.quantized == {"x"}
    assert asked == [("acme/tiny", None)]
    # and when the hub cannot say (offline, no such file): config.json alone
    monkeypatch.setattr(hh, "get_safetensors_metadata", lambda *a, **k: 1 / 0)
    ck = K.load_checkpoint("acme/tiny")
    assert ck.names_from is None and ck.module_names == () and ck.config == {}


def test_a_damaged_index_from_the_hub_is_refused_as_a_local_one_is(hub, tmp_path):
    _, put = hub
    put("acme/tiny", {"config.json": "{}", "model.safetensors.index.json": '{"metadata": {}}'})
    with pytest.raises(InputError) as e:
        K.load_checkpoint("acme/tiny")
    assert e.value.message == "acme/tiny: model.safetensors.index.json has no weight_map"
    snap = tmp_path / "hub" / "models--acme--tiny" / "snapshots" / COMMIT
    assert e.value.facts == [f"read from {snap / 'model.safetensors.index.json'}"]
    assert e.value.hint == ("the copy in the Hugging Face cache is damaged; delete it and run "
                            "the command again")
    (snap / "model.safetensors.index.json").write_text('{"weight_map": {"a.weight": "1"')
    with pytest.raises(InputError, match="model.safetensors.index.json"):
        K.load_checkpoint("acme/tiny")  # cut short: not JSON, said so, never "no modules"
