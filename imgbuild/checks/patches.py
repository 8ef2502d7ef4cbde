"""`imgbuild patches TARGET [--check]`: a target's compatibility patches, checked against its
locked wheel. The decisions (applies / obsolete / fails / not-applicable) are made by the
in-image patcher itself, imported here, so the check and the build agree by construction."""

from __future__ import annotations

import tempfile
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, replace
from pathlib import Path

from ..catalog.patches import Patch, target_patches
from ..lock import wheels
from ..lock.wheels import Wheel
from ..payload import patcher
from ..workspace import Workspace

STATUSES = ("applies", "obsolete", "fails", "not-applicable", "unchecked")


@dataclass(frozen=True)
class PatchResult:
    id: str
    status: str  # applies | obsolete | fails | not-applicable | unchecked
    detail: str
    package: str
    version: str | None = None
    variant: str | None = None  # the versions specifier of the variant used
    files: tuple[str, ...] = ()
    upstream: str = ""
    fixes: str = ""

    @property
    def failed(self) -> bool:
        return self.status == "fails"

    def to_dict(self) -> dict:
        d = asdict(self)
        d["files"] = list(self.files)
        return d


_STATUS = {patcher.APPLIES: "applies", patcher.APPLIED: "applies",
           patcher.OBSOLETE: "obsolete", patcher.NOT_APPLICABLE: "not-applicable",
           patcher.FAILS: "fails"}


def extract(wheel: Wheel, dest: Path, members: Iterable[str] | None = None) -> Path:
    """Unpack `members` of a (root-is-purelib) wheel, plus its .dist-info, into `dest`: a
    scratch site-packages. None: every member."""
    names = wheel.names()
    want = set(names) if members is None else (
        set(members) | {n for n in names if n.split("/", 1)[0].endswith(".dist-info")})
    chosen = [n for n in names if n in want and not n.endswith("/")]
    wheel.prefetch(chosen)
    for n in chosen:
        if n.startswith("/") or ".." in Path(n).parts:
            continue
        p = dest / n
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_bytes(wheel.read(n))
    return dest


def check_site(patches: Sequence[Patch], site: Path, *, verify: bool = True) -> list[PatchResult]:
    """Decide, then apply in `site` (a scratch copy), every patch; check RECORD afterwards.

    A failing patch leaves `site` untouched (the patcher writes all or nothing).
    """
    docs = [p.to_json() for p in patches]
    decisions = patcher.plan(docs, site)
    results = [_result(p, d) for p, d in zip(patches, decisions)]
    if any(r.failed for r in results) or not verify:
        return results
    try:
        patcher.apply(docs, site, None)
    except patcher.PatchError as e:  # e.g. a file the RECORD does not list
        return [replace(r, status="fails", detail=str(e)) if r.status == "applies" else r
                for r in results]
    out = []
    for r in results:
        if r.status == "applies":
            dist = patcher.find_dist(site, r.package)
            problems = [p for p in patcher.verify_record(dist, site)
                        if p.split(":", 1)[0] in r.files] if dist else ["not installed"]
            if problems:
                r = replace(r, status="fails",
                            detail="RECORD inconsistent after patching: " + "; ".join(problems))
        out.append(r)
    return out


def _result(p: Patch, d: patcher.Decision) -> PatchResult:
    return PatchResult(p.id, _STATUS[d.status], d.detail, p.package, d.version, d.variant,
                       tuple(d.files or p.files()), p.upstream, p.fixes)


@dataclass(frozen=True)
class PatchReport:
    """What `imgbuild patches TARGET [--check]` found, in the target's order."""

    target: str
    checked: bool  # --check: applied to the locked wheel; else only the version ranges read
    results: tuple[PatchResult, ...]

    @property
    def failed(self) -> bool:
        """True when the job should exit 1 (a patch does not apply to the locked version)."""
        return failed(self.results)

    def to_dict(self) -> dict:
        return to_dict(self.results, target=self.target)


def check(ws: Workspace, target: str, *,
          index_urls: Sequence[str] | None = None) -> PatchReport:
    """`imgbuild patches TARGET --check`: fetch each patched package's locked wheel (from the
    cache when a previous run kept it), unpack the files the patches touch into a scratch
    site-packages, and apply there. Nothing is built or installed."""
    ref = ws.target(target)
    patches = target_patches(ref.target, ws.patches)
    if not patches:
        return PatchReport(ref.name, True, ())
    lock, req = ref.lock(), ref.request
    urls = tuple(index_urls) if index_urls is not None else wheels.index_urls(req.extra_index_urls)
    results: dict[str, PatchResult] = {}
    by_pkg: dict[str, list[Patch]] = {}
    for p in patches:
        if lock.package(p.package) is None:
            results[p.id] = PatchResult(p.id, "not-applicable",
                                        f"{p.package} is not in the lock", p.package,
                                        upstream=p.upstream, fixes=p.fixes)
        else:
            by_pkg.setdefault(p.package, []).append(p)
    for pkg, group in by_pkg.items():
        locked = lock.package(pkg)
        with tempfile.TemporaryDirectory(prefix="imgbuild-patches-") as td, \
                wheels.fetch_locked(locked, urls, python=req.python,
                                    platform=req.uv_platform) as w:
            site = extract(w, Path(td), {f for p in group for f in p.files()})
            for r in check_site(group, site):
                results[r.id] = r
    return PatchReport(ref.name, True, tuple(results[p.id] for p in patches))


def listing(ws: Workspace, target: str) -> PatchReport:
    """`imgbuild patches TARGET` without --check: the patches and whether the locked version is
    in their range. No network."""
    ref = ws.target(target)
    patches = target_patches(ref.target, ws.patches)
    if not patches:
        return PatchReport(ref.name, False, ())
    lock = ref.lock()
    out = []
    for p in patches:
        pkg = lock.package(p.package)
        if pkg is None:
            out.append(PatchResult(p.id, "not-applicable", f"{p.package} is not in the lock",
                                   p.package, upstream=p.upstream, fixes=p.fixes))
            continue
        v = p.variant_for(pkg.version)
        detail = (f"{p.package} {pkg.version} is in {p.versions}; `--check` applies it to the "
                  "locked wheel" if p.covers(pkg.version) else
                  f"{p.package} {pkg.version} is outside {p.versions}; `--check` tells obsolete "
                  "from not-applicable")
        out.append(PatchResult(p.id, "unchecked", detail, p.package, pkg.version,
                               v.versions if v else None, tuple(p.files()), p.upstream, p.fixes))
    return PatchReport(ref.name, False, tuple(out))


def failed(results: Sequence[PatchResult]) -> bool:
    """True when the job should exit 1 (a patch does not apply to the locked version)."""
    return any(r.failed for r in results)



def to_dict(results: Sequence[PatchResult], *, target: str | None = None) -> dict:
    return {"target": target, "ok": not failed(results),
            "patches": [r.to_dict() for r in results]}

