"""How each engine version reads a compressed-tensors checkpoint (images/checks/engines.yaml):
its ignore matcher, activation gate, where it takes packed_modules_mapping, what it does with
W4A4 on archs without FP4, with wheel file:line evidence and the patches that change a value."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from packaging.specifiers import InvalidSpecifier, SpecifierSet
from packaging.version import Version

from ..errors import SpecError
from .schema import Doc, read_table

ENGINE_FILES = ("checks/engines.yaml",)
MATCHERS = ("substring", "suffix", "exact")
BEHAVIOURS = {
    "ignore_matcher": ("substring", "suffix", "exact"),
    "activation_gate": ("top-level", "per-group"),
    "packed_modules_mapping": ("config", "model", "config+model"),
}
W4A4_VALUES = ("refuses", "falls-back")
FUSED_LOOKUPS = ("shards-unless-listed", "direct-first")
# The value of each behaviour that no longer loses information.
FIXED = {"ignore_matcher": ("suffix", "exact"), "activation_gate": ("per-group",),
         "packed_modules_mapping": ("config", "config+model")}


@dataclass(frozen=True)
class Rule:
    """One version range of one behaviour."""

    versions: str  # PEP 440 specifier set
    value: str  # for w4a4_without_fp4_arch: "linear=<v>,moe=<v>"
    checked: tuple[str, ...]
    evidence: tuple[str, ...]
    patch: str | None = None  # patch id that changes the value
    patched_value: str | None = None

    def contains(self, version: str) -> bool:
        return SpecifierSet(self.versions).contains(Version(version), prereleases=True)


@dataclass(frozen=True)
class ModelClass:
    name: str
    mapping: dict[str, tuple[str, ...]] = field(hash=False)
    evidence: str = ""


@dataclass(frozen=True)
class EngineData:
    name: str
    rules: dict[str, tuple[Rule, ...]] = field(hash=False)
    fused_lookup: str = "shards-unless-listed"
    fuses_projections: bool = True
    classes_versions: str | None = None
    classes_checked: tuple[str, ...] = ()
    classes: dict[str, ModelClass] = field(default_factory=dict, hash=False)


@dataclass(frozen=True)
class EngineTable:
    fused: dict[str, tuple[str, ...]] = field(hash=False)
    engines: dict[str, EngineData] = field(hash=False)
    source: str = ""


def _specifier(doc: Doc, key: str) -> str:
    text = doc.get(key, str, what="a PEP 440 specifier in quotes, e.g. '>=0.5.7,<0.5.17'")
    try:
        SpecifierSet(text)
    except InvalidSpecifier:
        raise SpecError(doc.path, doc.key(key), "a PEP 440 specifier such as '>=0.5.7,<0.5.17'",
                        text) from None
    return text


def _mapping(doc: Doc, key: str) -> dict[str, tuple[str, ...]]:
    md = doc.sub(key, doc.get(key, dict, {}))
    return {str(k): md.str_list(str(k), default=...) for k in md.data}


def load_engines(images: Path) -> EngineTable:
    """Read and validate images/checks/engines.yaml; errors name the file, key and expectation."""
    doc = read_table(images, ENGINE_FILES, "engine behaviours")
    where = doc.path
    doc.reject_unknown({"fused_projections", "engines"})
    fused = _mapping(doc, "fused_projections")
    engines: dict[str, EngineData] = {}
    eng_doc = doc.sub("engines", doc.get("engines", dict))
    for name in eng_doc.data:
        ed = eng_doc.sub(str(name), eng_doc.data[name])
        ed.reject_unknown(set(BEHAVIOURS) | {"w4a4_without_fp4_arch", "fused_lookup",
                                             "fuses_projections", "model_classes"})
        rules: dict[str, tuple[Rule, ...]] = {}
        for beh in list(BEHAVIOURS) + ["w4a4_without_fp4_arch"]:
            out = []
            for i, raw in enumerate(ed.get(beh, list, [])):
                rd = ed.sub(f"{beh}[{i}]", raw)
                w4 = beh == "w4a4_without_fp4_arch"
                rd.reject_unknown({"versions", "checked", "evidence", "patch"}
                                  | ({"linear", "moe"} if w4 else {"value"}))
                if w4:
                    vals = {k: rd.get(k, str) for k in ("linear", "moe")}
                    for k, v in vals.items():
                        if v not in W4A4_VALUES:
                            raise SpecError(where, rd.key(k), "one of " + ", ".join(W4A4_VALUES), v)
                    value = f"linear={vals['linear']},moe={vals['moe']}"
                else:
                    value = rd.get("value", str)
                    if value not in BEHAVIOURS[beh]:
                        raise SpecError(where, rd.key("value"), "one of "
                                        + ", ".join(BEHAVIOURS[beh]), value)
                patch = pvalue = None
                if rd.data.get("patch") is not None:
                    pd = rd.sub("patch", rd.get("patch", dict))
                    pd.reject_unknown({"id", "value"})
                    patch, pvalue = pd.get("id", str), pd.get("value", str)
                    if not w4 and pvalue not in BEHAVIOURS[beh]:
                        raise SpecError(where, pd.key("value"), "one of "
                                        + ", ".join(BEHAVIOURS[beh]), pvalue)
                out.append(Rule(_specifier(rd, "versions"), value,
                                tuple(str(c) for c in rd.get("checked", list, [])),
                                rd.str_list("evidence"), patch, pvalue))
            rules[beh] = tuple(out)
        lookup = ed.get("fused_lookup", str, "shards-unless-listed")
        if lookup not in FUSED_LOOKUPS:
            raise SpecError(where, ed.key("fused_lookup"), "one of " + ", ".join(FUSED_LOOKUPS),
                            lookup)
        classes: dict[str, ModelClass] = {}
        cversions = None
        cchecked: tuple[str, ...] = ()
        if ed.data.get("model_classes") is not None:
            cd = ed.sub("model_classes", ed.get("model_classes", dict))
            cd.reject_unknown({"versions", "checked", "classes"})
            cversions = _specifier(cd, "versions")
            cchecked = tuple(str(c) for c in cd.get("checked", list, []))
            cls_doc = cd.sub("classes", cd.get("classes", dict))
            for cname in cls_doc.data:
                kd = cls_doc.sub(str(cname), cls_doc.data[cname])
                kd.reject_unknown({"mapping", "evidence"})
                classes[str(cname)] = ModelClass(str(cname), _mapping(kd, "mapping"),
                                                 kd.get("evidence", str, ""))
        engines[str(name)] = EngineData(str(name), rules, lookup,
                                        ed.get("fuses_projections", bool, True),
                                        cversions, cchecked, classes)
    return EngineTable(fused, engines, where)

