"""Model profiles (images/models/<alias>.yaml): what a target serves, and the generated
smoke models.

A profile whose checkpoint is a Hugging Face repo id or a local path may leave out
`quantization:` (and `name:`): the quantization is then the checkpoint's own, read from its
config.json when the profile is used (catalog/checkpoints.py), never when the catalog is
loaded, so listing the catalog stays offline."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import PurePosixPath
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
    revision: str | None = None  # a hub checkpoint's branch, tag or commit (default: main)
    # No `quantization:` in the profile: method, formats, activations, summary (and architecture
    # when not given) are the checkpoint's config.json's (catalog/checkpoints.resolve_profile).
    quant_from_checkpoint: bool = False

    @property
    def generated(self) -> bool:
        return self.generator_scheme is not None

    @property
    def w4a4_nvfp4(self) -> bool:
        """Needs FP4 tensor cores (sm100/sm120 families): NVFP4 weights and activations."""
        return "nvfp4-pack-quantized" in self.quant_formats and self.activations == "fp4"



MODEL_KEYS = {"name", "checkpoint", "size_gb", "architecture", "quantization",
              "tensor_parallel", "gpus", "engine_flags", "generator", "revision"}
QUANTIZATION_KEYS = {"method", "formats", "summary", "activations"}
GENERATOR_KEYS = {"scheme", "seed", "image"}

GENERATED_PREFIX = "generated:"
# A Hugging Face repo id: owner/name, nothing else. A local directory of that shape is written
# ./owner/name; anything starting with / . ~ or with more parts is a path.
REPO_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")


def checkpoint_kind(checkpoint: str) -> str:
    """generated (made by the smoke-model generator), hub (a repo id) or path (a local path,
    relative to the project root unless absolute)."""
    if checkpoint.startswith(GENERATED_PREFIX):
        return "generated"
    if REPO_ID.match(checkpoint) and not checkpoint.startswith((".", "/", "~")):
        return "hub"
    return "path"


def parse_model(alias: str, data: Any, path: str) -> ModelProfile:
    doc = Doc(path, data)
    doc.reject_unknown(MODEL_KEYS)
    checkpoint = doc.get("checkpoint", str)
    if not checkpoint.strip():
        raise SpecError(path, "checkpoint", "a Hugging Face repo id (org/name), a local path "
                        "or generated:NAME", checkpoint)
    kind = checkpoint_kind(checkpoint)
    revision = doc.get("revision", str, None)
    if revision is not None and kind != "hub":
        raise SpecError(path, "revision", "no revision: it is a Hugging Face repo's branch, tag "
                        "or commit, and the checkpoint is " + (
                            "generated" if kind == "generated" else "a local path"), revision)
    # Stated quantization is taken as written (every built-in profile states it); left out, a
    # hub or local checkpoint's own config.json says it.
    from_checkpoint = doc.get("quantization", dict, None) is None and kind != "generated"
    name = doc.get("name", str, None) if kind != "generated" else doc.get("name", str)
    if name is None:  # the checkpoint's last path part: My-Model-NVFP4 of my-org/My-Model-NVFP4
        name = PurePosixPath(checkpoint.rstrip("/")).name or checkpoint
    q = doc.sub("quantization", doc.get("quantization", dict, {}))
    q.reject_unknown(QUANTIZATION_KEYS)
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
    gen.reject_unknown(GENERATOR_KEYS)
    if kind == "generated" and gen.get("scheme", str, None) is None:
        # Without a scheme nothing can make it, and nothing else reads it: refused here, not
        # as a missing hub repo or directory when a target serves it.
        raise SpecError(path, "generator.scheme", "the scheme the generator quantizes with, "
                        "e.g. NVFP4 (a generated: checkpoint is made here, not downloaded)")
    return ModelProfile(
        alias=alias, path=path, name=name, checkpoint=checkpoint,
        size_gb=size, quant_method=q.get("method", str, None),
        quant_formats=q.str_list("formats"), quant_summary=q.get("summary", str, ""),
        activations=q.get("activations", str, None),
        tensor_parallel=tp, gpus=doc.get("gpus", str, None),
        architecture=doc.get("architecture", str, None), engine_flags=flags,
        generator_scheme=gen.get("scheme", str, None), generator_seed=gen.get("seed", int, 0),
        generator_image=gen.get("image", str, "smoke-model"),
        revision=revision, quant_from_checkpoint=from_checkpoint,
    )

