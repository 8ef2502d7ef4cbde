"""The catalog: targets, model profiles and the hardware tables under images/, read and
validated together, cross-references included. (Patches and the check tables are read by
their own modules, through the Workspace, when a command needs them.)"""

from __future__ import annotations

import difflib
from dataclasses import dataclass, field
from pathlib import Path

from ..errors import InputError, SpecError
from .hardware import (
    ArchInfo,
    Base,
    CudaImages,
    CudaInfo,
    Gpu,
    Toolchain,
    TorchBuild,
    parse_bases,
    parse_cuda,
    parse_gpus,
)
from .models import ModelProfile, parse_model
from .prune import PruneRule, parse_prune
from .schema import read_yaml, rel, unknown
from .targets import Target, parse_target


@dataclass(frozen=True)
class Catalog:
    root: Path
    targets: dict[str, Target] = field(hash=False)
    models: dict[str, ModelProfile] = field(hash=False)
    bases: dict[str, Base] = field(hash=False)
    cuda_images: CudaImages | None = field(default=None, hash=False)
    toolchain: Toolchain | None = None
    cuda: dict[str, CudaInfo] = field(default_factory=dict, hash=False)
    base_archs: tuple[str, ...] = ()
    torch: tuple[TorchBuild, ...] = ()
    gpus: tuple[Gpu, ...] = ()
    archs: dict[str, ArchInfo] = field(default_factory=dict, hash=False)
    # Images imgbuild itself runs (images/generators/): locked and built like targets, but
    # not CI jobs of their own.
    generators: dict[str, Target] = field(default_factory=dict, hash=False)
    prune: tuple[PruneRule, ...] = ()  # images/prune.yaml (none: the file is absent)

    def target(self, name: str) -> Target:
        """A target, or a generator (they are locked, planned and built the same way)."""
        if name in self.targets:
            return self.targets[name]
        if name in self.generators:
            return self.generators[name]
        raise unknown("target", name, self.targets)

    def model(self, alias: str) -> ModelProfile:
        if alias not in self.models:
            raise unknown("model", alias, self.models)
        return self.models[alias]

    def base(self, key: str, cpu_arch: str = "x86_64") -> Base:
        return self.bases[key].for_cpu(cpu_arch)


# Files under images/ that are catalog data, not targets.
DATA_FILES = {"bases.yaml", "gpus.yaml", "cuda.yaml", "prune.yaml"}


def load_catalog(root: Path) -> Catalog:
    """Read and validate every file under images/. Cross-references are checked here too."""
    root = Path(root)
    if not root.is_dir():
        raise InputError(f"no images/ directory at {root}",
                         hint="pass --images DIR (or set IMGBUILD_IMAGES)")
    bases_path = root / "bases.yaml"
    bases, cuda_images, toolchain = parse_bases(read_yaml(bases_path, root), rel(bases_path, root))
    gpus, archs = parse_gpus(read_yaml(root / "gpus.yaml", root), rel(root / "gpus.yaml", root))
    cuda, base_archs, torch = parse_cuda(read_yaml(root / "cuda.yaml", root),
                                         rel(root / "cuda.yaml", root))
    models = {}
    for p in sorted((root / "models").glob("*.yaml")):
        models[p.stem] = parse_model(p.stem, read_yaml(p, root), rel(p, root))
    targets: dict[str, Target] = {}
    generators: dict[str, Target] = {}
    files = [p for p in sorted(root.glob("*.yaml")) if p.name not in DATA_FILES]
    for p in files + sorted((root / "generators").glob("*.yaml")):
        t = parse_target(p.stem, read_yaml(p, root), rel(p, root))
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
        if p.parent.name == "generators":
            if p.stem in targets:
                raise SpecError(t.path, "", f"a name no target has ({p.stem}.yaml is a target "
                                "too)")
            generators[p.stem] = t
        else:
            targets[p.stem] = t
    for m in models.values():
        if m.generated and m.generator_image not in generators:
            raise SpecError(m.path, "generator.image", "a generator under images/generators/: "
                            + (", ".join(sorted(generators)) or "(none)"), m.generator_image)
    prune_path = root / "prune.yaml"
    prune = parse_prune(read_yaml(prune_path, root), rel(prune_path, root)) \
        if prune_path.is_file() else ()
    return Catalog(root=root, targets=targets, models=models, bases=bases,
                   cuda_images=cuda_images, toolchain=toolchain, cuda=cuda, base_archs=base_archs, torch=torch,
                   gpus=gpus, archs=archs, generators=generators, prune=prune)
