"""What a smoke run decides (image/smoke.py), without an Engine: the container's flags (no
network, any user on a read-only root, or root where the image's label says so; a GPU where
the host has the runtime), the report it reads from the payload, the any-user stage (the smoke
check itself is the root run's and is left out; one failing check fails the stage and is
named; a root-only image is skipped, saying as whom the smoke test ran), the failure it names
when there is no report, and which kept report is reused.

The docker client's answers are recordings of real runs (tests/data/smoke/)."""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

import pytest

from imgbuild.errors import InputError
from imgbuild.image import smoke


def test_the_any_user_stage_fails_on_any_check_and_names_it():
    doc = {"checks": [{"name": "smoke", "status": "fail", "reason": "root's"},
                      {"name": "tmp-exec", "status": "pass", "reason": ""},
                      {"name": "cache-writable", "status": "fail", "reason": "read-only /root"},
                      {"name": "versions", "status": "skipped", "reason": "no lock"}]}
    got = smoke._any_user_stage(doc)
    assert got["name"] == smoke.ANY_USER_STAGE and got["status"] == "fail"
    assert [c["name"] for c in got["checks"]] == ["tmp-exec", "cache-writable", "versions"]
    assert "cache-writable: read-only /root" in got["reason"]
    assert "versions: no lock" in got["reason"] and "tmp-exec" not in got["reason"]
    ok = smoke._any_user_stage({"checks": [{"name": "smoke", "status": "fail"},
                                           {"name": "a", "status": "pass"},
                                           {"name": "b", "status": "pass"}]})
    assert ok["status"] == "pass" and ok["reason"].endswith("2 checks passed")


def test_a_root_only_image_skips_the_stage_saying_who_ran():
    got = smoke._root_only_stage("x" * 1000, {"uid": 0, "gid": 0})
    assert got["status"] == "skipped" and got["checks"] == []
    assert "ran as uid 0 gid 0" in got["reason"] and "x" * 601 not in got["reason"]
    assert "uid ? gid ?" in smoke._root_only_stage("why", {})["reason"]


# --- a smoke run, replayed --------------------------------------------------------------------
# The docker client's answers are recorded from real runs (tests/data/smoke/record.py: the
# payload in a tiny-cpu image as any user; a broken image whose label says root only, as root;
# an image with no python). What smoke.run decides on them (the container's flags, the
# report, the any-user stage, the failure it names) is tested here without an Engine.

DATA = Path(__file__).parent / "data" / "smoke"
INSPECT_FORMAT = ('{{.Id}}\t{{index .Config.Labels "io.imgbuild.engine"}}\t'
                  '{{index .Config.Labels "io.imgbuild.user"}}')


def recording(name: str) -> dict:
    return json.loads((DATA / f"{name}.json").read_text())


class Engine:
    """The seam smoke.run talks through: the docker client's `image inspect` and `info`, the
    payload's container (answered with a recording), and whether nvidia-smi is on PATH."""

    def __init__(self, monkeypatch, rec: dict | None, *, gpu_runtime: bool = False,
                 timeout: bool = False, image_here: bool = True):
        self.rec, self.containers, self.asked = rec, [], []
        labels = (rec or {}).get("image_labels") or {}
        self.inspect = (f"{(rec or {}).get('image_id', 'sha256:x')}\t"
                        f"{labels.get('io.imgbuild.engine', '')}\t"
                        f"{labels.get('io.imgbuild.user', '')}\n")
        self.gpu_runtime, self.timeout, self.image_here = gpu_runtime, timeout, image_here
        monkeypatch.setattr(smoke, "run_cli", self.run_cli)
        monkeypatch.setattr(smoke, "run_container", self.run_container)
        monkeypatch.setattr(smoke.shutil, "which",
                            lambda name: "/usr/bin/nvidia-smi" if gpu_runtime else None)

    def run_cli(self, args: list[str], **kw) -> subprocess.CompletedProcess:
        self.asked.append(args)
        assert kw == {"capture_output": True, "text": True}
        if args[:2] == ["image", "inspect"]:
            assert args[2:] == ["--format", INSPECT_FORMAT, args[-1]]
            return subprocess.CompletedProcess(args, 0 if self.image_here else 1,
                                               self.inspect if self.image_here else "",
                                               "" if self.image_here else "No such image")
        assert args == ["info", "--format", "{{json .Runtimes}}"]
        runtimes = {"runc": {"path": "runc"}} | ({"nvidia": {"path": "nvidia-container-runtime"}}
                                                 if self.gpu_runtime else {})
        return subprocess.CompletedProcess(args, 0, json.dumps(runtimes) + "\n", "")

    def run_container(self, prefix: str, args: list[str], **kw) -> subprocess.CompletedProcess:
        self.containers.append(args)
        assert prefix == "imgbuild-smoke"
        assert kw["capture_output"] is True and kw["text"] is True
        if self.timeout:
            raise subprocess.TimeoutExpired(args, kw["timeout"])
        return subprocess.CompletedProcess(args, self.rec["returncode"], self.rec["stdout"],
                                           self.rec["stderr"])


@pytest.fixture()
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("IMGBUILD_CACHE", str(tmp_path / "cache"))
    return tmp_path / "cache"


def _image(rec: dict) -> str:
    # the image the recording ran: the argument before the container's command
    return rec["args"][rec["args"].index("python") - 1]


def test_a_passing_run_reports_the_payloads_stages_then_the_any_user_stage(monkeypatch, cache):
    rec = recording("tiny-cpu-any-user")
    engine = Engine(monkeypatch, rec)
    report = smoke.run(_image(rec))
    # the container ran exactly as recorded: no network, as any user on a read-only root,
    # the entrypoint's host check off, the payload told the engine the image's label names
    assert engine.containers == [rec["args"]]
    assert engine.asked == [["image", "inspect", "--format", INSPECT_FORMAT, _image(rec)]]
    assert report.ok and report.image == _image(rec) and report.image_id == rec["image_id"]
    assert [s["name"] for s in report.stages] == [
        "environment", "patches", "kernels", "toolchain", "checkpoint-cpu", "engine-schemes",
        "gpu-engine", smoke.ANY_USER_STAGE]
    any_user = report.stages[-1]
    assert any_user["status"] == "pass"
    assert any_user["reason"] == "as 1000770000:0 on a read-only root: 15 checks passed"
    assert report.raw["stages"] == list(report.stages) and report.raw["ok"] is True
    assert report.reused is None
    # kept by its image ID for the next build of the same bytes
    assert smoke.recall(_image(rec), rec["image_id"]).stages == report.stages


def test_a_root_only_image_runs_as_root_and_its_failure_is_the_reports(monkeypatch, cache):
    rec = recording("root-only-broken")
    engine = Engine(monkeypatch, rec)
    report = smoke.run(_image(rec))
    [args] = engine.containers
    assert args == rec["args"] and "--user" not in args and "--read-only" not in args
    assert not report.ok
    stages = {s["name"]: s for s in report.stages}
    assert stages["checkpoint-cpu"]["status"] == "fail"
    assert stages[smoke.ANY_USER_STAGE]["status"] == "skipped"
    assert stages[smoke.ANY_USER_STAGE]["reason"] == (
        "skipped: the image runs as root only (the engine writes its kernels beside its own "
        "modules); the smoke test ran as uid 0 gid 0")
    # a failed report is kept for the record, and never reused
    assert smoke.recall(_image(rec), rec["image_id"]) is None
    assert json.loads(smoke._cache_file(rec["image_id"]).read_text())["ok"] is False


def test_a_container_that_prints_no_report_fails_with_the_clients_words(monkeypatch, cache):
    rec = recording("no-python")
    Engine(monkeypatch, rec)
    report = smoke.run(_image(rec))
    assert not report.ok and report.image_id is None
    [stage] = report.stages
    assert stage["name"] == "payload" and stage["status"] == "fail"
    assert stage["reason"] == ("the payload printed no report (as 1000770000:0): "
                               + rec["stderr"].strip())
    assert report.raw == {"stages": [stage]}


def test_a_payload_that_runs_past_its_time_is_a_failure_that_says_so(monkeypatch, cache):
    rec = recording("tiny-cpu-any-user")
    Engine(monkeypatch, rec, timeout=True)
    report = smoke.run(_image(rec), timeout=42)
    assert [s["reason"] for s in report.stages] == ["timed out after 42 s"]


def test_an_image_that_is_not_here_is_refused_before_any_container(monkeypatch, cache):
    engine = Engine(monkeypatch, None, image_here=False)
    with pytest.raises(InputError) as e:
        smoke.run("acme:missing")
    assert str(e.value.message) == "image acme:missing is not here"
    assert e.value.hint == "build or pull it first" and engine.containers == []


@pytest.mark.parametrize("gpu, runtime, gets_gpus", [
    ("auto", True, True), ("require", True, True),
    ("auto", False, False),  # no driver on PATH: the Engine is not even asked
    ("off", True, False),
])
def test_a_gpu_is_given_where_the_host_has_the_runtime_and_it_is_not_off(monkeypatch, cache,
                                                                          gpu, runtime,
                                                                          gets_gpus):
    rec = recording("tiny-cpu-any-user")
    engine = Engine(monkeypatch, rec, gpu_runtime=runtime)
    smoke.run(_image(rec), gpu=gpu, env={"B": "2", "A": "1"})
    [args] = engine.containers
    assert (args[2:4] == ["--gpus", "all"]) is gets_gpus
    assert args[args.index("--gpu") + 1] == gpu  # the payload is told the same
    # the user's environment, in a stable order, before the entrypoint's switch
    i = args.index("IMGBUILD_PREFLIGHT=0")
    assert args[i - 5:i - 1] == ["-e", "A=1", "-e", "B=2"]
    assert (["info", "--format", "{{json .Runtimes}}"] in engine.asked) is (
        runtime and gpu != "off")


def test_a_gpu_runtime_needs_both_the_driver_and_the_engines_nvidia_runtime(monkeypatch):
    Engine(monkeypatch, None, gpu_runtime=True)
    assert smoke.host_has_gpu_runtime() is True
    monkeypatch.setattr(smoke, "run_cli", lambda args, **kw: subprocess.CompletedProcess(
        args, 0, '{"runc":{"path":"runc"}}\n', ""))
    assert smoke.host_has_gpu_runtime() is False


def test_a_report_without_stages_is_a_failure_with_the_payloads_error(monkeypatch, cache):
    rec = recording("tiny-cpu-any-user") | {
        "stdout": json.dumps({"ok": False, "checks": [],
                              "smoke": {"error": "x" * 2000 + "the end"}})}
    Engine(monkeypatch, rec)
    [stage] = smoke.run(_image(rec)).stages
    assert stage["reason"].startswith("the payload printed no report: x")
    assert stage["reason"].endswith("the end") and len(stage["reason"]) == len(
        "the payload printed no report: ") + 1500


def test_the_any_user_stage_alone_fails_when_the_payload_failed_as_that_user(monkeypatch):
    rec = recording("tiny-cpu-any-user")
    doc = json.loads(rec["stdout"][rec["stdout"].rindex('{"ok"'):])
    doc["smoke"]["ok"] = False
    Engine(monkeypatch, rec | {"stdout": json.dumps(doc)})
    stage = smoke.any_user(_image(rec), "transformers", ["--gpu", "off"])
    assert stage["status"] == "fail"
    assert stage["reason"] == ("as 1000770000:0 on a read-only root: 15 checks passed; the smoke "
                               "payload failed as this user")
    Engine(monkeypatch, rec)
    assert smoke.any_user(_image(rec), "transformers", ["--gpu", "off"])["status"] == "pass"
    Engine(monkeypatch, recording("no-python"))
    failed = smoke.any_user("imgbuild-test-nopy:1", None, [])
    assert failed["status"] == "fail" and failed["checks"] == []
    assert failed["reason"].startswith("the payload printed no report (as 1000770000:0)")


# --- what is kept, and what is reused ---------------------------------------------------------

def test_the_report_as_json_says_each_field():
    r = smoke.SmokeReport("r:t", True, ({"name": "a"},), 1.23456, {}, "sha256:x", "registry")
    assert r.to_dict() == {"image": "r:t", "ok": True, "seconds": 1.23,
                           "stages": [{"name": "a"}], "reused": "registry"}


def test_a_kept_report_is_one_file_per_image_id_saying_when_it_ran(cache):
    r = smoke.SmokeReport("r:t", True, ({"name": "a", "status": "pass"},), 2.5,
                          {"ok": True, "x": 1}, "sha256:abc")
    smoke.remember(r)
    path = cache / "smoke" / "sha256-abc.json"
    assert smoke._cache_file("sha256:abc") == path
    text = path.read_text()
    assert text.startswith('{\n "format": 1,\n "image_id": "sha256:abc",')  # indent 1
    doc = json.loads(text)
    assert doc["seconds"] == 2.5 and doc["raw"] == {"ok": True, "x": 1}
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\+00:00", doc["ran_at"])
    got = smoke.recall("r:t", "sha256:abc")
    assert got.reused == f"local cache, run {doc['ran_at']}"
    assert (got.image, got.image_id, got.raw) == ("r:t", "sha256:abc", {"ok": True, "x": 1})
    doc.pop("ran_at")
    path.write_text(json.dumps(doc))
    assert smoke.recall("r:t", "sha256:abc").reused == "local cache, run ?"


@pytest.mark.parametrize("status", ["skip", "skipped"])
def test_a_report_whose_gpu_stage_skipped_is_not_reused_where_a_gpu_is(monkeypatch, status):
    doc = {"ok": True, "stages": [{"name": smoke.GPU_STAGE, "status": status}]}
    monkeypatch.setattr(smoke, "host_has_gpu_runtime", lambda: True)
    assert smoke.reusable("r:t", "sha256:x", doc, "registry") is None
    monkeypatch.setattr(smoke, "host_has_gpu_runtime", lambda: False)
    got = smoke.reusable("r:t", "sha256:x", doc, "registry")
    # a report with no raw part is its own raw
    assert got.raw == doc and got.stages == tuple(doc["stages"])


def test_a_report_with_no_gpu_stage_is_reused_anywhere(monkeypatch):
    monkeypatch.setattr(smoke, "host_has_gpu_runtime", lambda: True)
    doc = {"ok": True, "stages": [{"name": "environment", "status": "pass"}], "raw": {"r": 1}}
    got = smoke.reusable("r:t", "sha256:x", doc, "registry")
    assert got is not None and got.raw == {"r": 1} and got.reused == "registry"


def test_the_any_user_stage_joins_its_failures_and_bounds_its_reason():
    failed = [{"name": f"c{i}", "status": "fail", "reason": "r" * 40} for i in range(60)]
    got = smoke._any_user_stage({"checks": failed})
    assert got["reason"].startswith(f"as {smoke.ANY_USER} on a read-only root: c0: {'r' * 40}; c1:")
    assert len(got["reason"]) == 1500
    assert smoke._any_user_stage({})["reason"].endswith("0 checks passed")
    assert smoke._root_only_stage("why", {})["name"] == smoke.ANY_USER_STAGE
