"""The catalog: targets, model profiles and the hardware tables under images/, read and
validated together, cross-references included. (Patches and the check tables are read by
their own modules, through the Workspace, when a command needs them.)"""

from __future__ import annotations

import difflib
from collections.abc import Sequence
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
from .layers import BUILTIN, PROJECT, Layer, RawTarget, resolve_targets
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
    # Layers (catalog/layers.py): "target NAME" / "model NAME" -> the lower layer's file that
    # a higher layer's shadows; each target's fields -> the file each came from (`extends:`);
    # each target's and model's layer.
    shadowed: dict[str, str] = field(default_factory=dict, hash=False)
    provenance: dict[str, dict[str, str]] = field(default_factory=dict, hash=False)
    origin: dict[str, str] = field(default_factory=dict, hash=False)
    model_origin: dict[str, str] = field(default_factory=dict, hash=False)

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
DATA_FILES = {"bases.yaml", "gpus.yaml", "cuda.yaml", "prune.yaml", "registries.yaml"}


def load_catalog(root: Path | Sequence[Path] | Sequence[Layer]) -> Catalog:
    """Read and validate every file under images/ (under each layer's, lowest first: a name in
    a higher layer shadows the same name below it, a table such as bases.yaml is the highest
    layer's that has one). Cross-references are checked here too."""
    layers = _layers(root)
    for layer in layers:
        if not layer.images.is_dir():
            raise InputError(f"no images/ directory at {layer.images}",
                             hint="pass --images DIR (or set IMGBUILD_IMAGES)")

    def table(name: str, required: bool = True) -> tuple[Path, Path] | None:
        for layer in reversed(layers):
            if (layer.images / name).is_file():
                return layer.images / name, layer.images
        if required:
            # The lowest layer's path in the message: the file a catalog is expected to have.
            read_yaml(layers[0].images / name, layers[0].images)
        return None

    (bp, br), (gp, gr), (cp, cr) = table("bases.yaml"), table("gpus.yaml"), table("cuda.yaml")
    bases, cuda_images, toolchain = parse_bases(read_yaml(bp, br), rel(bp, br))
    gpus, archs = parse_gpus(read_yaml(gp, gr), rel(gp, gr))
    cuda, base_archs, torch = parse_cuda(read_yaml(cp, cr), rel(cp, cr))
    models: dict[str, ModelProfile] = {}
    shadowed: dict[str, str] = {}
    model_layer: dict[str, str] = {}
    for layer in layers:
        root_ = layer.images
        for p in sorted((root_ / "models").glob("*.yaml")):
            if p.stem in models:
                shadowed[f"model {p.stem}"] = layer_of(models[p.stem].path, model_layer[p.stem])
            models[p.stem] = parse_model(p.stem, read_yaml(p, root_), rel(p, root_))
            model_layer[p.stem] = layer.label
    raw: list[dict[str, RawTarget]] = []
    gen_raw: dict[str, tuple[Path, Path]] = {}
    for i, layer in enumerate(layers):
        root_ = layer.images
        mine: dict[str, RawTarget] = {}
        for p in sorted(root_.glob("*.yaml")):
            if p.name in DATA_FILES:
                continue
            mine[p.stem] = RawTarget(p.stem, rel(p, root_), read_yaml(p, root_), i)
            below = next((r[p.stem] for r in reversed(raw) if p.stem in r), None)
            if below is not None:
                shadowed[f"target {p.stem}"] = layers[below.layer].where(below.path, True)
        raw.append(mine)
        for p in sorted((root_ / "generators").glob("*.yaml")):
            gen_raw[p.stem] = (p, root_)
    targets: dict[str, Target] = {}
    generators: dict[str, Target] = {}
    provenance: dict[str, dict[str, str]] = {}
    origin: dict[str, str] = {}
    resolved = resolve_targets(layers, raw)
    parsed = [(parse_target(name, data, t.path), False, prov, layers[t.layer].label)
              for name, (t, data, prov) in resolved.items()]
    for name, (p, r) in gen_raw.items():
        parsed.append((parse_target(name, read_yaml(p, r), rel(p, r)), True, {},
                       next(layer.label for layer in layers if layer.images == r)))
    for t, is_generator, prov, label in parsed:
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
        if is_generator:
            if t.name in targets:
                raise SpecError(t.path, "", f"a name no target has ({t.name}.yaml is a target "
                                "too)")
            generators[t.name] = t
        else:
            targets[t.name] = t
            provenance[t.name] = prov
        origin[t.name] = label
    for m in models.values():
        if m.generated and m.generator_image not in generators:
            raise SpecError(m.path, "generator.image", "a generator under images/generators/: "
                            + (", ".join(sorted(generators)) or "(none)"), m.generator_image)
    found = table("prune.yaml", required=False)
    prune = parse_prune(read_yaml(found[0], found[1]), rel(found[0], found[1])) if found else ()
    return Catalog(root=layers[-1].images, targets=targets, models=models, bases=bases,
                   cuda_images=cuda_images, toolchain=toolchain, cuda=cuda,
                   base_archs=base_archs, torch=torch, gpus=gpus, archs=archs,
                   generators=generators, prune=prune, shadowed=shadowed,
                   provenance=provenance, origin=origin, model_origin=model_layer)


def layer_of(path: str, label: str) -> str:
    return f"{path} ({label})"


def _layers(root: Path | Sequence[Path] | Sequence[Layer]) -> list[Layer]:
    if isinstance(root, (str, Path)):
        return [Layer(Path(root), PROJECT)]
    given = list(root)
    if given and isinstance(given[0], Layer):
        return given  # type: ignore[return-value]
    return [Layer(Path(p), BUILTIN if i < len(given) - 1 else PROJECT)
            for i, p in enumerate(given)]
