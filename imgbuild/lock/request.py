"""A target's lock request: everything that decides its resolution, from the catalog."""

from __future__ import annotations

from ..catalog.hardware import Base, Toolchain
from ..catalog.targets import Target
from .lockfile import LockRequest


def uv_platform(cpu_arch: str, glibc: str) -> str:
    """`x86_64-manylinux_2_36`: the image's platform as uv's --python-platform spells it."""
    major, minor = glibc.split(".")
    return f"{cpu_arch}-manylinux_{major}_{minor}"


def lock_request(target: Target, base: Base, toolchain: Toolchain | None = None) -> LockRequest:
    """The target's engine first, then its requirements, for the base's Python and glibc.

    A devel target's lock also holds the CUDA toolkit from NVIDIA's wheels (nvcc, headers,
    CCCL): unversioned, so the resolver takes the cuda-toolkit release torch itself pins, the
    CUDA torch was built for (plan/select.py checks that it did)."""
    devel = (toolchain.requirement,) if toolchain and target.flavor == "devel" else ()
    return LockRequest(
        target=target.name, python=target.python or base.python,
        uv_platform=uv_platform(target.cpu_arch, base.glibc),
        requirements=(target.engine_requirement,) + target.requirements + devel,
        overrides=tuple(o.requirement for o in target.overrides),
        extra_index_urls=tuple(ix.url for ix in target.indexes),
        build_from_source=target.build_from_source,
    )
