"""`imgbuild run TARGET|MODEL`: from a model to a serving endpoint on this host.

The steps, each one a value the next takes: the target (given, or chosen for this host's GPUs
from the model: plan/fit.py), its Plan, the Launch (plan/launch.py: the container a serving
engine needs, from images/launch.yaml and the model profile), the host preflight (the same
checks the image's entrypoint runs, run here once so the entrypoint's are skipped), the image
(local, or pulled by content tag and verified), the container (image/launch.py), its phases
until the server answers, and when it never does, the doctor on its log.
"""

from __future__ import annotations

import os
import shlex
import textwrap
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from cryptography import x509
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec

from ..catalog.registries import SignPolicy
from ..checks.doctor import Diagnosis, diagnose, to_dict
from ..errors import EXIT_FAILED, EXIT_OK, InputError, JobFailed
from ..image import cosign, daemon, keyless, signstore, toolkit
from ..image import launch as container
from ..image.base import host_platform
from ..payload import preflight as host_checks
from ..plan.decide import make_plan
from ..plan.fit import FitReport, fit_targets
from ..plan.imagepolicy import (
    ADMISSION,
    InlineTrust,
    TrustData,
    TrustedCA,
    TrustedLog,
    admission_header,
    admission_policy,
    inline_of,
    trust_root_file,
    trust_root_header,
    trust_root_note,
    trust_root_resource,
)
from ..plan.index import make_index_plan
from ..plan.launch import (
    Cluster,
    Launch,
    emit_compose,
    emit_k8s,
    launch_for,
    read_only,
    refuse_unwritable,
    with_env,
)
from ..plan.manifests import dump, write
from ..progress import SILENT, Progress
from ..workspace import Workspace
from .pull import pull_target

# The label every container `imgbuild run` starts carries: a second run of the same model is
# refused while the first one serves.
RUN_LABEL = "imgbuild.run"


@dataclass(frozen=True)
class RunReport:
    target: str
    model: str | None
    launch: Launch
    status: str  # dry-run | emitted | ready | stopped | exited | timeout
    fit: FitReport | None = None
    preflight: host_checks.Report | None = None
    preflight_where: str = ""  # which preflight ran where, in words
    image_action: str | None = None  # local | pulled
    phases: tuple[tuple[str, float], ...] = ()
    seconds: float = 0.0
    container_exit: int | None = None
    diagnoses: tuple[Diagnosis, ...] = ()
    log_tail: tuple[str, ...] = ()
    files: tuple[str, ...] = ()  # --emit
    kept: bool = False  # the container was left (--keep, --detach)
    served: str | None = None  # the model id the server answers to
    notes: tuple[str, ...] = field(default=())

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.launch.host_port}"

    @property
    def exit_code(self) -> int:
        return EXIT_OK if self.status in ("dry-run", "emitted", "ready", "stopped") \
            else EXIT_FAILED

    def to_dict(self) -> dict[str, Any]:
        return {
            "target": self.target, "model": self.model, "status": self.status,
            "image": self.launch.image, "container": self.launch.name,
            "docker_run": self.launch.dry_run_line(), "endpoint": self.endpoint,
            "fit": self.fit.to_dict() if self.fit else None,
            "preflight": self.preflight.to_dict() if self.preflight else None,
            "preflight_where": self.preflight_where, "image_action": self.image_action,
            "phases": [{"phase": p, "at_s": s} for p, s in self.phases],
            "seconds": self.seconds, "container_exit": self.container_exit,
            "served_model": self.served,
            "doctor": to_dict(self.diagnoses) if self.status in ("exited", "timeout") else None,
            "log_tail": list(self.log_tail), "files": list(self.files), "kept": self.kept,
            "notes": list(self.notes), "exit_code": self.exit_code,
        }


def choose(ws: Workspace, subject: str, model: str | None, host: host_checks.Host | None,
           *, starting: bool = True) -> tuple[str, str | None, FitReport | None]:
    """(target, model, fit): SUBJECT is a target, or a model profile the host's best-fitting
    target serves. starting=False (a dry run, --emit): a target that fits the hardware is
    chosen even while the host is busy (a full disk, a GPU held): nothing starts now."""
    cat = ws.catalog
    if subject in cat.targets:
        return subject, model, None
    if subject in cat.models:
        if model and model != subject:
            raise InputError(f"run {subject} names a model, and --model {model} another",
                             hint=f"`imgbuild run {subject}`, or `imgbuild run TARGET --model "
                                  f"{model}`")
        if host is None:
            host = host_checks.probe()
        report = fit_targets(ws, host, model=subject)
        if (err := report.refusal()) is not None and (starting or report.chosen is None):
            raise err
        assert report.chosen is not None
        return report.chosen.name, subject, report
    close = sorted({*cat.targets, *cat.models})
    raise InputError(f"'{subject}' is neither a target nor a model profile",
                     facts=["targets: " + ", ".join(sorted(cat.targets)),
                            "model profiles: " + ", ".join(sorted(cat.models))],
                     hint="see `imgbuild list`" if close else None)


def _name_taken(held: container.Holder) -> InputError:
    """The container name is taken: by what an earlier run left (kept, or its imgbuild killed
    before it could remove it), or by a container imgbuild did not start. Neither is removed
    here: the first's log may be what the user wants, the second is not imgbuild's."""
    n = held.name
    if RUN_LABEL in held.labels:
        return InputError(f"cannot start {n}: a container of an earlier `imgbuild run` holds "
                          "the name",
                          facts=[f"{n}: {held.state}, exit code {held.exit_code}, serving "
                                 f"{held.labels[RUN_LABEL]}"],
                          hint=f"read it with `docker logs {n}` if it matters, then "
                               f"`docker rm {n}` and run again")
    return InputError(f"cannot start {n}: a container imgbuild did not start has that name",
                      facts=[f"{n}: {held.state}, no {RUN_LABEL} label; imgbuild leaves it "
                             "alone"],
                      hint=f"rename it (`docker rename {n} {n}-old`) or remove it if it is yours "
                           "to remove, then run again")


def run(ws: Workspace, subject: str, *, model: str | None = None,
        registry_name: str | None = None, port: int | None = None, dry_run: bool = False,
        emit: tuple[str, Path] | None = None, gpus_per_node: int = 8, keep: bool = False,
        detach: bool = False, preflight: bool = True, timeout_s: float = 1800,
        nvidia_smi: str | None = None, model_cache: Path | None = None,
        read_only_root: bool = False, env: tuple[tuple[str, str], ...] = (),
        cluster: Cluster | None = None, admission: str | None = None,
        on_ready: Callable[[RunReport], None] = lambda _r: None,
        progress: Progress = SILENT) -> RunReport:
    # This host is read unless nothing will start on it and the target is given: a model
    # alone is served by the target that fits the host, so choosing reads it even for a dry run.
    offline = dry_run or emit is not None
    host = None if offline and subject in ws.catalog.targets else host_checks.probe(
        nvidia_smi=nvidia_smi, model_dir=str(model_cache or default_model_cache()))
    target, model, fit = choose(ws, subject, model, host, starting=not offline)
    if fit is not None:
        for row in fit.rows:  # which targets fit, and why the others do not
            progress.note(f"{'chosen' if row is fit.chosen else 'fits' if row.fits else 'no'}"
                          f": {row.name} ({row.platform}): {row.summary}")
    t = ws.catalog.target(target)
    here = host_platform()
    plan = make_plan(ws, target, model=model, repository=registry_name or "imgbuild",
                     platform=here if here in t.platforms else None)
    profile = ws.model(plan.model) if plan.model else None
    # One cache for both: the one the host check measures is the one the container mounts.
    launch = launch_for(plan, profile, ws.launch, host_port=port,
                        model_cache=model_cache or default_model_cache())
    if env:
        launch = with_env(launch, env, "--env")
    if read_only_root:
        # Refused here, before the host is asked anything more and before anything starts: a
        # cache on the read-only root fails the server at its first compile or download.
        launch = read_only(launch, ws.launch.writable.tmpfs)
        refuse_unwritable(launch)
    if dry_run:
        return RunReport(target, plan.model, launch, "dry-run", fit)
    if emit is not None:
        kind, out_dir = emit
        if kind == "k8s" and t.multi_platform:
            # A cluster's nodes are of any of the target's archs: the pods name the index (the
            # multi-arch tag), each node's runtime takes its own platform's image from it.
            # (compose runs here: this host's platform image, as `run` starts.)
            ip = make_index_plan(ws, target, model=model, repository=plan.repository,
                                 resolve=False)
            launch = replace(launch, image=ip.ref(), image_digest=None, platforms=ip.platforms)
        policy = ws.registries.policy_for(plan.repository) if kind == "k8s" else None
        if admission is not None and kind == "k8s" and policy is None:
            # Asked for by name, an admission policy that is not written would read as one that
            # was: refused before any file is written.
            facts = [f"no rule of images/registries.yaml with a signed-by matches "
                     f"{plan.repository}"]
            hint = ("add a `signed-by` (a key, or a keyless identity) to a rule that matches it "
                    "in your project's images/registries.yaml, or drop --admission")
            if not registry_name:
                facts.append("no --registry: the manifests name the local image")
                hint = "pass --registry with the repository the image is pulled from, or " + hint
            raise InputError(f"--admission {admission}: {plan.repository} has no signed-by "
                             "policy, so there is no admission policy to write",
                             facts=facts, hint=hint)
        # The cluster admits only what the registry's signed-by policy accepts. Its key or
        # trust root is read, and its files made, before any file is written: one that cannot
        # be used leaves no manifests behind without their policy.
        policy_files = (image_policy_files(plan.repository, policy, admission or ADMISSION[0])
                        if policy is not None else [])
        files = emit_compose(launch, out_dir) if kind == "compose" else \
            emit_k8s(launch, out_dir, gpus_per_node=gpus_per_node,
                     cluster=cluster or Cluster())
        for name, text in policy_files:
            write(Path(out_dir) / name, text)
            files = [*files, Path(out_dir) / name]
        return RunReport(target, plan.model, launch, "emitted", fit,
                         files=tuple(str(f) for f in files))
    assert host is not None
    notes: list[str] = []
    # The host checks run here once, as part of the fit (the same checks the image's
    # entrypoint runs, on the same facts); the entrypoint's copy is then skipped
    # (IMGBUILD_PREFLIGHT=0), so that the two never disagree about one host.
    report = None
    if preflight:
        if fit is None:
            fit = fit_targets(ws, host, model=plan.model, targets=[target])
        if (err := fit.refusal()) is not None:
            raise err
        row = fit.chosen
        assert row is not None and row.facts is not None
        report = host_checks.Report(row.facts, host, tuple(row.verdicts))
        where = ("preflight: ran on this host (the checks the image's entrypoint runs, on its "
                 "labels' facts); the entrypoint's run is skipped (IMGBUILD_PREFLIGHT=0)")
    else:
        where = "preflight: skipped on this host and in the container (--no-preflight)"
    launch, said = launch_on_host(launch, host_has_gpus=bool(host.gpus),
                                  serving=plan.model or target)
    for note in said:
        notes.append(note)
        progress.note(notes[-1], level="warn")
    for why in filter(None, [container.port_taken(launch.host_port)]):
        raise InputError(f"cannot start {target}: {why}",
                         facts=[f"{launch.name} would publish {launch.host_port}"],
                         hint="pass --port with a free one, or stop what listens there")
    busy = container.running_for(RUN_LABEL, plan.model or target)
    if busy:
        raise InputError(f"{plan.model or target} is already served here by {busy[0]}",
                         hint=f"use it, or stop it first: `docker rm -f {busy[0]}`")
    if (held := container.holder(launch.name)) is not None:
        raise _name_taken(held)
    client = daemon.client()
    if preflight and launch.gpus:
        # The driver is checked against the image's CUDA above (fit); this is the other half:
        # an Engine that cannot hand the GPUs to a container refuses `--gpus` at start.
        tk = toolkit.engine_toolkit(client, local=daemon.local_socket() is not None)
        if tk.ok is False:
            raise toolkit.refusal(tk, len(host.gpus))
        progress.note("NVIDIA Container Toolkit: " + (tk.how if tk.ok else
                                                      f"not confirmed ({tk.how})"),
                      level="info" if tk.ok else "warn")
    if daemon.local_image(client, plan.ref()) is not None:
        action = "local"
    elif registry_name:
        pull_target(ws, target, model=plan.model, registry_name=registry_name,
                    platform=plan.platform, progress=progress)
        action = "pulled"
    else:
        raise JobFailed(f"no image for {target} on this host",
                        facts=[f"content tag {plan.content_tag} is not among the local images"],
                        hint=f"build it (`imgbuild {target}"
                             + (f" --model {plan.model}" if plan.model else "")
                             + "`), or pull it: `imgbuild run "
                             + (f"{subject} --model {plan.model}" if plan.model and
                                subject != plan.model else subject)
                             + " --registry REGISTRY/REPO`")
    progress.note(where)
    progress.note("starting: " + shlex.join(launch.docker_args(detach=True, rm=False)))
    cid = container.start(launch)
    left = False
    try:
        w = container.watch(launch, cid, timeout_s=timeout_s,
                            on_phase=lambda p, line: progress.note(f"{p}: {line.strip()[:160]}"))
        base = dict(target=target, model=plan.model, launch=launch, fit=fit, preflight=report,
                    preflight_where=where, image_action=action, phases=tuple(w.phases),
                    seconds=w.seconds, notes=tuple(notes))
        if w.status != "ready":
            diags = tuple(diagnose(w.log, ws.failures))
            tail = tuple(list(w.lines)[-40:])
            left = leaves_container("failed", keep=keep, detach=detach)
            return RunReport(status=w.status, container_exit=w.exit_code, diagnoses=diags,
                             log_tail=tail, kept=keep, **base)
        ready = RunReport(status="ready", kept=keep or detach, served=w.served, **base)
        on_ready(ready)
        left = leaves_container("serving", keep=keep, detach=detach)
        if detach:
            return ready
        code = container.wait_exit(cid)  # until the server stops, or Ctrl-C / SIGTERM
        left = leaves_container("ended", keep=keep, detach=detach)
        if ended_status(code) == "exited":  # it served, then died: the doctor reads why
            log = container.logs(cid)
            return RunReport(status="exited", container_exit=code,
                             diagnoses=tuple(diagnose(log, ws.failures)),
                             log_tail=tuple(log.splitlines()[-40:]), kept=keep, **base)
        return RunReport(status="stopped", container_exit=code, kept=keep, **base)
    finally:
        if not left and (said := container.remove(launch.name)):
            progress.note(f"container {launch.name} was not removed ({said}): it may still "
                          f"run and hold its GPU and port; `docker rm -f {launch.name}` "
                          "once the daemon answers", level="warn")


def _subject(cert: x509.Certificate, oid: x509.ObjectIdentifier) -> str:
    return ", ".join(str(a.value) for a in cert.subject.get_attributes_for_oid(oid))


def trust_data(root: keyless.TrustRoot) -> TrustData:
    """A trust root as the plain text the admission policies carry (plan/imagepolicy.py), in
    the file's order. A CA the file names no subject for is named by its root certificate's
    (the last of its chain; self-signed, so subject and issuer are one)."""
    def ca(c: keyless.CA) -> TrustedCA:
        last = c.chain[-1]
        return TrustedCA(
            organization=c.organization or _subject(last, x509.NameOID.ORGANIZATION_NAME),
            common_name=c.common_name or _subject(last, x509.NameOID.COMMON_NAME),
            uri=c.uri,
            chain=tuple(x.public_bytes(serialization.Encoding.PEM).decode() for x in c.chain))

    def log(k: keyless.LogKey) -> TrustedLog:
        return TrustedLog(base_url=k.name, hash_algorithm=k.hash_algorithm,
                          public_pem=cosign.public_pem(k.key).decode(),
                          ecdsa=isinstance(k.key, ec.EllipticCurvePublicKey),
                          end=k.valid.end.isoformat(timespec="seconds") if k.valid.end else None)

    return TrustData(root.source, tuple(ca(c) for c in root.cas),
                     tuple(log(k) for k in root.tlogs), tuple(log(k) for k in root.ctlogs))


def inline_trust(root: keyless.TrustRoot) -> InlineTrust:
    """A trust root as the PEM text an inline admission policy carries: every CA certificate,
    and the log keys with no end to their validity (the ones that sign new entries)."""
    return inline_of(trust_data(root))


def _comment(text: str) -> str:
    # Names are hyphenated: a line broken inside one could not be copied whole.
    return "".join(f"# {line}\n" for line in textwrap.wrap(text, 90, break_on_hyphens=False))


def image_policy_files(repository: str, policy: SignPolicy,
                       admission: str = ADMISSION[0]) -> list[tuple[str, str]]:
    """The admission policy for the registry's signed-by policy (plan/imagepolicy.py), as
    (file name, text), named as the manifests are (NAME-KIND.yaml): a Sigstore
    policy-controller ClusterImagePolicy, and for a keyless policy with a trust root the
    TrustRoot it refers to; or a Kyverno ClusterPolicy, the trust root inline. Reads the
    policy's key or trust root (exit 2 where either cannot be used); writes nothing."""
    pem = None if policy.keyless else cosign.public_pem(signstore.policy_key(policy)[0]).decode()
    trust = (trust_data(signstore.policy_trust_root(policy))
             if policy.keyless and policy.trust_root else None)
    doc = admission_policy(admission, repository, policy, pem,
                           inline_of(trust) if trust is not None else None)
    name = doc["metadata"]["name"]
    if admission != "policy-controller":
        return [(f"{name}-{doc['kind'].lower()}.yaml",
                 admission_header(admission, policy) + dump(doc))]
    note = trust_root_note(policy, name)
    out = [(f"{name}-{doc['kind'].lower()}.yaml",
            admission_header(admission, policy)
            + (_comment("It " + note) if note else "")
            + dump(doc))]
    if trust is not None:
        # Made here, with the policy, so that a trust root policy-controller could not take is
        # refused before any launch file is written.
        out.append((trust_root_file(name), trust_root_header(policy, name, trust)
                    + dump(trust_root_resource(name, trust))))
    return out


def launch_on_host(launch: Launch, *, host_has_gpus: bool,
                   serving: str) -> tuple[Launch, tuple[str, ...]]:
    """The Launch `imgbuild run` starts on this host, and its warnings: the entrypoint's
    preflight off (it ran here), the RUN_LABEL naming what it serves, and, on a host with no
    NVIDIA GPU visible, no --gpus and no GPU ulimits."""
    notes: list[str] = []
    env = dict(launch.env) | {"IMGBUILD_PREFLIGHT": "0"}
    gpus, ulimits = launch.gpus, launch.ulimits
    if gpus and not host_has_gpus:
        # Asked to go on without the checks: the Engine would refuse --gpus with no NVIDIA
        # runtime, so the container starts without GPUs and the engine says what it lacks.
        # The GPU limits (locked memory for RDMA and NCCL) go too: nothing uses them here.
        gpus, ulimits = None, ()
        notes.append("no NVIDIA GPU visible on this host: starting without --gpus and the "
                     "GPU ulimits; the engine will say what it lacks")
    launch = replace(launch, env=tuple(sorted(env.items())), gpus=gpus, ulimits=ulimits,
                     labels=tuple(sorted({**dict(getattr(launch, "labels", ())),
                                          RUN_LABEL: serving}.items())))
    return launch, tuple(notes)


def leaves_container(stage: str, *, keep: bool, detach: bool) -> bool:
    """Whether the run's container is left (not removed) when the run ends at `stage`:
    "failed" (it never served: exited or timed out), "serving" (it answers; with --detach the
    run ends here, else it waits, and a Ctrl-C then removes it), "ended" (it served and
    stopped). --keep leaves a failed or ended one; --detach a serving one."""
    if stage == "serving":
        return detach
    return keep


def ended_status(code: int | None) -> str:
    """How a run whose server served and then stopped with `code` ends: "stopped" on 0 or no
    code (Ctrl-C, removed), "exited" otherwise (the doctor reads its log)."""
    return "exited" if code not in (0, None) else "stopped"


def default_model_cache() -> Path:
    """The host's Hugging Face cache, which the container mounts: HF_HOME/hub, else
    ~/.cache/huggingface."""
    home = os.environ.get("HF_HOME")
    return Path(home) if home else Path.home() / ".cache" / "huggingface"
