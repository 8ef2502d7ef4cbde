"""The hardware tables: OS bases and nvidia/cuda images (bases.yaml), GPUs and their archs
(gpus.yaml), CUDA releases and the torch builds for them (cuda.yaml)."""

from __future__ import annotations

import re
from dataclasses import dataclass, field, replace
from typing import Any

from packaging.specifiers import InvalidSpecifier, SpecifierSet

from ..errors import SpecError
from .schema import Doc

# Debian's and OCI's names for the CPUs targets name (x86_64, aarch64).
DEBIAN_ARCH = {"x86_64": "amd64", "aarch64": "arm64"}


@dataclass(frozen=True)
class Base:
    """An OS base: what slim images build on and what devel images' nvidia/cuda tags sit on."""

    key: str
    image: str
    name: str
    glibc: str
    python: str
    python_packages: tuple[str, ...] = ()  # OS packages that provide python
    # OS packages the devel flavor adds: the host compiler nvcc drives, the Python headers
    # torch's cpp_extension builds against.
    devel_packages: tuple[str, ...] = ()
    bootstrap: dict[str, Any] | None = field(default=None, hash=False, compare=False)
    cpu_arch: str = "x86_64"  # the CPU this base is for (for_cpu gives the others)

    def for_cpu(self, cpu_arch: str) -> Base:
        """This OS for another CPU. A pulled base (ubuntu, nvidia/cuda) is a multi-platform
        tag: the same name, the build's platform picks. A bootstrapped one is made per CPU: its
        own tag (`…-aarch64`) and its own recorded filesystem (`rootfs_aarch64`)."""
        if cpu_arch == self.cpu_arch:
            return self
        if not self.bootstrap:
            return replace(self, cpu_arch=cpu_arch)
        recipe = dict(self.bootstrap)
        recipe["rootfs"] = recipe.get(f"rootfs_{cpu_arch}")
        return replace(self, image=f"{self.image}-{cpu_arch}", bootstrap=recipe,
                       cpu_arch=cpu_arch)

    @property
    def debian_arch(self) -> str:
        return DEBIAN_ARCH[self.cpu_arch]

    @property
    def platform(self) -> str:
        return f"linux/{self.debian_arch}"

    @property
    def manylinux(self) -> str:
        major, minor = self.glibc.split(".")
        return f"manylinux_{major}_{minor}"


@dataclass(frozen=True)
class Toolchain:
    """The devel flavor's CUDA toolkit, from NVIDIA's wheels: what the lock adds, and the
    wheel that tells its CUDA version."""

    requirement: str  # cuda-toolkit[nvcc,cccl,cudart,crt]: torch's own pin decides the version
    nvcc_package: str  # nvidia-cuda-nvcc: its version is the toolkit's CUDA


@dataclass(frozen=True)
class CudaRelease:
    cuda: str  # "13.0"
    tag_version: str  # "13.0.0"
    os: tuple[str, ...]


@dataclass(frozen=True)
class CudaImages:
    repository: str
    kinds: tuple[str, ...]
    releases: tuple[CudaRelease, ...]
    digests: dict[str, str] = field(default_factory=dict, hash=False, compare=False)

    def tag(self, cuda: str, kind: str, os: str) -> str | None:
        rel = next((r for r in self.releases if r.cuda == cuda and os in r.os), None)
        if rel is None or kind not in self.kinds:
            return None
        return f"{self.repository}:{rel.tag_version}-{kind}-{os}"


@dataclass(frozen=True)
class CudaInfo:
    version: str
    min_driver: str
    adds: tuple[str, ...]
    drops: tuple[str, ...]


@dataclass(frozen=True)
class TorchBuild:
    versions: str  # a PEP 440 specifier set over torch versions
    pypi_cuda: str
    variants: tuple[str, ...]


@dataclass(frozen=True)
class Gpu:
    names: tuple[str, ...]
    sm: str
    generation: str
    memory_gb: float
    cpu_arch: str = "x86_64"


@dataclass(frozen=True)
class ArchInfo:
    sm: str
    capability: str
    w4a4_nvfp4: bool
    fp8: bool


OS_KEYS = {"image", "name", "glibc", "python", "python_packages", "devel_packages", "bootstrap"}


def parse_bases(data: Any, path: str) -> tuple[dict[str, Base], CudaImages, Toolchain | None]:
    doc = Doc(path, data)
    doc.reject_unknown({"os", "cuda_images", "toolchain"})
    out = {}
    for key, entry in doc.get("os", dict).items():
        bd = doc.sub(f"os.{key}", entry)
        bd.reject_unknown(OS_KEYS)
        glibc = bd.get("glibc", str, what="a glibc version in quotes, e.g. '2.36'")
        if not re.match(r"^2\.\d+$", glibc):
            raise SpecError(path, bd.key("glibc"), "a glibc version such as '2.36'", glibc)
        out[key] = Base(
            key=key, image=bd.get("image", str), name=bd.get("name", str), glibc=glibc,
            python=bd.get("python", str), python_packages=bd.str_list("python_packages"),
            devel_packages=bd.str_list("devel_packages"),
            bootstrap=bd.get("bootstrap", dict, None),
        )
    cd = doc.sub("cuda_images", doc.get("cuda_images", dict))
    cd.reject_unknown({"repository", "kinds", "releases", "digests"})
    releases = []
    for i, r in enumerate(cd.get("releases", list)):
        rd = cd.sub(f"releases[{i}]", r)
        rd.reject_unknown({"cuda", "tag_version", "os"})
        oss = rd.str_list("os")
        for o in oss:
            if o not in out:
                raise SpecError(path, rd.key("os"), "OS keys from `os:` above", o)
        releases.append(CudaRelease(rd.get("cuda", str), rd.get("tag_version", str), oss))
    images = CudaImages(cd.get("repository", str), cd.str_list("kinds"), tuple(releases),
                        dict(cd.get("digests", dict, {})))
    toolchain = None
    if "toolchain" in (data or {}):
        td = doc.sub("toolchain", doc.get("toolchain", dict))
        td.reject_unknown({"requirement", "nvcc_package"})
        toolchain = Toolchain(td.get("requirement", str), td.get("nvcc_package", str))
    return out, images, toolchain


def parse_gpus(data: Any, path: str) -> tuple[tuple[Gpu, ...], dict[str, ArchInfo]]:
    doc = Doc(path, data)
    doc.reject_unknown({"gpus", "archs"})
    archs = {}
    for sm, entry in doc.get("archs", dict).items():
        ad = doc.sub(f"archs.{sm}", entry)
        ad.reject_unknown({"capability", "w4a4_nvfp4", "fp8"})
        archs[sm] = ArchInfo(sm, ad.get("capability", str), ad.get("w4a4_nvfp4", bool),
                             ad.get("fp8", bool))
    gpus = []
    for i, g in enumerate(doc.get("gpus", list)):
        gd = doc.sub(f"gpus[{i}]", g)
        gd.reject_unknown({"names", "sm", "generation", "memory_gb", "cpu_arch"})
        sm = gd.get("sm", str)
        if sm not in archs:
            raise SpecError(path, gd.key("sm"), "an arch listed under `archs:`", sm)
        gpus.append(Gpu(gd.str_list("names", default=...), sm, gd.get("generation", str),
                        gd.get("memory_gb", float), gd.get("cpu_arch", str, "x86_64")))
    return tuple(gpus), archs


def parse_cuda(data: Any, path: str) -> tuple[dict[str, CudaInfo], tuple[str, ...], tuple[TorchBuild, ...]]:

    doc = Doc(path, data)
    doc.reject_unknown({"cuda", "base_archs", "torch"})
    cuda = {}
    for ver, entry in doc.get("cuda", dict).items():
        cd = doc.sub(f"cuda.{ver}", entry)
        cd.reject_unknown({"min_driver", "adds", "drops"})
        cuda[str(ver)] = CudaInfo(str(ver), cd.get("min_driver", str), cd.str_list("adds"),
                                  cd.str_list("drops"))
    torch = []
    for i, t in enumerate(doc.get("torch", list)):
        td = doc.sub(f"torch[{i}]", t)
        td.reject_unknown({"versions", "pypi_cuda", "variants"})
        spec = td.get("versions", str)
        try:
            SpecifierSet(spec)
        except InvalidSpecifier:
            raise SpecError(path, td.key("versions"), "a PEP 440 specifier such as '>=2.11,<2.15'",
                            spec) from None
        torch.append(TorchBuild(spec, td.get("pypi_cuda", str), td.str_list("variants")))
    return cuda, doc.str_list("base_archs"), tuple(torch)

