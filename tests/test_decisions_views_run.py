"""What `imgbuild run` says (cli/views/run.py) and how a model's quantization is shown
(cli/views/models.py): a RunReport or a ModelProfile in, the text a user reads out. Plain data,
no Engine: the run itself is tests/test_run.py."""

from __future__ import annotations

import json

import pytest

from imgbuild.catalog.models import ModelProfile
from imgbuild.checks.doctor import Diagnosis, Evidence
from imgbuild.cli.console import make_output
from imgbuild.cli.views import models as model_views
from imgbuild.cli.views import run as run_views
from imgbuild.pipeline.run import RunReport
from imgbuild.plan.launch import Launch


def _launch(**kw) -> Launch:
    base = dict(image="imgbuild:abc", engine="sglang", name="imgbuild-k2.6", command=("serve",),
                port=30000, host_port=30001, health_path="/health", models_path="/v1/models",
                ready_paths=("/health",), env=(("A", "1"),), gpus="all", ipc_host=True,
                shm_size=None, ulimits=(), volumes=(), phases=(), model="/models/k2.6")
    base.update(kw)
    return Launch(**base)


def _report(status: str, **kw) -> RunReport:
    return RunReport("k2.6-target", "k2.6", kw.pop("launch", _launch()), status, **kw)


def _said(capsys, fn, report: RunReport, as_json: bool = False) -> str:
    fn(make_output(as_json), report)
    return capsys.readouterr().out


# -- the moment the server answers ------------------------------------------------------------

@pytest.mark.parametrize("served, kept", [(None, False), ("k2.6-served", True)])
def test_ready_names_the_endpoint_the_model_and_a_request_to_paste(capsys, served, kept):
    said = _said(capsys, run_views.ready, _report("ready", served=served, kept=kept,
                                                 seconds=12.5))
    rows = said.splitlines()
    assert rows[0] == "k2.6-target is serving"
    row = {r.split()[0]: r.split(None, 1)[1] for r in rows[1:] if r.strip()}
    model = served or "/models/k2.6"  # the id the server answers to, else what it loads
    assert row["endpoint"] == "http://127.0.0.1:30001"  # the host port, not the container's
    assert row["model"] == model
    assert row["container"] == "imgbuild-k2.6" + (
        "" if kept else "  (removed when this run ends: Ctrl-C)")
    assert "ready after  12.5 s" in rows  # the key is two words: the column is 11 wide
    curl = row["try"]
    assert curl.startswith("curl -s http://127.0.0.1:30001/v1/completions -H "
                           "'Content-Type: application/json' -d '")
    body = json.loads(curl.split(" -d '", 1)[1].rstrip("'"))
    assert body == {"model": model, "prompt": "The capital of France is", "max_tokens": 16}


def test_ready_says_nothing_under_json(capsys):
    # --json: the report at the end is the one document on stdout.
    assert _said(capsys, run_views.ready, _report("ready"), as_json=True) == ""


# -- the report at the end --------------------------------------------------------------------

def test_the_report_under_json_is_the_run_reports_dict(capsys):
    r = _report("timeout", seconds=30)
    assert json.loads(_said(capsys, run_views.report, r, as_json=True)) == r.to_dict()


def test_a_dry_run_is_the_docker_run_line_alone_unwrapped_and_unescaped(capsys):
    launch = _launch(env=(("MARKUP", "[bold]x[/]"),) + tuple((f"V{i}", "y" * 20)
                                                             for i in range(8)))
    said = _said(capsys, run_views.report, _report("dry-run", launch=launch))
    assert said == launch.dry_run_line() + "\n"  # one line, rich markup taken literally


def test_emitted_files_are_listed(capsys):
    said = _said(capsys, run_views.report, _report("emitted", files=("a/compose.yaml",
                                                                     "a/k8s.yaml")))
    assert said.splitlines() == ["wrote a/compose.yaml", "wrote a/k8s.yaml"]


@pytest.mark.parametrize("status, code, kept, line", [
    ("ready", None, False, None),
    ("stopped", 0, False, "k2.6-target: the server stopped (exit 0); container removed"),
    ("stopped", 143, True, "k2.6-target: the server stopped (exit 143); container kept"),
])
def test_a_run_that_served_ends_in_one_line_or_none(capsys, status, code, kept, line):
    said = _said(capsys, run_views.report, _report(status, container_exit=code, kept=kept))
    assert said.splitlines() == ([line] if line else [])


def _diagnosis() -> Diagnosis:
    return Diagnosis(id="cuda-oom", title="CUDA out of memory", severity="error",
                     cause="the weights do not fit", fix="use more GPUs",
                     evidence=(Evidence(line=3, text="torch.OutOfMemoryError"),))


@pytest.mark.parametrize("status, kept, head", [
    ("timeout", False, "k2.6-target: the server never answered on /health within 30 s "
                       "(container removed)"),
    ("exited", True, "k2.6-target: the server exited with code 1 after 30 s"),
])
def test_a_server_that_never_served_says_why_with_its_log_and_the_doctor(capsys, status, kept,
                                                                         head):
    tail = tuple(f"log line {i}" for i in range(20))
    said = _said(capsys, run_views.report, _report(
        status, seconds=30, container_exit=1, kept=kept, log_tail=tail,
        diagnoses=(_diagnosis(),)))
    rows = said.splitlines()
    assert rows[0] == head
    # The last 15 lines of the log, indented under their header; the 5 before them left out.
    at = rows.index("last lines of its log:")
    assert rows[at + 1:at + 16] == [f"  log line {i}" for i in range(5, 20)]
    assert "log line 4" not in said
    # Then the doctor's reading of that log.
    assert "CUDA out of memory" in said and "use more GPUs" in said
    assert "the log of imgbuild-k2.6" in said


def test_no_log_no_log_header(capsys):
    said = _said(capsys, run_views.report, _report("exited", container_exit=2))
    assert said.splitlines()[0] == "k2.6-target: the server exited with code 2 after 0 s " \
                                   "(container removed)"
    assert "last lines of its log" not in said


# -- a model's quantization in list and plan --------------------------------------------------

def _profile(**kw) -> ModelProfile:
    base = dict(alias="m", path="org/m", name="M", checkpoint="org/m", size_gb=1.0,
                quant_method="compressed-tensors", quant_formats=("nvfp4-pack-quantized",),
                quant_summary="NVFP4 weights and activations", tensor_parallel=1,
                activations="fp4")
    base.update(kw)
    return ModelProfile(**base)


def test_a_declared_quantization_is_shown_as_declared():
    m = _profile()
    assert model_views.quantization(m) == {
        "method": "compressed-tensors", "formats": ["nvfp4-pack-quantized"],
        "activations": "fp4", "summary": "NVFP4 weights and activations",
        "from_checkpoint": False}
    assert model_views.quantization_cell(m) == "NVFP4 weights and activations"
    # Declared and empty: nothing to say, and no claim that config.json says it.
    assert model_views.quantization_cell(_profile(quant_summary="")) == ""
    assert model_views.quantization(_profile(quant_summary=""))["summary"] == ""


def test_a_quantization_left_to_the_checkpoint_says_so_until_it_is_read():
    unread = _profile(quant_method=None, quant_formats=(), quant_summary="", activations=None,
                      quant_from_checkpoint=True)
    assert model_views.quantization(unread) == {
        "method": None, "formats": [], "activations": None,
        "summary": model_views.FROM_CONFIG, "from_checkpoint": True}
    assert model_views.quantization_cell(unread) == "from config.json"
    read = _profile(quant_from_checkpoint=True)  # resolved: config.json's own words
    assert model_views.quantization(read)["summary"] == "NVFP4 weights and activations"
    assert model_views.quantization(read)["from_checkpoint"] is True
    assert model_views.quantization_cell(read) == "NVFP4 weights and activations"
