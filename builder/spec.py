"""Load and validate the data under images/: targets, model profiles, the base catalog.

Every error names the file, the key and what was expected, so a reviewer can fix a spec
without reading Python.
"""

from __future__ import annotations

import difflib
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from packaging.requirements import InvalidRequirement, Requirement
from packaging.version import InvalidVersion, Version

from .errors import InputError, SpecError

ENGINES = ("sglang", "vllm", "transformers")
CPU_ARCHES = ("x86_64", "aarch64")
ARCH_RE = re.compile(r"^sm\d{2,3}[a-z]?$")


def images_dir() -> Path:
    """images/ of the checkout (the data ships with the repository, not the wheel)."""
    return Path(__file__).resolve().parent.parent / "images"


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
    flavor: str = "devel"  # devel | slim (see images/bases.yaml)
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


@dataclass(frozen=True)
class ModelProfile:
    alias: str
    path: str
    name: str
    checkpoint: str
    size_gb: float
    quant_method: str | None
    quant_formats: tuple[str, ...]
    quant_summary: str
    tensor_parallel: int
    gpus: str | None = None
    architecture: str | None = None
    engine_flags: dict[str, tuple[str, ...]] = field(default_factory=dict, hash=False)
    # Made by builder/smokemodel.py rather than downloaded: its scheme and seed.
    generator_scheme: str | None = None
    generator_seed: int = 0
    activations: str | None = None  # what the quantized layers compute in: fp4 (w4a4), fp8, bf16

    @property
    def generated(self) -> bool:
        return self.generator_scheme is not None

    @property
    def w4a4_nvfp4(self) -> bool:
        """Needs FP4 tensor cores (sm100/sm120 families): NVFP4 weights and activations."""
        return "nvfp4-pack-quantized" in self.quant_formats and self.activations == "fp4"


@dataclass(frozen=True)
class Base:
    """An OS base: what slim images build on and what devel images' nvidia/cuda tags sit on."""

    key: str
    image: str
    name: str
    glibc: str
    python: str
    python_packages: tuple[str, ...] = ()  # OS packages that provide python
    bootstrap: dict[str, Any] | None = field(default=None, hash=False, compare=False)

    @property
    def manylinux(self) -> str:
        major, minor = self.glibc.split(".")
        return f"manylinux_{major}_{minor}"


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
    sass: dict[str, tuple[str, ...]] = field(hash=False, compare=False)
    measured: bool = False


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


# --- a small validator: each helper checks one key and says what was expected -------------

class _Doc:
    """One mapping in a spec file, with its location for error messages."""

    def __init__(self, path: str, data: Any, prefix: str = ""):
        if not isinstance(data, dict):
            raise SpecError(path, prefix or "(top level)", "a mapping of keys to values",
                            type(data).__name__)
        self.path, self.data, self.prefix = path, data, prefix

    def key(self, k: str) -> str:
        return f"{self.prefix}.{k}" if self.prefix else k

    def reject_unknown(self, allowed: set[str]) -> None:
        for k in self.data:
            if k not in allowed:
                close = difflib.get_close_matches(str(k), sorted(allowed), n=1)
                hint = f"did you mean '{close[0]}'?" if close else None
                raise SpecError(self.path, self.key(str(k)),
                                "one of the known keys: " + ", ".join(sorted(allowed)),
                                f"unknown key {k!r}", hint=hint)

    def get(self, k: str, typ: type | tuple[type, ...], default: Any = ..., *,
            what: str | None = None) -> Any:
        if k not in self.data or self.data[k] is None:
            if default is ...:
                raise SpecError(self.path, self.key(k), f"{what or _tname(typ)} (required key is missing)")
            return default
        v = self.data[k]
        if typ is float and isinstance(v, int) and not isinstance(v, bool):
            v = float(v)
        if typ is str and isinstance(v, (int, float)) and not isinstance(v, bool):
            # YAML reads 3.12 and 0.5 as numbers; the spec means the text.
            raise SpecError(self.path, self.key(k), f"{what or 'a string'} in quotes (YAML read a number)", v)
        if not isinstance(v, typ) or (isinstance(v, bool) and typ is not bool):
            raise SpecError(self.path, self.key(k), what or _tname(typ), v)
        return v

    def str_list(self, k: str, *, default: Any = ()) -> tuple[str, ...]:
        v = self.get(k, list, default=list(default) if default is not ... else ..., what="a list of strings")
        for i, item in enumerate(v):
            if not isinstance(item, str):
                raise SpecError(self.path, f"{self.key(k)}[{i}]", "a string", item)
        return tuple(v)

    def sub(self, k: str, value: Any) -> _Doc:
        return _Doc(self.path, value, self.key(k))


def _tname(typ: type | tuple[type, ...]) -> str:
    names = {str: "a string", int: "an integer", float: "a number", bool: "true or false",
             list: "a list", dict: "a mapping"}
    if isinstance(typ, tuple):
        return " or ".join(names.get(t, t.__name__) for t in typ)
    return names.get(typ, typ.__name__)


def _read_yaml(path: Path, root: Path) -> Any:
    rel = _rel(path, root)
    try:
        text = path.read_text()
    except OSError as e:
        raise InputError(f"{rel}: cannot read: {e.strerror}") from None
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f" line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        problem = getattr(e, "problem", None) or str(e).splitlines()[0]
        raise SpecError(rel, "", f"valid YAML (parse error at{where}: {problem})",
                        hint=f"fix the YAML syntax in {rel}") from None


def _rel(path: Path, root: Path) -> str:
    try:
        return str(path.relative_to(root.parent))
    except ValueError:
        return str(path)


def _requirement(doc: _Doc, key: str, text: str) -> Requirement:
    try:
        return Requirement(text)
    except InvalidRequirement as e:
        raise SpecError(doc.path, key, "a PEP 508 requirement such as 'torch==2.13.0'",
                        f"{text!r} ({e})") from None


# --- targets -------------------------------------------------------------------------------

TARGET_KEYS = {"description", "engine", "archs", "python", "os", "flavor", "cpu_arch",
               "requirements", "overrides", "patches", "indexes", "smoke", "model"}
FLAVORS = ("devel", "slim")


def parse_target(name: str, data: Any, path: str) -> Target:
    doc = _Doc(path, data)
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
        _requirement(doc, f"requirements[{i}]", r)
    overrides = []
    for i, o in enumerate(doc.get("overrides", list, [])):
        od = doc.sub(f"overrides[{i}]", o)
        od.reject_unknown({"requirement", "reason", "link"})
        req = od.get("requirement", str)
        _requirement(od, od.key("requirement"), req)
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


# --- model profiles ------------------------------------------------------------------------

MODEL_KEYS = {"name", "checkpoint", "size_gb", "architecture", "quantization",
              "tensor_parallel", "gpus", "engine_flags", "generator"}


def parse_model(alias: str, data: Any, path: str) -> ModelProfile:
    doc = _Doc(path, data)
    doc.reject_unknown(MODEL_KEYS)
    q = doc.sub("quantization", doc.get("quantization", dict, {}))
    q.reject_unknown({"method", "formats", "summary", "activations"})
    tp = doc.get("tensor_parallel", int, 1)
    if tp < 1:
        raise SpecError(path, "tensor_parallel", "an integer >= 1", tp)
    size = doc.get("size_gb", float)
    if size <= 0:
        raise SpecError(path, "size_gb", "a positive size in GB", size)
    flags_doc = doc.sub("engine_flags", doc.get("engine_flags", dict, {}))
    flags = {}
    for eng in flags_doc.data:
        if eng not in ENGINES:
            raise SpecError(path, flags_doc.key(str(eng)), "an engine name: " + ", ".join(ENGINES), eng)
        flags[eng] = flags_doc.str_list(eng)
    gen = doc.sub("generator", doc.get("generator", dict, {}))
    gen.reject_unknown({"scheme", "seed"})
    return ModelProfile(
        alias=alias, path=path, name=doc.get("name", str), checkpoint=doc.get("checkpoint", str),
        size_gb=size, quant_method=q.get("method", str, None),
        quant_formats=q.str_list("formats"), quant_summary=q.get("summary", str, ""),
        activations=q.get("activations", str, None),
        tensor_parallel=tp, gpus=doc.get("gpus", str, None),
        architecture=doc.get("architecture", str, None), engine_flags=flags,
        generator_scheme=gen.get("scheme", str, None), generator_seed=gen.get("seed", int, 0),
    )


# --- base catalog --------------------------------------------------------------------------

OS_KEYS = {"image", "name", "glibc", "python", "python_packages", "bootstrap"}


def parse_bases(data: Any, path: str) -> tuple[dict[str, Base], CudaImages]:
    doc = _Doc(path, data)
    doc.reject_unknown({"os", "cuda_images"})
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
    return out, images


def parse_gpus(data: Any, path: str) -> tuple[tuple[Gpu, ...], dict[str, ArchInfo]]:
    doc = _Doc(path, data)
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
    from packaging.specifiers import InvalidSpecifier, SpecifierSet

    doc = _Doc(path, data)
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
        td.reject_unknown({"versions", "pypi_cuda", "variants", "sass", "measured"})
        spec = td.get("versions", str)
        try:
            SpecifierSet(spec)
        except InvalidSpecifier:
            raise SpecError(path, td.key("versions"), "a PEP 440 specifier such as '>=2.11,<2.15'",
                            spec) from None
        sd = td.sub("sass", td.get("sass", dict))
        sass = {str(k): sd.str_list(k) for k in sd.data}
        torch.append(TorchBuild(spec, td.get("pypi_cuda", str), td.str_list("variants"), sass,
                                td.get("measured", bool, False)))
    return cuda, doc.str_list("base_archs"), tuple(torch)


# --- the catalog: everything under images/ --------------------------------------------------

@dataclass(frozen=True)
class Catalog:
    root: Path
    targets: dict[str, Target] = field(hash=False)
    models: dict[str, ModelProfile] = field(hash=False)
    bases: dict[str, Base] = field(hash=False)
    cuda_images: CudaImages | None = field(default=None, hash=False)
    cuda: dict[str, CudaInfo] = field(default_factory=dict, hash=False)
    base_archs: tuple[str, ...] = ()
    torch: tuple[TorchBuild, ...] = ()
    gpus: tuple[Gpu, ...] = ()
    archs: dict[str, ArchInfo] = field(default_factory=dict, hash=False)

    def target(self, name: str) -> Target:
        if name not in self.targets:
            raise _unknown("target", name, self.targets, "imgbuild list")
        return self.targets[name]

    def model(self, alias: str) -> ModelProfile:
        if alias not in self.models:
            raise _unknown("model", alias, self.models, "imgbuild list")
        return self.models[alias]

    def base(self, key: str) -> Base:
        return self.bases[key]


def _unknown(kind: str, name: str, known: dict, cmd: str) -> InputError:
    close = difflib.get_close_matches(name, list(known), n=1, cutoff=0.5)
    facts = [f"known {kind}s: " + ", ".join(sorted(known))]
    hint = f"did you mean '{close[0]}'?" if close else f"see `{cmd}`"
    return InputError(f"unknown {kind} '{name}'", facts=facts, hint=hint)


# Files under images/ that are catalog data, not targets.
DATA_FILES = {"bases.yaml", "gpus.yaml", "cuda.yaml"}


def load_catalog(root: Path | None = None) -> Catalog:
    """Read and validate every file under images/. Cross-references are checked here too."""
    root = Path(root) if root else images_dir()
    if not root.is_dir():
        raise InputError(f"no images/ directory at {root}", hint="run imgbuild from a checkout")
    bases_path = root / "bases.yaml"
    bases, cuda_images = parse_bases(_read_yaml(bases_path, root), _rel(bases_path, root))
    gpus, archs = parse_gpus(_read_yaml(root / "gpus.yaml", root), _rel(root / "gpus.yaml", root))
    cuda, base_archs, torch = parse_cuda(_read_yaml(root / "cuda.yaml", root),
                                         _rel(root / "cuda.yaml", root))
    models = {}
    for p in sorted((root / "models").glob("*.yaml")):
        models[p.stem] = parse_model(p.stem, _read_yaml(p, root), _rel(p, root))
    targets = {}
    for p in sorted(root.glob("*.yaml")):
        if p.name in DATA_FILES:
            continue
        t = parse_target(p.stem, _read_yaml(p, root), _rel(p, root))
        if t.os not in bases:
            close = difflib.get_close_matches(t.os, list(bases), n=1)
            raise SpecError(t.path, "os", "an OS from images/bases.yaml: " + ", ".join(sorted(bases)),
                            t.os, hint=f"did you mean '{close[0]}'?" if close else None)
        for i, a in enumerate(t.archs):
            if a != "cpu" and a not in archs:
                raise SpecError(t.path, f"archs[{i}]", "an arch from images/gpus.yaml: "
                                + ", ".join(archs), a)
        for k, ref in (("smoke.model", t.smoke_model), ("model", t.default_model)):
            if ref is not None and ref not in models:
                raise SpecError(t.path, k, "a model profile under images/models/: "
                                + ", ".join(sorted(models)), ref)
        targets[p.stem] = t
    return Catalog(root=root, targets=targets, models=models, bases=bases,
                   cuda_images=cuda_images, cuda=cuda, base_archs=base_archs, torch=torch,
                   gpus=gpus, archs=archs)
