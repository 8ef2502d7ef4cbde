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

How each engine version behaves is data (images/checks/engines.yaml, with wheel file:line
evidence); a target's `patches:` ids switch behaviours to their fixed values.

Module names come from the checkpoint's safetensors index (or the safetensors headers): a
module is *quantized* when it has a `weight_packed` or `weight_scale` tensor. Matching an
ignore list against them is indexed (sorted names for prefixes, per-length span tables for
substrings, per-depth tail tables for dotted suffixes), so 10,000 entries against 30,000
modules take a fraction of a second.

`fix` rewrites the offending entries as anchored `re:` expressions that ignore exactly the same
modules as the original entries do under exact matching (compressed-tensors' own semantics)
and no child, and proves it by recomputing the ignored set under every matcher.
"""

from __future__ import annotations

import bisect
import copy
import json
import os
import re
import struct
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from packaging.specifiers import InvalidSpecifier, SpecifierSet
from packaging.version import InvalidVersion, Version

from .errors import EnvError, InputError, JobFailed, SpecError
from .fsutil import atomic_write_text
from .spec import Catalog, Target, _Doc, _read_yaml, _rel, images_dir

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
QUANT_PARAMS = ("weight_packed", "weight_scale")
EXAMPLES = 5
SEVERITIES = ("error", "warning", "info")


# --- engine behaviours (data) ----------------------------------------------------------------

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


def _specifier(doc: _Doc, key: str) -> str:
    text = doc.get(key, str, what="a PEP 440 specifier in quotes, e.g. '>=0.5.7,<0.5.17'")
    try:
        SpecifierSet(text)
    except InvalidSpecifier:
        raise SpecError(doc.path, doc.key(key), "a PEP 440 specifier such as '>=0.5.7,<0.5.17'",
                        text) from None
    return text


def _mapping(doc: _Doc, key: str) -> dict[str, tuple[str, ...]]:
    md = doc.sub(key, doc.get(key, dict, {}))
    return {str(k): md.str_list(str(k), default=...) for k in md.data}


def load_engines(images: Path | None = None) -> EngineTable:
    """Read and validate images/checks/engines.yaml; errors name the file, key and expectation."""
    root = Path(images) if images else images_dir()
    path = next((root / f for f in ENGINE_FILES if (root / f).is_file()), None)
    if path is None:
        raise InputError(f"no engine behaviours under {root}",
                         facts=[f"looked for {', '.join(str(root / f) for f in ENGINE_FILES)}"],
                         hint="run imgbuild from a checkout (images/checks/engines.yaml ships "
                              "with it)")
    rel = _rel(path, root)
    doc = _Doc(rel, _read_yaml(path, root))
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
                            raise SpecError(rel, rd.key(k), "one of " + ", ".join(W4A4_VALUES), v)
                    value = f"linear={vals['linear']},moe={vals['moe']}"
                else:
                    value = rd.get("value", str)
                    if value not in BEHAVIOURS[beh]:
                        raise SpecError(rel, rd.key("value"), "one of "
                                        + ", ".join(BEHAVIOURS[beh]), value)
                patch = pvalue = None
                if rd.data.get("patch") is not None:
                    pd = rd.sub("patch", rd.get("patch", dict))
                    pd.reject_unknown({"id", "value"})
                    patch, pvalue = pd.get("id", str), pd.get("value", str)
                    if not w4 and pvalue not in BEHAVIOURS[beh]:
                        raise SpecError(rel, pd.key("value"), "one of "
                                        + ", ".join(BEHAVIOURS[beh]), pvalue)
                out.append(Rule(_specifier(rd, "versions"), value,
                                tuple(str(c) for c in rd.get("checked", list, [])),
                                rd.str_list("evidence"), patch, pvalue))
            rules[beh] = tuple(out)
        lookup = ed.get("fused_lookup", str, "shards-unless-listed")
        if lookup not in FUSED_LOOKUPS:
            raise SpecError(rel, ed.key("fused_lookup"), "one of " + ", ".join(FUSED_LOOKUPS),
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
    return EngineTable(fused, engines, rel)


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
        if d is None or not architecture:
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
              table: EngineTable | None = None) -> Behaviour:
    """The behaviours of `engine==version`, with the given patch ids applied."""
    table = table or load_engines()
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


def target_behaviour(target: Target, table: EngineTable | None = None) -> Behaviour:
    return behaviour(target.engine, target.engine_version, target.patches, table=table)


# --- the checkpoint --------------------------------------------------------------------------

@dataclass(frozen=True)
class Checkpoint:
    """What check-model reads: config.json, and module names when tensors are listed."""

    config: dict[str, Any] = field(hash=False, compare=False)
    module_names: tuple[str, ...]  # modules that own tensors, sorted
    source: str
    quantized: frozenset[str] = frozenset()  # modules with weight_packed / weight_scale
    w4a4: frozenset[str] = frozenset()  # NVFP4 modules with an input_global_scale
    names_from: str | None = None  # file the names were read from; None: config only
    config_path: Path | None = None
    config_text: str | None = field(default=None, hash=False, compare=False, repr=False)

    @classmethod
    def from_tensors(cls, config: dict[str, Any], tensor_names: Iterable[str], source: str, *,
                     names_from: str | None = None, config_path: Path | None = None,
                     config_text: str | None = None) -> Checkpoint:
        modules: set[str] = set()
        quantized: set[str] = set()
        w4a4: set[str] = set()
        for t in tensor_names:
            mod, _, param = t.rpartition(".")
            if not mod:
                continue
            modules.add(mod)
            if param in QUANT_PARAMS:
                quantized.add(mod)
            elif param == "input_global_scale":
                w4a4.add(mod)
        return cls(config, tuple(sorted(modules)), source, frozenset(quantized),
                   frozenset(w4a4 & quantized), names_from, config_path, config_text)

    @property
    def architecture(self) -> str | None:
        archs = self.config.get("architectures") or []
        return archs[0] if archs and isinstance(archs[0], str) else None


def quant_config(config: Mapping[str, Any]) -> tuple[dict[str, Any] | None, tuple[str, ...]]:
    """The quantization config and the keys that lead to it (engines look in this order)."""
    for key in ("quantization_config", "compression_config"):
        q = config.get(key)
        if isinstance(q, dict):
            return q, (key,)
    tc = config.get("text_config")
    if isinstance(tc, dict) and isinstance(tc.get("quantization_config"), dict):
        return tc["quantization_config"], ("text_config", "quantization_config")
    return None, ()


def safetensors_keys(path: Path) -> list[str]:
    """Tensor names in a .safetensors file, from its JSON header (8-byte length, then JSON)."""
    with open(path, "rb") as f:
        head = f.read(8)
        if len(head) != 8:
            raise InputError(f"{path}: not a safetensors file (shorter than its header)")
        (n,) = struct.unpack("<Q", head)
        if n > 512 * 1024 * 1024:
            raise InputError(f"{path}: not a safetensors file (header length {n})")
        try:
            header = json.loads(f.read(n))
        except ValueError as e:
            raise InputError(f"{path}: unreadable safetensors header ({e})") from None
    return [k for k in header if k != "__metadata__"]


def _read_json(path: Path) -> tuple[dict[str, Any], str]:
    try:
        text = path.read_text()
    except OSError as e:
        raise InputError(f"{path}: cannot read: {e.strerror}") from None
    try:
        data = json.loads(text)
    except ValueError as e:
        raise InputError(f"{path}: not valid JSON ({e})",
                         hint="point check-model at a checkpoint directory or its config.json") from None
    if not isinstance(data, dict):
        raise InputError(f"{path}: expected a JSON object, got {type(data).__name__}")
    return data, text


def _tensor_names(d: Path) -> tuple[list[str] | None, str | None]:
    index = d / "model.safetensors.index.json"
    if index.is_file():
        doc, _ = _read_json(index)
        wm = doc.get("weight_map")
        if not isinstance(wm, dict):
            raise InputError(f"{index}: no weight_map", hint="the index is truncated; "
                             "download it again")
        return list(wm), index.name
    files = sorted(d.glob("*.safetensors"))
    if files:
        names: list[str] = []
        for f in files:
            names += safetensors_keys(f)
        return names, ", ".join(f.name for f in files[:3]) + (" ..." if len(files) > 3 else "") \
            + " (headers)"
    return None, None


_REPO_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")


def load_checkpoint(path: str | Path) -> Checkpoint:
    """A checkpoint directory, its config.json (index or safetensors beside it are read too), a
    bare config file, or a Hugging Face repo id (only when the hub can be reached)."""
    p = Path(path).expanduser()
    if p.is_dir():
        cfg = p / "config.json"
        if not cfg.is_file():
            raise InputError(f"{p}: no config.json", hint="point check-model at the checkpoint "
                             "directory (the one with config.json and the .safetensors files)")
        config, text = _read_json(cfg)
        names, src = _tensor_names(p)
        return Checkpoint.from_tensors(config, names or (), str(p), names_from=src,
                                       config_path=cfg, config_text=text)
    if p.is_file():
        config, text = _read_json(p)
        names = src = None
        if p.name == "config.json":
            names, src = _tensor_names(p.parent)
        return Checkpoint.from_tensors(config, names or (), str(p), names_from=src,
                                       config_path=p, config_text=text)
    if _REPO_ID.match(str(path)) and not str(path).startswith((".", "/", "~")):
        return _load_hub(str(path))
    raise InputError(f"no checkpoint at {path}",
                     hint="pass a checkpoint directory, its config.json, a model alias from "
                          "`imgbuild list`, or a Hugging Face repo id")


def _load_hub(repo: str) -> Checkpoint:
    try:
        import huggingface_hub as hh
        from huggingface_hub.utils import EntryNotFoundError, RepositoryNotFoundError
    except ImportError:
        raise EnvError(f"cannot read {repo}: huggingface_hub is not installed",
                       hint="download the checkpoint's config.json and "
                            "model.safetensors.index.json and pass their directory") from None
    try:
        cfg = Path(hh.hf_hub_download(repo, "config.json"))
    except RepositoryNotFoundError:
        raise InputError(f"no repository {repo} on the Hugging Face hub",
                         hint="check the repo id (and HF_TOKEN for a gated model)") from None
    except Exception as e:  # offline, unreachable, gated: all end the same way
        raise EnvError(f"cannot read {repo} from the Hugging Face hub",
                       facts=[f"{type(e).__name__}: {str(e).splitlines()[0][:200] if str(e) else ''}",
                              f"HF_HUB_OFFLINE={os.environ.get('HF_HUB_OFFLINE', '')!s}"],
                       hint="download config.json and model.safetensors.index.json of the "
                            "checkpoint and pass their directory") from None
    config, text = _read_json(cfg)
    names: list[str] | None = None
    src = None
    try:
        idx = Path(hh.hf_hub_download(repo, "model.safetensors.index.json"))
        doc, _ = _read_json(idx)
        names, src = list(doc.get("weight_map") or {}), f"{repo}: model.safetensors.index.json"
    except EntryNotFoundError:
        try:
            meta = hh.get_safetensors_metadata(repo)
            names = [t for fm in meta.files_metadata.values() for t in fm.tensors]
            src = f"{repo}: safetensors headers"
        except Exception:
            names = None
    except Exception:
        names = None
    return Checkpoint.from_tensors(config, names or (), repo, names_from=src, config_text=text)


# --- matching, indexed -----------------------------------------------------------------------

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
            ln = n.lower()
            hit = any(ln[i:j] in lower for i in range(len(ln))
                      for j in range(i + 1, min(len(ln), i + longest) + 1))
        if hit or any(r.match(n) for r in rxs):
            out.add(n)
    return out


# --- the ignore analysis ---------------------------------------------------------------------

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
    if matcher == "substring":
        index.build(e.count(".") - 1 for e in entries if isinstance(e, str))
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


# --- the fix: anchored re: entries -----------------------------------------------------------

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
    index.build(e.count(".") - 1 for e in entries if isinstance(e, str))
    for e in entries:
        if not isinstance(e, str) or e.startswith("re:"):
            continue
        exact = set(index.exact(e))
        if any(set(index.matches(e, m)) != exact for m in matchers):
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
    rxs = [re.compile(x) for x in exprs]
    entries_matched = all(any(r.match(e) for r in rxs) for e in off)
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
    target = out if out.suffix == ".json" and not out.is_dir() else out / "config.json"
    orig = target.with_name(target.name + ".orig")
    kept = orig.exists()
    if not kept:
        atomic_write_text(orig, original_text)
    text = json.dumps(result.config, indent=2, ensure_ascii=False) + "\n"
    atomic_write_text(target, text)
    if json.loads(target.read_text()) != result.config:
        raise JobFailed(f"{target}: what was written does not read back the same",
                        hint="check the disk, then run the command again")
    return replace(result, out=target, orig=orig, orig_kept=kept)


# --- findings --------------------------------------------------------------------------------

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


def _engine_label(b: Behaviour) -> str:
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
                      ct_version, index_urls) -> list[Finding]:
    from . import drift

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
        fams = [f for f in drift.load_families() if f.model_quant_method == "compressed-tensors"]
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
                        f"{_engine_label(beh)}: how it gates activation schemes is not recorded",
                        (f"top-level format 'mixed-precision' ({'; '.join(desc)})",),
                        "check the engine's compressed_tensors.py and record it in "
                        "images/checks/engines.yaml")]
    if f.value != "top-level":
        return []
    facts = [f"config.json: quantization_config.format is 'mixed-precision' "
             f"({len(desc)} config groups: {'; '.join(desc)})",
             f"{_engine_label(beh)} decides whether a layer's activations are quantized from the "
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
                            f"{_engine_label(beh)} matches them by substring",
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
             f"{_engine_label(beh)} matches the ignore list {how}",
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
        facts[1] = (f"how {_engine_label(beh)} matches the ignore list is not recorded "
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
                 f"{_engine_label(beh)} builds one fused layer {fused} and matches ignore "
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
            facts.append(f"{_engine_label(beh)} refuses W4A4 {what} there: "
                         + ("NotImplementedError: Current platform does not support w4a4 nvfp4 "
                            "quantization." if kind == "linear" else
                            "its W4A4 MoE method requires sm100"))
            sev = "error" if not fp4 else "warning"
        else:
            facts.append(f"{_engine_label(beh)} serves W4A4 {what} there another way (weight-only "
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


def check(checkpoint: Checkpoint, *, target: Target | None, catalog: Catalog | None = None,
          lock=None, engines: EngineTable | None = None, ct_formats: Iterable[str] | None = None,
          ct_version: str | None = None, index_urls: Sequence[str] = (),
          index: NameIndex | None = None, analysis_out: dict | None = None) -> list[Finding]:
    """Findings for a checkpoint on a target's engine (version and patches from the target).

    lock: the target's Lockfile, for the compressed-tensors version the formats are checked
    against (read from the locked wheel, see builder/drift.py); or pass `ct_formats` (the
    CompressionFormat values) and `ct_version` directly. analysis_out, if given, receives the
    IgnoreAnalysis ("ignore"), the NameIndex ("index") and the packed mappings the fused
    check found missing ("packed")."""
    table = engines or load_engines()
    config = checkpoint.config
    q, _ = quant_config(config)
    if q is None:
        return [Finding("not-quantized", "info", "config.json has no quantization_config: "
                        "nothing to check", (f"{checkpoint.source}",))]
    if q.get("quant_method") not in (None, "compressed-tensors"):
        return [Finding("not-compressed-tensors", "info",
                        f"quant_method is {q.get('quant_method')!r}, not compressed-tensors: "
                        f"nothing check-model knows to check")]
    beh = target_behaviour(target, table) if target is not None else \
        behaviour("transformers", "5.0", table=table)
    findings: list[Finding] = []
    where = f"{checkpoint.source}/config.json" if checkpoint.config_path is None or \
        checkpoint.config_path.name != "config.json" else str(checkpoint.config_path)
    findings += _formats_findings(config, where, lock=lock, ct_formats=ct_formats,
                                  ct_version=ct_version, index_urls=index_urls)
    findings += _gate_finding(q, beh, target)
    index = index or NameIndex(checkpoint.module_names)
    entries = ignore_entries(config)
    matcher = beh.value("ignore_matcher")
    if matcher is None and beh.engine in table.engines:
        findings.append(Finding("ignore-parent", "warning",
                                f"{_engine_label(beh)}: how it matches the ignore list is not "
                                f"recorded; judged as substring matching (the worst case)",
                                hint="record it in images/checks/engines.yaml"))
    ana = analyze_ignore(entries, index, checkpoint.quantized, matcher or "substring")
    findings += _ignore_findings(ana, beh, target, None)
    ctx = _Ctx(index, checkpoint.quantized, entries)
    fused, fused_fix = _fused_findings(checkpoint, ctx, q, beh, table, target)
    findings += fused
    findings += _w4a4_findings(checkpoint, q, beh, target, catalog)
    if analysis_out is not None:
        analysis_out.update(ignore=ana, index=index, behaviour=beh,
                            packed=fused_fix.get("packed") or {},
                            add_ignore=fused_fix.get("ignore") or ())
    order = {s: i for i, s in enumerate(SEVERITIES)}
    return sorted(findings, key=lambda f: order.get(f.severity, 9))


# --- the command -----------------------------------------------------------------------------

@dataclass(frozen=True)
class Report:
    source: str
    target: str
    behaviour: Behaviour
    checkpoint: Checkpoint = field(repr=False)
    findings: tuple[Finding, ...]
    compressed_tensors: str | None = None
    fix: FixResult | None = None
    analysis: IgnoreAnalysis | None = None

    @property
    def errors(self) -> list[Finding]:
        return [f for f in self.findings if f.severity == "error"]

    @property
    def exit_code(self) -> int:
        """1 when an error remains that the written fix does not address, else 0."""
        fixed = {"ignore-parent"} if self.fix and self.fix.out else set()
        errors = self.errors
        if self.fix and self.fix.out and (self.fix.packed_added or self.fix.ignore_added):
            # a fused-layer error the fix settles: its layers are now listed, or mapped
            done = set(self.fix.ignore_added)
            errors = [f for f in errors if not (f.kind == "fused-projection" and (
                set(f.examples) <= done or self.fix.packed_added))]
        return 1 if any(f.kind not in fixed for f in errors) else 0

    def to_dict(self) -> dict[str, Any]:
        c = self.checkpoint
        return {"checkpoint": self.source, "target": self.target,
                "architecture": c.architecture, "names_from": c.names_from,
                "modules": len(c.module_names), "quantized_modules": len(c.quantized),
                "compressed_tensors": self.compressed_tensors,
                "engine": self.behaviour.to_dict(),
                "ignore": self.analysis.to_dict() if self.analysis else None,
                "findings": [f.to_dict() for f in self.findings],
                "fix": self.fix.to_dict() if self.fix else None,
                "exit_code": self.exit_code}


def resolve_checkpoint(path_or_alias: str, catalog: Catalog | None) -> Checkpoint:
    """A path or repo id, or a model alias from images/models/ (generated ones are made)."""
    p = Path(path_or_alias).expanduser()
    if not p.exists() and catalog is not None and path_or_alias in catalog.models:
        prof = catalog.model(path_or_alias)
        if prof.generated:
            from . import smokemodel
            from .plan import smoke_model_spec

            return load_checkpoint(smokemodel.ensure(smoke_model_spec(prof)))
        return load_checkpoint(prof.checkpoint)
    return load_checkpoint(path_or_alias)


def check_model(path_or_alias: str, target_name: str, catalog: Catalog, lock_dir: Path,
                fix_out: str | Path | None = None, *, engines: EngineTable | None = None,
                ct_formats: Iterable[str] | None = None) -> Report:
    """`imgbuild check-model PATH|ALIAS --target T [--fix OUT]`: the report (render it with
    `render`, serialize with `Report.to_dict`; exit with `Report.exit_code`)."""
    from . import wheels
    from .lock import read_lock
    from .plan import lock_request

    target = catalog.target(target_name)
    table = engines or load_engines(catalog.root)
    ckpt = resolve_checkpoint(path_or_alias, catalog)
    lock = None
    req = lock_request(catalog, target)
    lock_path = Path(lock_dir) / req.filename()
    if lock_path.is_file():
        lock = read_lock(lock_path)
    ct = lock.package("compressed-tensors") if lock is not None else None
    extra: dict[str, Any] = {}
    findings = check(ckpt, target=target, catalog=catalog, lock=lock, engines=table,
                     ct_formats=ct_formats, index_urls=wheels.index_urls(req.extra_index_urls),
                     analysis_out=extra)
    if lock is None and ct_formats is None:
        findings = [f for f in findings if f.kind != "format"] + [Finding(
            "format", "info", f"no lock for {target.name}: formats not checked against its "
            f"compressed-tensors", (f"looked for {lock_path}",),
            f"run `imgbuild lock {target.name}`")]
    result = None
    if fix_out is not None:
        ana: IgnoreAnalysis = extra["ignore"]
        if not ana.names_known:
            raise InputError("--fix needs module names, and this checkpoint has none",
                             facts=[f"{ckpt.source}: no model.safetensors.index.json or "
                                    f".safetensors beside config.json"],
                             hint="run check-model on the checkpoint directory")
        result = fix(ckpt.config, extra["index"], "substring", quantized=ckpt.quantized,
                     packed=extra["packed"] or None, add_ignore=extra["add_ignore"])
        text = ckpt.config_text if ckpt.config_text is not None else \
            json.dumps(ckpt.config, indent=2) + "\n"
        result = write_fix(result, fix_out, text)
        findings = [replace(f, hint=f"the corrected config.json is at {result.out} (the "
                            f"original is {result.orig})") if f.kind == "ignore-parent"
                    and f.severity == "error" else f for f in findings]
    return Report(ckpt.source, target.name, extra["behaviour"], ckpt, tuple(findings),
                  ct.version if ct else None, result, extra["ignore"])


def render(report: Report, console=None) -> None:
    """Human output (rich): what was read, the engine's behaviours, findings uv-style, the fix."""
    from rich.console import Console
    from rich.table import Table
    from rich.text import Text

    console = console or Console()
    c, b = report.checkpoint, report.behaviour
    head = Table(show_header=False, box=None, pad_edge=False)
    head.add_row("checkpoint", report.source)
    head.add_row("architecture", c.architecture or "?")
    head.add_row("modules", f"{len(c.module_names)} ({len(c.quantized)} quantized)"
                 + (f", from {c.names_from}" if c.names_from else ", no tensor names"))
    head.add_row("target", f"{report.target}: {_engine_label(b)}"
                 + (f", compressed-tensors {report.compressed_tensors}"
                    if report.compressed_tensors else ""))
    for name, f in b.facts.items():
        v = f.value or "unknown"
        if f.patched_by:
            v += f" (patched by {f.patched_by}; was {f.base_value})"
        head.add_row(name.replace("_", " "), v)
    console.print(head)
    styles = {"error": "bold red", "warning": "bold yellow", "info": "bold blue"}
    for f in report.findings:
        lines = f.lines()
        t = Text()
        t.append(f.severity + ":", style=styles.get(f.severity, ""))
        t.append(" " + f.message)
        console.print(t)
        for ln in lines[1:]:
            if ln.startswith("  help:"):
                t = Text("  ")
                t.append("help:", style="bold green")
                t.append(ln[len("  help:"):])
                console.print(t)
            else:
                console.print(Text(ln))
        for ex in f.examples:
            console.print(Text("      " + ex, style="dim"))
    if report.fix is not None:
        fx = report.fix
        p = fx.proof
        console.print(Text(f"fix: {len(fx.replaced)} entries -> {len(fx.added)} `re:` "
                           f"expressions; wrote {fx.out} (original: {fx.orig}"
                           f"{', kept from before' if fx.orig_kept else ''})", style="bold"))
        if p is not None:
            t = Table("ignored set", "modules", title="proof (over "
                      f"{p.modules} module names)", title_justify="left")
            t.add_row("original, exact matching (intended)", str(p.intended))
            t.add_row("fixed, exact matching", str(p.exact))
            t.add_row("fixed, dotted-suffix matching", str(p.suffix))
            t.add_row("fixed, substring matching", str(p.substring))
            t.add_row("quantized modules hidden before -> after",
                      f"{p.hidden_before} -> {p.hidden_after}")
            console.print(t)
            console.print(Text("equal: yes" if p.equal else "equal: NO", style="green"
                               if p.equal else "red"))
        if fx.unignored:
            console.print(Text(f"note: {len(fx.unignored)} modules with plain weights (e.g. "
                               f"{fx.unignored[0]}) were ignored only through the replaced "
                               f"entries; the engine now applies the config groups' targets to "
                               f"them, as compressed-tensors did when it wrote the checkpoint",
                               style="yellow"))
        if fx.ignore_added:
            console.print(Text(f"added {len(fx.ignore_added)} fused layer names to ignore "
                               f"(e.g. {fx.ignore_added[0]})"))
        if fx.packed_added:
            console.print(Text("added packed_modules_mapping: " + json.dumps(
                {k: list(v) for k, v in fx.packed_added.items()})))
    if not report.findings:
        console.print(Text(f"ok: nothing in config.json that {_engine_label(b)} would "
                           f"mishandle", style="green"))
