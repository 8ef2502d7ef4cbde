"""An engine version's behaviours, from the engine table, with a target's patches applied."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from packaging.specifiers import SpecifierSet
from packaging.version import InvalidVersion, Version

from ...catalog.engines import FIXED, EngineData, EngineTable, Rule
from ...catalog.targets import Target
from ...errors import InputError


@dataclass(frozen=True)
class Fact:
    """One behaviour of one engine version, with the patches a target applies."""

    name: str
    value: str | None  # None: no rule covers this version
    base_value: str | None = None  # before patches
    patched_by: str | None = None
    rule: Rule | None = None
    fixed_in: str | None = None  # first engine version with a fixed value, from the rules
    fix_patch: str | None = None  # the patch id that fixes it, from the rule

    def to_dict(self) -> dict[str, Any]:
        return {"value": self.value, "base_value": self.base_value, "patched_by": self.patched_by,
                "versions": self.rule.versions if self.rule else None,
                "checked": list(self.rule.checked) if self.rule else [],
                "evidence": list(self.rule.evidence) if self.rule else [],
                "fixed_in": self.fixed_in, "fix_patch": self.fix_patch}


@dataclass(frozen=True)
class Behaviour:
    engine: str
    version: str
    patches: tuple[str, ...]
    facts: dict[str, Fact] = field(hash=False)
    fused_lookup: str = "shards-unless-listed"
    fuses_projections: bool = True
    data: EngineData | None = field(default=None, hash=False, compare=False)

    def value(self, name: str) -> str | None:
        f = self.facts.get(name)
        return f.value if f else None

    def w4a4(self, kind: str) -> str | None:
        v = self.value("w4a4_without_fp4_arch")
        if not v:
            return None
        return dict(p.split("=") for p in v.split(","))[kind]

    def model_mapping(self, architecture: str | None) -> tuple[dict[str, tuple[str, ...]] | None, str]:
        """The packed_modules_mapping the engine's model class declares, and where that is
        written; (None, why) when the table does not know the class for this version."""
        d = self.data
        if d is None:
            return None, f"{self.engine} is not in the engine table (images/checks/engines.yaml)"
        if not architecture:
            return None, "no architecture in config.json"
        if d.classes_versions is None or not SpecifierSet(d.classes_versions).contains(
                Version(self.version), prereleases=True):
            return None, f"{self.engine} {self.version}'s model classes are not recorded"
        mc = d.classes.get(architecture)
        if mc is None:
            return None, (f"{architecture} is not among the model classes recorded for "
                          f"{self.engine} ({', '.join(sorted(d.classes)) or 'none'})")
        return dict(mc.mapping), mc.evidence

    def to_dict(self) -> dict[str, Any]:
        return {"engine": self.engine, "version": self.version, "patches": list(self.patches),
                "fused_lookup": self.fused_lookup,
                "behaviours": {k: f.to_dict() for k, f in self.facts.items()}}


def _first_fixed(rules: Sequence[Rule], name: str) -> str | None:
    good = FIXED.get(name, ())
    if name == "w4a4_without_fp4_arch":
        good = ("linear=falls-back,moe=falls-back",)
    lows = []
    for r in rules:
        if r.value in good:
            for s in SpecifierSet(r.versions):
                if s.operator in (">=", "=="):
                    lows.append(Version(s.version))
    return str(min(lows)) if lows else None


def behaviour(engine: str, version: str, patches: Iterable[str] = (), *,
              table: EngineTable) -> Behaviour:
    """The behaviours of `engine==version`, with the given patch ids applied."""
    patches = tuple(patches)
    data = table.engines.get(engine)
    if data is None:
        return Behaviour(engine, version, patches, {}, data=None)
    try:
        Version(version)
    except InvalidVersion:
        raise InputError(f"engine version {version!r} is not a PEP 440 version") from None
    facts: dict[str, Fact] = {}
    for name, rules in data.rules.items():
        rule = next((r for r in rules if r.contains(version)), None)
        fix_patch = next((r.patch for r in rules if r.patch), None)
        if rule is None:
            facts[name] = Fact(name, None, None, None, None, _first_fixed(rules, name), fix_patch)
            continue
        value, by = rule.value, None
        if rule.patch and rule.patch in patches and rule.patched_value:
            value, by = rule.patched_value, rule.patch
        facts[name] = Fact(name, value, rule.value, by, rule, _first_fixed(rules, name),
                           rule.patch or fix_patch)
    return Behaviour(engine, version, patches, facts, data.fused_lookup, data.fuses_projections,
                     data)


def target_behaviour(target: Target, table: EngineTable) -> Behaviour:
    return behaviour(target.engine, target.engine_version, target.patches, table=table)

