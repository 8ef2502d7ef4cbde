"""The symbol families the drift check compares (images/checks/drift.yaml): which class of which
provider package its consumers refer to, and how a reference is spelled."""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass
from pathlib import Path

from packaging.utils import canonicalize_name

from ..errors import SpecError
from .schema import read_table

# Where the families live, relative to images/. images/*.yaml are all read as targets by
# catalog.load_catalog, so the file sits one level down; images/drift.yaml is read too if a
# later layout puts it there.
FAMILY_FILES = ("checks/drift.yaml", "drift.yaml")
KINDS = ("enum", "class")


# --- the families (data) ---------------------------------------------------------------------

@dataclass(frozen=True)
class SymbolFamily:
    """A class in a provider package whose members consumer packages refer to."""

    name: str
    provider: str  # canonical package name
    modules: tuple[str, ...]  # wheel paths tried first for the class definition
    class_name: str
    kind: str  # "enum" | "class"
    consumers: tuple[str, ...]  # canonical package names
    reference: str  # regex; group 1 is the symbol
    ignore: tuple[str, ...] = ()
    needle: str | None = None  # literal every reference contains: files without it are skipped
    model_quant_method: str | None = None  # model profiles with this method declare values
    model_match: str = "value"
    source: str = ""  # the file it was read from, for messages

    @property
    def regex(self) -> re.Pattern[str]:
        return re.compile(self.reference)  # re caches compiled patterns

    def fingerprint(self) -> str:
        """What decides a scan or a definition; caches are keyed by it."""
        doc = [self.modules, self.class_name, self.kind, self.reference, self.ignore]
        return hashlib.sha256(json.dumps(doc).encode()).hexdigest()[:16]


FAMILY_KEYS = {"name", "provider", "modules", "class", "kind", "consumers", "reference",
               "ignore", "needle", "model"}


def load_families(images: Path) -> tuple[SymbolFamily, ...]:
    """Read and validate the families; errors name the file, the key and what was expected."""
    doc = read_table(images, FAMILY_FILES, "symbol families")
    where = doc.path
    doc.reject_unknown({"families"})
    out: list[SymbolFamily] = []
    for i, raw in enumerate(doc.get("families", list, what="a list of symbol families")):
        d = doc.sub(f"families[{i}]", raw)
        d.reject_unknown(FAMILY_KEYS)
        kind = d.get("kind", str, "enum")
        if kind not in KINDS:
            raise SpecError(where, d.key("kind"), "one of " + ", ".join(KINDS), kind)
        reference = d.get("reference", str, what="a regular expression whose group 1 is the symbol")
        try:
            rx = re.compile(reference)
        except re.error as e:
            raise SpecError(where, d.key("reference"), "a valid regular expression",
                            f"{reference!r} ({e})") from None
        if rx.groups < 1:
            raise SpecError(where, d.key("reference"), "a regular expression with a group for "
                            "the symbol, e.g. '\\bName\\.(\\w+)'", reference)
        cls = d.get("class", str)
        model = d.get("model", dict, {})
        md = d.sub("model", model)
        md.reject_unknown({"quant_method", "match"})
        match = md.get("match", str, "value")
        if match != "value":
            raise SpecError(where, md.key("match"), "'value' (models declare enum values)", match)
        # The class name makes a good prefilter when every reference spells it out.
        needle = d.get("needle", str, cls if cls in reference else None)
        out.append(SymbolFamily(
            name=d.get("name", str), provider=canonicalize_name(d.get("provider", str)),
            modules=d.str_list("modules"), class_name=cls, kind=kind,
            consumers=tuple(canonicalize_name(c) for c in d.str_list("consumers", default=...)),
            reference=reference, ignore=d.str_list("ignore"), needle=needle,
            model_quant_method=md.get("quant_method", str, None), model_match=match,
            source=where))
    return tuple(out)
