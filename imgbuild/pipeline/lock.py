"""`imgbuild lock TARGET… / --all [--check]`: lock targets in parallel, or check their locks
for staleness, and say which overrides each lock still needs."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace

from ..errors import ImgbuildError, InputError
from ..fsutil import check_writable
from ..lock import kernels
from ..lock.freshness import freshness
from ..lock.resolve import check_overrides, lock_many
from ..plan import coverage
from ..progress import SILENT, Progress
from ..workspace import TargetRef, Workspace


@dataclass(frozen=True)
class LockEntry:
    target: str
    lock: str  # path
    written: bool | None = None  # lock: whether the file was (re)written
    packages: int | None = None
    hash: str | None = None
    stale: bool | None = None  # --check
    diff: tuple[str, ...] = ()
    overrides: tuple[dict, ...] = ()
    error: ImgbuildError | None = field(default=None, compare=False)

    def to_dict(self) -> dict:
        d: dict = {"target": self.target, "lock": self.lock}
        if self.error is not None:
            return d | {"error": self.error.message}
        if self.stale is not None:
            d |= {"stale": self.stale, "diff": list(self.diff)}
        else:
            d |= {"written": self.written, "packages": self.packages, "hash": self.hash}
        if self.overrides:
            d["overrides"] = list(self.overrides)
        return d


@dataclass(frozen=True)
class LockReport:
    check: bool
    entries: tuple[LockEntry, ...]

    @property
    def failed(self) -> list[ImgbuildError]:
        return [e.error for e in self.entries if e.error is not None]

    @property
    def stale(self) -> list[str]:
        return [e.target for e in self.entries if e.stale]

    @property
    def exit_code(self) -> int:
        if self.failed:
            return max(e.exit_code for e in self.failed)
        return 1 if self.stale else 0

    def to_dict(self) -> dict:
        return {"locks": [e.to_dict() for e in self.entries], "stale": self.stale,
                "failed": [e.target for e in self.entries if e.error is not None]}


def lock_targets(ws: Workspace, names: list[str], *, check: bool = False,
                 refresh: bool = False, jobs: int = 4, progress: Progress = SILENT) -> LockReport:
    if not names:
        raise InputError("name a target or pass --all", hint="see `imgbuild list`")
    refs = [r for n in names for r in ws.platform_refs(n)]  # one lock per platform
    entries: list[LockEntry] = []
    if check:
        def one(ref: TargetRef) -> LockEntry:
            try:
                f = freshness(ref.request, ref.lock_path, ws.wheels)
                kdiff = () if f.stale else _kernel_record_diff(ws, ref)
                return LockEntry(ref.name, str(ref.lock_path), stale=f.stale or bool(kdiff),
                                 diff=tuple(f.diff) + kdiff)
            except ImgbuildError as e:
                return LockEntry(ref.name, str(ref.lock_path), error=e)

        with ThreadPoolExecutor(max_workers=max(1, jobs)) as pool:
            entries = list(pool.map(one, refs))
    else:
        # A directory that cannot take the lock is said now, not after minutes of resolving.
        check_writable(ws.lock_dir(), "lockfiles to")
        # A built-in target's lock goes into the project first: locking starts from it.
        for copied in ws.adopt_builtin_locks(refs):
            progress.note(f"copied the built-in lock into the project: {copied}")
        refs = [ws.target(r.name, r.target.platforms[0]) for r in refs]
        for ref, (lock, written, err) in zip(refs, lock_many(
                [r.request for r in refs], ws.lockfiles, ws.wheels, refresh=refresh, jobs=jobs,
                note=progress.note)):
            if err is None:
                err = _kernel_record(ws, ref, lock, progress)
            entries.append(LockEntry(ref.name, str(ref.lock_path), error=err) if err else
                           LockEntry(ref.name, str(lock.path), written, len(lock.packages),
                                     lock.digest))
    return LockReport(check, tuple(_with_overrides(ws, ref, e) for ref, e in zip(refs, entries)))


def _kernel_record(ws: Workspace, ref: TargetRef, lock,
                   progress: Progress = SILENT) -> ImgbuildError | None:
    """The lock's kernel coverage record (lockfiles/<lock>.kernels.json), read from its wheels
    when the lock is new or the rules changed: committed with the lock, what `plan` judges."""
    rules = coverage.rules_for(ws, ref.target)
    if rules is None:
        return None
    try:
        coverage.ensure_record(ref, lock, rules, note=progress.note)
    except ImgbuildError as e:
        return e
    return None


def _kernel_record_diff(ws: Workspace, ref: TargetRef) -> tuple[str, ...]:
    rules = coverage.rules_for(ws, ref.target)
    if rules is None:
        return ()
    path = kernels.record_path(ref.lock_path)
    if kernels.read_record(path, ref.lock().digest, rules.digest()) is None:
        return (f"{ws.display(path)}: missing, or not for this lock and images/checks/"
                f"kernels.yaml (run `imgbuild lock {ref.name}`)",)
    return ()


def _with_overrides(ws: Workspace, ref: TargetRef, entry: LockEntry) -> LockEntry:
    """Resolve without each override in turn: say which are still needed."""
    if not ref.request.overrides or entry.error is not None or not ref.has_lock:
        return entry
    reasons = {ov.requirement: ov.reason for ov in ref.target.overrides}
    statuses = tuple(
        {"requirement": st.requirement, "needed": st.needed, "effect": st.effect,
         "reason": reasons.get(st.requirement, "")}
        for st in check_overrides(ref.request, ws.wheels, ref.lock()))
    return replace(entry, overrides=statuses)
