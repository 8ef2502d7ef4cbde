"""Decision tests for `imgbuild preflight TARGET|IMAGE` (imgbuild/pipeline/preflight.py): which
image a TARGET stands for (its model, its archs, this host's platform where the target has it),
what the report names as judged, where --model is refused, and that the model directory and
the nvidia-smi to run reach the host side.

No Engine and no GPU: nvidia-smi is a script that answers with the recorded output of a real
host (tests/fixtures/nvidia-smi/rtx-pro-6000-8x-ok: 8 RTX PRO 6000, sm120, driver 580.65.06).
"""

from __future__ import annotations

import stat
from pathlib import Path

import pytest

from imgbuild.errors import InputError
from imgbuild.payload.preflight import ModelFacts
from imgbuild.pipeline import preflight as pipeline

RECORDED = Path(__file__).parent / "fixtures" / "nvidia-smi" / "rtx-pro-6000-8x-ok"


@pytest.fixture
def nvidia_smi(tmp_path: Path) -> str:
    """An nvidia-smi that answers the two queries from the recording."""
    script = tmp_path / "nvidia-smi"
    script.write_text(
        "#!/bin/sh\n"
        'for a in "$@"; do case "$a" in\n'
        f"  --query-gpu=*) cat '{RECORDED / 'gpus.csv'}'; exit 0;;\n"
        f"  --query-compute-apps=*) cat '{RECORDED / 'apps.csv'}'; exit 0;;\n"
        "esac; done\nexit 2\n")
    script.chmod(script.stat().st_mode | stat.S_IXUSR)
    return str(script)


def verdicts(p: pipeline.Preflight) -> dict:
    return {v.check: v for v in p.report.verdicts}


def test_a_target_is_judged_as_the_image_its_plan_makes(ws, nvidia_smi, tmp_path):
    model_dir = tmp_path / "models"
    p = pipeline.preflight(ws, "sglang-blackwell", model="tiny-nvfp4", archs=("sm120",),
                           model_dir=str(model_dir), nvidia_smi=nvidia_smi)
    # --model and --arch are the plan's: the image judged serves tiny-nvfp4, built for sm120.
    assert p.subject == "target sglang-blackwell --model tiny-nvfp4"
    assert p.report.image.archs == ("sm120",)
    assert p.report.image.model is not None and p.report.image.model.alias == "tiny-nvfp4"
    v = verdicts(p)
    # The nvidia-smi given is the one run: the recorded host's 8 GPUs.
    assert "8 GPU(s): NVIDIA RTX PRO 6000" in v["nvidia-smi"].detail
    assert v["arch"].status == "pass"
    # The model directory given is the one measured (at its nearest existing parent).
    assert f"free at {tmp_path}" in v["disk"].detail


def test_without_model_or_arch_the_targets_own_are_judged(ws, nvidia_smi, tmp_path):
    p = pipeline.preflight(ws, "sglang-blackwell", model_dir=str(tmp_path), nvidia_smi=nvidia_smi)
    assert p.subject == "target sglang-blackwell --model k2.6"  # the target's default model
    assert p.report.image.archs == ("sm100", "sm120")
    assert p.report.image.model == ModelFacts("k2.6", 595.0, 8)


def test_a_target_without_a_model_is_named_alone(ws, tmp_path):
    p = pipeline.preflight(ws, "tiny-cpu", model_dir=str(tmp_path),
                           nvidia_smi=str(tmp_path / "no-nvidia-smi"))
    assert p.subject == "target tiny-cpu"
    assert p.report.image.model is None


def test_the_host_platform_picks_the_targets_image_for_it(ws, tmp_path, monkeypatch):
    # An arm64 host judges tiny-cpu-multi's arm64 image, not the first platform's.
    monkeypatch.setattr(pipeline, "host_platform", lambda: "linux/arm64")
    p = pipeline.preflight(ws, "tiny-cpu-multi", model_dir=str(tmp_path),
                           nvidia_smi=str(tmp_path / "no-nvidia-smi"))
    assert p.report.image.cpu_arch == "aarch64"
    monkeypatch.setattr(pipeline, "host_platform", lambda: "linux/amd64")
    p = pipeline.preflight(ws, "tiny-cpu-multi", model_dir=str(tmp_path),
                           nvidia_smi=str(tmp_path / "no-nvidia-smi"))
    assert p.report.image.cpu_arch == "x86_64"
    # A target with no image for this host's platform is judged as the one it has: the cpu
    # check then says this host cannot run it.
    monkeypatch.setattr(pipeline, "host_platform", lambda: "linux/arm64")
    p = pipeline.preflight(ws, "tiny-cpu", model_dir=str(tmp_path),
                           nvidia_smi=str(tmp_path / "no-nvidia-smi"))
    assert p.report.image.cpu_arch == "x86_64"


def test_model_with_an_image_is_refused_with_the_way_out(ws):
    with pytest.raises(InputError) as e:
        pipeline.preflight(ws, "registry.example/team/img:tag", model="k2.6")
    assert str(e.value) == ("--model goes with a target; an image carries its model in its "
                            "labels")
    assert e.value.hint == "`imgbuild preflight TARGET --model k2.6`"


def test_an_image_is_judged_by_its_labels_with_the_same_host_inputs(ws, monkeypatch):
    # The image side reads labels through the Engine (tests/test_preflight.py, with a client
    # of recorded labels); here only what this layer hands it.
    seen = {}

    def host_side(ref, *, model_dir=None, nvidia_smi=None):
        seen.update(ref=ref, model_dir=model_dir, nvidia_smi=nvidia_smi)
        return "report"

    monkeypatch.setattr(pipeline, "preflight_image", host_side)
    p = pipeline.preflight(ws, "registry.example/team/img:tag", model_dir="/models",
                           nvidia_smi="/usr/bin/nvidia-smi")
    assert p == pipeline.Preflight("registry.example/team/img:tag", "report")
    assert seen == {"ref": "registry.example/team/img:tag", "model_dir": "/models",
                    "nvidia_smi": "/usr/bin/nvidia-smi"}
