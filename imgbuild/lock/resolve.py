"""Resolving with uv for the image's platform (not the host's): one lock, many in parallel,
the overrides a lock still needs, and every conflict explained at once."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, replace
from pathlib import Path

from packaging.utils import canonicalize_name

from ..catalog.indexes import strip_credentials
from ..errors import EnvError, ImgbuildError, ResolveError
from . import checkcache, conflicts
from .lockfile import Lockfile, LockRequest, parse_body, read_lock, write_lock
from .uv import index_args, uv_bin, uv_env, uv_version
from .wheels import index_urls, mirror_index

# uv's words when a request never got an answer (DNS, refused, timed out, TLS) or the index
# answered with an error: the machine's network or the index's address, not the requirements.
_UNREACHABLE = re.compile(
    r"Failed to fetch|error sending request|dns error|failed to lookup address|"
    r"tcp connect error|Connection refused|operation timed out|Request failed after \d+ retr|"
    r"invalid peer certificate|certificate verify failed")


def resolve(req: LockRequest, wheels: Path | None = None, *, prefer: str | None = None,
            upgrade: tuple[str, ...] = (), constraints: tuple[str, ...] = (),
            index_urls: tuple[str, ...] | None = None) -> str:
    """Run uv for the target platform; return the hash-pinned body or raise ResolveError.

    prefer: a lock body whose versions uv keeps where they still satisfy the inputs (all but
    the `upgrade` packages); index_urls: replace the default index (first) and add others.
    """
    # uv runs in the scratch directory and is given its files by relative name: the lock's
    # `# via -r requirements.in` annotations then read the same from any working directory.
    with tempfile.TemporaryDirectory(prefix="imgbuild-lock-") as td:
        (Path(td) / "requirements.in").write_text("\n".join(req.requirements) + "\n")
        out = Path(td) / "out.txt"
        if prefer:
            out.write_text(prefer)
        cmd = [uv_bin(), "pip", "compile", "requirements.in", "--generate-hashes", "--no-header",
               "--python-version", req.python, "--python-platform", req.uv_platform,
               "--no-progress", "--quiet", "-o", "out.txt"]
        if not req.build_from_source:
            # Wheels only: an sdist would be compiled inside the build, where the slim flavor
            # has no compiler and NVIDIA's wheel stubs fetch from pypi.nvidia.com. Better uv's
            # "has no usable wheels" here than a failed install step there.
            cmd.append("--no-build")
            # The interpreter named, not searched for: with nothing to build, uv reads no more
            # from it than the target's --python-version and --python-platform give, and its
            # search (every python3.x on PATH, pyenv's shims among them) cost 0.1-0.3 s a
            # resolution here: 5% of a lock (bench/lock_bench.py). The pins are the same.
            cmd += ["--python", sys.executable]
        if req.overrides:
            (Path(td) / "overrides.txt").write_text("\n".join(req.overrides) + "\n")
            cmd += ["--overrides", "overrides.txt"]
        if constraints:
            (Path(td) / "constraints.txt").write_text("\n".join(constraints) + "\n")
            cmd += ["-c", "constraints.txt"]
        for p in upgrade:
            # --refresh-package: the index page of what we ask about is read again, so a
            # release the JSON API shows is one uv sees too.
            cmd += ["--upgrade-package", p, "--refresh-package", p]
        if index_urls:
            cmd += ["--default-index", index_urls[0]]
            for u in index_urls[1:]:
                cmd += ["--extra-index-url", u]
        # The host's mirror is the default index unless the caller named one above.
        cmd += index_args(req, wheels, mirror=not index_urls)
        proc = subprocess.run(cmd, capture_output=True, text=True, env=uv_env(), cwd=td)
        if proc.returncode != 0 and _UNREACHABLE.search(proc.stderr):
            # Not a verdict on the requirements: uv never saw the index's answer.
            raise EnvError(
                f"cannot reach the package index to lock target '{req.target}'",
                facts=[ln for ln in proc.stderr.strip().splitlines() if ln.strip()][-12:],
                hint="check the network, the proxy (HTTPS_PROXY) and the index (UV_DEFAULT_INDEX "
                     "for a mirror, SSL_CERT_FILE for its CA); offline, pass --wheels DIR with "
                     "the wheels the target needs")
        if proc.returncode != 0:
            no_wheel = "has no usable wheels" in proc.stderr and not req.build_from_source
            raise ResolveError(
                f"no environment satisfies target '{req.target}' on "
                f"Python {req.python}, {req.uv_platform}",
                facts=[ln for ln in proc.stderr.strip().splitlines() if ln.strip()][-25:],
                hint=("pin a release that has a wheel for this platform (an override with a "
                      f"reason in images/{req.target}.yaml), or allow compiling sdists in the "
                      "build: `build_from_source: true`" if no_wheel else
                      "relax a requirement, or add an override with a reason to "
                      f"images/{req.target}.yaml"))
        return out.read_text()


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
    # uv's version (for the lock's header) is asked beside the resolution, not after it.
    with ThreadPoolExecutor(max_workers=1) as pool:
        version = pool.submit(uv_version)
        body = resolve_explained(req, wheels)
        return write_lock(path, req, body, version.result()), True


@dataclass(frozen=True)
class OverrideStatus:
    requirement: str
    needed: bool
    effect: str  # what dropping it would do, in words


def check_workers(n: int) -> int:
    """Checks at once: each is a uv process that is busy on the network and on a core, and
    this is a step inside `imgbuild lock`, which may itself lock several targets at once."""
    return max(1, min(n, os.cpu_count() or 2, 4))


def check_overrides(req: LockRequest, wheels: Path | None, locked: Lockfile, *,
                    jobs: int | None = None, use_cache: bool = True) -> list[OverrideStatus]:
    """Resolve without each override in turn: one that changes nothing is removable.

    First the static proof (static_proofs): an override some locked package's own metadata
    shows the lock needs is answered without uv. The rest are independent uv checks: they run
    side by side (`jobs`, default check_workers), and the statuses come back in the request's
    order of overrides whatever finishes first. Each answer is kept in the check cache
    (checkcache) by the digest of its inputs, so the same request, environment and lock answer
    again without uv or the index."""
    if not req.overrides:
        return []
    env = uv_env()
    common = {  # what every check of this request shares: read once, not once per check
        "uv_version": uv_version(), "uv_settings": checkcache.uv_settings(env),
        "wheels": checkcache.wheels_signature(wheels),
        "default_index": checkcache.clean_url(mirror_index()),
        "locked_pins": locked.digest}

    def without(ov: str) -> LockRequest:
        # Everything of the request but the one override (build_from_source included: a check
        # that refused sdists the target allows would call an override needed that is not).
        return replace(req, overrides=tuple(o for o in req.overrides if o != ov))

    def key(ov: str) -> str:
        w = without(ov)
        return checkcache.check_key(checkcache.CheckInputs(
            dropped=ov, python=w.python, uv_platform=w.uv_platform,
            requirements=w.requirements, overrides=w.overrides,
            extra_index_urls=tuple(strip_credentials(u) for u in w.extra_index_urls),
            build_from_source=w.build_from_source, **common))

    keys = {ov: key(ov) for ov in req.overrides}
    answers: dict[str, OverrideStatus] = {}
    if use_cache:
        for ov in req.overrides:
            if (hit := checkcache.load(keys[ov], ov)) is not None:
                answers[ov] = OverrideStatus(**hit)
    for ov, effect in static_proofs(
            req, tuple(ov for ov in req.overrides if ov not in answers), wheels, locked).items():
        # Kept like uv's answers: the key holds every input the proof read (the lock's pins
        # with the hashes that name the wheels whose metadata it read, the request, the
        # indexes, the --find-links files), so it stays true exactly as long as they do.
        answers[ov] = OverrideStatus(ov, True, effect)
        checkcache.store(keys[ov], asdict(answers[ov]))

    def one(ov: str) -> OverrideStatus:
        status = _check_one(without(ov), ov, wheels, locked)
        # Only verdicts are kept: a network failure raises EnvError above and is never stored.
        checkcache.store(keys[ov], asdict(status))
        return status

    rest = [ov for ov in req.overrides if ov not in answers]
    if rest:
        with ThreadPoolExecutor(max_workers=jobs or check_workers(len(rest))) as pool:
            answers.update(zip(rest, pool.map(one, rest)))
    return [answers[ov] for ov in req.overrides]  # the request's order


def static_proofs(req: LockRequest, overrides: tuple[str, ...], wheels: Path | None,
                  locked: Lockfile) -> dict[str, str]:
    """The overrides the lock surely needs by its packages' own metadata, each with its effect
    in words (staticproof); the others are uv's to answer. Reads the metadata of a few locked
    packages per override, all side by side, from the indexes uv is given for this request."""
    if not overrides:
        return {}
    from . import staticproof  # zip records and metadata parsing: only where a lock is checked

    packages = {p.name: p for p in locked.packages}
    via = staticproof.requirers(locked.body)
    pending = {}
    for ov in overrides:
        name = staticproof.override_name(ov)
        if name is not None and name in packages:
            pending[ov] = tuple(r for r in via.get(name, ()) if r in packages)
    to_read = staticproof.requirers_to_read(pending)
    # The indexes uv resolves from (index_args): with --find-links, the default index only.
    urls = index_urls(() if wheels is not None else req.extra_index_urls)
    metadata = staticproof.read_metadata(
        (packages[r] for names in to_read.values() for r in names), python=req.python,
        uv_platform=req.uv_platform, index_urls=urls, wheels=wheels)
    env = staticproof.marker_environment(req.python, req.uv_platform)
    out = {}
    for ov, names in to_read.items():
        kept = tuple(o for o in req.overrides if o != ov)
        if (effect := staticproof.prove(ov, kept, packages, names, metadata, env)) is not None:
            out[ov] = effect
    return out


def _check_one(without: LockRequest, ov: str, wheels: Path | None,
               locked: Lockfile) -> OverrideStatus:
    """uv's answer for the request without `ov`, compared with the lock, in words."""
    try:
        body = resolve(without, wheels)
    except ResolveError as e:
        name = canonicalize_name(re.split(r"[<>=!~;\[ ]", ov, maxsplit=1)[0])
        who = [f"{c.source} requires {c.package}{c.spec}"
               for c in conflicts.parse_constraints("\n".join(e.facts)) if c.package == name]
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


def lock_many(reqs: list[LockRequest], lock_dir: Path, wheels: Path | None = None, *,
              refresh: bool = False, jobs: int = 4,
              note: Callable[[str], None] = lambda _m: None,
              ) -> list[tuple[Lockfile | None, bool, Exception | None]]:
    """ensure_lock for independent targets in parallel (uv spends most of its time waiting on
    the network). Results come back in order; one target's failure does not stop the others.
    `note` hears when each starts resolving and how long it took (several run at once)."""
    def one(r: LockRequest):
        where = f"{r.target} ({r.uv_platform})"
        start = time.monotonic()
        try:
            if refresh or not (lock_dir / r.filename()).exists():
                note(f"locking {where} with uv ...")
            lock, written = ensure_lock(r, lock_dir, wheels, refresh=refresh)
            if written:
                note(f"locked {where}: {len(lock.packages)} packages in "
                     f"{time.monotonic() - start:.1f} s")
            return lock, written, None
        except ImgbuildError as e:  # a resolution, a lock, the network or the disk
            return None, False, e

    with ThreadPoolExecutor(max_workers=max(1, jobs)) as pool:
        return list(pool.map(one, reqs))


def resolve_explained(req: LockRequest, wheels: Path | None = None) -> str:
    """resolve(), and when it fails: every conflict at once, with overrides proven to resolve."""
    try:
        return resolve(req, wheels)
    except ResolveError as first:
        uv_chain = first.facts
        sentence = conflicts.platform_sentence("\n".join(uv_chain), req.uv_platform)
        if sentence:
            cpu = req.uv_platform.split("-", 1)[0]
            if conflicts.ships_cpu("\n".join(uv_chain), cpu) is False:
                hint = (f"it ships no {cpu} wheel at all: drop that platform from the target's "
                        f"`platforms:`, or pin a version that ships {cpu} wheels")
            else:
                hint = ("use a base image with a newer glibc (see images/bases.yaml), or pin an "
                        "engine version that ships wheels for this platform")
            raise ResolveError(sentence, facts=uv_chain, hint=hint) from None
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

