"""Decision tests for the in-image payloads (imgbuild/payload/*.py), run on the host.

The payloads are plain Python that runs inside the image; every judgement they make (pass, fail,
skipped, which reason) is tested here directly on plain data and tmp_path files, so a payload bug
is caught by a test of its own and not only by the golden content tags moving.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import json
import os
import re
import struct
from pathlib import Path

import pytest

from imgbuild.payload import smoke

# ------------------------------------------------------------------------------------------------
# smoke: stage "environment"
# ------------------------------------------------------------------------------------------------

PYTEST_VERSION = importlib.metadata.version("pytest")


def _lock(tmp_path: Path, text: str) -> Path:
    p = tmp_path / "lock.txt"
    p.write_text(text)
    return p


def test_environment_passes_when_every_locked_package_is_installed_at_its_version(tmp_path):
    status, reason, details = smoke.check_environment(
        _lock(tmp_path, f"pytest=={PYTEST_VERSION} \\\n    --hash=sha256:00\n"))
    assert status == smoke.PASS, reason
    assert details["checked"] == 1 and not details["mismatched"] and not details["missing"]


def test_environment_fails_on_a_version_that_differs_and_names_both_versions(tmp_path):
    status, reason, details = smoke.check_environment(_lock(tmp_path, "pytest==0.0.1\n"))
    assert status == smoke.FAIL
    assert f"pytest (locked 0.0.1, installed {PYTEST_VERSION})" in reason
    assert details["mismatched"] == [
        {"name": "pytest", "locked": "0.0.1", "installed": PYTEST_VERSION}]


def test_environment_fails_on_a_locked_package_that_is_not_installed(tmp_path):
    status, reason, details = smoke.check_environment(
        _lock(tmp_path, f"pytest=={PYTEST_VERSION}\nimgbuild-no-such-dist==1.0\n"))
    assert status == smoke.FAIL
    assert "locked but not installed: imgbuild-no-such-dist" in reason
    assert details["missing"] == ["imgbuild-no-such-dist"]


def test_environment_skips_a_package_whose_marker_excludes_this_platform(tmp_path):
    status, reason, details = smoke.check_environment(_lock(
        tmp_path,
        f"pytest=={PYTEST_VERSION}\n"
        "imgbuild-no-such-dist==1.0 ; sys_platform == 'imgbuild-nowhere'\n"))
    assert status == smoke.PASS, reason
    assert details["not_for_this_platform"] == ["imgbuild-no-such-dist"]
    assert details["checked"] == 1


def test_environment_direct_url_requirement_needs_presence_only(tmp_path):
    ok = smoke.check_environment(_lock(tmp_path, "pytest @ https://example.invalid/p.whl\n"))
    assert ok[0] == smoke.PASS, ok[1]
    missing = smoke.check_environment(
        _lock(tmp_path, "imgbuild-no-such-dist @ https://example.invalid/p.whl\n"))
    assert missing[0] == smoke.FAIL and "imgbuild-no-such-dist" in missing[1]


def test_environment_fails_on_an_unpinned_line_and_on_a_lock_without_pins(tmp_path):
    status, reason, _ = smoke.check_environment(
        _lock(tmp_path, f"pytest=={PYTEST_VERSION}\nloose>=1\n"))
    assert status == smoke.FAIL and "unpinned requirements: loose>=1" in reason
    status, reason, _ = smoke.check_environment(_lock(tmp_path, "# nothing\n--index-url x\n"))
    assert status == smoke.FAIL and "no pinned requirements" in reason


def test_environment_local_label_passes_but_is_recorded(tmp_path):
    # Any installed distribution whose version has no local label: locked with a label, it must
    # fail; the reverse (locked plain, installed labelled) passes by PEP 440 and is recorded.
    assert smoke.version_matches("1.0", "1.0+cpu") == (True, True)
    status, _, _ = smoke.check_environment(_lock(tmp_path, f"pytest=={PYTEST_VERSION}+cpu\n"))
    assert status == smoke.FAIL


def test_environment_goes_on_past_a_package_it_skips_or_finds_missing(tmp_path):
    status, reason, details = smoke.check_environment(_lock(
        tmp_path,
        "imgbuild-elsewhere==1.0 ; sys_platform == 'imgbuild-nowhere'\n"
        "imgbuild-no-such-dist==1.0\n"
        "imgbuild-no-such-dist-2==1.0\n"
        f"pytest=={PYTEST_VERSION}\n"))
    assert details["not_for_this_platform"] == ["imgbuild-elsewhere"]
    assert details["missing"] == ["imgbuild-no-such-dist", "imgbuild-no-such-dist-2"]
    assert details["checked"] == 3


def test_environment_details_word_for_word(tmp_path):
    """What the report's JSON carries for the environment stage, every key; torch here is a
    CPU build (2.13.0+cpu), locked without its label: it passes, and is recorded."""
    import sys

    torch = importlib.metadata.version("torch")
    assert "+" in torch, "this check needs a torch with a local label"
    public = torch.split("+", 1)[0]
    lock = _lock(tmp_path, f"torch=={public}\npytest=={PYTEST_VERSION}\n")
    status, reason, details = smoke.check_environment(lock)
    assert (status, reason) == (smoke.PASS, "2 locked packages installed at their locked "
                                            "versions")
    installed = smoke.installed_distributions()
    assert details == {
        "lock": str(lock), "locked": 2, "checked": 2, "mismatched": [], "missing": [],
        "unpinned_lines": [], "not_for_this_platform": [], "marker_unevaluated": [],
        "local_label_ignored": [{"name": "torch", "locked": public, "installed": torch}],
        "installed_not_locked": sorted(set(installed) - {"torch", "pytest"}),
        "python": sys.version.split()[0]}


def test_a_lock_is_read_as_uv_writes_it_line_by_line():
    lock = smoke.parse_lock(
        "# autogenerated by uv\n"                                           # 1
        "six==1.16.0  # via python-dateutil\n"                              # 2
        "torch==2.13.0+cpu \\\n"                                           # 3
        "    --hash=sha256:02\n"                                            # 4
        "    # via imgbuild\n"                                              # 5
        "mylib @ https://example.invalid/m.whl#sha256=ab ; python_version >= '3.8'\n"  # 6
        "-e ./local\n"                                                      # 7
        "--index-url https://pypi.org/simple\n")                            # 8
    assert [(p.name, p.version, p.line) for p in lock.packages] == [
        ("six", "1.16.0", 2), ("torch", "2.13.0+cpu", 3), ("mylib", None, 6)]
    assert lock.packages[2].marker == "python_version >= '3.8'"
    assert lock.unpinned == ("-e ./local",)  # an editable pins nothing: said, not passed


@pytest.mark.parametrize(("locked", "installed", "expected"), [
    ("Custom-A", "custom-a", (True, False)),  # neither PEP 440: compared as strings, any case
    ("custom", "custom+cpu", (True, True)),
    ("custom", "custom+cpu+x", (True, True)),
    ("custom+cpu", "custom+cpu2", (False, False)),
    ("custom", "other+cpu", (False, False)),
])
def test_versions_that_are_not_pep_440_are_compared_as_strings(locked, installed, expected):
    assert smoke.version_matches(locked, installed) == expected


def test_without_packaging_versions_are_compared_as_strings(monkeypatch):
    import builtins

    real = builtins.__import__

    def no_packaging(name, *a, **kw):
        if name.startswith("packaging"):
            raise ImportError(name)
        return real(name, *a, **kw)
    monkeypatch.setattr(builtins, "__import__", no_packaging)
    assert smoke.version_matches("2.13.0", "2.13.0+cpu") == (True, True)
    assert smoke.version_matches("1.0", "1.0.0") == (False, False)  # no normalizing without it


@pytest.mark.parametrize(("version", "release"), [
    ("4.56.0", (4, 56, 0)), ("4.56.0.dev0", (4, 56, 0)), ("5.0.0rc1", (5, 0, 0)),
    ("2.13.0+cpu", (2, 13, 0)), (None, (0,)),
])
def test_release_tuple_decides_the_transformers_dtype_keyword(version, release):
    assert smoke._release(version) == release
    assert (smoke._release(version) >= (4, 56)) == (release >= (4, 56))


# ------------------------------------------------------------------------------------------------
# smoke: structure checks of the checkpoint (stdlib only)
# ------------------------------------------------------------------------------------------------


def _safetensors(path: Path, header: dict) -> None:
    raw = json.dumps(header).encode()
    path.write_bytes(len(raw).to_bytes(8, "little") + raw)


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def test_files_check_fails_on_a_changed_a_missing_and_an_extra_file(tmp_path):
    (tmp_path / "a.json").write_text("A")
    (tmp_path / "b.json").write_text("B")
    (tmp_path / smoke.REFERENCE_DIR).mkdir()
    (tmp_path / smoke.REFERENCE_DIR / "reference.json").write_text("{}")  # never compared
    ref = {"files": {"a.json": {"sha256": _sha(b"A")}, "b.json": {"sha256": _sha(b"B")}}}
    ok = smoke._check_files(tmp_path, ref)
    assert ok.ok, ok.summary
    (tmp_path / "b.json").write_text("b")
    assert smoke._check_files(tmp_path, ref).data == ["b.json"]
    (tmp_path / "b.json").write_text("B")
    (tmp_path / "c.json").write_text("C")
    assert smoke._check_files(tmp_path, ref).data == ["c.json"]
    (tmp_path / "c.json").unlink()
    (tmp_path / "a.json").unlink()
    bad = smoke._check_files(tmp_path, ref)
    assert not bad.ok and bad.data == ["a.json"]


def test_layout_check_compares_dtype_and_shape_of_every_tensor(tmp_path):
    _safetensors(tmp_path / "model.safetensors", {
        "__metadata__": {"format": "pt"},
        "w": {"dtype": "U8", "shape": [4, 2], "data_offsets": [0, 8]}})
    ref = {"layout": {"w": {"dtype": "U8", "shape": [4, 2]}}}
    assert smoke._check_layout(tmp_path, ref).ok
    assert not smoke._check_layout(tmp_path, {"layout": {"w": {"dtype": "BF16", "shape": [4, 2]}}}).ok
    assert not smoke._check_layout(tmp_path, {"layout": {"w": {"dtype": "U8", "shape": [2, 4]}}}).ok
    extra = smoke._check_layout(tmp_path, {"layout": {**ref["layout"],
                                                      "v": {"dtype": "U8", "shape": [1]}}})
    assert not extra.ok and "v: expected" in extra.summary


@pytest.mark.parametrize(("data", "why"), [
    (b"\x01\x00", "shorter than its header"),
    ((0).to_bytes(8, "little"), "header length 0"),
    ((smoke.MAX_HEADER + 1).to_bytes(8, "little"), "header length"),
    ((2).to_bytes(8, "little") + b"[]", "not an object"),
    ((3).to_bytes(8, "little") + b"{{{", "unreadable safetensors header"),
])
def test_safetensors_header_reader_refuses_what_is_not_one(tmp_path, data, why):
    p = tmp_path / "x.safetensors"
    p.write_bytes(data)
    with pytest.raises(ValueError, match=why) as e:
        smoke.read_safetensors_header(p)
    assert str(p) in str(e.value)


def test_config_check_wants_compressed_tensors_and_the_reference_format(tmp_path):
    def cfg(qc):
        (tmp_path / "config.json").write_text(json.dumps({"quantization_config": qc}))
        return smoke._check_config(tmp_path, {"format": "nvfp4-pack-quantized"})
    assert cfg({"quant_method": "compressed-tensors", "format": "nvfp4-pack-quantized"}).ok
    assert not cfg({"quant_method": "compressed-tensors", "format": "mixed-precision"}).ok
    assert not cfg({"quant_method": "fp8", "format": "nvfp4-pack-quantized"}).ok
    assert not cfg(None).ok


def test_checkpoint_stage_fails_without_a_reference_or_with_another_schema(tmp_path):
    status, reason, _ = smoke.check_checkpoint(tmp_path)
    assert status == smoke.FAIL and "no reference" in reason
    ref = tmp_path / smoke.REFERENCE_DIR / smoke.REFERENCE_JSON
    ref.parent.mkdir()
    ref.write_text(json.dumps({"schema": smoke.REFERENCE_SCHEMA + 1}))
    status, reason, _ = smoke.check_checkpoint(tmp_path)
    assert status == smoke.FAIL and f"this payload reads {smoke.REFERENCE_SCHEMA}" in reason


# ------------------------------------------------------------------------------------------------
# smoke: greedy comparisons
# ------------------------------------------------------------------------------------------------


def test_decisive_prefix_stops_at_the_first_margin_within_twice_atol():
    assert smoke.decisive_prefix([5.0, 3.0, 0.1, 9.0], atol=1.0) == 2
    assert smoke.decisive_prefix([2.0], atol=1.0) == 0  # exactly 2*atol may flip
    assert smoke.decisive_prefix([2.01, 3.0], atol=1.0) == 2
    assert smoke.decisive_prefix([], atol=1.0) == 0


def test_engine_tokens_are_judged_only_over_the_decisive_prefix():
    prompts = [{"generated": [1, 2, 3, 4], "generate_margins": [9.0, 9.0, 0.1, 9.0]}]
    # logits_atol 1.0: the engine compares with 2*atol, so margins <= 4.0 are not decisive.
    ok, rows = smoke.judge_engine_tokens(prompts, [[1, 2, 7, 7]], 1.0)
    assert ok and rows[0]["decisive"] == 2 and rows[0]["match"]
    ok, rows = smoke.judge_engine_tokens(prompts, [[1, 5, 3, 4]], 1.0)
    assert not ok and not rows[0]["match"]
    edge = [{"generated": [1, 2], "generate_margins": [4.5, 4.0]}]
    ok, rows = smoke.judge_engine_tokens(edge, [[1, 9]], 1.0)
    assert ok and rows[0]["decisive"] == 1
    # Every prompt counts: one bad prompt fails the stage.
    ok, _ = smoke.judge_engine_tokens(prompts + prompts, [[1, 2, 3, 4], [0, 2, 3, 4]], 1.0)
    assert not ok


@pytest.mark.parametrize(("archs", "cap", "by"), [
    (["sm120"], (12, 1), "sm120"),  # same major, lower minor runs
    (["sm121"], (12, 0), None),  # a higher minor does not
    (["sm100"], (9, 0), None),  # never across majors
    (["sm90"], (10, 0), None),
    (["sm100", "sm103"], (10, 3), "sm103"),  # the closest one
    (["sm100", "sm103"], (10, 0), "sm100"),
    (["cpu"], (10, 0), None),
])
def test_arch_ok_same_major_and_a_minor_not_above_the_gpus(archs, cap, by):
    assert smoke._arch_ok(archs, cap) == by


@pytest.mark.parametrize(("engine", "activations", "cap", "mode", "status"), [
    ("sglang", True, (9, 0), "auto", smoke.SKIPPED),
    ("vllm", True, (9, 0), "require", smoke.FAIL),
    ("sglang", True, (10, 0), "require", None),
    ("vllm", True, (12, 0), "require", None),
    ("sglang", False, (9, 0), "require", None),  # w4a16: no FP4 activations
    ("transformers", True, (9, 0), "require", None),  # emulated
])
def test_w4a4_needs_fp4_tensor_cores_in_the_serving_engines(engine, activations, cap, mode,
                                                            status):
    refused = smoke.w4a4_refusal(engine, activations, cap, mode)
    assert (refused and refused[0]) == status
    if refused:
        assert f"sm{cap[0]}{cap[1]}" in refused[1]


@pytest.mark.parametrize(("mode", "status"), [("auto", smoke.SKIPPED), ("require", smoke.FAIL)])
def test_gpu_stage_without_a_gpu_skips_unless_required(tmp_path, mode, status):
    torch = pytest.importorskip("torch")
    if torch.cuda.is_available():
        pytest.skip("this host has a GPU")
    got, reason, _ = smoke.check_gpu(tmp_path, {"archs": ["sm100"]}, "sglang", mode)
    assert got == status, reason


def _cubin(sm: int, machine: int = smoke.EM_CUDA) -> bytes:
    data = bytearray(64)
    data[:4] = b"\x7fELF"
    struct.pack_into("<H", data, 18, machine)
    struct.pack_into("<I", data, 48, (sm << 8) | 0x5)
    return bytes(data)


def test_cubin_arch_reads_the_sm_from_a_cuda_elf_only():
    assert smoke.cubin_arch(_cubin(100)) == 100
    assert smoke.cubin_arch(_cubin(120)) == 120
    assert smoke.cubin_arch(_cubin(100, machine=62)) is None  # x86-64, not CUDA
    assert smoke.cubin_arch(b"\x7fELF" + bytes(20)) is None  # too short
    assert smoke.cubin_arch(b"MZ" + bytes(62)) is None
    # an ELF header is 52 bytes at least, and e_flags its last field: 52 is enough
    assert smoke.cubin_arch(_cubin(100)[:52]) == 100
    # a CUDA machine number without the ELF magic is no cubin
    assert smoke.cubin_arch(b"MZ\0\0" + _cubin(100)[4:]) is None
    assert smoke._sm("sm_100a") == 100 and smoke._sm("sm120") == 120


# ------------------------------------------------------------------------------------------------
# smoke: the image stages' verdicts (patches, kernels, toolchain, engine schemes)
# ------------------------------------------------------------------------------------------------


def test_patch_stage_skips_an_image_without_patches_and_fails_one_that_lacks_them(tmp_path):
    assert smoke.check_patches({}, tmp_path)[0] == smoke.SKIPPED
    status, reason, details = smoke.check_patches({"patches": ["sglang-ignore"]}, tmp_path)
    assert status == smoke.FAIL and "sglang-ignore" in reason
    assert details == {"expected": ["sglang-ignore"]}
    (tmp_path / "patcher.py").write_text("")  # a patcher without its report is no patch layer
    assert smoke.check_patches({}, tmp_path)[0] == smoke.FAIL


def _probe_out(*probes: dict) -> str:
    return "patcher: probing\n" + json.dumps({"ok": True, "probes": list(probes)})


def test_patch_probes_verdict():
    applied = {"id": "a", "status": "applied", "probe": "pass"}
    obsolete = {"id": "b", "status": "obsolete", "probe": "pass"}
    status, reason, _ = smoke.judge_patch_probes(["a", "b"], _probe_out(applied, obsolete), "")
    assert status == smoke.PASS and reason.startswith("2 patch probe(s) pass")
    already = {"id": "a", "status": "already-applied", "probe": "pass"}
    assert smoke.judge_patch_probes(["a"], _probe_out(already), "")[0] == smoke.PASS
    # An expected patch the probe report does not list, or lists as not in effect, fails.
    status, reason, _ = smoke.judge_patch_probes(["a", "c"], _probe_out(applied), "")
    assert status == smoke.FAIL and "not in effect: c" in reason
    na = {"id": "a", "status": "not-applicable", "probe": "skipped"}
    assert smoke.judge_patch_probes(["a"], _probe_out(na), "")[0] == smoke.FAIL
    # A failing probe fails even for a patch the target did not list.
    bad = {"id": "z", "status": "applied", "probe": "fail", "detail": "boom"}
    status, reason, _ = smoke.judge_patch_probes(["a"], _probe_out(applied, bad), "")
    assert status == smoke.FAIL and "z: boom" in reason
    status, reason, _ = smoke.judge_patch_probes(["a"], "Traceback ...", "ImportError: x\n")
    assert status == smoke.FAIL and "no probe report" in reason and "ImportError: x" in reason


def test_kernel_files_must_be_installed_byte_for_byte(tmp_path):
    r1, r2 = tmp_path / "site1", tmp_path / "site2"
    (r2 / "pkg").mkdir(parents=True)
    r1.mkdir()
    (r2 / "pkg" / "k.so").write_bytes(b"ELF")
    files = [{"package": "pkg", "member": "pkg/k.so", "sha256": _sha(b"ELF")}]
    assert smoke.kernel_file_problems(files, [r1, r2]) == []
    changed = [{**files[0], "sha256": _sha(b"other")}]
    assert smoke.kernel_file_problems(changed, [r1, r2]) == [
        "pkg: pkg/k.so differs from the scanned file"]
    assert smoke.kernel_file_problems(files, [r1]) == ["pkg: pkg/k.so is not installed"]
    # The first root that has the file is the one imported: a changed copy there fails.
    (r1 / "pkg").mkdir()
    (r1 / "pkg" / "k.so").write_bytes(b"changed")
    assert smoke.kernel_file_problems(files, [r1, r2]) != []
    assert smoke.check_kernels({})[0] == smoke.SKIPPED
    status, reason, _ = smoke.check_kernels(
        {"kernel_files": [{"package": "p", "member": "imgbuild-no-such/k.so", "sha256": "0"}]})
    assert status == smoke.FAIL and "is not installed" in reason


def test_toolchain_stage_skips_without_a_toolchain_and_fails_without_nvcc(tmp_path):
    status, reason, _ = smoke.check_toolchain({"flavor": "runtime", "archs": ["sm100"]})
    assert status == smoke.SKIPPED and "runtime" in reason
    status, reason, _ = smoke.check_toolchain(
        {"toolchain": {"cuda_home": str(tmp_path)}, "archs": ["sm100"]})
    assert status == smoke.FAIL and "no nvcc" in reason


def test_engine_scheme_stage_skips_an_image_without_a_serving_engine(tmp_path):
    status, reason, _ = smoke.check_engine_schemes(tmp_path, {"engine": "transformers"}, tmp_path)
    assert status == smoke.SKIPPED and "transformers" in reason
    assert smoke.check_engine_schemes(None, {}, tmp_path)[0] == smoke.SKIPPED


def _scheme_report(**kw) -> dict:
    return {"modules_checked": 3, "mismatches": [], "chosen": {}, "unchecked": [],
            "kernel_not_built": [], "error": None, "seconds": 0.1, "version": "0.5.9", **kw}


def test_engine_scheme_verdict():
    status, reason, details = smoke.judge_scheme_reports(
        "sglang", ["sm100"], {"smoke-model": _scheme_report()})
    assert status == smoke.PASS and "each of 3 layers in 1 checkpoints" in reason
    assert details["archs"] == ["sm100"]
    m = {"module": "model.layers.0.mlp.down_proj", "arch": "sm100", "declared": "W4A4",
         "got": None}
    status, reason, _ = smoke.judge_scheme_reports(
        "sglang", ["sm100"], {"probe": _scheme_report(mismatches=[m])})
    assert status == smoke.FAIL and "1 mismatch, first model.layers.0.mlp.down_proj" in reason
    assert "got no scheme" in reason
    status, reason, _ = smoke.judge_scheme_reports(
        "sglang", ["sm100"], {"probe": _scheme_report(mismatches=[m, m])})
    assert "2 mismatches" in reason
    status, reason, _ = smoke.judge_scheme_reports(
        "vllm", ["sm100"], {"probe": _scheme_report(error="CompressedTensorsConfig: boom")})
    assert status == smoke.FAIL and "probe: CompressedTensorsConfig: boom" in reason
    # Layers the engine could not be asked without a GPU are said, and not counted as passed.
    asked = [{"module": "m1", "scheme": None, "error": "needs a GPU"},
             {"module": "m2", "scheme": "W4A4", "error": ""}]
    status, reason, _ = smoke.judge_scheme_reports(
        "sglang", ["sm100"], {"p": _scheme_report(kernel_not_built=asked)})
    assert status == smoke.PASS
    assert "each of 2 layers" in reason and "1 not asked (e.g. m1: needs a GPU)" in reason
    assert "1 chosen whose kernel is picked on a GPU" in reason


# ------------------------------------------------------------------------------------------------
# smoke: the driver (stages, overall verdict, exit status, human output)
# ------------------------------------------------------------------------------------------------


def _names(report: dict) -> list[tuple[str, str]]:
    return [(s["name"], s["status"]) for s in report["stages"]]


def test_smoke_without_inputs_skips_and_passes():
    report = smoke.run_smoke(None, None)
    assert _names(report) == [("environment", smoke.SKIPPED), ("checkpoint-cpu", smoke.SKIPPED),
                              ("gpu-engine", smoke.SKIPPED)]
    assert report["ok"]


def test_smoke_missing_lock_or_model_fails(tmp_path):
    report = smoke.run_smoke(tmp_path / "nope.txt", tmp_path / "no-model", gpu="auto")
    assert _names(report) == [("environment", smoke.FAIL), ("checkpoint-cpu", smoke.FAIL),
                              ("gpu-engine", smoke.SKIPPED)]
    assert not report["ok"]
    assert report["stages"][2]["reason"] == "skipped: no smoke model"


def test_smoke_with_facts_orders_the_image_stages(tmp_path):
    facts = tmp_path / "image.json"
    facts.write_text(json.dumps({"engine": "transformers", "archs": ["cpu"]}))
    lock = _lock(tmp_path, f"pytest=={PYTEST_VERSION}\n")
    report = smoke.run_smoke(lock, None, facts=facts)
    assert [n for n, _ in _names(report)] == [
        "environment", "patches", "kernels", "toolchain", "checkpoint-cpu", "engine-schemes",
        "gpu-engine"]
    assert report["ok"], _names(report)
    bad = _lock(tmp_path, "pytest==0.0.1\n")
    assert not smoke.run_smoke(bad, None, facts=facts)["ok"]
    # A later stage's failure fails the whole smoke too (patches expected, no patch layer).
    facts.write_text(json.dumps({"engine": "transformers", "archs": ["cpu"],
                                 "patches": ["sglang-ignore"]}))
    report = smoke.run_smoke(_lock(tmp_path, f"pytest=={PYTEST_VERSION}\n"), None, facts=facts)
    assert ("patches", smoke.FAIL) in _names(report) and not report["ok"]


def test_unreadable_facts_are_no_facts(tmp_path):
    assert smoke._image_facts(tmp_path / "none.json") == {}
    (tmp_path / "bad.json").write_text("{")
    assert smoke._image_facts(tmp_path / "bad.json") == {}


def test_a_stage_that_raises_is_a_failure_with_its_reason():
    def boom():
        raise RuntimeError("kaput")
    stage = smoke._stage("x", boom)
    assert stage["status"] == smoke.FAIL and stage["reason"] == "RuntimeError: kaput"
    assert "kaput" in stage["details"]["traceback"]


def test_human_output_lists_failed_checks_and_the_verdict():
    report = {"ok": False, "stages": [
        {"name": "checkpoint-cpu", "status": smoke.FAIL, "duration_s": 1.0, "reason": "r",
         "details": {"checks": [{"check": "files", "ok": False, "summary": "differ"},
                                {"check": "layout", "ok": True, "summary": "fine"}]}},
        {"name": "environment", "status": smoke.PASS, "duration_s": 0.0, "reason": "all good",
         "details": {}}]}
    text = smoke.format_human(report)
    assert "1 of 2 checks failed:" in text and "- files: differ" in text
    assert "- layout" not in text and "all good" in text
    assert text.endswith("smoke: FAILED")
    assert smoke.format_human({**report, "ok": True}).endswith("smoke: ok")


def test_main_exit_status_follows_the_verdict(tmp_path, capsys):
    good = _lock(tmp_path, f"pytest=={PYTEST_VERSION}\n")
    assert smoke.main(["--lock", str(good), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["ok"] is True
    bad = tmp_path / "bad.txt"
    bad.write_text("pytest==0.0.1\n")
    assert smoke.main(["--lock", str(bad)]) == 1
    with pytest.raises(SystemExit) as e:
        smoke.main(["--gpu", "sometimes"])
    assert e.value.code == 2


def _nvcc(cuda_home: Path, body: str) -> None:
    """nvcc cannot run on this host: a stand-in that writes the cubin the test says."""
    (cuda_home / "bin").mkdir(parents=True)
    nvcc = cuda_home / "bin" / "nvcc"
    nvcc.write_text("#!/bin/sh\n" + body)
    nvcc.chmod(0o755)


@pytest.mark.parametrize(("body", "why"), [
    # writes a cubin for sm_90 whatever it is asked: the stage must read the cubin's own arch
    ("out=$(echo \"$@\" | sed 's/.*-o \\([^ ]*\\).*/\\1/')\n"
     "printf '\\177ELF' > \"$out\"; head -c 14 /dev/zero >> \"$out\"; "
     "printf '\\276\\000' >> \"$out\"; head -c 28 /dev/zero >> \"$out\"; "
     "printf '\\005\\132\\000\\000' >> \"$out\"; head -c 12 /dev/zero >> \"$out\"\n",
     "cubin is for sm_90"),
    ("echo 'nvcc fatal: Unsupported gpu architecture' >&2; exit 1\n", "Unsupported gpu"),
])
def test_toolchain_stage_fails_when_nvcc_cannot_build_for_the_target_arch(tmp_path, body, why):
    _nvcc(tmp_path / "cuda", body)
    status, reason, details = smoke.check_toolchain(
        {"toolchain": {"cuda_home": str(tmp_path / "cuda")}, "archs": ["cpu", "sm100"]})
    assert status == smoke.FAIL and "could not compile for sm100" in reason and why in reason
    assert list(details["cubins"]) == ["sm100"]


# ------------------------------------------------------------------------------------------------
# smokegen: the recipe (spec validation, key), which Linears are NVFP4, the layout check
# ------------------------------------------------------------------------------------------------

from imgbuild.payload import serve, smokegen  # noqa: E402

LINEARS = {
    "model.layers.0.self_attn.q_proj": (256, 256),
    "model.layers.0.mlp.down_proj": (256, 512),
    "lm_head": (512, 256),
}


def test_scheme_activations_follow_the_presets():
    assert smokegen.SCHEMES["NVFP4"].activations
    assert not smokegen.SCHEMES["NVFP4A16"].activations
    assert smokegen.SCHEMES["FP8-ATTN+NVFP4-MLP"].activations


@pytest.mark.parametrize(("kw", "why"), [
    ({"scheme": "INT4"}, "is not one of"),
    ({"name": ""}, "must be non-empty"),
    ({"name": "a/b"}, "only letters"),
    ({"hidden_size": 200}, "hidden_size=200 must be a multiple of 16"),
    ({"intermediate_size": 520}, "intermediate_size=520"),
    ({"num_attention_heads": 3, "num_key_value_heads": 1, "head_dim": 10}, "head_dim"),
    ({"num_attention_heads": 4, "num_key_value_heads": 3}, "multiple of num_key_value_heads"),
    ({"num_layers": 1}, "is not a Linear of a 1-layer Qwen3"),
    ({"reference_layers": ("model.layers.0.mlp.act_fn",)}, "is not a Linear"),
    ({"vocab_size": 256}, "vocab_size must cover"),
])
def test_smoke_spec_refuses_what_cannot_be_an_nvfp4_qwen3(kw, why):
    with pytest.raises(ValueError, match=why):
        smokegen.SmokeModelSpec(**kw)


def test_smoke_spec_limits_are_inclusive():
    smokegen.SmokeModelSpec(vocab_size=256 + len(smokegen.SPECIAL_TOKENS))
    smokegen.SmokeModelSpec(num_layers=2, reference_layers=("model.layers.1.mlp.up_proj",))


def test_smoke_key_covers_every_spec_field_and_the_format_version(monkeypatch):
    base = smokegen.SmokeModelSpec()
    assert base.key() == smokegen.SmokeModelSpec().key()
    for kw in ({"seed": 1}, {"scheme": "NVFP4A16"}, {"name": "other"}, {"logits_atol": 0.05},
               {"generate_tokens": 9}):
        assert smokegen.SmokeModelSpec(**kw).key() != base.key(), kw
    before = base.key()
    monkeypatch.setattr(smokegen, "FORMAT_VERSION", smokegen.FORMAT_VERSION + 1)
    assert smokegen.SmokeModelSpec().key() != before


def test_nvfp4_linears_per_scheme():
    assert smokegen.nvfp4_linears(smokegen.SCHEMES["NVFP4"], LINEARS) == {
        "model.layers.0.self_attn.q_proj": True, "model.layers.0.mlp.down_proj": True}
    assert smokegen.nvfp4_linears(smokegen.SCHEMES["NVFP4A16"], LINEARS) == {
        "model.layers.0.self_attn.q_proj": False, "model.layers.0.mlp.down_proj": False}
    # Mixed: attention goes to the FP8 group, only the MLP is NVFP4.
    assert smokegen.nvfp4_linears(smokegen.SCHEMES["FP8-ATTN+NVFP4-MLP"], LINEARS) == {
        "model.layers.0.mlp.down_proj": True}


def test_first_matching_group_wins():
    scheme = smokegen.SchemeDef(groups=(("FP8", ("Linear",)), ("NVFP4", ("Linear",))),
                                format="mixed-precision")
    assert smokegen.nvfp4_linears(scheme, LINEARS) == {}
    assert smokegen._matches("model.layers.0.mlp.down_proj", (r"re:.*mlp\.(gate|up|down)_proj$",))
    assert not smokegen._matches("model.layers.0.self_attn.o_proj",
                                 (r"re:.*mlp\.(gate|up|down)_proj$",))


def _nvfp4_layout(name: str, out: int, inp: int, w4a4: bool) -> dict:
    lay = {f"{name}.weight_packed": {"dtype": "U8", "shape": [out, inp // 2]},
           f"{name}.weight_scale": {"dtype": "F8_E4M3", "shape": [out, inp // 16]},
           f"{name}.weight_global_scale": {"dtype": "F32", "shape": [1]}}
    if w4a4:
        lay[f"{name}.input_global_scale"] = {"dtype": "F32", "shape": [1]}
    return lay


def test_nvfp4_layout_check():
    d = "model.layers.0.mlp.down_proj"
    linears = {d: (256, 512), "lm_head": (512, 256)}
    good = {**_nvfp4_layout(d, 256, 512, True),
            "lm_head.weight": {"dtype": "BF16", "shape": [512, 256]}}
    assert smokegen.check_nvfp4_layout(good, linears, {d: True}) == []
    # W4A4 without its input scale
    no_input = {k: v for k, v in good.items() if not k.endswith("input_global_scale")}
    assert smokegen.check_nvfp4_layout(no_input, linears, {d: True}) == [
        f"{d}.input_global_scale: expected {{'dtype': 'F32', 'shape': [1]}}, found None"]
    # W4A16 with one
    assert smokegen.check_nvfp4_layout(good, linears, {d: False}) == [
        f"{d}.input_global_scale present in a weight-only layer"]
    # a dense copy beside the packed weight
    dense = {**good, f"{d}.weight": {"dtype": "BF16", "shape": [256, 512]}}
    assert smokegen.check_nvfp4_layout(dense, linears, {d: True}) == [
        f"{d}.weight stored dense next to weight_packed"]
    # scales per 16 inputs, two values per byte
    wrong = {**good, f"{d}.weight_scale": {"dtype": "F8_E4M3", "shape": [256, 64]}}
    assert len(smokegen.check_nvfp4_layout(wrong, linears, {d: True})) == 1
    wrong = {**good, f"{d}.weight_packed": {"dtype": "U8", "shape": [256, 512]}}
    assert len(smokegen.check_nvfp4_layout(wrong, linears, {d: True})) == 1
    # lm_head quantized is a problem
    bad_head = {k: v for k, v in good.items() if k != "lm_head.weight"}
    assert smokegen.check_nvfp4_layout(bad_head, linears, {d: True}) != []


def test_generate_refuses_an_existing_directory_and_main_says_so(tmp_path, capsys):
    (tmp_path / "out").mkdir()
    with pytest.raises(FileExistsError, match="--force"):
        smokegen.generate(smokegen.SmokeModelSpec(), tmp_path / "out")
    assert smokegen.main([str(tmp_path / "out")]) == 2
    assert "exists" in capsys.readouterr().err
    assert smokegen.main([str(tmp_path / "new"), "--name", "a b"]) == 2
    assert not (tmp_path / "new").exists()


# ------------------------------------------------------------------------------------------------
# serve: the tiny-cpu server's decisions
# ------------------------------------------------------------------------------------------------


def test_served_name_defaults_to_the_checkpoint_directory():
    assert serve.served_name("/models/tiny-nvfp4", None) == "tiny-nvfp4"
    assert serve.served_name("/models/tiny-nvfp4/", "") == "tiny-nvfp4"
    assert serve.served_name("/models/tiny-nvfp4", "k2") == "k2"


@pytest.mark.parametrize(("body", "steps"), [
    ({}, 16), ({"max_tokens": 0}, 1), ({"max_tokens": -5}, 1), ({"max_tokens": 1}, 1),
    ({"max_tokens": 256}, 256), ({"max_tokens": 10_000}, 256), ({"max_tokens": "8"}, 8)])
def test_completion_length_is_held_to_one_through_256(body, steps):
    assert serve.max_new_tokens(body) == steps


def test_bad_max_tokens_is_a_client_error():
    with pytest.raises(ValueError):  # the handler answers 400 for ValueError/TypeError
        serve.max_new_tokens({"max_tokens": "many"})
    with pytest.raises(TypeError):
        serve.max_new_tokens({"max_tokens": None})


def test_get_routes():
    assert serve.get_route("/health", "m") == (200, {"status": "ok"})
    code, doc = serve.get_route("/v1/models", "m")
    assert code == 200 and [d["id"] for d in doc["data"]] == ["m"]
    assert serve.get_route("/v1/completions", "m")[0] == 404
    assert serve.get_route("/health/", "m")[0] == 404


# ------------------------------------------------------------------------------------------------
# smoke: the logits and decode judgements, on small tensors
# ------------------------------------------------------------------------------------------------


def _logits(rows):
    torch = pytest.importorskip("torch")
    return torch.tensor(rows, dtype=torch.float32)


def test_prompt_logits_within_atol_and_greedy_equal_where_decisive():
    expected = _logits([[5.0, 0.0, 0.0], [1.0, 1.05, 0.0]])  # row 1: margin 0.05, not decisive
    got = _logits([[5.02, 0.0, 0.0], [1.03, 1.02, 0.0]])  # row 1's argmax flips: allowed
    row, problems = smoke.judge_prompt_logits(0, got, expected, [0, 1], atol=0.04)
    assert problems == [] and row["greedy_checked"] == 1 and row["greedy_next"] == 0
    # Beyond atol
    row, problems = smoke.judge_prompt_logits(0, _logits([[5.06, 0.0, 0.0], [1.0, 1.05, 0.0]]),
                                              expected, [0, 1], atol=0.04)
    assert problems == ["prompt 0: max abs diff 0.06 > 0.04"]
    # A flip where the margin is decisive is a problem even within a loose atol.
    row, problems = smoke.judge_prompt_logits(3, _logits([[0.0, 5.0, 0.0], [1.0, 1.05, 0.0]]),
                                              expected, [0, 1], atol=10.0)
    assert problems == [] and row["greedy_checked"] == 0  # margin 5 <= 2*10: nothing decisive
    row, problems = smoke.judge_prompt_logits(3, _logits([[0.0, 5.0, 0.0], [1.0, 1.05, 0.0]]),
                                              expected, [0, 1], atol=2.4)
    assert "prompt 3: greedy token differs at positions [0]" in problems
    # exactly 2*atol is not decisive
    row, _ = smoke.judge_prompt_logits(0, expected, expected, [0, 1], atol=2.5)
    assert row["greedy_checked"] == 0
    row, problems = smoke.judge_prompt_logits(0, _logits([[1.0, 2.0]]), expected, [0, 1], 0.04)
    assert problems == ["prompt 0: logits shape (1, 2), expected (2, 3)"]


def test_generation_compared_through_the_first_divergence_only():
    expected = _logits([[0.0, 9.0], [9.0, 0.0], [0.0, 9.0]])
    want = [1, 0, 1]
    # Same tokens, logits equal: pass, every step compared.
    row, problems, compared = smoke.judge_generation(0, want, want, expected, expected,
                                                     [9.0, 9.0, 9.0], 0.04)
    assert problems == [] and row["compared_steps"] == 3 and compared == 3
    # Diverging at step 1 after the decisive prefix ends there: allowed; step 2's logits (other
    # inputs) are not compared, however far off.
    far = _logits([[0.0, 9.0], [9.0, 0.0], [99.0, -99.0]])
    row, problems, compared = smoke.judge_generation(0, [1, 1, 0], want, far, expected,
                                                     [9.0, 0.01, 9.0], 0.04)
    assert problems == [] and row["compared_steps"] == 2 and compared == 1
    assert row["decisive_tokens"] == 1
    # Diverging inside the decisive prefix fails.
    row, problems, compared = smoke.judge_generation(0, [1, 1, 1], want, expected, expected,
                                                     [9.0, 9.0, 9.0], 0.04)
    assert problems == ["prompt 0: generated [1, 1, 1], expected [1, 0, 1]"] and compared == 1
    # ... up to its last token.
    row, problems, _ = smoke.judge_generation(0, [1, 0, 0], want, expected, expected,
                                              [9.0, 9.0, 9.0], 0.04)
    assert problems == ["prompt 0: generated [1, 0, 0], expected [1, 0, 1]"]
    # Compared steps beyond atol fail.
    off = _logits([[0.0, 9.1], [9.0, 0.0], [0.0, 9.0]])
    row, problems, _ = smoke.judge_generation(0, want, want, off, expected, [9.0] * 3, 0.04)
    assert problems and "decode logits max abs diff" in problems[0]


# --- the toolchain stage past nvcc: cpp_extension and FlashInfer's JIT ----------------------------

NVCC_PY = r'''#!/usr/bin/env python3
# nvcc cannot run here: writes the cubin (a CUDA ELF for the asked sm) where -o says. As nvcc
# does, it wants -cubin for a cubin, and a .cu source that is there; each call is logged.
import json, os, re, struct, sys
args = sys.argv[1:]
with open(os.environ["NVCC_LOG"], "a") as log:
    log.write(json.dumps(args) + "\n")
src = args[-1]
if "-cubin" not in args or not src.endswith(".cu") or not os.path.isfile(src):
    sys.exit(f"nvcc fatal   : Don't know what to do with '{src}'")
sm = int(re.search(r"-arch=sm_(\d+)", " ".join(args)).group(1))
elf = bytearray(64)
elf[:4] = b"\x7fELF"
struct.pack_into("<H", elf, 18, 190)
struct.pack_into("<I", elf, 48, sm << 8)
open(args[args.index("-o") + 1], "wb").write(bytes(elf))
'''


@pytest.fixture()
def toolchain(tmp_path, monkeypatch):
    """A CUDA_HOME whose nvcc writes real cubin headers, torch's cpp_extension.load_inline
    standing in for a CUDA compile (it writes the module's .so and hands back its function),
    and the arch variables put back after."""
    import sys
    import types

    # Importing cpp_extension imports setuptools, which appends its _vendor directory to
    # sys.path for good: its vendored distributions would then be listed by every later
    # importlib.metadata.distributions() of this worker. The path is put back after.
    monkeypatch.setattr(sys, "path", list(sys.path))
    import torch.utils.cpp_extension as ext

    (tmp_path / "cuda" / "bin").mkdir(parents=True)
    nvcc = tmp_path / "cuda" / "bin" / "nvcc"
    nvcc.write_text(NVCC_PY)
    nvcc.chmod(0o755)
    monkeypatch.setenv("NVCC_LOG", str(tmp_path / "nvcc.log"))
    for var in ("TORCH_CUDA_ARCH_LIST", "FLASHINFER_CUDA_ARCH_LIST", "FLASHINFER_WORKSPACE_BASE"):
        monkeypatch.setenv(var, str(tmp_path / "before"))  # put back after; never the cwd
    built = {}

    def load_inline(*, name, build_directory, functions, cpp_sources, cuda_sources,
                    verbose=False):
        # what the compiler would insist on: each function declared in the C++ source is
        # defined, with the same signature, in the CUDA source; no build log on stdout
        for decl in re.findall(r"^(.+\));$", cpp_sources, re.M):
            assert decl + " {" in cuda_sources, decl
        assert [f"{f}(" in cpp_sources for f in functions] == [True] * len(functions)
        assert verbose is False
        built.update(name=name, functions=functions, arch=os.environ["TORCH_CUDA_ARCH_LIST"])
        (Path(build_directory) / f"{name}.so").write_bytes(b"")
        return types.SimpleNamespace(**{f: object() for f in functions})
    monkeypatch.setattr(ext, "load_inline", load_inline)
    # FlashInfer is not installed beside the tests: its JIT is skipped unless a test stands in.
    monkeypatch.setitem(sys.modules, "flashinfer", None)
    facts = {"toolchain": {"cuda_home": str(tmp_path / "cuda"), "nvcc": "13.0"},
             "archs": ["cpu", "sm100", "sm120"]}
    return facts, built


def test_the_toolchain_stage_compiles_for_each_arch_then_builds_an_extension(toolchain):
    facts, built = toolchain
    status, reason, details = smoke.check_toolchain(facts)
    assert status == smoke.PASS, reason
    assert {a: c["sm"] for a, c in details["cubins"].items()} == {"sm100": 100, "sm120": 120}
    assert built == {"name": "imgbuild_jit_probe", "functions": ["axpy"], "arch": "10.0;12.0"}
    ext = details["cpp_extension"]
    assert (ext["built"], ext["arch_list"], ext["loaded"]) == (
        ["imgbuild_jit_probe.so"], "10.0;12.0", True)
    assert details["flashinfer_jit"]["skipped"] == ("No module named 'flashinfer.jit'; "
                                                    "'flashinfer' is not a package")
    assert reason == (
        f"nvcc 13.0 compiled for sm_100a, sm_120a; torch cpp_extension built and loaded a CUDA "
        f"extension for 10.0;12.0 in {ext['seconds']} s; FlashInfer JIT skipped: "
        f"flashinfer.jit.activation: {details['flashinfer_jit']['skipped']}"[:len(reason)])
    assert os.environ["FLASHINFER_CUDA_ARCH_LIST"] == "10.0a 12.0a"


def test_the_toolchain_stage_asks_nvcc_for_a_cubin_per_arch_and_times_each_step(
        toolchain, tmp_path, monkeypatch):
    from types import SimpleNamespace

    facts, _ = toolchain
    ticks = iter(range(100))  # an eighth of a second a step: rounding shows
    monkeypatch.setattr(smoke, "time", SimpleNamespace(perf_counter=lambda: next(ticks) / 8))
    status, reason, details = smoke.check_toolchain(facts | {"toolchain": {
        "cuda_home": facts["toolchain"]["cuda_home"]}})  # no nvcc version recorded
    assert status == smoke.PASS, reason
    log = [json.loads(line) for line in (tmp_path / "nvcc.log").read_text().splitlines()]
    assert [a[:2] for a in log] == [["-cubin", "-arch=sm_100a"], ["-cubin", "-arch=sm_120a"]]
    for a in log:
        assert a[2] == "-o" and Path(a[-1]).name == "axpy.cu"
        assert Path(a[-1]).parent.name.startswith("imgbuild-tc-")  # its own scratch directory
    assert details["nvcc"] == str(tmp_path / "cuda" / "bin" / "nvcc")
    assert details["cubins"] == {"sm100": {"seconds": 0.12, "sm": 100},
                                 "sm120": {"seconds": 0.12, "sm": 120}}  # to the hundredth
    assert details["cpp_extension"]["seconds"] == 0.1  # to the tenth
    assert reason.startswith("nvcc  compiled for sm_100a, sm_120a; ")  # no version: none said


def test_the_toolchain_stage_without_nvcc_says_where_it_looked(tmp_path, monkeypatch):
    monkeypatch.setenv("CUDA_HOME", "/usr/local/cuda")
    assert smoke.check_toolchain({"toolchain": {"cuda_home": str(tmp_path)},
                                  "archs": ["sm100"]}) == (
        smoke.FAIL, f"no nvcc at {tmp_path / 'bin' / 'nvcc'} (CUDA_HOME=/usr/local/cuda)", {})


def test_the_toolchain_stage_fails_without_a_host_compiler_or_a_loaded_function(toolchain,
                                                                                monkeypatch):
    import shutil
    import types

    import torch.utils.cpp_extension as ext

    facts, _ = toolchain
    real = shutil.which
    monkeypatch.setattr(shutil, "which", lambda n, *a, **k: None if n == "c++" else real(n))
    assert smoke.check_toolchain(facts)[:2] == (
        smoke.FAIL, "nvcc compiles, but there is no host C++ compiler for extensions")
    monkeypatch.setattr(shutil, "which", real)
    monkeypatch.setattr(ext, "load_inline", lambda **kw: types.SimpleNamespace())
    assert smoke.check_toolchain(facts)[:2] == (
        smoke.FAIL, "cpp_extension built a module without its function")


class _Spec:
    def __init__(self, name: str, work: Path | None, fails: bool = False):
        self.name, self.work, self.fails = name, work, fails

    def build(self, verbose: bool = False) -> None:
        if self.fails:
            raise RuntimeError("ninja: build stopped: subcommand failed.")
        if self.work is not None:
            (self.work / "cached_ops" / self.name).mkdir(parents=True)
            (self.work / "cached_ops" / self.name / f"{self.name}.so").write_bytes(b"")


def _flashinfer(monkeypatch, gen) -> None:
    """A stand-in for flashinfer.jit.activation (FlashInfer's JIT needs a CUDA toolkit)."""
    import sys
    import types

    act = types.ModuleType("flashinfer.jit.activation")
    if gen is not None:
        act.gen_act_and_mul_module = gen
    jit = types.ModuleType("flashinfer.jit")
    jit.activation = act
    pkg = types.ModuleType("flashinfer")
    pkg.jit = jit
    for name, mod in (("flashinfer", pkg), ("flashinfer.jit", jit),
                      ("flashinfer.jit.activation", act)):
        monkeypatch.setitem(sys.modules, name, mod)


def test_flashinfers_jit_builds_its_kernel_for_the_archs_or_the_stage_says_why(toolchain,
                                                                             monkeypatch):
    facts, _ = toolchain
    asked = []

    def gen(act):
        asked.append(act)
        return _Spec("silu_and_mul", Path(os.environ["FLASHINFER_WORKSPACE_BASE"]))
    _flashinfer(monkeypatch, gen)
    status, reason, details = smoke.check_toolchain(facts)
    assert status == smoke.PASS and asked == ["silu"]
    fi = details["flashinfer_jit"]
    assert (fi["module"], fi["arch_list"], fi["built"]) == (
        "silu_and_mul", "10.0a 12.0a", ["cached_ops/silu_and_mul/silu_and_mul.so"])
    assert reason.endswith(f"; FlashInfer JIT-compiled silu_and_mul for 10.0a 12.0a in "
                           f"{fi['seconds']} s")
    _flashinfer(monkeypatch, lambda act: _Spec("silu_and_mul", None))
    status, reason, _ = smoke.check_toolchain(facts)
    assert (status, reason) == (smoke.FAIL,
                                "FlashInfer's build of silu_and_mul left no shared object")
    _flashinfer(monkeypatch, lambda act: _Spec("silu_and_mul", None, fails=True))
    status, reason, details = smoke.check_toolchain(facts)
    assert (status, reason) == (smoke.FAIL, "FlashInfer could not JIT-compile silu_and_mul: "
                                            "ninja: build stopped: subcommand failed.")
    assert details["flashinfer_jit"] == {"error": "ninja: build stopped: subcommand failed."}
    _flashinfer(monkeypatch, None)
    status, reason, details = smoke.check_toolchain(facts)
    assert status == smoke.PASS and reason.endswith(
        "; FlashInfer JIT skipped: this FlashInfer has no gen_act_and_mul_module")
    assert details["flashinfer_jit"] == {"skipped": "no gen_act_and_mul_module"}


# --- the GPU stage on a GPU: torch.cuda and the engine stand in ----------------------------------

@pytest.fixture()
def gpu(tmp_path, monkeypatch):
    """No GPU can be reached here: torch.cuda answers as on one B200 (sm100), the serving
    engine hands back the tokens the test gives, and the checkpoint's reference is written
    as the generator writes it (prompts, their greedy tokens and margins, the tolerance)."""
    import torch

    dev = {"cap": (10, 0), "name": "NVIDIA B200"}
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda i=0: dev["cap"])
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda i=0: dev["name"])
    calls = []
    answer = {"tokens": [[5, 6, 7], [8, 9, 10]]}

    def engine_generate(engine, model_dir, prompt_ids, n):
        calls.append((engine, model_dir, prompt_ids, n))
        return answer["tokens"]
    monkeypatch.setattr(smoke, "engine_generate", engine_generate)
    ref = {"prompts": [{"input_ids": [1, 2], "generated": [5, 6, 7],
                        "generate_margins": [9.0, 9.0, 9.0]},
                       {"input_ids": [3], "generated": [8, 9, 10],
                        "generate_margins": [9.0, 0.5, 9.0]}],
           "spec": {"generate_tokens": 3}, "logits_atol": 1.0, "activations": True}
    (tmp_path / smoke.REFERENCE_DIR).mkdir()
    (tmp_path / smoke.REFERENCE_DIR / smoke.REFERENCE_JSON).write_text(json.dumps(ref))
    return tmp_path, dev, calls, answer


def test_the_gpu_stage_runs_the_engine_on_the_reference_prompts(gpu):
    model_dir, _, calls, _ = gpu
    status, reason, details = smoke.check_gpu(model_dir, {"archs": ["sm100", "sm120"]},
                                              "sglang", "require")
    assert (status, reason) == (
        smoke.PASS, "sglang on NVIDIA B200 (sm100, image arch sm100) generated the reference "
                    "tokens")
    assert calls == [("sglang", model_dir, [[1, 2], [3]], 3)]
    assert (details["gpu"], details["sm"], details["engine"]) == ("NVIDIA B200", "sm100",
                                                                  "sglang")
    assert [r["decisive"] for r in details["prompts"]] == [3, 1]


def test_the_gpu_stage_fails_on_other_tokens_another_arch_or_w4a4_without_fp4(gpu):
    model_dir, dev, calls, answer = gpu
    answer["tokens"] = [[5, 6, 7], [4, 9, 10]]
    status, reason, details = smoke.check_gpu(model_dir, {"archs": ["sm100"]}, "vllm", "auto")
    assert (status, reason) == (smoke.FAIL, "vllm on NVIDIA B200: greedy tokens differ from "
                                            "the reference")
    assert [r["match"] for r in details["prompts"]] == [True, False]
    dev.update(cap=(9, 0), name="NVIDIA H100")
    status, reason, details = smoke.check_gpu(model_dir, {"archs": ["sm100", "sm120"]},
                                              "sglang", "auto")
    assert (status, reason) == (smoke.FAIL, "NVIDIA H100 is sm90; the image is built for "
                                            "sm100, sm120")
    assert details == {"gpu": "NVIDIA H100", "sm": "sm90", "engine": "sglang"}
    calls.clear()
    status, reason, _ = smoke.check_gpu(model_dir, {"archs": ["sm90"]}, "sglang", "auto")
    assert (status, reason) == smoke.w4a4_refusal("sglang", True, (9, 0), "auto")
    assert calls == []  # refused before the engine starts


def test_which_engine_the_gpu_stage_runs_and_when(tmp_path, monkeypatch):
    asked = []
    monkeypatch.setattr(smoke, "check_gpu", lambda model, f, eng, mode: asked.append(
        (model, f.get("engine"), eng, mode)) or (smoke.PASS, "ran", {}))
    monkeypatch.setattr(smoke, "check_checkpoint", lambda m: (smoke.PASS, "cpu ok", {}))
    model = tmp_path / "model"
    model.mkdir()
    facts = tmp_path / "image.json"
    facts.write_text(json.dumps({"engine": "sglang", "archs": ["cpu"]}))
    for name in ("check_patches", "check_kernels", "check_toolchain"):
        monkeypatch.setattr(smoke, name, lambda *a: (smoke.SKIPPED, "n/a", {}))
    monkeypatch.setattr(smoke, "check_engine_schemes", lambda *a: (smoke.SKIPPED, "n/a", {}))
    off = smoke.run_smoke(None, model, facts=facts)
    assert off["stages"][-1]["reason"] == "skipped: --gpu off" and asked == []
    smoke.run_smoke(None, model, gpu="require", facts=facts)  # the image's engine
    smoke.run_smoke(None, model, gpu="auto", facts=facts, engine="vllm")  # the one asked
    smoke.run_smoke(None, model, gpu="auto")  # no facts: transformers
    assert asked == [(model, "sglang", "sglang", "require"), (model, "sglang", "vllm", "auto"),
                     (model, None, "transformers", "auto")]


def test_the_human_report_word_for_word():
    report = {"ok": True, "stages": [
        {"name": "environment", "status": smoke.PASS, "duration_s": 0.25, "reason": "all good",
         "details": {}},
        {"name": "checkpoint-cpu", "status": smoke.SKIPPED, "duration_s": 0.0,
         "reason": "no --model given", "details": {"checks": []}}]}
    assert smoke.format_human(report) == (
        "PASS    environment        0.25s  all good\n"
        "SKIPPED checkpoint-cpu     0.00s  no --model given\n"
        "smoke: ok")


# --- smokegen.py as a command: its arguments reach generate(), its words -------------------------

@pytest.fixture()
def generated(monkeypatch):
    """generate() stood in for (tests/test_smokemodel.py makes real checkpoints): what it was
    asked, and a 2.5 MB directory as its answer; or the error it is told to raise."""
    asked: dict = {}

    def generate(spec, out_dir, *, overwrite=False, key=None):
        asked.update(spec=spec, out_dir=out_dir, overwrite=overwrite, key=key)
        if asked.get("raise"):
            raise asked["raise"]
        (out_dir / "sub").mkdir(parents=True)
        (out_dir / "sub" / "model.safetensors").write_bytes(b"\0" * 2_500_000)
        return out_dir
    monkeypatch.setattr(smokegen, "generate", generate)
    return asked


def test_smokegen_hands_its_arguments_to_generate_and_says_what_it_made(tmp_path, capsys,
                                                                        generated):
    out = tmp_path / "ck"
    assert smokegen.main([str(out), "--scheme", "NVFP4A16", "--seed", "3", "--name", "x",
                          "--force", "--key", "k" * 20]) == 0
    spec = generated["spec"]
    assert (spec.scheme, spec.seed, spec.name) == ("NVFP4A16", 3, "x")
    assert (generated["out_dir"], generated["overwrite"], generated["key"]) == (out, True,
                                                                                "k" * 20)
    said = capsys.readouterr().out
    assert said.startswith(f"{out}  (2.50 MB, key {'k' * 16}, ") and said.endswith("s)\n")
    generated.clear()
    assert smokegen.main([str(tmp_path / "two")]) == 0
    assert generated["overwrite"] is False and generated["spec"] == smokegen.SmokeModelSpec()
    assert f"key {smokegen.SmokeModelSpec().key()[:16]}, " in capsys.readouterr().out


def test_smokegen_refuses_a_bad_spec_or_an_existing_directory_on_stderr(tmp_path, capsys,
                                                                        generated):
    assert smokegen.main([str(tmp_path / "ck"), "--name", "a/b"]) == 2
    got = capsys.readouterr()
    assert got.out == "" and got.err.startswith("error: name 'a/b' must be non-empty")
    generated["raise"] = FileExistsError(f"{tmp_path / 'ck'} exists; pass overwrite=True (CLI: "
                                         "--force) to replace it")
    assert smokegen.main([str(tmp_path / "ck")]) == 2
    got = capsys.readouterr()
    assert got.out == "" and got.err == (f"error: {tmp_path / 'ck'} exists; pass overwrite=True "
                                         "(CLI: --force) to replace it\n")


@pytest.mark.parametrize("argv, said", [
    (["--help"], None),
    (["out", "--scheme", "INT4"], "invalid choice: 'INT4'"),
    (["out", "--seed", "x"], "invalid int value: 'x'"),
])
def test_smokegens_usage_and_what_it_refuses_before_anything_is_made(capsys, generated, argv,
                                                                     said):
    with pytest.raises(SystemExit) as e:
        smokegen.main(argv)
    got = capsys.readouterr()
    if said is None:
        assert e.value.code == 0
        assert got.out.startswith("usage: smokegen.py ")
        for words in ("Generate the NVFP4 smoke checkpoint", "directory to create",
                      "replace out_dir if it exists", "{FP8-ATTN+NVFP4-MLP,NVFP4,NVFP4A16}"):
            assert words in " ".join(got.out.split()), words
    else:
        assert e.value.code == 2 and said in got.err
    assert generated == {}


# --- smoke.py as the image runs it: its stages' plain data, its usage ---------------------------

def test_the_cpu_stages_report_each_missing_input_and_what_they_ran(tmp_path, monkeypatch):
    for var in ("HF_HUB_OFFLINE", "TOKENIZERS_PARALLELISM"):
        monkeypatch.delenv(var, raising=False)
    ran = []
    monkeypatch.setattr(smoke, "check_checkpoint", lambda model: (
        ran.append(model) or (smoke.PASS, "loads", {"model": str(model)})))
    report = smoke._run_cpu_stages(tmp_path / "no-lock.txt", tmp_path / "no-model")
    assert [(s["name"], s["status"], s["reason"]) for s in report["stages"]] == [
        ("environment", smoke.FAIL, f"lock file {tmp_path / 'no-lock.txt'} not found"),
        ("checkpoint-cpu", smoke.FAIL, f"model directory {tmp_path / 'no-model'} not found")]
    assert report["ok"] is False and ran == []
    # the image has no network: nothing may try the hub
    assert (os.environ["HF_HUB_OFFLINE"], os.environ["TOKENIZERS_PARALLELISM"]) == ("1", "false")
    (tmp_path / "model").mkdir()
    report = smoke._run_cpu_stages(None, tmp_path / "model")
    assert ran == [tmp_path / "model"]
    assert report["stages"][1]["details"] == {"model": str(tmp_path / "model")}
    assert report["ok"] is True


def test_a_stage_is_timed_from_its_start_to_its_end(monkeypatch):
    from types import SimpleNamespace

    clock = iter([100.0, 100.25])
    monkeypatch.setattr(smoke, "time", SimpleNamespace(perf_counter=lambda: next(clock)))
    got = smoke._stage("x", lambda: (smoke.PASS, "ok", {}))
    assert got == {"name": "x", "status": smoke.PASS, "reason": "ok", "duration_s": 0.25,
                   "details": {}}


def test_the_gpu_stage_skips_in_its_own_words(monkeypatch, tmp_path):
    import builtins

    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert smoke.check_gpu(tmp_path, {}, "sglang", "auto") == (smoke.SKIPPED, "skipped: no GPU",
                                                               {})
    real = builtins.__import__

    def no_torch(name, *a, **kw):
        if name == "torch":
            raise ImportError(name)
        return real(name, *a, **kw)
    monkeypatch.setattr(builtins, "__import__", no_torch)
    assert smoke.check_gpu(tmp_path, {}, "sglang", "auto") == (
        smoke.SKIPPED, "skipped: no torch in the image", {})


def test_the_engine_scheme_stage_names_the_engine_it_skips_for(tmp_path):
    assert smoke.check_engine_schemes(None, {}, tmp_path)[:2] == (
        smoke.SKIPPED, "skipped: no serving engine in this image (none)")
    assert smoke.check_engine_schemes(None, {"engine": "transformers"}, tmp_path)[:2] == (
        smoke.SKIPPED, "skipped: no serving engine in this image (transformers)")


def test_smokes_usage_says_each_option(capsys):
    with pytest.raises(SystemExit) as e:
        smoke.main(["--help"])
    out = " ".join(capsys.readouterr().out.split())
    assert e.value.code == 0
    for words in ("smoke checkpoint directory (with imgbuild-reference/)",
                  "print the report as JSON", "--gpu {auto,off,require}",
                  "stage 4, the engine on a GPU: auto runs it where a GPU is, require fails "
                  "without one", "the image's facts (archs, engine)",
                  "--engine {sglang,vllm,transformers}"):
        assert words in out, words


def test_smoke_reads_its_model_as_a_path(tmp_path, capsys):
    assert smoke.main(["--model", str(tmp_path / "absent"), "--json"]) == 1
    report = json.loads(capsys.readouterr().out)
    [stage] = [s for s in report["stages"] if s["name"] == "checkpoint-cpu"]
    assert stage["reason"] == f"model directory {tmp_path / 'absent'} not found"
