"""doctor knows which engine wrote a log, and answers a sentence by that engine's cause.

The logs here are written for the tests, in the shapes the engines print (prefixes from
images/checks/failures.yaml's sources); the sentences are the engines' own.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from imgbuild.catalog.failures import load_failures
from imgbuild.checks import doctor

from .conftest import ROOT

FAILURES = load_failures(ROOT / "images")
NO_SCHEME = "NotImplementedError: No compressed-tensors compatible scheme was found."
SGL_FRAME = ('  File "/opt/venv/lib/python3.12/site-packages/sglang/srt/layers/quantization/'
             'compressed_tensors/compressed_tensors.py", line 663, in _get_scheme_from_parts')
VLLM_FRAME = ('  File "/usr/local/lib/python3.12/dist-packages/vllm/model_executor/layers/'
              'quantization/compressed_tensors/compressed_tensors.py", line 538, in '
              '_get_scheme_from_parts')


def run(text: str, **kw) -> tuple[list[doctor.Diagnosis], doctor.LogEngine | None]:
    found: list = []
    diags = doctor.diagnose(text, FAILURES, found, **kw)
    return diags, found[0]


def ids(diags) -> list[tuple[str, bool]]:
    return [(d.id, d.certain) for d in diags]


# --- which engine -----------------------------------------------------------------------------

def test_the_engine_and_version_come_from_the_log():
    _, e = run("INFO 06-19 09:50:02 [api_server.py:1287] vLLM API server version 0.9.1\n")
    assert (e.name, e.title, e.version, e.evidence.line) == ("vllm", "vLLM", "0.9.1", 1)
    _, e = run("INFO 12-05 20:24:02 llm_engine.py:249] Initializing an LLM engine "
               "(v0.6.4.post1) with config: model='m'\n")
    assert (e.name, e.version) == ("vllm", "0.6.4.post1")
    _, e = run("sglang==0.5.16\n" + SGL_FRAME + "\n")
    assert (e.name, e.version) == ("sglang", "0.5.16")
    _, e = run("[2026-01-01 00:00:00 TP0] Load weight begin.\n")  # SGLang's prefix alone
    assert (e.name, e.version, e.evidence.line) == ("sglang", None, 0)
    assert e.where == "SGLang's log line prefix"
    # The prefix (2) outweighs one frame (1) of the other engine's package.
    _, e = run("[2026-01-01 00:00:00 TP0] Load weight begin.\n" + VLLM_FRAME + "\n")
    assert e.name == "sglang"
    assert run("RuntimeError: something\n")[1] is None


def test_an_engine_that_imports_the_other_is_still_itself():
    # Older SGLang ran vLLM's quantization code: vLLM frames inside an SGLang server's traceback.
    text = "\n".join([
        '  File "/usr/lib/python3/dist-packages/sglang/launch_server.py", line 14, in <module>',
        VLLM_FRAME, VLLM_FRAME.replace("538", "540"), NO_SCHEME, ""])
    assert run(text)[1].name == "sglang"
    # A tie (one frame each, nothing else) names no engine.
    assert run(SGL_FRAME + "\n" + VLLM_FRAME + "\n")[1] is None


KUBECTL = ("[pod/vllm-0/vllm] INFO 01-01 12:00:00 [api_server.py:1] vLLM API server version "
           "0.11.0")


def test_a_kubectl_prefixed_line_names_the_engine():
    # `kubectl logs --prefix`: the pod's prefix is cut like a container runtime's, and the
    # line says vLLM and its version (it crashed with a TypeError: two signs of one weight on
    # one line, only one with a version, were compared as tuples holding None).
    _, e = run(KUBECTL + "\n")
    assert (e.name, e.version, e.evidence.line, e.certain) == ("vllm", "0.11.0", 1, True)
    assert e.evidence.text == "INFO 01-01 12:00:00 [api_server.py:1] vLLM API server version 0.11.0"
    r = cli("-", stdin=KUBECTL + "\n")
    assert r.returncode == 0 and "Traceback" not in r.stderr, r.stderr
    assert "(written by vLLM 0.11.0: line 1)" in r.stdout


@pytest.mark.parametrize("line", [
    # two weight-3 signs on one line: the entry point (no version) and the banner (a version)
    "INFO 01-01 12:00:00 [vllm/entrypoints/openai/api_server.py:1] vLLM API server version 0.11.0",
    "[vllm-0] vllm serve m: vLLM API server version 0.11.0",
    # the same on one SGLang line: its entry point and its version
    "[2026-01-01 00:00:00] sglang/launch_server.py: sglang==0.5.16",
])
def test_equal_signs_on_one_line_give_the_engine_and_its_version(line):
    _, e = run(line + "\n")
    assert e is not None and e.version in ("0.11.0", "0.5.16") and e.evidence.line == 1
    assert e.certain


# --- a guess is said as one (issue 26) ------------------------------------------------------------

SERVE_PY = ("[2026-03-02 10:00:00] Starting HTTP server on 0.0.0.0:30000\n"
            "Traceback (most recent call last):\n"
            '  File "/app/serve.py", line 41, in <module>\n'
            "OSError: [Errno 98] Address already in use\n")


def test_a_generic_prefix_alone_makes_the_engine_probable():
    # A bracketed timestamp is SGLang's prefix, and any Python program's: a guess.
    _, e = run(SERVE_PY)
    assert (e.name, e.certain, e.evidence.line) == ("sglang", False, 1)
    assert e.said == ("probably written by SGLang: line 1 starts with SGLang's log line prefix, "
                      "a bracketed timestamp, which any program's logging can write")
    r = cli("-", stdin=SERVE_PY)
    first = r.stdout.splitlines()[0]
    assert first.startswith("1 known failure found in standard input (probably written by "
                            "SGLang: line 1 starts with"), first
    assert "(written by SGLang" not in r.stdout
    doc = json.loads(cli("-", "--json", stdin=SERVE_PY).stdout)
    assert doc["engine"]["certain"] is False and doc["engine"]["evidence"]["line"] == 1
    # A sign only SGLang writes makes it a fact: its scheduler's rank in the prefix, a frame.
    for text in ("[2026-03-02 10:00:00 TP0] Starting\n", SGL_FRAME + "\n" + SERVE_PY):
        _, e = run(text)
        assert (e.name, e.certain) == ("sglang", True), text
        assert e.said.startswith("written by SGLang: ")


def test_a_probable_engine_rules_no_failure_out():
    # vLLM's sentence in a log whose only sign of SGLang is a bracketed timestamp: vLLM's
    # failure is possible, not "a known sentence with another cause" from a guess.
    text = ("[2026-03-02 10:00:00] Starting\n"
            "ValueError: Free memory on device cuda:0 (2.11/22.05 GiB) on startup is less than "
            "desired GPU memory utilization (0.9, 19.84 GiB).\n")
    diags, e = run(text)
    assert e.name == "sglang" and not e.certain
    assert ids(diags) == [("vllm-gpu-memory-occupied", False)]
    assert diags[0].cause.endswith(
        "(The log does not say for certain which engine wrote it (probably SGLang, from a line "
        "prefix other programs write too): this holds for vLLM.)")
    # SGLang's own prefix (a rank in it) is a fact, and the sentence another cause.
    diags, _ = run(text.replace("10:00:00]", "10:00:00 TP0]", 1))
    assert ids(diags) == [(doctor.OTHER_CAUSE, True)]


# --- the same sentence, by engine and version -----------------------------------------------

def test_vllm_saying_sglangs_sentence_gets_vllms_cause():
    text = ("INFO 06-19 09:50:02 [api_server.py:1287] vLLM API server version 0.9.1\n"
            f"ERROR 06-19 09:50:31 [core.py:515] {VLLM_FRAME.strip()}\n"
            f"ERROR 06-19 09:50:31 [core.py:515] {NO_SCHEME}\n")
    diags, e = run(text)
    assert ids(diags) == [("vllm-no-compatible-scheme", True)]
    assert diags[0].line == 3


def test_sglang_after_the_fix_saying_the_sentence_is_another_cause():
    text = f"sglang==0.5.23\n{SGL_FRAME}\n{NO_SCHEME}\n"
    diags, e = run(text)
    assert ids(diags) == [(doctor.OTHER_CAUSE, True)]
    d = diags[0]
    assert d.sentence_of == "sglang-mixed-precision-no-scheme"
    assert d.title == ("a known sentence (sglang-mixed-precision-no-scheme), but from SGLang "
                       "0.5.23: another cause")
    assert "which SGLang <0.5.17 prints for that cause" in d.cause
    assert "This log was written by SGLang 0.5.23 (line 1)" in d.cause
    assert [ev.line for ev in d.evidence] == [3, 1]  # the sentence, then what says the engine
    report = doctor.DoctorReport("x", tuple(diags), e)
    assert report.exit_code == 0 and report.to_dict()["matched"] is False
    # The affected range gets the failure, for certain.
    diags, _ = run(text.replace("0.5.23", "0.5.16"))
    assert ids(diags) == [("sglang-mixed-precision-no-scheme", True)]


def test_without_the_version_a_version_bound_cause_is_possible_only():
    diags, e = run(f"{SGL_FRAME}\n{NO_SCHEME}\n")
    assert e.name == "sglang" and e.version is None
    assert ids(diags) == [("sglang-mixed-precision-no-scheme", False)]
    assert diags[0].title.startswith("possibly: ")
    assert diags[0].cause.endswith("(The log does not say which SGLang version wrote it: this "
                                   "holds for SGLang <0.5.17.)")
    # --engine says what the log does not.
    given = doctor.engine_given("sglang==0.5.16", FAILURES)
    diags, e = run(f"{SGL_FRAME}\n{NO_SCHEME}\n", engine=given)
    assert ids(diags) == [("sglang-mixed-precision-no-scheme", True)] and e is given


def test_without_any_engine_each_engines_reading_is_possible():
    diags, e = run("KeyError: 'model.layers.3.mlp.down_proj.weight_scale'\n")
    assert e is None
    assert ids(diags) == [("sglang-ignore-dequantized-keyerror", False),
                          ("vllm-keyerror-weight-scale", False)]
    assert "(The log does not say which engine wrote it: this holds for SGLang >=0.5.7,<0.5.17.)" \
        in diags[0].cause
    # A failure every engine prints stays certain without one.
    diags, _ = run("RuntimeError: CUDA error: no kernel image is available for execution on "
                   "the device\n")
    assert ids(diags) == [("no-kernel-image", True)]


def test_engine_given_is_checked():
    from imgbuild.errors import InputError

    with pytest.raises(InputError) as e:
        doctor.engine_given("tgi", FAILURES)
    assert e.value.message == "--engine tgi: not an engine doctor knows"
    assert e.value.facts == ["engines: sglang, vllm"]
    with pytest.raises(InputError, match="'x' is not a version"):
        doctor.engine_given("vllm==x", FAILURES)
    g = doctor.engine_given("VLLM", FAILURES)
    assert (g.name, g.version, g.where) == ("vllm", None, "--engine VLLM")


# --- wordings across versions --------------------------------------------------------------

@pytest.mark.parametrize("line, fid, caps", [
    # vLLM 0.9/0.10: no device in the sentence
    ("ValueError: Free memory on device (31.44/47.38 GiB) on startup is less than desired GPU "
     "memory utilization (0.95, 45.01 GiB). Decrease GPU memory utilization or reduce GPU "
     "memory used by other processes.", "vllm-gpu-memory-occupied",
     {"free_gib": "31.44", "total_gib": "47.38"}),
    # older SGLang: a ValueError with min_per_gpu_memory
    ("ValueError: The memory capacity is unbalanced. Some GPUs may be occupied by other "
     "processes. min_per_gpu_memory=8.8841552734375, local_gpu_memory=11.901611328125, "
     "local_gpu_memory * 0.9=10.7114501953125", "sglang-gpu-memory-unbalanced",
     {"min_free_gb": "8.88", "local_free_gb": "11.90"}),
    ("ValueError: The quantization method awq is not supported for the current GPU. Minimum "
     "capability: 75. Current capability: 70.", "quant-scheme-needs-newer-gpu",
     {"method": "awq", "min_cc": "75", "cc": "70", "needed_arch": "sm75"}),
    ("torch.cuda.OutOfMemoryError: CUDA out of memory. Tried to allocate 3.50 GiB. GPU 0 has a "
     "total capacty of 23.69 GiB of which 3.09 GiB is free.", "cuda-out-of-memory",
     {"alloc": "3.50 GiB", "total": "23.69 GiB", "free": "3.09 GiB"}),
])
def test_older_wordings(line, fid, caps):
    diags, _ = run(line + "\n")
    assert [d.id for d in diags] == [fid]
    for k, v in caps.items():
        assert diags[0].captures[k] == v, (k, dict(diags[0].captures))


def test_torch_too_old_wording_needs_its_second_line():
    text = ("/usr/local/lib/python3.12/site-packages/torch/cuda/__init__.py:230: UserWarning:\n"
            "    Found GPU1 Tesla V100-PCIE-16GB which is of cuda capability 7.0.\n"
            "    PyTorch no longer supports this GPU because it is too old.\n"
            "    The minimum cuda capability supported by this library is 7.5.\n")
    diags, _ = run(text)
    assert [(d.id, d.captures["arch"], d.captures["gpu_name"]) for d in diags] == [
        ("torch-arch-unsupported", "sm70", "Tesla V100-PCIE-16GB")]
    assert [e.role for e in diags[0].evidence] == ["match", "torch"]
    assert run(text.split("\n")[1] + "\n")[0] == []


# --- log hygiene -----------------------------------------------------------------------------

MEM = ("ValueError: Free memory on device cuda:0 (1.54/22.05 GiB) on startup is less than "
       "desired GPU memory utilization (0.9, 19.84 GiB). Decrease GPU memory utilization or "
       "reduce GPU memory used by other processes.")


@pytest.mark.parametrize("line", [
    "vllm-1  | (Worker_TP3 pid=77) ERROR 01-26 09:25:37 [core.py:935] {m}",
    "vllm-glm-4.7-flash-1  | (Worker_TP3 pid=77) ERROR 01-26 09:25:37 [core.py:935] {m}",
    "vllm_1 | ^[[0;36m(Worker_TP3 pid=77)^[[0;0m ^[[31mERROR^[[0m ^[[90m01-26 09:25:37^[[0m "
    "^[[90m[core.py:935]^[[0m {m}",
    "> [2026-01-26T17:25:37Z] \x1b[0;36m(Worker_TP3 pid=77)\x1b[0;0m ERROR 01-26 09:25:37 "
    "[core.py:935] {m}",
    "2026-01-26T17:25:37.123456789Z (Worker_TP3 pid=77) ERROR 01-26 09:25:37 [core.py:935] {m}",
    "│ (Worker_TP3 pid=77) ERROR 01-26 09:25:37 [core.py:935] {m}",
    "Jan 26 17:25:37 gpu-node-4 docker[1234]: (Worker_TP3 pid=77) ERROR 01-26 09:25:37 "
    "[core.py:935] {m}",
    ">   | [2026-01-26T17:25:37Z] (Worker_TP3 pid=77) ERROR 01-26 09:25:37 [core.py:935] {m}",
])
def test_container_and_paste_prefixes_and_colours_are_cut(line):
    diags, e = run(line.format(m=MEM) + "\n")
    assert [d.id for d in diags] == ["vllm-gpu-memory-occupied"]
    d = diags[0]
    assert d.ranks == ("3",), line  # the worker's rank is read behind the container's prefix
    assert d.captures["device"] == "cuda:0"
    assert "^[[" not in d.evidence[0].text and "\x1b" not in d.evidence[0].text
    assert e is not None and e.name == "vllm"


def test_repeats_that_differ_in_their_figures_are_one_failure():
    text = "".join(f"(Worker_TP{r} pid={70 + r}) ERROR 09-03 11:03:37 [core.py:712] "
                   f"ValueError: Free memory on device (7.3{r}/139.72 GiB) on startup is less "
                   f"than desired GPU memory utilization (0.9, 125.75 GiB).\n" for r in range(4))
    diags, _ = run(text)
    assert [(d.id, d.occurrences, d.ranks) for d in diags] == [
        ("vllm-gpu-memory-occupied", 4, ("0", "1", "2", "3"))]


# --- the report --------------------------------------------------------------------------------

def cli(*args: str, stdin: str | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "imgbuild.cli", "doctor", *args],
                          capture_output=True, text=True, input=stdin, cwd=ROOT, timeout=120)


def test_the_report_is_on_stdout_whole_in_a_pipe():
    text = ("INFO 06-19 09:50:02 [api_server.py:1287] vLLM API server version 0.9.1\n"
            f"ERROR 06-19 09:50:31 [core.py:515] {NO_SCHEME}\n")
    r = cli("-", stdin=text)
    assert r.returncode == 1, r.stderr
    lines = r.stdout.splitlines()
    assert lines[0] == ("1 known failure found in standard input (written by vLLM 0.9.1: "
                        "line 1)")
    assert lines[1] == ("error vllm-no-compatible-scheme: vLLM has no compressed-tensors scheme "
                        "for a layer of this checkpoint")
    fp = next(f for f in FAILURES.fingerprints if f.id == "vllm-no-compatible-scheme")
    assert lines[2] == "  cause: " + fp.cause.replace("{layer}", "a layer")
    assert lines[5] == f"    line 2: ERROR 06-19 09:50:31 [core.py:515] {NO_SCHEME}"
    r = cli("-", "--json", stdin=text)
    doc = json.loads(r.stdout)
    assert doc["engine"] == {"name": "vllm", "version": "0.9.1", "evidence": {
        "line": 1, "role": "engine", "rank": None,
        "text": "INFO 06-19 09:50:02 [api_server.py:1287] vLLM API server version 0.9.1"},
        "certain": True}
    assert [d["certain"] for d in doc["diagnoses"]] == [True]
    r = cli("-", "--engine", "sglang==0.5.23", stdin=f"{NO_SCHEME}\n")
    assert r.returncode == 0, r.stdout + r.stderr
    assert r.stdout.startswith("a known sentence (sglang-mixed-precision-no-scheme), but from "
                               "SGLang 0.5.23: another cause.")
    assert "no known failure matched in standard input" in r.stdout
    r = cli("-", "--engine", "nope", stdin="x\n")
    assert r.returncode == 2 and "--engine nope: not an engine doctor knows" in r.stderr
    assert "Traceback" not in r.stderr


def test_the_catalog_names_known_engines_only(tmp_path):
    from imgbuild.errors import SpecError

    images = tmp_path / "images"
    (images / "checks").mkdir(parents=True)
    text = (ROOT / "images" / "checks" / "failures.yaml").read_text()
    (images / "checks" / "failures.yaml").write_text(
        text.replace("    engine: vllm\n", "    engine: tgi\n", 1))
    with pytest.raises(SpecError) as e:
        load_failures(images)
    assert "prefixes[2].engine" in str(e.value) and "tgi" in str(e.value)
    (images / "checks" / "failures.yaml").write_text(
        text.replace("weight: 3}", "weight: 0}", 1))
    with pytest.raises(SpecError, match="a weight of 1 or more"):
        load_failures(images)
