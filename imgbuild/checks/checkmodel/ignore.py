"""The ignore analysis: which `ignore` entries hide quantized modules under an engine's matcher."""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from .checkpoint import quant_config
from .names import NameIndex

EXAMPLES = 5  # entries and modules a finding shows by name


@dataclass(frozen=True)
class Hiding:
    """One ignore entry that, under the engine's matcher, ignores quantized modules it does
    not name."""

    entry: str
    kind: str  # "parent": the entry is their parent module; else the matcher ("substring")
    hidden: tuple[str, ...]


@dataclass(frozen=True)
class IgnoreAnalysis:
    matcher: str
    entries: int
    hiding: tuple[Hiding, ...]
    hidden: frozenset[str]  # distinct quantized modules hidden
    moe_layers: tuple[str, ...]  # X.experts whose expert 0 is hidden (SGLang: whole layer)
    names_known: bool = True
    suspects: tuple[str, ...] = ()  # config only: entries that look like parent modules

    def to_dict(self) -> dict[str, Any]:
        return {"matcher": self.matcher, "entries": self.entries,
                "offending_entries": len(self.hiding), "hidden_modules": len(self.hidden),
                "moe_layers": len(self.moe_layers), "names_known": self.names_known,
                "examples": [{"entry": h.entry, "kind": h.kind, "hides": len(h.hidden),
                              "first": list(h.hidden[:3])} for h in self.hiding[:EXAMPLES]],
                "suspects": list(self.suspects[:EXAMPLES])}


_EXPERT0 = re.compile(r"^(.*\.experts)\.0\.[^.]+$")
_EXPERT = re.compile(r"(?:^|\.)experts\.[0-9]+$")
_CONTAINERS = {"mlp", "self_attn", "attn", "experts", "shared_experts", "shared_expert",
               "block_sparse_moe", "linear_attn", "layers", "model", "language_model",
               "visual", "vision_tower", "mixer", "feed_forward"}


def ignore_entries(config: Mapping[str, Any]) -> list[Any]:
    q, _ = quant_config(config)
    ig = (q or {}).get("ignore") or []
    return list(ig) if isinstance(ig, list) else []


def analyze_ignore(entries: Sequence[Any], index: NameIndex, quantized: Iterable[str],
                   matcher: str) -> IgnoreAnalysis:
    """Which entries hide quantized modules under `matcher`, and how many each hides."""
    quantized = quantized if isinstance(quantized, (set, frozenset)) else set(quantized)
    n = sum(isinstance(e, str) for e in entries)
    if not len(index):
        # No module names: only the shape of the entries can be judged.
        plain = [e for e in entries if isinstance(e, str) and not e.startswith("re:")]
        pset = set(plain)
        suspects = tuple(e for e in plain if e.rsplit(".", 1)[-1].isdigit()
                         or e.rsplit(".", 1)[-1] in _CONTAINERS
                         or any(o.startswith(e + ".") for o in pset if o != e)) \
            if matcher == "substring" and len(plain) < 50_000 else ()
        return IgnoreAnalysis(matcher, n, (), frozenset(), (), False, suspects)
    hiding: list[Hiding] = []
    hidden: set[str] = set()
    if matcher != "exact":
        for e in entries:
            if not isinstance(e, str) or e.startswith("re:"):
                continue  # re: entries are matched alike by every engine
            hid = tuple(m for m in index.matches(e, matcher) if m != e and m in quantized)
            if hid:
                kind = "parent" if hid[0].startswith(e + ".") else matcher
                hiding.append(Hiding(e, kind, hid))
                hidden.update(hid)
    moe = sorted({m.group(1) for h in hidden if (m := _EXPERT0.match(h))})
    return IgnoreAnalysis(matcher, n, tuple(hiding), frozenset(hidden), tuple(moe))

