"""Registries: look a tag up over the Distribution API, push and pull through the Engine."""

from __future__ import annotations

import hashlib
import ipaddress
import json
from collections.abc import Callable
from dataclasses import dataclass
from functools import cached_property
from typing import TYPE_CHECKING

from ..errors import EnvError, InputError, JobFailed
from ..progress import SILENT, Progress
from .compression import ZSTD, engine_reads
from .imagecheck import LayerFact, check
from .reference import parse_name

if TYPE_CHECKING:
    from .distribution import Client

OCI_MANIFEST_TYPE = "application/vnd.oci.image.manifest.v1+json"
MANIFEST_TYPES = ", ".join([
    "application/vnd.oci.image.index.v1+json",
    "application/vnd.oci.image.manifest.v1+json",
    "application/vnd.docker.distribution.manifest.list.v2+json",
    "application/vnd.docker.distribution.manifest.v2+json",
])


@dataclass(frozen=True)
class Repository:
    """`127.0.0.1:5000/imgbuild` -> host 127.0.0.1:5000, path imgbuild. No host: local only."""

    name: str
    host: str | None
    path: str

    @classmethod
    def parse(cls, name: str) -> Repository:
        """Checked as Docker checks a reference; a bad one is exit 2 with the reason."""
        host, path = parse_name(name)
        return cls(name, host, path)

    @property
    def plain_http(self) -> bool:
        # imported on use, as in api: a local repository makes no request
        from .distribution import insecure_hosts

        host = (self.host or "").rsplit(":", 1)[0].strip("[]")
        if host == "localhost" or (self.host or "") in insecure_hosts():
            return True
        try:
            return ipaddress.ip_address(host).is_loopback
        except ValueError:
            return False

    @property
    def base_url(self) -> str:
        return self.api.base_url

    @cached_property
    def api(self) -> Client:
        """The Distribution API of this repository's registry, authenticated as Docker is.
        Docker talks plain HTTP to loopback registries (and to those it is told are insecure)
        when they do not speak TLS; so do we."""
        # imported on use: requests and the docker SDK's auth are for a registry's requests,
        # which a build of a local repository that finds its image never makes
        from .distribution import Client

        return Client(self.host or "", plain_http_allowed=self.plain_http)

    def scope(self, *actions: str) -> str:
        return f"repository:{self.path}:{','.join(actions or ('pull',))}"


def repository(name: str | None, push: bool) -> Repository:
    """The repository tags are for; pushing needs one with a registry host."""
    repo = Repository.parse(name or "imgbuild")
    if push and repo.host is None:
        raise InputError("--push needs a registry",
                         facts=[f"repository '{repo.name}' names no registry host"],
                         hint="pass --registry HOST[:PORT]/REPO, e.g. "
                              "--registry 127.0.0.1:5000/imgbuild")
    return repo


def ca_file(repo: Repository) -> str | None:
    """The CA file this registry's certificate is verified with (Docker's certs.d, else
    IMGBUILD_CA_BUNDLE, ...), for another client (cosign) to trust the same; None for a
    plain-HTTP loopback or insecure host, or the system's default store."""
    if repo.plain_http or repo.host is None:
        return None
    from .distribution import ca_for  # imported on use: a registry's requests

    ca = ca_for(repo.host)
    return ca if isinstance(ca, str) else None


def manifest_digest(repo: Repository, tag: str) -> str | None:
    """The digest a tag points at, or None when the tag does not exist."""
    d = manifest_descriptor(repo, tag)
    return d["digest"] if d else None


def manifest_descriptor(repo: Repository, reference: str) -> dict | None:
    """{mediaType, digest, size} of the manifest a tag or digest names (what an index lists),
    or None when the registry has no such manifest."""
    if repo.host is None:
        return None
    r = repo.api.request("HEAD", f"{repo.path}/manifests/{reference}", scope=repo.scope("pull"),
                         headers={"Accept": MANIFEST_TYPES})
    if r.status_code == 404:
        return None
    if r.status_code != 200:
        raise EnvError(f"registry {repo.host} answered {r.status_code} for "
                       f"{repo.path}:{reference}",
                       hint="check the registry's logs and the repository name")
    return {"mediaType": r.headers.get("Content-Type", "").split(";")[0].strip(),
            "digest": r.headers.get("Docker-Content-Digest"),
            "size": int(r.headers.get("Content-Length", "0"))}


# --- OCI image indexes: one tag, a manifest per platform ------------------------------------

OCI_INDEX = "application/vnd.oci.image.index.v1+json"
INDEX_TYPES = (OCI_INDEX, "application/vnd.docker.distribution.manifest.list.v2+json")


def index_document(entries: list[tuple[str, dict]], annotations: dict[str, str]) -> bytes:
    """An OCI image index over (platform, manifest descriptor) pairs. The same entries give the
    same bytes (no time in it), so the same images always make the same index digest."""
    doc = {"schemaVersion": 2, "mediaType": OCI_INDEX, "manifests": [
        {"mediaType": d["mediaType"], "digest": d["digest"], "size": d["size"],
         "platform": {"os": plat.split("/")[0], "architecture": plat.split("/")[1]}}
        for plat, d in entries], "annotations": dict(sorted(annotations.items()))}
    return json.dumps(doc, indent=2).encode()


def push_index(repo: Repository, tags: tuple[str, ...], body: bytes) -> str:
    """PUT the index under each tag in order (the content tag first, then the moving tags);
    return its digest. The registry refuses an index whose manifests it does not hold. The
    content tag never moves: where it names another index already, nothing is written."""
    digest = "sha256:" + hashlib.sha256(body).hexdigest()
    held = manifest_digest(repo, tags[0]) if tags else None
    if held is not None and held != digest:
        raise JobFailed(f"{repo.name}:{tags[0]} already names another index; content tags "
                        "never move", facts=[f"the registry holds {held}",
                                             f"assembled now     {digest}"],
                        hint="no tag was moved; the registry's index stays the one its content "
                             "tag names")
    for tag in tags:
        put_index(repo, tag, body)
    return digest


def put_index(repo: Repository, reference: str, body: bytes) -> str:
    """PUT the index under `reference`: a tag, or its own digest (the registry then holds it
    with no tag naming it: what is signed before any tag moves). Its digest."""
    r = repo.api.request("PUT", f"{repo.path}/manifests/{reference}",
                         scope=repo.scope("pull", "push"), data=body,
                         headers={"Content-Type": OCI_INDEX})
    _expect(r, (200, 201), repo, f"index {reference}")
    return "sha256:" + hashlib.sha256(body).hexdigest()


def fetch_index(repo: Repository, tag: str) -> tuple[str, dict[str, str]] | None:
    """(index digest, platform → manifest digest) of the index under `tag`, the index checked
    against its digest; None when the tag does not exist. A tag that names a single image
    manifest is an error that says so."""
    got = _get_manifest(repo, tag, ", ".join(INDEX_TYPES), "index")
    if got is None:
        return None
    digest, doc = got
    if doc.get("mediaType") not in INDEX_TYPES and "manifests" not in doc:
        raise JobFailed(f"{repo.name}:{tag} is a single image, not an index",
                        hint="it was pushed by something other than `imgbuild index`")
    return digest, index_platforms(doc)


def index_platforms(doc: dict) -> dict[str, str]:
    """platform ("os/arch") -> manifest digest of an index document, the first entry for each
    platform kept; entries that name no os or architecture (attestations) left out."""
    out: dict[str, str] = {}
    for d in doc.get("manifests", []):
        p = d.get("platform") or {}
        if p.get("os") and p.get("architecture"):
            out.setdefault(f"{p['os']}/{p['architecture']}", d["digest"])
    return out


def get_manifest(repo: Repository, reference: str) -> tuple[str, dict] | None:
    """(digest, document) of the manifest or index under a tag or digest; None when absent."""
    return _get_manifest(repo, reference, MANIFEST_TYPES, "manifest")


def _get_manifest(repo: Repository, tag: str, accept: str, what: str) -> tuple[str, dict] | None:
    """(digest, document) of the manifest under `tag`, its bytes checked against the digest
    the registry gives; None when the tag does not exist."""
    m = repo.api.request("GET", f"{repo.path}/manifests/{tag}", scope=repo.scope("pull"),
                         headers={"Accept": accept})
    if m.status_code == 404:
        return None
    if m.status_code != 200:
        raise EnvError(f"registry {repo.host} answered {m.status_code} for {what} {tag}",
                       facts=[m.text[:300]] if m.text else [])
    digest = "sha256:" + hashlib.sha256(m.content).hexdigest()
    header = m.headers.get("Docker-Content-Digest")
    if header and header != digest:
        raise JobFailed(f"registry {repo.host} served {what} {tag} with other bytes than its "
                        f"digest {header}", hint="nothing was used")
    return digest, m.json()


def check_reachable(repo: Repository) -> None:
    """The registry answers the API (a 401 here is fine: each call answers its challenge)."""
    if repo.host is None:
        return
    r = repo.api.ping()
    if r.status_code not in (200, 401):
        raise EnvError(f"{repo.host} does not answer as a registry ({r.status_code} for /v2/)",
                       hint=f"check --registry {repo.name}")


def tag_manifest(repo: Repository, source_tag: str, tag: str) -> str:
    """Point `tag` at the manifest `source_tag` (a tag or a digest) names (a moving tag follows
    the content tag: the same bytes, the same digest, nothing uploaded but the manifest)."""
    m = repo.api.request("GET", f"{repo.path}/manifests/{source_tag}", scope=repo.scope("pull"),
                         headers={"Accept": MANIFEST_TYPES})
    _expect(m, (200,), repo, f"the manifest of {source_tag}")
    if source_tag.startswith("sha256:") and \
            "sha256:" + hashlib.sha256(m.content).hexdigest() != source_tag:
        raise JobFailed(f"registry {repo.host} served manifest {source_tag[:19]}… with other "
                        "bytes", hint="no tag was moved")
    media = m.headers.get("Content-Type", OCI_MANIFEST_TYPE).split(";")[0].strip()
    r = repo.api.request("PUT", f"{repo.path}/manifests/{tag}", scope=repo.scope("pull", "push"),
                         data=m.content, headers={"Content-Type": media})
    _expect(r, (201,), repo, f"the tag {tag}")
    return "sha256:" + hashlib.sha256(m.content).hexdigest()


def _zstd_layers(client, repo: Repository, reference: str) -> tuple[str, dict, list] | None:
    """(digest, manifest, its zstd layers) when this Engine cannot unpack them; else None."""
    if repo.host is None:
        return None
    got = get_manifest(repo, reference)
    if got is None:
        return None  # the Engine's own pull says the tag is missing
    digest, doc = got
    if "manifests" in doc:
        entry = arch_entry(doc["manifests"], client.version().get("Arch", "amd64"))
        got = get_manifest(repo, entry["digest"]) if entry else None
        if got is None:
            return None
        digest, doc = got
    zstd = unreadable_zstd(doc, lambda: str(client.version().get("Version", "")))
    if zstd is None:
        return None
    return digest, doc, zstd


def arch_entry(manifests: list[dict], arch: str) -> dict | None:
    """The first entry of an index's `manifests` for CPU architecture `arch` (the Engine's)."""
    return next((m for m in manifests
                 if (m.get("platform") or {}).get("architecture") == arch), None)


def unreadable_zstd(doc: dict, engine_version: Callable[[], str]) -> list[dict] | None:
    """The zstd layers of image manifest `doc` where the Engine (its version asked only when
    there are some) cannot unpack them; None where it has none or the Engine reads zstd."""
    zstd = [layer for layer in doc.get("layers", []) if layer.get("mediaType", "").endswith("zstd")]
    if not zstd or engine_reads(ZSTD, engine_version()):
        return None
    return zstd


def engine_can_read(client, repo: Repository, reference: str) -> bool:
    """Whether this Engine could unpack the image under `reference` (True when it is absent)."""
    return _zstd_layers(client, repo, reference) is None


def check_readable(client, repo: Repository, reference: str) -> None:
    """Refuse, before a byte of a layer moves, a pull this Engine could not unpack: layers in
    zstd need Docker Engine 23 or newer (20.10 downloads them all, then fails on each with
    "archive/tar: invalid tar header")."""
    found = _zstd_layers(client, repo, reference)
    if found is None:
        return
    digest, doc, zstd = found
    version = str(client.version().get("Version", ""))
    size = sum(int(layer.get("size", 0)) for layer in doc.get("layers", []))
    raise EnvError(
        f"this Docker Engine cannot unpack {repo.name}:{reference}: its layers are zstd",
        facts=[f"{repo.name}@{digest}: {len(zstd)} of {len(doc.get('layers', []))} layers are "
               f"{ZSTD.media_type} ({size / 1e9:.2f} GB to download)",
               f"Docker Engine {version} here unpacks gzip only; zstd needs Docker Engine 23 "
               "or newer (containerd reads it from 1.5)",
               "nothing was downloaded"],
        hint="pull it with containerd (`ctr images pull`, as a Kubernetes node does), upgrade "
             "the Engine to 23 or newer, or push a gzip image for this client: `imgbuild build "
             "TARGET --push --compression gzip --registry R` (or `compression: gzip` for R in "
             "images/registries.yaml)")


def pull(client, ref: str, digest: str | None = None, progress: Progress = SILENT) -> str:
    """Pull one tag; return the repo digest the image was pulled by. With `digest`, the Engine
    pulls by that digest (and checks every byte against it), then tags it `ref`: what is used
    is what the registry listed, even if the tag moves meanwhile."""
    from docker.errors import APIError, NotFound  # imported on use: the pull is the SDK's

    repo, _, tag = ref.rpartition(":")
    check_readable(client, Repository.parse(repo), digest or tag)
    failed = None
    try:
        with progress.transfer("pull", ref) as moving:
            for event in client.api.pull(repo, tag=digest or tag, stream=True, decode=True):
                moving.feed(event)
                if "error" in event:
                    failed = str(event["error"])
                    break
        img = client.images.get(f"{repo}@{digest}" if digest else ref)
    except NotFound:
        if failed is None:
            raise JobFailed(f"{ref} is not in the registry") from None
    except APIError as e:
        failed = str(e)
    if failed is not None:
        raise EnvError(f"pull of {ref} failed", facts=[failed[:300]],
                       hint="check that the registry is up, and `docker login` where it asks "
                            "for credentials; layers already fetched are not fetched again")
    if digest:
        img.tag(repo, tag)
    got = repo_digest(img.attrs.get("RepoDigests", []), repo, digest)
    if got is not None:
        return got
    raise JobFailed(f"pulled {ref} but the engine recorded no digest for it"
                    + (f" equal to {digest}" if digest else ""))


# --- smoke reports stored beside the image ------------------------------------------------
# An OCI artifact whose config blob is the report, tagged by the image's digest
# (`sha256-<hex>.smoke`, the OCI 1.1 tag-schema way of referring to a manifest), so any
# registry that stores OCI manifests keeps it and `imgbuild pull` finds it from the digest.

REPORT_TYPE = "application/vnd.imgbuild.smoke-report.v1+json"
OCI_MANIFEST = "application/vnd.oci.image.manifest.v1+json"


def report_tag(digest: str) -> str:
    return digest.replace(":", "-") + ".smoke"


def put_blob(repo: Repository, data: bytes) -> str:
    digest = "sha256:" + hashlib.sha256(data).hexdigest()
    scope = repo.scope("pull", "push")
    blobs = f"{repo.path}/blobs"
    if repo.api.request("HEAD", f"{blobs}/{digest}", scope=scope).status_code == 200:
        return digest
    start = repo.api.request("POST", f"{blobs}/uploads/", scope=scope)
    _expect(start, (202,), repo, "a blob upload")
    loc = start.headers["Location"]
    sep = "&" if "?" in loc else "?"
    done = repo.api.request("PUT", f"{loc}{sep}digest={digest}", scope=scope, data=data,
                            headers={"Content-Type": "application/octet-stream"})
    _expect(done, (201,), repo, "a blob upload")
    return digest


def expect(r, codes: tuple[int, ...], repo: Repository, what: str) -> None:
    """A registry answer that is not one of `codes`, as the error a user reads."""
    _expect(r, codes, repo, what)


def get_blob(repo: Repository, digest: str) -> bytes:
    """A blob, checked against its digest."""
    return _get_blob(repo, digest)


def repo_digest(repo_digests: list[str], repo: str, digest: str | None) -> str | None:
    """The digest the Engine recorded for `repo` among an image's RepoDigests (`repo@digest`),
    that one only where a pull by `digest` asked for it; None where there is none."""
    for rd in repo_digests:
        if rd.startswith(repo + "@"):
            got = rd.split("@", 1)[1]
            if digest and got != digest:
                continue
            return got
    return None


def _expect(r, codes: tuple[int, ...], repo: Repository, what: str) -> None:
    if r.status_code in codes:
        return
    if r.status_code == 403 or (r.status_code in (401, 404) and "DENIED" in r.text.upper()):
        raise EnvError(f"registry {repo.host} refused {what} in {repo.path}: the account may "
                       "pull but not push", facts=[r.text[:300]],
                       hint="log in with an account that may push to this repository")
    raise JobFailed(f"registry {repo.host} answered {r.status_code} to {what}",
                    facts=[r.text[:300]])


def _get_blob(repo: Repository, digest: str) -> bytes:
    """A blob, checked against its digest (a registry or proxy that serves other bytes fails)."""
    b = repo.api.request("GET", f"{repo.path}/blobs/{digest}", scope=repo.scope("pull"))
    _expect(b, (200,), repo, f"blob {digest[:19]}…")
    got = "sha256:" + hashlib.sha256(b.content).hexdigest()
    if got != digest:
        raise JobFailed(f"registry {repo.host} served blob {digest[:19]}… with other bytes",
                        facts=[f"asked for {digest}", f"got       {got}"],
                        hint="the registry or a proxy in between changed the content; "
                             "nothing was used")
    return b.content


def push_artifact(repo: Repository, tag: str, artifact_type: str, config: dict,
                  layer: bytes, layer_type: str, annotations: dict[str, str] | None = None,
                  subject: str | None = None) -> str:
    """Store an OCI artifact (a JSON config and one layer) under `tag`; return its manifest
    digest. subject: the digest of the image manifest it refers to, if any."""
    body = json.dumps(config, indent=2, sort_keys=True).encode()
    manifest = {
        "schemaVersion": 2, "mediaType": OCI_MANIFEST, "artifactType": artifact_type,
        "config": {"mediaType": artifact_type, "digest": put_blob(repo, body),
                   "size": len(body)},
        "layers": [{"mediaType": layer_type, "digest": put_blob(repo, layer),
                    "size": len(layer)}],
    }
    if subject:
        manifest["subject"] = {"mediaType": "application/vnd.docker.distribution.manifest.v2+json",
                               "digest": subject}
    if annotations:
        manifest["annotations"] = annotations
    data = json.dumps(manifest).encode()
    r = repo.api.request("PUT", f"{repo.path}/manifests/{tag}", scope=repo.scope("pull", "push"),
                         data=data, headers={"Content-Type": OCI_MANIFEST})
    _expect(r, (200, 201), repo, f"manifest {tag}")
    return "sha256:" + hashlib.sha256(data).hexdigest()


def fetch_artifact(repo: Repository, tag: str,
                   artifact_type: str) -> tuple[str, dict, bytes] | None:
    """(manifest digest, config, layer) of the artifact under `tag`, every part checked against
    its digest; None when the registry has no such tag (or it is another kind of artifact)."""
    if repo.host is None:
        return None
    got = _get_manifest(repo, tag, OCI_MANIFEST, "manifest")
    if got is None:
        return None
    digest, doc = got
    if doc.get("artifactType") != artifact_type or len(doc.get("layers") or []) != 1:
        return None
    config = json.loads(_get_blob(repo, doc["config"]["digest"]))
    return digest, config, _get_blob(repo, doc["layers"][0]["digest"])


def image_config(repo: Repository, digest: str) -> tuple[dict, dict]:
    """(manifest, config) of the image manifest `digest`, both checked against their digests."""
    manifest, config = image_parts(repo, digest)
    return manifest, json.loads(config)


def image_parts(repo: Repository, digest: str) -> tuple[dict, bytes]:
    """(manifest, the config's bytes) of the image manifest `digest`, both checked against
    their digests."""
    m = repo.api.request("GET", f"{repo.path}/manifests/{digest}", scope=repo.scope("pull"),
                         headers={"Accept": MANIFEST_TYPES})
    _expect(m, (200,), repo, f"manifest {digest[:19]}…")
    got = "sha256:" + hashlib.sha256(m.content).hexdigest()
    if got != digest:
        raise JobFailed(f"registry {repo.host} served manifest {digest[:19]}… with other bytes",
                        facts=[f"asked for {digest}", f"got       {got}"],
                        hint="the registry or a proxy in between changed the content")
    manifest = m.json()
    if "config" not in manifest:
        raise JobFailed(f"{repo.name}@{digest} is not an image manifest (an index?)")
    return manifest, _get_blob(repo, manifest["config"]["digest"])


def image_problems(repo: Repository, digest: str) -> list[str]:
    """What is wrong with the image manifest `digest` as the registry holds it ([]: nothing):
    its config an image config whose diff ids match the layers in number, each layer blob
    held, of the size the manifest gives (image/imagecheck.py; no layer is downloaded)."""
    manifest, config = image_parts(repo, digest)
    facts = []
    for la in manifest.get("layers") or []:
        r = repo.api.request("HEAD", f"{repo.path}/blobs/{la.get('digest')}",
                             scope=repo.scope("pull"))
        size = int(r.headers.get("Content-Length", -1)) if r.status_code == 200 else -1
        facts.append(LayerFact(str(la.get("digest")), size, None, "the registry holds"))
    return check(manifest, config, facts)


def platform_image(repo: Repository, reference: str,
                   platform: str) -> tuple[str, dict, dict] | None:
    """(manifest digest, manifest, config) of the image under `reference`, through an index to
    its entry for `platform` ("linux/amd64"); None when the tag or that entry is missing."""
    got = get_manifest(repo, reference)
    if got is None:
        return None
    digest, doc = got
    if "manifests" in doc:
        digest = platform_entry(doc["manifests"], platform)
        if digest is None:
            return None
    manifest, config = image_config(repo, digest)
    return digest, manifest, config


def platform_entry(manifests: list[dict], platform: str) -> str | None:
    """The digest of the first entry of an index's `manifests` for `platform` ("os/arch"), both
    its os and its architecture matching; None where there is none."""
    os_, _, arch = platform.partition("/")
    return next((m["digest"] for m in manifests
                 if (m.get("platform") or {}).get("architecture") == arch
                 and (m.get("platform") or {}).get("os") == os_), None)


def push_report(repo: Repository, image_digest: str, report: dict) -> str:
    """Store a smoke report as an artifact that refers to image_digest; return its tag."""
    tag = report_tag(image_digest)
    push_artifact(repo, tag, REPORT_TYPE, report, b"{}", "application/vnd.oci.empty.v1+json",
                  annotations={"io.imgbuild.smoke.ok": str(bool(report.get("ok"))).lower()},
                  subject=image_digest)
    return tag


def fetch_report(repo: Repository, image_digest: str) -> dict | None:
    """The smoke report stored for image_digest (every part checked against its digest), or
    None when there is none."""
    found = fetch_artifact(repo, report_tag(image_digest), REPORT_TYPE)
    return found[1] if found is not None else None
