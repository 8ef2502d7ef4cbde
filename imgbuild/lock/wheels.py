"""Locked wheels, read without installing: find on the index, fetch, verify, read members.

The drift check (imgbuild/checks/drift.py) needs the *source* of the exact files a lock pins. This
module finds those files on a package index (PEP 691 JSON where offered, else PEP 503 HTML),
picks one whose sha256 the lock pins, and exposes its members through `zipfile` without
extracting or importing anything.

Two ways to get the bytes:

- full: stream the whole wheel into a content-addressed cache
  (`$IMGBUILD_CACHE or ~/.cache/imgbuild` + `/wheels/<sha256>/<filename>`), hashing while
  writing, and rename into place only when the sha256 matches the lock. A second run reads
  the cache and touches no network.
- range: for big wheels (vLLM's is ~400 MB, nearly all compiled kernels) fetch only the zip's
  central directory and the members asked for, with HTTP Range requests that are coalesced
  into a few large spans. The whole-file hash cannot be checked without the whole file, so
  the file is chosen by the index's sha256 (which must be one the lock pins) and every member
  read is checked against the wheel's own RECORD. If the server ignores Range (answers 200),
  the response already streaming is taken as a full download instead.
"""

from __future__ import annotations

import base64
import csv
import hashlib
import io
import json
import logging
import os
import re
import struct
import tempfile
import threading
import zipfile
import zlib
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from email.parser import BytesHeaderParser
from html.parser import HTMLParser
from pathlib import Path
from typing import TYPE_CHECKING
from urllib.parse import urldefrag, urljoin

from packaging.tags import Tag, cpython_tags
from packaging.tags import compatible_tags as _compat
from packaging.utils import InvalidWheelFilename, canonicalize_name, parse_wheel_filename
from packaging.version import InvalidVersion, Version

from ..catalog.indexes import redact
from ..errors import EnvError, JobFailed
from ..fsutil import atomic_write_text
from .lockfile import LockedPackage

if TYPE_CHECKING:
    # Imported where a request is made: reading cached wheels (check-model, drift on a warm
    # cache) never does, and requests with urllib3 and ssl costs ~90 ms of start-up here.
    import requests

log = logging.getLogger(__name__)

PYPI_SIMPLE = "https://pypi.org/simple/"
# PEP 691: ask for JSON, accept HTML (pypiserver, plain directory indexes serve only that).
ACCEPT = ("application/vnd.pypi.simple.v1+json, "
          "application/vnd.pypi.simple.v1+html;q=0.2, text/html;q=0.01")
TIMEOUT = (10, 60)  # connect, read (seconds)
CHUNK = 1 << 20
# Wheels at least this big are read by Range when the server allows it. sglang (~40 MB) and
# transformers (~12 MB) are cheaper to fetch whole once and keep; vLLM is not.
RANGE_MIN_BYTES = int(float(os.environ.get("IMGBUILD_RANGE_MIN_MB", "64")) * (1 << 20))
# Two wanted members closer than this are fetched in one request: one round trip costs more
# than reading a few hundred KB of a compiled kernel we then throw away.
RANGE_MERGE_GAP = 1 << 20
RANGE_TAIL = 1 << 20  # first read: the end of the file, where the central directory is


def cache_root() -> Path:
    """Root of imgbuild's caches; IMGBUILD_CACHE overrides it (tests point it at tmp)."""
    env = os.environ.get("IMGBUILD_CACHE")
    return Path(env).expanduser() if env else Path.home() / ".cache" / "imgbuild"


# Where the host names a mirror in place of PyPI, first found wins (uv's own order, then pip's).
MIRROR_VARS = ("UV_DEFAULT_INDEX", "UV_INDEX_URL", "PIP_INDEX_URL")


def mirror_index() -> str | None:
    """The index the host names in place of PyPI (a mirror behind a firewall, credentials and
    all), or None for PyPI itself. Lock and build both use it: hash pins make its files the
    same bytes, so it is no input of the content key."""
    return next((os.environ[v] for v in MIRROR_VARS if os.environ.get(v)), None)


def default_index_urls() -> tuple[str, ...]:
    """The default index, as uv would pick it: UV_DEFAULT_INDEX, UV_INDEX_URL, PIP_INDEX_URL."""
    return (mirror_index() or PYPI_SIMPLE,)


def index_urls(extra: Iterable[str] = ()) -> tuple[str, ...]:
    """The default index plus a target's extra indexes (LockRequest.extra_index_urls)."""
    out: list[str] = []
    for u in (*default_index_urls(), *extra):
        u = u if u.endswith("/") else u + "/"
        if u not in out:
            out.append(u)
    return tuple(out)


_local = threading.local()


def _session() -> requests.Session:
    # One session per thread: connection reuse matters (a first-version search makes dozens
    # of requests to the same host), and requests' Session is not documented thread-safe.
    import requests

    s = getattr(_local, "session", None)
    if s is None:
        s = requests.Session()
        adapter = requests.adapters.HTTPAdapter(
            max_retries=requests.adapters.Retry(total=3, backoff_factor=0.5,
                                                status_forcelist=(429, 500, 502, 503, 504),
                                                allowed_methods=("GET", "HEAD")))
        s.mount("http://", adapter)
        s.mount("https://", adapter)
        s.headers["User-Agent"] = "imgbuild-drift (+requests)"
        _local.session = s
    return s


# --- the index -----------------------------------------------------------------------------

@dataclass(frozen=True)
class IndexFile:
    """One file a project page lists."""

    filename: str
    url: str
    sha256: str | None  # hex, from the URL fragment or the JSON `hashes`
    size: int | None
    yanked: bool
    version: Version | None  # None for files that are not wheels
    tags: frozenset[Tag]
    index: str
    metadata_url: str | None = None  # PEP 658/714 core metadata, when the index offers it

    @property
    def is_wheel(self) -> bool:
        return self.version is not None


class _LinkParser(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.links: list[tuple[dict[str, str | None], str]] = []
        self.base: str | None = None
        self._cur: dict[str, str | None] | None = None
        self._text: list[str] = []

    def handle_starttag(self, tag, attrs):
        if tag == "base":
            self.base = dict(attrs).get("href")
        elif tag == "a":
            self._cur, self._text = dict(attrs), []

    def handle_data(self, data):
        if self._cur is not None:
            self._text.append(data)

    def handle_endtag(self, tag):
        if tag == "a" and self._cur is not None:
            self.links.append((self._cur, "".join(self._text).strip()))
            self._cur = None


def _wheel_info(filename: str) -> tuple[Version | None, frozenset[Tag]]:
    if not filename.endswith(".whl"):
        return None, frozenset()
    try:
        _, ver, _, tags = parse_wheel_filename(filename)
    except (InvalidWheelFilename, InvalidVersion):
        return None, frozenset()
    return ver, frozenset(tags)


def _parse_json(doc: dict, page: str, index: str) -> list[IndexFile]:
    out = []
    for f in doc.get("files", []):
        name = f.get("filename", "")
        ver, tags = _wheel_info(name)
        meta = f.get("core-metadata", f.get("data-dist-info-metadata"))
        url = urljoin(page, f["url"])
        out.append(IndexFile(name, url, (f.get("hashes") or {}).get("sha256"), f.get("size"),
                             bool(f.get("yanked")), ver, tags, index,
                             url + ".metadata" if meta else None))
    return out


def _parse_html(text: str, page: str, index: str) -> list[IndexFile]:
    p = _LinkParser()
    p.feed(text)
    base = urljoin(page, p.base) if p.base else page
    out = []
    for attrs, label in p.links:
        href = attrs.get("href")
        if not href:
            continue
        url, frag = urldefrag(urljoin(base, href))
        name = label or url.rsplit("/", 1)[-1]
        m = re.match(r"sha256=([0-9a-fA-F]{64})", frag or "")
        ver, tags = _wheel_info(name)
        meta = attrs.get("data-core-metadata", attrs.get("data-dist-info-metadata"))
        out.append(IndexFile(name, url, m.group(1).lower() if m else None, None,
                             "data-yanked" in attrs, ver, tags, index,
                             url + ".metadata" if meta and meta != "false" else None))
    return out


class IndexUnreachable(EnvError):
    """An index did not answer. Kept apart so a lookup can try the next index first."""


_pages: dict[tuple[str, str], list[IndexFile]] = {}
_pages_lock = threading.Lock()


def project_files(name: str, index_url: str) -> list[IndexFile]:
    """Every file one index lists for a project; [] when the index does not have it.

    Pages are memoized for the life of the process: one check reads each page several
    times (locate the locked file, list versions, fetch older versions).
    """
    key = (index_url, canonicalize_name(name))
    with _pages_lock:
        if key in _pages:
            return _pages[key]
    page = index_url.rstrip("/") + "/" + key[1] + "/"
    import requests

    try:
        r = _session().get(page, headers={"Accept": ACCEPT}, timeout=TIMEOUT)
    except requests.RequestException as e:
        raise IndexUnreachable(
            f"the package index {redact(index_url)} is unreachable",
            facts=[f"GET {redact(page)} failed: {type(e).__name__}: {str(e)[:200]}"],
            hint="check the network (proxy, CA bundle), or point UV_INDEX_URL at a reachable "
                 "mirror of PyPI") from None
    if r.status_code == 404:
        files: list[IndexFile] = []
    elif r.status_code in (401, 403):
        raise IndexUnreachable(
            f"the package index {redact(index_url)} refused access ({r.status_code})",
            facts=[f"GET {redact(page)} -> {r.status_code}"],
            hint="put the index's credentials in the URL (UV_INDEX_URL) or a .netrc")
    elif r.status_code != 200:
        raise IndexUnreachable(
            f"the package index {redact(index_url)} answered {r.status_code}",
            facts=[f"GET {redact(page)} -> {r.status_code} {r.reason}"],
            hint="try again later, or point UV_INDEX_URL at another mirror")
    elif r.headers.get("Content-Type", "").startswith("application/vnd.pypi.simple.v1+json"):
        files = _parse_json(r.json(), r.url, index_url)
    else:
        files = _parse_html(r.text, r.url, index_url)
    with _pages_lock:
        _pages[key] = files
    return files


def _all_files(name: str, urls: Iterable[str]) -> list[IndexFile]:
    files: list[IndexFile] = []
    for u in urls:
        files += project_files(name, u)
    return files


def list_versions(name: str, index_urls: Iterable[str] = (), *, prereleases: bool = False,
                  yanked: bool = False) -> list[Version]:
    """Versions with at least one wheel on any of the indexes, ascending.

    Pre-releases and yanked files are left out by default: "the first version that has it"
    means the first release a user would get from a `>=` requirement.
    """
    vers = {f.version for f in _all_files(name, index_urls or default_index_urls())
            if f.version is not None and (yanked or not f.yanked)}
    return sorted(v for v in vers if prereleases or not v.is_prerelease)


# --- choosing a file -------------------------------------------------------------------------

def compatible_tags(python: str | None, platform: str | None) -> frozenset[Tag]:
    """Tags a lock's target accepts, from its header ("3.12", "x86_64-manylinux_2_39")."""
    if not python or not platform or "-" not in platform:
        return frozenset()
    arch, plat = platform.split("-", 1)
    plats: list[str] = []
    m = re.match(r"manylinux_(\d+)_(\d+)$", plat)
    if m:
        major, minor = int(m.group(1)), int(m.group(2))
        legacy = {17: "manylinux2014", 12: "manylinux2010", 5: "manylinux1"}
        for k in range(minor, -1, -1):
            plats.append(f"manylinux_{major}_{k}_{arch}")
            if major == 2 and k in legacy:
                plats.append(f"{legacy[k]}_{arch}")
    plats.append(f"linux_{arch}")
    pyver = tuple(int(x) for x in python.split(".")[:2])
    return frozenset([*cpython_tags(pyver, platforms=plats), *_compat(pyver, platforms=plats)])


def _rank(f: IndexFile, accepted: frozenset[Tag]) -> tuple[int, int]:
    # Pure-Python wheels first (small, one per version), then what the target would install,
    # then any other build of the version: every locked wheel is built from the same source.
    if any(t.platform == "any" for t in f.tags):
        pref = 0
    elif accepted & f.tags:
        pref = 1
    else:
        pref = 2
    return pref, f.size if f.size is not None else 1 << 40


def locate_locked(pkg: LockedPackage, index_urls: Iterable[str] = (), *,
                  python: str | None = None, platform: str | None = None) -> IndexFile:
    """The index file whose sha256 is one the lock pins for `pkg`.

    Indexes are asked in order; one that is down is an error only if no other index has a
    matching file.
    """
    urls = tuple(index_urls) or default_index_urls()
    pinned = {h.split(":", 1)[1] for h in pkg.hashes if h.startswith("sha256:")}
    accepted = compatible_tags(python, platform)
    down: list[IndexUnreachable] = []
    seen: list[IndexFile] = []
    for u in urls:
        try:
            files = project_files(pkg.name, u)
        except IndexUnreachable as e:
            down.append(e)
            continue
        same_version = [f for f in files if f.version == Version(pkg.version)]
        seen += same_version
        match = [f for f in same_version if f.sha256 in pinned]
        if match:
            return min(match, key=lambda f: _rank(f, accepted))
    if down:
        raise down[0]
    unhashed = [f for f in seen if f.sha256 is None]
    if unhashed:
        # An index that publishes no hashes: the file is only known after fetching it.
        return min(unhashed, key=lambda f: _rank(f, accepted))
    listed = ", ".join(f"{f.filename} (sha256:{f.sha256[:12]}…)" for f in seen[:6] if f.sha256)
    raise JobFailed(
        f"no wheel of {pkg.name} {pkg.version} on the index matches a hash the lock pins",
        facts=[f"the lock pins {pkg.name}=={pkg.version} with "
               + ", ".join(h[:19] + "…" for h in pkg.hashes[:4])
               + (f" and {len(pkg.hashes) - 4} more" if len(pkg.hashes) > 4 else ""),
               f"indexes asked: {', '.join(redact(u) for u in urls)}",
               (f"the index lists {listed}" if listed
                else f"the index lists no wheel of {pkg.name} {pkg.version}")],
        hint="the lock was made against another index, or the file was replaced: regenerate the "
             "lock (`imgbuild lock TARGET --refresh`), or set UV_INDEX_URL to the index it was "
             "made from")


# --- reading a wheel -------------------------------------------------------------------------

class _RangeFile(io.RawIOBase):
    """A read-only, seekable view of a remote file, fetched by HTTP Range on demand.

    Fetched spans are kept in memory; `prefetch` coalesces many small wanted ranges into a
    few requests, so reading 3 000 members costs a handful of round trips, not 3 000.
    """

    def __init__(self, url: str, size: int, tail: bytes):
        super().__init__()
        self.url, self.size, self.pos = url, size, 0
        self.spans: list[tuple[int, bytes]] = [(size - len(tail), tail)]
        self.fetched = len(tail)
        self.requests = 1

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self.pos

    def seek(self, off: int, whence: int = io.SEEK_SET) -> int:
        self.pos = {io.SEEK_SET: 0, io.SEEK_CUR: self.pos, io.SEEK_END: self.size}[whence] + off
        return self.pos

    def _find(self, start: int, end: int) -> bytes | None:
        for s, data in self.spans:
            if s <= start and end <= s + len(data):
                return data[start - s:end - s]
        return None

    def _at(self, pos: int, n: int) -> bytes | None:
        """Up to n bytes from pos out of one fetched span (a short read is fine: the
        BufferedReader around this file asks again for the rest)."""
        for s, data in self.spans:
            if s <= pos < s + len(data):
                return data[pos - s:pos - s + n]
        return None

    def _get(self, start: int, end: int) -> bytes:
        r = _session().get(self.url, headers={"Range": f"bytes={start}-{end - 1}"},
                           timeout=TIMEOUT)
        if r.status_code != 206:
            raise EnvError(f"{self.url}: a Range request got {r.status_code} after the server "
                           "had honoured Range", hint="try again; set IMGBUILD_RANGE_MIN_MB=1e9 "
                                                      "to download whole wheels instead")
        self.fetched += len(r.content)
        self.requests += 1
        return r.content

    def prefetch(self, ranges: Iterable[tuple[int, int]]) -> None:
        merged: list[list[int]] = []
        for s, e in sorted(ranges):
            e = min(e, self.size)
            if self._find(s, e) is not None:
                continue
            if merged and s - merged[-1][1] <= RANGE_MERGE_GAP:
                merged[-1][1] = max(merged[-1][1], e)
            else:
                merged.append([s, e])
        for s, e in merged:
            self.spans.append((s, self._get(s, e)))

    def readinto(self, b) -> int:
        n = min(len(b), self.size - self.pos)
        if n <= 0:
            return 0
        data = self._at(self.pos, n)
        if data is None:
            # Not prefetched (zipfile reading a directory or a header): fetch a block here.
            end = min(self.size, self.pos + max(n, 256 << 10))
            self.spans.append((self.pos, self._get(self.pos, end)))
            data = self._at(self.pos, n)
            assert data
        b[:len(data)] = data
        self.pos += len(data)
        return len(data)


@dataclass
class Wheel:
    """An opened wheel: its members by name, read from the cache or by Range."""

    name: str  # canonical project name
    version: str
    filename: str
    sha256: str | None  # of the whole file; verified for full downloads
    mode: str  # "cache" | "full" | "range"
    transferred: int  # bytes fetched over the network for this wheel
    size: int | None
    zf: zipfile.ZipFile = field(repr=False)
    _range: _RangeFile | None = field(default=None, repr=False)
    _record: dict[str, str] | None = field(default=None, repr=False)

    def names(self) -> list[str]:
        return self.zf.namelist()

    def prefetch(self, names: Iterable[str]) -> None:
        """Fetch these members in as few requests as possible (no-op for a local wheel)."""
        if self._range is None:
            return
        infos = self.zf.infolist()
        offsets = sorted(i.header_offset for i in infos) + [self._range.size]
        # A member's local header may carry a longer extra field than the central one says;
        # read up to the next member's header, which is exact and costs nothing extra.
        nxt = {o: offsets[k + 1] for k, o in enumerate(offsets[:-1])}
        want = set(names)
        self._range.prefetch((i.header_offset, nxt[i.header_offset])
                             for i in infos if i.filename in want)
        self.transferred = self._range.fetched

    def read(self, member: str) -> bytes:
        data = self.zf.read(member)
        if self._range is not None:
            self._verify_member(member, data)
            self.transferred = self._range.fetched
        return data

    def read_text(self, member: str) -> str:
        return self.read(member).decode("utf-8", "replace")

    def stream(self, member: str, chunk: int = CHUNK) -> Iterator[bytes]:
        """A member's bytes in chunks, decompressed as they are read: a member bigger than
        memory can be scanned. In range mode, checked against RECORD once the last chunk is
        out (a consumer that stops early has read nothing it can trust)."""
        self.prefetch([member])
        h = hashlib.sha256()
        with self.zf.open(member) as f:
            while block := f.read(chunk):
                h.update(block)
                yield block
        if self._range is not None:
            self._check_record(member, h.digest())
            self.transferred = self._range.fetched

    def _verify_member(self, member: str, data: bytes) -> None:
        self._check_record(member, hashlib.sha256(data).digest())

    def _check_record(self, member: str, digest: bytes) -> None:
        # Range mode never sees the whole file, so the lock's hash cannot be checked; the
        # wheel's RECORD (which pip checks at install) can, member by member.
        if self._record is None:
            rec = next((n for n in self.zf.namelist()
                        if n.endswith(".dist-info/RECORD") and n.count("/") == 1), None)
            self._record = {}
            if rec:
                for row in csv.reader(io.StringIO(self.zf.read(rec).decode("utf-8", "replace"))):
                    if len(row) >= 2 and row[1].startswith("sha256="):
                        self._record[row[0]] = row[1][len("sha256="):]
        want = self._record.get(member)
        if want is None:
            return
        got = base64.urlsafe_b64encode(digest).rstrip(b"=").decode()
        if got != want:
            raise JobFailed(f"{self.filename}: member {member} does not match the wheel's RECORD",
                            facts=[f"RECORD sha256={want}", f"read    sha256={got}"],
                            hint="the file on the index is damaged or was replaced; "
                                 "try again, then regenerate the lock")

    def close(self) -> None:
        self.zf.close()

    def __enter__(self) -> Wheel:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def wheel_cache_dir() -> Path:
    return cache_root() / "wheels"


def cached_wheel(sha256: str) -> Path | None:
    """The cached wheel with this sha256, if a previous run verified and kept it."""
    d = wheel_cache_dir() / sha256
    if d.is_dir():
        for p in d.iterdir():
            if p.suffix == ".whl" and not p.name.startswith("."):
                return p
    return None


def _open_cached(path: Path, sha: str) -> Wheel:
    name, ver, _, _ = parse_wheel_filename(path.name)
    return Wheel(str(name), str(ver), path.name, sha, "cache", 0, path.stat().st_size,
                 zipfile.ZipFile(path))


def _download(resp: requests.Response, f: IndexFile, expect: set[str] | None,
              what: str) -> Path:
    """Stream a response into the cache: hash while writing, rename only when it matches."""
    root = wheel_cache_dir()
    root.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{f.filename}.", dir=root)
    h = hashlib.sha256()
    try:
        with os.fdopen(fd, "wb") as out:
            for chunk in resp.iter_content(CHUNK):
                h.update(chunk)
                out.write(chunk)
        got = h.hexdigest()
        if expect is not None and got not in expect:
            raise JobFailed(
                f"{f.filename} does not have a hash the lock pins for {what}",
                facts=[f"downloaded from {redact(f.url)}", f"its sha256 is {got}",
                       "the lock pins " + ", ".join(sorted(expect)[:4])],
                hint="the index serves a different file than the one locked; regenerate the "
                     "lock, or check for a proxy that rewrites downloads")
        dest = root / got / f.filename
        dest.parent.mkdir(parents=True, exist_ok=True)
        os.chmod(tmp, 0o644)
        os.replace(tmp, dest)  # atomic: a reader sees no file or the whole, verified one
        return dest
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def open_file(f: IndexFile, *, expect: set[str] | None, what: str,
              mode: str = "auto") -> Wheel:
    """Open an index file as a Wheel: from the cache, whole, or by Range.

    `expect`: acceptable sha256 hex digests (the lock's), or None to accept the file as the
    index describes it (older versions in a first-version search). mode: "auto" (Range for
    big wheels), "full" or "range".
    """
    for sha in ([f.sha256] if f.sha256 else []) + sorted(expect or ()):
        p = cached_wheel(sha)
        if p is not None and (f.sha256 is None or sha == f.sha256):
            return _open_cached(p, sha)
    if mode not in ("auto", "full", "range"):
        raise ValueError(f"mode must be auto, full or range, not {mode!r}")
    want_range = mode == "range" or (mode == "auto" and f.size is not None
                                     and f.size >= RANGE_MIN_BYTES)
    headers = {"Range": f"bytes=-{RANGE_TAIL}"} if want_range and f.sha256 else {}
    resp = _get(f, headers)
    if resp.status_code == 206:
        m = re.match(r"bytes (\d+)-(\d+)/(\d+)", resp.headers.get("Content-Range", ""))
        if m:
            with resp:
                tail = resp.content
            size = int(m.group(3))
            rf = _RangeFile(f.url, size, tail)
            log.info("range: %s (%d bytes on the index)", f.filename, size)
            return Wheel(canonicalize_name(f.filename.split("-")[0]), str(f.version),
                         f.filename, f.sha256, "range", rf.fetched, size,
                         zipfile.ZipFile(io.BufferedReader(rf, 1 << 16)), rf)
        # A partial answer we cannot place in the file: ask for all of it instead.
        resp.close()
        resp = _get(f, {})
    with resp:
        if resp.status_code != 200:
            raise EnvError(f"cannot download {f.filename}: the index answered {resp.status_code}",
                           facts=[f"GET {redact(f.url)} -> {resp.status_code} {resp.reason}"],
                           hint="try again later, or point UV_INDEX_URL at another mirror")
        # 200: a full download, asked for or because the server ignored Range.
        if f.sha256:
            expect = {f.sha256} if expect is None else expect
        path = _download(resp, f, expect, what)
    w = _open_cached(path, path.parent.name)
    w.mode, w.transferred = "full", path.stat().st_size
    return w


def _get(f: IndexFile, headers: dict[str, str]) -> requests.Response:
    import requests

    try:
        return _session().get(f.url, headers=headers, stream=True, timeout=TIMEOUT)
    except requests.RequestException as e:
        raise EnvError(f"cannot download {f.filename}",
                       facts=[f"GET {redact(f.url)} failed: {type(e).__name__}: {str(e)[:200]}"],
                       hint="check the network, then run the command again") from None


def fetch_locked(pkg: LockedPackage, index_urls: Iterable[str] = (), *,
                 python: str | None = None, platform: str | None = None,
                 mode: str = "auto") -> Wheel:
    """Open a wheel of a locked package whose sha256 the lock pins. Never installs it."""
    pinned = {h.split(":", 1)[1] for h in pkg.hashes if h.startswith("sha256:")}
    for sha in sorted(pinned):  # no network at all when a previous run kept one
        p = cached_wheel(sha)
        if p is not None:
            return _open_cached(p, sha)
    f = locate_locked(pkg, index_urls, python=python, platform=platform)
    return open_file(f, expect=pinned, what=f"{pkg.name}=={pkg.version}", mode=mode)


def fetch_version(name: str, version: str | Version, index_urls: Iterable[str] = (), *,
                  mode: str = "auto") -> Wheel:
    """Open any wheel of `name==version` (verified against the index's hash when it gives one)."""
    v = Version(str(version))
    urls = tuple(index_urls) or default_index_urls()
    files = [f for f in _all_files(name, urls) if f.version == v and not f.yanked] or \
            [f for f in _all_files(name, urls) if f.version == v]
    if not files:
        raise JobFailed(f"no wheel of {canonicalize_name(name)} {v} on the index",
                        facts=[f"indexes asked: {', '.join(redact(u) for u in urls)}"],
                        hint="the version may exist only as an sdist; pick another version")
    f = min(files, key=lambda f: _rank(f, frozenset()))
    return open_file(f, expect=None, what=f"{canonicalize_name(name)}=={v}", mode=mode)


def fetch_metadata(pkg: LockedPackage, index_urls: Iterable[str] = ()) -> dict[str, list[str]]:
    """Core metadata of a locked package (headers -> values), without the whole wheel.

    Uses the index's PEP 658 metadata file when offered (a few KB), else the wheel's METADATA.
    Cached per sha256 in the cache, since it is read to explain every finding.
    """
    pinned = sorted(h.split(":", 1)[1] for h in pkg.hashes if h.startswith("sha256:"))
    cdir = cache_root() / "metadata"
    for sha in pinned:
        p = cdir / f"{sha}.json"
        if p.exists():
            return json.loads(p.read_text())
    raw: bytes | None = None
    sha_used = pinned[0] if pinned else "unknown"
    local = next((cached_wheel(s) for s in pinned if cached_wheel(s)), None)
    if local is not None:
        sha_used = local.parent.name
        with zipfile.ZipFile(local) as z:
            raw = _metadata_member(z)
    else:
        f = locate_locked(pkg, index_urls)
        sha_used = f.sha256 or sha_used
        raw = wheel_metadata(f)
        if raw is None:  # the whole wheel, then: open_file says what went wrong, if anything
            with open_file(f, expect=set(pinned), what=f"{pkg.name}=={pkg.version}",
                           mode="range") as w:
                raw = _metadata_member(w.zf)
    msg = BytesHeaderParser().parsebytes(raw or b"")
    doc: dict[str, list[str]] = {}
    for k, v in msg.items():
        doc.setdefault(k, []).append(str(v))
    cdir.mkdir(parents=True, exist_ok=True)
    atomic_write_text(cdir / f"{sha_used}.json", json.dumps(doc))
    return doc


def _metadata_member(z: zipfile.ZipFile) -> bytes | None:
    n = next((n for n in z.namelist()
              if n.endswith(".dist-info/METADATA") and n.count("/") == 1), None)
    return z.read(n) if n else None


def wheel_metadata(f: IndexFile) -> bytes | None:
    """An index file's core metadata without the whole wheel: a wheel this machine keeps, the
    index's metadata file (PEP 658/714), or the wheel's end by HTTP Range, as uv reads it where
    an index has no metadata file. None where none of those answers (a file the index gives no
    hash for, a server that ignores Range, a torn zip, the network): whether the whole wheel is
    worth fetching then is the caller's choice."""
    import requests

    if f.sha256 and (local := cached_wheel(f.sha256)) is not None:
        with zipfile.ZipFile(local) as z:
            return _metadata_member(z)
    try:
        if f.metadata_url:
            r = _session().get(f.metadata_url, timeout=TIMEOUT)
            if r.status_code == 200:
                return r.content
        if not f.sha256:
            return None  # bytes read by Range could not be tied to a hash
        with _session().get(f.url, headers={"Range": f"bytes=-{RANGE_TAIL}"}, stream=True,
                            timeout=TIMEOUT) as r:
            m = re.match(r"bytes (\d+)-(\d+)/(\d+)", r.headers.get("Content-Range", ""))
            if r.status_code != 206 or not m:
                return None
            tail = r.content
        size = int(m.group(3))
        if (raw := metadata_from_tail(tail, size)) is not None:
            return raw
        # Not all in the tail (a zip64 file, METADATA early in the archive): zipfile reads the
        # rest by Range, a request or two more.
        with zipfile.ZipFile(io.BufferedReader(_RangeFile(f.url, size, tail), 1 << 16)) as z:
            return _metadata_member(z)
    except (requests.RequestException, zipfile.BadZipFile):
        return None


_EOCD = struct.Struct("<4s4H2LH")  # end of central directory record
_CDIR = struct.Struct("<4s6H3L5H2L")  # central directory file header
_LOCAL = struct.Struct("<4s5H3L2H")  # local file header


def metadata_from_tail(tail: bytes, size: int) -> bytes | None:
    """A wheel's top-level `*.dist-info/METADATA` from the last bytes of the file (`size` in
    all), read straight from the zip's records: zipfile reads every member's entry first, and
    vLLM has 5 800 (3 ms here against zipfile's 17 ms, for a zip of that many entries). None
    when the member or the directory is not all in `tail`, the file is zip64, or the data
    fails its CRC: then zipfile reads it the long way."""
    at = tail.rfind(b"PK\x05\x06")
    if at < 0 or at + _EOCD.size > len(tail):
        return None
    _, _, _, _, count, cd_size, cd_offset, _ = _EOCD.unpack_from(tail, at)
    base = size - len(tail)  # where the tail starts in the file
    pos = cd_offset - base
    if count == 0xFFFF or cd_offset == 0xFFFFFFFF or pos < 0 or pos + cd_size > len(tail):
        return None
    for _ in range(count):
        if pos + _CDIR.size > len(tail):
            return None
        (sig, _, _, _, method, _, _, crc, csize, _, nlen, xlen, clen, _, _, _,
         offset) = _CDIR.unpack_from(tail, pos)
        if sig != b"PK\x01\x02":
            return None
        name = tail[pos + _CDIR.size:pos + _CDIR.size + nlen].decode("utf-8", "replace")
        pos += _CDIR.size + nlen + xlen + clen
        if not (name.endswith(".dist-info/METADATA") and name.count("/") == 1):
            continue
        lpos = offset - base
        if lpos < 0 or lpos + _LOCAL.size > len(tail) or method not in (0, 8):
            return None
        lsig, *_, lnlen, lxlen = _LOCAL.unpack_from(tail, lpos)
        start = lpos + _LOCAL.size + lnlen + lxlen
        if lsig != b"PK\x03\x04" or start + csize > len(tail):
            return None
        data = tail[start:start + csize]
        try:
            data = zlib.decompressobj(-15).decompress(data) if method == 8 else data
        except zlib.error:
            return None
        return data if zlib.crc32(data) == crc else None
    return None




def iter_py(w: Wheel) -> Iterator[tuple[str, bytes]]:
    """Every .py member of a wheel with its bytes; for Range wheels, fetched in a few spans."""
    names = [n for n in w.names() if n.endswith(".py")]
    # RECORD too: every member read by Range is checked against it.
    w.prefetch(names + [n for n in w.names() if n.endswith(".dist-info/RECORD")])
    for n in names:
        yield n, w.read(n)
