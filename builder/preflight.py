"""`imgbuild preflight`: will an image's server start on this host?

The checks live in builder/payload/preflight.py (standard library only, because images run the
same file from their entrypoint); this module feeds them the image's facts from an image's
labels or a target's plan, and renders the verdicts with rich for people.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

from rich.console import Console
from rich.table import Table

from .errors import EnvError, InputError
from .payload import preflight as payload
from .payload.preflight import (  # noqa: F401  (re-exported: callers need only this module)
    FAIL,
    PASS,
    SKIP,
    WARN,
    Gpu,
    Host,
    ImageFacts,
    ModelFacts,
    Process,
    Report,
    Runner,
    Verdict,
)

LABEL_NS = "io.imgbuild"
LABELS = {
    "archs": f"{LABEL_NS}.archs",
    "cuda": f"{LABEL_NS}.cuda",
    "min_driver": f"{LABEL_NS}.driver-min",
    "model": f"{LABEL_NS}.model",
    "size_gb": f"{LABEL_NS}.model-size-gb",
    "tp": f"{LABEL_NS}.tp",
}


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
        return ImageFacts.from_dict({"archs": archs.split(","), "cuda": get("cuda"),
                                     "min_driver": get("min_driver"), "model": model})
    except ValueError as e:
        raise InputError(f"the image's {LABEL_NS}.* labels are malformed: {e}",
                         hint="rebuild the image with this imgbuild") from None


def facts_from_plan(plan) -> ImageFacts:
    """A TARGET's facts from its Plan (builder.plan.Plan): the same values its labels carry,
    so `imgbuild preflight TARGET` and `imgbuild preflight IMAGE` judge alike."""
    return facts_from_labels(dict(plan.labels))


def preflight_target(facts: ImageFacts, *, model_dir: str | os.PathLike[str] | None = None,
                     nvidia_smi: str | None = None, runner: Runner | None = None) -> Report:
    """Judge this host for an image with these facts (a TARGET: facts from its plan).

    model_dir: where the model will be stored (default IMGBUILD_MODEL_DIR, else the Hugging
    Face cache). nvidia_smi: the binary to run. runner: replaces subprocess, for recordings.
    Never raises for a host without GPUs: that is a `skip` verdict."""
    if model_dir is None:
        model_dir = payload.default_model_dir()
    return payload.run(facts, nvidia_smi=nvidia_smi, runner=runner, model_dir=model_dir)


def image_labels(ref: str, client=None) -> dict[str, str]:
    """Labels of a local image through the Engine API; EnvError/InputError say what to do."""
    from docker.errors import DockerException, ImageNotFound

    if client is None:
        from .dockerenv import client as docker_client

        client = docker_client()
    try:
        return dict(client.images.get(ref).labels or {})
    except ImageNotFound:
        raise InputError(f"no local image {ref}",
                         hint=f"pull it first (`docker pull {ref}` or `imgbuild pull`), or "
                              f"pass a target name") from None
    except DockerException as e:
        raise EnvError(f"cannot inspect image {ref}: {e}",
                       hint="check that the Docker daemon runs and DOCKER_HOST points at it"
                       ) from None


def preflight_image(ref: str, *, client=None, model_dir: str | os.PathLike[str] | None = None,
                    nvidia_smi: str | None = None, runner: Runner | None = None) -> Report:
    """Judge this host for a built IMAGE, from its io.imgbuild.* labels."""
    return preflight_target(facts_from_labels(image_labels(ref, client)), model_dir=model_dir,
                            nvidia_smi=nvidia_smi, runner=runner)


STYLE = {PASS: "bold green", FAIL: "bold red", WARN: "bold yellow", SKIP: "dim"}


def render(verdicts: list[Verdict] | tuple[Verdict, ...], *, title: str = "preflight",
           console: Console | None = None) -> None:
    """The verdict table for people (stdout; `--json` callers print Report.to_dict())."""
    t = Table(title=title, title_justify="left")
    t.add_column("check", no_wrap=True)
    t.add_column("verdict", no_wrap=True)
    t.add_column("detail", overflow="fold")
    for v in verdicts:
        t.add_row(v.check, f"[{STYLE.get(v.status, '')}]{v.status}[/]", v.detail)
    (console or Console(highlight=False)).print(t)


def render_report(report: Report, *, title: str = "preflight",
                  console: Console | None = None) -> None:
    c = console or Console(highlight=False)
    render(report.verdicts, title=title, console=c)
    if report.ok:
        c.print("[green]preflight ok[/]: no check failed")
    else:
        failed = ", ".join(v.check for v in report.verdicts if v.status == FAIL)
        c.print(f"[bold red]preflight failed[/] ({failed}): the server would not start here")
