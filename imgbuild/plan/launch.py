"""The container a serving engine runs in, as one value (Launch), and the three ways to start it:
the `docker run` line (`imgbuild run`, and --dry-run prints it), a compose file, Kubernetes
manifests. Pure: the engine facts are images/checks/launch.yaml's (catalog/launch.py), the
model's the profile's, the image the Plan's; nothing here talks to Docker or a cluster.
"""

from __future__ import annotations

import math
import re
import shlex
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from ..catalog.checkpoints import checkpoint_dir, local_checkpoint
from ..catalog.launch import LaunchTable, MultiNode
from ..catalog.models import ModelProfile, checkpoint_kind
from ..errors import InputError
from ..fsutil import atomic_write_text, cannot_write
from .labels import ANY_USER
from .plan import Plan

# Kubernetes' probe period; the startup probe's threshold is the engine's startup timeout in
# these steps.
PROBE_PERIOD_S = 10
# The LeaderWorkerSet variables (kubernetes-sigs/lws api/leaderworkerset/v1/
# leaderworkerset_types.go: LwsLeaderAddress, LwsGroupSize, LwsWorkerIndex), which the LWS
# webhook puts in every container's env, so Kubernetes expands $(NAME) in args.
LWS_VARS = {"leader": "$(LWS_LEADER_ADDRESS)", "nnodes": "$(LWS_GROUP_SIZE)",
            "node_rank": "$(LWS_WORKER_INDEX)"}
LWS_API = "leaderworkerset.x-k8s.io/v1"
ANY_UID = int(ANY_USER.split(":")[0])  # the UID the image's smoke test runs as
LWS_NAME_LABEL = "leaderworkerset.sigs.k8s.io/name"  # on every pod of the set (the same file)
MANAGED = {"app.kubernetes.io/managed-by": "imgbuild"}
_DOCKER_NAME = re.compile(r"[^a-zA-Z0-9_.-]+")


@dataclass(frozen=True)
class Launch:
    """One serving container: the image, the argv after its entrypoint, and what it needs from
    the host. `command` is final (no template left); `model` is what the server loads."""

    image: str  # repository:content-tag, what `docker run` starts
    engine: str
    name: str  # the container's name
    command: tuple[str, ...]
    port: int  # in the container
    host_port: int
    health_path: str
    models_path: str
    ready_paths: tuple[str, ...]
    env: tuple[tuple[str, str], ...]
    gpus: str | None  # "all", or None: no GPUs (a CPU image)
    ipc_host: bool
    shm_size: str | None  # Docker units (32g)
    ulimits: tuple[tuple[str, int, int], ...]  # (name, soft, hard); -1 unlimited
    volumes: tuple[tuple[str, str, str], ...]  # (host path, container path, "ro" | "rw")
    phases: tuple[tuple[str, str], ...]  # (phase, regex searched in each log line)
    labels: tuple[tuple[str, str], ...] = ()
    pass_env: tuple[str, ...] = ()  # passed from the caller's environment when set (secrets)
    model: str = ""  # what {model} became: a repo id or a path in the container
    model_source: str = "smoke"  # hub | local | smoke
    target: str = ""
    tensor_parallel: int = 1
    startup_timeout_s: int = 1800
    multi_node: MultiNode | None = None
    image_digest: str | None = None  # sha256:... when known (pushed): compose and k8s pin it
    model_size_gb: float | None = None  # the profile's weights: what a cache claim must hold
    root_only: str | None = None  # why the image runs as root only (its target's smoke.root_only)

    @property
    def pinned_image(self) -> str:
        """The image as a file for another host names it: by digest when there is one."""
        return f"{self.image}@{self.image_digest}" if self.image_digest else self.image

    def docker_args(self, detach: bool = False, rm: bool = True) -> list[str]:
        """The `docker run` argv, "docker" first."""
        args = ["docker", "run"]
        if detach:
            args.append("-d")
        if rm:
            args.append("--rm")
        args += ["--name", self.name]
        for k, v in self.labels:
            args += ["--label", f"{k}={v}"]
        if self.gpus:
            args += ["--gpus", self.gpus]
        if self.ipc_host:
            # With --ipc host /dev/shm is the host's and Docker ignores --shm-size (measured,
            # Docker 20.10): a size beside it would promise a limit that is not there.
            args += ["--ipc", "host"]
        elif self.shm_size:
            args += ["--shm-size", self.shm_size]
        for name, soft, hard in self.ulimits:
            args += ["--ulimit", f"{name}={soft}" if soft == hard else f"{name}={soft}:{hard}"]
        args += ["-p", f"{self.host_port}:{self.port}"]
        for host, container, mode in self.volumes:
            args += ["-v", f"{host}:{container}:{mode}"]
        for k, v in self.env:
            args += ["-e", f"{k}={v}"]
        for k in self.pass_env:
            args += ["-e", k]  # no value: docker takes the caller's, and only when it is set
        return args + [self.image, *self.command]

    def dry_run_line(self, detach: bool = False, rm: bool = True) -> str:
        """The `docker run` line, quoted for a POSIX shell: paste it and it runs."""
        return shlex.join(self.docker_args(detach=detach, rm=rm))


def launch_for(plan: Plan, profile: ModelProfile | None, table: LaunchTable, *,
               host_port: int | None = None, model_cache: Path | None = None,
               name: str | None = None, project_root: Path | None = None,
               digest: str | None = None) -> Launch:
    """The Launch of the Plan's image serving the profile's model (None: the image's own smoke
    model). model_cache: the host's Hugging Face cache (default: the table's, ~/.cache/
    huggingface); project_root: where a relative local checkpoint is (default: the table's,
    the directory that holds the top layer's images/)."""
    eng = table.engine(plan.engine)
    src = table.models
    root = project_root or table.project_root
    env: list[tuple[str, str]] = list(eng.env)
    volumes: list[tuple[str, str, str]] = []
    extra: list[str] = []
    alias = profile.alias if profile else None
    if profile is None or profile.generated:
        if plan.smoke_model is None or (profile is not None and profile.alias != plan.smoke_model):
            what = f"model '{profile.alias}' is generated" if profile else \
                f"target '{plan.target}' names no model"
            raise InputError(
                f"cannot serve from {plan.target}: {what}, and the image carries only "
                + (f"its smoke model '{plan.smoke_model}'" if plan.smoke_model else "no model"),
                facts=[f"{src.smoke_model} in the image is the smoke model ({plan.smoke_model})"
                       if plan.smoke_model else f"target '{plan.target}' has no smoke model"],
                hint="name a model profile with a hub or local checkpoint (--model ALIAS), or "
                     f"serve the smoke model: --model {plan.smoke_model}" if plan.smoke_model
                     else "name a model profile (--model ALIAS)")
        model, source, alias = src.smoke_model, "smoke", plan.smoke_model
    else:
        local = _local_dir(profile, root)
        if local is None:  # a Hugging Face repo id, through the host's cache
            cache = Path(model_cache).expanduser() if model_cache else \
                Path(src.hf_cache_host).expanduser()
            volumes.append((str(cache), src.hf_cache_container, "rw"))
            env.append((src.hf_cache_env, src.hf_cache_container))
            model, source = profile.checkpoint, "hub"
            if profile.revision:
                if eng.revision_flag is None:
                    raise InputError(f"{profile.path}: revision: {profile.revision} cannot be "
                                     f"passed to {plan.engine}",
                                     facts=[f"{table.source}: engines.{plan.engine} has no "
                                            "revision_flag"],
                                     hint="drop revision: or download that revision and name "
                                          "the directory")
                extra = [eng.revision_flag, profile.revision]
        else:
            model, source = f"{src.local}/{profile.alias}", "local"
            volumes.append((str(local), model, "ro"))
    command = tuple(w.format(model=model, port=eng.port) for w in eng.command) \
        + tuple(extra) + tuple(plan.serve_flags)
    gpus = "all" if eng.gpus and any(a != "cpu" for a in plan.archs) else None
    cname = name or "imgbuild-" + _DOCKER_NAME.sub("-", alias or plan.target).strip("-._")
    if not re.fullmatch(r"[a-zA-Z0-9][a-zA-Z0-9_.-]+", cname):
        raise InputError(f"container name {cname!r}: docker takes letters, digits, '_', '.' "
                         "and '-', starting with a letter or digit", hint="pick another --name")
    labels = (("imgbuild.target", plan.target), ("imgbuild.model", alias or ""))
    return Launch(
        image=plan.ref(), engine=plan.engine, name=cname, command=command, port=eng.port,
        host_port=host_port or eng.port, health_path=eng.health_path,
        models_path=eng.models_path, ready_paths=eng.ready_paths, env=tuple(env), gpus=gpus,
        ipc_host=eng.ipc_host, shm_size=eng.shm_size, ulimits=eng.ulimits,
        volumes=tuple(volumes), phases=eng.phases, labels=labels, pass_env=eng.pass_env,
        model_size_gb=plan.model_size_gb,
        model=model, model_source=source, target=plan.target,
        tensor_parallel=(profile.tensor_parallel if profile and source != "smoke" else 1),
        startup_timeout_s=eng.startup_timeout_s, multi_node=eng.multi_node,
        image_digest=digest, root_only=plan.root_only)


def _local_dir(profile: ModelProfile, root: Path | None) -> Path | None:
    """The profile's local checkpoint directory on this host (absolute), or None for a hub id."""
    if checkpoint_kind(profile.checkpoint) == "hub":
        return local_checkpoint(profile, root) if root is not None else None
    p = Path(profile.checkpoint).expanduser()
    if p.is_absolute():
        return p
    if root is None:
        raise InputError(f"{profile.path}: checkpoint {profile.checkpoint} is a relative path "
                         "and no project directory is known to read it from",
                         hint="give the checkpoint as an absolute path")
    return checkpoint_dir(profile, root).absolute()


# --- compose --------------------------------------------------------------------------------

def _health_cmd(launch: Launch) -> list[str]:
    # The images have python3 (the venv's) and no curl or wget (checked in a built image);
    # urlopen raises on anything but 2xx, so the exit code is the verdict.
    url = f"http://127.0.0.1:{launch.port}{launch.health_path}"
    return ["CMD", "python3", "-c",
            f"import urllib.request; urllib.request.urlopen({url!r}, timeout=5)"]


def compose_doc(launch: Launch) -> dict[str, Any]:
    svc: dict[str, Any] = {
        "image": launch.pinned_image,
        "container_name": launch.name,
        "command": list(launch.command),
        "ports": [f"{launch.host_port}:{launch.port}"],
    }
    if launch.ipc_host:
        svc["ipc"] = "host"  # /dev/shm is the host's; shm_size would be ignored
    elif launch.shm_size:
        svc["shm_size"] = launch.shm_size
    if launch.ulimits:
        svc["ulimits"] = {n: s if s == h else {"soft": s, "hard": h}
                          for n, s, h in launch.ulimits}
    env = [f"{k}={v}" for k, v in launch.env] + list(launch.pass_env)
    if env:
        svc["environment"] = env  # a bare NAME is taken from the shell that runs compose
    if launch.volumes:
        svc["volumes"] = [f"{h}:{c}:{m}" for h, c, m in launch.volumes]
    if launch.labels:
        svc["labels"] = dict(launch.labels)
    if launch.gpus:
        svc["deploy"] = {"resources": {"reservations": {"devices": [
            {"driver": "nvidia", "count": "all" if launch.gpus == "all" else int(launch.gpus),
             "capabilities": ["gpu"]}]}}}
    svc["healthcheck"] = {"test": _health_cmd(launch), "interval": "30s", "timeout": "10s",
                          "retries": 3, "start_period": f"{launch.startup_timeout_s}s"}
    return {"services": {_k8s_name(launch.name): svc}}


def emit_compose(launch: Launch, dir: Path) -> list[Path]:
    """dir/compose.yaml: `docker compose up -d` starts what `imgbuild run` starts."""
    out = Path(dir) / "compose.yaml"
    head = _header(launch, "docker compose -f compose.yaml up -d") + (
        "" if launch.image_digest else
        "# The image is named by tag: pass the pushed image's digest to pin it.\n")
    _write(out, head + _dump(compose_doc(launch)))
    return [out]


# --- Kubernetes -----------------------------------------------------------------------------

def _k8s_name(name: str) -> str:
    """A DNS-1123 label: lowercase letters, digits and '-'; short enough that LWS pod names
    (<name>-<group>-<worker>) stay within 63."""
    s = re.sub(r"[^a-z0-9-]+", "-", name.lower()).strip("-")[:50].rstrip("-")
    return s or "imgbuild"


def _quantity(docker_size: str) -> str:
    """Docker's binary units (32g = 32 GiB) as a Kubernetes quantity."""
    n, unit = re.match(r"^([0-9]+)([bkmg]?)$", docker_size, re.IGNORECASE).groups()  # type: ignore[union-attr]
    return n + {"": "", "b": "", "k": "Ki", "m": "Mi", "g": "Gi"}[unit.lower()]


def _container(launch: Launch, args: list[str], gpus: int, *, probes: bool) -> dict[str, Any]:
    """The server container. probes: it serves HTTP (not an LWS worker whose engine serves none:
    no port, no probes)."""
    c: dict[str, Any] = {"name": "server", "image": launch.pinned_image,
                         "imagePullPolicy": "IfNotPresent", "args": args}
    if probes:
        c["ports"] = [{"name": "http", "containerPort": launch.port}]
    env: list[dict[str, Any]] = [{"name": k, "value": v} for k, v in launch.env]
    # A secret the caller's environment would give docker comes from a Secret here; optional,
    # so a model that needs none starts without it.
    env += [{"name": k, "valueFrom": {"secretKeyRef": {
        "name": _k8s_name(launch.name) + "-env", "key": k, "optional": True}}}
        for k in launch.pass_env]
    if env:
        c["env"] = env
    if gpus:
        c["resources"] = {"limits": {"nvidia.com/gpu": gpus}}
    # The restricted Pod Security standard, and what OpenShift's restricted SCC asks: no root,
    # no privilege escalation, no capabilities, the runtime's seccomp profile, a read-only
    # root; the image works so as any UID with group 0 (its smoke test's any-user stage).
    c["securityContext"] = {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]},
                            "readOnlyRootFilesystem": True, "runAsNonRoot": True}
    if launch.root_only:
        # A root-only image (its target says why): root, and the root filesystem writable; the
        # rest of what the restricted standard asks still holds. It meets the baseline standard.
        c["securityContext"] = {"allowPrivilegeEscalation": False, "runAsNonRoot": False,
                                "runAsUser": 0, "readOnlyRootFilesystem": False}
    mounts = [{"name": "tmp", "mountPath": "/tmp"}]
    mounts += [{"name": "dshm", "mountPath": "/dev/shm"}] if launch.shm_size else []
    mounts += [{"name": _vol_name(cpath), "mountPath": cpath, "readOnly": mode == "ro"}
               for _h, cpath, mode in launch.volumes]
    if mounts:
        c["volumeMounts"] = mounts
    if probes:
        get = {"httpGet": {"path": launch.health_path, "port": "http"}}
        c["startupProbe"] = {**get, "periodSeconds": PROBE_PERIOD_S,
                             "failureThreshold": math.ceil(launch.startup_timeout_s
                                                           / PROBE_PERIOD_S)}
        c["readinessProbe"] = {**get, "periodSeconds": PROBE_PERIOD_S, "failureThreshold": 3,
                               "timeoutSeconds": 5}
    return c


def _vol_name(container_path: str) -> str:
    return _k8s_name(container_path.rstrip("/").rsplit("/", 1)[-1])


def _pod_spec(launch: Launch, args: list[str], gpus: int, *, probes: bool) -> dict[str, Any]:
    # /tmp: HOME and every cache and JIT directory of the image (io.imgbuild.writable).
    vols: list[dict[str, Any]] = [{"name": "tmp", "emptyDir": {}}]
    if launch.shm_size:
        # A Pod has no ipc host: /dev/shm is a memory-backed emptyDir of the engine's size
        # (Docker's default 64 MiB breaks NCCL and the engines' worker processes).
        vols.append({"name": "dshm", "emptyDir": {"medium": "Memory",
                                                  "sizeLimit": _quantity(launch.shm_size)}})
    for _host, cpath, mode in launch.volumes:
        # A PersistentVolumeClaim (emitted beside the workload): the restricted standard allows
        # no hostPath. The Hugging Face cache is kept across restarts; a local checkpoint's
        # claim is filled with the checkpoint before the first start.
        vols.append({"name": _vol_name(cpath), "persistentVolumeClaim": {
            "claimName": _claim_name(launch, cpath), "readOnly": mode == "ro"}})
    spec: dict[str, Any] = {
        # runAsUser: a UID with no passwd entry, group 0 (OpenShift assigns its own from the
        # namespace's range: drop runAsUser there). fsGroup 0: the claims are group 0's.
        "securityContext": {"runAsNonRoot": True, "runAsUser": ANY_UID, "runAsGroup": 0,
                            "fsGroup": 0, "seccompProfile": {"type": "RuntimeDefault"}}
        if not launch.root_only else
        {"runAsUser": 0, "runAsGroup": 0, "seccompProfile": {"type": "RuntimeDefault"}},
        "containers": [_container(launch, args, gpus, probes=probes)]}
    if vols:
        spec["volumes"] = vols
    return spec


def _claim_name(launch: Launch, container_path: str) -> str:
    return f"{_k8s_name(launch.name)}-{_vol_name(container_path)}"


def _claims(launch: Launch) -> list[dict[str, Any]]:
    """A claim per volume: the cache read-write on one node, a checkpoint read-only on many."""
    out = []
    for _host, cpath, mode in launch.volumes:
        # The weights and a fifth more (tokenizer, config, a partial download's headroom).
        size = max(10, math.ceil(launch.model_size_gb * 1.2)) if launch.model_size_gb else 100
        out.append({"apiVersion": "v1", "kind": "PersistentVolumeClaim",
                    "metadata": {"name": _claim_name(launch, cpath),
                                 "labels": _labels(_k8s_name(launch.name))},
                    "spec": {"accessModes": ["ReadOnlyMany" if mode == "ro" else "ReadWriteOnce"],
                             "resources": {"requests": {"storage": f"{size}Gi"}}}})
    return out


def _labels(name: str, **more: str) -> dict[str, str]:
    return {"app.kubernetes.io/name": name, **MANAGED, **more}


def k8s_docs(launch: Launch, *, gpus_per_node: int) -> list[dict[str, Any]]:
    """The manifests: a Deployment and a Service, or, when the model's tensor parallelism spans
    more GPUs than one node has, a LeaderWorkerSet (one pod a node) and a Service on its
    leader."""
    if gpus_per_node < 1:
        raise InputError(f"--gpus-per-node {gpus_per_node}: expected at least 1")
    name = _k8s_name(launch.name)
    tp = launch.tensor_parallel if launch.gpus else 0
    base = list(launch.command)
    svc_port = [{"name": "http", "port": launch.port, "targetPort": "http"}]
    if tp <= gpus_per_node:
        labels = _labels(name)
        deploy = {
            "apiVersion": "apps/v1", "kind": "Deployment",
            "metadata": {"name": name, "labels": labels},
            "spec": {"replicas": 1, "selector": {"matchLabels": {"app.kubernetes.io/name": name}},
                     # Recreate: a rolling update would hold two servers' GPUs at once.
                     "strategy": {"type": "Recreate"},
                     "template": {"metadata": {"labels": labels},
                                  "spec": _pod_spec(launch, base, tp, probes=True)}}}
        service = {"apiVersion": "v1", "kind": "Service",
                   "metadata": {"name": name, "labels": _labels(name)},
                   "spec": {"selector": {"app.kubernetes.io/name": name}, "ports": svc_port}}
        return [deploy, service, *_claims(launch)]
    mn = launch.multi_node
    if mn is None:
        raise InputError(f"{launch.model} needs {tp} GPUs (tensor parallel) and a node has "
                         f"{gpus_per_node}; {launch.engine} has no multi-node launch",
                         facts=["images/checks/launch.yaml: engines."
                                f"{launch.engine}.multi_node is not set"],
                         hint=f"use nodes with {tp} GPUs (--gpus-per-node {tp})")
    size = math.ceil(tp / gpus_per_node)
    if tp % size:
        raise InputError(f"tensor parallel {tp} does not split evenly over {size} nodes of "
                         f"{gpus_per_node} GPUs",
                         facts=[f"{launch.engine} needs the same number of GPUs on every node "
                                f"({tp} / {size} is not whole)"],
                         hint="pick --gpus-per-node so that it divides the tensor parallelism")
    per_node = tp // size
    flags = [w.format(**LWS_VARS) for w in mn.flags]
    leader_args = base + flags
    worker_args = leader_args + [w.format(**LWS_VARS) for w in mn.worker_flags]
    leader_labels = _labels(name, role="leader")
    lws = {
        "apiVersion": LWS_API, "kind": "LeaderWorkerSet",
        "metadata": {"name": name, "labels": _labels(name)},
        "spec": {
            "replicas": 1,
            # The workers start with the leader, not after it is ready: the leader is ready
            # only once every worker has joined.
            "startupPolicy": "LeaderCreated",
            "leaderWorkerTemplate": {
                "size": size,
                # One rank lost breaks the collective: restart the group together.
                "restartPolicy": "RecreateGroupOnPodRestart",
                "leaderTemplate": {"metadata": {"labels": leader_labels},
                                   "spec": _pod_spec(launch, leader_args, per_node,
                                                     probes=True)},
                "workerTemplate": {"metadata": {"labels": _labels(name, role="worker")},
                                   "spec": _pod_spec(launch, worker_args, per_node,
                                                     probes=mn.worker_serves_http)}}}}
    # The LWS controller makes a headless Service named like the set (the pods' subdomain):
    # the API Service needs a name of its own.
    service = {"apiVersion": "v1", "kind": "Service",
               "metadata": {"name": f"{name}-api", "labels": _labels(name)},
               "spec": {"selector": {LWS_NAME_LABEL: name, "role": "leader"},
                        "ports": svc_port}}
    return [lws, service, *_claims(launch)]


def emit_k8s(launch: Launch, dir: Path, *, gpus_per_node: int) -> list[Path]:
    """One file a manifest under dir: `kubectl apply -f dir`. A LeaderWorkerSet needs the LWS
    controller installed (kubernetes-sigs/lws)."""
    docs = k8s_docs(launch, gpus_per_node=gpus_per_node)
    notes = ("# A Pod spec has no ulimits: " + ", ".join(
        f"{n}={s}" for n, s, _h in launch.ulimits) + " (what `docker run` passes) come from the "
        "node's container runtime.\n") if launch.ulimits else ""
    if launch.gpus:
        notes += ("# The GPUs come from the NVIDIA device plugin (nvidia.com/gpu); a node whose "
                  "default runtime is not nvidia\n# needs runtimeClassName: nvidia on the pod "
                  "(the GPU Operator creates that RuntimeClass).\n")
    if launch.pass_env:
        notes += (f"# {', '.join(launch.pass_env)}: from the Secret {_k8s_name(launch.name)}-env "
                  "when it exists (kubectl create secret generic ... --from-literal=NAME=VALUE).\n")
    if not launch.image_digest:
        notes += "# The image is named by tag: pass the pushed image's digest to pin it.\n"
    if launch.root_only:
        notes += ("# This image runs as root only (" + " ".join(launch.root_only.split())[:300]
                  + "):\n# these manifests meet the baseline Pod Security standard, not "
                  "restricted; a restricted namespace refuses them.\n")
    out: list[Path] = []
    for doc in docs:
        path = Path(dir) / f"{doc['metadata']['name']}-{doc['kind'].lower()}.yaml"
        extra = ""
        if doc["kind"] == "LeaderWorkerSet":
            extra = ("# A LeaderWorkerSet (kubernetes-sigs/lws, its controller must be "
                     f"installed): {doc['spec']['leaderWorkerTemplate']['size']} pods, one a "
                     "node; the leader serves HTTP.\n")
        _write(path, _header(launch, "kubectl apply -f " + str(Path(dir)))
                          + extra + notes + _dump(doc))
        out.append(path)
    return out


def _header(launch: Launch, how: str) -> str:
    return (f"# Generated by imgbuild: {launch.target} ({launch.engine}) serving {launch.model}.\n"
            f"# Start: {how}\n"
            f"# Ready when GET {launch.health_path} and {launch.models_path} answer 200 on port "
            f"{launch.port}.\n")


def _write(path: Path, text: str) -> None:
    try:
        atomic_write_text(path, text)
    except OSError as e:
        raise cannot_write(path, e, "a launch file") from None


class _Dumper(yaml.SafeDumper):
    """Every value written out where it is used: no &anchors / *aliases for a reader to chase
    (a probe and its twin share one dict here)."""

    def ignore_aliases(self, data: Any) -> bool:
        return True


def _dump(doc: dict[str, Any]) -> str:
    return yaml.dump(doc, Dumper=_Dumper, sort_keys=False, default_flow_style=False, width=100)
