"""check-model on a checkpoint the size of a large MoE: 30,000 module names, 10,000 ignore entries.

The shape of the real case (DESIGN.md): an llmcompressor checkpoint whose ignore list names
thousands of expert *parent* modules (`model.layers.L.mlp.experts.E`), each hiding its w1/w2/w3
under SGLang 0.5.7-0.5.16's substring matcher. Generated here as a safetensors index (no
weights: check-model reads names only), then timed, median of several runs:

- load   read config.json + model.safetensors.index.json (120,000 tensor names)
- check  every check for a target on sglang 0.5.16 (substring matcher), module index included
- fix    rewrite the ignore list and prove it (exact, suffix and substring recomputed),
         module index built anew
- check-model  check, then fix on check's index, as `imgbuild check-model --fix` runs them
- cli / cli --fix  the command as a user runs it (a new process: imports, the target's lock,
         the checkpoint read, the report), against sglang-0516-blackwell (SGLang 0.5.16)

Results: bench/results/checkmodel.json and a table on stdout.

    .venv/bin/python bench/checkmodel_bench.py [--rounds 7]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.machine import machine  # noqa: E402
from builder.checks import checkmodel  # noqa: E402
from builder.workspace import Workspace  # noqa: E402

IMGBUILD = str(ROOT / ".venv" / "bin" / "imgbuild")

LAYERS = 60
EXPERTS = 164  # 60 x 164 x 3 = 29,520 expert Linears
ATTN = ("q_proj", "k_proj", "v_proj", "o_proj")  # + 240
SHARED = ("w1", "w2", "w3")  # shared experts: + 180
EXTRA = ("mlp.gate",)  # routers: + 60 -> 30,000 modules


def _write(root: Path, weight_map: dict[str, str], ignore: list[str]) -> Path:
    """config.json (NVFP4 on every Linear, this ignore list) and the safetensors index."""
    config = {
        "architectures": ["DeepseekV3ForCausalLM"],
        "quantization_config": {
            "quant_method": "compressed-tensors", "format": "nvfp4-pack-quantized",
            "config_groups": {"group_0": {
                "format": "nvfp4-pack-quantized", "targets": ["Linear"],
                "weights": {"num_bits": 4, "type": "float", "strategy": "tensor_group",
                            "group_size": 16},
                "input_activations": {"num_bits": 4, "type": "float",
                                      "strategy": "tensor_group", "group_size": 16}}},
            "ignore": ignore}}
    (root / "config.json").write_text(json.dumps(config, indent=2))
    (root / "model.safetensors.index.json").write_text(json.dumps(
        {"metadata": {"total_size": 0}, "weight_map": weight_map}))
    return root


def make_checkpoint(root: Path) -> tuple[Path, int, int]:
    """A checkpoint directory with config.json and a safetensors index; no weight files."""
    weight_map: dict[str, str] = {}
    modules = 0

    def quantized(m: str) -> None:
        nonlocal modules
        modules += 1
        for p in ("weight_packed", "weight_scale", "weight_global_scale", "input_global_scale"):
            weight_map[f"{m}.{p}"] = "model-00001-of-00001.safetensors"

    def plain(m: str) -> None:
        nonlocal modules
        modules += 1
        weight_map[f"{m}.weight"] = "model-00001-of-00001.safetensors"

    ignore: list[str] = []
    for layer in range(LAYERS):
        pre = f"model.layers.{layer}"
        for a in ATTN:
            plain(f"{pre}.self_attn.{a}")
        for e in range(EXPERTS):
            for w in ("w1", "w2", "w3"):
                quantized(f"{pre}.mlp.experts.{e}.{w}")
        for w in SHARED:
            quantized(f"{pre}.mlp.shared_experts.{w}")
        for x in EXTRA:
            plain(f"{pre}.{x}")
        # What the real checkpoint's ignore list looked like: parents of quantized experts,
        # plus the modules really left in bf16.
        ignore += [f"{pre}.mlp.experts.{e}" for e in range(EXPERTS)]
        ignore += [f"{pre}.mlp.gate"]
        ignore += [f"{pre}.self_attn.{a}" for a in ATTN if layer < 25]
    ignore += [f"model.layers.{layer}.mlp.shared_experts" for layer in range(
        10_000 - len(ignore))]
    return _write(root, weight_map, ignore), modules, len(ignore)


def make_irregular(root: Path) -> tuple[Path, int, int]:
    """A held-out shape the code was not tuned on (seeded, so every run is the same): 61 layers
    of 170 experts (gate/up/down), MLA attention partly quantized, an ignore list that names
    most but not all expert parents in 90% of the layers, the routers and lm_head: about
    31,500 modules and 9,200 entries, which collapse into many expressions, not one."""
    import random

    rng = random.Random(7)
    weight_map: dict[str, str] = {}
    ignore: list[str] = []
    modules = 0

    def add(m: str, quantized: bool) -> None:
        nonlocal modules
        modules += 1
        for p in (("weight_packed", "weight_scale", "weight_global_scale", "input_global_scale")
                  if quantized else ("weight",)):
            weight_map[f"{m}.{p}"] = "model-00001-of-00001.safetensors"
        if not quantized:
            ignore.append(m)

    for layer in range(61):
        pre = f"model.layers.{layer}"
        for a in ("q_a_proj", "q_b_proj", "kv_a_proj_with_mqa", "kv_b_proj", "o_proj"):
            add(f"{pre}.self_attn.{a}", quantized=not (layer < 3 or rng.random() < 0.3))
        for e in range(170):
            for w in ("gate_proj", "up_proj", "down_proj"):
                add(f"{pre}.mlp.experts.{e}.{w}", quantized=True)
        if rng.random() < 0.9:
            ignore += [f"{pre}.mlp.experts.{e}" for e in range(170) if rng.random() < 0.98]
        add(f"{pre}.mlp.gate", quantized=False)
    add("lm_head", quantized=False)
    return _write(root, weight_map, ignore), modules, len(ignore)


SHAPES = {"uniform": make_checkpoint, "irregular": make_irregular}
CPU: dict[str, list[float]] = {}


def timed(fn, rounds: int, name: str = "") -> tuple[float, list[float], object]:
    """Wall time per run (median); CPU time of the process per run goes to CPU[name] (this
    machine is shared, so wall time includes waiting for a core)."""
    times, out = [], None
    for _ in range(rounds):
        c = time.process_time()
        t = time.perf_counter()
        out = fn()
        times.append(time.perf_counter() - t)
        CPU.setdefault(name, []).append(time.process_time() - c)
    return statistics.median(times), times, out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--shape", choices=tuple(SHAPES), default="uniform")
    ap.add_argument("--out", type=Path, help="default: bench/results/checkmodel[-SHAPE].json")
    args = ap.parse_args(argv)
    args.out = args.out or ROOT / "bench" / "results" / (
        "checkmodel.json" if args.shape == "uniform" else f"checkmodel-{args.shape}.json")
    ws = Workspace.open(ROOT / "images")
    cat = ws.catalog
    target = replace(cat.target("sglang-blackwell"), engine_version="0.5.16")
    engines = ws.engines
    formats = {"nvfp4-pack-quantized", "mixed-precision", "pack-quantized", "float-quantized"}
    with tempfile.TemporaryDirectory() as td:
        root, modules, entries = SHAPES[args.shape](Path(td))
        t_load, load_runs, ckpt = timed(lambda: checkmodel.load_checkpoint(root), args.rounds, "load")

        def run_check():
            return checkmodel.analyze(ckpt, target=target, catalog=cat, engines=engines,
                                      ct_formats=formats, ct_version="0.19.0")

        t_check, check_runs, ana = timed(run_check, args.rounds, "check")
        findings = ana.findings
        t_fix, fix_runs, result = timed(
            lambda: checkmodel.fix(ckpt.config, ckpt.module_names, "substring",
                                   quantized=ckpt.quantized), args.rounds, "fix")

        def run_both():  # as check-model runs them: fix reuses check's module index
            a = run_check()
            return checkmodel.fix(ckpt.config, a.index, "substring",
                                  quantized=ckpt.quantized, packed=a.packed or None)

        t_both, both_runs, _ = timed(run_both, args.rounds, "check-model")
        def cli(*extra: str):
            r = subprocess.run([IMGBUILD, "check-model", str(root), "--target",
                                "sglang-0516-blackwell", "--json", *extra], cwd=ROOT,
                               capture_output=True, text=True)
            if r.returncode not in (0, 1):
                raise SystemExit(f"check-model failed:\n{r.stderr[-2000:]}")
            return json.loads(r.stdout)

        t_cli, cli_runs, cli_doc = timed(cli, args.rounds, "cli")
        t_clifix, clifix_runs, clifix_doc = timed(
            lambda: cli("--fix", str(Path(td) / "fixed" / "config.json")), args.rounds, "cli --fix")
    ana = ana.ignore
    proof = result.proof
    doc = {
        "machine": machine(),
        "rounds": args.rounds,
        "shape": {"name": args.shape, "module_names": modules, "ignore_entries": entries,
                  "tensor_names": len(ckpt.quantized) * 4 + (modules - len(ckpt.quantized))},
        "median_s": {"load": round(t_load, 4), "check": round(t_check, 4),
                     "fix": round(t_fix, 4), "check-model": round(t_both, 4),
                     "cli": round(t_cli, 4), "cli --fix": round(t_clifix, 4)},
        "median_cpu_s": {k: round(statistics.median(v), 4) for k, v in CPU.items()},
        "runs_s": {"load": [round(x, 4) for x in load_runs],
                   "check": [round(x, 4) for x in check_runs],
                   "fix": [round(x, 4) for x in fix_runs],
                   "check-model": [round(x, 4) for x in both_runs],
                   "cli": [round(x, 4) for x in cli_runs],
                   "cli --fix": [round(x, 4) for x in clifix_runs]},
        "cli": {"findings": [f"{f['severity']}:{f['kind']}" for f in cli_doc["findings"]],
                "fix_proof": (clifix_doc.get("fix") or {}).get("proof")},
        "result": {"offending_entries": len(ana.hiding), "hidden_modules": len(ana.hidden),
                   "moe_layers": len(ana.moe_layers),
                   "findings": [f"{f.severity}:{f.kind}" for f in findings],
                   "fix_replaced": len(result.replaced), "fix_expressions": len(result.added),
                   "fix_expression_chars": sum(len(x) for x in result.added),
                   "proof": proof.to_dict()},
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(doc, indent=2) + "\n")
    print(f"{modules:,} module names, {entries:,} ignore entries "
          f"({len(ana.hiding):,} hide {len(ana.hidden):,} quantized modules), "
          f"median of {args.rounds}")
    print(f"{'step':<13}{'median s':>10}{'min s':>10}{'max s':>10}{'cpu s':>10}")
    for k, runs in (("load", load_runs), ("check", check_runs), ("fix", fix_runs),
                    ("check-model", both_runs), ("cli", cli_runs), ("cli --fix", clifix_runs)):
        print(f"{k:<13}{statistics.median(runs):>10.3f}{min(runs):>10.3f}{max(runs):>10.3f}"
              f"{statistics.median(CPU[k]):>10.3f}")
    print(f"fix: {len(result.replaced):,} entries -> {len(result.added)} re: expressions "
          f"({doc['result']['fix_expression_chars']} chars); proof equal={proof.equal} "
          f"(hidden {proof.hidden_before:,} -> {proof.hidden_after})")
    print(f"wrote {args.out.relative_to(ROOT) if args.out.is_relative_to(ROOT) else args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
