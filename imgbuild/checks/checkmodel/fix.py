"""The fix for parent-module ignore entries: anchored `re:` expressions that ignore exactly the
modules the original entries name under exact matching (compressed-tensors' own semantics)
and no child, proven by recomputing the ignored set under every matcher."""

from __future__ import annotations

import copy
import json
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from ...errors import InputError, JobFailed
from ...fsutil import atomic_write_text, cannot_write, check_writable
from .checkpoint import quant_config
from .ignore import EXAMPLES, ignore_entries
from .names import MATCHERS, NameIndex, ignored_set


def _fill9(n: int, count: int) -> int:
    s = str(n)
    return int(s[:-count] + "9" * count) if count < len(s) else int("9" * count)


def _range_parts(lo: int, hi: int) -> list[tuple[int, int]]:
    """Split [lo, hi] into ranges each one regex of fixed width covers."""
    stops = {hi}
    nines = 1
    stop = _fill9(lo, nines)
    while lo <= stop < hi:
        stops.add(stop)
        nines += 1
        stop = _fill9(lo, nines)
    zeros = 1
    stop = (hi + 1) - (hi + 1) % 10 ** zeros - 1
    while lo < stop <= hi:
        stops.add(stop)
        zeros += 1
        stop = (hi + 1) - (hi + 1) % 10 ** zeros - 1
    out, start = [], lo
    for s in sorted(stops):
        out.append((start, s))
        start = s + 1
    return out


def _range_pattern(a: int, b: int) -> str:
    sa, sb = str(a), str(b)
    out = []
    for x, y in zip(sa, sb):
        if x == y:
            out.append(x)
        elif x == "0" and y == "9":
            out.append("[0-9]")
        else:
            out.append(f"[{x}-{y}]")
    return "".join(out)


def number_regex(values: Iterable[int | str]) -> str:
    """A regex that matches exactly the decimal forms (no leading zeros) of `values`."""
    nums = sorted({int(v) for v in values})
    alts: list[str] = []
    i = 0
    while i < len(nums):
        j = i
        while j + 1 < len(nums) and nums[j + 1] == nums[j] + 1:
            j += 1
        lo, hi = nums[i], nums[j]
        if lo == hi:
            alts.append(str(lo))
        elif hi == lo + 1:
            alts += [str(lo), str(hi)]
        else:
            alts += [_range_pattern(a, b) for a, b in _range_parts(lo, hi)]
        i = j + 1
    return alts[0] if len(alts) == 1 else "(?:" + "|".join(alts) + ")"


def _factor(tuples: list[tuple[str, ...]]) -> list[tuple[frozenset[str], ...]]:
    """Rows of per-position value sets whose cartesian products exactly cover `tuples`."""
    if not tuples:
        return []
    if len(tuples[0]) == 0:
        return [()]
    if len(tuples[0]) == 1:
        return [(frozenset(t[0] for t in tuples),)]
    lasts: dict[tuple[str, ...], set[str]] = {}
    for t in tuples:
        lasts.setdefault(t[:-1], set()).add(t[-1])
    groups: dict[frozenset[str], list[tuple[str, ...]]] = {}
    for pre, ls in lasts.items():
        groups.setdefault(frozenset(ls), []).append(pre)
    rows = []
    for ls, pres in groups.items():
        rows += [r + (ls,) for r in _factor(pres)]
    return rows


def collapse(entries: Iterable[str]) -> list[str]:
    """Anchored regexes (without the `re:`) that match exactly the given names: names alike
    but for their numeric components share one expression."""
    shapes: dict[tuple[str | None, ...], list[tuple[str, ...]]] = {}
    for e in dict.fromkeys(entries):
        parts = e.split(".")
        num = [p.isdigit() and p.isascii() and (p[0] != "0" or p == "0") for p in parts]
        key = tuple(None if d else p for p, d in zip(parts, num))
        shapes.setdefault(key, []).append(tuple(p for p, d in zip(parts, num) if d))
    out = []
    for key, tuples in shapes.items():
        for row in _factor(tuples):
            vals = iter(row)
            pieces = [number_regex(next(vals)) if k is None else re.escape(k) for k in key]
            out.append("^" + r"\.".join(pieces) + "$")
    return out


@dataclass(frozen=True)
class Proof:
    """The fixed ignore list against the original, recomputed over every module name."""

    modules: int  # names compared (modules and their parents)
    intended: int  # modules the original ignores under exact matching
    exact: int  # ... the fixed list ignores under exact matching
    suffix: int  # ... under dotted-suffix matching (SGLang >= 0.5.17)
    substring: int  # ... under substring matching (SGLang 0.5.7-0.5.16)
    hidden_before: int  # quantized modules the original hides under the engine's matcher
    hidden_after: int
    entries_matched: bool  # every replaced entry is matched by the new expressions
    equal: bool

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class FixResult:
    config: dict[str, Any] = field(hash=False, compare=False)
    replaced: tuple[str, ...] = ()
    added: tuple[str, ...] = ()  # the new `re:` entries
    proof: Proof | None = None
    unignored: tuple[str, ...] = ()  # non-quantized modules the engine no longer ignores
    packed_added: dict[str, tuple[str, ...]] = field(default_factory=dict, hash=False)
    ignore_added: tuple[str, ...] = ()  # fused layer names listed in `ignore`
    out: Path | None = None
    orig: Path | None = None
    orig_kept: bool = False  # an earlier .orig was there and was kept

    @property
    def changed(self) -> bool:
        return bool(self.replaced or self.packed_added or self.ignore_added)

    def to_dict(self) -> dict[str, Any]:
        return {"replaced": len(self.replaced), "replaced_examples": list(self.replaced[:EXAMPLES]),
                "added": list(self.added), "proof": self.proof.to_dict() if self.proof else None,
                "unignored": len(self.unignored),
                "unignored_examples": list(self.unignored[:EXAMPLES]),
                "packed_modules_mapping_added": {k: list(v) for k, v in self.packed_added.items()},
                "ignore_added": list(self.ignore_added),
                "out": str(self.out) if self.out else None,
                "orig": str(self.orig) if self.orig else None, "orig_kept": self.orig_kept}


def fix(config: Mapping[str, Any], module_names: Iterable[str] | NameIndex,
        matcher: str = "substring", *, quantized: Iterable[str] = (),
        packed: Mapping[str, Sequence[str]] | None = None,
        add_ignore: Sequence[str] = ()) -> FixResult:
    """A corrected copy of `config`: every plain ignore entry that `matcher` (and, as the most
    permissive, the substring matcher) applies to more names than the entry itself is replaced
    by anchored `re:` expressions that match exactly those entries. `packed` entries are added
    to quantization_config.packed_modules_mapping; `add_ignore` names (engine-side fused layer
    names, which name no module of the checkpoint) are appended to `ignore`. Raises JobFailed
    if the proof fails."""
    index = module_names if isinstance(module_names, NameIndex) else NameIndex(module_names)
    quantized = set(quantized)
    new = copy.deepcopy(dict(config))
    q, _ = quant_config(new)
    if q is None:
        raise InputError("config.json has no quantization_config: nothing to fix")
    entries = ignore_entries(new)
    matchers = tuple(dict.fromkeys((matcher, "substring")))
    offending: list[str] = []
    for e in entries:
        if not isinstance(e, str) or e.startswith("re:"):
            continue
        # Every matcher matches the entry's own module and lists no name twice, so it matches
        # more than the entry exactly when it matches more names: counts, not sets, compared.
        exact = len(index.exact(e))
        if any(len(index.matches(e, m)) != exact for m in matchers):
            offending.append(e)
    off = set(offending)
    exprs = collapse(offending)
    added = tuple("re:" + x for x in exprs)
    new_entries: list[Any] = []
    placed = False
    for e in entries:
        if isinstance(e, str) and e in off:
            if not placed:
                new_entries += added
                placed = True
            continue
        new_entries.append(e)
    extra = [n for n in add_ignore if n not in index.set and n not in entries]
    if any(set(index.matches(n, m)) for n in extra for m in matchers):
        raise InputError("a fused layer name to add to `ignore` would match checkpoint modules",
                         facts=[f"{n}: {index.matches(n, 'substring')[:3]}" for n in extra
                                if index.matches(n, "substring")][:3])
    new_entries += extra
    if offending or extra:
        q["ignore"] = new_entries
    packed_added: dict[str, tuple[str, ...]] = {}
    if packed:
        pm = q.get("packed_modules_mapping")
        pm = dict(pm) if isinstance(pm, dict) else {}
        for k, v in packed.items():
            if k not in pm:
                pm[k] = list(v)
                packed_added[k] = tuple(v)
        if packed_added:
            q["packed_modules_mapping"] = pm
    # The proof: recompute what each list ignores over every module name.
    intended = ignored_set(entries, index, "exact")
    after = {m: ignored_set(new_entries, index, m) for m in MATCHERS}
    # Every replaced entry is matched by a new expression. An entry that names a module is
    # among what the index found each expression to match (for `after`, above): one lookup,
    # not one try per expression; an entry that names none is tried against each.
    found = set().union(*(index.regex(x) for x in exprs))
    rxs = [re.compile(x) for x in exprs]
    entries_matched = all(e in found or any(r.match(e) for r in rxs) for e in off)
    before_engine = ignored_set(entries, index, matcher)
    hidden_before = len((before_engine - intended) & quantized)
    hidden_after = len((after[matcher] - intended) & quantized)
    equal = all(after[m] == intended for m in MATCHERS) and entries_matched
    proof = Proof(len(index), len(intended), len(after["exact"]), len(after["suffix"]),
                  len(after["substring"]), hidden_before, hidden_after, entries_matched, equal)
    if not equal:
        diff = {m: sorted(after[m] ^ intended)[:3] for m in MATCHERS if after[m] != intended}
        raise JobFailed("the rewritten ignore list would not ignore the same modules",
                        facts=[f"{m}: differs on {d}" for m, d in diff.items()]
                        + ([] if entries_matched else ["some replaced entry is not matched"]),
                        hint="report this as a bug; the original config.json was not changed")
    unignored = tuple(sorted(((before_engine - after[matcher]) & index.leaves) - quantized))
    return FixResult(new, tuple(offending), added, proof, unignored, packed_added,
                     ignore_added=tuple(extra))




def write_fix(result: FixResult, out: str | Path, original_text: str) -> FixResult:
    """Write the fixed config.json to OUT (a directory, or a .json file path) and keep the
    original beside it as config.json.orig (an existing .orig is kept: it is the first one).
    Both writes are atomic; the written file is read back and compared."""
    out = Path(out).expanduser()
    if out.exists() and not out.is_dir() and out.suffix != ".json":
        raise InputError(f"--fix {out}: an existing file that is not a .json",
                         hint="pass a directory (config.json is written in it) or a .json path")
    target = out if out.suffix == ".json" and not out.is_dir() else out / "config.json"
    orig = target.with_name(target.name + ".orig")
    kept = orig.exists()
    try:
        check_writable(target.parent, "the fixed config.json to")
        if not kept:
            atomic_write_text(orig, original_text)
        text = json.dumps(result.config, indent=2, ensure_ascii=False) + "\n"
        atomic_write_text(target, text)
    except OSError as e:
        raise cannot_write(target, e, "the fixed config") from None
    if json.loads(target.read_text()) != result.config:
        raise JobFailed(f"{target}: what was written does not read back the same",
                        hint="check the disk, then run the command again")
    return replace(result, out=target, orig=orig, orig_kept=kept)

