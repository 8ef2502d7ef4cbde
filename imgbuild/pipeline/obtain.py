"""Having the image for a plan's content tag: already here, pulled from the registry by that
tag, or built (base, context, BuildKit)."""

from __future__ import annotations

import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from ..errors import JobFailed
from ..image import base as base_image
from ..image import daemon, registry
from ..image.buildkit import BuildResult, docker_build
from ..image.context import Secrets, index_flags, prepare_build
from ..lock.lockfile import Lockfile
from ..lock.wheels import mirror_index
from ..plan.plan import Plan
from ..progress import SILENT, Progress
from ..workspace import Workspace


@dataclass(frozen=True)
class Built:
    """The image for the plan's content tag, and how it was had."""

    action: str  # built | local | pulled
    image_id: str
    size_bytes: int
    build: BuildResult | None = None
    registry_digest: str | None = None  # when pulled: the digest the registry holds


def obtain(ws: Workspace, plan: Plan, lock: Lockfile, client, repo: registry.Repository, *,
           smoke_dir: Callable[[], Path | None] = lambda: None, rebuild: bool = False,
           no_cache: bool = False, log_dir: Path | None = None,
           cache_from: tuple[str, ...] = (), progress: Progress = SILENT) -> Built:
    """The image for the content tag: already here, in the registry (pulled), or built
    (reusing the layers of the images `cache_from` names, by their inline cache)."""
    if not rebuild:
        if (img := daemon.local_image(client, plan.ref())) is not None:
            progress.note(f"{plan.ref()} is already here: nothing to build")
            return Built("local", img.id, img.attrs.get("Size", 0))
        if repo.host and (digest := registry.manifest_digest(repo, plan.content_tag)):
            # By digest: checked by the Engine.
            registry.pull(client, plan.ref(), digest, progress)
            img = client.images.get(plan.ref())
            progress.note(f"{plan.ref()} found in the registry: pulled instead of building")
            return Built("pulled", img.id, img.attrs.get("Size", 0), registry_digest=digest)
    # Asked only of a target that carries a smoke model: the checkpoint may be made for it.
    result = build_image(ws, plan, lock, client, repo,
                         smoke_dir=smoke_dir() if plan.smoke_model else None, no_cache=no_cache,
                         log_dir=log_dir, cache_from=cache_from, progress=progress)
    img = client.images.get(plan.ref())
    return Built("built", img.id, img.attrs.get("Size", 0), result)


def build_image(ws: Workspace, plan: Plan, lock: Lockfile, client, repo: registry.Repository,
                *, smoke_dir: Path | None = None, no_cache: bool = False,
                log_dir: Path | None = None, cache_from: tuple[str, ...] = (),
                progress: Progress = SILENT) -> BuildResult:
    """Base, context (with the smoke checkpoint in `smoke_dir`), `docker build`: tags the
    content tag on success only."""
    if plan.cpu_arch != base_image.host_cpu():
        base_image.check_emulation(plan.cpu_arch)  # every RUN step runs under QEMU
    os_base = ws.catalog.base(plan.base, plan.cpu_arch)
    if plan.base_image == os_base.image:  # a cuda-devel image's nvidia/cuda base is pulled as usual
        base_image.ensure_local(client, os_base, repo if repo.host else None)
    if plan.smoke_model and smoke_dir is None:
        raise JobFailed(f"{plan.target} carries smoke model {plan.smoke_model}, and none was "
                        "given to build it with")
    index_urls = ws.target(plan.target, plan.platform).request.extra_index_urls  # with credentials
    mirror = mirror_index()  # the host's PyPI mirror: the lock came from there too
    index_urls += (mirror,) if mirror else ()
    with tempfile.TemporaryDirectory(prefix="imgbuild-ctx-") as td:
        built = prepare_build(plan, lock, Path(td), wheels=ws.wheels, smoke_model_dir=smoke_dir,
                              patches=ws.patches, index_urls=index_urls,
                              host=Secrets.from_host())
        carried = built.carried
        flags = index_flags(plan, bool(carried), mirror)
        log_path = (log_dir / f"{plan.content_tag}.build.log") if log_dir else None
        try:
            return docker_build(plan, built.context, secrets=built.secrets, flags=flags,
                                progress=progress, log_path=log_path, no_cache=no_cache,
                                cache_from=cache_from)
        except JobFailed as e:
            e.hint = unreachable_hint(plan.extra_index_urls, e.log_tail, bool(carried)) or e.hint
            raise


def unreachable_hint(extra_index_urls: tuple[str, ...], log_tail: list[str],
                     carried: bool) -> str | None:
    """The hint for a build that failed because uv inside it could not reach an extra index
    (the CPU torch index, say), when no local wheel directory stood in for it; else None."""
    unreachable = [u for u in extra_index_urls
                   if any(f"Failed to fetch: {u}" in ln for ln in log_tail)]
    if unreachable and not carried:
        return (f"{unreachable[0]} is out of reach from the build; a local directory holding "
                "the same wheels can stand in for it: --wheels DIR (or IMGBUILD_WHEELS)")
    return None
