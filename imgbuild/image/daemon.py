"""The Docker Engine as this tool sees it: which CLI builds, and whether the daemon answers."""

from __future__ import annotations

import os
import shutil
import subprocess
import uuid
from dataclasses import dataclass
from functools import cache

import docker
from docker.errors import DockerException

from ..errors import EnvError

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
    """The Engine API client; raises EnvError when no daemon answers."""
    try:
        c = docker.from_env(timeout=600)
        c.ping()
        return c
    except DockerException as e:
        host = os.environ.get("DOCKER_HOST", "unix:///var/run/docker.sock")
        raise EnvError(f"no Docker daemon answers at {host}",
                       facts=[str(e).splitlines()[0][:200]], hint=DAEMON_HINT) from None


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
    except docker.errors.ImageNotFound:
        return None


def cli_command(args: list[str]) -> list[str]:
    """The docker client's command line for `args` (for a Popen the caller streams into)."""
    return [cli().path, *args]
