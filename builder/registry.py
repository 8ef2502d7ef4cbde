"""Registries: look a tag up over the Distribution API, push and pull through the Engine."""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass

import requests

from .errors import EnvError, JobFailed

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
    def parse(cls, name: str) -> "Repository":
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
    from docker.errors import APIError, NotFound

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
