"""Module names indexed for the engines' ignore matchers (substring, dotted suffix, exact) and
`re:` entries: an entry costs a few bisections of sorted lists and the names it matches, never
a pass over all names (10,000 entries against 30,000 modules: bench/checkmodel_bench.py).

- exact: a set.
- dotted suffix: the names sorted by their reversed text; those ending in '.' + entry are one
  run of it.
- substring (case-insensitive): every dotted parent of a name is a name too, so a name contains
  an entry `s.t` (`s` up to the entry's last dot) exactly where one of its parents P ends with
  `s` and the name goes on `P.t...`. The parents ending in `s` are one run of the lowercased
  names sorted by their reversed text, and the names starting with `P.t` one run of the sorted
  lowercased names. An entry without a dot lies inside one component: the names whose last
  component contains it, and all below them.
- `re:`: the names that start with the pattern's literal prefix (one run), tried one by one.
"""

from __future__ import annotations

import bisect
import re
from collections.abc import Iterable
from itertools import chain
from typing import Any, NamedTuple

MATCHERS = ("substring", "suffix", "exact")


def _literal_prefix(pattern: str) -> str:
    """A string every name re.match(pattern) accepts starts with ('' when unsure)."""
    depth, i, esc, cls = 0, 0, False, False
    while i < len(pattern):  # a top-level alternation has no common prefix
        c = pattern[i]
        if esc:
            esc = False
        elif c == "\\":
            esc = True
        elif cls:
            cls = c != "]"
        elif c == "[":
            cls = True
        elif c == "(":
            depth += 1
        elif c == ")":
            depth -= 1
        elif c == "|" and depth == 0:
            return ""
        i += 1
    out: list[str] = []
    i = 1 if pattern.startswith("^") else 0
    while i < len(pattern):
        c = pattern[i]
        if c == "\\" and i + 1 < len(pattern) and not pattern[i + 1].isalnum():
            ch, j = pattern[i + 1], i + 2
        elif c.isalnum() or c in "_-/:,@ ":
            ch, j = c, i + 1
        else:
            break
        if j < len(pattern) and pattern[j] in "*?{+":
            break
        out.append(ch)
        i = j
    return "".join(out)


def _with_parents(names: Iterable[str]) -> set[str]:
    """The names and every dotted parent of them ('a.b.c' -> 'a.b', 'a'; a leading '.' is no
    parent). One pass per depth over the names added in the pass before."""
    out = set(names)
    new = out
    while new:
        new = {p for n in new if (p := n.rpartition(".")[0])} - out
        out |= new
    return out


def _run(names: list[str], prefix: str) -> tuple[int, int]:
    """Where the names starting with `prefix` lie in a sorted list: names[lo:hi]."""
    lo = bisect.bisect_left(names, prefix)
    # The first text after every text that starts with `prefix`: its last character raised by
    # one (a last U+10FFFF cannot be raised: the run then ends where the one before it would).
    stem = prefix.rstrip("\U0010ffff")
    if not stem:
        return lo, len(names)
    return lo, bisect.bisect_left(names, stem[:-1] + chr(ord(stem[-1]) + 1))


class _Lowered(NamedTuple):
    """The lowercased names and their parents, sorted; for each the indexes of the names that
    lowercase to it (None: they are the names themselves); the same sorted by reversed text,
    and forwards in that order."""

    names: list[str]
    back: list[list[int]] | None
    rev: list[str]
    rev_names: list[str]


class NameIndex:
    """Module names (and every dotted parent) indexed for the three matchers and `re:`."""

    def __init__(self, names: Iterable[str]):
        names = list(names)
        self.leaves = frozenset(names)  # the names given (modules that own tensors)
        self.names: list[str] = sorted(_with_parents(names))
        self.set = frozenset(self.names)
        self._rev: tuple[list[str], list[str]] | None = None  # reversed texts sorted, names
        self._low: _Lowered | None = None  # substring matching's lists
        self._lasts: dict[str, list[int]] | None = None
        self._ending: dict[str, list[str]] = {}
        self._suf: dict[str, tuple[str, ...]] = {}  # entry -> names
        self._sub: dict[str, tuple[str, ...]] = {}  # lowercased entry -> names
        self._regex: dict[str, list[str]] = {}

    def __len__(self) -> int:
        return len(self.names)

    def with_prefix(self, prefix: str) -> list[str]:
        lo, hi = _run(self.names, prefix)
        return self.names[lo:hi]

    def descendants(self, name: str) -> list[str]:
        lo = bisect.bisect_left(self.names, name + ".")
        hi = bisect.bisect_left(self.names, name + "/")  # "/" follows "." in code points
        return self.names[lo:hi]

    # exact ------------------------------------------------------------------------------
    def exact(self, entry: str) -> list[str]:
        return [entry] if entry in self.set else []

    # dotted suffix (SGLang >= 0.5.17) ---------------------------------------------------
    def _reversed(self) -> tuple[list[str], list[str]]:
        if self._rev is None:
            rev = sorted(n[::-1] for n in self.names)
            self._rev = rev, [r[::-1] for r in rev]
        return self._rev

    def suffix(self, entry: str) -> list[str]:
        """The entry itself and every name ending in '.' + entry: a prefix run of the sorted
        reversed names."""
        hit = self._suf.get(entry)
        if hit is None:
            rev, names = self._reversed()
            r = entry[::-1]
            lo = bisect.bisect_left(rev, r + ".")
            hi = bisect.bisect_left(rev, r + "/")
            hit = ((entry,) if entry in self.set else ()) + tuple(names[lo:hi])
            self._suf[entry] = hit
        return list(hit)

    # substring, case-insensitive (SGLang 0.5.7-0.5.16) ----------------------------------
    # Matched among the lowercased names (with their dotted parents: lowercasing a whole name
    # is not always lowercasing its parts, Greek capital sigma depends on what follows it), then
    # mapped back to the names. When every name is lowercase already, as in real checkpoints,
    # the two lists are one and a run of one is a run of the other.
    def _lower(self) -> _Lowered:
        if self._low is None:
            low = list(map(str.lower, self.names))
            if low == self.names:
                self._low = _Lowered(self.names, None, *self._reversed())
            else:
                where: dict[str, list[int]] = {}
                for i, x in enumerate(low):
                    where.setdefault(x, []).append(i)
                low = sorted(_with_parents(where))
                rev = sorted(x[::-1] for x in low)
                self._low = _Lowered(low, [where.get(x, []) for x in low], rev,
                                     [r[::-1] for r in rev])
        return self._low

    def _runs(self, e: str) -> list[tuple[int, int]]:
        """The lowercased names that contain `e` (lowercase), as runs of their sorted list."""
        low = self._lower()
        head, dot, last = e.rpartition(".")
        if dot:
            parents = self._ending.get(head)
            if parents is None:  # the names that end with head (entries share a few heads)
                lo, hi = _run(low.rev, head[::-1])
                parents = self._ending[head] = low.rev_names[lo:hi]
                if not head:  # a name that starts with '.' has no parent there: "" stands for it
                    parents.append("")
            return [_run(low.names, f"{p}.{last}") for p in parents]
        if self._lasts is None:  # last component -> names: few distinct ones
            self._lasts = {}
            for i, x in enumerate(low.names):
                self._lasts.setdefault(x.rpartition(".")[2], []).append(i)
        # a name whose last component holds e, with all below it ("/" follows ".")
        return [(i, bisect.bisect_left(low.names, low.names[i] + "/"))
                for part, idxs in self._lasts.items() if e in part for i in idxs]

    def substring(self, entry: str) -> list[str]:
        e = entry.lower()
        hit = self._sub.get(e)
        if hit is None:
            runs = self._runs(e)
            if len(runs) > 1:  # join the runs where they overlap
                merged: list[tuple[int, int]] = []
                for lo, hi in sorted(runs):
                    if merged and lo <= merged[-1][1]:
                        merged[-1] = merged[-1][0], max(merged[-1][1], hi)
                    else:
                        merged.append((lo, hi))
                runs = merged
            back = self._lower().back
            if back is None:
                hit = tuple(chain.from_iterable(self.names[lo:hi] for lo, hi in runs))
            else:
                idxs = sorted(i for lo, hi in runs for j in range(lo, hi) for i in back[j])
                hit = tuple(self.names[i] for i in idxs)
            self._sub[e] = hit
        return list(hit)

    # re: --------------------------------------------------------------------------------
    def regex(self, pattern: str) -> list[str]:
        hit = self._regex.get(pattern)
        if hit is None:
            rx = re.compile(pattern)
            hit = list(filter(rx.match, self.with_prefix(_literal_prefix(pattern))))
            self._regex[pattern] = hit
        return hit

    def matches(self, entry: str, matcher: str) -> list[str]:
        """Names an ignore entry matches under an engine's matcher."""
        if entry.startswith("re:"):
            try:
                return self.regex(entry[3:])
            except re.error:
                return []
        if matcher == "exact":
            return self.exact(entry)
        if matcher == "suffix":
            return self.suffix(entry)
        if matcher == "substring":
            return self.substring(entry)
        raise ValueError(f"unknown matcher {matcher!r}")


def ignored_set(entries: Iterable[Any], index: NameIndex, matcher: str) -> set[str]:
    out: set[str] = set()
    for e in entries:
        if isinstance(e, str):
            out.update(index.matches(e, matcher))
    return out


def names_ignored(names: Iterable[str], entries: Iterable[Any], matcher: str) -> set[str]:
    """Which of a few names (not in any index) an ignore list matches: each name's substrings,
    dotted suffixes or itself are looked up among the entries, so the cost follows the names,
    not the entries."""
    plain = {e for e in entries if isinstance(e, str) and not e.startswith("re:")}
    rxs = []
    for e in entries:
        if isinstance(e, str) and e.startswith("re:"):
            try:
                rxs.append(re.compile(e[3:]))
            except re.error:
                pass
    lower = {e.lower() for e in plain}
    longest = max(map(len, lower), default=0)
    out = set()
    for n in names:
        hit = False
        if matcher == "exact":
            hit = n in plain
        elif matcher == "suffix":
            hit = n in plain or any(n[i + 1:] in plain for i, c in enumerate(n) if c == ".")
        elif matcher == "substring":
            ln = n.lower()  # an empty entry is in every name, as `"" in name` says
            hit = "" in lower or any(ln[i:j] in lower for i in range(len(ln))
                                     for j in range(i + 1, min(len(ln), i + longest) + 1))
        if hit or any(r.match(n) for r in rxs):
            out.add(n)
    return out

