"""The command the project exists for, on this machine: `imgbuild sglang-blackwell --model k2.6`
plans, locks, builds (devel flavor: Debian base, CUDA toolkit from NVIDIA's wheels), smoke-tests
and tags, from Debian's mirror and PyPI alone. Slow: an 11 GB image (make test-slow)."""

from __future__ import annotations

import json

import pytest

from .conftest import docker_available, run_imgbuild

pytestmark = [pytest.mark.slow, pytest.mark.docker,
              pytest.mark.skipif(not docker_available(), reason="skipped: no Docker Engine")]


def test_the_headline_command_builds_smokes_and_tags_here(docker_client):
    r = run_imgbuild("sglang-blackwell", "--model", "k2.6", "--json", timeout=3600)
    assert r.returncode == 0, r.stderr[-3000:]
    d = json.loads(r.stdout)
    stages = {s["name"]: s for s in d["smoke"]["stages"]}
    for name in ("environment", "kernels", "toolchain", "checkpoint-cpu", "engine-schemes"):
        assert stages[name]["status"] == "pass", (name, stages[name]["reason"])
    tc = stages["toolchain"]["details"]
    assert {a: c["sm"] for a, c in tc["cubins"].items()} == {"sm100": 100, "sm120": 120}
    assert tc["cpp_extension"]["loaded"] and tc["cpp_extension"]["arch_list"] == "10.0;12.0"
    assert tc["flashinfer_jit"]["built"] and tc["flashinfer_jit"]["arch_list"] == "10.0a 12.0a"
    assert stages["kernels"]["details"]["files"] >= 3  # torch, sglang-kernel's, the shown ones
    gpu = stages["gpu-engine"]
    assert gpu["status"] in ("pass", "skipped"), gpu["reason"]
    if gpu["status"] == "skipped":
        assert gpu["reason"].endswith("no GPU")
    img = docker_client.images.get(d["content_tag"])
    labels = img.labels
    assert labels["io.imgbuild.flavor"] == "devel"
    assert "sglang-kernel=sass" in labels["io.imgbuild.kernels.sm120"]
    assert "torch=sass" in labels["io.imgbuild.kernels.sm100"]
    env = dict(e.split("=", 1) for e in img.attrs["Config"]["Env"])
    assert env["CUDA_HOME"].endswith("/site-packages/nvidia/cu13")
    assert env["PATH"].startswith(env["CUDA_HOME"] + "/bin:")
    assert set(d["refs"]) >= {"imgbuild:sglang-blackwell-k2.6",
                              "imgbuild:sglang-blackwell-k2.6-sglang0.5.23"}
