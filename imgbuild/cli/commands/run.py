from __future__ import annotations

import re
from pathlib import Path

from ...errors import InputError
from ...pipeline.run import run as run_model
from ...plan.launch import Cluster, cluster_for
from ..args import repository, workspace
from ..views import run as views

ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
# The --nccl-* options and the variable each one sets.
NCCL_OPTIONS = (("nccl_ib_hca", "NCCL_IB_HCA"), ("nccl_ib_gid_index", "NCCL_IB_GID_INDEX"),
                ("nccl_socket_ifname", "NCCL_SOCKET_IFNAME"))


def env_pairs(given: list[str]) -> tuple[tuple[str, str], ...]:
    """--env NAME=VALUE, each checked: a NAME the shell would take, then '='."""
    out = []
    for item in given:
        name, eq, value = item.partition("=")
        if not eq or not ENV_NAME.match(name):
            raise InputError(f"--env {item!r}: expected NAME=VALUE",
                             hint="e.g. --env TRITON_CACHE_DIR=/tmp/triton")
        out.append((name, value))
    return tuple(out)


def run(args, out) -> int:
    ws = workspace(args)
    emit = None
    if args.emit:
        kind, where = args.emit
        if kind not in ("compose", "k8s"):
            raise InputError(f"--emit {kind}: not a format imgbuild writes",
                             hint="--emit compose DIR, or --emit k8s DIR")
        emit = (kind, Path(where))
    if args.port is not None and not 0 < args.port < 65536:
        raise InputError(f"--port {args.port}: not a TCP port", hint="a number from 1 to 65535")
    if args.timeout <= 0:
        raise InputError(f"--timeout {args.timeout}: not a duration", hint="seconds, above 0")
    if args.admission is not None and (emit is None or emit[0] != "k8s"):
        raise InputError(f"--admission {args.admission}: an admission policy is for a "
                         "Kubernetes cluster: it goes with --emit k8s DIR",
                         hint="add --emit k8s DIR, or drop --admission")
    nccl = tuple((var, getattr(args, opt)) for opt, var in NCCL_OPTIONS
                 if getattr(args, opt) is not None)
    cluster = Cluster()
    if args.gke or args.rdma or args.rdma_resource is not None or nccl:
        if emit is None or emit[0] != "k8s":
            raise InputError("--gke, --rdma, --rdma-resource and --nccl-* describe a "
                             "Kubernetes cluster: they go with --emit k8s DIR",
                             hint="add --emit k8s DIR, or drop them")
        cluster = cluster_for(ws.launch, gke=args.gke, rdma=args.rdma,
                              rdma_resource=args.rdma_resource, nccl=nccl)
    report = run_model(
        ws, args.subject, model=args.model,
        registry_name=repository(args) if args.registry else None, port=args.port,
        dry_run=args.dry_run, emit=emit, gpus_per_node=args.gpus_per_node, keep=args.keep,
        detach=args.detach, preflight=not args.no_preflight, timeout_s=args.timeout,
        nvidia_smi=args.nvidia_smi,
        model_cache=Path(args.model_cache).expanduser() if args.model_cache else None,
        read_only_root=args.read_only, env=env_pairs(args.env), cluster=cluster,
        admission=args.admission, on_ready=lambda r: views.ready(out, r), progress=out.progress())
    views.report(out, report)
    return report.exit_code
