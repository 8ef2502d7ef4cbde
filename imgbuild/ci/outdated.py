"""What upstream released since a target was locked, and whether the target can take it.

For each target: its engine, the key packages (torch, compressed-tensors, transformers,
flashinfer-python, vllm, sglang) and its own exact pins. Newer releases come from the package
index's JSON API (PyPI: /pypi/NAME/json) or, for any other index (a mirror, a target's extra
index), its simple API. A newer release is only news if the target can take it, so each one is
resolved with uv for the target's platform, starting from the committed lock (uv keeps every
other locked version it can, `--upgrade-package` moves the package asked about):

- available: it resolves; the lock diff is what `relock TARGET --upgrade PKG` writes;
- blocked: it does not resolve, and uv's chain says by whom (e.g. a newer vLLM that pins a
  compressed-tensors the target pins otherwise: blocked by the target's pin, not available);
- held: an override in the target decides the version (its written reason stands until
  someone edits it).

Base images: nvidia/cuda tags newer than the catalog's, asked of the registry where it can be
reached; where it cannot (Docker Hub, from these machines), the report says "not checked".

`relock(cat, TARGET, [PKG or PKG==VER])` performs an upgrade: for the engine or a package the
target pins exactly, it edits the pin in images/TARGET.yaml (textually, comments kept) and
relocks; for any other package it relocks with `--upgrade-package`. The lock is written
atomically, with the inputs hash of the edited spec, so `plan` and `build` take it as is.
"""

from __future__ import annotations

import re
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from urllib.parse import urlsplit

import requests
from packaging.requirements import InvalidRequirement, Requirement
from packaging.utils import (
    InvalidSdistFilename,
    InvalidWheelFilename,
    canonicalize_name,
    parse_sdist_filename,
    parse_wheel_filename,
)
from packaging.version import InvalidVersion, Version

from ..catalog.catalog import Catalog, load_catalog
from ..catalog.indexes import redact
from ..catalog.targets import Target
from ..errors import EnvError, ImgbuildError, InputError, LockError, ResolveError
from ..fsutil import atomic_write_text
from ..image.registry import Repository
from ..lock import conflicts
from ..lock.lockfile import Lockfile, LockRequest, parse_body, write_lock
from ..lock.request import lock_request
from ..lock.resolve import resolve
from ..lock.uv import uv_version
from ..lock.wheels import default_index_urls
from ..plan.decide import make_plan
from ..workspace import Workspace

KEY_PACKAGES = ("sglang", "vllm", "torch", "compressed-tensors", "transformers",
                "flashinfer-python")
MAX_TRIES = 3  # newer versions of a pinned package resolved, newest first, before giving up
TIMEOUT = (5, 30)
ACCEPT = ("application/vnd.pypi.simple.v1+json, "
          "application/vnd.pypi.simple.v1+html;q=0.2, text/html;q=0.01")


# --- results ----------------------------------------------------------------------------------

@dataclass(frozen=True)
class Change:
    package: str
    old: str | None  # None: added
    new: str | None  # None: removed


@dataclass(frozen=True)
class Candidate:
    version: str
    status: str  # available | blocked
    blocked_by: tuple[str, ...] = ()  # who asks for what, from uv's chain
    needs: tuple[str, ...] = ()  # what the candidate itself asks for, in the conflict
    changes: tuple[Change, ...] = ()


@dataclass(frozen=True)
class PackageNews:
    package: str
    role: str  # engine | pinned (an exact pin in the target) | dependency
    locked: str | None
    newer: tuple[str, ...]  # newer releases on the indexes, ascending
    status: str  # current | available | blocked | held | unknown
    available: str | None = None  # the newest version a relock would take
    blocked_by: tuple[str, ...] = ()  # for the newest release
    needs: tuple[str, ...] = ()
    changes: tuple[Change, ...] = ()  # the lock diff for `available`
    tried: tuple[Candidate, ...] = ()
    note: str = ""

    @property
    def latest(self) -> str | None:
        return self.newer[-1] if self.newer else None

    def to_dict(self) -> dict:
        d = asdict(self)
        d["latest"] = self.latest
        d["diff"] = diff_lines(self.changes)
        # Each version tried, without its diff (the one for `available` is above).
        d["tried"] = [{"version": c.version, "status": c.status, "blocked_by": list(c.blocked_by),
                       "needs": list(c.needs), "lock_changes": len(c.changes)} for c in self.tried]
        return d


@dataclass(frozen=True)
class BaseNews:
    image: str
    status: str  # current | newer | not checked
    newer: tuple[str, ...] = ()
    note: str = ""


@dataclass(frozen=True)
class TargetNews:
    target: str
    engine: str
    lock: str
    packages: tuple[PackageNews, ...] = ()
    bases: tuple[BaseNews, ...] = ()
    errors: tuple[str, ...] = ()
    patches: tuple[str, ...] = ()  # a patched engine is upgraded by hand: patches fit versions

    def to_dict(self) -> dict:
        return {"target": self.target, "engine": self.engine, "lock": self.lock,
                "patches": list(self.patches),
                "packages": [p.to_dict() for p in self.packages],
                "bases": [asdict(b) for b in self.bases], "errors": list(self.errors)}


@dataclass(frozen=True)
class RelockResult:
    target: str
    lock: str
    spec_edits: tuple[str, ...]
    changes: tuple[Change, ...]
    written: bool
    note: str = ""

    @property
    def diff(self) -> list[str]:
        return diff_lines(self.changes, self.lock)

    def to_dict(self) -> dict:
        return {"target": self.target, "lock": self.lock, "spec_edits": list(self.spec_edits),
                "changes": [asdict(c) for c in self.changes], "diff": self.diff,
                "written": self.written, "note": self.note}


def diff_lines(changes: tuple[Change, ...] | list[Change], lock: str | None = None) -> list[str]:
    """The pins a relock changes, as `imgbuild lock --check` shows a stale lock's diff."""
    out = [f"--- {lock} (committed)", f"+++ {lock} (relocked)"] if lock and changes else []
    for c in changes:
        if c.old:
            out.append(f"-{c.package}=={c.old}")
        if c.new:
            out.append(f"+{c.package}=={c.new}")
    return out


def to_dict(news: list[TargetNews]) -> dict:
    return {"targets": [n.to_dict() for n in news]}


# --- the indexes ------------------------------------------------------------------------------

def _is_pypi(index_url: str) -> bool:
    return urlsplit(index_url).hostname in ("pypi.org", "test.pypi.org")


def _version_of(filename: str) -> Version | None:
    try:
        if filename.endswith(".whl"):
            return parse_wheel_filename(filename)[1]
        if filename.endswith((".tar.gz", ".zip")):
            return parse_sdist_filename(filename)[1]
    except (InvalidWheelFilename, InvalidSdistFilename, InvalidVersion):
        return None
    return None


def index_versions(name: str, index_url: str) -> list[Version]:
    """Released, unyanked versions of `name` on one index (ascending); [] if it has none.

    PyPI: its JSON API. Other indexes: the simple API (PEP 691 JSON or PEP 503 HTML). Nothing
    is memoized: a release published a second ago is seen.
    """
    s = requests.Session()
    s.headers["User-Agent"] = "imgbuild-outdated (+requests)"
    vers: set[Version] = set()
    if _is_pypi(index_url):
        parts = urlsplit(index_url)
        url = f"{parts.scheme}://{parts.netloc}/pypi/{canonicalize_name(name)}/json"
        r = s.get(url, timeout=TIMEOUT)
        if r.status_code == 404:
            return []
        r.raise_for_status()
        for ver, files in (r.json().get("releases") or {}).items():
            if files and not all(f.get("yanked") for f in files):
                try:
                    vers.add(Version(ver))
                except InvalidVersion:
                    pass
    else:
        url = index_url.rstrip("/") + f"/{canonicalize_name(name)}/"
        r = s.get(url, headers={"Accept": ACCEPT}, timeout=TIMEOUT)
        if r.status_code == 404:
            return []
        r.raise_for_status()
        if r.headers.get("Content-Type", "").startswith("application/vnd.pypi.simple.v1+json"):
            files = [(f.get("filename", ""), bool(f.get("yanked"))) for f in r.json().get("files", [])]
        else:
            files = [((text.strip() or attrs.split("href=")[-1]).rsplit("/", 1)[-1].split("#")[0],
                      "data-yanked" in attrs)
                     for attrs, text in re.findall(r"<a\s([^>]*)>([^<]*)</a>", r.text, re.I)]
        for fname, yanked in files:
            v = _version_of(fname.strip("'\""))
            if v is not None and not yanked:
                vers.add(v)
    return sorted(v for v in vers if not v.is_prerelease and not v.is_devrelease)


class _Versions:
    """Versions per package over a set of indexes, for the life of one report."""

    def __init__(self) -> None:
        self._memo: dict[tuple[str, tuple[str, ...]], tuple[list[Version], list[str]]] = {}

    def get(self, name: str, urls: tuple[str, ...]) -> tuple[list[Version], list[str]]:
        key = (canonicalize_name(name), urls)
        if key not in self._memo:
            found: set[Version] = set()
            errors = []
            for u in urls:
                try:
                    found |= set(index_versions(name, u))
                except requests.RequestException as e:
                    errors.append(f"{redact(u)} not checked for {name}: unreachable "
                                  f"({type(e).__name__})")
            self._memo[key] = (sorted(found), errors)
        return self._memo[key]


def _indexes(target: Target, index_urls: tuple[str, ...] | None) -> tuple[str, ...]:
    base = tuple(index_urls) if index_urls else default_index_urls()
    out: list[str] = []
    for u in (*base, *(ix.url for ix in target.indexes)):
        u = u if u.endswith("/") else u + "/"
        if u not in out:
            out.append(u)
    return tuple(out)


# --- resolving --------------------------------------------------------------------------------

def compile_lock(req: LockRequest, *, wheels: Path | None = None, prefer: str | None = None,
                 upgrade: tuple[str, ...] = (), constraints: tuple[str, ...] = (),
                 index_urls: tuple[str, ...] | None = None) -> str:
    """imgbuild.lock.resolve.resolve, keeping the versions in `prefer` except the `upgrade` packages."""
    return resolve(req, wheels, prefer=prefer, upgrade=upgrade, constraints=constraints,
                   index_urls=index_urls)


def _changes(old: Lockfile, body: str) -> tuple[Change, ...]:
    have = {p.name: p.version for p in old.packages}
    new = {p.name: p.version for p in parse_body(body, "the resolution")}
    return tuple(Change(n, have.get(n), new.get(n)) for n in sorted(set(have) | set(new))
                 if have.get(n) != new.get(n))


def _blockers(err: ResolveError, target: Target, req: LockRequest,
              candidate: tuple[str, str] | None) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """(blocked_by, needs) from uv's chain: the constraints on the package in conflict.

    uv names a dependent by the range it reasoned about ("vllm<=1.0 depends on ..."); where
    the request pins that package exactly, the pin is what is meant and what is shown.
    """
    text = "\n".join(err.facts)
    platform = req.uv_platform
    pinned = {}
    for r in req.requirements:
        p = _exact_pin((r,), canonicalize_name(Requirement(r).name))
        if p:
            pinned[canonicalize_name(Requirement(r).name)] = _pinned_version(p)
    sentence = conflicts.platform_sentence(text, platform)
    if sentence:
        return (sentence,), ()
    cs = conflicts.parse_constraints(text)
    specs: dict[str, set[str]] = {}
    for c in cs:
        specs.setdefault(c.package, set()).add(c.spec)
    cname, cver = candidate or ("", "")
    blocked, needs = [], []
    for c in cs:
        if len(specs[c.package]) < 2:
            continue
        you = c.source == "you"
        src_name = canonicalize_name(re.split(r"[<>=!~ ]", c.source, maxsplit=1)[0])
        src = target.path if you else (f"{src_name}=={pinned[src_name]}" if src_name in pinned
                                       else c.source)
        line = f"{src} requires {c.package}{c.spec}"
        own = (not you and src_name == cname) or (you and c.package == cname and c.spec == f"=={cver}")
        if own:
            needs.append(line)
        elif line not in blocked:
            blocked.append(line)
    if not blocked:
        blocked = [ln for ln in err.facts if ln.strip()][-3:]
    return tuple(blocked), tuple(dict.fromkeys(needs))


def _exact_pin(reqs: tuple[str, ...], name: str) -> str | None:
    for r in reqs:
        try:
            rq = Requirement(r)
        except InvalidRequirement:
            continue
        if canonicalize_name(rq.name) == name and any(s.operator == "==" for s in rq.specifier):
            return r
    return None


def _with_pin(req: LockRequest, old: str, name: str, version: str) -> LockRequest:
    new = tuple(_repin(r, version) if r == old else r for r in req.requirements)
    return replace(req, requirements=new)


def _pinned_version(requirement: str) -> str:
    return next(s.version for s in Requirement(requirement).specifier if s.operator == "==")


def _repin(requirement: str, version: str) -> str:
    rq = Requirement(requirement)
    extras = f"[{','.join(sorted(rq.extras))}]" if rq.extras else ""
    marker = f"; {rq.marker}" if rq.marker else ""
    return f"{rq.name}{extras}=={version}{marker}"


# --- the report -------------------------------------------------------------------------------

def _package_news(name: str, role: str, target: Target, req: LockRequest, lock: Lockfile,
                  versions: list[Version], wheels: Path | None,
                  index_urls: tuple[str, ...] | None, max_tries: int) -> PackageNews:
    locked = lock.package(name)
    cur = Version(locked.version) if locked else None
    newer = [v for v in versions if cur is None or Version(v.public) > Version(cur.public)]
    base = PackageNews(name, role, locked.version if locked else None,
                       tuple(str(v) for v in newer), "current")
    if not newer:
        return base
    held = next((o for o in target.overrides if o.name and canonicalize_name(o.name) == name), None)
    if held is not None:
        return replace(base, status="held",
                       note=f"override {held.requirement} in {target.path}: {held.reason}")
    resolve = lambda r, **kw: compile_lock(r, wheels=wheels, prefer=lock.body,  # noqa: E731
                                           index_urls=index_urls, **kw)
    tried: list[Candidate] = []
    pin = _exact_pin(req.requirements, name) if role != "dependency" else None
    if pin is not None:
        # The target pins it: ask for each newer version in place of the pin, newest first.
        for v in list(reversed(newer))[:max_tries]:
            try:
                body = resolve(_with_pin(req, pin, name, str(v)), upgrade=(name,))
            except ResolveError as e:
                by, needs = _blockers(e, target, _with_pin(req, pin, name, str(v)),
                                      (name, str(v)))
                tried.append(Candidate(str(v), "blocked", by, needs))
                continue
            tried.append(Candidate(str(v), "available", changes=_changes(lock, body)))
            break
    else:
        # A dependency: would the others' pins allow the newest release?
        latest = str(newer[-1])
        asked = replace(req, requirements=req.requirements + (f"{name}=={latest}",))
        try:
            body = resolve(asked, upgrade=(name,))
            tried.append(Candidate(latest, "available", changes=_changes(lock, body)))
        except ResolveError as e:
            by, needs = _blockers(e, target, asked, (name, latest))
            tried.append(Candidate(latest, "blocked", by, needs))
            # Something between? Not when another package pins exactly the locked version.
            pinned_here = any(f"requires {name}=={locked.version}" in b for b in by) if locked else False
            if len(newer) > 1 and not pinned_here:
                body = resolve(req, upgrade=(name,))
                got = next((p.version for p in parse_body(body, "resolution") if p.name == name), None)
                if got and locked and got != locked.version:
                    tried.append(Candidate(got, "available", changes=_changes(lock, body)))
    first = tried[0]
    best = next((c for c in tried if c.status == "available"), None)
    note = "" if best or len(newer) <= max_tries or pin is None else \
        f"the {max_tries} newest releases were tried"
    if best and target.archs == ("cpu",) and any(
            c.old is None and c.package.startswith(("nvidia-", "cuda-")) for c in best.changes):
        note = (f"brings CUDA wheels (nvidia-*) into a CPU target: {name} {best.version} from "
                "the default index is a CUDA build" + (
                    f"; the target's own index ({', '.join(ix.url for ix in target.indexes)}) "
                    "is where its CPU build comes from" if target.indexes else ""))
    return replace(base, status="available" if first.status == "available" else "blocked",
                   available=best.version if best else None, blocked_by=first.blocked_by,
                   needs=first.needs, changes=best.changes if best else (), tried=tuple(tried),
                   note=note)


def _key_packages(target: Target, req: LockRequest, lock: Lockfile) -> list[tuple[str, str]]:
    out = [(canonicalize_name(target.engine), "engine")]
    for r in req.requirements[1:]:
        try:
            name = canonicalize_name(Requirement(r).name)
        except InvalidRequirement:
            continue
        if _exact_pin((r,), name) and name not in dict(out):
            out.append((name, "pinned"))
    for k in KEY_PACKAGES:
        if lock.package(k) is not None and k not in dict(out):
            out.append((k, "dependency"))
    return out


def target_news(ws: Workspace, name: str, *, index_urls=None, check_bases: bool = True,
                max_tries: int = MAX_TRIES, versions: _Versions | None = None) -> TargetNews:
    ref = ws.target(name)
    target, req, wheels = ref.target, ref.request, ws.wheels
    try:
        lock = ref.lock()
    except (LockError, InputError) as e:
        return TargetNews(name, target.engine, ref.display, errors=(e.message,),
                          patches=target.patches)
    versions = versions or _Versions()
    urls = _indexes(target, tuple(index_urls) if index_urls else None)
    uv_urls = tuple(index_urls) if index_urls else None
    pkgs, errors = [], []
    for pkg, role in _key_packages(target, req, lock):
        found, errs = versions.get(pkg, urls)
        errors += [e for e in errs if e not in errors]
        if not found and errs:
            pkgs.append(PackageNews(pkg, role, getattr(lock.package(pkg), "version", None), (),
                                    "unknown", note="; ".join(errs)))
            continue
        try:
            pkgs.append(_package_news(pkg, role, target, req, lock, found, wheels, uv_urls,
                                      max_tries))
        except ImgbuildError as e:
            pkgs.append(PackageNews(pkg, role, getattr(lock.package(pkg), "version", None),
                                    (), "unknown", note=e.message))
    bases: list[BaseNews] = []
    if check_bases:
        try:
            plan = make_plan(ws, name, resolve=False)
            bases.append(base_news(ws.catalog, plan.base_image))
        except ImgbuildError as e:
            errors.append(f"base image not checked: {e.message}")
    return TargetNews(name, target.engine, ref.display, tuple(pkgs), tuple(bases),
                      tuple(errors), target.patches)


def outdated(ws: Workspace, *, index_urls: list[str] | tuple[str, ...] | None = None,
             targets: list[str] | None = None, jobs: int = 4, check_bases: bool = True,
             max_tries: int = MAX_TRIES) -> list[TargetNews]:
    """The news for each target (all, or `targets`), in the order asked.

    index_urls: the indexes to ask (and to resolve from); default: uv's default index
    (UV_DEFAULT_INDEX / UV_INDEX_URL / PIP_INDEX_URL, else PyPI) plus each target's extra
    indexes.
    """
    names = list(targets) if targets else sorted(ws.catalog.targets)
    for n in names:
        ws.catalog.target(n)  # unknown names are bad input before any network
    versions = _Versions()
    with ThreadPoolExecutor(max_workers=max(1, jobs)) as pool:
        return list(pool.map(lambda n: target_news(
            ws, n, index_urls=index_urls, check_bases=check_bases, max_tries=max_tries,
            versions=versions), names))


# --- base images ------------------------------------------------------------------------------

_CUDA_TAG = re.compile(r"^(\d+(?:\.\d+)+)-(.+)$")


def _repository_of(name: str) -> Repository:
    """An image name's repository, on Docker Hub when it names no host."""
    repo = Repository.parse(name)
    if repo.host is None:
        path = name if "/" in name else f"library/{name}"
        return Repository.parse(f"registry-1.docker.io/{path}")
    return repo


def registry_tags(name: str, *, timeout: float = 5, max_pages: int = 50) -> list[str]:
    """Every tag of a repository (Distribution API; the registry's challenge answered as
    Docker answers it, anonymously where it allows anonymous pulls)."""
    repo = _repository_of(name)
    url = f"{repo.path}/tags/list?n=1000"
    tags: list[str] = []
    for _ in range(max_pages):
        r = repo.api.request("GET", url, scope=repo.scope("pull"), timeout=(timeout, 30))
        if r.status_code == 404:
            return tags
        if r.status_code != 200:
            raise EnvError(f"registry {repo.host} answered {r.status_code} listing {repo.path}")
        tags += r.json().get("tags") or []
        m = re.search(r'<([^>]+)>;\s*rel="next"', r.headers.get("Link", ""))
        if not m:
            break
        url = m.group(1)
    return tags


def base_news(cat: Catalog, image: str, *, timeout: float = 5) -> BaseNews:
    """Newer tags of a base image where the registry answers; says so where it does not."""
    image = image.split("@", 1)[0]  # a tag pinned by digest: its newer tags are the news
    name, _, tag = image.rpartition(":")
    if "/" in tag or not name:
        name, tag = image, "latest"
    if any(b.bootstrap and b.image == image for b in cat.bases.values()):
        return BaseNews(image, "not checked", note="made on the build machine by `imgbuild base "
                        "bootstrap` from Debian's packages; it is on no upstream registry")
    host = _repository_of(name).host
    cuda = cat.cuda_images
    m = _CUDA_TAG.match(tag)
    if cuda is None or name != cuda.repository or not m:
        return BaseNews(image, "not checked", note="an OS release tag: a newer tag is another "
                        "OS release, not an update of this one")
    try:
        tags = registry_tags(name, timeout=timeout)
    except EnvError as e:
        return BaseNews(image, "not checked", note=f"registry {host} unreachable ({e.message})")
    cur, suffix = Version(m.group(1)), m.group(2)
    newer = []
    for t in tags:
        tm = _CUDA_TAG.match(t)
        if tm and tm.group(2) == suffix:
            try:
                v = Version(tm.group(1))
            except InvalidVersion:
                continue
            if v > cur:
                newer.append((v, t))
    newer.sort()
    if not newer:
        return BaseNews(image, "current")
    same = [t for v, t in newer if v.release[:2] == cur.release[:2]]
    note = (f"{len(same)} newer patch release(s) of CUDA {cur.major}.{cur.minor}"
            if same else "newer CUDA releases only (a new CUDA also needs a torch built for it)")
    return BaseNews(image, "newer", tuple(t for _, t in newer), note)


# --- relock -----------------------------------------------------------------------------------



def edit_engine_version(text: str, old: str, new: str) -> str | None:
    """images/T.yaml with engine.version changed from old to new, comments and quotes kept;
    None when the text does not have the shape this edit understands."""
    lines = text.splitlines(keepends=True)
    in_engine = False
    hits = []
    for i, line in enumerate(lines):
        if re.match(r"^engine:\s*(#.*)?$", line):
            in_engine = True
            continue
        if re.match(r"^engine:\s*\{", line):
            new_line, n = re.subn(r"(\bversion:\s*['\"]?)" + re.escape(old) + r"(?=['\"]?\s*[,}])",
                                  lambda m: m.group(1) + new, line)
            if n == 1:
                hits.append((i, new_line))
            continue
        if in_engine:
            if line.strip() and not line[0].isspace():
                in_engine = False
                continue
            m = re.match(r"^(\s+version:\s*['\"]?)" + re.escape(old) + r"(['\"]?\s*(#.*)?\n?)$", line)
            if m:
                hits.append((i, m.group(1) + new + m.group(2)))
    if len(hits) != 1:
        return None
    i, new_line = hits[0]
    lines[i] = new_line
    return "".join(lines)


def edit_requirement(text: str, old: str, new: str) -> str | None:
    """images/T.yaml with one requirement string replaced, outside comments; None unless the
    old requirement appears exactly once."""
    pat = re.compile(r"(?<![\w.-])" + re.escape(old) + r"(?![\w.])")
    lines = text.splitlines(keepends=True)
    hits = [i for i, ln in enumerate(lines) if pat.search(ln.split("#", 1)[0])]
    if len(hits) != 1:
        return None
    i = hits[0]
    code, sep, comment = lines[i].partition("#")
    lines[i] = pat.sub(new, code, count=1) + sep + comment
    return "".join(lines)


def _parse_upgrade(spec: str) -> tuple[str, str | None]:
    try:
        rq = Requirement(spec)
    except InvalidRequirement:
        raise InputError(f"--upgrade {spec}: expected a package name or NAME==VERSION") from None
    pins = [s.version for s in rq.specifier if s.operator == "=="]
    if rq.specifier and not pins:
        raise InputError(f"--upgrade {spec}: give a package name or an exact NAME==VERSION")
    return canonicalize_name(rq.name), (pins[0] if pins else None)


def relock(ws: Workspace, target: str, upgrade: list[str], *,
           index_urls: list[str] | None = None) -> RelockResult:
    """Upgrade packages in a target's lock; returns what changed.

    upgrade: names, or NAME==VERSION. The engine, or a package the target pins exactly, is
    moved in images/TARGET.yaml (to VERSION, or to the newest release the target resolves
    with); any other locked package is re-resolved with `--upgrade-package` (to VERSION via a
    constraint, which leaves the spec as it is). Everything else keeps its locked version
    where uv can keep it. Nothing is written unless the whole resolution succeeds.
    """
    ref = ws.target(target)
    # Refused before anything is resolved when the spec or the lock is the built-in catalog's.
    ws.spec_file(f"{target}.yaml", f"relock {target}")
    t, req, wheels, lock_dir = ref.target, ref.request, ws.wheels, ws.lock_dir()
    lock = ref.lock()
    uv_urls = tuple(index_urls) if index_urls else None
    new_req = req
    names: list[str] = []
    constraints: list[str] = []
    edits: list[tuple[str, str, str]] = []  # (kind, old, new)
    for spec in upgrade:
        name, version = _parse_upgrade(spec)
        names.append(name)
        ov = next((o for o in t.overrides if canonicalize_name(o.name) == name), None)
        if ov is not None:
            raise InputError(f"{name} is held by an override in {t.path}: {ov.requirement}",
                             facts=[f"reason: {ov.reason}"],
                             hint=f"edit or remove the override in {t.path} (with its reason), "
                                  f"then `imgbuild lock {target}`")
        pin = _exact_pin(new_req.requirements, name)
        if pin is None:
            if lock.package(name) is None:
                raise InputError(f"{name} is not in {target}'s lock",
                                 hint="name a package the lock holds (see lockfiles/)")
            if version:
                constraints.append(f"{name}=={version}")
            continue
        if version is None:
            versions, errs = _Versions().get(name, _indexes(t, uv_urls))
            locked = lock.package(name)
            cur = Version(locked.version).public if locked else "0"
            newer = [v for v in versions if Version(v.public) > Version(cur)]
            if not newer:
                if errs:
                    raise ResolveError(f"cannot tell whether {name} has a newer release",
                                       facts=errs, hint="check the network, or give NAME==VERSION")
                continue
            version = _newest_resolving(new_req, pin, name, newer, t, lock, wheels, uv_urls)
        if _repin(pin, version) == _repin(pin, _pinned_version(pin)):
            continue  # already there
        new_req = _with_pin(new_req, pin, name, version)
        if name == canonicalize_name(t.engine):
            edits.append(("engine", t.engine_version, version))
        else:
            edits.append(("requirement", pin, _repin(pin, version)))
    try:
        body = compile_lock(new_req, wheels=wheels, prefer=lock.body, upgrade=tuple(names),
                            constraints=tuple(constraints), index_urls=uv_urls)
    except ResolveError as e:
        by, _ = _blockers(e, t, new_req, None)
        raise ResolveError(f"{target} cannot take {', '.join(upgrade)}", facts=list(by),
                           hint=f"`imgbuild outdated {target}` shows what each newer release "
                                "needs") from None
    # A multi-platform target: every other platform's lock moves with the first, resolved for
    # its own platform from the same requirements (they carry their markers), before anything
    # is written.
    others = []
    for other in ws.platform_refs(target)[1:]:
        oreq = replace(other.request, requirements=new_req.requirements)
        try:
            obody = compile_lock(oreq, wheels=wheels, prefer=other.lock().body,
                                 upgrade=tuple(names), constraints=tuple(constraints),
                                 index_urls=uv_urls)
        except ResolveError as e:
            raise ResolveError(f"{target} cannot take {', '.join(upgrade)} on "
                               f"{other.target.platforms[0]}", facts=list(e.facts)[-12:],
                               hint=f"`imgbuild outdated {target}` shows what each newer "
                                    "release needs") from None
        others.append((other.target.platforms[0], other.lock().body, obody))
    changes = _changes(lock, body)
    spec_edits = tuple(f"{t.path}: " + (f"engine.version {o} → {n}" if k == "engine"
                                        else f"requirements: {o} → {n}") for k, o, n in edits)
    if not edits and body == lock.body and lock.inputs_hash == req.inputs_hash() \
            and all(ob == nb for _, ob, nb in others):
        return RelockResult(target, ref.display, (), (), False,
                            "nothing to do: the lock already has the newest versions the "
                            "target allows")
    spec_path = ws.images / f"{target}.yaml"
    original = spec_path.read_text() if edits else None
    # Each lock written, with what its path held before (None: nothing): a failure part-way
    # puts every one back, as it puts the spec back.
    replaced: list[tuple[Path, str | None]] = []

    def put(path: Path, r: LockRequest, b: str) -> None:
        replaced.append((path, path.read_text() if path.exists() else None))
        write_lock(path, r, b, uv_version())
    try:
        if edits:
            text = original
            for kind, old, new in edits:
                edited = (edit_engine_version if kind == "engine" else edit_requirement)(text, old, new)
                if edited is None:
                    raise InputError(f"cannot edit {t.path} by text ({kind} {old})",
                                     hint=f"change it by hand to {new}, then `imgbuild lock {target}`")
                text = edited
            atomic_write_text(spec_path, text)
            cat2 = load_catalog(list(ws.layers))  # the edited spec, as the next command reads it
            t2 = cat2.target(target)
            req2 = lock_request(t2, cat2.base(t2.os), cat2.toolchain)
            if req2.requirements != new_req.requirements:
                raise InputError(f"editing {t.path} gave other requirements than intended",
                                 facts=[f"intended {list(new_req.requirements)}",
                                        f"got {list(req2.requirements)}"],
                                 hint="edit the spec by hand")
        else:
            req2 = req
        put(lock_dir / req2.filename(), req2, body)
        for platform, _, obody in others:
            # The edited spec's request for that platform; its lock goes where the first went
            # (the project's lockfiles/), never over a built-in lock it was read from.
            oreq = Workspace(ws.images, ws.lockfiles, ws.wheels, ws.base).target(
                target, platform).request
            put(lock_dir / oreq.filename(), oreq, obody)
    except BaseException:
        for path, before in reversed(replaced):
            if before is None:
                path.unlink(missing_ok=True)
            else:
                atomic_write_text(path, before)
        if original is not None:
            atomic_write_text(spec_path, original)
        raise
    return RelockResult(target, ref.display, spec_edits, changes, True)


def _newest_resolving(req: LockRequest, pin: str, name: str, newer: list[Version], t: Target,
                      lock: Lockfile, wheels: Path | None, uv_urls) -> str:
    facts: list[str] = []
    for v in list(reversed(newer))[:MAX_TRIES]:
        try:
            compile_lock(_with_pin(req, pin, name, str(v)), wheels=wheels, prefer=lock.body,
                         upgrade=(name,), index_urls=uv_urls)
            return str(v)
        except ResolveError as e:
            by, _ = _blockers(e, t, _with_pin(req, pin, name, str(v)), (name, str(v)))
            facts.append(f"{name} {v}: blocked by " + "; ".join(by))
    raise ResolveError(f"no newer {name} resolves for {t.name}", facts=facts,
                       hint=f"relax the pins named above in {t.path}, or add an override with "
                            "a reason")


# --- human output -----------------------------------------------------------------------------

def summary(n: PackageNews) -> str:
    if n.status == "current":
        return "current"
    if n.status == "unknown":
        return f"not checked: {n.note}"
    if n.status == "held":
        return f"{n.latest} held: {n.note}"
    parts = []
    if n.status == "available":
        parts.append(f"{n.latest} available ({len(n.changes)} lock change(s))")
    else:
        parts.append(f"{n.latest} blocked by " + "; ".join(n.blocked_by))
        if n.available:
            parts.append(f"{n.available} available ({len(n.changes)} lock change(s))")
    return "; ".join(parts + ([n.note] if n.note else []))
