"""check-model: will the target's locked engine load this checkpoint as it was quantized?

A checkpoint's config.json says how it was quantized (compressed-tensors): formats, config
groups and an `ignore` list. An engine reads it its own way, and some ways lose:

- a format (top level or of a group) the locked compressed-tensors does not define;
- a top-level `mixed-precision` format behind an engine gate that looks only at the top level
  (SGLang < 0.5.17: `No compressed-tensors compatible scheme was found`);
- `ignore` entries that are parent modules of quantized layers, which a substring matcher
  (SGLang 0.5.7-0.5.16) applies to every child: quantized layers are silently loaded as bf16;
- fused projections (qkv_proj, gate_up_proj, in_proj_qkvz, in_proj_ba) whose shards the engine
  cannot map back to the checkpoint's names without a packed_modules_mapping;
- W4A4 NVFP4 on a target whose archs have no FP4 tensor cores.

How each engine version behaves is data (images/checks/engines.yaml, read by
catalog/engines.py, with wheel file:line evidence); a target's `patches:` ids switch behaviours
to their fixed values (behaviour.py).

Module names come from the checkpoint's safetensors index (or the safetensors headers): a
module is *quantized* when it has a `weight_packed` or `weight_scale` tensor. Matching an
ignore list against them is indexed (the names sorted, and sorted by their reversed text: an
entry costs a few bisections and what it matches), so 10,000 entries against 30,000 modules
take a fraction of a second.

`fix` rewrites the offending entries as anchored `re:` expressions that ignore exactly the same
modules as the original entries do under exact matching (compressed-tensors' own semantics)
and no child, and proves it by recomputing the ignored set under every matcher.

The parts: behaviour.py (the engine table applied to a version and its patches), checkpoint.py
(config.json and module names), names.py (indexed matching), ignore.py (which entries hide
quantized modules), fix.py (the rewrite and its proof), findings.py (each finding as facts and
a way out), report.py (the command: one checkpoint, one target).
"""

from .behaviour import Behaviour, Fact, behaviour, target_behaviour
from .checkpoint import Checkpoint, load_checkpoint, quant_config, safetensors_keys
from .findings import SEVERITIES, Analysis, Finding, analyze, check
from .fix import FixResult, Proof, collapse, fix, number_regex, write_fix
from .ignore import Hiding, IgnoreAnalysis, analyze_ignore, ignore_entries
from .names import MATCHERS, NameIndex, ignored_set, names_ignored
from .report import Report, check_model, resolve_checkpoint

__all__ = [
    "MATCHERS", "SEVERITIES", "Analysis", "Behaviour", "Checkpoint", "Fact", "Finding",
    "FixResult", "Hiding", "IgnoreAnalysis", "NameIndex", "Proof", "Report", "analyze",
    "analyze_ignore", "behaviour", "check", "check_model", "collapse", "fix", "ignore_entries",
    "ignored_set", "load_checkpoint", "names_ignored", "number_regex", "quant_config",
    "resolve_checkpoint", "safetensors_keys", "target_behaviour", "write_fix",
]
