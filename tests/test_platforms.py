"""arm64 (Grace Blackwell, DGX Spark): targets for aarch64 locked for aarch64 wheels, planned on
an arm64 base made here, their GPU code read from the aarch64 wheels (which differ from the
x86_64 ones), and a clear answer where this machine cannot build them."""

from __future__ import annotations

import json

import pytest

from builder.payload import preflight as pf
from builder.payload.preflight import PASS
from builder.plan.decide import make_plan
from builder.plan.labels import facts_from_plan

from .conftest import ROOT, docker_available, run_imgbuild

FIXTURES = ROOT / "tests" / "fixtures" / "nvidia-smi"
ARM64 = ("sglang-gb200", "sglang-dgx-spark")


def test_a_bootstrapped_base_is_made_per_cpu(ws):
    amd64 = ws.catalog.base("debian-bookworm")
    arm64 = ws.catalog.base("debian-bookworm", "aarch64")
    assert (amd64.platform, arm64.platform) == ("linux/amd64", "linux/arm64")
    assert arm64.image == amd64.image + "-aarch64"
    recorded = ws.catalog.bases["debian-bookworm"].bootstrap
    assert arm64.bootstrap["rootfs"] == recorded["rootfs_aarch64"] != recorded["rootfs"]
    assert amd64.bootstrap["rootfs"] == recorded["rootfs"]
    # A pulled base is one multi-platform name: the same tag for every CPU.
    assert ws.catalog.base("ubuntu24.04", "aarch64").image == "ubuntu:24.04"


@pytest.mark.parametrize("name", ARM64)
def test_arm64_targets_are_locked_and_planned_for_aarch64(ws, name):
    ref = ws.target(name)
    assert ref.lock_path.name == f"{name}.py3.11-manylinux_2_36-aarch64.txt"
    assert ref.request.uv_platform == "aarch64-manylinux_2_36"
    p = make_plan(ws, name, resolve=False)
    arm64 = ws.catalog.base("debian-bookworm", "aarch64")
    assert p.cpu_arch == "aarch64" and p.platform_tag == "manylinux_2_36_aarch64"
    assert p.base_image == arm64.image and p.base_digest == arm64.bootstrap["rootfs"]
    assert p.cuda == "13.0" and p.nvcc.startswith("13.0.")
    for arch, rows in p.kernel_coverage:
        rows = dict(rows)
        assert rows["torch"] == rows["sglang-kernel"] == "sass", arch
    # The wheels read are the aarch64 ones.
    record = json.loads(ref.lock_path.with_name(ref.lock_path.stem + ".kernels.json").read_text())
    assert record["packages"]["torch"]["wheel"].endswith("_aarch64.whl")


def test_coverage_is_read_per_platform():
    # sglang-kernel 0.4.10: x86_64 common_ops carries sm_120a, nothing for sm121; the aarch64
    # wheel carries sm_121a. DGX Spark is arm64: its target plans, the x86_64 one is refused.
    r = run_imgbuild("plan", "sglang-blackwell", "--arch", "sm121", "--no-checks")
    assert r.returncode == 2 and "carries no GPU code for sm121" in " ".join(r.stderr.split())
    r = run_imgbuild("plan", "sglang-dgx-spark", "--json", "--no-checks")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["kernel_coverage"]["sm121"]["sglang-kernel"] == "sass"
    # The aarch64 wheel has no FlashAttention 3 at all: GH200 (sm90, arm64) is refused.
    r = run_imgbuild("plan", "sglang-gb200", "--arch", "sm90", "--model", "k2.6", "--no-checks")
    said = " ".join(r.stderr.split())
    assert r.returncode == 2, said
    assert "sglang-kernel 0.4.10 has no sgl_kernel/flash_ops*.so in its wheel for this " \
           "platform, needed on sm90" in said
    assert "manylinux2014_aarch64.whl has:" in said and "Traceback" not in said


def test_dgx_spark_image_passes_the_gb10_preflight(ws):
    facts = facts_from_plan(make_plan(ws, "sglang-dgx-spark", resolve=False))
    r = pf.run(facts, runner=pf.recording_runner(FIXTURES / "gb10-1x-sm121"))
    arch = {v.check: v for v in r.verdicts}["arch"]
    assert arch.status == PASS and "sm121" in arch.detail


@pytest.mark.skipif(not docker_available(), reason="skipped: no Docker Engine")
def test_building_an_arm64_target_on_x86_64_says_where_it_builds(ws):
    r = run_imgbuild("sglang-gb200", "--no-smoke", "--registry", "imgbuild-arm64-here")
    said = " ".join(r.stderr.split())
    assert r.returncode == 3, said[-2000:]
    assert "sglang-gb200 is built for aarch64, and this machine is x86_64" in said
    assert "arm64 runner" in said and "Traceback" not in said


def test_the_ci_matrix_sends_arm64_targets_to_arm_runners(ws):
    from builder.ci.matrix import jobs

    by = {j.target: j for j in jobs(ws)}
    for name in ARM64:
        job = by[name].to_dict()
        assert job["platform"] == "linux/arm64" and job["cpu_arch"] == "aarch64"
        assert "arm64" in json.dumps(job["runner"])
    assert by["sglang-blackwell"].to_dict()["platform"] == "linux/amd64"


@pytest.mark.slow
def test_the_arm64_base_is_made_here_under_qemu_reproducibly(docker_client, ws):
    """debootstrap for arm64 under QEMU user emulation (about 105 s here), loaded as a
    linux/arm64 image: the filesystem digest the recipe records, and it runs (emulated)."""
    from builder.image import base

    b = ws.catalog.base("debian-bookworm", "aarch64")
    res = base.bootstrap(docker_client, b, rebuild=True)
    assert res.rootfs == b.bootstrap["rootfs"]
    img = docker_client.images.get(b.image)
    assert img.attrs["Architecture"] == "arm64"
    out = docker_client.containers.run(b.image, ["python3", "-c",
                                                 "import platform; print(platform.machine())"],
                                       remove=True, network_disabled=True)
    assert out.decode().strip() == "aarch64"
