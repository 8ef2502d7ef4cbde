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

Shapes (--shape): `uniform` (above), `irregular` (a held-out one), `large-ignore` (a
Kimi-K2.5-like layout: 31,202 modules, 10,540 ignore entries of every shape a real list has).

--before REV runs the same steps side by side with the builder package of commit REV (read
with `git archive` into a temporary directory; --after REV measures a commit's, not the working
tree's): in-process steps in a child process per version, CLI runs alternating. CLI runs go through one runner for both versions (the
checkout's editable install left out, the version's directory first on sys.path), with their
bytecode cached (PYTHONPYCACHEPREFIX in the temporary directory, one warm-up run each), as
the entry point `imgbuild` runs; CPU seconds of a CLI run are the child's user + system time.
--profile adds a cProfile of one CLI run per version: the functions that take the time.

Results: bench/results/checkmodel[-SHAPE].json and a table on stdout.

    .venv/bin/python bench/checkmodel_bench.py [--rounds 7] [--shape large-ignore]
        [--before REV [--after REV]] [--profile]
"""

from __future__ import annotations

import argparse
import json
import os
import pstats
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
# Another version's builder package (--before runs this script again under it, --steps): the
# venv's editable install would import the checkout's, so it is left out.
CODE = os.environ.get("CHECKMODEL_BENCH_CODE")
if CODE:
    sys.meta_path[:] = [f for f in sys.meta_path if "editable" not in repr(f).lower()]
    sys.path.insert(0, CODE)

from bench.machine import machine  # noqa: E402
from imgbuild.checks import checkmodel  # noqa: E402
from imgbuild.workspace import Workspace  # noqa: E402

PYTHON = str(ROOT / ".venv" / "bin" / "python")
TARGET = "sglang-0516-blackwell"  # the CLI's target: SGLang 0.5.16 with its patches
# `imgbuild` from the builder package in argv[1], as the entry point runs it.
RUNNER = """import sys
tree = sys.argv.pop(1)
sys.meta_path[:] = [f for f in sys.meta_path if "editable" not in repr(f).lower()]
sys.path.insert(0, tree)
from imgbuild.cli import main
sys.argv[0] = "imgbuild"
sys.exit(main())
"""
STEPS = ("load", "check", "fix", "check-model")

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


def make_large_ignore(root: Path, layers: int = 61, experts: int = 168,
                      blocks: int = 27) -> tuple[Path, int, int]:
    """Kimi-K2.5-like (seeded): Kimi K2's language model (DeepseekV3ForCausalLM) under
    `language_model.model` (61 layers; layer 0 dense, 1-60 with 168 routed experts, gate/up/down
    in NVFP4 W4A4; MLA attention, shared experts and routers in bf16) and a vision tower in
    bf16. Its ignore list has every shape a real one has: each bf16 Linear by exact name (660),
    expert parents for 97.5% of the experts of every MoE layer (9,800-odd, the SGLang
    0.5.7-0.5.16 hazard), `self_attn` parents in half the layers, `re:` patterns for the vision
    tower, the projector and the routers, and a bare `lm_head`: 31,202 modules, 10,540 entries.
    Smaller (fewer layers, experts, vision blocks): the same shape, for tests that check every
    answer against a brute-force one."""
    import random

    rng = random.Random(26)
    weight_map: dict[str, str] = {}
    ignore: list[str] = []
    modules = 0

    def add(m: str, quantized: bool = False, listed: bool = False) -> None:
        nonlocal modules
        modules += 1
        for p in (("weight_packed", "weight_scale", "weight_global_scale", "input_global_scale")
                  if quantized else ("weight",)):
            weight_map[f"{m}.{p}"] = "model-00001-of-00001.safetensors"
        if listed:
            ignore.append(m)

    lm = "language_model.model"
    add(f"{lm}.embed_tokens")
    for layer in range(layers):
        pre = f"{lm}.layers.{layer}"
        for a in ("q_a_proj", "q_b_proj", "kv_a_proj_with_mqa", "kv_b_proj", "o_proj"):
            add(f"{pre}.self_attn.{a}", listed=True)
        for n in ("self_attn.q_a_layernorm", "self_attn.kv_a_layernorm", "input_layernorm",
                  "post_attention_layernorm"):
            add(f"{pre}.{n}")
        if layer == 0:
            for w in ("gate_proj", "up_proj", "down_proj"):
                add(f"{pre}.mlp.{w}", listed=True)
            continue
        for e in range(experts):
            for w in ("gate_proj", "up_proj", "down_proj"):
                add(f"{pre}.mlp.experts.{e}.{w}", quantized=True)
        for w in ("gate_proj", "up_proj", "down_proj"):
            add(f"{pre}.mlp.shared_experts.{w}", listed=True)
        add(f"{pre}.mlp.gate", listed=True)
        ignore += [f"{pre}.mlp.experts.{e}" for e in range(experts) if rng.random() < 0.975]
        if rng.random() < 0.5:
            ignore.append(f"{pre}.self_attn")
    add(f"{lm}.norm")
    add("language_model.lm_head", listed=True)
    add("vision_tower.patch_embed.proj")
    for b in range(blocks):
        for n in ("wqkv", "wo", "mlp.fc0", "mlp.fc1"):
            add(f"vision_tower.encoder.blocks.{b}.{n}", listed=True)
        for n in ("norm0", "norm1"):
            add(f"vision_tower.encoder.blocks.{b}.{n}")
    add("vision_tower.encoder.final_layernorm")
    add("mm_projector.pre_norm")
    for n in ("proj.0", "proj.2"):
        add(f"mm_projector.{n}", listed=True)
    ignore += ["re:.*vision_tower.*", "re:.*mm_projector.*", r"re:.*mlp\.gate$", "lm_head"]
    return _write(root, weight_map, ignore), modules, len(ignore)


SHAPES = {"uniform": make_checkpoint, "irregular": make_irregular,
          "large-ignore": make_large_ignore}


def timed(fn, rounds: int, name: str, cpu: dict[str, list[float]]
          ) -> tuple[float, list[float], object]:
    """Wall time per run (median); CPU time of the process per run goes to cpu[name] (this
    machine is shared, so wall time includes waiting for a core)."""
    times, out = [], None
    for _ in range(rounds):
        c = time.process_time()
        t = time.perf_counter()
        out = fn()
        times.append(time.perf_counter() - t)
        cpu.setdefault(name, []).append(time.process_time() - c)
    return statistics.median(times), times, out


def steps(root: Path, rounds: int) -> dict:
    """The in-process steps on one checkpoint, with the builder package this process imports."""
    ws = Workspace.open(ROOT / "images")
    cat = ws.catalog
    target = replace(cat.target("sglang-blackwell"), engine_version="0.5.16")
    engines = ws.engines
    formats = {"nvfp4-pack-quantized", "mixed-precision", "pack-quantized", "float-quantized"}
    cpu: dict[str, list[float]] = {}
    _, load_runs, ckpt = timed(lambda: checkmodel.load_checkpoint(root), rounds, "load", cpu)

    def run_check():
        return checkmodel.analyze(ckpt, target=target, catalog=cat, engines=engines,
                                  ct_formats=formats, ct_version="0.19.0")

    _, check_runs, ana = timed(run_check, rounds, "check", cpu)
    _, fix_runs, result = timed(
        lambda: checkmodel.fix(ckpt.config, ckpt.module_names, "substring",
                               quantized=ckpt.quantized), rounds, "fix", cpu)

    def run_both():  # as check-model runs them: fix reuses check's module index
        a = run_check()
        return checkmodel.fix(ckpt.config, a.index, "substring",
                              quantized=ckpt.quantized, packed=a.packed or None)

    _, both_runs, _ = timed(run_both, rounds, "check-model", cpu)
    ig = ana.ignore
    runs = dict(zip(STEPS, (load_runs, check_runs, fix_runs, both_runs)))
    return {
        "median_s": {k: round(statistics.median(v), 4) for k, v in runs.items()},
        "median_cpu_s": {k: round(statistics.median(v), 4) for k, v in cpu.items()},
        "runs_s": {k: [round(x, 4) for x in v] for k, v in runs.items()},
        "tensor_names": len(ckpt.quantized) * 4 + (len(ckpt.module_names) - len(ckpt.quantized)),
        "result": {"offending_entries": len(ig.hiding), "hidden_modules": len(ig.hidden),
                   "moe_layers": len(ig.moe_layers),
                   "findings": [f"{f.severity}:{f.kind}" for f in ana.findings],
                   "fix_replaced": len(result.replaced), "fix_expressions": len(result.added),
                   "fix_expression_chars": sum(len(x) for x in result.added),
                   "proof": result.proof.to_dict()}}


def steps_in_child(root: Path, rounds: int, code: Path) -> dict:
    env = os.environ | {"CHECKMODEL_BENCH_CODE": str(code)}
    r = subprocess.run([PYTHON, __file__, "--steps", str(root), "--rounds", str(rounds)],
                       cwd=ROOT, env=env, capture_output=True, text=True)
    if r.returncode != 0:
        raise SystemExit(f"the steps under {code} failed:\n{r.stderr[-2000:]}")
    return json.loads(r.stdout)


def cli(runner: Path, code: Path, env: dict[str, str], *args: str) -> tuple[float, float, str]:
    """One `imgbuild ARGS` from `code`: wall seconds, the child's CPU seconds, its stdout."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t = time.perf_counter()
    r = subprocess.run([PYTHON, str(runner), str(code), *args], cwd=ROOT, env=env,
                       capture_output=True, text=True)
    took = time.perf_counter() - t
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if r.returncode not in (0, 1):
        raise SystemExit(f"check-model ({code}) failed:\n{r.stderr[-2000:]}")
    return (took, after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime,
            r.stdout)


def profile(runner: Path, code: Path, env: dict[str, str], out: Path, *args: str,
            top: int = 20) -> dict:
    """One CLI run under cProfile: the builder functions by cumulative time, and all functions
    by their own time."""
    subprocess.run([PYTHON, "-m", "cProfile", "-o", str(out), str(runner), str(code), *args],
                   cwd=ROOT, env=env, capture_output=True, check=False)
    st = pstats.Stats(str(out))
    total = st.total_tt  # type: ignore[attr-defined]

    def name(key: tuple[str, int, str]) -> str:
        f, line, fn = key
        for base in (str(code) + "/", str(ROOT) + "/"):
            f = f.removeprefix(base)
        return f"{f}:{line}({fn})"

    rows = [(k, v) for k, v in st.stats.items()]  # type: ignore[attr-defined]
    ours = sorted((r for r in rows if r[0][0].startswith(str(code) + "/imgbuild/")),
                  key=lambda r: -r[1][3])[:top]
    own = sorted(rows, key=lambda r: -r[1][2])[:top // 2]
    return {"total_s": round(total, 3),
            "cumulative": [{"function": name(k), "cum_s": round(v[3], 3),
                            "own_s": round(v[2], 3), "calls": v[1]} for k, v in ours],
            "own": [{"function": name(k), "own_s": round(v[2], 3), "calls": v[1]}
                    for k, v in own]}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--shape", choices=tuple(SHAPES), default="uniform")
    ap.add_argument("--before", metavar="REV",
                    help="also run the builder package of this commit, side by side")
    ap.add_argument("--after", metavar="REV",
                    help="the builder package of this commit as the one measured (default: the "
                         "working tree, with whatever else is uncommitted in it)")
    ap.add_argument("--profile", action="store_true", help="cProfile one CLI run per version")
    ap.add_argument("--out", type=Path, help="default: bench/results/checkmodel[-SHAPE].json")
    ap.add_argument("--steps", type=Path, help=argparse.SUPPRESS)  # the child of steps_in_child
    args = ap.parse_args(argv)
    if args.steps:
        print(json.dumps(steps(args.steps, args.rounds)))
        return 0
    args.out = args.out or ROOT / "bench" / "results" / (
        "checkmodel.json" if args.shape == "uniform" else f"checkmodel-{args.shape}.json")
    load_start = os.getloadavg()  # others' work on this shared machine: wall time waits for it
    with tempfile.TemporaryDirectory() as td:
        tmp = Path(td)
        ckpt = tmp / "checkpoint"
        ckpt.mkdir()
        root, modules, entries = SHAPES[args.shape](ckpt)
        runner = tmp / "imgbuild_runner.py"
        runner.write_text(RUNNER)
        def archive(rev: str, name: str) -> Path:
            tree = tmp / name
            tree.mkdir()
            # The package is imgbuild/; commits before the rename have it as builder/ (its
            # imports are relative, so it runs under the new name).
            for folder in ("imgbuild", "builder"):
                got = subprocess.run(["git", "archive", rev, folder], cwd=ROOT,
                                     capture_output=True)
                if got.returncode == 0:
                    break
            else:
                raise SystemExit(f"{rev}: neither imgbuild/ nor builder/ in it")
            subprocess.run(["tar", "-x", "-C", str(tree)], input=got.stdout, check=True)
            if folder != "imgbuild":
                (tree / folder).rename(tree / "imgbuild")
            return tree

        versions = {"after": archive(args.after, "after") if args.after else ROOT}
        if args.before:
            versions = {"before": archive(args.before, "before"), **versions}
        # Bytecode cached, as an installed imgbuild has it, and kept out of the checkout.
        env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
        env["PYTHONPYCACHEPREFIX"] = str(tmp / "pycache")
        blocks = {v: steps_in_child(root, args.rounds, code) for v, code in versions.items()}
        check_args = ("check-model", str(root), "--target", TARGET, "--json")
        fixed = tmp / "fixed"

        def fix_args() -> tuple[str, ...]:
            subprocess.run(["rm", "-rf", str(fixed)], check=True)  # each run writes it anew
            return (*check_args, "--fix", str(fixed / "config.json"))

        outputs: dict[str, dict[str, str]] = {}
        for code in versions.values():  # warm-up: bytecode written
            cli(runner, code, env, *check_args)
        wall: dict[str, dict[str, list[float]]] = {v: {"cli": [], "cli --fix": []}
                                                   for v in versions}
        cpu: dict[str, dict[str, list[float]]] = {v: {"cli": [], "cli --fix": []}
                                                  for v in versions}
        for _ in range(args.rounds):  # alternating, so both see the same machine
            for v, code in versions.items():
                for step, argl in (("cli", check_args), ("cli --fix", fix_args())):
                    took, used, out = cli(runner, code, env, *argl)
                    wall[v][step].append(took)
                    cpu[v][step].append(used)
                    outputs.setdefault(v, {})[step] = out
                outputs[v]["fixed config.json"] = (fixed / "config.json").read_text()
        profiles = {v: profile(runner, code, env, tmp / f"{v}.prof", *check_args)
                    for v, code in versions.items()} if args.profile else {}
    for v, b in blocks.items():
        b["median_s"] |= {k: round(statistics.median(x), 4) for k, x in wall[v].items()}
        b["median_cpu_s"] |= {k: round(statistics.median(x), 4) for k, x in cpu[v].items()}
        b["runs_s"] |= {k: [round(t, 4) for t in x] for k, x in wall[v].items()}
        doc = json.loads(outputs[v]["cli"])
        fdoc = json.loads(outputs[v]["cli --fix"])
        b["cli"] = {"findings": [f"{f['severity']}:{f['kind']}" for f in doc["findings"]],
                    "ignore": doc["ignore"], "fix_proof": (fdoc.get("fix") or {}).get("proof")}
        if v in profiles:
            b["profile"] = profiles[v]
    after = blocks["after"]
    doc = {"machine": machine(), "rounds": args.rounds, "code": args.after or "working tree",
           "load_avg": {"start": [round(x, 2) for x in load_start],
                        "end": [round(x, 2) for x in os.getloadavg()]},
           "shape": {"name": args.shape, "module_names": modules, "ignore_entries": entries,
                     "tensor_names": after.pop("tensor_names")},
           "cli_target": TARGET, **after}
    if args.before:
        before = blocks["before"]
        before.pop("tensor_names")
        doc["before"] = {"code": args.before, **before}
        doc["speedup"] = {k: round(before["median_s"][k] / after["median_s"][k], 2)
                          for k in after["median_s"]}
        # The same answer: the CLI's stdout (check and --fix) and the config it wrote.
        doc["same_output"] = {k: outputs["before"][k] == outputs["after"][k]
                              for k in outputs["after"]}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(doc, indent=2) + "\n")
    res = after["result"]
    print(f"load average {doc['load_avg']['start'][0]} -> {doc['load_avg']['end'][0]} "
          f"on {os.cpu_count()} cores")
    print(f"{modules:,} module names, {entries:,} ignore entries "
          f"({res['offending_entries']:,} hide {res['hidden_modules']:,} quantized modules "
          f"under SGLang 0.5.16's substring matcher), median of {args.rounds}")
    print(f"{'step':<13}" + "".join(f"{v + ' s':>12}{'cpu s':>8}" for v in blocks)
          + ("   speedup" if args.before else ""))
    for k in after["median_s"]:
        print(f"{k:<13}" + "".join(f"{b['median_s'][k]:>12.3f}{b['median_cpu_s'][k]:>8.3f}"
                                   for b in blocks.values())
              + (f"{doc['speedup'][k]:>9.2f}x" if args.before else ""))
    if args.before:
        print(f"same output: {doc['same_output']}")
    proof = res["proof"]
    print(f"fix: {res['fix_replaced']:,} entries -> {res['fix_expressions']} re: expressions "
          f"({res['fix_expression_chars']} chars); proof equal={proof['equal']} "
          f"(hidden {proof['hidden_before']:,} -> {proof['hidden_after']})")
    for v, prof in profiles.items():
        print(f"profile ({v}, {prof['total_s']} s under cProfile):")
        for row in prof["cumulative"][:12]:
            print(f"  {row['cum_s']:>7.3f} {row['function']}")
    print(f"wrote {args.out.relative_to(ROOT) if args.out.is_relative_to(ROOT) else args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
