"""How each engine's server is started in a container (images/checks/launch.yaml): its command
line, port, health and model-list paths, the log lines that mark its start-up phases, what the
container needs from the host (GPUs, shared memory, ulimits), how one server spans nodes, and
where the model comes from inside the container. Validated here, so imgbuild/plan/launch.py
only assembles."""

from __future__ import annotations

import re
import string
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from ..errors import SpecError
from .schema import Doc, read_table
from .targets import ENGINES

LAUNCH_FILES = ("checks/launch.yaml",)
# The start-up phases a server's log may mark, in the order they happen.
PHASES = ("loading", "loaded", "graphs", "ready")
# What `docker run --ulimit` knows (the Engine's list; a Pod spec has none).
ULIMITS = ("core", "cpu", "data", "fsize", "locks", "memlock", "msgqueue", "nice", "nofile",
           "nproc", "rss", "rtprio", "rttime", "sigpending", "stack")
COMMAND_FIELDS = {"model", "port"}
MULTI_NODE_FIELDS = {"nnodes", "node_rank", "leader"}
# Docker's size syntax for --shm-size: a number and an optional unit (b, k, m, g; binary).
SIZE = re.compile(r"^([0-9]+)([bkmg]?)$", re.IGNORECASE)
ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


@dataclass(frozen=True)
class MultiNode:
    """How one server spans several nodes: flags on every node ({nnodes} {node_rank} {leader}
    in them), flags on the workers only, and whether a worker serves HTTP."""

    flags: tuple[str, ...]
    worker_flags: tuple[str, ...] = ()
    worker_serves_http: bool = False


@dataclass(frozen=True)
class EngineLaunch:
    engine: str
    command: tuple[str, ...]  # argv template: {model}, {port}
    port: int
    health_path: str
    models_path: str
    ready_paths: tuple[str, ...]
    phases: tuple[tuple[str, str], ...]  # (phase, regex), in PHASES order
    gpus: bool
    ipc_host: bool
    shm_size: str | None
    ulimits: tuple[tuple[str, int, int], ...]  # (name, soft, hard); -1 unlimited
    env: tuple[tuple[str, str], ...]
    pass_env: tuple[str, ...]
    startup_timeout_s: int
    revision_flag: str | None = None
    multi_node: MultiNode | None = None
    evidence: tuple[str, ...] = ()


@dataclass(frozen=True)
class ModelSources:
    """Where a model is inside the container: a hub id through the mounted Hugging Face cache,
    a local checkpoint mounted read-only under `local`, the image's own smoke model."""

    hf_cache_host: str  # the default host cache ("~" is the user's home)
    hf_cache_container: str
    hf_cache_env: str  # the variable that points the engine at the mounted cache (HF_HOME)
    local: str
    smoke_model: str


@dataclass(frozen=True)
class WriteDir:
    """A directory written at run time: the variable that names it, else its default ("~/x"
    under HOME, "{VAR}/x" under another entry's directory, or an absolute path)."""

    env: str
    default: str
    engines: tuple[str, ...] = ()  # empty: every engine

    def for_engine(self, engine: str) -> bool:
        return not self.engines or engine in self.engines


@dataclass(frozen=True)
class Writable:
    """Where a serving container writes: the tmpfs mounts of a read-only run (each with exec)
    and every directory the engines write."""

    tmpfs: tuple[str, ...]
    dirs: tuple[WriteDir, ...]


@dataclass(frozen=True)
class Rdma:
    """A multi-node server over InfiniBand / RoCE: the device plugin's resource, the
    capabilities verbs need, and the NCCL variables' defaults ("" leaves one unset)."""

    resource: str
    capabilities: tuple[str, ...]
    env: tuple[tuple[str, str], ...]


@dataclass(frozen=True)
class LaunchTable:
    engines: dict[str, EngineLaunch] = field(hash=False)
    models: ModelSources
    source: str = ""  # the file it was read from, as messages name it
    # The directory a relative local checkpoint is read from: the one that holds the top
    # layer's images/ (catalog/checkpoints.py checkpoint_dir does the same).
    project_root: Path | None = None
    writable: Writable = Writable(("/tmp",), (WriteDir("HOME", "~"),))
    gke_env: tuple[tuple[str, str], ...] = ()  # set on the engine container on GKE (--gke)
    rdma: Rdma = Rdma("rdma/ib", ("IPC_LOCK",), ())

    def write_dirs(self, engine: str) -> tuple[WriteDir, ...]:
        return tuple(d for d in self.writable.dirs if d.for_engine(engine))

    def engine(self, name: str) -> EngineLaunch:
        if name not in self.engines:
            raise SpecError(self.source, f"engines.{name}", "a launch entry for every engine a "
                            "target can name: " + ", ".join(ENGINES), "(missing)")
        return self.engines[name]


def _path(doc: Doc, key: str) -> str:
    v = doc.get(key, str, what="an absolute path such as /health")
    if not v.startswith("/") or any(c.isspace() for c in v):
        raise SpecError(doc.path, doc.key(key), "an absolute path such as /health, no spaces", v)
    return v


def _template(doc: Doc, key: str, allowed: set[str], *, default=...) -> tuple[str, ...]:
    """A list of argv words whose {fields} are all among `allowed` (a misspelt {modle} is an
    error here, not a KeyError when a container is started)."""
    words = doc.str_list(key, default=default)
    for i, w in enumerate(words):
        try:
            names = {f for _, f, _, _ in string.Formatter().parse(w) if f is not None}
        except ValueError as e:
            raise SpecError(doc.path, f"{doc.key(key)}[{i}]", "a word whose braces are {field}s "
                            "(write {{ for a literal brace)", f"{w!r} ({e})") from None
        bad = sorted(n for n in names if n not in allowed)
        if bad:
            raise SpecError(doc.path, f"{doc.key(key)}[{i}]", "only the fields "
                            + ", ".join("{" + a + "}" for a in sorted(allowed)), w)
    return words


def _ulimits(doc: Doc) -> tuple[tuple[str, int, int], ...]:
    ud = doc.sub("ulimits", doc.get("ulimits", dict, {}))
    out = []
    for name, raw in ud.data.items():
        key = ud.key(str(name))
        if name not in ULIMITS:
            raise SpecError(doc.path, key, "a ulimit docker knows: " + ", ".join(ULIMITS), name)
        if isinstance(raw, dict):
            vd = ud.sub(str(name), raw)
            vd.reject_unknown({"soft", "hard"})
            soft, hard = vd.get("soft", int), vd.get("hard", int)
        elif isinstance(raw, int) and not isinstance(raw, bool):
            soft = hard = raw
        else:
            raise SpecError(doc.path, key, "an integer (-1: unlimited) or {soft: N, hard: N}", raw)
        for v in (soft, hard):
            if v < -1:
                raise SpecError(doc.path, key, "-1 (unlimited) or a value >= 0", v)
        if hard != -1 and (soft == -1 or soft > hard):
            raise SpecError(doc.path, key, "soft <= hard (-1 is unlimited)", raw)
        out.append((str(name), soft, hard))
    return tuple(out)


def _phases(doc: Doc) -> tuple[tuple[str, str], ...]:
    pd = doc.sub("phases", doc.get("phases", dict))
    pd.reject_unknown(set(PHASES))
    if "ready" not in pd.data:
        raise SpecError(doc.path, pd.key("ready"), "the log line that says the server is ready "
                        "(required: the other phases are optional)")
    out = []
    for name in PHASES:
        if name not in pd.data:
            continue
        rx = pd.get(name, str, what="a regular expression (Python re) in quotes")
        try:
            re.compile(rx)
        except re.error as e:
            raise SpecError(doc.path, pd.key(name), "a valid Python regular expression",
                            f"{rx!r} ({e})") from None
        out.append((name, rx))
    return tuple(out)


def _multi_node(doc: Doc) -> MultiNode | None:
    if doc.data.get("multi_node") is None:
        return None
    md = doc.sub("multi_node", doc.get("multi_node", dict))
    md.reject_unknown({"flags", "worker_flags", "worker_serves_http"})
    flags = _template(md, "flags", MULTI_NODE_FIELDS)
    used = {f for w in flags for _, f, _, _ in string.Formatter().parse(w) if f}
    missing = sorted(MULTI_NODE_FIELDS - used)
    if missing:
        # A node that is not told its rank, the group size or the leader joins nothing.
        raise SpecError(doc.path, md.key("flags"), "flags that use every one of "
                        + ", ".join("{" + f + "}" for f in sorted(MULTI_NODE_FIELDS)),
                        "no " + ", ".join("{" + f + "}" for f in missing))
    return MultiNode(flags, _template(md, "worker_flags", MULTI_NODE_FIELDS, default=()),
                     md.get("worker_serves_http", bool, False))


def _engine(name: str, doc: Doc) -> EngineLaunch:
    doc.reject_unknown({"command", "revision_flag", "port", "health", "models", "ready",
                        "phases", "gpus", "ipc_host", "shm_size", "ulimits", "env", "pass_env",
                        "startup_timeout_s", "multi_node", "evidence"})
    command = _template(doc, "command", COMMAND_FIELDS, default=...)
    if not command:
        raise SpecError(doc.path, doc.key("command"), "the server's argv (a non-empty list)", [])
    if not any("{model}" in w for w in command):
        raise SpecError(doc.path, doc.key("command"), "a command that names {model} (what the "
                        "server loads)", list(command))
    port = doc.get("port", int)
    if not 1 <= port <= 65535:
        raise SpecError(doc.path, doc.key("port"), "a TCP port, 1-65535", port)
    health, models = _path(doc, "health"), _path(doc, "models")
    rd = doc.str_list("ready", default=(health, models))
    for i, p in enumerate(rd):
        if not p.startswith("/"):
            raise SpecError(doc.path, f"{doc.key('ready')}[{i}]", "an absolute path", p)
    shm = doc.get("shm_size", str, None)
    if shm is not None and not SIZE.match(shm):
        raise SpecError(doc.path, doc.key("shm_size"), "a size in Docker's units, e.g. 32g "
                        "(b, k, m, g: binary)", shm)
    ed = doc.sub("env", doc.get("env", dict, {}))
    env = []
    for k in ed.data:
        if not ENV_NAME.match(str(k)):
            raise SpecError(doc.path, ed.key(str(k)), "an environment variable name", k)
        env.append((str(k), ed.get(str(k), str, what="a string in quotes")))
    pass_env = doc.str_list("pass_env")
    for i, k in enumerate(pass_env):
        if not ENV_NAME.match(k):
            raise SpecError(doc.path, f"{doc.key('pass_env')}[{i}]", "an environment variable "
                            "name", k)
    timeout = doc.get("startup_timeout_s", int)
    if timeout < 1:
        raise SpecError(doc.path, doc.key("startup_timeout_s"), "a positive number of seconds",
                        timeout)
    rev = doc.get("revision_flag", str, None)
    if rev is not None and not rev.startswith("-"):
        raise SpecError(doc.path, doc.key("revision_flag"), "a flag such as --revision", rev)
    return EngineLaunch(
        engine=name, command=command, port=port, health_path=health, models_path=models,
        ready_paths=rd, phases=_phases(doc), gpus=doc.get("gpus", bool),
        ipc_host=doc.get("ipc_host", bool, False), shm_size=shm, ulimits=_ulimits(doc),
        env=tuple(env), pass_env=pass_env, startup_timeout_s=timeout, revision_flag=rev,
        multi_node=_multi_node(doc), evidence=doc.str_list("evidence"))


def _models(doc: Doc) -> ModelSources:
    md = doc.sub("models", doc.get("models", dict))
    md.reject_unknown({"hf_cache", "local", "smoke_model"})
    hd = md.sub("hf_cache", md.get("hf_cache", dict))
    hd.reject_unknown({"host", "container", "env"})
    env = hd.get("env", str)
    if not ENV_NAME.match(env):
        raise SpecError(doc.path, hd.key("env"), "an environment variable name", env)
    host = hd.get("host", str)
    if not host.startswith(("/", "~")):
        raise SpecError(doc.path, hd.key("host"), "an absolute path or one under ~", host)
    return ModelSources(host, _path(hd, "container"), env, _path(md, "local"),
                        _path(md, "smoke_model"))


def _env_map(doc: Doc, key: str) -> tuple[tuple[str, str], ...]:
    ed = doc.sub(key, doc.get(key, dict, {}))
    out = []
    for k in ed.data:
        if not ENV_NAME.match(str(k)):
            raise SpecError(doc.path, ed.key(str(k)), "an environment variable name", k)
        v = ed.data[k]
        if v is None:
            v = ""
        if not isinstance(v, str):
            raise SpecError(doc.path, ed.key(str(k)), "a string in quotes", v)
        out.append((str(k), v))
    return tuple(out)


# A default's reference to another directory's variable: {XDG_CACHE_HOME}/vllm.
_REF = re.compile(r"\{([A-Za-z_][A-Za-z0-9_]*)\}")


def _writable(doc: Doc) -> Writable:
    wd = doc.sub("writable", doc.get("writable", dict))
    wd.reject_unknown({"tmpfs", "dirs"})
    tmpfs = wd.str_list("tmpfs")
    for i, t in enumerate(tmpfs):
        if not t.startswith("/") or ":" in t or any(c.isspace() for c in t):
            raise SpecError(doc.path, f"{wd.key('tmpfs')}[{i}]", "an absolute path in the "
                            "container, no options (imgbuild adds rw,exec,nosuid,nodev)", t)
    raw = wd.get("dirs", list)
    dirs: list[WriteDir] = []
    for i, item in enumerate(raw):
        dd = wd.sub(f"dirs[{i}]", item)
        dd.reject_unknown({"env", "default", "engines"})
        env = dd.get("env", str)
        if not ENV_NAME.match(env):
            raise SpecError(doc.path, dd.key("env"), "an environment variable name", env)
        default = dd.get("default", str, what="~/PATH, {VAR}/PATH or an absolute path")
        refs = _REF.findall(default)
        known = {d.env for d in dirs}
        if not (default == "~" or default.startswith(("~/", "/")) or default.startswith("{")):
            raise SpecError(doc.path, dd.key("default"), "~/PATH, {VAR}/PATH or an absolute "
                            "path", default)
        if default.startswith("{") and refs[0] not in known:
            # Resolved in order: an entry names only a directory listed above it.
            raise SpecError(doc.path, dd.key("default"), "a {VAR} that an entry above names ("
                            + ", ".join(sorted(known)) + ")", default)
        engines = dd.str_list("engines")
        for j, e in enumerate(engines):
            if e not in ENGINES:
                raise SpecError(doc.path, f"{dd.key('engines')}[{j}]", "an engine: "
                                + ", ".join(ENGINES), e)
        dirs.append(WriteDir(env, default, engines))
    if not dirs or dirs[0].env != "HOME":
        raise SpecError(doc.path, wd.key("dirs"), "HOME first (the others default under it)",
                        [d.env for d in dirs][:1])
    return Writable(tmpfs, tuple(dirs))


def _rdma(doc: Doc) -> Rdma:
    rd = doc.sub("rdma", doc.get("rdma", dict))
    rd.reject_unknown({"resource", "capabilities", "env"})
    res = rd.get("resource", str)
    if not re.fullmatch(r"[a-z0-9.-]+/[A-Za-z0-9._-]+", res):
        raise SpecError(doc.path, rd.key("resource"), "an extended resource name, "
                        "DOMAIN/NAME (rdma/ib)", res)
    caps = rd.str_list("capabilities")
    for i, c in enumerate(caps):
        if not re.fullmatch(r"[A-Z_]+", c) or c.startswith("CAP_"):
            raise SpecError(doc.path, f"{rd.key('capabilities')}[{i}]", "a capability as "
                            "Kubernetes names it, without CAP_ (IPC_LOCK)", c)
    return Rdma(res, caps, _env_map(rd, "env"))


def load_launch(images: Path | Sequence[Path]) -> LaunchTable:
    """Read and validate the launch table: with several images/ directories (lowest layer
    first), the highest one that has the file is read, whole (like images/checks/engines.yaml).
    Errors name the file, the key and what was expected."""
    layers = [Path(images)] if isinstance(images, (str, Path)) else [Path(p) for p in images]
    if not layers:
        raise ValueError("load_launch: no images/ directory given")
    top = next((d for d in reversed(layers) if any((d / n).is_file() for n in LAUNCH_FILES)),
               layers[0])
    doc = read_table(top, LAUNCH_FILES, "launch table")
    doc.reject_unknown({"engines", "models", "writable", "gke", "rdma"})
    eng_doc = doc.sub("engines", doc.get("engines", dict))
    engines: dict[str, EngineLaunch] = {}
    for name in eng_doc.data:
        if name not in ENGINES:
            raise SpecError(doc.path, eng_doc.key(str(name)), "an engine a target can name: "
                            + ", ".join(ENGINES), name)
        engines[str(name)] = _engine(str(name), eng_doc.sub(str(name), eng_doc.data[name]))
    for name in ENGINES:
        if name not in engines:
            raise SpecError(doc.path, eng_doc.key(name), "a launch entry for every engine a "
                            "target can name: " + ", ".join(ENGINES), "(missing)",
                            hint=f"add engines.{name} to {doc.path} (command, port, health, "
                                 "models, phases, gpus, startup_timeout_s)")
    gke = doc.sub("gke", doc.get("gke", dict))
    gke.reject_unknown({"env"})
    return LaunchTable(engines, _models(doc), doc.path, layers[-1].parent,
                       writable=_writable(doc), gke_env=_env_map(gke, "env"), rdma=_rdma(doc))
