"""Module names indexed for the engines' ignore matchers (substring, dotted suffix, exact) and
`re:` entries: sorted names for prefixes, per-length span tables for substrings, per-depth
tail tables for dotted suffixes, so 10,000 entries against 30,000 modules take a fraction of
a second."""

from __future__ import annotations

import bisect
import re
from collections.abc import Iterable
from typing import Any

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


class NameIndex:
    """Module names (and every dotted parent) indexed for the three matchers and `re:`."""

    def __init__(self, names: Iterable[str]):
        names = list(names)
        self.leaves = frozenset(names)  # the names given (modules that own tensors)
        allnames: set[str] = set()
        for n in names:
            if n in allnames:
                continue
            allnames.add(n)
            i = n.rfind(".")
            while i > 0:
                p = n[:i]
                if p in allnames:
                    break
                allnames.add(p)
                i = n.rfind(".", 0, i)
        self.names: list[str] = sorted(allnames)
        self.set = frozenset(allnames)
        self._lparts: list[list[str]] | None = None
        self._tables: dict[int, dict[Any, Any]] = {}
        self._rev: list[str] | None = None
        self._sub: dict[str, tuple[str, ...]] = {}  # lowercased entry -> names
        self._regex: dict[str, list[str]] = {}

    def __len__(self) -> int:
        return len(self.names)

    def with_prefix(self, prefix: str) -> list[str]:
        if not prefix:
            return self.names
        lo = bisect.bisect_left(self.names, prefix)
        hi = bisect.bisect_left(self.names, prefix[:-1] + chr(ord(prefix[-1]) + 1))
        return self.names[lo:hi]

    def descendants(self, name: str) -> list[str]:
        lo = bisect.bisect_left(self.names, name + ".")
        hi = bisect.bisect_left(self.names, name + "/")  # "/" follows "." in code points
        return self.names[lo:hi]

    # exact ------------------------------------------------------------------------------
    def exact(self, entry: str) -> list[str]:
        return [entry] if entry in self.set else []

    # dotted suffix (SGLang >= 0.5.17) ---------------------------------------------------
    def suffix(self, entry: str) -> list[str]:
        """The entry itself and every name ending in '.' + entry: a prefix run of the sorted
        reversed names."""
        if self._rev is None:
            self._rev = sorted(n[::-1] for n in self.names)
        r = entry[::-1] + "."
        lo = bisect.bisect_left(self._rev, r)
        hi = bisect.bisect_left(self._rev, entry[::-1] + "/", lo)
        out = [x[::-1] for x in self._rev[lo:hi]]
        return ([entry] if entry in self.set else []) + out

    # substring, case-insensitive (SGLang 0.5.7-0.5.16) ----------------------------------
    # Every parent is a name too, so the names containing an entry are the subtrees of the
    # *minimal* ones: those where the entry ends inside the last component. For an entry
    # "p0.p1...pk" (k >= 2) a minimal name ends "...<c ending with p0>.p1...p(k-1).<c starting
    # with pk>": a table keyed by the k-1 components before the last (one key per name),
    # sorted by the last component, finds them with one bisect. k = 1 and k = 0 scan the
    # distinct (previous, last) pairs or last components, which are few. A subtree is one
    # contiguous run of the sorted names.
    def _lower(self) -> list[list[str]]:
        if self._lparts is None:
            self._lparts = [n.lower().split(".") for n in self.names]
        return self._lparts

    def _ends(self, m: int) -> dict[Any, Any]:
        t = self._tables.get(m)
        if t is None:
            t = {}
            if m == 0:  # last component -> names
                for idx, ps in enumerate(self._lower()):
                    t.setdefault(ps[-1], []).append(idx)
            elif m == -1:  # (previous, last) -> names
                for idx, ps in enumerate(self._lower()):
                    if len(ps) > 1:
                        t.setdefault((ps[-2], ps[-1]), []).append(idx)
            else:
                self.build({m})
                return self._tables[m]
            self._tables[m] = t
        return t

    def build(self, ms: Iterable[int]) -> None:
        """The tables for k-1 = m middle components (m >= 1), several in one pass: the m
        components before the last -> sorted (last, the component before them, name)."""
        ms = sorted({m for m in ms if m >= 1 and m not in self._tables})
        if not ms:
            return
        top = ms[-1]
        tables: dict[int, dict[str, list[tuple[str, str, int]]]] = {m: {} for m in ms}
        # rsplit keeps the front in one piece, which has the components before them all
        for idx, ps in enumerate(n.lower().rsplit(".", top + 1) for n in self.names):
            count, last = len(ps), ps[-1]
            for m in ms:
                if count >= m + 2:
                    head = ps[-m - 2]
                    tables[m].setdefault(".".join(ps[-m - 1:-1]), []).append(
                        (last, head[head.rfind(".") + 1:], idx))
        for m, t in tables.items():
            for v in t.values():
                v.sort()
            self._tables[m] = t

    def _minimal(self, e: str) -> list[int]:
        parts = e.split(".")
        k = len(parts) - 1
        if k == 0:
            return [i for last, idxs in self._ends(0).items() if e in last for i in idxs]
        if k == 1:
            a, b = parts
            return [i for (x, y), idxs in self._ends(-1).items()
                    if x.endswith(a) and y.startswith(b) for i in idxs]
        rows = self._ends(k - 1).get(".".join(parts[1:-1]))
        out = []
        if rows:
            first, last = parts[0], parts[-1]
            i = bisect.bisect_left(rows, (last,))
            while i < len(rows) and rows[i][0].startswith(last):
                if rows[i][1].endswith(first):
                    out.append(rows[i][2])
                i += 1
        return out

    def substring(self, entry: str) -> list[str]:
        e = entry.lower()
        hit = self._sub.get(e)
        if hit is None:
            names = self.names
            idxs: set[int] = set()
            for i in self._minimal(e):
                if i in idxs:
                    continue
                hi = bisect.bisect_left(names, names[i] + "/", i)
                idxs.update(range(i, hi))
            hit = tuple(names[i] for i in sorted(idxs))
            self._sub[e] = hit
        return list(hit)

    # re: --------------------------------------------------------------------------------
    def regex(self, pattern: str) -> list[str]:
        hit = self._regex.get(pattern)
        if hit is None:
            rx = re.compile(pattern)
            hit = [n for n in self.with_prefix(_literal_prefix(pattern)) if rx.match(n)]
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
    entries = list(entries)
    if matcher == "substring":
        index.build(e.count(".") - 1 for e in entries if isinstance(e, str))
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

