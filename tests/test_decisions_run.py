"""Decisions of `imgbuild run` and the container's life (pipeline/run.py, image/launch.py)
that need no Engine: which container is left or removed, which name conflict is whose, how a
watch poll ends, what the Engine's words mean. Plain data in, plain data out."""

from __future__ import annotations

import json
import re
import subprocess

import pytest

from imgbuild.errors import EXIT_FAILED, EXIT_OK
from imgbuild.image import launch as container
from imgbuild.pipeline import run as run_mod
from imgbuild.plan.launch import Launch


def _launch(**kw) -> Launch:
    base = dict(image="imgbuild:abc", engine="sglang", name="imgbuild-k2.6", command=("serve",),
                port=30000, host_port=30001, health_path="/health", models_path="/v1/models",
                ready_paths=("/health",), env=(("A", "1"), ("IMGBUILD_PREFLIGHT", "1")),
                gpus="all", ipc_host=True, shm_size=None,
                ulimits=(("memlock", -1, -1), ("stack", 67108864, 67108864)),
                volumes=(), phases=(("load", "Loading"), ("ready", "ready")))
    base.update(kw)
    return Launch(**base)


# -- which container is left when the run ends ----------------------------------------------

@pytest.mark.parametrize("stage, keep, detach, left", [
    ("failed", False, False, False),   # never served: removed
    ("failed", True, False, True),     # --keep: the user wants its log
    ("failed", False, True, False),    # --detach alone does not keep a failed one
    ("serving", False, True, True),    # detached: it serves on after the run ends
    ("serving", False, False, False),  # waiting: a Ctrl-C removes it
    ("serving", True, False, False),   # even with --keep, while still waiting
    ("ended", False, False, False),
    ("ended", True, False, True),
    ("ended", False, True, False),
])
def test_which_container_the_run_leaves(stage, keep, detach, left):
    assert run_mod.leaves_container(stage, keep=keep, detach=detach) is left


@pytest.mark.parametrize("code, status", [(0, "stopped"), (None, "stopped"), (1, "exited"),
                                          (137, "exited"), (-1, "exited")])
def test_a_server_that_served_and_stopped_ends_by_its_exit_code(code, status):
    assert run_mod.ended_status(code) == status


@pytest.mark.parametrize("status, code", [
    ("dry-run", EXIT_OK), ("emitted", EXIT_OK), ("ready", EXIT_OK), ("stopped", EXIT_OK),
    ("exited", EXIT_FAILED), ("timeout", EXIT_FAILED)])
def test_run_report_exit_code_and_doctor_only_on_failure(status, code):
    r = run_mod.RunReport("t", "m", _launch(), status)
    assert r.exit_code == code
    d = r.to_dict()
    assert d["exit_code"] == code
    assert (d["doctor"] is not None) == (status in ("exited", "timeout"))
    assert d["container"] == "imgbuild-k2.6" and d["endpoint"] == "http://127.0.0.1:30001"


# -- the Launch the run starts on this host --------------------------------------------------

def test_the_run_turns_the_entrypoint_preflight_off_and_labels_what_it_serves():
    got, notes = run_mod.launch_on_host(_launch(labels=(("x", "y"),)), host_has_gpus=True,
                                      serving="k2.6")
    assert notes == ()
    assert dict(got.env) == {"A": "1", "IMGBUILD_PREFLIGHT": "0"}
    assert list(got.env) == sorted(got.env)
    assert dict(got.labels) == {"x": "y", run_mod.RUN_LABEL: "k2.6"}
    assert got.gpus == "all" and got.ulimits == _launch().ulimits  # a GPU host keeps both
    args = got.docker_args(detach=True, rm=False)
    assert "--gpus" in args and f"{run_mod.RUN_LABEL}=k2.6" in args


def test_without_a_visible_gpu_the_run_drops_gpus_and_gpu_ulimits_and_says_so():
    got, notes = run_mod.launch_on_host(_launch(), host_has_gpus=False, serving="t")
    assert got.gpus is None and got.ulimits == ()
    assert len(notes) == 1 and "no NVIDIA GPU" in notes[0]
    assert "--gpus" not in got.docker_args()


def test_a_cpu_image_on_a_host_without_gpus_starts_as_it_is():
    got, notes = run_mod.launch_on_host(_launch(gpus=None), host_has_gpus=False, serving="t")
    assert notes == () and got.ulimits == _launch().ulimits


# -- whose container holds the name ---------------------------------------------------------

def test_a_name_held_by_an_earlier_run_is_named_as_such_and_left_alone():
    held = container.Holder("imgbuild-k2.6", "exited", 3, {run_mod.RUN_LABEL: "k2.6"})
    err = run_mod._name_taken(held)
    text = str(err) + " ".join(err.facts) + (err.hint or "")
    assert "earlier `imgbuild run`" in str(err)
    assert "exited, exit code 3, serving k2.6" in " ".join(err.facts)
    assert "docker logs imgbuild-k2.6" in err.hint and "docker rm imgbuild-k2.6" in err.hint
    assert "did not start" not in text


def test_a_name_held_by_a_foreign_container_is_not_imgbuilds_to_remove():
    held = container.Holder("imgbuild-k2.6", "running", 0, {"other": "x"})
    err = run_mod._name_taken(held)
    assert "imgbuild did not start" in str(err)
    assert "docker rename imgbuild-k2.6 imgbuild-k2.6-old" in err.hint
    assert "earlier" not in str(err)


def test_holder_reads_the_inspect_document():
    doc = {"State": {"Status": "exited", "ExitCode": 137},
           "Config": {"Labels": {run_mod.RUN_LABEL: "m"}}}
    h = container.holder_from("n", 0, json.dumps(doc))
    assert h == container.Holder("n", "exited", 137, {run_mod.RUN_LABEL: "m"})
    assert container.holder_from("n", 1, "Error: No such container: n") is None
    h = container.holder_from("n", 0, json.dumps({"State": {}, "Config": {"Labels": None}}))
    assert h == container.Holder("n", "unknown", 0, {})


class _Client:
    """The docker client seam (daemon.run_cli): records each call, answers as told."""

    def __init__(self, *answers: subprocess.CompletedProcess | Exception):
        self.answers, self.calls = list(answers), []

    def __call__(self, args: list[str], **kw) -> subprocess.CompletedProcess:
        self.calls.append((args, kw))
        answer = self.answers.pop(0)
        if isinstance(answer, Exception):
            raise answer
        return answer


def _done(rc: int, out: str, err: str = "") -> subprocess.CompletedProcess:
    return subprocess.CompletedProcess([], rc, out, err)


# What each question to the docker client needs: its output as text (what the parsers read),
# and a bound on the wait, so that a hung daemon ends the run with a message.
TEXT = {"capture_output": True, "text": True}


def test_who_holds_a_name_is_asked_of_that_container_by_exact_name(monkeypatch):
    doc = {"State": {"Status": "running", "ExitCode": 0},
           "Config": {"Labels": {run_mod.RUN_LABEL: "m"}}}
    client = _Client(_done(0, json.dumps(doc)), _done(1, "", "Error: No such container: y"))
    monkeypatch.setattr(container.daemon, "run_cli", client)
    assert container.holder("x") == container.Holder("x", "running", 0, {run_mod.RUN_LABEL: "m"})
    assert container.holder("y") is None
    [(args, kw), (args2, _)] = client.calls
    # --type container: an image or a volume of the same name is not the holder
    assert args == ["inspect", "--type", "container", "--format", "{{json .}}", "x"]
    assert args2[-1] == "y"
    assert kw.items() >= TEXT.items() and 0 < kw["timeout"] <= 120


def test_what_runs_for_a_label_is_asked_of_running_containers_by_that_label(monkeypatch):
    client = _Client(_done(0, "imgbuild-a\nimgbuild-b\n"), _done(0, ""))
    monkeypatch.setattr(container.daemon, "run_cli", client)
    assert container.running_for(run_mod.RUN_LABEL, "k2.6") == ["imgbuild-a", "imgbuild-b"]
    assert container.running_for(run_mod.RUN_LABEL, "k2.6") == []
    args, kw = client.calls[0]
    assert args == ["ps", "--filter", f"label={run_mod.RUN_LABEL}=k2.6", "--format",
                    "{{.Names}}"]
    assert kw.items() >= TEXT.items() and 0 < kw["timeout"] <= 120


def test_a_removal_is_forced_survives_a_stop_and_is_bounded(monkeypatch):
    client = _Client(_done(0, "x\n"), _done(1, "", "Cannot connect to the Docker daemon"),
                     _done(1, "said on stdout\n", ""), subprocess.TimeoutExpired(["docker"], 120))
    monkeypatch.setattr(container.daemon, "run_cli", client)
    assert container.remove("x") is None
    assert container.remove("x") == "Cannot connect to the Docker daemon"
    assert container.remove("x") == "said on stdout"
    assert container.remove("x") == "`docker rm -f` did not finish in 120 s"
    args, kw = client.calls[0]
    # -f: a running container too; cleanup: it finishes even while imgbuild is being stopped
    assert args == ["rm", "-f", "x"] and kw["cleanup"] is True
    assert kw.items() >= TEXT.items() and kw["timeout"] == 120


# -- what happens when a start fails, and removal -------------------------------------------

@pytest.mark.parametrize("said, removes", [
    ('docker: Error response from daemon: Conflict. The container name "/x" is already in use '
     'by container "abc".', False),
    ("docker: Error response from daemon: could not select device driver \"\" with "
     "capabilities: [[gpu]].", True),
    ("port is already allocated", True),
])
def test_a_failed_start_removes_what_it_made_unless_the_name_was_someone_elses(said, removes):
    assert container.removes_after_failed_start(said) is removes


@pytest.mark.parametrize("said, words", [
    ("could not select device driver", "NVIDIA Container Toolkit"),
    ("nvidia-container-cli: initialization error", "NVIDIA Container Toolkit"),
    ("Bind for 0.0.0.0:30000 failed: port is already allocated", "--port"),
    ("listen tcp: address already in use", "--port"),
    ("something else", "docker client's message"),
])
def test_the_start_hint_follows_the_engines_words(said, words):
    assert words in container._start_hint(said)


@pytest.mark.parametrize("rc, out, err, said", [
    (0, "", "", None),
    (0, "", "Error: No such container: x", None),  # gone already: no failure
    (1, "", "line one\nCannot connect to the Docker daemon", "Cannot connect to the Docker daemon"),
    (1, "from stdout\n", "", "from stdout"),
    (125, "", "", "`docker rm -f` exited 125"),
])
def test_what_a_removal_tells_the_user(rc, out, err, said):
    assert container.removal_said(rc, out, err) == said


# -- the state and the watch ----------------------------------------------------------------

@pytest.mark.parametrize("rc, out, state", [
    (0, "running 0\n", ("running", 0)),
    (0, "exited 137", ("exited", 137)),
    (0, "exited -1", ("exited", -1)),
    (0, "created", ("created", None)),
    (1, "", ("gone", None)),
])
def test_parse_state(rc, out, state):
    assert container.parse_state(rc, out) == state


@pytest.mark.parametrize("state, up", [
    (("running", 0), True), (("restarting", 1), True), (("exited", 0), False),
    (("gone", None), False), (("paused", 0), False), (None, False)])
def test_wait_exit_waits_only_while_the_container_runs(state, up):
    assert container.still_up(state) is up


def _never():
    raise AssertionError("asked when it need not be")


@pytest.mark.parametrize("state, answers, elapsed, verdict", [
    (("exited", 1), _never, _never, "exited"),
    (("gone", None), _never, _never, "exited"),
    (("running", 0), lambda: True, _never, "ready"),
    (None, lambda: True, _never, "ready"),
    (("running", 0), lambda: False, lambda: 10.0, None),
    (("running", 0), lambda: False, lambda: 10.0001, "timeout"),
    (("running", 0), lambda: False, lambda: 9.0, None),
])
def test_one_watch_poll(state, answers, elapsed, verdict):
    assert container.watch_verdict(state, answers, elapsed, 10.0) == verdict


def test_phases_are_reached_once_each_in_table_order():
    phases = [("load", re.compile("Loading")), ("ready", re.compile(r"ready|Loading done"))]
    seen: set[str] = set()
    assert container.phases_reached("Loading done", phases, seen) == ["load", "ready"]
    seen |= {"load"}
    assert container.phases_reached("Loading weights", phases, seen) == []
    assert container.phases_reached("server ready", phases, seen) == ["ready"]
    assert container.phases_reached("nothing", phases, set()) == []


@pytest.mark.parametrize("doc, served", [
    ({"data": [{"id": "a"}, {"id": "b"}]}, "a"), ({"data": []}, None), ({}, None),
    ({"data": None}, None), ([], None), ({"data": [{"name": "a"}]}, None), ({"data": [{"id": 7}]}, "7")])
def test_the_served_model_is_the_first_in_the_list(doc, served):
    assert container.first_model_id(doc) == served


# --- which target `imgbuild run SUBJECT` serves (on recorded hosts) ------------------------

def _host(name: str):
    from pathlib import Path

    from imgbuild.payload import preflight as pf
    return pf.probe(runner=pf.recording_runner(Path(__file__).parent / "fixtures" / "nvidia-smi"
                                               / name))


def test_a_target_is_served_as_given_without_reading_the_host(ws):
    assert run_mod.choose(ws, "tiny-cpu", "k2.6", None) == ("tiny-cpu", "k2.6", None)


def test_a_model_is_served_by_the_best_fitting_target(ws):
    from imgbuild.errors import InputError
    target, model, fit = run_mod.choose(ws, "k2.6", None, _host("rtx-pro-6000-8x-ok"))
    assert (target, model) == ("sglang-blackwell", "k2.6") and fit.chosen.name == target
    assert run_mod.choose(ws, "k2.6", "k2.6", _host("rtx-pro-6000-8x-ok"))[0] == target
    with pytest.raises(InputError, match="names a model, and --model tiny-nvfp4 another"):
        run_mod.choose(ws, "k2.6", "tiny-nvfp4", _host("rtx-pro-6000-8x-ok"))
    with pytest.raises(InputError, match="neither a target nor a model profile") as e:
        run_mod.choose(ws, "k2.7", None, _host("rtx-pro-6000-8x-ok"))
    assert any(f.startswith("targets: ") for f in e.value.facts)


def test_a_busy_host_refuses_a_start_but_not_a_dry_run(ws):
    from imgbuild.errors import EnvError
    busy = _host("rtx-pro-6000-8x-stale-gpu0")
    with pytest.raises(EnvError, match="the host is busy"):
        run_mod.choose(ws, "k2.6", None, busy)
    target, _m, fit = run_mod.choose(ws, "k2.6", None, busy, starting=False)
    assert target == "sglang-blackwell" and fit.chosen.blocked
    # Nothing fits the hardware: refused even for a dry run.
    with pytest.raises(EnvError):
        run_mod.choose(ws, "k2.6", None, _host("b200-8x-driver-570"), starting=False)


# -- what the report says ---------------------------------------------------------------------

def test_the_report_says_every_field_and_the_doctor_only_for_a_failed_start():
    from imgbuild.checks import doctor

    d = doctor.Diagnosis("port-in-use", "t", "error", "c", "f", (doctor.Evidence(3, "x"),))
    launch = _launch()
    r = run_mod.RunReport("t", "k2.6", launch, "exited", preflight_where="here",
                          image_action="pulled", phases=(("load", 1.5), ("ready", 9.0)),
                          seconds=12.5, container_exit=3, diagnoses=(d,), log_tail=("a", "b"),
                          files=("f.yaml",), kept=True, served="m", notes=("n",))
    assert r.to_dict() == {
        "target": "t", "model": "k2.6", "status": "exited", "image": "imgbuild:abc",
        "container": "imgbuild-k2.6", "docker_run": launch.dry_run_line(),
        "endpoint": "http://127.0.0.1:30001", "fit": None, "preflight": None,
        "preflight_where": "here", "image_action": "pulled",
        "phases": [{"phase": "load", "at_s": 1.5}, {"phase": "ready", "at_s": 9.0}],
        "seconds": 12.5, "container_exit": 3, "served_model": "m",
        "doctor": doctor.to_dict((d,)), "log_tail": ["a", "b"], "files": ["f.yaml"],
        "kept": True, "notes": ["n"], "exit_code": EXIT_FAILED}
    assert run_mod.RunReport("t", None, launch, "timeout", diagnoses=(d,)).to_dict()[
        "doctor"] == doctor.to_dict((d,))
    ready = run_mod.RunReport("t", None, launch, "ready", diagnoses=(d,)).to_dict()
    assert ready["doctor"] is None and ready["exit_code"] == EXIT_OK


def test_the_name_conflict_says_whose_container_it_is_word_for_word():
    held = container.Holder("imgbuild-k2.6", "exited", 3, {run_mod.RUN_LABEL: "k2.6"})
    err = run_mod._name_taken(held)
    assert (err.message, err.facts, err.hint) == (
        "cannot start imgbuild-k2.6: a container of an earlier `imgbuild run` holds the name",
        ["imgbuild-k2.6: exited, exit code 3, serving k2.6"],
        "read it with `docker logs imgbuild-k2.6` if it matters, then `docker rm imgbuild-k2.6` "
        "and run again")
    err = run_mod._name_taken(container.Holder("x", "running", 0, {}))
    assert (err.message, err.facts, err.hint) == (
        "cannot start x: a container imgbuild did not start has that name",
        ["x: running, no imgbuild.run label; imgbuild leaves it alone"],
        "rename it (`docker rename x x-old`) or remove it if it is yours to remove, then run "
        "again")


def test_the_model_cache_is_hf_home_else_the_users_cache(monkeypatch, tmp_path):
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    assert run_mod.default_model_cache() == tmp_path / "hf"
    monkeypatch.delenv("HF_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert run_mod.default_model_cache() == tmp_path / "home" / ".cache" / "huggingface"
    monkeypatch.setenv("HF_HOME", "")  # set but empty: not a directory
    assert run_mod.default_model_cache() == tmp_path / "home" / ".cache" / "huggingface"


@pytest.mark.parametrize("said, hint", [
    ("could not select device driver", "the Engine has no NVIDIA runtime: install the NVIDIA "
     "Container Toolkit and run `nvidia-ctk runtime configure --runtime=docker`, then restart "
     "dockerd"),
    ("port is already allocated", "pick another port with --port, or stop what holds it"),
    ("x", "see the docker client's message above"),
])
def test_the_start_hint_word_for_word(said, hint):
    assert container._start_hint(said) == hint


def test_a_port_a_listener_holds_is_taken_and_a_free_one_is_not():
    """A real socket on this host: what `run` asks before it starts anything."""
    import socket

    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        said = container.port_taken(port)
        assert said is not None and said.startswith(f"port {port} is in use on this host (")
    assert container.port_taken(port) is None  # closed: free again


# -- the trust root an admission policy carries -------------------------------------------------

def test_a_trust_root_becomes_the_plain_text_of_its_file_in_its_order():
    """Sigstore's recorded public-good trust root (tests/data/sigstore): every CA with its
    subject (from its root certificate where the file names none), each log with its key,
    hash and the end of its window."""
    from dataclasses import replace
    from pathlib import Path

    from cryptography import x509
    from cryptography.hazmat.primitives import serialization

    from imgbuild.image import keyless

    pgi = Path(__file__).parent / "data" / "sigstore" / "trusted_root_pgi.json"
    root = keyless.load_trust_root(pgi.read_bytes(), str(pgi))
    t = run_mod.trust_data(root)
    assert t.source == str(pgi)
    assert len(t.cas) == len(root.cas) and len(t.tlogs) == len(root.tlogs)
    assert len(t.ctlogs) == len(root.ctlogs)
    for got, ca in zip(t.cas, root.cas):
        assert got.chain == tuple(c.public_bytes(serialization.Encoding.PEM).decode()
                                  for c in ca.chain)
        assert (got.organization, got.common_name, got.uri) == (
            ca.organization, ca.common_name, ca.uri)
    for got, k in zip(t.tlogs + t.ctlogs, root.tlogs + root.ctlogs):
        assert (got.base_url, got.hash_algorithm) == (k.name, k.hash_algorithm)
        assert got.end == (k.valid.end.isoformat(timespec="seconds") if k.valid.end else None)
    assert any(x.end is None for x in t.tlogs) and any(x.end for x in t.tlogs + t.ctlogs)
    # A CA the file names no subject for: its root certificate's.
    bare = replace(root, cas=tuple(replace(c, organization="", common_name="")
                                   for c in root.cas))
    for got, ca in zip(run_mod.trust_data(bare).cas, root.cas):
        last = ca.chain[-1].subject
        assert got.organization == ", ".join(
            str(a.value) for a in last.get_attributes_for_oid(x509.NameOID.ORGANIZATION_NAME))
        assert got.common_name == ", ".join(
            str(a.value) for a in last.get_attributes_for_oid(x509.NameOID.COMMON_NAME))
        assert got.organization and got.common_name


def test_a_comment_is_wrapped_at_90_and_never_inside_a_hyphenated_name():
    name = "imgbuild-" + "-".join(["part"] * 7)  # 43 characters, across the 90th column
    text = run_mod._comment("x " * 35 + name + " and more words" * 8)
    lines = text.splitlines()
    assert all(ln.startswith("# ") for ln in lines)
    assert lines[0] == "# " + ("x " * 35).strip()  # the name is not cut to fill this line
    assert lines[1].startswith("# " + name + " ")
    assert max(len(ln) for ln in lines) <= 92 and len(lines[1]) > 85  # filled up to 90


def test_choose_refuses_word_for_word(ws):
    from imgbuild.errors import InputError
    with pytest.raises(InputError) as e:
        run_mod.choose(ws, "k2.6", "tiny-nvfp4", _host("rtx-pro-6000-8x-ok"))
    assert (e.value.message, e.value.hint) == (
        "run k2.6 names a model, and --model tiny-nvfp4 another",
        "`imgbuild run k2.6`, or `imgbuild run TARGET --model tiny-nvfp4`")
    with pytest.raises(InputError) as e:
        run_mod.choose(ws, "k2.7", None, None)
    cat = ws.catalog
    assert (e.value.message, e.value.facts, e.value.hint) == (
        "'k2.7' is neither a target nor a model profile",
        ["targets: " + ", ".join(sorted(cat.targets)),
         "model profiles: " + ", ".join(sorted(cat.models))], "see `imgbuild list`")
