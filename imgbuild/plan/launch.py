"""The container a serving engine runs in, as one value (Launch), and the three ways to start it:
the `docker run` line (`imgbuild run`, and --dry-run prints it), a compose file, Kubernetes
manifests. Pure: the engine facts are images/checks/launch.yaml's (catalog/launch.py), the
model's the profile's, the image the Plan's; nothing here talks to Docker or a cluster.
"""

from __future__ import annotations

import math
import re
import shlex
import textwrap
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from ..catalog.checkpoints import checkpoint_dir, local_checkpoint
from ..catalog.launch import LaunchTable, MultiNode, Rdma, WriteDir
from ..catalog.models import ModelProfile, checkpoint_kind
from ..errors import InputError
from .labels import ANY_USER, RUN_ENV
from .manifests import dump, write
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
# A tmpfs a read-only run mounts: exec, because Docker's bare `--tmpfs /tmp` is noexec and every
# JIT compiler (torch cpp_extension, FlashInfer, DeepGEMM, Triton) dlopens the .so it just built
# from under HOME=/tmp/home ("failed to map segment from shared object" otherwise).
TMPFS_OPTIONS = "rw,exec,nosuid,nodev"


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
    # The OCI platforms `image` runs on (linux/ARCH): its own, or, for a multi-platform
    # target's index, each of its images'. A cluster schedules the pod only onto nodes of these
    # archs: an amd64 image on an arm64 node (a Grace Blackwell one) fails with "exec format
    # error" after the pull. (): not known, no constraint.
    platforms: tuple[str, ...] = ()
    model_size_gb: float | None = None  # the profile's weights: what a cache claim must hold
    root_only: str | None = None  # why the image runs as root only (its target's smoke.root_only)
    # What the image sets (HOME=/tmp/home ...: plan/labels.py RUN_ENV): where the caches resolve.
    image_env: tuple[tuple[str, str], ...] = ()
    # Every directory the engine writes (images/checks/launch.yaml writable.dirs).
    write_dirs: tuple[WriteDir, ...] = ()
    read_only: bool = False  # --read-only: a read-only root, the tmpfs below writable
    tmpfs: tuple[str, ...] = ()  # mounted rw,exec,nosuid,nodev (TMPFS_OPTIONS)
    env_set_by: tuple[tuple[str, str], ...] = ()  # (variable, who set it) for messages

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
        if self.read_only:
            args.append("--read-only")
        for path in self.tmpfs:
            args += ["--tmpfs", f"{path}:{TMPFS_OPTIONS}"]
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

    @property
    def container_env(self) -> dict[str, str]:
        """What the server sees: the image's env, then what the launch sets over it."""
        return dict(self.image_env) | dict(self.env)

    def mounts(self) -> tuple[tuple[str, bool], ...]:
        """(path in the container, writable) of every mount: the volumes and the tmpfs."""
        return tuple((c, m == "rw") for _h, c, m in self.volumes) + \
            tuple((t, True) for t in self.tmpfs)


# --- where the server writes ----------------------------------------------------------------

@dataclass(frozen=True)
class WriteTarget:
    """One directory the engine writes, resolved in the container, and what covers it."""

    env: str  # the variable that names it
    path: str
    set_by: str  # who set the variable ("the image", "--env", ...), or "its default"
    mount: str | None  # the mount it lies on (longest prefix), None: the root filesystem
    writable: bool  # what that mount (or the root) allows


def _under(path: str, mount: str) -> bool:
    m = mount.rstrip("/") or "/"
    return m == "/" or path == m or path.startswith(m + "/")


def resolve_write_dirs(env: dict[str, str], dirs: tuple[WriteDir, ...]) -> list[tuple[str, str]]:
    """(variable, path) of every directory, as the engine resolves it: its variable when set,
    else its default ("~" is HOME; "{VAR}" an entry above, or a variable such as USER)."""
    home = env.get("HOME") or "/root"
    seen: dict[str, str] = {}
    out = []
    for d in dirs:
        if env.get(d.env):
            path = env[d.env]
        else:
            path = home + d.default[1:] if d.default.startswith("~") else d.default
            path = re.sub(r"\{([A-Za-z_][A-Za-z0-9_]*)\}",
                          lambda m: seen.get(m.group(1)) or env.get(m.group(1)) or "user", path)
        path = "/" + "/".join(p for p in path.split("/") if p not in ("", "."))
        seen[d.env] = path
        out.append((d.env, path))
    return out


def write_targets(env: dict[str, str], dirs: tuple[WriteDir, ...],
                  mounts: tuple[tuple[str, bool], ...], *, root_writable: bool,
                  set_by: dict[str, str] | None = None) -> list[WriteTarget]:
    """Where each directory the engine writes lands: on which mount, and whether it can be
    written there. Pure: the container's env, the engine's directories and the mounts."""
    set_by = set_by or {}
    out = []
    for var, path in resolve_write_dirs(env, dirs):
        on = [(m, w) for m, w in mounts if _under(path, m)]
        mount, writable = max(on, key=lambda mw: len(mw[0])) if on else (None, root_writable)
        who = set_by.get(var, "the image" if var in env else "its default")
        out.append(WriteTarget(var, path, who, mount, writable))
    return out


def unwritable_dirs(launch: Launch) -> list[WriteTarget]:
    """The directories the engine writes that a read-only run leaves unwritable (empty: none,
    or the root is writable)."""
    return [t for t in write_targets(launch.container_env, launch.write_dirs, launch.mounts(),
                                     root_writable=not launch.read_only,
                                     set_by=dict(launch.env_set_by)) if not t.writable]


def refuse_unwritable(launch: Launch, *, how: str = "--read-only",
                      bad: list[WriteTarget] | None = None) -> None:
    """InputError (exit 2) when a read-only run would leave a JIT or cache directory
    unwritable: the server would start and fail at its first compile or download."""
    if launch.read_only and launch.root_only:
        # Its target says it writes beside its own files: no list of directories covers that.
        raise InputError(f"cannot run {launch.name} {how}: the image writes to its root "
                         "filesystem",
                         facts=[f"target {launch.target}: smoke.root_only: "
                                + " ".join(launch.root_only.split())[:300],
                                "nothing was started"],
                         hint="run it without --read-only")
    bad = unwritable_dirs(launch) if bad is None else bad
    if not bad:
        return
    facts = []
    for t in bad:
        where = f"the read-only mount {t.mount}" if t.mount else "the read-only root"
        facts.append(f"{t.env} is not set: its default {t.path} lies on {where}"
                     if t.set_by == "its default" else
                     f"{t.env}={t.path} (set by {t.set_by}) lies on {where}")
    writable = ", ".join([*launch.tmpfs, *(c for _h, c, m in launch.volumes if m == "rw")])
    moved = [t.env for t in bad if t.set_by == "--env"]
    raise InputError(
        f"cannot run {launch.name} {how}: {len(bad)} director"
        + ("y" if len(bad) == 1 else "ies") + " the server writes would be read-only",
        facts=facts + [f"writable in the container: {writable or 'nothing'}",
                       "nothing was started"],
        hint=(f"drop --env {', '.join(moved)}, or point " if moved else "point ")
             + ", ".join(dict.fromkeys(t.env for t in bad)) + " under "
             + (launch.tmpfs[0] if launch.tmpfs else "a writable mount")
             + (" with --env" if how == "--read-only" else "")
             + ("; or run without --read-only" if how == "--read-only" else ""))


def read_only(launch: Launch, tmpfs: tuple[str, ...]) -> Launch:
    """The Launch on a read-only root, with each of `tmpfs` mounted writable and exec."""
    return replace(launch, read_only=True, tmpfs=tuple(dict.fromkeys(tmpfs)))


def with_env(launch: Launch, pairs: tuple[tuple[str, str], ...], who: str) -> Launch:
    """The Launch with these variables set over the ones it has (`who` set them)."""
    env = dict(launch.env) | dict(pairs)
    by = dict(launch.env_set_by) | {k: who for k, _v in pairs}
    return replace(launch, env=tuple(env.items()), env_set_by=tuple(by.items()))


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
                f"cannot serve from {plan.target}: {what}, and the image carries "
                + (f"only its smoke model '{plan.smoke_model}'" if plan.smoke_model
                   else "no model"),
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
    # Who set each variable, for a message that names it.
    set_by = tuple((k, f"{table.source}: engines.{plan.engine}.env") for k, _v in eng.env)
    if source == "hub":
        set_by += ((src.hf_cache_env, "the model cache's mount"),)
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
        image_digest=digest, platforms=(plan.platform,), root_only=plan.root_only,
        image_env=RUN_ENV,
        write_dirs=table.write_dirs(plan.engine),
        env_set_by=set_by)


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
    if launch.read_only:
        svc["read_only"] = True
    if launch.tmpfs:
        # exec: a bare tmpfs is noexec, and the engines' JIT kernels are loaded from it.
        svc["tmpfs"] = [f"{t}:{TMPFS_OPTIONS}" for t in launch.tmpfs]
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
    write(out, head + dump(compose_doc(launch)))
    return [out]


# --- Kubernetes -----------------------------------------------------------------------------

@dataclass(frozen=True)
class Cluster:
    """What the cluster the manifests are for gives a pod beyond the standard: GKE's driver
    paths (--gke), RDMA for a multi-node server (--rdma; None: none)."""

    gke_env: tuple[tuple[str, str], ...] = ()  # set on the server container (empty: not GKE)
    rdma: Rdma | None = None

    @property
    def gke(self) -> bool:
        return bool(self.gke_env)


def cluster_for(table: LaunchTable, *, gke: bool = False, rdma: bool = False,
                rdma_resource: str | None = None,
                nccl: tuple[tuple[str, str], ...] = ()) -> Cluster:
    """The Cluster the options describe, on images/checks/launch.yaml's defaults: --gke, and
    --rdma with its resource and NCCL variables ("" drops one)."""
    if not rdma and (rdma_resource is not None or nccl):
        raise InputError("--rdma-resource and the --nccl-* options go with --rdma",
                         hint="add --rdma (a multi-node server over InfiniBand or RoCE), or "
                              "drop them")
    r = None
    if rdma:
        res = rdma_resource or table.rdma.resource
        if not re.fullmatch(r"[a-z0-9.-]+/[A-Za-z0-9._-]+", res):
            raise InputError(f"--rdma-resource {res}: not an extended resource name",
                             hint="DOMAIN/NAME, as the RDMA device plugin advertises it "
                                  "(`kubectl describe node`: rdma/ib, rdma/rdma_shared_device_a)")
        env = dict(table.rdma.env) | dict(nccl)
        r = Rdma(res, table.rdma.capabilities, tuple(env.items()))
    return Cluster(gke_env=table.gke_env if gke else (), rdma=r)


# /tmp is an emptyDir in every pod: HOME and the caches of the image are under it.
K8S_TMP = "/tmp"

def _k8s_name(name: str) -> str:
    """A DNS-1123 label: lowercase letters, digits and '-'; short enough that LWS pod names
    (<name>-<group>-<worker>) stay within 63."""
    s = re.sub(r"[^a-z0-9-]+", "-", name.lower()).strip("-")[:50].rstrip("-")
    return s or "imgbuild"


def _quantity(docker_size: str) -> str:
    """Docker's binary units (32g = 32 GiB) as a Kubernetes quantity."""
    n, unit = re.match(r"^([0-9]+)([bkmg]?)$", docker_size, re.IGNORECASE).groups()  # type: ignore[union-attr]
    return n + {"": "", "b": "", "k": "Ki", "m": "Mi", "g": "Gi"}[unit.lower()]


def _container(launch: Launch, args: list[str], gpus: int, *, probes: bool,
               cluster: Cluster | None = None, rdma: bool = False,
               cache_dirs: tuple[tuple[str, str], ...] = ()) -> dict[str, Any]:
    """The server container. probes: it serves HTTP (not an LWS worker whose engine serves none:
    no port, no probes). rdma: it talks to the other nodes over InfiniBand / RoCE."""
    cluster = cluster or Cluster()
    c: dict[str, Any] = {"name": "server", "image": launch.pinned_image,
                         "imagePullPolicy": "IfNotPresent", "args": args}
    if probes:
        c["ports"] = [{"name": "http", "containerPort": launch.port}]
    env: list[dict[str, Any]] = [{"name": k, "value": v} for k, v in launch.env]
    # GKE mounts the node driver's libraries at /usr/local/nvidia/lib64 and names them nowhere
    # (vLLM: "NVML Shared Library Not Found" without it).
    env += [{"name": k, "value": v} for k, v in cluster.gke_env]
    if rdma and cluster.rdma:
        env += [{"name": k, "value": v} for k, v in cluster.rdma.env if v]
    # A secret the caller's environment would give docker comes from a Secret here; optional,
    # so a model that needs none starts without it.
    env += [{"name": k, "valueFrom": {"secretKeyRef": {
        "name": _k8s_name(launch.name) + "-env", "key": k, "optional": True}}}
        for k in launch.pass_env]
    if env:
        c["env"] = env
    if gpus:
        c["resources"] = {"limits": {"nvidia.com/gpu": gpus}}
    if rdma and cluster.rdma:
        # The RDMA device plugin's resource: the IB devices (/dev/infiniband) in the pod.
        c.setdefault("resources", {"limits": {}})["limits"][cluster.rdma.resource] = 1
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
    if rdma and cluster.rdma and cluster.rdma.capabilities:
        # Verbs pin (register) the memory NCCL sends from: IPC_LOCK, or the memlock limit.
        c["securityContext"]["capabilities"] = {
            "drop": ["ALL"], "add": list(cluster.rdma.capabilities)}
    mounts = [{"name": "tmp", "mountPath": K8S_TMP}]
    mounts += [{"name": n, "mountPath": path} for n, path in cache_dirs]
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


def k8s_cache_dirs(launch: Launch) -> tuple[tuple[str, str], ...]:
    """(volume name, path) of an emptyDir for every directory the engine writes that the pod's
    mounts (/tmp, /dev/shm, the claims) leave on its read-only root: the same decision as
    `run --read-only`. A directory on a read-only claim is refused (exit 2). Empty for a
    root-only image, whose root is writable."""
    if launch.root_only:
        return ()
    pod = replace(launch, read_only=True,
                  tmpfs=(K8S_TMP, *(("/dev/shm",) if launch.shm_size else ())))
    bad = unwritable_dirs(pod)
    on_claims = [t for t in bad if t.mount is not None]
    if on_claims:  # an emptyDir over a read-only claim's directory cannot be made
        refuse_unwritable(pod, how="in Kubernetes", bad=on_claims)
    out: list[tuple[str, str]] = []
    for t in sorted(bad, key=lambda t: t.path):
        if not any(_under(t.path, p) for _n, p in out):  # a parent's emptyDir holds it
            out.append((_k8s_name("cache-" + t.env.replace("_", "-")), t.path))
    return tuple(out)


def _pod_spec(launch: Launch, args: list[str], gpus: int, *, probes: bool,
              cluster: Cluster | None = None, rdma: bool = False) -> dict[str, Any]:
    cluster = cluster or Cluster()
    # /tmp: HOME and every cache and JIT directory of the image (io.imgbuild.writable); one more
    # emptyDir for each directory the engine writes that the launch moved elsewhere.
    caches = k8s_cache_dirs(launch)
    vols: list[dict[str, Any]] = [{"name": "tmp", "emptyDir": {}}]
    vols += [{"name": n, "emptyDir": {}} for n, _p in caches]
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
        "containers": [_container(launch, args, gpus, probes=probes, cluster=cluster,
                                  rdma=rdma, cache_dirs=caches)]}
    if vols:
        spec["volumes"] = vols
    spec |= node_archs(launch.platforms)
    return spec


def node_archs(platforms: tuple[str, ...]) -> dict[str, Any]:
    """The pod spec's constraint to nodes that can run the image: one arch, a nodeSelector on
    the well-known label kubernetes.io/arch; an index's several, a required node affinity
    naming them; none known, nothing."""
    archs = sorted({p.split("/")[1] for p in platforms if "/" in p})
    if not archs:
        return {}
    if len(archs) == 1:
        return {"nodeSelector": {"kubernetes.io/arch": archs[0]}}
    return {"affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
        "nodeSelectorTerms": [{"matchExpressions": [
            {"key": "kubernetes.io/arch", "operator": "In", "values": archs}]}]}}}}


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


def k8s_docs(launch: Launch, *, gpus_per_node: int,
             cluster: Cluster | None = None) -> list[dict[str, Any]]:
    """The manifests: a Deployment and a Service, or, when the model's tensor parallelism spans
    more GPUs than one node has, a LeaderWorkerSet (one pod a node) and a Service on its
    leader. cluster: GKE's driver paths, RDMA between the nodes (a LeaderWorkerSet only)."""
    cluster = cluster or Cluster()
    if gpus_per_node < 1:
        raise InputError(f"--gpus-per-node {gpus_per_node}: expected at least 1",
                         hint="pass the number of GPUs one node of the cluster has, e.g. "
                              "--gpus-per-node 8 (the default)")
    name = _k8s_name(launch.name)
    tp = launch.tensor_parallel if launch.gpus else 0
    base = list(launch.command)
    svc_port = [{"name": "http", "port": launch.port, "targetPort": "http"}]
    if tp <= gpus_per_node:
        if cluster.rdma is not None:
            raise InputError(f"--rdma: {launch.model} runs on one node (tensor parallel {tp}, "
                             f"--gpus-per-node {gpus_per_node}), where NCCL needs no network",
                             facts=["a Deployment, not a LeaderWorkerSet, would be written"],
                             hint="drop --rdma, or give the nodes' real --gpus-per-node")
        labels = _labels(name)
        deploy = {
            "apiVersion": "apps/v1", "kind": "Deployment",
            "metadata": {"name": name, "labels": labels},
            "spec": {"replicas": 1, "selector": {"matchLabels": {"app.kubernetes.io/name": name}},
                     # Recreate: a rolling update would hold two servers' GPUs at once.
                     "strategy": {"type": "Recreate"},
                     "template": {"metadata": {"labels": labels},
                                  "spec": _pod_spec(launch, base, tp, probes=True,
                                                    cluster=cluster)}}}
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
    rdma = cluster.rdma is not None
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
                                                     probes=True, cluster=cluster,
                                                     rdma=rdma)},
                "workerTemplate": {"metadata": {"labels": _labels(name, role="worker")},
                                   "spec": _pod_spec(launch, worker_args, per_node,
                                                     probes=mn.worker_serves_http,
                                                     cluster=cluster, rdma=rdma)}}}}
    # The LWS controller makes a headless Service named like the set (the pods' subdomain):
    # the API Service needs a name of its own.
    service = {"apiVersion": "v1", "kind": "Service",
               "metadata": {"name": f"{name}-api", "labels": _labels(name)},
               "spec": {"selector": {LWS_NAME_LABEL: name, "role": "leader"},
                        "ports": svc_port}}
    return [lws, service, *_claims(launch)]


def emit_k8s(launch: Launch, dir: Path, *, gpus_per_node: int,
             cluster: Cluster | None = None) -> list[Path]:
    """One file a manifest under dir: `kubectl apply -f dir`. A LeaderWorkerSet needs the LWS
    controller installed (kubernetes-sigs/lws)."""
    cluster = cluster or Cluster()
    docs = k8s_docs(launch, gpus_per_node=gpus_per_node, cluster=cluster)
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
    if len(launch.platforms) > 1:
        notes += (f"# {launch.image} is a multi-platform index ({', '.join(launch.platforms)}): "
                  "each node pulls its own\n# platform's image from it; the pods go to nodes of "
                  "those archs only (kubernetes.io/arch).\n")
    elif launch.platforms:
        notes += (f"# The image is {launch.platforms[0]} only: the pods go to nodes of that arch "
                  "(kubernetes.io/arch).\n")
    notes += _writes_note(launch)
    if cluster.gke:
        notes += ("# GKE: the node driver's libraries are mounted at /usr/local/nvidia/lib64 and "
                  "named nowhere,\n# so " + ", ".join(f"{k}={v}" for k, v in cluster.gke_env)
                  + " is set (replacing the image's); nvidia-smi is\n"
                  "# /usr/local/nvidia/bin/nvidia-smi (PATH is left as the image sets it).\n")
    if cluster.rdma is not None:
        r = cluster.rdma
        said = [f"RDMA between the nodes: the cluster must run an RDMA device plugin that "
                f"advertises {r.resource} (k8s-rdma-shared-dev-plugin, or the NVIDIA Network "
                "Operator) on nodes with InfiniBand or RoCE NICs."]
        said += [f"{k}={v}: {RDMA_ENV_NOTES.get(k, 'set')}." for k, v in r.env if v]
        said += [f"{k} unset: {RDMA_UNSET_NOTES.get(k, 'the default')}." for k, v in r.env
                 if not v]
        said += [f"{', '.join(r.capabilities)} lets verbs pin memory: the manifests meet the "
                 "privileged Pod Security standard, not restricted or baseline."]
        notes += "".join(f"# {line}\n" for text in said for line in textwrap.wrap(text, 96))
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
        write(path, _header(launch, "kubectl apply -f " + str(Path(dir)))
              + extra + notes + dump(doc))
        out.append(path)
    return out


# What each NCCL variable asks of the cluster, for the manifests' header.
RDMA_ENV_NOTES = {
    "NCCL_IB_HCA": "the HCAs NCCL uses (a prefix); the nodes' names: `ibv_devices`",
    "NCCL_IB_GID_INDEX": "RoCE's GID index on every node (`show_gids`); a wrong one fails "
                         "\"ibv_modify_qp failed with error No such device\"",
    "NCCL_SOCKET_IFNAME": "the pod's interface for NCCL's bootstrap",
}
RDMA_UNSET_NOTES = {
    "NCCL_IB_GID_INDEX": "NCCL picks RoCE's GID index; pass --nccl-ib-gid-index N where it "
                         "picks a wrong one (\"ibv_modify_qp failed with error No such "
                         "device\")",
}


def _writes_note(launch: Launch) -> str:
    """Where the directories the engine writes land in the pod, in one header line."""
    if launch.root_only or not launch.write_dirs:
        return ""
    caches = dict((p, n) for n, p in k8s_cache_dirs(launch))
    pod = replace(launch, read_only=True, tmpfs=(K8S_TMP,))
    ts = write_targets(pod.container_env, pod.write_dirs, pod.mounts(), root_writable=False)
    on: dict[str, list[str]] = {}
    for t in ts:
        m = t.mount or next((p for p in caches if _under(t.path, p)), t.path)
        on.setdefault(m, []).append(t.env)
    text = "Written by the server (the root is read-only): " + "; ".join(
        f"{m}: {', '.join(v)}" for m, v in on.items()) + "."
    return "".join(f"# {line}\n" for line in textwrap.wrap(text, 96))


def _header(launch: Launch, how: str) -> str:
    return (f"# Generated by imgbuild: {launch.target} ({launch.engine}) serving {launch.model}.\n"
            f"# Start: {how}\n"
            f"# Ready when GET {launch.health_path} and {launch.models_path} answer 200 on port "
            f"{launch.port}.\n")
