"""`imgbuild [build] TARGET`: the main job as separate steps that return values.

    plan → dependency check → obtain (reuse by content tag, or build) → gate (smoke) → publish

`build_target` only sequences them and decides what to skip; each step can be called on its
own (CI's bake path builds elsewhere and calls gate and publish through `build_target` on the
image it finds by content tag).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from ..catalog.registries import ATTESTATION_TYPES, SignPolicy
from ..checks import drift
from ..checks.deps import check_deps
from ..errors import InputError, JobFailed
from ..image import attest, buildlock, cosigncli, daemon, inlinecache, registry, smoke
from ..image.compression import compression as compression_named
from ..image.compression import kind_of
from ..lock.lockfile import Lockfile
from ..plan.decide import make_plan
from ..plan.index import IndexPlan, make_index_plan
from ..plan.plan import Plan
from ..progress import SILENT, Progress, human_bytes
from ..workspace import Workspace
from .index import Assembled, assemble
from .obtain import Built, obtain
from .smokemodel import publish_smoke_model, smoke_model

# What a build that finds its image here and its smoke report reused does not use is imported
# where it is used: the Docker Engine's facts and BuildKit (to build), the wire and the base
# images (to push, to build, for other platforms). Those imports took longer than the rest of
# such a build (bench/startup_bench.py; tests/test_layering.py keeps them out of it).
if TYPE_CHECKING:
    from ..image import engine
    from ..image.buildkit import Export
    from ..image.cosign import SigningKey
    from ..image.cosigncli import Delegated

    Signer = SigningKey | Delegated  # imgbuild signs with the first, cosign with the second


@dataclass(frozen=True)
class BuildOptions:
    """What the user asked `imgbuild build` for."""

    target: str
    model: str | None = None
    registry: str | None = None  # HOST[:PORT]/REPO, or a local repository name
    archs: tuple[str, ...] | None = None
    flavor: str | None = None
    push: bool = False
    rebuild: bool = False  # build even if the content tag exists
    smoke: bool = True
    force: bool = False  # move the moving tags even if the smoke test fails
    platforms: tuple[str, ...] | None = None  # --platform: some of the target's (default all)
    no_cache: bool = False
    cache_from: bool = True  # reuse layers from this target's images in the registry
    cache_from_refs: tuple[str, ...] = ()  # --cache-from: other images whose layers to reuse
    log_dir: Path | None = None
    resmoke: bool = False  # run the smoke test even if this image passed it before
    compression: str | None = None  # --compression; None: images/registries.yaml's rule
    splice: bool = True  # pushed, not run here: the heavy layers may stay in the registry
    registry_cache: bool = False  # the registry build cache (mode=max), where the Engine has it
    # --sign-key: a cosign key file or env://VAR (imgbuild signs), `keyless` or a KMS URI (the
    # cosign binary signs); signs what is pushed
    sign_key: str | None = None


@dataclass(frozen=True)
class Gate:
    """What the smoke gate decided: whether the moving tags may move, and why not."""

    report: smoke.SmokeReport | None
    open: bool  # the moving tags may move
    held: str | None = None  # why they may not
    forced: bool = False  # --force: they move whatever the smoke test says


@dataclass(frozen=True)
class Published:
    pushed: tuple[str, ...] = ()  # ref@digest
    moved: tuple[str, ...] = ()  # moving tags set (locally, and in the registry when pushed)
    report_ref: str | None = None
    compression: str | None = None  # of the layers pushed
    sent_bytes: int = 0  # compressed layer bytes uploaded (layers the registry held: none)
    reused_layers: int = 0  # layers the registry held already
    cached_layers: int = 0  # of those sent, from this machine's blob cache (not compressed again)
    build_cache: str | None = None  # the cache tag, when moved onto this image (cache_tag)
    mounted_layers: int = 0  # of those held, mounted from another repository of the registry
    signed: tuple[str, ...] = ()  # the `.sig`/`.att` tags written (cosign's layout)
    # who signed: {"method": "key"|"kms", "key": ...} or {"method": "keyless", "subject": ...,
    # "issuer": ...} (read back from the registry's signature); None: not signed by this run
    signed_by: dict | None = None


@dataclass(frozen=True)
class Outcome:
    plan: Plan
    built: Built
    gate: Gate
    published: Published
    seconds: float

    @property
    def action(self) -> str:
        return self.built.action

    def to_dict(self) -> dict:
        b, g, p = self.built, self.gate, self.published
        return {
            "target": self.plan.target, "action": b.action, "image_id": b.image_id,
            "content_tag": self.plan.ref(), "refs": list(self.plan.refs),
            "seconds": round(self.seconds, 1), "size_bytes": b.size_bytes,
            "smoke": g.report.to_dict() if g.report else None, "pushed": list(p.pushed),
            "moved": list(p.moved), "held": g.held, "report": p.report_ref,
            "signed": list(p.signed), "signed_by": p.signed_by,
            "push": None if p.compression is None else {
                "compression": p.compression, "sent_bytes": p.sent_bytes,
                "reused_layers": p.reused_layers, "cached_layers": p.cached_layers,
                "mounted_layers": p.mounted_layers, "build_cache": p.build_cache},
            "build": None if b.build is None else {
                "seconds": round(b.build.seconds, 1), "steps": b.build.steps,
                "cached_steps": b.build.cached_steps,
                "cache_imported": list(b.build.cache_imported)},
        }


@dataclass(frozen=True)
class MultiOutcome:
    """A multi-platform target's build: each platform's Outcome, then its index."""

    index: IndexPlan
    outcomes: tuple[Outcome, ...]
    assembled: Assembled | None  # None: not assembled (held says why)
    moved: tuple[str, ...]  # moving tags set locally, onto this host's platform image
    held: str | None
    seconds: float

    @property
    def action(self) -> str:
        return ", ".join(f"{o.plan.platform} {o.action}" for o in self.outcomes)

    def to_dict(self) -> dict:
        pushed = [r for o in self.outcomes for r in o.published.pushed]
        if self.assembled is not None:
            pushed += list(self.assembled.pushed)
        return {"target": self.index.target, "action": self.action,
                "platforms": {o.plan.platform: o.to_dict() for o in self.outcomes},
                "index": self.index.to_dict() | {
                    "digest": self.assembled.digest if self.assembled else None,
                    "signed": list(self.assembled.signed) if self.assembled else [],
                    "held": self.held},
                "content_tag": self.index.ref(), "refs": list(self.index.refs),
                "pushed": pushed, "moved": list(self.moved), "held": self.held,
                "seconds": round(self.seconds, 1)}


def build_target(ws: Workspace, opts: BuildOptions,
                 progress: Progress = SILENT) -> Outcome | MultiOutcome:
    """Build one image, or for a target that names several platforms, one per platform (all
    of them, or those `opts.platforms` names) and then their index."""
    target = ws.catalog.target(opts.target)
    chosen = tuple(r.target.platforms[0] for r in ws.platform_refs(opts.target, opts.platforms))
    if not target.multi_platform:
        return build_platform(ws, opts, chosen[0], progress)
    from ..image import base as base_image  # imported on use: several platforms

    start = time.monotonic()
    repo = registry.repository(opts.registry, opts.push)
    index = make_index_plan(ws, opts.target, model=opts.model, repository=repo.name,
                            archs=opts.archs, flavor=opts.flavor, forced=opts.force)
    # The key signs each platform's image (build_platform opens it again) and then the index;
    # opened here first, so a key that cannot sign is refused before anything is built.
    policy = ws.registries.policy_for(repo.name) if opts.push else None
    signer = signing_key(opts.sign_key, push=opts.push, policy=policy)
    outcomes = []
    for p in chosen:
        progress.note(f"{opts.target}: {p}" + (" (under QEMU user emulation)"
                                                if p != base_image.host_platform() else ""))
        outcomes.append(build_platform(ws, opts, p, progress))
    return finish_index(index, tuple(outcomes), repo, push=opts.push, client=daemon.client(),
                        seconds_from=start, signer=signer, policy=policy,
                        commit=attest.git_commit(ws.images) if signer is not None else None,
                        progress=progress)


def finish_index(index: IndexPlan, outcomes: tuple[Outcome, ...], repo: registry.Repository, *,
                 push: bool, client, seconds_from: float, signer: SigningKey | None = None,
                 policy: SignPolicy | None = None, commit: str | None = None,
                 progress: Progress = SILENT) -> MultiOutcome:
    """After each platform's gate: the moving tags locally onto this host's platform image,
    and in the registry onto the index, assembled once every platform passed and was pushed
    (and, with `signer`, signed before its tags move: pipeline/index.py)."""
    from ..image import base as base_image  # imported on use: several platforms

    host = base_image.host_platform()
    failed = [f"{o.plan.platform}: {o.gate.held}" for o in outcomes if not o.gate.open]
    missing = [p for p in index.platforms if p not in {o.plan.platform for o in outcomes}]
    moved: list[str] = []
    # A spliced image is in the registry only: nothing here to tag.
    mine = next((o for o in outcomes if o.plan.platform == host and o.gate.open
                 and o.built.spliced is None), None)
    if mine is not None:
        # The Engine holds one image per tag: here it is the one this machine runs.
        img = client.images.get(mine.plan.ref())
        for t in index.tags:
            img.tag(index.repository, t)
            moved.append(index.ref(t))
    held = None
    if failed:
        held = f"not every platform's moving tags may move ({'; '.join(failed)})"
    elif missing:
        held = (f"only {', '.join(o.plan.platform for o in outcomes)} was built; the index "
                f"needs {', '.join(index.platforms)} (`imgbuild index {index.target} "
                f"--registry REPO` once each is pushed)")
    elif not push:
        held = "not pushed (--push assembles the index in the registry)"
    assembled = assemble(index, repo, signer=signer, policy=policy, commit=commit,
                         progress=progress) if held is None else None
    if held:
        progress.note(f"index {index.ref()} not assembled: {held}")
    return MultiOutcome(index, outcomes, assembled, tuple(moved), held,
                        time.monotonic() - seconds_from)


def build_platform(ws: Workspace, opts: BuildOptions, platform: str | None = None,
                   progress: Progress = SILENT) -> Outcome:
    """One platform's image: plan, check, obtain, gate, publish its content tag (and, for a
    single-platform target, its moving tags)."""
    start = time.monotonic()
    repo = registry.repository(opts.registry, opts.push)
    plan = make_plan(ws, opts.target, model=opts.model, repository=repo.name, archs=opts.archs,
                     flavor=opts.flavor, forced=opts.force, platform=platform)
    lock = ws.target(plan.target, plan.platform).lock()
    # Before anything is built: a symbol the engine uses that its locked dependency lacks
    # would fail at model load, after the download. Needs no Docker, so it comes first.
    err = drift.as_error(check_deps(ws, plan.target, model=plan.model, lock=lock,
                                    platform=plan.platform))
    if err is not None:
        raise err
    client = daemon.client()
    registry.check_reachable(repo)
    compression = opts.compression or ws.registries.rule_for(repo.name).compression
    # Before anything is built: a key that cannot sign, or that the registry's policy does not
    # trust, would only be found after the build and the smoke test.
    policy = ws.registries.policy_for(repo.name) if opts.push else None
    signer = signing_key(opts.sign_key, push=opts.push, policy=policy)
    known: list[tuple[engine.EngineFacts, engine.EngineUse]] = []

    def this_engine() -> tuple[engine.EngineFacts, engine.EngineUse]:
        """What this Engine is and offers (image/engine.py), asked once, only when needed."""
        from ..image import engine  # imported on use: to push or to build

        if not known:
            facts = engine.read_facts(client)
            known.append((facts, engine.decide(facts)))
        return known[0]

    if opts.push and (refused := this_engine()[1].refusal) is not None:
        raise refused.error()  # before anything is built: nothing could be published

    def export() -> Export:
        facts, use = this_engine()
        cache = cache_ref(plan, repo, opts)
        held = cache is not None and use.cache.value == "registry" and \
            registry.manifest_digest(repo, cache.rpartition(":")[2]) is not None
        got = build_export(use, compression, cache, push=opts.push, cache_held=held)
        said = got.describe() or ["BuildKit's default output, the inline cache"]
        progress.note(f"building with {facts.builder} on Engine {facts.version} "
                      f"({facts.store} store): {'; '.join(said)}")
        return got

    # The lock covers making the image and its smoke test: a second imgbuild for this content
    # key waits, then finds the image and the report, and builds and tests nothing. The push
    # is outside it: it only reads the finished image, so two pushes of one image (to two
    # registries, or twice to one: blobs and manifests are content-addressed, tags go to the
    # same digest) run side by side instead of one waiting out the other's upload.
    with buildlock.exclusive(plan.content_key, log=progress.note):
        built = obtain(ws, plan, lock, client, repo, rebuild=opts.rebuild,
                       smoke_dir=lambda: smoke_model(ws, plan.smoke_model, plan.smoke_model_key,
                                                     client, repo, log_dir=opts.log_dir,
                                                     progress=progress),
                       no_cache=opts.no_cache, log_dir=opts.log_dir,
                       cache_from=readable_cache(client, repo, cache_refs(plan, repo, opts)),
                       splice_from=splice_refs(plan, repo, opts),
                       compression=compression_named(compression),
                       progress=progress, export=export)
        gated = gate(plan, built, client, repo, run_smoke=opts.smoke, force=opts.force,
                     resmoke=opts.resmoke, progress=progress)
    if opts.push and plan.smoke_model:
        # Other machines fetch the checkpoint by its recipe key instead of generating it.
        publish_smoke_model(ws, plan.smoke_model, plan.smoke_model_key, client, repo,
                            log_dir=opts.log_dir, progress=progress)
    published = publish(plan, gated, client, repo, push=opts.push, lock=lock,
                        compression=compression,
                        # only a push writes provenance: no `git` run for a build kept here
                        commit=attest.git_commit(ws.images) if opts.push else None,
                        built=built, signer=signer, policy=policy, progress=progress)
    return Outcome(plan, built, gated, published, time.monotonic() - start)


def cache_ref(plan: Plan, repo: registry.Repository, opts: BuildOptions) -> str | None:
    """The registry build cache of this target (and platform): every stage's layers, written
    with mode=max where the Engine can export it, read by the next fresh runner."""
    if repo.host is None or opts.no_cache or not opts.cache_from or not opts.registry_cache:
        return None
    return plan.ref(plan.cache_tag + "-max")


def build_export(use: engine.EngineUse, compression: str, cache: str | None, *,
                 push: bool, cache_held: bool = False) -> Export:
    """What the build asks of BuildKit on this Engine: the reproducible route (rewrite-timestamp
    through an OCI archive, its layers in the compression the registry wants, so the push sends
    them as they are) where the Engine has it. The registry cache where it was asked for
    (`cache`: --registry-cache) and the Engine exports it: written when the build is pushed
    (writing needs push rights), and read alone where the registry holds it (`cache_held`):
    read beside the images' inline caches, BuildKit 0.13 matched neither for the heavy install
    step (measured on Engine 26.1.5). Off by default: there, a fresh runner got less from it
    than from the inline cache (bench/registry_cache_bench.py)."""
    from ..image.buildkit import Export  # imported on use: to build

    registry_cache = use.cache.value == "registry" and cache is not None
    return Export(reproducible=use.rewrite_timestamp.value is True, compression=compression,
                  cache_to=cache if registry_cache and push else None,
                  cache_from=(cache,) if registry_cache and cache_held else ())


def cache_refs(plan: Plan, repo: registry.Repository, opts: BuildOptions) -> tuple[str, ...]:
    """The images in the registry whose layers this build may reuse (their inline cache): this
    content tag (a --rebuild), then the moving tags, which hold the target's previous image,
    then the cache tag, which holds the newest image that carries the heavy steps' results
    (the previous image may not: image/inlinecache.py). A fresh CI runner has no BuildKit
    cache: without these, an engine-only bump (a new rest lock, the same heavy layer) would
    rebuild torch and the CUDA wheels. A tag not there yet is skipped by BuildKit. Then the
    images --cache-from names (another repository's: the release one, for a build pushed to a
    staging one), after the target's own."""
    own = own_cache_refs(plan, repo, opts)
    if opts.no_cache or not opts.cache_from:
        return ()
    return (*own, *(r for r in dict.fromkeys(opts.cache_from_refs) if r not in own))


def own_cache_refs(plan: Plan, repo: registry.Repository,
                   opts: BuildOptions) -> tuple[str, ...]:
    """cache_refs without --cache-from's: the target's own images in its repository."""
    if repo.host is None or opts.no_cache or not opts.cache_from:
        return ()
    return (*plan.refs, plan.ref(plan.cache_tag))


def splice_refs(plan: Plan, repo: registry.Repository, opts: BuildOptions) -> tuple[str, ...]:
    """The images in the registry whose heavy layers this build may take as they are
    (image/splice.py): those it reads the cache of, where the image need not be on this
    machine at all: pushed, and no smoke test to run here."""
    runs_here = opts.smoke and bool(plan.smoke_model)
    if not opts.push or not opts.splice or runs_here:
        return ()
    # The target's own only: a spliced manifest names the donor's heavy blobs, which must
    # be in this repository already (--cache-from's may be in another).
    return own_cache_refs(plan, repo, opts)


def readable_cache(client, repo: registry.Repository, refs: tuple[str, ...]) -> tuple[str, ...]:
    """Of `refs`, those this Engine can unpack: an image in zstd (before Engine 23) is no cache
    for it, and BuildKit would fail the build on it rather than skip it."""
    def repo_of(ref: str) -> registry.Repository:
        name = ref.rpartition(":")[0]
        return repo if name == repo.name else registry.Repository.parse(name)

    return tuple(r for r in refs
                 if registry.engine_can_read(client, repo_of(r), r.rpartition(":")[2]))


def earlier_report(plan: Plan, built: Built, client,
                   repo: registry.Repository) -> smoke.SmokeReport | None:
    """A passing report made before for this very image: this machine's cache first, then the
    one the registry stores by the image's digest there (when the Engine knows that digest)."""
    found = smoke.recall(plan.ref(), built.image_id)
    if found is not None or repo.host is None:
        return found
    from ..image import wire  # imported on use: the registry's report

    # The digests the Engine records for the image in this repository. Under the containerd
    # store it records the image's own index digest there even before any push, which the
    # registry may not hold: each is only a candidate.
    digests = [d.split("@", 1)[1] for d in
               client.images.get(plan.ref()).attrs.get("RepoDigests") or []
               if d.startswith(repo.name + "@")]
    # Pushed by imgbuild's own client, the Engine records no repo digest: the registry's
    # content tag is this image when its config is this image's.
    got = registry.get_manifest(repo, plan.content_tag)
    mine = wire.config_digest_of(client, plan.ref(), plan.platform) if got else None
    if got is not None and mine is not None and \
            (got[1].get("config") or {}).get("digest") == mine:
        digests.append(got[0])
    for digest in dict.fromkeys(digests):
        stored = registry.fetch_report(repo, digest)
        if stored is not None:
            return smoke.reusable(plan.ref(), built.image_id, stored,
                                  f"registry, {repo.name}@{digest}")
    return None


def gate(plan: Plan, built: Built, client, repo: registry.Repository, *, run_smoke: bool = True,
         force: bool = False, resmoke: bool = False, progress: Progress = SILENT) -> Gate:
    """Smoke-test the image (or take the report the registry stores for a pulled one) and
    decide whether its moving tags may move. A failed smoke test moves the content tag aside
    (`…-smoke-failed`) and raises, unless forced."""
    report = None
    stored = registry.fetch_report(repo, built.registry_digest) \
        if built.action == "pulled" and built.registry_digest else None
    if stored is not None:
        report = smoke.SmokeReport(plan.ref(), bool(stored.get("ok")),
                                   tuple(stored.get("stages", [])), 0.0, stored,
                                   built.image_id, "registry")
    elif run_smoke and plan.smoke_model:
        if not resmoke:
            report = earlier_report(plan, built, client, repo)
        if report is not None:
            progress.note(f"smoke test not run again: {plan.ref()} passed it before "
                          f"({report.reused}); --resmoke runs it")
        else:
            with progress.status(f"smoke-testing {plan.ref()} in a container with no network "
                                 f"(versions, patches, kernels, the smoke model)"):
                report = smoke.run(plan.ref())
    decided = decide(report, has_smoke_model=bool(plan.smoke_model), force=force)
    if report is None or report.ok:
        if decided.held and plan.tags:  # a platform's image of an index has none to move
            progress.note(f"moving tags not moved: {decided.held}")
        return decided
    facts = [f"{s_['name']}: {s_['status']}: {s_.get('reason') or ''}" for s_ in report.stages]
    if not decided.open:
        # The content tag must not claim a finished, good image: move it aside.
        failed_ref = plan.ref(plan.content_tag + "-smoke-failed")
        client.images.get(plan.ref()).tag(*failed_ref.rsplit(":", 1))
        client.images.remove(plan.ref())
        raise JobFailed(f"smoke test failed for {plan.target}; no tag was moved", facts=facts,
                        hint=f"the image is kept as {failed_ref} to inspect; "
                             f"`imgbuild smoke {failed_ref}` reruns the check")
    progress.note(f"FORCED: the smoke test FAILED for {plan.ref()} and --force moves its tags "
                  "anyway; the image is labelled io.imgbuild.smoke-gate=forced", level="warn")
    return decided


def decide(report: smoke.SmokeReport | None, *, has_smoke_model: bool, force: bool) -> Gate:
    """The gate itself: the moving tags move on a passing report, or with --force; without a
    report (no smoke test ran, or the target has none) they stay, and `held` says why."""
    if report is None:
        if force:
            return Gate(None, True, None, forced=True)
        return Gate(None, False, "no smoke test ran (--no-smoke)" if has_smoke_model else
                    "the target has no smoke model")
    if report.ok:
        return Gate(report, True, forced=force)
    if force:
        return Gate(report, True, None, forced=True)
    return Gate(report, False, "the smoke test failed")


def publish(plan: Plan, gated: Gate, client, repo: registry.Repository, *, push: bool = False,
            lock: Lockfile | None = None, commit: str | None = None, compression: str = "gzip",
            built: Built | None = None, signer: Signer | None = None,
            policy: SignPolicy | None = None, progress: Progress = SILENT) -> Published:
    """Push the content tag first, then what refers to its digest (the smoke report, the SBOM
    and provenance when `lock` is given), then, with `signer` and an open gate, the image's
    signature and its SBOM and provenance as signed attestations (cosign's layout,
    image/signstore.py), then move the moving tags: a moving tag never points at something the
    registry does not fully hold, nor at an image without a passing report, and moves only onto
    a digest that passed `verify` (image/attest.py), the registry's signature `policy` included.
    A signing that fails moves no tag.

    A content tag never moves: where the registry holds it already, nothing is pushed under it
    (an image pulled from it is that image: a no-op), and what is published beside it is only
    what this run made of that very image.

    The layers go in `compression` (image/wire.py); those the registry holds for the target's
    previous image (its moving tags) are not sent again. A moving tag is the content tag's own
    manifest under another name: the same digest, nothing uploaded. A spliced image is in the
    registry already, but for its manifest (and is not in the Engine)."""
    spliced = built.spliced if built is not None else None
    img = client.images.get(plan.ref()) if spliced is None else None
    pushed: list[str] = []
    signed: list[str] = []
    signed_by = None
    report_ref = None
    sent = None
    build_cache = None
    digest = None
    if spliced is not None and not push:
        raise JobFailed(f"{plan.ref()} was spliced in the registry and must be pushed")
    if push:
        from ..image import wire  # imported on use: a build kept here sends nothing

        held = registry.manifest_digest(repo, plan.content_tag)
        same = held is not None and held_is_this_image(plan, built, held, client, repo)
        way = content_tag_way(held, same, pulled=built is not None and built.action == "pulled")
        if held is not None:
            digest = held
            progress.note(f"{plan.ref()} {way.said}", level="info" if same else "warn")
            # Nothing sent: every layer is the registry's, in the compression it holds them in.
            layers = registry.image_config(repo, held)[0].get("layers") or []
            kinds = {kind_of(la.get("mediaType", "")) for la in layers}
            sent = wire.Pushed(held, b"", kinds.pop() if len(kinds) == 1 else "mixed", 0, 0,
                               len(layers), 0)
        elif spliced is not None:
            manifest = spliced.manifest
            digest = wire.checked_put(repo, plan.content_tag, manifest, spliced.config,
                                      spliced.facts, ref=plan.ref(), immutable=True)
            got = spliced.pushed
            sent = wire.Pushed(digest, manifest, compression, got.sent_bytes, got.sent_layers,
                               got.reused_layers + spliced.heavy_layers, got.cached_layers,
                               got.mounted_layers)
        else:
            sent = wire.push(client, plan.ref(), repo, comp=compression_named(compression),
                             hint_refs=plan.tags, platform=plan.platform, progress=progress,
                             immutable=True)
            digest = sent.digest
        pushed.append(f"{plan.ref()}@{digest}")
        if held is None and sent is not None:
            progress.note(f"pushed {plan.ref()}@{digest[:19]}… ({compression}): "
                          f"{sent.sent_layers} layers sent ({human_bytes(sent.sent_bytes)}"
                          + (f"; {sent.cached_layers} from this machine's blob cache"
                             if sent.cached_layers else "")
                          + f"), {sent.reused_layers} already in the registry"
                          + (f" ({sent.mounted_layers} mounted from another repository)"
                             if sent.mounted_layers else ""))
        # What this run made of this very image goes beside it: its smoke report (where the
        # gate ran here, not where it took the registry's), its SBOM and provenance; each only
        # where the registry lacks it. Nothing is said of another image under the same tag.
        if way.attach:
            if gated.report is not None and registry.fetch_report(repo, digest) is None:
                report_ref = f"{repo.name}:" + registry.push_report(
                    repo, digest, gated.report.to_dict() | {"ok": gated.report.ok,
                                                             "forced": gated.forced})
            if lock is not None and (held is None or not attest.stored(repo, digest)):
                debs = list(built.os_packages) if built is not None and built.spliced \
                    else attest.os_packages(plan.ref())
                docs = {"sbom": attest.sbom(plan, lock, digest, debs),
                        "provenance": attest.provenance(plan, digest, commit)}
                attest.push(repo, digest, docs)
                progress.note(f"pushed the SBOM and provenance of {plan.ref()}@{digest[:19]}…")
            if signer is not None:
                unsigned = why_not_sign(built.action if built is not None else None, gated)
                if unsigned is None:
                    signed, signed_by = sign_published(repo, digest, signer)
                    progress.note(f"signed {plan.ref()}@{digest[:19]}… {said_by(signed_by)}"
                                  + (f": {', '.join(signed)}" if signed else
                                     " (its signature and attestations were there already)"))
                else:
                    progress.note(f"{plan.ref()} not signed: {unsigned}", level="warn")
        if held is None:
            build_cache = keep_build_cache(plan, repo, digest, progress)
    moved: list[str] = []
    if gated.open:
        if push:
            assert digest is not None
            checked = attest.verify(repo, digest, policy=policy)
            if not checked.ok:
                raise JobFailed(
                    f"the moving tags of {plan.target} were not moved: {repo.name}@"
                    f"{digest[:19]}… did not pass verify",
                    facts=[f"{c}: {detail}" for c, ok, detail in checked.checks if not ok],
                    hint=f"`imgbuild verify {repo.name}@{digest}` says the same; the "
                         "content tag stays as it is (content tags never move): push to "
                         "another repository, or delete that manifest in the registry and "
                         "build again")
        for t in plan.tags:
            if img is not None:
                img.tag(plan.repository, t)
                moved.append(plan.ref(t))
            if push:
                pushed.append(f"{plan.ref(t)}@{registry.tag_manifest(repo, digest, t)}")
    return Published(tuple(pushed), tuple(moved), report_ref,
                     sent.compression if sent else None, sent.sent_bytes if sent else 0,
                     sent.reused_layers if sent else 0, sent.cached_layers if sent else 0,
                     build_cache, sent.mounted_layers if sent else 0, tuple(signed), signed_by)


def signing_key(spec: str | None, *, push: bool, policy: SignPolicy | None) -> Signer | None:
    """The signer `--sign-key` names, checked against the registry's policy before anything is
    built: a key file or env://VAR loaded (exit 2 for a wrong password or a key the policy does
    not trust); `keyless` or a KMS URI handed to the cosign binary, which must be there (exit 3
    where it is not), with a KMS key's public half read through cosign and checked the same
    way. Each of these would otherwise show only after the build and the smoke test."""
    if spec is None:
        return None
    if not push:
        raise InputError("--sign-key signs what is pushed, and nothing is",
                         hint="add --push --registry HOST[:PORT]/REPO")
    kind = cosigncli.delegated_kind(spec) or "key"
    refused = signer_refusal(kind, policy)
    if refused is not None:
        raise InputError(f"--sign-key {spec} cannot make a signature {policy.where} accepts "
                         "for this registry", facts=[refused],
                         hint="sign as the registry's signed-by policy says, or change signed-by "
                              "in images/registries.yaml: the moving tags move only onto an "
                              "image the policy accepts")
    if kind != "key":
        signer = cosigncli.preflight(spec)
        if kind == "kms" and policy is not None:
            from ..image import cosign, signstore  # imported on use: the crypto, only to sign

            trusted, path = signstore.policy_key(policy)
            theirs, _ = signstore.kms_public_key(signer)
            if cosign.key_id(theirs) != cosign.key_id(trusted):
                raise InputError(f"the KMS key {spec} is not the key {policy.where} trusts for "
                                 "this registry",
                                 facts=[f"KMS key:    {cosign.key_id(theirs)}",
                                        f"policy key: {cosign.key_id(trusted)} "
                                        f"({path or 'inline PEM'})"],
                                 hint="sign with the policy's key, or put this key's public "
                                      f"half (`cosign public-key --key {spec}`) in signed-by")
        return signer
    from ..image import cosign, signstore  # imported on use: the crypto, only to sign

    key = signstore.load_signing_key(spec)
    if policy is not None:
        trusted, path = signstore.policy_key(policy)
        if not cosign.same_key(trusted, key):
            raise InputError(f"the signing key {key.source} is not the key {policy.where} "
                             "trusts for this registry",
                             facts=[f"signing key: {cosign.key_id(key.key.public_key())}",
                                    f"policy key:  {cosign.key_id(trusted)} "
                                    f"({path or 'inline PEM'})"],
                             hint="sign with the policy's key (its private half), or change "
                                  "signed-by in images/registries.yaml: the moving tags move "
                                  "only onto an image the policy accepts")
    return key


def signer_refusal(kind: str, policy: SignPolicy | None) -> str | None:
    """Why a signer of `kind` ("key", "kms", "keyless") can never satisfy the registry's
    policy (None: it may): a key policy accepts only that key's signatures, a keyless policy
    only a certificate for its identity."""
    if policy is None:
        return None
    if policy.keyless and kind != "keyless":
        return (f"the policy asks for a keyless signature by {policy.subject} (issuer "
                f"{policy.issuer}); a {'KMS ' if kind == 'kms' else ''}key signs with no "
                "certificate")
    if not policy.keyless and kind == "keyless":
        return ("the policy asks for a signature by its key; a keyless signature carries a "
                "certificate for the job's identity instead")
    return None


def why_not_sign(action: str | None, gated: Gate) -> str | None:
    """Why this run does not sign what it published (None: it signs). A signature says the
    project's CI made this image and it passed its smoke test: not for an image whose test
    failed or did not run, nor for one this run only pulled from the registry (whoever pushed
    it there without the key, with a passing report beside it, would get it signed)."""
    if gated.forced:
        return "its smoke test failed and --force moved its tags; a signature vouches for a pass"
    if not gated.open:
        return f"a signature vouches for a passing smoke test ({gated.held or 'none'})"
    if action == "pulled":
        return ("it was pulled from the registry, not built here; it keeps the signatures it "
                "has there (`--rebuild` builds and signs it)")
    reused = gated.report.reused if gated.report is not None else None
    if reused and reused.startswith("registry"):
        return (f"its smoke report is the one the registry stores ({reused}), not one made "
                "here (`--resmoke` runs it here, then signs)")
    return None


def sign_published(repo: registry.Repository, digest: str,
                   signer: Signer) -> tuple[list[str], dict]:
    """Sign the pushed image, and attest the SBOM and provenance the registry holds beside it
    (read back, each checked against its digest: what is signed is what is stored), with a key
    here or through cosign. (The tags written, who signed: for keyless, the identity of the
    certificate read back from the registry, not the one the job meant to have.)"""
    predicates: dict[str, dict] = {}
    sbom_doc = registry.fetch_artifact(repo, attest.tag(digest, "sbom"), attest.SBOM_TYPE)
    if sbom_doc is not None:
        predicates[ATTESTATION_TYPES["cyclonedx"]] = sbom_doc[1]
    prov = registry.fetch_artifact(repo, attest.tag(digest, "provenance"), attest.PROVENANCE_TYPE)
    if prov is not None and isinstance(prov[1].get("predicate"), dict):
        predicates[ATTESTATION_TYPES["slsaprovenance1"]] = prov[1]["predicate"]
    from ..image import signstore  # imported on use: the crypto, only to sign

    return signstore.sign_as(repo, digest, signer, predicates)


def said_by(signed_by: dict | None) -> str:
    """Who signed, in words (the build's report and its progress)."""
    if not signed_by:
        return "not signed by this run"
    if signed_by.get("method") == "keyless":
        return f"keyless as {signed_by['subject']} (issuer {signed_by['issuer']})"
    return f"with the {'KMS key' if signed_by.get('method') == 'kms' else 'key'} " \
           f"{signed_by['key']}"


@dataclass(frozen=True)
class ContentTagWay:
    """What publish does under the content tag, given what the registry holds there."""

    push: bool  # send the image and put its manifest under the content tag
    attach: bool  # put this run's smoke report, SBOM and provenance beside it, where missing
    said: str  # what the user is told (after the ref)


def content_tag_way(held: str | None, same: bool, *, pulled: bool) -> ContentTagWay:
    """A content tag never moves. Absent: push. Held for this very image (pulled from there,
    or the same config): a no-op, what this run made of it added where missing. Held for
    another image (the same inputs built elsewhere, other bytes): nothing of this run's is
    put under it or beside it; the registry's image stays the one the tag names."""
    if held is None:
        return ContentTagWay(True, True, "")
    if same:
        return ContentTagWay(False, True, f"is in the registry already ({held[:19]}…)"
                             + (", pulled from there" if pulled else "") + ": nothing to push")
    return ContentTagWay(False, False,
                         f"is in the registry already as another image ({held[:19]}…, built "
                         "elsewhere from the same inputs); content tags never move, so this "
                         "build was not pushed over it")


def held_is_this_image(plan: Plan, built: Built | None, held: str, client,
                       repo: registry.Repository) -> bool:
    """Whether the manifest the registry holds under the content tag (`held`) is the image
    this run has: the one it pulled from there, the one it spliced, or one whose config is
    the local image's."""
    if built is None:
        return False
    from ..image import wire  # imported on use: to push

    if built.action == "pulled":
        return built.registry_digest == held
    if built.spliced is not None:
        return (registry.image_config(repo, held)[0].get("config") or {}).get("digest") \
            == built.spliced.config_digest
    mine = wire.config_digest_of(client, plan.ref(), plan.platform)
    return mine is not None and (
        registry.image_config(repo, held)[0].get("config") or {}).get("digest") == mine


def keep_build_cache(plan: Plan, repo: registry.Repository, digest: str,
                     progress: Progress = SILENT) -> str | None:
    """Move the cache tag onto the image just pushed when its inline cache carries the heavy
    steps' results; otherwise leave it on the earlier image that does, and say so. Not gated on
    the smoke test: it is read as build cache only, never pulled or run."""
    _, config = registry.image_config(repo, digest)
    if not inlinecache.carries_heavy(config):
        progress.note(f"{plan.ref(plan.cache_tag)} left where it was: this image's inline "
                      "cache has no result for its heavy steps (BuildKit took them from the "
                      "registry's cache and did not export them: moby/buildkit#1981)")
        return None
    registry.tag_manifest(repo, plan.content_tag, plan.cache_tag)
    return plan.ref(plan.cache_tag)
