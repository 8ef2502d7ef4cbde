"""`imgbuild doctor LOGFILE|-`: match a server's log against known failures, say what to do.

The failures are data (images/checks/failures.yaml): for each, the regular expressions that
find it in a log, what they capture (a symbol, a module, an arch, a device), the cause and the
fix with imgbuild, in plain words templated with the captures, and where in the engine's wheel
the message comes from. This module only reads that file, scans a log line by line and fills in
the templates; a log that matches nothing gets an empty answer ("no known failure matched"),
never a guess.

Scanning is linear in the log: every line is cleaned once (ANSI colours, the engine's log
prefix, which also tells the tensor-parallel rank), and a fingerprint's regex runs only on
lines that contain its literal `contains` text. Context lines (`near`) are looked for only
around a line that already matched.
"""

from __future__ import annotations

import functools
import re
import string
import sys
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Any

from packaging.requirements import InvalidRequirement, Requirement
from packaging.specifiers import InvalidSpecifier, SpecifierSet

from .errors import InputError, SpecError
from .spec import _Doc, _read_yaml, _rel, images_dir

# Relative to images/: images/*.yaml are all read as targets, so checks live one level down.
FAILURE_FILE = "checks/failures.yaml"
SEVERITIES = ("error", "warning")
BUILTINS = ("occurrences", "ranks")  # template names doctor fills in itself
MAX_LINE = 8000  # characters of one line that are matched (a log may hold megabyte lines)
NO_MATCH = "no known failure matched"

_ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")
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
            return self.template.format_map(_Blank(values))
        return dict(self.table).get(values.get(self.source or "", ""), self.default)


@dataclass(frozen=True)
class Source:
    """Where a message text comes from: a file (and line) inside a released wheel."""

    requirement: str  # "sglang==0.5.16"
    at: str  # "sglang/srt/.../utils.py:132"

    def __str__(self) -> str:
        return f"{self.requirement} {self.at}"


@dataclass(frozen=True)
class LogPrefix:
    """How an engine starts its log lines; groups named rank... give the TP rank."""

    name: str
    regex: re.Pattern[str]


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
    sources: tuple[Source, ...] = ()
    examples: tuple[str, ...] = ()
    path: str = ""  # the file it was read from, for messages


@dataclass(frozen=True)
class _Catalog:
    prefixes: tuple[LogPrefix, ...]
    fingerprints: tuple[Fingerprint, ...]


FAILURE_KEYS = {"id", "title", "severity", "match", "derive", "defaults", "dedupe_by",
                "supersedes", "cause", "fix", "applies_to", "sources", "examples"}
ALT_KEYS = {"regex", "contains", "near", "severity"}
NEAR_KEYS = {"regex", "contains", "before", "after", "role"}


def _failure_file(images: Path | str | None) -> tuple[Path, Path]:
    root = Path(images) if images else images_dir()
    path = root / FAILURE_FILE
    if not path.is_file():
        raise InputError(f"no failure fingerprints under {root}",
                         facts=[f"looked for {path}"],
                         hint="run imgbuild from a checkout (images/checks/failures.yaml "
                              "ships with it), or pass --images")
    return root, path


def load_fingerprints(images: Path | str | None = None) -> tuple[Fingerprint, ...]:
    """Read and validate images/checks/failures.yaml; errors name the file, key and expectation."""
    return _load(images).fingerprints


def load_prefixes(images: Path | str | None = None) -> tuple[LogPrefix, ...]:
    """The log-line prefixes (SGLang's, vLLM's) that failures.yaml declares."""
    return _load(images).prefixes


def _load(images: Path | str | None) -> _Catalog:
    root, path = _failure_file(images)
    st = path.stat()
    return _load_cached(str(root.resolve()), str(path.resolve()), st.st_mtime_ns, st.st_size)


@functools.lru_cache(maxsize=8)
def _load_cached(root: str, path: str, _mtime: int, _size: int) -> _Catalog:
    rootp, p = Path(root), Path(path)
    rel = _rel(p, rootp)
    doc = _Doc(rel, _read_yaml(p, rootp))
    doc.reject_unknown({"prefixes", "failures"})
    prefixes = []
    for i, raw in enumerate(doc.get("prefixes", list, [], what="a list of log prefixes")):
        d = doc.sub(f"prefixes[{i}]", raw)
        d.reject_unknown({"name", "regex"})
        prefixes.append(LogPrefix(d.get("name", str), _regex(d, "regex")))
    fps: list[Fingerprint] = []
    seen: dict[str, str] = {}
    raws = doc.get("failures", list, what="a list of failures")
    if not raws:
        raise SpecError(rel, "failures", "at least one failure")
    for i, raw in enumerate(raws):
        fp = _parse_failure(doc.sub(f"failures[{i}]", raw))
        if fp.id in seen:
            raise SpecError(rel, f"failures[{i}].id", f"a unique id ({seen[fp.id]} has it too)",
                            fp.id)
        seen[fp.id] = f"failures[{i}]"
        fps.append(fp)
    for i, fp in enumerate(fps):
        for j, other in enumerate(fp.supersedes):
            if other not in seen or other == fp.id:
                raise SpecError(rel, f"failures[{i}].supersedes[{j}]",
                                "the id of another failure in this file", other)
    return _Catalog(tuple(prefixes), tuple(fps))


def _regex(d: _Doc, key: str) -> re.Pattern[str]:
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


def _pattern(d: _Doc, *, near: bool) -> Pattern:
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


def _severity(d: _Doc, default: Any) -> str | None:
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
            raise ValueError(name or "{}")
        out.append(name)
    return out


def _check_template(d: _Doc, key: str, template: str, alts: Sequence[Alternative],
                    extra: Iterable[str]) -> None:
    try:
        names = _fields(template)
    except ValueError as e:
        raise SpecError(d.path, d.key(key), "plain {name} placeholders (write {{ and }} for "
                        "literal braces)", f"{{{e}}}") from None
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


def _parse_failure(d: _Doc) -> Fingerprint:
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
    title = d.get("title", str)
    cause = d.get("cause", str, what="the cause, in plain words")
    fix = d.get("fix", str, what="the fix with imgbuild, in plain words")
    for key, text in (("title", title), ("cause", cause), ("fix", fix)):
        if not text.strip():
            raise SpecError(d.path, d.key(key), "a non-empty text")
        _check_template(d, key, text, alts, known | set(BUILTINS))
    dedupe = d.get("dedupe_by", list, None, what="a list of capture names")
    if dedupe is not None:
        for j, name in enumerate(dedupe):
            if not isinstance(name, str):
                raise SpecError(d.path, d.key(f"dedupe_by[{j}]"), "a capture name", name)
            _check_template(d, f"dedupe_by[{j}]", "{" + name + "}", alts, known)
        dedupe = tuple(dedupe)
    applies = []
    for pkg, spec in d.get("applies_to", dict, {}).items():
        if not isinstance(spec, str):
            raise SpecError(d.path, d.key(f"applies_to.{pkg}"),
                            "a PEP 440 version range in quotes ('' for any version)", spec)
        try:
            SpecifierSet(spec)
        except InvalidSpecifier:
            raise SpecError(d.path, d.key(f"applies_to.{pkg}"),
                            "a PEP 440 version range such as '>=0.5.8,<0.5.17'", spec) from None
        applies.append((str(pkg), spec))
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
    )


# --- the answers -------------------------------------------------------------------------------

@dataclass(frozen=True)
class Evidence:
    line: int  # 1-based, as `grep -n` and `sed -n Np` count
    text: str
    role: str = "match"  # "match", a context pattern's role, or "related"
    rank: str | None = None  # the TP rank the line came from, when the log says

    def to_dict(self) -> dict:
        return {"line": self.line, "text": self.text, "role": self.role, "rank": self.rank}


@dataclass(frozen=True)
class Diagnosis:
    """One known failure found in a log. evidence[0] is the line that matched."""

    id: str
    title: str
    severity: str
    cause: str
    fix: str
    evidence: tuple[Evidence, ...]
    captures: Mapping[str, str] = field(default_factory=dict, hash=False)
    occurrences: int = 1
    ranks: tuple[str, ...] = ()
    applies_to: tuple[tuple[str, str], ...] = ()
    sources: tuple[str, ...] = ()

    @property
    def line(self) -> int:
        return self.evidence[0].line

    def to_dict(self) -> dict:
        return {
            "id": self.id, "title": self.title, "severity": self.severity,
            "cause": self.cause, "fix": self.fix,
            "evidence": [e.to_dict() for e in self.evidence],
            "captures": dict(self.captures), "occurrences": self.occurrences,
            "ranks": list(self.ranks),
            "applies_to": {pkg: spec for pkg, spec in self.applies_to},
            "sources": list(self.sources),
        }


def to_dict(diags: Sequence[Diagnosis], *, source: str | None = None) -> dict:
    """The --json document: every diagnosis, most specific first; none says so."""
    doc: dict[str, Any] = {"matched": bool(diags), "diagnoses": [d.to_dict() for d in diags]}
    if source is not None:
        doc = {"log": source} | doc
    if not diags:
        doc["message"] = NO_MATCH
    return doc


class _Blank(dict):
    """format_map values: a capture an alternative left unset renders as nothing."""

    def __missing__(self, key: str) -> str:
        return ""


@dataclass
class _Hit:
    fp: Fingerprint
    alt: Alternative
    index: int  # 0-based line
    captures: dict[str, str]
    evidence: list[Evidence]
    rank: str | None


@dataclass
class _Group:
    first: _Hit
    count: int = 0
    ranks: set[str] = field(default_factory=set)
    severity: str = "warning"
    specificity: int = 0
    related: list[Evidence] = field(default_factory=list)


def _clean(text: str,
           prefixes: Sequence[LogPrefix]) -> tuple[list[str], list[str], list[str | None]]:
    """Each line as shown (colours off), its message (prefix off) and its TP rank."""
    shown: list[str] = []
    bodies: list[str] = []
    ranks: list[str | None] = []
    rank: str | None = None
    lines = text.split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    for line in lines:
        if "\x1b" in line:
            line = _ANSI.sub("", line)
        line = line.rstrip()
        if "\r" in line:  # progress bars: what a terminal would show is the last segment
            line = next((seg for seg in reversed(line.split("\r")) if seg.strip()), "")
        if len(line) > MAX_LINE:
            line = line[:MAX_LINE]
        body = line
        for p in prefixes:
            m = p.regex.match(line)
            if m:
                body = line[m.end():]
                rank = next((v for k, v in m.groupdict().items()
                             if k.startswith("rank") and v is not None), None)
                break
        shown.append(line)
        bodies.append(body)
        ranks.append(rank)
    return shown, bodies, ranks


def _near(p: Pattern, i: int, caps: dict[str, str], bodies: list[str]) -> tuple[int, dict] | None:
    """The closest line around i that matches p and agrees with the captures so far."""
    n = len(bodies)
    for dist in range(1, max(p.before, p.after) + 1):
        for j in ((i - dist) if dist <= p.before else -1, (i + dist) if dist <= p.after else n):
            if not 0 <= j < n:
                continue
            body = bodies[j]
            if p.contains is not None and p.contains not in body:
                continue
            m = p.regex.search(body)
            if m is None:
                continue
            got = {k: v for k, v in m.groupdict().items() if v is not None}
            if all(caps.get(k, v) == v for k, v in got.items()):
                return j, got
    return None


def _values(fp: Fingerprint, caps: dict[str, str]) -> dict[str, str]:
    values = dict(fp.defaults)
    values.update(caps)
    for dv in fp.derive:
        values[dv.name] = dv.value(values)
    return values


def _ranks_text(ranks: Iterable[str]) -> str:
    rs = sorted(set(ranks), key=lambda r: (len(r), r))
    return ", ".join(f"TP{r}" for r in rs) if rs else "not named in the log"


def diagnose(text: str, fingerprints: Sequence[Fingerprint] | None = None,
             prefixes: Sequence[LogPrefix] | None = None, *,
             images: Path | str | None = None) -> list[Diagnosis]:
    """Known failures in a log, most specific first; [] when none matched (never a guess).

    Errors (the server stopped) come before warnings; then the diagnosis whose match needed more
    lines; then the earlier one in the log. A failure seen on several ranks, or several times
    with the same captures, is one diagnosis with its first line as evidence.
    """
    if fingerprints is None:
        fingerprints = load_fingerprints(images)
    if prefixes is None:
        prefixes = load_prefixes(images)
    shown, bodies, ranks = _clean(text, prefixes)
    anchors = [(fi, alt, alt.line.contains, alt.line.regex)
               for fi, fp in enumerate(fingerprints) for alt in fp.alternatives]
    # One pass in C finds the few lines that contain any fingerprint's literal at all.
    needles = sorted({a[2] for a in anchors if a[2] is not None}, key=len, reverse=True)
    if all(a[2] is not None for a in anchors) and needles:
        any_needle = re.compile("|".join(map(re.escape, needles)))
        candidates: Iterable[int] = [i for i, b in enumerate(bodies) if any_needle.search(b)]
    else:
        candidates = range(len(bodies))
    hits: list[_Hit] = []
    for i in candidates:
        body = bodies[i]
        done: set[int] = set()
        for fi, alt, needle, rx in anchors:
            if needle is not None and needle not in body:
                continue
            if fi in done:
                continue
            m = rx.search(body)
            if m is None:
                continue
            caps = {k: v for k, v in m.groupdict().items() if v is not None}
            ev = [Evidence(i + 1, shown[i], "match", ranks[i])]
            for p in alt.near:
                found = _near(p, i, caps, bodies)
                if found is None:
                    break
                j, got = found
                caps.update(got)
                ev.append(Evidence(j + 1, shown[j], p.role, ranks[j]))
            else:
                done.add(fi)
                hits.append(_Hit(fingerprints[fi], alt, i, caps, ev, ranks[i]))
    return _summarise(hits)


def _summarise(hits: list[_Hit]) -> list[Diagnosis]:
    groups: dict[tuple, _Group] = {}
    for h in hits:
        values = _values(h.fp, h.captures)
        names = h.fp.dedupe_by if h.fp.dedupe_by is not None else sorted(values)
        key = (h.fp.id, tuple((k, values.get(k)) for k in names))
        g = groups.get(key)
        if g is None:
            g = groups[key] = _Group(h)
        g.count += 1
        if h.rank is not None:
            g.ranks.add(h.rank)
        if (h.alt.severity or h.fp.severity) == "error":
            g.severity = "error"
        g.specificity = max(g.specificity, h.alt.specificity)
    # A failure that explains another takes the other's first line as related evidence.
    by_id: dict[str, list[_Group]] = {}
    for g in groups.values():
        by_id.setdefault(g.first.fp.id, []).append(g)
    dropped: set[str] = set()
    for gs in by_id.values():
        for other in gs[0].first.fp.supersedes:
            if other in by_id and other not in dropped:
                dropped.add(other)
                for og in by_id[other][:3]:
                    e = og.first.evidence[0]
                    gs[0].related.append(Evidence(e.line, e.text, "related", e.rank))
    kept = [g for g in groups.values() if g.first.fp.id not in dropped]
    kept.sort(key=lambda g: (g.severity != "error", -g.specificity, g.first.index))
    out = []
    for g in kept:
        fp, h = g.first.fp, g.first
        values = _values(fp, h.captures)
        values["occurrences"] = str(g.count)
        values["ranks"] = _ranks_text(g.ranks)
        fill = _Blank(values)
        captures = _values(fp, h.captures)
        out.append(Diagnosis(
            id=fp.id, title=fp.title.format_map(fill), severity=g.severity,
            cause=fp.cause.format_map(fill), fix=fp.fix.format_map(fill),
            evidence=tuple(h.evidence) + tuple(sorted(g.related, key=lambda e: e.line)),
            captures=MappingProxyType(captures), occurrences=g.count,
            ranks=tuple(sorted(g.ranks, key=lambda r: (len(r), r))),
            applies_to=fp.applies_to, sources=tuple(str(s) for s in fp.sources),
        ))
    return out


# --- reading and showing -----------------------------------------------------------------------

def read_log(arg: str, stdin=None) -> tuple[str, str]:
    """The text of LOGFILE, or of standard input for "-"; and how to name it in messages."""
    if arg == "-":
        stream = stdin if stdin is not None else sys.stdin
        buf = getattr(stream, "buffer", None)
        data = buf.read() if buf is not None else stream.read()
        text = data.decode("utf-8", "replace") if isinstance(data, bytes) else data
        return text, "standard input"
    p = Path(arg)
    if p.is_dir():
        raise InputError(f"{arg} is a directory, not a log file",
                         hint="pass the server's log file, or - to read standard input")
    try:
        data = p.read_bytes()
    except FileNotFoundError:
        raise InputError(f"no such log file: {arg}",
                         hint="pass the server's log file, or - to read standard input "
                              "(docker logs CONTAINER 2>&1 | imgbuild doctor -)") from None
    except OSError as e:
        raise InputError(f"cannot read {arg}: {e.strerror}") from None
    return data.decode("utf-8", "replace"), arg


def render(diags: Sequence[Diagnosis], console, *, source: str | None = None) -> None:
    """Each diagnosis for people: cause, fix, evidence lines. Log text is never read as markup."""
    from rich.panel import Panel
    from rich.text import Text

    where = f" in {source}" if source else ""
    if not diags:
        t = Text()
        t.append(NO_MATCH, style="bold")
        t.append(where + ".\n")
        t.append("imgbuild doctor only names failures it knows (images/checks/failures.yaml) "
                 "and does not guess; start from the last exception in the log.", style="dim")
        console.print(t)
        return
    n = len(diags)
    console.print(Text(f"{n} known failure{'s' if n != 1 else ''} found{where}", style="bold"))
    for d in diags:
        body = Text()
        body.append(d.title + "\n", style="bold")
        body.append("cause ", style="bold")
        body.append(d.cause + "\n")
        body.append("fix   ", style="bold cyan")
        body.append(d.fix + "\n")
        body.append("evidence", style="bold")
        for e in d.evidence:
            body.append(f"\n  line {e.line}", style="bold")
            label = [x for x in (f"TP{e.rank}" if e.rank is not None else None,
                                 e.role if e.role != "match" else None) if x]
            if label:
                body.append(f" ({', '.join(label)})", style="dim")
            body.append(": ")
            text = e.text.strip()
            body.append(text if len(text) <= 300 else text[:297] + "...")
        seen = []
        if d.occurrences > 1:
            seen.append(f"seen {d.occurrences} times")
        if d.ranks:
            seen.append("on " + _ranks_text(d.ranks))
        if seen:
            body.append("\n" + ", ".join(seen), style="dim")
        style = "red" if d.severity == "error" else "yellow"
        title = Text()
        title.append(d.severity, style=f"bold {style}")
        title.append(f" {d.id}", style="bold")
        console.print(Panel(body, title=title, title_align="left", border_style=style))
