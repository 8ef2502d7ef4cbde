"""A model profile's quantization, read from its checkpoint's own config.json (a Hugging Face
repo id or a local path) when the profile does not state it.

Reading config.json is shared with check-model (imgbuild/checks/checkmodel/checkpoint.py, which
imports it from here: the catalog sits below the checks): the bounded JSON read with its
errors, where engines look for the quantization config, and the hub download through
huggingface_hub (its own cache, HF_HUB_OFFLINE and HF_TOKEN; nothing is cached anywhere else).
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from ..errors import EnvError, ImgbuildError, InputError
from .models import ModelProfile, checkpoint_kind

# The largest config.json or safetensors index read. Real ones are kilobytes (config) to a few
# megabytes (the index of a 1T-parameter model: ~100k tensors, ~8 MB); anything past this is
# not a checkpoint's metadata, and reading it whole would cost twice its size in memory.
MAX_JSON_BYTES = 64 * 1024 * 1024

# The way out of every failure to read a profile's checkpoint: the profile can always be made
# to stand on its own.
PROFILE_HINT = ("download config.json into a local directory and point `checkpoint:` at it, "
                "or state `quantization:` in the profile")


# --- reading config.json (shared with check-model, whose wording these messages keep) --------

def read_json(path: Path) -> tuple[dict[str, Any], str]:
    """A JSON object from a file of at most MAX_JSON_BYTES, and its text."""
    try:
        size = path.stat().st_size
        if size > MAX_JSON_BYTES:
            raise InputError(f"{path}: {size / 2**20:,.0f} MiB, more than check-model reads "
                             f"({MAX_JSON_BYTES // 2**20} MiB)",
                             facts=["a checkpoint's config.json is kilobytes and its safetensors "
                                    "index a few megabytes"],
                             hint="point check-model at the checkpoint's config.json (and "
                                  "model.safetensors.index.json), not at a weights file")
        with open(path, "rb") as f:
            # Bounded even where stat() cannot tell (a pipe, /proc): one byte past the cap.
            raw = f.read(MAX_JSON_BYTES + 1)
        if len(raw) > MAX_JSON_BYTES:
            raise InputError(f"{path}: more than check-model reads ({MAX_JSON_BYTES // 2**20} MiB)")
        text = raw.decode("utf-8")
    except OSError as e:
        raise InputError(f"{path}: cannot read: {e.strerror}") from None
    except UnicodeDecodeError as e:
        raise InputError(f"{path}: not UTF-8 text (byte {e.start})",
                         hint="config.json is JSON in UTF-8; point check-model at the "
                              "checkpoint directory or its config.json") from None
    try:
        data = json.loads(text)
    except ValueError as e:
        raise InputError(f"{path}: not valid JSON ({e})",
                         hint="point check-model at a checkpoint directory or its config.json") from None
    if not isinstance(data, dict):
        raise InputError(f"{path}: expected a JSON object, got {type(data).__name__}")
    return data, text


def quant_config(config: Mapping[str, Any]) -> tuple[dict[str, Any] | None, tuple[str, ...]]:
    """The quantization config and the keys that lead to it (engines look in this order)."""
    for key in ("quantization_config", "compression_config"):
        q = config.get(key)
        if isinstance(q, dict):
            return q, (key,)
    tc = config.get("text_config")
    if isinstance(tc, dict) and isinstance(tc.get("quantization_config"), dict):
        return tc["quantization_config"], ("text_config", "quantization_config")
    return None, ()


def hub_module() -> Any:
    """huggingface_hub, imported only when a repo id is read (it is not a dependency)."""
    try:
        import huggingface_hub
    except ImportError:
        raise EnvError("huggingface_hub is not installed",
                       hint="download the checkpoint's config.json and "
                            "model.safetensors.index.json and pass their directory") from None
    return huggingface_hub


def hub_file(repo: str, filename: str = "config.json", revision: str | None = None, *,
             cache_first: bool = False) -> Path:
    """One file of a hub repository, through huggingface_hub's cache. cache_first: a copy in
    the cache is used without asking the hub (what planning wants: the same answer offline and
    on, no request per command); otherwise huggingface_hub decides (it asks the hub for the
    revision's commit unless HF_HUB_OFFLINE is set, and falls back to its cache)."""
    try:
        hh = hub_module()
    except EnvError as e:
        raise EnvError(f"cannot read {repo}: {e.message}", hint=e.hint) from None
    from huggingface_hub.utils import RepositoryNotFoundError

    if cache_first:
        cached = hh.try_to_load_from_cache(repo, filename, revision=revision)
        if isinstance(cached, str):
            return Path(cached)
    try:
        return Path(hh.hf_hub_download(repo, filename, revision=revision))
    except RepositoryNotFoundError:
        raise InputError(f"no repository {repo} on the Hugging Face hub",
                         hint="check the repo id (and HF_TOKEN for a gated model)") from None
    except Exception as e:  # offline, unreachable, gated: all end the same way
        raise EnvError(f"cannot read {repo} from the Hugging Face hub",
                       facts=[f"{type(e).__name__}: {str(e).splitlines()[0][:200] if str(e) else ''}",
                              f"HF_HUB_OFFLINE={os.environ.get('HF_HUB_OFFLINE', '')!s}"],
                       hint="download config.json and model.safetensors.index.json of the "
                            "checkpoint and pass their directory") from None


# --- what config.json says about quantization ------------------------------------------------

@dataclass(frozen=True)
class Quantization:
    """A checkpoint's quantization as a model profile states it."""

    method: str | None
    formats: tuple[str, ...]
    activations: str | None  # fp4, fp8, int8, bf16 (weights only); None: not quantized / unknown
    summary: str


# Activation types from the most demanding of the hardware down: a checkpoint with W4A4 NVFP4
# layers among FP8 ones needs what the NVFP4 layers need.
_ACT_ORDER = ("fp4", "fp8", "int8", "bf16")
# compressed-tensors preset names (a config group written as {preset: [targets]}).
_PRESET = {"NVFP4": ("NVFP4 W4A4", "fp4"), "NVFP4A16": ("NVFP4 W4A16", "bf16"),
           "MXFP4": ("MXFP4 W4A4", "fp4"), "MXFP4A16": ("MXFP4 W4A16", "bf16"),
           "W4A16": ("INT4 W4A16", "bf16"), "W4A16_ASYM": ("INT4 W4A16", "bf16"),
           "W8A16": ("INT8 W8A16", "bf16"), "W8A8": ("INT8 W8A8", "int8"),
           "FP8": ("FP8 W8A8", "fp8"), "FP8_DYNAMIC": ("FP8 W8A8", "fp8"),
           "FP8_BLOCK": ("FP8 W8A8", "fp8"), "W4AFP8": ("INT4 W4A8", "fp8")}
_MODELOPT_ACTS = {"NVFP4": "fp4", "MXFP4": "fp4", "FP8": "fp8", "W4A8_AWQ": "fp8",
                  "W4A16_AWQ": "bf16", "NVFP4_AWQ": "fp4"}


def _act(args: Any) -> str | None:
    """What a group's input_activations compute in: None (absent) is weights only."""
    if args is None:
        return "bf16"
    if not isinstance(args, dict):
        return None
    bits, typ = args.get("num_bits"), args.get("type", "int")
    if typ == "float" and bits == 4:
        return "fp4"
    if typ == "float" and bits == 8:
        return "fp8"
    if typ == "int" and bits == 8:
        return "int8"
    return f"{typ}{bits}" if isinstance(bits, int) and isinstance(typ, str) else None


def _label(weights: Any, act: str | None) -> str | None:
    """A group's scheme in the words model cards use: NVFP4 W4A4, INT4 W4A16, FP8 W8A8."""
    if not isinstance(weights, dict) or not isinstance(weights.get("num_bits"), int):
        return None
    bits, typ = weights["num_bits"], weights.get("type", "int")
    name = {("float", 4): "NVFP4" if weights.get("group_size") == 16 else "FP4",
            ("float", 8): "FP8"}.get((typ, bits), f"{str(typ).upper()}{bits}")
    a = {"fp4": "4", "fp8": "8", "int8": "8", "bf16": "16"}.get(act or "", "?")
    return f"{name} W{bits}A{a}"


def _most_demanding(acts: list[str | None]) -> str | None:
    known = [a for a in acts if a in _ACT_ORDER]
    return min(known, key=_ACT_ORDER.index) if known else None


def _add(out: list[str], v: Any) -> None:
    if isinstance(v, str) and v not in out:
        out.append(v)


def quantization_of(config: Mapping[str, Any]) -> Quantization:
    """The quantization a checkpoint's config.json declares (compressed-tensors fully; modelopt,
    fp8, awq and gptq as far as their configs say)."""
    q, _ = quant_config(config)
    if q is None:
        return Quantization(None, (), None, "unquantized (config.json has no quantization_config)")
    method = q.get("quant_method") if isinstance(q.get("quant_method"), str) else None
    if method is None and "config_groups" in q:
        method = "compressed-tensors"  # older compression_config: no quant_method
    formats: list[str] = []
    labels: list[str] = []
    acts: list[str | None] = []
    if method == "compressed-tensors":
        _add(formats, q.get("format"))
        groups = q.get("config_groups")
        for name, gc in (groups.items() if isinstance(groups, dict) else ()):
            if isinstance(gc, list):  # {preset: [targets]}
                label, act = _PRESET.get(str(name), (None, None))
                _add(labels, label)
                acts.append(act)
                continue
            if not isinstance(gc, dict):
                continue
            _add(formats, gc.get("format"))
            act = _act(gc.get("input_activations"))
            acts.append(act)
            _add(labels, _label(gc.get("weights"), act))
    elif method == "modelopt":
        algo = q.get("quant_algo")
        if isinstance(algo, str):
            _add(formats, algo.lower())
            acts.append(_MODELOPT_ACTS.get(algo.upper()))
            _add(labels, algo.upper())
    elif method == "fp8":
        _add(formats, "fp8")
        # FP8 W8A8: activations are quantized, dynamically or from static scales.
        acts.append("fp8")
        _add(labels, "FP8 W8A8" + (" block-wise" if q.get("weight_block_size") else ""))
    elif method in ("awq", "gptq"):
        _add(formats, q.get("checkpoint_format") or q.get("version") or method)
        acts.append("bf16")  # weights only: the layers compute in 16 bits
        bits = q.get("bits")
        _add(labels, f"{method.upper()} INT{bits} W{bits}A16" if isinstance(bits, int)
             else method.upper())
    else:
        _add(formats, q.get("format"))
    summary = " + ".join(labels) if labels else (method or "quantized")
    return Quantization(method, tuple(formats), _most_demanding(acts),
                        f"{summary} (from config.json)")


# --- a model profile ------------------------------------------------------------------------

def checkpoint_dir(profile: ModelProfile, project_root: Path) -> Path:
    """Where a profile's local checkpoint is: relative paths are the project's (the directory
    that holds its images/), not the current directory's."""
    p = Path(profile.checkpoint).expanduser()
    return p if p.is_absolute() else Path(project_root) / p


def local_checkpoint(profile: ModelProfile, project_root: Path) -> Path | None:
    """The local directory (or file) a profile's checkpoint names; None for a hub id. A
    directory in the project spelled like a repo id (models/qwen, as `imgbuild init` writes a
    checkpoint inside the project) is that directory, as check-model prefers a path that
    exists; `revision:` always means the hub."""
    kind = checkpoint_kind(profile.checkpoint)
    if kind == "generated":
        return None
    p = checkpoint_dir(profile, project_root)
    if kind == "hub" and (profile.revision is not None or not p.exists()):
        return None
    return p


def _fail(profile: ModelProfile, what: str, err: ImgbuildError | None = None, *,
          facts: tuple[str, ...] | list[str] = (), hint: str = PROFILE_HINT) -> ImgbuildError:
    """An error that names the profile file and its checkpoint, the chain that led there, and
    the way out."""
    chain = list(facts)
    if err is not None:
        chain += [err.message, *err.facts]
    cls = EnvError if isinstance(err, EnvError) else InputError
    return cls(f"{profile.path}: checkpoint {profile.checkpoint}: {what}", facts=chain,
               hint=hint)


def read_config(profile: ModelProfile, project_root: Path) -> tuple[dict[str, Any], str]:
    """The profile's checkpoint's config.json, and where it was read (a file, or repo@revision).
    A hub id is read through huggingface_hub's cache first."""
    p = local_checkpoint(profile, project_root)
    if p is None:
        where = profile.checkpoint + (f"@{profile.revision}" if profile.revision else "")
        try:
            path = hub_file(profile.checkpoint, "config.json", profile.revision, cache_first=True)
        except ImgbuildError as e:
            hint = (f"{PROFILE_HINT}; or, with the hub reachable and HF_HUB_OFFLINE unset (and "
                    "HF_TOKEN for a gated model), run the command again: huggingface_hub "
                    "caches config.json") if isinstance(e, EnvError) else \
                f"check the repo id and `revision:` (HF_TOKEN for a gated model); {PROFILE_HINT}"
            raise _fail(profile, "cannot read config.json from the Hugging Face hub", e,
                        facts=[f"HF_HOME={os.environ.get('HF_HOME', '')}"],
                        hint=hint) from None
        try:
            return read_json(path)[0], where
        except InputError as e:
            raise _fail(profile, "config.json from the hub is not readable JSON", e) from None
    looked = [f"looked for {p}"] + ([] if Path(profile.checkpoint).expanduser().is_absolute()
                                    else [f"a relative path is read from the project root "
                                          f"({project_root})"])
    if p.is_dir():
        cfg = p / "config.json"
        if not cfg.is_file():
            raise _fail(profile, f"no config.json in {p}", facts=looked)
    elif p.is_file():
        cfg = p
    else:
        raise _fail(profile, "no such directory", facts=looked)
    try:
        return read_json(cfg)[0], str(cfg)
    except InputError as e:
        raise _fail(profile, "config.json is not readable JSON", e,
                    hint="fix config.json (or download it again), or state `quantization:` in "
                         "the profile") from None


def resolve_profile(profile: ModelProfile, project_root: Path) -> ModelProfile:
    """The profile with its quantization filled in from the checkpoint's config.json where the
    profile leaves it out (relative paths are the project's); any other profile unchanged."""
    if not profile.quant_from_checkpoint:
        return profile
    config, where = read_config(profile, project_root)
    if config.get("quantization_config") is not None \
            and not isinstance(config["quantization_config"], dict):
        raise _fail(profile, "config.json's quantization_config is not a mapping",
                    facts=[f"{where}: quantization_config is "
                           f"{type(config['quantization_config']).__name__}"])
    q = quantization_of(config)
    arch = profile.architecture
    archs = config.get("architectures")
    if arch is None and isinstance(archs, list) and archs and isinstance(archs[0], str):
        arch = archs[0]
    return replace(profile, quant_method=q.method, quant_formats=q.formats,
                   activations=q.activations, quant_summary=q.summary, architecture=arch)
