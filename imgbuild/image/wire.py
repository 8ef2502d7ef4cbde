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

The layers come from `docker save`, streamed (never written to disk here; Docker Engine 20.10
itself writes the whole image under its data root first, so a push needs that much free disk
there): the legacy layout
of Engine 20.10 (`<v1 id>/layer.tar`, a layer known only once hashed, so the size the earlier
manifest recorded for it picks which layers to hash without compressing) and the OCI layout of
Engine >= 25 (`blobs/sha256/<diff id>`). The image config is sent byte for byte as the Engine
keeps it: its digest is the image id, and BuildKit's inline cache (`moby.buildkit.cache.v0`)
stays in it for the next build's `--cache-from`.
"""

from __future__ import annotations

import hashlib
import io
import json
import tarfile
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

import docker.errors

from ..errors import EnvError, JobFailed
from ..fsutil import atomic_write_text
from ..lock.wheels import cache_root
from ..progress import SILENT, Progress
from . import blobcache, registry
from .compression import SAME, Compression
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


def remember_pushed(host: str, comp: Compression, sent: dict[str, Held]) -> None:
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
        mine[d] = {"digest": h.digest, "size": h.size, "tar_size": h.tar_size}
    _memory().parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(_memory(), json.dumps(doc))


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
         platform: str = "linux/amd64", progress: Progress = SILENT) -> Pushed:
    """Push local image `ref` as tag `ref` of `repo`, its layers in `comp`; return its digest.

    hint_refs: tags of `repo` whose images may share layers with this one (the target's moving
    tags): the layers they hold in `comp` are not read, compressed or sent again."""
    tag = ref.rpartition(":")[2]
    image_id = client.images.get(ref).id
    scope = repo.scope("pull", "push")
    blobs = f"{repo.path}/blobs"
    config_here = repo.api.request("HEAD", f"{blobs}/{image_id}",
                                   scope=scope).status_code == 200
    with progress.transfer("push", ref) as moving:
        got = send_layers(client, ref, repo, comp=comp, hint_refs=[tag, *hint_refs],
                          platform=platform, feed=moving.feed, config_wanted=not config_here)
        if got.config is not None:
            _upload(repo, blobs, scope, iter([got.config]), image_id)
        config_size = len(got.config) if got.config is not None else _blob_size(repo, image_id)
        manifest = image_manifest(image_id, config_size, got.descriptors)
        digest = put_manifest(repo, tag, manifest)
    return Pushed(digest, manifest, comp.name, got.sent_bytes, got.sent_layers,
                  got.reused_layers, got.cached_layers)


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


def image_manifest(config_digest: str, config_size: int, layers: Iterable[dict]) -> bytes:
    return json.dumps({
        "schemaVersion": 2, "mediaType": OCI_MANIFEST,
        "config": {"mediaType": OCI_CONFIG, "digest": config_digest, "size": config_size},
        "layers": list(layers)}, separators=(",", ":")).encode()


def descriptor(h: Held) -> dict:
    return {"mediaType": h.media_type, "digest": h.digest, "size": h.size,
            **({"annotations": {TAR_SIZE: str(h.tar_size)}} if h.tar_size is not None else {})}


def send_layers(client, ref: str, repo, *, comp: Compression, hint_refs: Iterable[str],
                platform: str, feed: Callable[[dict], None],
                config_wanted: bool = False) -> Layers:
    """Get every layer of local image `ref` into `repo` in `comp`: those the registry holds
    (found by diff id from the manifests of `hint_refs`, or from this machine's earlier
    pushes) cost a HEAD; the rest come from this machine's blob cache or `docker save`,
    compressed as they are read. The config is read too when `config_wanted`."""
    img = client.images.get(ref)
    image_id = img.id
    diff_ids: list[str] = list(img.attrs["RootFS"]["Layers"])
    scope = repo.scope("pull", "push")
    blobs = f"{repo.path}/blobs"
    known = pushed_before(repo.host or "", comp) | held_layers(repo, hint_refs, platform, comp)
    have: dict[str, Held] = {}
    for d in dict.fromkeys(diff_ids):
        h = known.get(d)
        if h and repo.api.request("HEAD", f"{blobs}/{h.digest}", scope=scope).status_code == 200:
            have[d] = h
    sent: dict[str, Held] = {}
    config: bytes | None = None
    from_cache = 0
    for d in dict.fromkeys(diff_ids):
        if d in have:
            feed({"id": d[7:19], "status": "Layer already exists"})
    needed = [d for d in dict.fromkeys(diff_ids) if d not in have]
    # What this machine compressed before (image/blobcache.py): sent from there, with no
    # export from the Engine and no compression; the rest go through `docker save`.
    for d in list(needed):
        if (c := blobcache.layer(comp.recipe, d)) is not None:
            sent[d] = _send_cached(c, repo, blobs, scope, comp, feed, d[7:19])
            needed.remove(d)
            from_cache += 1
    if config_wanted:
        config = blobcache.config(image_id)
    for attempt in range(2):  # a second pass only after a size collision (see _read_save)
        if not needed and (not config_wanted or config is not None):
            break
        try:
            got, missed = _read_save(client, image_id, repo, needed, have | sent, sent,
                                     comp, feed, trust_sizes=attempt == 0)
        except (docker.errors.DockerException, tarfile.TarError, OSError) as e:
            raise _save_failed(ref, img, e) from None
        needed = [d for d in needed if d in missed]
        if got is not None:
            config = got
            blobcache.keep_config(image_id, got)
    if needed:
        raise JobFailed(f"push of {ref}: layers of the image were not found in `docker save`",
                        facts=[f"missing: {', '.join(d[:19] for d in needed)}"])
    if config_wanted and config is None:
        raise JobFailed(f"push of {ref}: the image config was not found in `docker save`")
    remember_pushed(repo.host or "", comp, sent)
    return Layers(image_id, tuple(diff_ids),
                  tuple(descriptor(have.get(d) or sent[d]) for d in diff_ids), config,
                  sum(h.size for h in sent.values()), len(sent), len(have), from_cache)


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


def put_manifest(repo, tag: str, manifest: bytes) -> str:
    """PUT an OCI image manifest under `tag`; return its digest (checked against the
    registry's)."""
    digest = "sha256:" + hashlib.sha256(manifest).hexdigest()
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


def _read_save(client, image_id: str, repo, needed: list[str], have: dict[str, Held],
               sent: dict[str, Held], comp: Compression, feed: Callable[[dict], None], *,
               trust_sizes: bool = True) -> tuple[bytes | None, set[str]]:
    """One pass over `docker save`: compress and send the layers in `needed`, hash the others.

    A legacy-layout member is known only once hashed; one whose size is that of a layer the
    registry holds is hashed without compressing. If it turns out to be a needed layer of the
    same size after all, it is returned in `missed`, for a second pass, which compresses every
    layer it cannot name (trust_sizes=False)."""
    blobs = f"{repo.path}/blobs"
    scope = repo.scope("pull", "push")
    want = set(needed)
    sizes = {h.tar_size for d, h in have.items() if h.tar_size is not None} if trust_sizes \
        else set()
    config: bytes | None = None
    missed: set[str] = set()
    stream = io.BufferedReader(_Stream(iter(client.api.get_image(image_id, chunk_size=READ_CHUNK))),
                               buffer_size=READ_CHUNK)
    with tarfile.open(fileobj=stream, mode="r|") as tf:
        for m in tf:
            if not m.isfile():
                continue
            name = m.name
            oci_id = ("sha256:" + name.rsplit("/", 1)[1]) if name.startswith("blobs/sha256/") \
                else None
            is_layer = name.endswith("/layer.tar") or name == "layer.tar" or (
                oci_id is not None and oci_id in set(have) | want)
            f = tf.extractfile(m)
            assert f is not None
            if oci_id == image_id or (not is_layer and m.size < (64 << 20)):
                data = f.read()
                if "sha256:" + hashlib.sha256(data).hexdigest() == image_id:
                    config = data
                continue
            if not is_layer:
                continue
            compress = (oci_id in want) if oci_id else (m.size not in sizes and bool(want))
            if not compress:
                h = hashlib.sha256()
                while chunk := f.read(READ_CHUNK):
                    h.update(chunk)
                diff_id = "sha256:" + h.hexdigest()
                if diff_id in want:
                    missed.add(diff_id)
                continue
            diff_id, held = _send_layer(f, m.size, repo, blobs, scope, comp, feed,
                                        (oci_id or name)[7:19] if oci_id else name[:12])
            if diff_id in want:
                sent[diff_id] = held
                want.discard(diff_id)
    return config, missed | want


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
