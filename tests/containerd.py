"""A containerd of the test's own, to pull and run images the way a Kubernetes node does.

A node's kubelet pulls through containerd (CRI), not through the Docker Engine: containerd
resolves the tag, checks every blob against its digest, unpacks the layers into a snapshotter
(zstd layers included) and records the manifest digest it pulled. This harness starts Debian's
`containerd` (1.6) on a socket under the test's tmp dir, with its own root and state, and drives
it with `ctr`, so a test can ask "would a node accept this image, and as which digest?".

    from .containerd import containerd_daemon

    @pytest.mark.docker            # it reaches the registry (through ctr, which the guard
    def test_x(tmp_path):          # cannot see, so mark the test yourself)
        with containerd_daemon(tmp_path) as ctrd:
            digest = ctrd.pull("127.0.0.1:5000/repo:tag")       # "sha256:…"
            out = ctrd.run("127.0.0.1:5000/repo:tag", ["python", "-m", "x"])  # CompletedProcess

Two ways to pull. `pull` is `ctr images pull`: containerd 1.6's ctr fetches every blob first
and unpacks after (cmd/ctr/commands/images/pull.go, the non-transfer path). A kubelet calls the
CRI plugin's ImageService/PullImage instead, which pulls with unpack on: each layer is applied
as soon as its download ends while later layers still download (pkg/cri/server/image_pull.go,
client.Pull(WithPullUnpack)). `Containerd(workdir, cri=True)` turns the CRI plugin on and
`kubelet_pull` calls PullImage over the daemon's gRPC socket, so a benchmark times what a node
times; its images live in CRI's namespace, k8s.io, which `digest` and `run` then use.
`bin_dir=` runs another release unpacked or built beside the system's; with containerd >= 2.2,
`unpacks=N` sets its transfer service's max_concurrent_unpacks, through which its CRI plugin
pulls (2.1 and newer), so up to N layers are applied at once, each into a snapshot of its own
rebased onto its parent at commit.

What it is not: no kubelet and no pods (only the image service is called), there is no CNI (a
container gets a network namespace with loopback only), and `run` replaces the image's
entrypoint and cmd with `args` (ctr's semantics; a pod's `command` does the same).

Facts measured here (Debian containerd 1.6.20, runc 1.1.5, kernel 6.18, root, cgroup v1): the
daemon answers in ~0.1 s; pulling the 63 MiB base image from the local registry takes ~5 s
(mostly unpacking); the overlayfs snapshotter works; `ctr run` works (runc, overlay mounts and
cgroups are allowed) and returns the container's exit status. An OCI manifest with
tar+zstd layers (hand-pushed to the registry) pulled as the registry's digest and ran. With the
CRI plugin on (and no CNI), the daemon still answers at once and PullImage works on 1.6.20 and
on Debian trixie's 1.7.24 (`bin_dir`: its .deb unpacked elsewhere); a pulled 9.37 GB SGLang
image in zstd: `ctr images pull` 80.3 s, CRI 1.6 69.8 s, CRI 1.7 60.9 s
(bench/node_pull_bench.py).
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import signal
import subprocess
import tempfile
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from imgbuild.errors import EnvError, ImgbuildError

NAMESPACE = "imgbuild-test"
CRI_NAMESPACE = "k8s.io"  # where the CRI plugin keeps the images a kubelet pulled
CRI = "io.containerd.grpc.v1.cri"
DIGEST = re.compile(r"^sha256:[0-9a-f]{64}$")
# The snapshotters containerd would try and log a warning for; off, so its log says only what
# matters. overlayfs and native stay: the first is a node's, the second the fallback. The CRI
# plugin is off unless asked for (cri=True): it starts a stream server and looks for CNI.
UNUSED_PLUGINS = ("io.containerd.snapshotter.v1.aufs",
                  "io.containerd.snapshotter.v1.btrfs", "io.containerd.snapshotter.v1.devmapper",
                  "io.containerd.snapshotter.v1.zfs")


class CtrFailed(ImgbuildError):
    """A `ctr` command failed; `stderr` is ctr's own words."""

    def __init__(self, message: str, *, argv: list[str], returncode: int, stderr: str,
                 hint: str | None = None):
        super().__init__(f"{message}: {stderr.strip() or f'ctr exited {returncode}'}",
                         facts=[" ".join(argv), f"exit status {returncode}"], hint=hint)
        self.argv, self.returncode, self.stderr = argv, returncode, stderr


@dataclass(frozen=True)
class Tools:
    containerd: str
    ctr: str
    runc: str | None  # only `run` needs it


def find_tools(bin_dir: Path | None = None) -> Tools | str:
    """The binaries (containerd and ctr from bin_dir when given: another release unpacked
    beside the system's), or why this machine cannot host the harness (a skip reason)."""
    path = None if bin_dir is None else str(bin_dir)
    containerd, ctr = shutil.which("containerd", path=path), shutil.which("ctr", path=path)
    if not containerd or not ctr:
        return (f"skipped: containerd and ctr are not both in {bin_dir}" if bin_dir else
                "skipped: containerd and ctr are not both on PATH "
                "(Debian: apt-get install containerd)")
    if os.geteuid() != 0:
        return "skipped: containerd needs root (it mounts snapshots and owns its state)"
    return Tools(containerd, ctr, shutil.which("runc"))


def _short_dir() -> Path:
    # A unix socket's path has 108 bytes at most; pytest's tmp_path can be longer.
    return Path(tempfile.mkdtemp(prefix="ctrd-", dir="/tmp"))


class Containerd:
    """One containerd process with its root, state and sockets under `workdir`.

    Attributes after `start()`: `sock` (the gRPC socket to pass to ctr -a), `snapshotter`
    ("overlayfs", or "native" where overlayfs cannot mount) and `snapshotter_reason` (why),
    `log` (the daemon's log file)."""

    def __init__(self, workdir: Path, *, namespace: str = NAMESPACE, debug: bool = False,
                 cri: bool = False, bin_dir: Path | None = None, unpacks: int = 1,
                 log_debug: bool = False):
        tools = find_tools(bin_dir)
        if isinstance(tools, str):
            raise EnvError(tools.removeprefix("skipped: "))
        self.tools = tools
        self.workdir = Path(workdir)
        self.cri = cri
        # With CRI on, ctr looks where the kubelet's pulls land, so digest() and run() see them.
        self.namespace = CRI_NAMESPACE if cri else namespace
        self.hosts_dir = self.workdir / "certs.d"  # CRI's registry hosts (config_path)
        self.root = self.workdir / "root"
        self.state = self.workdir / "state"
        self.runc_root = self.workdir / "runc"  # not /run/containerd/runc, the system's
        self.fifo_dir = self.workdir / "fifo"
        self.log = self.workdir / "containerd.log"
        self.config = self.workdir / "config.toml"
        self._sockdir: Path | None = None
        self.sock = ""
        self.snapshotter = ""
        self.snapshotter_reason = ""
        self._proc: subprocess.Popen | None = None
        self.debug = debug  # serve Go's pprof on debug_sock (bench/pull_profile_bench.py)
        self.debug_sock = ""
        # Layers applied at once by a pull (the transfer service's max_concurrent_unpacks,
        # containerd >= 2.2, which the CRI plugin pulls through; 1, the default, is one after
        # another). Where the snapshotter cannot rebase, containerd says so and stays at 1.
        self.unpacks = unpacks
        # The daemon's debug lines too: how each image was unpacked ("image unpacked ...
        # parallel=true"), on whenever unpacks > 1 asks for something to check.
        self.log_debug = log_debug

    def unpack_modes(self) -> list[str]:
        """How this daemon unpacked each image it pulled, from its debug log ("image unpacked
        ... parallel=true"): 'parallel=true' or 'parallel=false', in order."""
        lines = [ln for ln in self.log.read_text(errors="replace").splitlines()
                 if "image unpacked" in ln]
        return [m.group(0) for m in re.finditer(r"parallel=(true|false)", "\n".join(lines))]

    @property
    def pid(self) -> int:
        assert self._proc is not None
        return self._proc.pid

    # -- lifecycle ---------------------------------------------------------------------------

    def start(self, timeout: float = 30) -> None:
        for d in (self.root, self.state, self.runc_root, self.fifo_dir):
            d.mkdir(parents=True, exist_ok=True)
        self._sockdir = _short_dir()
        self.sock = str(self._sockdir / "containerd.sock")
        self.debug_sock = str(self._sockdir / "debug.sock") if self.debug else ""
        disabled = ", ".join(f'"{p}"' for p in UNUSED_PLUGINS + (() if self.cri else (CRI,)))
        self.config.write_text(f"""version = 2
root = "{self.root}"
state = "{self.state}"
disabled_plugins = [{disabled}]

[grpc]
  address = "{self.sock}"

[ttrpc]
  address = "{self.sock}.ttrpc"

[debug]
  address = "{self.debug_sock}"
  level = "{'debug' if self.log_debug or self.unpacks > 1 else 'info'}"

[metrics]
  address = ""

[plugins."io.containerd.internal.v1.opt"]
  path = "{self.workdir / 'opt'}"
{self._cri_config() if self.cri else ""}{self._transfer_config()}""")
        with open(self.log, "ab") as log:
            # Its own session: a Ctrl-C at the terminal reaches pytest, which tears it down.
            # Its own directory first on PATH: containerd finds its shims there, so a release
            # unpacked elsewhere runs containers with its own shim, not the system's.
            env = os.environ | {"PATH": f"{Path(self.tools.containerd).parent}:"
                                        f"{os.environ.get('PATH', '')}"}
            self._proc = subprocess.Popen([self.tools.containerd, "--config", str(self.config)],
                                          stdout=log, stderr=subprocess.STDOUT, env=env,
                                          stdin=subprocess.DEVNULL, start_new_session=True)
        deadline = time.monotonic() + timeout
        while True:
            if self._proc.poll() is not None:
                self._fail_start(f"containerd exited {self._proc.returncode} while starting")
            r = self._ctr("version", timeout=10, connect_timeout="1s")
            if r.returncode == 0:
                break
            if time.monotonic() > deadline:
                self._fail_start(f"containerd did not answer on {self.sock} in {timeout:.0f} s "
                                 f"(ctr version: {r.stderr.strip()})")
            time.sleep(0.1)
        self._choose_snapshotter()

    def _cri_config(self) -> str:
        # A kubelet's defaults but for what must stay inside workdir: no TCP stream server,
        # CNI looked for under workdir (there is none: PullImage does not need it), registry
        # hosts read from hosts_dir (kubelet_pull writes one per plain-HTTP registry).
        # max_concurrent_downloads stays at CRI's default, 3, as on a node.
        self.hosts_dir.mkdir(parents=True, exist_ok=True)
        return f"""
[plugins."{CRI}"]
  disable_tcp_service = true
  stream_server_address = "127.0.0.1"
  stream_server_port = "0"
  enable_selinux = false
  [plugins."{CRI}".containerd]
    snapshotter = "overlayfs"
  [plugins."{CRI}".cni]
    bin_dir = "{self.workdir / 'cni' / 'bin'}"
    conf_dir = "{self.workdir / 'cni' / 'conf'}"
  [plugins."{CRI}".registry]
    config_path = "{self.hosts_dir}"
"""

    def _transfer_config(self) -> str:
        if self.unpacks <= 1:
            return ""  # containerd's default; a release before 2.2 has no such key
        return f"""
[plugins."io.containerd.transfer.v1.local"]
  max_concurrent_unpacks = {self.unpacks}
"""

    def _fail_start(self, what: str) -> None:
        tail = self.log.read_text(errors="replace").splitlines()[-15:] if self.log.exists() else []
        self.stop()
        raise EnvError(what, facts=tail, hint=f"the daemon's whole log is {self.log}")

    def _choose_snapshotter(self) -> None:
        """overlayfs where containerd's own check passed (it mounts a test overlay in its root
        when it loads the plugin), else native, which copies each layer and always works."""
        r = self._ctr("plugins", "ls", timeout=30)
        status = ""
        for line in r.stdout.splitlines():
            cols = line.split()
            if cols[:2] == ["io.containerd.snapshotter.v1", "overlayfs"]:
                status = cols[-1]
        if status == "ok":
            self.snapshotter, self.snapshotter_reason = "overlayfs", "overlayfs plugin ok"
            return
        said = [ln for ln in self.log.read_text(errors="replace").splitlines()
                if "snapshotter.v1.overlayfs" in ln]
        self.snapshotter = "native"
        self.snapshotter_reason = (f"overlayfs plugin {status or 'absent'}: "
                                   + (said[-1] if said else "containerd logged no reason"))

    def stop(self) -> None:
        """Kill what still runs in the namespace, stop the daemon, unmount what it left under
        workdir and remove its state (the image layers and the socket dir)."""
        if self._proc is not None and self._proc.poll() is None:
            with contextlib.suppress(Exception):
                self._kill_tasks()
            self._proc.send_signal(signal.SIGTERM)
            try:
                self._proc.wait(15)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait(15)
        self._proc = None
        self._unmount_under(self.workdir)
        for d in (self.root, self.state, self.runc_root, self.fifo_dir, self.workdir / "opt",
                  self.hosts_dir):
            shutil.rmtree(d, ignore_errors=True)
        if self._sockdir is not None:
            shutil.rmtree(self._sockdir, ignore_errors=True)
            self._sockdir = None

    def _kill_tasks(self) -> None:
        # A task left running keeps its shim (a process outside this one's tree) and its
        # rootfs mount alive after containerd stops.
        r = self._ctr("tasks", "ls", "-q", timeout=30)
        for cid in r.stdout.split():
            self._remove_container(cid)

    def _remove_container(self, cid: str) -> None:
        self._ctr("tasks", "kill", "-s", "SIGKILL", cid, timeout=30)
        for _ in range(50):
            if self._ctr("tasks", "rm", "-f", cid, timeout=30).returncode == 0:
                break
            time.sleep(0.1)
        self._ctr("containers", "rm", cid, timeout=30)

    @staticmethod
    def _unmount_under(path: Path) -> None:
        prefix = str(path.resolve()).rstrip("/") + "/"
        with open("/proc/self/mountinfo") as f:
            points = [ln.split()[4] for ln in f]
        for point in sorted((p for p in points if p.startswith(prefix)), key=len, reverse=True):
            if subprocess.run(["umount", point], capture_output=True).returncode != 0:
                subprocess.run(["umount", "-l", point], capture_output=True)

    def __enter__(self) -> Containerd:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # -- ctr ---------------------------------------------------------------------------------

    def _ctr(self, *args: str, timeout: float, connect_timeout: str = "10s"
             ) -> subprocess.CompletedProcess:
        argv = [self.tools.ctr, "-a", self.sock, "-n", self.namespace,
                "--connect-timeout", connect_timeout, *args]
        return subprocess.run(argv, capture_output=True, text=True, timeout=timeout,
                              stdin=subprocess.DEVNULL)

    def ctr(self, *args: str, timeout: float = 300) -> subprocess.CompletedProcess:
        """Any other ctr command against this daemon and namespace; raises when ctr fails."""
        r = self._ctr(*args, timeout=timeout)
        if r.returncode != 0:
            raise CtrFailed(f"ctr {' '.join(args)} failed", argv=list(r.args),
                            returncode=r.returncode, stderr=r.stderr)
        return r

    def pull(self, ref: str, *, plain_http: bool = True, timeout: float = 900) -> str:
        """Pull `ref` (fully qualified: host/repo:tag or @digest) for this machine's platform
        and unpack it into the snapshotter, as a node does; return the digest containerd
        recorded for it (the manifest's, or the index's for a multi-platform tag)."""
        args = ["images", "pull", "--snapshotter", self.snapshotter]
        if plain_http:
            args.append("--plain-http")
        r = self._ctr(*args, ref, timeout=timeout)
        if r.returncode != 0:
            raise CtrFailed(f"containerd could not pull {ref}", argv=list(r.args),
                            returncode=r.returncode, stderr=r.stderr,
                            hint="ctr's own words; a kubelet pulls through CRI, whose words differ (kubelet_pull)")
        return self.digest(ref)

    def kubelet_pull(self, ref: str, *, plain_http: bool = True, timeout: float = 1800) -> str:
        """Pull `ref` as a kubelet does: the CRI plugin's ImageService/PullImage over gRPC
        (download and unpack overlapped, 3 downloads at once). Needs `cri=True`. Returns the
        digest containerd recorded for it, as `pull` does."""
        if not self.cri:
            raise EnvError("kubelet_pull needs the CRI plugin: Containerd(workdir, cri=True)")
        if self.snapshotter != "overlayfs":
            raise EnvError(f"the CRI plugin here unpacks into overlayfs, which cannot be used "
                           f"({self.snapshotter_reason})")
        import grpc

        host = ref.split("/", 1)[0]
        if plain_http:
            d = self.hosts_dir / host
            d.mkdir(parents=True, exist_ok=True)
            (d / "hosts.toml").write_text(f'server = "http://{host}"\n'
                                          f'[host."http://{host}"]\n'
                                          f'  capabilities = ["pull", "resolve"]\n')
        request, response = _cri_pull_messages()
        with grpc.insecure_channel(f"unix://{self.sock}") as channel:
            call = channel.unary_unary("/runtime.v1.ImageService/PullImage",
                                       request_serializer=request.SerializeToString,
                                       response_deserializer=response.FromString)
            try:
                call(request(image={"image": ref}), timeout=timeout)
            except grpc.RpcError as e:
                raise CtrFailed(f"containerd's CRI could not pull {ref}",
                                argv=["PullImage", ref], returncode=1,
                                stderr=f"{e.code().name}: {e.details()}",  # type: ignore[attr-defined]
                                hint="this is what a node's kubelet would report") from None
        return self.digest(ref)

    def digest(self, ref: str) -> str:
        """The digest containerd holds for image `ref`, read from `ctr images ls`."""
        r = self.ctr("images", "ls", timeout=60)
        for line in r.stdout.splitlines()[1:]:
            cols = line.split()
            # REF TYPE DIGEST SIZE PLATFORMS LABELS: the ref and digest hold no spaces, the
            # size does ("63.1 MiB"), so find the digest by its shape, not its column.
            if cols and cols[0] == ref:
                found = [c for c in cols[1:] if DIGEST.match(c)]
                if found:
                    return found[0]
        raise CtrFailed(f"containerd holds no image {ref} after pulling it",
                        argv=list(r.args), returncode=0, stderr=r.stdout)

    def run(self, ref: str, args: list[str], *, env: dict[str, str] | None = None,
            timeout: int = 300) -> subprocess.CompletedProcess:
        """`ctr run --rm` the pulled image `ref` with argv `args` (replacing its entrypoint and
        cmd; its env, user and working dir stay), no network but loopback. Returns ctr's
        CompletedProcess: the container's exit status, stdout and stderr. Raises CtrFailed when
        the container could not be started (ctr's own error), and on timeout after killing it."""
        if self.tools.runc is None:
            raise EnvError("cannot run a container here: runc is not on PATH",
                           hint="apt-get install runc; pull works without it")
        cid = f"t-{uuid.uuid4().hex[:12]}"
        argv = ["run", "--rm", "--snapshotter", self.snapshotter,
                "--runc-root", str(self.runc_root), "--fifo-dir", str(self.fifo_dir)]
        for k, v in (env or {}).items():
            argv += ["--env", f"{k}={v}"]
        argv += [ref, cid, *args]
        try:
            r = self._ctr(*argv, timeout=timeout)
        except subprocess.TimeoutExpired as e:
            self._remove_container(cid)  # killing ctr leaves the task running
            raise CtrFailed(f"{' '.join(args)} in {ref} ran past {timeout} s; killed",
                            argv=[str(a) for a in e.cmd], returncode=-9,
                            stderr=_text(e.stderr)) from None
        # ctr exits with the container's status; its own failures (runc refused, no such
        # image) say "ctr: …" on stderr, which a container's own output does not.
        if r.returncode != 0 and any(ln.startswith("ctr: ") for ln in r.stderr.splitlines()):
            self._ctr("containers", "rm", cid, timeout=30)
            raise CtrFailed(f"containerd could not run {ref}", argv=list(r.args),
                            returncode=r.returncode, stderr=r.stderr,
                            hint=f"the daemon's log is {self.log}")
        return r


def _cri_pull_messages() -> tuple[type, type]:
    """PullImageRequest and PullImageResponse of the CRI API (k8s.io/cri-api, package
    runtime.v1), built from their descriptors with protobuf: only the fields a pull by
    reference sends and reads (ImageSpec.image = 1; PullImageRequest.image = 1;
    PullImageResponse.image_ref = 1). Unknown fields in a reply are kept, not refused."""
    from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

    fd = descriptor_pb2.FieldDescriptorProto
    f = descriptor_pb2.FileDescriptorProto(name="imgbuild/cri_pull.proto", package="runtime.v1",
                                           syntax="proto3")
    f.message_type.add(name="ImageSpec").field.add(
        name="image", number=1, type=fd.TYPE_STRING, label=fd.LABEL_OPTIONAL)
    f.message_type.add(name="PullImageRequest").field.add(
        name="image", number=1, type=fd.TYPE_MESSAGE, label=fd.LABEL_OPTIONAL,
        type_name=".runtime.v1.ImageSpec")
    f.message_type.add(name="PullImageResponse").field.add(
        name="image_ref", number=1, type=fd.TYPE_STRING, label=fd.LABEL_OPTIONAL)
    pool = descriptor_pool.DescriptorPool()
    pool.Add(f)
    return tuple(message_factory.GetMessageClass(pool.FindMessageTypeByName(f"runtime.v1.{n}"))
                 for n in ("PullImageRequest", "PullImageResponse"))  # type: ignore[return-value]


def _text(b: bytes | str | None) -> str:
    return b.decode(errors="replace") if isinstance(b, bytes) else (b or "")


@contextlib.contextmanager
def containerd_daemon(tmp_path: Path, *, cri: bool = False, bin_dir: Path | None = None,
                      unpacks: int = 1, log_debug: bool = False) -> Iterator[Containerd]:
    """A started Containerd under tmp_path/containerd (with the CRI plugin on: cri=True; the
    release in bin_dir, else the system's), stopped and cleaned up on exit; skips the test
    when this machine has no containerd, ctr or root."""
    tools = find_tools(bin_dir)
    if isinstance(tools, str):
        pytest.skip(tools)
    with Containerd(Path(tmp_path) / "containerd", cri=cri, bin_dir=bin_dir,
                    unpacks=unpacks, log_debug=log_debug) as c:
        yield c
