"""Push an image from the Engine to a registry through imgbuild's own Distribution client, with
its layers compressed for the clients that will pull it, on every core.

Why not the Engine's push: Docker Engine 20.10 compresses with gzip on one core (the bound of a
10 GB push), and no Engine writes zstd. The compressors are in image/compression.py.

A layer is sent once: the registry's copy is found before anything is read, by the layer's
uncompressed digest (diff id) and compression, from the manifests the repository holds for this
image's tags (the content tag, the moving tags: the previous image of the target; this is what
a fresh CI runner has) and from what this machine pushed to that registry before (as the
Engine keeps its own record). Only the layers it lacks are compressed and sent; the rest cost
one HEAD each.

The layers come from `docker save`, streamed (image/exported.py says what each Engine's save
holds): the legacy layout of Engine 20.10 (`<v1 id>/layer.tar`, a layer known only once hashed,
so the size the earlier manifest recorded for it picks which layers to hash without
compressing; Engine 20.10 itself writes the whole image under its data root first, so a push
needs that much free disk there), the OCI layout of the classic store from Engine 25
(`blobs/sha256/<diff id>`, uncompressed), and the containerd image store's (the Engine's
compressed blobs, named by their compressed digest, and an image id that is a manifest's or an
index's digest, not the config's). A blob already in the compression wanted goes as it is,
its tar hashed on the way; any other is compressed again here. Nothing is written to disk,
but for a blob that comes before the manifest naming it while the registry holds some of the
image (`early_blob`). The image config is sent byte for byte as the Engine keeps it, and
BuildKit's inline cache (`moby.buildkit.cache.v0`) stays in it for the next build's
`--cache-from`.

Before the manifest is put, it is checked against the config in hand and the layers as they
were sent or found (image/imagecheck.py): a manifest that would not describe its image is
refused and nothing is written. A content tag is put once (`immutable`): the registry's tag is
never re-pointed.
"""

from __future__ import annotations

import hashlib
import io
import json
import tarfile
import tempfile
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import IO

import docker.errors

from ..errors import EnvError, JobFailed
from ..fsutil import atomic_write_text
from ..lock.wheels import cache_root
from ..progress import SILENT, Progress
from . import blobcache, exported, imagecheck, registry
from .compression import SAME, Compression, Inflater, decompressed, sniff
from .compression import compression as compression_named

OCI_MANIFEST = "application/vnd.oci.image.manifest.v1+json"
OCI_INDEX = "application/vnd.oci.image.index.v1+json"
OCI_CONFIG = "application/vnd.oci.image.config.v1+json"
DOCKER_MANIFEST = "application/vnd.docker.distribution.manifest.v2+json"
DOCKER_LIST = "application/vnd.docker.distribution.manifest.list.v2+json"
# The size of the uncompressed layer tar, kept beside each layer we push: with the config's
# diff ids it lets the next push tell, from the registry alone, which layers it already holds.
TAR_SIZE = "io.imgbuild.layer.tar-size"

READ_CHUNK = 1 << 20


# --- what the registry already holds -------------------------------------------------------

@dataclass(frozen=True)
class Held:
    """A layer blob the registry holds for a diff id, in a given compression."""

    digest: str
    size: int
    media_type: str
    tar_size: int | None


def held_layers(repo, refs: Iterable[str], platform: str, comp: Compression) -> dict[str, Held]:
    """diff id -> the blob in `comp` the registry holds for it, read from the manifests of
    `refs` (tags or digests in `repo`; those missing are skipped)."""
    out: dict[str, Held] = {}
    for ref in refs:
        got = registry.platform_image(repo, ref, platform)
        if got is None:
            continue
        _, doc, config = got
        held_in(doc, config, comp, out)
    return out


def held_in(doc: dict, config: dict, comp: Compression,
            out: dict[str, Held] | None = None) -> dict[str, Held]:
    """diff id -> the blob in `comp` one image manifest `doc` (with its `config`) names, added
    to `out` where it has no entry for that diff id yet (the first ref that holds a layer
    wins); layers in another compression are not named."""
    out = {} if out is None else out
    diff_ids = (config.get("rootfs") or {}).get("diff_ids") or []
    for diff_id, layer in zip(diff_ids, doc.get("layers", [])):
        mt = SAME.get(layer.get("mediaType"), layer.get("mediaType"))
        if mt != comp.media_type or diff_id in out:
            continue
        size = (layer.get("annotations") or {}).get(TAR_SIZE)
        out[diff_id] = Held(layer["digest"], int(layer["size"]), layer["mediaType"],
                            int(size) if size else None)
    return out


def _memory() -> Path:
    return cache_root() / "pushed-layers.json"


def pushed_before(host: str, comp: Compression) -> dict[str, Held]:
    """The layers this machine pushed to `host` in `comp` (diff id -> blob); a hint only: each
    is checked with a HEAD before it is trusted."""
    try:
        doc = json.loads(_memory().read_text())
        entries = doc[host][comp.name]
        return {d: Held(e["digest"], int(e["size"]), comp.media_type, e.get("tar_size"))
                for d, e in entries.items()}
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return {}


MOUNT_SOURCES_KEPT = 4  # repositories remembered per blob, the latest first


def mount_sources(host: str, comp: Compression) -> dict[str, tuple[str, ...]]:
    """diff id -> the repositories of `host` this machine pushed its blob in `comp` to, or
    found it held in, the latest first: where a push to another repository of the same
    registry may mount it from instead of sending it (a hint, as pushed_before's)."""
    try:
        entries = json.loads(_memory().read_text())[host][comp.name]
        return {d: tuple(str(r) for r in e.get("repos") or ()) for d, e in entries.items()}
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return {}


def remembered(entry: dict | None, h: Held, repo_path: str | None) -> dict:
    """The memory's entry for a blob now in `repo_path`: its descriptor, and that repository
    first among those it may be mounted from (earlier ones kept, up to MOUNT_SOURCES_KEPT)."""
    before = [r for r in ((entry or {}).get("repos") or []) if isinstance(r, str)]
    if (entry or {}).get("digest") not in (None, h.digest):
        before = []  # another blob for this diff id: its repositories hold that one
    repos = ([repo_path] if repo_path else []) + [r for r in before if r != repo_path]
    return {"digest": h.digest, "size": h.size, "tar_size": h.tar_size,
            "repos": repos[:MOUNT_SOURCES_KEPT]}


def remember_pushed(host: str, comp: Compression, sent: dict[str, Held],
                    repo_path: str | None = None) -> None:
    """Keep what `sent` (diff id -> blob) now has in the registry: in repository `repo_path`
    where given, which a later push to another repository may mount the blobs from."""
    if not sent:
        return
    try:
        doc = json.loads(_memory().read_text())
        if not isinstance(doc, dict):
            doc = {}
    except (OSError, ValueError):
        doc = {}
    mine = doc.setdefault(host, {}).setdefault(comp.name, {})
    for d, h in sent.items():
        old = mine.get(d)
        mine[d] = remembered(old if isinstance(old, dict) else None, h, repo_path)
    _memory().parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(_memory(), json.dumps(doc))


def mounts_to_try(needed: Iterable[str], known: dict[str, Held],
                  sources: dict[str, tuple[str, ...]], target: str
                  ) -> list[tuple[str, Held, tuple[str, ...]]]:
    """(diff id, blob, repositories to mount it from) for each layer still to send whose blob
    this machine knows and has put in another repository of the same registry: a mount costs
    the registry a link, where a send costs reading, compressing and uploading the layer."""
    out = []
    for d in needed:
        h = known.get(d)
        froms = tuple(r for r in sources.get(d, ()) if r != target)
        if h is not None and froms:
            out.append((d, h, froms))
    return out


# --- the push ------------------------------------------------------------------------------

@dataclass(frozen=True)
class Pushed:
    digest: str  # the manifest's
    manifest: bytes
    compression: str
    sent_bytes: int  # compressed bytes uploaded
    sent_layers: int
    reused_layers: int  # held by the registry already
    cached_layers: int = 0  # of those sent, how many from this machine's blob cache
    mounted_layers: int = 0  # of those held, how many mounted from another repository


class _Stream(io.RawIOBase):
    """A generator of bytes as a file, for tarfile's streaming mode."""

    def __init__(self, chunks: Iterator[bytes]):
        self._chunks, self._buf = chunks, b""

    def readable(self) -> bool:
        return True

    def readinto(self, b) -> int:
        while not self._buf:
            try:
                self._buf = next(self._chunks)
            except StopIteration:
                return 0
        n = min(len(b), len(self._buf))
        b[:n], self._buf = self._buf[:n], self._buf[n:]
        return n


def push_ref(client, ref: str, progress: Progress = SILENT, *, compression: str = "gzip",
             hint_refs: Iterable[str] = ()) -> str:
    """Push local image `ref` to the registry its name says; return the manifest digest."""
    repo_name, _, _ = ref.rpartition(":")
    return push(client, ref, registry.Repository.parse(repo_name),
                comp=compression_named(compression),
                hint_refs=hint_refs, progress=progress).digest


def push(client, ref: str, repo, *, comp: Compression, hint_refs: Iterable[str] = (),
         platform: str = "linux/amd64", progress: Progress = SILENT,
         immutable: bool = False) -> Pushed:
    """Push local image `ref` as tag `ref` of `repo`, its layers in `comp`; return its digest.

    hint_refs: tags of `repo` whose images may share layers with this one (the target's moving
    tags): the layers they hold in `comp` are not read, compressed or sent again.
    immutable: the tag is a content tag: one the registry holds already is never re-pointed
    (the same manifest again is a no-op; another is refused)."""
    tag = ref.rpartition(":")[2]
    with progress.transfer("push", ref) as moving:
        got = send_layers(client, ref, repo, comp=comp, hint_refs=[tag, *hint_refs],
                          platform=platform, feed=moving.feed, config_wanted=True)
        digest, manifest = publish_manifest(repo, tag, got, ref=ref, immutable=immutable)
    return Pushed(digest, manifest, comp.name, got.sent_bytes, got.sent_layers,
                  got.reused_layers, got.cached_layers, got.mounted_layers)


def publish_manifest(repo, tag: str, got: Layers, *, ref: str,
                     immutable: bool = False) -> tuple[str, bytes]:
    """The config into the registry where it lacks it, then the manifest of `got` under `tag`
    (checked_put)."""
    assert got.config is not None and got.config_digest is not None
    manifest = image_manifest(got.config_digest, len(got.config), got.descriptors)
    return checked_put(repo, tag, manifest, got.config, got.facts, ref=ref,
                       immutable=immutable), manifest


def checked_put(repo, tag: str, manifest: bytes, config: bytes,
                facts: Iterable[imagecheck.LayerFact], *, ref: str,
                immutable: bool = False) -> str:
    """PUT `manifest` under `tag` once it is checked against the config in hand and the layers
    as they were sent or found (image/imagecheck.py), the config uploaded first where the
    registry lacks it: a manifest that would not describe the image is refused, and nothing
    is written."""
    doc = json.loads(manifest)
    facts = tuple(facts)
    problems = imagecheck.check(doc, config, facts)
    # What was found rather than sent, asked again now: the registry still holds each blob,
    # of the size the manifest gives.
    if not problems:
        problems += gone_layers(facts, lambda digest, size: _held(repo, digest, size))
    if problems:
        raise JobFailed(f"push of {ref} refused: the manifest would not describe the image",
                        facts=problems,
                        hint="no manifest and no tag was written; the Engine's copy of the "
                             "image does not add up (`docker image inspect` it, rebuild it "
                             "with --rebuild), or report it with these facts")
    if not _held(repo, doc["config"]["digest"], len(config)):
        _upload(repo, f"{repo.path}/blobs", repo.scope("pull", "push"), iter([config]),
                doc["config"]["digest"])
    return put_manifest(repo, tag, manifest, immutable=immutable)


@dataclass(frozen=True)
class Layers:
    """A local image's layers, each in the registry now (sent, or held already)."""

    image_id: str
    diff_ids: tuple[str, ...]
    descriptors: tuple[dict, ...]  # the manifest's layer entries, in diff_ids' order
    config: bytes | None  # the image config as the Engine keeps it (when asked for)
    sent_bytes: int
    sent_layers: int
    reused_layers: int
    cached_layers: int
    config_digest: str | None = None  # the config's (under the containerd store, not the id)
    facts: tuple[imagecheck.LayerFact, ...] = ()  # each layer as sent or found, in order

    @property
    def mounted_layers(self) -> int:
        return sum(1 for f in self.facts if f.how == "mounted")


def gone_layers(facts: Iterable[imagecheck.LayerFact],
                registry_holds: Callable[[str, int], bool]) -> list[str]:
    """The layers found in the registry or mounted there rather than sent (`how` "found",
    "mounted") that it no longer holds at their size, asked again now, in words."""
    return [f"layer {i}: the registry no longer holds {f.digest[:19]}… of {f.size} bytes"
            for i, f in enumerate(facts) if f.how in ("found", "mounted")
            and not registry_holds(f.digest, f.size)]


def image_manifest(config_digest: str, config_size: int, layers: Iterable[dict]) -> bytes:
    return json.dumps({
        "schemaVersion": 2, "mediaType": OCI_MANIFEST,
        "config": {"mediaType": OCI_CONFIG, "digest": config_digest, "size": config_size},
        "layers": list(layers)}, separators=(",", ":")).encode()


def descriptor(h: Held) -> dict:
    return {"mediaType": h.media_type, "digest": h.digest, "size": h.size,
            **({"annotations": {TAR_SIZE: str(h.tar_size)}} if h.tar_size is not None else {})}


def _held(repo, digest: str, size: int | None = None) -> bool:
    """Whether the registry holds blob `digest` (of `size` bytes, where given)."""
    r = repo.api.request("HEAD", f"{repo.path}/blobs/{digest}", scope=repo.scope("pull", "push"))
    return head_holds(r.status_code, r.headers.get("Content-Length"), size)


def _mount(repo, h: Held, source: str) -> bool:
    """Whether the registry mounted blob `h` from repository `source` into `repo` (201, and a
    HEAD then shows it at its size). Any other answer is no mount, and the layer is sent: 202
    (the registry opened an upload instead, which is cancelled), a refusal (no pull right on
    `source`), an error."""
    blobs = f"{repo.path}/blobs"
    scope = f"{repo.scope('pull', 'push')} repository:{source}:pull"
    try:
        r = repo.api.request("POST", f"{blobs}/uploads/", scope=scope,
                             params={"mount": h.digest, "from": source})
        if r.status_code == 202 and r.headers.get("Location"):
            repo.api.request("DELETE", r.headers["Location"], scope=scope)
        return mount_took(r.status_code, r.headers.get("Docker-Content-Digest"), h.digest) \
            and _held(repo, h.digest, h.size)
    except EnvError:
        return False


def mount_took(status: int, said: str | None, digest: str) -> bool:
    """Whether a mount request that answered `status` (and Docker-Content-Digest `said`)
    mounted blob `digest`: 201 Created, for that blob where the registry names one."""
    return status == 201 and (said is None or said == digest)


def head_holds(status: int, said: str | None, size: int | None) -> bool:
    """Whether a HEAD of a blob that answered `status` with Content-Length `said` shows the
    registry holding it (of `size` bytes, where given)."""
    if status != 200:
        return False
    return size is None or said is None or int(said) == size


def send_layers(client, ref: str, repo, *, comp: Compression, hint_refs: Iterable[str],
                platform: str, feed: Callable[[dict], None],
                config_wanted: bool = False) -> Layers:
    """Get every layer of local image `ref` into `repo` in `comp`: those the registry holds
    (found by diff id from the manifests of `hint_refs`, or from this machine's earlier
    pushes) cost a HEAD; the rest come from this machine's blob cache or `docker save`:
    a blob already in `comp` (the containerd image store keeps compressed layers) goes as it
    is, hashed on the way; any other is compressed as it is read. The config is read too when
    `config_wanted`."""
    img = client.images.get(ref)
    image_id = img.id
    diff_ids: list[str] = list(img.attrs["RootFS"]["Layers"])
    before = pushed_before(repo.host or "", comp)
    known = before | held_layers(repo, hint_refs, platform, comp)
    have, needed = layers_to_send(diff_ids, known, lambda h: _held(repo, h.digest, h.size))
    sent: dict[str, Held] = {}
    how: dict[str, str] = {}
    for d in dict.fromkeys(diff_ids):
        if d in have:
            feed({"id": d[7:19], "status": "Layer already exists"})
    # Blobs this machine put in another repository of this registry: mounted from there, as
    # Docker does (the registry links the blob it holds; nothing is read or sent).
    for d, h, froms in mounts_to_try(needed, before, mount_sources(repo.host or "", comp),
                                     repo.path):
        if (src := next((f for f in froms if _mount(repo, h, f)), None)) is not None:
            have[d], how[d] = h, "mounted"
            needed.remove(d)
            feed({"id": d[7:19], "status": f"Mounted from {src}"})
    # What this machine compressed before (image/blobcache.py): sent from there, with no
    # export from the Engine and no compression; the rest go through `docker save`.
    for d in list(needed):
        if (c := blobcache.layer(comp.recipe, d)) is not None:
            sent[d] = _send_cached(c, repo, f"{repo.path}/blobs", repo.scope("pull", "push"),
                                   comp, feed, d[7:19])
            how[d] = "cached"
            needed.remove(d)
    # The image as an earlier push read it from `docker save` (its documents, each checked
    # against its digest): under the containerd store, where the image id is no config's.
    found = saved_image(image_id, platform)
    config, config_digest = ((found.config, found.config_digest) if found is not None else
                             (None, None))
    if config_wanted and config is None:
        config, config_digest = _classic_config(repo, image_id, diff_ids)
    for attempt in range(3):  # a second pass after a size collision or a layout read late
        if not needed and (not config_wanted or config is not None):
            break
        try:
            got = _read_save(client, image_id, repo, needed, have | sent, sent, comp, feed,
                             diff_ids=diff_ids, platform=platform, found=found,
                             speculate=not have and not sent and found is None,
                             trust_sizes=attempt == 0)
        except (docker.errors.DockerException, tarfile.TarError, OSError) as e:
            raise _save_failed(ref, img, e) from None
        except (exported.LayoutError, ValueError) as e:
            raise JobFailed(f"push of {ref}: `docker save` gave an image imgbuild cannot read",
                            facts=[str(e)], hint="nothing was tagged; rebuild the image "
                            "(--rebuild) and push again, or report it with these facts") \
                from None
        for d in got.hashed:
            how.setdefault(d, "sent")
        for d, h in got.held:
            have[d] = h
            feed({"id": d[7:19], "status": "Layer already exists"})
        if got.found is not None:
            found = got.found
            for digest, data in found.docs:
                blobcache.keep_config(digest, data)
        if got.config is not None:
            config, config_digest = got.config, got.config_digest
            blobcache.keep_config(config_digest, config)
        needed = [d for d in needed if d in got.missed]
    if needed:
        raise JobFailed(f"push of {ref}: layers of the image were not found in `docker save`",
                        facts=[f"missing: {', '.join(d[:19] for d in needed)}"])
    if config_wanted and config is None:
        raise JobFailed(f"push of {ref}: the image config was not found in `docker save`")
    if config is not None and imagecheck.diff_ids(config) != diff_ids:
        raise JobFailed(f"push of {ref}: the Engine's config is not the image it inspects",
                        facts=[f"`docker image inspect` lists {len(diff_ids)} layers, the "
                               f"config {config_digest} lists "
                               f"{len(imagecheck.diff_ids(config))} diff ids"],
                        hint="nothing was tagged; rebuild the image (--rebuild)")
    remember_pushed(repo.host or "", comp, have | sent, repo.path)
    return layers_of(image_id, diff_ids, have, sent, how, config, config_digest)


def layers_to_send(diff_ids: Iterable[str], known: dict[str, Held],
                   registry_holds: Callable[[Held], bool]) -> tuple[dict[str, Held], list[str]]:
    """(the layers the registry holds: diff id -> blob, the diff ids still to send, in order,
    each once): a layer `known` (from the registry's manifests or this machine's earlier
    pushes) counts as held only where `registry_holds` its blob now (a HEAD)."""
    have: dict[str, Held] = {}
    for d in dict.fromkeys(diff_ids):
        h = known.get(d)
        if h and registry_holds(h):
            have[d] = h
    needed = [d for d in dict.fromkeys(diff_ids) if d not in have]
    return have, needed


def layers_of(image_id: str, diff_ids: list[str], have: dict[str, Held], sent: dict[str, Held],
              how: dict[str, str], config: bytes | None, config_digest: str | None) -> Layers:
    """What a push of the layers `diff_ids` got: each layer's descriptor from what the registry
    held (`have`) else what was sent, the bytes and layers sent, those held, those sent from
    the blob cache, and each layer's fact (`how` it got there; held: found)."""
    facts = tuple(imagecheck.LayerFact(h.digest, h.size, d, how.get(d, "found"))
                  for d, h in ((d, have.get(d) or sent[d]) for d in diff_ids))
    return Layers(image_id, tuple(diff_ids),
                  tuple(descriptor(have.get(d) or sent[d]) for d in diff_ids), config,
                  sum(h.size for h in sent.values()), len(sent), len(have),
                  sum(1 for v in how.values() if v == "cached"), config_digest, facts)


def saved_image(image_id: str, platform: str) -> exported.Exported | None:
    """The image an earlier read of `docker save` found for `image_id` (a manifest or index
    digest: the containerd store's), from the documents kept then, each checked against its
    digest; None where none was kept, or where `image_id` is a config's (the classic store)."""
    try:
        return exported.resolve(image_id, blobcache.config, platform)
    except exported.LayoutError:
        return None


def config_digest_of(client, ref: str, platform: str = "linux/amd64") -> str | None:
    """The digest of local image `ref`'s config: its id under the classic store; under the
    containerd store (the id is a manifest's or an index's) what an earlier push read, or None."""
    image_id = client.images.get(ref).id
    found = saved_image(image_id, platform)
    if found is not None:
        return found.config_digest
    data = blobcache.config(image_id)
    if data is not None and not imagecheck.config_problems(data):
        return image_id
    return None if _containerd_id(client) else image_id


def _containerd_id(client) -> bool:
    """Whether this Engine's image ids are manifest digests (the containerd image store)."""
    try:
        info = client.info()
    except (docker.errors.DockerException, TypeError, ValueError):
        return False
    return containerd_ids(info)


def containerd_ids(info: dict) -> bool:
    """Whether an Engine whose `docker info` is `info` names images by manifest digest (the
    containerd image store: a snapshotter driver-type)."""
    try:
        status = dict(tuple(x) for x in info.get("DriverStatus") or [] if len(x) == 2)
    except (TypeError, ValueError):
        return False
    return "snapshotter" in status.get("driver-type", "")


def _classic_config(repo, image_id: str, diff_ids: list[str]) -> tuple[bytes | None, str | None]:
    """The config of an image whose id is its config's digest (the classic store), from this
    machine's cache or from the registry, taken only where it is an image config whose diff
    ids are the image's: under the containerd store the id names a manifest or an index (the
    save's blob of that digest is that document: taking it for the config is what corrupted
    registries)."""
    data = blobcache.config(image_id)
    if data is None and repo.host and _held(repo, image_id):
        try:
            data = registry.get_blob(repo, image_id)
        except JobFailed:
            data = None
    if data is None or imagecheck.config_problems(data) or imagecheck.diff_ids(data) != diff_ids:
        return None, None
    return data, image_id


def _save_failed(ref: str, img, e: Exception) -> EnvError:
    """`docker save` stopped: Docker Engine 20.10 writes the whole image to its own disk
    (/var/lib/docker/tmp) before it streams a byte, so a full disk is the usual cause."""
    said = str(getattr(e, "explanation", None) or e)
    size = int(img.attrs.get("Size") or 0)
    full = "no space left" in said.lower()
    return EnvError(
        f"push of {ref} stopped: the Docker Engine could not export the image",
        facts=[said[:300], f"the image is {size / 1e9:.1f} GB unpacked; Docker Engine 20.10's "
               "`docker save` writes all of it under its data root before streaming it"],
        hint=("free that much disk on the Engine's data root (`docker system df`; "
              "`docker builder prune` takes back BuildKit's cache), then run the command "
              "again: nothing was tagged, and layers already sent are not sent again")
        if full else "check the Docker daemon's log, then run the command again")


class TagTaken(JobFailed):
    """A content tag the registry holds already, for another manifest: content tags never move."""


def content_tag_put(held: str | None, digest: str) -> str:
    """What a content tag's PUT does where the registry's tag names `held` (None: no such tag)
    and this push made `digest`: "put" it; "there" already (nothing sent); "taken" by another
    image (refused: content tags never move)."""
    if held == digest:
        return "there"
    if held is not None:
        return "taken"
    return "put"


def put_manifest(repo, tag: str, manifest: bytes, *, immutable: bool = False) -> str:
    """PUT an OCI image manifest under `tag`; return its digest (checked against the
    registry's). immutable: where the registry holds `tag` already, the same manifest is not
    sent again and another is refused (TagTaken), the tag left as it is."""
    digest = "sha256:" + hashlib.sha256(manifest).hexdigest()
    if immutable:
        held = registry.manifest_digest(repo, tag)
        way = content_tag_put(held, digest)
        if way == "there":
            return digest
        if way == "taken":
            raise TagTaken(f"{repo.name}:{tag} already names another image; content tags "
                           "never move", facts=[f"the registry holds {held}",
                                                f"this push made    {digest}"],
                           hint="nothing was written; the registry's image stays the one its "
                                "content tag names")
    r = repo.api.request("PUT", f"{repo.path}/manifests/{tag}", scope=repo.scope("pull", "push"),
                         data=manifest, headers={"Content-Type": OCI_MANIFEST})
    registry.expect(r, (201,), repo, f"the manifest of {tag}")
    said = r.headers.get("Docker-Content-Digest")
    if said and said != digest:
        raise JobFailed(f"registry {repo.host} stored the manifest of {tag} as {said}",
                        facts=[f"imgbuild sent {digest}"])
    return digest


def _blob_size(repo, digest: str) -> int:
    r = repo.api.request("HEAD", f"{repo.path}/blobs/{digest}", scope=repo.scope("pull"))
    return int(r.headers.get("Content-Length", 0))


# The documents of an OCI layout (indexes, manifests, configs) are a few kB; a blob up to this
# size is kept in memory while `docker save` streams, until index.json (sent last) says what
# each blob is. A layer this small costs as little.
SMALL_BLOB = 4 << 20


@dataclass(frozen=True)
class _Read:
    """What one pass over `docker save` got."""

    config: bytes | None
    config_digest: str | None
    found: exported.Exported | None  # the OCI layout's image, where the save had one
    missed: set[str]  # needed layers not sent (another pass may send them)
    hashed: tuple[str, ...] = ()  # diff ids sent in this pass
    held: tuple[tuple[str, Held], ...] = ()  # diff ids the registry holds as the Engine does


def _read_save(client, image_id: str, repo, needed: list[str], have: dict[str, Held],
               sent: dict[str, Held], comp: Compression, feed: Callable[[dict], None], *,
               diff_ids: list[str], platform: str = "linux/amd64",
               found: exported.Exported | None = None, speculate: bool = False,
               trust_sizes: bool = True) -> _Read:
    """One pass over `docker save`: send the layers in `needed`, hash what must be named.

    The legacy layout (Engine 20.10): a member is known only once hashed; one whose size is
    that of a layer the registry holds is hashed without compressing. If it turns out to be a
    needed layer of the same size after all, it is returned in `missed`, for a second pass,
    which compresses every layer it cannot name (trust_sizes=False).

    OCI layouts: a blob named by a diff id (the classic store) is a layer tar. One named by a
    compressed digest (the containerd store) is known once the image's index, manifest and
    config have come by (`found`; they are small blobs, kept as they come, and sorted among
    the layers by digest). A layer blob that comes before them is, by its first bytes and a
    HEAD: held by the registry as it is (left; the manifest names its diff id), sent as it
    comes where every layer is needed (`speculate`: nothing held, nothing cached), or else
    kept on disk while its tar is hashed, and sent from there only if its diff id is needed:
    one pass over a save that streams at the Engine's pace (the containerd store's export
    reads its content store through containerd, about 40 MB/s on two cores here)."""
    blobs = f"{repo.path}/blobs"
    scope = repo.scope("pull", "push")
    want = set(needed)
    before = set(sent)
    ids = set(diff_ids)
    sizes = held_tar_sizes(have, trust_sizes)
    config: bytes | None = None
    missed: set[str] = set()
    small: dict[str, bytes] = {}
    index_json: bytes | None = None
    by_digest = found.by_digest() if found is not None else {}
    guessed: list[tuple[str, str, Held]] = []  # (blob digest, diff id hashed, what was sent)
    as_is: dict[str, int] = {}  # blob digest -> size: held by the registry byte for byte
    held_as_is: list[tuple[str, Held]] = []

    def send_blob(chunks: Iterator[bytes], size: int, digest: str, kind: str,
                  expect: str | None) -> tuple[str, Held]:
        lid = digest[7:19]
        if as_it_is(kind, comp):
            diff_id, held = _pass_blob(chunks, size, digest, kind, repo, blobs, scope, comp,
                                       feed, lid)
        else:
            diff_id, held = _send_chunks(decompressed(chunks, kind), -1, repo, blobs, scope,
                                         comp, feed, lid)
        if expect is not None and diff_id != expect:
            raise _not_its_layer(digest, expect, diff_id)
        return diff_id, held

    stream = io.BufferedReader(_Stream(iter(client.api.get_image(image_id, chunk_size=READ_CHUNK))),
                               buffer_size=READ_CHUNK)
    with tarfile.open(fileobj=stream, mode="r|") as tf:
        for m in tf:
            if not m.isfile():
                continue
            name = m.name
            f = tf.extractfile(m)
            assert f is not None
            if name == "index.json":
                index_json = f.read()
                continue
            if name.startswith("blobs/sha256/"):
                digest = "sha256:" + name.rsplit("/", 1)[1]
                if digest in ids:  # a layer tar named by its diff id (the classic store)
                    if digest in want:
                        diff_id, held = _send_layer(f, m.size, repo, blobs, scope, comp, feed,
                                                    digest[7:19])
                        if diff_id != digest:
                            raise _not_its_layer(digest, digest, diff_id)
                        sent[diff_id] = held
                        want.discard(diff_id)
                    continue
                if digest in by_digest:  # a compressed layer blob, known from the manifest
                    la = by_digest[digest]
                    if la.diff_id in want:
                        _, sent[la.diff_id] = send_blob(_chunks(f), m.size, digest, la.kind,
                                                        la.diff_id)
                        want.discard(la.diff_id)
                    continue
                if m.size <= SMALL_BLOB:
                    small[digest] = f.read()
                    if found is None and image_id in small:
                        try:  # the containerd store's image id names its index or manifest
                            found = exported.resolve(image_id, small.get, platform)
                            by_digest = found.by_digest()
                        except exported.LayoutError:
                            pass
                    continue
                if found is not None:
                    continue  # not a layer of this platform's image
                head = f.read(READ_CHUNK)
                kind = sniff(head)
                way = early_blob(kind, comp, speculate,
                                 lambda: _held(repo, digest, m.size))  # noqa: B023
                if way == "held":
                    as_is[digest] = m.size
                elif way == "send":
                    diff_id, held = send_blob(_chunks(f, head), m.size, digest, kind, None)
                    guessed.append((digest, diff_id, held))
                else:
                    with _spooled(_chunks(f, head), kind) as (spool, diff_id):
                        if diff_id in want:
                            _, held = send_blob(_chunks(spool), m.size, digest, kind, diff_id)
                            guessed.append((digest, diff_id, held))
                continue
            is_layer = name.endswith("/layer.tar") or name == "layer.tar"
            if not is_layer:
                if m.size < (64 << 20):
                    data = f.read()
                    if "sha256:" + hashlib.sha256(data).hexdigest() == image_id:
                        config = data
                continue
            compress = legacy_compress(m.size, sizes, want)
            if not compress:
                h = hashlib.sha256()
                while chunk := f.read(READ_CHUNK):
                    h.update(chunk)
                diff_id = "sha256:" + h.hexdigest()
                if diff_id in want:
                    missed.add(diff_id)
                continue
            diff_id, held = _send_layer(f, m.size, repo, blobs, scope, comp, feed, name[:12])
            if diff_id in want:
                sent[diff_id] = held
                want.discard(diff_id)
    config_digest = image_id if config is not None else None
    if found is None and index_json is not None:
        found = exported.resolve(exported.top_entry(index_json, image_id), small.get, platform)
    if found is not None:
        if list(found.diff_ids) != diff_ids:
            raise JobFailed("the image `docker save` sent is not the image the Engine inspects",
                            facts=[f"inspect: {len(diff_ids)} layers", f"save: "
                                   f"{len(found.diff_ids)} layers ({found.manifest_digest})"],
                            hint="nothing was tagged; rebuild the image (--rebuild)")
        config, config_digest = found.config, found.config_digest
        layers = found.by_digest()
        for digest, diff_id, held in guessed:
            la = layers.get(digest)
            if la is None:
                continue  # not this platform's (another's, in the same save): never named
            if la.diff_id != diff_id:
                raise _not_its_layer(digest, la.diff_id, diff_id)
            if diff_id in want:
                sent[diff_id] = held
                want.discard(diff_id)
        for la in found.layers:
            if la.diff_id not in want:
                continue
            if la.digest in as_is:  # the registry holds the Engine's own blob: nothing sent
                held_as_is.append((la.diff_id, Held(la.digest, as_is[la.digest],
                                                    comp.media_type, None)))
                want.discard(la.diff_id)
            elif la.digest in small:  # layers small enough to have been kept until now
                _, sent[la.diff_id] = send_blob(iter([small[la.digest]]), la.size, la.digest,
                                                la.kind, la.diff_id)
                want.discard(la.diff_id)
    return _Read(config, config_digest, found, missed | want,
                 tuple(d for d in sent if d not in before), tuple(held_as_is))


def held_tar_sizes(have: dict[str, Held], trust_sizes: bool) -> set[int]:
    """The tar sizes of the layers the registry holds (as recorded beside them): in the legacy
    save, a member of one of these sizes is hashed, not compressed (none on a second pass)."""
    return {h.tar_size for d, h in have.items() if h.tar_size is not None} if trust_sizes \
        else set()


def legacy_compress(size: int, held_sizes: set[int], want: set[str]) -> bool:
    """Whether a legacy save's layer.tar of `size` bytes is compressed and sent as it is read
    (a layer is still wanted, and none the registry holds has its size) rather than hashed
    first."""
    return size not in held_sizes and bool(want)


def as_it_is(kind: str, comp: Compression) -> bool:
    """Whether a layer blob in `kind` (gzip | zstd | tar) goes to the registry byte for byte:
    where it is in the compression wanted. Any other is decompressed and compressed again by
    imgbuild's compressor (a tar, or gzip where zstd is wanted)."""
    return kind == comp.name


def early_blob(kind: str, comp: Compression, speculate: bool,
               registry_holds: Callable[[], bool]) -> str:
    """What to do with a large layer blob of the containerd store's save that comes before
    the manifest that names it (image/exported.py: the blobs come sorted by digest):

    - held: it is in the compression wanted and the registry holds it byte for byte (asked
      only then); nothing is sent, and the manifest will name its diff id;
    - send: every layer of the image is needed (nothing held, nothing cached): it goes as it
      comes, its diff id hashed on the way and matched to the manifest at the end;
    - spool: it may be a layer the registry holds in another compression: kept on disk while
      its tar is hashed, then sent only if that diff id is needed."""
    if as_it_is(kind, comp) and registry_holds():
        return "held"
    return "send" if speculate else "spool"


def _not_its_layer(digest: str, expect: str, got: str) -> JobFailed:
    return JobFailed(f"layer blob {digest[:19]}… of the Engine's image is not the layer its "
                     "config names", facts=[f"config: {expect}", f"hashed: {got}"],
                     hint="nothing was tagged; rebuild the image (--rebuild)")


@contextmanager
def _spooled(chunks: Iterator[bytes], kind: str) -> Iterator[tuple[IO[bytes], str]]:
    """A blob written to a file of its own while its tar is hashed: (the file, rewound; the
    diff id). The file is gone when the block ends."""
    inflater = Inflater(kind)
    tar = hashlib.sha256()
    with tempfile.TemporaryFile(dir=_spool_dir(), prefix="imgbuild-blob-") as f:
        for chunk in chunks:
            f.write(chunk)
            for out in inflater.feed(chunk):
                tar.update(out)
        inflater.close()
        f.seek(0)
        yield f, "sha256:" + tar.hexdigest()


def _spool_dir() -> Path:
    d = cache_root() / "spool"
    d.mkdir(parents=True, exist_ok=True)
    return d


def _chunks(f, head: bytes = b"") -> Iterator[bytes]:
    if head:
        yield head
    while chunk := f.read(READ_CHUNK):
        yield chunk


def _pass_blob(chunks: Iterator[bytes], size: int, digest: str, kind: str, repo, blobs: str,
               scope: str, comp: Compression, feed: Callable[[dict], None],
               lid: str) -> tuple[str, Held]:
    """A layer blob already in `comp` (the containerd store's), sent as it is (its digest
    checked on the way) unless the registry holds it; its tar hashed as it goes, for the diff
    id the manifest is checked against."""
    inflater = Inflater(kind)
    tar = hashlib.sha256()
    n = [0]
    done = [0]

    def hashed() -> Iterator[bytes]:
        for chunk in chunks:
            for out in inflater.feed(chunk):
                tar.update(out)
                n[0] += len(out)
            done[0] += len(chunk)
            feed({"id": lid, "status": "Pushing",
                  "progressDetail": {"current": done[0], "total": size}})
            yield chunk
        inflater.close()

    if _held(repo, digest, size):
        for _ in hashed():
            pass
        got, csize = digest, size
    else:
        got, csize = _upload(repo, blobs, scope, hashed(), digest)
    feed({"id": lid, "status": "Pushed"})
    return "sha256:" + tar.hexdigest(), Held(got, csize, comp.media_type, n[0])


def _send_layer(f, size: int, repo, blobs: str, scope: str, comp: Compression,
                feed: Callable[[dict], None], lid: str) -> tuple[str, Held]:
    """Compress one layer tar as it is read and upload it as it is compressed (one streamed
    PATCH, then the PUT that names its digest, as Docker does)."""
    return _send_chunks(iter(lambda: f.read(READ_CHUNK), b""), size, repo, blobs, scope, comp,
                        feed, lid)


def send_stream(body: Iterable[bytes], repo, comp: Compression, feed: Callable[[dict], None],
                lid: str) -> tuple[str, Held]:
    """A layer tar compressed and uploaded as it is made, its size known only at its end
    (image/layercut.py): its diff id and what the registry holds."""
    return _send_chunks(_coalesced(body), -1, repo, f"{repo.path}/blobs",
                        repo.scope("pull", "push"), comp, feed, lid)


def _coalesced(body: Iterable[bytes]) -> Iterator[bytes]:
    """Small pieces (a tar header each) gathered into chunks of READ_CHUNK or so."""
    buf = bytearray()
    for piece in body:
        buf += piece
        if len(buf) >= READ_CHUNK:
            yield bytes(buf)
            buf.clear()
    if buf:
        yield bytes(buf)


def _send_chunks(body: Iterator[bytes], size: int, repo, blobs: str, scope: str,
                 comp: Compression, feed: Callable[[dict], None], lid: str) -> tuple[str, Held]:
    raw = hashlib.sha256()
    done = [0]

    def chunks() -> Iterator[bytes]:
        for chunk in body:
            raw.update(chunk)
            done[0] += len(chunk)
            feed({"id": lid, "status": "Pushing",
                  "progressDetail": {"current": done[0], **({"total": size} if size >= 0
                                                           else {})}})
            yield chunk

    with blobcache.writer(comp.recipe) as keep:
        def tee(body: Iterator[bytes]) -> Iterator[bytes]:
            for chunk in body:
                if keep is not None:
                    keep.write(chunk)
                yield chunk

        digest, csize = _upload(repo, blobs, scope, tee(comp.compressor(size)(chunks())), None)
        diff_id = "sha256:" + raw.hexdigest()
        blobcache.commit(keep, comp.recipe, diff_id, digest, csize, done[0])
    feed({"id": lid, "status": "Pushed"})
    return diff_id, Held(digest, csize, comp.media_type, done[0])


def _send_cached(c: blobcache.Cached, repo, blobs: str, scope: str, comp: Compression,
                 feed: Callable[[dict], None], lid: str) -> Held:
    """Upload a layer this machine compressed before, from its cache (checked on the way: the
    digest the registry is told is the one the bytes hash to)."""
    done = [0]

    def chunks() -> Iterator[bytes]:
        with open(c.path, "rb") as f:
            while chunk := f.read(READ_CHUNK):
                done[0] += len(chunk)
                feed({"id": lid, "status": "Pushing",
                      "progressDetail": {"current": done[0], "total": c.size}})
                yield chunk

    digest, size = _upload(repo, blobs, scope, chunks(), c.digest)
    feed({"id": lid, "status": "Pushed"})
    return Held(digest, size, comp.media_type, c.tar_size)


def _upload(repo, blobs: str, scope: str, body: Iterator[bytes],
            digest: str | None) -> tuple[str, int]:
    """Upload a blob from a stream of its bytes; the digest is computed as it goes (or checked
    against `digest`). A blob the registry already has (the same compressed bytes, from any
    earlier push) is the registry's to keep: the upload is cancelled, not duplicated."""
    h = hashlib.sha256()
    n = [0]

    def counted() -> Iterator[bytes]:
        for chunk in body:
            h.update(chunk)
            n[0] += len(chunk)
            yield chunk

    start = repo.api.request("POST", f"{blobs}/uploads/", scope=scope)
    registry.expect(start, (202,), repo, "a blob upload")
    loc = start.headers["Location"]
    try:
        patch = repo.api.request("PATCH", loc, scope=scope, data=counted(),
                                 headers={"Content-Type": "application/octet-stream"})
    except EnvError as e:
        raise EnvError(f"registry {repo.host} went away during a push to {repo.path}",
                       facts=e.facts, hint="nothing was tagged that points at a partial image; "
                       "when the registry is back, run the command again (layers already "
                       "pushed are not sent twice)") from None
    registry.expect(patch, (202, 204), repo, "a blob upload")
    got = "sha256:" + h.hexdigest()
    if digest and got != digest:
        raise JobFailed(f"push to {repo.name}: a blob's bytes changed while it was read",
                        facts=[f"expected {digest}", f"read     {got}"])
    loc = patch.headers.get("Location", loc)
    sep = "&" if "?" in loc else "?"
    done = repo.api.request("PUT", f"{loc}{sep}digest={got}", scope=scope,
                            headers={"Content-Length": "0"})
    registry.expect(done, (201,), repo, "a blob upload")
    return got, n[0]
