"""Lockfiles: uv's `pip compile --generate-hashes` output under a header that records what it
was resolved from (an inputs hash) and a hash of its own body, so a stale lock is re-resolved
and a hand-edited or truncated one is refused instead of installed.
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import asdict, dataclass
from pathlib import Path

from packaging.utils import canonicalize_name

from ..catalog.indexes import strip_credentials
from ..errors import LockError
from ..fsutil import atomic_write_text, cannot_write

LOCK_FORMAT = 1

# Packages installed in their own, earlier layer: they are most of an image's bytes and change
# least often, so an engine bump does not re-download torch and the CUDA libraries.
HEAVY_PREFIXES = ("torch", "triton", "nvidia-", "cuda-")
# Where the heavy layer splits when a target asks for it (`split_heavy_layer: true`): NVIDIA's
# CUDA wheels in one layer, torch and Triton in the next.
CUDA_PREFIXES = ("nvidia-", "cuda-")


@dataclass(frozen=True)
class LockRequest:
    """Everything that decides a resolution. Its hash names a lock's inputs."""

    target: str
    python: str  # "3.11"
    uv_platform: str  # "x86_64-manylinux_2_36"
    requirements: tuple[str, ...]
    overrides: tuple[str, ...] = ()
    extra_index_urls: tuple[str, ...] = ()
    build_from_source: bool = False  # sdists allowed (Target.build_from_source)

    def inputs_hash(self) -> str:
        # An index's credentials decide no resolution: a new password keeps the lock.
        doc = asdict(self) | {"format": LOCK_FORMAT, "extra_index_urls": [
            strip_credentials(u) for u in self.extra_index_urls]}
        if not self.build_from_source:
            # Wheels only is what every lock before this field was: they keep their hash.
            del doc["build_from_source"]
        return "sha256:" + hashlib.sha256(json.dumps(doc, sort_keys=True).encode()).hexdigest()

    def filename(self) -> str:
        return f"{self.target}.py{self.python}-{self.uv_platform.split('-', 1)[1]}-" \
               f"{self.uv_platform.split('-', 1)[0]}.txt"


@dataclass(frozen=True)
class LockedPackage:
    name: str  # canonical (PEP 503)
    version: str
    hashes: tuple[str, ...]  # "sha256:..."

    @property
    def heavy(self) -> bool:
        return self.name.startswith(HEAVY_PREFIXES)

    @property
    def layer(self) -> str:
        """heavy-cuda, heavy-torch or rest: the install step (and so the layer) it lands in
        when the heavy layer is split."""
        if not self.heavy:
            return "rest"
        return "heavy-cuda" if self.name.startswith(CUDA_PREFIXES) else "heavy-torch"

    def line(self) -> str:
        return f"{self.name}=={self.version} " + " ".join(f"--hash={h}" for h in self.hashes)


@dataclass(frozen=True)
class Lockfile:
    path: Path
    target: str
    inputs_hash: str
    body_hash: str
    body: str
    packages: tuple[LockedPackage, ...]

    @property
    def digest(self) -> str:
        """What identifies the locked environment: every pin and its hashes, in order. Not
        where the file lies, nor uv's `# via` annotations (which say how, not what)."""
        return pins_digest(self.packages)

    def package(self, name: str) -> LockedPackage | None:
        n = canonicalize_name(name)
        return next((p for p in self.packages if p.name == n), None)

    def requirements_text(self, heavy: bool | None = None, layer: str | None = None) -> str:
        """The lock as a requirements file for `uv pip install --require-hashes --no-deps`:
        all of it, its heavy part or the rest, or one layer's packages."""
        pkgs = [p for p in self.packages if (heavy is None or p.heavy == heavy)
                and (layer is None or p.layer == layer)]
        return "".join(p.line() + "\n" for p in pkgs)


def pins_digest(packages: tuple[LockedPackage, ...]) -> str:
    """sha256 over name==version and hashes, one package a line: the same environment gives the
    same digest whatever the lock's comments say."""
    return "sha256:" + hashlib.sha256(
        "".join(p.line() + "\n" for p in packages).encode()).hexdigest()


# --- parsing -----------------------------------------------------------------------------

_PIN = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)==([^\s\\;]+)")
_HASH = re.compile(r"--hash=(sha256:[0-9a-f]{64})")


def parse_body(body: str, where: str) -> tuple[LockedPackage, ...]:
    """Parse uv's hash-pinned requirements output; refuse anything that is not a pin."""
    pkgs: list[LockedPackage] = []
    joined = re.sub(r"\\\n", " ", body)
    for n, line in enumerate(joined.splitlines(), 1):
        s = line.split(" #", 1)[0].strip()
        if not s or s.startswith("#"):
            continue
        m = _PIN.match(s)
        if not m:
            raise LockError(f"{where}: line {n} is not an exact pin: {s[:80]!r}",
                            hint="locks hold only name==version with hashes; regenerate it "
                                 "with `imgbuild lock`")
        hashes = tuple(_HASH.findall(s))
        if not hashes:
            raise LockError(f"{where}: {m.group(1)}=={m.group(2)} has no --hash",
                            hint="every locked package needs a hash; regenerate the lock")
        pkgs.append(LockedPackage(canonicalize_name(m.group(1)), m.group(2), hashes))
    if not pkgs:
        raise LockError(f"{where}: the lock lists no packages", hint="regenerate it")
    return tuple(pkgs)


def read_lock(path: Path) -> Lockfile:
    """Read and verify a lockfile. A body that does not match its recorded hash is refused."""
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as e:
        raise LockError(f"{path}: cannot read: {e.strerror}") from None
    except UnicodeDecodeError as e:
        raise LockError(f"{path}: not a lockfile (not UTF-8 text, byte {e.start})",
                        hint=f"restore it from version control, or regenerate it with "
                             f"`imgbuild lock {path.name.split('.py')[0]}`") from None
    header: dict[str, str] = {}
    lines = text.splitlines(keepends=True)
    i = 0
    while i < len(lines) and lines[i].startswith("#"):
        m = re.match(r"^# ([a-z-]+): (.*)$", lines[i].rstrip("\n"))
        if m:
            header[m.group(1)] = m.group(2)
        i += 1
    body = "".join(lines[i:])
    for k in ("target", "inputs", "body"):
        if k not in header:
            raise LockError(f"{path}: not an imgbuild lockfile (header '# {k}:' is missing)",
                            hint=f"regenerate it with `imgbuild lock {path.name.split('.py')[0]}`")
    actual = "sha256:" + hashlib.sha256(body.encode()).hexdigest()
    if actual != header["body"]:
        raise LockError(
            f"{path}: the lock was changed after it was generated",
            facts=[f"recorded body hash {header['body']}", f"actual body hash   {actual}"],
            hint=f"do not edit locks by hand: put the change in images/{header['target']}.yaml "
                 f"(requirements or overrides with a reason) and run `imgbuild lock {header['target']}`")
    return Lockfile(path, header["target"], header["inputs"], actual, body,
                    parse_body(body, str(path)))


def write_lock(path: Path, req: LockRequest, body: str, uv_version: str) -> Lockfile:
    """Write atomically: a reader sees the old lock or the new one, never half of one."""
    parse_body(body, str(path))  # never write what we would refuse to read
    body_hash = "sha256:" + hashlib.sha256(body.encode()).hexdigest()
    header = (
        f"# imgbuild lockfile (format {LOCK_FORMAT}): generated, do not edit; "
        f"regenerate with `imgbuild lock {req.target}`\n"
        f"# target: {req.target}\n"
        f"# python: {req.python}\n"
        f"# platform: {req.uv_platform}\n"
        f"# resolver: {uv_version}\n"
        f"# inputs: {req.inputs_hash()}\n"
        f"# body: {body_hash}\n"
    )
    try:
        atomic_write_text(path, header + body)
    except OSError as e:
        raise cannot_write(path, e, "the lock") from None
    return read_lock(path)

