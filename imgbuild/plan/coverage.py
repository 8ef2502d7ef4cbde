"""Kernel coverage: for each target arch, which locked packages carry SASS for it, which only
PTX, which nothing; a required package with nothing refuses the target before any build.

The GPU code is read from the locked wheels once (imgbuild/lock/kernels.py) into a record
committed next to the lock; this module only judges that record against the rules
(images/checks/kernels.yaml) for the archs asked for, so `plan --arch` needs no network.
"""

from __future__ import annotations

import fnmatch
from collections.abc import Callable
from dataclasses import dataclass

from ..catalog.kernels import EngineKernels, KernelRule
from ..catalog.targets import Target
from ..errors import InputError
from ..lock import kernels, wheels
from ..lock.fatbin import Code
from ..lock.lockfile import Lockfile
from ..workspace import TargetRef, Workspace

# Worst first: a package's status for an arch is the worst of its files'.
ORDER = ("none", "ptx", "sass")


@dataclass(frozen=True)
class FileVerdict:
    package: str
    version: str
    member: str
    sha256: str
    codes: tuple[str, ...]
    required: bool
    why: str
    status: tuple[tuple[str, str], ...]  # (arch, sass | ptx | none | -): - where not needed


@dataclass(frozen=True)
class Coverage:
    archs: tuple[str, ...]
    files: tuple[FileVerdict, ...]
    jit: tuple[str, ...]  # jit packages in the lock, name==version
    record: str  # where the record lies (as messages show it)

    def table(self) -> tuple[tuple[str, tuple[tuple[str, str], ...]], ...]:
        """Per arch, package → its worst status over the files that apply (required ones;
        shown ones as `shown:<status>`), then the JIT packages."""
        out = []
        for a in self.archs:
            row: dict[str, str] = {}
            for f in self.files:
                st = dict(f.status)[a]
                if st == "-":
                    continue
                key = f.package if f.required else f"{f.package} (shown)"
                row[key] = min(row.get(key, "sass"), st, key=ORDER.index)
            row.update({j.split("==")[0]: "jit" for j in self.jit})
            out.append((a, tuple(sorted(row.items()))))
        return tuple(out)

    @property
    def ptx_only(self) -> tuple[tuple[FileVerdict, str], ...]:
        return tuple((f, a) for f in self.files for a, st in f.status if st == "ptx")


def status_for(codes: tuple[str, ...], arch: str) -> str:
    n = int(arch[2:])
    parsed = [Code.parse(c) for c in codes]
    if any(c.kind == "sass" and c.runs_on(n) for c in parsed):
        return "sass"
    if any(c.kind == "ptx" and c.runs_on(n) for c in parsed):
        return "ptx"
    return "none"


def _rule_files(rule: KernelRule, files: dict) -> list[str]:
    if not rule.files:
        return sorted(m for m, f in files.items() if f["codes"])  # those with GPU code
    return sorted(m for m in files if any(fnmatch.fnmatch(m, g) for g in rule.files))


def judge(record: dict, rules: EngineKernels, archs: tuple[str, ...], lock: Lockfile,
          where: str) -> Coverage:
    """Coverage of `archs`; raises InputError (exit 2) naming package, file and arch when a
    required file has no code that runs there."""
    verdicts: list[FileVerdict] = []
    refusals: list[tuple[FileVerdict, str, KernelRule]] = []
    for rule in rules.rules:
        pkg = record["packages"].get(rule.package)
        if pkg is None:
            continue  # not in this lock (an older or newer engine names it otherwise)
        members = _rule_files(rule, pkg["files"])
        needed_on = [a for a in archs if rule.applies(a)]
        if rule.required and needed_on and not members:
            # Not in this platform's wheel (FA3 has no aarch64 build), or moved.
            raise InputError(
                f"{rule.package} {pkg['version']} has no {' or '.join(rule.files) or '.so'} "
                f"in its wheel for this platform, needed on {', '.join(needed_on)}",
                facts=[f"images/checks/kernels.yaml: {rule.package} is required on "
                       f"{', '.join(rule.archs) or 'every arch'}"
                       + (f": {rule.why}" if rule.why else ""),
                       f"{pkg['wheel']} has: {', '.join(sorted(pkg['files'])[:8]) or 'no .so'}"],
                hint=f"drop {', '.join(needed_on)} from the target, or pin a {rule.package} "
                     "whose wheel for this platform has it; if the package moved its "
                     "libraries, update `files:` in images/checks/kernels.yaml")
        for m in members:
            f = pkg["files"][m]
            status = tuple((a, status_for(tuple(f["codes"]), a) if rule.applies(a) else "-")
                           for a in archs)
            v = FileVerdict(rule.package, pkg["version"], m, f["sha256"], tuple(f["codes"]),
                            rule.required, rule.why, status)
            verdicts.append(v)
            if rule.required:
                refusals += [(v, a, rule) for a, st in status if st == "none"]
    if refusals:
        v, arch, rule = refusals[0]
        more = [f"{x.package}: {x.member} has nothing for {a}" for x, a, _ in refusals[1:6]]
        raise InputError(
            f"{v.package} {v.version} carries no GPU code for {arch}: {v.member}",
            facts=[f"{v.member} carries " + (", ".join(v.codes) or "no GPU code at all")
                   + f" (read from the locked wheel's .nv_fatbin; {where})",
                   f"{arch} runs none of it: no SASS of its own (or an earlier minor of its "
                   "major), no PTX it can JIT",
                   f"images/checks/kernels.yaml: {v.package} is required"
                   + (f" on {', '.join(rule.archs)}" if rule.archs else "")
                   + (f": {rule.why}" if rule.why else "")] + more,
            hint=f"drop {arch} from the target (or --arch without it), or pin a {v.package} "
                 f"built for {arch}; if this engine never loads {v.member} on {arch}, say so "
                 "with `archs:` on its rule in images/checks/kernels.yaml")
    jit = tuple(f"{p.name}=={p.version}" for name in rules.jit if (p := lock.package(name)))
    return Coverage(archs, tuple(verdicts), jit, where)


def rules_for(ws: Workspace, target: Target,
              archs: tuple[str, ...] | None = None) -> EngineKernels | None:
    """The rules a target's coverage is judged by: its engine's, for its GPU archs (`archs`
    overrides the target's); None for a CPU target or an engine without rules."""
    gpu = [a for a in (archs or target.archs) if a != "cpu"]
    return ws.kernel_rules.get(target.engine) if gpu else None


def ensure_record(ref: TargetRef, lock: Lockfile, rules: EngineKernels, *,
                  write: bool = True,
                  note: Callable[[str], None] = lambda _m: None) -> tuple[dict, bool]:
    """The committed record for this lock and these rules; read from the wheels (network,
    cached by wheel hash) when it is missing or stale. Returns (record, read_now)."""
    path = kernels.record_path(ref.lock_path)
    digest = rules.digest()
    doc = kernels.read_record(path, lock.digest, digest)
    if doc is not None:
        return doc, False
    req = ref.request
    packages = ", ".join(r.package for r in rules.rules)
    note(f"reading the GPU code in {ref.name}'s locked wheels ({packages}): ranged reads, "
         f"cached by wheel hash ...")
    doc, _ = kernels.make_record(
        lock, [(r.package, r.files) for r in rules.rules], digest,
        index_urls=wheels.index_urls(req.extra_index_urls), python=req.python,
        platform=req.uv_platform)
    if write and not ref.builtin:  # a built-in lock's record is read, never rewritten there
        kernels.write_record(path, doc)
    return doc, True
