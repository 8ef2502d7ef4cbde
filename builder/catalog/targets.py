"""Targets (images/<target>.yaml): the engine, GPU archs, OS, flavor, requirements and the
overrides and patches that go with them."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from packaging.requirements import Requirement
from packaging.version import InvalidVersion, Version

from ..errors import SpecError
from .schema import Doc, requirement

ENGINES = ("sglang", "vllm", "transformers")
CPU_ARCHES = ("x86_64", "aarch64")
ARCH_RE = re.compile(r"^sm\d{2,3}[a-z]?$")


@dataclass(frozen=True)
class Override:
    requirement: str  # e.g. "compressed-tensors==0.18.0"
    reason: str
    link: str | None = None

    @property
    def name(self) -> str:
        return Requirement(self.requirement).name


@dataclass(frozen=True)
class Index:
    name: str
    url: str
    packages: tuple[str, ...] = ()


@dataclass(frozen=True)
class Target:
    name: str
    path: str
    description: str
    engine: str
    engine_version: str
    archs: tuple[str, ...]
    os: str
    flavor: str = "devel"  # devel | cuda-devel | slim (see images/bases.yaml)
    cpu_arch: str = "x86_64"
    python: str | None = None
    requirements: tuple[str, ...] = ()
    overrides: tuple[Override, ...] = ()
    patches: tuple[str, ...] = ()
    indexes: tuple[Index, ...] = ()
    smoke_model: str | None = None
    default_model: str | None = None

    @property
    def engine_requirement(self) -> str:
        return f"{self.engine}=={self.engine_version}"


TARGET_KEYS = {"description", "engine", "archs", "python", "os", "flavor", "cpu_arch",
               "requirements", "overrides", "patches", "indexes", "smoke", "model"}
FLAVORS = ("devel", "cuda-devel", "slim")


def parse_target(name: str, data: Any, path: str) -> Target:
    doc = Doc(path, data)
    doc.reject_unknown(TARGET_KEYS)
    eng = doc.sub("engine", doc.get("engine", dict, what="a mapping with name and version"))
    eng.reject_unknown({"name", "version"})
    engine = eng.get("name", str)
    if engine not in ENGINES:
        raise SpecError(path, "engine.name", "one of " + ", ".join(ENGINES), engine)
    version = eng.get("version", str, what="an exact version in quotes, e.g. '0.5.23'")
    try:
        Version(version)
    except InvalidVersion:
        raise SpecError(path, "engine.version", "an exact PEP 440 version such as '0.5.23'",
                        version) from None
    archs = doc.str_list("archs", default=...)
    for i, a in enumerate(archs):
        if not ARCH_RE.match(a) and a != "cpu":
            raise SpecError(path, f"archs[{i}]", "a CUDA arch such as sm90, sm100, sm120 (or cpu)", a)
    cpu_arch = doc.get("cpu_arch", str, "x86_64")
    if cpu_arch not in CPU_ARCHES:
        raise SpecError(path, "cpu_arch", "one of " + ", ".join(CPU_ARCHES), cpu_arch)
    python = doc.get("python", str, None, what="a Python version in quotes, e.g. '3.12'")
    if python is not None and not re.match(r"^3\.\d+$", python):
        raise SpecError(path, "python", "a Python minor version such as '3.12'", python)
    reqs = doc.str_list("requirements")
    for i, r in enumerate(reqs):
        requirement(doc, f"requirements[{i}]", r)
    overrides = []
    for i, o in enumerate(doc.get("overrides", list, [])):
        od = doc.sub(f"overrides[{i}]", o)
        od.reject_unknown({"requirement", "reason", "link"})
        req = od.get("requirement", str)
        requirement(od, od.key("requirement"), req)
        reason = od.get("reason", str, what="a written reason (why this override is needed)")
        if not reason.strip():
            raise SpecError(path, od.key("reason"), "a non-empty written reason")
        overrides.append(Override(req, reason.strip(), od.get("link", str, None)))
    indexes = []
    for i, ix in enumerate(doc.get("indexes", list, [])):
        xd = doc.sub(f"indexes[{i}]", ix)
        xd.reject_unknown({"name", "url", "packages"})
        url = xd.get("url", str)
        if not re.match(r"^https?://", url):
            raise SpecError(path, xd.key("url"), "an http(s) URL of a PEP 503 simple index", url)
        indexes.append(Index(xd.get("name", str), url, xd.str_list("packages")))
    smoke = doc.get("smoke", dict, {})
    sd = doc.sub("smoke", smoke)
    sd.reject_unknown({"model"})
    flavor = doc.get("flavor", str, "slim" if archs == ("cpu",) else "devel")
    if flavor not in FLAVORS:
        raise SpecError(path, "flavor", "one of " + ", ".join(FLAVORS), flavor)
    return Target(
        name=name, path=path, description=doc.get("description", str, ""),
        engine=engine, engine_version=version, archs=archs, os=doc.get("os", str), flavor=flavor,
        cpu_arch=cpu_arch, python=python, requirements=reqs, overrides=tuple(overrides),
        patches=doc.str_list("patches"), indexes=tuple(indexes),
        smoke_model=sd.get("model", str, None), default_model=doc.get("model", str, None),
    )

