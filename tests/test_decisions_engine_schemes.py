"""Decisions of the in-image probe imgbuild/payload/engine_schemes.py, without Docker or a GPU:
which scheme a config group declares (classify_group's table and its OTHER wording), which
tensors make a Linear-like module and its in/out sizes, which config group a module matches,
how modules become checks (expert blocks, sizes), the per-arch loop against a stand-in engine
(what counts as a mismatch, what is counted as chosen / error / not asked, which choices are
kernels not built here), the JSON report and its text word for word, the error texts, and
main's arguments, exit codes and stderr.

The engine is the narrow seam: a stand-in registered in es.ENGINES answers each module as a
scripted engine would; everything else runs as in the image, on safetensors files written here.
"""

from __future__ import annotations

import contextlib
import json
import struct
from collections import Counter
from types import SimpleNamespace

import pytest

from imgbuild.payload import engine_schemes as es

from .test_engine_schemes import (
    FP8_A,
    FP8_W,
    NVFP4,
    FakeEngine,
    _kernel_refusing,
    _Scheme,
    fp8_linear,
    mixed_ckpt,  # noqa: F401 - a fixture
    nvfp4_linear,
    write_safetensors,
)

# --- a stand-in engine, scripted per module and arch --------------------------------------------

SM100, SM120 = (10, 0), (12, 0)


def scheme(name):
    return lambda cap: _Scheme(name)


def raises(make):
    def answer(cap):
        raise make()
    return answer


def per_arch(**by_arch):
    return lambda cap: by_arch[f"sm{cap[0]}{cap[1]}"](cap)


def stand_in(answers):
    """An engine that answers each module (Linear or MoE block) from `answers`, and prints as
    real engines do while they load and while they are asked."""

    class Scripted(es.Engine):
        name = "sglang"

        def __init__(self):
            print("loading the stand-in engine")
            self.version = "9.9-stand-in"
            self.cap = None

        def parse(self, qcfg):
            return qcfg

        @contextlib.contextmanager
        def device(self, capability):
            print(f"answering as capability {capability}")
            self.cap = capability
            yield

        def linear(self, cfg, check):
            return answers[check.name](self.cap)

        moe = linear

    return Scripted


def clock(monkeypatch, *times):
    """The probe's monotonic clock reads these values in turn."""
    readings = iter(times)
    monkeypatch.setattr(es, "time", SimpleNamespace(monotonic=lambda: next(readings)))


def not_askable():
    return es.NotAskable("the MoE method needs the runtime")


SCENARIO = {
    # unquantized: no scheme on sm100, a scheme on sm120
    "lm_head": per_arch(sm100=lambda cap: None, sm120=scheme("CompressedTensorsW8A8Fp8")),
    # chosen but its kernel cannot be built here on sm100; refused on sm120
    "model.layers.0.mlp.down_proj": per_arch(
        sm100=lambda cap: _kernel_refusing("CompressedTensorsW4A4Fp4")(),
        sm120=raises(lambda: NotImplementedError(
            "No compressed-tensors compatible scheme was found."))),
    # a scheme EXPECTED has no row for: asked and counted, never judged
    "model.layers.0.mlp.gate_proj": scheme("CompressedTensorsWNA16"),
    # the right scheme on sm100, the wrong one on sm120
    "model.layers.0.self_attn.o_proj": per_arch(
        sm100=scheme("CompressedTensorsW8A8Fp8"), sm120=scheme("CompressedTensorsW8A16Fp8")),
    "model.layers.0.mlp.experts": raises(not_askable),
    "model.layers.1.mlp.experts": raises(not_askable),
}


@pytest.fixture()
def scenario_ckpt(tmp_path):
    """An unquantized lm_head, an FP8 attention projection, NVFP4 MLP projections (one of them
    in a group whose scheme no table knows), two blocks of three NVFP4 experts."""
    t = {"lm_head.weight": ("BF16", [64, 32])}
    t.update(fp8_linear("model.layers.0.self_attn.o_proj", 32, 32))
    t.update(nvfp4_linear("model.layers.0.mlp.down_proj", 32, 64))
    t.update(nvfp4_linear("model.layers.0.mlp.gate_proj", 64, 32))
    for layer in range(2):
        for e in range(3):
            t.update(nvfp4_linear(f"model.layers.{layer}.mlp.experts.{e}.down_proj", 32, 64))
    write_safetensors(tmp_path / "model.safetensors", t)
    odd = {"num_bits": 4, "type": "float", "strategy": "group", "group_size": 32}
    (tmp_path / "config.json").write_text(json.dumps({"quantization_config": {
        "quant_method": "compressed-tensors", "ignore": ["lm_head"],
        "config_groups": {
            "attn": {"weights": FP8_W, "input_activations": FP8_A,
                     "targets": [r"re:.*self_attn\..*"]},
            "odd": {"weights": odd, "targets": [r"re:.*mlp\.gate_proj$"]},
            "rest": {"weights": NVFP4, "input_activations": NVFP4, "targets": ["Linear"]}}}}))
    return tmp_path


KERNEL_ERROR = "ValueError: Failed to find a kernel that can implement the NVFP4 linear layer."
REFUSED = "NotImplementedError: No compressed-tensors compatible scheme was found."


def test_a_run_over_two_archs_reports_every_decision_in_its_json(scenario_ckpt, monkeypatch,
                                                                    capsys):
    monkeypatch.setitem(es.ENGINES, "sglang", stand_in(SCENARIO))
    clock(monkeypatch, 10.0, 11.23456, 20.0, 20.5)
    assert es.main(["--model", str(scenario_ckpt), "--engine", "sglang", "--arch", "sm100",
                    "--arch", "sm120", "--arch", "sm100", "--json"]) == 1
    out, err = capsys.readouterr()
    # what the engine prints goes to stderr, so stdout stays the report alone
    assert err == ("loading the stand-in engine\nanswering as capability (10, 0)\n"
                   "answering as capability (12, 0)\n")
    not_asked = [{"module": f"model.layers.{i}.mlp.experts", "arch": arch, "scheme": None,
                  "error": "not asked: the MoE method needs the runtime"}
                 for arch in ("sm100", "sm120") for i in range(2)]
    assert json.loads(out) == {
        "engine": "sglang", "version": "9.9-stand-in", "archs": ["sm100", "sm120"],
        "model": str(scenario_ckpt), "names_from": "safetensors headers",
        "modules_checked": 6, "checkpoint_modules": 10,
        "declared": {"None": 1, "OTHER(w=float4/group, a=none)": 1, "W4A4_NVFP4": 3,
                     "W8A8_FP8": 1},
        "chosen": {
            "sm100": {"CompressedTensorsW4A4Fp4": 1, "CompressedTensorsW8A8Fp8": 1,
                      "CompressedTensorsWNA16": 1, "none": 1, "not asked": 6},
            "sm120": {"CompressedTensorsW8A16Fp8": 1, "CompressedTensorsW8A8Fp8": 1,
                      "CompressedTensorsWNA16": 1, "error": 1, "not asked": 6}},
        "unchecked": ["linear:OTHER(w=float4/group, a=none)"],
        "mismatches": [
            {"module": "lm_head", "path": "linear", "arch": "sm120", "declared": None,
             "expected": None, "got": "CompressedTensorsW8A8Fp8", "error": None},
            {"module": "model.layers.0.mlp.down_proj", "path": "linear", "arch": "sm120",
             "declared": "W4A4_NVFP4", "expected": ["CompressedTensorsW4A4Fp4"], "got": None,
             "error": REFUSED},
            {"module": "model.layers.0.self_attn.o_proj", "path": "linear", "arch": "sm120",
             "declared": "W8A8_FP8", "expected": ["CompressedTensorsW8A8Fp8"],
             "got": "CompressedTensorsW8A16Fp8", "error": None}],
        "kernel_not_built": [
            {"module": "model.layers.0.mlp.down_proj", "arch": "sm100",
             "scheme": "CompressedTensorsW4A4Fp4", "error": KERNEL_ERROR},
            *not_asked[:2], *not_asked[2:]],
        "error": None, "ok": False,
        "seconds": {"import": 1.235, "check": 0.5}}


def test_a_run_with_mismatches_reads_as_text_line_by_line(scenario_ckpt, monkeypatch, capsys):
    monkeypatch.setitem(es.ENGINES, "sglang", stand_in(SCENARIO))
    clock(monkeypatch, 10.0, 11.23456, 20.0, 20.5)
    assert es.main(["--model", str(scenario_ckpt), "--engine", "sglang", "--arch", "sm100",
                    "--arch", "sm120"]) == 1
    assert capsys.readouterr().out == "\n".join([
        "engine-schemes: sglang 9.9-stand-in on sm100, sm120: 6 modules checked (10 in the "
        "checkpoint; names from safetensors headers)",
        "declared: None x1, OTHER(w=float4/group, a=none) x1, W4A4_NVFP4 x3, W8A8_FP8 x1",
        "sm100: CompressedTensorsW4A4Fp4 x1, CompressedTensorsW8A8Fp8 x1, "
        "CompressedTensorsWNA16 x1, none x1, not asked x6",
        "sm120: CompressedTensorsW8A16Fp8 x1, CompressedTensorsW8A8Fp8 x1, "
        "CompressedTensorsWNA16 x1, error x1, not asked x6",
        "no expectation for: linear:OTHER(w=float4/group, a=none)",
        "FAIL  [sm120] lm_head (linear, declared None): expected no scheme (unquantized), got "
        "CompressedTensorsW8A8Fp8",
        "FAIL  [sm120] model.layers.0.mlp.down_proj (linear, declared W4A4_NVFP4): expected "
        f"CompressedTensorsW4A4Fp4, got an exception: {REFUSED}",
        "FAIL  [sm120] model.layers.0.self_attn.o_proj (linear, declared W8A8_FP8): expected "
        "CompressedTensorsW8A8Fp8, got CompressedTensorsW8A16Fp8",
        "FAILED: 3 mismatches; import 1.2 s, check 0.5 s"]) + "\n"


def test_a_run_without_mismatches_reads_ok_and_exits_0(scenario_ckpt, monkeypatch, capsys):
    monkeypatch.setitem(es.ENGINES, "sglang", stand_in(SCENARIO))
    clock(monkeypatch, 0.0, 2.0, 2.0, 2.25)
    assert es.main(["--model", str(scenario_ckpt), "--engine", "sglang", "--arch", "sm100"]) == 0
    assert capsys.readouterr().out.splitlines()[2:] == [
        "sm100: CompressedTensorsW4A4Fp4 x1, CompressedTensorsW8A8Fp8 x1, "
        "CompressedTensorsWNA16 x1, none x1, not asked x6",
        "no expectation for: linear:OTHER(w=float4/group, a=none)",
        "ok: 0 mismatches; import 2.0 s, check 0.2 s"]


def test_a_run_lists_each_scheme_without_expectation_and_each_class_accepted(tmp_path,
                                                                            monkeypatch, capsys):
    t = {}
    t.update(nvfp4_linear("model.layers.0.mlp.gate_proj", 64, 32))
    for e in range(2):
        t.update(nvfp4_linear(f"model.layers.0.mlp.experts.{e}.down_proj", 32, 64))
    t.update(nvfp4_linear("model.layers.1.mlp.experts.0.down_proj", 32, 64))
    t["model.layers.1.mlp.experts.1.down_proj.weight"] = ("BF16", [32, 64])  # left unquantized
    write_safetensors(tmp_path / "model.safetensors", t)
    odd = {"num_bits": 4, "type": "float", "strategy": "group", "group_size": 32}
    (tmp_path / "config.json").write_text(json.dumps({"quantization_config": {
        "quant_method": "compressed-tensors", "config_groups": {
            "odd": {"weights": odd, "targets": [r"re:.*mlp\.gate_proj$"]},
            "int4": {"weights": INT4_GROUP, "targets": ["Linear"]}}}}))
    monkeypatch.setitem(es.ENGINES, "sglang", stand_in({
        "model.layers.0.mlp.gate_proj": lambda cap: None,
        "model.layers.0.mlp.experts": scheme("CompressedTensorsW8A8Fp8MoE"),
        "model.layers.1.mlp.experts": scheme("CompressedTensorsWNA16MoE")}))
    clock(monkeypatch, 0.0, 1.0, 1.0, 1.5)
    assert es.main(["--model", str(tmp_path), "--engine", "sglang", "--arch", "sm90"]) == 1
    assert capsys.readouterr().out.splitlines() == [
        "engine-schemes: sglang 9.9-stand-in on sm90: 3 modules checked (5 in the checkpoint; "
        "names from safetensors headers)",
        "declared: NOT_UNIFORM:None,WNA16_INT x1, OTHER(w=float4/group, a=none) x1, "
        "WNA16_INT x1",
        "sm90: CompressedTensorsW8A8Fp8MoE x2, CompressedTensorsWNA16MoE x2, none x1",
        "no expectation for: linear:OTHER(w=float4/group, a=none), "
        "moe:NOT_UNIFORM:None,WNA16_INT",
        "FAIL  [sm90] model.layers.0.mlp.experts (moe, declared WNA16_INT): expected "
        "CompressedTensorsWNA16MoE or CompressedTensorsWNA16TritonMoE or "
        "CompressedTensorsMxInt4MoE, got CompressedTensorsW8A8Fp8MoE",
        "FAILED: 1 mismatch; import 1.0 s, check 0.5 s"]


def test_an_unquantized_module_given_a_scheme_is_a_mismatch_naming_it():
    engine = stand_in({"lm_head": scheme("CompressedTensorsW8A8Fp8")})()
    mismatches = []
    counts = es._check_arch(engine, "sglang", {}, [es.Check("linear", "lm_head", None)],
                            "sm90", mismatches)
    assert counts == Counter({"CompressedTensorsW8A8Fp8": 1})
    assert mismatches == [{"module": "lm_head", "path": "linear", "arch": "sm90",
                           "declared": None, "expected": None,
                           "got": "CompressedTensorsW8A8Fp8", "error": None}]


def test_blocks_the_engine_cannot_be_asked_count_their_experts_without_a_kernel_list():
    engine = stand_in({"a.experts": raises(not_askable), "b.experts": raises(not_askable)})()
    checks = [es.Check("moe", "a.experts", "W4A4_NVFP4", covers=3),
              es.Check("moe", "b.experts", "W4A4_NVFP4", covers=4)]
    mismatches = []
    assert es._check_arch(engine, "sglang", {}, checks, "sm120", mismatches) == \
        Counter({"not asked": 7})
    assert mismatches == []


# --- the engine failing to load, and the config it is given ------------------------------------

class RejectingEngine(FakeEngine):
    """Loads, then rejects the config's format as an engine's from_config would."""

    def parse(self, qcfg):
        raise ValueError(f"unsupported format {qcfg['format']!r}")


def test_an_engine_that_rejects_the_config_is_reported_with_its_installed_version(
        mixed_ckpt, tmp_path_factory, monkeypatch, capsys):  # noqa: F811
    site = tmp_path_factory.mktemp("site")
    dist = site / "sglang-0.5.16.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: sglang\nVersion: 0.5.16\n")
    monkeypatch.syspath_prepend(str(site))
    monkeypatch.setitem(es.ENGINES, "sglang", RejectingEngine)
    argv = ["--model", str(mixed_ckpt), "--engine", "sglang", "--arch", "sm100"]
    error = "engine import/parse: ValueError: unsupported format 'mixed-precision'"

    clock(monkeypatch, 5.0, 6.23456)
    assert es.main([*argv, "--json"]) == 1
    rep = json.loads(capsys.readouterr().out)
    assert (rep["version"], rep["error"], rep["ok"]) == ("0.5.16", error, False)
    assert (rep["mismatches"], rep["chosen"], rep["kernel_not_built"]) == ([], {}, [])
    assert rep["seconds"] == {"import": 1.235, "check": 0.0}
    assert (rep["modules_checked"], rep["checkpoint_modules"]) == (15, 15)

    clock(monkeypatch, 5.0, 6.23456)
    assert es.main(argv) == 1
    assert capsys.readouterr().out == "\n".join([
        "engine-schemes: sglang 0.5.16 on sm100: 15 modules checked (15 in the checkpoint; "
        "names from safetensors headers)",
        "declared: None x1, W4A4_NVFP4 x6, W8A8_FP8 x8",
        f"FAIL  {error}",
        "FAILED: 0 mismatches; import 1.2 s, check 0.0 s"]) + "\n"


def _rewrite_qcfg(ckpt, edit):
    cfg = json.loads((ckpt / "config.json").read_text())
    (ckpt / "config.json").write_text(json.dumps(edit(cfg)))


def test_a_config_under_compression_config_is_read(mixed_ckpt, monkeypatch):  # noqa: F811
    _rewrite_qcfg(mixed_ckpt, lambda c: {"compression_config": c.pop("quantization_config")})
    monkeypatch.setitem(es.ENGINES, "sglang", FakeEngine)
    rep = es.run(mixed_ckpt, "sglang", ["sm100"])
    assert rep["ok"] is True and rep["modules_checked"] == 15


def test_a_config_without_quant_method_is_taken_as_compressed_tensors(mixed_ckpt,  # noqa: F811
                                                                      monkeypatch):
    def drop(c):
        del c["quantization_config"]["quant_method"]
        return c

    _rewrite_qcfg(mixed_ckpt, drop)
    monkeypatch.setitem(es.ENGINES, "sglang", FakeEngine)
    rep = es.run(mixed_ckpt, "sglang", ["sm100"])
    assert rep["ok"] is True and rep["declared"] == {"None": 1, "W4A4_NVFP4": 6, "W8A8_FP8": 8}


def test_another_quant_method_exits_2_naming_it(mixed_ckpt, capsys):  # noqa: F811
    def fp8(c):
        c["quantization_config"]["quant_method"] = "fp8"
        return c

    _rewrite_qcfg(mixed_ckpt, fp8)
    assert es.main(["--model", str(mixed_ckpt), "--engine", "sglang", "--arch", "sm100"]) == 2
    out, err = capsys.readouterr()
    assert out == ""
    assert err == (f"engine-schemes: {mixed_ckpt / 'config.json'}: quant_method 'fp8' is not "
                   "compressed-tensors\n")


def test_an_unparsable_config_json_exits_2_with_the_json_error(tmp_path, capsys):
    (tmp_path / "config.json").write_text("{not json")
    assert es.main(["--model", str(tmp_path), "--engine", "vllm", "--arch", "sm90"]) == 2
    assert capsys.readouterr().err == (
        f"engine-schemes: {tmp_path / 'config.json'}: Expecting property name enclosed in "
        "double quotes: line 1 column 2 (char 1)\n")



def test_a_shard_that_cannot_be_read_exits_2_naming_it(tmp_path, capsys):
    """A directory named like a shard (and so a file this user may not read): the probe's
    bad-input exit with the file and the reason, never a traceback."""
    (tmp_path / "config.json").write_text(json.dumps({"quantization_config": {
        "quant_method": "compressed-tensors", "config_groups": {}}}))
    (tmp_path / "model-00001-of-00001.safetensors").mkdir()
    assert es.main(["--model", str(tmp_path), "--engine", "vllm", "--arch", "sm90"]) == 2
    assert capsys.readouterr().err == (
        f"engine-schemes: {tmp_path / 'model-00001-of-00001.safetensors'}: cannot be read "
        "(Is a directory)\n")

# --- main's arguments ----------------------------------------------------------------------------

@pytest.mark.parametrize("missing", ["--model", "--engine", "--arch"])
def test_each_required_argument_missing_exits_2_naming_it(tmp_path, capsys, missing):
    given = {"--model": str(tmp_path), "--engine": "sglang", "--arch": "sm100"}
    argv = [x for k, v in given.items() if k != missing for x in (k, v)]
    with pytest.raises(SystemExit) as e:
        es.main(argv)
    assert e.value.code == 2
    assert f"error: the following arguments are required: {missing}" in capsys.readouterr().err


def test_an_unknown_engine_exits_2(tmp_path, capsys):
    with pytest.raises(SystemExit) as e:
        es.main(["--model", str(tmp_path), "--engine", "tgi", "--arch", "sm100"])
    assert e.value.code == 2
    assert "argument --engine: invalid choice: 'tgi'" in capsys.readouterr().err


def test_help_says_what_the_probe_does_and_each_option(capsys):
    with pytest.raises(SystemExit) as e:
        es.main(["--help"])
    assert e.value.code == 0
    text = " ".join(capsys.readouterr().out.split())
    assert ("In-image probe: does the image's OWN engine pick, for every layer of a checkpoint, "
            "the quantization scheme the checkpoint declares, on each target GPU arch? No GPU, "
            "no network.") in text
    assert "Exit status" not in text and "Reads DIR/config.json" not in text
    assert "--model MODEL checkpoint directory" in text
    assert "--arch {sm100,sm103,sm110,sm120,sm121,sm80,sm89,sm90} target GPU arch (repeat " \
           "for several)" in text
    assert "--json print the report as JSON" in text


# --- what a config group declares -------------------------------------------------------------

INT4_GROUP = {"num_bits": 4, "type": "int", "strategy": "group", "group_size": 128}


@pytest.mark.parametrize("weights, acts, label", [
    ({"num_bits": 4, "type": "int", "strategy": "channel"}, None, "WNA16_INT"),
    # int4 in groups of 16 is not NVFP4
    (dict(INT4_GROUP, group_size=16), None, "WNA16_INT"),
    # int8 weights without activations are weight-only
    ({"num_bits": 8, "type": "int", "strategy": "channel"}, None, "WNA16_INT"),
    (NVFP4, {"num_bits": 4, "type": "int"}, "OTHER(w=float4/tensor_group, a=int4)"),
    (NVFP4, {"num_bits": 8, "type": "float"}, "OTHER(w=float4/tensor_group, a=float8)"),
    (FP8_W, {"num_bits": 8, "type": "int"}, "OTHER(w=float8/channel, a=int8)"),
    (FP8_W, {"num_bits": 16, "type": "float"}, "OTHER(w=float8/channel, a=float16)"),
    ({"num_bits": 4, "type": "float", "strategy": "group", "group_size": 32}, None,
     "OTHER(w=float4/group, a=none)"),
    (INT4_GROUP, FP8_A, "OTHER(w=int4/group, a=float8)"),
    ({"num_bits": 4, "type": "int", "strategy": "tensor"}, None, "OTHER(w=int4/tensor, a=none)"),
])
def test_a_group_is_classified_by_weights_and_activations(weights, acts, label):
    assert es.classify_group({"weights": weights, "input_activations": acts}) == label


# --- which tensors make a Linear-like module, and its sizes ------------------------------------

def test_a_module_without_a_weight_does_not_end_the_listing():
    assert es.linear_modules({"a.bias": [8], "b.weight": [8, 4]}) == [
        es.Module("b", False, 4, 8)]


def test_weights_of_other_than_two_dimensions_are_not_linear():
    tensors = {"experts.weight": [8, 16, 32], "router.weight": [16], "proj.weight": [24, 40]}
    assert es.linear_modules(tensors) == [es.Module("proj", False, 40, 24)]


def test_a_packed_weight_makes_a_linear_module_sized_from_it():
    # NVFP4 packs two values a byte: [out, in / 2]; whatever `.weight` is beside it
    tensors = {"m.weight_packed": [48, 32], "m.weight_scale": [48, 4], "m.weight": [3]}
    assert es.linear_modules(tensors) == [es.Module("m", True, 64, 48)]


def test_a_weight_of_unknown_shape_is_sized_16_by_16():
    assert es.linear_modules({"a.c.weight": None}) == [es.Module("a.c", False, 16, 16)]


def test_the_safetensors_metadata_entry_is_not_a_tensor(tmp_path):
    header = {"__metadata__": {"format": "pt"},
              "a.weight": {"dtype": "BF16", "shape": [4, 2], "data_offsets": [0, 16]}}
    raw = json.dumps(header).encode()
    raw += b" " * (-len(raw) % 8)
    (tmp_path / "model.safetensors").write_bytes(struct.pack("<Q", len(raw)) + raw + bytes(16))
    assert es.checkpoint_tensors(tmp_path) == ({"a.weight": [4, 2]}, "safetensors headers")


def test_an_index_without_a_weight_map_is_an_input_error_naming_it(tmp_path):
    index = tmp_path / "model.safetensors.index.json"
    index.write_text(json.dumps({"metadata": {}}))
    with pytest.raises(es.ProbeInputError) as e:
        es.checkpoint_tensors(tmp_path)
    assert str(e.value) == f"{index}: no weight_map ('weight_map')"


# --- which group a module matches, and the checks planned --------------------------------------

def test_the_class_name_target_is_never_a_module_name():
    groups = {"cls": {"targets": ["Linear"]}, "named": {"targets": ["re:^Linear$"]}}
    assert es.match_group("Linear", groups) == "named"
    # an exact-name target spelt like a class name in lower case is a name
    assert es.match_group("linear", {"g": {"targets": ["linear"]}}) == "g"


def test_a_linear_check_carries_the_modules_sizes_and_a_lone_expert_is_a_block():
    cfg = {"config_groups": {"g": {"targets": ["Linear"], "weights": NVFP4,
                                   "input_activations": NVFP4}}}
    mods = [es.Module("m.experts.0.down_proj", True, 64, 32), es.Module("m.o_proj", True, 48, 24)]
    assert es.plan_checks(mods, cfg) == [
        es.Check("linear", "m.o_proj", "W4A4_NVFP4", 48, 24),
        es.Check("moe", "m.experts", "W4A4_NVFP4", covers=1)]


# --- which failure was the engine's choice, and error texts --------------------------------------

CT_MODULE = "fake.compressed_tensors.schemes"


def _raised(fn):
    try:
        fn()
    except Exception as e:  # noqa: BLE001
        return e
    raise AssertionError("did not raise")


def test_only_a_compressed_tensors_schemes_constructor_counts_as_the_choice():
    class CompressedTensorsConfig:
        __module__ = "fake.compressed_tensors.compressed_tensors"

        def get_scheme(self):
            raise NotImplementedError("No compressed-tensors compatible scheme was found.")

    class MarlinKernelPicker:  # in the package, but not a scheme
        __module__ = CT_MODULE

        def __init__(self):
            raise ValueError("no kernel")

    class CompressedTensorsLookalike:  # named like one, from elsewhere
        __module__ = "other.schemes"

        def __init__(self):
            raise ValueError("no kernel")

    class Helper:
        def __init__(self):
            raise ValueError("no kernel")

    for cls in (MarlinKernelPicker, CompressedTensorsLookalike, Helper):
        assert es._constructing(_raised(cls)) is None, cls
    assert es._constructing(_raised(CompressedTensorsConfig().get_scheme)) is None

    inner = _kernel_refusing("CompressedTensorsW4A4Fp4Kernel")

    class CompressedTensorsW4A4Fp4:
        __module__ = CT_MODULE

        def __init__(self):
            self.kernel = inner()

    assert es._constructing(_raised(CompressedTensorsW4A4Fp4)) is CompressedTensorsW4A4Fp4


def test_error_text_of_one_argument_is_the_exceptions_own_text():
    assert es._error_text(KeyError("weight_map")) == "KeyError: 'weight_map'"
    assert es._error_text(ValueError()) == "ValueError: "


def test_error_text_of_something_without_args_is_its_text():
    class Refusal:
        def __str__(self):
            return "refused"

    assert es._error_text(Refusal()) == "Refusal: refused"
