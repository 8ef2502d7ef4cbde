"""`imgbuild report`: the compatibility page's data. Which target's image runs on which GPU,
and why, collected from the evidence only: each shipped target's Plan (its archs, CUDA and
driver floor, the lock's kernel coverage record, overrides, patches), the GPU table
(images/gpus.yaml), the doctor's failure catalog, and, with a registry, what is stored there
(the content tag's manifest, its layers, the smoke report pushed beside it).

A cell says what the evidence says and no more: without a registry, whether an image was built
or smoke-tested is "not known", never "passed". Everything is sorted and nothing carries the
time it was made, so the same inputs give the same Report (and the same page bytes).
"""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass
from typing import Any

from packaging.specifiers import InvalidSpecifier, SpecifierSet
from packaging.version import InvalidVersion, Version

from ..catalog.failures import Fingerprint
from ..catalog.hardware import Gpu
from ..catalog.models import ModelProfile
from ..catalog.registries import SignPolicy
from ..catalog.targets import PLATFORMS
from ..errors import ImgbuildError
from ..image import cosign, signstore
from ..image import registry as reg
from ..lock import kernels
from ..lock.lockfile import Lockfile
from ..payload import preflight as pf
from ..plan.decide import make_plan
from ..plan.fit import gpu_model
from ..plan.plan import Plan
from ..workspace import Workspace

# Cell words, for the kernels a GPU would run and for the image in the registry.
SASS, PTX, NONE, REFUSED, NOT_BUILT, CPU_ONLY, NO_RECORD = (
    "sass", "ptx-jit", "no kernels", "refused", "not built", "cpu only", "not recorded")
NOT_KNOWN = "not known"
SMOKE_GPU, SMOKE_CPU, SMOKE_FAILED, BUILT, ABSENT = (
    "smoke-tested on GPU", "smoke-tested on CPU", "smoke failed", "built",
    "not in registry")
# Where the smoke report says when it ran: the reused report's origin ("local cache, run
# 2026-12-01T20:05:01+00:00"). A report run at push time carries no time: then none is shown.
_RAN_AT = re.compile(r"\brun (\d{4}-\d\d-\d\dT[\d:]+(?:[+-]\d\d:\d\d|Z)?)")


def anchor(*parts: str) -> str:
    """An HTML id from parts: lower case, [a-z0-9-] only (the evidence links' targets)."""
    return "-".join(re.sub(r"[^a-z0-9]+", "-", p.lower()).strip("-") for p in parts if p)


@dataclass(frozen=True)
class GpuColumn:
    key: str  # the first name gpus.yaml gives
    names: tuple[str, ...]
    sm: str
    generation: str
    memory_gb: float
    cpu_arch: str


@dataclass(frozen=True)
class Cell:
    target: str
    gpu: str  # GpuColumn.key
    status: str  # SASS, PTX, NONE, REFUSED, NOT_BUILT, CPU_ONLY, NO_RECORD
    reason: str
    platform: str | None  # the image that would run there (None: no platform for its CPU)
    kernels: tuple[tuple[str, str], ...] = ()  # (package, sass | ptx | jit | none) for this arch
    image: str = NOT_KNOWN  # SMOKE_GPU, SMOKE_CPU, SMOKE_FAILED, BUILT, ABSENT, NOT_KNOWN
    image_reason: str = "no registry given: whether it was built or smoke-tested is not known"
    model_fit: str | None = None  # the preflight's model-fits rule on this GPU, as a sentence
    evidence: tuple[str, ...] = ()  # anchors of the evidence in the target's section


@dataclass(frozen=True)
class Layer:
    digest: str
    size: int  # compressed, as the manifest says
    media_type: str
    step: str  # the config's history entry that made it ("" when the history does not say)


@dataclass(frozen=True)
class Smoke:
    ok: bool
    stages: tuple[tuple[str, str, str], ...]  # (name, status, reason)
    gpu: str | None  # the GPU stage's device ("NVIDIA B200 (sm100)"); None: no GPU stage ran
    when: str | None  # as the report records it; None when it does not
    image: str
    forced: bool


@dataclass(frozen=True)
class Published:
    """What the registry holds for one platform's content tag."""

    repository: str
    ref: str
    digest: str | None  # None: the tag is not there
    layers: tuple[Layer, ...] = ()
    smoke: Smoke | None = None
    smoke_tag: str | None = None  # where the report is stored (sha256-<hex>.smoke)
    signature: str | None = None  # its cosign signature, as the registry's policy reads it

    @property
    def total_bytes(self) -> int:
        return sum(x.size for x in self.layers)


@dataclass(frozen=True)
class KernelFile:
    package: str
    version: str
    member: str
    sha256: str
    statuses: tuple[tuple[str, str], ...]  # (arch, status) for the plan's archs


@dataclass(frozen=True)
class PlatformSection:
    platform: str
    cpu_arch: str
    content_tag: str
    content_key: str
    archs: tuple[str, ...]
    cuda: str | None
    min_driver: str | None
    selection: tuple[str, ...]
    flavor: str
    base_image: str
    python: str
    lock_path: str
    lock_hash: str
    lock_packages: int
    kernel_record: str | None  # the record's path (None: no GPU code judged)
    kernel_coverage: tuple[tuple[str, tuple[tuple[str, str], ...]], ...]
    kernel_lock_lines: tuple[tuple[str, str], ...]  # (package, "lockfiles/x.txt:12: pkg==v")
    heavy: tuple[str, ...]
    pull: str  # the `imgbuild pull` line
    docker_pull: str | None  # `docker pull REPO@sha256:…`, when the digest is known
    published: Published | None  # None: no registry given
    error: str | None = None  # the plan's refusal, when this platform does not plan


@dataclass(frozen=True)
class Failure:
    id: str
    title: str
    severity: str
    why: str  # what in the lock it applies to ("any engine", "sglang 0.5.23 in sglang: <0.5.17")
    cause: str
    fix: str


@dataclass(frozen=True)
class ModelRow:
    alias: str
    name: str
    checkpoint: str
    size_gb: float
    tensor_parallel: int
    quantization: str
    role: str  # "default" | "smoke test" | "with --model"


@dataclass(frozen=True)
class TargetSection:
    name: str
    description: str
    engine: str
    engine_version: str
    platforms: tuple[PlatformSection, ...]
    overrides: tuple[tuple[str, str, str], ...]  # (requirement, reason, link)
    patches: tuple[tuple[str, str, str, str], ...]  # (id, package versions, fixes, upstream)
    models: tuple[ModelRow, ...]
    failures: tuple[Failure, ...]
    error: str | None = None  # the target does not plan at all


@dataclass(frozen=True)
class Report:
    registry: str | None
    gpus: tuple[GpuColumn, ...]
    targets: tuple[TargetSection, ...]
    cells: tuple[Cell, ...]

    def cell(self, target: str, gpu: str) -> Cell:
        return next(c for c in self.cells if c.target == target and c.gpu == gpu)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


# --- collecting ------------------------------------------------------------------------------

def collect(ws: Workspace, *, registry: str | None = None,
            targets: tuple[str, ...] | None = None) -> Report:
    """The Report for every target of the catalog (or those named), judged against every GPU
    of images/gpus.yaml. With `registry`, what it holds for each content tag (an unreachable
    registry is exit 3: a page that silently says "not in registry" would mislead)."""
    repo = reg.Repository.parse(registry) if registry else None
    if repo is not None:
        reg.check_reachable(repo)
    names = sorted(targets or ws.catalog.targets)
    for n in names:
        ws.catalog.target(n)  # an unknown name: InputError with the closest one
    gpus = _columns(ws.catalog.gpus)
    sections, cells = [], []
    for name in names:
        section, plans = _section(ws, name, repo)
        sections.append(section)
        cells += [_cell(ws, section, plans, g) for g in gpus]
    return Report(registry, gpus, tuple(sections), tuple(cells))


def _columns(gpus: tuple[Gpu, ...]) -> tuple[GpuColumn, ...]:
    """gpus.yaml's entries, by arch (capability), then as the file lists them."""
    order = sorted(range(len(gpus)), key=lambda i: (pf.parse_arch(gpus[i].sm)[:2], i))  # type: ignore[index]
    return tuple(GpuColumn(gpus[i].names[0], gpus[i].names, gpus[i].sm, gpus[i].generation,
                           gpus[i].memory_gb, gpus[i].cpu_arch) for i in order)


def _section(ws: Workspace, name: str,
             repo: reg.Repository | None) -> tuple[TargetSection, dict[str, Plan]]:
    t = ws.catalog.target(name)
    plans: dict[str, Plan] = {}
    platforms = []
    for p in t.platforms:
        try:
            plan = make_plan(ws, name, resolve=False, platform=p,
                             repository=repo.name if repo else "imgbuild")
        except ImgbuildError as e:
            platforms.append(_refused_platform(t, p, e))
            continue
        plans[p] = plan
        platforms.append(_platform(ws, name, plan, repo))
    first = next(iter(plans.values()), None)
    lock = ws.target(name, next(iter(plans))).lock() if plans else None
    error = None if plans else platforms[0].error
    return TargetSection(
        name=name, description=t.description, engine=t.engine, engine_version=t.engine_version,
        platforms=tuple(platforms),
        overrides=tuple(sorted((o.requirement, o.reason, o.link or "") for o in t.overrides)),
        patches=_patches(ws, first),
        models=_models(ws, t, first),
        failures=_failures(ws, lock) if lock is not None else (),
        error=error), plans


def _refused_platform(t, platform: str, e: ImgbuildError) -> PlatformSection:
    return PlatformSection(platform, PLATFORMS[platform], "", "", t.archs, None, None, (),
                           t.flavor, "", "", "", "", 0, None, (), (), (), "", None, None,
                           error=_message(e))


def _message(e: ImgbuildError) -> str:
    """The refusal as one paragraph: the message, its facts, the way out."""
    parts = [e.message, *e.facts]
    if e.hint:
        parts.append(f"help: {e.hint}")
    return "; ".join(parts)


def _platform(ws: Workspace, name: str, plan: Plan,
              repo: reg.Repository | None) -> PlatformSection:
    ref = ws.target(name, plan.platform)
    record = ws.display(kernels.record_path(ref.lock_path)) if plan.kernel_coverage else None
    lock = ref.lock()
    lines = _lock_lines(ref.lock_path, plan.lock_path, lock,
                        sorted({pkg for _, rows in plan.kernel_coverage for pkg, _ in rows}))
    multi = len(plan.index_platforms) > 1
    repo_name = repo.name if repo else "REGISTRY/REPO"
    pull = (f"imgbuild pull {name} --registry {repo_name}"
            + (f" --platform {plan.platform}" if multi else ""))
    published = _published(repo, plan, ws.registries.policy_for(repo.name)) \
        if repo is not None else None
    docker_pull = (f"docker pull {repo.name}@{published.digest}"
                   if repo is not None and published and published.digest else None)
    return PlatformSection(
        platform=plan.platform, cpu_arch=plan.cpu_arch, content_tag=plan.content_tag,
        content_key=plan.content_key, archs=plan.archs, cuda=plan.cuda,
        min_driver=plan.min_driver, selection=plan.selection, flavor=plan.flavor,
        base_image=plan.base_image, python=plan.python, lock_path=plan.lock_path,
        lock_hash=plan.lock_hash, lock_packages=plan.lock_packages, kernel_record=record,
        kernel_coverage=plan.kernel_coverage, kernel_lock_lines=lines,
        heavy=tuple(sorted(plan.heavy_packages)), pull=pull, docker_pull=docker_pull,
        published=published)


def _lock_lines(path, display: str, lock: Lockfile,
                packages: list[str]) -> tuple[tuple[str, str], ...]:
    """Each kernel package's pin in the lock, as `lockfiles/x.txt:LINE: name==version`."""
    out = []
    text = path.read_text().splitlines()
    for label in packages:
        pkg = label.split(" ")[0]
        p = lock.package(pkg)
        if p is None:
            continue
        pin = f"{p.name}=={p.version}"
        line = next((i + 1 for i, s in enumerate(text) if s.strip().startswith(pin)), None)
        out.append((label, f"{display}:{line}: {pin}" if line else f"{display}: {pin}"))
    return tuple(out)


def _published(repo: reg.Repository, plan: Plan, policy: SignPolicy | None = None) -> Published:
    tag = plan.content_tag
    digest = reg.manifest_digest(repo, tag)
    ref = f"{repo.name}:{tag}"
    if digest is None:
        return Published(repo.name, ref, None)
    got = reg.get_manifest(repo, digest)
    manifest = got[1] if got else {}
    layers: list[Layer] = []
    if "config" in manifest:
        _, config = reg.image_config(repo, digest)
        steps = [_step(h.get("created_by", ""), h.get("comment", ""))
                 for h in config.get("history", []) if not h.get("empty_layer")]
        for i, x in enumerate(manifest.get("layers", [])):
            layers.append(Layer(x["digest"], int(x.get("size", 0)), x.get("mediaType", ""),
                                steps[i] if i < len(steps) else ""))
    doc = reg.fetch_report(repo, digest)
    return Published(repo.name, ref, digest, tuple(layers),
                     _smoke(doc) if doc is not None else None,
                     reg.report_tag(digest) if doc is not None else None,
                     _signature(repo, digest, policy))


def _signature(repo: reg.Repository, digest: str, policy: SignPolicy | None) -> str:
    """Whether, and by whom, the image is signed: against the registry's signed-by policy
    where it has one; else only how many cosign signatures are stored (no key to check them)."""
    if policy is None:
        sigs = signstore.fetch_layers(repo, cosign.sig_tag(digest)) or []
        return signature_words(None, [], len(sigs), repo.name)
    checks, _ = signstore.checks(repo, digest, policy)
    return signature_words(policy, checks, 0, repo.name)


def signature_words(policy: SignPolicy | None, checks: list, stored: int,
                    repository: str) -> str:
    """The page's words for an image's signature, from the policy's checks (or, with no
    policy, the number of signatures stored)."""
    if policy is None:
        if not stored:
            return "not signed"
        return (f"{stored} cosign signature{'s' if stored != 1 else ''} stored; no signed-by "
                f"policy for {repository} names a key to check them against")
    bad = [f"{c}: {d}" for c, ok, d in checks if not ok]
    if bad:
        return f"NOT accepted by the signed-by policy ({policy.where}): " + "; ".join(bad)
    return "; ".join(d for _, _, d in checks)


def _step(created_by: str, comment: str = "") -> str:
    """A history entry as people read it: BuildKit's `RUN |1 A=b c /bin/sh -c cmd # buildkit`
    as `RUN cmd`, a leading `if ...; fi;` set-up dropped; an imported layer by its comment."""
    s = " ".join(created_by.split())
    if not s:
        return f"base layer ({comment})" if comment else "base layer"
    if s.startswith("RUN ") and " /bin/sh -c " in s:
        s = "RUN " + s.split(" /bin/sh -c ", 1)[1]
    s = s.removeprefix("/bin/sh -c #(nop) ").removesuffix(" # buildkit")
    return re.sub(r"^RUN if .*?; fi;\s*", "RUN ", s)


def _smoke(doc: dict) -> Smoke:
    stages = tuple((str(s.get("name", "?")), str(s.get("status", "?")), str(s.get("reason", "")))
                   for s in doc.get("stages", []) if isinstance(s, dict))
    gpu = None
    for s in doc.get("stages", []):
        if isinstance(s, dict) and s.get("name") == "gpu-engine" and s.get("status") == "pass":
            d = s.get("details") or {}
            gpu = f"{d.get('gpu', 'a GPU')} ({d.get('sm', '?')})"
    m = _RAN_AT.search(str(doc.get("reused") or ""))
    return Smoke(bool(doc.get("ok")), stages, gpu, m.group(1) if m else None,
                 str(doc.get("image", "")), bool(doc.get("forced")))


def _patches(ws: Workspace, plan: Plan | None) -> tuple[tuple[str, str, str, str], ...]:
    if plan is None:
        return ()
    known = ws.patches
    out = []
    for pid in sorted(set(plan.applied_patches) | set(plan.needed_patches)):
        p = known.get(pid)
        if p is not None:
            out.append((pid, f"{p.package} {p.versions}", p.fixes.strip(), p.upstream))
    return tuple(out)


def _models(ws: Workspace, t, plan: Plan | None) -> tuple[ModelRow, ...]:
    """The target's default model, its smoke model, and the other profiles `--model` can give
    it (plan/fit.py's rule: a CPU target serves no GPU model)."""
    cpu = all(a == "cpu" for a in t.archs)
    rows = []
    for alias in sorted(ws.catalog.models):
        prof: ModelProfile = ws.catalog.model(alias)
        if alias == t.default_model:
            role = "default"
        elif alias == t.smoke_model:
            role = "smoke test"
        elif cpu and gpu_model(prof):
            continue
        else:
            role = "with --model"
        rows.append(ModelRow(alias, prof.name, prof.checkpoint, prof.size_gb,
                             prof.tensor_parallel, prof.quant_summary
                             or ", ".join(prof.quant_formats) or "not stated", role))
    order = {"default": 0, "smoke test": 1, "with --model": 2}
    return tuple(sorted(rows, key=lambda r: (order[r.role], r.alias)))


def _failures(ws: Workspace, lock: Lockfile) -> tuple[Failure, ...]:
    """The doctor's entries that hold for this lock: those for any engine (applies_to empty),
    and those whose package range holds for the locked version."""
    out = []
    for fp in ws.failures.fingerprints:
        why = _applies(fp, lock)
        if why is not None:
            out.append(Failure(fp.id, fp.title, fp.severity, why, _plain(fp.cause),
                               _plain(fp.fix)))
    return tuple(sorted(out, key=lambda f: (f.severity != "error", f.id)))


def _applies(fp: Fingerprint, lock: Lockfile) -> str | None:
    if not fp.applies_to:
        return "any engine"
    hits = []
    for pkg, spec in fp.applies_to:
        p = lock.package(pkg)
        if p is None:
            continue
        try:
            inside = not spec or Version(p.version) in SpecifierSet(spec, prereleases=True)
        except (InvalidSpecifier, InvalidVersion):
            continue
        if inside:
            hits.append(f"{p.name} {p.version}" + (f" (in {spec})" if spec else ""))
    return ", ".join(hits) if hits else None


def _plain(template: str) -> str:
    """A cause or fix with no log to fill it: each [[with||without]] takes its second wording,
    and a {capture} left reads as <capture>."""
    s = re.sub(r"\[\[(.*?)\|\|(.*?)\]\]", r"\2", template, flags=re.S)
    s = re.sub(r"\[\[(.*?)\]\]", "", s, flags=re.S)
    return re.sub(r"\{(\w+)\}", r"<\1>", s).strip()


# --- one cell --------------------------------------------------------------------------------

def _cell(ws: Workspace, section: TargetSection, plans: dict[str, Plan], g: GpuColumn) -> Cell:
    name = section.name
    platform = next((p for p in ws.catalog.target(name).platforms
                     if PLATFORMS[p] == g.cpu_arch), None)
    sec = next((s for s in section.platforms if s.platform == platform), None)
    if platform is None:
        have = ", ".join(ws.catalog.target(name).platforms)
        return Cell(name, g.key, REFUSED,
                    f"{g.key} sits in {g.cpu_arch} hosts; {name} has images for {have} only "
                    f"(`imgbuild plan {name} --arch '{g.key}'` refuses it)", None,
                    image="", image_reason="")
    plan = plans.get(platform)
    if plan is None:
        return Cell(name, g.key, REFUSED, sec.error if sec else "does not plan", platform,
                    image="", image_reason="",
                    evidence=(anchor("t", name, platform),))
    image, image_reason, ev_image = _image_cell(name, sec, g)
    fit = _model_fit(ws, plan, g)
    base = dict(target=name, gpu=g.key, platform=platform, image=image,
                image_reason=image_reason, model_fit=fit)
    if all(a == "cpu" for a in plan.archs):
        return Cell(status=CPU_ONLY, reason="CPU image: runs on the host CPU, the GPU stays "
                    "idle", evidence=(anchor("t", name, platform, "plan"), *ev_image), **base)
    cap = pf.parse_arch(g.sm)[:2]  # type: ignore[index]
    covering = [a for a in plan.archs if pf.arch_covers(a, cap)]
    if g.sm in plan.archs:
        rows = dict(plan.kernel_coverage).get(g.sm, ())
        return _kernel_cell(base, rows, g.sm, f"built for {g.sm}",
                            (anchor("t", name, platform, "kernels", g.sm), *ev_image))
    # Not one of the target's archs: what the plan says for that arch alone, from the same
    # lock's kernel record (a required package with no code for it is the plan's refusal).
    try:
        alone = make_plan(ws, name, resolve=False, platform=platform, archs=(g.sm,))
    except ImgbuildError as e:
        why = _message(e)
        if covering:
            why = (f"the image's {', '.join(covering)} code would load on {g.sm}, but "
                   f"`imgbuild plan {name} --arch {g.sm}` refuses: {why}")
        if not covering:  # the image never starts there: what the registry holds is moot
            base |= dict(image="", image_reason="")
            ev_image = ()
        return Cell(status=REFUSED, reason=why,
                    evidence=(anchor("t", name, platform, "lock"), *ev_image), **base)
    rows = dict(alone.kernel_coverage).get(g.sm, ())
    if covering:
        return _kernel_cell(base, rows, g.sm, f"binary-compatible: built for "
                            f"{', '.join(covering)}, which {g.sm} runs; the locked kernels "
                            f"judged for {g.sm}",
                            (anchor("t", name, platform, "lock"), *ev_image))
    cell = _kernel_cell(base, rows, g.sm, "", (anchor("t", name, platform, "lock"),))
    return Cell(**(base | dict(image="", image_reason="")), status=NOT_BUILT,
                reason=f"not built for {g.sm} (archs: {', '.join(plan.archs)}); "
                f"`imgbuild build {name} --arch {g.sm}` plans: its locked kernels carry "
                f"{cell.status} for {g.sm}",
                kernels=cell.kernels, evidence=cell.evidence)


def _kernel_cell(base: dict, rows: tuple[tuple[str, str], ...], sm: str, lead: str,
                 evidence: tuple[str, ...]) -> Cell:
    """The status for one arch: the worst over the required packages (SASS, else PTX the
    driver compiles at first launch); packages only shown and JIT packages are said beside."""
    if not rows:
        return Cell(status=NO_RECORD, reason=(lead + "; " if lead else "") + "no kernel "
                    "coverage recorded for this engine (images/checks/kernels.yaml)",
                    evidence=evidence, **base)
    required = [(p, s) for p, s in rows if not p.endswith("(shown)") and s != "jit"]
    worst = min((s for _, s in required), key=("none", "ptx", "sass").index, default="sass")
    status = {"sass": SASS, "ptx": PTX, "none": NONE}[worst]
    notes = []
    ptx = [p for p, s in required if s == "ptx"]
    if ptx:
        notes.append(f"PTX only (the driver compiles it at first launch): {', '.join(ptx)}")
    if worst == "sass":
        notes.append(f"SASS for {sm} in every required package ({len(required)})")
    shown_none = [p.removesuffix(" (shown)") for p, s in rows
                  if p.endswith("(shown)") and s == "none"]
    if shown_none:
        notes.append(f"nothing for {sm} in {', '.join(shown_none)} (not required)")
    jit = [p for p, s in rows if s == "jit"]
    if jit:
        notes.append(f"JIT at first use: {', '.join(jit)}")
    return Cell(status=status, reason="; ".join(([lead] if lead else []) + notes),
                kernels=rows, evidence=evidence, **base)


def _image_cell(name: str, sec: PlatformSection | None,
                g: GpuColumn) -> tuple[str, str, tuple[str, ...]]:
    if sec is None or sec.published is None:
        return NOT_KNOWN, ("no registry given: whether it was built or smoke-tested is not "
                           "known"), ()
    pub = sec.published
    ev = anchor("t", name, sec.platform, "registry")
    if pub.digest is None:
        return ABSENT, f"{pub.ref} is not in {pub.repository}", (ev,)
    if pub.smoke is None:
        return BUILT, f"{pub.ref} is pushed ({pub.digest}); no smoke report stored for it", (ev,)
    sm = pub.smoke
    when = f", {sm.when}" if sm.when else ""
    passed = [n for n, s, _ in sm.stages if s == "pass"]
    if not sm.ok:
        failed = [n for n, s, _ in sm.stages if s == "fail"]
        return SMOKE_FAILED, f"stages failed: {', '.join(failed) or '?'}{when}", (ev,)
    if sm.gpu and f"({g.sm})" in sm.gpu:
        return SMOKE_GPU, f"on {sm.gpu}{when}; passed: {', '.join(passed)}", (ev,)
    where = f"on {sm.gpu}, not this GPU" if sm.gpu else "on CPU only, no GPU stage ran"
    return SMOKE_CPU, f"{where}{when}; passed: {', '.join(passed)}", (ev,)


def _model_fit(ws: Workspace, plan: Plan, g: GpuColumn) -> str | None:
    """The image's preflight rule for the model's weights, on TP GPUs of this kind with the
    memory gpus.yaml gives (as sold, read as GiB)."""
    if plan.model is None or plan.model_size_gb is None or not plan.tensor_parallel:
        return None
    if all(a == "cpu" for a in plan.archs):
        return None
    tp = plan.tensor_parallel
    host = pf.Host(gpus=tuple(pf.Gpu(i, "", g.key, None, "name table",
                                     int(g.memory_gb * 1024), 0) for i in range(tp)))
    facts = pf.ImageFacts(plan.archs, model=pf.ModelFacts(plan.model, plan.model_size_gb, tp))
    v = pf.check_fit(facts, host)
    word = {pf.PASS: "fits", pf.FAIL: "does not fit", pf.WARN: "not checked"}.get(v.status,
                                                                                "not checked")
    per = plan.model_size_gb / tp
    return (f"{plan.model} {word} on {tp}x {g.key} ({g.memory_gb:g} GB each): "
            f"{plan.model_size_gb:g} GB / TP {tp} = {per:.1f} GB of weights per GPU, allowed "
            f"<= {pf.WEIGHTS_HEADROOM:.0%}")
