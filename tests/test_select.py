"""GPU names to archs, and the CUDA / base / driver floor chosen for a target (no network)."""

from __future__ import annotations

import dataclasses
import json

import pytest

from imgbuild.catalog.archs import parse_arch
from imgbuild.errors import InputError
from imgbuild.lock.lockfile import LockedPackage
from imgbuild.plan.coverage import status_for
from imgbuild.plan.decide import make_plan
from imgbuild.plan.select import select, torch_cuda

from .conftest import checkout_workspace, run_imgbuild

WS = checkout_workspace()


@pytest.fixture(scope="module")
def cat():
    return WS.catalog


@pytest.mark.parametrize("text, sm", [
    ("sm100", "sm100"), ("SM_120", "sm120"), ("10.0", "sm100"), ("12.1", "sm121"),
    ("B200", "sm100"), ("RTX PRO 6000", "sm120"), ("rtx pro 6000 blackwell", "sm120"),
    ("GB10", "sm121"), ("DGX Spark", "sm121"), ("H200", "sm90"), ("B300", "sm103"),
    ("NVIDIA GeForce RTX 5090", "sm120"),
])
def test_parse_arch(cat, text, sm):
    assert parse_arch(text, cat) == sm


def test_unknown_arch_suggests(cat):
    with pytest.raises(InputError) as e:
        parse_arch("B2000", cat)
    assert "unknown GPU architecture 'B2000'" in e.value.message
    assert e.value.hint == "did you mean 'B200'?"


def test_binary_compatibility_within_a_major_only():
    # The one rule (imgbuild/lock/fatbin.py: Code.runs_on), as plan's coverage applies it.
    assert status_for(("sm_120",), "sm121") == status_for(("sm_100",), "sm103") == "sass"
    assert status_for(("sm_121",), "sm120") == status_for(("sm_90",), "sm100") == "none"
    assert status_for(("sm_100",), "sm120") == "none"
    assert status_for(("sm_120",), "sm120") == status_for(("sm_90",), "sm90") == "sass"
    assert status_for(("sm_90", "sm_100", "sm_120"), "sm121") == "sass"
    assert status_for(("sm_90", "sm_100"), "sm120") == "none"


def _plan(cat, target, **kw):
    return make_plan(WS, target, resolve=False, **kw)


def test_every_shipped_target_shows_cuda_base_driver_and_why(cat):
    for name in cat.targets:
        p = _plan(cat, name)
        assert p.selection, name
        if p.archs == ("cpu",):
            assert p.cuda is None and p.min_driver is None
            continue
        torch = WS.target(name).lock().package("torch")
        cuda, how = torch_cuda(cat, torch.version)  # e.g. torch 2.14.x on PyPI: CUDA 13.0
        floor = cat.cuda[cuda].min_driver
        assert p.cuda == cuda and p.min_driver == floor, name
        assert how in p.selection
        assert p.selection[-1] == f"driver ≥ {floor} (CUDA {cuda})"
        labels = dict(p.labels)
        assert labels["io.imgbuild.driver-min"] == floor
        assert labels["io.imgbuild.flavor"] == p.flavor
        if p.flavor == "cuda-devel":
            tag = cat.cuda_images.tag(cuda, "cudnn-devel", p.base)
            assert p.base_image.split("@")[0] == tag  # pinned by digest where one is recorded
            assert p.base_digest == cat.cuda_images.digests.get(tag)
        else:
            assert p.base_image == cat.base(p.base, p.cpu_arch).image
        # devel: the toolkit is in the lock, at torch's CUDA, and the image's CUDA_HOME is it.
        assert (p.cuda_home is not None) == (p.flavor == "devel"), name
        if p.flavor == "devel":
            assert p.nvcc.startswith(cuda + "."), name
            assert p.cuda_home.endswith(f"/site-packages/nvidia/cu{cuda.split('.')[0]}")


def test_blackwell_reasoning_reads_like_the_issue(cat):
    p = _plan(cat, "sglang-blackwell")
    assert p.selection == (
        "sm100 needs CUDA ≥ 12.8", "sm120 needs CUDA ≥ 12.8",
        "torch 2.14.1 on PyPI is built for CUDA 13.0",
        "nvcc 13.0.88 (nvidia-cuda-nvcc) matches torch's CUDA 13.0",
        "→ imgbuild-base:debian-bookworm-py3.11 + nvcc 13.0.88 from NVIDIA's wheels (devel: for "
        "FlashInfer/DeepGEMM JIT; builds from the OS mirror and PyPI alone)",
        "driver ≥ 580.65.06 (CUDA 13.0)")
    # nvidia/cuda publishes no Debian images: the cuda-devel flavor of this target says so and
    # names the flavors that do build.
    with pytest.raises(InputError) as e:
        select(cat, cat.target("sglang-blackwell"), archs=("sm100", "sm120"),
               flavor="cuda-devel", lock=WS.target("sglang-blackwell").lock(), model=None)
    assert e.value.message == "no nvidia/cuda cudnn-devel image for CUDA 13.0 on debian-bookworm"
    assert "--flavor devel" in e.value.hint
    # On an OS it does publish for, cuda-devel is nvidia/cuda's image, by digest.
    sel = select(cat, cat.target("sglang-hopper"), archs=("sm90",), flavor="cuda-devel",
                 lock=WS.target("sglang-hopper").lock(), model=None)
    assert sel.base_image.startswith("nvidia/cuda:13.0.0-cudnn-devel-ubuntu24.04@sha256:")
    assert sel.toolkit_dir is None


def test_devel_refuses_an_nvcc_of_another_cuda(cat):
    lock = WS.target("sglang-blackwell").lock()
    pkgs = tuple(p for p in lock.packages if p.name != "nvidia-cuda-nvcc") + (
        LockedPackage("nvidia-cuda-nvcc", "13.5.37", ("sha256:" + "0" * 64,)),)
    with pytest.raises(InputError) as e:
        select(cat, cat.target("sglang-blackwell"), archs=("sm100",), flavor="devel",
               lock=dataclasses.replace(lock, packages=pkgs), model=None)
    assert e.value.message == "the lock's nvcc is CUDA 13.5, but torch is built for CUDA 13.0"
    assert "cuda-toolkit==13.0.*" in e.value.hint
    # A devel flavor asked of a lock without the toolkit (a slim target, --flavor devel).
    lock = dataclasses.replace(lock, packages=tuple(p for p in lock.packages
                                                    if p.name != "nvidia-cuda-nvcc"))
    with pytest.raises(InputError) as e:
        select(cat, cat.target("sglang-blackwell"), archs=("sm100",), flavor="devel",
               lock=lock, model=None)
    assert "the devel flavor needs nvcc in the lock" in e.value.message


def _lock_with_torch(cat, version):
    lock = WS.target("sglang-blackwell").lock()
    pkgs = tuple(p for p in lock.packages if p.name != "torch") + (
        LockedPackage("torch", version, ("sha256:" + "0" * 64,)),)
    return dataclasses.replace(lock, packages=pkgs)


def test_sm121_on_a_cuda_128_torch_is_refused(cat):
    t = cat.target("sglang-blackwell")
    with pytest.raises(InputError) as e:
        select(cat, t, archs=("sm121",), flavor="slim", lock=_lock_with_torch(cat, "2.10.0"),
               model=None)
    assert e.value.message == "sm121 needs CUDA ≥ 12.9, but torch 2.10.0 is built for CUDA 12.8"
    assert "+cu130" in e.value.hint
    # The same arch on torch 2.14.1 (CUDA 13.0) is fine, through sm120's code.
    sel = select(cat, t, archs=("sm121",), flavor="slim", lock=_lock_with_torch(cat, "2.14.1"),
                 model=None)
    assert sel.cuda == "13.0"
    # A +cu130 local build of an older torch is read from its tag.
    sel = select(cat, t, archs=("sm121",), flavor="slim", lock=_lock_with_torch(cat, "2.10.0+cu130"),
                 model=None)
    assert sel.cuda == "13.0" and "torch 2.10.0+cu130 is the +cu130 build" in sel.reasoning


def test_cuda_13_no_longer_builds_volta(cat):
    with pytest.raises(InputError) as e:
        select(cat, cat.target("sglang-hopper"), archs=("sm70",), flavor="cuda-devel",
               lock=_lock_with_torch(cat, "2.14.1"), model=None)
    assert e.value.message == "CUDA 13.0 no longer compiles for sm70"


def test_w4a4_nvfp4_model_on_hopper_only_is_refused(cat):
    with pytest.raises(InputError) as e:
        _plan(cat, "sglang-hopper", model="tiny-nvfp4")
    assert "w4a4 NVFP4, which needs sm100/sm120-family GPUs" in e.value.message
    assert "use a BF16 or FP8 build" in e.value.hint
    # A W4A16 model is fine on Hopper; the same NVFP4 model is fine on Blackwell.
    assert _plan(cat, "sglang-hopper", model="k2.6").cuda == "13.0"
    assert _plan(cat, "sglang-blackwell", model="tiny-nvfp4").cuda == "13.0"


def test_cli_arch_and_flavor_overrides():
    r = run_imgbuild("plan", "sglang-blackwell", "--arch", "RTX PRO 6000", "--flavor", "slim",
                     "--json", "--no-checks")
    assert r.returncode == 0, r.stderr
    p = json.loads(r.stdout)
    assert p["archs"] == ["sm120"] and p["flavor"] == "slim"
    assert p["base_image"] == "imgbuild-base:debian-bookworm-py3.11" and p["cuda_home"] is None
    assert p["labels"]["io.imgbuild.archs"] == "sm120"
    r = run_imgbuild("plan", "sglang-hopper", "--model", "tiny-nvfp4", "--no-checks")
    assert r.returncode == 2 and "w4a4 NVFP4" in r.stderr and "Traceback" not in r.stderr
    r = run_imgbuild("plan", "sglang-blackwell", "--arch", "B2000", "--no-checks")
    assert r.returncode == 2 and "did you mean 'B200'?" in r.stderr


def test_selections_refusals_word_for_word(cat):
    t = cat.target("sglang-blackwell")
    no_torch = dataclasses.replace(WS.target("sglang-blackwell").lock(), packages=tuple(
        p for p in WS.target("sglang-blackwell").lock().packages if p.name != "torch"))
    with pytest.raises(InputError) as e:
        select(cat, t, archs=("sm100", "sm120"), flavor="slim", lock=no_torch, model=None)
    assert (e.value.message, e.value.hint) == (
        "target 'sglang-blackwell' is for GPUs (sm100, sm120) but its lock has no torch",
        "add torch to the target's requirements")
    # A CPU image: no CUDA, whatever torch the lock has (none here).
    cpu = select(cat, t, archs=("cpu",), flavor="slim", lock=no_torch, model=None)
    assert (cpu.cuda, cpu.torch, cpu.reasoning) == (None, None, ("CPU only: no CUDA",))
    with pytest.raises(InputError) as e:
        select(cat, t, archs=("sm121",), flavor="slim", lock=_lock_with_torch(cat, "2.10.0"),
               model=None)
    assert e.value.facts == ["sm121 needs CUDA ≥ 12.9", *e.value.facts[1:]] and \
        len(e.value.facts) == 2
    assert e.value.hint == ("use torch 2.10.0's CUDA 13.0 build from the PyTorch index (+cu130), "
                            "or drop the arch from the target")
    with pytest.raises(InputError) as e:
        select(cat, cat.target("sglang-hopper"), archs=("sm70",), flavor="cuda-devel",
               lock=_lock_with_torch(cat, "2.14.1"), model=None)
    assert e.value.hint == "drop sm70 or use a torch built for an older CUDA"
    with pytest.raises(InputError) as e:
        _plan(cat, "sglang-hopper", model="tiny-nvfp4")
    assert e.value.hint == ("on sm90 use a BF16 or FP8 build of the model, or a Blackwell "
                            "target (--arch B200 / --arch 'RTX PRO 6000')")
    slim = select(cat, t, archs=("sm100",), flavor="slim", lock=_lock_with_torch(cat, "2.14.1"),
                  model=None)
    assert slim.flavor == "slim" and slim.reasoning[-2].endswith(
        "(slim: CUDA 13.0 libraries from the torch wheels only)")


def test_more_of_selections_refusals_word_for_word(cat):
    t = cat.target("sglang-blackwell")
    with pytest.raises(InputError) as e:
        select(cat, t, archs=("sm100", "sm120"), flavor="slim",
               lock=_lock_with_torch(cat, "2.14.1+cpu"), model=None)
    assert (e.value.message, e.value.hint) == (
        "torch 2.14.1+cpu is the CPU build: it cannot drive sm100, sm120",
        "lock a CUDA build of torch (PyPI's Linux wheels are CUDA builds)")
    # A local +cu build cuda.yaml does not list: no other build of it to offer.
    with pytest.raises(InputError) as e:
        select(cat, t, archs=("sm121",), flavor="slim",
               lock=_lock_with_torch(cat, "2.0.0+cu128"), model=None)
    assert e.value.hint == ("use a newer torch (images/cuda.yaml lists which CUDA each is built "
                            "for), or drop the arch from the target")
    with pytest.raises(InputError) as e:
        select(cat, t, archs=("sm35",), flavor="slim", lock=_lock_with_torch(cat, "2.14.1"),
               model=None)
    assert (e.value.message, e.value.hint) == (
        "no CUDA in images/cuda.yaml compiles for sm35",
        "add the CUDA release that brings it to images/cuda.yaml")
    with pytest.raises(InputError) as e:
        select(cat, t, archs=("sm80", "sm90"), flavor="slim",
               lock=_lock_with_torch(cat, "2.14.1"), model=cat.model("tiny-nvfp4"))
    assert e.value.hint == ("on sm80, sm90 use a BF16 or FP8 build of the model, or a "
                            "Blackwell target (--arch B200 / --arch 'RTX PRO 6000')")
    lock = WS.target("sglang-blackwell").lock()
    no_nvcc = dataclasses.replace(lock, packages=tuple(p for p in lock.packages
                                                       if p.name != "nvidia-cuda-nvcc"))
    with pytest.raises(InputError) as e:
        select(cat, t, archs=("sm100",), flavor="devel", lock=no_nvcc, model=None)
    assert (e.value.facts, e.value.hint) == (
        ["images/sglang-blackwell.yaml: flavor: devel",
         f"images/bases.yaml: toolchain: {cat.toolchain.requirement} is added to devel locks"],
        "set `flavor: devel` in images/sglang-blackwell.yaml and run `imgbuild lock "
        "sglang-blackwell`, or use --flavor slim / cuda-devel")
    with pytest.raises(InputError) as e:
        select(cat, t, archs=("sm100",), flavor="cuda-devel", lock=lock, model=None)
    assert e.value.facts[-1].startswith("images/bases.yaml has: 12.8 on ubuntu22.04, ")
    assert e.value.hint == ("use --flavor devel (the toolkit from NVIDIA's wheels) or slim, or "
                            "add the release to images/bases.yaml")


def test_a_cuda_devel_base_without_a_recorded_digest_says_how_to_pin_it(cat):
    hopper = cat.target("sglang-hopper")
    lock = WS.target("sglang-hopper").lock()
    pinned = select(cat, hopper, archs=("sm90",), flavor="cuda-devel", lock=lock, model=None)
    assert "not pinned by digest" not in " ".join(pinned.reasoning)
    unpinned = dataclasses.replace(cat, cuda_images=dataclasses.replace(cat.cuda_images,
                                                                       digests={}))
    sel = select(unpinned, hopper, archs=("sm90",), flavor="cuda-devel", lock=lock, model=None)
    assert sel.base_image == "nvidia/cuda:13.0.0-cudnn-devel-ubuntu24.04"
    assert sel.reasoning[2].endswith(
        "(cuda-devel: nvidia/cuda's nvcc for FlashInfer/DeepGEMM JIT); not pinned by digest: "
        "`imgbuild base refresh-digests`")


def test_cuda_releases_are_taken_in_version_order_not_text_order(cat):
    """13.10 comes after 13.2: an arch 13.2 adds is there for 13.2, whatever 13.10 does."""
    from imgbuild.plan.select import supports

    r = next(iter(cat.cuda.values()))
    releases = dict(cat.cuda) | {
        "13.2": dataclasses.replace(r, adds=("sm110",), drops=()),
        "13.10": dataclasses.replace(r, adds=(), drops=("sm110",))}
    later = dataclasses.replace(cat, cuda=releases)
    assert supports(later, "13.2", "sm110") is True
    assert supports(later, "13.10", "sm110") is False
    assert supports(later, "13.0", "sm110") is False
