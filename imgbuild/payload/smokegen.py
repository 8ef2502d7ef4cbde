"""The smoke checkpoint's generator: a tiny, random, really-NVFP4 Qwen3 made in seconds on CPU.

It runs inside the generator image (images/generators/smoke-model.yaml: llmcompressor,
compressed-tensors, transformers and CPU torch from a hash-pinned lock), so what it writes
depends on the spec and that lock, not on what the machine imgbuild runs on has installed:

    python /opt/imgbuild/smokegen.py OUT --name tiny-nvfp4 --scheme NVFP4 --seed 0 --key KEY

generate() builds a 2-layer Qwen3ForCausalLM with random weights, trains a byte-level BPE
tokenizer on the fixed corpus below, quantizes with llmcompressor (W4A4 NVFP4 needs calibration
for input_global_scale, so a few fixed sentences are fed through it on CPU) and saves it
compressed (`nvfp4-pack-quantized`). It then loads the saved checkpoint back exactly as the
image will (builder/payload/smoke.py's load_model: transformers, decompressed, bf16, CPU) and
records what that computes under imgbuild-reference/: a few decompressed weights and the logits,
greedy tokens and greedy generations on fixed prompts, with tolerances and the versions used.

Only the standard library is imported at module level (torch and the rest are imported where
they are used), so the host computes SmokeModelSpec.key() without them; builder/smokemodel.py
is the host side (the recipe key, the cache).
"""

from __future__ import annotations

import argparse
import gc
import hashlib
import importlib.metadata
import json
import os
import re
import shutil
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

try:  # builder.payload.smokegen, in the package
    from . import smoke as payload
except ImportError:  # /opt/imgbuild/smokegen.py, a script beside smoke.py in the image
    import smoke as payload  # type: ignore[no-redef]

# Bump when generate() changes what it writes, so cached checkpoints are not reused across it.
FORMAT_VERSION = 1

# The libraries whose behaviour decides the checkpoint's bytes and its reference numbers: the
# reference records their versions (the generator image's lock pins them).
KEY_DISTRIBUTIONS = (
    "torch",
    "transformers",
    "compressed-tensors",
    "llmcompressor",
    "tokenizers",
    "safetensors",
)


@dataclass(frozen=True)
class SchemeDef:
    """How a smoke scheme maps onto compressed-tensors presets.

    groups: (preset name, targets) per config group. One group gives a single top-level format;
    several give `mixed-precision` (FP8 attention + NVFP4 MLP is the case SGLang 0.5.8-0.5.16
    mishandles), which is why this is a table and not a string. Targets are module class names
    or `re:` patterns matched against module names, as in compressed-tensors.
    """

    groups: tuple[tuple[str, tuple[str, ...]], ...]
    format: str  # the expected top-level quantization_config.format

    @property
    def activations(self) -> bool:
        """Some group quantizes activations (static NVFP4 input_global_scale needs calibration)."""
        return any(preset in ACTIVATION_PRESETS for preset, _ in self.groups)


# Presets that quantize activations; NVFP4 (W4A4) also has a static per-tensor input scale.
ACTIVATION_PRESETS = ("NVFP4", "FP8", "FP8_DYNAMIC")

SCHEMES: dict[str, SchemeDef] = {
    # W4A4: weights and activations in NVFP4, the scheme Blackwell serves natively.
    "NVFP4": SchemeDef(groups=(("NVFP4", ("Linear",)),), format="nvfp4-pack-quantized"),
    # W4A16: NVFP4 weights only (no input_global_scale, no calibration).
    "NVFP4A16": SchemeDef(groups=(("NVFP4A16", ("Linear",)),), format="nvfp4-pack-quantized"),
    # Two config groups, top-level format `mixed-precision`.
    "FP8-ATTN+NVFP4-MLP": SchemeDef(
        groups=(
            ("FP8_DYNAMIC", (r"re:.*self_attn\.(q|k|v|o)_proj$",)),
            ("NVFP4", (r"re:.*mlp\.(gate|up|down)_proj$",)),
        ),
        format="mixed-precision",
    ),
}

# Modules left in bf16: the output projection, as real NVFP4 checkpoints do.
IGNORE = ("lm_head",)

# Tokenizer training text and calibration sentences. Fixed here so the checkpoint is a pure
# function of the spec and the library versions (no hub, no dataset download).
CORPUS = """\
The quick brown fox jumps over the lazy dog.
A container image pins every package it needs, down to the hash of each wheel.
Four bits per weight, sixteen weights per scale, and one global scale per tensor.
The server loads the model, allocates the cache, and answers the first request.
When the resolver is satisfied but the engine is not, the image builds and the server dies.
A smoke test loads a small model before the image is tagged for use.
Every known incompatibility is patched at build time, and each patch says why.
The lock file lists every package with its exact version and the hashes of its files.
Blackwell GPUs run four bit floating point matrix multiplications in hardware.
Older GPUs fail late, with an error that names the platform and not the fix.
The planner is a pure function: the same inputs give the same plan and the same tag.
Layers that change least come first, so a rebuild reuses the base and the heavy wheels.
Secrets reach the build as secrets and never as a layer in the image.
The registry serves the image by digest; tags move only after the push succeeds.
Quantized weights are packed two to a byte, the even index in the low nibble.
Each scale is an eight bit float, and the global scale is a thirty two bit float.
Calibration feeds a few sentences through the model to measure its activations.
The reference records the logits, the greedy tokens and the versions that produced them.
If the numbers differ beyond the tolerance, the smoke test fails and says by how much.
Small models make fast tests, and fast tests get run before every release.
The tokenizer learns merges from this text: pairs of bytes that appear together often.
Numbers like 0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 16, 32, 64, 128, 256 and 512 appear here too.
Punctuation matters: commas, periods, colons: semicolons; dashes - and (parentheses).
Hello world! Is this thing on? Yes, it is; the model is tiny, but it is real.
"""

PROMPTS = (
    "The quick brown fox jumps over the lazy dog.",
    "A container image pins every package",
    "Four bits per weight, sixteen weights per",
)

SPECIAL_TOKENS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")

# ChatML, as Qwen uses, so an engine's chat endpoint has a template to apply.
CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)


@dataclass(frozen=True)
class SmokeModelSpec:
    """Everything that decides the checkpoint's content, with the generator's environment."""

    name: str = "qwen3-nvfp4-tiny"
    scheme: str = "NVFP4"
    seed: int = 0
    hidden_size: int = 256
    intermediate_size: int = 512
    num_layers: int = 2
    num_attention_heads: int = 4
    num_key_value_heads: int = 2
    head_dim: int = 64
    vocab_size: int = 512
    max_position_embeddings: int = 1024
    calibration_samples: int = 16
    calibration_seq_len: int = 64
    generate_tokens: int = 8
    # Tolerances for the image, measured on this model (bf16, CPU). Weights-only logits
    # (activation QDQ off): sdpa -> eager attention moves them by <= 0.01; transformers 4.57.6 +
    # compressed-tensors 0.17.0 (decompressed weights one bf16 ulp off) by 0.014, decode by 0.017;
    # negating 1% of one layer's weights by ~0.1. As-loaded W4A4 logits are chaotic: rounding
    # activations to FP4 turns last-bit bf16 differences into whole FP4 steps, so eager moves
    # them by 0.14 relative, the older stack by 0.21, a x10 input_global_scale by 0.8.
    logits_atol: float = 0.04  # weights-only logits, max abs diff; greedy checked where decisive
    as_loaded_rel_tol: float = 0.5  # as-loaded logits, relative (Frobenius) error
    # Decompressed weights may differ by at most one bf16 ulp (rounding order), see payload.
    weight_rtol: float = 2.0**-7
    # Which decompressed weights the reference records: one attention, one MLP projection.
    reference_layers: tuple[str, ...] = (
        "model.layers.0.self_attn.q_proj",
        "model.layers.1.mlp.down_proj",
    )

    def __post_init__(self) -> None:
        if self.scheme not in SCHEMES:
            raise ValueError(f"scheme {self.scheme!r} is not one of {sorted(SCHEMES)}")
        if not self.name or not all(c.isalnum() or c in "-_." for c in self.name):
            raise ValueError(
                f"name {self.name!r} must be non-empty and use only letters, digits, '-', '_', '.'"
            )
        # NVFP4 groups 16 input features per scale and packs 2 per byte.
        for attr in ("hidden_size", "intermediate_size"):
            if getattr(self, attr) % 16:
                raise ValueError(
                    f"{attr}={getattr(self, attr)} must be a multiple of 16 (NVFP4 group size)"
                )
        if (self.num_attention_heads * self.head_dim) % 16:
            raise ValueError("num_attention_heads * head_dim must be a multiple of 16")
        if self.num_attention_heads % self.num_key_value_heads:
            raise ValueError("num_attention_heads must be a multiple of num_key_value_heads")
        for layer in self.reference_layers:
            m = re.fullmatch(
                r"model\.layers\.(\d+)\.(self_attn\.[qkvo]_proj|mlp\.(gate|up|down)_proj)", layer
            )
            if not m or int(m.group(1)) >= self.num_layers:
                raise ValueError(
                    f"reference layer {layer!r} is not a Linear of a {self.num_layers}-layer Qwen3"
                )
        if self.vocab_size < 256 + len(SPECIAL_TOKENS):
            raise ValueError(
                "vocab_size must cover the 256 byte-level symbols and the special tokens"
            )

    def key(self) -> str:
        """sha256 over the spec, the generator's format version and its fixed texts: the recipe.
        (What runs it is keyed beside it: builder/smokemodel.py's recipe_key.)"""
        material = {
            "format_version": FORMAT_VERSION,
            "spec": asdict(self),
            "texts": hashlib.sha256(
                json.dumps([CORPUS, PROMPTS, SPECIAL_TOKENS, CHAT_TEMPLATE, IGNORE]).encode()
            ).hexdigest(),
        }
        return hashlib.sha256(json.dumps(material, sort_keys=True).encode()).hexdigest()


def library_versions() -> dict[str, str | None]:
    """Installed versions of KEY_DISTRIBUTIONS (None when absent), without importing them."""
    out: dict[str, str | None] = {}
    for dist in KEY_DISTRIBUTIONS:
        try:
            out[dist] = importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            out[dist] = None
    return out


# ----------------------------------------------------------------------------------------------
# Generation
# ----------------------------------------------------------------------------------------------


def _train_tokenizer(spec: SmokeModelSpec) -> Any:
    """Byte-level BPE trained on CORPUS (deterministic: fixed text, single pass), wrapped as a
    transformers fast tokenizer."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(
        vocab_size=spec.vocab_size,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(CORPUS.splitlines(), trainer=trainer)
    if tok.get_vocab_size() > spec.vocab_size:
        raise RuntimeError(
            f"tokenizer has {tok.get_vocab_size()} tokens, the model {spec.vocab_size}"
        )
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        eos_token="<|endoftext|>",
        pad_token="<|endoftext|>",
        model_max_length=spec.max_position_embeddings,
    )
    fast.chat_template = CHAT_TEMPLATE
    return fast


def _save_tokenizer(tokenizer: Any, out: Path) -> None:
    tokenizer.save_pretrained(str(out))
    # transformers 5 writes tokenizer_class "TokenizersBackend", which 4.x cannot resolve;
    # "PreTrainedTokenizerFast" loads the same tokenizer.json in both (5.x aliases it).
    cfg_path = out / "tokenizer_config.json"
    cfg = json.loads(cfg_path.read_text())
    cfg["tokenizer_class"] = "PreTrainedTokenizerFast"
    # transformers 5 keeps the template in chat_template.jinja; older ones read it from here.
    cfg["chat_template"] = CHAT_TEMPLATE
    cfg_path.write_text(json.dumps(cfg, indent=2, sort_keys=True) + "\n")


def _random_model(spec: SmokeModelSpec, tokenizer: Any) -> Any:
    import torch
    from transformers import Qwen3Config, Qwen3ForCausalLM

    eos = tokenizer.convert_tokens_to_ids("<|endoftext|>")
    config = Qwen3Config(
        vocab_size=spec.vocab_size,
        hidden_size=spec.hidden_size,
        intermediate_size=spec.intermediate_size,
        num_hidden_layers=spec.num_layers,
        num_attention_heads=spec.num_attention_heads,
        num_key_value_heads=spec.num_key_value_heads,
        head_dim=spec.head_dim,
        max_position_embeddings=spec.max_position_embeddings,
        tie_word_embeddings=False,  # an untied lm_head, as the large Qwen3 checkpoints have
        eos_token_id=eos,
        pad_token_id=eos,
        bos_token_id=None,
    )
    torch.manual_seed(spec.seed)
    return Qwen3ForCausalLM(config).to(torch.bfloat16).eval()


def _calibration_dataset(spec: SmokeModelSpec, tokenizer: Any) -> Any:
    from datasets import Dataset

    lines = [line for line in CORPUS.splitlines() if line.strip()][: spec.calibration_samples]
    ids = [tokenizer(line)["input_ids"][: spec.calibration_seq_len] for line in lines]
    return Dataset.from_dict({"input_ids": ids, "attention_mask": [[1] * len(i) for i in ids]})


def _quantize(spec: SmokeModelSpec, model: Any, tokenizer: Any) -> None:
    from llmcompressor import oneshot
    from llmcompressor.modifiers.quantization import QuantizationModifier

    scheme = SCHEMES[spec.scheme]
    if len(scheme.groups) == 1:
        preset, targets = scheme.groups[0]
        modifier = QuantizationModifier(targets=list(targets), scheme=preset, ignore=list(IGNORE))
    else:
        modifier = QuantizationModifier(
            scheme={preset: list(targets) for preset, targets in scheme.groups}, ignore=list(IGNORE)
        )
    kwargs: dict[str, Any] = {}
    if scheme.activations:
        kwargs.update(
            dataset=_calibration_dataset(spec, tokenizer),
            num_calibration_samples=spec.calibration_samples,
            max_seq_length=spec.calibration_seq_len,
            shuffle_calibration_samples=False,
        )
    oneshot(model=model, tokenizer=tokenizer, recipe=modifier, **kwargs)


def _linear_shapes(model: Any) -> dict[str, tuple[int, int]]:
    import torch

    return {
        name: (m.out_features, m.in_features)
        for name, m in model.named_modules()
        if isinstance(m, torch.nn.Linear)
    }


def _matches(name: str, targets: tuple[str, ...]) -> bool:
    # Class-name targets are "Linear" here: every Linear matches.
    return any(t == "Linear" or (t.startswith("re:") and re.match(t[3:], name)) for t in targets)


def nvfp4_linears(scheme: SchemeDef, linears: dict[str, tuple[int, int]]) -> dict[str, bool]:
    """Linear name -> W4A4 (True) or W4A16 (False), for the Linears an NVFP4 group quantizes."""
    out: dict[str, bool] = {}
    for name in linears:
        if name in IGNORE:
            continue
        for preset, targets in scheme.groups:
            if preset.startswith("NVFP4") and _matches(name, targets):
                out[name] = preset == "NVFP4"
                break
            if _matches(name, targets):  # first matching group wins, as in compressed-tensors
                break
    return out


def check_nvfp4_layout(
    layout: dict[str, dict[str, Any]],
    linears: dict[str, tuple[int, int]],
    nvfp4: dict[str, bool],
) -> list[str]:
    """Problems with a checkpoint's NVFP4 tensors, per DESIGN.md: for each NVFP4 Linear,
    weight_packed uint8 [out, in/2], weight_scale float8_e4m3fn [out, in/16],
    weight_global_scale float32 [1], and input_global_scale float32 [1] for W4A4; no dense
    weight. Ignored Linears (lm_head) stay dense bf16."""
    problems = []
    for name, (out, inp) in sorted(linears.items()):
        want: dict[str, dict[str, Any]] = {}
        if name in IGNORE:
            want[f"{name}.weight"] = {"dtype": "BF16", "shape": [out, inp]}
        elif name in nvfp4:
            want[f"{name}.weight_packed"] = {"dtype": "U8", "shape": [out, inp // 2]}
            want[f"{name}.weight_scale"] = {"dtype": "F8_E4M3", "shape": [out, inp // 16]}
            want[f"{name}.weight_global_scale"] = {"dtype": "F32", "shape": [1]}
            if nvfp4[name]:
                want[f"{name}.input_global_scale"] = {"dtype": "F32", "shape": [1]}
            elif f"{name}.input_global_scale" in layout:
                problems.append(f"{name}.input_global_scale present in a weight-only layer")
            if f"{name}.weight" in layout:
                problems.append(f"{name}.weight stored dense next to weight_packed")
        for tensor, expected in want.items():
            if layout.get(tensor) != expected:
                problems.append(f"{tensor}: expected {expected}, found {layout.get(tensor)}")
    return problems


def _record_reference(spec: SmokeModelSpec, out: Path, linears: dict[str, tuple[int, int]],
                      key: str) -> None:
    """Load the saved checkpoint as the image will (payload.load_model) and write
    imgbuild-reference/: decompressed weights, W4A4 logits as loaded, and weights-only logits,
    greedy tokens and greedy generations (activation QDQ off, see SmokeModelSpec.logits_atol)."""
    import torch
    from safetensors.torch import save_file

    activations = SCHEMES[spec.scheme].activations
    model, load_info = payload.load_model(out)
    prompt_ids = _prompt_ids(out)
    tensors: dict[str, torch.Tensor] = {}
    weights: dict[str, Any] = {}
    for layer in spec.reference_layers:
        w = model.get_submodule(layer).weight.detach().contiguous()
        tensors[f"weight.{layer}"] = w.clone()
        weights[layer] = {"tensor": f"weight.{layer}", **payload.weight_digest(w)}

    prompts: list[dict[str, Any]] = [
        {"text": text, "input_ids": ids, "tensor": f"logits.{i}"}
        for i, (text, ids) in enumerate(zip(PROMPTS, prompt_ids))
    ]
    if activations:
        for i, prompt in enumerate(prompts):
            logits = payload.compute_logits(model, prompt["input_ids"])
            tensors[f"logits_as_loaded.{i}"] = logits.contiguous()
            prompt.update(
                tensor_as_loaded=f"logits_as_loaded.{i}",
                greedy_next_as_loaded=int(logits[-1].argmax()),
            )
    payload.set_activation_quantization(model, False)
    for i, prompt in enumerate(prompts):
        logits = payload.compute_logits(model, prompt["input_ids"])
        tensors[f"logits.{i}"] = logits.contiguous()
        generated, margins, gen_logits = payload.greedy_generate(
            model, prompt["input_ids"], spec.generate_tokens
        )
        tensors[f"generate.{i}"] = gen_logits.contiguous()
        prompt.update(
            tensor_generate=f"generate.{i}",
            greedy=logits.argmax(-1).tolist(),
            greedy_next=int(logits[-1].argmax()),
            margins=payload.top2_margin(logits).tolist(),
            generated=generated,
            generate_margins=margins,
        )
        if activations:
            prompt["as_loaded_vs_weights_only"] = payload.relative_error(
                tensors[f"logits_as_loaded.{i}"], tensors[f"logits.{i}"]
            )
    del model
    gc.collect()

    ref_dir = out / payload.REFERENCE_DIR
    ref_dir.mkdir()
    save_file(tensors, str(ref_dir / payload.REFERENCE_TENSORS), metadata={"format": "pt"})
    reference = {
        "schema": payload.REFERENCE_SCHEMA,
        "key": key,
        "spec": asdict(spec),
        "format": SCHEMES[spec.scheme].format,
        "activations": activations,
        "dtype": "bfloat16",
        "loader": load_info["api"],
        "versions": library_versions(),
        "weight_rtol": spec.weight_rtol,
        "logits_atol": spec.logits_atol,
        "as_loaded_rel_tol": spec.as_loaded_rel_tol,
        "weights": weights,
        "prompts": prompts,
        "layout": payload.safetensors_layout(out),
        "linears": {name: list(shape) for name, shape in linears.items()},
        "files": payload.file_manifest(out),
    }
    # Written last: its presence (with matching key and files) marks a complete checkpoint.
    (ref_dir / payload.REFERENCE_JSON).write_text(
        json.dumps(reference, indent=2, sort_keys=True) + "\n"
    )


def _prompt_ids(model_dir: Path) -> list[list[int]]:
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(model_dir))
    return [tok(p)["input_ids"] for p in PROMPTS]


def _build(spec: SmokeModelSpec, out: Path, key: str) -> None:
    import torch
    from transformers import AutoModelForCausalLM

    tokenizer = _train_tokenizer(spec)
    model = _random_model(spec, tokenizer)
    linears = _linear_shapes(model)
    # oneshot re-reads the model's config from model.config.name_or_path, so the random model
    # goes through disk first (a few hundred KB).
    with tempfile.TemporaryDirectory(prefix=".base-", dir=out.parent) as base:
        model.save_pretrained(base)
        _save_tokenizer(tokenizer, Path(base))
        del model
        model = AutoModelForCausalLM.from_pretrained(base, dtype=torch.bfloat16)
        _quantize(spec, model, tokenizer)
        model.save_pretrained(str(out), save_compressed=True)
    _save_tokenizer(tokenizer, out)
    del model
    gc.collect()

    scheme = SCHEMES[spec.scheme]
    config = json.loads((out / "config.json").read_text())
    fmt = (config.get("quantization_config") or {}).get("format")
    if fmt != scheme.format:
        raise RuntimeError(f"saved quantization format is {fmt!r}, expected {scheme.format!r}")
    nvfp4 = nvfp4_linears(scheme, linears)
    if not nvfp4:
        raise RuntimeError(f"scheme {spec.scheme} quantizes no Linear to NVFP4")
    problems = check_nvfp4_layout(payload.safetensors_layout(out), linears, nvfp4)
    if problems:
        raise RuntimeError("NVFP4 layout differs from DESIGN.md: " + "; ".join(problems[:5]))
    _record_reference(spec, out, linears, key)


def _make_readable(root: Path) -> None:
    """mkdtemp makes 0700 and safetensors writes 0600; the image may run its smoke as a
    non-root user, and COPY keeps modes."""
    for path in [root, *root.rglob("*")]:
        path.chmod(0o755 if path.is_dir() else 0o644)


def generate(spec: SmokeModelSpec, out_dir: Path, *, overwrite: bool = False,
             key: str | None = None) -> Path:
    """Write the smoke checkpoint and its reference to out_dir; return out_dir.

    key: what the reference records as the checkpoint's key (the host's recipe key; default
    the spec's own). Built in a temporary directory beside out_dir and renamed into place, so
    out_dir is either absent or complete. Raises FileExistsError if out_dir exists (unless
    overwrite)."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")  # nothing here may reach the hub
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    # llmcompressor logs INFO (and "no accelerator" warnings) to stdout; read at its import.
    os.environ.setdefault("LLM_COMPRESSOR_LOG_LEVEL", "ERROR")
    out_dir = Path(out_dir).absolute()
    if out_dir.exists() and not overwrite:
        raise FileExistsError(f"{out_dir} exists; pass overwrite=True (CLI: --force) to replace it")
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.", suffix=".tmp", dir=out_dir.parent))
    try:
        _build(spec, tmp, key or spec.key())
        _make_readable(tmp)
        if overwrite and out_dir.exists():
            old = Path(
                tempfile.mkdtemp(prefix=f".{out_dir.name}.", suffix=".old", dir=out_dir.parent)
            )
            os.replace(out_dir, old / "x")
            os.replace(tmp, out_dir)
            shutil.rmtree(old, ignore_errors=True)
        else:
            try:
                os.rename(tmp, out_dir)
            except OSError as exc:  # another process published first
                raise FileExistsError(f"{out_dir} appeared while generating") from exc
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return out_dir


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="smokegen.py", description="Generate the NVFP4 smoke checkpoint"
    )
    parser.add_argument("out_dir", type=Path, help="directory to create")
    parser.add_argument("--scheme", default=SmokeModelSpec.scheme, choices=sorted(SCHEMES))
    parser.add_argument("--seed", type=int, default=SmokeModelSpec.seed)
    parser.add_argument("--name", default=SmokeModelSpec.name)
    parser.add_argument("--force", action="store_true", help="replace out_dir if it exists")
    parser.add_argument("--key", help="the key the reference records (default: the spec's)")
    args = parser.parse_args(argv)
    try:
        spec = SmokeModelSpec(name=args.name, scheme=args.scheme, seed=args.seed)
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    started = time.perf_counter()
    try:
        out = generate(spec, args.out_dir, overwrite=args.force, key=args.key)
    except FileExistsError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    size = sum(p.stat().st_size for p in out.rglob("*") if p.is_file())
    print(f"{out}  ({size / 1e6:.2f} MB, key {(args.key or spec.key())[:16]}, "
          f"{time.perf_counter() - started:.1f}s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
