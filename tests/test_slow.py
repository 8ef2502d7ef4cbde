"""The slow group (`make test-slow`): what downloads gigabytes. A real SGLang image, slim
flavor, built from the committed lock (about 5 GB of wheels from PyPI) and smoke-tested: on a
machine without a GPU the GPU stage says "skipped: no GPU", and every other stage passes."""

from __future__ import annotations

import json

import pytest

from .conftest import run_imgbuild

pytestmark = [pytest.mark.slow, pytest.mark.live, pytest.mark.docker]


def test_the_sglang_slim_image_builds_and_passes_its_smoke_test(docker_client):
    r = run_imgbuild("sglang-blackwell-slim", "--json", timeout=3600)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    out = json.loads(r.stdout)
    smoke = out["smoke"]
    assert smoke["ok"] is True, smoke
    stages = {s["name"]: s for s in smoke["stages"]}
    # Without a GPU, the GPU stage says so; with one, it runs and passes.
    assert stages["gpu-engine"]["status"] in ("pass", "skipped")
    if stages["gpu-engine"]["status"] == "skipped":
        assert stages["gpu-engine"]["reason"] == "skipped: no GPU"
    # What runs on CPU inside the image passes: the locked versions, the kernel files
    # scanned, the smoke checkpoint through compressed-tensors.
    for name in ("environment", "kernels", "checkpoint-cpu", "engine-schemes"):
        assert stages[name]["status"] == "pass", stages[name]
    # SGLang 0.5.23's own scheme choice, every layer of the four checkpoints on both archs.
    schemes = stages["engine-schemes"]["details"]["checkpoints"]
    assert sorted(schemes) == ["ignore-parent", "mixed-precision", "moe", "smoke-model"]
    assert all(c["mismatches"] == [] and c["modules_checked"] > 0 for c in schemes.values())
    assert out["size_bytes"] > 5e9  # the real engine, not a stand-in
