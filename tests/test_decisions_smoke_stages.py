"""The smoke payload's image stages word for word (imgbuild/payload/smoke.py): what the patches,
kernels and engine-schemes stages tell the user and keep in the report, how the patches stage
runs the image's patcher, which checkpoint the engine-schemes stage hands the engine, and that
one bad prompt fails the GPU stage whatever the prompts after it say. No Docker, no GPU: the
patcher is a script written here, the installed files are this interpreter's own, and the
in-image probe module is stood in for where the stage imports it."""

from __future__ import annotations

import hashlib
import json
import sys
import types
from pathlib import Path

import pytest

from imgbuild.payload import smoke

# --- patches --------------------------------------------------------------------------------


def test_an_image_without_patches_is_skipped_and_one_missing_its_layer_says_what_to_do(tmp_path):
    assert smoke.check_patches({}, tmp_path) == (
        smoke.SKIPPED, "skipped: the image carries no patches", {})
    assert smoke.check_patches({"patches": ["a", "b"]}, tmp_path) == (
        smoke.FAIL, "the installed versions need patches this image lacks: a, b (no patch layer; "
        "list them under the target's `patches:`)", {"expected": ["a", "b"]})


def test_the_patcher_is_run_with_its_patches_and_report_and_its_answer_judged(tmp_path):
    """The image's patcher.py, run as the stage runs it: this interpreter, --probe, the patch
    directory and the report beside it. The stand-in prints its arguments, then a report."""
    (tmp_path / "patches").mkdir()
    (tmp_path / "patches.json").write_text("{}")
    (tmp_path / "patcher.py").write_text(
        "import json, sys\n"
        "print('patcher: probing', sys.argv[1:])\n"
        "print(json.dumps({'ok': True, 'probes': [\n"
        "    {'id': 'a', 'status': 'applied', 'probe': 'pass', 'argv': sys.argv[1:]}]}))\n")
    status, reason, details = smoke.check_patches({"patches": ["a"]}, tmp_path)
    assert (status, reason) == (smoke.PASS, "1 patch probe(s) pass: a")
    assert details["expected"] == ["a"]
    assert details["probes"][0]["argv"] == [
        "--probe", "--patches", str(tmp_path / "patches"), "--report",
        str(tmp_path / "patches.json")]
    # Its report is read from what it printed, whatever it printed before it.
    (tmp_path / "patcher.py").write_text("import sys\nprint('no report'); "
                                         "print('ImportError: x', file=sys.stderr)\n")
    assert smoke.check_patches({"patches": ["a"]}, tmp_path) == (
        smoke.FAIL, "the patcher printed no probe report: ImportError: x", {})


def test_a_patch_verdict_keeps_what_was_expected_and_every_probe(tmp_path):
    probes = [{"id": "a", "status": "applied", "probe": "pass"},
              {"id": "z", "status": "applied", "probe": "fail", "detail": "boom"},
              {"id": "y", "status": "applied", "probe": "fail", "detail": "bang"}]
    out = "patcher: probing\n" + json.dumps({"ok": False, "probes": probes})
    assert smoke.judge_patch_probes(["a"], out, "") == (
        smoke.FAIL, "patch probes fail: z: boom; y: bang", {"expected": ["a"], "probes": probes})
    assert smoke.judge_patch_probes(["a", "q", "r"], out, "")[1] == (
        "the installed versions need patches that are not in effect: q, r")


# --- kernels ----------------------------------------------------------------------------------


def _installed(member: str) -> dict:
    """A kernel-file record for a file this interpreter has installed (so the stage finds it
    where it looks: the platlib, purelib and site directories)."""
    import pytest as mod
    path = Path(mod.__file__).parent.parent / member
    return {"package": "pytest", "member": member,
            "sha256": hashlib.sha256(path.read_bytes()).hexdigest()}


def test_installed_kernel_files_pass_with_their_count_in_words():
    one = [_installed("_pytest/__init__.py")]
    assert smoke.check_kernels({"kernel_files": one}) == (
        smoke.PASS, "1 kernel library is the files whose GPU code plan read",
        {"files": 1, "problems": []})
    two = one + [_installed("_pytest/main.py")]
    assert smoke.check_kernels({"kernel_files": two}) == (
        smoke.PASS, "2 kernel libraries are the files whose GPU code plan read",
        {"files": 2, "problems": []})


def test_kernel_problems_are_said_five_at_most_and_all_kept():
    files = [{"package": "p", "member": f"imgbuild-no-such/k{i}.so", "sha256": "0"}
             for i in range(7)]
    status, reason, details = smoke.check_kernels({"kernel_files": files})
    said = [f"p: imgbuild-no-such/k{i}.so is not installed" for i in range(7)]
    assert (status, reason) == (smoke.FAIL, "; ".join(said[:5]))
    assert details == {"files": 7, "problems": said}


# --- engine schemes ---------------------------------------------------------------------------


def _report(**kw) -> dict:
    return {"modules_checked": 3, "mismatches": [], "chosen": {"sm100": {"X": 3}},
            "unchecked": ["linear:Y"], "kernel_not_built": [], "error": None, "seconds": 0.1,
            "version": "", "extra": "not kept", **kw}


def test_a_scheme_verdict_names_the_engine_version_and_keeps_each_reports_fields():
    status, reason, details = smoke.judge_scheme_reports(
        "sglang", ["sm100", "sm120"], {"smoke-model": _report(), "nvfp4": _report(version="0.5.9")})
    assert (status, reason) == (smoke.PASS, "sglang 0.5.9 gave each of 6 layers in 2 checkpoints "
                                            "(smoke-model, nvfp4) its declared scheme on sm100, "
                                            "sm120")
    kept = {k: v for k, v in _report().items() if k != "extra"}
    assert details == {"archs": ["sm100", "sm120"],
                       "checkpoints": {"smoke-model": kept, "nvfp4": {**kept, "version": "0.5.9"}}}
    # No report says its version: the sentence goes on without one.
    assert smoke.judge_scheme_reports("vllm", ["sm90"], {"p": _report()})[1].startswith(
        "vllm  gave each of 3 layers")


def test_a_scheme_failure_says_each_checkpoints_first_mismatch_with_the_engines_words():
    m = {"module": "m.down_proj", "arch": "sm120", "declared": "W4A4_NVFP4", "got": None,
         "error": "NotImplementedError: no scheme"}
    other = {"module": "m.o_proj", "arch": "sm100", "declared": "W8A8_FP8",
             "got": "CompressedTensorsW8A16Fp8", "error": None}
    status, reason, _ = smoke.judge_scheme_reports("sglang", ["sm100"], {
        "a": _report(mismatches=[m, other], version="0.5.9"), "b": _report(mismatches=[other]),
        "c": _report(error="CompressedTensorsConfig: boom")})
    assert (status, reason) == (
        smoke.FAIL, "sglang 0.5.9 did not give every layer its declared scheme: "
        "a: 2 mismatches, first m.down_proj on sm120: declared W4A4_NVFP4, got no scheme "
        "(NotImplementedError: no scheme); "
        "b: 1 mismatch, first m.o_proj on sm100: declared W8A8_FP8, got CompressedTensorsW8A16Fp8; "
        "c: CompressedTensorsConfig: boom")


def test_the_scheme_stage_asks_about_the_smoke_model_and_each_probe_by_index(tmp_path,
                                                                              monkeypatch):
    """The stage imports the probe from the payload directory; a stand-in module in its place
    records which checkpoint directories the engine was asked about."""
    asked = []

    def run(d, engine, archs):
        asked.append((d.name, engine, archs, json.loads((d / "config.json").read_text()),
                      sorted(p.name for p in d.iterdir())))
        if d.name != "model":
            asked[-1] += (json.loads((d / "model.safetensors.index.json").read_text()),)
        return _report(version="1.0")

    probe = types.ModuleType("engine_schemes")
    probe.ARCH_CAPABILITY = {"sm100": (10, 0)}
    probe.run = run
    monkeypatch.setitem(sys.modules, "engine_schemes", probe)
    here = tmp_path / "payload"
    here.mkdir()
    (here / smoke.SCHEME_PROBES).write_text(json.dumps({"probes": {
        "fp8": {"quantization_config": {"q": 1}, "tensors": ["l.weight", "l.weight_scale"]}}}))
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text(json.dumps({"quantization_config": {"m": 2}}))
    (here / "image.json").write_text(json.dumps({"engine": "sglang", "archs": ["sm100", "cpu"]}))
    for name in ("check_patches", "check_kernels", "check_toolchain", "check_checkpoint"):
        monkeypatch.setattr(smoke, name, lambda *a: (smoke.SKIPPED, "n/a", {}))
    report = smoke.run_smoke(None, model, facts=here / "image.json")
    stage = next(s for s in report["stages"] if s["name"] == "engine-schemes")
    assert stage["status"] == smoke.PASS, stage
    assert asked == [
        ("model", "sglang", ["sm100"], {"quantization_config": {"m": 2}}, ["config.json"]),
        ("fp8", "sglang", ["sm100"], {"quantization_config": {"q": 1}},
         ["config.json", "model.safetensors.index.json"],
         {"weight_map": {"l.weight": "model.safetensors", "l.weight_scale": "model.safetensors"}})]
    assert stage["reason"] == ("sglang 1.0 gave each of 6 layers in 2 checkpoints (smoke-model, "
                               "fp8) its declared scheme on sm100")


# --- the GPU stage's tokens -------------------------------------------------------------------


@pytest.mark.parametrize("got, ok", [
    ([[0, 2, 3, 4], [1, 2, 3, 4]], False),  # a bad prompt before a good one still fails
    ([[1, 2, 3, 4], [0, 2, 3, 4]], False),
    ([[1, 2, 3, 4], [1, 2, 3, 4]], True),
])
def test_every_prompt_counts_in_the_engines_token_verdict(got, ok):
    prompts = [{"generated": [1, 2, 3, 4], "generate_margins": [9.0] * 4}] * 2
    verdict, rows = smoke.judge_engine_tokens(prompts, got, 1.0)
    assert verdict is ok
    assert rows == [{"want": [1, 2, 3, 4], "got": g, "decisive": 4, "match": g == [1, 2, 3, 4]}
                    for g in got]
