"""Hash-pinned lockfiles, resolved by uv for the image's platform (not the host's).

A lockfile is uv's `pip compile --generate-hashes` output under a header that records what it
was resolved from (an inputs hash) and a hash of its own body, so a stale lock is re-resolved
and a hand-edited or truncated one is refused instead of installed.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess
import tempfile
import threading
from dataclasses import asdict, dataclass
from functools import cache
from pathlib import Path

from packaging.utils import canonicalize_name

from .errors import EnvError, LockError, ResolveError
from .fsutil import atomic_write_text

LOCK_FORMAT = 1

# Packages installed in their own, earlier layer: they are most of an image's bytes and change
# least often, so an engine bump does not re-download torch and the CUDA libraries.
HEAVY_PREFIXES = ("torch", "triton", "nvidia-", "cuda-")


@dataclass(frozen=True)
class LockRequest:
    """Everything that decides a resolution. Its hash names a lock's inputs."""

    target: str
    python: str  # "3.11"
    uv_platform: str  # "x86_64-manylinux_2_36"
    requirements: tuple[str, ...]
    overrides: tuple[str, ...] = ()
    extra_index_urls: tuple[str, ...] = ()

    def inputs_hash(self) -> str:
        doc = asdict(self) | {"format": LOCK_FORMAT}
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
        """What identifies the locked environment: the body, not where the file lies."""
        return self.body_hash

    def package(self, name: str) -> LockedPackage | None:
        n = canonicalize_name(name)
        return next((p for p in self.packages if p.name == n), None)

    def requirements_text(self, heavy: bool | None = None) -> str:
        """The lock as a requirements file for `uv pip install --require-hashes --no-deps`."""
        pkgs = [p for p in self.packages if heavy is None or p.heavy == heavy]
        return "".join(p.line() + "\n" for p in pkgs)


_UV_LOCK = threading.Lock()


def uv_bin() -> str:
    """The uv binary (not a pyenv shim: we copy it into build contexts)."""
    # sysconfig's first use (inside uv.find_uv_bin) is not thread-safe; locks resolve in threads.
    with _UV_LOCK:
        return _uv_bin()


@cache
def _uv_bin() -> str:
    try:
        import uv  # the PyPI package ships the binary

        path = uv.find_uv_bin()
        if path:
            return path
    except (ImportError, FileNotFoundError):
        pass
    found = shutil.which("uv")
    if not found:
        raise EnvError("uv is not installed", hint="install it: `pip install uv` (or `make setup`)")
    return found


def uv_env() -> dict[str, str]:
    env = dict(os.environ)
    # Managed Python downloads are unreachable here and cost ~10 s each; the target's
    # interpreter is named with --python-version and never needs to exist on the host.
    env.setdefault("UV_PYTHON_DOWNLOADS", "never")
    return env


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
        text = path.read_text()
    except OSError as e:
        raise LockError(f"{path}: cannot read: {e.strerror}") from None
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
    atomic_write_text(path, header + body)
    return read_lock(path)


# --- resolving ---------------------------------------------------------------------------

def uv_version() -> str:
    out = subprocess.run([uv_bin(), "--version"], capture_output=True, text=True, env=uv_env())
    return out.stdout.strip() or "uv (unknown version)"


def index_args(req: LockRequest, wheels: Path | None) -> list[str]:
    """Index flags shared by resolve and install, so both see the same candidates."""
    args: list[str] = []
    if wheels is not None:
        args += ["--find-links", str(wheels)]
    for url in req.extra_index_urls:
        if wheels is None:
            args += ["--extra-index-url", url]
    if req.extra_index_urls:
        # With several indexes, take the best version from any of them (the CPU torch index
        # mirrors numpy & co.); first-match would make the lock depend on which index is up.
        args += ["--index-strategy", "unsafe-best-match"]
    return args


def resolve(req: LockRequest, wheels: Path | None = None, *, prefer: str | None = None,
            upgrade: tuple[str, ...] = (), constraints: tuple[str, ...] = (),
            index_urls: tuple[str, ...] | None = None) -> str:
    """Run uv for the target platform; return the hash-pinned body or raise ResolveError.

    prefer: a lock body whose versions uv keeps where they still satisfy the inputs (all but
    the `upgrade` packages); index_urls: replace the default index (first) and add others.
    """
    with tempfile.TemporaryDirectory(prefix="imgbuild-lock-") as td:
        reqs = Path(td) / "requirements.in"
        reqs.write_text("\n".join(req.requirements) + "\n")
        out = Path(td) / "out.txt"
        if prefer:
            out.write_text(prefer)
        cmd = [uv_bin(), "pip", "compile", str(reqs), "--generate-hashes", "--no-header",
               "--python-version", req.python, "--python-platform", req.uv_platform,
               "--no-progress", "--quiet", "-o", str(out)]
        if req.overrides:
            ov = Path(td) / "overrides.txt"
            ov.write_text("\n".join(req.overrides) + "\n")
            cmd += ["--overrides", str(ov)]
        if constraints:
            c = Path(td) / "constraints.txt"
            c.write_text("\n".join(constraints) + "\n")
            cmd += ["-c", str(c)]
        for p in upgrade:
            # --refresh-package: the index page of what we ask about is read again, so a
            # release the JSON API shows is one uv sees too.
            cmd += ["--upgrade-package", p, "--refresh-package", p]
        if index_urls:
            cmd += ["--default-index", index_urls[0]]
            for u in index_urls[1:]:
                cmd += ["--extra-index-url", u]
        cmd += index_args(req, wheels)
        proc = subprocess.run(cmd, capture_output=True, text=True, env=uv_env())
        if proc.returncode != 0:
            raise ResolveError(
                f"no environment satisfies target '{req.target}' on "
                f"Python {req.python}, {req.uv_platform}",
                facts=[ln for ln in proc.stderr.strip().splitlines() if ln.strip()][-25:],
                hint="relax a requirement, or add an override with a reason to "
                     f"images/{req.target}.yaml")
        body = out.read_text()
    # uv annotates with the temp files' paths; keep the annotations, drop the random directory
    # so that the same inputs give the same bytes.
    return body.replace(td + "/", "")


def ensure_lock(req: LockRequest, lock_dir: Path, wheels: Path | None = None, *,
                refresh: bool = False) -> tuple[Lockfile, bool]:
    """The lock for `req`: reused when its inputs match, else resolved and written.

    Returns (lockfile, written).
    """
    path = lock_dir / req.filename()
    if path.exists() and not refresh:
        lock = read_lock(path)  # a corrupted lock is an error, not silently replaced
        if lock.inputs_hash == req.inputs_hash():
            return lock, False
    body = resolve_explained(req, wheels)
    return write_lock(path, req, body, uv_version()), True


@dataclass(frozen=True)
class OverrideStatus:
    requirement: str
    needed: bool
    effect: str  # what dropping it would do, in words


def check_overrides(req: LockRequest, wheels: Path | None, locked: Lockfile) -> list[OverrideStatus]:
    """Resolve without each override in turn: one that changes nothing is removable."""
    from concurrent.futures import ThreadPoolExecutor

    def one(ov: str) -> OverrideStatus:
        without = LockRequest(req.target, req.python, req.uv_platform, req.requirements,
                              tuple(o for o in req.overrides if o != ov), req.extra_index_urls)
        try:
            body = resolve(without, wheels)
        except ResolveError as e:
            from .conflicts import parse_constraints

            name = canonicalize_name(re.split(r"[<>=!~;\[ ]", ov, maxsplit=1)[0])
            who = [f"{c.source} requires {c.package}{c.spec}"
                   for c in parse_constraints("\n".join(e.facts)) if c.package == name]
            return OverrideStatus(ov, True, "without it there is no resolution" +
                                  (f" ({'; '.join(who)})" if who else ""))
        pins = {p.name: p.version for p in parse_body(body, "resolution without " + ov)}
        have = {p.name: p.version for p in locked.packages}
        changed = sorted(n for n in set(pins) | set(have) if pins.get(n) != have.get(n))
        if not changed:
            return OverrideStatus(ov, False, "the resolution is the same without it: removable")
        shown = ", ".join(f"{n} {have.get(n, '-')} → {pins.get(n, '-')}" for n in changed[:4])
        return OverrideStatus(ov, True, f"without it: {shown}" +
                              (f" (+{len(changed) - 4} more)" if len(changed) > 4 else ""))

    with ThreadPoolExecutor(max_workers=4) as pool:
        return list(pool.map(one, req.overrides))


def lock_many(reqs: list[LockRequest], lock_dir: Path, wheels: Path | None = None, *,
              refresh: bool = False, jobs: int = 4) -> list[tuple[Lockfile | None, bool, Exception | None]]:
    """ensure_lock for independent targets in parallel (uv spends most of its time waiting on
    the network). Results come back in order; one target's failure does not stop the others."""
    from concurrent.futures import ThreadPoolExecutor

    def one(r: LockRequest):
        try:
            lock, written = ensure_lock(r, lock_dir, wheels, refresh=refresh)
            return lock, written, None
        except (ResolveError, LockError) as e:
            return None, False, e

    with ThreadPoolExecutor(max_workers=max(1, jobs)) as pool:
        return list(pool.map(one, reqs))


def resolve_explained(req: LockRequest, wheels: Path | None = None) -> str:
    """resolve(), and when it fails: every conflict at once, with overrides proven to resolve."""
    from . import conflicts

    try:
        return resolve(req, wheels)
    except ResolveError as first:
        uv_chain = first.facts
        sentence = conflicts.platform_sentence("\n".join(uv_chain), req.uv_platform)
        if sentence:
            raise ResolveError(sentence, facts=uv_chain,
                               hint="use a base image with a newer glibc (see images/bases.yaml), "
                                    "or pin an engine version that ships wheels for this "
                                    "platform") from None
        found, ok, _ = conflicts.reconcile(req, lambda r: resolve(r, wheels))
        if not found:
            raise
        facts = uv_chain + ["who asks for what:"] + [ln for c in found for ln in c.lines()]
        if ok:
            hint = (f"these overrides resolve it (checked with uv); add them to "
                    f"images/{req.target}.yaml, each with the reason it is safe:\n"
                    + conflicts.override_yaml(found))
        else:
            hint = ("no set of overrides found resolves it; relax a requirement in "
                    f"images/{req.target}.yaml")
        raise ResolveError(first.message, facts=facts, hint=hint) from None
