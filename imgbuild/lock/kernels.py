"""The GPU code a lock's wheels carry: per package, per shared object, which SASS and PTX.

Read from the exact files the lock pins (imgbuild/lock/wheels.py: the target platform's wheel,
chosen by the lock's sha256; its big members fetched by HTTP Range and checked against the
wheel's RECORD), never installed, never run, no GPU. Each shared object is spooled to a
temporary file, its `.nv_fatbin` section found with pyelftools (the section the CUDA runtime
registers, and the one `cuobjdump` lists: a library may also carry fat binaries as plain data,
which this deliberately does not count) and that section scanned (imgbuild/lock/fatbin.py).

Results are cached by the wheel's sha256 and the member's name
(`$IMGBUILD_CACHE/kernels/<sha256>.json`): a wheel is read once per machine, whatever target
or lock asks again.
"""

from __future__ import annotations

import fnmatch
import hashlib
import json
import shutil
import tempfile
import time
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from ..errors import JobFailed
from ..fsutil import atomic_write_text
from . import fatbin, wheels
from .lockfile import LockedPackage, Lockfile

# Bump when what a scan reports changes: cached results of another version are read again.
SCANNER = 2
SECTION = ".nv_fatbin"
SHARED_OBJECT_GLOBS = ("*.so", "*.so.*")


@dataclass(frozen=True)
class FileCode:
    member: str  # path inside the wheel
    codes: tuple[str, ...]  # sorted entry names: sm_100a, compute_120 …
    sha256: str  # of the member: the file an image installs, which its smoke test checks


@dataclass(frozen=True)
class WheelCode:
    package: str
    version: str
    filename: str
    sha256: str
    files: tuple[FileCode, ...]
    transferred: int  # bytes fetched over the network for this read (0: from the cache)
    seconds: float


def shared_objects(names: Iterable[str]) -> list[str]:
    return [n for n in names if any(fnmatch.fnmatch(n.rsplit("/", 1)[-1], g)
                                    for g in SHARED_OBJECT_GLOBS)]


def select_members(names: Iterable[str], globs: tuple[str, ...]) -> list[str]:
    """The wheel members a rule names (fnmatch over the full path; `*` crosses `/`)."""
    sos = shared_objects(names)
    if not globs:
        return sos
    return [n for n in sos if any(fnmatch.fnmatch(n, g) for g in globs)]


def codes_in(path: Path) -> set[fatbin.Code]:
    """The GPU code in a shared object on disk: its .nv_fatbin section, scanned."""
    # Imported here: only a wheel not yet in the cache is read; every `imgbuild lock` imports
    # this module, and pyelftools costs ~0.1 s of its start-up.
    from elftools.common.exceptions import ELFError
    from elftools.elf.elffile import ELFFile

    with path.open("rb") as f:
        try:
            section = ELFFile(f).get_section_by_name(SECTION)
        except ELFError:
            return set()  # not ELF (a linker script named .so): no GPU code
        if section is None or section["sh_type"] == "SHT_NOBITS":
            return set()
        start, size = section["sh_offset"], section["sh_size"]

        def chunks():
            f.seek(start)
            left = size
            while left > 0:
                block = f.read(min(left, wheels.CHUNK * 8))
                if not block:
                    return
                left -= len(block)
                yield block

        return fatbin.scan(chunks())


def _cache_path(sha256: str) -> Path:
    return wheels.cache_root() / "kernels" / f"{sha256}.json"


def _cached(sha256: str) -> tuple[list[str] | None, dict[str, dict]]:
    """(the wheel's member names, what was scanned of it) from an earlier read."""
    try:
        doc = json.loads(_cache_path(sha256).read_text())
    except (OSError, ValueError):
        return None, {}
    if doc.get("scanner") != SCANNER:
        return None, {}
    return doc.get("names"), doc.get("files", {})


def scan_wheel(pkg: LockedPackage, globs: tuple[str, ...] = (), *,
               index_urls: Iterable[str] = (), python: str | None = None,
               platform: str | None = None) -> WheelCode:
    """GPU code in the members of `pkg`'s wheel (for the lock's platform) that `globs` name
    (every shared object when empty)."""
    t0 = time.monotonic()
    f = wheels.locate_locked(pkg, index_urls, python=python, platform=platform)
    if f.sha256 is None:
        raise JobFailed(f"the index gives no sha256 for {f.filename}",
                        hint="kernel coverage is cached by wheel hash; use an index that "
                             "publishes hashes (PEP 503 #sha256= or PEP 691)")
    names, known = _cached(f.sha256)
    transferred = 0
    if names is not None and all(m in known for m in select_members(names, globs)):
        files = {m: known[m] for m in select_members(names, globs)}
    else:
        pinned = {h.split(":", 1)[1] for h in pkg.hashes if h.startswith("sha256:")}
        with wheels.open_file(f, expect=pinned, what=f"{pkg.name}=={pkg.version}",
                              mode="range") as w:
            names = w.names()
            files = {}
            for m in select_members(names, globs):
                if m in known:
                    files[m] = known[m]
                    continue
                codes, sha = _scan_member(w, m)
                files[m] = {"codes": sorted(c.name for c in codes), "sha256": sha}
            transferred = w.transferred
        doc = {"scanner": SCANNER, "filename": f.filename, "names": names,
               "files": known | files}
        _cache_path(f.sha256).parent.mkdir(parents=True, exist_ok=True)
        atomic_write_text(_cache_path(f.sha256), json.dumps(doc, sort_keys=True))
    return WheelCode(pkg.name, pkg.version, f.filename, f.sha256,
                     tuple(FileCode(m, tuple(c["codes"]), c["sha256"])
                           for m, c in sorted(files.items())),
                     transferred, time.monotonic() - t0)


def _scan_member(w: wheels.Wheel, member: str) -> tuple[set[fatbin.Code], str]:
    # Spooled to disk, not memory: flash-attention's kernel library is over 1 GB unpacked.
    h = hashlib.sha256()
    with tempfile.NamedTemporaryFile(prefix="imgbuild-so-", dir=_spool_dir()) as tmp:
        for block in w.stream(member):
            h.update(block)
            tmp.write(block)
        tmp.flush()
        return codes_in(Path(tmp.name)), h.hexdigest()


# --- the record: lockfiles/<lock>.kernels.json ------------------------------------------------

RECORD_FORMAT = 1


def record_path(lock_path: Path) -> Path:
    """Next to the lock it was read from, committed with it: `plan` judges coverage from it
    without a network, and it changes only when the lock or the rules do."""
    return lock_path.with_name(lock_path.stem + ".kernels.json")


def read_record(path: Path, lock_digest: str, rules_digest: str) -> dict | None:
    """The record, if it is for this lock and these rules (else None: stale or absent)."""
    try:
        doc = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    if (doc.get("format"), doc.get("lock"), doc.get("rules")) != \
            (RECORD_FORMAT, lock_digest, rules_digest):
        return None
    return doc


def make_record(lock: Lockfile, rules: Iterable[tuple[str, tuple[str, ...]]], rules_digest: str,
                *, index_urls: Iterable[str] = (), python: str | None = None,
                platform: str | None = None) -> tuple[dict, list[WheelCode]]:
    """Read every (package, file globs) the rules name from the lock's wheels. Packages the
    lock does not hold are left out (the judge says so)."""
    urls = tuple(index_urls)
    globs: dict[str, list[str]] = {}
    for name, files in rules:
        if not files:
            globs[name] = []  # every shared object
        elif globs.get(name) != []:
            globs.setdefault(name, []).extend(files)
    packages, scans = {}, []
    for name in sorted(globs):
        pkg = lock.package(name)
        if pkg is None:
            continue
        wc = scan_wheel(pkg, tuple(dict.fromkeys(globs[name])), index_urls=urls,
                        python=python, platform=platform)
        scans.append(wc)
        packages[wc.package] = {
            "version": wc.version, "wheel": wc.filename, "sha256": wc.sha256,
            "files": {f.member: {"codes": list(f.codes), "sha256": f.sha256} for f in wc.files}}
    doc = {"format": RECORD_FORMAT, "lock": lock.digest, "rules": rules_digest,
           "scanner": SCANNER, "packages": packages}
    return doc, scans


def write_record(path: Path, doc: dict) -> None:
    atomic_write_text(path, json.dumps(doc, indent=1, sort_keys=True) + "\n")


def _spool_dir() -> str | None:
    d = wheels.cache_root() / "tmp"
    try:
        d.mkdir(parents=True, exist_ok=True)
    except OSError:
        return None
    return str(d) if shutil.disk_usage(d).free > 4 << 30 else None
