"""imgbuild/payload/engine_schemes.py: the in-image probe that asks the image's own engine which
quantization scheme each checkpoint module gets per arch.

Most of it runs without an image: reading a checkpoint's modules from safetensors headers or an
index, what each module declares, the expected-scheme table, the mismatch records and the
report, and the whole run against a stand-in engine. The slow test builds (or reuses) the
patched SGLang 0.5.16 image and runs the probe in it, patched and with the patch layer undone
(the image's patched files, `patch -R` with images/patches/*.diff, mounted over them).
"""

from __future__ import annotations

import ast
import contextlib
import json
import shutil
import struct
import subprocess
import sys
from pathlib import Path

import pytest

from imgbuild.payload import engine_schemes as es

from .conftest import ROOT, run_imgbuild

NVFP4 = {"num_bits": 4, "type": "float", "strategy": "tensor_group", "group_size": 16,
         "symmetric": True, "dynamic": False}
FP8_W = {"num_bits": 8, "type": "float", "strategy": "channel", "symmetric": True,
         "dynamic": False}
FP8_A = {"num_bits": 8, "type": "float", "strategy": "token", "symmetric": True, "dynamic": True}


def write_safetensors(path: Path, tensors: dict[str, tuple[str, list[int]]]) -> None:
    """A real safetensors file (header and zero bytes)."""
    sizes = {"U8": 1, "F8_E4M3": 1, "BF16": 2, "F32": 4}
    header, off = {}, 0
    for name, (dtype, shape) in tensors.items():
        n = sizes[dtype]
        for s in shape:
            n *= s
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [off, off + n]}
        off += n
    raw = json.dumps(header).encode()
    raw += b" " * (-len(raw) % 8)
    path.write_bytes(struct.pack("<Q", len(raw)) + raw + bytes(off))


def nvfp4_linear(name: str, out: int, inp: int) -> dict[str, tuple[str, list[int]]]:
    return {f"{name}.weight_packed": ("U8", [out, inp // 2]),
            f"{name}.weight_scale": ("F8_E4M3", [out, inp // 16]),
            f"{name}.weight_global_scale": ("F32", [1]),
            f"{name}.input_global_scale": ("F32", [1])}


def fp8_linear(name: str, out: int, inp: int) -> dict[str, tuple[str, list[int]]]:
    return {f"{name}.weight": ("F8_E4M3", [out, inp]),
            f"{name}.weight_scale": ("BF16", [out, 1])}


def mixed_config(ignore=("lm_head",)) -> dict:
    return {"quant_method": "compressed-tensors", "format": "mixed-precision",
            "ignore": list(ignore),
            "config_groups": {
                "group_0": {"format": "float-quantized", "weights": FP8_W,
                            "input_activations": FP8_A,
                            "targets": [r"re:.*self_attn\.(q|k|v|o)_proj$"]},
                "group_1": {"format": "nvfp4-pack-quantized", "weights": NVFP4,
                            "input_activations": dict(NVFP4, dynamic="local"),
                            "targets": [r"re:.*mlp\.(gate|up|down)_proj$"]}}}


@pytest.fixture()
def mixed_ckpt(tmp_path) -> Path:
    """Qwen3-shaped, two layers: FP8 attention, NVFP4 MLP, bf16 lm_head (ignored)."""
    t = {"model.embed_tokens.weight": ("BF16", [512, 256]),
         "lm_head.weight": ("BF16", [512, 256]), "model.norm.weight": ("BF16", [256])}
    for i in range(2):
        p = f"model.layers.{i}"
        t[f"{p}.input_layernorm.weight"] = ("BF16", [256])
        t[f"{p}.self_attn.q_norm.weight"] = ("BF16", [64])
        for proj, (o, n) in {"q_proj": (256, 256), "k_proj": (128, 256),
                             "v_proj": (128, 256), "o_proj": (256, 256)}.items():
            t.update(fp8_linear(f"{p}.self_attn.{proj}", o, n))
        for proj, (o, n) in {"gate_proj": (512, 256), "up_proj": (512, 256),
                             "down_proj": (256, 512)}.items():
            t.update(nvfp4_linear(f"{p}.mlp.{proj}", o, n))
    write_safetensors(tmp_path / "model.safetensors", t)
    (tmp_path / "config.json").write_text(json.dumps(
        {"architectures": ["Qwen3ForCausalLM"], "quantization_config": mixed_config()}))
    return tmp_path


# --- the checkpoint ----------------------------------------------------------------------------

def test_modules_from_safetensors_headers(mixed_ckpt):
    tensors, src = es.checkpoint_tensors(mixed_ckpt)
    assert src == "safetensors headers"
    mods = {m.name: m for m in es.linear_modules(tensors)}
    # Linear-like: 2-D `.weight` or `.weight_packed`; not norms (1-D) nor the embedding.
    assert set(mods) == {"lm_head"} | {
        f"model.layers.{i}.{p}" for i in range(2) for p in (
            "self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj",
            "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj")}
    assert not mods["lm_head"].quantized
    assert mods["model.layers.0.self_attn.k_proj"].quantized  # FP8: `.weight` + `.weight_scale`
    # in/out from `.weight` [out, in], or `.weight_packed` [out, in/2] for NVFP4
    k, down = mods["model.layers.0.self_attn.k_proj"], mods["model.layers.0.mlp.down_proj"]
    assert (k.in_features, k.out_features) == (256, 128)
    assert (down.in_features, down.out_features) == (512, 256)


def test_modules_from_the_index_with_and_without_the_shards(tmp_path):
    write_safetensors(tmp_path / "s1.safetensors", nvfp4_linear("a.b", 32, 64))
    (tmp_path / "model.safetensors.index.json").write_text(json.dumps({"weight_map": {
        "a.b.weight_packed": "s1.safetensors", "a.b.weight_scale": "s1.safetensors",
        "a.b.weight_global_scale": "s1.safetensors", "a.b.input_global_scale": "s1.safetensors",
        "a.c.weight": "s2.safetensors", "a.norm.weight": "s2.safetensors"}}))
    tensors, src = es.checkpoint_tensors(tmp_path)
    assert src == "model.safetensors.index.json"
    assert tensors["a.b.weight_packed"] == [32, 32] and tensors["a.c.weight"] is None
    mods = {m.name: m for m in es.linear_modules(tensors)}
    # s2 is absent: a.c counts (unknown shape), a norm does not
    assert set(mods) == {"a.b", "a.c"} and mods["a.b"].quantized and not mods["a.c"].quantized
    assert (mods["a.b"].in_features, mods["a.b"].out_features) == (64, 32)


def test_unreadable_checkpoints_are_input_errors(tmp_path):
    with pytest.raises(es.ProbeInputError, match="no \\*.safetensors"):
        es.checkpoint_tensors(tmp_path)
    (tmp_path / "x.safetensors").write_bytes(b"\x01")
    with pytest.raises(es.ProbeInputError, match="shorter than its header"):
        es.checkpoint_tensors(tmp_path)
    (tmp_path / "x.safetensors").write_bytes(struct.pack("<Q", 4) + b"nope")
    with pytest.raises(es.ProbeInputError, match="unreadable safetensors header"):
        es.checkpoint_tensors(tmp_path)


# --- what the checkpoint declares -------------------------------------------------------------

def test_classify_group_covers_the_table():
    g = lambda w, a=None: es.classify_group({"weights": w, "input_activations": a})  # noqa: E731
    assert g(NVFP4, NVFP4) == "W4A4_NVFP4"
    assert g(NVFP4) == "W4A16_NVFP4"
    assert g(FP8_W, FP8_A) == "W8A8_FP8"
    assert g(FP8_W) == "W8A16_FP8"
    int8 = {"num_bits": 8, "type": "int", "strategy": "channel"}
    assert g(int8, {"num_bits": 8, "type": "int", "strategy": "token"}) == "W8A8_INT8"
    assert g({"num_bits": 4, "type": "int", "strategy": "group", "group_size": 128}) == "WNA16_INT"
    assert g({"num_bits": 4, "type": "float", "strategy": "group", "group_size": 32}).startswith(
        "OTHER(")
    # every declared scheme the classifier names has a row for each engine's Linear path,
    # and the NVFP4/FP8 ones for the MoE path too
    for engine, paths in es.EXPECTED.items():
        assert set(paths) == {"linear", "moe"}
        for label in ("W4A4_NVFP4", "W4A16_NVFP4", "W8A8_FP8"):
            assert paths["linear"][label] and paths["moe"][label], (engine, label)
        assert paths["linear"]["W4A4_NVFP4"] == ("CompressedTensorsW4A4Fp4",)
        assert paths["linear"]["W8A8_FP8"] == ("CompressedTensorsW8A8Fp8",)
        assert paths["linear"]["W4A16_NVFP4"] == ("CompressedTensorsW4A16Fp4",)


def test_group_matching_is_compressed_tensors_name_matching():
    groups = {"g_cls": {"targets": ["Linear"]},
              "g_re": {"targets": [r"re:.*mlp\.down_proj$"]},
              "g_exact": {"targets": ["model.layers.0.self_attn.o_proj"]}}
    assert es.match_group("model.layers.3.mlp.down_proj", groups) == "g_re"  # name before class
    assert es.match_group("model.layers.0.self_attn.o_proj", groups) == "g_exact"
    assert es.match_group("model.layers.1.self_attn.o_proj", groups) == "g_cls"
    # no substring matching: a target that is a prefix of the name does not match
    assert es.match_group("model.layers.0.self_attn.o_proj_x", {"g": {"targets": [
        "model.layers.0.self_attn.o_proj"]}}) is None


def test_declared_scheme_follows_the_tensors_not_the_ignore_list(mixed_ckpt):
    cfg = mixed_config(ignore=["lm_head", "model.layers.0.mlp"])  # a parent module
    mods = {m.name: m for m in es.linear_modules(es.checkpoint_tensors(mixed_ckpt)[0])}
    assert es.declared_scheme(mods["lm_head"], cfg) is None
    assert es.declared_scheme(mods["model.layers.0.mlp.up_proj"], cfg) == "W4A4_NVFP4"
    assert es.declared_scheme(mods["model.layers.0.self_attn.q_proj"], cfg) == "W8A8_FP8"
    orphan = es.Module("model.layers.0.other", True, 16, 16)
    assert es.declared_scheme(orphan, cfg) == "NO_GROUP"


def test_experts_are_one_moe_check_per_block():
    mods = [es.Module(f"model.layers.0.mlp.experts.{e}.{p}", True, 16, 16)
            for e in range(3) for p in ("gate_proj", "up_proj", "down_proj")]
    mods += [es.Module("model.layers.0.mlp.gate", False, 16, 4),
             es.Module("model.layers.0.mlp.shared_experts.up_proj", True, 16, 16)]
    cfg = {"config_groups": {"g": {"targets": ["Linear"], "weights": NVFP4,
                                   "input_activations": NVFP4}}}
    checks = es.plan_checks(mods, cfg)
    moe = [c for c in checks if c.path == "moe"]
    assert [(c.name, c.declared, c.covers) for c in moe] == [
        ("model.layers.0.mlp.experts", "W4A4_NVFP4", 9)]
    assert {c.name for c in checks if c.path == "linear"} == {
        "model.layers.0.mlp.gate", "model.layers.0.mlp.shared_experts.up_proj"}
    # experts that disagree are reported as such
    mods[0] = es.Module(mods[0].name, False, 16, 16)
    (moe,) = [c for c in es.plan_checks(mods, cfg) if c.path == "moe"]
    assert moe.declared == "NOT_UNIFORM:None,W4A4_NVFP4"
    assert es.expected_classes("sglang", "moe", moe.declared) is None


# --- judging and the report -------------------------------------------------------------------

def test_judge():
    chk = es.Check("linear", "m", "W4A4_NVFP4")
    ok = es.judge("sglang", chk, "sm100", "CompressedTensorsW4A4Fp4",
                  ("CompressedTensorsW4A4Fp4", "CompressedTensorsLinearScheme"), None)
    assert ok is None
    # a subclass of the expected class is fine (the match is on the MRO)
    sub = ("Sub", "CompressedTensorsW4A4Fp4")
    assert es.judge("sglang", chk, "sm100", "Sub", sub, None) is None
    err = "NotImplementedError: No compressed-tensors compatible scheme was found."
    assert es.judge("sglang", chk, "sm120", None, (), err) == {
        "module": "m", "path": "linear", "arch": "sm120", "declared": "W4A4_NVFP4",
        "expected": ["CompressedTensorsW4A4Fp4"], "got": None, "error": err}
    # silently unquantized
    assert es.judge("sglang", chk, "sm100", None, (), None)["got"] is None
    # an unquantized module must get no scheme
    plain = es.Check("linear", "lm_head", None)
    assert es.judge("sglang", plain, "sm100", None, (), None) is None
    bad = es.judge("sglang", plain, "sm100", "CompressedTensorsW8A8Fp8",
                   ("CompressedTensorsW8A8Fp8",), None)
    assert bad["expected"] is None and bad["got"] == "CompressedTensorsW8A8Fp8"
    # no row in the table: not judged (the caller lists it as unchecked)
    assert es.judge("sglang", es.Check("linear", "m", "OTHER(x)"), "sm100", None, (), None) is None


def test_error_text_joins_tuple_args():
    # SGLang raises RuntimeError("Quantization scheme is not supported for ", "the current GPU...")
    e = RuntimeError("not supported for ", "the current GPU. Min capability: 100. ")
    assert es._error_text(e) == \
        "RuntimeError: not supported for the current GPU. Min capability: 100. "


class _Scheme:
    def __init__(self, name):
        self.__class__ = type(name, (_Scheme,), {})


class FakeEngine(es.Engine):
    """Stands in for SGLang 0.5.16 unpatched: substring `ignore` matching; no W4A4 below sm100."""
    name = "sglang"
    imports = 0

    def __init__(self):
        FakeEngine.imports += 1
        self.version = "0.0-fake"
        self.cap = None

    def parse(self, qcfg):
        return json.loads(json.dumps(qcfg))

    @contextlib.contextmanager
    def device(self, capability):
        self.cap = capability
        yield
        self.cap = None

    def linear(self, cfg, check):
        if any(t in check.name for t in cfg["ignore"]):
            return None
        g = es.match_group(check.name, cfg["config_groups"])
        kind = es.classify_group(cfg["config_groups"][g])
        if kind == "W4A4_NVFP4" and self.cap < (10, 0):
            raise NotImplementedError("Current platform does not support w4a4 nvfp4 quantization.")
        return _Scheme({"W4A4_NVFP4": "CompressedTensorsW4A4Fp4",
                        "W8A8_FP8": "CompressedTensorsW8A8Fp8"}[kind])


def test_run_and_report_against_a_stand_in_engine(mixed_ckpt, monkeypatch, capsys):
    monkeypatch.setitem(es.ENGINES, "sglang", FakeEngine)
    assert es.main(["--model", str(mixed_ckpt), "--engine", "sglang", "--arch", "sm100",
                    "--arch", "sm120", "--json"]) == 0
    rep = json.loads(capsys.readouterr().out)
    assert set(rep) >= {"engine", "version", "archs", "modules_checked", "mismatches", "seconds"}
    assert rep["engine"] == "sglang" and rep["version"] == "0.0-fake"
    assert rep["archs"] == ["sm100", "sm120"] and rep["modules_checked"] == 15
    assert rep["mismatches"] == [] and rep["ok"] is True and rep["error"] is None
    assert set(rep["seconds"]) == {"import", "check"}
    assert rep["declared"] == {"None": 1, "W4A4_NVFP4": 6, "W8A8_FP8": 8}
    assert rep["chosen"]["sm120"] == {"CompressedTensorsW4A4Fp4": 6,
                                      "CompressedTensorsW8A8Fp8": 8, "none": 1}

    # a parent module in `ignore` + substring matching: the children come back unquantized
    cfg = json.loads((mixed_ckpt / "config.json").read_text())
    cfg["quantization_config"]["ignore"].append("model.layers.0.mlp")
    (mixed_ckpt / "config.json").write_text(json.dumps(cfg))
    assert es.main(["--model", str(mixed_ckpt), "--engine", "sglang", "--arch", "sm100"]) == 1
    out = capsys.readouterr().out
    assert "FAIL  [sm100] model.layers.0.mlp.up_proj (linear, declared W4A4_NVFP4): expected " \
           "CompressedTensorsW4A4Fp4, got no scheme" in out
    assert "FAILED: 3 mismatches" in out

    # Hopper: the engine's own exception text is reported
    rep = es.run(mixed_ckpt, "sglang", ["sm90"])
    assert {m["error"] for m in rep["mismatches"] if m["module"].startswith("model.layers.1")} \
        == {"NotImplementedError: Current platform does not support w4a4 nvfp4 quantization."}


def test_engine_failing_to_import_is_a_failure_not_a_crash(mixed_ckpt, monkeypatch, capsys):
    class Broken(es.Engine):
        name = "sglang"

        def __init__(self):
            raise ImportError("No module named 'sglang'")

    monkeypatch.setitem(es.ENGINES, "sglang", Broken)
    assert es.main(["--model", str(mixed_ckpt), "--engine", "sglang", "--arch", "sm100",
                    "--json"]) == 1
    rep = json.loads(capsys.readouterr().out)
    assert rep["error"] == "engine import/parse: ImportError: No module named 'sglang'"
    assert rep["ok"] is False


def test_an_arch_the_engine_cannot_be_told_about_is_a_failure(mixed_ckpt, monkeypatch):
    class NoDevice(FakeEngine):
        @contextlib.contextmanager
        def device(self, capability):
            raise ImportError("cannot import name 'DeviceCapability'")
            yield

    monkeypatch.setitem(es.ENGINES, "sglang", NoDevice)
    rep = es.run(mixed_ckpt, "sglang", ["sm100"])
    assert rep["ok"] is False and rep["error"].startswith(
        "sm100: could not answer the engine's GPU queries: ImportError")


def test_bad_input_exits_2(tmp_path, capsys):
    assert es.main(["--model", str(tmp_path), "--engine", "sglang", "--arch", "sm100"]) == 2
    (tmp_path / "config.json").write_text(json.dumps({"architectures": ["X"]}))
    assert es.main(["--model", str(tmp_path), "--engine", "vllm", "--arch", "sm100"]) == 2
    assert "no quantization_config" in capsys.readouterr().err
    with pytest.raises(SystemExit) as e:
        es.main(["--model", str(tmp_path), "--engine", "sglang", "--arch", "sm75"])
    assert e.value.code == 2


def test_module_level_imports_are_standard_library_only():
    tree = ast.parse(Path(es.__file__).read_text())
    top = set()
    for node in tree.body:
        if isinstance(node, ast.Import):
            top |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module:
            top.add(node.module.split(".")[0])
    assert top - {"__future__"} <= set(sys.stdlib_module_names), top


# --- in the image -------------------------------------------------------------------------------

TARGET = "sglang-0516-blackwell"
CT = "sglang/srt/layers/quantization/compressed_tensors"
SITE = "/opt/venv/lib/python3.11/site-packages"


def _docker(*args, timeout=600) -> subprocess.CompletedProcess:
    return subprocess.run(["docker", *args], capture_output=True, text=True, timeout=timeout)


@pytest.fixture(scope="module")
def sglang_0516_image() -> str:
    """The patched SGLang 0.5.16 image: reused by its content tag when present, else built."""
    if shutil.which("docker") is None or _docker("info").returncode != 0:
        pytest.skip("skipped: no Docker daemon")
    r = run_imgbuild("plan", TARGET, "--json", timeout=600)
    assert r.returncode == 0, r.stderr[-2000:]
    image = f"imgbuild:{json.loads(r.stdout)['content_tag']}"
    if _docker("image", "inspect", image).returncode != 0:
        r = run_imgbuild("build", TARGET, "--no-smoke", timeout=3600)
        assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    return image


@pytest.fixture(scope="module")
def unpatched_files(sglang_0516_image, tmp_path_factory) -> dict[str, Path]:
    """The files the patch layer rewrote, taken out of the image and reverted with `patch -R`
    and the set's own diffs: mounted over the image's, they are SGLang 0.5.16 as released."""
    if shutil.which("patch") is None:
        pytest.skip("skipped: GNU patch is not installed")
    d = tmp_path_factory.mktemp("unpatched")
    for name in ("utils.py", "compressed_tensors.py"):
        r = _docker("run", "--rm", "--network", "none", "-e", "IMGBUILD_PREFLIGHT=0",
                    sglang_0516_image, "cat", f"{SITE}/{CT}/{name}")
        assert r.returncode == 0, r.stderr
        (d / CT).mkdir(parents=True, exist_ok=True)
        (d / CT / name).write_text(r.stdout)
    patches = ROOT / "images" / "patches"
    for diff in (patches / "sglang-ct-ignore-exact-match.diff",
                 patches / "sglang-ct-mixed-precision-format" / "0.5.16.diff"):
        r = subprocess.run(["patch", "-R", "-p1", "-d", str(d), "-i", str(diff)],
                           capture_output=True, text=True)
        assert r.returncode == 0, r.stdout + r.stderr
    return {name: d / CT / name for name in ("utils.py", "compressed_tensors.py")}


@pytest.fixture(scope="module")
def smoke_checkpoints(tmp_path_factory) -> dict[str, Path]:
    from imgbuild import smokemodel

    cache = tmp_path_factory.mktemp("engine-schemes-cache")
    out = {key: smokemodel.ensure(smokemodel.SmokeModelSpec(name=f"es-{key}", scheme=scheme),
                                  cache_dir=cache)
           for key, scheme in (("nvfp4", "NVFP4"), ("mixed", "FP8-ATTN+NVFP4-MLP"))}
    parent = tmp_path_factory.mktemp("ignore-parent")
    for f in ("config.json", "model.safetensors"):
        shutil.copy2(out["nvfp4"] / f, parent / f)
    cfg = json.loads((parent / "config.json").read_text())
    cfg["quantization_config"]["ignore"].append("model.layers.0.mlp")
    (parent / "config.json").write_text(json.dumps(cfg, indent=2))
    out["ignore-parent"] = parent
    return out


def probe(image: str, model: Path, mounts: dict[str, Path] | None = None) -> tuple[int, dict]:
    # the image's own copy (it carries engine_schemes.py beside smoke.py, which it reads with)
    args = ["run", "--rm", "--network", "none", "-e", "IMGBUILD_PREFLIGHT=0",
            "-v", f"{model}:/m:ro"]
    for name, path in (mounts or {}).items():
        args += ["-v", f"{path}:{SITE}/{CT}/{name}:ro"]
    r = _docker(*args, image, "/opt/venv/bin/python", "/opt/imgbuild/engine_schemes.py",
                "--model", "/m",
                "--engine", "sglang", "--arch", "sm100", "--arch", "sm120", "--json")
    assert r.returncode in (0, 1), r.stdout[-2000:] + r.stderr[-3000:]
    return r.returncode, json.loads(r.stdout)


@pytest.mark.slow
@pytest.mark.docker
def test_probe_in_the_image_patched_vs_unpatched(sglang_0516_image, unpatched_files,
                                                 smoke_checkpoints):
    img, ck = sglang_0516_image, smoke_checkpoints
    for key in ("nvfp4", "mixed", "ignore-parent"):
        rc, rep = probe(img, ck[key])
        assert rc == 0 and rep["ok"] and rep["mismatches"] == [], (key, rep)
        assert rep["version"] == "0.5.16" and rep["modules_checked"] == 15
    rc, rep = probe(img, ck["mixed"])
    assert rep["chosen"]["sm100"] == {"CompressedTensorsW4A4Fp4": 6,
                                      "CompressedTensorsW8A8Fp8": 8, "none": 1}

    # the same image with the patch layer undone: SGLang 0.5.16 as released
    rc, rep = probe(img, ck["nvfp4"], unpatched_files)
    assert rc == 0, rep
    rc, rep = probe(img, ck["mixed"], unpatched_files)
    assert rc == 1
    mlp = [m for m in rep["mismatches"] if ".mlp." in m["module"]]
    assert len(mlp) == 12 and {m["error"] for m in mlp} == {
        "NotImplementedError: No compressed-tensors compatible scheme was found."}
    rc, rep = probe(img, ck["ignore-parent"], unpatched_files)
    assert rc == 1
    assert sorted((m["arch"], m["module"], m["got"], m["error"]) for m in rep["mismatches"]) == \
        sorted((a, f"model.layers.0.mlp.{p}", None, None)
               for a in ("sm100", "sm120") for p in ("gate_proj", "up_proj", "down_proj"))


# --- the smoke stage "engine-schemes" (imgbuild/payload/smoke.py) ------------------------------

class ExactEngine(FakeEngine):
    """The stand-in with SGLang 0.5.17's exact `ignore` matching."""

    def linear(self, cfg, check):
        if check.name in cfg["ignore"]:
            return None
        return super().linear(dict(cfg, ignore=[]), check)

    def moe(self, cfg, check):
        g = es.match_group(check.name + ".0.down_proj", cfg["config_groups"])
        assert es.classify_group(cfg["config_groups"][g]) == "W4A4_NVFP4"
        return _Scheme("CompressedTensorsW4A4Nvfp4MoE")


def stage(model, facts, monkeypatch, engine):
    from imgbuild.payload import smoke

    monkeypatch.setitem(sys.modules, "engine_schemes", es)  # what smoke.py imports, in-image
    monkeypatch.setitem(es.ENGINES, "sglang", engine)
    return smoke.check_engine_schemes(model, facts, Path(smoke.__file__).parent)


def test_the_smoke_stage_asks_about_the_smoke_model_and_every_probe(mixed_ckpt, monkeypatch):
    facts = {"engine": "sglang", "archs": ["sm100", "sm120"]}
    status, reason, details = stage(mixed_ckpt, facts, monkeypatch, ExactEngine)
    assert status == "pass", reason
    assert reason == ("sglang 0.0-fake gave each of 58 layers in 4 checkpoints (smoke-model, "
                      "ignore-parent, mixed-precision, moe) its declared scheme on sm100, sm120")
    cks = details["checkpoints"]
    assert cks["moe"]["chosen"]["sm100"]["none"] == 3  # two routers and lm_head: unquantized
    assert details["archs"] == ["sm100", "sm120"]
    # Substring matching (SGLang 0.5.7-0.5.16 unpatched): the parent entry's children are lost.
    class Substring(ExactEngine):
        linear = FakeEngine.linear

    status, reason, details = stage(mixed_ckpt, facts, monkeypatch, Substring)
    assert status == "fail"
    assert reason == ("sglang 0.0-fake did not give every layer its declared scheme: "
                      "ignore-parent: 6 mismatches, first model.layers.0.mlp.down_proj on sm100: "
                      "declared W4A4_NVFP4, got no scheme")
    assert len(details["checkpoints"]["ignore-parent"]["mismatches"]) == 6


def test_the_smoke_stage_is_skipped_without_an_engine_or_a_gpu_arch(mixed_ckpt, monkeypatch):
    assert stage(mixed_ckpt, {"engine": "transformers", "archs": ["cpu"]}, monkeypatch,
                 ExactEngine)[:2] == ("skipped", "skipped: no serving engine in this image "
                                                 "(transformers)")
    assert stage(mixed_ckpt, {"engine": "sglang", "archs": ["cpu"]}, monkeypatch,
                 ExactEngine)[:2] == ("skipped", "skipped: none of the image's archs is a GPU "
                                                 "arch the probe knows")


def test_the_scheme_probes_are_what_their_notes_say():
    doc = json.loads((Path(es.__file__).parent / "scheme-probes.json").read_text())
    probes = doc["probes"]
    mixed = probes["mixed-precision"]["quantization_config"]
    assert mixed["format"] == "mixed-precision" and len(mixed["config_groups"]) == 2
    assert "model.layers.0.mlp" in probes["ignore-parent"]["quantization_config"]["ignore"]
    assert "model.layers.0.mlp.down_proj.weight_packed" in probes["ignore-parent"]["tensors"]
    moe = probes["moe"]["tensors"]
    assert "model.layers.1.mlp.experts.3.down_proj.weight_packed" in moe
    assert "model.layers.0.mlp.gate.weight" in moe  # the router, unquantized


@pytest.mark.slow
@pytest.mark.docker
def test_the_unpatched_image_fails_the_stage_with_sglangs_own_error(sglang_0516_image,
                                                                      images_copy):
    """SGLang 0.5.16 built without its patches (a copy of images/ without `patches:`): the
    smoke stage asks SGLang itself, which finds no scheme for the mixed-precision probe and
    builds the ignore-parent probe's children unquantized; the patched image passes."""
    spec = images_copy / f"{TARGET}.yaml"
    spec.write_text(spec.read_text().replace(
        "patches:\n  - sglang-ct-mixed-precision-format\n  - sglang-ct-ignore-exact-match\n", ""))
    env = {"IMGBUILD_IMAGES": str(images_copy)}
    r = run_imgbuild("build", TARGET, "--no-smoke", "--json", env=env, timeout=3600)
    assert r.returncode == 0, r.stderr[-3000:]
    unpatched = json.loads(r.stdout)["content_tag"]
    assert unpatched != sglang_0516_image
    for image, ok in ((unpatched, False), (sglang_0516_image, True)):
        r = run_imgbuild("smoke", image, "--json", timeout=900)
        stages = {s["name"]: s for s in json.loads(r.stdout)["stages"]}
        s = stages["engine-schemes"]
        assert (s["status"] == "pass") is ok, s["reason"]
        cks = s["details"]["checkpoints"]
        if ok:
            assert all(c["mismatches"] == [] for c in cks.values())
            continue
        assert {m["error"] for m in cks["mixed-precision"]["mismatches"]
                if ".mlp." in m["module"]} == {
            "NotImplementedError: No compressed-tensors compatible scheme was found."}
        assert sorted({m["module"] for m in cks["ignore-parent"]["mismatches"]}) == [
            f"model.layers.0.mlp.{p}" for p in ("down_proj", "gate_proj", "up_proj")]
        assert cks["smoke-model"]["mismatches"] == [] and cks["moe"]["mismatches"] == []


# --- check-model --image -------------------------------------------------------------------

def test_check_model_says_where_the_wheels_and_the_engine_disagree(mixed_ckpt):
    from dataclasses import replace

    from imgbuild.checks.checkmodel import check_model
    from imgbuild.workspace import Workspace

    report = check_model(Workspace.open(ROOT / "images"), str(mixed_ckpt), "sglang-blackwell")
    assert report.disagreement is None and report.in_image is None
    ok = {"ok": True, "mismatches": [], "engine": "sglang"}
    bad = {"ok": False, "mismatches": [{"module": "m", "arch": "sm100"}], "engine": "sglang"}
    if report.errors:
        agree = replace(report, in_image=bad, image="x")
        assert agree.disagreement is None and agree.exit_code == 1
        differ = replace(report, in_image=ok, image="x")
        kinds = ", ".join(sorted({f.kind for f in report.errors}))
        assert differ.disagreement.startswith(f"check-model finds errors ({kinds}) that the "
                                              "image's engine does not show")
    else:
        assert replace(report, in_image=ok, image="x").disagreement is None
        differ = replace(report, in_image=bad, image="x")
        assert differ.disagreement.startswith("check-model's reading of the locked wheels finds "
                                              "no error, but the image's engine does not give")
        assert differ.exit_code == 1
    doc = replace(report, in_image=bad, image="img:1").to_dict()
    assert doc["in_image"]["image"] == "img:1" and doc["in_image"]["report"] == bad


@pytest.mark.slow
@pytest.mark.docker
def test_check_model_asks_the_images_own_engine(sglang_0516_image, smoke_checkpoints):
    mixed = smoke_checkpoints["mixed"]
    r = run_imgbuild("check-model", str(mixed), "--image", sglang_0516_image, "--json")
    doc = json.loads(r.stdout)
    assert doc["target"] == TARGET  # from the image's label
    rep = doc["in_image"]["report"]
    assert rep["ok"] is True and rep["version"] == "0.5.16" and rep["modules_checked"] == 15
    # The engine's answer is about schemes; check-model's fused-layer reading goes further.
    assert doc["in_image"]["disagreement"] is None or "fused-projection" in \
        doc["in_image"]["disagreement"]
    r = run_imgbuild("check-model", str(mixed), "--image", "imgbuild:no-such-image")
    assert r.returncode == 2 and "no local image imgbuild:no-such-image" in r.stderr


def _kernel_refusing(name: str) -> type:
    """A scheme class as vLLM writes them: it picks a kernel in its constructor, which fails
    where no GPU is."""
    def __init__(self):
        raise ValueError("Failed to find a kernel that can implement the NVFP4 linear layer.")
    return type(name, (), {"__init__": __init__, "__module__": "fake.compressed_tensors.schemes"})


class KernelEngine(ExactEngine):
    """Chooses like ExactEngine, then builds the scheme as vLLM does; its MoE needs a runtime."""

    def linear(self, cfg, check):
        got = super().linear(cfg, check)
        return None if got is None else _kernel_refusing(type(got).__name__)()

    def moe(self, cfg, check):
        raise es.NotAskable("the MoE method reads a config only the runtime builds")


def test_a_scheme_chosen_but_not_built_without_a_gpu_is_the_engines_choice(mixed_ckpt,
                                                                           monkeypatch):
    monkeypatch.setitem(es.ENGINES, "sglang", KernelEngine)
    rep = es.run(mixed_ckpt, "sglang", ["sm100"])
    assert rep["ok"] is True and rep["mismatches"] == []
    assert rep["chosen"]["sm100"] == {"CompressedTensorsW4A4Fp4": 6,
                                      "CompressedTensorsW8A8Fp8": 8, "none": 1}
    built = rep["kernel_not_built"]
    assert len(built) == 14 and {k["scheme"] for k in built} == {
        "CompressedTensorsW4A4Fp4", "CompressedTensorsW8A8Fp8"}
    assert built[0]["error"] == ("ValueError: Failed to find a kernel that can implement the "
                                 "NVFP4 linear layer.")
    # An error raised outside a scheme's constructor stays a mismatch.
    assert es._constructing(ValueError("x")) is None

    facts = {"engine": "sglang", "archs": ["sm100"]}
    status, reason, _ = stage(mixed_ckpt, facts, monkeypatch, KernelEngine)
    assert status == "pass"
    assert reason == (
        "sglang 0.0-fake gave each of 56 layers in 4 checkpoints (smoke-model, ignore-parent, "
        "mixed-precision, moe) its declared scheme on sm100; 2 not asked (e.g. "
        "model.layers.0.mlp.experts: not asked: the MoE method reads a config only the runtime "
        "builds); 14 chosen whose kernel is picked on a GPU")
