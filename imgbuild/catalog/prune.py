"""images/prune.yaml: the dead weight a flavor's images drop, by rule."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from ..errors import SpecError
from .schema import Doc

FLAVORS = ("devel", "cuda-devel", "slim")
PRUNE_KEYS = {"rules"}
RULE_KEYS = {"name", "path", "dirs", "files", "flavors", "why", "package"}
_SAFE = re.compile(r"^[A-Za-z0-9_.*/-]+$")  # what reaches a find(1) command line


@dataclass(frozen=True)
class PruneRule:
    name: str
    kind: str  # path | dirs | files
    pattern: str
    flavors: tuple[str, ...]
    why: str
    # A GPU library of this package (its `path`): removed only where the lock's kernel record
    # says none of the target's archs runs any of its code (no SASS, no PTX it can JIT).
    package: str | None = None


def parse_prune(data: Any, path: str) -> tuple[PruneRule, ...]:
    doc = Doc(path, data)
    doc.reject_unknown(PRUNE_KEYS)
    out = []
    for i, r in enumerate(doc.get("rules", list, [])):
        rd = doc.sub(f"rules[{i}]", r)
        rd.reject_unknown(RULE_KEYS)
        given = [k for k in ("path", "dirs", "files") if k in r]
        if len(given) != 1:
            raise SpecError(path, rd.key("path"), "exactly one of path, dirs, files",
                            ", ".join(given) or "none")
        pattern = rd.get(given[0], str)
        if not _SAFE.match(pattern) or ".." in pattern.split("/") or pattern.startswith("/"):
            raise SpecError(path, rd.key(given[0]), "a relative name or glob of letters, digits, "
                            "_ . * / - (no .., not absolute)", pattern)
        flavors = rd.str_list("flavors", default=...)
        for j, f in enumerate(flavors):
            if f not in FLAVORS:
                raise SpecError(path, rd.key(f"flavors[{j}]"), "one of " + ", ".join(FLAVORS), f)
        why = rd.get("why", str, what="why nothing in the image reads these files")
        package = rd.get("package", str, None)
        if package is not None and given[0] != "path":
            raise SpecError(path, rd.key("package"), "a rule with `path:` (the one library of "
                            "the package whose kernels it judges)", given[0])
        out.append(PruneRule(rd.get("name", str), given[0], pattern, flavors, why.strip(),
                             package))
    return tuple(out)
