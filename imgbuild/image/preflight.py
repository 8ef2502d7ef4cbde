"""`imgbuild preflight`: will an image's server start on this host?

The checks live in imgbuild/payload/preflight.py (standard library only, because images run the
same file from their entrypoint); this module feeds them the image's facts, from a built
image's labels (through the Engine) or from a target's plan (plan/labels.py).
"""

from __future__ import annotations

import os

from docker.errors import DockerException, ImageNotFound

from ..errors import EnvError, InputError
from ..payload import preflight as payload
from ..payload.preflight import ImageFacts, Report, Runner
from ..plan.labels import facts_from_labels
from . import daemon


def preflight_facts(facts: ImageFacts, *, model_dir: str | os.PathLike[str] | None = None,
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
    client = client or daemon.client()
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
    return preflight_facts(facts_from_labels(image_labels(ref, client)), model_dir=model_dir,
                           nvidia_smi=nvidia_smi, runner=runner)
