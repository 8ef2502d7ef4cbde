"""`imgbuild check-model --image`: asking an image's own engine how it loads each layer
(image/schemes.py probe), with the Engine's side scripted: the image's labels, and the
container the engine runs in. Decided and tested: only an SGLang or vLLM image with GPU archs
is asked; the container has no network, the entrypoint's host check off, the checkpoint
read-only, each arch named; a silent, slow or older image is said so. What the engine answers
is tests/test_engine_schemes.py's."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from imgbuild.errors import InputError, JobFailed
from imgbuild.image import schemes

LABELS = {"io.imgbuild.engine": "sglang==0.5.16", "io.imgbuild.archs": "sm100,sm120",
          "io.imgbuild.target": "sglang-blackwell"}


@pytest.fixture()
def engine(monkeypatch):
    e = {"labels": dict(LABELS), "runs": [], "answer": (0, '{"ok": true, "modules": []}', "")}
    monkeypatch.setattr(schemes, "image_labels", lambda image: e["labels"])

    def run(prefix, args, **kw):
        e["runs"].append((prefix, args, kw))
        if isinstance(e["answer"], Exception):
            raise e["answer"]
        rc, out, err = e["answer"]
        return subprocess.CompletedProcess(args, rc, out, err)
    monkeypatch.setattr(schemes, "run_container", run)
    return e


def test_the_engine_is_asked_in_a_closed_container_for_each_arch(engine, tmp_path):
    got = schemes.probe("reg/img:t", tmp_path / "ckpt", timeout=60)
    assert got == {"ok": True, "modules": []}
    [(prefix, args, kw)] = engine["runs"]
    assert prefix == "imgbuild-schemes" and kw["timeout"] == 60
    assert args == ["--network", "none", "-e", "IMGBUILD_PREFLIGHT=0", "--entrypoint", "python",
                    "-v", f"{(tmp_path / 'ckpt').resolve()}:{schemes.MOUNT}:ro", "reg/img:t",
                    "/opt/imgbuild/engine_schemes.py", "--model", schemes.MOUNT,
                    "--engine", "sglang", "--arch", "sm100", "--arch", "sm120", "--json"]


def test_log_lines_before_the_report_are_skipped(engine):
    engine["answer"] = (0, 'INFO loading\nWARNING x\n{"ok": false}\n', "")
    assert schemes.probe("reg/img:t", Path("c")) == {"ok": False}


@pytest.mark.parametrize("labels, said", [
    ({"io.imgbuild.engine": "transformers==5.17.0", "io.imgbuild.archs": "cpu"},
     "image reg/img:t has no serving engine to ask (io.imgbuild.engine: transformers)"),
    ({"io.imgbuild.archs": "sm100"},
     "image reg/img:t has no serving engine to ask (io.imgbuild.engine: none)"),
    ({"io.imgbuild.engine": "vllm==0.11.0", "io.imgbuild.archs": "cpu"},
     "image reg/img:t names no GPU arch (io.imgbuild.archs)"),
    ({}, "the image has no io.imgbuild.archs label: it was not built by imgbuild, so there is "
         "nothing to check it against"),
])
def test_an_image_without_a_serving_engine_or_a_gpu_arch_is_not_asked(engine, labels, said):
    engine["labels"] = labels
    with pytest.raises(InputError) as e:
        schemes.probe("reg/img:t", Path("c"))
    assert e.value.message == said and engine["runs"] == []


def test_an_engine_that_does_not_answer_in_time_is_said_so(engine):
    engine["answer"] = subprocess.TimeoutExpired(["docker"], 30)
    with pytest.raises(JobFailed) as e:
        schemes.probe("reg/img:t", Path("c"), timeout=30)
    assert e.value.message == "the engine in reg/img:t did not answer in 30 s"


def test_an_image_built_before_the_probe_existed_is_to_be_rebuilt(engine):
    engine["answer"] = (2, "", "python: can't open file '/opt/imgbuild/engine_schemes.py': "
                               "[Errno 2] No such file or directory")
    with pytest.raises(InputError) as e:
        schemes.probe("reg/img:t", Path("c"))
    assert "carries no engine_schemes.py" in e.value.message
    assert e.value.hint == "rebuild it (`imgbuild TARGET --rebuild`)"


def test_an_engine_that_printed_no_report_is_said_with_its_last_lines(engine):
    engine["answer"] = (1, "\n".join(f"line {n}" for n in range(20)), "Traceback: boom")
    with pytest.raises(JobFailed) as e:
        schemes.probe("reg/img:t", Path("c"))
    assert e.value.message == "the engine in reg/img:t printed no report"
    assert e.value.facts == [f"line {n}" for n in range(12, 19)] + ["line 19Traceback: boom"]
    engine["answer"] = (1, "", "")
    with pytest.raises(JobFailed) as e:
        schemes.probe("reg/img:t", Path("c"))
    assert e.value.facts == ["(no output)"]


def test_another_missing_file_is_no_sign_of_an_older_image(engine):
    engine["answer"] = (1, "", "FileNotFoundError: [Errno 2] No such file or directory: "
                               "'/imgbuild-checkpoint/config.json'")
    with pytest.raises(JobFailed) as e:
        schemes.probe("reg/img:t", Path("c"))
    assert e.value.message == "the engine in reg/img:t printed no report"
