"""In-image smoke payload: the image's packages match its lock, and a tiny NVFP4 checkpoint loads
and computes what its reference says.

This file is copied into the image and run there as

    python /opt/imgbuild/smoke.py --lock /opt/imgbuild/lock.txt \
        --model /opt/imgbuild/smoke-model [--json]

so it imports only the standard library at module level: the image has torch, transformers,
compressed-tensors and safetensors, but not this package, llmcompressor, pytest, rich or yaml.
The heavy imports happen inside the checkpoint stage, where a failure to import is a finding.

The host generator (builder.smokemodel) imports the loading and forward helpers below to write
the reference, so the image recomputes it with the very code that produced it.

Exit status: 0 when no stage failed, 1 when one did, 2 for bad arguments.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import importlib.metadata
import json
import os
import re
import sys
import time
import traceback
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

# The reference lives in a subdirectory of the checkpoint: engines glob `<model>/*.safetensors`
# (non-recursively) for weights, and would try to load reference.safetensors as model weights.
REFERENCE_DIR = "imgbuild-reference"
REFERENCE_JSON = "reference.json"
REFERENCE_TENSORS = "reference.safetensors"
REFERENCE_SCHEMA = 1

PASS, FAIL, SKIPPED = "pass", "fail", "skipped"


# ----------------------------------------------------------------------------------------------
# Stage "environment": installed distributions against the lock
# ----------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class LockedPackage:
    name: str  # PEP 503 normalized
    version: str | None  # None for a direct URL requirement (`name @ url`): presence only
    marker: str | None
    line: int


@dataclass(frozen=True)
class LockFile:
    packages: tuple[LockedPackage, ...]
    # Requirement lines that pin nothing (`foo>=1`, `-e ./x`): a lock must not have them.
    unpinned: tuple[str, ...]


def normalize_name(name: str) -> str:
    """PEP 503: runs of -, _ and . are one '-', case-insensitive."""
    return re.sub(r"[-_.]+", "-", name).lower()


_PINNED = re.compile(
    r"^(?P<name>[A-Za-z0-9][A-Za-z0-9._-]*)\s*(?:\[[^\]]*\])?\s*"
    r"(?P<op>===|==)\s*(?P<version>[^\s;]+)\s*(?:;\s*(?P<marker>.+))?$"
)
_DIRECT_URL = re.compile(
    r"^(?P<name>[A-Za-z0-9][A-Za-z0-9._-]*)\s*(?:\[[^\]]*\])?\s*@\s*\S+\s*(?:;\s*(?P<marker>.+))?$"
)


def parse_lock(text: str) -> LockFile:
    """Parse `uv pip compile` / pip-compile output.

    A requirement is a logical line (backslash continuations joined): `name==version`, optional
    extras and `; marker`, then `--hash=...` options. `# via` comments, blank lines and global
    options (`--index-url ...`) carry no pins.
    """
    packages: list[LockedPackage] = []
    unpinned: list[str] = []
    logical: list[tuple[int, str]] = []
    buf, start = "", 0
    for lineno, raw in enumerate(text.splitlines(), start=1):
        line = raw.strip()
        if not buf:
            start = lineno
        if line.startswith("#"):
            # Comment lines (`# via ...`) carry nothing and do not break a continuation.
            continue
        # An inline comment must be preceded by whitespace (a URL may contain '#').
        line = re.split(r"\s+#", line, maxsplit=1)[0]
        if line.endswith("\\"):
            buf += line[:-1] + " "
            continue
        buf += line
        if buf.strip():
            logical.append((start, buf.strip()))
        buf = ""
    if buf.strip():
        logical.append((start, buf.strip()))

    for lineno, line in logical:
        if line.startswith("-"):
            # Global options (--index-url, --find-links, -c) and editables (-e) pin nothing
            # by version; editables are reported so a lock with one does not pass silently.
            if line.startswith(("-e", "--editable")):
                unpinned.append(line)
            continue
        requirement = re.split(r"\s--?[A-Za-z]", " " + line, maxsplit=1)[0].strip()
        match = _PINNED.match(requirement)
        if match:
            packages.append(
                LockedPackage(
                    normalize_name(match["name"]), match["version"], match["marker"], lineno
                )
            )
            continue
        match = _DIRECT_URL.match(requirement)
        if match:
            packages.append(
                LockedPackage(normalize_name(match["name"]), None, match["marker"], lineno)
            )
            continue
        unpinned.append(requirement)
    return LockFile(tuple(packages), tuple(unpinned))


def installed_distributions() -> dict[str, str]:
    """Normalized name -> version of what `import` would find: the first distribution of a name
    on sys.path wins, as it does for importlib.metadata.version()."""
    found: dict[str, str] = {}
    for dist in importlib.metadata.distributions():
        name = dist.metadata.get("Name") if dist.metadata else None
        if name:
            found.setdefault(normalize_name(name), dist.version)
    return found


def version_matches(locked: str, installed: str) -> tuple[bool, bool]:
    """(matches, only_ignoring_local_label).

    PEP 440 `==`: a locked version without a local label (`2.13.0`) matches an installed one with
    any label (`2.13.0+cpu`); a locked label must match exactly. packaging normalizes spellings
    (`1.0` vs `1.0.0`, `2026.10.19.post1`); without it, strings are compared.
    """
    try:
        from packaging.version import InvalidVersion, Version
    except ImportError:  # packaging ships with transformers, but the check must not need it
        Version = None  # type: ignore[assignment,misc]
    if Version is not None:
        try:
            lv, iv = Version(locked), Version(installed)
        except InvalidVersion:
            pass
        else:
            if lv == iv:
                return True, False
            if lv.local is None and iv.local is not None and lv == Version(iv.public):
                return True, True
            return False, False
    lo, io = locked.lower(), installed.lower()
    if lo == io:
        return True, False
    if "+" not in lo and io.split("+", 1)[0] == lo:
        return True, True
    return False, False


def _marker_applies(marker: str | None) -> bool | None:
    """True/False when the marker can be evaluated here, None when packaging is missing."""
    if not marker:
        return True
    try:
        from packaging.markers import Marker
    except ImportError:
        return None
    return Marker(marker).evaluate()


def check_environment(lock_path: Path) -> tuple[str, str, dict[str, Any]]:
    lock = parse_lock(lock_path.read_text())
    installed = installed_distributions()
    mismatched: list[dict[str, str]] = []
    missing: list[str] = []
    not_for_this_platform: list[str] = []
    marker_unevaluated: list[str] = []
    local_label_ignored: list[dict[str, str]] = []
    checked = 0
    for pkg in lock.packages:
        applies = _marker_applies(pkg.marker)
        if applies is False:
            not_for_this_platform.append(pkg.name)
            continue
        if applies is None:
            marker_unevaluated.append(pkg.name)
        checked += 1
        have = installed.get(pkg.name)
        if have is None:
            missing.append(pkg.name)
            continue
        if pkg.version is None:
            continue
        ok, via_local = version_matches(pkg.version, have)
        if not ok:
            mismatched.append({"name": pkg.name, "locked": pkg.version, "installed": have})
        elif via_local:
            # Passes by PEP 440, but worth seeing: torch 2.13.0 vs 2.13.0+cpu is CUDA vs CPU.
            local_label_ignored.append({"name": pkg.name, "locked": pkg.version, "installed": have})
    locked_names = {p.name for p in lock.packages}
    details: dict[str, Any] = {
        "lock": str(lock_path),
        "locked": len(lock.packages),
        "checked": checked,
        "mismatched": mismatched,
        "missing": missing,
        "unpinned_lines": list(lock.unpinned),
        "not_for_this_platform": not_for_this_platform,
        "marker_unevaluated": marker_unevaluated,
        "local_label_ignored": local_label_ignored,
        "installed_not_locked": sorted(set(installed) - locked_names),
        "python": sys.version.split()[0],
    }
    problems = []
    if mismatched:
        problems.append(
            "version differs from the lock: "
            + ", ".join(
                f"{m['name']} (locked {m['locked']}, installed {m['installed']})"
                for m in mismatched
            )
        )
    if missing:
        problems.append("locked but not installed: " + ", ".join(missing))
    if lock.unpinned:
        problems.append("lock has unpinned requirements: " + "; ".join(lock.unpinned))
    if not lock.packages:
        problems.append(f"no pinned requirements found in {lock_path}")
    if problems:
        return FAIL, "; ".join(problems), details
    return PASS, f"{checked} locked packages installed at their locked versions", details


# ----------------------------------------------------------------------------------------------
# Stage "checkpoint-cpu": load the NVFP4 checkpoint in bf16 on CPU and compare with the reference
# ----------------------------------------------------------------------------------------------


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def file_manifest(model_dir: Path) -> dict[str, dict[str, Any]]:
    """Size and sha256 of every checkpoint file (the reference directory excluded)."""
    out: dict[str, dict[str, Any]] = {}
    for path in sorted(model_dir.rglob("*")):
        rel = path.relative_to(model_dir)
        if not path.is_file() or rel.parts[0] == REFERENCE_DIR:
            continue
        out[rel.as_posix()] = {"size": path.stat().st_size, "sha256": sha256_file(path)}
    return out


MAX_HEADER = 512 * 1024 * 1024  # a header claiming more is not a safetensors file


def read_safetensors_header(path: Path) -> dict[str, Any]:
    """The JSON header of a safetensors file: u64 little-endian length, then that much JSON
    (an object of tensors). ValueError, naming the file, for anything else."""
    with open(path, "rb") as f:
        head = f.read(8)
        if len(head) != 8:
            raise ValueError(f"{path}: not a safetensors file (shorter than its header)")
        n = int.from_bytes(head, "little")
        if n <= 0 or n > MAX_HEADER:
            raise ValueError(f"{path}: not a safetensors file (header length {n})")
        try:
            header = json.loads(f.read(n))
        except ValueError as e:
            raise ValueError(f"{path}: unreadable safetensors header ({e})") from None
    if not isinstance(header, dict):
        raise ValueError(f"{path}: not a safetensors file (header is not an object)")
    return header


def safetensors_layout(model_dir: Path) -> dict[str, dict[str, Any]]:
    """tensor name -> {"dtype", "shape"} across the checkpoint's top-level *.safetensors."""
    layout: dict[str, dict[str, Any]] = {}
    for path in sorted(model_dir.glob("*.safetensors")):
        for name, info in read_safetensors_header(path).items():
            if name != "__metadata__":
                layout[name] = {"dtype": info["dtype"], "shape": list(info["shape"])}
    return layout


def _version(dist: str) -> str | None:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return None


def _release(version: str | None) -> tuple[int, ...]:
    parts = []
    for piece in (version or "0").split("+")[0].split("."):
        m = re.match(r"\d+", piece)
        if not m:
            break
        parts.append(int(m.group()))
    return tuple(parts)


def load_model(model_dir: Path) -> tuple[Any, dict[str, Any]]:
    """Load a compressed-tensors checkpoint with transformers, decompressed to bf16 on CPU.

    transformers' compressed-tensors quantizer builds the compressed module layout, loads
    weight_packed/weight_scale/..., then (asked to) decompresses to dense bf16 weights; the
    quantization scheme stays attached, so Linear forwards still fake-quantize their inputs
    (W4A4: NVFP4 activations with the checkpoint's input_global_scale).

    The knob is `dequantize=True` in transformers 5.x and `run_compressed=False` before that
    (5.x still accepts the old name with a deprecation warning); `dtype=` replaced `torch_dtype=`
    in 4.56. bf16, not fp32: the checkpoint's dense tensors and the reference are bf16.
    """
    import inspect

    import torch
    import transformers
    from transformers import AutoModelForCausalLM, CompressedTensorsConfig

    params = inspect.signature(CompressedTensorsConfig.__init__).parameters
    if "dequantize" in params:
        qconfig, knob = CompressedTensorsConfig(dequantize=True), "dequantize=True"
    else:
        qconfig, knob = CompressedTensorsConfig(run_compressed=False), "run_compressed=False"
    dtype_kw = "dtype" if _release(transformers.__version__) >= (4, 56) else "torch_dtype"
    started = time.perf_counter()
    with warnings.catch_warnings():
        # "You passed `quantization_config` ... loading attributes will be overwritten": intended.
        warnings.filterwarnings("ignore", message=".*quantization_config.*")
        model = AutoModelForCausalLM.from_pretrained(
            str(model_dir),
            # No device_map: CPU is the default, and in 4.x a device_map needs accelerate.
            quantization_config=qconfig,
            **{dtype_kw: torch.bfloat16},
        )
    model.eval()
    info = {
        "api": f"transformers.AutoModelForCausalLM.from_pretrained("
        f"{dtype_kw}=torch.bfloat16, quantization_config=CompressedTensorsConfig({knob}))",
        "load_s": round(time.perf_counter() - started, 3),
    }
    return model, info


def set_activation_quantization(model: Any, enabled: bool) -> int:
    """Turn compressed-tensors' fake-quantization (QDQ) in Linear forwards on or off; returns
    how many modules carry a scheme.

    Off, a decompressed W4A4 model computes with its NVFP4 weights and bf16 activations. That is
    the mode with tight tolerances: rounding activations to 4-bit floats turns a last-bit bf16
    difference upstream (another CPU's kernels, another attention implementation) into a jump
    of a whole FP4 step, so W4A4 logits can only be compared loosely (see the reference).
    """
    count = 0
    for module in model.modules():
        if getattr(module, "quantization_scheme", None) is not None:
            module.quantization_enabled = enabled
            count += 1
    return count


def compute_logits(model: Any, input_ids: list[int]) -> Any:
    """float32 [seq, vocab] logits of one unpadded prompt (computed in bf16)."""
    import torch

    with torch.no_grad():
        out = model(input_ids=torch.tensor([input_ids], dtype=torch.long))
    return out.logits[0].float()


def top2_margin(logits: Any) -> Any:
    """Per row: top-1 minus top-2 logit; under a max-abs error e, argmax holds if margin > 2e."""
    import torch

    top = torch.topk(logits.float(), 2, dim=-1).values
    return top[..., 0] - top[..., 1]


def relative_error(got: Any, expected: Any) -> float:
    """||got - expected|| / ||expected|| (Frobenius)."""
    return float((got.float() - expected.float()).norm() / expected.float().norm().clamp_min(1e-30))


def greedy_generate(
    model: Any, input_ids: list[int], max_new_tokens: int
) -> tuple[list[int], list[float], Any]:
    """Greedy continuation through model.generate (the KV-cache decode path a server uses):
    the tokens, each step's top-2 margin (of the scores greedy chose from), and each step's raw
    logits as float32 [steps, vocab]."""
    import torch

    with torch.no_grad():
        out = model.generate(
            torch.tensor([input_ids], dtype=torch.long),
            attention_mask=torch.ones(1, len(input_ids), dtype=torch.long),
            max_new_tokens=max_new_tokens,
            min_new_tokens=max_new_tokens,  # eos must not cut the comparison short
            do_sample=False,
            output_scores=True,
            output_logits=True,  # raw: scores carry -inf where min_new_tokens masks eos
            return_dict_in_generate=True,
        )
    tokens = out.sequences[0, len(input_ids) :].tolist()
    margins = [float(top2_margin(s[0])) for s in out.scores]
    logits = torch.stack([step[0].float() for step in out.logits])
    return tokens, margins, logits


def decisive_prefix(margins: list[float], atol: float) -> int:
    """How many greedy steps are determined under max-abs error atol: all steps before the first
    one whose margin is within 2*atol (after a possible flip, later steps see other inputs)."""
    for i, m in enumerate(margins):
        if m <= 2 * atol:
            return i
    return len(margins)


def weight_digest(weight: Any) -> dict[str, Any]:
    """sha256 of the raw bytes plus summary stats of a dense weight tensor."""
    import torch

    w = weight.detach().contiguous()
    raw = w.view(torch.uint8) if w.dtype != torch.uint8 else w
    wf = w.float()
    return {
        "dtype": str(w.dtype).replace("torch.", ""),
        "shape": list(w.shape),
        "sha256": hashlib.sha256(raw.numpy().tobytes()).hexdigest(),
        "sum": float(wf.double().sum()),
        "abs_sum": float(wf.double().abs().sum()),
        "absmax": float(wf.abs().max()),
    }


@dataclass(frozen=True)
class Check:
    name: str
    ok: bool
    summary: str
    data: Any = None

    def as_dict(self) -> dict[str, Any]:
        return {"check": self.name, "ok": self.ok, "summary": self.summary, "data": self.data}


def _check_files(model_dir: Path, ref: dict[str, Any]) -> Check:
    expected: dict[str, dict[str, Any]] = ref.get("files", {})
    actual = file_manifest(model_dir)
    bad = sorted(
        name
        for name in set(expected) | set(actual)
        if name not in expected
        or name not in actual
        or expected[name]["sha256"] != actual[name]["sha256"]
    )
    if bad:
        return Check(
            "files", False, "checkpoint files differ from those generated: " + ", ".join(bad), bad
        )
    return Check("files", True, f"{len(actual)} files as generated")


def _check_layout(model_dir: Path, ref: dict[str, Any]) -> Check:
    expected: dict[str, Any] = ref["layout"]
    actual = safetensors_layout(model_dir)
    diffs = [
        f"{name}: expected {expected.get(name)}, found {actual.get(name)}"
        for name in sorted(set(expected) | set(actual))
        if expected.get(name) != actual.get(name)
    ]
    if diffs:
        return Check(
            "layout",
            False,
            f"{len(diffs)} tensors differ in dtype/shape: " + "; ".join(diffs[:5]),
            diffs,
        )
    return Check("layout", True, f"{len(actual)} tensors with the expected dtype and shape")


def _check_config(model_dir: Path, ref: dict[str, Any]) -> Check:
    qc = json.loads((model_dir / "config.json").read_text()).get("quantization_config") or {}
    found = (qc.get("quant_method"), qc.get("format"))
    want = ("compressed-tensors", ref["format"])
    if found != want:
        return Check(
            "config",
            False,
            f"quantization_config (quant_method, format) is {found}, expected {want}",
        )
    return Check("config", True, f"compressed-tensors, format {ref['format']}")


def _check_weights(model: Any, ref: dict[str, Any], tensors: dict[str, Any]) -> Check:
    import torch

    rtol = float(ref["weight_rtol"])
    rows, failed = [], []
    for layer, want in ref["weights"].items():
        w = model.get_submodule(layer).weight.detach()
        expected = tensors[want["tensor"]]
        got = weight_digest(w)
        row: dict[str, Any] = {"layer": layer, "dtype": got["dtype"], "shape": got["shape"]}
        if got["dtype"] != want["dtype"] or got["shape"] != want["shape"]:
            row["error"] = f"expected {want['dtype']} {want['shape']}"
            failed.append(layer)
        else:
            diff = (w.float() - expected.float()).abs()
            # The decode (e2m1 value x fp8 scale / global scale) is elementwise and exact in
            # float32, so equal bytes are expected; rtol only forgives another rounding order
            # (one bf16 ulp), not a wrong nibble order, scale or global scale.
            within = bool(torch.all(diff <= rtol * expected.float().abs()))
            row.update(
                exact=got["sha256"] == want["sha256"],
                max_abs_diff=float(diff.max()),
                within_rtol=within,
            )
            if not within:
                failed.append(layer)
        rows.append(row)
    if failed:
        return Check(
            "weights",
            False,
            "decompressed weights differ from the reference: " + ", ".join(failed),
            rows,
        )
    exact = sum(1 for r in rows if r.get("exact"))
    return Check(
        "weights", True, f"{len(rows)} decompressed weights match ({exact} bit-exact)", rows
    )


def _check_tokenizer(model_dir: Path, ref: dict[str, Any]) -> Check:
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(model_dir))
    diffs = []
    for i, prompt in enumerate(ref["prompts"]):
        ids = tok(prompt["text"])["input_ids"]
        if ids != prompt["input_ids"]:
            diffs.append({"prompt": i, "expected": prompt["input_ids"], "found": ids})
    if diffs:
        return Check(
            "tokenizer", False, f"tokenizer encodes {len(diffs)} prompts differently", diffs
        )
    return Check(
        "tokenizer",
        True,
        f"{type(tok).__name__} encodes the {len(ref['prompts'])} prompts as recorded",
    )


def judge_prompt_logits(i: int, got: Any, expected: Any, greedy_ref: list[int], atol: float
                        ) -> tuple[dict[str, Any], list[str]]:
    """One prompt's weights-only logits against the reference: (row, problems)."""
    problems = []
    if tuple(got.shape) != tuple(expected.shape):
        problems.append(
            f"prompt {i}: logits shape {tuple(got.shape)}, expected {tuple(expected.shape)}"
        )
        return {"prompt": i, "shape": list(got.shape)}, problems
    max_diff = float((got - expected).abs().max())
    greedy = got.argmax(-1).tolist()
    # Where the reference's top-2 margin is within 2*atol, argmax may legitimately flip.
    margins = top2_margin(expected).tolist()
    decisive = [j for j, m in enumerate(margins) if m > 2 * atol]
    flipped = [j for j in decisive if greedy[j] != greedy_ref[j]]
    row = {
        "prompt": i,
        "max_abs_diff": max_diff,
        "greedy_next": greedy[-1],
        "greedy_checked": len(decisive),
        "greedy_flipped_positions": flipped,
    }
    if max_diff > atol:
        problems.append(f"prompt {i}: max abs diff {max_diff:.4g} > {atol:.4g}")
    if flipped:
        problems.append(f"prompt {i}: greedy token differs at positions {flipped}")
    return row, problems


def _check_logits(model: Any, ref: dict[str, Any], tensors: dict[str, Any]) -> Check:
    """Weights-only logits (activation QDQ off) within atol, greedy tokens equal where decisive."""
    atol = float(ref["logits_atol"])
    rows, problems = [], []
    for i, prompt in enumerate(ref["prompts"]):
        expected = tensors[prompt["tensor"]]
        got = compute_logits(model, prompt["input_ids"])
        row, said = judge_prompt_logits(i, got, expected, prompt["greedy"], atol)
        rows.append(row)
        problems += said
    worst = max((r.get("max_abs_diff", float("inf")) for r in rows), default=0.0)
    data = {"atol": atol, "max_abs_diff": worst, "prompts": rows}
    if problems:
        return Check("logits", False, "; ".join(problems), data)
    checked = sum(r["greedy_checked"] for r in rows)
    return Check(
        "logits",
        True,
        f"max abs diff {worst:.4g} <= {atol:.4g}; {checked} greedy tokens equal",
        data,
    )


def _check_logits_as_loaded(model: Any, ref: dict[str, Any], tensors: dict[str, Any]) -> Check:
    """As-loaded logits (activations quantized: NVFP4 with the checkpoint's input_global_scale,
    or FP8 in a mixed scheme) loosely close to the reference, and different from this image's
    own weights-only logits (activation quantization is in effect here, not silently dropped)."""
    rtol = float(ref["as_loaded_rel_tol"])
    rows, problems = [], []
    for i, prompt in enumerate(ref["prompts"]):
        expected = tensors[prompt["tensor_as_loaded"]]
        got = compute_logits(model, prompt["input_ids"])
        set_activation_quantization(model, False)
        try:
            weights_only = compute_logits(model, prompt["input_ids"])
        finally:
            set_activation_quantization(model, True)
        rel = relative_error(got, expected)
        effect = relative_error(got, weights_only)
        rows.append({"prompt": i, "rel_error": rel, "activation_quant_effect": effect})
        if rel > rtol:
            problems.append(f"prompt {i}: relative error {rel:.3g} > {rtol:.3g}")
        if effect < 1e-3:
            problems.append(
                f"prompt {i}: logits equal the weights-only ones: activations are not quantized"
            )
    worst = max(r["rel_error"] for r in rows)
    data = {"rel_tol": rtol, "rel_error": worst, "prompts": rows}
    if problems:
        return Check("logits-as-loaded", False, "; ".join(problems), data)
    return Check(
        "logits-as-loaded",
        True,
        f"relative error {worst:.3g} <= {rtol:.3g}; activations quantized",
        data,
    )


def judge_generation(i: int, got: list[int], want: list[int], logits: Any, expected: Any,
                     margins: list[float], atol: float) -> tuple[dict[str, Any], list[str], int]:
    """One prompt's greedy decode against the recorded one: (row, problems, tokens compared)."""
    problems = []
    decisive = decisive_prefix(margins, atol)
    same = next((k for k, (a, b) in enumerate(zip(got, want)) if a != b), len(want))
    # Step k's logits depend on tokens < k: comparable through the first divergence.
    steps = min(same + 1, len(want))
    diff = float((logits[:steps] - expected[:steps]).abs().max()) if steps else 0.0
    row = {
        "prompt": i,
        "expected": want,
        "found": got,
        "decisive_tokens": decisive,
        "compared_steps": steps,
        "max_abs_diff": diff,
    }
    if same < decisive:
        problems.append(f"prompt {i}: generated {got[:decisive]}, expected {want[:decisive]}")
    if diff > atol:
        problems.append(f"prompt {i}: decode logits max abs diff {diff:.4g} > {atol:.4g}")
    return row, problems, min(decisive, same)


def _check_generate(model: Any, ref: dict[str, Any], tensors: dict[str, Any]) -> Check:
    """model.generate (KV-cache decode) against the recorded greedy continuation: tokens equal up
    to the first step whose margin allows a flip, and each step's logits within atol for as long
    as the inputs are the same tokens."""
    atol = float(ref["logits_atol"])
    rows, problems, compared_tokens = [], [], 0
    worst = 0.0
    for i, prompt in enumerate(ref["prompts"]):
        want = prompt["generated"]
        expected = tensors[prompt["tensor_generate"]]
        got, _, logits = greedy_generate(model, prompt["input_ids"], len(want))
        row, said, compared = judge_generation(i, got, want, logits, expected,
                                               prompt["generate_margins"], atol)
        worst = max(worst, row["max_abs_diff"])
        compared_tokens += compared
        rows.append(row)
        problems += said
    data = {"atol": atol, "max_abs_diff": worst, "prompts": rows}
    if problems:
        return Check("generate", False, "; ".join(problems), data)
    steps = sum(r["compared_steps"] for r in rows)
    return Check(
        "generate",
        True,
        f"decode logits max abs diff {worst:.4g} over {steps} steps; "
        f"{compared_tokens} decisive tokens equal",
        data,
    )


def _failed(name: str, exc: Exception) -> Check:
    """A check that raised: the message for people, the innermost frames for whoever debugs the
    image (an import error deep in a library names the library there)."""
    frames = traceback.format_exception(type(exc), exc, exc.__traceback__)
    return Check(name, False, f"{type(exc).__name__}: {exc}", {"traceback": "".join(frames[-4:])})


def check_checkpoint(model_dir: Path) -> tuple[str, str, dict[str, Any]]:
    ref_dir = model_dir / REFERENCE_DIR
    ref_json = ref_dir / REFERENCE_JSON
    if not ref_json.is_file():
        return FAIL, f"no reference at {ref_json}; was the smoke model copied whole?", {}
    ref = json.loads(ref_json.read_text())
    if ref.get("schema") != REFERENCE_SCHEMA:
        return (
            FAIL,
            f"reference schema {ref.get('schema')!r}, this payload reads {REFERENCE_SCHEMA}",
            {},
        )

    checks: list[Check] = []
    details: dict[str, Any] = {
        "model": str(model_dir),
        "reference_versions": ref.get("versions", {}),
    }

    def run(fn: Callable[[], Check], name: str) -> None:
        try:
            checks.append(fn())
        except Exception as exc:  # noqa: BLE001 - a finding, reported by name, never a traceback
            checks.append(_failed(name, exc))

    # Structure first: stdlib only, so it reports even when torch cannot be imported.
    run(lambda: _check_files(model_dir, ref), "files")
    run(lambda: _check_layout(model_dir, ref), "layout")
    run(lambda: _check_config(model_dir, ref), "config")

    try:
        from safetensors.torch import load_file

        details["versions"] = {
            d: _version(d)
            for d in ("torch", "transformers", "compressed-tensors", "safetensors", "tokenizers")
        }
        tensors = load_file(str(ref_dir / REFERENCE_TENSORS))
        model, info = load_model(model_dir)
        details["load"] = info
        checks.append(Check("load", True, info["api"], info))
    except Exception as exc:  # noqa: BLE001 - any load failure is the finding
        checks.append(_failed("load", exc))
    else:
        run(lambda: _check_weights(model, ref, tensors), "weights")
        run(lambda: _check_tokenizer(model_dir, ref), "tokenizer")
        if ref.get("activations"):
            run(lambda: _check_logits_as_loaded(model, ref, tensors), "logits-as-loaded")
        set_activation_quantization(model, False)
        try:
            run(lambda: _check_logits(model, ref, tensors), "logits")
            run(lambda: _check_generate(model, ref, tensors), "generate")
        finally:
            set_activation_quantization(model, True)

    details["checks"] = [c.as_dict() for c in checks]
    failed = [c for c in checks if not c.ok]
    if failed:
        return FAIL, "; ".join(f"{c.name}: {c.summary}" for c in failed), details
    logits = next((c for c in checks if c.name == "logits"), None)
    summary = f"{ref['format']} checkpoint loads in bf16 on CPU and matches its reference"
    if logits is not None:
        summary += f" (logits max abs diff {logits.data['max_abs_diff']:.4g})"
    return PASS, summary, details


# ----------------------------------------------------------------------------------------------
# Driver
# ----------------------------------------------------------------------------------------------


def _stage(name: str, fn: Callable[[], tuple[str, str, dict[str, Any]]]) -> dict[str, Any]:
    started = time.perf_counter()
    try:
        # Libraries print (progress bars, notices); stdout must stay clean for --json.
        with contextlib.redirect_stdout(sys.stderr):
            status, reason, details = fn()
    except Exception as exc:  # noqa: BLE001 - the report must come out whatever broke
        failed = _failed(name, exc)
        status, reason, details = FAIL, failed.summary, {"traceback": failed.data["traceback"]}
    return {
        "name": name,
        "status": status,
        "reason": reason,
        "duration_s": round(time.perf_counter() - started, 3),
        "details": details,
    }


def _skipped(name: str, reason: str) -> dict[str, Any]:
    return {"name": name, "status": SKIPPED, "reason": reason, "duration_s": 0.0, "details": {}}


# ----------------------------------------------------------------------------------------------
# Stage 4: the image's own engine on a GPU
# ----------------------------------------------------------------------------------------------


def _image_facts(path: Path) -> dict[str, Any]:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return {}


def _arch_ok(archs: list[str], cap: tuple[int, int]) -> str | None:
    """The image arch that runs on a GPU of capability cap (same major, minor <= the GPU's)."""
    for a in sorted(archs, reverse=True):
        digits = "".join(ch for ch in a if ch.isdigit())
        if len(digits) >= 2 and int(digits[:-1]) == cap[0] and int(digits[-1]) <= cap[1]:
            return a
    return None


def engine_generate(engine: str, model_dir: Path, prompt_ids: list[list[int]],
                    max_new_tokens: int) -> list[list[int]]:
    """Greedy tokens from the serving engine itself (sglang.Engine / vllm.LLM) on the GPU."""
    if engine == "sglang":
        import sglang

        eng = sglang.Engine(model_path=str(model_dir), tp_size=1, mem_fraction_static=0.3,
                            disable_cuda_graph=True, random_seed=0, log_level="error")
        try:
            outs = eng.generate(input_ids=prompt_ids, sampling_params={
                "temperature": 0.0, "max_new_tokens": max_new_tokens, "ignore_eos": True})
            return [list(o["output_ids"]) for o in outs]
        finally:
            eng.shutdown()
    if engine == "vllm":
        from vllm import LLM, SamplingParams

        llm = LLM(model=str(model_dir), max_model_len=256, enforce_eager=True,
                  gpu_memory_utilization=0.3, seed=0)
        outs = llm.generate([{"prompt_token_ids": ids} for ids in prompt_ids],
                            SamplingParams(temperature=0.0, max_tokens=max_new_tokens,
                                           ignore_eos=True))
        return [list(o.outputs[0].token_ids) for o in outs]
    # transformers: the CPU stage's loader, on the GPU.
    import torch

    model, _ = load_model(model_dir)
    model = model.to("cuda")
    out = []
    for ids in prompt_ids:
        gen = model.generate(torch.tensor([ids], device="cuda"), max_new_tokens=max_new_tokens,
                             do_sample=False)
        out.append(gen[0, len(ids):].tolist())
    return out


def w4a4_refusal(engine: str, activations: bool, cap: tuple[int, int], mode: str
                 ) -> tuple[str, str] | None:
    """(status, reason) when the serving engine cannot run this checkpoint's w4a4 NVFP4 on a GPU
    of capability cap, None when it can (or the engine is transformers)."""
    if engine in ("sglang", "vllm") and activations and cap[0] not in (10, 12):
        # The engines' w4a4 NVFP4 kernels need FP4 tensor cores; transformers emulates them.
        why = f"skipped: sm{cap[0]}{cap[1]} cannot run w4a4 NVFP4 (needs sm100/sm120 families)"
        return (FAIL if mode == "require" else SKIPPED), why
    return None


def judge_engine_tokens(prompts: list[dict[str, Any]], got: list[list[int]], logits_atol: float
                        ) -> tuple[bool, list[dict[str, Any]]]:
    """(all match, rows): the engine's greedy tokens against the reference's, per prompt."""
    rows = []
    ok = True
    for p, toks in zip(prompts, got):
        # The engine runs real FP4 kernels; the reference computed the same math on the CPU.
        # Tokens are compared up to the first step where the reference's top-2 margin was
        # too small to decide (there rounding may legitimately pick the other token).
        want = p["generated"]
        decisive = decisive_prefix(p.get("generate_margins", []), 2 * logits_atol)
        match = toks[:decisive] == want[:decisive]
        ok &= match
        rows.append({"want": want, "got": toks, "decisive": decisive, "match": match})
    return ok, rows


def check_gpu(model_dir: Path, facts: dict[str, Any], engine: str, mode: str
              ) -> tuple[str, str, dict[str, Any]]:
    """pass / fail / skipped with the reason; `mode` is auto | require (off never gets here)."""
    try:
        import torch
    except ImportError:
        return SKIPPED, "skipped: no torch in the image", {}
    if not torch.cuda.is_available():
        if mode == "require":
            return FAIL, "no GPU visible in the container, and --gpu require", {}
        return SKIPPED, "skipped: no GPU", {}
    cap = torch.cuda.get_device_capability(0)
    name = torch.cuda.get_device_name(0)
    sm = f"sm{cap[0]}{cap[1]}"
    details: dict[str, Any] = {"gpu": name, "sm": sm, "engine": engine}
    archs = facts.get("archs") or []
    by = _arch_ok(archs, cap)
    if by is None:
        return FAIL, f"{name} is {sm}; the image is built for {', '.join(archs)}", details
    ref = json.loads((model_dir / REFERENCE_DIR / REFERENCE_JSON).read_text())
    refused = w4a4_refusal(engine, bool(ref.get("activations")), cap, mode)
    if refused is not None:
        return refused[0], refused[1], details
    prompts = ref["prompts"]
    n = int(ref["spec"].get("generate_tokens", 8))
    got = engine_generate(engine, model_dir, [p["input_ids"] for p in prompts], n)
    ok, rows = judge_engine_tokens(prompts, got, float(ref["logits_atol"]))
    details["prompts"] = rows
    if not ok:
        return FAIL, f"{engine} on {name}: greedy tokens differ from the reference", details
    return PASS, f"{engine} on {name} ({sm}, image arch {by}) generated the reference tokens", details


def check_patches(facts: dict[str, Any], here: Path) -> tuple[str, str, dict[str, Any]]:
    """Stage 2: every patch the target expects is in effect and its probe passes."""
    import subprocess

    expected = list(facts.get("patches") or [])
    patcher, pdir, report = here / "patcher.py", here / "patches", here / "patches.json"
    if not expected and not patcher.exists():
        return SKIPPED, "skipped: the image carries no patches", {}
    if not patcher.exists() or not report.exists():
        return FAIL, ("the installed versions need patches this image lacks: "
                      + ", ".join(expected) + " (no patch layer; list them under the target's "
                      "`patches:`)"), {"expected": expected}
    proc = subprocess.run([sys.executable, str(patcher), "--probe", "--patches", str(pdir),
                           "--report", str(report)], capture_output=True, text=True)
    return judge_patch_probes(expected, proc.stdout, proc.stderr)


def judge_patch_probes(expected: list[str], stdout: str, stderr: str
                       ) -> tuple[str, str, dict[str, Any]]:
    """The patches stage's verdict from what `patcher.py --probe` printed."""
    try:
        res = json.loads(stdout[stdout.index("{"):])
    except ValueError:
        return FAIL, "the patcher printed no probe report: " + stderr.strip()[-300:], {}
    probes = {r["id"]: r for r in res.get("probes", [])}
    missing = [e for e in expected if e not in probes or probes[e]["status"] not in
               ("applied", "obsolete", "already-applied")]
    failing = [f"{i}: {r.get('detail')}" for i, r in probes.items() if r.get("probe") == "fail"]
    details = {"expected": expected, "probes": list(probes.values())}
    if missing:
        return FAIL, ("the installed versions need patches that are not in effect: "
                      + ", ".join(missing)), details
    if failing:
        return FAIL, "patch probes fail: " + "; ".join(failing), details
    n = sum(1 for r in probes.values() if r.get("probe") == "pass")
    return PASS, f"{n} patch probe(s) pass: " + ", ".join(probes), details


# ----------------------------------------------------------------------------------------------
# Stages 2b, 2c: the toolchain compiles for every target arch; the kernel files are the scanned ones
# ----------------------------------------------------------------------------------------------

EM_CUDA = 190
TOY_KERNEL = (
    'extern "C" __global__ void imgbuild_axpy(float a, const float *x, float *y, int n) {\n'
    "  int i = blockIdx.x * blockDim.x + threadIdx.x;\n"
    "  if (i < n) y[i] = a * x[i] + y[i];\n"
    "}\n"
)


def _sm(arch: str) -> int:
    return int("".join(ch for ch in arch if ch.isdigit()))


def cubin_arch(data: bytes) -> int | None:
    """The SM number of a CUDA ELF (cubin): e_machine EM_CUDA, the arch in e_flags' 2nd byte."""
    if data[:4] != b"\x7fELF" or len(data) < 52:
        return None
    import struct

    if struct.unpack_from("<H", data, 18)[0] != EM_CUDA:
        return None
    return (struct.unpack_from("<I", data, 48)[0] >> 8) & 0xFF


def check_toolchain(facts: dict[str, Any]) -> tuple[str, str, dict[str, Any]]:
    """nvcc compiles a kernel to a cubin for every target arch (arch-specific, sm_100a: what
    NVFP4 tensor-core code needs), then torch's cpp_extension JIT-compiles and loads a CUDA
    extension for those archs: the path FlashInfer, DeepGEMM and custom ops take at first
    launch. No GPU is needed to compile; running the kernels is the GPU stage's job."""
    import shutil
    import subprocess
    import tempfile

    tc = facts.get("toolchain") or {}
    archs = [a for a in facts.get("archs", []) if a != "cpu"]
    if not tc:
        return SKIPPED, f"skipped: the {facts.get('flavor', '?')} flavor carries no toolchain", {}
    nvcc = Path(tc["cuda_home"]) / "bin" / "nvcc"
    if not nvcc.exists():
        return FAIL, f"no nvcc at {nvcc} (CUDA_HOME={os.environ.get('CUDA_HOME')})", {}
    details: dict[str, Any] = {"nvcc": str(nvcc), "cubins": {}}
    with tempfile.TemporaryDirectory(prefix="imgbuild-tc-") as td:
        src = Path(td) / "axpy.cu"
        src.write_text(TOY_KERNEL)
        for a in archs:
            out = Path(td) / f"axpy.{a}.cubin"
            t0 = time.perf_counter()
            proc = subprocess.run([str(nvcc), "-cubin", f"-arch=sm_{_sm(a)}a", "-o", str(out),
                                   str(src)], capture_output=True, text=True)
            got = cubin_arch(out.read_bytes()) if out.exists() else None
            details["cubins"][a] = {"seconds": round(time.perf_counter() - t0, 2), "sm": got}
            if proc.returncode != 0 or got != _sm(a):
                return FAIL, (f"nvcc could not compile for {a}: "
                              + (proc.stderr.strip()[-400:] or f"cubin is for sm_{got}")), details
        if shutil.which("c++") is None:
            return FAIL, "nvcc compiles, but there is no host C++ compiler for extensions", details
        try:
            import torch.utils.cpp_extension as ext
        except Exception as exc:  # noqa: BLE001
            return FAIL, f"torch.utils.cpp_extension does not import: {exc}", details
        os.environ["TORCH_CUDA_ARCH_LIST"] = ";".join(
            f"{_sm(a) // 10}.{_sm(a) % 10}" for a in archs)
        t0 = time.perf_counter()
        mod = ext.load_inline(
            name="imgbuild_jit_probe", build_directory=td,
            cpp_sources="void axpy(double a, torch::Tensor x, torch::Tensor y);",
            cuda_sources=TOY_KERNEL + (
                "void axpy(double a, torch::Tensor x, torch::Tensor y) {\n"
                "  int n = x.numel();\n"
                "  imgbuild_axpy<<<(n + 255) / 256, 256>>>((float)a, x.data_ptr<float>(),\n"
                "                                         y.data_ptr<float>(), n);\n"
                "}\n"),
            functions=["axpy"], verbose=False)
        built = sorted(p.name for p in Path(td).glob("*.so"))
        details["cpp_extension"] = {"seconds": round(time.perf_counter() - t0, 1),
                                    "built": built, "arch_list": os.environ["TORCH_CUDA_ARCH_LIST"],
                                    "loaded": hasattr(mod, "axpy")}
        if not hasattr(mod, "axpy"):
            return FAIL, "cpp_extension built a module without its function", details
        status, said = _flashinfer_jit(archs, Path(td), details)
        if status == FAIL:
            return FAIL, said, details
    return PASS, (f"nvcc {tc.get('nvcc', '')} compiled for " + ", ".join(
        f"sm_{_sm(a)}a" for a in archs) + "; torch cpp_extension built and loaded a CUDA "
        f"extension for {details['cpp_extension']['arch_list']} in "
        f"{details['cpp_extension']['seconds']} s; " + said), details


def _flashinfer_jit(archs: list[str], work: Path, details: dict[str, Any]) -> tuple[str, str]:
    """The engine's own JIT path: FlashInfer compiles one real kernel (silu_and_mul, which
    SGLang and vLLM call in every gated MLP) for the target archs, as at first launch."""
    # Read by flashinfer.jit when it is imported: set before.
    os.environ["FLASHINFER_CUDA_ARCH_LIST"] = " ".join(
        f"{_sm(a) // 10}.{_sm(a) % 10}a" for a in archs)
    os.environ["FLASHINFER_WORKSPACE_BASE"] = str(work)
    try:
        from flashinfer.jit import activation
    except Exception as exc:  # noqa: BLE001
        details["flashinfer_jit"] = {"skipped": str(exc)[:200]}
        return SKIPPED, f"FlashInfer JIT skipped: flashinfer.jit.activation: {exc}"[:200]
    gen = getattr(activation, "gen_act_and_mul_module", None)
    if gen is None:
        details["flashinfer_jit"] = {"skipped": "no gen_act_and_mul_module"}
        return SKIPPED, "FlashInfer JIT skipped: this FlashInfer has no gen_act_and_mul_module"
    t0 = time.perf_counter()
    spec = gen("silu")
    try:
        spec.build(verbose=False)
    except Exception as exc:  # noqa: BLE001
        details["flashinfer_jit"] = {"error": str(exc)[-2000:]}
        return FAIL, f"FlashInfer could not JIT-compile {spec.name}: {str(exc)[-300:]}"
    built = sorted(str(p.relative_to(work)) for p in work.rglob(f"{spec.name}*.so"))
    details["flashinfer_jit"] = {"module": spec.name, "seconds": round(time.perf_counter() - t0, 1),
                                 "arch_list": os.environ["FLASHINFER_CUDA_ARCH_LIST"],
                                 "built": built}
    if not built:
        return FAIL, f"FlashInfer's build of {spec.name} left no shared object"
    return PASS, (f"FlashInfer JIT-compiled {spec.name} for "
                  f"{os.environ['FLASHINFER_CUDA_ARCH_LIST']} in "
                  f"{details['flashinfer_jit']['seconds']} s")


SCHEME_PROBES = "scheme-probes.json"  # beside this file: checkpoints as config and names


def _probe_dirs(model_dir: Path | None, here: Path, tmp: Path) -> dict[str, Path]:
    """The checkpoints the engine is asked about: the image's smoke model, and the scheme
    probes (a quantization config and tensor names each, written as config.json and a
    safetensors index: an engine picks a layer's scheme from those alone)."""
    dirs: dict[str, Path] = {}
    if model_dir is not None and (model_dir / "config.json").is_file():
        dirs["smoke-model"] = model_dir
    probes = here / SCHEME_PROBES
    if probes.is_file():
        for name, p in sorted(json.loads(probes.read_text())["probes"].items()):
            d = tmp / name
            d.mkdir()
            (d / "config.json").write_text(json.dumps({"quantization_config":
                                                       p["quantization_config"]}))
            (d / "model.safetensors.index.json").write_text(json.dumps(
                {"weight_map": dict.fromkeys(p["tensors"], "model.safetensors")}))
            dirs[name] = d
    return dirs


def check_engine_schemes(model_dir: Path | None, facts: dict[str, Any],
                         here: Path) -> tuple[str, str, dict[str, Any]]:
    """The image's own engine, on CPU: its CompressedTensorsConfig parses each checkpoint's
    quantization config and its scheme selection is asked for every layer, on each of the
    image's GPU archs (the capability query answered for the arch). Every quantized layer must
    get the scheme its group declares, every other layer none (engine_schemes.py)."""
    import tempfile

    engine = facts.get("engine")
    if engine not in ("sglang", "vllm"):
        return SKIPPED, f"skipped: no serving engine in this image ({engine or 'none'})", {}
    sys.path.insert(0, str(here))
    try:
        import engine_schemes as es
    finally:
        sys.path.remove(str(here))
    archs = [a for a in facts.get("archs") or [] if a in es.ARCH_CAPABILITY]
    if not archs:
        return SKIPPED, "skipped: none of the image's archs is a GPU arch the probe knows", {}
    with tempfile.TemporaryDirectory(prefix="imgbuild-schemes-") as t:
        dirs = _probe_dirs(model_dir, here, Path(t))
        if not dirs:
            return SKIPPED, "skipped: no checkpoint to ask the engine about", {}
        reports = {name: es.run(d, engine, archs) for name, d in dirs.items()}
    return judge_scheme_reports(engine, archs, reports)


def judge_scheme_reports(engine: str, archs: list[str], reports: dict[str, dict[str, Any]]
                         ) -> tuple[str, str, dict[str, Any]]:
    """The engine-schemes stage's verdict from engine_schemes.run's report per checkpoint."""
    bad = []  # per checkpoint: how many layers went wrong, and the first, as the engine said
    for name, r in reports.items():
        if r.get("error"):
            bad.append(f"{name}: {r['error']}")
        ms = r["mismatches"]
        if ms:
            m = ms[0]
            bad.append(f"{name}: {len(ms)} mismatch{'es' if len(ms) != 1 else ''}, first "
                       f"{m['module']} on {m['arch']}: declared {m['declared']}, got "
                       f"{m['got'] or 'no scheme'}" + (f" ({m['error']})" if m.get("error") else ""))
    modules = sum(r["modules_checked"] for r in reports.values())
    details = {"archs": archs, "checkpoints": {
        name: {k: r.get(k) for k in ("modules_checked", "mismatches", "chosen", "unchecked",
                                     "kernel_not_built", "error", "seconds", "version")}
        for name, r in reports.items()}}
    version = next((r.get("version") for r in reports.values() if r.get("version")), "")
    if bad:
        return FAIL, (f"{engine} {version} did not give every layer its declared scheme: "
                      + "; ".join(bad)), details
    # What the engine could not be asked without a GPU run is said, not passed over.
    asked = [k for r in reports.values() for k in r.get("kernel_not_built") or []]
    not_asked = sorted({k["module"] for k in asked if k["scheme"] is None})
    no_kernel = sorted({k["module"] for k in asked if k["scheme"] is not None})
    notes = ([f"{len(not_asked)} not asked (e.g. {not_asked[0]}: "
              f"{next(k['error'] for k in asked if k['scheme'] is None)})"] if not_asked else []) \
        + ([f"{len(no_kernel)} chosen whose kernel is picked on a GPU"] if no_kernel else [])
    return PASS, (f"{engine} {version} gave each of {modules - len(not_asked)} layers in "
                  f"{len(reports)} checkpoints ({', '.join(reports)}) its declared scheme on "
                  f"{', '.join(archs)}" + (f"; {'; '.join(notes)}" if notes else "")), details


def check_kernels(facts: dict[str, Any]) -> tuple[str, str, dict[str, Any]]:
    """The kernel libraries whose GPU code was read from the locked wheels (plan's coverage
    table) are installed unchanged: byte for byte the files that were scanned."""
    import site
    import sysconfig

    files = facts.get("kernel_files") or []
    if not files:
        return SKIPPED, "skipped: no kernel coverage recorded for this image", {}
    roots = [Path(sysconfig.get_paths()["platlib"]), Path(sysconfig.get_paths()["purelib"]),
             *map(Path, site.getsitepackages())]
    bad = kernel_file_problems(files, roots)
    details = {"files": len(files), "problems": bad}
    if bad:
        return FAIL, "; ".join(bad[:5]), details
    return PASS, (f"{len(files)} kernel librar{'y is' if len(files) == 1 else 'ies are'} the "
                  "files whose GPU code plan read"), details


def kernel_file_problems(files: list[dict[str, Any]], roots: list[Path]) -> list[str]:
    """Each scanned kernel file not installed under any of roots, or installed changed."""
    bad = []
    for f in files:
        path = next((r / f["member"] for r in roots if (r / f["member"]).is_file()), None)
        if path is None:
            bad.append(f"{f['package']}: {f['member']} is not installed")
        elif sha256_file(path) != f["sha256"]:
            bad.append(f"{f['package']}: {f['member']} differs from the scanned file")
    return bad


def run_smoke(lock: Path | None, model: Path | None, *, gpu: str = "off",
              facts: Path | None = None, engine: str | None = None) -> dict[str, Any]:
    report = _run_cpu_stages(lock, model)
    stages = report["stages"]
    f = _image_facts(facts) if facts else {}
    if facts is not None:
        stages.insert(1, _stage("patches", lambda: check_patches(f, facts.parent)))
        stages.insert(2, _stage("kernels", lambda: check_kernels(f)))
        stages.insert(3, _stage("toolchain", lambda: check_toolchain(f)))
        stages.append(_stage("engine-schemes",
                             lambda: check_engine_schemes(model, f, facts.parent)))
    eng = engine or f.get("engine") or "transformers"
    if gpu == "off":
        stages.append(_skipped("gpu-engine", "skipped: --gpu off"))
    elif model is None or not model.is_dir():
        stages.append(_skipped("gpu-engine", "skipped: no smoke model"))
    else:
        stages.append(_stage("gpu-engine", lambda: check_gpu(model, f, eng, gpu)))
    report["ok"] = all(s["status"] != FAIL for s in stages)
    return report


def _run_cpu_stages(lock: Path | None, model: Path | None) -> dict[str, Any]:
    """Run every stage; the report is plain data (also what --json prints)."""
    # The image has no network; a hub lookup would hang or fail, never help.
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    stages = []
    if lock is None:
        stages.append(_skipped("environment", "no --lock given"))
    elif not lock.is_file():
        stages.append(
            {**_skipped("environment", ""), "status": FAIL, "reason": f"lock file {lock} not found"}
        )
    else:
        stages.append(_stage("environment", lambda: check_environment(lock)))
    if model is None:
        stages.append(_skipped("checkpoint-cpu", "no --model given"))
    elif not model.is_dir():
        stages.append(
            {
                **_skipped("checkpoint-cpu", ""),
                "status": FAIL,
                "reason": f"model directory {model} not found",
            }
        )
    else:
        stages.append(_stage("checkpoint-cpu", lambda: check_checkpoint(model)))
    return {"stages": stages, "ok": all(s["status"] != FAIL for s in stages)}


def format_human(report: dict[str, Any]) -> str:
    lines = []
    for s in report["stages"]:
        checks = s["details"].get("checks", [])
        failed = [c for c in checks if not c["ok"]]
        reason = f"{len(failed)} of {len(checks)} checks failed:" if failed else s["reason"]
        lines.append(f"{s['status'].upper():7} {s['name']:15} {s['duration_s']:7.2f}s  {reason}")
        lines.extend(f"        - {c['check']}: {c['summary']}" for c in failed)
    lines.append("smoke: " + ("ok" if report["ok"] else "FAILED"))
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="imgbuild in-image smoke test")
    parser.add_argument("--lock", type=Path, help="the image's lock (uv pip compile output)")
    parser.add_argument(
        "--model", type=Path, help="smoke checkpoint directory (with imgbuild-reference/)"
    )
    parser.add_argument("--json", action="store_true", help="print the report as JSON")
    parser.add_argument("--gpu", choices=("auto", "off", "require"), default="off",
                        help="stage 4, the engine on a GPU: auto runs it where a GPU is, "
                             "require fails without one")
    parser.add_argument("--facts", type=Path, help="the image's facts (archs, engine)")
    parser.add_argument("--engine", choices=("sglang", "vllm", "transformers"))
    args = parser.parse_args(argv)
    report = run_smoke(args.lock, args.model, gpu=args.gpu, facts=args.facts, engine=args.engine)
    print(json.dumps(report, indent=2) if args.json else format_human(report))
    return 0 if report["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
