"""Decision tests for each command of imgbuild/cli/commands/, in this process (so mutation
testing and coverage see them): what a command refuses before any work, which stage it hands
the arguments to, and which exit code it returns for what that stage reports. Nothing here
needs a Docker Engine, a registry or the network: the Engine-driving commands are run against
a socket where no daemon answers, which is itself one of their decisions (exit 3, said first).

The commands run end to end on a real Engine in tests/test_installed.py (every command from an
empty directory), tests/test_docker.py and tests/test_engines.py."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from imgbuild.cli.main import main
from imgbuild.cli.parser import COMMANDS

from .conftest import ROOT

NO_DAEMON = "unix:///nonexistent/imgbuild-test.sock"
CORPUS = ROOT / "tests" / "fixtures" / "corpus"


def run(capsys, *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    got = capsys.readouterr()
    return code, got.out, got.err


def err_json(capsys, *argv: str) -> tuple[int, dict]:
    code, out, _ = run(capsys, *argv, "--json")
    return code, json.loads(out)


@pytest.fixture
def no_daemon(monkeypatch):
    monkeypatch.setenv("DOCKER_HOST", NO_DAEMON)


def test_every_command_module_is_covered_here():
    """A command added tomorrow gets its decision test in this file too."""
    here = Path(__file__).read_text()
    missing = [c for c, m in COMMANDS.items() if f"# command: {m}" not in here]
    assert missing == []


# command: verify

@pytest.mark.parametrize("ref, said", [
    ("tiny-cpu", "tiny-cpu: expected HOST[:PORT]/REPO:TAG or HOST[:PORT]/REPO@DIGEST"),
    ("127.0.0.1:5000/x:a/b", "expected HOST[:PORT]/REPO:TAG"),
    ("imgbuild:tiny", "imgbuild:tiny names no registry host"),
    ("imgbuild@sha256:" + "0" * 64, "names no registry host"),
])
def test_verify_refuses_what_names_no_registry_copy(capsys, ref, said):
    code, doc = err_json(capsys, "verify", ref)
    assert code == 2 and doc["error"] == "InputError" and said in doc["message"]


# command: doctor

def test_doctor_reads_a_log_or_the_host_never_both_and_needs_one(capsys, tmp_path):
    code, doc = err_json(capsys, "doctor", "--host", str(tmp_path / "x.log"))
    assert code == 2 and doc["message"] == "doctor reads a log or this host, not both at once"
    assert doc["facts"] == [f"given: {tmp_path / 'x.log'} and --host"]
    code, doc = err_json(capsys, "doctor", "--host", "--engine", "vllm")
    assert code == 2 and doc["facts"] == ["given: --engine vllm and --host"]
    code, doc = err_json(capsys, "doctor")
    assert code == 2 and "needs a LOGFILE" in doc["message"]


def test_doctor_returns_the_reports_exit_code(capsys, tmp_path):
    code, out, _ = run(capsys, "doctor", str(CORPUS / "vllm-19853-no-scheme.log"))
    assert code == 1 and "vllm-no-compatible-scheme" in out
    quiet = tmp_path / "ok.log"
    quiet.write_text("INFO: server started\nINFO: 200 OK\n")
    code, out, _ = run(capsys, "doctor", str(quiet))
    assert code == 0


def test_doctor_host_is_the_environment_when_no_daemon_answers(capsys, no_daemon):
    code, doc = err_json(capsys, "doctor", "--host")
    assert code == 3


def test_doctor_refusals_say_the_way_out(capsys, tmp_path):
    _, doc = err_json(capsys, "doctor", "--host", str(tmp_path / "x.log"))
    assert doc["hint"] == ("run `imgbuild doctor LOGFILE` and `imgbuild doctor --host` one "
                           "after the other")
    _, doc = err_json(capsys, "doctor")
    assert doc["message"] == "doctor needs a LOGFILE (or - for stdin), or --host"
    assert doc["hint"] == ("`imgbuild doctor server.log` reads a log; `imgbuild doctor --host` "
                           "says what imgbuild does with this machine's Docker Engine")


def test_doctor_reads_the_log_as_the_engine_named(capsys):
    log = str(CORPUS / "vllm-19853-no-scheme.log")
    code, doc = err_json(capsys, "doctor", log, "--engine", "sglang")
    assert doc["engine"]["name"] == "sglang"  # as named, not as the log says
    assert "--engine sglang" in json.dumps(doc["engine"])
    code, doc = err_json(capsys, "doctor", log)
    assert doc["engine"]["name"] == "vllm"


def test_doctor_host_shows_the_engines_facts_and_exits_by_its_decision(capsys, monkeypatch):
    from imgbuild.cli.commands import doctor as doctor_cmd
    from imgbuild.image import engine

    facts, shown = object(), []

    class Use:
        exit_code = 3

    use = Use()
    monkeypatch.setattr(engine, "read_facts", lambda: facts)
    monkeypatch.setattr(engine, "decide", lambda f: use if f is facts else None)
    monkeypatch.setattr(doctor_cmd.views, "doctor_host",
                        lambda out, f, u: shown.append((out.json, f, u)))
    assert main(["doctor", "--host", "--json"]) == 3
    assert shown == [(True, facts, use)]


# command: report

def test_report_needs_a_page_or_json_and_a_named_directory(capsys):
    code, _, err = run(capsys, "report")
    assert code == 2 and "neither was asked for" in err
    assert "help: pass --html DIR (writes DIR/index.html) or --json" in err
    code, _, err = run(capsys, "report", "--html", "  ")
    assert code == 2 and "--html is empty" in err
    assert "help: name the directory for index.html" in err
    code, _, err = run(capsys, "report", "--html", "out", "--registry", "Bad Name!")
    assert code == 2 and "Traceback" not in err


# command: run

CLUSTER_FLAGS = ("--gke, --rdma, --rdma-resource and --nccl-* describe a Kubernetes cluster: "
                 "they go with --emit k8s DIR")


@pytest.mark.parametrize("argv, said, hint", [
    (["--emit", "yaml", "out"], "--emit yaml: not a format imgbuild writes",
     "--emit compose DIR, or --emit k8s DIR"),
    (["--port", "0"], "--port 0: not a TCP port", "a number from 1 to 65535"),
    (["--port", "65536"], "--port 65536: not a TCP port", "a number from 1 to 65535"),
    (["--timeout", "0"], "--timeout 0.0: not a duration", "seconds, above 0"),
    (["--timeout", "-5"], "--timeout -5.0: not a duration", "seconds, above 0"),
    (["--admission", "kyverno"], "--admission kyverno: an admission policy is for a Kubernetes "
                                 "cluster: it goes with --emit k8s DIR",
     "add --emit k8s DIR, or drop --admission"),
    (["--emit", "compose", "out", "--admission", "policy-controller"],
     "--admission policy-controller: an admission policy is for a Kubernetes cluster: it goes "
     "with --emit k8s DIR", "add --emit k8s DIR, or drop --admission"),
    (["--env", "NOEQUALS"], "--env 'NOEQUALS': expected NAME=VALUE",
     "e.g. --env TRITON_CACHE_DIR=/tmp/triton"),
    (["--env", "1BAD=x"], "--env '1BAD=x': expected NAME=VALUE",
     "e.g. --env TRITON_CACHE_DIR=/tmp/triton"),
    (["--gke"], CLUSTER_FLAGS, "add --emit k8s DIR, or drop them"),
    (["--rdma-resource", "rdma/ib"], CLUSTER_FLAGS, "add --emit k8s DIR, or drop them"),
    (["--emit", "compose", "out", "--rdma"], CLUSTER_FLAGS, "add --emit k8s DIR, or drop them"),
])
def test_run_refuses_bad_arguments_before_anything_starts(capsys, no_daemon, argv, said, hint):
    code, doc = err_json(capsys, "run", "tiny-cpu", *argv)
    assert code == 2 and doc["message"] == said
    assert doc["hint"] == hint


def test_run_takes_a_short_timeout_and_a_good_env(capsys, no_daemon):
    # Half a second is a duration; NAME=VALUE with an empty value is one. Both pass the
    # argument checks: the run then stops at the Engine, which is not there (exit 3).
    code, _ = err_json(capsys, "run", "tiny-cpu", "--timeout", "0.5", "--env", "A_B=")
    assert code == 3


def test_run_admission_names_a_controller_imgbuild_writes_for(capsys, tmp_path):
    with pytest.raises(SystemExit) as e:
        main(["run", "tiny-cpu", "--emit", "k8s", str(tmp_path), "--admission", "gatekeeper"])
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert "argument --admission: invalid choice: 'gatekeeper' (choose from " \
           "'policy-controller', 'kyverno')" in err and "Traceback" not in err
    assert not list(tmp_path.iterdir())


def test_run_emit_k8s_admission_kyverno_reports_the_policy_it_wrote(capsys, no_daemon,
                                                                   tmp_path):
    images = tmp_path / "images"
    images.mkdir()
    (images / "registries.yaml").write_text(
        "registries:\n  - match: 127.0.0.1:5000/acme\n"
        f"    signed-by: {{key: {ROOT / 'tests' / 'fixtures' / 'cosign' / 'cosign.pub'}}}\n")
    code, out, err = run(capsys, "run", "tiny-cpu", "--images", str(images), "--lockfiles",
                         str(ROOT / "lockfiles"), "--registry", "127.0.0.1:5000/acme/serving",
                         "--emit", "k8s", str(tmp_path / "k8s"), "--admission", "kyverno",
                         "--json")
    assert code == 0, err
    files = [Path(f).name for f in json.loads(out)["files"]]
    assert [f for f in files if f.endswith("policy.yaml")] == [
        "imgbuild-127-0-0-1-5000-acme-serving-92210632-clusterpolicy.yaml"]
    # without --admission, the default: policy-controller's
    code, out, err = run(capsys, "run", "tiny-cpu", "--images", str(images), "--lockfiles",
                         str(ROOT / "lockfiles"), "--registry", "127.0.0.1:5000/acme/serving",
                         "--emit", "k8s", str(tmp_path / "k8s2"), "--json")
    assert code == 0, err
    assert [Path(f).name for f in json.loads(out)["files"] if f.endswith("policy.yaml")] == [
        "imgbuild-127-0-0-1-5000-acme-serving-92210632-clusterimagepolicy.yaml"]


def test_run_takes_the_edges_of_the_port_range(capsys, no_daemon, tmp_path):
    # 1 and 65535 are ports: the command goes on to the stage, which writes the compose file
    # without asking an Engine.
    for port in ("1", "65535"):
        code, out, err = run(capsys, "run", "tiny-cpu", "--port", port, "--emit", "compose",
                             str(tmp_path / port))
        assert code == 0, err
        assert f"{port}:" in (tmp_path / port / "compose.yaml").read_text()


# command: index

def test_index_needs_targets_and_each_must_be_multi_platform(capsys):
    code, doc = err_json(capsys, "index", "--registry", "127.0.0.1:5000/x")
    assert code == 2 and doc["message"] == "name the targets whose index to assemble, or --all"
    assert doc["facts"] == ["multi-platform targets: tiny-cpu-multi"]
    code, doc = err_json(capsys, "index", "tiny-cpu", "--registry", "127.0.0.1:5000/x")
    assert code == 2 and doc["message"] == \
        "target 'tiny-cpu' names one platform: its image is its own tag"


# command: pull

def test_pull_takes_one_platform(capsys):
    code, doc = err_json(capsys, "pull", "tiny-cpu-multi", "--registry", "127.0.0.1:5000/x",
                         "--platform", "linux/amd64,linux/arm64")
    assert code == 2 and doc["message"] == "pull takes one --platform"
    assert doc["facts"] == ["asked for linux/amd64, linux/arm64"]


# command: check_model

def test_check_model_needs_a_target_to_check_against(capsys):
    code, doc = err_json(capsys, "check-model", "some/model")
    assert code == 2 and "needs the target whose engine to check against" in doc["message"]


# command: build

def test_build_checks_its_log_dir_before_any_work(capsys, no_daemon, tmp_path):
    code, doc = err_json(capsys, "tiny-cpu", "--log-dir", "")
    assert code == 2 and doc["message"] == "--log-dir is empty"
    blocker = tmp_path / "file"
    blocker.write_text("")
    code, doc = err_json(capsys, "tiny-cpu", "--log-dir", str(blocker))
    assert code == 2 and doc["message"].endswith("it is a file, not a directory")
    code, doc = err_json(capsys, "tiny-cpu", "--log-dir", str(blocker / "below"))
    assert code == 2 and "a part of the path is a file" in doc["message"]
    assert doc["facts"] == ["nothing was built"]


def test_build_with_a_good_log_dir_reaches_the_engine(capsys, no_daemon, tmp_path):
    code, doc = err_json(capsys, "tiny-cpu", "--log-dir", str(tmp_path / "new" / "logs"))
    assert code == 3 and (tmp_path / "new" / "logs").is_dir()


# command: smoke_model

def test_smoke_model_checks_its_log_dir_first(capsys, tmp_path):
    f = tmp_path / "f"
    f.write_text("")
    code, doc = err_json(capsys, "smoke-model", "tiny-nvfp4", "--log-dir", str(f))
    assert code == 2 and doc["facts"] == ["nothing was built"]


# command: size
# command: smoke
# command: base

@pytest.mark.parametrize("argv", [["size", "img"], ["smoke", "img"],
                                  ["base", "bootstrap", "--registry", "127.0.0.1:5000/x"]])
def test_engine_commands_say_no_daemon_first(capsys, no_daemon, argv):
    code, doc = err_json(capsys, *argv)
    assert code == 3 and doc["error"] == "EnvError"
    assert doc["message"] == f"no Docker daemon answers at {NO_DAEMON}"


# command: list
# command: version

def test_list_and_version_read_the_catalog(capsys):
    code, out, _ = run(capsys, "list", "--json")
    targets = json.loads(out)["targets"]
    assert code == 0 and "tiny-cpu" in targets and targets["tiny-cpu"]["engine"]
    code, out, _ = run(capsys, "version", "--json")
    info = json.loads(out)
    shipped = [p for p in (ROOT / "images").glob("*.yaml")
               if p.name not in ("bases.yaml", "cuda.yaml", "gpus.yaml", "prune.yaml",
                                 "registries.yaml")]
    assert code == 0 and info["catalog"]["targets"] == len(shipped)
    assert info["catalog"]["model_profiles"] == len(list((ROOT / "images/models").glob("*.yaml")))


# command: plan

def test_plan_of_a_multi_platform_target_is_an_index_plan_unless_one_platform(capsys):
    code, out, _ = run(capsys, "plan", "tiny-cpu-multi", "--no-checks", "--json")
    doc = json.loads(out)
    assert code == 0 and "platforms" in doc and len(doc["platforms"]) == 2
    code, out, _ = run(capsys, "plan", "tiny-cpu-multi", "--no-checks", "--json",
                       "--platform", "linux/arm64")
    one = json.loads(out)
    assert code == 0 and one["platform"] == "linux/arm64" and "platforms" not in one


def test_an_index_plan_says_the_served_models_quantization_as_a_single_plan_does(capsys):
    code, out, _ = run(capsys, "plan", "tiny-cpu-multi", "--no-checks", "--json",
                       "--model", "tiny-nvfp4")
    index = json.loads(out)
    code1, out, _ = run(capsys, "plan", "tiny-cpu-multi", "--no-checks", "--json",
                        "--model", "tiny-nvfp4", "--platform", "linux/arm64")
    one = json.loads(out)
    assert (code, code1) == (0, 0)
    assert index["quantization"] == one["quantization"] and index["quantization"]
    code, out, _ = run(capsys, "plan", "tiny-cpu-multi", "--no-checks", "--json")
    assert "quantization" not in json.loads(out)  # no model served: none said


def test_plan_notes_a_shadowed_target_for_people_only(capsys, tmp_path, monkeypatch):
    from .test_project import project

    proj = project(tmp_path / "p", {"images/tiny-cpu.yaml": "extends: tiny-cpu\n"})
    monkeypatch.chdir(proj)
    code, _, err = run(capsys, "plan", "tiny-cpu", "--no-checks")
    assert "note" in err and "tiny-cpu" in err
    code, out, err = run(capsys, "plan", "tiny-cpu", "--no-checks", "--json")
    assert "note" not in err and json.loads(out)["target"] == "tiny-cpu"


# command: patches

def test_patches_lists_without_checking(capsys):
    code, out, _ = run(capsys, "patches", "sglang-0516-blackwell", "--json")
    assert code == 0 and json.loads(out)


# command: matrix

def test_matrix_lists_a_job_per_target(capsys):
    code, out, _ = run(capsys, "matrix", "--format", "json")
    jobs = json.loads(out)["jobs"]
    assert code == 0 and "tiny-cpu" in {j["target"] for j in jobs}


# command: preflight

def test_preflight_returns_the_reports_exit_code(capsys, tmp_path):
    # No nvidia-smi here: the GPU checks are skipped, never passed; the report's exit code is
    # the command's.
    code, out, _ = run(capsys, "preflight", "sglang-blackwell", "--model", "k2.6", "--json",
                       "--nvidia-smi", str(tmp_path / "nvidia-smi"))
    doc = json.loads(out)
    statuses = {v["check"]: v["status"] for v in doc["verdicts"]}
    assert statuses["nvidia-smi"] == "skip" and statuses["cpu"] == "pass"
    failed = [c for c, s in statuses.items() if s == "fail"]
    assert doc["ok"] is (not failed) and code == (1 if failed else 0), statuses


# command: init

def test_init_writes_a_project_and_refuses_a_reserved_name(capsys, tmp_path):
    code, _, err = run(capsys, "init", str(tmp_path / "a"), "--extends", "tiny-cpu")
    assert code == 0, err
    assert (tmp_path / "a" / "imgbuild.yaml").is_file()
    code, doc = err_json(capsys, "init", str(tmp_path / "b"), "--extends", "tiny-cpu",
                         "--name", "run")
    assert code == 2 and not (tmp_path / "b").exists()


# command: lock
# command: relock
# command: outdated
# command: check_deps
# These ask an index (uv, PyPI) for what they report: their decisions are the stages'
# (tests/test_lock.py, tests/test_outdated.py, tests/test_cli_lock.py). The command's own is
# which targets it hands on, and an unknown one is refused before any resolution.

def _stage(monkeypatch, module, name: str, result):
    """The stage a command hands its arguments to, answering `result` and writing down what it
    was handed (the stage's own decisions are tested with the real index elsewhere)."""
    handed: list = []

    def stage(*args, **kwargs):
        handed.append((args, kwargs))
        return result
    monkeypatch.setattr(module, name, stage)
    return handed


def test_lock_hands_on_the_targets_and_flags_and_returns_the_reports_code(capsys, monkeypatch):
    from imgbuild.cli.commands import lock as cmd
    from imgbuild.errors import EnvError
    from imgbuild.pipeline.lock import LockEntry, LockReport

    fresh = LockReport(False, (LockEntry("tiny-cpu", "lockfiles/tiny-cpu.lock", True, 12, "h"),))
    handed = _stage(monkeypatch, cmd, "lock_targets", fresh)
    code, out, _ = run(capsys, "lock", "tiny-cpu", "--refresh", "--jobs", "2")
    assert code == 0 and "wrote  tiny-cpu  lockfiles/tiny-cpu.lock  (12 packages)" in out
    (ws, names), kw = handed[0]
    assert names == ["tiny-cpu"] and ws.catalog.target("tiny-cpu")
    assert (kw["check"], kw["refresh"], kw["jobs"]) == (False, True, 2)
    assert kw["progress"] is not None and hasattr(kw["progress"], "note")
    # --all: every target of the catalog; --check: stale is exit 1, and the JSON is the report's
    stale = LockReport(True, (LockEntry("tiny-cpu", "lockfiles/tiny-cpu.lock", stale=True,
                                        diff=("- six==1.16.0",)),))
    handed = _stage(monkeypatch, cmd, "lock_targets", stale)
    code, out, _ = run(capsys, "lock", "--all", "--check", "--json")
    (ws, names), kw = handed[0]
    assert names == list(ws.catalog.targets) and kw["check"] is True
    assert code == 1 and json.loads(out) == stale.to_dict()
    failed = LockReport(False, (LockEntry("tiny-cpu", "x.lock",
                                          error=EnvError("uv is not installed")),))
    _stage(monkeypatch, cmd, "lock_targets", failed)
    code, _, err = run(capsys, "lock", "tiny-cpu")
    assert code == 3 and "uv is not installed" in err


def test_relock_and_outdated_show_the_stages_result_and_exit_0(capsys, monkeypatch):
    from imgbuild.ci import outdated as o
    from imgbuild.cli.commands import outdated as outdated_cmd
    from imgbuild.cli.commands import relock as relock_cmd

    res = o.RelockResult("tiny-cpu", "lockfiles/tiny-cpu.lock", ("images/tiny-cpu.yaml: x",),
                         (o.Change("numpy", "2.1.0", "2.1.1"),), True, note="wrote it")
    handed = _stage(monkeypatch, relock_cmd, "relock", res)
    code, out, _ = run(capsys, "relock", "tiny-cpu", "--upgrade", "numpy")
    assert code == 0 and out == "\n".join([*res.diff, "wrote it", ""])
    (ws, target, upgrade), _ = handed[0]
    assert (target, upgrade) == ("tiny-cpu", ["numpy"]) and ws.catalog.target("tiny-cpu")
    code, out, _ = run(capsys, "relock", "tiny-cpu", "--upgrade", "numpy", "--json")
    assert code == 0 and json.loads(out) == json.loads(json.dumps(res.to_dict()))

    # News is a report, not a failure: exit 0 with a package to upgrade.
    news = [o.TargetNews("tiny-cpu", "torch", "lockfiles/tiny-cpu.lock", packages=(
        o.PackageNews("numpy", "dependency", "2.1.0", ("2.1.1",), "available",
                      available="2.1.1", changes=(o.Change("numpy", "2.1.0", "2.1.1"),)),))]
    handed = _stage(monkeypatch, outdated_cmd, "outdated", news)
    code, out, _ = run(capsys, "outdated", "tiny-cpu", "--json")
    assert code == 0 and json.loads(out) == json.loads(json.dumps(o.to_dict(news)))
    assert handed[0][1] == {"targets": ["tiny-cpu"]}
    code, out, _ = run(capsys, "outdated")
    assert code == 0 and "relock --upgrade numpy==2.1.1:" in out
    assert handed[1][1] == {"targets": None}  # none named: every target


@pytest.mark.parametrize("argv", [["lock", "no-such"], ["relock", "no-such", "--upgrade", "sglang"],
                                  ["outdated", "no-such"], ["check-deps", "no-such"]])
def test_index_commands_refuse_an_unknown_target_before_resolving(capsys, argv):
    code, doc = err_json(capsys, *argv)
    assert code == 2 and "no-such" in doc["message"]
