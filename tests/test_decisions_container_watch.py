"""A serving container's life as image/launch.py drives it, without an Engine: the docker
client's answers are scripted (its `run -d`, `inspect`, `logs`), the log it follows is a real
process printing a server's log, and the server's endpoints are a real HTTP server on this
machine. What is decided: the id `run -d` gave, what a refused start says and removes, when a
watch ends (ready, exited, timeout) and what it saw on the way (the phases, the served model,
the log's lines), and how long `wait_exit` waits.

tests/test_run.py runs the same path on a real Engine with a CPU image."""

from __future__ import annotations

import http.server
import json
import subprocess
import sys
import threading
from collections import deque

import pytest

from imgbuild.errors import EnvError
from imgbuild.image import launch as container

from .test_decisions_run import _launch

LOG = ["[2026-12-05 10:00:00] server_args=ServerArgs(model_path='k2.6')",
       "[2026-12-05 10:00:03] Loading safetensors checkpoint shards: 100%",
       "[2026-12-05 10:00:09] Capture cuda graph end. Time elapsed: 4.1 s",
       "[2026-12-05 10:00:10] The server is fired up and ready to roll!",
       "[2026-12-05 10:00:10] Loading again (a phase is reached once)"]


class Client:
    """The docker client seam (daemon.run_cli and cli_command): `inspect` answers the states
    given in turn (the last one for ever); `logs -f` is a real process printing `log`."""

    def __init__(self, monkeypatch, states: list[str], log: list[str] = LOG,
                 run: subprocess.CompletedProcess | None = None):
        self.states, self.log, self.run, self.calls = deque(states), log, run, []
        monkeypatch.setattr(container.daemon, "run_cli", self.run_cli)
        monkeypatch.setattr(container.daemon, "cli_command", self.cli_command)

    def run_cli(self, args: list[str], **kw) -> subprocess.CompletedProcess:
        self.calls.append((args, kw))
        if args[0] == "inspect":
            state = self.states.popleft() if len(self.states) > 1 else self.states[0]
            return subprocess.CompletedProcess(args, 1 if state == "gone" else 0,
                                               state + "\n", "")
        if args[0] == "logs":
            return subprocess.CompletedProcess(args, 0, "\n".join(self.log) + "\n", None)
        if args[0] == "run":
            return self.run
        return subprocess.CompletedProcess(args, 0, "", "")

    def cli_command(self, args: list[str]) -> list[str]:
        assert args[:2] == ["logs", "-f"]
        return [sys.executable, "-c", "import sys; sys.stdout.write(sys.argv[1])",
                "\n".join(self.log) + "\n"]


class Server:
    """A model server's two endpoints on 127.0.0.1: health and the model list."""

    def __init__(self, models: object = None, health: int = 200):
        body = json.dumps({"data": [{"id": "k2.6"}, {"id": "other"}]} if models is None
                          else models).encode()

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self):  # noqa: N802 (http.server's name)
                code = health if self.path == "/health" else 200
                self.send_response(code)
                self.end_headers()
                self.wfile.write(body if self.path == "/v1/models" else b"")

            def log_message(self, *a):
                pass

        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self.httpd.server_address[1]
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def close(self):
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture()
def server():
    s = Server()
    yield s
    s.close()


class Clock:
    def __init__(self, step: float = 1.0):
        self.now, self.step = 0.0, step

    def __call__(self) -> float:
        self.now += self.step
        return self.now


PHASES = (("load", "Loading"), ("graphs", "Capture cuda graph"), ("ready", "fired up"))


def test_a_server_whose_endpoints_answer_is_ready_serving_the_first_model(monkeypatch, server):
    Client(monkeypatch, ["running 0"])
    w = container.watch(_launch(host_port=server.port, phases=PHASES), "cid", timeout_s=60,
                        poll_s=0, clock=Clock())
    assert w.status == "ready" and w.served == "k2.6" and w.exit_code is None


def test_the_log_gives_each_phase_once_in_order_with_the_time_it_was_reached(monkeypatch):
    Client(monkeypatch, ["exited 1"])
    seen = []
    w = container.watch(_launch(host_port=1, phases=PHASES), "cid", timeout_s=60,
                        poll_s=0, clock=Clock(0.0), on_phase=lambda p, line: seen.append(
                            (p, line)))
    # stopped at the first poll: the log is still read to its end (what the doctor reads)
    assert w.status == "exited" and w.exit_code == 1
    assert list(w.lines) == LOG
    assert [p for p, _ in w.phases] == ["load", "graphs", "ready"] == [p for p, _ in seen]
    assert seen[0][1] == LOG[1]  # the line that reached it


def test_a_container_that_stopped_is_exited_even_while_its_port_answers(monkeypatch, server):
    Client(monkeypatch, ["exited 137"])
    w = container.watch(_launch(host_port=server.port, phases=PHASES), "cid", timeout_s=60,
                        poll_s=0, clock=Clock())
    assert (w.status, w.exit_code, w.served) == ("exited", 137, None)


def test_a_server_that_never_answers_times_out(monkeypatch):
    client = Client(monkeypatch, ["running 0"])
    w = container.watch(_launch(host_port=1, phases=PHASES), "cid", timeout_s=5, poll_s=0,
                        clock=Clock(1.0))
    assert w.status == "timeout" and w.seconds >= 5
    polls = [a for a, _ in client.calls if a[0] == "inspect"]
    assert polls[0] == ["inspect", "--format", "{{.State.Status}} {{.State.ExitCode}}", "cid"]
    assert len(polls) >= 2  # polled again until past the time, not given up at once


def test_a_server_that_answers_health_but_lists_no_model_is_ready_serving_none(monkeypatch):
    s = Server(models={"data": []})
    try:
        Client(monkeypatch, ["running 0"])
        w = container.watch(_launch(host_port=s.port, phases=PHASES), "cid", timeout_s=60,
                            poll_s=0, clock=Clock())
        assert w.status == "ready" and w.served is None
    finally:
        s.close()


def test_a_server_whose_health_fails_is_not_ready(monkeypatch):
    s = Server(health=503)
    try:
        Client(monkeypatch, ["running 0", "running 0", "exited 1"])
        w = container.watch(_launch(host_port=s.port, phases=PHASES), "cid", timeout_s=60,
                            poll_s=0, clock=Clock())
        assert w.status == "exited"
    finally:
        s.close()


# --- the start, the log, the wait -------------------------------------------------------------

def test_a_start_runs_the_dry_runs_line_detached_and_gives_the_id(monkeypatch):
    launch = _launch()
    client = Client(monkeypatch, ["running 0"], run=subprocess.CompletedProcess(
        [], 0, "Unable to find image locally\nabc123def\n", ""))
    assert container.start(launch) == "abc123def"
    [(args, kw)] = client.calls
    assert args == launch.docker_args(detach=True, rm=False)[1:]
    assert args[:2] == ["run", "-d"] and "--rm" not in args  # kept, to read its log
    assert kw["capture_output"] is True and kw["text"] is True and kw["timeout"] > 0


@pytest.mark.parametrize("said, removed", [
    ("docker: Error response from daemon: could not select device driver \"\" with "
     "capabilities: [[gpu]].", True),
    ('docker: Error response from daemon: Conflict. The container name "/imgbuild-k2.6" is '
     'already in use by container "abc".', False),
])
def test_a_refused_start_says_the_clients_words_and_removes_only_its_own(monkeypatch, said,
                                                                         removed):
    words = "\n".join(["Unable to find image locally", "pulling", said])
    client = Client(monkeypatch, ["running 0"],
                    run=subprocess.CompletedProcess([], 125, "", words + "\n"))
    with pytest.raises(EnvError) as e:
        container.start(_launch())
    assert e.value.message == "docker could not start imgbuild-k2.6"
    assert e.value.facts == ["Unable to find image locally", "pulling", said]
    assert e.value.hint == container._start_hint(said)
    removals = [(a, kw) for a, kw in client.calls if a[0] == "rm"]
    assert bool(removals) is removed
    if removed:
        [(args, kw)] = removals
        assert args == ["rm", "-f", "imgbuild-k2.6"] and kw["cleanup"] is True


def test_the_log_is_its_last_lines_stdout_and_stderr_together(monkeypatch):
    client = Client(monkeypatch, ["running 0"])
    assert container.logs("cid", tail=200) == "\n".join(LOG) + "\n"
    [(args, kw)] = client.calls
    assert args == ["logs", "--tail", "200", "cid"]
    assert kw["stdout"] == subprocess.PIPE and kw["stderr"] == subprocess.STDOUT


@pytest.mark.parametrize("states, code", [
    (["running 0", "restarting 1", "running 0", "exited 3"], 3),
    (["running 0", "gone"], None),
])
def test_wait_exit_waits_while_it_runs_and_gives_its_exit_code(monkeypatch, states, code):
    client = Client(monkeypatch, states)
    assert container.wait_exit("cid", poll_s=0) == code
    assert len(client.calls) == len(states)


def test_the_id_is_the_last_line_run_printed_and_a_removal_is_quiet(monkeypatch):
    client = Client(monkeypatch, ["running 0"], run=subprocess.CompletedProcess(
        [], 0, "Unable to find image locally\nlatest: Pulling from acme\nabc123def\n", ""))
    assert container.start(_launch()) == "abc123def"
    client.run = subprocess.CompletedProcess([], 125, "", "docker: Error: no runtime\n")
    with pytest.raises(EnvError):
        container.start(_launch())
    [(args, kw)] = [(a, kw) for a, kw in client.calls if a[0] == "rm"]
    assert kw["capture_output"] is True  # its words are not the user's to read here


BAD_UTF8 = ("import sys; sys.stdout.buffer.write(b'weights \\xff\\xfe loaded\\n'); "
            "sys.stdout.flush()")


def test_a_log_that_is_not_utf8_is_read_with_its_bad_bytes_replaced(monkeypatch):
    """The client runs for real here (a process printing bytes no UTF-8 decoder takes), with
    the arguments logs() gives it."""
    def run_cli(args, **kw):
        return subprocess.run([sys.executable, "-c", BAD_UTF8], **kw)
    monkeypatch.setattr(container.daemon, "run_cli", run_cli)
    assert container.logs("cid") == "weights \ufffd\ufffd loaded\n"


class StuckClock:
    """0 at the start, then 2.34 s for ever: what each phase and the end are stamped with."""

    def __init__(self):
        self.calls = 0

    def __call__(self) -> float:
        self.calls += 1
        return 0.0 if self.calls == 1 else 2.34


def test_phases_and_the_end_are_stamped_to_a_tenth_of_a_second(monkeypatch):
    Client(monkeypatch, ["exited 1"])
    w = container.watch(_launch(host_port=1, phases=PHASES), "cid", timeout_s=60,
                        poll_s=0, clock=StuckClock())
    assert w.phases == [("load", 2.3), ("graphs", 2.3), ("ready", 2.3)] and w.seconds == 2.3


def test_the_log_is_followed_from_a_thread_that_does_not_keep_imgbuild_alive(monkeypatch):
    Client(monkeypatch, ["exited 1"])
    daemons = []
    container.watch(_launch(host_port=1, phases=PHASES), "cid", timeout_s=60, poll_s=0,
                    clock=Clock(0.0),
                    on_phase=lambda p, line: daemons.append(threading.current_thread().daemon))
    assert daemons == [True, True, True]


def test_a_log_that_never_ends_delays_the_end_of_a_watch_only_so_long(monkeypatch):
    """`docker logs -f` of a stopped container ends by itself; one that hangs (a daemon gone
    away) is given 10 s for the log's last lines, then the watch ends without them."""
    client = Client(monkeypatch, ["exited 1"])
    monkeypatch.setattr(client, "cli_command", lambda args: [
        sys.executable, "-c", "import time; print('loading', flush=True); time.sleep(30)"])
    monkeypatch.setattr(container.daemon, "cli_command", client.cli_command)
    w = container.watch(_launch(host_port=1, phases=PHASES), "cid", timeout_s=60, poll_s=0,
                        clock=Clock(0.0))
    assert w.status == "exited"
    # ended while the log's reader still waits on the client
    assert any(t.name == "container-log" and t.is_alive() for t in threading.enumerate())


def test_a_watch_and_a_wait_poll_once_a_second_and_probes_are_short(monkeypatch, server):
    """Once a second: a server that is ready is seen within a second, and inspect is not run
    in a loop. A probe of a local server gives up in seconds (2 s for health, 5 s for the model
    list), so a hung endpoint does not stall the watch."""
    from types import SimpleNamespace

    import requests

    slept, asked = [], []
    monkeypatch.setattr(container, "time", SimpleNamespace(
        sleep=slept.append, monotonic=container.time.monotonic))
    real_get = requests.get
    monkeypatch.setattr(container.requests, "get", lambda url, timeout: (
        asked.append((url.rsplit("/", 1)[-1], timeout)) or real_get(url, timeout=timeout)))
    Client(monkeypatch, ["running 0", "exited 0"])
    assert container.wait_exit("cid") == 0 and slept == [1.0]
    slept.clear()
    Client(monkeypatch, ["running 0"])
    s = Server(health=503)
    try:
        w = container.watch(_launch(host_port=s.port, phases=PHASES), "cid", timeout_s=2,
                            clock=Clock(1.0))
    finally:
        s.close()
    assert w.status == "timeout" and set(slept) == {1.0}
    Client(monkeypatch, ["running 0"])
    asked.clear()
    w = container.watch(_launch(host_port=server.port, phases=PHASES), "cid", timeout_s=60,
                        poll_s=0, clock=Clock())
    assert w.status == "ready" and asked == [("health", 2), ("models", 2), ("models", 5)]


def test_a_timeout_reports_the_time_that_decided_it(monkeypatch):
    """Between the top of a poll and the reading that decides a timeout the endpoints are
    asked (and the log reader reads the clock too): the seconds reported are those of the
    deciding reading, never less than the timeout."""
    import threading

    main = threading.current_thread()
    readings = iter([0.0, 1.0, 10.0, 11.0])

    def clock() -> float:  # the poll's own readings; the log reader's are not counted
        return next(readings) if threading.current_thread() is main else 0.0

    Client(monkeypatch, ["running 0"], log=[])
    w = container.watch(_launch(host_port=1, phases=PHASES), "cid", timeout_s=5, poll_s=0,
                        clock=clock)
    assert (w.status, w.seconds) == ("timeout", 10.0)
