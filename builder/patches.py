"""Compatibility patches: data under images/patches/, checked against locked wheels, applied
in the image by builder/payload/patcher.py.

A patch is `images/patches/<id>.yaml`:

    id: sglang-ct-ignore-exact-match       # optional; must equal the file name
    package: sglang
    versions: ">=0.5.7,<0.5.17"           # where the defect is, confirmed in the wheels
    fixes: the error it fixes, in the words the user sees
    upstream: https://github.com/...       # the issue or pull request, or "unknown"
    diff: <id>.diff                        # unified diff against the installed files (paths
                                           # relative to site-packages), a file next to the
                                           # YAML or inline text; or, when the code moved
                                           # between releases:
    variants:
      - {versions: ">=0.5.7,<0.5.9", diff: <id>/0.5.7.diff}
      - {versions: ">=0.5.9,<0.5.17", diff: <id>/0.5.9.diff}
    probe: |                               # Python run by the smoke test inside the image:
      ns = load("pkg/mod.py", "func")      # fails without the patch, passes with it
      assert ...

The decisions (applies / obsolete / fails / not-applicable) are made by the patcher itself,
imported here, so `imgbuild patches TARGET --check` and the build agree by construction.
"""

from __future__ import annotations

import hashlib
import json
import re
import tempfile
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING

from packaging.specifiers import InvalidSpecifier, SpecifierSet
from packaging.utils import canonicalize_name
from packaging.version import Version

from .errors import InputError, SpecError
from .payload import patcher

if TYPE_CHECKING:
    from .lock import Lockfile
    from .spec import Catalog, Target
    from .wheels import Wheel

ASSETS = "/opt/imgbuild"  # where the payload lives in the image (render.ASSETS)
PATCHER = Path(patcher.__file__)
PATCH_KEYS = {"id", "package", "versions", "fixes", "upstream", "diff", "variants", "probe"}
STATUSES = ("applies", "obsolete", "fails", "not-applicable", "unchecked")


# --- the data -----------------------------------------------------------------------------

@dataclass(frozen=True)
class Variant:
    versions: str
    diff: str  # the unified diff text
    source: str  # where it came from: a path under images/, or "<inline>"


@dataclass(frozen=True)
class Patch:
    id: str
    path: str  # the YAML, relative to the checkout (for messages)
    package: str  # canonical name
    versions: str
    fixes: str
    upstream: str
    variants: tuple[Variant, ...]
    probe: str

    def files(self) -> list[str]:
        """Every file (relative to site-packages) any variant changes."""
        out: list[str] = []
        for v in self.variants:
            out += [f.path for f in patcher.parse_diff(v.diff) if f.path not in out]
        return out

    def covers(self, version: str) -> bool:
        return Version(version) in SpecifierSet(self.versions, prereleases=True)

    def variant_for(self, version: str) -> Variant | None:
        return next((v for v in self.variants
                     if Version(version) in SpecifierSet(v.versions, prereleases=True)), None)

    def to_json(self) -> dict:
        """The document the in-image patcher reads (patches/<id>.json)."""
        return {"id": self.id, "package": self.package, "versions": self.versions,
                "fixes": self.fixes, "upstream": self.upstream,
                "variants": [{"versions": v.versions, "diff": v.diff} for v in self.variants],
                "probe": self.probe}


def patches_dir(root: Path | None = None) -> Path:
    """images/patches/ (root is the images/ directory)."""
    from .spec import images_dir

    return Path(root or images_dir()) / "patches"


def _rel(path: Path, root: Path) -> str:
    try:
        return str(path.relative_to(root.parent))
    except ValueError:
        return str(path)


def _specifier(rel: str, key: str, text: object) -> str:
    expected = "a PEP 440 specifier in quotes, such as '>=0.5.7,<0.5.17'"
    if not isinstance(text, str) or not text.strip():
        raise SpecError(rel, key, expected, text)
    try:
        SpecifierSet(text)
        patcher.version_in("0", text)  # the in-image patcher must read it too
    except (InvalidSpecifier, ValueError) as e:
        raise SpecError(rel, key, expected, f"{text!r} ({e})") from None
    return text


def _diff(rel: str, key: str, value: object, base: Path, root: Path) -> tuple[str, str]:
    expected = ("a unified diff (inline, or a path to a .diff file next to the YAML) whose "
                "paths are relative to site-packages")
    if not isinstance(value, str) or not value.strip():
        raise SpecError(rel, key, expected, value)
    if "\n" in value.strip():
        text, source = value, "<inline>"
    else:
        p = (base / value).resolve()
        if ".." in Path(value).parts or value.startswith("/"):
            raise SpecError(rel, key, "a path inside images/patches/", value)
        if not p.is_file():
            raise SpecError(rel, key, f"an existing diff file ({_rel(p, root)} is missing)", value)
        text, source = p.read_text(encoding="utf-8"), _rel(p, root)
    try:
        patcher.parse_diff(text)
    except ValueError as e:
        raise SpecError(rel, key, expected, f"{source}: {e}") from None
    return text, source


def load_patch(path: Path, root: Path | None = None) -> Patch:
    """Read and validate one patch file; SpecError names the file and the key."""
    from .spec import _Doc, _read_yaml

    root = Path(root or path.parent.parent)
    rel = _rel(path, root)
    doc = _Doc(rel, _read_yaml(path, root))
    doc.reject_unknown(PATCH_KEYS)
    pid = doc.get("id", str, path.stem)
    if pid != path.stem:
        raise SpecError(rel, "id", f"the file's name, {path.stem!r}", pid)
    package = doc.get("package", str, what="a package name such as 'sglang'")
    if not re.match(r"^[A-Za-z0-9][A-Za-z0-9._-]*$", package):
        raise SpecError(rel, "package", "a package name such as 'sglang'", package)
    versions = _specifier(rel, "versions", doc.get("versions", str, what="a PEP 440 specifier"))
    fixes = doc.get("fixes", str, what="the error the patch fixes, in the user's words")
    if not fixes.strip():
        raise SpecError(rel, "fixes", "the error the patch fixes, in the user's words", fixes)
    upstream = doc.get("upstream", str, what="the upstream issue or pull request URL, or 'unknown'")
    if upstream != "unknown" and not re.match(r"^https://\S+$", upstream):
        raise SpecError(rel, "upstream", "an https:// URL of the upstream issue or pull request, "
                                         "or 'unknown'", upstream)
    has_diff, has_variants = "diff" in doc.data, "variants" in doc.data
    if has_diff == has_variants:
        raise SpecError(rel, "diff", "exactly one of `diff:` or `variants:`",
                        "both" if has_diff else "neither")
    variants: list[Variant] = []
    if has_diff:
        text, source = _diff(rel, "diff", doc.data["diff"], path.parent, root)
        variants.append(Variant(versions, text, source))
    else:
        items = doc.get("variants", list, what="a list of {versions, diff}")
        if not items:
            raise SpecError(rel, "variants", "at least one {versions, diff}", items)
        for i, item in enumerate(items):
            vd = doc.sub(f"variants[{i}]", item)
            vd.reject_unknown({"versions", "diff"})
            vv = _specifier(rel, vd.key("versions"), vd.get("versions", str))
            text, source = _diff(rel, vd.key("diff"), vd.data.get("diff"), path.parent, root)
            variants.append(Variant(vv, text, source))
    probe = doc.get("probe", str, what="a few lines of Python that fail without the patch")
    try:
        compile(probe, f"{rel}: probe", "exec", dont_inherit=True)
    except SyntaxError as e:
        raise SpecError(rel, "probe", "Python source", f"line {e.lineno}: {e.msg}") from None
    return Patch(pid, rel, canonicalize_name(package), versions, " ".join(fixes.split()),
                 upstream, tuple(variants), probe)


def load_patches(root: Path | None = None) -> dict[str, Patch]:
    """Every patch under images/patches/, by id."""
    d = patches_dir(root)
    images = Path(root) if root else d.parent
    return {p.stem: load_patch(p, images) for p in sorted(d.glob("*.yaml"))} if d.is_dir() else {}


def target_patches(target: Target, root: Path | None = None) -> list[Patch]:
    """The patches a target lists, in its order; an unknown id names the target's file."""
    known = load_patches(root)
    out = []
    for i, pid in enumerate(target.patches):
        if pid not in known:
            import difflib

            close = difflib.get_close_matches(pid, list(known), n=1)
            raise SpecError(target.path, f"patches[{i}]",
                            "a patch id under images/patches/: " + (", ".join(sorted(known))
                                                                     or "(none)"),
                            pid, hint=f"did you mean '{close[0]}'?" if close else None)
        out.append(known[pid])
    return out


# --- checking against the locked wheel ----------------------------------------------------

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


def _lock_for(target: Target, catalog: Catalog, lock_dir: Path) -> tuple[Lockfile, object]:
    from .lock import read_lock
    from .plan import lock_request

    req = lock_request(catalog, target)
    path = Path(lock_dir) / req.filename()
    if not path.exists():
        raise InputError(f"target '{target.name}' has no lock yet",
                         facts=[f"expected {path}"],
                         hint=f"run `imgbuild lock {target.name}` first")
    return read_lock(path), req


def check(target: Target, catalog: Catalog, lock_dir: Path, *,
          index_urls: Sequence[str] | None = None) -> list[PatchResult]:
    """`imgbuild patches TARGET --check`: fetch each patched package's locked wheel (from the
    cache when a previous run kept it), unpack the files the patches touch into a scratch
    site-packages, and apply there. Nothing is built or installed."""
    from . import wheels

    patches = target_patches(target, catalog.root)
    if not patches:
        return []
    lock, req = _lock_for(target, catalog, lock_dir)
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
    return [results[p.id] for p in patches]


def listing(target: Target, catalog: Catalog, lock_dir: Path) -> list[PatchResult]:
    """`imgbuild patches TARGET` without --check: the patches and whether the locked version is
    in their range. No network."""
    patches = target_patches(target, catalog.root)
    if not patches:
        return []
    lock, _ = _lock_for(target, catalog, lock_dir)
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
    return out


def failed(results: Sequence[PatchResult]) -> bool:
    """True when the job should exit 1 (a patch does not apply to the locked version)."""
    return any(r.failed for r in results)


# --- the build context --------------------------------------------------------------------

def context_files(plan_patches: Sequence[str], lock: Lockfile,
                  root: Path | None = None) -> dict[str, str]:
    """Files for the patch layer, by path relative to the context directory that is copied to
    /opt/imgbuild/: `patcher.py` and `patches/<id>.json` for each listed patch whose package
    is in the lock (every variant: the patcher picks by the installed version, and tells an
    upstream fix from a broken patch). Empty when nothing is to be patched."""
    known = load_patches(root)
    out: dict[str, str] = {}
    for pid in plan_patches:
        if pid not in known:
            raise SpecError("images/patches", f"{pid}.yaml", "a patch file for the plan's patch id",
                            pid)
        p = known[pid]
        if lock.package(p.package) is None:
            continue
        out[f"patches/{pid}.json"] = json.dumps(p.to_json(), indent=2, sort_keys=True) + "\n"
    if out:
        out["patcher.py"] = PATCHER.read_text(encoding="utf-8")
    return dict(sorted(out.items()))


def expected_applied(plan_patches: Sequence[str], lock: Lockfile,
                     root: Path | None = None) -> tuple[str, ...]:
    """The ids the patch layer will apply: those whose `versions` cover the locked version of
    their package. No network; for the image's labels. (An in-range patch that upstream has
    backported would be reported obsolete by the build instead; `patches --check` tells.)"""
    known = load_patches(root)
    out = []
    for pid in plan_patches:
        p = known.get(pid)
        pkg = lock.package(p.package) if p else None
        if pkg is not None and p.covers(pkg.version):
            out.append(pid)
    return tuple(out)


def context_digest(files: dict[str, str]) -> str:
    """A hash of context_files(): put it in the plan's content key."""
    h = hashlib.sha256()
    for k, v in sorted(files.items()):
        h.update(k.encode() + b"\0" + v.encode() + b"\0")
    return "sha256:" + h.hexdigest()


def write_context(files: dict[str, str], dest: Path) -> None:
    """Write context_files() under `dest` (e.g. <context>/patchset)."""
    for rel, text in files.items():
        p = Path(dest) / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(text, encoding="utf-8")


def apply_command(python: str = "python") -> str:
    """The RUN line of the patch layer (after COPY <patchset>/ /opt/imgbuild/)."""
    return (f"{python} {ASSETS}/patcher.py --patches {ASSETS}/patches "
            f"--report {ASSETS}/patches.json")


def probe_command(python: str = "python") -> list[str]:
    """What the smoke test runs in the image: prints JSON, exits 1 if a probe fails."""
    return [python, f"{ASSETS}/patcher.py", "--probe", "--patches", f"{ASSETS}/patches",
            "--report", f"{ASSETS}/patches.json"]


# --- reporting ----------------------------------------------------------------------------

def to_dict(results: Sequence[PatchResult], *, target: str | None = None) -> dict:
    return {"target": target, "ok": not failed(results),
            "patches": [r.to_dict() for r in results]}


_STYLE = {"applies": "green", "obsolete": "yellow", "fails": "bold red",
          "not-applicable": "dim", "unchecked": "cyan"}


def render(results: Sequence[PatchResult], console=None, *, target: str | None = None) -> None:
    from rich.console import Console
    from rich.table import Table

    c = console or Console(highlight=False)
    if not results:
        c.print(f"target '{target}' lists no patches" if target else "no patches")
        return
    t = Table(title=f"patches for {target}" if target else "patches", title_justify="left")
    for col in ("patch", "package", "status", "variant", "detail"):
        t.add_column(col, overflow="fold")
    for r in results:
        pkg = f"{r.package} {r.version}" if r.version else r.package
        t.add_row(r.id, pkg, f"[{_STYLE.get(r.status, '')}]{r.status}[/]", r.variant or "-",
                  r.detail)
    c.print(t)
    for r in results:
        if r.status in ("applies", "fails"):
            c.print(f"[bold]{r.id}[/]: {r.fixes} [dim]({r.upstream})[/]", highlight=False)
