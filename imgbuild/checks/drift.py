"""Cross-package API drift: does the locked provider define every symbol its consumers use?

The case that motivates it (DESIGN.md): SGLang refers to
`CompressionFormat.nvfp4_pack_quantized` without declaring a minimum compressed-tensors; vLLM
0.6.6 pins `compressed-tensors==0.8.1`, which lacks it. The resolver is satisfied, the image
builds, and the server dies at model load. Every fact needed to predict this is in the wheels,
so this module reads them (imgbuild/lock/wheels.py: download or Range-read, never install, never
import) and compares:

- every `<Family>.<member>` a locked consumer's source refers to, against the members the
  locked provider's class defines (parsed with `ast`);
- every format a model declares (top level and each config group), against the enum's values.

A finding names the symbol, the consumer file and line, the locked provider version and the
first released version that has the symbol. Families are data (images/checks/drift.yaml):
adding a (provider, symbol family) pair needs no code.
"""

from __future__ import annotations

import ast
import bisect
import io
import json
import re
import threading
import tokenize
from collections.abc import Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any, NamedTuple

from packaging.requirements import InvalidRequirement, Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

from ..catalog.families import SymbolFamily
from ..catalog.models import ModelProfile
from ..errors import ImgbuildError, JobFailed
from ..fsutil import atomic_write_text
from ..lock import wheels
from ..lock.lockfile import LockedPackage, Lockfile

FIRST_VERSION_WORKERS = 8

# --- results -------------------------------------------------------------------------------

class Reference(NamedTuple):
    symbol: str
    file: str  # path inside the consumer wheel
    line: int
    code: str  # the line, stripped


@dataclass(frozen=True)
class Definition:
    """The provider's class as one version defines it."""

    provider: str
    version: str
    file: str | None  # wheel path of the class; None: no such class in this version
    members: dict[str, str | None] = field(hash=False)  # member -> value (None: not a string)

    @property
    def values(self) -> set[str]:
        return {v for v in self.members.values() if v is not None}


@dataclass(frozen=True)
class Finding:
    family: str
    symbol: str  # member name (source "engine") or format value (source "model")
    consumer: str
    consumer_version: str
    file: str  # consumer wheel path, or where the model declares the format
    line: int | None
    code: str
    provider: str
    provider_version: str
    first_version: str | None  # first release of the provider that has it; None: none has
    source: str  # "engine" | "model"
    also: tuple[str, ...] = ()  # other places in the consumer ("file:line")
    required_by: tuple[str, ...] = ()  # why the provider is at this version (from the lock)
    defined_in: str | None = None  # provider file that defines the class
    target: str = ""

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


# --- reading the provider: members, without importing --------------------------------------

def _literal(node: ast.expr | None) -> str | None:
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    return None


def _class_members(tree: ast.Module, family: SymbolFamily) -> dict[str, str | None] | None:
    """Members of the first class named like the family's, or None if the module has none."""
    for node in ast.walk(tree):
        if not (isinstance(node, ast.ClassDef) and node.name == family.class_name):
            continue
        out: dict[str, str | None] = {}
        for stmt in node.body:
            if isinstance(stmt, ast.Assign):
                for t in stmt.targets:
                    if isinstance(t, ast.Name):
                        out[t.id] = _literal(stmt.value)
            elif isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name):
                if stmt.value is not None or family.kind == "class":
                    out[stmt.target.id] = _literal(stmt.value)
            elif family.kind == "class" and isinstance(
                    stmt, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                out[stmt.name] = None
        if family.kind == "enum":
            # Enum: _sunder_ and __dunder__ names are configuration, not members.
            out = {k: v for k, v in out.items() if not k.startswith("_")}
        return out
    return None


def _class_members_text(text: str, family: SymbolFamily) -> dict[str, str | None] | None:
    """Fallback for a module this Python cannot parse (newer syntax): the class body's
    `NAME = "value"` lines, read by indentation."""
    m = re.search(rf"^class\s+{re.escape(family.class_name)}\b.*?:\s*$", text, re.M)
    if not m:
        return None
    out: dict[str, str | None] = {}
    for line in text[m.end():].splitlines()[1:]:
        if line.strip() and not line[:1].isspace():
            break
        a = re.match(r"^\s{4}([A-Za-z_]\w*)\s*(?::[^=]+)?=\s*(?:(['\"])(.*?)\2)?", line)
        if a and not (family.kind == "enum" and a.group(1).startswith("_")):
            out[a.group(1)] = a.group(3) if a.group(2) else None
    return out


def _parse_definition(text: str, family: SymbolFamily) -> dict[str, str | None] | None:
    try:
        return _class_members(ast.parse(text), family)
    except SyntaxError:
        return _class_members_text(text, family)


def definition(wheel: wheels.Wheel, family: SymbolFamily) -> Definition:
    """The family's class in a provider wheel: the listed modules first, then every .py."""
    names = set(wheel.names())
    for mod in family.modules:
        if mod in names:
            mem = _parse_definition(wheel.read_text(mod), family)
            if mem is not None:
                return Definition(wheel.name, wheel.version, mod, mem)
    # Moved (or never listed): search the whole package for the class statement.
    pat = re.compile(rb"^\s*class\s+" + re.escape(family.class_name.encode()) + rb"\b", re.M)
    for name, data in wheels.iter_py(wheel):
        if name not in family.modules and pat.search(data):
            mem = _parse_definition(data.decode("utf-8", "replace"), family)
            if mem is not None:
                return Definition(wheel.name, wheel.version, name, mem)
    return Definition(wheel.name, wheel.version, None, {})


def members(wheel: wheels.Wheel, family: SymbolFamily) -> set[str]:
    """Member names of the family's class in a provider wheel (empty: no such class)."""
    return set(definition(wheel, family).members)


def values(wheel: wheels.Wheel, family: SymbolFamily) -> set[str]:
    """String values of the family's enum in a provider wheel (what checkpoints declare)."""
    return definition(wheel, family).values


# --- scanning the consumer -----------------------------------------------------------------

def _excluded_spans(text: str, starts: list[int]) -> list[tuple[int, int]]:
    """Offsets of comments and plain (non-f) string literals: a name there is not executed.

    Tokenizing is slow next to a regex, so it runs only on files with a match.
    """
    spans: list[tuple[int, int]] = []

    def off(pos: tuple[int, int]) -> int:
        return starts[pos[0] - 1] + pos[1]

    try:
        for tok in tokenize.generate_tokens(io.StringIO(text).readline):
            if tok.type == tokenize.COMMENT:
                spans.append((off(tok.start), off(tok.end)))
            elif tok.type == tokenize.STRING:
                prefix = re.match(r"[A-Za-z]*", tok.string).group(0).lower()
                if "f" not in prefix:
                    spans.append((off(tok.start), off(tok.end)))
    except (tokenize.TokenError, SyntaxError, IndexError):
        # Source this Python cannot tokenize (newer f-string syntax): drop whole-line
        # comments only, which is what matters in practice.
        spans = []
        for m in re.finditer(r"^[ \t]*#.*$", text, re.M):
            spans.append((m.start(), m.end()))
    return spans


def scan_text(text: str, file: str, family: SymbolFamily) -> list[Reference]:
    """References to the family in one source file, outside comments and docstrings."""
    rx = family.regex
    matches = [m for m in rx.finditer(text)
               if not m.group(1).startswith("_") and m.group(1) not in family.ignore]
    if not matches:
        return []
    starts = [0] + [m.end() for m in re.finditer("\n", text)]
    spans = _excluded_spans(text, starts)
    out = []
    for m in matches:
        pos = m.start()
        if any(s <= pos < e for s, e in spans):
            continue
        line = bisect.bisect_right(starts, pos)
        end = starts[line] - 1 if line < len(starts) else len(text)
        out.append(Reference(m.group(1), file, line, text[starts[line - 1]:end].strip()[:200]))
    return out


def scan(wheel: wheels.Wheel, family: SymbolFamily) -> list[Reference]:
    """Every reference to the family in a consumer wheel's .py files."""
    needle = family.needle.encode() if family.needle else None
    out: list[Reference] = []
    for name, data in wheels.iter_py(wheel):
        if needle is not None and needle not in data:
            continue
        out += scan_text(data.decode("utf-8", "replace"), name, family)
    return out


# --- caches --------------------------------------------------------------------------------
# Released files do not change (an index may not replace a file under the same name), so what
# was read from a (package, version) or a sha256 is kept; a second check needs no network.

_cache_lock = threading.Lock()


def _cache_dir() -> Path:
    return wheels.cache_root() / "drift"


def _json_get(name: str, key: str) -> Any:
    p = _cache_dir() / name
    with _cache_lock:
        try:
            return json.loads(p.read_text()).get(key)
        except (OSError, ValueError):
            return None


def _json_put(name: str, key: str, value: Any) -> None:
    p = _cache_dir() / name
    with _cache_lock:
        try:
            doc = json.loads(p.read_text())
        except (OSError, ValueError):
            doc = {}
        doc[key] = value
        atomic_write_text(p, json.dumps(doc, sort_keys=True, indent=0))


def _defn_key(provider: str, version: str, family: SymbolFamily) -> str:
    return f"{provider}=={version}|{family.class_name}|{family.fingerprint()}"


def _cached_definition(provider: str, version: str, family: SymbolFamily) -> Definition | None:
    d = _json_get("members.json", _defn_key(provider, version, family))
    return Definition(provider, version, d["file"], d["members"]) if d else None


def _store_definition(d: Definition, family: SymbolFamily) -> None:
    _json_put("members.json", _defn_key(d.provider, d.version, family),
              {"file": d.file, "members": d.members})


@dataclass(frozen=True)
class _Ctx:
    urls: tuple[str, ...]
    python: str | None
    platform: str | None
    mode: str


def _locked_definition(pkg: LockedPackage, family: SymbolFamily, ctx: _Ctx) -> Definition:
    d = _cached_definition(pkg.name, pkg.version, family)
    if d is None:
        with wheels.fetch_locked(pkg, ctx.urls, python=ctx.python, platform=ctx.platform,
                                 mode=ctx.mode) as w:
            d = definition(w, family)
        d = Definition(pkg.name, pkg.version, d.file, d.members)
        _store_definition(d, family)
    return d


def _locked_scan(pkg: LockedPackage, family: SymbolFamily, ctx: _Ctx) -> list[Reference]:
    # Keyed by each locked hash: all of a version's wheels carry the same Python source, and
    # a hit on any of them spares the index lookup too.
    fp = family.fingerprint()
    for h in pkg.hashes:
        hit = _json_get("scans.json", f"{h}|{fp}")
        if hit is not None:
            return [Reference(*r) for r in hit]
    with wheels.fetch_locked(pkg, ctx.urls, python=ctx.python, platform=ctx.platform,
                             mode=ctx.mode) as w:
        refs = scan(w, family)
        sha = w.sha256
    key = f"sha256:{sha}" if sha else pkg.hashes[0]
    _json_put("scans.json", f"{key}|{fp}", [list(r) for r in refs])
    return refs


def _version_definition(family: SymbolFamily, version: str, urls: tuple[str, ...]) -> Definition:
    d = _cached_definition(family.provider, version, family)
    if d is None:
        with wheels.fetch_version(family.provider, version, urls) as w:
            d = definition(w, family)
        d = Definition(family.provider, version, d.file, d.members)
        _store_definition(d, family)
    return d


def first_version(family: SymbolFamily, symbol: str, *, by: str = "member",
                  index_urls: Sequence[str] = ()) -> str | None:
    """The first released provider version whose class has `symbol`, or None.

    by="member": a member name (what engine source refers to); by="value": an enum value
    (what a checkpoint declares). Releases are scanned in ascending order (pre-releases and
    yanked files left out), a few at a time in parallel; each version's members are cached,
    and so is the answer once found (a later release cannot change which came first).
    """
    urls = tuple(index_urls) or wheels.default_index_urls()
    key = f"{family.provider}|{family.class_name}|{family.fingerprint()}|{by}|{symbol}"
    hit = _json_get("first.json", key)
    if hit:
        return hit

    def has(d: Definition) -> bool:
        return symbol in (d.members if by == "member" else d.values)

    versions = [str(v) for v in wheels.list_versions(family.provider, urls)]
    with ThreadPoolExecutor(FIRST_VERSION_WORKERS) as pool:
        for i in range(0, len(versions), FIRST_VERSION_WORKERS):
            batch = versions[i:i + FIRST_VERSION_WORKERS]
            for v, d in zip(batch, pool.map(lambda v: _version_definition(family, v, urls),
                                            batch)):
                if has(d):
                    _json_put("first.json", key, v)
                    return v
    return None


# --- who put the provider at this version --------------------------------------------------

def via(lock: Lockfile, name: str) -> list[str]:
    """The `# via` annotations uv wrote under a package in the lock body."""
    n = canonicalize_name(name)
    out: list[str] = []
    inside = False
    for line in lock.body.splitlines():
        pin = re.match(r"^([A-Za-z0-9][A-Za-z0-9._-]*)==", line)
        if pin:
            if inside:
                break
            inside = canonicalize_name(pin.group(1)) == n
            continue
        if not inside:
            continue
        m = re.match(r"^\s+#\s+via(?:\s+(.*))?$", line)
        if m:
            if m.group(1):
                out.append(_readable_via(m.group(1).strip(), lock))
            continue
        m = re.match(r"^\s+#\s{2,}(\S.*)$", line)
        if m:
            out.append(_readable_via(m.group(1).strip(), lock))
    return out


def _readable_via(text: str, lock: Lockfile) -> str:
    """uv names the overrides file it was given; the user wrote the override in the target."""
    if text.startswith("--override"):
        return f"an override in images/{lock.target}.yaml"
    if text.startswith("-r ") or text == "requirements.in":
        return f"images/{lock.target}.yaml"
    return text


def _requirement_on(meta: dict[str, list[str]], provider: str) -> str | None:
    for text in meta.get("Requires-Dist", []):
        try:
            req = Requirement(text)
        except InvalidRequirement:
            continue
        if canonicalize_name(req.name) == provider and not (
                req.marker and "extra" in str(req.marker)):
            return str(req.specifier) or ""
    return None


def _required_by(lock: Lockfile, provider: str, urls: tuple[str, ...]) -> tuple[str, ...]:
    out = []
    for who in via(lock, provider):
        if who.startswith("-r ") or who.startswith("-c "):
            out.append(f"the target's requirements ({who[3:]})")
            continue
        name = who.split()[0]
        pkg = lock.package(name)
        if pkg is None:
            out.append(who)
            continue
        spec = None
        try:
            spec = _requirement_on(wheels.fetch_metadata(pkg, urls), provider)
        except ImgbuildError:
            pass  # the explanation loses a detail, the finding stands
        if spec is None:
            out.append(f"{pkg.name}=={pkg.version}")
        else:
            out.append(f"{pkg.name}=={pkg.version} requires {provider}{spec or ' (any version)'}")
    return tuple(out)


# --- the check -----------------------------------------------------------------------------

def _lock_header(lock: Lockfile) -> tuple[str | None, str | None]:
    python = platform = None
    try:
        for line in lock.path.read_text().splitlines():
            if not line.startswith("#"):
                break
            if line.startswith("# python: "):
                python = line.split(": ", 1)[1].strip()
            elif line.startswith("# platform: "):
                platform = line.split(": ", 1)[1].strip()
    except OSError:
        pass
    return python, platform


def profile_formats(profile: ModelProfile,
                    families: Iterable[SymbolFamily]) -> list[tuple[str, str]]:
    """(where, format) pairs a model profile declares, if a family checks its quant method."""
    methods = {f.model_quant_method for f in families if f.model_quant_method}
    if profile.quant_method not in methods:
        return []
    # Formats read from the checkpoint are its config.json's, not the profile's to fix.
    where = (f"{profile.path}: checkpoint {profile.checkpoint}: config.json formats"
             if profile.quant_from_checkpoint else f"{profile.path}: quantization.formats")
    return [(f"{where}[{i}]", fmt) for i, fmt in enumerate(profile.quant_formats)]


def checkpoint_formats(config: dict[str, Any], where: str = "config.json") -> list[tuple[str, str]]:
    """(where, format) pairs a checkpoint's config.json declares: top level and each group."""
    q = config.get("quantization_config") or config.get("compression_config") or {}
    out: list[tuple[str, str]] = []
    if not isinstance(q, dict):
        return out
    if isinstance(q.get("format"), str):
        out.append((f"{where}: quantization_config.format", q["format"]))
    groups = q.get("config_groups") or {}
    if isinstance(groups, dict):
        for g, gc in groups.items():
            if isinstance(gc, dict) and isinstance(gc.get("format"), str):
                out.append((f"{where}: quantization_config.config_groups.{g}.format",
                            gc["format"]))
    return out


def check(lock: Lockfile, families: Iterable[SymbolFamily], *,
          model_formats: Sequence[tuple[str, str]] = (), index_urls: Sequence[str] = (),
          mode: str = "auto") -> list[Finding]:
    """Findings for a lock: consumer references and model formats the provider lacks.

    index_urls: indexes to read wheels from, in order; empty means the default index
    (UV_DEFAULT_INDEX / UV_INDEX_URL / PIP_INDEX_URL / PyPI). For a target with extra indexes
    pass `wheels.index_urls(lock_request(cat, target).extra_index_urls)`.
    model_formats: (where, format) pairs, e.g. from `profile_formats` or `checkpoint_formats`;
    checked against families that declare a model quant method.
    A family whose provider is not locked is skipped, and so is a consumer not in the lock.
    """
    python, platform = _lock_header(lock)
    ctx = _Ctx(tuple(index_urls) or wheels.default_index_urls(), python, platform, mode)
    findings: list[Finding] = []
    for fam in families:
        prov = lock.package(fam.provider)
        if prov is None:
            continue
        consumers = [p for c in fam.consumers if (p := lock.package(c)) is not None]
        formats = list(model_formats) if fam.model_quant_method else []
        if not consumers and not formats:
            continue
        d = _locked_definition(prov, fam, ctx)
        raw: list[Finding] = []
        for c in consumers:
            by_symbol: dict[str, list[Reference]] = {}
            for r in _locked_scan(c, fam, ctx):
                by_symbol.setdefault(r.symbol, []).append(r)
            for sym, refs in by_symbol.items():
                if sym in d.members:
                    continue
                r0 = refs[0]
                raw.append(Finding(fam.name, sym, c.name, c.version, r0.file, r0.line, r0.code,
                                   prov.name, prov.version, None, "engine",
                                   also=tuple(f"{r.file}:{r.line}" for r in refs[1:]),
                                   defined_in=d.file, target=lock.target))
        engine = consumers[0] if consumers else None
        for where, fmt in formats:
            if fmt in d.values:
                continue
            raw.append(Finding(fam.name, fmt, engine.name if engine else "model",
                               engine.version if engine else "", where, None,
                               f"format: {fmt}", prov.name, prov.version, None, "model",
                               defined_in=d.file, target=lock.target))
        if not raw:
            continue
        req_by = _required_by(lock, prov.name, ctx.urls)
        firsts: dict[tuple[str, str], str | None] = {}
        for f in raw:
            by = "member" if f.source == "engine" else "value"
            if (by, f.symbol) not in firsts:
                firsts[(by, f.symbol)] = first_version(fam, f.symbol, by=by, index_urls=ctx.urls)
            findings.append(replace(f, first_version=firsts[(by, f.symbol)], required_by=req_by))
    return findings


# --- explaining ----------------------------------------------------------------------------

def _story(f: Finding) -> tuple[str, list[str], str]:
    """(headline, facts, way out) for one finding."""
    sym = f"{f.family}.{f.symbol}"
    pinned = f"the lock pins {f.provider} {f.provider_version}"
    if f.required_by:
        pinned += " (required by " + "; ".join(f.required_by) + ")"
    if f.source == "engine":
        head = f"{f.consumer} {f.consumer_version} refers to {sym}, which {f.provider} " \
               f"{f.provider_version} does not have"
        where = f"{f.consumer} {f.consumer_version} refers to {sym} at {f.file}:{f.line}"
        if f.also:
            where += f" (and {len(f.also)} more place{'s' if len(f.also) > 1 else ''})"
        facts = [where + (f": {f.code}" if f.code else ""), pinned]
        if f.defined_in is None:
            facts.append(f"{f.provider} {f.provider_version} defines no class {f.family} at all")
        has = f"{f.provider} has {sym}"
        fails = (f"so {f.consumer} fails when it reaches that line (at import or model load, "
                 f"after the model download) with: AttributeError: type object "
                 f"'{f.family}' has no attribute '{f.symbol}'")
    else:
        head = f"the model declares format '{f.symbol}', which {f.provider} " \
               f"{f.provider_version}'s {f.family} does not have"
        facts = [f"{f.file}: '{f.symbol}'", pinned]
        has = f"{f.provider} has {f.family}('{f.symbol}')"
        fails = (f"so {f.consumer} cannot load this checkpoint: ValueError: '{f.symbol}' "
                 f"is not a valid {f.family}")
    if f.first_version:
        facts.append(f"{has} from {f.first_version} on")
    else:
        facts.append(f"no released {f.provider} has it (newest checked: the index's latest)")
    facts.append(fails)
    pinners = [r.split("==")[0] for r in f.required_by if "==" in r and r.split("==")[0]
               not in (f.consumer,)]
    agree = f"or pick versions of {', '.join([f.consumer] + pinners)} that agree"
    yaml = f"images/{f.target}.yaml" if f.target else "the target's yaml"
    if f.first_version:
        why = (f"{f.consumer} uses {sym}" if f.source == "engine"
               else f"the model's checkpoint declares format {f.symbol}")
        out = (f"add an override to {yaml}: requirement '{f.provider}>={f.first_version}' with "
               f"a reason ('{why}, added in {f.provider} {f.first_version}'), "
               f"then `imgbuild lock {f.target or 'TARGET'}`; {agree}")
    elif f.source == "engine":
        out = f"pick a {f.consumer} version that does not use {sym}, {agree}"
    else:
        out = f"this checkpoint needs a {f.provider} newer than any released; use another model"
    return head, facts, out


def _summary(findings: Sequence[Finding]) -> list[str]:
    """One override per provider covers every finding: the highest first version."""
    out = []
    for prov in dict.fromkeys(f.provider for f in findings):
        fs = [f for f in findings if f.provider == prov]
        firsts = [f.first_version for f in fs if f.first_version]
        if len(fs) < 2 or not firsts:
            continue
        need = max(firsts, key=Version)
        syms = ", ".join(dict.fromkeys(f.symbol for f in fs))
        out.append(f"{len(fs)} findings for {prov} {fs[0].provider_version} ({syms}); "
                   f"one override covers them all: '{prov}>={need}'")
    return out


def explain(findings: Sequence[Finding]) -> list[str]:
    """Human lines, uv style: per finding a headline, the chain of facts, and a way out."""
    lines: list[str] = []
    for f in findings:
        head, facts, out = _story(f)
        lines.append(f"error: {head}")
        for i, fact in enumerate(facts):
            lines.append(("  ╰─▶ " if i == len(facts) - 1 else "  ├─▶ ") + fact)
        lines.append(f"  help: {out}")
    lines += [f"help: {x}" for x in _summary(findings)]
    return lines


def as_error(findings: Sequence[Finding]) -> JobFailed | None:
    """One JobFailed (exit 1) for the CLI's error printer, or None when there is nothing."""
    if not findings:
        return None
    if len(findings) == 1:
        head, facts, out = _story(findings[0])
        return JobFailed(head, facts=facts, hint=out)
    facts: list[str] = []
    for f in findings:
        head, fs, _ = _story(f)
        facts += [head] + ["  " + x for x in fs[:-1]]
    summary = _summary(findings)
    _, _, out = _story(findings[0])
    return JobFailed(f"{len(findings)} symbols the locked environment lacks", facts=facts,
                     hint=summary[0] if summary else out)
