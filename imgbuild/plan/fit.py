"""Which target fits this host: `imgbuild run MODEL` picks one, `imgbuild run --target T` checks
one, and both say why every other target does or does not fit.

The host is what `preflight.probe` read (nvidia-smi, `uname -m`); each target is judged by the
same checks the image's own preflight runs (payload/preflight.py: cpu, arch, driver, model
fits, gpus free, disk) on the facts its Plan would label the image with (plan/labels.py), so
`run`, `preflight TARGET` and the image's entrypoint agree.

Candidates. Given a model: every target, each serving that model. A GPU target (archs sm*)
can serve any model profile. A CPU target (archs [cpu]) never serves a GPU model: a profile
with `gpus:` or a tensor-parallel size above 1 (k2.6); it serves the others (the generated
smoke models). Given no model: each target with its own default model. Given targets: only
those. A target is judged on each of its platforms whose CPU is the host's (`uname -m`); one
with none is judged on its first, so that its row says which CPU it is for; a host whose CPU
is unknown (no `uname -m`) gets every platform.

What a row says. `fits`: the image would run here: CPU arch, GPU arch, driver floor and the
model's memory at its TP size all pass (a GPU target on a host with no GPU fails with
"no NVIDIA GPU visible"). `blocked`: it fits, but the host is busy right now: another process
holds memory on a GPU the server will use (check_taken), or the disk lacks room for the model.
A busy host keeps the target (the choice is about what the hardware runs; a stale process is
stopped, not worked around with another image) but `refusal()` refuses the run with the
reason (exit 3).

Ranking among the targets that fit, first difference decides (`TargetFit.rank`):
  1. an exact SASS match for every GPU (sm120 code on sm120) before a binary-compatible one
     (sm120 code on sm121, a family sm100f on sm103), before a CPU target (the GPUs idle);
  2. the target that names the model as its default (`model:`) before one that only can serve
     it;
  3. fewer archs the host does not use (sm100 is dead weight on an sm120 host);
  4. the engine's name, then its newer release first (orders releases of one engine only:
     sglang 0.5.23 before sglang 0.5.16);
  5. the target's name, then its platforms' order.

Refusal when nothing fits (`FitReport.refusal()`), exit codes as DESIGN.md assigns them:
  - 3 (EnvError, environment): the machine must change, not the command: no GPU visible, a
    driver below the floor of a target that otherwise fits, a busy GPU or a full disk.
  - 2 (InputError, bad input): the host is fine but nothing asked for runs on it: no target
    has code for its GPU arch or CPU, or the model does not fit its GPUs' memory or count.
    The way out is another target, `--arch`, or another model.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from ..catalog.models import ModelProfile
from ..catalog.targets import PLATFORMS
from ..errors import EnvError, ImgbuildError, InputError
from ..payload import preflight as pf
from ..payload.preflight import FAIL, PASS, SKIP, WARN, Host, ImageFacts, Verdict
from ..workspace import Workspace
from .decide import make_plan
from .labels import facts_from_plan

# The checks that decide whether a target fits, and those that say the host is busy now.
FIT_CHECKS = ("cpu", "nvidia-smi", "arch", "driver", "model fits")
BUSY_CHECKS = ("gpus free", "disk")
# Failures only the machine can fix: the driver. A target that fails on these alone is the
# right target for the hardware.
HOST_SIDE = ("driver",)

EXACT, COMPATIBLE, CPU_ONLY = 0, 1, 2
MATCH_WORDS = {EXACT: "exact SASS match", COMPATIBLE: "binary-compatible (same major, earlier "
               "minor or family code)", CPU_ONLY: "CPU image: the GPUs stay idle"}


@dataclass(frozen=True)
class TargetFit:
    """One target on one platform, judged against the host."""

    name: str
    platform: str
    model: str | None  # the model it would serve (the asked one, else its default)
    fits: bool
    reasons: tuple[str, ...]  # why not (the failed checks) or why yes; one sentence each
    blocked: tuple[str, ...] = ()  # fits, but the host is busy now (gpus free, disk)
    # The ranking key (module docstring); None where its code does not run on these GPUs.
    rank: tuple[Any, ...] | None = None
    facts: ImageFacts | None = None  # None: never planned (not a candidate, or plan refused)
    verdicts: tuple[Verdict, ...] = ()
    failed: tuple[str, ...] = ()  # names of the failed fit checks ("arch", "driver", ...)
    candidate: bool = True  # False: cannot serve the model at all (a CPU target, a GPU model)
    short: tuple[str, ...] = ()  # the failed checks' facts in a few words each (summary)

    @property
    def ready(self) -> bool:
        return self.fits and not self.blocked

    @property
    def matches_hardware(self) -> bool:
        """Its code runs on these GPUs and this CPU: it fails on the driver or the model's
        memory at most."""
        return bool(self.failed) and all(f in ("driver", "model fits") for f in self.failed)

    @property
    def summary(self) -> str:
        """Why not, in short: the facts the refusal chains ("sm100, sm120 code, none runs on
        sm90; needs driver >= 580.65.06 (CUDA 13.0), host has 565.57.01")."""
        if self.fits:
            return self.reasons[0]
        return "; ".join(self.short) or "; ".join(self.reasons)

    @property
    def host_side_only(self) -> bool:
        """It fails only on what the machine must change (the driver)."""
        return bool(self.failed) and all(f in HOST_SIDE for f in self.failed)

    def to_dict(self) -> dict[str, Any]:
        return {"target": self.name, "platform": self.platform, "model": self.model,
                "fits": self.fits, "ready": self.ready, "reasons": list(self.reasons),
                "blocked": list(self.blocked), "failed": list(self.failed),
                "candidate": self.candidate,
                "rank": list(self.rank) if self.rank is not None else None,
                "facts": self.facts.to_dict() if self.facts else None,
                "verdicts": [{"check": v.check, "status": v.status, "detail": v.detail}
                             for v in self.verdicts]}


@dataclass(frozen=True)
class FitReport:
    host: Host
    model: str | None
    rows: tuple[TargetFit, ...]  # fitting ones by rank, then the rest by name
    asked: tuple[str, ...] | None = None  # the targets given (None: the catalog's)
    # When targets were given and none fits: the catalog's other candidates, for the way out.
    others: tuple[TargetFit, ...] = field(default=())
    # `--arch` builds that the locked kernels allow, for targets that fail on the arch alone:
    # (target, sm). Checked with make_plan(archs=...), whose kernel coverage refuses an arch
    # the locked wheels carry no code for.
    arch_builds: tuple[tuple[str, str], ...] = ()

    @property
    def chosen(self) -> TargetFit | None:
        return self.rows[0] if self.rows and self.rows[0].fits else None

    @property
    def fitting(self) -> tuple[TargetFit, ...]:
        return tuple(r for r in self.rows if r.fits)

    @property
    def ok(self) -> bool:
        return self.chosen is not None and self.chosen.ready

    def to_dict(self) -> dict[str, Any]:
        err = self.refusal()
        return {"ok": self.ok, "model": self.model,
                "chosen": self.chosen.name if self.chosen else None,
                "chosen_platform": self.chosen.platform if self.chosen else None,
                "host": describe_host(self.host),
                "rows": [r.to_dict() for r in self.rows],
                "others": [r.to_dict() for r in self.others],
                "refusal": err.to_dict() if err else None}

    def refusal(self) -> ImgbuildError | None:
        """The error that stops the run (None: the chosen target runs here now): the chain
        of facts (the host, the model, each target and why it does not fit, in short), then
        the way out."""
        host = "host: " + describe_host(self.host)
        model = _model_fact((*self.rows, *self.others))
        chosen = self.chosen
        if chosen is not None:
            if not chosen.blocked:
                return None
            ways = []
            if any(b.startswith("gpus free") for b in chosen.blocked):
                ways.append("stop the process that holds the GPU memory (`nvidia-smi` on the "
                            "host names it), or pick other GPUs with CUDA_VISIBLE_DEVICES")
            if any(b.startswith("disk") for b in chosen.blocked):
                ways.append("free disk space where the model goes, or point --model-dir at a "
                            "larger disk")
            return EnvError(f"target '{chosen.name}' fits this host, but the host is busy",
                            facts=[host, *model, *(f"{chosen.name}: {b}" for b in chosen.blocked)],
                            hint="; ".join(ways) + "; then run again")
        if self.asked:
            subject = (f"target '{self.asked[0]}' does not" if len(self.asked) == 1 else
                       f"targets {', '.join(repr(a) for a in self.asked)} do not") + " fit this host"
        else:
            subject = "no target fits this host"
        if self.model:
            subject += f" for model {self.model}"
        facts = [host, *model, *_grouped(self.rows)]
        if not self.host.gpus and any(r.facts and not r.facts.cpu_only for r in self.rows):
            return EnvError(f"{subject}: no NVIDIA GPU visible", facts=facts,
                            hint=pf.NO_GPU_HINT + "; on a host without a GPU only a CPU "
                            "target runs, with a model that is not a GPU model")
        ways = self._ways_out()
        hint = "; ".join(ways) if ways else None
        # The exit code follows the way out: the machine must change (3) when a target asked
        # for (or, given none, any target) fails on the driver alone; else the request (2).
        if any(r.host_side_only for r in self.rows):
            return EnvError(subject, facts=facts, hint=hint)
        return InputError(subject, facts=facts, hint=hint)

    def _ways_out(self) -> list[str]:
        out: list[str] = []
        # The nearest target: one whose code runs on these GPUs and this CPU, failing on the
        # driver or the model's memory only. Those asked for first, then the catalog's.
        near = [r for r in self.rows if r.matches_hardware] or sorted(
            [r for r in self.others if r.matches_hardware], key=_order)
        r = near[0] if near else None
        if r is not None and r.facts and "driver" in r.failed:
            out.append(f"update the NVIDIA driver to {r.facts.driver_floor} or later (CUDA "
                       f"{r.facts.cuda} needs it; this host has {self.host.driver})"
                       + (f": then '{r.name}' fits" if r.host_side_only else
                          f" for '{r.name}'"))
        fit_other = [o for o in self.others if o.fits]
        if fit_other:
            out.append(f"target '{fit_other[0].name}' fits this host: run it instead")
        for name, sm in self.arch_builds:
            out.append(f"build '{name}' for this GPU with `--arch {sm}` (its locked kernels "
                       f"carry {sm} code)")
        if self.model and any("model fits" in x.failed for x in (*self.rows, *self.others)):
            runs = (f"'{r.name}' runs on these GPUs: " if r is not None
                    and "model fits" in r.failed else "")
            out.append(f"{runs}serve a smaller model, or one at a tensor-parallel size this "
                       f"host's {len(self.host.gpus)} GPU(s) can hold")
        if not out and any("arch" in x.failed for x in self.rows):
            sms = ", ".join(sorted({g.sm or "?" for g in self.host.gpus}))
            out.append(f"add a target whose archs include {sms} (`archs:` in images/TARGET.yaml)")
        if not out and any("cpu" in x.failed for x in self.rows):
            out.append(f"use a target built for {self.host.cpu_arch} (`platforms:`)")
        return out


def _grouped(rows: Sequence[TargetFit]) -> list[str]:
    """One fact per distinct short reason, naming every target it holds for, in row order:
    "sglang-blackwell, vllm-blackwell: needs driver >= 580.65.06 (CUDA 13.0), host has
    565.57.01"."""
    groups: dict[str, list[str]] = {}
    for r in rows:
        names = groups.setdefault(r.summary, [])
        if r.name not in names:
            names.append(r.name)
    return [f"{', '.join(names)}: {summary}" for summary, names in groups.items()]


def describe_host(host: Host) -> str:
    """"8x NVIDIA H100 80GB HBM3 (sm90, 79.6 GiB), driver 565.57.01, CPU x86_64"."""
    if not host.gpus:
        gpus = f"no NVIDIA GPU visible: {host.error or 'nvidia-smi lists no device'}"
    else:
        groups: dict[str, int] = {}
        for g in host.gpus:
            mem = (f"{g.memory_total_mib / 1024:.1f} GiB" if g.memory_total_mib is not None
                   else "memory [N/A]")
            key = f"{g.name} ({g.sm or 'capability unknown'}, {mem})"
            groups[key] = groups.get(key, 0) + 1
        gpus = ", ".join(f"{n}x {k}" for k, n in groups.items())
        gpus += f", driver {host.driver or 'unknown'}"
    return f"{gpus}, CPU {host.cpu_arch or 'unknown (`uname -m` did not answer)'}"


def fit_targets(ws: Workspace, host: Host, *, model: str | None = None,
                targets: Sequence[str] | None = None) -> FitReport:
    """Judge the catalog's targets (or `targets`) for serving `model` (or each its default)
    on `host`; rank those that fit (module docstring). Reads committed locks only."""
    profile = ws.catalog.model(model) if model else None  # unknown alias: InputError, closest
    names = list(dict.fromkeys(targets)) if targets else list(ws.catalog.targets)
    for n in names:
        ws.catalog.target(n)  # unknown name: InputError with the closest name
    rows = _judge_all(ws, host, names, model, profile)
    others: tuple[TargetFit, ...] = ()
    builds: list[tuple[str, str]] = []
    if not any(r.fits for r in rows):
        if targets:
            rest = [n for n in ws.catalog.targets if n not in names]
            others = _sorted(_judge_all(ws, host, rest, model, profile))
        # `--arch` is the way out for a target asked for by name; over the whole catalog,
        # only where no target's code runs on these GPUs (else that target is the way out).
        if targets or not any(r.matches_hardware for r in rows):
            builds = _arch_builds(ws, host, _sorted(rows), model)[:None if targets else 1]
    return FitReport(host=host, model=model, rows=_sorted(rows),
                     asked=tuple(names) if targets else None, others=others,
                     arch_builds=tuple(builds))


def _judge_all(ws: Workspace, host: Host, names: Sequence[str], model: str | None,
               profile: ModelProfile | None) -> list[TargetFit]:
    rows: list[TargetFit] = []
    for name in names:
        t = ws.catalog.target(name)
        platforms = _platforms(t.platforms, host.cpu_arch)
        for p in platforms:
            rows.append(_judge(ws, host, name, p, model, profile))
    return rows


def _platforms(platforms: tuple[str, ...], cpu: str | None) -> tuple[str, ...]:
    if cpu is None:
        return platforms
    mine = tuple(p for p in platforms if PLATFORMS[p] == cpu)
    return mine or platforms[:1]


def gpu_model(profile: ModelProfile) -> bool:
    """A model that needs GPUs: its profile names GPUs or a tensor-parallel size above 1."""
    return bool(profile.gpus) or profile.tensor_parallel > 1


def _judge(ws: Workspace, host: Host, name: str, platform: str, model: str | None,
           profile: ModelProfile | None) -> TargetFit:
    t = ws.catalog.target(name)
    served = model or t.default_model
    cpu_target = all(a == "cpu" for a in t.archs)
    if cpu_target and profile is not None and gpu_model(profile):
        why = (f"CPU target (archs [cpu]): serves no GPU model, and {model} is one "
               f"({profile.size_gb:g} GB at TP {profile.tensor_parallel}"
               + (f"; gpus: {profile.gpus}" if profile.gpus else "") + ")")
        return TargetFit(name, platform, served, False, (why,), failed=("model",),
                         candidate=False)
    try:
        plan = make_plan(ws, name, model=served, resolve=False, platform=platform)
        facts = facts_from_plan(plan)
    except ImgbuildError as e:
        # A target without a committed lock, or whose locked kernels miss one of its archs:
        # it cannot run until that is fixed, whatever the host.
        return TargetFit(name, platform, served, False, (f"cannot plan it: {e.message}",),
                         failed=("plan",))
    vs = pf.verdicts(facts, host)
    if not facts.cpu_only and not host.gpus:
        vs = [Verdict("nvidia-smi", FAIL, f"no NVIDIA GPU visible: "
                                          f"{host.error or 'nvidia-smi lists no device'}")
              if v.check == "nvidia-smi" else v for v in vs]
    fit_vs = [v for v in vs if v.check in FIT_CHECKS]
    failed = tuple(v.check for v in fit_vs if v.status == FAIL)
    blocked = tuple(f"{v.check}: {v.detail}" for v in vs
                    if v.check in BUSY_CHECKS and v.status == FAIL)
    rank: tuple[Any, ...] | None = None
    why: list[str] = []
    if "arch" not in failed:
        # Ranked where its code runs on these GPUs, fitting or not: the nearest target that
        # does not fit (a driver or memory short) is the one the way out names.
        match, unused = _arch_match(facts, host)
        names_model = 0 if (model is None or t.default_model == model) else 1
        rank = (match, names_model, len(unused), t.engine,
                tuple(-x for x in pf.version_tuple(t.engine_version)), name,
                t.platforms.index(platform))
        why = [MATCH_WORDS[match]
               + (f"; {len(unused)} arch(s) unused here ({', '.join(unused)})" if unused else "")
               + (f"; names {model} as its default model" if model and names_model == 0
                  else f"; can serve {model} (its default model is {t.default_model or 'none'})"
                  if model else "")]
    if failed:
        reasons = tuple(f"{v.check}: {v.detail}" for v in fit_vs if v.status == FAIL)
        short = tuple(_short(v, facts, host) for v in fit_vs if v.status == FAIL)
        return TargetFit(name, platform, served, False, reasons, rank=rank, facts=facts,
                         verdicts=tuple(vs), failed=failed, short=short)
    why += [f"{v.check}: {v.detail}" for v in fit_vs if v.status in (PASS, WARN)]
    why += [f"{v.check}: not checked: {v.detail}" for v in fit_vs
            if v.status == SKIP and v.check == "cpu"]
    return TargetFit(name, platform, served, True, tuple(why), blocked=blocked, rank=rank,
                     facts=facts, verdicts=tuple(vs))


def _short(v: Verdict, facts: ImageFacts, host: Host) -> str:
    """A failed check's facts in a few words, for the refusal's chain (the full detail stays
    in `reasons`)."""
    if v.check == "arch":
        sms = ", ".join(sorted({g.sm or f"{g.name} (capability unknown)" for g in host.gpus}))
        return f"{', '.join(facts.archs)} code, none runs on {sms}"
    if v.check == "driver":
        return (f"needs driver >= {facts.driver_floor} (CUDA {facts.cuda}), host has "
                f"{host.driver or 'none reported'}")
    if v.check == "cpu":
        return f"{facts.cpu_arch} image, {host.cpu_arch} host"
    if v.check == "nvidia-smi":
        return "needs an NVIDIA GPU, none visible"
    # model fits: its first clause carries the numbers ("... has 4 GPU(s)", "GPU0 ... has
    # 79.6 GiB"); the basis after it is the same for every target.
    return v.detail.split("; weights only")[0].split("; the engine")[0]


def _arch_match(facts: ImageFacts, host: Host) -> tuple[int, tuple[str, ...]]:
    """How the image's archs meet the host's GPUs, and the archs no GPU here uses."""
    if facts.cpu_only:
        return CPU_ONLY, ()
    used: set[str] = set()
    match = EXACT
    for g in host.gpus:
        cap = pf.parse_capability(g.compute_cap)
        if cap is None:
            continue
        covering = [a for a in facts.archs if pf.arch_covers(a, cap)]
        exact = [a for a in covering if pf.parse_arch(a)[:2] == cap]  # type: ignore[index]
        # The GPU loads its own SASS where there is one: sm100 code beside sm103 code is
        # unused on an sm103 GPU, though it would run there.
        used.update(exact or covering)
        if not exact:
            match = COMPATIBLE
    return match, tuple(a for a in facts.archs if a not in used)


def _arch_builds(ws: Workspace, host: Host, rows: Sequence[TargetFit],
                 model: str | None) -> list[tuple[str, str]]:
    """For targets that fail on the GPU arch (and at most the driver besides): can they be
    built for this GPU? Asks
    make_plan, whose kernel coverage refuses an arch the locked wheels have no code for."""
    sms = sorted({g.sm for g in host.gpus if g.sm})
    if len(sms) != 1:
        return []
    out = []
    for r in rows:
        if "arch" not in r.failed or not set(r.failed) <= {"arch", "driver"} \
                or (r.name, sms[0]) in out:
            continue
        try:
            make_plan(ws, r.name, model=r.model, resolve=False, platform=r.platform,
                      archs=(sms[0],))
        except ImgbuildError:
            continue
        out.append((r.name, sms[0]))
    return out


def _model_fact(rows: Sequence[TargetFit]) -> list[str]:
    for r in rows:
        m = r.facts.model if r.facts else None
        if m and m.size_gb is not None and m.tensor_parallel:
            per = m.size_gb * 1e9 / m.tensor_parallel / 2**30
            return [f"model {m.alias}: {m.size_gb:g} GB at TP {m.tensor_parallel} "
                    f"({per:.1f} GiB of weights per GPU)"]
    return []


def _order(r: TargetFit) -> tuple[Any, ...]:
    """Fitting targets by rank; then those whose code runs here by rank (the nearest first);
    then the rest by name."""
    if r.rank is None:
        return (not r.fits, 1, (), r.name, r.platform)
    return (not r.fits, 0, r.rank)


def _sorted(rows: Sequence[TargetFit]) -> tuple[TargetFit, ...]:
    return tuple(sorted(rows, key=_order))
