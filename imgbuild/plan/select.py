"""CUDA version and base image for a target: from its archs, its locked torch and its flavor.

Users think "B200"; the image needs a CUDA that compiles for sm100, a torch whose wheels carry
code for it, a base image of that CUDA (devel) or none at all (slim), and a driver floor. Each
step of the reasoning is kept so `imgbuild plan` can show it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from packaging.specifiers import SpecifierSet
from packaging.version import Version

from ..catalog.catalog import Catalog
from ..catalog.hardware import TorchBuild
from ..catalog.models import ModelProfile
from ..catalog.targets import Target
from ..errors import InputError
from ..lock.lockfile import Lockfile


@dataclass(frozen=True)
class Selection:
    cuda: str | None
    base_image: str
    os: str
    flavor: str
    min_driver: str | None
    torch: str | None
    torch_cuda: str | None
    reasoning: tuple[str, ...]
    # devel: where the toolkit from NVIDIA's wheels lies, relative to the venv's site-packages
    # (nvidia/cu13), and the nvcc version the lock pins.
    toolkit_dir: str | None = None
    nvcc: str | None = None


def _v(cuda: str) -> Version:
    return Version(cuda)


def first_cuda(cat: Catalog, arch: str) -> str | None:
    """The oldest CUDA in the catalog that compiles for `arch`."""
    for ver in sorted(cat.cuda, key=_v):
        if supports(cat, ver, arch):
            return ver
    return None


def supports(cat: Catalog, cuda: str, arch: str) -> bool:
    known = set(cat.base_archs)
    for ver in sorted(cat.cuda, key=_v):
        if _v(ver) > _v(cuda):
            break
        known |= set(cat.cuda[ver].adds)
        known -= set(cat.cuda[ver].drops)
    return arch in known


def torch_build(cat: Catalog, version: str) -> TorchBuild | None:
    v = Version(version)
    base = Version(v.base_version)
    return next((t for t in cat.torch if base in SpecifierSet(t.versions)), None)


def torch_cuda(cat: Catalog, version: str) -> tuple[str | None, str]:
    """(CUDA the locked torch is built for, how we know)."""
    local = Version(version).local or ""
    m = re.fullmatch(r"cu(\d+)(\d)", local)
    if m:
        return f"{m.group(1)}.{m.group(2)}", f"torch {version} is the +{local} build"
    if local == "cpu":
        return None, f"torch {version} is the CPU build"
    tb = torch_build(cat, version)
    if tb is None:
        return None, f"torch {version} is not in images/cuda.yaml"
    return tb.pypi_cuda, f"torch {version} on PyPI is built for CUDA {tb.pypi_cuda}"


def select(cat: Catalog, target: Target, *, archs: tuple[str, ...], flavor: str,
           lock: Lockfile, model: ModelProfile | None) -> Selection:
    os_base = cat.base(target.os, target.cpu_arch)
    why: list[str] = []
    gpu_archs = tuple(a for a in archs if a != "cpu")
    if model is not None and model.w4a4_nvfp4 and gpu_archs and \
            not any(cat.archs[a].w4a4_nvfp4 for a in gpu_archs):
        raise InputError(
            f"model '{model.alias}' is w4a4 NVFP4, which needs sm100/sm120-family GPUs; "
            f"this image is for {', '.join(gpu_archs)} only",
            facts=[f"{model.path}: formats {', '.join(model.quant_formats)}, activations fp4",
                   "w4a4 NVFP4 kernels need FP4 tensor cores (sm100, sm103, sm120, sm121)",
                   f"on {', '.join(gpu_archs)} the engine fails at load: Current platform does "
                   "not support w4a4 nvfp4 quantization"],
            hint=f"on {', '.join(gpu_archs)} use a BF16 or FP8 build of the model, or a "
                 "Blackwell target (--arch B200 / --arch 'RTX PRO 6000')")
    torch_pkg = lock.package("torch")
    tver = torch_pkg.version if torch_pkg else None
    if not gpu_archs:
        why.append("CPU only: no CUDA")
        return Selection(None, os_base.image, os_base.key, flavor, None, tver, None, tuple(why))
    need = "0"
    for a in gpu_archs:
        first = first_cuda(cat, a)
        if first is None:
            raise InputError(f"no CUDA in images/cuda.yaml compiles for {a}",
                             hint="add the CUDA release that brings it to images/cuda.yaml")
        why.append(f"{a} needs CUDA ≥ {first}")
        need = max(need, first, key=_v)
    if tver is None:
        raise InputError(f"target '{target.name}' is for GPUs ({', '.join(gpu_archs)}) but its "
                         "lock has no torch", hint="add torch to the target's requirements")
    cuda, how = torch_cuda(cat, tver)
    why.append(how)
    if cuda is None:
        raise InputError(f"{how}: it cannot drive {', '.join(gpu_archs)}",
                         hint="lock a CUDA build of torch (PyPI's Linux wheels are CUDA builds)")
    if _v(cuda) < _v(need):
        tb = torch_build(cat, tver)
        alts = [v for v in (tb.variants if tb else ()) if _v(v) >= _v(need)]
        raise InputError(
            f"{max(gpu_archs, key=lambda a: _v(first_cuda(cat, a) or '0'))} needs CUDA ≥ {need}, "
            f"but torch {tver} is built for CUDA {cuda}",
            facts=why,
            hint=(f"use torch {tver}'s CUDA {alts[0]} build from the PyTorch index "
                  f"(+cu{alts[0].replace('.', '')})" if alts else
                  "use a newer torch (images/cuda.yaml lists which CUDA each is built for)")
            + ", or drop the arch from the target")
    for a in gpu_archs:
        if not supports(cat, cuda, a):
            raise InputError(f"CUDA {cuda} no longer compiles for {a}", facts=why,
                             hint=f"drop {a} or use a torch built for an older CUDA")
    # Whether torch (and the engine's kernel packages) carry code for each arch is read from
    # the locked wheels themselves: plan/coverage.py.
    info = cat.cuda[cuda]
    toolkit_dir = nvcc = None
    if flavor == "devel":
        toolkit_dir, nvcc = _toolkit(cat, target, lock, cuda, why)
        image = os_base.image
        why.append(f"→ {image} + nvcc {nvcc} from NVIDIA's wheels (devel: for FlashInfer/"
                   "DeepGEMM JIT; builds from the OS mirror and PyPI alone)")
    elif flavor == "cuda-devel":
        image = cat.cuda_images.tag(cuda, "cudnn-devel", os_base.key) if cat.cuda_images else None
        if image is None:
            have = [f"{r.cuda} on {', '.join(r.os)}" for r in cat.cuda_images.releases] \
                if cat.cuda_images else []
            raise InputError(f"no nvidia/cuda cudnn-devel image for CUDA {cuda} on {os_base.key}",
                             facts=why + ["images/bases.yaml has: " + "; ".join(have)],
                             hint="use --flavor devel (the toolkit from NVIDIA's wheels) or "
                                  "slim, or add the release to images/bases.yaml")
        digest = cat.cuda_images.digests.get(image)
        if digest:
            image = f"{image}@{digest}"
        why.append(f"→ {image} (cuda-devel: nvidia/cuda's nvcc for FlashInfer/DeepGEMM JIT)"
                   + ("" if digest else "; not pinned by digest: `imgbuild base refresh-digests`"))
    else:
        image = os_base.image
        why.append(f"→ {image} (slim: CUDA {cuda} libraries from the torch wheels only)")
    why.append(f"driver ≥ {info.min_driver} (CUDA {cuda})")
    return Selection(cuda, image, os_base.key, flavor, info.min_driver, tver, cuda, tuple(why),
                     toolkit_dir, nvcc)


def _toolkit(cat: Catalog, target: Target, lock: Lockfile, cuda: str,
             why: list[str]) -> tuple[str, str]:
    """The devel flavor's toolkit in the lock: its nvcc must be the CUDA torch was built for
    (a newer nvcc's PTX needs a newer driver than torch's floor; an older one cannot target
    the newest archs torch carries)."""
    tc = cat.toolchain
    pkg = lock.package(tc.nvcc_package) if tc else None
    if tc is None or pkg is None:
        raise InputError(
            f"the devel flavor needs nvcc in the lock, and {target.name}'s lock has none",
            facts=[f"{target.path}: flavor: {target.flavor}"]
            + ([f"images/bases.yaml: toolchain: {tc.requirement} is added to devel locks"]
               if tc else ["images/bases.yaml has no `toolchain:`"]),
            hint=f"set `flavor: devel` in {target.path} and run `imgbuild lock {target.name}`, "
                 "or use --flavor slim / cuda-devel")
    v = Version(pkg.version)
    have = f"{v.major}.{v.minor}"
    if have != cuda:
        raise InputError(
            f"the lock's nvcc is CUDA {have}, but torch is built for CUDA {cuda}",
            facts=why + [f"{tc.nvcc_package}=={pkg.version} in the lock"],
            hint=f"add `cuda-toolkit=={cuda}.*` to {target.path}'s requirements and run "
                 f"`imgbuild lock {target.name}`")
    why.append(f"nvcc {pkg.version} ({tc.nvcc_package}) matches torch's CUDA {cuda}")
    return f"nvidia/cu{v.major}", pkg.version
