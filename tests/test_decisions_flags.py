"""Each flag of a command reaches its stage as the field it names, and only that field: the
thin layer between the parser and the pipeline (cli/commands/*), tested as pip-tools tests its
command layering. The stage itself is stood in for by a recorder that stops the command where
it would start work, so nothing here needs an Engine, a registry or the network; the stages
are tested on their own, and end to end in tests/test_docker.py and tests/test_installed.py.

A flag dropped, swapped or inverted on its way (`smoke=args.no_smoke`, `flavor=None`) fails
here, where before only the docker tests that happened to pass that flag could see it."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from imgbuild.cli.commands import build as build_cmd
from imgbuild.cli.commands import lock as lock_cmd
from imgbuild.cli.commands import pull as pull_cmd
from imgbuild.cli.commands import run as run_cmd
from imgbuild.cli.main import main
from imgbuild.pipeline.build import BuildOptions
from imgbuild.plan.launch import Cluster


class Reached(BaseException):
    """The command got to its stage with these arguments (a BaseException, so that main's
    error handling, which turns ImgbuildErrors into exit codes, lets it through)."""

    def __init__(self, args: tuple, kwargs: dict) -> None:
        super().__init__("reached")
        self.call_args, self.call_kwargs = args, kwargs


def reach(monkeypatch, module, stage: str, argv: list[str]) -> tuple[tuple, dict]:
    def stand_in(*args, **kwargs):
        raise Reached(args, kwargs)

    monkeypatch.setattr(module, stage, stand_in)
    with pytest.raises(Reached) as got:
        main(argv)
    return got.value.call_args, got.value.call_kwargs


# --- build -----------------------------------------------------------------------------------

def build_opts(monkeypatch, *flags: str, target: str = "tiny-cpu") -> BuildOptions:
    (_, opts, _), _ = reach(monkeypatch, build_cmd, "build_target", ["build", target, *flags])
    return opts


def test_build_without_flags_asks_for_the_defaults(monkeypatch):
    assert build_opts(monkeypatch) == BuildOptions(target="tiny-cpu")


BUILD_FLAGS = [
    (["--model", "tiny"], {"model": "tiny"}),
    (["--registry", "127.0.0.1:5000/acme/x"], {"registry": "127.0.0.1:5000/acme/x"}),
    (["--flavor", "slim"], {"flavor": "slim"}),
    (["--push"], {"push": True}),
    (["--platform", "linux/arm64"], {"platforms": ("linux/arm64",)}),
    (["--platform", "arm64,linux/amd64"], {"platforms": ("linux/arm64", "linux/amd64")}),
    (["--rebuild"], {"rebuild": True}),
    (["--no-smoke"], {"smoke": False}),
    (["--force"], {"force": True}),
    (["--no-cache"], {"no_cache": True}),
    (["--no-cache-from"], {"cache_from": False}),
    (["--cache-from", "127.0.0.1:5000/rel:x", "--cache-from", "127.0.0.1:5000/rel:y"],
     {"cache_from_refs": ("127.0.0.1:5000/rel:x", "127.0.0.1:5000/rel:y")}),
    (["--resmoke"], {"resmoke": True}),
    (["--compression", "zstd"], {"compression": "zstd"}),
    (["--no-splice"], {"splice": False}),
    (["--registry-cache"], {"registry_cache": True}),
    (["--sign-key", "env://COSIGN_KEY"], {"sign_key": "env://COSIGN_KEY"}),
]


@pytest.mark.parametrize("flags, fields", BUILD_FLAGS, ids=[" ".join(f) for f, _ in BUILD_FLAGS])
def test_each_build_flag_reaches_its_option_and_only_it(monkeypatch, flags, fields):
    assert build_opts(monkeypatch, *flags) == dataclasses.replace(
        BuildOptions(target="tiny-cpu"), **fields)


def test_build_arch_and_log_dir_reach_their_options(monkeypatch, tmp_path):
    opts = build_opts(monkeypatch, "--arch", "B200", "--arch", "12.0",
                      target="sglang-blackwell")
    assert opts == BuildOptions(target="sglang-blackwell", archs=("sm100", "sm120"))
    logs = tmp_path / "logs"
    assert build_opts(monkeypatch, "--log-dir", str(logs)) == BuildOptions(
        target="tiny-cpu", log_dir=logs)


def test_every_build_option_has_a_flag_tested_here():
    """A field added to BuildOptions tomorrow gets its row in BUILD_FLAGS (or the test above)."""
    tested = {f for _, fields in BUILD_FLAGS for f in fields} | {"archs", "log_dir", "target"}
    assert {f.name for f in dataclasses.fields(BuildOptions)} - tested == set()


# --- run -------------------------------------------------------------------------------------

def run_kwargs(monkeypatch, *flags: str) -> dict:
    (_, subject), kwargs = reach(monkeypatch, run_cmd, "run_model", ["run", "tiny-cpu", *flags])
    assert subject == "tiny-cpu"
    # The two callbacks are the views' and the console's: what they do is the views' tests'.
    assert callable(kwargs.pop("on_ready")) and kwargs.pop("progress") is not None
    return kwargs


RUN_DEFAULTS = {"model": None, "registry_name": None, "port": None, "dry_run": False,
                "emit": None, "gpus_per_node": 8, "keep": False, "detach": False,
                "preflight": True, "timeout_s": 1800, "nvidia_smi": None,
                "model_cache": None, "read_only_root": False, "env": (), "cluster": Cluster(),
                "admission": None}


def test_run_without_flags_asks_for_the_defaults(monkeypatch):
    assert run_kwargs(monkeypatch) == RUN_DEFAULTS


RUN_FLAGS = [
    (["--model", "tiny"], {"model": "tiny"}),
    (["--registry", "127.0.0.1:5000/acme/x"], {"registry_name": "127.0.0.1:5000/acme/x"}),
    (["--port", "30001"], {"port": 30001}),
    (["--dry-run"], {"dry_run": True}),
    (["--emit", "compose", "out"], {"emit": ("compose", Path("out"))}),
    (["--emit", "k8s", "out", "--admission", "kyverno"],
     {"emit": ("k8s", Path("out")), "admission": "kyverno"}),
    (["--emit", "k8s", "out", "--gpus-per-node", "4"],
     {"emit": ("k8s", Path("out")), "gpus_per_node": 4}),
    (["--keep"], {"keep": True}),
    (["--detach"], {"detach": True}),
    (["--no-preflight"], {"preflight": False}),
    (["--timeout", "12.5"], {"timeout_s": 12.5}),
    (["--nvidia-smi", "/opt/bin/nvidia-smi"], {"nvidia_smi": "/opt/bin/nvidia-smi"}),
    (["--model-dir", "/srv/models"], {"model_cache": Path("/srv/models")}),
    (["--read-only"], {"read_only_root": True}),
    (["-e", "A=1", "--env", "B=x=y"], {"env": (("A", "1"), ("B", "x=y"))}),
]


@pytest.mark.parametrize("flags, fields", RUN_FLAGS, ids=[" ".join(f) for f, _ in RUN_FLAGS])
def test_each_run_flag_reaches_its_argument_and_only_it(monkeypatch, flags, fields):
    assert run_kwargs(monkeypatch, *flags) == RUN_DEFAULTS | fields


def test_the_cluster_flags_reach_the_cluster(monkeypatch):
    from imgbuild.cli.args import workspace
    from imgbuild.cli.parser import parser
    from imgbuild.plan.launch import cluster_for

    flags = ["--emit", "k8s", "out", "--gke", "--rdma", "--rdma-resource", "rdma/ib",
             "--nccl-ib-hca", "mlx5", "--nccl-ib-gid-index", "3", "--nccl-socket-ifname", "eth0"]
    got = run_kwargs(monkeypatch, *flags)
    assert got == RUN_DEFAULTS | {"emit": ("k8s", Path("out")), "cluster": got["cluster"]}
    table = workspace(parser().parse_args(["run", "tiny-cpu"])).launch
    assert got["cluster"] == cluster_for(
        table, gke=True, rdma=True, rdma_resource="rdma/ib",
        nccl=(("NCCL_IB_HCA", "mlx5"), ("NCCL_IB_GID_INDEX", "3"),
              ("NCCL_SOCKET_IFNAME", "eth0")))
    assert got["cluster"].gke and got["cluster"].rdma.resource == "rdma/ib"
    # each alone: GKE without RDMA, RDMA on the table's resource
    only_gke = run_kwargs(monkeypatch, "--emit", "k8s", "out", "--gke")["cluster"]
    assert only_gke.gke and only_gke.rdma is None
    only_rdma = run_kwargs(monkeypatch, "--emit", "k8s", "out", "--rdma")["cluster"]
    assert not only_rdma.gke and only_rdma.rdma.resource == table.rdma.resource


def test_the_model_cache_is_the_users_directory_expanded(monkeypatch):
    got = run_kwargs(monkeypatch, "--model-cache", "~/models")
    assert got["model_cache"] == Path("~/models").expanduser()


# --- pull and lock ---------------------------------------------------------------------------

def test_pull_passes_its_flags_and_one_platform(monkeypatch):
    (_, target), kw = reach(monkeypatch, pull_cmd, "pull_target",
                            ["pull", "tiny-cpu", "--registry", "127.0.0.1:5000/x"])
    kw.pop("progress")
    assert target == "tiny-cpu" and kw == {"model": None, "registry_name": "127.0.0.1:5000/x",
                                           "archs": None, "flavor": None, "platform": None}
    (_, _), kw = reach(monkeypatch, pull_cmd, "pull_target",
                       ["pull", "tiny-cpu", "--registry", "127.0.0.1:5000/x", "--model", "m",
                        "--flavor", "slim", "--platform", "arm64"])
    kw.pop("progress")
    assert kw == {"model": "m", "registry_name": "127.0.0.1:5000/x", "archs": None,
                  "flavor": "slim", "platform": "linux/arm64"}


def test_lock_passes_its_flags_and_all_means_every_target(monkeypatch):
    (_, names), kw = reach(monkeypatch, lock_cmd, "lock_targets", ["lock", "tiny-cpu"])
    kw.pop("progress")
    assert names == ["tiny-cpu"] and kw == {"check": False, "refresh": False, "jobs": 4}
    (ws, names), kw = reach(monkeypatch, lock_cmd, "lock_targets",
                            ["lock", "--all", "--check", "--refresh", "--jobs", "2"])
    kw.pop("progress")
    assert names == list(ws.catalog.targets) and len(names) > 1
    assert kw == {"check": True, "refresh": True, "jobs": 2}


# --- base and check-model --------------------------------------------------------------------

def test_base_bootstrap_passes_its_flags(monkeypatch):
    from imgbuild.cli.commands import base as base_cmd
    from imgbuild.image import base as base_stage

    (_, name), kw = reach(monkeypatch, base_stage, "bootstrap_base", ["base", "bootstrap"])
    kw.pop("progress")
    assert name == "debian-bookworm"
    assert kw == {"registry": None, "rebuild": False, "record": False, "cpu_arch": "x86_64"}
    (_, name), kw = reach(monkeypatch, base_stage, "bootstrap_base",
                          ["base", "bootstrap", "--base", "debian-trixie", "--registry",
                           "127.0.0.1:5000/b", "--rebuild", "--record", "--cpu-arch",
                           "aarch64"])
    kw.pop("progress")
    assert name == "debian-trixie"
    assert kw == {"registry": "127.0.0.1:5000/b", "rebuild": True, "record": True,
                  "cpu_arch": "aarch64"}
    assert base_cmd.base is base_stage  # the command calls the stage through its module


def test_base_refresh_digests_passes_the_mirror_and_bootstraps_nothing(monkeypatch):
    from imgbuild.image import base as base_stage
    from imgbuild.image import digests

    def no_bootstrap(*a, **kw):
        raise AssertionError("refresh-digests bootstrapped a base")

    monkeypatch.setattr(base_stage, "bootstrap_base", no_bootstrap)
    (_,), kw = reach(monkeypatch, digests, "refresh_catalog", ["base", "refresh-digests"])
    assert kw == {"mirror": None}
    (_,), kw = reach(monkeypatch, digests, "refresh_catalog",
                     ["base", "refresh-digests", "--mirror", "127.0.0.1:5000/hub"])
    assert kw == {"mirror": "127.0.0.1:5000/hub"}


def test_check_model_takes_the_target_given_or_the_images_label(monkeypatch, tmp_path):
    from imgbuild.cli.commands import check_model as cm_cmd
    from imgbuild.image import schemes

    (_, model, target, fix), _ = reach(monkeypatch, cm_cmd, "check_model",
                                       ["check-model", "m", "--target", "t1"])
    assert (model, target, fix) == ("m", "t1", None)
    (_, _, _, fix), _ = reach(monkeypatch, cm_cmd, "check_model",
                              ["check-model", "m", "--target", "t1", "--fix", "out"])
    assert fix == "out"
    # --image: the Engine is asked which target built it (a stand-in for that one call), and
    # --target, where given, wins over the label.
    monkeypatch.setattr(schemes, "image_engine", lambda image: (None, None, None, "labelled"))
    (_, _, target, _), _ = reach(monkeypatch, cm_cmd, "check_model",
                                 ["check-model", "m", "--image", "img:1"])
    assert target == "labelled"
    (_, _, target, _), _ = reach(monkeypatch, cm_cmd, "check_model",
                                 ["check-model", "m", "--image", "img:1", "--target", "t2"])
    assert target == "t2"


def test_check_model_without_a_target_or_a_label_is_refused(monkeypatch, capsys):
    from imgbuild.image import schemes

    assert main(["check-model", "m"]) == 2
    assert "needs the target whose engine to check against" in capsys.readouterr().err
    monkeypatch.setattr(schemes, "image_engine", lambda image: (None, None, None, None))
    assert main(["check-model", "m", "--image", "img:1"]) == 2
    assert "pass --target TARGET" in capsys.readouterr().err


# --- the image commands ----------------------------------------------------------------------

@pytest.fixture
def daemon_answers(monkeypatch):
    """The daemon check passes (what it says when none answers: test_decisions_commands)."""
    from imgbuild.image import daemon

    monkeypatch.setattr(daemon, "client", lambda: object())


def test_smoke_passes_the_image_and_the_gpu_choice(monkeypatch, daemon_answers):
    from imgbuild.image import smoke

    (image,), kw = reach(monkeypatch, smoke, "run", ["smoke", "img:1"])
    assert image == "img:1" and kw == {"gpu": "auto"}
    (image,), kw = reach(monkeypatch, smoke, "run", ["smoke", "img:2", "--gpu", "require"])
    assert image == "img:2" and kw == {"gpu": "require"}


def test_size_measures_the_image_named(monkeypatch, daemon_answers):
    from imgbuild.image import sizes

    (image,), kw = reach(monkeypatch, sizes, "measure", ["size", "img:1", "--top", "3"])
    assert image == "img:1" and kw == {}


def test_preflight_passes_its_flags(monkeypatch):
    from imgbuild.cli.commands import preflight as pf_cmd

    (_, subject), kw = reach(monkeypatch, pf_cmd, "preflight", ["preflight", "tiny-cpu"])
    assert subject == "tiny-cpu"
    assert kw == {"model": None, "archs": None, "flavor": None, "model_dir": None,
                  "nvidia_smi": None}
    (_, subject), kw = reach(monkeypatch, pf_cmd, "preflight",
                             ["preflight", "sglang-blackwell", "--model", "m", "--arch", "B200",
                              "--flavor", "slim", "--model-dir", "/srv/m", "--nvidia-smi",
                              "/opt/nvidia-smi"])
    assert kw == {"model": "m", "archs": ("sm100",), "flavor": "slim", "model_dir": "/srv/m",
                  "nvidia_smi": "/opt/nvidia-smi"}


def test_smoke_model_passes_its_flags_and_the_checked_log_dir(monkeypatch, tmp_path):
    from imgbuild.cli.commands import smoke_model as sm_cmd

    (_, alias), kw = reach(monkeypatch, sm_cmd, "smoke_model_for", ["smoke-model", "tiny"])
    kw.pop("progress")
    assert alias == "tiny" and kw == {"registry_name": None, "push": False, "log_dir": None}
    logs = tmp_path / "made" / "here"
    (_, alias), kw = reach(monkeypatch, sm_cmd, "smoke_model_for",
                           ["smoke-model", "tiny", "--registry", "127.0.0.1:5000/m", "--push",
                            "--log-dir", str(logs)])
    kw.pop("progress")
    assert kw == {"registry_name": "127.0.0.1:5000/m", "push": True, "log_dir": logs}
    assert logs.is_dir()  # made before the stage started, as for a build


def test_report_passes_the_registry_and_the_targets(monkeypatch):
    from imgbuild.cli.commands import report as report_cmd

    (_,), kw = reach(monkeypatch, report_cmd, "collect", ["report", "--json"])
    assert kw == {"registry": None, "targets": None}
    (_,), kw = reach(monkeypatch, report_cmd, "collect",
                     ["report", "--json", "--registry", "127.0.0.1:5000/x", "a", "b"])
    assert kw == {"registry": "127.0.0.1:5000/x", "targets": ("a", "b")}


@pytest.mark.parametrize("argv, said", [
    (["report"], "neither was asked for"),
    (["report", "--html", " "], "--html is empty"),
    (["report", "--json", "--registry", "127.0.0.1:5000/UPPER"], "UPPER"),
])
def test_report_refuses_before_collecting(monkeypatch, capsys, argv, said):
    from imgbuild.cli.commands import report as report_cmd

    def no_collect(*a, **kw):
        raise AssertionError("collected")

    monkeypatch.setattr(report_cmd, "collect", no_collect)
    assert main(argv) == 2
    got = capsys.readouterr()
    assert said in got.err + got.out  # with --json, the error is the JSON document


# --- the stage's answer reaches the view and the exit code -----------------------------------

def test_check_deps_asks_for_the_check_and_exits_by_its_findings(monkeypatch, capsys):
    from imgbuild.cli.commands import check_deps as cd_cmd
    from imgbuild.pipeline.plan import PlanReport
    from imgbuild.plan.decide import make_plan

    asked: list[tuple] = []

    class Finding:
        def to_dict(self) -> dict:
            return {"symbol": "gone"}

    def plan_target(ws, target, **kw):
        asked.append((target, kw))
        plan = make_plan(ws, "tiny-cpu", resolve=False)
        return PlanReport(plan, (Finding(),) if kw.get("model") == "bad" else ())

    monkeypatch.setattr(cd_cmd, "plan_target", plan_target)
    assert main(["check-deps", "tiny-cpu"]) == 0
    assert asked == [("tiny-cpu", {"model": None, "checks": True})]
    assert capsys.readouterr().out.startswith("ok: tiny-cpu (")
    assert main(["check-deps", "tiny-cpu", "--model", "bad", "--json"]) == 1
    assert asked[-1] == ("tiny-cpu", {"model": "bad", "checks": True})
    import json

    doc = json.loads(capsys.readouterr().out)
    assert doc["ok"] is False and doc["findings"] == [{"symbol": "gone"}]


def test_base_reports_what_the_stage_made_and_exits_0(monkeypatch, capsys):
    import json

    from imgbuild.image import base as base_stage
    from imgbuild.image import digests

    res = base_stage.BaseResult(image="imgbuild-base:bookworm", image_id="sha256:1", built=True,
                                seconds=12.34, size_bytes=100, rootfs="sha256:2", pushed=())
    monkeypatch.setattr(base_stage, "bootstrap_base", lambda ws, name, **kw: res)
    assert main(["base", "bootstrap", "--json"]) == 0
    assert json.loads(capsys.readouterr().out) == {
        "image": "imgbuild-base:bookworm", "image_id": "sha256:1", "built": True,
        "seconds": 12.3, "size_bytes": 100, "rootfs": "sha256:2", "pushed": []}
    assert main(["base", "bootstrap"]) == 0
    assert capsys.readouterr().out.splitlines()[0] == "base debian-bookworm"
    monkeypatch.setattr(digests, "refresh_catalog", lambda ws, mirror: {"a:1": "sha256:3",
                                                                       "b:2": None})
    assert main(["base", "refresh-digests", "--json"]) == 0
    assert json.loads(capsys.readouterr().out) == {"digests": {"a:1": "sha256:3", "b:2": None}}
    assert main(["base", "refresh-digests"]) == 0
    assert "tag not found" in capsys.readouterr().out


def test_matrix_passes_its_flags_and_shows_the_document_in_the_format_asked(monkeypatch, capsys):
    import json

    from imgbuild.cli.commands import matrix as matrix_cmd

    asked: list[tuple] = []

    def document(ws, fmt, **kw):
        asked.append((fmt, kw))
        return {"include": [{"target": "tiny-cpu"}]}

    monkeypatch.setattr(matrix_cmd, "document", document)
    assert main(["matrix"]) == 0
    assert asked[-1] == ("json", {"changed_since": None, "repository": "imgbuild",
                                  "contexts": None})
    assert json.loads(capsys.readouterr().out) == {"include": [{"target": "tiny-cpu"}]}
    assert main(["matrix", "--format", "github", "--changed-since", "HEAD~1", "--registry",
                 "127.0.0.1:5000/acme/x", "--contexts", "ctx"]) == 0
    assert asked[-1] == ("github", {"changed_since": "HEAD~1",
                                    "repository": "127.0.0.1:5000/acme/x",
                                    "contexts": Path("ctx")})
    assert capsys.readouterr().out.count("\n") == 1  # github: one line, for GITHUB_OUTPUT


def test_patches_lists_or_checks_as_asked_and_exits_1_on_a_failure(monkeypatch, capsys):
    from imgbuild.checks import patches
    from imgbuild.cli.commands import patches as patches_cmd

    called: list[tuple] = []

    class Report:
        def __init__(self, failed: bool):
            self.failed = failed

    failing = {"value": False}

    def stand_in(kind):
        def f(ws, target):
            called.append((kind, target))
            return Report(failing["value"])
        return f

    monkeypatch.setattr(patches, "listing", stand_in("listing"))
    monkeypatch.setattr(patches, "check", stand_in("check"))
    monkeypatch.setattr(patches_cmd.views, "patches", lambda out, report: None)
    assert main(["patches", "sglang-blackwell"]) == 0
    assert main(["patches", "sglang-blackwell", "--check"]) == 0
    assert called == [("listing", "sglang-blackwell"), ("check", "sglang-blackwell")]
    failing["value"] = True
    assert main(["patches", "sglang-blackwell", "--check"]) == 1  # exit 1: a job failed


def test_init_passes_its_flags_to_the_project_plan(monkeypatch, tmp_path):
    from imgbuild.cli.commands import init as init_cmd
    from imgbuild.cli.parser import COMMANDS

    (builtin, where), kw = reach(monkeypatch, init_cmd, "plan_project",
                                 ["init", str(tmp_path / "p"), "--extends", "tiny-cpu",
                                  "--name", "mine", "--model", "org/m", "--tp", "4",
                                  "--size-gb", "12.5"])
    assert where == tmp_path / "p" and builtin is not None
    assert kw == {"extends": "tiny-cpu", "name": "mine", "model": "org/m", "tensor_parallel": 4,
                  "size_gb": 12.5, "reserved": frozenset(COMMANDS)}
    (_, where), kw = reach(monkeypatch, init_cmd, "plan_project", ["init"])
    assert where == Path(".") and kw["extends"] == "sglang-blackwell"
    assert (kw["name"], kw["model"], kw["tensor_parallel"], kw["size_gb"]) == (None, None, 1,
                                                                               None)


def test_init_without_a_built_in_catalog_says_to_reinstall(monkeypatch, capsys):
    import json

    from imgbuild.cli.commands import init as init_cmd

    monkeypatch.setattr(init_cmd, "builtin_catalog", lambda: None)
    assert main(["init", "--json"]) == 2
    doc = json.loads(capsys.readouterr().out)
    assert doc["message"] == "imgbuild has no built-in catalog to extend"
    assert doc["hint"] == "reinstall imgbuild from its wheel"


def test_check_model_with_an_image_asks_its_engine_about_the_local_checkpoint(monkeypatch,
                                                                            capsys, tmp_path):
    from types import SimpleNamespace

    from imgbuild.checks.checkmodel.report import Report
    from imgbuild.cli.commands import check_model as cm_cmd
    from imgbuild.image import schemes

    asked, shown = [], []
    report = Report("m", "tiny-cpu", None, SimpleNamespace(config_path=str(tmp_path / "c.json")),
                    ())
    monkeypatch.setattr(cm_cmd, "check_model", lambda ws, model, target, fix: report)
    monkeypatch.setattr(schemes, "image_engine", lambda image: (None, None, None, "tiny-cpu"))
    monkeypatch.setattr(schemes, "probe", lambda image, d: asked.append((image, d)) or {"ok": 1})
    monkeypatch.setattr(cm_cmd.views, "check_model", lambda out, r: shown.append(r))
    main(["check-model", "m", "--image", "img:1"])
    assert asked == [("img:1", tmp_path)]  # the checkpoint's directory, mounted in the image
    [r] = shown
    assert r.in_image == {"ok": 1} and r.image == "img:1" and r.source == "m"
    # Without --image, no image is asked anything and the report is shown as it is.
    shown.clear()
    main(["check-model", "m", "--target", "tiny-cpu"])
    assert shown == [report] and shown[0].in_image is None and len(asked) == 1
    # A hub id with --image: there is no local config.json to mount.
    monkeypatch.setattr(cm_cmd, "check_model", lambda ws, model, target, fix: Report(
        "org/m", "tiny-cpu", None, SimpleNamespace(config_path=None), ()))
    assert main(["check-model", "org/m", "--image", "img:1", "--json"]) == 2
    import json

    doc = json.loads(capsys.readouterr().out)
    assert doc["message"] == ("--image needs the checkpoint on this machine: org/m is not a "
                              "local directory")
    assert doc["hint"] == ("download its config.json and model.safetensors.index.json (no "
                           "weights) and pass that directory")


def test_check_model_refusal_without_a_target_says_how(capsys):
    import json

    assert main(["check-model", "m", "--json"]) == 2
    doc = json.loads(capsys.readouterr().out)
    assert doc["message"] == "check-model needs the target whose engine to check against"
    assert doc["hint"] == "pass --target TARGET (or --image IMAGE of an imgbuild image)"


@pytest.mark.parametrize("ok, code", [(True, 0), (False, 1)])
def test_smoke_shows_the_report_of_the_image_named_and_exits_by_it(monkeypatch, capsys,
                                                                  daemon_answers, ok, code):
    from imgbuild.image import smoke

    rep = smoke.SmokeReport("img:1", ok, ({"name": "import", "status": "pass",
                                           "duration_s": 1.5},), 1.5, {})
    monkeypatch.setattr(smoke, "run", lambda image, gpu: rep)
    assert main(["smoke", "img:1"]) == code
    said = capsys.readouterr().out.splitlines()
    assert said[0] == f"smoke img:1: {'passed' if ok else 'FAILED'}"
    assert said[2].split() == ["import", "pass", "1.50"]


def test_size_shows_the_top_packages_asked_for(monkeypatch, capsys, daemon_answers):
    from imgbuild.image import sizes

    rep = sizes.SizeReport("img:1", 3_000_000, 3, (("RUN pip install", 3_000_000),),
                           (("python", 3_000_000),),
                           tuple((f"pkg{i}", 1_000_000 - i) for i in range(3)), {}, ())
    monkeypatch.setattr(sizes, "measure", lambda image: rep)
    assert main(["size", "img:1", "--top", "2"]) == 0
    said = capsys.readouterr().out
    assert said.startswith("img:1: 3.0 MB in 3 files")
    assert "by package (top 2)" in said and "pkg1" in said and "pkg2" not in said


def test_version_names_the_built_in_catalog_it_carries(monkeypatch, capsys):
    import json

    from imgbuild.cli.commands import version as version_cmd
    from imgbuild.workspace import builtin_catalog

    b = builtin_catalog()
    assert main(["version", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["catalog"]["path"] == str(b.images.parent)
    assert doc["catalog"]["images"] == str(b.images)
    assert doc["catalog"]["lockfiles"] == str(b.lockfiles)
    assert doc["catalog"]["packaged"] is b.packaged
    assert doc["catalog"]["digest"] == b.digest()
    monkeypatch.setattr(version_cmd, "builtin_catalog", lambda: None)
    assert main(["version", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["catalog"] is None


def test_pull_passes_its_flags_and_shows_the_outcome(monkeypatch, capsys):
    import json

    from imgbuild.cli.commands import pull as pull_cmd

    asked, shown = [], []

    def pull_target(ws, target, **kw):
        asked.append((ws is not None, target, {k: v for k, v in kw.items() if k != "progress"},
                      kw["progress"] is not None))
        return "outcome"

    monkeypatch.setattr(pull_cmd, "pull_target", pull_target)
    monkeypatch.setattr(pull_cmd.views, "pull", lambda out, o: shown.append((out.json, o)))
    assert main(["pull", "tiny-cpu", "--registry", "127.0.0.1:5000/a/b", "--arch", "B200",
                 "--platform", "arm64", "--json"]) == 0
    assert asked == [(True, "tiny-cpu", {"model": None, "registry_name": "127.0.0.1:5000/a/b",
                                         "archs": ("sm100",), "flavor": None,
                                         "platform": "linux/arm64"}, True)]
    assert shown == [(True, "outcome")]
    assert main(["pull", "tiny-cpu", "--registry", "127.0.0.1:5000/a/b", "--platform",
                 "arm64,amd64", "--json"]) == 2
    doc = json.loads(capsys.readouterr().out)
    assert doc["message"] == "pull takes one --platform"
    assert doc["facts"] == ["asked for linux/arm64, linux/amd64"]
    assert doc["hint"] == "the Engine holds one image per tag: pull each platform on its own"


def test_report_writes_the_page_or_the_json_it_was_asked_for(monkeypatch, capsys, tmp_path):
    import json

    from imgbuild.cli.commands import report as report_cmd

    class Report:
        targets, gpus = ("a", "b"), ("B200",)

        def to_dict(self) -> dict:
            return {"targets": 2}

    asked, wrote = [], []
    monkeypatch.setattr(report_cmd, "collect", lambda ws, registry, targets: asked.append(
        (ws is not None, registry, targets)) or Report())
    monkeypatch.setattr(report_cmd.report_html, "write", lambda rep, d: wrote.append(d) or
                        tmp_path / "out" / "index.html" if isinstance(rep, Report) else None)
    assert main(["report", "--html", "out", "--registry", "127.0.0.1:5000/a/b", "a"]) == 0
    assert asked == [(True, "127.0.0.1:5000/a/b", ("a",))] and wrote == ["out"]
    assert capsys.readouterr().out == f"wrote {tmp_path / 'out' / 'index.html'} (2 targets x 1 " \
                                      "GPUs)\n"
    assert main(["report", "--json"]) == 0
    assert asked[-1] == (True, None, None) and len(wrote) == 1  # no page asked: none written
    assert json.loads(capsys.readouterr().out) == {"targets": 2}
    assert main(["report", "--json", "--html", "out"]) == 0
    assert json.loads(capsys.readouterr().out) == {"targets": 2,
                                                   "html": str(tmp_path / "out" / "index.html")}
    assert main(["report", "--json", "--html", " "]) == 2
    doc = json.loads(capsys.readouterr().out)
    assert (doc["message"], doc["hint"]) == ("--html is empty", "name the directory for "
                                                                "index.html")
    assert main(["report"]) == 2
    assert "pass --html DIR (writes DIR/index.html) or --json" in capsys.readouterr().err


def test_smoke_model_shows_what_it_made_and_exits_0(monkeypatch, capsys):
    import json

    from imgbuild.cli.commands import smoke_model as sm_cmd

    doc = {"model": "tiny", "path": "/c/tiny", "key": "sha256:k", "files": 3, "bytes": 2_500_000,
           "versions": {"torch": "2.13.0"}, "pushed": None}
    seen = []
    monkeypatch.setattr(sm_cmd, "smoke_model_for", lambda ws, alias, **kw: seen.append(
        (ws is not None, alias, kw["progress"] is not None)) or doc)
    assert main(["smoke-model", "tiny", "--json"]) == 0
    assert json.loads(capsys.readouterr().out) == doc and seen == [(True, "tiny", True)]
    assert main(["smoke-model", "tiny"]) == 0
    said = capsys.readouterr().out
    assert said.splitlines()[0] == "smoke model tiny" and "3 (2.50 MB)" in said
    assert "torch 2.13.0" in said


def test_a_named_rdma_resource_is_the_clusters(monkeypatch):
    got = run_kwargs(monkeypatch, "--emit", "k8s", "out", "--rdma", "--rdma-resource",
                     "nvidia.com/roce")["cluster"]
    assert got.rdma.resource == "nvidia.com/roce"


def test_run_says_the_endpoint_the_moment_the_server_answers(monkeypatch, capsys):
    from imgbuild.pipeline.run import RunReport
    from imgbuild.plan.launch import Launch

    launch = Launch(image="i", engine="transformers", name="imgbuild-tiny", command=(),
                    port=8000, host_port=8001, health_path="/health", models_path="/v1/models",
                    ready_paths=(), env=(), gpus=None, ipc_host=False, shm_size=None,
                    ulimits=(), volumes=(), phases=(), model="/m/tiny")

    def run_model(ws, subject, **kw):
        report = RunReport("tiny-cpu", None, launch, "ready", seconds=3)
        kw["on_ready"](report)  # what the stage calls once the server answers
        return report

    monkeypatch.setattr(run_cmd, "run_model", run_model)
    assert main(["run", "tiny-cpu"]) == 0
    said = capsys.readouterr().out
    assert said.splitlines()[0] == "tiny-cpu is serving"
    assert "http://127.0.0.1:8001" in said


def test_stages_get_a_progress_display_and_their_workspace(monkeypatch):
    from imgbuild.checks import patches
    from imgbuild.cli.commands import check_model as cm_cmd
    from imgbuild.cli.commands import index as index_cmd
    from imgbuild.image import base as base_stage
    from imgbuild.image import digests

    _, kw = reach(monkeypatch, base_stage, "bootstrap_base", ["base", "bootstrap"])
    assert kw["progress"] is not None
    (ws,), _ = reach(monkeypatch, digests, "refresh_catalog", ["base", "refresh-digests"])
    assert ws is not None and ws.catalog is not None
    (ws, _, _, _), _ = reach(monkeypatch, cm_cmd, "check_model",
                             ["check-model", "m", "--target", "tiny-cpu"])
    assert ws is not None and ws.catalog is not None
    (ws, _), _ = reach(monkeypatch, patches, "check", ["patches", "tiny-cpu", "--check"])
    assert ws is not None and ws.catalog is not None
    monkeypatch.setattr(index_cmd.registry, "check_reachable", lambda r: None)
    _, kw = reach(monkeypatch, index_cmd, "assemble", ["index", "tiny-cpu-multi", "--registry",
                                                        "127.0.0.1:5000/a/b"])
    assert kw["progress"] is not None
