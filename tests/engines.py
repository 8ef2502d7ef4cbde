"""The Docker Engines the tests run imgbuild's core path on, as test parameters.

Users have three kinds: Debian bookworm's 20.10 (the shared Engine these machines run),
Engine 26 with the classic image store (overlay2), and Engine 26 with the containerd image
store (Engine 29's and Docker Desktop's default). scripts/engines.sh (run by `make services`)
installs Engine 26 from Debian trixie beside the system's and starts the two 26 daemons, each
described by an env file ($IMGBUILD_STATE/engines/<name>.env: DOCKER_HOST, IMGBUILD_DOCKER, and
a DOCKER_CONFIG holding the buildx plugin, which clients from 23 on build with). One more mix
users have: a client newer than its server, the 26 client (with buildx) against the 20.10
Engine (26-client.env).

    engine = engines.get("26-containerd")       # or pytest.skip(...) with the reason
    run_imgbuild("tiny-cpu", env=engine.env)    # imgbuild against that Engine
    engine.client().images.list()               # the docker SDK against it
    engine.docker("images")                     # its own docker client
"""

from __future__ import annotations

import os
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

import docker
import pytest

STATE = Path(os.environ.get("IMGBUILD_STATE", "/var/lib/imgbuild"))
ENGINES_DIR = STATE / "engines"

SHARED = "20.10"  # the shared Engine (tests/conftest.py's docker_client)
CLASSIC = "26-classic"
CONTAINERD = "26-containerd"
CLIENT_MIX = "26-client"  # the 26 client against the shared Engine
ENGINES = (SHARED, CLASSIC, CONTAINERD)

WHAT = {
    SHARED: "the shared Docker Engine (Debian bookworm's 20.10)",
    CLASSIC: "Engine 26 with the classic store",
    CONTAINERD: "Engine 26 with the containerd store",
    CLIENT_MIX: "the Docker 26 client with buildx against the shared Engine",
}


@dataclass(frozen=True)
class Engine:
    name: str
    env: dict[str, str]  # for a subprocess (run_imgbuild's env=, the docker client)
    shared: bool  # the shared Engine: other tests' images are in it; never emptied
    version: str = ""  # the server's
    storage: str = ""  # its storage driver (overlay2; overlayfs: the containerd store)
    facts: dict[str, str] = field(default_factory=dict)

    @property
    def what(self) -> str:
        return WHAT[self.name]

    @property
    def host(self) -> str:
        return self.env.get("DOCKER_HOST") or os.environ.get("DOCKER_HOST") \
            or "unix:///var/run/docker.sock"

    @property
    def docker_path(self) -> str:
        return self.env.get("IMGBUILD_DOCKER") or "/usr/bin/docker"

    @property
    def containerd_store(self) -> bool:
        return "io.containerd.snapshotter" in self.facts.get("driver_status", "")

    def client(self) -> docker.DockerClient:
        return docker.DockerClient(base_url=self.host, timeout=600)

    def docker(self, *args: str, timeout: int = 600, check: bool = False
               ) -> subprocess.CompletedProcess:
        """Its own docker client (the 20.10 one for the shared Engine, the 26 one otherwise)."""
        r = subprocess.run([self.docker_path, *args], env=os.environ | self.env,
                           capture_output=True, text=True, timeout=timeout)
        if check:
            assert r.returncode == 0, f"docker {' '.join(args)}: {r.stderr[-2000:]}"
        return r

    def with_docker_config(self, config_dir: Path) -> dict[str, str]:
        """This Engine's env with DOCKER_CONFIG=config_dir (a test's own credentials): the buildx
        plugin linked into it as well, where this Engine's client builds through buildx."""
        env = dict(self.env, DOCKER_CONFIG=str(config_dir))
        plugin = buildx_plugin(self.env)
        if plugin is not None:
            (config_dir / "cli-plugins").mkdir(parents=True, exist_ok=True)
            link = config_dir / "cli-plugins" / "docker-buildx"
            if not link.exists():
                link.symlink_to(plugin)
        return env


def buildx_plugin(env: dict[str, str]) -> Path | None:
    config = env.get("DOCKER_CONFIG")
    if not config:
        return None
    p = Path(config) / "cli-plugins" / "docker-buildx"
    return p.resolve() if p.exists() else None


def env_file(name: str) -> Path:
    return ENGINES_DIR / f"{name}.env"


def read_env(path: Path) -> dict[str, str]:
    """KEY=value lines (what `set -a; . FILE` reads here: no quoting, no expansion)."""
    out = {}
    for line in path.read_text().splitlines():
        line = line.strip()
        if line and not line.startswith("#") and "=" in line:
            k, _, v = line.partition("=")
            out[k.strip()] = v.strip()
    return out


def _not_running(name: str, why: str) -> str:
    return f"skipped: {WHAT[name]} is not running (make services starts it): {why}"


def find(name: str) -> Engine | str:
    """The Engine, answering; or why not, in words (a skip reason)."""
    if name == SHARED:
        env = {"IMGBUILD_DOCKER": "/usr/bin/docker"} if Path("/usr/bin/docker").exists() else {}
        shared = True
    else:
        path = env_file(name)
        if not path.exists():
            return _not_running(name, f"no {path} (scripts/engines.sh writes it: as root, "
                                      "with Debian's trixie packages in reach)")
        env = read_env(path)
        shared = name == CLIENT_MIX
        missing = [k for k in ("DOCKER_HOST", "IMGBUILD_DOCKER", "DOCKER_CONFIG") if k not in env]
        if missing:
            return _not_running(name, f"{path} lacks {', '.join(missing)}")
        if not Path(env["IMGBUILD_DOCKER"]).exists():
            return _not_running(name, f"no docker client at {env['IMGBUILD_DOCKER']}")
        if buildx_plugin(env) is None:
            return _not_running(name, f"no buildx plugin in {env['DOCKER_CONFIG']}/cli-plugins")
    base = Engine(name, env, shared)
    try:
        info = base.client().info()
    except Exception as e:  # noqa: BLE001 - any failure to answer is the reason to skip
        return _not_running(name, f"no answer on {base.host}: {str(e).splitlines()[0][:200]}")
    driver = str(info.get("DriverStatus"))
    engine = Engine(name, env, shared, str(info.get("ServerVersion", "")),
                    str(info.get("Driver", "")), {"driver_status": driver})
    if name == CONTAINERD and not engine.containerd_store:
        return _not_running(name, f"{base.host} runs without the containerd store ({driver})")
    if name == CLASSIC and engine.containerd_store:
        return _not_running(name, f"{base.host} runs the containerd store")
    return engine


def get(name: str) -> Engine:
    """The Engine, or the test skipped with the reason."""
    found = find(name)
    if isinstance(found, str):
        pytest.skip(found)
    return found


def group(name: str) -> str:
    """The xdist group of the tests on this Engine (tests/docker_guard.py): one worker each.
    The shared Engine's are in test_run's group: both serve tiny-cpu's model with
    `imgbuild run`, and a second run of it on one Engine is refused while the first serves.
    The two Engine 26 share one, the classic store's first (ENGINES' order): the containerd
    store's first build reads the image the classic one pushed (--cache-from), instead of
    building torch from nothing a second time (tests/test_engines.py)."""
    if name == SHARED:
        return "engine-b"
    return "engines-26" if name in (CLASSIC, CONTAINERD) else f"engines-{name}"


def params(names: tuple[str, ...] = ENGINES) -> list:
    """The Engines as test parameters, each in its xdist group."""
    return [pytest.param(n, id=n, marks=pytest.mark.xdist_group(group(n))) for n in names]


def engine26_bin_dir() -> Path | None:
    """usr/sbin of the newest complete Engine 26 install (scripts/engines.sh), for a test's own
    empty Engine 26 (tests/fresh_engine.py `fresh_engine(bin_dir=..., containerd_store=...)`);
    None when there is none."""
    trees = [p for p in ENGINES_DIR.glob("docker-*") if (p / ".complete").exists()]
    for tree in sorted(trees, key=lambda p: [int(x) if x.isdigit() else 0
                                             for x in p.name.removeprefix("docker-").split(".")],
                       reverse=True):
        if (tree / "usr" / "sbin" / "dockerd").exists():
            return tree / "usr" / "sbin"
    return None
