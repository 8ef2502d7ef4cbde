"""`imgbuild doctor LOGFILE|-`: match a server's log against known failures, say what to do.

The failures are data (images/checks/failures.yaml): for each, the regular expressions that
find it in a log, what they capture (a symbol, a module, an arch, a device), the cause and the
fix with imgbuild, in plain words templated with the captures, and where in the engine's wheel
the message comes from. This module only reads that file, scans a log line by line and fills in
the templates; a log that matches nothing gets an empty answer ("no known failure matched"),
never a guess.

Scanning is linear in the log: every line is cleaned once (a container runtime's prefix,
ANSI colours, also as the literal `^[[0;36m` a copy from a terminal leaves, the engine's log
prefix, which also tells the tensor-parallel rank), and a fingerprint's regex runs only on
lines that contain its literal `contains` text. Context lines (`near`) are looked for only
around a line that already matched.

The same pass works out which engine wrote the log, and its version, from the catalog's
`engines:` signs (traceback frames in its package, its banner, its log prefix). A failure whose
text only some engines print (its `applies_to` names them) is that failure only in a log of
one of them, in the versions named: the same sentence from another engine, or from a version
outside the range, is answered as a known sentence with another cause, with the evidence for
the engine, never as the failure it is not.
"""

from __future__ import annotations

import gzip
import io
import re
import sys
import zlib
from collections import deque
from collections.abc import Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from pathlib import Path
from types import MappingProxyType
from typing import Any, BinaryIO

from packaging.specifiers import SpecifierSet
from packaging.version import InvalidVersion, Version

from ..catalog.failures import (
    Alternative,
    FailureCatalog,
    Fingerprint,
    LogPrefix,
    Pattern,
    fill,
)
from ..errors import InputError

MAX_LINE = 8000  # characters of one line that are matched (a log may hold megabyte lines)
NO_MATCH = "no known failure matched"
_ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")
# The same codes as a terminal's copy or `cat -v` leaves them: a caret and a bracket.
_CARET_ANSI = re.compile(r"\^\[\[[0-9;?]*[A-Za-z]")
OTHER_CAUSE = "known-sentence-other-cause"



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
    sentence_of: str | None = None  # for OTHER_CAUSE: the failure whose text this is
    # False: the failure's text is only some engines', and the log does not say which wrote it
    certain: bool = True

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
            "certain": self.certain,
        } | ({"sentence_of": self.sentence_of} if self.sentence_of else {})


@dataclass(frozen=True)
class LogEngine:
    """Which engine wrote a log, as far as the log says: its name, its version where a line
    says it, and the line that weighed most."""

    name: str
    title: str
    version: str | None
    evidence: Evidence
    # None: a sign only this engine writes says so. Otherwise the only sign is a line prefix
    # other programs write too, and this says why it is a hint: the engine is a guess.
    only_hint: str | None = None

    @property
    def certain(self) -> bool:
        return self.only_hint is None

    @property
    def label(self) -> str:
        return f"{self.title} {self.version}" if self.version else self.title

    @property
    def where(self) -> str:
        """What says so: a line of the log, or (line 0) the prefix or the --engine option."""
        if self.only_hint is not None:
            return (f"line {self.evidence.line} starts with {self.title}'s log line prefix, "
                    f"{self.only_hint}")
        return f"line {self.evidence.line}" if self.evidence.line else self.evidence.text

    @property
    def said(self) -> str:
        """Who wrote the log, as sure as the log makes it: "probably" for a guess."""
        return f"{'' if self.certain else 'probably '}written by {self.label}: {self.where}"

    def to_dict(self) -> dict:
        return {"name": self.name, "version": self.version, "evidence": self.evidence.to_dict(),
                "certain": self.certain}


def to_dict(diags: Sequence[Diagnosis], *, source: str | None = None,
            engine: LogEngine | None = None) -> dict:
    """The --json document: every diagnosis, most specific first; none says so."""
    doc: dict[str, Any] = {"matched": any(d.id != OTHER_CAUSE for d in diags),
                           "engine": engine.to_dict() if engine else None,
                           "diagnoses": [d.to_dict() for d in diags]}
    if source is not None:
        doc = {"log": source} | doc
    if not doc["matched"]:
        doc["message"] = NO_MATCH
    return doc


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


def _clean(lines: Iterable[str], prefixes: Sequence[LogPrefix], outer: Sequence[LogPrefix] = (),
           seen: dict[str, tuple[int, str]] | None = None,
           ) -> Iterator[tuple[str, str, str | None]]:
    """Each line as shown (colours and a container runtime's prefix off), its message (the
    engine's prefix off) and its TP rank. Each engine prefix met goes in `seen`, with the
    first line (0-based, as shown) that has it."""
    rank: str | None = None
    for i, line in enumerate(lines):
        if "\x1b" in line:
            line = _ANSI.sub("", line)
        if "^[[" in line:
            line = _CARET_ANSI.sub("", line)
        for _ in range(3):  # `vllm-1  | 2025-01-01T00:00:00Z ...`: compose, then timestamps
            m = next((m for p in outer if (m := p.regex.match(line))), None)
            if m is None:
                break
            line = line[m.end():]
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
                if seen is not None and p.engine and p.name not in seen:
                    seen[p.name] = (i, line)
                break
        yield line, body, rank


class _Window:
    """The last lines of the log, by their 0-based number: what `near` patterns look at. Only
    as many as the widest context needs are kept, so memory does not grow with the log."""

    def __init__(self, keep: int):
        self.keep = keep
        self.first = 0  # number of the oldest line kept
        self.lines: deque[tuple[str, str, str | None]] = deque()

    def add(self, item: tuple[str, str, str | None]) -> None:
        self.lines.append(item)
        if len(self.lines) > self.keep:
            self.lines.popleft()
            self.first += 1

    def __len__(self) -> int:  # lines read so far
        return self.first + len(self.lines)

    def __getitem__(self, i: int) -> tuple[str, str, str | None]:
        return self.lines[i - self.first]


def _near(p: Pattern, i: int, caps: dict[str, str], win: _Window) -> tuple[int, dict] | None:
    """The closest line around i that matches p and agrees with the captures so far."""
    n = len(win)
    for dist in range(1, max(p.before, p.after) + 1):
        for j in ((i - dist) if dist <= p.before else -1, (i + dist) if dist <= p.after else n):
            if not win.first <= j < n:
                continue
            body = win[j][1]
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


def _given(fp: Fingerprint, caps: Mapping[str, str], values: Mapping[str, str]) -> set[str]:
    """The names whose value the log gave (a default or a table's default is not one)."""
    given = set(caps)
    for dv in fp.derive:
        if dv.given(values, given):
            given.add(dv.name)
        else:
            given.discard(dv.name)
    return given


def ranks_text(ranks: Iterable[str]) -> str:
    rs = sorted(set(ranks), key=lambda r: (len(r), r))
    return ", ".join(f"TP{r}" for r in rs) if rs else "not named in the log"


def diagnose(log: str | Iterable[str], failures: FailureCatalog,
             engine_out: list[LogEngine | None] | None = None, *,
             engine: LogEngine | None = None) -> list[Diagnosis]:
    """Known failures in a log (its text, or its lines as they are read), most specific first;
    [] when none matched (never a guess).

    Errors (the server stopped) come before warnings; then the diagnosis whose match needed more
    lines; then the earlier one in the log. A failure seen on several ranks, or several times
    with the same captures, is one diagnosis with its first line as evidence.

    The log is read once, front to back, keeping only the lines that context patterns can
    reach: memory stays flat in the log's length.
    """
    fingerprints, prefixes = failures.fingerprints, failures.prefixes
    lines = log.split("\n") if isinstance(log, str) else log
    anchors = [(fi, alt, alt.line.contains, alt.line.regex)
               for fi, fp in enumerate(fingerprints) for alt in fp.alternatives]
    near = [p for _, alt, _, _ in anchors for p in alt.near] + \
        [p for fp in fingerprints for p in fp.around]
    before = max((p.before for p in near), default=0)
    after = max((p.after for p in near), default=0)
    # One pass in C finds the few lines that contain any fingerprint's literal at all.
    needles = sorted({a[2] for a in anchors if a[2] is not None}, key=len, reverse=True)
    any_needle = re.compile("|".join(map(re.escape, needles))) \
        if needles and all(a[2] is not None for a in anchors) else None
    win = _Window(before + after + 1)
    pending: deque[int] = deque()  # candidate lines waiting for the lines after them
    hits: list[_Hit] = []
    votes = _Votes(failures)
    for i, item in enumerate(_clean(lines, prefixes, failures.outer, votes.prefixes)):
        win.add(item)
        votes.line(i, item)
        if any_needle is None or any_needle.search(item[1]):
            pending.append(i)
        while pending and pending[0] + after <= i:
            hits += _match_line(pending.popleft(), win, anchors, fingerprints)
    while pending:
        hits += _match_line(pending.popleft(), win, anchors, fingerprints)
    engine = engine or votes.engine()
    if engine_out is not None:
        engine_out.append(engine)
    return _engine_fit(_summarise(hits), engine, failures)


class _Votes:
    """Which engine wrote the log: each sign counts once, with its weight; a prefix only one
    engine writes counts as a sign of weight 2. A tie is no answer."""

    def __init__(self, failures: FailureCatalog):
        self.engines = failures.engines
        self.prefix_engine = {p.name: p.engine for p in failures.prefixes if p.engine}
        self.generic = {p.name: p.generic for p in failures.prefixes if p.generic}
        self.prefixes: dict[str, tuple[int, str]] = {}  # engine prefix -> its first line
        self.hits: dict[tuple[int, int], tuple[int, str, str | None]] = {}  # sign -> first hit
        self.todo = [(ei, si, s) for ei, e in enumerate(self.engines)
                     for si, s in enumerate(e.signs)]

    def line(self, i: int, item: tuple[str, str, str | None]) -> None:
        shown = item[0]
        for ei, si, s in self.todo:
            if s.contains in shown and (m := s.regex.search(shown)):
                self.hits[(ei, si)] = (i, shown, m.groupdict().get("version"))
        if self.hits:
            self.todo = [t for t in self.todo if (t[0], t[1]) not in self.hits]

    def engine(self) -> LogEngine | None:
        score: dict[int, int] = {}
        for (ei, si) in self.hits:
            score[ei] = score.get(ei, 0) + self.engines[ei].signs[si].weight
        for p in self.prefixes:
            ei = next(k for k, e in enumerate(self.engines) if e.name == self.prefix_engine[p])
            score[ei] = score.get(ei, 0) + 2
        if not score:
            return None
        best = max(score.values())
        top = [ei for ei, v in score.items() if v == best]
        if len(top) > 1:
            return None
        ei = top[0]
        engine = self.engines[ei]
        mine = sorted(((si, h) for (e, si), h in self.hits.items() if e == ei),
                      key=lambda sh: (sh[1][0], sh[0]))  # by line, then the catalog's order
        version = next((h[2] for _, h in mine if h[2]), None)
        if mine:
            # The heaviest sign, the earliest of those; keyed on numbers only, since two signs
            # on one line differ only in a version one of them may not capture.
            si, h = max(mine, key=lambda sh: (engine.signs[sh[0]].weight, -sh[1][0], -sh[0]))
            return LogEngine(engine.name, engine.title, version, Evidence(h[0] + 1, h[1], "engine"))
        mine_prefixes = sorted((at, name) for name, at in self.prefixes.items()
                               if self.prefix_engine[name] == engine.name)
        specific = [at for at, name in mine_prefixes if name not in self.generic]
        if specific:
            return LogEngine(engine.name, engine.title, version,
                             Evidence(0, f"{engine.title}'s log line prefix", "engine"))
        # Only a prefix other programs write too: a guess, said as one, with its line.
        (i, shown), name = mine_prefixes[0]
        return LogEngine(engine.name, engine.title, version, Evidence(i + 1, shown, "engine"),
                         only_hint=self.generic[name])


def _fits(fp: Fingerprint, engine: LogEngine | None) -> bool:
    """The failure's cause can hold in this engine's log (unknown engine: it can)."""
    if engine is None or not fp.engines:
        return True
    spec = dict(fp.engines).get(engine.name)
    if spec is None:
        return False
    if not spec or engine.version is None:
        return True
    try:
        return Version(engine.version) in SpecifierSet(spec, prereleases=True)
    except InvalidVersion:
        return True


def _engine_fit(diags: list[Diagnosis], engine: LogEngine | None,
                failures: FailureCatalog) -> list[Diagnosis]:
    """Keep each diagnosis whose cause can hold for the log's engine; the others become a
    known sentence with another cause, unless a failure of that engine explains the line."""
    by_id = {fp.id: fp for fp in failures.fingerprints}
    if engine is None or not engine.certain:
        # Which engine wrote it is unknown, or only guessed from a prefix other programs write
        # too: a failure only some engines print is possible, and a guess rules none out.
        unsure = ("The log does not say which engine wrote it" if engine is None else
                  f"The log does not say for certain which engine wrote it (probably "
                  f"{engine.label}, from a line prefix other programs write too)")
        return [d if not _bound(by_id[d.id], failures) else replace(
            d, certain=False, title=f"possibly: {d.title}",
            cause=(d.cause + f" ({unsure}: this holds for "
                   + ", ".join(f"{_title(failures, n)} {spec}".strip()
                               for n, spec in by_id[d.id].engines) + ".)"))
            for d in diags]
    kept = [d for d in diags if _fits(by_id[d.id], engine)]
    explained = {d.line for d in kept}  # a line one answer explains gets no other-cause one
    out = []
    for d in kept:
        spec = dict(by_id[d.id].engines).get(engine.name)
        if spec and engine.version is None:
            # The cause holds in some versions of this engine, and the log does not say which.
            d = replace(d, certain=False, title=f"possibly: {d.title}",
                        cause=(d.cause + f" (The log does not say which {engine.title} "
                               f"version wrote it: this holds for {engine.title} {spec}.)"))
        out.append(d)
    for d in diags:
        fp = by_id[d.id]
        if d in kept or d.line in explained:
            continue
        explained.add(d.line)
        assert engine is not None
        who = ", ".join(f"{_title(failures, n)} {spec}".strip() for n, spec in fp.engines)
        out.append(replace(
            d, id=OTHER_CAUSE, sentence_of=d.id,
            title=f"a known sentence ({d.id}), but from {engine.label}: another cause",
            cause=(f"This line is the message imgbuild knows as {d.id} ({d.title}), which "
                   f"{who} print{'s' if len(fp.engines) == 1 else ''} for that cause. This log "
                   f"was written by {engine.label} ({engine.where}), where the same "
                   "words have another cause, and imgbuild has no diagnosis for it."),
            fix=(f"Start from the last exception in the log and {engine.title}'s own issues for "
                 f"this message{' in ' + engine.version if engine.version else ''}; imgbuild "
                 "does not guess."),
            evidence=d.evidence + ((engine.evidence,) if engine.evidence.line else ())))
    out.sort(key=lambda d: (d.id == OTHER_CAUSE, d.severity != "error"))
    return out


def _bound(fp: Fingerprint, failures: FailureCatalog) -> bool:
    """The failure's text is printed by some engines (or versions) only, not by every one."""
    return bool(fp.engines) and (
        {n for n, _ in fp.engines} != {e.name for e in failures.engines}
        or any(spec for _, spec in fp.engines))


def _title(failures: FailureCatalog, name: str) -> str:
    return next((e.title for e in failures.engines if e.name == name), name)


def _match_line(i: int, win: _Window, anchors, fingerprints) -> list[_Hit]:
    shown, body, rank = win[i]
    done: set[int] = set()
    hits: list[_Hit] = []
    for fi, alt, needle, rx in anchors:
        if needle is not None and needle not in body:
            continue
        if fi in done:
            continue
        m = rx.search(body)
        if m is None:
            continue
        caps = {k: v for k, v in m.groupdict().items() if v is not None}
        ev = [Evidence(i + 1, shown, "match", rank)]
        for p in alt.near:
            found = _near(p, i, caps, win)
            if found is None:
                break
            j, got = found
            caps.update(got)
            ev.append(Evidence(j + 1, win[j][0], p.role, win[j][2]))
        else:
            # A value the matched lines do not give may be on a line around them (the port
            # the server announced): the closest such line gives it, and is evidence.
            for p in fingerprints[fi].around:
                if p.names <= caps.keys():
                    continue
                found = _near(p, i, caps, win)
                if found is not None:
                    j, got = found
                    caps.update(got)
                    ev.append(Evidence(j + 1, win[j][0], p.role, win[j][2]))
            done.add(fi)
            hits.append(_Hit(fingerprints[fi], alt, i, caps, ev, rank))
    return hits


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
        given = _given(fp, h.captures, values)
        # --json's captures are what the log gave: a default is a phrase for the sentences.
        captures = {k: v for k, v in values.items() if k in given}
        given |= {"occurrences"} | ({"ranks"} if g.ranks else set())
        values["occurrences"] = str(g.count)
        values["ranks"] = ranks_text(g.ranks)
        out.append(Diagnosis(
            id=fp.id, title=fill(fp.title, values, given), severity=g.severity,
            cause=fill(fp.cause, values, given), fix=fill(fp.fix, values, given),
            evidence=tuple(h.evidence) + tuple(sorted(g.related, key=lambda e: e.line)),
            captures=MappingProxyType(captures), occurrences=g.count,
            ranks=tuple(sorted(g.ranks, key=lambda r: (len(r), r))),
            applies_to=fp.applies_to, sources=tuple(str(s) for s in fp.sources),
        ))
    return out


# --- reading and showing -----------------------------------------------------------------------

def _text_stream(raw: BinaryIO) -> Iterator[str]:
    """Lines of a log as bytes come: gzip unpacked, UTF-16 (by its byte-order mark, or the
    zero bytes of mostly-ASCII text) and UTF-8 with or without a BOM decoded, anything else
    read as UTF-8 with replacements. A line longer than MAX_LINE is cut there, and the rest of
    it skipped without being held."""
    buf = raw if hasattr(raw, "peek") else io.BufferedReader(raw)  # type: ignore[arg-type]
    head = buf.peek(4)[:4]
    if head[:2] == b"\x1f\x8b":
        buf = io.BufferedReader(gzip.GzipFile(fileobj=buf))  # type: ignore[arg-type]
        head = buf.peek(4)[:4]
    if head[:2] in (b"\xff\xfe", b"\xfe\xff"):
        encoding = "utf-16"
    elif len(head) == 4 and head[1] == 0 and head[3] == 0 and head[0] and head[2]:
        encoding = "utf-16-le"
    elif len(head) == 4 and head[0] == 0 and head[2] == 0 and head[1] and head[3]:
        encoding = "utf-16-be"
    else:
        encoding = "utf-8-sig"
    text = io.TextIOWrapper(buf, encoding=encoding, errors="replace", newline="\n")
    while True:
        line = text.readline(MAX_LINE + 1)
        if not line:
            return
        if len(line) > MAX_LINE and not line.endswith("\n"):
            while (rest := text.readline(1 << 16)) and not rest.endswith("\n"):
                pass
        yield line.rstrip("\n")


@contextmanager
def open_log(arg: str, stdin=None) -> Iterator[tuple[Iterator[str], str]]:
    """The lines of LOGFILE, or of standard input for "-", read as they are needed; and how to
    name the log in messages."""
    if arg == "-":
        stream = stdin if stdin is not None else sys.stdin
        raw = getattr(stream, "buffer", None)
        if raw is None and isinstance(stream, io.TextIOBase):
            yield (ln.rstrip("\n") for ln in stream), "standard input"
        else:
            yield _text_stream(raw if raw is not None else stream), "standard input"
        return
    p = Path(arg)
    if p.is_dir():
        raise InputError(f"{arg} is a directory, not a log file",
                         hint="pass the server's log file, or - to read standard input")
    try:
        f = open(p, "rb")
    except FileNotFoundError:
        raise InputError(f"no such log file: {arg}",
                         hint="pass the server's log file, or - to read standard input "
                              "(docker logs CONTAINER 2>&1 | imgbuild doctor -)") from None
    except OSError as e:
        raise InputError(f"cannot read {arg}: {e.strerror}") from None
    with f:
        yield _text_stream(f), arg


def read_log(arg: str, stdin=None) -> tuple[str, str]:
    """The whole text of a log (for tests and small logs; `doctor` streams)."""
    with open_log(arg, stdin) as (lines, source):
        return "\n".join(lines), source


@dataclass(frozen=True)
class DoctorReport:
    """`imgbuild doctor LOGFILE|-`: what was read and what was found in it."""

    source: str
    diagnoses: tuple[Diagnosis, ...]
    engine: LogEngine | None = None

    @property
    def exit_code(self) -> int:
        # A known failure found is the job's finding (1); nothing matched, or only a known
        # sentence with another cause, is not an error (0).
        return 1 if any(d.id != OTHER_CAUSE for d in self.diagnoses) else 0

    def to_dict(self) -> dict:
        return to_dict(self.diagnoses, source=self.source, engine=self.engine)


def engine_given(text: str, failures: FailureCatalog) -> LogEngine:
    """`--engine NAME[==VERSION]`: the engine that wrote the log, as the user says."""
    name, _, version = text.partition("==")
    known = {e.name: e for e in failures.engines}
    e = known.get(name.strip().lower())
    if e is None:
        raise InputError(f"--engine {text}: not an engine doctor knows",
                         facts=[f"engines: {', '.join(sorted(known))}"],
                         hint="write NAME or NAME==VERSION, e.g. --engine sglang==0.5.16")
    version = version.strip() or None
    if version is not None:
        try:
            Version(version)
        except InvalidVersion:
            raise InputError(f"--engine {text}: {version!r} is not a version",
                             hint="write NAME==VERSION, e.g. --engine sglang==0.5.16") from None
    return LogEngine(e.name, e.title, version, Evidence(0, f"--engine {text}", "engine"))


def doctor(failures: FailureCatalog, log: str, stdin=None, *,
           engine: LogEngine | None = None) -> DoctorReport:
    """Read LOGFILE (or standard input for "-") and diagnose it; `engine`, when given, is
    who wrote it (the log's own signs are then not asked)."""
    try:
        with open_log(log, stdin) as (lines, source):
            found: list[LogEngine | None] = []
            diags = tuple(diagnose(lines, failures, found, engine=engine))
            return DoctorReport(source, diags, found[0])
    except (OSError, EOFError, zlib.error) as e:  # a truncated gzip, a read error midway
        raise InputError(f"cannot read {log if log != '-' else 'standard input'}: "
                         f"{getattr(e, 'strerror', None) or e}",
                         hint="pass the server's log as text or gzip") from None
