"""A serving container's life on this host: started from a Launch (plan/launch.py) with the
docker client (the exact line `imgbuild run --dry-run` prints), watched until its server
answers or it stops, and removed when the run ends.

The docker client rather than the Engine API starts it, so that what runs is what the dry run
shows, flag for flag; the log is followed and the state read through the API.
"""

from __future__ import annotations

import json
import re
import socket
import subprocess
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

import requests

from ..errors import EnvError
from ..plan.launch import Launch
from . import daemon

# The last lines of a server's log kept for the doctor: a failing server's cause is near the
# end, and a model load can print hundreds of thousands of lines.
LOG_LINES = 20000


@dataclass
class Watch:
    """What was seen of a running container: its log (the last LOG_LINES), the phases reached,
    and how it ended (ready, exited with a code, or timed out)."""

    lines: deque[str] = field(default_factory=lambda: deque(maxlen=LOG_LINES))
    phases: list[tuple[str, float]] = field(default_factory=list)
    status: str = "starting"  # starting | ready | exited | timeout
    exit_code: int | None = None
    seconds: float = 0.0
    served: str | None = None  # the model id the server's model list gives

    @property
    def log(self) -> str:
        return "\n".join(self.lines)


def port_taken(port: int) -> str | None:
    """Why `port` cannot be published on this host (something listens there), or None."""
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    # As the Engine's proxy binds it: connections of an earlier server still in TIME_WAIT do
    # not hold the port, a listener does.
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        s.bind(("0.0.0.0", port))
    except OSError as e:
        return f"port {port} is in use on this host ({e.strerror})"
    finally:
        s.close()
    return None


def running_for(label: str, value: str) -> list[str]:
    """Containers started by `imgbuild run` with this label value that still run."""
    r = daemon.run_cli(["ps", "--filter", f"label={label}={value}", "--format", "{{.Names}}"],
                       capture_output=True, text=True, timeout=60)
    return [n for n in r.stdout.split() if n]


@dataclass(frozen=True)
class Holder:
    """The container that holds a name on this host, whoever started it."""

    name: str
    state: str  # running | exited | created | paused | ...
    exit_code: int
    labels: dict[str, str]


def holder(name: str) -> Holder | None:
    """The container named `name`, running or not, or None when the name is free. By exact
    name: `docker inspect` reads a name or an id, and these names are not hexadecimal."""
    r = daemon.run_cli(["inspect", "--type", "container", "--format", "{{json .}}", name],
                       capture_output=True, text=True, timeout=60)
    return holder_from(name, r.returncode, r.stdout)


def holder_from(name: str, returncode: int, stdout: str) -> Holder | None:
    """The Holder that `docker inspect`'s exit status and JSON describe; None: no such one."""
    if returncode != 0:
        return None
    doc = json.loads(stdout)
    state = doc.get("State") or {}
    return Holder(name, str(state.get("Status", "unknown")), int(state.get("ExitCode") or 0),
                  dict((doc.get("Config") or {}).get("Labels") or {}))


def start(launch: Launch) -> str:
    """`docker run -d ...` as the dry run prints it; the container's id. A refusal by the Engine
    (no GPU runtime, an image it cannot find) is an EnvError with the client's words."""
    r = daemon.run_cli(launch.docker_args(detach=True, rm=False)[1:], capture_output=True,
                       text=True, timeout=600)
    if r.returncode != 0:
        said = (r.stderr or r.stdout).strip()
        # The client created the container and could not start it: remove what it made. Not
        # when the name was taken meanwhile: that container is someone else's.
        if removes_after_failed_start(said):
            daemon.run_cli(["rm", "-f", launch.name], capture_output=True, cleanup=True)
        raise EnvError(f"docker could not start {launch.name}",
                       facts=[line for line in said.splitlines()[-6:] if line.strip()],
                       hint=_start_hint(said))
    return r.stdout.strip().splitlines()[-1]


def removes_after_failed_start(said: str) -> bool:
    """Whether a container `docker run` could not start is removed: yes, unless the client's
    words say the name was already in use (that container is someone else's)."""
    return "is already in use" not in said


def _start_hint(said: str) -> str:
    if "could not select device driver" in said or "nvidia-container" in said:
        return ("the Engine has no NVIDIA runtime: install the NVIDIA Container Toolkit and "
                "run `nvidia-ctk runtime configure --runtime=docker`, then restart dockerd")
    if "port is already allocated" in said or "address already in use" in said:
        return "pick another port with --port, or stop what holds it"
    return "see the docker client's message above"


def remove(name: str) -> str | None:
    """Stop and remove the container: even while imgbuild itself is being stopped. None when
    it is gone; else the client's words (the daemon went away, say), for the caller to tell
    the user that a served container may still hold its GPU and port."""
    try:
        r = daemon.run_cli(["rm", "-f", name], capture_output=True, text=True, cleanup=True,
                           timeout=120)
    except subprocess.TimeoutExpired:
        return "`docker rm -f` did not finish in 120 s"
    return removal_said(r.returncode, r.stdout, r.stderr)


def removal_said(returncode: int, stdout: str | None, stderr: str | None) -> str | None:
    """What `docker rm -f` exiting `returncode` tells the user: None when the container is gone."""
    if returncode == 0:  # `rm -f` of a container already gone exits 0 too
        return None
    said = (stderr or stdout or "").strip()
    return said.splitlines()[-1] if said else f"`docker rm -f` exited {returncode}"


def watch(launch: Launch, container_id: str, *, timeout_s: float,
          on_phase: Callable[[str, str], None] = lambda _p, _l: None,
          poll_s: float = 1.0, clock: Callable[[], float] = time.monotonic) -> Watch:
    """Follow the log and poll the health and model-list endpoints until both answer (ready),
    the container stops (exited) or `timeout_s` passes (timeout)."""
    w = Watch()
    phases = [(name, re.compile(rx)) for name, rx in launch.phases]
    seen: set[str] = set()
    started = clock()

    def follow() -> None:
        proc = subprocess.Popen(daemon.cli_command(["logs", "-f", container_id]),
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                errors="replace")
        assert proc.stdout is not None
        for line in proc.stdout:
            line = line.rstrip("\n")
            w.lines.append(line)
            for name in phases_reached(line, phases, seen):
                seen.add(name)
                w.phases.append((name, round(clock() - started, 1)))
                on_phase(name, line)
        proc.wait()

    reader = threading.Thread(target=follow, name="container-log", daemon=True)
    reader.start()
    base = f"http://127.0.0.1:{launch.host_port}"

    def elapsed() -> float:
        # The time that decides a timeout is the time reported with it (the log reader and
        # the endpoints' answers take time between the top of a poll and this reading).
        s = clock() - started
        w.seconds = round(s, 1)
        return s

    while True:
        w.seconds = round(clock() - started, 1)
        state = _state(container_id)
        verdict = watch_verdict(
            state, lambda: _answers(base, launch.health_path) and
            _answers(base, launch.models_path), elapsed, timeout_s)
        if verdict == "exited":
            assert state is not None
            w.status, w.exit_code = "exited", state[1]
            break
        if verdict == "ready":
            w.status, w.served = "ready", _first_model(base + launch.models_path)
            break
        if verdict == "timeout":
            w.status = "timeout"
            break
        time.sleep(poll_s)
    if w.status != "ready":
        reader.join(timeout=10)  # the log's last lines: what the doctor reads
    return w


def phases_reached(line: str, phases: list[tuple[str, re.Pattern[str]]],
                   seen: set[str]) -> list[str]:
    """The phases not yet in `seen` whose regex this log line matches, in table order."""
    return [name for name, rx in phases if name not in seen and rx.search(line)]


def watch_verdict(state: tuple[str, int | None] | None, answers: Callable[[], bool],
                  elapsed: Callable[[], float], timeout_s: float) -> str | None:
    """One poll of `watch`: "exited" when the container stopped (first: a stopped server's
    port may be someone else's), "ready" when its endpoints answer, "timeout" once timeout_s
    has passed, None to poll again. `answers` and `elapsed` are asked only when needed."""
    if state is not None and state[0] != "running":
        return "exited"
    if answers():
        return "ready"
    if elapsed() > timeout_s:
        return "timeout"
    return None


def _state(container_id: str) -> tuple[str, int | None] | None:
    r = daemon.run_cli(["inspect", "--format", "{{.State.Status}} {{.State.ExitCode}}",
                        container_id], capture_output=True, text=True, timeout=60)
    return parse_state(r.returncode, r.stdout)


def parse_state(returncode: int, stdout: str) -> tuple[str, int | None]:
    """(status, exit code) from `docker inspect --format '{{.State.Status}} {{.State.ExitCode}}'`;
    ("gone", None) when inspect fails (no such container)."""
    if returncode != 0:
        return ("gone", None)
    status, _, code = stdout.strip().partition(" ")
    return status, int(code) if code.lstrip("-").isdigit() else None


def _answers(base: str, path: str) -> bool:
    try:
        return requests.get(base + path, timeout=2).status_code == 200
    except requests.RequestException:
        return False


def _first_model(url: str) -> str | None:
    try:
        return first_model_id(requests.get(url, timeout=5).json())
    except (requests.RequestException, ValueError):
        return None


def first_model_id(doc: object) -> str | None:
    """The first model id in an OpenAI-style model list ({"data": [{"id": ...}]}), or None."""
    try:
        data = doc.get("data") or []  # type: ignore[attr-defined]
        return str(data[0]["id"]) if data else None
    except (KeyError, TypeError, AttributeError):
        return None


def logs(container_id: str, tail: int = LOG_LINES) -> str:
    """The container's log (stdout and stderr, as it printed them), its last `tail` lines."""
    r = daemon.run_cli(["logs", "--tail", str(tail), container_id], stdout=subprocess.PIPE,
                       stderr=subprocess.STDOUT, text=True, errors="replace", timeout=120)
    return r.stdout


def wait_exit(container_id: str, poll_s: float = 1.0) -> int | None:
    """Block until the container stops (the user's Ctrl-C ends the wait first)."""
    while True:
        state = _state(container_id)
        if not still_up(state):
            return state[1] if state else None
        time.sleep(poll_s)


def still_up(state: tuple[str, int | None] | None) -> bool:
    """Whether `wait_exit` keeps waiting: the container runs or is restarting."""
    return state is not None and state[0] in ("running", "restarting")
