"""An engine bump's image made in the registry: the changed layers built on their own, put
beside the previous image's heavy layers, which never leave the registry.

Why: on a fresh CI runner, an engine-only bump built the usual way pulls the heavy layers
(torch, Triton, the CUDA wheels: 4.5 GB of a 10.5 GB SGLang image) from the registry's cache and
unpacks them on one core, only to run the rest install on top of them, and the push then reads
all 10.5 GB back out of the Engine (`docker save`) to send the 0.8 GB that changed
(bench/results/bump-sglang-blackwell-slim.json). Neither the heavy layers' bytes nor their
files are needed to make the new layers:

- the rest install is `uv pip install --no-deps` of hash-pinned wheels: it reads no installed
  package, so torch need not be there;
- the heavy and rest lock parts are disjoint, so no rest file removes one of the heavy layers'
  (which would take a whiteout), and a file both write is written whole by the later one;
- patches that change a heavy package are refused here (the patch step would need its files).

So the "top" (render.dockerfile(with_heavy=False): the target's Dockerfile less its heavy steps)
is built by BuildKit as usual, its layers are sent (those the registry holds cost a HEAD), and
the image is its config with the donor's heavy layers (diff ids, history entries) put back where
the full build has them. The donor is an image of the target in the registry (its moving tags,
its cache tag) whose heavy layers are, by what can be checked, those this build would make:

- the same heavy lock part, read from the donor's own `COPY lock/heavy.txt` layer;
- the same install command (the donor's heavy step is the top's rest step with the part named
  differently: one template, render._install);
- the same layers under them, byte for byte (diff ids), which the top's build took from the
  registry's inline cache;
- in the compression this push writes, so a client that reads one layer reads them all.

Anything else is no splice: `why` says what differed and the caller builds the usual way.
tests/test_splice.py checks the spliced image's files against a full build's.

Without a patch step, the rest layer is not built into the top at all: the top is built
without its rest install (beside the rest install's own build), and the rest layer is cut from
BuildKit's tar of the filesystem the install leaves (image/layercut.py, pipeline/obtain.py
_cut_splice), its history entry made by rest_history from the donor's heavy install, and put in
place by with_rest.

The config's inline cache (`moby.buildkit.cache.v0`) is dropped: its records index the top's
layers. The target's cache tag stays on the image that carries the heavy steps' results
(pipeline/build.py keep_build_cache), which is where a later full build reads them.
"""

from __future__ import annotations

import dataclasses
import gzip
import io
import json
import tarfile
from collections.abc import Callable, Iterable
from dataclasses import dataclass

import zstandard

from ..lock.lockfile import Lockfile
from ..plan.plan import Plan
from ..plan.render import ASSETS, HEAVY_LAYERS
from . import imagecheck, inlinecache, registry, wire
from .compression import SAME, Compression


@dataclass(frozen=True)
class Donor:
    """An image in the registry whose heavy layers this plan's image may use as they are."""

    ref: str  # the tag it was found under
    digest: str  # its manifest's
    manifest: dict
    config: dict
    before: int  # history entries before the heavy steps (the top's history has the same)
    history: tuple[dict, ...]  # the heavy steps' history entries
    first_layer: int  # index of the first heavy layer (a `COPY lock/<part>.txt`)
    layers: tuple[dict, ...]  # the heavy layers' manifest entries
    diff_ids: tuple[str, ...]


@dataclass(frozen=True)
class Spliced:
    """The image made: its manifest and config are the registry's already (as blobs); nothing
    is tagged until publish puts the manifest under the content tag."""

    manifest: bytes
    config_digest: str
    donor: str  # ref@digest the heavy layers came from
    heavy_layers: int
    size_bytes: int  # unpacked, as the Engine would count it
    pushed: wire.Layers  # what the top's layers cost
    config: bytes = b""  # the spliced config, as uploaded
    facts: tuple[imagecheck.LayerFact, ...] = ()  # each layer as sent or found, in order


def heavy_parts(plan: Plan) -> tuple[str, ...]:
    """The lock parts the heavy install steps read (render.dockerfile)."""
    return HEAVY_LAYERS if plan.split_heavy else ("heavy",)


def heavy_texts(plan: Plan, lock: Lockfile) -> dict[str, str]:
    """Each heavy part's requirements file as the build context holds it (image/context.py)."""
    if plan.split_heavy:
        return {p: lock.requirements_text(layer=p) for p in HEAVY_LAYERS}
    return {"heavy": lock.requirements_text(heavy=True)}


def refused(plan: Plan, heavy_package_of_patch: Callable[[str], bool]) -> str | None:
    """Why this plan's image cannot be spliced at all, whatever the registry holds; else None."""
    if not plan.heavy_packages:
        return "the target has no heavy layer"
    if plan.cuda_home:
        return "the devel flavor's toolkit step runs on the heavy layer's files"
    touching = [p for p in plan.applied_patches if heavy_package_of_patch(p)]
    if touching:
        return f"patch {touching[0]} changes a package of the heavy layer"
    return None


def _command(created_by: str) -> str:
    """A RUN step's shell command as BuildKit records it, without the build arguments' values
    (`RUN |1 IMGBUILD_INDEX_FLAGS=... /bin/sh -c CMD # buildkit`): where wheels came from is not
    what the step does (the wheels are hash-checked)."""
    return created_by.split("/bin/sh -c ", 1)[-1]


def decompressed(media_type: str, data: bytes) -> bytes:
    if "zstd" in media_type:
        return zstandard.ZstdDecompressor().stream_reader(io.BytesIO(data)).read()
    if "gzip" in media_type:
        return gzip.decompress(data)
    return data


def _file_in_layer(repo, layer: dict, path: str) -> bytes | None:
    blob = decompressed(layer.get("mediaType", ""), registry.get_blob(repo, layer["digest"]))
    with tarfile.open(fileobj=io.BytesIO(blob)) as tf:
        try:
            f = tf.extractfile(path.lstrip("/"))
        except KeyError:
            return None
        return f.read() if f is not None else None


def find_donor(repo, plan: Plan, lock: Lockfile, refs: Iterable[str],
               comp: Compression) -> tuple[Donor | None, list[str]]:
    """The first of `refs` (tags of `repo`) whose heavy layers are this plan's, with the
    reasons the others are not."""
    texts = heavy_texts(plan, lock)
    why: list[str] = []
    for ref in dict.fromkeys(refs):
        tag = ref.rpartition(":")[2]
        got = registry.platform_image(repo, tag, plan.platform)
        if got is None:
            continue
        digest, manifest, config = got
        donor, no = _as_donor(repo, tag, digest, manifest, config, texts, comp)
        if donor is not None:
            return donor, why
        why.append(f"{repo.name}:{tag}: {no}")
    return None, why


def _as_donor(repo, tag: str, digest: str, manifest: dict, config: dict,
              texts: dict[str, str], comp: Compression) -> tuple[Donor | None, str]:
    return donor_from(tag, digest, manifest, config, texts, comp,
                      lambda layer, path: _file_in_layer(repo, layer, path))


def donor_from(tag: str, digest: str, manifest: dict, config: dict, texts: dict[str, str],
               comp: Compression, file_in_layer: Callable[[dict, str], bytes | None]
               ) -> tuple[Donor | None, str]:
    """The image (`manifest`, `config`) as a donor of the heavy layers whose lock parts are
    `texts`, or why it is none; `file_in_layer(layer, path)` reads a file of one of its
    layers (the registry's blob)."""
    history = config.get("history") or []
    diff_ids = (config.get("rootfs") or {}).get("diff_ids") or []
    made = [i for i, h in enumerate(history) if not h.get("empty_layer")]
    if len(made) != len(diff_ids) or len(diff_ids) != len(manifest.get("layers", [])):
        return None, "its history does not say which step made which layer"
    runs = inlinecache.heavy_layers(config)
    if len(runs) != len(texts):
        return None, f"it has {len(runs)} heavy install steps, this build {len(texts)}"
    first = runs[0] - 1
    if list(runs) != [first + 1 + 2 * n for n in range(len(runs))]:
        return None, "its heavy steps are not one block"
    span = range(first, runs[-1] + 1)
    h0, h1 = made[span[0]], made[span[-1]]
    if any(history[i].get("empty_layer") for i in range(h0, h1 + 1)):
        return None, "its heavy steps are not one block"
    layers = manifest["layers"][span[0]:span[-1] + 1]
    for la in layers:
        if SAME.get(la.get("mediaType"), la.get("mediaType")) != comp.media_type:
            return None, (f"its heavy layers are {la.get('mediaType')}, this push writes "
                          f"{comp.media_type}")
    for n, (part, text) in enumerate(texts.items()):
        copy, run = history[made[first + 2 * n]], history[made[first + 2 * n + 1]]
        path = f"{ASSETS}/{part}.txt"
        if not copy.get("created_by", "").startswith("COPY ") or path not in copy["created_by"] \
                or f"-r {path}" not in run.get("created_by", ""):
            return None, f"its heavy steps are not this build's ({part})"
        held = file_in_layer(manifest["layers"][first + 2 * n], path)
        if held is None or held.decode(errors="replace") != text:
            return None, f"its {part} lock part is not this build's"
    return Donor(tag, digest, manifest, config, h0, tuple(history[h0:h1 + 1]), first,
                 tuple(layers), tuple(diff_ids[span[0]:span[-1] + 1])), ""


def check_top(donor: Donor, created_by: list[str], diff_ids: list[str]) -> str | None:
    """Why the top image (its history, oldest first, and its layers) does not fit under and over
    the donor's heavy layers; None when it does: the same steps and layers before the heavy
    ones, and its rest install the donor's heavy install but for the part it names."""
    before = [h.get("created_by", "") for h in donor.config["history"][:donor.before]]
    if created_by[:donor.before] != before:
        return "the steps before the heavy layer are not the previous image's"
    if diff_ids[:donor.first_layer] != donor.config["rootfs"]["diff_ids"][:donor.first_layer]:
        return ("the layers under the heavy layer are not the previous image's (BuildKit did "
                "not take them from its cache)")
    rest = next((c for c in created_by[donor.before:] if f"-r {ASSETS}/rest.txt" in c), None)
    if rest is None:
        return "the top has no rest install step"
    for part, same in _heavy_installs(donor):
        if same != _command(rest):
            return f"the previous image's {part} install command is not this build's"
    return None


def _heavy_installs(donor: Donor) -> list[tuple[str, str]]:
    """Each of the donor's heavy install steps: the lock part it names, and its recorded
    command (_command) as the rest install would read, the part renamed (one template,
    render._install)."""
    out = []
    for h in donor.history:
        by = h.get("created_by", "")
        part = next((p for p in (*HEAVY_LAYERS, "heavy") if f"-r {ASSETS}/{p}.txt" in by), None)
        if part is not None:
            out.append((part, _command(by).replace(f"{ASSETS}/{part}.txt", f"{ASSETS}/rest.txt")
                        .replace(f"pruned-{part}.txt", "pruned-rest.txt")))
    return out


@dataclass(frozen=True)
class CutLayer:
    """The rest layer when it was cut from the built filesystem (image/layercut.py) rather than
    built into the top: where it goes in the top's config and manifest, and what it is."""

    history_at: int  # its history entry's index in the top's history
    layer_at: int  # its index among the top's layers
    history: dict
    diff_id: str
    descriptor: dict
    tar_size: int


def rest_history(donor: Donor, command: str, flags: str, created: str) -> dict | None:
    """The history entry BuildKit would record for the rest install `command` (render.
    recorded_command), run with IMGBUILD_INDEX_FLAGS=flags; None unless the donor's heavy
    install is that command but for the part it names (so the entry's form is BuildKit's
    own, as the donor's history shows it)."""
    installs = _heavy_installs(donor)
    heavy = [h for h in donor.history if f"-r {ASSETS}/" in h.get("created_by", "")]
    if not installs or any(same != f"{command} # buildkit" for _, same in installs) \
            or not heavy[0]["created_by"].startswith("RUN |1 IMGBUILD_INDEX_FLAGS="):
        return None
    return {"created": created,
            "created_by": f"RUN |1 IMGBUILD_INDEX_FLAGS={flags} /bin/sh -c {installs[0][1]}",
            "comment": heavy[0].get("comment", "buildkit.dockerfile.v0")}


def with_rest(top_config: bytes, rest: CutLayer) -> bytes:
    """The top's config (built without its rest install) with the cut rest layer in it."""
    cfg = json.loads(top_config)
    cfg["rootfs"]["diff_ids"].insert(rest.layer_at, rest.diff_id)
    cfg["history"].insert(rest.history_at, rest.history)
    return json.dumps(cfg, separators=(",", ":"), sort_keys=True).encode()


def spliced_config(donor: Donor, top_config: bytes) -> bytes:
    """The top's config with the donor's heavy layers and their history entries where the full
    build has them, and no inline cache."""
    cfg = json.loads(top_config)
    cfg.pop(inlinecache.CONFIG_KEY, None)
    diff_ids = cfg["rootfs"]["diff_ids"]
    cfg["rootfs"]["diff_ids"] = (diff_ids[:donor.first_layer] + list(donor.diff_ids)
                                 + diff_ids[donor.first_layer:])
    history = cfg.get("history") or []
    cfg["history"] = history[:donor.before] + list(donor.history) + history[donor.before:]
    return json.dumps(cfg, separators=(",", ":"), sort_keys=True).encode()


def assemble(repo, donor: Donor, top: wire.Layers, top_size: int,
             rest: CutLayer | None = None) -> Spliced:
    """Upload the spliced config; return the manifest that names it (not put under any tag).
    rest: the rest layer, when it was cut rather than built into the top."""
    assert top.config is not None
    config = spliced_config(donor, with_rest(top.config, rest) if rest is not None
                            else top.config)
    digest = registry.put_blob(repo, config)
    return spliced_image(donor, top, top_size, rest, config, digest, repo.name)


def spliced_image(donor: Donor, top: wire.Layers, top_size: int, rest: CutLayer | None,
                  config: bytes, digest: str, repo_name: str) -> Spliced:
    """The spliced image whose config (`config`, uploaded as `digest`) is made: the top's
    layers (and the cut rest layer, where there is one) with the donor's heavy layers put
    where the full build has them, each layer's fact, and what it cost and weighs."""
    descriptors = list(top.descriptors)
    facts = list(top.facts)
    if rest is not None:
        descriptors.insert(rest.layer_at, rest.descriptor)
        facts.insert(rest.layer_at, imagecheck.LayerFact(
            rest.descriptor["digest"], rest.descriptor["size"], rest.diff_id, "sent"))
        top_size += rest.tar_size
        top = dataclasses.replace(top, sent_bytes=top.sent_bytes + rest.descriptor["size"],
                                  sent_layers=top.sent_layers + 1)
    k = donor.first_layer
    layers = descriptors[:k] + list(donor.layers) + descriptors[k:]
    # The donor's layers as its config names them: held by the registry (find_donor read them
    # from its manifest), each checked with a HEAD before the manifest is put.
    facts[k:k] = [imagecheck.LayerFact(la["digest"], int(la["size"]), d, "found")
                  for la, d in zip(donor.layers, donor.diff_ids)]
    manifest = wire.image_manifest(digest, len(config), layers)
    heavy_size = sum(int((la.get("annotations") or {}).get(wire.TAR_SIZE) or la["size"])
                     for la in donor.layers)
    return Spliced(manifest, digest, f"{repo_name}@{donor.digest}", len(donor.layers),
                   top_size + heavy_size, top, config, tuple(facts))
