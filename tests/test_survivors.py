"""Behaviours that deliberate one-line bugs once got past every test (the mutation-testing
issue): each test here fails on that bug. Offline: real wheels on a local pypiserver, the CLI
as a subprocess, the Engine where an image is needed."""

from __future__ import annotations

import importlib
import json
import uuid
from pathlib import Path

import docker
import pytest

from imgbuild.checks import checkmodel as cm
from imgbuild.checks import drift
from imgbuild.errors import JobFailed
from imgbuild.plan import render
from imgbuild.plan.decide import make_plan
from imgbuild.workspace import Workspace

from .conftest import REGISTRY_HOST, ROOT, registry_available, run_imgbuild
from .test_drift import ENGINE, FAMILY_YAML, env, index, lock_of  # noqa: F401 (fixtures)
from .wheelfactory import WheelSpec

WS = Workspace(ROOT / "images", ROOT / "lockfiles")


# 1. `--no-smoke` must hold the moving tags (pipeline/build.py, the gate's `held` branch).

@pytest.mark.docker
def test_no_smoke_moves_no_tag(docker_client):
    if not registry_available():
        pytest.skip(f"skipped: no registry on {REGISTRY_HOST} (make services starts one)")
    repo_name = f"{REGISTRY_HOST}/imgbuild-nosmoke-{uuid.uuid4().hex[:8]}"
    r = run_imgbuild("tiny-cpu", "--no-smoke", "--json", "--push", "--registry", repo_name)
    assert r.returncode == 0, r.stderr[-2000:]
    out = json.loads(r.stdout)
    assert out["moved"] == [] and "--no-smoke" in out["held"]
    assert [p.split("@")[0] for p in out["pushed"]] == [out["content_tag"]]
    from imgbuild.image.registry import Repository, manifest_digest

    repo = Repository.parse(repo_name)
    assert manifest_digest(repo, out["content_tag"].rsplit(":", 1)[1]) is not None
    for moving in ("tiny-cpu", "tiny-cpu-transformers5.17.0"):
        assert manifest_digest(repo, moving) is None
        with pytest.raises(docker.errors.ImageNotFound):
            docker_client.images.get(f"{repo_name}:{moving}")


# 2. The patch step fails the build when a patch does not apply (no `|| true`, no `;`).

def test_the_patch_step_fails_with_the_patcher():
    plan = make_plan(WS, "sglang-0516-blackwell", resolve=False)
    assert plan.patch_digest
    [step] = [ln for ln in render.dockerfile(plan).splitlines() if "patcher.py" in ln]
    assert step == f"RUN {render.VENV}/bin/python /opt/imgbuild/patcher.py --patches " \
                   "/opt/imgbuild/patches --report /opt/imgbuild/patches.json"
    # The shell form runs `/bin/sh -c STEP`: the step's status is the patcher's only when
    # nothing follows it.
    assert not any(tok in step for tok in ("||", ";", "&", "|", "exit 0", "true"))


# 3. check-model judges the ignore list under the suffix matcher too (SGLang >= 0.5.17).

NVFP4 = {"num_bits": 4, "type": "float", "strategy": "tensor_group", "group_size": 16}


def test_a_suffix_entry_that_dequantizes_two_modules_is_found_on_0523(tmp_path):
    d = tmp_path / "ck"
    d.mkdir()
    mods = [f"model.layers.{i}.self_attn.{p}" for i in range(2) for p in ("q_proj", "k_proj")]
    (d / "config.json").write_text(json.dumps({"architectures": ["LlamaForCausalLM"],
                                               "quantization_config": {
        "quant_method": "compressed-tensors", "format": "nvfp4-pack-quantized",
        "ignore": ["lm_head", "q_proj"],
        "config_groups": {"g": {"targets": ["Linear"], "weights": NVFP4,
                                "input_activations": NVFP4}}}}))
    (d / "model.safetensors.index.json").write_text(json.dumps({"weight_map": {
        f"{m}.{t}": "model.safetensors" for m in mods for t in ("weight_packed",
                                                                 "weight_scale")}}))
    rep = cm.check_model(WS, str(d), "sglang-blackwell",
                         ct_formats={"nvfp4-pack-quantized"})
    assert rep.behaviour.version == "0.5.23"
    [f] = [f for f in rep.findings if f.kind == "ignore-parent"]
    assert f.severity == "error" and any(e.startswith("q_proj (suffix) hides 2")
                                         for e in f.examples)
    assert rep.analysis.matcher == "suffix"
    assert set(rep.analysis.hidden) == {"model.layers.0.self_attn.q_proj",
                                      "model.layers.1.self_attn.q_proj"}


# 4. The drift check scans every locked consumer, not the first.

def test_drift_scans_every_locked_consumer(index, env, tmp_path):  # noqa: F811
    idx, w = index
    eng2 = idx.add(WheelSpec("eng2", "1.0.0", requires=("ctensors",), files={
        "eng2/__init__.py": "",
        "eng2/glue.py": ENGINE.replace("Fmt.nvfp4", "Fmt.mxfp8").replace("Engine", "Other")}))
    d = tmp_path / "images" / "checks"
    d.mkdir(parents=True)
    (d / "drift.yaml").write_text(FAMILY_YAML.replace("consumers: [eng, absent-engine]",
                                                      "consumers: [eng, eng2]"))
    from imgbuild.catalog.families import load_families

    families = load_families(tmp_path / "images")
    lock = lock_of(tmp_path, {
        "ctensors": ("0.1.0", w["old"], ["eng", "eng2"]),
        "eng": ("1.0.0", w["eng"], ["-r requirements.in"]),
        "eng2": ("1.0.0", eng2, ["-r requirements.in"]),
    })
    found = drift.check(lock, families, index_urls=[idx.url])
    assert {(f.consumer, f.symbol) for f in found} == {("eng", "nvfp4"), ("eng2", "mxfp8")}


# 5. The proof of `--fix` can fail: a rewrite that ignores other modules is refused.

def test_the_fix_proof_refuses_a_rewrite_that_ignores_other_modules(monkeypatch):
    names = [f"model.layers.{i}.mlp.{p}" for i in range(3) for p in ("gate_proj", "up_proj")]
    config = {"quantization_config": {"quant_method": "compressed-tensors",
                                      "ignore": ["model.layers.0.mlp"], "config_groups": {}}}
    good = cm.fix(config, names, "substring", quantized=names)
    assert good.proof.equal and good.added == (r"re:^model\.layers\.0\.mlp$",)
    fixmod = importlib.import_module("imgbuild.checks.checkmodel.fix")  # the module, not fix()

    # A rewrite one character too loose: `.` unescaped, anchored at the start only.
    monkeypatch.setattr(fixmod, "collapse", lambda entries: [r"^model.layers.0.mlp"])
    with pytest.raises(JobFailed) as e:
        cm.fix(config, names, "substring", quantized=names)
    assert "would not ignore the same modules" in e.value.message
    monkeypatch.setattr(fixmod, "collapse", lambda entries: [r"^model\.layers\.1\.mlp$"])
    with pytest.raises(JobFailed):
        cm.fix(config, names, "substring", quantized=names)


def test_survivor_tests_read_the_checkout():
    assert (ROOT / "images" / "sglang-0516-blackwell.yaml").is_file()
    assert Path(render.PAYLOAD_DIR).is_dir()
