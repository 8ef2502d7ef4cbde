"""Targets (images/<target>.yaml): the engine, GPU archs, OS, flavor, requirements and the
overrides and patches that go with them."""

from __future__ import annotations

import re
from dataclasses import dataclass, replace
from typing import Any

from packaging.requirements import Requirement
from packaging.version import InvalidVersion, Version

from ..errors import InputError, SpecError
from .hardware import DEBIAN_ARCH
from .schema import Doc, requirement

ENGINES = ("sglang", "vllm", "transformers")
# The OCI platforms a target may name, and the CPU arch each one's wheels are built for (the
# one CPU-name table is hardware.DEBIAN_ARCH: Debian, Docker and OCI spell them alike).
PLATFORMS = {f"linux/{debian}": cpu for cpu, debian in DEBIAN_ARCH.items()}
CPU_ARCHES = tuple(PLATFORMS.values())
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
    platforms: tuple[str, ...] = ()  # the platforms whose locks ask it (none listed: all)


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
    platforms: tuple[str, ...] = ("linux/amd64",)
    python: str | None = None
    requirements: tuple[str, ...] = ()
    overrides: tuple[Override, ...] = ()
    patches: tuple[str, ...] = ()
    indexes: tuple[Index, ...] = ()
    smoke_model: str | None = None
    default_model: str | None = None
    split_heavy_layer: bool = False  # the heavy layer as two (plan/render.py)
    # Whether the lock may hold a package that has no wheel for the image's platform, to be
    # compiled from its sdist inside the build (a compiler, build dependencies, the network
    # the sdist's build asks for). Off: every locked package is a wheel, or the lock says no.
    build_from_source: bool = False
    # Why the image cannot run as any user (`smoke: root_only:`): its smoke test runs as root
    # and says so, and its Kubernetes manifests ask for root. None: it runs as any UID.
    root_only: str | None = None

    @property
    def engine_requirement(self) -> str:
        return f"{self.engine}=={self.engine_version}"

    @property
    def multi_platform(self) -> bool:
        return len(self.platforms) > 1

    @property
    def cpu_arch(self) -> str:
        """The CPU arch of the target's first platform: of its only one once `on()` chose."""
        return PLATFORMS[self.platforms[0]]

    def on(self, platform: str) -> Target:
        """The target as one platform's image sees it: that platform only, and only the
        indexes its locks ask. Its requirements keep their markers (`platform_machine == ...`):
        uv evaluates them for the platform it resolves for."""
        if platform not in self.platforms:
            raise InputError(
                f"target '{self.name}' is not built for {platform}",
                facts=[f"{self.path}: platforms: [{', '.join(self.platforms)}]"],
                hint="pass one of its platforms to --platform, or add it to `platforms:`")
        return replace(self, platforms=(platform,), indexes=tuple(
            ix for ix in self.indexes if not ix.platforms or platform in ix.platforms))


TARGET_KEYS = {"description", "engine", "archs", "python", "os", "flavor", "platforms",
               "requirements", "overrides", "patches", "indexes", "smoke", "model",
               "split_heavy_layer", "build_from_source"}
FLAVORS = ("devel", "cuda-devel", "slim")
# The keys of the mappings inside a target (the reference at docs/reference/catalog.md lists
# each, with imgbuild/catalog/keys.yaml's words).
ENGINE_KEYS = {"name", "version"}
OVERRIDE_KEYS = {"requirement", "reason", "link"}
INDEX_KEYS = {"name", "url", "packages", "platforms"}
SMOKE_KEYS = {"model", "root_only"}


def parse_target(name: str, data: Any, path: str) -> Target:
    doc = Doc(path, data)
    doc.reject_unknown(TARGET_KEYS)
    eng = doc.sub("engine", doc.get("engine", dict, what="a mapping with name and version"))
    eng.reject_unknown(ENGINE_KEYS)
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
    platforms = _platforms(doc, "platforms", default=("linux/amd64",))
    python = doc.get("python", str, None, what="a Python version in quotes, e.g. '3.12'")
    if python is not None and not re.match(r"^3\.\d+$", python):
        raise SpecError(path, "python", "a Python minor version such as '3.12'", python)
    reqs = doc.str_list("requirements")
    for i, r in enumerate(reqs):
        requirement(doc, f"requirements[{i}]", r)
    overrides = []
    for i, o in enumerate(doc.get("overrides", list, [])):
        od = doc.sub(f"overrides[{i}]", o)
        od.reject_unknown(OVERRIDE_KEYS)
        req = od.get("requirement", str)
        requirement(od, od.key("requirement"), req)
        reason = od.get("reason", str, what="a written reason (why this override is needed)")
        if not reason.strip():
            raise SpecError(path, od.key("reason"), "a non-empty written reason")
        overrides.append(Override(req, reason.strip(), od.get("link", str, None)))
    indexes = []
    for i, ix in enumerate(doc.get("indexes", list, [])):
        xd = doc.sub(f"indexes[{i}]", ix)
        xd.reject_unknown(INDEX_KEYS)
        url = xd.get("url", str)
        if not re.match(r"^https?://", url):
            raise SpecError(path, xd.key("url"), "an http(s) URL of a PEP 503 simple index", url)
        ix_platforms = _platforms(xd, "platforms", default=())
        for j, p in enumerate(ix_platforms):
            if p not in platforms:
                raise SpecError(path, xd.key(f"platforms[{j}]"),
                                "one of the target's platforms (" + ", ".join(platforms) + ")", p)
        indexes.append(Index(xd.get("name", str), url, xd.str_list("packages"), ix_platforms))
    smoke = doc.get("smoke", dict, {})
    sd = doc.sub("smoke", smoke)
    sd.reject_unknown(SMOKE_KEYS)
    root_only = sd.get("root_only", str, None,
                       what="a written reason why the image runs as root only")
    if root_only is not None and not root_only.strip():
        raise SpecError(path, sd.key("root_only"),
                        "a non-empty written reason (why the image cannot run as any user)")
    flavor = doc.get("flavor", str, "slim" if archs == ("cpu",) else "devel")
    if flavor not in FLAVORS:
        raise SpecError(path, "flavor", "one of " + ", ".join(FLAVORS), flavor)
    return Target(
        name=name, path=path, description=doc.get("description", str, ""),
        engine=engine, engine_version=version, archs=archs, os=doc.get("os", str), flavor=flavor,
        platforms=platforms, python=python, requirements=reqs, overrides=tuple(overrides),
        patches=doc.str_list("patches"), indexes=tuple(indexes),
        smoke_model=sd.get("model", str, None), default_model=doc.get("model", str, None),
        split_heavy_layer=doc.get("split_heavy_layer", bool, False),
        build_from_source=doc.get("build_from_source", bool, False),
        root_only=" ".join(root_only.split()) if root_only else None,
    )



def _platforms(doc: Doc, key: str, *, default: tuple[str, ...]) -> tuple[str, ...]:
    got = doc.str_list(key, default=default)
    for i, p in enumerate(got):
        if p not in PLATFORMS:
            raise SpecError(doc.path, doc.key(f"{key}[{i}]"),
                            "an OCI platform: one of " + ", ".join(PLATFORMS), p)
    if len(set(got)) != len(got):
        raise SpecError(doc.path, doc.key(key), "each platform once", ", ".join(got))
    if key == "platforms" and not got and default:
        raise SpecError(doc.path, doc.key(key), "at least one platform", "[]")
    return got
