"""`imgbuild lock` / `lock --check` / `check-deps` as a user runs them."""

from __future__ import annotations

import json
import shutil

import pytest

from .conftest import ROOT, run_imgbuild
from .wheelfactory import LocalIndex, WheelSpec


@pytest.fixture()
def fake_images(tmp_path):
    """A catalog with one target whose packages all live on a local index."""
    images = tmp_path / "images"
    (images / "models").mkdir(parents=True)
    for data in ("bases.yaml", "gpus.yaml", "cuda.yaml"):
        shutil.copy(ROOT / "images" / data, images)
    shutil.copy(ROOT / "images" / "models" / "tiny-nvfp4.yaml", images / "models")
    shutil.copytree(ROOT / "images" / "generators", images / "generators")
    (images / "fake.yaml").write_text(
        "engine: {name: sglang, version: '0.5.23'}\narchs: [sm100]\nos: debian-bookworm\n"
        "flavor: slim\nrequirements: [ctensors]\n")
    return images


@pytest.fixture()
def index(tmp_path):
    ix = LocalIndex(tmp_path / "index")
    ix.add(WheelSpec("sglang", "0.5.23", requires=("ctensors>=0.10",)))
    ix.add(WheelSpec("ctensors", "0.10.0"))
    ix.start()
    yield ix
    ix.stop()


def test_lock_check_reports_a_stale_lock_with_its_diff(fake_images, index, tmp_path):
    env = {"UV_INDEX_URL": index.url, "UV_NO_CACHE": "1"}
    r = run_imgbuild("lock", "fake", "--images", str(fake_images), "--json", env=env)
    assert r.returncode == 0, r.stderr
    [entry] = json.loads(r.stdout)["locks"]
    assert entry["written"] is True
    lock_path = fake_images.parent / "lockfiles" / "fake.py3.11-manylinux_2_36-x86_64.txt"
    before = lock_path.read_bytes()
    assert b"ctensors==0.10.0" in before
    r = run_imgbuild("lock", "--all", "--check", "--images", str(fake_images), env=env)
    assert r.returncode == 0 and "fresh" in r.stdout
    index.add(WheelSpec("ctensors", "0.11.0"))  # upstream releases: news, not drift
    r = run_imgbuild("lock", "--all", "--check", "--images", str(fake_images), env=env)
    assert r.returncode == 0 and "fresh" in r.stdout
    # The spec changes (a floor the lock no longer meets): the lock is stale.
    spec = fake_images / "fake.yaml"
    spec.write_text(spec.read_text().replace("[ctensors]", "['ctensors>=0.11']"))
    r = run_imgbuild("lock", "--all", "--check", "--images", str(fake_images), "--json", env=env)
    assert r.returncode == 1
    doc = json.loads(r.stdout)
    assert doc["stale"] == ["fake"]
    diff = doc["locks"][0]["diff"]
    assert "-ctensors==0.10.0 \\" in diff and "+ctensors==0.11.0 \\" in diff
    assert lock_path.read_bytes() == before  # --check never writes


def test_lock_reports_removable_override(fake_images, index):
    spec = fake_images / "fake.yaml"
    spec.write_text(spec.read_text() + "overrides:\n  - requirement: ctensors>=0.10\n"
                    "    reason: NVFP4 needs nvfp4_pack_quantized\n")
    env = {"UV_INDEX_URL": index.url, "UV_NO_CACHE": "1"}
    r = run_imgbuild("lock", "fake", "--images", str(fake_images), "--json", env=env)
    assert r.returncode == 0, r.stderr
    [ov] = json.loads(r.stdout)["locks"][0]["overrides"]
    assert ov["needed"] is False and "removable" in ov["effect"]
    assert ov["reason"] == "NVFP4 needs nvfp4_pack_quantized"
    r = run_imgbuild("lock", "fake", "--images", str(fake_images), env=env)
    assert "removable" in r.stdout


def test_lock_of_unresolvable_target_fails_without_writing(fake_images, index):
    spec = fake_images / "fake.yaml"
    spec.write_text(spec.read_text().replace("[ctensors]", "['ctensors<0.10']"))
    env = {"UV_INDEX_URL": index.url, "UV_NO_CACHE": "1"}
    r = run_imgbuild("lock", "fake", "--images", str(fake_images), env=env)
    assert r.returncode == 1, r.stderr
    assert "sglang==0.5.23 requires ctensors>=0.10" in r.stderr
    assert "you require ctensors<0.10" in r.stderr
    assert "Traceback" not in r.stderr
    assert not (fake_images.parent / "lockfiles").exists() or \
        not list((fake_images.parent / "lockfiles").iterdir())


@pytest.mark.live
def test_check_deps_catches_the_real_nvfp4_failure(tmp_path):
    """SGLang 0.5.10 (compressed-tensors unpinned) locked beside compressed-tensors 0.8.1,
    vLLM 0.6.6's pin: the image would die at model load; check-deps says so first."""
    images = tmp_path / "images"
    shutil.copytree(ROOT / "images", images)
    (images / "sglang-old.yaml").write_text(
        "engine: {name: sglang, version: '0.5.10'}\narchs: [sm100]\nos: debian-bookworm\nflavor: slim\n"
        "requirements: ['compressed-tensors==0.8.1']\nsmoke: {model: tiny-nvfp4}\n")
    r = run_imgbuild("check-deps", "sglang-old", "--images", str(images))
    assert r.returncode == 1, r.stderr
    # The findings are check-deps' report: stdout.
    assert "CompressionFormat.nvfp4_pack_quantized" in r.stdout
    assert "sglang/srt/layers/quantization/compressed_tensors/utils.py:" in r.stdout
    assert "0.10.0" in r.stdout and "0.8.1" in r.stdout
    # plan says it too, and a build refuses to start (before any Docker work).
    r = run_imgbuild("plan", "sglang-old", "--images", str(images), "--json")
    assert r.returncode == 1
    assert json.loads(r.stdout)["checks"]["ok"] is False
    r = run_imgbuild("sglang-old", "--images", str(images),
                     env={"DOCKER_HOST": "unix:///nonexistent.sock"})
    assert r.returncode == 1 and "nvfp4_pack_quantized" in r.stderr


@pytest.mark.live
def test_check_deps_clean_for_shipped_targets():
    for t in ("sglang-blackwell", "vllm-blackwell", "sglang-vllm-blackwell"):
        r = run_imgbuild("check-deps", t, "--model", "k2.6", "--json")
        assert r.returncode == 0, r.stdout + r.stderr
        assert json.loads(r.stdout)["ok"] is True


@pytest.mark.live
def test_broken_image_sglang_with_compressed_tensors_081_is_refused_before_building(tmp_path):
    """Issue 6's first broken image: SGLang 0.5.23 with compressed-tensors 0.8.1 forced in
    (vLLM 0.6.6's pin). The build stops at the drift check, naming nvfp4_pack_quantized, before
    any Docker work (no daemon is even asked)."""
    images = tmp_path / "images"
    shutil.copytree(ROOT / "images", images)
    (images / "sglang-ct081.yaml").write_text(
        "engine: {name: sglang, version: '0.5.23'}\narchs: [sm100, sm120]\n"
        "os: debian-bookworm\nflavor: slim\nsmoke: {model: tiny-nvfp4}\n"
        "overrides:\n  - requirement: compressed-tensors==0.8.1\n"
        "    reason: vLLM 0.6.6's pin, the combination that must be refused\n")
    r = run_imgbuild("sglang-ct081", "--images", str(images),
                     env={"DOCKER_HOST": "unix:///nonexistent.sock"})
    assert r.returncode == 1, r.stderr
    assert "CompressionFormat.nvfp4_pack_quantized" in r.stderr
    assert "sglang/srt/layers/quantization/compressed_tensors/utils.py:" in r.stderr
    assert "an override in images/sglang-ct081.yaml" in r.stderr
    assert "'compressed-tensors>=0.10.0'" in r.stderr
