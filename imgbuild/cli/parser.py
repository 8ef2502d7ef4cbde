"""The command line's grammar: argparse only, so `imgbuild --help` loads nothing else.

Each subcommand names the module under imgbuild/cli/commands/ that runs it."""

from __future__ import annotations

import argparse
import os

# command -> module under imgbuild.cli.commands (imported only when that command runs)
COMMANDS = {
    "list": "list", "plan": "plan", "lock": "lock", "check-deps": "check_deps",
    "build": "build", "pull": "pull", "run": "run", "smoke": "smoke", "preflight": "preflight",
    "doctor": "doctor", "check-model": "check_model", "patches": "patches",
    "matrix": "matrix", "outdated": "outdated", "relock": "relock", "base": "base",
    "smoke-model": "smoke_model", "verify": "verify", "index": "index", "size": "size",
    "init": "init", "version": "version", "report": "report",
}


def parser() -> argparse.ArgumentParser:
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--json", action="store_true",
                        help="machine-readable output: JSON on stdout and nothing else")
    common.add_argument("--progress", choices=("auto", "tty", "plain", "json"), default="auto",
                        help="how long stages (builds, pulls, pushes) report on stderr: a live "
                             "display (tty), a line every few seconds (plain), one JSON event "
                             "per line (json); auto: tty on a terminal, plain otherwise, none "
                             "with --json")
    common.add_argument("--images", default=os.environ.get("IMGBUILD_IMAGES"),
                        help="your project's images/ directory, over the built-in catalog (env "
                             "IMGBUILD_IMAGES; default: the project whose imgbuild.yaml is in "
                             "this directory or above, else the built-in catalog alone)")
    common.add_argument("--lockfiles", default=os.environ.get("IMGBUILD_LOCKFILES"),
                        help="where locks live (env IMGBUILD_LOCKFILES; default: lockfiles/ "
                             "beside images/)")
    common.add_argument("--wheels", help="a local wheel directory that stands in for extra "
                        "indexes (env IMGBUILD_WHEELS)")
    common.add_argument("--insecure-registry", action="append", metavar="HOST[:PORT]",
                        help="a registry to reach by plain HTTP or with a certificate this "
                             "machine does not trust, as Docker's insecure-registries (env "
                             "IMGBUILD_INSECURE_REGISTRIES; loopback registries always are)")
    select = argparse.ArgumentParser(add_help=False)
    select.add_argument("--arch", action="append", metavar="ARCH",
                        help="GPU archs instead of the target's: sm100, 10.0, B200, 'RTX PRO 6000' "
                             "(repeat or comma-separate)")
    select.add_argument("--platform", action="append", metavar="OS/ARCH",
                        help="some of a multi-platform target's platforms (linux/amd64, "
                             "linux/arm64; repeat or comma-separate); default: all it names "
                             "(pull: this host's)")
    select.add_argument("--flavor", choices=("devel", "cuda-devel", "slim"),
                        help="devel: OS base + the CUDA toolkit from NVIDIA's wheels; "
                             "cuda-devel: nvidia/cuda cudnn-devel base; slim: OS base, CUDA "
                             "from the torch wheels only")
    p = argparse.ArgumentParser(
        prog="imgbuild", description="Build, smoke-test and publish LLM serving images. "
        "`imgbuild TARGET ...` is `imgbuild build TARGET ...`.")
    # Read by main(), which runs `imgbuild version` for it: listed here for --help.
    p.add_argument("--version", action="store_true",
                   help="imgbuild's version and its built-in catalog's digest (with --json: "
                        "as JSON); the same as `imgbuild version`")
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")
    sub.add_parser("list", parents=[common], help="targets and model profiles")
    sub.add_parser("version", parents=[common],
                   help="imgbuild's version and the built-in catalog it carries (its digest)")
    s = sub.add_parser("init", parents=[common],
                       help="write a project here (or in DIR): imgbuild.yaml, a target that "
                            "extends a built-in one, its model profile, lockfiles/, a CI "
                            "workflow, a README")
    s.add_argument("dir", nargs="?", default=".", metavar="DIR",
                   help="where (default: this directory); made if missing")
    s.add_argument("--extends", default="sglang-blackwell", metavar="TARGET",
                   help="the built-in target the project's target starts from (default: "
                        "sglang-blackwell; `imgbuild list`)")
    s.add_argument("--name", help="the project's target (default: my-TARGET)")
    s.add_argument("--model", metavar="CHECKPOINT",
                   help="a Hugging Face repo id (org/name) or a local checkpoint directory "
                        "(default: a placeholder to replace)")
    s.add_argument("--tp", type=int, default=1, help="GPUs the model is sharded over (default 1)")
    s.add_argument("--size-gb", type=float, metavar="G",
                   help="the checkpoint's size on disk in GB (default: measured from a local "
                        "directory, else a placeholder)")
    s = sub.add_parser("plan", parents=[common, select],
                       help="the Plan for a target (locks if needed)")
    s.add_argument("target")
    s.add_argument("--model")
    s.add_argument("--registry", help="repository the tags are for, e.g. 127.0.0.1:5000/imgbuild")
    s.add_argument("--no-checks", action="store_true",
                   help="skip the dependency (API drift) check, which reads locked wheels")
    s = sub.add_parser("lock", parents=[common], help="resolve and write lockfiles")
    s.add_argument("targets", nargs="*")
    s.add_argument("--all", action="store_true")
    s.add_argument("--check", action="store_true", help="exit 1 with the diff if a lock is stale")
    s.add_argument("--refresh", action="store_true", help="re-resolve even if inputs match")
    s.add_argument("--jobs", type=int, default=4, help="locks resolved at once (default 4)")
    s = sub.add_parser("check-deps", parents=[common],
                       help="API drift: what the locked engine uses exists in its locked deps")
    s.add_argument("target")
    s.add_argument("--model")
    s = sub.add_parser("build", parents=[common, select],
                       help="plan, lock, build, smoke, tag (and push)")
    s.add_argument("target")
    s.add_argument("--model")
    s.add_argument("--registry")
    s.add_argument("--push", action="store_true")
    s.add_argument("--rebuild", action="store_true", help="build even if the content tag exists")
    s.add_argument("--no-smoke", action="store_true",
                   help="skip the smoke test (then only the content tag is set)")
    s.add_argument("--resmoke", action="store_true",
                   help="run the smoke test even if this image (by ID) passed it before: by "
                        "default a passing report kept here or stored in the registry is reused")
    s.add_argument("--force", action="store_true",
                   help="move the moving tags even if the smoke test fails (loud; labelled "
                        "io.imgbuild.smoke-gate=forced, so it has a content tag of its own)")
    s.add_argument("--no-cache", action="store_true",
                   help="run every build step again (BuildKit's layer cache unused; uv's kept)")
    s.add_argument("--no-cache-from", action="store_true",
                   help="do not reuse layers from this target's images in the --registry "
                        "(by default their inline cache is read: a fresh machine rebuilds "
                        "only what changed)")
    s.add_argument("--cache-from", action="append", default=[], metavar="REF",
                   help="also reuse the layers of image REF (HOST/REPO:TAG, its inline cache), "
                        "after the target's own: another repository's, such as the release "
                        "one when pushing to a staging one; repeatable")
    s.add_argument("--registry-cache", action="store_true",
                   help="on an Engine with the containerd image store, also write BuildKit's "
                        "registry build cache on --push (TARGET-buildcache-max, mode=max: every "
                        "stage's layers) and read it alone where it exists, instead of the "
                        "images' inline cache. Off by default: on Engine 26.1.5 it gave a fresh "
                        "runner less than the inline cache (bench/results/"
                        "registry-cache-tiny-cpu.json)")
    s.add_argument("--no-splice", action="store_true",
                   help="with --push --no-smoke, build the image whole here instead of "
                        "building the layers above the heavy ones alone and pushing them "
                        "beside the previous image's heavy layers, which stay in the registry")
    s.add_argument("--compression", choices=("gzip", "zstd"),
                   help="layer compression of the push (default: the --registry's rule in "
                        "images/registries.yaml, else gzip). zstd is smaller and faster to "
                        "unpack, and read only by containerd >= 1.5 and Docker Engine >= 23")
    s.add_argument("--sign-key", metavar="KEY",
                   default=os.environ.get("IMGBUILD_SIGN_KEY") or None,
                   help="with --push, sign the image and attest its SBOM and provenance in "
                        "Sigstore cosign's format once its smoke test passed, before its moving "
                        "tags move: a cosign key file (`cosign generate-key-pair`; its password "
                        "in COSIGN_PASSWORD) or env://VAR, which imgbuild signs with; `keyless` "
                        "(the CI job's OIDC identity) or a KMS URI (awskms://, gcpkms://, "
                        "azurekms://, hashivault://, k8s://, ...), which the cosign 2.x binary "
                        "signs with (IMGBUILD_COSIGN, else cosign on PATH) (env "
                        "IMGBUILD_SIGN_KEY)")
    s.add_argument("--log-dir", help="keep the full build log here")
    s = sub.add_parser("pull", parents=[common, select],
                       help="pull the prebuilt image for a target")
    s.add_argument("target")
    s.add_argument("--model")
    s.add_argument("--registry", required=True)
    s = sub.add_parser("run", parents=[common],
                       help="serve a model on this host: the target that fits its GPUs, the "
                            "image, preflight, the container, until the server answers")
    s.add_argument("subject", metavar="TARGET|MODEL",
                   help="a target, or a model profile (the target that fits this host is "
                        "chosen)")
    s.add_argument("--model", help="with a TARGET: the model profile to serve (default: the "
                                   "target's)")
    s.add_argument("--registry", help="pull the image from here (by content tag, verified) "
                                      "when this host does not have it")
    s.add_argument("--port", type=int, help="the host port to publish (default: the engine's)")
    s.add_argument("--dry-run", action="store_true",
                   help="print the exact `docker run` line and start nothing")
    s.add_argument("--emit", nargs=2, metavar=("compose|k8s", "DIR"),
                   help="write a compose file, or Kubernetes manifests, into DIR")
    s.add_argument("--admission", choices=("policy-controller", "kyverno"),
                   help="with --emit k8s: the admission controller that enforces the registry's "
                        "signed-by policy in the cluster, whose policy is written beside the "
                        "manifests: Sigstore's policy-controller (a ClusterImagePolicy; the "
                        "default) or Kyverno 1.13+ (a ClusterPolicy with a verifyImages rule)")
    s.add_argument("--gpus-per-node", type=int, default=8,
                   help="with --emit k8s: GPUs per node (a model sharded wider is a "
                        "LeaderWorkerSet over several nodes)")
    s.add_argument("--keep", action="store_true",
                   help="leave the container when the run ends (default: removed)")
    s.add_argument("--detach", action="store_true",
                   help="return once the server answers, leaving it running")
    s.add_argument("--no-preflight", action="store_true",
                   help="start without the host checks (here and in the container): GPUs, "
                        "the driver against the image's CUDA, memory, disk, and the NVIDIA "
                        "Container Toolkit registered with the Engine")
    s.add_argument("--timeout", type=float, default=1800,
                   help="seconds to wait for the server to answer (default 1800)")
    s.add_argument("--nvidia-smi", help="the nvidia-smi binary to read the GPUs with")
    s.add_argument("--model-dir", "--model-cache", dest="model_cache",
                   help="the host's model cache to mount, where the model is or will be "
                        "downloaded (default: HF_HOME, else ~/.cache/huggingface)")
    s.add_argument("--read-only", action="store_true",
                   help="a read-only root filesystem (also --emit compose), with /tmp a tmpfs "
                        "mounted exec (the engines' JIT kernels load from it); refused (exit 2, "
                        "nothing started) when a directory the server writes (HOME, the JIT "
                        "and model caches: images/checks/launch.yaml writable) would be "
                        "read-only. --emit k8s always has a read-only root")
    s.add_argument("-e", "--env", action="append", default=[], metavar="NAME=VALUE",
                   help="set a variable in the server's container (repeatable; also in "
                        "--dry-run and --emit)")
    s.add_argument("--gke", action="store_true",
                   help="with --emit k8s: for Google Kubernetes Engine's GPU nodes, "
                        "LD_LIBRARY_PATH names the node driver's libraries "
                        "(/usr/local/nvidia/lib64)")
    s.add_argument("--rdma", action="store_true",
                   help="with --emit k8s, a LeaderWorkerSet: the nodes talk over InfiniBand "
                        "or RoCE: the RDMA device plugin's resource, IPC_LOCK, and NCCL's "
                        "variables (the cluster must run an RDMA device plugin, or the NVIDIA "
                        "Network Operator)")
    s.add_argument("--rdma-resource", metavar="NAME",
                   help="with --rdma: the resource the cluster's RDMA device plugin advertises "
                        "(default: rdma/ib)")
    s.add_argument("--nccl-ib-hca", metavar="HCAS",
                   help="with --rdma: NCCL_IB_HCA, the nodes' HCAs (default mlx5: every "
                        "mlx5_* port)")
    s.add_argument("--nccl-ib-gid-index", metavar="N",
                   help="with --rdma: NCCL_IB_GID_INDEX, RoCE's GID index on the nodes "
                        "(`show_gids`; default: unset, NCCL picks)")
    s.add_argument("--nccl-socket-ifname", metavar="IFACE",
                   help="with --rdma: NCCL_SOCKET_IFNAME, the pod's interface for NCCL's "
                        "bootstrap (default eth0)")
    s = sub.add_parser("index", parents=[common],
                       help="assemble a multi-platform target's OCI image index from its pushed "
                            "platform images, then move its tags onto it")
    s.add_argument("targets", nargs="*")
    s.add_argument("--all", action="store_true", help="every multi-platform target")
    s.add_argument("--model")
    s.add_argument("--registry", required=True)
    s.add_argument("--sign-key", metavar="KEY",
                   default=os.environ.get("IMGBUILD_SIGN_KEY") or None,
                   help="sign the index and attest it (an SBOM of its platform images, its "
                        "provenance) in Sigstore cosign's format, after it is put by digest and "
                        "before any tag moves; refused unless every platform image is signed by "
                        "this key: a cosign key file (its password in COSIGN_PASSWORD) or "
                        "env://VAR; `keyless` (every platform image's certificate, and the "
                        "index's, naming one identity) or a KMS URI, signed by the cosign 2.x "
                        "binary (env IMGBUILD_SIGN_KEY)")
    s = sub.add_parser("smoke", parents=[common], help="run the smoke payload inside an image")
    s.add_argument("image")
    s.add_argument("--gpu", choices=("auto", "off", "require"), default="auto",
                   help="stage 4, the image's engine on a GPU: auto where there is one, "
                        "require turns a GPU skip into a failure")
    s = sub.add_parser("size", parents=[common],
                       help="where an image's bytes are: layers, kinds of file, packages, "
                            "duplicated files, dead weight (any image with Python)")
    s.add_argument("image")
    s.add_argument("--top", type=int, default=15, help="packages and duplicates shown")
    s = sub.add_parser("preflight", parents=[common, select],
                       help="check this host (GPUs, driver, memory, disk) for an image or target")
    s.add_argument("subject", metavar="IMAGE|TARGET")
    s.add_argument("--model", help="with a TARGET: the model profile to check for")
    s.add_argument("--model-dir", help="where the model will be stored (free disk is checked "
                   "there; default IMGBUILD_MODEL_DIR, else the Hugging Face cache)")
    s.add_argument("--nvidia-smi", help="the nvidia-smi binary to run")
    s = sub.add_parser("patches", parents=[common],
                       help="a target's compatibility patches; --check applies them to the "
                            "locked wheel in a scratch directory")
    s.add_argument("target")
    s.add_argument("--check", action="store_true")
    s = sub.add_parser("check-model", parents=[common],
                       help="lint a checkpoint's config.json against a target's locked engine")
    s.add_argument("model", metavar="PATH|ALIAS")
    s.add_argument("--target", help="the target whose locked engine to read (with --image: "
                                     "the image's own target by default)")
    s.add_argument("--image", help="also ask this image's engine, in a container with no "
                                   "network, which scheme each layer gets (config.json and "
                                   "tensor names only; no weights are read)")
    s.add_argument("--fix", metavar="OUT", help="write a corrected config.json (original kept "
                   "beside it) whose ignore list ignores exactly the same modules")
    s = sub.add_parser("matrix", parents=[common], help="CI jobs from images/: github, bake, json")
    s.add_argument("--format", choices=("github", "bake", "json"), default="json")
    s.add_argument("--changed-since", metavar="REF",
                   help="only jobs whose content key changed since this git ref")
    s.add_argument("--registry", help="repository the tags are for")
    s.add_argument("--contexts", metavar="DIR", help="with bake: write each job's build context")
    s = sub.add_parser("report", parents=[common],
                       help="the compatibility page: which target's image runs on which GPU, "
                            "and why, from the plans, locks, kernel records and (with "
                            "--registry) the pushed images and their smoke reports")
    s.add_argument("targets", nargs="*", help="only these targets (default: every one)")
    s.add_argument("--registry", help="read what this repository holds for each content tag: "
                                      "digest, layers, stored smoke report")
    s.add_argument("--html", metavar="DIR", help="write DIR/index.html (one static page)")
    s = sub.add_parser("outdated", parents=[common],
                       help="newer upstream releases per target: available, blocked by, held")
    s.add_argument("targets", nargs="*")
    s = sub.add_parser("relock", parents=[common], help="re-resolve a target upgrading packages")
    s.add_argument("target")
    s.add_argument("--upgrade", action="append", required=True, metavar="PKG[==VER]")
    s = sub.add_parser("doctor", parents=[common],
                       help="match a server log or traceback against known failures; --host: "
                            "the Docker Engine and client here, and what imgbuild does with "
                            "them")
    s.add_argument("log", metavar="LOGFILE|-", nargs="?",
                   help="the log to read (- for stdin); not with --host")
    s.add_argument("--host", action="store_true",
                   help="instead of a log: the Docker Engine (DOCKER_HOST) and client, their "
                        "versions, image store and builder, and what imgbuild does with them "
                        "(exit 3 when it cannot publish from them, with the fix)")
    s.add_argument("--engine", metavar="NAME[==VERSION]",
                   help="the engine (and version) that wrote the log, when the log does not "
                        "say: e.g. sglang==0.5.16")
    s = sub.add_parser("smoke-model", parents=[common],
                       help="a generated smoke checkpoint, by its recipe key: from the cache, "
                            "the registry, or made by its pinned generator image")
    s.add_argument("alias", metavar="MODEL", help="a generated model profile, e.g. tiny-nvfp4")
    s.add_argument("--registry", help="fetch it from (and with --push, store it in) this "
                                      "repository, e.g. 127.0.0.1:5000/imgbuild")
    s.add_argument("--push", action="store_true")
    s.add_argument("--log-dir", help="keep the generator image's build log and the "
                                     "generator's output here")
    s = sub.add_parser("verify", parents=[common],
                       help="check an image in a registry: its digest, smoke report, SBOM "
                            "against its lock, provenance")
    s.add_argument("ref", metavar="HOST[:PORT]/REPO:TAG|@DIGEST")
    s.add_argument("--key", metavar="PUB",
                   help="also check its cosign signature and signed attestations (cyclonedx, "
                        "slsaprovenance1) against this public key (a path), instead of the "
                        "signed-by policy images/registries.yaml gives the registry")
    s = sub.add_parser("base", parents=[common], help="base images")
    bsub = s.add_subparsers(dest="base_command", required=True, metavar="COMMAND")
    b = bsub.add_parser("bootstrap", parents=[common],
                        help="debootstrap + docker import a Debian base, tag and push it")
    b.add_argument("--base", default="debian-bookworm")
    b.add_argument("--cpu-arch", choices=("x86_64", "aarch64"), default="x86_64",
                   help="the CPU the base is for; another than this machine's runs debootstrap "
                        "under QEMU user emulation (qemu-user-static, binfmt_misc)")
    b.add_argument("--registry")
    b.add_argument("--rebuild", action="store_true")
    b.add_argument("--record", action="store_true",
                   help="make it anew and write its rootfs digest into images/bases.yaml (when "
                        "Debian's mirror moved since it was recorded)")
    b = bsub.add_parser("refresh-digests", parents=[common],
                        help="pin the catalog's nvidia/cuda tags by digest (needs the registry)")
    b.add_argument("--mirror", help="a registry that mirrors nvidia/cuda, e.g. 127.0.0.1:5000/hub")
    return p
