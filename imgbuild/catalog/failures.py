"""Known failures (images/checks/failures.yaml): how each shows in a server log (regular
expressions, with the literal every matching line contains), what it captures, the cause and
the fix in plain words templated with the captures, and where the engine prints it."""

from __future__ import annotations

import json
import re
import string
import sys
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from packaging.requirements import InvalidRequirement, Requirement
from packaging.specifiers import InvalidSpecifier, SpecifierSet

from ..errors import SpecError
from .schema import Doc, read_table

# Relative to images/: images/*.yaml are all read as targets, so checks live one level down.
FAILURE_FILE = "checks/failures.yaml"
SEVERITIES = ("error", "warning")
BUILTINS = ("occurrences", "ranks")  # template names doctor fills in itself
_ID = re.compile(r"^[a-z0-9]+(?:-[a-z0-9]+)*$")
_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")



# --- the fingerprints (data) -------------------------------------------------------------------

@dataclass(frozen=True)
class Pattern:
    """One regular expression, and the literal that every line it can match contains."""

    regex: re.Pattern[str]
    contains: str | None
    before: int = 0  # for context patterns: how far around the matched line to look
    after: int = 0
    role: str = "match"  # how the evidence line is labelled

    @property
    def names(self) -> frozenset[str]:
        return frozenset(self.regex.groupindex)


@dataclass(frozen=True)
class Alternative:
    """One way a failure shows: a line, and possibly lines that must be near it."""

    line: Pattern
    near: tuple[Pattern, ...] = ()
    severity: str | None = None

    @property
    def specificity(self) -> int:
        return 1 + len(self.near)

    @property
    def names(self) -> frozenset[str]:
        out = set(self.line.names)
        for p in self.near:
            out |= p.names
        return frozenset(out)


@dataclass(frozen=True)
class Derived:
    """A capture computed from others: a template, or a table looked up by one capture."""

    name: str
    template: str | None = None
    source: str | None = None  # the capture looked up in `table`
    table: tuple[tuple[str, str], ...] = ()
    default: str = ""

    def value(self, values: Mapping[str, str]) -> str:
        if self.template is not None:
            return self.template.format_map(Blank(values))
        return dict(self.table).get(values.get(self.source or "", ""), self.default)

    def given(self, values: Mapping[str, str], given: frozenset[str] | set[str]) -> bool:
        """The value comes from the log: every input did, and a table had the one looked up
        (its `default` is a phrase standing in for a value, not one)."""
        if self.template is not None:
            return all(n in given for n in _fields(self.template))
        return self.source in given and values.get(self.source) in dict(self.table)


@dataclass(frozen=True)
class Source:
    """Where a message text comes from: a file (and line) inside a released wheel."""

    requirement: str  # "sglang==0.5.16"
    at: str  # "sglang/srt/.../utils.py:132"

    def __str__(self) -> str:
        return f"{self.requirement} {self.at}"


@dataclass(frozen=True)
class LogPrefix:
    """How an engine starts its log lines; groups named rank... give the TP rank. A prefix
    that only one engine writes names it (`engine`): the log is that engine's."""

    name: str
    regex: re.Pattern[str]
    engine: str | None = None
    # Set when programs other than the engine write the same prefix (a bracketed timestamp is
    # any Python logging config's): why it is only a hint. A log whose only sign of an engine
    # is such a prefix was *probably* written by it, and doctor says so, never as a fact.
    generic: str | None = None


@dataclass(frozen=True)
class Sign:
    """A line that shows which engine wrote a log (a traceback frame in its package, its
    banner); `version` captured where the line says it. Heavier signs outvote lighter ones:
    an engine's entry point outweighs a frame of a library it imports."""

    regex: re.Pattern[str]
    contains: str
    weight: int = 1


@dataclass(frozen=True)
class Engine:
    """A serving engine doctor can tell from its log: its name (as in applies_to) and signs."""

    name: str
    title: str  # as people write it: "SGLang", "vLLM"
    signs: tuple[Sign, ...]


@dataclass(frozen=True)
class Fingerprint:
    id: str
    title: str
    severity: str
    alternatives: tuple[Alternative, ...]
    cause: str
    fix: str
    derive: tuple[Derived, ...] = ()
    defaults: tuple[tuple[str, str], ...] = ()
    dedupe_by: tuple[str, ...] | None = None  # None: all captures
    supersedes: tuple[str, ...] = ()
    applies_to: tuple[tuple[str, str], ...] = ()  # (package, PEP 440 specifier; "" = any)
    # The engines whose code prints this failure's text, with their version ranges: an engine
    # named in applies_to. Empty: any engine (torch's, CUDA's, the OS's own messages).
    sources: tuple[Source, ...] = ()
    examples: tuple[str, ...] = ()
    path: str = ""  # the file it was read from, for messages
    engines: tuple[tuple[str, str], ...] = ()
    # Lines around the matched one that may give a value the matched line does not (the port
    # a server announced before it failed to bind it): looked for only when it is missing.
    around: tuple[Pattern, ...] = ()


class Blank(dict):
    """format_map values: a capture an alternative left unset renders as nothing."""

    def __missing__(self, key: str) -> str:
        return ""


# `[[with {value}||without]]` in a title, cause or fix: the first wording when the log gave
# every value it names, else the second (or nothing). It is how a sentence is written without
# a value the log does not give, instead of with a phrase standing in for it.
_SEGMENT = re.compile(r"\[\[(.*?)(?:\|\|(.*?))?\]\]", re.S)
_CODE = re.compile(r"`[^`]*`")


def _segments(template: str) -> list[tuple[str, str]]:
    """Each [[with||without]] segment of a template, as (with, without)."""
    return [(m.group(1), m.group(2) or "") for m in _SEGMENT.finditer(template)]


def _without(template: str) -> str:
    """The template as written when the log gives none of the optional values."""
    return _SEGMENT.sub(lambda m: m.group(2) or "", template)


def fill(template: str, values: Mapping[str, str], given: frozenset[str] | set[str]) -> str:
    """A title, cause or fix filled in: each [[with||without]] segment is its first wording
    when every value it names is in `given` (came from the log), else its second; then the
    {name} placeholders from `values` (an unset one renders as nothing)."""
    def choose(m: re.Match[str]) -> str:
        with_, without = m.group(1), m.group(2) or ""
        return with_ if all(n in given for n in _fields(with_)) else without
    text = _SEGMENT.sub(choose, template) if "[[" in template else template
    return text.format_map(Blank(values))


@dataclass(frozen=True)
class FailureCatalog:
    prefixes: tuple[LogPrefix, ...]
    fingerprints: tuple[Fingerprint, ...]
    outer: tuple[LogPrefix, ...] = ()  # a container runtime's or collector's, cut first
    engines: tuple[Engine, ...] = ()


FAILURE_KEYS = {"id", "title", "severity", "match", "derive", "defaults", "dedupe_by",
                "supersedes", "cause", "fix", "applies_to", "sources", "examples", "around"}
ALT_KEYS = {"regex", "contains", "near", "severity", "printed_by"}
NEAR_KEYS = {"regex", "contains", "before", "after", "role"}


def load_fingerprints(images: Path | str) -> tuple[Fingerprint, ...]:
    """Read and validate images/checks/failures.yaml; errors name the file, key and expectation."""
    return load_failures(images).fingerprints


def load_prefixes(images: Path | str) -> tuple[LogPrefix, ...]:
    """The log-line prefixes (SGLang's, vLLM's) that failures.yaml declares."""
    return load_failures(images).prefixes


def load_failures(images: Path | str | Sequence[Path]) -> FailureCatalog:
    """Read and validate images/checks/failures.yaml (the Workspace reads it once a command).

    Given several images/ directories (the catalog's layers, lowest first), their files add up:
    a higher layer's entry replaces a lower one's of the same id (or name), and the others
    follow the lower layer's, so a project adds a failure without copying the catalog's."""
    if isinstance(images, (str, Path)):
        doc = read_table(images, (FAILURE_FILE,), "failure fingerprints")
    else:
        roots = [Path(r) for r in images]
        docs = [read_table(r, (FAILURE_FILE,), "failure fingerprints") for r in roots
                if (r / FAILURE_FILE).is_file()]
        if not docs:
            read_table(roots[0], (FAILURE_FILE,), "failure fingerprints")  # says it is missing
        doc = docs[0]
        for upper in docs[1:]:
            doc = Doc(upper.path, _merged(doc.data, upper.data))
    return _parse_failures(doc)


def _merged(lower: Any, upper: Any) -> Any:
    if not isinstance(lower, dict) or not isinstance(upper, dict):
        return upper
    out = dict(lower)
    for key, items in upper.items():
        below = out.get(key)
        if not isinstance(items, list) or not isinstance(below, list):
            out[key] = items
            continue
        def ident(x: Any) -> Any:
            return (x.get("id") or x.get("name")) if isinstance(x, dict) else None
        mine = {ident(x) for x in items} - {None}
        out[key] = list(items) + [x for x in below if ident(x) not in mine]
    return out


def _parse_failures(doc: Doc) -> FailureCatalog:
    where = doc.path
    doc.reject_unknown({"outer_prefixes", "prefixes", "engines", "failures"})
    engines = []
    for i, raw in enumerate(doc.get("engines", list, [], what="a list of engines")):
        d = doc.sub(f"engines[{i}]", raw)
        d.reject_unknown({"name", "title", "signs"})
        signs = []
        for j, sraw in enumerate(d.get("signs", list, what="a list of {regex, contains}")):
            sd = d.sub(f"signs[{j}]", sraw)
            sd.reject_unknown({"regex", "contains", "weight"})
            pat = _pattern(sd, near=False)
            weight = sd.get("weight", int, 1, what="a weight of 1 or more")
            if weight < 1:
                raise SpecError(sd.path, sd.key("weight"), "a weight of 1 or more", weight)
            if set(pat.regex.groupindex) - {"version"}:
                raise SpecError(sd.path, sd.key("regex"), "no capture but (?P<version>...)",
                                sorted(pat.regex.groupindex))
            signs.append(Sign(pat.regex, pat.contains or "", weight))
        engines.append(Engine(d.get("name", str), d.get("title", str), tuple(signs)))
    names = {e.name for e in engines}
    outer, prefixes = [], []
    for key, into in (("outer_prefixes", outer), ("prefixes", prefixes)):
        for i, raw in enumerate(doc.get(key, list, [], what="a list of log prefixes")):
            d = doc.sub(f"{key}[{i}]", raw)
            d.reject_unknown({"name", "regex", "engine", "generic"})
            engine = d.get("engine", str, None)
            if engine is not None and engine not in names:
                raise SpecError(d.path, d.key("engine"), "the name of an engine under engines: ("
                                + (", ".join(sorted(names)) or "none is declared") + ")", engine)
            generic = d.get("generic", str, None,
                            what="why other programs write this prefix too, in words")
            if generic is not None and (not generic.strip() or engine is None):
                raise SpecError(d.path, d.key("generic"),
                                "a non-empty text, on a prefix that names its engine", generic)
            into.append(LogPrefix(d.get("name", str), _regex(d, "regex"), engine, generic))
    fps: list[Fingerprint] = []
    seen: dict[str, str] = {}
    raws = doc.get("failures", list, what="a list of failures")
    if not raws:
        raise SpecError(where, "failures", "at least one failure")
    for i, raw in enumerate(raws):
        fp = _parse_failure(doc.sub(f"failures[{i}]", raw), names)
        if fp.id in seen:
            raise SpecError(where, f"failures[{i}].id", f"a unique id ({seen[fp.id]} has it too)",
                            fp.id)
        seen[fp.id] = f"failures[{i}]"
        fps.append(fp)
    for i, fp in enumerate(fps):
        for j, other in enumerate(fp.supersedes):
            if other not in seen or other == fp.id:
                raise SpecError(where, f"failures[{i}].supersedes[{j}]",
                                "the id of another failure in this file", other)
    return FailureCatalog(tuple(prefixes), tuple(fps), tuple(outer), tuple(engines))


def _regex(d: Doc, key: str) -> re.Pattern[str]:
    text = d.get(key, str, what="a regular expression (Python syntax)")
    try:
        rx = re.compile(text)
    except re.error as e:
        raise SpecError(d.path, d.key(key), "a valid regular expression",
                        f"{text!r} ({e})") from None
    for name in rx.groupindex:
        if name in BUILTINS:
            raise SpecError(d.path, d.key(key), f"capture names other than {', '.join(BUILTINS)} "
                            "(doctor fills those in itself)", name)
    return rx


def _pattern(d: Doc, *, near: bool) -> Pattern:
    rx = _regex(d, "regex")
    what = ("a literal text every line the regex matches contains (lines without it are not "
            "searched)")
    contains = d.get("contains", str, ... if not near else None, what=what)
    if contains is not None and not contains:
        raise SpecError(d.path, d.key("contains"), "a non-empty text", contains)
    if not near:
        return Pattern(rx, contains)
    before = d.get("before", int, 0, what="a number of lines (0 or more)")
    after = d.get("after", int, 0, what="a number of lines (0 or more)")
    if before < 0 or after < 0 or before + after == 0:
        raise SpecError(d.path, d.key("before" if before <= 0 else "after"),
                        "how many lines before and/or after the matched line to look "
                        "(at least one of before, after above 0)",
                        {"before": before, "after": after})
    return Pattern(rx, contains, before, after, d.get("role", str, "context"))


def _severity(d: Doc, default: Any) -> str | None:
    sev = d.get("severity", str, default)
    if sev is not None and sev not in SEVERITIES:
        raise SpecError(d.path, d.key("severity"), "one of " + ", ".join(SEVERITIES), sev)
    return sev


def _fields(template: str) -> list[str]:
    out = []
    for _, name, spec, conv in string.Formatter().parse(template):
        if name is None:
            continue
        if not _NAME.match(name) or spec or conv:
            # The placeholder as written ({name!r}, {n:>5}, {}), so the refusal shows the user
            # their own text and not a cleaned-up one that looks right.
            raise ValueError("{" + name + (f"!{conv}" if conv else "") + (f":{spec}" if spec else "")
                             + "}")
        out.append(name)
    return out


def _check_template(d: Doc, key: str, template: str, alts: Sequence[Alternative],
                    extra: Iterable[str]) -> None:
    try:
        names = _fields(template)
    except ValueError as e:
        raise SpecError(d.path, d.key(key), "plain {name} placeholders (write {{ and }} for "
                        "literal braces)", str(e)) from None
    extra = set(extra)
    for k, alt in enumerate(alts):
        have = alt.names | extra
        for name in names:
            if name not in have:
                raise SpecError(d.path, d.key(key),
                                f"placeholders that match[{k}] sets: one of "
                                + ", ".join(sorted(have)), f"{{{name}}}",
                                hint="name the capture in match[...].regex, or give it under "
                                     "defaults: or derive:")


def _check_text(d: Doc, key: str, template: str, alts: Sequence[Alternative],
                known: Iterable[str], around: Iterable[str], derived: Sequence[Derived]) -> None:
    """A title, cause or fix: a placeholder outside [[...]] is set by every alternative (or
    has a default, or is derived); one inside [[with||...]] by something (an alternative or
    an `around` line). A command (in backticks) outside [[...]] holds only values the log
    always gives: a default or a table's default is a phrase, and a phrase in a command is a
    command that does not run."""
    plain = _without(template)
    if "[[" in plain or "]]" in plain:
        raise SpecError(d.path, d.key(key), "[[with {value}||without]] segments, closed and not "
                        "nested", template)
    _check_template(d, key, plain, alts, set(known) | set(BUILTINS))
    anywhere = set(known) | set(BUILTINS) | set(around)
    for alt in alts:
        anywhere |= alt.names
    for with_, _ in _segments(template):
        _check_template(d, key, with_, (), ())  # the braces are well-formed
        for name in _fields(with_):
            if name not in anywhere:
                raise SpecError(d.path, d.key(key), "placeholders that a match or an around "
                                "line sets: one of " + ", ".join(sorted(anywhere)),
                                f"{{{name}}}")
    commands = [name for span in _CODE.findall(plain) for name in _fields(span)]
    for k, alt in enumerate(alts):
        always = set(alt.names) | {"occurrences"}
        for dv in derived:  # in order: a derived value may use one derived before it
            if dv.template is not None and all(n in always for n in _fields(dv.template)):
                always.add(dv.name)
        for name in commands:
            if name not in always:
                raise SpecError(
                    d.path, d.key(key), f"commands (in backticks) with values match[{k}] always "
                    "gives", f"{{{name}}}",
                    hint=f"write [[`...{{{name}}}...`||a wording that needs no value]]: "
                         "a default is a phrase, and a phrase in a command does not run")


def _specifier(d: Doc, key: str, spec: Any) -> str:
    if not isinstance(spec, str):
        raise SpecError(d.path, d.key(key),
                        "a PEP 440 version range in quotes ('' for any version)", spec)
    try:
        SpecifierSet(spec)
    except InvalidSpecifier:
        raise SpecError(d.path, d.key(key),
                        "a PEP 440 version range such as '>=0.5.8,<0.5.17'", spec) from None
    return spec


def _parse_failure(d: Doc, engine_names: Iterable[str] = ()) -> Fingerprint:
    d.reject_unknown(FAILURE_KEYS)
    fid = d.get("id", str)
    if not _ID.match(fid):
        raise SpecError(d.path, d.key("id"), "a kebab-case id such as 'torch-arch-unsupported'",
                        fid)
    severity = _severity(d, "error")
    alts = []
    raw_alts = d.get("match", list, what="a list of ways the failure shows (regex, contains)")
    if not raw_alts:
        raise SpecError(d.path, d.key("match"), "at least one {regex, contains}")
    for k, raw in enumerate(raw_alts):
        ad = d.sub(f"match[{k}]", raw)
        ad.reject_unknown(ALT_KEYS)
        line = _pattern(ad, near=False)
        near = tuple(_pattern(ad.sub(f"near[{j}]", n), near=True)
                     for j, n in enumerate(ad.get("near", list, [], what="a list of lines "
                                                  "that must be near the matched one")))
        # printed_by: which releases print this wording ({package: range}); read by people
        for pkg, spec in ad.get("printed_by", dict, {}).items():
            _specifier(ad, f"printed_by.{pkg}", spec)
        alts.append(Alternative(line, near, _severity(ad, None)))
    defaults_raw = d.get("defaults", dict, {})
    defaults = []
    for name, value in defaults_raw.items():
        if not isinstance(name, str) or not _NAME.match(name):
            raise SpecError(d.path, d.key("defaults"), "capture names as keys", name)
        if not isinstance(value, str):
            raise SpecError(d.path, d.key(f"defaults.{name}"), "a string in quotes", value)
        defaults.append((name, value))
    known = {n for n, _ in defaults}
    derived = []
    for name, raw in d.get("derive", dict, {}).items():
        key = f"derive.{name}"
        if not isinstance(name, str) or not _NAME.match(name) or name in BUILTINS:
            raise SpecError(d.path, d.key("derive"), "names of new captures as keys "
                            f"(not {', '.join(BUILTINS)})", name)
        dd = d.sub(key, raw)
        dd.reject_unknown({"template", "from", "map", "default"})
        if "template" in raw:
            tpl = dd.get("template", str)
            _check_template(d, key + ".template", tpl, alts, known)
            derived.append(Derived(name, template=tpl))
        elif "from" in raw:
            src = dd.get("from", str, what="the name of a capture")
            table = dd.get("map", dict, what="a mapping from captured values to results")
            for kk, vv in table.items():
                if not isinstance(vv, str):
                    raise SpecError(d.path, d.key(f"{key}.map.{kk}"), "a string in quotes", vv)
            _check_template(d, key + ".from", "{" + src + "}", alts, known)
            derived.append(Derived(name, source=src,
                                   table=tuple((str(kk), vv) for kk, vv in table.items()),
                                   default=dd.get("default", str, "")))
        else:
            raise SpecError(d.path, d.key(key), "a mapping with template, or with from and map")
        known.add(name)
    around = []
    for j, raw in enumerate(d.get("around", list, [], what="a list of lines around the "
                                  "matched one that may give a value it does not")):
        ad = d.sub(f"around[{j}]", raw)
        ad.reject_unknown(NEAR_KEYS)
        p = _pattern(ad, near=True)
        if not p.names:
            raise SpecError(d.path, ad.key("regex"),
                            "a regular expression with (?P<name>...) captures", p.regex.pattern)
        around.append(p)
    around_names = {n for p in around for n in p.names}
    title = d.get("title", str)
    cause = d.get("cause", str, what="the cause, in plain words")
    fix = d.get("fix", str, what="the fix with imgbuild, in plain words")
    for key, text in (("title", title), ("cause", cause), ("fix", fix)):
        if not text.strip():
            raise SpecError(d.path, d.key(key), "a non-empty text")
        _check_text(d, key, text, alts, known, around_names, derived)
    dedupe = d.get("dedupe_by", list, None, what="a list of capture names")
    if dedupe is not None:
        for j, name in enumerate(dedupe):
            if not isinstance(name, str):
                raise SpecError(d.path, d.key(f"dedupe_by[{j}]"), "a capture name", name)
            _check_template(d, f"dedupe_by[{j}]", "{" + name + "}", alts, known)
        dedupe = tuple(dedupe)
    applies = []
    for pkg, spec in d.get("applies_to", dict, {}).items():
        applies.append((str(pkg), _specifier(d, f"applies_to.{pkg}", spec)))
    engine_names = set(engine_names)
    sources = []
    for j, raw in enumerate(d.get("sources", list, [])):
        sd = d.sub(f"sources[{j}]", raw)
        sd.reject_unknown({"in", "at"})
        req = sd.get("in", str, what="the package the text is in, as name==version")
        try:
            Requirement(req)
        except InvalidRequirement:
            raise SpecError(d.path, sd.key("in"), "a package as name==version", req) from None
        sources.append(Source(req, sd.get("at", str, what="a path inside the wheel, with :line")))
    return Fingerprint(
        id=fid, title=title.strip(), severity=severity or "error", alternatives=tuple(alts),
        cause=" ".join(cause.split()), fix=" ".join(fix.split()), derive=tuple(derived),
        defaults=tuple(defaults), dedupe_by=dedupe,
        supersedes=d.str_list("supersedes"), applies_to=tuple(applies), sources=tuple(sources),
        examples=d.str_list("examples"), path=d.path,
        engines=tuple((pkg, spec) for pkg, spec in applies if pkg in engine_names),
        around=tuple(around),
    )


# --- the sentences an image says for itself ------------------------------------------------------

# The failures the image's entrypoint can see in its own container before the server starts
# (payload/preflight.py --container): their title, cause and fix are shipped into every image
# as payload/doctor-sentences.json, extracted from this catalog so that both say the same.
PREFLIGHT_FAILURES = ("uid-without-passwd-entry", "cache-dir-not-writable", "jit-noexec-tmp")
SENTENCES_FILE = "doctor-sentences.json"


def preflight_sentences(catalog: FailureCatalog) -> dict[str, dict[str, str]]:
    """{id: {title, cause, fix}} of PREFLIGHT_FAILURES, templates as the catalog holds them."""
    by_id = {fp.id: fp for fp in catalog.fingerprints}
    missing = [f for f in PREFLIGHT_FAILURES if f not in by_id]
    if missing:
        raise SpecError(FAILURE_FILE, "failures", "the failures the image's preflight names: "
                        + ", ".join(PREFLIGHT_FAILURES), ", ".join(missing) + " missing")
    return {f: {"title": by_id[f].title, "cause": by_id[f].cause, "fix": by_id[f].fix}
            for f in PREFLIGHT_FAILURES}


def preflight_sentences_text(catalog: FailureCatalog) -> str:
    """payload/doctor-sentences.json as it must read (`make payload-sentences` writes it)."""
    return json.dumps(preflight_sentences(catalog), indent=2, sort_keys=True) + "\n"


if __name__ == "__main__":  # python -m imgbuild.catalog.failures --write-sentences
    root = Path(__file__).resolve().parents[2]
    text = preflight_sentences_text(load_failures(root / "images"))
    target = root / "imgbuild" / "payload" / SENTENCES_FILE
    if "--write-sentences" in sys.argv[1:]:
        target.write_text(text)
    else:
        sys.stdout.write(text)
