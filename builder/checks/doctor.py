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

import gzip
import io
import re
import sys
import zlib
from collections import deque
from collections.abc import Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Any, BinaryIO

from ..catalog.failures import (
    Alternative,
    Blank,
    FailureCatalog,
    Fingerprint,
    LogPrefix,
    Pattern,
)
from ..errors import InputError

MAX_LINE = 8000  # characters of one line that are matched (a log may hold megabyte lines)
NO_MATCH = "no known failure matched"
_ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")



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


def _clean(lines: Iterable[str],
           prefixes: Sequence[LogPrefix]) -> Iterator[tuple[str, str, str | None]]:
    """Each line as shown (colours off), its message (prefix off) and its TP rank."""
    rank: str | None = None
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


def ranks_text(ranks: Iterable[str]) -> str:
    rs = sorted(set(ranks), key=lambda r: (len(r), r))
    return ", ".join(f"TP{r}" for r in rs) if rs else "not named in the log"


def diagnose(log: str | Iterable[str], failures: FailureCatalog) -> list[Diagnosis]:
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
    near = [p for _, alt, _, _ in anchors for p in alt.near]
    before = max((p.before for p in near), default=0)
    after = max((p.after for p in near), default=0)
    # One pass in C finds the few lines that contain any fingerprint's literal at all.
    needles = sorted({a[2] for a in anchors if a[2] is not None}, key=len, reverse=True)
    any_needle = re.compile("|".join(map(re.escape, needles))) \
        if needles and all(a[2] is not None for a in anchors) else None
    win = _Window(before + after + 1)
    pending: deque[int] = deque()  # candidate lines waiting for the lines after them
    hits: list[_Hit] = []
    for i, item in enumerate(_clean(lines, prefixes)):
        win.add(item)
        if any_needle is None or any_needle.search(item[1]):
            pending.append(i)
        while pending and pending[0] + after <= i:
            hits += _match_line(pending.popleft(), win, anchors, fingerprints)
    while pending:
        hits += _match_line(pending.popleft(), win, anchors, fingerprints)
    return _summarise(hits)


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
        values["occurrences"] = str(g.count)
        values["ranks"] = ranks_text(g.ranks)
        fill = Blank(values)
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

    @property
    def exit_code(self) -> int:
        # A known failure found is the job's finding (1); nothing matched is not an error (0).
        return 1 if self.diagnoses else 0

    def to_dict(self) -> dict:
        return to_dict(self.diagnoses, source=self.source)


def doctor(failures: FailureCatalog, log: str, stdin=None) -> DoctorReport:
    """Read LOGFILE (or standard input for "-") and diagnose it."""
    try:
        with open_log(log, stdin) as (lines, source):
            return DoctorReport(source, tuple(diagnose(lines, failures)))
    except (OSError, EOFError, zlib.error) as e:  # a truncated gzip, a read error midway
        raise InputError(f"cannot read {log if log != '-' else 'standard input'}: "
                         f"{getattr(e, 'strerror', None) or e}",
                         hint="pass the server's log as text or gzip") from None
