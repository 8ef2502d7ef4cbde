"""Apply imgbuild's compatibility patches to an installed package, inside the image.

Stdlib only: it runs on the image's own interpreter (Debian and Ubuntu bases have no
`patch` binary, and nothing but the venv is guaranteed). The host imports the same module
(`builder/checks/patches.py`) to check patches against a locked wheel in a scratch directory, so
the build and `imgbuild patches TARGET --check` decide with one implementation.

A patch set is a directory of `<id>.json` files, rendered from `images/patches/<id>.yaml`:

    {"id": ..., "package": "sglang", "versions": ">=0.5.7,<0.5.17", "fixes": ..., "upstream": ...,
     "variants": [{"versions": ..., "diff": "<unified diff, paths relative to site-packages>"}],
     "probe": "<python source>"}

For the installed version of `package`:

- inside `versions`: the variant whose `versions` contains it is applied. Every hunk must
  match exactly (no fuzz; only its line position may move). A hunk counts as present when
  its patched side is in the file and its original side is not, or, where upstream made the
  same change amid other code, when its changed lines (with the context between them and
  next to one of their own context lines) are there and the removed lines are not. A patch
  with every hunk present is *obsolete* (upstream has the change) and is not applied, unless
  this patcher applied it before (the report says so), which makes a second run a no-op.
  Presence is only ever used to skip a patch, never to write; the probes check the result.
- outside `versions`: never applied. If a variant's patched side is fully present the patch
  is *obsolete* (fixed upstream), otherwise *not-applicable*.

Anything else (a hunk that matches neither side, a file that is partly patched, a missing
file) fails the whole run with exit status 1, naming the patch, the file and the hunk, and
writes nothing: all patches are computed in memory first.

After writing, each patched file's row in the package's RECORD gets its new sha256 and
size (so `pip check`, `pip uninstall` and RECORD verification stay sound), existing
bytecode for it is recompiled in the same invalidation mode, and a report (`patches.json`)
lists every patch with its status and the hashes of the files it leaves.

    python patcher.py --patches DIR [--site-packages SP] [--report FILE] [--dry-run]
    python patcher.py --probe --patches DIR [--site-packages SP] [--report FILE]

`--probe` runs each applied or obsolete patch's probe (a few lines of Python that fail
without the change) and prints a JSON report; exit 1 if any probe fails.
"""

from __future__ import annotations
import __future__ as _future

import ast
import base64
import csv
import hashlib
import io
import json
import os
import re
import sys
import tempfile
import traceback
from dataclasses import dataclass, field
from pathlib import Path

REPORT_FORMAT = 1

# Statuses: what happens to a patch for the installed version.
APPLIES = "applies"  # would be applied (a check) / was applied just now
APPLIED = "applied"  # in effect because this patcher applied it (now or before)
OBSOLETE = "obsolete"  # the change is already in the package: nothing to do
NOT_APPLICABLE = "not-applicable"  # outside the patch's versions and not present
FAILS = "fails"


class PatchError(Exception):
    """A patch that cannot be applied: the message names patch, file and hunk."""


# --- unified diffs ------------------------------------------------------------------------

_HUNK = re.compile(r"^@@ -(\d+)(?:,(\d+))? \+(\d+)(?:,(\d+))? @@(.*)$")


@dataclass
class Hunk:
    index: int  # 1-based, in its file
    header: str  # "@@ -300,7 +300,18 @@ ..."
    old_start: int
    old_len: int
    new_start: int
    new_len: int
    old: list[str] = field(default_factory=list)  # lines with their line ending
    new: list[str] = field(default_factory=list)
    context: int = 0
    body: list[tuple[str, str]] = field(default_factory=list)  # (tag, line) in diff order

    @property
    def label(self) -> str:
        return f"hunk #{self.index} ({self.header.split(' @@')[0]} @@)"

    def core(self, side: str, pad: int = 0) -> list[str]:
        """One side's lines from the hunk's first to its last changed line, with `pad`
        context lines around (the outer context of the diff dropped)."""
        idx = [k for k, (t, _) in enumerate(self.body) if t != " "]
        lo, hi = max(0, idx[0] - pad), min(len(self.body), idx[-1] + 1 + pad)
        drop = "+" if side == "old" else "-"
        return [ln for t, ln in self.body[lo:hi] if t != drop]

    def core_neighbours(self) -> tuple[str | None, str | None]:
        """The context lines just before and after the changed span (None at the edges)."""
        idx = [k for k, (t, _) in enumerate(self.body) if t != " "]
        before = self.body[idx[0] - 1][1] if idx[0] > 0 else None
        after = self.body[idx[-1] + 1][1] if idx[-1] + 1 < len(self.body) else None
        return before, after


@dataclass
class FileDiff:
    path: str  # relative to site-packages
    hunks: list[Hunk]


def split_lines(text: str) -> list[str]:
    """Lines with their endings, split at "\n" only (str.splitlines also splits at form feeds
    and other separators that `diff` keeps inside a line)."""
    parts = text.split("\n")
    out = [p + "\n" for p in parts[:-1]]
    if parts[-1]:
        out.append(parts[-1])
    return out


def _strip_prefix(name: str) -> str:
    name = name.split("\t", 1)[0].strip()
    if name.startswith(("a/", "b/")):
        name = name[2:]
    return name


def parse_diff(text: str) -> list[FileDiff]:
    """Parse a unified diff strictly; raise ValueError with the line number on anything odd."""
    lines = split_lines(text)
    files: list[FileDiff] = []
    i = 0
    while i < len(lines):
        ln = lines[i]
        if ln.startswith("--- "):
            if i + 1 >= len(lines) or not lines[i + 1].startswith("+++ "):
                raise ValueError(f"line {i + 1}: '--- ' not followed by '+++ '")
            old, new = _strip_prefix(ln[4:]), _strip_prefix(lines[i + 1][4:])
            if old == "/dev/null" or new == "/dev/null":
                raise ValueError(f"line {i + 1}: patches change existing files only "
                                 "(no created or deleted files)")
            if old != new:
                raise ValueError(f"line {i + 1}: old and new paths differ ({old} vs {new})")
            if new.startswith("/") or ".." in Path(new).parts:
                raise ValueError(f"line {i + 1}: path must be relative to site-packages: {new}")
            files.append(FileDiff(new, []))
            i += 2
            continue
        m = _HUNK.match(ln.rstrip("\r\n"))
        if m:
            if not files:
                raise ValueError(f"line {i + 1}: hunk before any '--- '/'+++ ' file header")
            h = Hunk(len(files[-1].hunks) + 1, ln.rstrip("\r\n"), int(m.group(1)),
                     int(m.group(2) if m.group(2) is not None else 1), int(m.group(3)),
                     int(m.group(4) if m.group(4) is not None else 1))
            i += 1
            n_old = n_new = 0
            last: list[list[str]] = []
            while i < len(lines) and (n_old < h.old_len or n_new < h.new_len):
                body = lines[i]
                tag, rest = (body[0], body[1:]) if body not in ("\n", "\r\n") else (" ", body)
                if tag == " ":
                    h.old.append(rest)
                    h.new.append(rest)
                    n_old += 1
                    n_new += 1
                    h.context += 1
                    last = [h.old, h.new]
                elif tag == "-":
                    h.old.append(rest)
                    n_old += 1
                    last = [h.old]
                elif tag == "+":
                    h.new.append(rest)
                    n_new += 1
                    last = [h.new]
                elif tag == "\\" and last:
                    # "\ No newline at end of file" between the sides (GNU diff writes it
                    # after the old side's last line when only the new side gains one).
                    for side in last:
                        side[-1] = side[-1].rstrip("\r\n")
                    h.body[-1] = (h.body[-1][0], h.body[-1][1].rstrip("\r\n"))
                    i += 1
                    continue
                if tag in " -+":
                    h.body.append((tag, rest))
                else:
                    raise ValueError(f"line {i + 1}: unexpected line in {h.header!r}: {body[:40]!r}")
                i += 1
            if n_old != h.old_len or n_new != h.new_len:
                raise ValueError(f"{files[-1].path}: {h.header}: the hunk has {n_old} old and "
                                 f"{n_new} new lines, its header says {h.old_len} and {h.new_len}")
            if i < len(lines) and lines[i].startswith("\\") and last:
                for side in last:
                    side[-1] = side[-1].rstrip("\r\n")
                h.body[-1] = (h.body[-1][0], h.body[-1][1].rstrip("\r\n"))
                i += 1
            if h.context == 0:
                raise ValueError(f"{files[-1].path}: {h.header}: a hunk needs context lines "
                                 "(make the diff with `diff -u`)")
            files[-1].hunks.append(h)
            continue
        if files and files[-1].hunks and ln.strip():
            raise ValueError(f"line {i + 1}: text after a hunk that is not a hunk: {ln[:40]!r}")
        i += 1  # leading text (a `diff -u` command line, comments) is allowed before files
    if not files:
        raise ValueError("no file in the diff (expected '--- a/PATH' and '+++ b/PATH' lines)")
    for f in files:
        if not f.hunks:
            raise ValueError(f"{f.path}: no hunks")
    return files


# --- applying, strictly -------------------------------------------------------------------

def _find_all(lines: list[str], block: list[str], start: int) -> list[int]:
    n = len(block)
    first = block[0]
    return [p for p in range(start, len(lines) - n + 1)
            if lines[p] == first and lines[p:p + n] == block]


def _nearest(found: list[int], expected: int) -> int:
    return min(found, key=lambda p: (abs(p - expected), p))


def _mismatch(lines: list[str], block: list[str], at: int) -> str:
    """Why the original side is not in the file: where it comes closest, and the first line
    that differs there."""
    best, best_score = max(0, min(at, len(lines))), -1
    for p in range(0, max(1, len(lines) - len(block) + 1)):
        score = sum(1 for k, want in enumerate(block) if p + k < len(lines) and lines[p + k] == want)
        if score > best_score or (score == best_score and abs(p - at) < abs(best - at)):
            best, best_score = p, score
    for k, want in enumerate(block):
        got = lines[best + k] if best + k < len(lines) else None
        if got != want:
            shown = "end of file" if got is None else repr(got.rstrip("\r\n"))
            return (f"closest at line {best + 1} ({best_score} of {len(block)} lines match); "
                    f"line {best + k + 1}: expected {want.rstrip(chr(13) + chr(10))!r}, "
                    f"found {shown}")
    return "the context is ambiguous"


@dataclass
class FileResult:
    path: str
    states: list[str]  # per hunk: "apply" | "present"
    new_text: str | None  # the patched text, when any hunk applies
    error: str | None = None


def apply_file(fd: FileDiff, text: str) -> FileResult:
    """Apply one file's hunks to `text`; never raises for a mismatch, it reports it."""
    lines = split_lines(text)
    states: list[str] = []
    floor = 0  # hunks apply in order: each searches after the previous one
    prev_end_old = 0  # where the previous hunk ended, in the diff's old numbering
    for h in fd.hunks:
        expected = floor + max(0, (h.old_start - 1) - prev_end_old)
        olds = _find_all(lines, h.old, floor)
        news = _find_all(lines, h.new, floor)
        if olds and news:
            return FileResult(fd.path, states, None,
                              f"{h.label}: both the original and the patched text are in the "
                              f"file (at lines {olds[0] + 1} and {news[0] + 1}); refusing to guess")
        if olds:
            at = _nearest(olds, expected)
            lines[at:at + len(h.old)] = h.new
            states.append("apply")
            floor = at + len(h.new)
        elif news:
            at = _nearest(news, expected)
            states.append("present")
            floor = at + len(h.new)
        else:
            # Upstream may carry the same change with different code around it: the changed
            # lines (and the context between them) present, the original ones gone, counts as
            # present. Never used to write: only to tell obsolete from broken.
            removes = any(t == "-" for t, _ in h.body)
            core_new, core_old = h.core("new"), h.core("old")
            before, after = h.core_neighbours()
            # The changed span must sit next to at least one of its own context lines.
            found = [p for p in (_find_all(lines, core_new, floor) if core_new else [])
                     if (before is not None and p > 0 and lines[p - 1] == before)
                     or (after is not None and p + len(core_new) < len(lines)
                         and lines[p + len(core_new)] == after)]
            if found and not (removes and core_old and _find_all(lines, core_old, floor)):
                states.append("present")
                floor = _nearest(found, expected) + len(core_new)
            else:
                return FileResult(fd.path, states, None,
                                  f"{h.label} does not apply: "
                                  f"{_mismatch(lines, h.old, expected)}")
        prev_end_old = h.old_start - 1 + h.old_len
    changed = "apply" in states
    return FileResult(fd.path, states, "".join(lines) if changed else None)


@dataclass
class Outcome:
    """One variant of one patch against the current files."""

    state: str  # "apply" | "present" | "fail"
    new_texts: dict[str, str] = field(default_factory=dict)
    error: str | None = None


def apply_variant(diff: str, read) -> Outcome:
    """`read(relpath) -> str | None` gives current file text (None: no such file)."""
    try:
        files = parse_diff(diff)
    except ValueError as e:
        return Outcome("fail", error=f"the diff is malformed: {e}")
    states: list[tuple[str, Hunk, str]] = []
    texts: dict[str, str] = {}
    for fd in files:
        text = read(fd.path)
        if text is None:
            return Outcome("fail", error=f"{fd.path}: no such file in site-packages")
        r = apply_file(fd, text)
        if r.error:
            return Outcome("fail", error=f"{fd.path}: {r.error}")
        states += [(s, h, fd.path) for s, h in zip(r.states, fd.hunks)]
        if r.new_text is not None:
            texts[fd.path] = r.new_text
    kinds = {s for s, _, _ in states}
    if kinds == {"present"}:
        return Outcome("present")
    if kinds == {"apply"}:
        return Outcome("apply", texts)
    there = ", ".join(f"{p} {h.label}" for s, h, p in states if s == "present")
    missing = ", ".join(f"{p} {h.label}" for s, h, p in states if s == "apply")
    return Outcome("fail", error=f"partly present: {there} already in the package, but "
                                 f"{missing} not; the package has part of the change, so this "
                                 "version needs its own diff variant")


# --- versions (PEP 440, the subset a stdlib script needs) ---------------------------------

_VER = re.compile(r"^\s*v?(?:\d+!)?(\d+(?:\.\d+)*)(?:[-_.]?(a|b|rc|alpha|beta|c|pre|preview)"
                  r"[-_.]?(\d*))?(?:(?:[-_.]?(?:post|rev|r)[-_.]?(\d*))|-(\d+))?"
                  r"(?:[-_.]?dev[-_.]?(\d*))?(?:\+[a-z0-9._-]+)?\s*$", re.I)
_PRE = {"a": 0, "alpha": 0, "b": 1, "beta": 1, "rc": 2, "c": 2, "pre": 2, "preview": 2}


@dataclass(frozen=True)
class _V:
    release: tuple[int, ...]  # trailing zeros dropped: 1.0 == 1.0.0
    pre: tuple[int, int] | None
    post: int | None
    dev: int | None

    @property
    def key(self) -> tuple:
        # PEP 440 order: X.devN < X.aN < X.bN < X.rcN < X < X.postN
        if self.pre is None and self.post is None and self.dev is not None:
            pre = (-1, 0)
        else:
            pre = self.pre if self.pre is not None else (3, 0)
        return (self.release, pre, -1 if self.post is None else self.post,
                float("inf") if self.dev is None else self.dev)


def _parse_version(text: str) -> _V:
    m = _VER.match(text)
    if not m:
        raise ValueError(f"not a PEP 440 version: {text!r}")
    rel = [int(x) for x in m.group(1).split(".")]
    while len(rel) > 1 and rel[-1] == 0:
        rel.pop()
    pre = (_PRE[m.group(2).lower()], int(m.group(3) or 0)) if m.group(2) else None
    post = m.group(4) if m.group(4) is not None else m.group(5)
    dev = m.group(6)
    return _V(tuple(rel), pre, int(post or 0) if post is not None else None,
              int(dev or 0) if dev is not None else None)


def version_in(version: str, spec: str) -> bool:
    """`version` satisfies every clause of the PEP 440 specifier set `spec`.

    The comparison operators a patch's `versions:` needs (==, !=, <, <=, >, >=, ~=, and ==X.*),
    with PEP 440's exclusive-ordering rules: `<V` admits no pre-release of V, `>V` no
    post-release of V. (The host checks every specifier with `packaging` as well.)
    """
    v = _parse_version(version)
    for clause in (c.strip() for c in spec.split(",")):
        if not clause:
            continue
        m = re.match(r"^(~=|===|==|!=|>=|<=|>|<)\s*(\S+)$", clause)
        if not m:
            raise ValueError(f"not a version specifier: {clause!r}")
        op, want = m.groups()
        if want.endswith(".*"):
            if op not in ("==", "!="):
                raise ValueError(f"'.*' only goes with == or !=: {clause!r}")
            prefix = [int(x) for x in want[:-2].split(".")]
            full = list(v.release) + [0] * max(0, len(prefix) - len(v.release))
            ok = (full[:len(prefix)] == prefix) == (op == "==")
        elif op == "===":
            ok = version.strip().lower() == want.lower()
        else:
            w = _parse_version(want)
            if op == "~=":
                # The prefix is the release segment without its last number; a pre-, post- or
                # dev-release suffix only raises the floor (~=1.4rc1 is >=1.4rc1, ==1.*).
                parts = [int(x) for x in _VER.match(want).group(1).split(".")][:-1]
                if len(parts) < 1:
                    raise ValueError(f"~= needs at least two release numbers: {clause!r}")
                full = list(v.release) + [0] * max(0, len(parts) - len(v.release))
                ok = v.key >= w.key and full[:len(parts)] == parts
            elif op == "==":
                ok = v.key == w.key
            elif op == "!=":
                ok = v.key != w.key
            elif op == ">=":
                ok = v.key >= w.key
            elif op == "<=":
                ok = v.key <= w.key
            elif op == "<":
                # <V is <V.dev0 unless V is a pre- or dev-release: <1.0 admits no 1.0rc1,
                # <1.0.post1 admits 1.0rc1 but no 1.0.post1.dev1 (as packaging reads PEP 440).
                floor = w if w.pre is not None or w.dev is not None else _V(w.release, None,
                                                                            w.post, 0)
                ok = v.key < floor.key
            else:  # ">": >V admits no post-release of V unless V is a post- or dev-release
                ok = v.key > w.key and not (w.post is None and w.dev is None
                                            and v.release == w.release and v.pre == w.pre
                                            and v.post is not None)
        if not ok:
            return False
    return True


# --- the installed package ----------------------------------------------------------------

def canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


@dataclass
class Dist:
    name: str
    version: str
    dist_info: Path  # the .dist-info directory

    @property
    def record(self) -> Path:
        return self.dist_info / "RECORD"


def find_dist(site: Path, package: str) -> Dist | None:
    """The installed distribution `package` in `site`, from its .dist-info METADATA."""
    from email.parser import HeaderParser

    want = canonical(package)
    for d in sorted(site.glob("*.dist-info")):
        meta = d / "METADATA"
        if not meta.is_file():
            continue
        hdr = HeaderParser().parsestr(meta.read_text(encoding="utf-8", errors="replace"))
        if canonical(hdr.get("Name", "")) == want:
            return Dist(hdr.get("Name", package), hdr.get("Version", ""), d)
    return None


def record_hash(data: bytes) -> str:
    return "sha256=" + base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()


def update_record(dist: Dist, site: Path, paths: list[str]) -> None:
    """Rewrite the RECORD rows of `paths` (and of their bytecode) with their current hash and
    size; every other line keeps its bytes."""
    record = dist.record
    raw = record.read_bytes().decode("utf-8")
    wanted = set(paths)
    for p in paths:
        for pyc in _pycs(site / p):
            wanted.add(pyc.relative_to(site).as_posix())
    seen: set[str] = set()
    out = []
    for line in split_lines(raw):
        row = next(csv.reader([line.rstrip("\r\n")]), [])
        if row and _norm(row[0]) in wanted:
            rel = _norm(row[0])
            seen.add(rel)
            if len(row) >= 2 and (row[1] or rel in paths):
                data = (site / rel).read_bytes()
                buf = io.StringIO()
                end = line[len(line.rstrip("\r\n")):]  # keep the line's own terminator
                csv.writer(buf, lineterminator=end).writerow([row[0], record_hash(data), len(data)])
                line = buf.getvalue()
        out.append(line)
    missing = [p for p in paths if p not in seen]
    if missing:
        raise PatchError(f"{record.relative_to(site)} does not list {', '.join(missing)}: "
                         "the package's RECORD cannot be kept consistent")
    _atomic_write(record, "".join(out).encode("utf-8"))


def _norm(path: str) -> str:
    """A RECORD path relative to site-packages, normalized ('../../bin/x' stays as it is)."""
    return os.path.normpath(path).replace(os.sep, "/") if not path.startswith("..") else path


def verify_record(dist: Dist, site: Path) -> list[str]:
    """Every RECORD row with a hash matches its file's sha256 and size; returns the problems."""
    problems = []
    for row in csv.reader(io.StringIO(dist.record.read_text(encoding="utf-8"))):
        if len(row) < 2 or not row[1]:
            continue
        p = site / row[0]
        if not p.is_file():
            problems.append(f"{row[0]}: listed in RECORD, missing")
            continue
        data = p.read_bytes()
        if row[1] != record_hash(data):
            problems.append(f"{row[0]}: RECORD says {row[1]}, file is {record_hash(data)}")
        elif len(row) > 2 and row[2] and int(row[2]) != len(data):
            problems.append(f"{row[0]}: RECORD says {row[2]} bytes, file has {len(data)}")
    return problems


def _pycs(src: Path) -> list[Path]:
    import importlib.util

    out = []
    for opt in ("", 1, 2):
        try:
            c = Path(importlib.util.cache_from_source(str(src), optimization=opt))
        except (NotImplementedError, ValueError):
            continue
        if c.is_file():
            out.append(c)
    return out


def _recompile(src: Path) -> None:
    """Recompile bytecode that exists for `src`, keeping its invalidation mode and level."""
    import py_compile

    for pyc in _pycs(src):
        head = pyc.read_bytes()[:16]
        flags = int.from_bytes(head[4:8], "little") if len(head) >= 8 else 0
        mode = {0: py_compile.PycInvalidationMode.TIMESTAMP,
                1: py_compile.PycInvalidationMode.UNCHECKED_HASH,
                3: py_compile.PycInvalidationMode.CHECKED_HASH}.get(
                    flags, py_compile.PycInvalidationMode.TIMESTAMP)
        # Each file at its own level: 0 for the plain .pyc (py_compile's -1 would take the
        # level of the interpreter running this, e.g. under PYTHONOPTIMIZE).
        opt = 2 if ".opt-2." in pyc.name else 1 if ".opt-1." in pyc.name else 0
        py_compile.compile(str(src), cfile=str(pyc), doraise=True, invalidation_mode=mode,
                           optimize=opt)


def _atomic_write(path: Path, data: bytes) -> None:
    mode = path.stat().st_mode & 0o7777 if path.exists() else 0o644
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.chmod(tmp, mode)
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


# --- the patch set ------------------------------------------------------------------------

def load_patch_dir(d: Path) -> list[dict]:
    """Every <id>.json in `d`, sorted by id (the order they apply in)."""
    out = []
    for p in sorted(Path(d).glob("*.json")):
        doc = json.loads(p.read_text(encoding="utf-8"))
        for k in ("id", "package", "versions", "variants"):
            if k not in doc:
                raise PatchError(f"{p}: not a patch (no {k!r})")
        out.append(doc)
    return out


@dataclass
class Decision:
    id: str
    package: str
    version: str | None
    status: str  # APPLIES / APPLIED / OBSOLETE / NOT_APPLICABLE / FAILS
    detail: str
    variant: str | None = None  # the variant's versions specifier
    new_texts: dict[str, str] = field(default_factory=dict)
    files: list[str] = field(default_factory=list)


def _files_of(doc: dict) -> list[str]:
    out: list[str] = []
    for v in doc["variants"]:
        try:
            out += [f.path for f in parse_diff(v["diff"]) if f.path not in out]
        except ValueError:
            pass
    return out


def decide(doc: dict, site: Path, overlay: dict[str, str], previous: dict | None = None) -> Decision:
    """What to do with one patch against `site` (with earlier patches' results in `overlay`)."""
    pid, pkg = doc["id"], doc["package"]
    dist = find_dist(site, pkg)
    if dist is None:
        return Decision(pid, pkg, None, NOT_APPLICABLE, f"{pkg} is not installed")
    ver = dist.version

    def read(rel: str) -> str | None:
        if rel in overlay:
            return overlay[rel]
        p = site / rel
        return p.read_bytes().decode("utf-8") if p.is_file() else None

    files = _files_of(doc)
    in_range = version_in(ver, doc["versions"])
    variants = doc["variants"]
    if in_range:
        matching = [v for v in variants if version_in(ver, v["versions"])]
        if not matching:
            return Decision(pid, pkg, ver, FAILS,
                            f"{pkg} {ver} is in the patch's versions ({doc['versions']}) but no "
                            "diff variant covers it", files=files)
        errors = []
        for v in matching:
            o = apply_variant(v["diff"], read)
            if o.state == "apply":
                return Decision(pid, pkg, ver, APPLIES, "applies cleanly", v["versions"],
                                o.new_texts, files)
            if o.state == "present":
                if previous and previous.get("status") == APPLIED and \
                        previous.get("version") == ver:
                    # Applied by an earlier run: report it as that run did (same bytes).
                    return Decision(pid, pkg, ver, APPLIED, previous.get("detail") or APPLIED,
                                    v["versions"], files=files)
                return Decision(pid, pkg, ver, OBSOLETE,
                                f"{pkg} {ver} already has the change; not applied",
                                v["versions"], files=files)
            errors.append(o.error)
        return Decision(pid, pkg, ver, FAILS, f"patch {pid}: " + "; ".join(errors),
                        matching[0]["versions"], files=files)
    for v in reversed(variants):  # the newest variant is the likeliest to match upstream
        if apply_variant(v["diff"], read).state == "present":
            return Decision(pid, pkg, ver, OBSOLETE,
                            f"{pkg} {ver} is outside {doc['versions']} and already has the "
                            "change (fixed upstream)", v["versions"], files=files)
    return Decision(pid, pkg, ver, NOT_APPLICABLE,
                    f"{pkg} {ver} is outside the patch's versions ({doc['versions']})",
                    files=files)


def plan(docs: list[dict], site: Path, previous: dict[str, dict] | None = None) -> list[Decision]:
    """Decide every patch in order, each seeing the files as the ones before left them."""
    overlay: dict[str, str] = {}
    out = []
    for doc in docs:
        d = decide(doc, site, overlay, (previous or {}).get(doc["id"]))
        overlay.update(d.new_texts)
        out.append(d)
    return out


def read_report(path: Path | None) -> dict[str, dict]:
    if path is None or not path.is_file():
        return {}
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
        return {p["id"]: p for p in doc.get("patches", [])}
    except (ValueError, KeyError, TypeError, AttributeError):  # not a report: none
        return {}


def apply(docs: list[dict], site: Path, report: Path | None, *, dry_run: bool = False) -> dict:
    """Apply the patch set to `site`; raise PatchError (nothing written) if any patch fails."""
    site = Path(site)
    decisions = plan(docs, site, read_report(report))
    failed = [d for d in decisions if d.status == FAILS]
    if failed:
        raise PatchError("\n".join(d.detail if d.detail.startswith("patch ")
                                   else f"patch {d.id}: {d.detail}" for d in failed))
    written: dict[str, list[str]] = {}
    if not dry_run:
        for d in decisions:
            for rel, text in d.new_texts.items():
                _atomic_write(site / rel, text.encode("utf-8"))
                written.setdefault(d.package, [])
                if rel not in written[d.package]:
                    written[d.package].append(rel)
        for pkg, rels in written.items():
            for rel in rels:
                _recompile(site / rel)
            dist = find_dist(site, pkg)
            assert dist is not None
            update_record(dist, site, rels)
    entries = []
    for d in decisions:
        status = APPLIED if d.status == APPLIES and not dry_run else d.status
        detail = "applied cleanly" if d.status == APPLIES and not dry_run else d.detail
        hashes = {}
        for rel in d.files:
            p = site / rel
            if p.is_file():
                hashes[rel] = record_hash(p.read_bytes())
        entries.append({"id": d.id, "package": d.package, "version": d.version,
                        "status": status, "variant": d.variant, "detail": detail,
                        "files": hashes})
    doc = {"format": REPORT_FORMAT, "site_packages": str(site), "patches": entries,
           "applied": [e["id"] for e in entries if e["status"] == APPLIED]}
    if report is not None and not dry_run:
        report.parent.mkdir(parents=True, exist_ok=True)
        _atomic_write(report, (json.dumps(doc, indent=2, sort_keys=True) + "\n").encode())
    return doc


# --- probes -------------------------------------------------------------------------------

def _allowed_import(node: ast.stmt, modules: tuple[str, ...]) -> bool:
    if isinstance(node, ast.Import):
        tops = [a.name.split(".")[0] for a in node.names]
    elif isinstance(node, ast.ImportFrom):
        if node.level or node.module is None or node.module == "__future__":
            return False
        tops = [node.module.split(".")[0]]
    else:
        return False
    stdlib = getattr(sys, "stdlib_module_names", ())
    return all(t in stdlib or t in modules for t in tops)


def load_source(path: Path, names: tuple[str, ...], modules: tuple[str, ...] = (),
                env: dict | None = None) -> dict:
    """The named top-level functions/classes of a source file, without importing its package.

    `Class.method` takes one method out of its class, undecorated, as a plain function (so
    a test can call it with a stand-in `self`/`cls`). The file's top-level imports run only
    for the standard library and `modules`; everything else it needs comes from `env`.
    Annotations are never evaluated (compiled as `from __future__ import annotations`).
    """
    tree = ast.parse(Path(path).read_text(encoding="utf-8"), str(path))
    body: list[ast.stmt] = [n for n in tree.body if _allowed_import(n, modules)]
    top = {n.name: n for n in tree.body
           if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))}
    for name in names:
        cls, _, meth = name.partition(".")
        if cls not in top:
            raise LookupError(f"{path}: no top-level {cls!r}")
        if not meth:
            body.append(top[cls])
            continue
        node = next((n for n in getattr(top[cls], "body", [])
                     if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)) and n.name == meth),
                    None)
        if node is None:
            raise LookupError(f"{path}: class {cls} has no method {meth!r}")
        node = ast.parse(ast.unparse(node)).body[0]
        node.decorator_list = []
        node.name = f"{cls}__{meth}"
        body.append(node)
    mod = ast.Module(body=body, type_ignores=[])
    ast.fix_missing_locations(mod)
    code = compile(mod, str(path), "exec", flags=_future.annotations.compiler_flag,
                   dont_inherit=True)
    ns: dict = {"__name__": f"imgbuild_probe_{Path(path).stem}", "__file__": str(path)}
    ns.update(env or {})
    exec(code, ns)
    return {n: ns[n.replace(".", "__")] for n in names}


def run_probe(doc: dict, site: Path) -> tuple[bool, str]:
    """Run one patch's probe against `site`; (passed, detail)."""
    site = Path(site)
    dist = find_dist(site, doc["package"])

    def load(relpath: str, *names: str, modules: tuple[str, ...] = (), env: dict | None = None):
        return load_source(site / relpath, names, modules, env)

    g = {"__name__": f"imgbuild_probe_{doc['id']}", "load": load, "site_packages": site,
         "version": dist.version if dist else None}
    try:
        exec(compile(doc.get("probe") or "", f"<probe {doc['id']}>", "exec", dont_inherit=True), g)
    except Exception as e:  # noqa: BLE001 - any failure of a probe is its result
        tb = traceback.extract_tb(e.__traceback__)
        line = next((f.lineno for f in reversed(tb) if f.filename.startswith("<probe")), None)
        where = f" (line {line})" if line else ""
        if isinstance(e, AssertionError):
            # A bare assert says nothing: show its own line (a probe has no file to show it).
            src = (doc.get("probe") or "").splitlines()
            said = str(e) or (src[line - 1].strip() if line and line <= len(src) else "")
            return False, f"assertion failed: {said}{where}"
        return False, f"{type(e).__name__}: {e}{where}"
    return True, "passed"


def probe(docs: list[dict], site: Path, report: Path | None) -> dict:
    """Run the probes of the patches in effect (applied or obsolete)."""
    previous = read_report(report)
    results = []
    for d in plan(docs, Path(site), previous):
        doc = next(x for x in docs if x["id"] == d.id)
        rep = previous.get(d.id, {})
        if d.status in (APPLIED, OBSOLETE):
            label = rep.get("status", d.status) if d.status == APPLIED else d.status
            ok, detail = run_probe(doc, Path(site)) if doc.get("probe") else (True, "no probe")
            results.append({"id": d.id, "status": label, "probe": "pass" if ok else "fail",
                            "detail": detail, "version": d.version})
        elif d.status == APPLIES:
            results.append({"id": d.id, "status": "not-applied", "probe": "fail",
                            "detail": "the patch applies but is not in effect: the patch layer "
                                      "did not run or was undone", "version": d.version})
        elif d.status == NOT_APPLICABLE:
            results.append({"id": d.id, "status": d.status, "probe": "skipped",
                            "detail": d.detail, "version": d.version})
        else:
            results.append({"id": d.id, "status": d.status, "probe": "fail", "detail": d.detail,
                            "version": d.version})
    return {"ok": all(r["probe"] != "fail" for r in results), "probes": results}


# --- command line -------------------------------------------------------------------------

def default_site_packages() -> Path:
    import sysconfig

    return Path(sysconfig.get_paths()["purelib"])


def main(argv: list[str] | None = None) -> int:
    import argparse

    ap = argparse.ArgumentParser(description="Apply (or probe) imgbuild's patches.")
    ap.add_argument("--patches", required=True, type=Path, help="directory of <id>.json patches")
    ap.add_argument("--site-packages", type=Path, default=None,
                    help="where the package is installed (default: this interpreter's purelib)")
    ap.add_argument("--report", type=Path, default=None,
                    help="patches.json to write/read (default: next to the patches directory)")
    ap.add_argument("--probe", action="store_true", help="run the probes; print a JSON report")
    ap.add_argument("--dry-run", action="store_true", help="decide and report; write nothing")
    a = ap.parse_args(argv)
    site = a.site_packages or default_site_packages()
    report = a.report or a.patches.resolve().parent / "patches.json"
    try:
        docs = load_patch_dir(a.patches)
        if a.probe:
            out = probe(docs, site, report)
            print(json.dumps(out, indent=2, sort_keys=True))
            return 0 if out["ok"] else 1
        doc = apply(docs, site, report, dry_run=a.dry_run)
    except PatchError as e:
        print(f"imgbuild patcher: FAILED\n{e}", file=sys.stderr)
        return 1
    for e in doc["patches"]:
        print(f"imgbuild patcher: {e['id']}: {e['status']} ({e['package']} {e['version']}): "
              f"{e['detail']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
