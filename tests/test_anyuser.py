"""Images that run as any user on a read-only root (restricted pods, OpenShift): the smoke
test runs as UID 1000770000 with group 0, `--read-only`, /tmp the one writable place, no
capabilities, and its any-user stage says what was checked; the same run fails when a cache is
left under a root-owned directory, so the check can fail."""

from __future__ import annotations

import io
import json

import pytest

from imgbuild.image import smoke
from imgbuild.plan import labels, render
from imgbuild.plan.labels import ANY_USER

from .conftest import run_imgbuild

pytestmark = pytest.mark.docker

SMOKE_ARGS = ["--lock", f"{render.ASSETS}/lock.txt", "--model", f"{render.ASSETS}/smoke-model",
              "--facts", f"{render.ASSETS}/image.json", "--gpu", "off"]


@pytest.fixture(scope="module")
def tiny(docker_client) -> dict:
    r = run_imgbuild("build", "tiny-cpu", "--json")
    assert r.returncode == 0, r.stderr[-3000:]
    return json.loads(r.stdout)


def test_tiny_cpu_smoke_passes_as_any_user_on_a_read_only_root(tiny, docker_client):
    stages = {s["name"]: s for s in tiny["smoke"]["stages"]}
    stage = stages[smoke.ANY_USER_STAGE]
    assert stage["status"] == "pass", stage["reason"]
    assert ANY_USER in stage["reason"] and "read-only root" in stage["reason"]
    checks = {c["name"]: c for c in stage["checks"]}
    # Who it ran as, getpass answering for a UID with no passwd entry.
    assert "uid 1000770000 gid 0" in checks["user"]["reason"]
    # Every cache and JIT directory resolved under /tmp and written.
    writable = {k: c for k, c in checks.items() if k.startswith("writable:")}
    assert len(writable) >= 10 and all(c["status"] == "pass" for c in writable.values())
    assert all("/tmp" in c["reason"] for c in writable.values())
    assert checks["import:transformers"]["status"] == "pass"
    assert checks["preflight"]["status"] == "pass"
    # The smoke payload's stages ran in the same container, as that user: the checkpoint
    # loaded and matched.
    assert stages["checkpoint-cpu"]["status"] == "pass"
    labels = docker_client.images.get(tiny["content_tag"]).labels
    assert labels["io.imgbuild.user"].startswith("0:0")
    assert labels["io.imgbuild.writable"] == "/tmp,HF_HOME"


@pytest.mark.parametrize("env,check", [
    ({"TRITON_CACHE_DIR": "/opt/venv/triton-cache"}, "writable:triton"),
    ({"HOME": "/root"}, "writable:home"),
    ({"XDG_CACHE_HOME": "/opt/imgbuild/cache"}, "writable:xdg-cache"),
])
def test_a_cache_under_a_root_owned_directory_fails_the_stage(tiny, env, check):
    stage = smoke.any_user(tiny["content_tag"], "transformers",
                           [*SMOKE_ARGS, "--engine", "transformers"], env=env)
    assert stage["status"] == "fail"
    failed = {c["name"]: c for c in stage["checks"] if c["status"] != "pass"}
    assert check in failed, stage["reason"]
    path = next(iter(env.values()))
    assert path in failed[check]["reason"] and path in stage["reason"]


def test_a_root_only_image_is_smoke_tested_as_root_and_says_the_stage_was_skipped(
        tiny, docker_client):
    """A target whose image cannot run as any user says why (smoke.root_only); the image's
    io.imgbuild.user label carries it, so the smoke test of the image (built here or pulled)
    runs the payload as root and reports the any-user stage skipped, with that reason."""
    reason = "the engine writes its kernels beside its own modules (upstream issue 123)"
    dockerfile = (f"FROM {tiny['content_tag']}\n"
                  f'LABEL io.imgbuild.user="{labels.user_label(reason)}"\n')
    image, _ = docker_client.images.build(fileobj=io.BytesIO(dockerfile.encode()),
                                          tag="imgbuild-test-root-only:1", rm=True)
    try:
        report = smoke.run("imgbuild-test-root-only:1", gpu="off")
    finally:
        docker_client.images.remove(image.id, force=True)
    stages = {s["name"]: s for s in report.stages}
    stage = stages[smoke.ANY_USER_STAGE]
    assert stage["status"] == "skipped", stage
    assert reason in stage["reason"] and "uid 0 gid 0" in stage["reason"]
    assert stages["checkpoint-cpu"]["status"] == "pass"
    assert report.ok  # a skipped stage the target asked for does not fail the image


@pytest.mark.slow
def test_the_headline_image_passes_as_any_user(docker_client):
    """sglang-blackwell (SGLang 0.5.23, 11 GB): its engine imports and its smoke payload runs
    as any user on a read-only root (no GPU here: the GPU stage is skipped, said so)."""
    r = run_imgbuild("build", "sglang-blackwell", "--json", timeout=3600)
    assert r.returncode == 0, r.stderr[-3000:]
    stages = {s["name"]: s for s in json.loads(r.stdout)["smoke"]["stages"]}
    stage = stages[smoke.ANY_USER_STAGE]
    assert stage["status"] == "pass", stage["reason"]
    assert {c["name"]: c["status"] for c in stage["checks"]}["import:sglang"] == "pass"
