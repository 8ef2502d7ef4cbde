"""Write imgbuild/payload/scheme-probes.json: the checkpoints the smoke stage "engine-schemes"
asks an image's engine about, beside the image's own smoke model.

    .venv/bin/python -m tests.scheme_probes --write     # after a change to the generator

An engine chooses a layer's quantization scheme from the checkpoint's quantization config and
the layer's name only, so a probe is a checkpoint's config.json quantization_config and its
tensor names (no weights). All three come from checkpoints really made by llmcompressor and
compressed-tensors here (imgbuild/payload/smokegen.py's recipes):

- `mixed-precision`: the two-group smoke checkpoint (FP8 W8A8 on self_attn, NVFP4 W4A4 on mlp;
  top-level format `mixed-precision`): SGLang 0.5.7-0.5.16 without the patch find no scheme.
- `ignore-parent`: the NVFP4 smoke checkpoint with a parent module (`model.layers.0.mlp`) in
  its ignore list, as llmcompressor writes it for containers, its children stored quantized:
  SGLang 0.5.7-0.5.16 without the patch build those children unquantized.
- `moe`: a two-layer Qwen3-MoE (4 experts) in NVFP4 W4A4, router left unquantized: the fused
  MoE path.
"""

from __future__ import annotations

import argparse
import json
import struct
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "imgbuild" / "payload" / "scheme-probes.json"


def _names(model: Path) -> list[str]:
    names: list[str] = []
    for f in sorted(model.glob("*.safetensors")):
        with open(f, "rb") as fh:
            n = struct.unpack("<Q", fh.read(8))[0]
            names += [k for k in json.loads(fh.read(n)) if k != "__metadata__"]
    return sorted(names)


def _probe(model: Path, note: str) -> dict:
    qcfg = json.loads((model / "config.json").read_text())["quantization_config"]
    return {"note": note, "quantization_config": qcfg, "tensors": _names(model)}


def _moe(out: Path) -> Path:
    import torch
    from transformers import AutoModelForCausalLM, Qwen3MoeConfig, Qwen3MoeForCausalLM

    from imgbuild.payload import smokegen as g

    spec = g.SmokeModelSpec(name="scheme-probe-moe", scheme="NVFP4")
    tok = g._train_tokenizer(spec)
    cfg = Qwen3MoeConfig(vocab_size=len(tok), hidden_size=128, intermediate_size=256,
                         moe_intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                         num_key_value_heads=2, head_dim=32, num_experts=4, num_experts_per_tok=2,
                         decoder_sparse_step=1, max_position_embeddings=256,
                         tie_word_embeddings=False)
    torch.manual_seed(spec.seed)
    base = out / "base"
    Qwen3MoeForCausalLM(cfg).to(torch.bfloat16).save_pretrained(base)
    g._save_tokenizer(tok, base)
    model = AutoModelForCausalLM.from_pretrained(base, dtype=torch.bfloat16)
    g._quantize(spec, model, tok)
    model.save_pretrained(out / "moe", save_compressed=True)
    return out / "moe"


def build() -> dict:
    from imgbuild import smokemodel

    with tempfile.TemporaryDirectory(prefix="scheme-probes-") as d:
        tmp = Path(d)
        mixed = smokemodel.ensure(smokemodel.SmokeModelSpec(name="scheme-probe-mixed",
                                                            scheme="FP8-ATTN+NVFP4-MLP"),
                                  cache_dir=tmp / "cache")
        nvfp4 = smokemodel.ensure(smokemodel.SmokeModelSpec(name="scheme-probe-nvfp4",
                                                            scheme="NVFP4"),
                                  cache_dir=tmp / "cache")
        parent = _probe(nvfp4, "the NVFP4 smoke checkpoint; model.layers.0.mlp (a parent of "
                               "three quantized layers) added to ignore")
        parent["quantization_config"]["ignore"] = sorted(
            set(parent["quantization_config"]["ignore"]) | {"model.layers.0.mlp"})
        return {
            "format": 1,
            "probes": {
                "mixed-precision": _probe(mixed, "two config groups: FP8 W8A8 on self_attn, "
                                                 "NVFP4 W4A4 on mlp"),
                "ignore-parent": parent,
                "moe": _probe(_moe(tmp), "Qwen3-MoE, 4 experts, NVFP4 W4A4, router unquantized"),
            },
        }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--write", action="store_true")
    doc = build()
    text = json.dumps(doc, indent=1, sort_keys=True) + "\n"
    if ap.parse_args().write:
        OUT.write_text(text)
        print(f"wrote {OUT.relative_to(ROOT)}", file=sys.stderr)
    else:
        sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
