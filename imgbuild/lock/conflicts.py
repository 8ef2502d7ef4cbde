"""Explain a failed resolution and find the overrides that would reconcile it.

uv reports one incompatibility at a time as a chain of facts. Here each chain is read for the
package whose constraints cannot all hold, an override is proposed for it, and the resolution
is retried with the proposals so far, until it succeeds or stops making progress. The user
gets every conflict at once, each with who asks for what, and a set of overrides that is
proven to resolve (they still have to write why each one is safe).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, replace

from packaging.specifiers import SpecifierSet
from packaging.utils import canonicalize_name
from packaging.version import InvalidVersion, Version

from ..errors import ResolveError

_NAME = r"([A-Za-z0-9][A-Za-z0-9._-]*)(?:\[[^\]]*\])?(?:\{[^}]*\})?"  # name[extras]{marker}
_SPEC = r"((?:(?:==|>=|<=|~=|!=|<|>)[A-Za-z0-9.*+!_-]+,?)+)"
_DEPENDS = re.compile(
    r"(?:all versions of )?([A-Za-z0-9][A-Za-z0-9._-]*(?:(?:==|>=|<=|~=|<|>)[^\s,]+)?)"
    rf" depends? on {_NAME}{_SPEC}")
# "we can conclude that you require X" is derived, not something the user asked for.
_REQUIRE = re.compile(rf"(?<!conclude that )you require ({_NAME}{_SPEC}(?:,? and {_NAME}{_SPEC})*)")
_ONE = re.compile(rf"{_NAME}{_SPEC}")
_NO_WHEELS = re.compile(rf"{_NAME}==([^\s]+) has no wheels with a matching platform tag")
_AVAILABLE = re.compile(r"Wheels are available for `([^`]+)` \(v([^)]+)\) on the following platforms?: (.*)")


@dataclass(frozen=True)
class Constraint:
    package: str  # canonical
    spec: str  # "==0.8.1", ">=0.10"
    source: str  # "you" or the dependent, e.g. "vllm==0.6.6"


@dataclass(frozen=True)
class Conflict:
    package: str
    constraints: tuple[Constraint, ...]
    override: str  # the proposed override requirement
    rationale: str

    def lines(self) -> list[str]:
        who = "; ".join(f"{'you require' if c.source == 'you' else c.source + ' requires'} "
                        f"{c.package}{c.spec}" for c in self.constraints)
        return [f"{self.package}: {who}", f"  → override {self.override} ({self.rationale})"]


def parse_constraints(message: str) -> list[Constraint]:
    text = " ".join(message.split())
    out: list[Constraint] = []
    for m in _DEPENDS.finditer(text):
        out.append(Constraint(canonicalize_name(m.group(2)), m.group(3).rstrip(",."), m.group(1)))
    for m in _REQUIRE.finditer(text):
        for one in _ONE.finditer(m.group(1)):
            out.append(Constraint(canonicalize_name(one.group(1)), one.group(2).rstrip(",."), "you"))
    # uv says "all versions of engine-old depend on ..." when the user pinned the only one:
    # name the dependent with the user's pin, as the user wrote it.
    pins = {c.package: c.package + c.spec for c in out if c.source == "you"}
    return [replace(c, source=pins.get(canonicalize_name(c.source), c.source)) for c in out]


def _pins(spec: str) -> list[Version]:
    out = []
    for part in spec.split(","):
        if part.startswith("==") and "*" not in part:
            try:
                out.append(Version(part[2:]))
            except InvalidVersion:
                pass
    return out


def propose(constraints: list[Constraint], already: set[str]) -> Conflict | None:
    """The first package with incompatible constraints, and an override for it.

    Choice: the newest exact pin that the other (range) constraints admit; if no pin fits the
    ranges, the ranges themselves (the side that asks for newer code usually needs it; the
    other side's pin is typically conservative).
    """
    by_pkg: dict[str, list[Constraint]] = {}
    for c in constraints:
        by_pkg.setdefault(c.package, []).append(c)
    for pkg, cs in by_pkg.items():
        if pkg in already or len({c.spec for c in cs}) < 2:
            continue
        pins = sorted({v for c in cs for v in _pins(c.spec)}, reverse=True)
        ranges = [c.spec for c in cs if not _pins(c.spec)]
        ok_ranges = SpecifierSet(",".join(ranges)) if ranges else SpecifierSet()
        for v in pins:
            if ok_ranges.contains(v, prereleases=True):
                why = ("the newer of the exact pins" if not ranges
                       else f"the newest pin that also satisfies {','.join(ranges)}")
                return Conflict(pkg, tuple(cs), f"{pkg}=={v}", why)
        if ranges:
            return Conflict(pkg, tuple(cs), f"{pkg}{','.join(ranges)}",
                            "what the range requirement asks; the exact pin is overridden")
    return None


def platform_sentence(message: str, platform: str) -> str | None:
    """The no-silent-backtracking sentence: an exactly pinned package has no wheel here."""
    m = _NO_WHEELS.search(" ".join(message.split()))
    if not m:
        return None
    avail = _AVAILABLE.search(message)
    where = f" (it ships wheels for {avail.group(3)})" if avail else ""
    return (f"{m.group(1)} {m.group(2)} has no wheel for this image's platform "
            f"{platform}{where}; imgbuild pins it exactly and will not fall back to an older "
            f"{m.group(1)}")


def ships_cpu(message: str, cpu: str) -> bool | None:
    """Whether the wheels uv says the package ships include one for `cpu` (None: uv named no
    platforms). False means no glibc choice helps: only another CPU's image could take it."""
    avail = _AVAILABLE.search(message)
    if not avail:
        return None
    tags = re.findall(r"[\w.]+", avail.group(3))
    return any(t == "any" or t.endswith("_" + cpu) or t == cpu for t in tags)


def reconcile(req, resolve_fn, max_rounds: int = 12) -> tuple[list[Conflict], bool, str]:
    """Retry the resolution with proposed overrides until it resolves.

    Returns (conflicts found, whether the proposals resolve, the last uv message).
    """
    found: list[Conflict] = []
    overrides = list(req.overrides)
    last = ""
    for _ in range(max_rounds):
        try:
            resolve_fn(replace(req, overrides=tuple(overrides)))
            return found, True, last
        except ResolveError as e:
            last = "\n".join(e.facts)
            c = propose(parse_constraints(last), {f.package for f in found})
            if c is None:
                return found, False, last
            found.append(c)
            overrides = [o for o in overrides
                         if canonicalize_name(re.split(r"[<>=!~;\[ ]", o, maxsplit=1)[0]) != c.package]
            overrides.append(c.override)
    return found, False, last


def override_yaml(conflicts: list[Conflict]) -> str:
    lines = ["overrides:"]
    for c in conflicts:
        lines += [f"  - requirement: {c.override}",
                  f"    reason: <why {c.override} is safe for "
                  + ", ".join(sorted({x.source for x in c.constraints if x.source != 'you'}) or ["you"])
                  + ">"]
    return "\n".join(lines)
