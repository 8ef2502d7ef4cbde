"""A static proof that a lock still needs an override, tried before uv is asked.

`imgbuild lock` says which overrides a lock still needs by resolving again without each one
(resolve.check_overrides), a whole uv resolution per override. Most overrides settle a clash
of exact pins (sglang pins compressed-tensors==0.18.0, vllm ==0.17.0), and that is plain in
the locked packages' own metadata: when a package in the lock, at its locked version, requires
the overridden package with a specifier that excludes the locked version, no resolution
without the override can be the lock (the lock breaks that requirement), so the override is
needed. That takes a few metadata files, not a resolution.

The proof is one-sided on purpose. It only ever says "needed"; "removable" is uv's answer
alone. Every step under-approximates: a requirement whose marker cannot be judged for the
target (an `extra`, a variable uv sets from the host) does not count, a package whose wheel
for the target is not known for sure does not count, and whatever cannot be fetched or parsed
proves nothing. Then uv answers, as before.
"""

from __future__ import annotations

import os
import re
import zipfile
from collections.abc import Iterable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from email.parser import BytesHeaderParser
from pathlib import Path

from packaging.markers import InvalidMarker, Marker
from packaging.requirements import InvalidRequirement, Requirement
from packaging.specifiers import InvalidSpecifier, SpecifierSet
from packaging.tags import Tag
from packaging.utils import InvalidWheelFilename, canonicalize_name, parse_wheel_filename
from packaging.version import InvalidVersion, Version

from . import wheels as wh
from .lockfile import LockedPackage

# Requirers read per override, most shared first (see requirers_to_read): one is proof enough,
# and the few named in the effect are what a reader needs. torch has 19 in one lock.
MAX_REQUIRERS = 4
# Conflicts named in one effect sentence.
MAX_NAMED = 3
# Metadata files fetched at once: each is one or two small requests, waiting on the network.
FETCH_WORKERS = 8


# --- the decisions: pure functions on plain data --------------------------------------------

@dataclass(frozen=True)
class Conflict:
    """A locked package whose requirement the lock breaks without the override."""

    requirer: str  # canonical name
    version: str  # its locked version
    requirement: str  # as its metadata words it, without the marker: "compressed-tensors==0.17.0"


def marker_environment(python: str, uv_platform: str) -> dict[str, str] | None:
    """The marker variables uv's resolution fixes for a lock request, from its python
    ("3.12") and platform ("x86_64-manylinux_2_39") alone; None when the platform is not one
    this knows. Left out on purpose, so a marker naming them is not judged: the host's
    (platform_release, platform_version), the implementation (uv takes it from the interpreter
    it finds), and python_full_version (uv's patch level for "3.12" is its own choice)."""
    if not re.fullmatch(r"\d+\.\d+", python):
        return None
    m = re.fullmatch(r"([a-z0-9_]+)-(many|musl)linux_\d+_\d+", uv_platform)
    if not m:
        return None
    return {"python_version": python, "sys_platform": "linux", "platform_system": "Linux",
            "os_name": "posix", "platform_machine": m.group(1)}


_MARKER_WORDS = frozenset({"and", "or", "in", "not"})


def marker_variables(marker: str) -> frozenset[str]:
    """The variables a marker names (its quoted values taken out first)."""
    bare = re.sub(r"'[^']*'|\"[^\"]*\"", " ", marker)
    return frozenset(re.findall(r"[A-Za-z_][A-Za-z0-9_.]*", bare)) - _MARKER_WORDS


def marker_applies(marker: str | None, env: Mapping[str, str] | None) -> bool:
    """Whether a requirement with this marker surely applies to the target. No marker: yes.
    A marker with a variable `env` does not fix (an `extra` above all: whether anyone asks for
    the extra is not known here) or one that does not parse: no, so it proves nothing."""
    if not marker:
        return True
    if env is None or not marker_variables(marker) <= env.keys():
        return False
    try:
        return Marker(marker).evaluate(dict(env))
    except (InvalidMarker, ValueError, KeyError):
        return False


def excludes(specifier: str, version: str) -> bool:
    """Whether the specifier rules the version out. Pre-releases are compared as versions (a
    locked rc that a range contains is not excluded: the range alone does not forbid it);
    said outright, as older packaging releases left them out of a range by default."""
    try:
        return not SpecifierSet(specifier).contains(Version(version), prereleases=True)
    except (InvalidSpecifier, InvalidVersion):
        return False


def breaking_requirements(requires_dist: Iterable[str], name: str, locked_version: str,
                          env: Mapping[str, str] | None) -> tuple[str, ...]:
    """The requirements on `name` in one file's Requires-Dist that apply to the target and
    exclude its locked version, each without its marker. One that does not parse is left
    out: it proves nothing."""
    want = canonicalize_name(name)
    out = []
    for line in requires_dist:
        # The name first: a full parse of each of vLLM's hundred requirements, for each
        # override, cost more than the network did.
        lead = re.match(r"\s*([A-Za-z0-9][A-Za-z0-9._-]*)", line)
        if not lead or canonicalize_name(lead.group(1)) != want:
            continue
        try:
            r = Requirement(line)
        except InvalidRequirement:
            continue
        if canonicalize_name(r.name) != want:
            continue  # (a URL requirement has no specifier, and so excludes nothing)
        if marker_applies(str(r.marker) if r.marker else None, env) and \
                excludes(str(r.specifier), locked_version):
            out.append(f"{want}{r.specifier}")
    return tuple(out)


def requirer_conflict(requirer: LockedPackage, files: tuple[tuple[str, ...], ...], name: str,
                      locked_version: str, env: Mapping[str, str] | None) -> Conflict | None:
    """The conflict one locked package makes, or None. `files`: the Requires-Dist of every
    wheel of its locked version that uv could have read for the target. Metadata can differ
    between them (torch's does), so each one must break a requirement; none known: no proof."""
    if not files:
        return None
    found = [breaking_requirements(f, name, locked_version, env) for f in files]
    if not all(found):
        return None
    return Conflict(requirer.name, requirer.version, found[0][0])


def requirers(body: str) -> dict[str, tuple[str, ...]]:
    """Who requires each locked package, by uv's own `# via` annotations in a lock body
    (`# via vllm` on one line, or `# via` then one `#   pkg` a line); not the input files
    (`-r requirements.in`, `--override overrides.txt`). One pass over the body."""
    out: dict[str, list[str]] = {}
    current: list[str] | None = None
    in_via = False
    for line in body.splitlines():
        if line[:1].isalnum():  # a pin starts a package's block: `name==version \`
            name = line.split("==", 1)[0]
            current, in_via = out.setdefault(canonicalize_name(name), []), False
            continue
        s = line.strip()
        if current is None or not s.startswith("#"):
            continue
        text = s[1:].strip()
        if text.startswith("via"):
            in_via, text = True, text[3:].strip()
        elif not in_via:
            continue
        if text and not text.startswith("-"):
            current.append(canonicalize_name(text.split()[0]))
    return {k: tuple(dict.fromkeys(v)) for k, v in out.items()}


def override_name(requirement: str) -> str | None:
    try:
        return canonicalize_name(Requirement(requirement).name)
    except InvalidRequirement:
        return None


def requirers_to_read(pending: Mapping[str, tuple[str, ...]],
                      limit: int = MAX_REQUIRERS) -> dict[str, tuple[str, ...]]:
    """Per override (its requirers by `# via`), which to read: those that bear on the most
    overrides first (one file read serves them all), then by name; at most `limit` each."""
    shared: dict[str, int] = {}
    for names in pending.values():
        for n in names:
            shared[n] = shared.get(n, 0) + 1
    return {ov: tuple(sorted(names, key=lambda n: (-shared[n], n))[:limit])
            for ov, names in pending.items()}


def effect(conflicts: tuple[Conflict, ...], name: str, locked_version: str) -> str:
    """The effect in words: who requires what, and what the lock has."""
    shown = "; ".join(f"{c.requirer} {c.version} requires {c.requirement}"
                      for c in conflicts[:MAX_NAMED])
    more = f" (+{len(conflicts) - MAX_NAMED} more)" if len(conflicts) > MAX_NAMED else ""
    return f"without it: {shown}{more}, the lock has {name} {locked_version}"


def prove(override: str, kept: tuple[str, ...], packages: Mapping[str, LockedPackage],
          requirers: tuple[str, ...], metadata: Mapping[str, tuple[tuple[str, ...], ...] | None],
          env: Mapping[str, str] | None) -> str | None:
    """The effect sentence when the lock surely needs `override`, else None (ask uv).

    kept: the overrides left when it is dropped (another one on the same package would still
    replace every requirement on it); packages: the lock's, by name; requirers: whom to read;
    metadata: their files' Requires-Dist, None where unknown."""
    name = override_name(override)
    if name is None or name not in packages:
        return None
    if any(override_name(k) == name for k in kept):
        return None
    locked_version = packages[name].version
    found = []
    for r in requirers:
        pkg, files = packages.get(r), metadata.get(r)
        if pkg is None or files is None:
            continue
        c = requirer_conflict(pkg, files, name, locked_version, env)
        if c is not None:
            found.append(c)
    return effect(tuple(found), name, locked_version) if found else None


# --- the metadata: from the index (wheels.wheel_metadata) or the --find-links directory ------

def requires_dist(raw: bytes) -> tuple[str, ...]:
    """Requires-Dist of a core metadata file."""
    return tuple(str(v) for v in BytesHeaderParser().parsebytes(raw).get_all("Requires-Dist")
                 or ())


def _local_candidates(pkg: LockedPackage, wheels: Path, accepted: frozenset[Tag]) -> list[Path]:
    out = []
    for p in sorted(wheels.glob("*.whl")):
        try:
            name, ver, _, tags = parse_wheel_filename(p.name)
        except (InvalidWheelFilename, InvalidVersion):
            continue
        if name == pkg.name and ver == Version(pkg.version) and accepted & tags:
            out.append(p)
    return out


def _index_candidates(pkg: LockedPackage, urls: tuple[str, ...], accepted: frozenset[Tag],
                      *, all_pinned: bool) -> list[wh.IndexFile] | None:
    """The wheels of the locked version on the indexes that fit the target and have a hash
    the lock pins. all_pinned: None unless every file the lock pins is one the indexes list
    (uv pins every file of the version it saw: one missing here came from somewhere this
    does not read, and its metadata could be the one uv read)."""
    pinned = {h.split(":", 1)[1] for h in pkg.hashes if h.startswith("sha256:")}
    version = Version(pkg.version)
    files = [f for u in urls for f in wh.project_files(pkg.name, u)]
    if all_pinned and not pinned <= {f.sha256 for f in files}:  # (the sdist's hash too)
        return None
    return [f for f in files if f.version == version and accepted & f.tags
            and (f.sha256 is None or f.sha256 in pinned)]


def _read_local(path: Path) -> bytes | None:
    with zipfile.ZipFile(path) as z:
        return wh._metadata_member(z)


def file_requirements(pkg: LockedPackage, *, python: str, uv_platform: str,
                      index_urls: tuple[str, ...], wheels: Path | None,
                      ) -> tuple[tuple[str, ...], ...] | None:
    """The Requires-Dist of every wheel of `pkg`'s locked version that uv could read for the
    target (tags that fit its python and platform, a hash the lock pins), from the indexes
    the request uses and the --find-links directory; None when not known for sure."""
    accepted = wh.compatible_tags(python, uv_platform)
    if not accepted:
        return None
    # Anything that goes wrong here (the network, an index's odd answer, a torn zip) only
    # means no proof: uv answers instead, and says what is wrong if it matters.
    try:
        # With a --find-links directory its files are not hashed (torch's is gigabytes): every
        # one that fits is read instead, and the lock's other files may be among them.
        remote = _index_candidates(pkg, index_urls, accepted, all_pinned=wheels is None)
        if remote is None:
            return None
        raws = [_read_local(p)
                for p in (_local_candidates(pkg, wheels, accepted) if wheels else [])]
        raws += [wh.wheel_metadata(f) for f in remote]
    except Exception:  # noqa: BLE001 (see above: a failure is "unknown", never an error)
        return None
    if not raws or any(r is None for r in raws):
        return None
    return tuple(requires_dist(r) for r in raws if r is not None)


def read_metadata(pkgs: Iterable[LockedPackage], *, python: str, uv_platform: str,
                  index_urls: tuple[str, ...], wheels: Path | None,
                  ) -> dict[str, tuple[tuple[str, ...], ...] | None]:
    """file_requirements for several packages side by side, by name."""
    todo = list({p.name: p for p in pkgs}.values())
    if not todo:
        return {}
    # No more threads than cores: each read costs CPU too (a session and its TLS handshakes
    # per thread, a page to parse); on 2 cores, 4 threads took half again as long as 1.
    with ThreadPoolExecutor(max_workers=min(FETCH_WORKERS, len(todo),
                                            os.cpu_count() or 1)) as pool:
        got = pool.map(lambda p: file_requirements(
            p, python=python, uv_platform=uv_platform, index_urls=index_urls, wheels=wheels),
            todo)
        return dict(zip((p.name for p in todo), got))
