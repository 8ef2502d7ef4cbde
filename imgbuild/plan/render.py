"""Dockerfile text from the Plan. Pure: no Docker, no network, no clock.

Layer order puts what changes least first; each step says why it sits where it does.
"""

from __future__ import annotations

import hashlib
import json
import shlex
from pathlib import Path

from .. import payload
from ..payload.preflight import ENTRYPOINT_SH
from .labels import RUN_ENV, facts_from_labels
from .patchset import apply_command
from .plan import Plan

PAYLOAD_DIR = Path(payload.__file__).parent
PAYLOAD = PAYLOAD_DIR / "smoke.py"
# What runs inside the image besides the engine: stdlib-only scripts, copied as they are.
PAYLOAD_FILES = ("smoke.py", "preflight.py", "smokegen.py", "engine_schemes.py", "serve.py",
                 "scheme-probes.json", "anyuser.py", "doctor-sentences.json")

VENV = "/opt/venv"
TOOLS = "/opt/imgbuild-tools"  # bind-mounted from the context: uv never lands in a layer
WHEELS = "/opt/imgbuild-wheels"
ASSETS = "/opt/imgbuild"
HEAVY_LAYERS = ("heavy-cuda", "heavy-torch")  # lock/lockfile.py LockedPackage.layer


def payload_digest() -> str:
    h = hashlib.sha256()
    for name in PAYLOAD_FILES:
        h.update(name.encode() + b"\0" + (PAYLOAD_DIR / name).read_bytes() + b"\0")
    return "sha256:" + h.hexdigest()


def entrypoint_sh() -> str:
    return ENTRYPOINT_SH


def image_facts(plan: Plan) -> str:
    """/opt/imgbuild/image.json: what the in-image preflight checks the host against."""
    facts = facts_from_labels(dict(plan.labels)).to_dict() | {
        # For the smoke test: which engine to drive, which patches must be in effect.
        "engine": plan.engine, "patches": list(plan.needed_patches), "flavor": plan.flavor}
    if plan.cuda_home:
        facts["toolchain"] = {"cuda_home": plan.cuda_home, "nvcc": plan.nvcc}
    if plan.kernel_files:
        facts["kernel_files"] = [dict(zip(("package", "member", "sha256"), f))
                                 for f in plan.kernel_files]
        facts["kernel_coverage"] = {a: dict(rows) for a, rows in plan.kernel_coverage}
    return json.dumps(facts, indent=2, sort_keys=True) + "\n"


def serve_command(plan: Plan) -> list[str]:
    """What the image runs by default: the engine's server for the model, or the smoke test."""
    model_path = f"/models/{plan.checkpoint}" if plan.checkpoint else "/models/model"
    if plan.engine == "sglang":
        return ["python", "-m", "sglang.launch_server", "--model-path", model_path,
                "--host", "0.0.0.0", *plan.serve_flags]
    if plan.engine == "vllm":
        return ["vllm", "serve", model_path, "--host", "0.0.0.0", *plan.serve_flags]
    return ["python", f"{ASSETS}/smoke.py", "--lock", f"{ASSETS}/lock.txt",
            "--model", f"{ASSETS}/smoke-model"]


def _prune(plan: Plan, part: str) -> str:
    """The flavor's dead weight (images/prune.yaml), removed in the step that installed it so
    that its bytes never reach a layer; what went is listed in the image."""
    if not plan.prune:
        return ""
    tests = {"path": "-path './{}'", "dirs": "-type d -name '{}'", "files": "-type f -name '{}'"}
    expr = " -o ".join(tests[kind].format(pattern) for kind, pattern in plan.prune)
    return (f" && \\\n    cd {VENV}/lib/python{plan.python}/site-packages && \\\n"
            f"    find . -mindepth 2 \\( {expr} \\) -prune -print -exec rm -rf {{}} + \\\n"
            f"      > {ASSETS}/pruned-{part}.txt")


def _install(lock_file: str, plan: Plan) -> str:
    # One install step per lock part. Hashes are required and dependencies are not re-resolved:
    # the image gets exactly the lock. The CA bundle and index credentials are build secrets,
    # mounted for this step only; uv's cache is a cache mount, so it is reused across builds
    # and never stored in the image. IMGBUILD_INDEX_FLAGS says where wheels come from (an
    # index, or the context's wheelhouse); it is a build argument so that the source of
    # identical, hash-checked files does not change the content key. The bytecode is
    # checked against its source's hash, not its time (PYC_INVALIDATION_MODE, which uv's
    # compile step reads): a reproducible build sets every file's time to SOURCE_DATE_EPOCH
    # after the install (image/buildkit.py), which would make time-stamped .pyc files stale
    # and have Python compile every module again at each start on a read-only root.
    return (
        "RUN --mount=type=cache,id=imgbuild-uv,target=/root/.cache/uv,sharing=locked \\\n"
        "    --mount=type=secret,id=cacert \\\n"
        "    --mount=type=secret,id=netrc,target=/root/.netrc \\\n"
        f"    --mount=type=bind,source=tools,target={TOOLS} \\\n"
        f"    --mount=type=bind,source=wheels,target={WHEELS} \\\n"
        "    if [ -s /run/secrets/cacert ]; then export SSL_CERT_FILE=/run/secrets/cacert; fi; \\\n"
        f"    PYC_INVALIDATION_MODE=CHECKED_HASH {TOOLS}/uv pip install \\\n"
        f"      --python {VENV}/bin/python --require-hashes --no-deps \\\n"
        "      --link-mode=copy --compile-bytecode $IMGBUILD_INDEX_FLAGS \\\n"
        f"      -r {ASSETS}/{lock_file}" + _prune(plan, lock_file.split(".")[0]) + "\n"
    )


REST_LOCK = f"{ASSETS}/rest.txt"


def recorded_command(run: str) -> str:
    """The shell command BuildKit records in the image's history for a RUN step as rendered
    here (`RUN |N ARGS /bin/sh -c <this> # buildkit`): the line continuations joined, the RUN
    keyword and its --mount flags dropped."""
    text = run.rstrip("\n").replace("\\\n", "")
    words = text.split(" ", 1)[1].lstrip()
    while words.startswith("--"):
        words = words.split(" ", 1)[1].lstrip()
    return words


def rest_install(plan: Plan) -> str:
    """The rest install step as the Dockerfile has it."""
    return _install("rest.txt", plan)


def dockerfile(plan: Plan, *, with_heavy: bool = True, rest: str = "install") -> str:
    """The target's Dockerfile. with_heavy=False leaves out the heavy layers' steps (and the
    devel toolkit step, which needs them): the changed layers of an engine bump, built to be
    spliced onto the previous image's heavy layers in the registry (image/splice.py).

    rest: "install" (the image), "skip" (the rest install step left out, all else kept: the
    small layers of a splice whose rest layer is cut from the filesystem) or "last" (nothing
    after the rest install: that filesystem, image/layercut.py)."""
    if rest not in ("install", "skip", "last"):
        raise ValueError(rest)
    heavy = bool(plan.heavy_packages) and with_heavy
    out = [
        f"# Generated by imgbuild from the Plan for target '{plan.target}' "
        f"({plan.engine} {plan.engine_version}; archs {', '.join(plan.archs)}). Do not edit:\n"
        f"# change images/{plan.target}.yaml and run `imgbuild plan {plan.target}`.\n",
        "# The base changes least of all, so it comes first (pinned in images/bases.yaml).\n",
        f"FROM {plan.base_image}\n",
    ]
    if plan.python_packages:
        out += [
            "# Python from the base's own packages, before anything of ours: it changes only\n"
            "# with the base.\n",
            "RUN apt-get update && DEBIAN_FRONTEND=noninteractive apt-get install -y "
            "--no-install-recommends " + " ".join(plan.python_packages)
            + " && rm -rf /var/lib/apt/lists/*\n",
        ]
    if plan.devel_packages:
        out += [
            "# devel: the host compiler nvcc drives and the Python headers torch's cpp_extension\n"
            "# builds against, from the base's own packages: they change only with the base.\n",
            "RUN apt-get update && DEBIAN_FRONTEND=noninteractive apt-get install -y "
            "--no-install-recommends " + " ".join(plan.devel_packages)
            + " && rm -rf /var/lib/apt/lists/*\n",
        ]
    out += [
        "# An empty venv on the base's interpreter; uv comes from the context, not a layer.\n",
        f"RUN --mount=type=bind,source=tools,target={TOOLS} \\\n"
        f"    {TOOLS}/uv venv --python /usr/bin/python{plan.python} {VENV}\n",
        f"ENV VIRTUAL_ENV={VENV} PATH={VENV}/bin:$PATH PYTHONDONTWRITEBYTECODE=1 "
        "UV_PYTHON_DOWNLOADS=never\n",
        "ARG IMGBUILD_INDEX_FLAGS\n",
    ]
    if heavy and plan.split_heavy:
        out += [
            "# The heavy layer as two, so that the Engine fetches one while it unpacks the other:\n"
            "# NVIDIA's CUDA wheels first (they change least), then torch and Triton, built\n"
            "# against them. Dead weight (images/prune.yaml) goes in the step that installs it.\n",
        ]
        for layer in HEAVY_LAYERS:
            out += [f"COPY lock/{layer}.txt {ASSETS}/{layer}.txt\n", _install(f"{layer}.txt", plan)]
    elif heavy:
        out += [
            "# torch, triton and the CUDA wheels: most of the bytes and the slowest to change,\n"
            "# so an engine bump reuses this layer.\n" + (
                "# Dead weight (images/prune.yaml) goes in the step that installs it: removed\n"
                "# in a later step, its bytes would stay in this layer.\n" if plan.prune else ""),
            f"COPY lock/heavy.txt {ASSETS}/heavy.txt\n",
            _install("heavy.txt", plan),
        ]
    if plan.cuda_home and with_heavy:
        out += [
            "# devel: the toolkit NVIDIA's wheels installed (with the heavy layer it belongs to)\n"
            "# made a CUDA_HOME. torch's cpp_extension, FlashInfer and DeepGEMM link with -lcudart\n"
            "# and look in lib64; FlashInfer also links -lcuda from lib64/stubs. The wheels ship\n"
            "# none of these, so: lib64 -> lib, libcudart.so, and a driver stub (no code, soname\n"
            "# libcuda.so.1: the host's driver, mounted at run time, provides the symbols).\n",
            f"ENV CUDA_HOME={plan.cuda_home} CUDA_PATH={plan.cuda_home} "
            f"PATH={plan.cuda_home}/bin:{VENV}/bin:$PATH\n",
            "RUN test -x $CUDA_HOME/bin/nvcc && ln -sfn lib $CUDA_HOME/lib64 && \\\n"
            "    ln -sfn $(cd $CUDA_HOME/lib && ls libcudart.so.* | head -n1) "
            "$CUDA_HOME/lib/libcudart.so && \\\n"
            "    mkdir -p $CUDA_HOME/lib/stubs && printf '' | c++ -shared -x c++ - "
            "-Wl,-soname,libcuda.so.1 -o $CUDA_HOME/lib/stubs/libcuda.so\n",
        ]
    out += [
        "# The engine and everything else in the lock: after torch, so changing the engine\n"
        "# does not invalidate torch.\n",
        f"COPY lock/rest.txt {REST_LOCK}\n",
        *([rest_install(plan)] if rest != "skip" else []),
    ]
    if rest == "last":
        return "".join(out)
    if plan.patch_digest:
        out += [
            "# Compatibility patches, in their own layer right after the engine they patch: a\n"
            "# patch change rebuilds only this. A hunk that does not apply fails the build;\n"
            "# one already fixed upstream is reported obsolete and skipped.\n",
            f"COPY patchset/ {ASSETS}/\n",
            f"RUN {apply_command(f'{VENV}/bin/python')}\n",
        ]
    out += [
        "# The payload (smoke test, host preflight, entrypoint, the image's facts) and the lock\n"
        "# it checks against: small, changed with imgbuild rather than the engine, so above\n"
        "# the heavy layers.\n",
        f"COPY lock/lock.txt {ASSETS}/lock.txt\n",
        f"COPY payload/ {ASSETS}/\n",
    ]
    if plan.smoke_model:
        out += [
            "# The smoke checkpoint: changes only with the generator.\n",
            f"COPY smoke/model {ASSETS}/smoke-model\n",
        ]
    labels = " \\\n      ".join(f"{k}={json.dumps(v)}" for k, v in plan.labels)
    out += [
        "# Any user (a random UID with group 0, as restricted pods and OpenShift run them) on a\n"
        "# read-only root: HOME, and with it every cache and JIT directory the engines default\n"
        "# to under ~ (Triton, FlashInfer, DeepGEMM, TVM, CUDA's), is under /tmp, the one place\n"
        "# written besides the model cache; USER answers getpass for a UID with no passwd entry\n"
        "# (torch's inductor asks). Metadata only, like the labels: it rebuilds no layer.\n",
        "ENV " + " ".join(f"{k}={v}" for k, v in RUN_ENV) + "\n",
        "# Labels last: metadata only, so changing one rebuilds nothing above.\n",
        f"LABEL {labels}\n",
        "# The host preflight runs before the server (IMGBUILD_PREFLIGHT=0 skips it).\n",
        f'ENTRYPOINT ["/bin/sh", "{ASSETS}/entrypoint.sh"]\n',
        f"CMD {json.dumps(serve_command(plan))}\n",
    ]
    return "".join(out)


def shell_quote(args: list[str]) -> str:
    return " ".join(shlex.quote(a) for a in args)
