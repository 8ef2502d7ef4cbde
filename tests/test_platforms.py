"""arm64 (Grace Blackwell, DGX Spark): targets for aarch64 locked for aarch64 wheels, planned on
an arm64 base made here, their GPU code read from the aarch64 wheels (which differ from the
x86_64 ones), and a clear answer where this machine cannot build them."""

from __future__ import annotations

import json

import pytest

from builder.errors import EnvError
from builder.payload import preflight as pf
from builder.payload.preflight import PASS
from builder.plan.decide import make_plan
from builder.plan.labels import facts_from_plan

from .conftest import ROOT, run_imgbuild

FIXTURES = ROOT / "tests" / "fixtures" / "nvidia-smi"
ARM64 = ("sglang-gb200", "sglang-dgx-spark", "tiny-cpu-arm64")
GPU_ARM64 = ("sglang-gb200", "sglang-dgx-spark")


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


@pytest.mark.parametrize("name", GPU_ARM64)
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


def test_a_grace_gpu_named_for_an_x86_64_image_is_refused():
    r = run_imgbuild("plan", "sglang-blackwell", "--arch", "DGX Spark", "--no-checks")
    said = " ".join(r.stderr.split())
    assert r.returncode == 2, said
    assert "DGX Spark sits in aarch64 hosts, and sglang-blackwell is an x86_64 image" in said
    assert "use sglang-dgx-spark" in said and "--arch sm121" in said
    r = run_imgbuild("plan", "sglang-gb200", "--arch", "GB300", "--json", "--no-checks")
    assert r.returncode == 0 and json.loads(r.stdout)["archs"] == ["sm103"]


def test_dgx_spark_image_passes_the_gb10_preflight(ws):
    facts = facts_from_plan(make_plan(ws, "sglang-dgx-spark", resolve=False))
    r = pf.run(facts, runner=pf.recording_runner(FIXTURES / "gb10-1x-sm121"))
    arch = {v.check: v for v in r.verdicts}["arch"]
    assert arch.status == PASS and "sm121" in arch.detail


def test_another_cpus_uv_comes_from_its_wheel_and_emulation_is_checked():
    """Builds run uv inside the image: for an arm64 image, the same uv release's aarch64
    binary from its wheel on PyPI. Without QEMU registered, the error says how to get it."""
    from builder.image.base import check_emulation, host_cpu
    from builder.lock.uv import uv_bin, uv_bin_for, uv_version

    assert uv_bin_for(host_cpu(), host_cpu()) == uv_bin()
    other = "aarch64" if host_cpu() == "x86_64" else "x86_64"
    path = uv_bin_for(other, host_cpu())
    head = open(path, "rb").read(20)
    assert head[:4] == b"\x7fELF"
    assert int.from_bytes(head[18:20], "little") == {"aarch64": 183, "x86_64": 62}[other]
    assert uv_version().split()[1] in path
    with pytest.raises(EnvError) as e:
        check_emulation("riscv64")
    assert "cannot run riscv64 programs" in e.value.message and "qemu-user-static" in e.value.hint


def test_the_ci_matrix_sends_arm64_targets_to_arm_runners(ws):
    from builder.ci.matrix import jobs

    by = {j.target: j for j in jobs(ws)}
    for name in ARM64:
        job = by[name].to_dict()
        assert job["platform"] == "linux/arm64" and job["cpu_arch"] == "aarch64"
        runner = job["runner"]
        assert runner == "ubuntu-24.04-arm" if not job["gpu"] else \
            runner[:4] == ["self-hosted", "linux", "arm64", "gpu"]
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


@pytest.mark.slow
def test_tiny_cpu_for_arm64_builds_smokes_and_pushes_here_under_qemu(docker_client,
                                                                      registry_repo):
    """The demo target for arm64, built on this machine under QEMU user emulation (every RUN
    step, and the smoke test, run as aarch64 code), smoke-tested, pushed and pulled back."""
    r = run_imgbuild("tiny-cpu-arm64", "--push", "--registry", registry_repo, "--rebuild",
                     "--json", timeout=3600)
    assert r.returncode == 0, r.stderr[-3000:]
    d = json.loads(r.stdout)
    assert d["action"] == "built"
    stages = {s["name"]: s for s in d["smoke"]["stages"]}
    assert stages["environment"]["status"] == "pass"
    assert stages["checkpoint-cpu"]["status"] == "pass", stages["checkpoint-cpu"]["reason"]
    img = docker_client.images.get(d["content_tag"])
    assert img.attrs["Architecture"] == "arm64"
    assert img.labels["io.imgbuild.platform"] == "manylinux_2_36_aarch64"
    out = docker_client.containers.run(d["content_tag"], ["-c", "import platform; "
                                       "print(platform.machine())"], entrypoint="python",
                                       remove=True, network_disabled=True)
    assert out.decode().strip() == "aarch64"
    assert d["pushed"] and all("@sha256:" in p for p in d["pushed"])
    r = run_imgbuild("pull", "tiny-cpu-arm64", "--registry", registry_repo, "--json")
    assert r.returncode == 0, r.stderr[-2000:]
