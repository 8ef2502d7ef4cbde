"""Compatibility patches: data under images/patches/, checked against locked wheels, applied
in the image by imgbuild/payload/patcher.py.

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

import difflib
import re
from dataclasses import dataclass
from pathlib import Path

from packaging.specifiers import InvalidSpecifier, SpecifierSet
from packaging.utils import canonicalize_name
from packaging.version import Version

from ..errors import SpecError
from ..payload import patcher
from .schema import Doc, read_yaml, rel
from .targets import Target

PATCH_KEYS = {"id", "package", "versions", "fixes", "upstream", "diff", "variants", "probe"}
VARIANT_KEYS = {"versions", "diff"}


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


def _specifier(where: str, key: str, text: object) -> str:
    expected = "a PEP 440 specifier in quotes, such as '>=0.5.7,<0.5.17'"
    if not isinstance(text, str) or not text.strip():
        raise SpecError(where, key, expected, text)
    try:
        SpecifierSet(text)
        patcher.version_in("0", text)  # the in-image patcher must read it too
    except (InvalidSpecifier, ValueError) as e:
        raise SpecError(where, key, expected, f"{text!r} ({e})") from None
    if not _can_match(SpecifierSet(text)):
        # Such a patch would never apply and always pass as "not applicable": a typo, say
        # '<0.5.7' for '<0.5.17', must not read as "nothing to patch".
        raise SpecError(where, key, "a range some version falls in", f"{text!r} (no version "
                        "satisfies all of it: check the bounds' order)")
    return text


def _can_match(spec: SpecifierSet) -> bool:
    """Whether some version satisfies `spec`: tried on the versions it names and the points
    just above and between them (a range's bounds are among them)."""
    if any(sp.operator == "===" for sp in spec):
        return True  # arbitrary equality: a string, not a version to reason about
    named = [Version(sp.version.removesuffix(".*")) for sp in spec]
    tries = [Version("0"), Version("99999")]
    for v in named:
        r = v.release
        tries += [v, Version(f"{v}.post1"), Version(".".join(map(str, (*r, 1)))),
                  Version(".".join(map(str, (*r[:-1], r[-1] + 1)))),
                  Version(".".join(map(str, (*r, 0, 1))))]
    return any(spec.contains(t, prereleases=True) for t in tries)


def _diff(where: str, key: str, value: object, base: Path, root: Path) -> tuple[str, str]:
    expected = ("a unified diff (inline, or a path to a .diff file next to the YAML) whose "
                "paths are relative to site-packages")
    if not isinstance(value, str) or not value.strip():
        raise SpecError(where, key, expected, value)
    if "\n" in value.strip():
        text, source = value, "<inline>"
    else:
        p = (base / value).resolve()
        if ".." in Path(value).parts or value.startswith("/"):
            raise SpecError(where, key, "a path inside images/patches/", value)
        if not p.is_file():
            raise SpecError(where, key, f"an existing diff file ({rel(p, root)} is missing)", value)
        text, source = p.read_text(encoding="utf-8"), rel(p, root)
    try:
        patcher.parse_diff(text)
    except ValueError as e:
        raise SpecError(where, key, expected, f"{source}: {e}") from None
    return text, source


def load_patch(path: Path, root: Path | None = None) -> Patch:
    """Read and validate one patch file; SpecError names the file and the key."""
    root = Path(root or path.parent.parent)
    where = rel(path, root)
    doc = Doc(where, read_yaml(path, root))
    doc.reject_unknown(PATCH_KEYS)
    pid = doc.get("id", str, path.stem)
    if pid != path.stem:
        raise SpecError(where, "id", f"the file's name, {path.stem!r}", pid)
    package = doc.get("package", str, what="a package name such as 'sglang'")
    if not re.match(r"^[A-Za-z0-9][A-Za-z0-9._-]*$", package):
        raise SpecError(where, "package", "a package name such as 'sglang'", package)
    versions = _specifier(where, "versions", doc.get("versions", str, what="a PEP 440 specifier"))
    fixes = doc.get("fixes", str, what="the error the patch fixes, in the user's words")
    if not fixes.strip():
        raise SpecError(where, "fixes", "the error the patch fixes, in the user's words", fixes)
    upstream = doc.get("upstream", str, what="the upstream issue or pull request URL, or 'unknown'")
    if upstream != "unknown" and not re.match(r"^https://\S+$", upstream):
        raise SpecError(where, "upstream", "an https:// URL of the upstream issue or pull request, "
                                         "or 'unknown'", upstream)
    has_diff, has_variants = "diff" in doc.data, "variants" in doc.data
    if has_diff == has_variants:
        raise SpecError(where, "diff", "exactly one of `diff:` or `variants:`",
                        "both" if has_diff else "neither")
    variants: list[Variant] = []
    if has_diff:
        text, source = _diff(where, "diff", doc.data["diff"], path.parent, root)
        variants.append(Variant(versions, text, source))
    else:
        items = doc.get("variants", list, what="a list of {versions, diff}")
        if not items:
            raise SpecError(where, "variants", "at least one {versions, diff}", items)
        for i, item in enumerate(items):
            vd = doc.sub(f"variants[{i}]", item)
            vd.reject_unknown(VARIANT_KEYS)
            vv = _specifier(where, vd.key("versions"), vd.get("versions", str))
            text, source = _diff(where, vd.key("diff"), vd.data.get("diff"), path.parent, root)
            variants.append(Variant(vv, text, source))
    probe = doc.get("probe", str, what="a few lines of Python that fail without the patch")
    try:
        compile(probe, f"{where}: probe", "exec", dont_inherit=True)
    except SyntaxError as e:
        raise SpecError(where, "probe", "Python source", f"line {e.lineno}: {e.msg}") from None
    return Patch(pid, where, canonicalize_name(package), versions, " ".join(fixes.split()),
                 upstream, tuple(variants), probe)


def load_patches(images: Path) -> dict[str, Patch]:
    """Every patch under images/patches/, by id."""
    d = Path(images) / "patches"
    return {p.stem: load_patch(p, images) for p in sorted(d.glob("*.yaml"))} if d.is_dir() else {}


def target_patches(target: Target, known: dict[str, Patch]) -> list[Patch]:
    """The patches a target lists, in its order; an unknown id names the target's file."""
    out = []
    for i, pid in enumerate(target.patches):
        if pid not in known:
            close = difflib.get_close_matches(pid, list(known), n=1)
            raise SpecError(target.path, f"patches[{i}]",
                            "a patch id under images/patches/: " + (", ".join(sorted(known))
                                                                     or "(none)"),
                            pid, hint=f"did you mean '{close[0]}'?" if close else None)
        out.append(known[pid])
    return out

