"""check-model (builder/checks/checkmodel/) on real llmcompressor checkpoints and on config texts.

Two checkpoints are generated once per session with builder.smokemodel into a temporary cache:
NVFP4 (W4A4, one group, `Linear` targets) and FP8 attention + NVFP4 MLP (two groups, top-level
`mixed-precision`, regex targets). Engine behaviours come from images/checks/engines.yaml; the
compressed-tensors formats of an old release are written out here (CompressionFormat values of
compressed-tensors 0.9.x) rather than downloaded. Matching is cross-checked against
compressed-tensors' own `match_name` (the intended, exact semantics) and against a transcript
of SGLang 0.5.16's substring matcher.
"""

from __future__ import annotations

import json
import os
import random
import re
import shutil
from dataclasses import replace
from pathlib import Path

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

from builder.catalog.engines import load_engines  # noqa: E402
from builder.checks import checkmodel as cm  # noqa: E402
from builder.errors import EnvError, InputError, SpecError  # noqa: E402
from builder.workspace import Workspace  # noqa: E402

from .conftest import checkout_workspace  # noqa: E402

WS = checkout_workspace()
ENGINES = WS.engines

ROOT = Path(__file__).resolve().parent.parent

# CompressionFormat values of compressed-tensors 0.9.x: no nvfp4-pack-quantized (0.10.0),
# no mixed-precision (0.11.0).
CT_09 = {"dense", "sparse-bitmask", "sparse-24-bitmask", "int-quantized", "float-quantized",
         "naive-quantized", "pack-quantized", "marlin-24"}


def ct_now() -> set[str]:
    from compressed_tensors import CompressionFormat

    return {f.value for f in CompressionFormat}


# --- transcripts of the engines' matchers, as the wheels write them --------------------------

def sglang_0516_match(layer_name: str, target: str) -> bool:
    """sglang 0.5.16 compressed_tensors/utils.py:158-176 with check_contains=True."""
    if target.startswith("re:"):
        return re.match(target[3:], layer_name) is not None
    return target.lower() in layer_name.lower()


def sglang_0517_match(layer_name: str, target: str) -> bool:
    """sglang 0.5.17 compressed_tensors/utils.py:94-99."""
    if target.startswith("re:"):
        return re.match(target[3:], layer_name) is not None
    return target == layer_name or layer_name.endswith("." + target)


def ct_match(name: str, target: str) -> bool:
    from compressed_tensors.utils.match import match_name

    return match_name(name, target)


def with_parents(names):
    out = set()
    for n in names:
        parts = n.split(".")
        out.update(".".join(parts[:i]) for i in range(1, len(parts) + 1))
    return out


# --- fixtures --------------------------------------------------------------------------------

@pytest.fixture(scope="session")
def checkpoints(tmp_path_factory) -> dict[str, Path]:
    from builder import smokemodel

    cache = tmp_path_factory.mktemp("checkmodel-cache")
    out = {}
    for key, scheme in (("nvfp4", "NVFP4"), ("mixed", "FP8-ATTN+NVFP4-MLP")):
        spec = smokemodel.SmokeModelSpec(name=f"ckm-{key}", scheme=scheme)
        out[key] = smokemodel.ensure(spec, cache_dir=cache)
    return out


@pytest.fixture(scope="session")
def catalog():
    return WS.catalog


@pytest.fixture(scope="session")
def engines():
    return ENGINES


def sglang(catalog, version: str, patches: tuple[str, ...] = (), name: str = "sglang-blackwell"):
    return replace(catalog.target(name), engine_version=version, patches=patches)


def copy_checkpoint(src: Path, dst: Path) -> Path:
    dst.mkdir(parents=True)
    for f in ("config.json", "model.safetensors"):
        shutil.copy2(src / f, dst / f)
    return dst


def edit_ignore(d: Path, extra: list[str]) -> None:
    cfg = json.loads((d / "config.json").read_text())
    cfg["quantization_config"]["ignore"] += extra
    (d / "config.json").write_text(json.dumps(cfg, indent=2))


def kinds(findings) -> list[str]:
    return [f"{f.severity}:{f.kind}" for f in findings]


# --- engine data -----------------------------------------------------------------------------

def test_engine_behaviours_by_version_and_patch(engines):
    b = cm.behaviour("sglang", "0.5.16", table=engines)
    assert (b.value("ignore_matcher"), b.value("activation_gate"),
            b.value("packed_modules_mapping")) == ("substring", "top-level", "model")
    assert b.facts["ignore_matcher"].fixed_in == "0.5.17"
    assert any("utils.py:85" in e for e in b.facts["ignore_matcher"].rule.evidence)
    b = cm.behaviour("sglang", "0.5.17", table=engines)
    assert (b.value("ignore_matcher"), b.value("activation_gate")) == ("suffix", "per-group")
    assert cm.behaviour("sglang", "0.5.6.post2", table=engines).value("ignore_matcher") == "exact"
    assert cm.behaviour("sglang", "0.5.7", table=engines).value("ignore_matcher") == "substring"
    b = cm.behaviour("sglang", "0.5.16", ("sglang-ct-ignore-exact-match",
                                           "sglang-ct-mixed-precision-format"), table=engines)
    assert (b.value("ignore_matcher"), b.value("activation_gate"),
            b.value("packed_modules_mapping")) == ("suffix", "per-group", "model")
    assert b.facts["ignore_matcher"].patched_by == "sglang-ct-ignore-exact-match"
    assert b.facts["ignore_matcher"].base_value == "substring"
    v = cm.behaviour("vllm", "0.33.0", table=engines)
    assert (v.value("ignore_matcher"), v.value("activation_gate")) == ("exact", "per-group")
    assert cm.behaviour("vllm", "0.20.0", table=engines).value("ignore_matcher") is None
    assert cm.behaviour("sglang", "0.5.23", table=engines).w4a4("linear") == "falls-back"
    assert cm.behaviour("sglang", "0.5.21", table=engines).w4a4("linear") == "refuses"
    for e in engines.engines.values():
        for rules in e.rules.values():
            for r in rules:
                assert r.evidence and r.checked, r


def test_engine_data_errors_name_file_and_key(tmp_path):
    (tmp_path / "checks").mkdir()
    text = (ROOT / "images/checks/engines.yaml").read_text()
    (tmp_path / "checks/engines.yaml").write_text(
        text.replace("value: substring", "value: substrng", 1))
    with pytest.raises(SpecError) as e:
        load_engines(tmp_path)
    assert "checks/engines.yaml" in str(e.value) and "ignore_matcher[1].value" in str(e.value)


# --- reading a checkpoint --------------------------------------------------------------------

def test_load_reads_module_names_from_safetensors_header(checkpoints):
    from safetensors import safe_open

    ck = cm.load_checkpoint(checkpoints["nvfp4"])
    with safe_open(str(checkpoints["nvfp4"] / "model.safetensors"), "pt") as f:
        keys = set(f.keys())
    assert set(cm.safetensors_keys(checkpoints["nvfp4"] / "model.safetensors")) == keys
    assert "header" in ck.names_from
    assert set(ck.module_names) == {k.rpartition(".")[0] for k in keys}
    linears = {f"model.layers.{i}.{p}" for i in range(2) for p in (
        "self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj",
        "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj")}
    assert ck.quantized == linears and ck.w4a4 == linears
    assert ck.architecture == "Qwen3ForCausalLM"
    mixed = cm.load_checkpoint(checkpoints["mixed"] / "config.json")  # the file: siblings read
    assert len(mixed.quantized) == 14 and len(mixed.w4a4) == 6


def test_load_prefers_the_safetensors_index(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"architectures": ["X"]}))
    (tmp_path / "model.safetensors.index.json").write_text(json.dumps({
        "metadata": {}, "weight_map": {"a.b.weight_packed": "s1", "a.b.weight_scale": "s1",
                                       "a.c.weight": "s2"}}))
    ck = cm.load_checkpoint(tmp_path)
    assert ck.names_from == "model.safetensors.index.json"
    assert ck.module_names == ("a.b", "a.c") and ck.quantized == {"a.b"}


def test_unreachable_hub_and_missing_path(monkeypatch):
    pytest.importorskip("huggingface_hub")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises((EnvError, InputError)) as e:
        cm.load_checkpoint("no-such-org-imgbuild/no-such-model")
    assert e.value.hint
    with pytest.raises(InputError):
        cm.load_checkpoint("/no/such/dir")


# --- formats and the mixed-precision gate ----------------------------------------------------

def test_formats_the_old_compressed_tensors_lacks(checkpoints, catalog, engines):
    t = sglang(catalog, "0.5.23")
    ck = cm.load_checkpoint(checkpoints["nvfp4"])
    fs = [f for f in cm.check(ck, target=t, catalog=catalog, engines=engines, ct_formats=CT_09,
                              ct_version="0.9.2") if f.kind == "format"]
    assert len(fs) == 1 and fs[0].severity == "error"
    assert "'nvfp4-pack-quantized'" in fs[0].message and "0.9.2" in fs[0].message
    assert fs[0].counts["places"] == 2  # top level and group_0
    assert "is not a valid CompressionFormat" in fs[0].facts[-1]
    mixed = cm.load_checkpoint(checkpoints["mixed"])
    fs = [f for f in cm.check(mixed, target=t, catalog=catalog, engines=engines,
                              ct_formats=CT_09, ct_version="0.9.2") if f.kind == "format"]
    assert sorted(re.search(r"'(.*?)'", f.message).group(1) for f in fs) == \
        ["mixed-precision", "nvfp4-pack-quantized"]
    for c in (ck, mixed):
        assert not [f for f in cm.check(c, target=t, catalog=catalog, engines=engines,
                                        ct_formats=ct_now(), ct_version="0.19.0")
                    if f.kind == "format"]


def test_mixed_precision_gate(checkpoints, catalog, engines):
    mixed = cm.load_checkpoint(checkpoints["mixed"])

    def gate(version, patches=()):
        return [f for f in cm.check(mixed, target=sglang(catalog, version, patches),
                                    catalog=catalog, engines=engines, ct_formats=ct_now())
                if f.kind == "mixed-precision-gate"]

    fs = gate("0.5.16")
    assert len(fs) == 1 and fs[0].severity == "error"
    assert "No compressed-tensors compatible scheme was found." in fs[0].facts[-1]
    assert any("compressed_tensors.py:596" in x for x in fs[0].facts)
    assert "group_0: float-quantized" in fs[0].examples
    assert "0.5.17" in fs[0].hint and "sglang-ct-mixed-precision-format" in fs[0].hint
    assert gate("0.5.8") and gate("0.5.7")
    assert not gate("0.5.17") and not gate("0.5.23")
    assert not gate("0.5.16", ("sglang-ct-mixed-precision-format",))
    vllm = catalog.target("vllm-blackwell")
    assert not [f for f in cm.check(mixed, target=vllm, catalog=catalog, engines=engines,
                                    ct_formats=ct_now()) if f.kind == "mixed-precision-gate"]
    nvfp4 = cm.load_checkpoint(checkpoints["nvfp4"])
    assert not [f for f in cm.check(nvfp4, target=sglang(catalog, "0.5.16"), catalog=catalog,
                                    engines=engines, ct_formats=ct_now())
                if f.kind == "mixed-precision-gate"]


# --- ignore entries that are parent modules --------------------------------------------------

@pytest.fixture()
def parent_ckpt(checkpoints, tmp_path) -> Path:
    """The NVFP4 checkpoint with two parent modules added to its ignore list, as llmcompressor
    writes them for containers: each holds quantized layers (3 MLP, 4 attention)."""
    d = copy_checkpoint(checkpoints["nvfp4"], tmp_path / "ckpt")
    edit_ignore(d, ["model.layers.0.mlp", "model.layers.1.self_attn"])
    return d


def test_ignore_parent_counts_on_a_real_checkpoint(parent_ckpt, catalog, engines):
    ck = cm.load_checkpoint(parent_ckpt)
    fs = [f for f in cm.check(ck, target=sglang(catalog, "0.5.16"), catalog=catalog,
                              engines=engines, ct_formats=ct_now()) if f.kind == "ignore-parent"]
    assert len(fs) == 1 and fs[0].severity == "error"
    assert fs[0].counts == {"entries": 2, "ignore_entries": 3, "parent_entries": 2,
                            "hidden_modules": 7, "moe_layers": 0}
    assert fs[0].examples[0].startswith("model.layers.1.self_attn (parent) hides 4")
    assert any("utils.py:85" in x for x in fs[0].facts)
    assert "--fix" in fs[0].hint and "sglang-ct-ignore-exact-match" in fs[0].hint
    # the count is what the engine's own matcher does to the quantized modules
    entries = ["lm_head", "model.layers.0.mlp", "model.layers.1.self_attn"]
    by_engine = {m for m in ck.quantized if any(sglang_0516_match(m, e) for e in entries)}
    assert len(by_engine) == 7
    for version, patches in (("0.5.17", ()), ("0.5.23", ()), ("0.5.16", ("sglang-ct-ignore-exact-match",)),
                             ("0.5.6", ())):
        assert not [f for f in cm.check(ck, target=sglang(catalog, version, patches),
                                        catalog=catalog, engines=engines, ct_formats=ct_now())
                    if f.kind == "ignore-parent"], version


def test_an_unrecorded_engine_version_is_a_warning_not_a_guess(parent_ckpt, catalog, engines):
    ck = cm.load_checkpoint(parent_ckpt)
    old_vllm = replace(catalog.target("vllm-blackwell"), engine_version="0.20.0")
    fs = [f for f in cm.check(ck, target=old_vllm, catalog=catalog, engines=engines,
                              ct_formats=ct_now()) if f.kind == "ignore-parent"]
    assert {f.severity for f in fs} == {"warning"}
    assert any("not recorded" in f.message or "if it matches by substring" in f.message
               for f in fs)


def test_fix_writes_an_equivalent_config_and_keeps_the_original(parent_ckpt, tmp_path):
    images = tmp_path / "images"
    shutil.copytree(ROOT / "images", images)
    shutil.copytree(ROOT / "lockfiles", tmp_path / "lockfiles")
    y = images / "sglang-hopper.yaml"
    y.write_text(y.read_text().replace('version: "0.5.23"', 'version: "0.5.16"'))
    ws = Workspace(images, tmp_path / "lockfiles")
    cat = ws.catalog
    original = (parent_ckpt / "config.json").read_text()
    out = tmp_path / "fixed"
    rep = cm.check_model(ws, str(parent_ckpt), "sglang-hopper", fix_out=out,
                         ct_formats=ct_now())
    assert rep.behaviour.version == "0.5.16"
    assert (out / "config.json.orig").read_text() == original
    new = json.loads((out / "config.json").read_text())
    ignore = new["quantization_config"]["ignore"]
    assert ignore == ["lm_head", r"re:^model\.layers\.0\.mlp$", r"re:^model\.layers\.1\.self_attn$"]
    p = rep.fix.proof
    assert p.equal and p.hidden_before == 7 and p.hidden_after == 0
    assert p.intended == p.exact == p.suffix == p.substring == 3
    # Independently: compressed-tensors' own matching ignores the same modules (leaves and
    # parents), and SGLang 0.5.16's matcher no longer hides a quantized layer.
    ck = cm.load_checkpoint(parent_ckpt)
    names = with_parents(ck.module_names)
    old_entries = json.loads(original)["quantization_config"]["ignore"]
    assert {n for n in names if any(ct_match(n, e) for e in old_entries)} == \
        {n for n in names if any(ct_match(n, e) for e in ignore)}
    assert not {m for m in ck.quantized if any(sglang_0516_match(m, e) for e in ignore)}
    assert not {m for m in ck.quantized if any(sglang_0517_match(m, e) for e in ignore)}
    # the rest of config.json is untouched
    old = json.loads(original)
    old["quantization_config"]["ignore"] = ignore
    assert old == new
    # the fixed config passes
    fixed = replace(ck, config=new)
    t = cat.target("sglang-hopper")
    assert not [f for f in cm.check(fixed, target=t, catalog=cat, engines=ws.engines,
                                    ct_formats=ct_now())
                if f.kind == "ignore-parent"]
    assert rep.exit_code == 1  # W4A4 on sm90 is still an error for sglang 0.5.16
    assert json.loads(json.dumps(rep.to_dict()))["fix"]["proof"]["equal"] is True
    # a second run keeps the first original; in place, the original lies beside config.json
    rep2 = cm.check_model(ws, str(parent_ckpt), "sglang-hopper", fix_out=out / "config.json",
                          ct_formats=ct_now())
    assert rep2.fix.orig_kept and (out / "config.json.orig").read_text() == original
    cm.check_model(ws, str(parent_ckpt), "sglang-hopper", fix_out=parent_ckpt,
                   ct_formats=ct_now())
    assert (parent_ckpt / "config.json.orig").read_text() == original
    assert json.loads((parent_ckpt / "config.json").read_text()) == new


def moe_names(layers: int, experts: int) -> tuple[list[str], set[str]]:
    tensors, quantized = [], set()
    for layer in range(layers):
        pre = f"model.language_model.layers.{layer}"
        for a in ("q_proj", "k_proj", "v_proj", "o_proj"):
            tensors.append(f"{pre}.self_attn.{a}.weight")
        tensors.append(f"{pre}.mlp.gate.weight")
        for e in range(experts):
            for w in ("gate_proj", "up_proj", "down_proj"):
                m = f"{pre}.mlp.experts.{e}.{w}"
                quantized.add(m)
                tensors += [f"{m}.weight_packed", f"{m}.weight_scale",
                            f"{m}.weight_global_scale", f"{m}.input_global_scale"]
    return tensors, quantized


def moe_config(ignore: list[str]) -> dict:
    return {"architectures": ["Qwen3MoeForCausalLM"], "quantization_config": {
        "quant_method": "compressed-tensors", "format": "nvfp4-pack-quantized",
        "config_groups": {"group_0": {"format": "nvfp4-pack-quantized", "targets": ["Linear"],
                                      "weights": {"num_bits": 4, "type": "float",
                                                  "group_size": 16},
                                      "input_activations": {"num_bits": 4, "type": "float"}}},
        "ignore": ignore}}


def test_fix_collapses_thousands_of_parents_exactly(catalog, engines):
    rng = random.Random(7)
    tensors, quantized = moe_names(12, 40)
    ignore = [f"model.language_model.layers.{layer}.self_attn.{a}" for layer in range(12)
              for a in ("q_proj", "k_proj", "v_proj", "o_proj")]
    ignore += [f"model.language_model.layers.{layer}.mlp.gate" for layer in range(12)]
    # every expert in layers 0-7, a scattered subset elsewhere, and one that only collides
    # by substring (experts.1 also hides experts.10-19 under SGLang 0.5.16)
    parents = [(layer, e) for layer in range(8) for e in range(40)]
    parents += [(layer, e) for layer in range(8, 12) for e in rng.sample(range(40), 9)]
    ignore += [f"model.language_model.layers.{layer}.mlp.experts.{e}" for layer, e in parents]
    ignore += ["MODEL.LANGUAGE_MODEL.LAYERS.11.MLP.EXPERTS.3"]  # substring is case-blind
    ck = cm.Checkpoint.from_tensors(moe_config(ignore), tensors, "synthetic")
    t = sglang(catalog, "0.5.16")
    ana = cm.analyze(ck, target=t, catalog=catalog, engines=engines, ct_formats=ct_now())
    f = next(f for f in ana.findings if f.kind == "ignore-parent")
    entries = [e for e in ignore if not e.startswith("re:")]
    by_engine = {m for m in quantized if any(sglang_0516_match(m, e) for e in entries)}
    assert f.counts["hidden_modules"] == len(by_engine) > 3 * len(parents)
    assert f.counts["entries"] == len(parents) + 1
    assert f.counts["moe_layers"] == sum(1 for layer in range(12) if any(
        sglang_0516_match(f"model.language_model.layers.{layer}.mlp.experts.0.up_proj", e)
        for e in entries))
    result = cm.fix(ck.config, ana.index, quantized=ck.quantized)
    new = result.config["quantization_config"]["ignore"]
    assert len(result.replaced) == len(parents) + 1 and len(result.added) < 12
    assert all(e.startswith("re:^") and e.endswith("$") for e in result.added)
    names = with_parents(ck.module_names) | {e for e in ignore}
    assert {n for n in names if any(ct_match(n, e) for e in ignore)} == \
        {n for n in names if any(ct_match(n, e) for e in new)}
    assert not {m for m in quantized if any(sglang_0516_match(m, e) for e in new)}
    assert result.proof.equal and result.proof.hidden_after == 0


def test_number_regex_is_exact():
    rng = random.Random(3)
    sets = [set(range(lo, hi + 1)) for lo in range(0, 40) for hi in range(lo, 130, 7)]
    sets += [set(rng.sample(range(0, 300), k)) for k in (1, 2, 5, 30, 120)]
    sets += [{0}, {9, 10}, {99, 100, 101}, {0, 1, 2, 5, 7, 30}, set(range(0, 1000))]
    probe = [str(i) for i in range(0, 1100)] + ["00", "01", "007", "1a", ""]
    for s in sets:
        rx = re.compile("(?:" + cm.number_regex(s) + r")\Z")
        got = {p for p in probe if rx.match(p)}
        assert got == {str(i) for i in s}, sorted(s)[:10]


def test_index_matchers_agree_with_the_engines(engines):
    rng = random.Random(11)
    leaves = [f"model.layers.{layer}.{m}" for layer in (0, 1, 2, 10, 11, 21) for m in (
        "self_attn.q_proj", "self_attn.qkv_proj", "mlp.gate", "mlp.gate_proj", "mlp.up_proj",
        "mlp.experts.0.w1", "mlp.experts.1.w1", "mlp.experts.10.w2", "mlp.shared_expert_gate",
        "Mixer.In_Proj")] + ["lm_head", "model.embed_tokens", "mtp.lm_head"]
    index = cm.NameIndex(leaves)
    names = sorted(with_parents(leaves))
    assert index.names == names
    entries = ["model.layers.1", "layers.1", "model.layers.1.mlp.gate", "mlp.gate", "gate",
               "lm_head", "ers.1.mlp.exp", "experts.1", "s.1", ".", "mixer.in_proj",
               "MODEL.LAYERS.2", "self_attn.q", "proj", "model.layers.0.mlp.experts.1",
               "1.self_attn.qkv_proj", "re:.*experts\\.1\\.", "re:model\\.layers\\.2"]
    entries += [rng.choice(names)[rng.randrange(0, 5):] for _ in range(40)]
    for e in entries:
        assert set(index.matches(e, "substring")) == {
            n for n in names if sglang_0516_match(n, e)}, e
        assert set(index.matches(e, "suffix")) == {
            n for n in names if sglang_0517_match(n, e)}, e
        assert set(index.matches(e, "exact")) == {n for n in names if ct_match(n, e)}, e
        for m in ("exact", "suffix", "substring"):
            assert cm.names_ignored(names, [e], m) == set(index.matches(e, m)), (e, m)


def test_config_only_input_flags_parent_shaped_entries(tmp_path, catalog, engines):
    cfg = moe_config(["lm_head", "model.layers.0.mlp.experts.0", "model.layers.0.mlp",
                      "model.layers.3.self_attn.o_proj"])
    p = tmp_path / "my-config.json"
    p.write_text(json.dumps(cfg))
    ck = cm.load_checkpoint(p)
    assert ck.module_names == () and ck.names_from is None
    fs = [f for f in cm.check(ck, target=sglang(catalog, "0.5.16"), catalog=catalog,
                              engines=engines, ct_formats=ct_now()) if f.kind == "ignore-parent"]
    assert len(fs) == 1 and fs[0].severity == "warning"
    assert set(fs[0].examples) == {"model.layers.0.mlp.experts.0", "model.layers.0.mlp"}


# --- fused projections -----------------------------------------------------------------------

def qwen3_next_checkpoint(d: Path, *, split: bool = True, mapping: bool = False) -> Path:
    """config.json + model.safetensors.index.json in the shape of a Qwen3-Next checkpoint:
    linear-attention layers (0-2) keep their GDN projections in bf16 (ignored), the full
    attention layer (3) and the experts are NVFP4."""
    d.mkdir(parents=True)
    wm, ignore = {}, []
    gdn = ("in_proj_qkv", "in_proj_z", "in_proj_b", "in_proj_a") if split else \
        ("in_proj_qkvz", "in_proj_ba")
    for layer in range(4):
        pre = f"model.layers.{layer}"
        if layer < 3:
            for p in gdn + ("out_proj",):
                wm[f"{pre}.linear_attn.{p}.weight"] = "model-00001-of-00002.safetensors"
                ignore.append(f"{pre}.linear_attn.{p}")
            wm[f"{pre}.linear_attn.A_log"] = "model-00001-of-00002.safetensors"
        else:
            for p in ("q_proj", "k_proj", "v_proj", "o_proj"):
                for t in ("weight_packed", "weight_scale", "weight_global_scale",
                          "input_global_scale"):
                    wm[f"{pre}.self_attn.{p}.{t}"] = "model-00002-of-00002.safetensors"
        wm[f"{pre}.mlp.gate.weight"] = "model-00002-of-00002.safetensors"
        ignore.append(f"{pre}.mlp.gate")
        for e in range(4):
            for p in ("gate_proj", "up_proj", "down_proj"):
                for t in ("weight_packed", "weight_scale", "weight_global_scale",
                          "input_global_scale"):
                    wm[f"{pre}.mlp.experts.{e}.{p}.{t}"] = "model-00002-of-00002.safetensors"
    q = {"quant_method": "compressed-tensors", "format": "nvfp4-pack-quantized",
         "config_groups": {"group_0": {"format": "nvfp4-pack-quantized", "targets": ["Linear"],
                                       "weights": {"num_bits": 4, "type": "float",
                                                   "group_size": 16},
                                       "input_activations": {"num_bits": 4, "type": "float"}}},
         "ignore": ignore}
    if mapping:
        q["packed_modules_mapping"] = {"in_proj_qkvz": ["in_proj_qkv", "in_proj_z"],
                                       "in_proj_ba": ["in_proj_b", "in_proj_a"]}
    (d / "config.json").write_text(json.dumps({
        "architectures": ["Qwen3NextForCausalLM"], "model_type": "qwen3_next",
        "num_hidden_layers": 4, "full_attention_interval": 4, "quantization_config": q},
        indent=2))
    (d / "model.safetensors.index.json").write_text(json.dumps(
        {"metadata": {"total_size": 123}, "weight_map": wm}, indent=2))
    return d


def fused(ck, target, catalog, engines):
    return [f for f in cm.check(ck, target=target, catalog=catalog, engines=engines,
                                ct_formats=ct_now()) if f.kind == "fused-projection"]


def test_fused_projections_without_a_mapping(tmp_path, catalog, engines):
    ck = cm.load_checkpoint(qwen3_next_checkpoint(tmp_path / "split"))
    fs = fused(ck, sglang(catalog, "0.5.17"), catalog, engines)
    assert sorted(f.message for f in fs) == [
        "sglang would quantize 3 fused in_proj_ba layers whose shards are bf16",
        "sglang would quantize 3 fused in_proj_qkvz layers whose shards are bf16"]
    f = fs[0]
    assert f.severity == "error" and f.counts == {"layers": 3}
    assert any("qwen3_next.py:1000" in x and "config.json's is overwritten" in x
               for x in f.facts)
    assert "list the fused layers in `ignore`" in f.hint
    # 0.5.16 ignores them too, but only because 'in_proj_qkv' is a substring of 'in_proj_qkvz'
    fs = fused(ck, sglang(catalog, "0.5.16"), catalog, engines)
    assert len(fs) == 2 and {f.severity for f in fs} == {"warning"}
    assert "substring" in fs[0].message
    # SGLang overwrites config.json's mapping with the model class's
    ck_map = cm.load_checkpoint(qwen3_next_checkpoint(tmp_path / "mapped", mapping=True))
    assert len(fused(ck_map, sglang(catalog, "0.5.17"), catalog, engines)) == 2
    # stored fused (in_proj_qkvz, in_proj_ba): the engine's names are the checkpoint's
    ck_fused = cm.load_checkpoint(qwen3_next_checkpoint(tmp_path / "fused", split=False))
    assert not fused(ck_fused, sglang(catalog, "0.5.17"), catalog, engines)
    # vLLM 0.33.0 maps in_proj_qkvz to itself: split shards are not found either
    fs = fused(ck, catalog.target("vllm-blackwell"), catalog, engines)
    assert {f.counts["layers"] for f in fs} == {3} and len(fs) == 2
    # the fix lists the fused names in `ignore`; they name no module of the checkpoint
    ana = cm.analyze(ck, target=sglang(catalog, "0.5.17"), catalog=catalog, engines=engines,
                     ct_formats=ct_now())
    r = cm.fix(ck.config, ana.index, quantized=ck.quantized, add_ignore=ana.add_ignore)
    assert sorted(r.ignore_added) == sorted(f"model.layers.{i}.linear_attn.{p}" for i in range(3)
                                            for p in ("in_proj_qkvz", "in_proj_ba"))
    assert r.proof.equal and not r.packed_added
    fixed = replace(ck, config=r.config)
    for t in (sglang(catalog, "0.5.17"), sglang(catalog, "0.5.16"),
              catalog.target("vllm-blackwell")):
        assert not fused(fixed, t, catalog, engines), t.engine_version


def test_fused_projections_where_the_engine_reads_config_json(tmp_path, catalog):
    """An engine that takes packed_modules_mapping from config.json (engines.yaml value
    `config`): the mapping is the way out, and --fix writes it."""
    images = tmp_path / "images"
    (images / "checks").mkdir(parents=True)
    text = (ROOT / "images/checks/engines.yaml").read_text()
    (images / "checks/engines.yaml").write_text(text.replace(
        'packed_modules_mapping:\n      - versions: ">=0.5.1"\n        value: model',
        'packed_modules_mapping:\n      - versions: ">=0.5.1"\n        value: config', 1))
    table = load_engines(images)
    t = sglang(catalog, "0.5.17")
    assert cm.target_behaviour(t, table).value("packed_modules_mapping") == "config"
    ck = cm.load_checkpoint(qwen3_next_checkpoint(tmp_path / "split"))
    fs = fused(ck, t, catalog, table)
    assert len(fs) == 2 and all("add packed_modules_mapping" in f.hint for f in fs)
    assert any("reads it from there only" in x for x in fs[0].facts)
    ck_map = cm.load_checkpoint(qwen3_next_checkpoint(tmp_path / "mapped", mapping=True))
    assert not fused(ck_map, t, catalog, table)
    ana = cm.analyze(ck, target=t, catalog=catalog, engines=table, ct_formats=ct_now())
    r = cm.fix(ck.config, ana.index, quantized=ck.quantized, packed=ana.packed)
    assert r.packed_added == {"in_proj_qkvz": ("in_proj_qkv", "in_proj_z"),
                              "in_proj_ba": ("in_proj_b", "in_proj_a")}
    assert not fused(replace(ck, config=r.config), t, catalog, table)


def test_regex_targets_on_a_model_class_without_mapping(checkpoints, catalog, engines):
    """The mixed smoke checkpoint targets q/k/v/o_proj and gate/up/down_proj by regex; SGLang's
    Qwen3ForCausalLM fuses qkv_proj and gate_up_proj and declares no packed_modules_mapping, so
    neither fused name matches a target."""
    mixed = cm.load_checkpoint(checkpoints["mixed"])
    fs = fused(mixed, catalog.target("sglang-blackwell"), catalog, engines)
    assert sorted((f.counts["layers"], f.examples[0]) for f in fs) == [
        (2, "model.layers.0.mlp.gate_up_proj"), (2, "model.layers.0.self_attn.qkv_proj")]
    assert all("Unable to find matching target" in f.facts[-1] for f in fs)
    nvfp4 = cm.load_checkpoint(checkpoints["nvfp4"])  # `Linear` matches any linear class
    assert not fused(nvfp4, catalog.target("sglang-blackwell"), catalog, engines)
    assert not fused(mixed, catalog.target("tiny-cpu"), catalog, engines)  # no fusing


# --- W4A4 on archs without FP4 ---------------------------------------------------------------

def test_w4a4_on_an_sm90_only_target(checkpoints, catalog, engines):
    nvfp4 = cm.load_checkpoint(checkpoints["nvfp4"])

    def w4(target, ck=nvfp4):
        return [f for f in cm.check(ck, target=target, catalog=catalog, engines=engines,
                                    ct_formats=ct_now()) if f.kind == "w4a4-arch"]

    hopper = catalog.target("sglang-hopper")
    assert hopper.archs == ("sm90",)
    fs = w4(replace(hopper, engine_version="0.5.16"))
    assert len(fs) == 1 and fs[0].severity == "error" and fs[0].counts == {"modules": 14}
    assert "Current platform does not support w4a4 nvfp4 quantization." in fs[0].facts[-1]
    fs = w4(hopper)  # 0.5.23 serves dense W4A4 weight-only on sm90
    assert len(fs) == 1 and fs[0].severity == "warning" and "falls back" in fs[0].message
    assert not w4(catalog.target("sglang-blackwell"))
    assert not w4(catalog.target("tiny-cpu"))
    mixed = w4(replace(hopper, engine_version="0.5.16"), cm.load_checkpoint(checkpoints["mixed"]))
    assert mixed[0].counts == {"modules": 6}
    both = replace(hopper, engine_version="0.5.16", archs=("sm90", "sm100"))
    assert [f.severity for f in w4(both)] == ["warning"]  # fails on the sm90 GPUs only


# --- the report ------------------------------------------------------------------------------

def test_report_renders_and_serializes(parent_ckpt, catalog, tmp_path):
    from rich.console import Console

    from builder.cli.console import Output
    from builder.cli.views import checks as views

    rep = cm.check_model(WS, str(parent_ckpt), "sglang-blackwell", ct_formats=ct_now())
    assert rep.behaviour.version == "0.5.23" and rep.compressed_tensors == "0.18.0"
    console = Console(record=True, width=200)
    views.check_model(Output(False, console, Console(stderr=True)), rep)
    text = console.export_text()
    assert "ignore matcher" in text and "suffix" in text
    d = json.loads(json.dumps(rep.to_dict()))
    assert d["ignore"]["offending_entries"] == 0 and d["quantized_modules"] == 14
    assert d["exit_code"] == rep.exit_code
    patched = replace(catalog.target("sglang-blackwell"), engine_version="0.5.16")
    ck = cm.load_checkpoint(parent_ckpt)
    rep = cm.Report(str(parent_ckpt), "t", cm.target_behaviour(patched, ENGINES), ck,
                    tuple(cm.check(ck, target=patched, catalog=catalog, engines=ENGINES,
                                   ct_formats=ct_now())))
    console = Console(record=True, width=200)
    views.check_model(Output(False, console, Console(stderr=True)), rep)
    text = console.export_text()
    assert "error: 2 ignore entries silently de-quantize 7 quantized modules" in text
    assert "  help: `--fix OUT`" in text and rep.exit_code == 1
