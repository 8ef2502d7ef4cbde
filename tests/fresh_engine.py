"""A Docker Engine of a test's own, started empty: what a fresh CI runner's builder is.

The shared Engine's BuildKit cache is everyone's: pruning it to stand in for a fresh runner made
every test after it rebuild (test_build_cache's rebuild used to be slow-group for that), and
its long history decides what inline cache an image carries (moby/buildkit#1992: results lost
after many imports). A second dockerd with its own data root, socket and bridge starts with
nothing: no images, no build cache.

Its containers (a build's RUN steps) need a bridge: `--bridge none` is no way out, since a
dockerd started with it deletes the host's docker0 (moby removes the default bridge interface
when the bridge is off), which the shared Engine's containers use. They reach the network
through a bridge of their own, NATed by two iptables rules this module adds and removes; the
daemon itself is told not to touch iptables, so the shared Engine's rules are left as they
are. Needs root, `ip` and `iptables` (a machine where `make services` runs has them); without
them the test is skipped, saying so.

By default it is the system's dockerd (the one on PATH), with the classic store. `bin_dir` starts
another one, Engine 26 from scripts/engines.sh's install (tests/engines.py
`engine26_bin_dir()`): that directory and its sibling bin/ (an install tree's usr/sbin and
usr/bin) come first on its PATH, so that it also runs their containerd, shim, docker-proxy and
docker-init (and the system's runc); `containerd_store=True` gives it the containerd image store
(`{"features": {"containerd-snapshotter": true}}`). Its `env` is what imgbuild needs to use it:
DOCKER_HOST, and with bin_dir the client beside it (IMGBUILD_DOCKER) and a DOCKER_CONFIG that
holds its buildx plugin.
"""

from __future__ import annotations

import contextlib
import ipaddress
import os
import shutil
import signal
import subprocess
import tempfile
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import docker


class FreshEngine:
    """The running daemon: where to reach it, and a restart (what a host's upgrade or crash
    does to a build in flight)."""

    def __init__(self, root: Path, bridge: str, bin_dir: Path | None = None,
                 containerd_store: bool = False):
        self.root = root
        self.host = f"unix://{root / 'docker.sock'}"  # DOCKER_HOST for imgbuild and docker
        self.containerd_store = containerd_store
        config = []
        if containerd_store:
            (root / "daemon.json").write_text('{"features": {"containerd-snapshotter": true}}\n')
            config = ["--config-file", str(root / "daemon.json")]
        self._argv = [str(bin_dir / "dockerd") if bin_dir else "dockerd", *config,
                      "--data-root", str(root / "data"),
                      "--exec-root", str(root / "exec"), "--pidfile", str(root / "dockerd.pid"),
                      "-H", self.host, "--bridge", bridge,
                      "--iptables=false", "--ip-masq=false", "--ip-forward=false"]
        self._env: dict[str, str] | None = None
        # What imgbuild and the docker client need to use it.
        self.env: dict[str, str] = {"DOCKER_HOST": self.host}
        if bin_dir is not None:
            paths = _bin_dirs(bin_dir)
            self._env = dict(os.environ, PATH=os.pathsep.join(
                [*map(str, paths), os.environ.get("PATH", "")]))
            client = next((p / "docker" for p in paths if (p / "docker").exists()), None)
            plugin = bin_dir.parent / "libexec" / "docker" / "cli-plugins" / "docker-buildx"
            if client is not None:
                self.env["IMGBUILD_DOCKER"] = str(client)
            if plugin.exists():
                (root / "docker-config" / "cli-plugins").mkdir(parents=True)
                (root / "docker-config" / "cli-plugins" / "docker-buildx").symlink_to(plugin)
                self.env["DOCKER_CONFIG"] = str(root / "docker-config")
        self._proc: subprocess.Popen | None = None

    @property
    def pid(self) -> int:
        assert self._proc is not None
        return self._proc.pid

    def client(self) -> docker.DockerClient:
        return docker.DockerClient(base_url=self.host, timeout=600)

    def start(self) -> None:
        with open(self.root / "dockerd.log", "ab") as log:
            self._proc = subprocess.Popen(self._argv, stdout=log, stderr=subprocess.STDOUT,
                                          stdin=subprocess.DEVNULL, start_new_session=True,
                                          env=self._env)
        deadline = time.monotonic() + 60
        while True:
            try:
                docker.DockerClient(base_url=self.host, timeout=5).ping()
                return
            except Exception:
                if self._proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError("the test's dockerd did not come up:\n"
                                       + (self.root / "dockerd.log").read_text()[-3000:]) \
                        from None
                time.sleep(0.3)

    def stop(self) -> None:
        if self._proc is None or self._proc.poll() is not None:
            return
        self._proc.send_signal(signal.SIGTERM)
        try:
            self._proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            self._proc.kill()
            self._proc.wait()

    def restart(self) -> None:
        self.stop()
        self.start()

    def running(self, pattern: str) -> list[int]:
        """Pids of the processes under this daemon (its build steps' and containers') whose
        command line holds `pattern`: another Engine's, on the same host, are not counted."""
        out = []
        for proc in Path("/proc").iterdir():
            if not proc.name.isdigit():
                continue
            try:
                if pattern not in (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(
                        errors="replace"):
                    continue
            except OSError:
                continue
            if self._descends(int(proc.name)):
                out.append(int(proc.name))
        return out

    def _descends(self, pid: int) -> bool:
        while pid > 1:
            if pid == self.pid:
                return True
            try:
                status = Path(f"/proc/{pid}/status").read_text()
            except OSError:
                return False
            pid = int(next(ln.split()[1] for ln in status.splitlines()
                           if ln.startswith("PPid:")))
        return False


def _bin_dirs(bin_dir: Path) -> list[Path]:
    """bin_dir, and its sibling bin/ where there is one (usr/sbin's usr/bin)."""
    sibling = bin_dir.parent / "bin"
    return [bin_dir, sibling] if sibling != bin_dir and sibling.is_dir() else [bin_dir]


def missing(bin_dir: Path | None = None) -> str | None:
    """Why this machine cannot start one (None when it can)."""
    if os.geteuid() != 0:
        return "a second Docker Engine needs root"
    if bin_dir is not None and not (bin_dir / "dockerd").exists():
        return f"no dockerd in {bin_dir} (make services installs Engine 26: scripts/engines.sh)"
    for tool in ("ip", "iptables") if bin_dir is not None else ("dockerd", "ip", "iptables"):
        if shutil.which(tool) is None:
            return f"a second Docker Engine needs {tool} on PATH"
    if Path("/proc/sys/net/ipv4/ip_forward").read_text().strip() != "1":
        return "IP forwarding is off (the shared Engine turns it on)"
    return None


def _free_subnet() -> ipaddress.IPv4Network:
    used = subprocess.run(["ip", "-4", "route"], capture_output=True, text=True).stdout
    for third in range(200, 250):
        net = ipaddress.IPv4Network(f"172.30.{third}.0/24")
        if str(net) not in used:
            return net
    raise RuntimeError("no free 172.30.x.0/24 for a test bridge")


def _sh(*cmd: str) -> None:
    subprocess.run(cmd, check=True, capture_output=True, text=True)


@contextlib.contextmanager
def fresh_engine(bin_dir: Path | None = None,
                 containerd_store: bool = False) -> Iterator[FreshEngine]:
    # A short path: a unix socket's path has a 108-byte limit.
    root = Path(tempfile.mkdtemp(prefix="ibfe-", dir="/tmp"))
    bridge = "ibfe" + uuid.uuid4().hex[:8]
    net = _free_subnet()
    gateway = f"{net.network_address + 1}/{net.prefixlen}"
    nat = ["-t", "nat", "POSTROUTING", "-s", str(net), "!", "-o", bridge, "-j", "MASQUERADE"]
    forward = [["FORWARD", "-i", bridge, "-j", "ACCEPT"],
               ["FORWARD", "-o", bridge, "-m", "conntrack", "--ctstate", "RELATED,ESTABLISHED",
                "-j", "ACCEPT"]]
    undo: list[list[str]] = []
    engine = None
    try:
        _sh("ip", "link", "add", "name", bridge, "type", "bridge")
        undo.append(["ip", "link", "del", bridge])
        _sh("ip", "addr", "add", gateway, "dev", bridge)
        _sh("ip", "link", "set", bridge, "up")
        _sh("iptables", *nat[:2], "-A", *nat[2:])
        undo.append(["iptables", *nat[:2], "-D", *nat[2:]])
        for rule in forward:
            _sh("iptables", "-I", *rule)
            undo.append(["iptables", "-D", *rule])
        engine = FreshEngine(root, bridge, bin_dir, containerd_store)
        engine.start()
        yield engine
    finally:
        if engine is not None:
            engine.stop()
        for cmd in reversed(undo):
            subprocess.run(cmd, capture_output=True)
        # Its overlay mounts normally go with it; any left are unmounted before the delete,
        # deepest first, so that nothing is deleted through a mount.
        mounts = [line.split()[1] for line in Path("/proc/mounts").read_text().splitlines()]
        for m in sorted((m for m in mounts if m.startswith(str(root) + "/")), reverse=True):
            subprocess.run(["umount", "-l", m], capture_output=True)
        shutil.rmtree(root, ignore_errors=True)
