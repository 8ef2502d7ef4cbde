"""Registries: look a tag up over the Distribution API, push and pull through the Engine."""

from __future__ import annotations

import hashlib
import ipaddress
import json
from dataclasses import dataclass

import requests
from docker.errors import APIError, NotFound

from ..errors import EnvError, InputError, JobFailed

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
        first, _, rest = name.partition("/")
        if rest and ("." in first or ":" in first or first == "localhost"):
            return cls(name, first, rest)
        return cls(name, None, name)

    @property
    def base_url(self) -> str:
        host = self.host.split(":")[0] if self.host else ""
        plain = host == "localhost"
        try:
            plain = plain or ipaddress.ip_address(host).is_loopback
        except ValueError:
            pass
        # Docker itself talks plain HTTP to loopback registries; so do we.
        return f"{'http' if plain else 'https'}://{self.host}"


def repository(name: str | None, push: bool) -> Repository:
    """The repository tags are for; pushing needs one with a registry host."""
    repo = Repository.parse(name or "imgbuild")
    if push and repo.host is None:
        raise InputError("--push needs a registry",
                         facts=[f"repository '{repo.name}' names no registry host"],
                         hint="pass --registry HOST[:PORT]/REPO, e.g. "
                              "--registry 127.0.0.1:5000/imgbuild")
    return repo


def manifest_digest(repo: Repository, tag: str, timeout: float = 10) -> str | None:
    """The digest a tag points at, or None when the tag does not exist."""
    if repo.host is None:
        return None
    url = f"{repo.base_url}/v2/{repo.path}/manifests/{tag}"
    try:
        r = requests.head(url, headers={"Accept": MANIFEST_TYPES}, timeout=timeout)
    except requests.RequestException as e:
        raise unreachable(repo, e) from None
    if r.status_code == 404:
        return None
    if r.status_code == 401:
        raise EnvError(f"registry {repo.host} asks for credentials",
                       hint=f"`docker login {repo.host}`, then run the command again")
    if r.status_code != 200:
        raise EnvError(f"registry {repo.host} answered {r.status_code} for {url}",
                       hint="check the registry's logs and the repository name")
    return r.headers.get("Docker-Content-Digest")


def unreachable(repo: Repository, e: Exception) -> EnvError:
    return EnvError(f"registry {repo.host} is unreachable",
                    facts=[f"{type(e).__name__}: {str(e)[:200]}"],
                    hint=f"start it (`make services` runs one on 127.0.0.1:5000) or check "
                         f"--registry {repo.name}")


def check_reachable(repo: Repository) -> None:
    if repo.host is None:
        return
    try:
        requests.get(f"{repo.base_url}/v2/", timeout=5)
    except requests.RequestException as e:
        raise unreachable(repo, e) from None


def push(client, ref: str) -> str:
    """Push one tag; return the manifest digest the registry stored."""
    repo, _, tag = ref.rpartition(":")
    digest = None
    for line in client.images.push(repo, tag=tag, stream=True, decode=True):
        if "error" in line:
            raise JobFailed(f"push of {ref} failed", facts=[line["error"]],
                            hint="check that the registry is up and accepts pushes")
        aux = line.get("aux") or {}
        digest = aux.get("Digest", digest)
    if not digest:
        raise JobFailed(f"push of {ref} reported no digest")
    return digest


def pull(client, ref: str) -> str:
    """Pull one tag; return the repo digest the image was pulled by."""
    repo, _, tag = ref.rpartition(":")
    try:
        img = client.images.pull(repo, tag=tag)
    except NotFound:
        raise JobFailed(f"{ref} is not in the registry") from None
    except APIError as e:
        raise EnvError(f"pull of {ref} failed", facts=[str(e)[:300]],
                       hint="check that the registry is up") from None
    for rd in img.attrs.get("RepoDigests", []):
        if rd.startswith(repo + "@"):
            return rd.split("@", 1)[1]
    raise JobFailed(f"pulled {ref} but the engine recorded no digest for it")


# --- smoke reports stored beside the image ------------------------------------------------
# An OCI artifact whose config blob is the report, tagged by the image's digest
# (`sha256-<hex>.smoke`, the OCI 1.1 tag-schema way of referring to a manifest), so any
# registry that stores OCI manifests keeps it and `imgbuild pull` finds it from the digest.

REPORT_TYPE = "application/vnd.imgbuild.smoke-report.v1+json"
OCI_MANIFEST = "application/vnd.oci.image.manifest.v1+json"


def report_tag(digest: str) -> str:
    return digest.replace(":", "-") + ".smoke"


def _put_blob(repo: Repository, data: bytes) -> str:
    digest = "sha256:" + hashlib.sha256(data).hexdigest()
    base = f"{repo.base_url}/v2/{repo.path}/blobs"
    try:
        if requests.head(f"{base}/{digest}", timeout=10).status_code == 200:
            return digest
        start = requests.post(f"{base}/uploads/", timeout=10)
        start.raise_for_status()
        loc = start.headers["Location"]
        url = loc if loc.startswith("http") else repo.base_url + loc
        sep = "&" if "?" in url else "?"
        done = requests.put(f"{url}{sep}digest={digest}", data=data, timeout=30,
                            headers={"Content-Type": "application/octet-stream"})
        done.raise_for_status()
    except requests.RequestException as e:
        raise unreachable(repo, e) from None
    return digest


def _get_blob(repo: Repository, digest: str) -> bytes:
    """A blob, checked against its digest (a registry or proxy that serves other bytes fails)."""
    try:
        b = requests.get(f"{repo.base_url}/v2/{repo.path}/blobs/{digest}", timeout=60)
        b.raise_for_status()
    except requests.RequestException as e:
        raise unreachable(repo, e) from None
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
        "config": {"mediaType": artifact_type, "digest": _put_blob(repo, body),
                   "size": len(body)},
        "layers": [{"mediaType": layer_type, "digest": _put_blob(repo, layer),
                    "size": len(layer)}],
    }
    if subject:
        manifest["subject"] = {"mediaType": "application/vnd.docker.distribution.manifest.v2+json",
                               "digest": subject}
    if annotations:
        manifest["annotations"] = annotations
    data = json.dumps(manifest).encode()
    try:
        r = requests.put(f"{repo.base_url}/v2/{repo.path}/manifests/{tag}", data=data,
                         headers={"Content-Type": OCI_MANIFEST}, timeout=30)
    except requests.RequestException as e:
        raise unreachable(repo, e) from None
    if r.status_code not in (200, 201):
        raise JobFailed(f"registry {repo.host} refused {tag} ({r.status_code})",
                        facts=[r.text[:300]])
    return "sha256:" + hashlib.sha256(data).hexdigest()


def fetch_artifact(repo: Repository, tag: str,
                   artifact_type: str) -> tuple[str, dict, bytes] | None:
    """(manifest digest, config, layer) of the artifact under `tag`, every part checked against
    its digest; None when the registry has no such tag (or it is another kind of artifact)."""
    if repo.host is None:
        return None
    try:
        m = requests.get(f"{repo.base_url}/v2/{repo.path}/manifests/{tag}",
                         headers={"Accept": OCI_MANIFEST}, timeout=10)
    except requests.RequestException as e:
        raise unreachable(repo, e) from None
    if m.status_code == 404:
        return None
    if m.status_code != 200:
        raise EnvError(f"registry {repo.host} answered {m.status_code} for {tag}")
    digest = "sha256:" + hashlib.sha256(m.content).hexdigest()
    header = m.headers.get("Docker-Content-Digest")
    if header and header != digest:
        raise JobFailed(f"registry {repo.host} served manifest {tag} with other bytes than its "
                        f"digest {header}", hint="nothing was used")
    doc = m.json()
    if doc.get("artifactType") != artifact_type or len(doc.get("layers") or []) != 1:
        return None
    config = json.loads(_get_blob(repo, doc["config"]["digest"]))
    return digest, config, _get_blob(repo, doc["layers"][0]["digest"])


def push_report(repo: Repository, image_digest: str, report: dict) -> str:
    """Store a smoke report as an artifact that refers to image_digest; return its tag."""
    body = json.dumps(report, indent=2, sort_keys=True).encode()
    cfg = _put_blob(repo, body)
    empty = _put_blob(repo, b"{}")
    manifest = {
        "schemaVersion": 2, "mediaType": OCI_MANIFEST, "artifactType": REPORT_TYPE,
        "config": {"mediaType": REPORT_TYPE, "digest": cfg, "size": len(body)},
        "layers": [{"mediaType": "application/vnd.oci.empty.v1+json", "digest": empty, "size": 2}],
        "subject": {"mediaType": "application/vnd.docker.distribution.manifest.v2+json",
                    "digest": image_digest},
        "annotations": {"io.imgbuild.smoke.ok": str(bool(report.get("ok"))).lower()},
    }
    tag = report_tag(image_digest)
    try:
        r = requests.put(f"{repo.base_url}/v2/{repo.path}/manifests/{tag}",
                         data=json.dumps(manifest).encode(),
                         headers={"Content-Type": OCI_MANIFEST}, timeout=30)
    except requests.RequestException as e:
        raise unreachable(repo, e) from None
    if r.status_code not in (200, 201):
        raise JobFailed(f"registry {repo.host} refused the smoke report ({r.status_code})",
                        facts=[r.text[:300]], hint="the image was pushed; its tags were not moved")
    return tag


def fetch_report(repo: Repository, image_digest: str) -> dict | None:
    """The smoke report stored for image_digest, or None when there is none."""
    if repo.host is None:
        return None
    tag = report_tag(image_digest)
    try:
        m = requests.get(f"{repo.base_url}/v2/{repo.path}/manifests/{tag}",
                         headers={"Accept": OCI_MANIFEST}, timeout=10)
        if m.status_code == 404:
            return None
        m.raise_for_status()
        cfg = m.json()["config"]["digest"]
        b = requests.get(f"{repo.base_url}/v2/{repo.path}/blobs/{cfg}", timeout=10)
        b.raise_for_status()
        return json.loads(b.content)
    except requests.RequestException as e:
        raise unreachable(repo, e) from None
