"""How imgbuild pushes to each registry (images/registries.yaml): the layer compression its
pulling clients can read. Compression is a property of where an image goes, not of what it is:
it never enters the content key (the tag is the same either way; the digest is not).

    default: {compression: gzip}
    registries:
      - match: ghcr.io/acme/serving     # a repository, or a prefix of one (host, host/path)
        compression: zstd
        reason: pulled only by our Kubernetes nodes (containerd 1.7)

The longest `match` that is the repository or a path prefix of it wins; a project's entries
come before the built-in ones, so a project can say how its own registries are written.

A rule may also say whose signature an image there must carry (`signed-by`), which `verify`
checks and `pull` and `run` enforce before any layer is downloaded (image/cosign.py):

      - match: 127.0.0.1:5000/acme
        signed-by:
          key: keys/cosign.pub          # a public key: a path (from this file's directory) or PEM
          attestations: [cyclonedx, slsaprovenance1]   # signed attestations required (default)
      - match: ghcr.io/acme
        signed-by:
          keyless: {issuer: https://token.actions.githubusercontent.com,
                    subject: https://github.com/acme/serving/.github/workflows/ci.yml@refs/heads/main,
                    trust-root: /etc/imgbuild/trusted_root.json}  # Sigstore's
          # tlog: false    a signature with no Rekor entry (cosign --insecure-ignore-tlog)
          # sct: false     a certificate with no SCT (cosign --insecure-ignore-sct)

A rule with `signed-by` alone keeps the compression of the rule below it (or the default); the
policy is the longest matching rule's that has one."""

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
RULE_KEYS = {"match", "compression", "reason", "signed-by"}


# The attestations a policy may require, by cosign's names for them (`verify-attestation
# --type`), and the in-toto predicate type each names.
ATTESTATION_TYPES = {"cyclonedx": "https://cyclonedx.org/bom",
                     "slsaprovenance1": "https://slsa.dev/provenance/v1"}


# The `where` of a SignPolicy that stands for a signing key itself (`imgbuild index --sign-key`
# asks each platform image for that key's signature where no policy is set).
SIGNING_KEY = "--sign-key"


@dataclass(frozen=True)
class SignPolicy:
    """Whose signature an image in a registry must carry: a public key, or (keyless) a
    certificate identity with its trust root; and which signed attestations it must have."""

    where: str  # the file it came from
    key: str | None = None  # a path (absolute, or from `where`'s directory) or a PEM
    issuer: str | None = None  # keyless: the OIDC issuer
    subject: str | None = None  # keyless: the certificate's identity
    trust_root: str | None = None  # keyless: the trusted root (for air-gapped hosts), a path
    tlog: bool = True  # keyless: a Rekor bundle required (false: --insecure-ignore-tlog)
    sct: bool = True  # keyless: an SCT in the certificate is required (--insecure-ignore-sct)
    attestations: tuple[str, ...] = tuple(ATTESTATION_TYPES)

    @property
    def keyless(self) -> bool:
        return self.key is None


@dataclass(frozen=True)
class RegistryRule:
    match: str
    compression: str  # "": the rule says nothing of compression (a `signed-by` rule)
    reason: str
    where: str  # the file it came from
    signed_by: SignPolicy | None = None


@dataclass(frozen=True)
class RegistryTable:
    default: RegistryRule
    rules: tuple[RegistryRule, ...] = ()

    def rule_for(self, repository: str) -> RegistryRule:
        """The rule for a repository name (HOST[:PORT]/PATH): the longest matching prefix."""
        hits = [r for r in self._hits(repository) if r.compression]
        return max(hits, key=lambda r: len(r.match), default=self.default)

    def policy_for(self, repository: str) -> SignPolicy | None:
        """The signature policy for a repository: the longest matching rule that has one;
        None where none has (images there are not checked for signatures)."""
        hits = [r for r in self._hits(repository) if r.signed_by is not None]
        rule = max(hits, key=lambda r: len(r.match), default=None)
        return rule.signed_by if rule is not None else None

    def _hits(self, repository: str) -> list[RegistryRule]:
        return [r for r in self.rules
                if repository == r.match or repository.startswith(r.match.rstrip("/") + "/")]


def _policy(doc: Doc) -> SignPolicy:
    """A `signed-by` mapping: exactly one of `key` and `keyless`."""
    doc.reject_unknown({"key", "keyless", "attestations"})
    atts = doc.get("attestations", list, list(ATTESTATION_TYPES))
    for a in atts:
        if not isinstance(a, str) or a not in ATTESTATION_TYPES:
            raise SpecError(doc.path, doc.key("attestations"),
                            "a list of: " + ", ".join(ATTESTATION_TYPES), a)
    if ("key" in doc.data) == ("keyless" in doc.data):
        raise SpecError(doc.path, doc.prefix or "signed-by",
                        "exactly one of `key` (a public key: path or PEM) and `keyless` "
                        "(issuer, subject, trust-root)")
    if "key" in doc.data:
        key = doc.get("key", str).strip()
        if not key:
            raise SpecError(doc.path, doc.key("key"), "a public key's path or PEM", key)
        return SignPolicy(doc.path, key=key, attestations=tuple(atts))
    k = doc.sub("keyless", doc.get("keyless", dict))
    k.reject_unknown({"issuer", "subject", "trust-root", "tlog", "sct"})
    return SignPolicy(doc.path, issuer=k.get("issuer", str), subject=k.get("subject", str),
                      trust_root=k.get("trust-root", str, None), tlog=k.get("tlog", bool, True),
                      sct=k.get("sct", bool, True), attestations=tuple(atts))


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
            policy = _policy(e.sub("signed-by", e.get("signed-by", dict))) \
                if "signed-by" in e.data else None
            comp = _compression(e) if "compression" in e.data or policy is None else ""
            layer.append(RegistryRule(match, comp, e.get("reason", str, ""), str(path), policy))
        rules = layer + rules
    return RegistryTable(default, tuple(rules))
