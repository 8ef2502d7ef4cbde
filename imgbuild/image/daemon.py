"""The Docker Engine as this tool sees it: which CLI builds, and whether the daemon answers."""

from __future__ import annotations

import http.client
import json
import os
import shutil
import socket
import subprocess
from dataclasses import dataclass
from functools import cache
from typing import TYPE_CHECKING, Any
from urllib.parse import quote, urlencode

from ..errors import EnvError

if TYPE_CHECKING:  # the SDK is imported on use: a build that finds its image needs none of it
    import docker

DAEMON_HINT = ("start the daemon (as root: `dockerd >/var/log/dockerd.log 2>&1 &`, or "
               "`make services`), or point DOCKER_HOST at one")


@dataclass(frozen=True)
class DockerCLI:
    path: str
    version: str
    buildkit_env: bool  # True: DOCKER_BUILDKIT=1 with the built-in builder (client < 23)


@cache
def cli() -> DockerCLI:
    """A docker client that can run BuildKit builds with secrets and cache mounts.

    Clients from 23 on hand BuildKit builds to the buildx plugin; the Debian 20.10 client has
    BuildKit built in. IMGBUILD_DOCKER picks one explicitly.
    """
    tried = []
    for c in candidates():
        ver = client_version(c)
        if ver is None:
            continue
        major = int(ver.split(".")[0]) if ver[:1].isdigit() else 0
        if 0 < major < 23:
            return DockerCLI(c, ver, True)
        bx = subprocess.run([c, "buildx", "version"], capture_output=True, text=True)
        if bx.returncode == 0:
            return DockerCLI(c, ver, False)
        tried.append(f"{c} (client {ver or '?'}: needs the buildx plugin, which is missing)")
    raise EnvError(
        "no docker client that can run BuildKit builds",
        facts=tried or ["no docker client found on PATH"],
        hint="install Debian's docker.io (client 20.10 has BuildKit built in) or the buildx "
             "plugin; IMGBUILD_DOCKER=/path/to/docker picks a client")


def candidates() -> list[str]:
    """The docker clients cli() tries, in its order: those that exist."""
    found = [os.environ.get("IMGBUILD_DOCKER"), "/usr/bin/docker", shutil.which("docker")]
    return [c for c in found if c and os.path.exists(c)]


def client_version(path: str) -> str | None:
    """`docker version`'s client part ("20.10.24+dfsg1"); None when it does not run."""
    try:
        return subprocess.run([path, "version", "--format", "{{.Client.Version}}"],
                              capture_output=True, text=True, timeout=30).stdout.strip()
    except (OSError, subprocess.TimeoutExpired):
        return None


def client():
    """The Engine API client; raises EnvError when no daemon answers.

    On the local socket it is an `Engine`: what a build that finds its image here asks (is the
    image here, tag it) goes to the socket directly, everything else to the docker SDK's
    client, made on first use. Importing the SDK (and requests under it) took longer than the
    rest of such a build (bench/startup_bench.py)."""
    path = local_socket()
    if path is not None:
        got = _ask(path, "GET", "/_ping")
        if got is not None and got[0] == 200:
            return Engine(path)
    return sdk_client()  # elsewhere, or no answer: the SDK's client, and its reason


def sdk_client() -> docker.DockerClient:
    """The docker SDK's client for DOCKER_HOST (or the Docker CLI's context), pinged."""
    import docker  # imported on use: see client()
    from docker.errors import DockerException

    try:
        c = docker.from_env(timeout=600)
        c.ping()
        return c
    except DockerException as e:
        host = os.environ.get("DOCKER_HOST", "unix:///var/run/docker.sock")
        raise EnvError(f"no Docker daemon answers at {host}",
                       facts=[str(e).splitlines()[0][:200]], hint=DAEMON_HINT) from None


DEFAULT_SOCKET = "/var/run/docker.sock"


def local_socket() -> str | None:
    """The Engine's unix socket where the docker SDK would use it as is: DOCKER_HOST unset (and
    no Docker CLI context other than the default chosen) or unix://, and no TLS asked for;
    None otherwise (the SDK's client is then the only one)."""
    env = os.environ
    if env.get("DOCKER_TLS_VERIFY") is not None or env.get("DOCKER_CERT_PATH"):
        return None
    host = env.get("DOCKER_HOST")
    if host:
        path = host.removeprefix("unix://")
        return path if host.startswith("unix://") and path.startswith("/") else None
    if env.get("DOCKER_CONTEXT") not in (None, "default"):
        return None
    # The SDK's ContextAPI reads the Docker CLI's current context from the first of these.
    home = os.path.expanduser("~")
    for config in ([os.path.join(env["DOCKER_CONFIG"], "config.json")]
                   if env.get("DOCKER_CONFIG") else []) + [
            os.path.join(home, ".docker", "config.json"), os.path.join(home, ".dockercfg")]:
        if os.path.exists(config):
            try:
                with open(config) as f:
                    current = json.load(f).get("currentContext", "default")
            except Exception:
                current = "default"  # unreadable: the SDK takes the default context too
            if current not in (None, "default"):
                return None
            break
    return DEFAULT_SOCKET


class _UnixConnection(http.client.HTTPConnection):
    """http.client's connection over the Engine's unix socket (the standard library parses the
    answer, chunked or not)."""

    def __init__(self, path: str, timeout: float) -> None:
        super().__init__("docker", timeout=timeout)
        self.path = path

    def connect(self) -> None:
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.settimeout(self.timeout)
        self.sock.connect(self.path)


def _ask(path: str, method: str, url: str, timeout: float = 600) -> tuple[int, bytes] | None:
    """One HTTP request to the Engine's unix socket: (status, body), or None where the socket
    could not be asked or the answer not read (the caller then asks through the SDK)."""
    conn = _UnixConnection(path, timeout)
    try:
        conn.request(method, url, headers={"Content-Length": "0"})
        answer = conn.getresponse()
        return answer.status, answer.read()
    except (OSError, http.client.HTTPException):
        return None
    finally:
        conn.close()


class Engine:
    """The Engine API client on the local socket (client()). `images.get` and an image's `tag`
    ask the socket; any other call, and these where the answer is not the plain success, go to
    the docker SDK's client (made on first use), which answers them as it always did and
    raises its own errors."""

    def __init__(self, path: str) -> None:
        self.path = path
        self._sdk: docker.DockerClient | None = None
        self.images = _Images(self)

    @property
    def sdk(self) -> docker.DockerClient:
        if self._sdk is None:
            self._sdk = sdk_client()
        return self._sdk

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__") or name in ("path", "_sdk", "images"):
            raise AttributeError(name)
        return getattr(self.sdk, name)


class _Images:
    """`client.images`: `get` from the socket, the rest the SDK's."""

    def __init__(self, engine: Engine) -> None:
        self._engine = engine

    def get(self, name: str) -> Any:
        # Quoted as the SDK quotes its own URLs (docker/api/client.py _url).
        got = _ask(self._engine.path, "GET", f"/images/{quote(name, safe='/:')}/json")
        if got is not None and got[0] == 200:
            try:
                attrs = json.loads(got[1])
            except ValueError:
                attrs = None
            if isinstance(attrs, dict) and attrs.get("Id"):
                return _Image(self._engine, attrs)
        return self._engine.sdk.images.get(name)  # not here, or an error: the SDK's answer

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__") or name == "_engine":
            raise AttributeError(name)
        return getattr(self._engine.sdk.images, name)


class _Image:
    """An image as `images.get` found it: `id`, `attrs`, `labels` and `tag` here, the rest the
    SDK's Image for the same ID."""

    def __init__(self, engine: Engine, attrs: dict) -> None:
        self._engine = engine
        self.attrs = attrs
        self._sdk_image: Any = None

    @property
    def id(self) -> str:
        return self.attrs["Id"]

    @property
    def labels(self) -> dict:
        return (self.attrs.get("Config") or {}).get("Labels") or {}

    def tag(self, repository: str, tag: str | None = None, **kwargs: Any) -> bool:
        """As the SDK's Image.tag: True when the Engine tagged it (201)."""
        if set(kwargs) <= {"force"}:
            query = {"tag": tag, "repo": repository, "force": 1 if kwargs.get("force") else 0}
            url = (f"/images/{quote(self.id, safe='/:')}/tag?"
                   + urlencode({k: v for k, v in query.items() if v is not None}))
            got = _ask(self._engine.path, "POST", url)
            if got is not None and got[0] == 201:
                return True
        return self._engine.sdk.api.tag(self.id, repository, tag=tag, **kwargs)

    def reload(self) -> None:
        """As the SDK's Image.reload: `attrs` asked again."""
        self.attrs = self._engine.images.get(self.id).attrs
        self._sdk_image = None

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__") or name in ("_engine", "attrs", "_sdk_image"):
            raise AttributeError(name)
        if self._sdk_image is None:
            self._sdk_image = self._engine.sdk.images.get(self.id)
        return getattr(self._sdk_image, name)


def run_cli(args: list[str], *, cleanup: bool = False, **kw) -> subprocess.CompletedProcess:
    """The docker client. cleanup: a command that undoes something (removes a container) and
    must finish even while imgbuild is being stopped (cli/main.py spares it)."""
    d = cli()
    env = dict(os.environ)
    if cleanup:
        env["IMGBUILD_CLEANUP"] = "1"
    if d.buildkit_env:
        env["DOCKER_BUILDKIT"] = "1"
    return subprocess.run([d.path, *args], env=env, **kw)


# The pid of the imgbuild process that started a container (labels are not part of any key).
OWNER_LABEL = "io.imgbuild.pid"


def run_container(prefix: str, args: list[str], **kw) -> subprocess.CompletedProcess:
    """`docker run --rm --name PREFIX-<random> ARGS`. Named, so that it is removed when this
    process is stopped, interrupted or times out: ending the docker client does not end the
    container it started. Whatever ends the run is raised again (TimeoutExpired included).
    Labelled with this process's pid, so that one run's containers can be told from another's
    on a shared Engine (`docker ps --filter label=io.imgbuild.pid=PID`)."""
    import uuid  # imported on use: a build that finds its image runs no container

    name = f"{prefix}-{uuid.uuid4().hex[:12]}"
    try:
        return run_cli(["run", "--rm", "--name", name, "--label", f"{OWNER_LABEL}={os.getpid()}",
                        *args], **kw)
    except BaseException:
        run_cli(["rm", "-f", name], capture_output=True, cleanup=True)
        raise


def local_image(client, ref: str):
    """The local image `ref`, or None when the Engine has no such image."""
    try:
        return client.images.get(ref)
    except Exception as e:
        from docker.errors import ImageNotFound  # imported on use: only a missing image raises

        if isinstance(e, ImageNotFound):
            return None
        raise


def cli_command(args: list[str]) -> list[str]:
    """The docker client's command line for `args` (for a Popen the caller streams into)."""
    return [cli().path, *args]
