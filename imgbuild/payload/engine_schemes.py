"""In-image probe: does the image's OWN engine pick, for every layer of a checkpoint, the
quantization scheme the checkpoint declares, on each target GPU arch? No GPU, no network.

    python engine_schemes.py --model DIR --engine sglang|vllm --arch sm100 [--arch sm120 ...]
                             [--json]

1. Reads DIR/config.json's `quantization_config` and the checkpoint's tensor names (the
   safetensors headers, or model.safetensors.index.json's weight map): every Linear-like
   module (a `.weight` of two dimensions, or a `.weight_packed`) is listed; it is quantized
   when it carries quantization tensors (`weight_packed`, `weight_scale`, ...).
2. Parses the quantization config with the engine's own `CompressedTensorsConfig.from_config`.
3. Asks the engine's own scheme selection for every module (`get_linear_scheme` / `get_scheme`
   with a `torch.nn.Linear` on the meta device; fused MoE experts, `...experts.N.proj`, once per
   `...experts` block through the engine's MoE path), with the GPU capability queries answered
   for each requested arch: torch.cuda's capability (and availability) is what SGLang's
   `_check_scheme_supported` and `is_blackwell_supported` read, vLLM's is
   `current_platform.get_device_capability()`; the engine's own comparison does the rest.
4. Compares with what the checkpoint declares (its config group's weights/activations, mapped
   to engine scheme classes by EXPECTED below; unquantized modules expect no scheme) and
   reports every mismatch with the engine's exception text when it raised.

This file is copied into images like smoke.py: only the standard library at module level; the
engine and torch are imported inside functions (their import is timed and reported).

Exit status: 0 no mismatch, 1 a mismatch (or the engine could not be imported or could not
parse the config), 2 bad arguments or an unreadable checkpoint.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import importlib.metadata
import json
import re
import sys
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

# ----------------------------------------------------------------------------------------------
# Data: archs, declared schemes, and the engine scheme classes each declared scheme must get
# ----------------------------------------------------------------------------------------------

ARCH_CAPABILITY: dict[str, tuple[int, int]] = {
    "sm80": (8, 0), "sm89": (8, 9), "sm90": (9, 0), "sm100": (10, 0), "sm103": (10, 3),
    "sm110": (11, 0), "sm120": (12, 0), "sm121": (12, 1),
}

# Declared scheme (classify_group) -> engine scheme class names accepted, per engine and path.
# A class matches when it or one of its bases has the name. A declared scheme missing from a
# path's table is reported under `unchecked` (no expectation), not as a mismatch.
LINEAR: dict[str, tuple[str, ...]] = {
    "W4A4_NVFP4": ("CompressedTensorsW4A4Fp4",),
    "W4A16_NVFP4": ("CompressedTensorsW4A16Fp4",),
    "W8A8_FP8": ("CompressedTensorsW8A8Fp8",),
    "W8A16_FP8": ("CompressedTensorsW8A16Fp8",),
    "W8A8_INT8": ("CompressedTensorsW8A8Int8",),
    "WNA16_INT": ("CompressedTensorsWNA16",),
}
EXPECTED: dict[str, dict[str, dict[str, tuple[str, ...]]]] = {
    "sglang": {
        "linear": LINEAR,
        "moe": {
            "W4A4_NVFP4": ("CompressedTensorsW4A4Nvfp4MoE",),
            "W4A16_NVFP4": ("CompressedTensorsW4A16Nvfp4MoE",),
            "W8A8_FP8": ("CompressedTensorsW8A8Fp8MoE",),
            "WNA16_INT": ("CompressedTensorsWNA16MoE", "CompressedTensorsWNA16TritonMoE",
                          "CompressedTensorsMxInt4MoE"),
        },
    },
    "vllm": {
        "linear": LINEAR,  # vLLM's linear schemes carry the same names as SGLang's
        "moe": {
            "W4A4_NVFP4": ("CompressedTensorsW4A4Nvfp4MoEMethod", "CompressedTensorsW4A4MoeMethod"),
            "W4A16_NVFP4": ("CompressedTensorsW4A4Nvfp4MoEMethod",),  # use_a16=True
            "W8A8_FP8": ("CompressedTensorsW8A8Fp8MoEMethod",),
            "W8A8_INT8": ("CompressedTensorsW8A8Int8MoEMethod",),
            "WNA16_INT": ("CompressedTensorsWNA16MoEMethod",
                          "CompressedTensorsWNA16MarlinMoEMethod"),
        },
    },
}

ENGINE_CONFIG_CLASS = {
    "sglang": "sglang.srt.layers.quantization.compressed_tensors.compressed_tensors",
    "vllm": "vllm.model_executor.layers.quantization.compressed_tensors.compressed_tensors",
}

# Tensors a compressed-tensors quantized Linear carries besides (or instead of) `weight`.
QUANT_SUFFIXES = frozenset({
    "weight_packed", "weight_scale", "weight_global_scale", "weight_zero_point", "weight_shape",
    "weight_g_idx", "input_global_scale", "input_scale", "input_zero_point",
})
# Two-dimensional `.weight`s that are not Linear layers.
NOT_LINEAR = re.compile(r"(^|\.)(embed_tokens|embeddings?|wte|wpe|word_embeddings)$|norm$")
EXPERT = re.compile(r"^(?P<block>.+\.experts)\.(?P<idx>\d+)\.(?P<proj>[^.]+)$")



class ProbeInputError(Exception):
    """The checkpoint cannot be read (exit 2)."""


# ----------------------------------------------------------------------------------------------
# The checkpoint: tensors, Linear-like modules, what each declares
# ----------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Module:
    name: str
    quantized: bool
    in_features: int
    out_features: int


def safetensors_header(path: Path) -> dict[str, dict[str, Any]]:
    """name -> {dtype, shape} from a .safetensors file's JSON header (smoke.py reads it)."""
    try:
        header = _smoke().read_safetensors_header(path)
    except ValueError as e:
        raise ProbeInputError(str(e)) from None
    except OSError as e:  # a directory named *.safetensors, a file this user may not read
        raise ProbeInputError(f"{path}: cannot be read ({e.strerror or e})") from None
    return {k: v for k, v in header.items() if k != "__metadata__" and isinstance(v, dict)}


def checkpoint_tensors(model: Path) -> tuple[dict[str, list[int] | None], str]:
    """Every tensor name and its shape (None where only the index names it), and where the
    names came from."""
    index = model / "model.safetensors.index.json"
    if index.is_file():
        try:
            weight_map = json.loads(index.read_text())["weight_map"]
        except (ValueError, KeyError, TypeError) as e:
            raise ProbeInputError(f"{index}: no weight_map ({e})") from None
        out: dict[str, list[int] | None] = dict.fromkeys(weight_map)
        for shard in sorted(set(weight_map.values())):
            if (model / shard).is_file():
                for k, v in safetensors_header(model / shard).items():
                    out[k] = list(v.get("shape") or [])
        return out, index.name
    files = sorted(model.glob("*.safetensors"))
    if not files:
        raise ProbeInputError(f"{model}: no *.safetensors and no model.safetensors.index.json")
    out = {}
    for f in files:
        out.update({k: list(v.get("shape") or []) for k, v in safetensors_header(f).items()})
    return out, "safetensors headers"


def linear_modules(tensors: dict[str, list[int] | None]) -> list[Module]:
    """The Linear-like modules: a two-dimensional `.weight` (or one of unknown shape) or a
    `.weight_packed`; quantized when any of QUANT_SUFFIXES is present."""
    by_module: dict[str, dict[str, list[int] | None]] = {}
    for key, shape in tensors.items():
        module, _, leaf = key.rpartition(".")
        if module:
            by_module.setdefault(module, {})[leaf] = shape
    out = []
    for name, leaves in sorted(by_module.items()):
        if "weight_packed" not in leaves and "weight" not in leaves:
            continue
        quantized = bool(QUANT_SUFFIXES & leaves.keys())
        w = leaves.get("weight")
        if "weight_packed" not in leaves and (
                (w is not None and len(w) != 2) or (not quantized and NOT_LINEAR.search(name))):
            continue
        out.append(Module(name, quantized, *_in_out(leaves)))
    return out


def _in_out(leaves: dict[str, list[int] | None]) -> tuple[int, int]:
    """(in_features, out_features), as well as the tensors tell (a scheme choice never reads
    them; the probe's Linear lives on the meta device)."""
    w, packed = leaves.get("weight"), leaves.get("weight_packed")
    if w and len(w) == 2:
        return w[1], w[0]
    if packed and len(packed) == 2:  # NVFP4: uint8, two values a byte; int4 packs 8 in int32
        return packed[1] * 2, packed[0]
    return 16, 16


def _target_matches(target: str, name: str) -> bool:
    """compressed-tensors' name matching: `re:` regex (re.match) or the exact name."""
    if target.startswith("re:"):
        return re.match(target[3:], name) is not None
    return target == name


def match_group(name: str, config_groups: dict[str, Any]) -> str | None:
    """The config group a Linear module belongs to: a name or regex target first, then a
    class-name target (`Linear`)."""
    for gname, group in config_groups.items():
        if any(_target_matches(t, name) for t in group.get("targets") or ()
               if t != "Linear"):
            return gname
    for gname, group in config_groups.items():
        if "Linear" in (group.get("targets") or ()):
            return gname
    return None


def classify_group(group: dict[str, Any]) -> str:
    """A config group's scheme, in EXPECTED's words."""
    w = group.get("weights") or {}
    a = group.get("input_activations") or None
    wtype, wbits, strat = w.get("type"), w.get("num_bits"), w.get("strategy")
    if wtype == "float" and wbits == 4 and strat == "tensor_group" and w.get("group_size") == 16:
        if a is None:
            return "W4A16_NVFP4"
        if a.get("type") == "float" and a.get("num_bits") == 4:
            return "W4A4_NVFP4"
    if wtype == "float" and wbits == 8:
        if a is None:
            return "W8A16_FP8"
        if a.get("type") == "float" and a.get("num_bits") == 8:
            return "W8A8_FP8"
    if wtype == "int" and wbits == 8 and a is not None and a.get("type") == "int" \
            and a.get("num_bits") == 8:
        return "W8A8_INT8"
    if wtype == "int" and a is None and strat in ("group", "channel"):
        return "WNA16_INT"
    a_desc = "none" if a is None else f"{a.get('type')}{a.get('num_bits')}"
    return f"OTHER(w={wtype}{wbits}/{strat}, a={a_desc})"


def declared_scheme(module: Module, qcfg: dict[str, Any]) -> str | None:
    """What the checkpoint declares for a module: None when it stores it unquantized, else its
    config group's scheme ('NO_GROUP' when quantized tensors match no group)."""
    if not module.quantized:
        return None
    groups = qcfg.get("config_groups") or {}
    g = match_group(module.name, groups)
    return classify_group(groups[g]) if g is not None else "NO_GROUP"


@dataclass(frozen=True)
class Check:
    """One question to the engine: a Linear module, or a fused-MoE block of experts."""
    path: str  # "linear" | "moe"
    name: str  # module name; for moe the `...experts` prefix the engine is given
    declared: str | None
    in_features: int = 16
    out_features: int = 16
    covers: int = 1  # checkpoint modules this check stands for


def plan_checks(modules: list[Module], qcfg: dict[str, Any]) -> list[Check]:
    """Linear modules one by one; expert modules (`X.experts.N.proj`) one check per block X,
    whose declared scheme is the experts' common one ('NOT_UNIFORM:a,b' when they differ)."""
    checks, blocks = [], {}
    for m in modules:
        hit = EXPERT.match(m.name)
        if hit:
            blocks.setdefault(hit["block"], []).append(declared_scheme(m, qcfg))
        else:
            checks.append(Check("linear", m.name, declared_scheme(m, qcfg),
                                m.in_features, m.out_features))
    for block, decl in sorted(blocks.items()):
        kinds = sorted({str(d) for d in decl})
        declared = decl[0] if len(kinds) == 1 else "NOT_UNIFORM:" + ",".join(kinds)
        checks.append(Check("moe", block, declared, covers=len(decl)))
    return checks


def expected_classes(engine: str, path: str, declared: str | None) -> tuple[str, ...] | None:
    """Accepted class names; () for 'no scheme' (unquantized); None when EXPECTED has no row."""
    if declared is None:
        return ()
    return EXPECTED[engine][path].get(declared)


def judge(engine: str, check: Check, arch: str, got: str | None, bases: tuple[str, ...],
          error: str | None) -> dict[str, Any] | None:
    """A mismatch record, or None when the engine chose what the checkpoint declares."""
    want = expected_classes(engine, check.path, check.declared)
    if want is None:
        return None  # counted as unchecked by the caller
    if error is None and (got is None if not want else bool(set(want) & set(bases))):
        return None
    return {"module": check.name, "path": check.path, "arch": arch, "declared": check.declared,
            "expected": list(want) if want else None, "got": got, "error": error}


def build_report(*, engine: str, version: str | None, archs: list[str], model: str,
                 names_from: str, checks: list[Check], mismatches: list[dict[str, Any]],
                 chosen: dict[str, Counter], unchecked: list[str], seconds: dict[str, float],
                 error: str | None = None,
                 kernels: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    return {
        "engine": engine, "version": version, "archs": archs, "model": model,
        "names_from": names_from,
        "modules_checked": len(checks),
        "checkpoint_modules": sum(c.covers for c in checks),
        "declared": dict(sorted(Counter(str(c.declared) for c in checks).items())),
        "chosen": {a: dict(sorted(c.items())) for a, c in chosen.items()},
        "unchecked": unchecked,
        "mismatches": mismatches,
        # chosen, but building the scheme failed on its kernel for a GPU that is not here
        "kernel_not_built": kernels or [],
        "error": error,
        "ok": error is None and not mismatches,
        "seconds": {k: round(v, 3) for k, v in seconds.items()},
    }


# ----------------------------------------------------------------------------------------------
# The engines (imported only here)
# ----------------------------------------------------------------------------------------------


class Engine:
    name = ""

    def __init__(self) -> None:
        mod = importlib.import_module(ENGINE_CONFIG_CLASS[self.name])
        self.config_cls = mod.CompressedTensorsConfig
        self.version = importlib.metadata.version(self.name)

    def parse(self, qcfg: dict[str, Any]) -> Any:
        return self.config_cls.from_config(json.loads(json.dumps(qcfg)))

    @contextlib.contextmanager
    def device(self, capability: tuple[int, int]) -> Iterator[None]:
        raise NotImplementedError

    def linear(self, cfg: Any, check: Check) -> Any:
        import torch

        layer = torch.nn.Linear(check.in_features, check.out_features, bias=False,
                                device="meta")
        get = getattr(cfg, "get_linear_scheme", None) or cfg.get_scheme
        return get(layer=layer, layer_name=check.name)

    def moe(self, cfg: Any, check: Check) -> Any:
        raise NotImplementedError


def _fused_moe_stub() -> Any:
    """A module whose class is named FusedMoE: the engines match class-name targets
    (`Linear` -> `FusedMoE`) by `module.__class__.__name__`; building the real layer needs a
    distributed runtime and a GPU."""
    import torch

    return type("FusedMoE", (torch.nn.Module,), {})()


class SGLang(Engine):
    name = "sglang"

    @contextlib.contextmanager
    def device(self, capability: tuple[int, int]) -> Iterator[None]:
        """torch.cuda answers as a GPU of this capability would: what `_check_scheme_supported`
        and `is_blackwell_supported` (lru-cached: cleared before and after) read."""
        import torch

        try:
            from sglang.srt.utils import common
        except ImportError:
            common = None
        saved = (torch.cuda.get_device_capability, torch.cuda.is_available, torch.version.cuda)

        def clear() -> None:
            for obj in list(vars(common).values()) if common else ():
                if callable(getattr(obj, "cache_clear", None)):
                    with contextlib.suppress(Exception):
                        obj.cache_clear()

        torch.cuda.get_device_capability = lambda device=None: capability
        torch.cuda.is_available = lambda: True
        if torch.version.cuda is None:  # a CPU torch: the capability checks also read this
            torch.version.cuda = "12.8"
        clear()
        try:
            yield
        finally:
            torch.cuda.get_device_capability, torch.cuda.is_available, torch.version.cuda = saved
            clear()

    def moe(self, cfg: Any, check: Check) -> Any:
        return cfg.get_moe_scheme(layer=_fused_moe_stub(), layer_name=check.name)


class VLLM(Engine):
    name = "vllm"

    @contextlib.contextmanager
    def device(self, capability: tuple[int, int]) -> Iterator[None]:
        """vLLM's `_check_scheme_supported` asks current_platform.get_device_capability()."""
        import torch
        from vllm.platforms import current_platform
        from vllm.platforms.interface import DeviceCapability

        cap = DeviceCapability(*capability)
        saved_torch = torch.cuda.get_device_capability
        had = "get_device_capability" in vars(current_platform)
        old = vars(current_platform).get("get_device_capability")
        current_platform.get_device_capability = lambda device_id=0: cap
        torch.cuda.get_device_capability = lambda device=None: capability
        try:
            yield
        finally:
            torch.cuda.get_device_capability = saved_torch
            if had:
                current_platform.get_device_capability = old
            else:
                with contextlib.suppress(AttributeError):
                    del current_platform.get_device_capability

    def moe(self, cfg: Any, check: Check) -> Any:
        from vllm.model_executor.layers.quantization.compressed_tensors import (
            compressed_tensors_moe as ctm,
        )

        layer = _fused_moe_stub()
        layer.moe_config = None  # a real FusedMoEConfig needs the distributed runtime
        # the checkpoint's names of an expert's projections (vLLM's FusedMoE carries them)
        layer.ckpt_gate_proj_name, layer.ckpt_up_proj_name, layer.ckpt_down_proj_name = (
            "gate_proj", "up_proj", "down_proj")
        try:  # the MoE methods read the current engine config; a default one stands in
            from vllm.config import DeviceConfig, VllmConfig, set_current_vllm_config
            # (no GPU here to infer the device from: the image serves on CUDA)
            current = set_current_vllm_config(VllmConfig(device_config=DeviceConfig("cuda")))
        except Exception:  # noqa: BLE001 - older releases read none
            current = contextlib.nullcontext()
        with current:
            try:
                return ctm.CompressedTensorsMoEMethod.get_moe_method(cfg, layer,
                                                                     layer_name=check.name)
            except AttributeError as e:
                if "'NoneType'" not in str(e):
                    raise
                raise NotAskable("vLLM's MoE method choice reads a FusedMoEConfig that only its "
                                 f"distributed runtime builds ({_error_text(e)})") from None


ENGINES = {"sglang": SGLang, "vllm": VLLM}


def _error_text(e: BaseException) -> str:
    args = getattr(e, "args", ())
    text = "".join(str(a) for a in args) if len(args) > 1 else str(e)  # RuntimeError("a", "b")
    return f"{type(e).__name__}: {text}"


def run(model: Path, engine_name: str, archs: list[str]) -> dict[str, Any]:
    cfg_path = model / "config.json"
    try:
        config = json.loads(cfg_path.read_text())
    except (OSError, ValueError) as e:
        raise ProbeInputError(f"{cfg_path}: {e}") from None
    qcfg = config.get("quantization_config") or config.get("compression_config")
    if not isinstance(qcfg, dict):
        raise ProbeInputError(f"{cfg_path}: no quantization_config")
    if qcfg.get("quant_method", "compressed-tensors") != "compressed-tensors":
        raise ProbeInputError(f"{cfg_path}: quant_method {qcfg.get('quant_method')!r} is not "
                              "compressed-tensors")
    tensors, names_from = checkpoint_tensors(model)
    checks = plan_checks(linear_modules(tensors), qcfg)
    unchecked = sorted({f"{c.path}:{c.declared}" for c in checks
                        if expected_classes(engine_name, c.path, c.declared) is None})
    seconds = {"import": 0.0, "check": 0.0}
    common = dict(engine=engine_name, archs=archs, model=str(model), names_from=names_from,
                  checks=checks, unchecked=unchecked)

    t0 = time.monotonic()
    try:
        with contextlib.redirect_stdout(sys.stderr):
            engine = ENGINES[engine_name]()
            engine.parse(qcfg)
    except Exception as e:  # noqa: BLE001 - the finding is the engine's own failure
        seconds["import"] = time.monotonic() - t0
        return build_report(version=_installed(engine_name), mismatches=[], chosen={},
                            seconds=seconds, error=f"engine import/parse: {_error_text(e)}",
                            **common)
    seconds["import"] = time.monotonic() - t0

    t0 = time.monotonic()
    mismatches, chosen, failed, kernels = [], {}, None, []
    with contextlib.redirect_stdout(sys.stderr):
        for arch in archs:
            try:
                chosen[arch] = _check_arch(engine, engine_name, qcfg, checks, arch, mismatches,
                                           kernels)
            except Exception as e:  # noqa: BLE001 - answering the arch's capability failed
                failed = f"{arch}: could not answer the engine's GPU queries: {_error_text(e)}"
                break
    seconds["check"] = time.monotonic() - t0
    return build_report(version=engine.version, mismatches=mismatches, chosen=chosen,
                        seconds=seconds, error=failed, kernels=kernels, **common)


def _check_arch(engine: Engine, engine_name: str, qcfg: dict[str, Any], checks: list[Check],
                arch: str, mismatches: list[dict[str, Any]],
                kernels: list[dict[str, Any]] | None = None) -> Counter:
    """Every check on one arch; mismatches appended; what the engine chose, counted."""
    counts: Counter = Counter()
    kernels = [] if kernels is None else kernels
    with engine.device(ARCH_CAPABILITY[arch]):
        cfg = engine.parse(qcfg)  # fresh per arch: the MoE path edits its target map
        for check in checks:
            got, bases, error = None, (), None
            try:
                scheme = (engine.linear if check.path == "linear" else engine.moe)(cfg, check)
            except NotAskable as e:
                kernels.append({"module": check.name, "arch": arch, "scheme": None,
                                "error": f"not asked: {e}"})
                counts["not asked"] += check.covers
                continue
            except Exception as e:  # noqa: BLE001 - the engine's own refusal is the finding
                error = _error_text(e)
                chosen = _constructing(e)
                if chosen is not None:
                    # The engine chose this scheme; building it failed on the kernel it picks
                    # for a GPU that is not here (vLLM chooses kernels in the constructor).
                    # The choice is what this probe checks; the kernel is the GPU stage's.
                    got, bases = chosen.__name__, tuple(c.__name__ for c in chosen.__mro__)
                    kernels.append({"module": check.name, "arch": arch, "scheme": got,
                                    "error": error})
                    error = None
            else:
                if scheme is not None:
                    got = type(scheme).__name__
                    bases = tuple(c.__name__ for c in type(scheme).__mro__)
            counts[error and "error" or got or "none"] += check.covers
            bad = judge(engine_name, check, arch, got, bases, error)
            if bad:
                mismatches.append(bad)
    return counts


class NotAskable(Exception):
    """The engine cannot be asked this without what only a GPU run builds: not a mismatch.
    Counted as `not asked` under `chosen`, and listed under `kernel_not_built` with no scheme
    and the reason (`not asked: ...`)."""


def _constructing(e: BaseException) -> type | None:
    """The scheme class whose constructor raised `e`, if it was one (a frame of `__init__`
    whose `self` is a compressed-tensors scheme or MoE method of the engine)."""
    tb = e.__traceback__
    found = None
    while tb is not None:
        frame = tb.tb_frame
        me = frame.f_locals.get("self") if frame.f_code.co_name == "__init__" else None
        if me is not None and type(me).__name__.startswith("CompressedTensors") and \
                "compressed_tensors" in type(me).__module__:
            found = found or type(me)  # the outermost: the class the engine asked for
        tb = tb.tb_next
    return found


def _smoke():
    """smoke.py, beside this file: imported as builder.payload.smoke on the host, as a script's
    neighbour in the image (/opt/imgbuild)."""
    try:
        from . import smoke
    except ImportError:
        import smoke  # type: ignore[no-redef]
    return smoke


def _installed(name: str) -> str | None:
    return _smoke()._version(name)


def render_text(report: dict[str, Any]) -> str:
    lines = [f"engine-schemes: {report['engine']} {report['version']} on "
             f"{', '.join(report['archs'])}: {report['modules_checked']} modules checked "
             f"({report['checkpoint_modules']} in the checkpoint; names from "
             f"{report['names_from']})"]
    lines.append("declared: " + ", ".join(f"{k} x{v}" for k, v in report["declared"].items()))
    for arch, counts in report["chosen"].items():
        lines.append(f"{arch}: " + ", ".join(f"{k} x{v}" for k, v in counts.items()))
    if report["unchecked"]:
        lines.append("no expectation for: " + ", ".join(report["unchecked"]))
    if report["error"]:
        lines.append(f"FAIL  {report['error']}")
    for m in report["mismatches"]:
        want = " or ".join(m["expected"]) if m["expected"] else "no scheme (unquantized)"
        got = m["got"] or ("no scheme" if m["error"] is None else "an exception")
        lines.append(f"FAIL  [{m['arch']}] {m['module']} ({m['path']}, declared "
                     f"{m['declared']}): expected {want}, got {got}"
                     + (f": {m['error']}" if m["error"] else ""))
    s = report["seconds"]
    n = len(report["mismatches"])
    lines.append(f"{'ok' if report['ok'] else 'FAILED'}: {n} mismatch{'' if n == 1 else 'es'}; "
                 f"import {s['import']:.1f} s, check {s['check']:.1f} s")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", required=True, type=Path, help="checkpoint directory")
    p.add_argument("--engine", required=True, choices=sorted(ENGINES))
    p.add_argument("--arch", action="append", required=True, choices=sorted(ARCH_CAPABILITY),
                   help="target GPU arch (repeat for several)")
    p.add_argument("--json", action="store_true", help="print the report as JSON")
    args = p.parse_args(argv)
    archs = list(dict.fromkeys(args.arch))
    try:
        report = run(args.model, args.engine, archs)
    except ProbeInputError as e:
        print(f"engine-schemes: {e}", file=sys.stderr)
        return 2
    print(json.dumps(report, indent=2) if args.json else render_text(report))
    return 0 if report["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
