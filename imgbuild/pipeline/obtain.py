"""Having the image for a plan's content tag: already here, pulled from the registry by that
tag, or built (base, context, BuildKit)."""

from __future__ import annotations

import dataclasses
import io
import json
import tempfile
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass
from pathlib import Path
from typing import IO, TYPE_CHECKING

from ..errors import JobFailed
from ..image import attest, daemon, registry
from ..image.compression import Compression
from ..lock.lockfile import Lockfile
from ..lock.wheels import mirror_index
from ..plan import render
from ..plan.plan import Plan
from ..progress import SILENT, Progress
from ..workspace import Workspace

# What builds and splices (BuildKit, the build context, base images, the wire) is imported where
# it is used: an image found here or pulled needs none of it, and it took longer to import than
# the rest of such a build (bench/startup_bench.py; tests/test_layering.py keeps it out of it).
if TYPE_CHECKING:
    from ..image import layercut, splice, wire
    from ..image.buildkit import BuildResult, Export


@dataclass(frozen=True)
class Built:
    """The image for the plan's content tag, and how it was had."""

    action: str  # built | local | pulled | spliced
    image_id: str
    size_bytes: int
    build: BuildResult | None = None
    registry_digest: str | None = None  # when pulled: the digest the registry holds
    # spliced: made in the registry (image/splice.py), not in the Engine; its manifest is put
    # under the content tag by publish, and what the SBOM lists of the OS comes with it.
    spliced: splice.Spliced | None = None
    os_packages: tuple[dict[str, str], ...] = ()


def obtain(ws: Workspace, plan: Plan, lock: Lockfile, client, repo: registry.Repository, *,
           smoke_dir: Callable[[], Path | None] = lambda: None, rebuild: bool = False,
           no_cache: bool = False, log_dir: Path | None = None,
           cache_from: tuple[str, ...] = (), splice_from: tuple[str, ...] = (),
           compression: Compression | None = None, progress: Progress = SILENT,
           export: Callable[[], Export] | None = None) -> Built:
    """The image for the content tag: already here, in the registry (pulled), or built
    (reusing the layers of the images `cache_from` names, by their inline cache).

    export: what more than its default BuildKit is asked for (image/buildkit.py Export;
    None: Export()), decided from the Engine only when something is built.

    splice_from: tags of the registry whose heavy layers the image may take as they are, its
    other layers built without them and pushed in `compression` (image/splice.py); for a build
    that is pushed and not run here. Where none fits, the image is built as usual."""
    if not rebuild:
        if (img := daemon.local_image(client, plan.ref())) is not None:
            progress.note(f"{plan.ref()} is already here: nothing to build")
            return Built("local", img.id, img.attrs.get("Size", 0))
        if repo.host and (digest := registry.manifest_digest(repo, plan.content_tag)):
            policy = ws.registries.policy_for(repo.name)
            if policy is not None:
                # As `imgbuild pull`: nothing the registry's signed-by policy refuses is
                # pulled (imported on use: the crypto, for a registry with a policy only).
                from ..image import signstore

                signstore.enforce(repo, digest, policy, plan.ref())
            # By digest: checked by the Engine.
            registry.pull(client, plan.ref(), digest, progress)
            img = client.images.get(plan.ref())
            progress.note(f"{plan.ref()} found in the registry: pulled instead of building")
            return Built("pulled", img.id, img.attrs.get("Size", 0), registry_digest=digest)
    from ..image.buildkit import Export  # imported on use: to build

    # Asked only of a target that carries a smoke model: the checkpoint may be made for it.
    smoke = smoke_dir() if plan.smoke_model else None
    if splice_from and compression is not None and not no_cache:
        got = splice_image(ws, plan, lock, client, repo, refs=splice_from, comp=compression,
                           smoke_dir=smoke, log_dir=log_dir, cache_from=cache_from,
                           progress=progress)
        if got is not None:
            return got
    result = build_image(ws, plan, lock, client, repo, smoke_dir=smoke, no_cache=no_cache,
                         log_dir=log_dir, cache_from=cache_from, progress=progress,
                         export=(export or Export)())
    img = client.images.get(plan.ref())
    return Built("built", img.id, img.attrs.get("Size", 0), result)


def splice_image(ws: Workspace, plan: Plan, lock: Lockfile, client, repo: registry.Repository,
                 *, refs: tuple[str, ...], comp: Compression, smoke_dir: Path | None,
                 log_dir: Path | None, cache_from: tuple[str, ...],
                 progress: Progress = SILENT) -> Built | None:
    """The image made in the registry from a donor's heavy layers and the top built here
    (image/splice.py); None, having said why, where that cannot be done."""
    from ..image import splice  # imported on use: to splice

    heavy = set(plan.heavy_packages)
    patches = ws.patches
    no = splice.refused(plan, lambda p: p in patches and patches[p].package in heavy)
    donor, why = (None, [no]) if no else splice.find_donor(repo, plan, lock, refs, comp)
    if donor is None:
        progress.note("not spliced, the image is built whole: "
                      + ("; ".join(why) or "no earlier image of the target in the registry"))
        return None
    progress.note(f"the heavy layers are {repo.name}:{donor.ref}'s: building the layers "
                  "above them alone")
    top = f"{plan.ref()}-top"
    if not plan.patch_digest:  # the patch step patches the rest layer's files in place
        try:
            cut = _cut_splice(ws, plan, lock, client, repo, donor, top, refs=refs, comp=comp,
                              smoke_dir=smoke_dir, log_dir=log_dir, cache_from=cache_from,
                              progress=progress)
        except _Whole as e:
            progress.note(f"not spliced after all, the image is built whole: {e}")
            return None
        if cut is not None:
            return cut
    result = build_image(ws, plan, lock, client, repo, smoke_dir=smoke_dir, log_dir=log_dir,
                         cache_from=cache_from, progress=progress, with_heavy=False, tag=top)
    try:
        img = client.images.get(top)
        created_by = [h.get("CreatedBy", "") for h in reversed(client.api.history(top))]
        no = splice.check_top(donor, created_by, list(img.attrs["RootFS"]["Layers"]))
        if no is not None:
            progress.note(f"not spliced after all, the image is built whole: {no}")
            return None
        layers = _send_top(client, top, repo, plan, donor, refs, comp, progress)
        made = splice.assemble(repo, donor, layers, int(img.attrs.get("Size") or 0))
        debs = tuple(attest.os_packages(top))
    finally:
        client.images.remove(top, noprune=True)
    progress.note(f"spliced {plan.ref()}: {made.heavy_layers} heavy layers from {made.donor}")
    return Built("spliced", made.config_digest, made.size_bytes, result, spliced=made,
                 os_packages=debs)


def _send_top(client, top: str, repo: registry.Repository, plan: Plan, donor: splice.Donor,
              refs: tuple[str, ...], comp: Compression, progress: Progress) -> wire.Layers:
    """The top's layers into the registry (those it holds, the donor's among them, cost a
    HEAD), and its config read."""
    from ..image import wire  # imported on use: to splice

    with progress.transfer("push", plan.ref()) as moving:
        return wire.send_layers(client, top, repo, comp=comp,
                                hint_refs=[donor.ref, *(r.rpartition(":")[2] for r in refs)],
                                platform=plan.platform, feed=moving.feed, config_wanted=True)


class _Whole(Exception):
    """The splice does not fit after all: the image is built whole (the message says why)."""


class _Later:
    """The progress of work done beside a build on the screen: its notes kept, to be said once
    that build is over (a terminal shows one live display at a time, and two builds' lines
    interleaved read as one); no status or bars of its own."""

    def __init__(self) -> None:
        self.notes: list[tuple[str, str]] = []

    def note(self, message: str, *, level: str = "info") -> None:
        self.notes.append((message, level))

    def status(self, message: str):
        return SILENT.status(message)

    def transfer(self, kind: str, ref: str):
        return SILENT.transfer(kind, ref)

    def say(self, progress: Progress, heading: str) -> None:
        if self.notes:
            progress.note(heading)
        for message, level in self.notes:
            progress.note(message, level=level)


@dataclass(frozen=True)
class _Top:
    """A cut splice's top, built without its rest install and sent: where the rest layer goes."""

    result: BuildResult
    layers: wire.Layers
    size: int
    rest: dict  # the rest install's history entry
    history_at: int
    layer_at: int
    os_packages: tuple[dict[str, str], ...]


def _make_top(ws: Workspace, plan: Plan, lock: Lockfile, client, repo: registry.Repository,
              donor: splice.Donor, top: str, *, refs: tuple[str, ...], comp: Compression,
              smoke_dir: Path | None, log_dir: Path | None, cache_from: tuple[str, ...],
              progress: Progress) -> _Top:
    """The top without its rest install, built, checked against the donor and sent. Raises
    NotCut where the cut does not fit (the top is then built with its rest layer), _Whole
    where the splice does not."""
    from ..image import layercut, splice  # imported on use: to splice

    result = build_image(ws, plan, lock, client, repo, smoke_dir=smoke_dir, log_dir=log_dir,
                         cache_from=cache_from, progress=progress, with_heavy=False, tag=top,
                         rest="skip", log_name=f"{plan.content_tag}.top.build.log")
    img = client.images.get(top)
    layers = _send_top(client, top, repo, plan, donor, refs, comp, progress)
    assert layers.config is not None
    history = json.loads(layers.config).get("history") or []
    at = next((i for i, h in enumerate(history)
               if h.get("created_by", "").startswith("COPY lock/rest.txt ")), None)
    command = render.recorded_command(render.rest_install(plan))
    entry = splice.rest_history(donor, command, result.flags,
                                history[at]["created"] if at is not None else "")
    if at is None or entry is None:
        raise layercut.NotCut("the previous image's heavy install is not this build's rest "
                              "install but for its part")
    created_by = [h.get("created_by", "") for h in history]
    created_by.insert(at + 1, entry["created_by"])
    no = splice.check_top(donor, created_by, list(layers.diff_ids))
    if no is not None:
        raise _Whole(no)
    layer_at = sum(1 for h in history[:at + 1] if not h.get("empty_layer"))
    return _Top(result, layers, int(img.attrs.get("Size") or 0), entry, at + 1, layer_at,
                tuple(attest.os_packages(top)))


def _cut_splice(ws: Workspace, plan: Plan, lock: Lockfile, client, repo: registry.Repository,
                donor: splice.Donor, top: str, *, refs: tuple[str, ...], comp: Compression,
                smoke_dir: Path | None, log_dir: Path | None, cache_from: tuple[str, ...],
                progress: Progress) -> Built | None:
    """The splice with its rest layer cut from the built filesystem (image/layercut.py): the
    filesystem as the rest install leaves it streamed out of BuildKit, cut, compressed and
    sent as it comes, while beside it the top is built without the rest install, checked
    and sent (the cut waits for the layers under it). None, having said why, where the cut
    does not fit: the caller builds the top with its rest layer. Raises _Whole where the
    splice does not fit."""
    from ..image import layercut, splice, wire  # imported on use: to splice

    start = time.monotonic()
    _base_ready(ws, plan, client, repo)  # once, here, before two builds want it
    beside = _Later()
    made_top: Future[_Top] = Future()
    lower: Future[dict[str, layercut.Entry]] = Future()

    def make() -> None:
        try:
            got_top = _make_top(ws, plan, lock, client, repo, donor, top, refs=refs, comp=comp,
                                smoke_dir=smoke_dir, log_dir=log_dir, cache_from=cache_from,
                                progress=beside)
        except BaseException as e:  # the build beside it stops on it (its sink raises it)
            made_top.set_exception(e)
            lower.set_exception(e)
            return
        made_top.set_result(got_top)
        try:
            # What the layers under the rest install hold (from the registry, a few hundred
            # MB unpacked at most), read while the rest install runs.
            lower.set_result(layercut.lower_entries(
                io.BytesIO(splice.decompressed(d["mediaType"],
                                               registry.get_blob(repo, d["digest"])))
                for d in got_top.layers.descriptors[:got_top.layer_at]))
        except BaseException as e:
            lower.set_exception(e)

    stats = layercut.Cut()
    got: list[tuple[str, wire.Held]] = []

    def sink(fs: IO[bytes]) -> None:
        got.append(wire.send_stream(layercut.cut(fs, lower.result(), stats), repo, comp,
                                    lambda e: None, "rest"))

    beside_top = threading.Thread(target=make, name="splice-top", daemon=True)
    beside_top.start()
    try:
        try:
            installed = build_image(ws, plan, lock, client, repo, smoke_dir=smoke_dir,
                                    log_dir=log_dir, cache_from=cache_from, progress=progress,
                                    with_heavy=False, rest="last", tar_sink=sink)
        finally:
            beside_top.join()
            beside.say(progress, f"beside it, {top} (the layers above the rest install):")
        done = made_top.result()
    except layercut.NotCut as e:
        progress.note(f"the rest layer is built into the top: {e}")
        return None
    finally:
        if daemon.local_image(client, top) is not None:
            client.images.remove(top, noprune=True)
    # The build's account is the rest install's (its steps, its cache reads), its time both
    # builds' (side by side).
    result = dataclasses.replace(installed, seconds=time.monotonic() - start)
    diff_id, held = got[0]
    rest = splice.CutLayer(done.history_at, done.layer_at, done.rest, diff_id,
                           wire.descriptor(held), held.tar_size or 0)
    made = splice.assemble(repo, donor, done.layers, done.size, rest)
    progress.note(f"spliced {plan.ref()}: {made.heavy_layers} heavy layers from {made.donor}, "
                  f"the rest layer cut from the built filesystem ({stats.kept} of "
                  f"{stats.entries} entries)")
    return Built("spliced", made.config_digest, made.size_bytes, result, spliced=made,
                 os_packages=done.os_packages)


def build_image(ws: Workspace, plan: Plan, lock: Lockfile, client, repo: registry.Repository,
                *, smoke_dir: Path | None = None, no_cache: bool = False,
                log_dir: Path | None = None, cache_from: tuple[str, ...] = (),
                progress: Progress = SILENT, with_heavy: bool = True,
                tag: str | None = None, rest: str = "install",
                tar_sink: Callable[[IO[bytes]], None] | None = None,
                log_name: str | None = None, export: Export | None = None) -> BuildResult:
    """Base, context (with the smoke checkpoint in `smoke_dir`), `docker build`: tags the
    content tag (or `tag`) on success only. with_heavy=False: the top of a splice; rest and
    tar_sink: render.dockerfile's and buildkit.docker_build's; log_name: the build log's name
    in log_dir (default: the content tag's); export: None is Export()."""
    from ..image.buildkit import Export, docker_build  # imported on use: to build
    from ..image.context import Secrets, index_flags, prepare_build

    _base_ready(ws, plan, client, repo)
    if plan.smoke_model and smoke_dir is None:
        raise JobFailed(f"{plan.target} carries smoke model {plan.smoke_model}, and none was "
                        "given to build it with")
    index_urls = ws.target(plan.target, plan.platform).request.extra_index_urls  # with credentials
    mirror = mirror_index()  # the host's PyPI mirror: the lock came from there too
    index_urls += (mirror,) if mirror else ()
    with tempfile.TemporaryDirectory(prefix="imgbuild-ctx-") as td:
        built = prepare_build(plan, lock, Path(td), wheels=ws.wheels, smoke_model_dir=smoke_dir,
                              patches=ws.patches, index_urls=index_urls,
                              host=Secrets.from_host(), with_heavy=with_heavy, rest=rest)
        carried = built.carried
        flags = index_flags(plan, bool(carried), mirror)
        log_path = (log_dir / (log_name or f"{plan.content_tag}.build.log")) if log_dir \
            else None
        try:
            return docker_build(plan, built.context, secrets=built.secrets, flags=flags,
                                progress=progress, log_path=log_path, no_cache=no_cache,
                                cache_from=cache_from, tag=tag, tar_sink=tar_sink,
                                export=export if export is not None else Export())
        except JobFailed as e:
            e.hint = unreachable_hint(plan.extra_index_urls, e.log_tail, bool(carried)) or e.hint
            raise


def _base_ready(ws: Workspace, plan: Plan, client, repo: registry.Repository) -> None:
    """The base image here for BuildKit (an imgbuild base pulled from the registry)."""
    from ..image import base as base_image  # imported on use: to build

    if plan.cpu_arch != base_image.host_cpu():
        base_image.check_emulation(plan.cpu_arch)  # every RUN step runs under QEMU
    os_base = ws.catalog.base(plan.base, plan.cpu_arch)
    if plan.base_image == os_base.image:  # a cuda-devel image's nvidia/cuda base is pulled as usual
        base_image.ensure_local(client, os_base, repo if repo.host else None)


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
