"""Model profiles (images/models/<alias>.yaml): what a target serves, and the generated
smoke models."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ..errors import SpecError
from .schema import Doc
from .targets import ENGINES


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
    # Made by the generator (imgbuild/payload/smokegen.py in its image) rather than
    # downloaded: its scheme and seed.
    generator_scheme: str | None = None
    generator_seed: int = 0
    generator_image: str = "smoke-model"  # the generator under images/generators/ that makes it
    activations: str | None = None  # what the quantized layers compute in: fp4 (w4a4), fp8, bf16

    @property
    def generated(self) -> bool:
        return self.generator_scheme is not None

    @property
    def w4a4_nvfp4(self) -> bool:
        """Needs FP4 tensor cores (sm100/sm120 families): NVFP4 weights and activations."""
        return "nvfp4-pack-quantized" in self.quant_formats and self.activations == "fp4"



MODEL_KEYS = {"name", "checkpoint", "size_gb", "architecture", "quantization",
              "tensor_parallel", "gpus", "engine_flags", "generator"}


def parse_model(alias: str, data: Any, path: str) -> ModelProfile:
    doc = Doc(path, data)
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
    gen.reject_unknown({"scheme", "seed", "image"})
    return ModelProfile(
        alias=alias, path=path, name=doc.get("name", str), checkpoint=doc.get("checkpoint", str),
        size_gb=size, quant_method=q.get("method", str, None),
        quant_formats=q.str_list("formats"), quant_summary=q.get("summary", str, ""),
        activations=q.get("activations", str, None),
        tensor_parallel=tp, gpus=doc.get("gpus", str, None),
        architecture=doc.get("architecture", str, None), engine_flags=flags,
        generator_scheme=gen.get("scheme", str, None), generator_seed=gen.get("seed", int, 0),
        generator_image=gen.get("image", str, "smoke-model"),
    )

