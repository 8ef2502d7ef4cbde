"""What an image's bytes are: run inside the image (any image with a Python 3 interpreter),
standard library only, JSON on stdout. `imgbuild size IMAGE` sends this file's source as
`python3 -c`, so nothing has to be in the image beforehand.

Every regular file is counted once (hard links once), by:
- owner: the distribution whose RECORD lists it (site-packages), else the top directory;
- kind: shared library, static library (.a), header, bytecode (.pyc), Python source, test file
  (under a `tests`/`test` directory of a package), other;
- duplicates: files of 1 MiB or more whose bytes occur more than once (sha256 over candidates
  of equal size), with every path.
"""

from __future__ import annotations

import csv
import hashlib
import json
import os
import stat
import sys

SKIP = ("/proc", "/sys", "/dev", "/run", "/tmp")
BIG = 1 << 20
HEADER = (".h", ".hpp", ".hh", ".cuh", ".inl", ".inc")


def kind(path: str) -> str:
    name = os.path.basename(path)
    parts = path.split("/")
    if ".so" in name and (name.endswith(".so") or ".so." in name):
        return "shared library"
    if name.endswith(".a"):
        return "static library"
    if name.endswith(HEADER) or ("include" in parts and "." not in name):
        return "header"
    if name.endswith(".pyc"):
        return "bytecode"
    if "site-packages" in parts and ("tests" in parts or "test" in parts):
        return "test file"
    if name.endswith(".py"):
        return "python source"
    return "other"


def owners(bases: tuple[str, ...] | None = None) -> dict[str, str]:
    """path -> distribution, from every RECORD under a site-packages directory: this
    interpreter's and those of the virtual environments under `bases` (default VENV_BASES)."""
    out: dict[str, str] = {}
    mine = set() if bases is not None else {
        p for p in sys.path if p.endswith("site-packages") and os.path.isdir(p)}
    for root in sorted(mine | set(_venv_site_packages(bases or VENV_BASES))):
        for entry in os.listdir(root):
            if not entry.endswith(".dist-info"):
                continue
            dist = entry[: -len(".dist-info")].rsplit("-", 1)[0]
            try:
                with open(os.path.join(root, entry, "RECORD"), newline="") as f:
                    for row in csv.reader(f):
                        if row:
                            out[os.path.normpath(os.path.join(root, row[0]))] = dist
            except OSError:
                continue
    return out


# Where an image keeps the virtual environments its interpreter does not use.
VENV_BASES = ("/opt", "/usr/local", "/root", "/workspace", "/app")


def _venv_site_packages(bases: tuple[str, ...] = VENV_BASES) -> list[str]:
    """site-packages of virtual environments under `bases`, at most five levels down."""
    found = []
    for base in bases:
        if not os.path.isdir(base):
            continue
        for dirpath, dirnames, _ in os.walk(base):
            if dirpath.count("/") - base.count("/") > 5:
                dirnames[:] = []
            elif dirpath.endswith("site-packages"):
                found.append(dirpath)
                dirnames[:] = []
    return found


def _source_of(path: str) -> str:
    """pkg/__pycache__/mod.cpython-311.pyc -> pkg/mod.py: bytecode compiled at install time is
    in no RECORD, and belongs to the distribution of its source."""
    d, name = os.path.split(path)
    if os.path.basename(d) != "__pycache__" or not name.endswith(".pyc"):
        return ""
    return os.path.join(os.path.dirname(d), name.split(".", 1)[0] + ".py")


def measure(root: str = "/") -> dict:
    """The report for the tree at `root` (the image's /; another root in the tests): owners and
    paths are as the image sees them, from `root`."""
    root = os.path.abspath(root)

    def seen_as(path: str) -> str:  # the path as the image names it
        return path if root == "/" else "/" + os.path.relpath(path, root)

    skip = SKIP if root == "/" else tuple(os.path.join(root, s[1:]) for s in SKIP)
    owner_of = {seen_as(p): d for p, d in owners(None if root == "/" else tuple(
        os.path.join(root, b[1:]) for b in VENV_BASES)).items()}
    seen: set[tuple[int, int]] = set()
    total = 0
    by_owner: dict[str, int] = {}
    by_kind: dict[str, int] = {}
    by_owner_kind: dict[str, dict[str, int]] = {}
    by_size: dict[int, list[str]] = {}
    for dirpath, dirnames, filenames in os.walk(root):
        if dirpath.startswith(skip):
            dirnames[:] = []
            continue
        for name in filenames:
            try:
                st = os.lstat(os.path.join(dirpath, name))
            except OSError:
                continue
            path = seen_as(os.path.join(dirpath, name))
            if not stat.S_ISREG(st.st_mode) or (st.st_dev, st.st_ino) in seen:
                continue
            seen.add((st.st_dev, st.st_ino))
            size = st.st_size
            total += size
            owner = owner_of.get(path) or owner_of.get(_source_of(path)) \
                or "/" + path.split("/")[1]
            k = kind(path)
            by_owner[owner] = by_owner.get(owner, 0) + size
            by_kind[k] = by_kind.get(k, 0) + size
            ok = by_owner_kind.setdefault(owner, {})
            ok[k] = ok.get(k, 0) + size
            if size >= BIG:
                by_size.setdefault(size, []).append(path)
    dups = []
    for size, paths in by_size.items():
        if len(paths) < 2:
            continue
        groups: dict[str, list[str]] = {}
        for p in paths:
            h = hashlib.sha256()
            try:
                with open(p if root == "/" else os.path.join(root, p[1:]), "rb") as f:
                    for chunk in iter(lambda: f.read(1 << 20), b""):
                        h.update(chunk)
            except OSError:
                continue
            groups.setdefault(h.hexdigest(), []).append(p)
        for digest, same in groups.items():
            if len(same) > 1:
                dups.append({"sha256": digest, "size": size, "paths": sorted(same),
                             "owners": sorted({owner_of.get(p) or "/" + p.split("/")[1]
                                               for p in same})})
    return {"total": total, "files": len(seen), "by_owner": by_owner, "by_kind": by_kind,
            "by_owner_kind": by_owner_kind,
            "duplicates": sorted(dups, key=lambda d: -d["size"] * (len(d["paths"]) - 1))}


def main() -> None:
    json.dump(measure(), sys.stdout)


if __name__ == "__main__":
    main()
