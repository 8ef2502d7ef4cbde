"""`imgbuild run` on a GPU host, from the probe to the container's removal, without an Engine.

What cannot run here is a GPU host's Engine serving a model. It sits behind the seam
pipeline/run.py already has: the container lifecycle of image/launch.py (port, name, start,
watch, wait, logs, remove), the image lookup and the NVIDIA toolkit answer. A scripted
`Engine` stands in for them, answering as a GPU host's does; the host is a recorded
nvidia-smi (tests/fixtures/nvidia-smi) and a failed server's log a recorded one
(tests/fixtures/logs). Everything else (the choice of target, the plan, the Launch, the host
checks, the doctor) is imgbuild's own code.

What each test pins is a decision of run(): which refusal comes before anything starts, which
image is used or pulled, which container is left or removed at each end, what the report says.
tests/test_run.py runs the same path against the real Engine with a CPU image.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace

import pytest

from imgbuild.errors import EnvError, InputError, JobFailed
from imgbuild.image import launch as container
from imgbuild.image import toolkit
from imgbuild.image.base import host_platform
from imgbuild.pipeline import run as run_mod

from .conftest import ROOT
from .progress_notes import Notes

LOGS = ROOT / "tests" / "fixtures" / "logs"


def _host(name: str):
    from imgbuild.payload import preflight as pf
    return pf.probe(runner=pf.recording_runner(ROOT / "tests" / "fixtures" / "nvidia-smi" / name))


@dataclass
class Engine:
    """The Engine's answers, scripted; `calls` is what run() asked, in order."""

    watch_status: str = "ready"
    watch_exit: int | None = None
    watch_log: str = ""
    wait_code: int | None = 0
    exit_log: str = ""
    port: str | None = None
    busy: tuple[str, ...] = ()
    held: container.Holder | None = None
    remove_said: str | None = None
    local_image: bool = True
    toolkit: toolkit.Toolkit = field(default_factory=lambda: toolkit.Toolkit(True, "runtime nvidia"))
    calls: list[tuple] = field(default_factory=list)
    started: object = None

    def container(self) -> SimpleNamespace:
        def watch(launch, cid, *, timeout_s, on_phase):
            assert launch == self.started  # the container started, by its id
            self.calls.append(("watch", cid, timeout_s))
            on_phase("load", "  Loading safetensors checkpoint shards  ")
            w = container.Watch(lines=deque(self.watch_log.splitlines(),
                                            maxlen=container.LOG_LINES),
                                phases=[("load", 1.0)], status=self.watch_status,
                                exit_code=self.watch_exit, seconds=2.5,
                                served="served-id" if self.watch_status == "ready" else None)
            return w

        def start(launch):
            self.calls.append(("start", launch.name))
            self.started = launch
            return "cid-1"

        return SimpleNamespace(
            port_taken=lambda port: self.calls.append(("port_taken", port)) or self.port,
            running_for=lambda label, value: self.calls.append(("running_for", label, value))
            or list(self.busy),
            holder=lambda name: self.calls.append(("holder", name)) or self.held,
            start=start, watch=watch,
            wait_exit=lambda cid: self.calls.append(("wait_exit", cid)) or self.wait_code,
            logs=lambda cid: self.calls.append(("logs", cid)) or self.exit_log,
            remove=lambda name: self.calls.append(("remove", name)) or self.remove_said)

    def asked(self, what: str) -> list[tuple]:
        return [c[1:] for c in self.calls if c[0] == what]

    def daemon(self) -> SimpleNamespace:
        return SimpleNamespace(
            client=lambda: "client", local_socket=lambda: "/run/docker.sock",
            local_image=lambda client, ref: self.calls.append(("local_image", client, ref))
            or ("sha256:" + "a" * 64 if self.local_image else None))




@pytest.fixture
def engine(monkeypatch) -> Engine:
    e = Engine()
    monkeypatch.setattr(run_mod, "container", e.container())
    monkeypatch.setattr(run_mod, "daemon", e.daemon())
    monkeypatch.setattr(toolkit, "engine_toolkit",
                        lambda client, *, local: e.calls.append(("toolkit", client, local))
                        or e.toolkit)
    host = _host("rtx-pro-6000-8x-ok")  # read before probe is replaced by its answer
    monkeypatch.setattr(run_mod.host_checks, "probe", lambda **kw: host)
    monkeypatch.setattr(run_mod, "pull_target", lambda ws, target, **kw: e.calls.append(
        ("pull", target, kw["registry_name"], kw["model"], kw["platform"])))
    return e


def _run(ws, engine, subject="k2.6", **kw):
    notes = Notes()
    ready = []
    r = run_mod.run(ws, subject, progress=notes, on_ready=ready.append,
                    model_cache=Path("/models"), **kw)
    return r, notes, ready, [c[0] for c in engine.calls]


# -- it served ---------------------------------------------------------------------------------

def test_a_server_that_serves_and_is_stopped_is_removed(ws, engine):
    r, notes, ready, calls = _run(ws, engine)
    assert calls == ["port_taken", "running_for", "holder", "toolkit", "local_image", "start",
                     "watch", "wait_exit", "remove"]
    assert engine.calls[1] == ("running_for", run_mod.RUN_LABEL, "k2.6")
    assert engine.calls[2] == ("holder", r.launch.name)
    assert engine.calls[3] == ("toolkit", "client", True)
    assert engine.asked("local_image") == [("client", r.launch.image)]  # by content tag
    assert engine.asked("wait_exit") == [("cid-1",)]
    assert engine.asked("remove") == [(r.launch.name,)]
    assert engine.calls[6] == ("watch", "cid-1", 1800)
    assert (r.target, r.model, r.status, r.container_exit) == ("sglang-blackwell", "k2.6",
                                                               "stopped", 0)
    assert (r.image_action, r.phases, r.seconds, r.kept) == ("local", (("load", 1.0),), 2.5,
                                                             False)
    assert r.preflight is not None and r.fit is not None and r.fit.chosen.name == r.target
    assert r.preflight_where.startswith("preflight: ran on this host")
    # What was started is what the report names: the entrypoint's preflight off, labelled.
    assert engine.started == r.launch and r.launch.container_env["IMGBUILD_PREFLIGHT"] == "0"
    assert dict(r.launch.labels)[run_mod.RUN_LABEL] == "k2.6"
    # Ready was said once, while it served, and kept only if asked.
    assert [x.status for x in ready] == ["ready"] and ready[0].served == "served-id"
    assert not ready[0].kept
    said = notes.text()
    assert "chosen: sglang-blackwell" in said and "NVIDIA Container Toolkit: runtime nvidia" in said
    assert "load: Loading safetensors checkpoint shards" in said
    assert "starting: docker run -d" in said and r.launch.name in said


def test_detached_it_is_left_serving_and_the_run_ends_ready(ws, engine):
    r, _notes, ready, calls = _run(ws, engine, detach=True)
    assert calls[-1] == "watch" and "remove" not in calls and "wait_exit" not in calls
    assert r.status == "ready" and r.kept and r.served == "served-id" and ready == [r]


def test_kept_it_is_left_after_it_stops(ws, engine):
    r, *_rest, calls = _run(ws, engine, keep=True)
    assert r.status == "stopped" and r.kept and "remove" not in calls


def test_a_server_that_served_then_died_is_diagnosed_from_its_log(ws, engine):
    log = (LOGS / "nccl-shm.log").read_text()
    engine.wait_code, engine.exit_log = 137, log + "\n" + "\n".join(f"l{i}" for i in range(50))
    r, *_rest, calls = _run(ws, engine)
    assert calls[-3:] == ["wait_exit", "logs", "remove"]
    assert engine.asked("logs") == [("cid-1",)]
    assert (r.status, r.container_exit, r.kept) == ("exited", 137, False)
    assert [d.id for d in r.diagnoses] == ["nccl-system-error"]
    assert r.log_tail == tuple(f"l{i}" for i in range(10, 50))  # the last 40 lines
    engine.calls.clear()
    r, *_rest, calls = _run(ws, engine, keep=True)
    assert r.status == "exited" and r.kept and "remove" not in calls


# -- it never served ---------------------------------------------------------------------------

@pytest.mark.parametrize(("status", "code"), [("exited", 1), ("timeout", None)])
def test_a_server_that_never_served_is_diagnosed_and_removed_unless_kept(ws, engine, status,
                                                                          code):
    engine.watch_status, engine.watch_exit = status, code
    engine.watch_log = "".join(f"boot {i}\n" for i in range(60)) + (
        LOGS / "port-in-use.log").read_text()
    r, _notes, ready, calls = _run(ws, engine)
    assert (r.status, r.container_exit, r.kept, ready) == (status, code, False, [])
    assert calls[-2:] == ["watch", "remove"] and r.exit_code != 0
    assert [d.id for d in r.diagnoses] == ["port-in-use"]
    assert len(r.log_tail) == 40 and r.log_tail == tuple(engine.watch_log.splitlines()[-40:])
    engine.calls.clear()
    r, *_rest, calls = _run(ws, engine, keep=True)
    assert r.kept and "remove" not in calls
    engine.calls.clear()
    r, *_rest, calls = _run(ws, engine, detach=True)  # --detach keeps only a serving one
    assert not r.kept and calls[-1] == "remove"


def test_a_container_the_daemon_would_not_remove_is_said_with_the_way_out(ws, engine):
    engine.remove_said = "Cannot connect to the Docker daemon"
    r, notes, *_rest = _run(ws, engine)
    assert ("warn", f"container {r.launch.name} was not removed (Cannot connect to the Docker "
            f"daemon): it may still run and hold its GPU and port; `docker rm -f "
            f"{r.launch.name}` once the daemon answers") in notes.notes


# -- refused before anything starts ------------------------------------------------------------

def test_a_port_in_use_is_refused_before_anything_starts(ws, engine):
    engine.port = "port 30000 is in use on this host (Address already in use)"
    with pytest.raises(InputError) as e:
        _run(ws, engine)
    assert e.value.message == f"cannot start sglang-blackwell: {engine.port}"
    assert e.value.facts == ["imgbuild-k2.6 would publish 30000"]
    assert engine.calls == [("port_taken", 30000)]  # asked first, nothing else
    assert e.value.hint == "pass --port with a free one, or stop what listens there"


def test_a_model_already_served_here_is_refused(ws, engine):
    engine.busy = ("imgbuild-old",)
    with pytest.raises(InputError) as e:
        _run(ws, engine)
    assert e.value.message == "k2.6 is already served here by imgbuild-old"
    assert e.value.hint == "use it, or stop it first: `docker rm -f imgbuild-old`"
    assert "start" not in [c[0] for c in engine.calls]


def test_a_name_another_container_holds_is_refused_and_left_alone(ws, engine):
    engine.held = container.Holder("x", "exited", 1, {})
    with pytest.raises(InputError, match="a container imgbuild did not start"):
        _run(ws, engine)
    assert not {"start", "remove"} & {c[0] for c in engine.calls}


def test_an_engine_without_the_nvidia_toolkit_is_refused_and_an_unsure_one_warned(ws, engine):
    engine.toolkit = toolkit.Toolkit(False, "no nvidia runtime")
    with pytest.raises(EnvError):
        _run(ws, engine)
    assert "start" not in [c[0] for c in engine.calls]
    engine.toolkit = toolkit.Toolkit(None, "a remote Engine")
    _r, notes, *_rest = _run(ws, engine)
    assert ("warn", "NVIDIA Container Toolkit: not confirmed (a remote Engine)") in notes.notes


def test_without_preflight_nothing_about_the_host_or_toolkit_is_asked(ws, engine):
    r, notes, _ready, calls = _run(ws, engine, subject="sglang-blackwell", model="k2.6",
                                   preflight=False)
    assert "toolkit" not in calls and r.preflight is None and r.fit is None
    assert r.preflight_where == ("preflight: skipped on this host and in the container "
                                 "(--no-preflight)")
    assert r.preflight_where in notes.text()


# -- which image -------------------------------------------------------------------------------

def test_no_local_image_and_no_registry_says_how_to_build_or_pull(ws, engine):
    engine.local_image = False
    with pytest.raises(JobFailed) as e:
        _run(ws, engine)
    assert e.value.message == "no image for sglang-blackwell on this host"
    assert e.value.facts[0].startswith("content tag sglang-blackwell-")
    assert e.value.hint == ("build it (`imgbuild sglang-blackwell --model k2.6`), or pull it: "
                            "`imgbuild run k2.6 --registry REGISTRY/REPO`")
    with pytest.raises(JobFailed) as e:
        _run(ws, engine, subject="sglang-blackwell", model="k2.6")
    assert e.value.hint.endswith("`imgbuild run sglang-blackwell --model k2.6 --registry "
                                 "REGISTRY/REPO`")


def test_no_local_image_with_a_registry_is_pulled_first(ws, engine):
    engine.local_image = False
    r, *_rest, calls = _run(ws, engine, registry_name="127.0.0.1:5000/imgbuild")
    assert calls.index("pull") < calls.index("start") and r.image_action == "pulled"
    pull = next(c for c in engine.calls if c[0] == "pull")
    assert pull == ("pull", "sglang-blackwell", "127.0.0.1:5000/imgbuild", "k2.6", "linux/amd64")
    assert r.launch.image.startswith("127.0.0.1:5000/imgbuild:sglang-blackwell-")


# -- nothing starts: a dry run, emitted files ----------------------------------------------------

def test_a_dry_run_of_a_target_reads_nothing_of_the_host(ws, engine, monkeypatch):
    monkeypatch.setattr(run_mod.host_checks, "probe", lambda **kw: pytest.fail("probed"))
    r, notes, ready, calls = _run(ws, engine, subject="sglang-blackwell", model="k2.6",
                                  dry_run=True, env=(("A", "1"),))
    assert (r.status, r.target, r.model, r.fit, calls, ready) == (
        "dry-run", "sglang-blackwell", "k2.6", None, [], [])
    assert r.launch.container_env["A"] == "1" and r.exit_code == 0


def test_a_dry_run_of_a_model_says_which_targets_fit_and_why(ws, engine):
    r, notes, _ready, calls = _run(ws, engine, dry_run=True)
    assert r.status == "dry-run" and r.target == "sglang-blackwell" and calls == []
    said = notes.said
    assert said[0].startswith("chosen: sglang-blackwell (linux/amd64): ")
    assert any(m.startswith("no: ") for m in said)  # and why the others do not fit
    assert len(said) == len(r.fit.rows)


def test_a_read_only_root_is_applied_and_checked_before_anything_starts(ws, engine):
    r, *_rest = _run(ws, engine, subject="sglang-blackwell", model="k2.6", dry_run=True,
                     read_only_root=True)
    assert "--read-only" in r.launch.dry_run_line()


def test_emitted_files_are_listed_and_a_multi_platform_target_names_its_index(ws, engine,
                                                                             tmp_path):
    r, *_rest, calls = _run(ws, engine, subject="tiny-cpu-multi", emit=("k8s", tmp_path / "k"))
    assert r.status == "emitted" and calls == [] and r.files
    assert all(Path(f).parent == tmp_path / "k" and Path(f).is_file() for f in r.files)
    assert r.launch.platforms == ("linux/amd64", "linux/arm64")
    assert r.launch.image_digest is None and r.launch.image.startswith("imgbuild:tiny-cpu-multi-")
    assert [Path(f).name for f in r.files] == ["imgbuild-tiny-nvfp4-deployment.yaml",
                                               "imgbuild-tiny-nvfp4-service.yaml"]
    r2, *_rest = _run(ws, engine, subject="tiny-cpu-multi", emit=("compose", tmp_path / "c"))
    assert r2.launch.platforms == (host_platform(),)  # compose runs this host's image
    assert r2.files == (str(tmp_path / "c" / "compose.yaml"),)


@pytest.mark.parametrize(("registry", "facts", "hint"), [
    (None, ["no rule of images/registries.yaml with a signed-by matches imgbuild",
            "no --registry: the manifests name the local image"],
     "pass --registry with the repository the image is pulled from, or add a `signed-by` (a "
     "key, or a keyless identity) to a rule that matches it in your project's "
     "images/registries.yaml, or drop --admission"),
    ("127.0.0.1:5000/x", ["no rule of images/registries.yaml with a signed-by matches "
                          "127.0.0.1:5000/x"],
     "add a `signed-by` (a key, or a keyless identity) to a rule that matches it in your "
     "project's images/registries.yaml, or drop --admission"),
])
def test_an_admission_policy_asked_for_without_a_signing_policy_is_refused_writing_nothing(
        ws, engine, tmp_path, registry, facts, hint):
    with pytest.raises(InputError) as e:
        _run(ws, engine, subject="tiny-cpu", emit=("k8s", tmp_path / "k"), admission="kyverno",
             registry_name=registry)
    repo = registry or "imgbuild"
    assert e.value.message == (f"--admission kyverno: {repo} has no signed-by policy, so "
                               "there is no admission policy to write")
    assert (e.value.facts, e.value.hint) == (facts, hint)
    assert not (tmp_path / "k").exists()
