"""The image's labels and the facts the host preflight checks: one source, so that an image's
labels, its /opt/imgbuild/image.json and `imgbuild preflight TARGET` agree."""

from __future__ import annotations

from collections.abc import Mapping

from ..errors import InputError
from ..payload.preflight import ImageFacts
from .plan import Plan

LABEL_NS = "io.imgbuild"
# Any user: the HOME every cache and JIT directory defaults under, and where a container writes
# (/tmp, a tmpfs or emptyDir; and the model cache, HF_HOME, where it is mounted).
RUN_HOME = "/tmp/home"
# What the image sets for it (plan/render.py writes it as one ENV line): USER answers getpass
# for a UID with no passwd entry. Where the caches resolve (plan/launch.py write_targets).
RUN_ENV = (("HOME", RUN_HOME), ("XDG_CACHE_HOME", f"{RUN_HOME}/.cache"), ("USER", "imgbuild"),
           ("LOGNAME", "imgbuild"))
WRITABLE = ("/tmp", "HF_HOME")  # a path, or the variable naming one (no $: LABEL expands it)
ANY_USER = "1000770000:0"  # what the smoke test runs as: a UID with no passwd entry, group 0
# The labels preflight reads back from a built image.
LABELS = {
    "archs": f"{LABEL_NS}.archs",
    "cuda": f"{LABEL_NS}.cuda",
    "min_driver": f"{LABEL_NS}.driver-min",
    "model": f"{LABEL_NS}.model",
    "size_gb": f"{LABEL_NS}.model-size-gb",
    "tp": f"{LABEL_NS}.tp",
    "platform": f"{LABEL_NS}.platform",  # manylinux_2_36_aarch64: the CPU it runs on
}


def labels(draft: Plan) -> dict[str, str]:
    """OCI and io.imgbuild.* labels of the image a plan describes."""
    return {
        "org.opencontainers.image.title": f"imgbuild {draft.target}",
        "org.opencontainers.image.description": draft.description[:200],
        "org.opencontainers.image.base.name": draft.base_image,
        "org.opencontainers.image.base.digest": draft.base_digest or "none",
        "org.opencontainers.image.vendor": "imgbuild",
        f"{LABEL_NS}.target": draft.target,
        f"{LABEL_NS}.engine": f"{draft.engine}=={draft.engine_version}",
        f"{LABEL_NS}.archs": ",".join(draft.archs),
        f"{LABEL_NS}.cuda": draft.cuda or "none",
        f"{LABEL_NS}.driver-min": draft.min_driver or "none",
        f"{LABEL_NS}.flavor": draft.flavor,
        f"{LABEL_NS}.python": draft.python,
        f"{LABEL_NS}.platform": draft.platform_tag,
        f"{LABEL_NS}.lock.hash": draft.lock_hash,
        f"{LABEL_NS}.patches": ",".join(draft.applied_patches) or "none",
        f"{LABEL_NS}.model": draft.model or "none",
        f"{LABEL_NS}.model-size-gb": f"{draft.model_size_gb:g}" if draft.model_size_gb else "none",
        f"{LABEL_NS}.tp": str(draft.tensor_parallel or "none"),
        f"{LABEL_NS}.smoke-model": draft.smoke_model_key or "none",
        # GPU code per arch, read from the locked wheels: "torch=sass,sglang-kernel=sass,…".
        **{f"{LABEL_NS}.kernels.{a}": ",".join(f"{k.split(' ')[0]}={v}" for k, v in rows
                                               if "(shown)" not in k)
           for a, rows in draft.kernel_coverage},
        # A forced image says so in its own metadata, and gets a content key of its own.
        f"{LABEL_NS}.smoke-gate": "forced" if draft.forced else "required",
        # Root by default (as the engines' own images); any UID with group 0 works on a
        # read-only root with these writable (the smoke test's any-user stage checks it),
        # unless the target says why it cannot: the smoke test of a pulled image reads it here.
        f"{LABEL_NS}.user": user_label(draft.root_only),
        f"{LABEL_NS}.writable": ",".join(WRITABLE),
    }


ROOT_ONLY = "0:0 only"


def user_label(root_only: str | None) -> str:
    """io.imgbuild.user: who the image runs as, and for a root-only one, why."""
    return f"{ROOT_ONLY}: {root_only}" if root_only else "0:0; any uid with gid 0"


def root_only_reason(user: str | None) -> str | None:
    """The reason an io.imgbuild.user label gives for running as root only (None: any user)."""
    if user and user.startswith(ROOT_ONLY):
        return user[len(ROOT_ONLY):].lstrip(": ").strip() or "no reason given"
    return None


def facts_from_labels(labels: Mapping[str, str] | None) -> ImageFacts:
    """An image's facts from its io.imgbuild.* labels. "none" or a missing label means absent;
    the driver floor falls back to the CUDA version's (CUDA_MIN_DRIVER) when not labelled."""
    labels = dict(labels or {})

    def get(key: str) -> str | None:
        v = labels.get(LABELS[key])
        return None if v is None or v.strip().lower() in ("", "none") else v.strip()

    archs = get("archs")
    if not archs:
        raise InputError(f"the image has no {LABELS['archs']} label: it was not built by "
                         f"imgbuild, so there is nothing to check it against",
                         hint="pass an image built by imgbuild, or a target name")
    model = None
    if get("model"):
        model = {"alias": get("model"), "size_gb": get("size_gb"), "tensor_parallel": get("tp")}
    try:
        platform = get("platform") or ""
        cpu = next((c for c in ("x86_64", "aarch64") if platform.endswith("_" + c)), None)
        return ImageFacts.from_dict({"archs": archs.split(","), "cuda": get("cuda"),
                                     "min_driver": get("min_driver"), "model": model,
                                     "cpu_arch": cpu})
    except ValueError as e:
        raise InputError(f"the image's {LABEL_NS}.* labels are malformed: {e}",
                         hint="rebuild the image with this imgbuild") from None


def facts_from_plan(plan: Plan) -> ImageFacts:
    """A TARGET's facts from its Plan: the same values its labels carry, so `imgbuild preflight
    TARGET` and `imgbuild preflight IMAGE` judge alike."""
    return facts_from_labels(dict(plan.labels))
