"""How imgbuild pushes to each registry (images/registries.yaml): the layer compression its
pulling clients can read. Compression is a property of where an image goes, not of what it is:
it never enters the content key (the tag is the same either way; the digest is not).

    default: {compression: gzip}
    registries:
      - match: ghcr.io/acme/serving     # a repository, or a prefix of one (host, host/path)
        compression: zstd
        reason: pulled only by our Kubernetes nodes (containerd 1.7)

The longest `match` that is the repository or a path prefix of it wins; a project's entries
come before the built-in ones, so a project can say how its own registries are written."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from ..errors import SpecError
from .schema import Doc, read_yaml

REGISTRIES_FILE = "registries.yaml"
COMPRESSIONS = ("gzip", "zstd")
REGISTRIES_KEYS = {"default", "registries"}
DEFAULT_KEYS = {"compression", "reason"}
RULE_KEYS = {"match", "compression", "reason"}


@dataclass(frozen=True)
class RegistryRule:
    match: str
    compression: str
    reason: str
    where: str  # the file it came from


@dataclass(frozen=True)
class RegistryTable:
    default: RegistryRule
    rules: tuple[RegistryRule, ...] = ()

    def rule_for(self, repository: str) -> RegistryRule:
        """The rule for a repository name (HOST[:PORT]/PATH): the longest matching prefix."""
        hits = [r for r in self.rules
                if repository == r.match or repository.startswith(r.match.rstrip("/") + "/")]
        return max(hits, key=lambda r: len(r.match), default=self.default)


def _compression(doc: Doc, key: str = "compression") -> str:
    value = doc.get(key, str)
    if value not in COMPRESSIONS:
        raise SpecError(doc.path, doc.key(key), "one of: " + ", ".join(COMPRESSIONS), value)
    return value


def load_registries(images_dirs: Sequence[Path]) -> RegistryTable:
    """The table from each layer's images/ (lowest first); a higher layer's default wins, and
    its rules come first."""
    default = RegistryRule("", "gzip", "every client reads gzip", "(built in)")
    rules: list[RegistryRule] = []
    for images in images_dirs:
        path = Path(images) / REGISTRIES_FILE
        if not path.is_file():
            continue
        doc = Doc(str(path), read_yaml(path, Path(images)) or {})
        doc.reject_unknown(REGISTRIES_KEYS)
        if "default" in doc.data:
            d = doc.sub("default", doc.get("default", dict))
            d.reject_unknown(DEFAULT_KEYS)
            default = RegistryRule("", _compression(d), d.get("reason", str, ""), str(path))
        layer: list[RegistryRule] = []
        for i, item in enumerate(doc.get("registries", list, [])):
            e = doc.sub(f"registries[{i}]", item)
            e.reject_unknown(RULE_KEYS)
            match = e.get("match", str).strip().rstrip("/")
            if not match:
                raise SpecError(doc.path, e.key("match"), "a registry host or repository", match)
            layer.append(RegistryRule(match, _compression(e), e.get("reason", str, ""),
                                      str(path)))
        rules = layer + rules
    return RegistryTable(default, tuple(rules))
