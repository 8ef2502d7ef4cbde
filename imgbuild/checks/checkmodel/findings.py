"""check-model's findings: each way an engine mishandles a checkpoint, as the chain of facts
that leads there and the way out."""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace
from typing import Any

from ...catalog.catalog import Catalog
from ...catalog.engines import EngineTable
from ...catalog.families import SymbolFamily
from ...catalog.targets import Target
from ...errors import InputError
from .. import drift
from .behaviour import Behaviour, Fact, behaviour, target_behaviour
from .checkpoint import Checkpoint, malformed, quant_config
from .fix import FixResult
from .ignore import _EXPERT, EXAMPLES, IgnoreAnalysis, analyze_ignore, ignore_entries
from .names import NameIndex, ignored_set, names_ignored

SEVERITIES = ("error", "warning", "info")


@dataclass(frozen=True)
class Finding:
    kind: str  # format | mixed-precision-gate | ignore-parent | fused-projection | w4a4-arch | ...
    severity: str  # error | warning | info
    message: str  # the headline
    facts: tuple[str, ...] = ()  # the chain that leads there
    hint: str = ""  # the way out
    counts: dict[str, int] = field(default_factory=dict, hash=False, compare=False)
    examples: tuple[str, ...] = ()

    def lines(self) -> list[str]:
        out = [f"{self.severity}: {self.message}"]
        for i, f in enumerate(self.facts):
            out.append(("  ╰─▶ " if i == len(self.facts) - 1 else "  ├─▶ ") + f)
        if self.hint:
            out.append(f"  help: {self.hint}")
        return out

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["facts"], d["examples"] = list(self.facts), list(self.examples)
        return d


def engine_label(b: Behaviour) -> str:
    return f"{b.engine} {b.version}" + (f" (patches: {', '.join(b.patches)})" if b.patches else "")


def _evidence(f: Fact | None, n: int = 1) -> list[str]:
    if f is None or f.rule is None:
        return []
    return [f"in the wheel: {e}" for e in f.rule.evidence[:n]]


def _way_out(f: Fact | None, target: Target | None, what: str) -> str:
    """`WHAT; or serve it with engine >= X; or add patch P to images/<target>.yaml`."""
    yaml = f"images/{target.name}.yaml" if target else "the target's yaml"
    opts = [what] if what else []
    if f is not None and f.fixed_in:
        opts.append(f"serve it with {target.engine if target else 'the engine'} >= {f.fixed_in}")
    if f is not None and f.fix_patch and f.patched_by is None:
        opts.append(f"add `{f.fix_patch}` to `patches:` in {yaml}")
    return "; or ".join(opts)


def _formats_findings(config: Mapping[str, Any], where: str, *, lock, ct_formats,
                      ct_version, index_urls, families: Sequence[SymbolFamily]) -> list[Finding]:
    q, keys = quant_config(config)
    pairs = drift.checkpoint_formats({"quantization_config": q}, where)
    if keys and keys[0] != "quantization_config":
        pairs = [(w.replace("quantization_config", ".".join(keys)), f) for w, f in pairs]
    if not pairs:
        return []
    out = []
    if ct_formats is not None:
        missing = [(w, f, None, ()) for w, f in pairs if f not in set(ct_formats)]
    elif lock is not None:
        fams = [f for f in families if f.model_quant_method == "compressed-tensors"]
        if not fams or lock.package(fams[0].provider) is None:
            return [Finding("format", "info", "the lock has no compressed-tensors: formats not "
                            "checked", (f"lock: {lock.path}",))]
        ct_version = lock.package(fams[0].provider).version
        dfs = drift.check(lock, [replace(fams[0], consumers=())], model_formats=pairs,
                          index_urls=index_urls)
        missing = [(f.file, f.symbol, f.first_version, f.required_by) for f in dfs]
    else:
        return [Finding("format", "info", "no lock for the target: formats not checked",
                        hint="run `imgbuild lock TARGET` first")]
    grouped: dict[str, list[tuple[str, str | None, tuple[str, ...]]]] = {}
    for w, fmt, first, req in missing:
        grouped.setdefault(fmt, []).append((w, first, tuple(req)))
    for fmt, places in grouped.items():
        first, req = places[0][1], places[0][2]
        wheres = [w for w, _, _ in places]
        facts = [f"config.json declares '{fmt}' in "
                 + ", ".join(w.rsplit(": ", 1)[-1] for w in wheres),
                 f"the lock pins compressed-tensors {ct_version}"
                 + (f" (required by {'; '.join(req)})" if req else ""),
                 (f"compressed-tensors has CompressionFormat('{fmt}') from {first} on"
                  if first else f"compressed-tensors {ct_version}'s CompressionFormat has no "
                  f"value '{fmt}'"),
                 f"so the engine cannot load this checkpoint: ValueError: '{fmt}' is not a "
                 f"valid CompressionFormat"]
        hint = (f"add an override 'compressed-tensors>={first}' (with a reason) to the target's "
                f"yaml and run `imgbuild lock`" if first else
                "lock a newer compressed-tensors (an override in the target's yaml)")
        out.append(Finding("format", "error", f"the checkpoint declares format '{fmt}', which "
                           f"compressed-tensors {ct_version} lacks", tuple(facts), hint,
                           {"places": len(wheres)}, tuple(wheres)))
    return out


def _gate_finding(q: Mapping[str, Any], beh: Behaviour, target: Target | None) -> list[Finding]:
    top = q.get("format")
    groups = q.get("config_groups") or {}
    if top != "mixed-precision" or not isinstance(groups, dict):
        return []
    f = beh.facts.get("activation_gate")
    desc = [f"{g}: {gc.get('format')}" for g, gc in groups.items() if isinstance(gc, dict)]
    if f is None or f.value is None:
        if beh.engine not in ("sglang", "vllm"):
            return []
        return [Finding("mixed-precision-gate", "warning",
                        f"{engine_label(beh)}: how it gates activation schemes is not recorded",
                        (f"top-level format 'mixed-precision' ({'; '.join(desc)})",),
                        "check the engine's compressed_tensors.py and record it in "
                        "images/checks/engines.yaml")]
    if f.value != "top-level":
        return []
    facts = [f"config.json: quantization_config.format is 'mixed-precision' "
             f"({len(desc)} config groups: {'; '.join(desc)})",
             f"{engine_label(beh)} decides whether a layer's activations are quantized from the "
             f"top-level format only, and 'mixed-precision' is not an activation format",
             *_evidence(f, 2),
             "so no layer of any group gets a scheme; model load fails with: "
             "NotImplementedError: No compressed-tensors compatible scheme was found."]
    return [Finding("mixed-precision-gate", "error",
                    f"{beh.engine} {beh.version} refuses a mixed-precision checkpoint "
                    f"(it reads only the top-level format)", tuple(facts),
                    _way_out(f, target, ""), {"groups": len(desc)}, tuple(desc))]


def _ignore_findings(ana: IgnoreAnalysis, beh: Behaviour, target: Target | None,
                     fixed: FixResult | None) -> list[Finding]:
    f = beh.facts.get("ignore_matcher")
    if not ana.names_known:
        if ana.suspects:
            return [Finding("ignore-parent", "warning",
                            f"{len(ana.suspects)} ignore entries look like parent modules; "
                            f"{engine_label(beh)} matches them by substring",
                            ("no module names: the checkpoint has no safetensors index or "
                             "files beside config.json, so hidden layers cannot be counted",
                             *_evidence(f)),
                            "run check-model on the checkpoint directory (or with its "
                            "model.safetensors.index.json beside config.json)",
                            {"entries": len(ana.suspects)}, ana.suspects[:EXAMPLES])]
        return []
    if not ana.hiding:
        return []
    top = sorted(ana.hiding, key=lambda h: -len(h.hidden))[:EXAMPLES]
    examples = tuple(f"{h.entry} ({h.kind}) hides {len(h.hidden)}: "
                     + ", ".join(h.hidden[:3]) + (" ..." if len(h.hidden) > 3 else "")
                     for h in top)
    parents = sum(h.kind == "parent" for h in ana.hiding)
    how = {"substring": "by substring (case-insensitive): an entry also ignores every name "
                        "containing it",
           "suffix": "by dotted suffix: an entry also ignores every name ending in '.' + entry"
           }.get(ana.matcher, ana.matcher)
    facts = [f"{len(ana.hiding)} of {ana.entries} ignore entries name modules that contain "
             f"quantized layers ({parents} parent modules)"
             if parents else f"{len(ana.hiding)} of {ana.entries} ignore entries match quantized "
             f"layers they do not name",
             f"{engine_label(beh)} matches the ignore list {how}",
             *_evidence(f, 2),
             f"so {len(ana.hidden)} quantized modules would be loaded as unquantized: bf16 "
             f"allocation (out of memory) or a missing-tensor error such as "
             f"KeyError: '...w2_input_global_scale'"]
    if ana.moe_layers:
        facts.insert(-1, f"{len(ana.moe_layers)} fused-MoE layers lose expert 0, from which "
                         f"{beh.engine} takes the scheme of all experts of the layer "
                         f"(e.g. {ana.moe_layers[0]})")
    fix_way = ("`--fix OUT` rewrites these entries as anchored `re:` expressions that ignore "
               "exactly the same modules and no child")
    if fixed is not None and fixed.out is not None:
        fix_way = f"the corrected config.json is at {fixed.out} (the original beside it)"
    known = f is not None and f.value is not None
    if not known:
        facts[1] = (f"how {engine_label(beh)} matches the ignore list is not recorded "
                    f"(images/checks/engines.yaml); judged as {how}")
    return [Finding("ignore-parent", "error" if known else "warning",
                    f"{len(ana.hiding)} ignore entries silently de-quantize "
                    f"{len(ana.hidden)} quantized modules under {beh.engine} {beh.version}"
                    + ("" if known else " (if it matches by substring)"),
                    tuple(facts), _way_out(f, target, fix_way),
                    {"entries": len(ana.hiding), "ignore_entries": ana.entries,
                     "parent_entries": parents, "hidden_modules": len(ana.hidden),
                     "moe_layers": len(ana.moe_layers)}, examples)]


def _targets(q: Mapping[str, Any]) -> list[str]:
    out: list[str] = []
    for gc in (q.get("config_groups") or {}).values():
        if isinstance(gc, dict):
            out += [t for t in gc.get("targets") or [] if isinstance(t, str)]
    return out


# The engines' classes for fused layers: what a class-name target is compared with.
_FUSED_CLASS = {"qkv_proj": "QKVParallelLinear"}
_DEFAULT_FUSED_CLASS = "MergedColumnParallelLinear"


def _target_matches(name: str, targets: Sequence[str], fused: str | None = None) -> bool:
    """The engines' find_matched_target: the layer name (equal, or re: with re.match), then
    the module's class name, which a plain target matches by substring ('Linear' matches
    QKVParallelLinear: compressed_tensors/utils.py:124-127 in SGLang 0.5.16)."""
    cls = _FUSED_CLASS.get(fused or "", _DEFAULT_FUSED_CLASS).lower()
    for t in targets:
        if t.startswith("re:"):
            try:
                if re.match(t[3:], name):
                    return True
            except re.error:
                continue
        elif t == name or (fused is not None and "." not in t and t.lower() in cls):
            return True
    return False


@dataclass
class _Ctx:
    index: NameIndex
    quantized: frozenset[str]
    entries: list[Any]
    _sets: dict[str, set[str]] = field(default_factory=dict)

    def ignored(self, matcher: str) -> set[str]:
        if matcher not in self._sets:
            self._sets[matcher] = ignored_set(self.entries, self.index, matcher)
        return self._sets[matcher]


def _fused_findings(ckpt: Checkpoint, ctx: _Ctx, q: Mapping[str, Any], beh: Behaviour,
                    table: EngineTable, target: Target | None) -> tuple[list[Finding], dict]:
    """Fused projections the engine builds from split checkpoint shards, judged by what the
    engine's matcher and mapping make of the fused layer name."""
    if not beh.fuses_projections or not ctx.index.names:
        return [], {}
    matcher = beh.value("ignore_matcher") or "substring"
    source = beh.value("packed_modules_mapping")
    pf = beh.facts.get("packed_modules_mapping")
    cfg_map = q.get("packed_modules_mapping") if isinstance(q.get("packed_modules_mapping"),
                                                             dict) else {}
    cls_map, cls_where = beh.model_mapping(ckpt.architecture)
    known = True
    if source == "config":
        mapping = dict(cfg_map)
    elif source == "model":
        known = cls_map is not None
        mapping = dict(cls_map or {})
    elif source == "config+model":
        known = cls_map is not None or bool(cfg_map)
        mapping = {**(cls_map or {}), **cfg_map}
    else:
        return [], {}
    # (fused name, parent) for every complete set of split shards in the checkpoint
    layers: list[tuple[str, str, tuple[str, ...]]] = []
    for fused, shards in table.fused.items():
        for n in ctx.index.suffix(shards[0]):
            parent = n[: -len(shards[0]) - 1] if n != shards[0] else ""
            if not parent or f"{parent}.{fused}" in ctx.index.set:
                continue  # stored fused already: the engine's name is the checkpoint's
            if _EXPERT.search(parent):
                continue  # routed experts go into one FusedMoE layer, not a fused Linear
            if all(f"{parent}.{s}" in ctx.index.set for s in shards):
                layers.append((fused, parent, tuple(f"{parent}.{s}" for s in shards)))
    if not layers:
        return [], {}
    targets = _targets(q)
    extra = [f"{p}.{f}" for f, p, _ in layers]
    for f, p, _ in layers:
        extra += [f"{p}.{f}".replace(f, s) for s in mapping.get(f, ())]
    entry_set = {e for e in ctx.entries if isinstance(e, str)}
    direct = {m: names_ignored(extra, ctx.entries, m) | ctx.ignored(m)
              for m in {matcher, "exact"}}

    def engine_ignores(layer: str, fused: str, m: str, mp: Mapping[str, Sequence[str]]
                       ) -> bool | None:
        """The engine's should_ignore_layer: True/False, or None when the shards disagree
        (the engine raises)."""
        listed = layer in direct[m]
        if beh.fused_lookup == "direct-first" and listed:
            return True
        if fused in mp and (beh.fused_lookup == "direct-first" or layer not in entry_set):
            got = {layer.replace(fused, s) in direct[m] for s in mp[fused]}
            return got.pop() if len(got) == 1 else None
        return listed

    def targeted(layer: str, fused: str, mp: Mapping[str, Sequence[str]]) -> bool:
        return _target_matches(layer, targets, fused) or (fused in mp and all(
            _target_matches(layer.replace(fused, s), targets) for s in mp[fused]))

    def right(want: bool, layer: str, fused: str, m: str, mp) -> bool:
        eng = engine_ignores(layer, fused, m, mp)
        return eng is True if want else (eng is False and targeted(layer, fused, mp))

    problems: dict[tuple[str, str], list[str]] = {}
    needs: dict[str, tuple[str, ...]] = {}
    for fused, parent, shard_names in layers:
        layer = f"{parent}.{fused}"
        intended = [s in ctx.ignored("exact") for s in shard_names]
        quant = [s in ctx.quantized for s in shard_names]
        if all(intended) or not any(quant):
            want = True  # bf16 shards
        elif not any(intended) and all(quant):
            want = False
        else:
            continue  # shards with different schemes: no mapping helps, nor is one needed
        full = {**mapping, fused: table.fused[fused]}
        if right(want, layer, fused, matcher, mapping):
            # right, but perhaps only through substring matching of the shard names
            if matcher != "exact" and fused not in mapping and \
                    not right(want, layer, fused, "exact", mapping) and \
                    right(want, layer, fused, "exact", full):
                problems.setdefault(("accident", fused), []).append(layer)
                needs[fused] = table.fused[fused]
            continue
        if not right(want, layer, fused, matcher, full):
            continue  # a mapping would not help: the ignore list is at fault (ignore-parent)
        eng = engine_ignores(layer, fused, matcher, mapping)
        kind = ("mixed" if eng is None else "quantizes-bf16" if want else
                "dequantizes" if eng else "no-target")
        problems.setdefault((kind, fused), []).append(layer)
        needs[fused] = table.fused[fused]
    out: list[Finding] = []
    consequences = {
        "quantizes-bf16": ("the engine treats {layer} as quantized, but the checkpoint stores "
                           "its shards unquantized (ignored): model load fails looking for "
                           "weight_packed/weight_scale, or computes garbage"),
        "dequantizes": ("the engine ignores {layer}, but the checkpoint's shards are quantized: "
                        "the layer is allocated in bf16 and the quantized tensors do not load"),
        "no-target": ("no config-group target matches {layer}: model load fails with "
                      "ValueError: Unable to find matching target for {layer} in the "
                      "compressed-tensors config."),
        "mixed": ("the shards of {layer} are not all ignored or all quantized: the engine "
                  "raises ValueError: Found different quantization schemes"),
        "accident": ("{layer} is ignored only because its shard name is a substring of it; "
                     "with exact or suffix matching ({fix}) it would be quantized though its "
                     "shards are bf16"),
    }
    reads_config = source in ("config", "config+model")
    yaml = f"images/{target.name}.yaml" if target else "the target's yaml"
    add_ignore: list[str] = []
    im = beh.facts.get("ignore_matcher")
    for (kind, fused), lays in problems.items():
        shards = table.fused[fused]
        facts = [f"the checkpoint stores {fused} split as {', '.join(shards)} "
                 f"({len(lays)} layers, e.g. {lays[0].rsplit('.', 1)[0]})",
                 f"{engine_label(beh)} builds one fused layer {fused} and matches ignore "
                 f"entries and targets against that name"]
        if fused in mapping:
            facts.append(f"its packed_modules_mapping maps {fused} to {list(mapping[fused])}")
        elif source == "model":
            facts.append(f"it takes packed_modules_mapping from the model class only "
                         f"({ckpt.architecture or 'unknown architecture'}: "
                         f"{cls_where if cls_map is not None else cls_where}), which has no "
                         f"entry for {fused}; config.json's is overwritten"
                         if known else f"whether the model class maps {fused} is unknown: "
                         f"{cls_where}")
        else:
            facts.append(f"config.json's quantization_config has no packed_modules_mapping for "
                         f"{fused}, and {beh.engine} {beh.version} reads it from there only")
        facts.append(("" if known else "if it does not: ") + consequences[kind].format(
            layer=lays[0], fix=(f"{beh.engine} >= {im.fixed_in}" if im and im.fixed_in else
                                "a fixed engine")))
        sev = "warning" if kind == "accident" or not known else "error"
        head = {"quantizes-bf16": f"{beh.engine} would quantize {len(lays)} fused {fused} layers "
                                  f"whose shards are bf16",
                "dequantizes": f"{beh.engine} would de-quantize {len(lays)} fused {fused} layers",
                "no-target": f"{beh.engine} finds no quantization target for {len(lays)} fused "
                             f"{fused} layers",
                "mixed": f"{len(lays)} fused {fused} layers have shards with different schemes",
                "accident": f"{len(lays)} fused {fused} layers are ignored only by accident of "
                            f"substring matching"}[kind]
        ways = []
        if reads_config:
            ways.append(f"add packed_modules_mapping {{{fused}: {list(shards)}}} to "
                        f"quantization_config in config.json (`--fix OUT` writes it)")
        if kind in ("quantizes-bf16", "accident"):
            # The fused names, listed in `ignore`, match the engine's layer directly, and
            # name no module of the checkpoint (compressed-tensors ignores nothing more).
            add_ignore += lays
            ways.append(f"list the fused layers in `ignore` (`--fix OUT` adds the {len(lays)} "
                        f"{fused} names; they name no checkpoint module)")
        elif kind == "no-target":
            ways.append(f"make a config-group target match the fused name too, e.g. "
                        f"`re:.*\\.{fused}$` beside the group's targets for {', '.join(shards)}")
        if not reads_config and pf is not None and pf.fix_patch:
            ways.append(f"add `{pf.fix_patch}` to `patches:` in {yaml} and write the mapping "
                        f"into config.json")
        if not ways:
            ways.append("serve it with an engine whose model class maps the shards")
        out.append(Finding("fused-projection", sev, head, tuple(facts), "; or ".join(ways),
                           {"layers": len(lays)}, tuple(lays[:EXAMPLES])))
    fixes = {"packed": needs if reads_config else {}, "ignore": tuple(dict.fromkeys(add_ignore))}
    return out, fixes


def _w4a4_findings(ckpt: Checkpoint, q: Mapping[str, Any], beh: Behaviour, target: Target | None,
                   catalog: Catalog | None) -> list[Finding]:
    if target is None or catalog is None:
        return []
    gpu_archs = [a for a in target.archs if a != "cpu"]
    if not gpu_archs:
        return []
    w4a4 = set(ckpt.w4a4)
    groups = []
    for g, gc in (q.get("config_groups") or {}).items():
        if not isinstance(gc, dict):
            continue
        w, a = gc.get("weights") or {}, gc.get("input_activations") or {}
        if w.get("num_bits") == 4 and w.get("type") == "float" and \
                a.get("num_bits") == 4 and a.get("type") == "float":
            groups.append(g)
    if not groups and not w4a4:
        return []
    lacking = [a for a in gpu_archs if not (catalog.archs.get(a) and catalog.archs[a].w4a4_nvfp4)]
    if not lacking:
        return []
    fp4 = [a for a in gpu_archs if a not in lacking]
    fact = beh.facts.get("w4a4_without_fp4_arch")
    if fact is None or fact.value is None:
        return []
    moe = sorted(m for m in w4a4 if ".experts." in m)
    dense = sorted(w4a4 - set(moe))
    kinds = []
    if dense or (not w4a4):
        kinds.append(("linear", len(dense) if w4a4 else None))
    if moe:
        kinds.append(("moe", len(moe)))
    out = []
    for kind, count in kinds:
        v = beh.w4a4(kind)
        what = "dense layers" if kind == "linear" else "fused-MoE experts"
        n = f"{count} {what}" if count is not None else what
        facts = [f"config groups {', '.join(groups) or '?'} quantize weights and activations to "
                 f"NVFP4 (W4A4): {n}",
                 f"target {target.name} builds for {', '.join(gpu_archs)}; "
                 f"{', '.join(lacking)} has no FP4 tensor cores (images/gpus.yaml: "
                 f"w4a4_nvfp4: false)", *_evidence(fact, 1)]
        if v == "refuses":
            facts.append(f"{engine_label(beh)} refuses W4A4 {what} there: "
                         + ("NotImplementedError: Current platform does not support w4a4 nvfp4 "
                            "quantization." if kind == "linear" else
                            "its W4A4 MoE method requires sm100"))
            sev = "error" if not fp4 else "warning"
        else:
            facts.append(f"{engine_label(beh)} serves W4A4 {what} there another way (weight-only "
                         f"FP4 Marlin or emulation): activations are not quantized as calibrated")
            sev = "warning"
        if fp4:
            facts.append(f"on {', '.join(fp4)} they run natively")
        out.append(Finding("w4a4-arch", sev,
                           f"W4A4 NVFP4 {what} on {', '.join(lacking)}: {beh.engine} "
                           f"{beh.version} {'refuses them' if v == 'refuses' else 'falls back'}",
                           tuple(facts),
                           "serve it on sm100/sm120 (a Blackwell target such as "
                           "sglang-blackwell), or use a W4A16 checkpoint (NVFP4A16)",
                           {"modules": count or 0}, tuple((dense or moe)[:EXAMPLES])))
    return out


@dataclass(frozen=True)
class Analysis:
    """Everything check-model worked out: the findings, and what `--fix` builds on."""

    findings: tuple[Finding, ...]
    behaviour: Behaviour
    index: NameIndex
    ignore: IgnoreAnalysis | None = None  # None: nothing quantized by compressed-tensors
    packed: dict[str, tuple[str, ...]] = field(default_factory=dict, hash=False)
    add_ignore: tuple[str, ...] = ()  # fused layer names the fix lists in `ignore`


def analyze(checkpoint: Checkpoint, *, target: Target | None, engines: EngineTable,
            families: Sequence[SymbolFamily] = (), catalog: Catalog | None = None, lock=None,
            ct_formats: Iterable[str] | None = None, ct_version: str | None = None,
            index_urls: Sequence[str] = (), index: NameIndex | None = None) -> Analysis:
    """A checkpoint on a target's engine (version and patches from the target).

    lock: the target's Lockfile, for the compressed-tensors version the formats are checked
    against (read from the locked wheel with the drift `families`, see checks/drift.py); or
    pass `ct_formats` (the CompressionFormat values) and `ct_version` directly."""
    table = engines
    config = checkpoint.config
    beh = target_behaviour(target, table) if target is not None else \
        behaviour("transformers", "5.0", table=table)
    index = index or NameIndex(checkpoint.module_names)
    q, keys = quant_config(config)
    if q is None:
        return Analysis((Finding("not-quantized", "info", "config.json has no "
                                 "quantization_config: nothing to check",
                                 (f"{checkpoint.source}",)),), beh, index)
    if q.get("quant_method") not in (None, "compressed-tensors"):
        return Analysis((Finding("not-compressed-tensors", "info",
                                 f"quant_method is {q.get('quant_method')!r}, not "
                                 f"compressed-tensors: nothing check-model knows to check"),),
                        beh, index)
    if problems := malformed(q, keys):
        # Judged as it stands, a malformed config would pass: an engine fails on it instead.
        raise InputError(f"{checkpoint.source}: the quantization config is malformed",
                         facts=problems, hint="fix config.json (compressed-tensors writes these "
                         "keys when it saves a checkpoint: re-save it, or correct the keys named)")
    findings: list[Finding] = []
    where = f"{checkpoint.source}/config.json" if checkpoint.config_path is None or \
        checkpoint.config_path.name != "config.json" else str(checkpoint.config_path)
    findings += _formats_findings(config, where, lock=lock, ct_formats=ct_formats,
                                  ct_version=ct_version, index_urls=index_urls,
                                  families=families)
    findings += _gate_finding(q, beh, target)
    entries = ignore_entries(config)
    matcher = beh.value("ignore_matcher")
    if matcher is None and beh.engine in table.engines:
        findings.append(Finding("ignore-parent", "warning",
                                f"{engine_label(beh)}: how it matches the ignore list is not "
                                f"recorded; judged as substring matching (the worst case)",
                                hint="record it in images/checks/engines.yaml"))
    ana = analyze_ignore(entries, index, checkpoint.quantized, matcher or "substring")
    findings += _ignore_findings(ana, beh, target, None)
    ctx = _Ctx(index, checkpoint.quantized, entries)
    fused, fused_fix = _fused_findings(checkpoint, ctx, q, beh, table, target)
    findings += fused
    findings += _w4a4_findings(checkpoint, q, beh, target, catalog)
    order = {s: i for i, s in enumerate(SEVERITIES)}
    return Analysis(tuple(sorted(findings, key=lambda f: order.get(f.severity, 9))), beh, index,
                    ana, dict(fused_fix.get("packed") or {}), tuple(fused_fix.get("ignore") or ()))


def check(checkpoint: Checkpoint, **kw: Any) -> list[Finding]:
    """The findings of analyze(): most severe first."""
    return list(analyze(checkpoint, **kw).findings)
