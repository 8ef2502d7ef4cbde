"""`imgbuild doctor` (imgbuild/checks/doctor.py, images/checks/failures.yaml).

The logs under tests/fixtures/logs/ were written for these tests in the shapes real SGLang and
vLLM servers print (see that folder's README: the message texts are verbatim from the wheels,
the rest is made to look real). Each is diagnosed with the right failure, captures and evidence
line; the healthy log and the unknown traceback get no diagnosis at all.
"""

from __future__ import annotations

import io
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from rich.console import Console

from imgbuild.catalog.failures import SEVERITIES, load_failures, load_fingerprints
from imgbuild.checks import doctor
from imgbuild.cli.console import Output
from imgbuild.cli.views import checks as views
from imgbuild.errors import InputError, SpecError

ROOT = Path(__file__).resolve().parent.parent
LOGS = ROOT / "tests" / "fixtures" / "logs"
CHECKS = ROOT / "images" / "checks" / "failures.yaml"
FAILURES = load_failures(ROOT / "images")


def render(diags, console, source=None) -> None:
    """The human report, as `imgbuild doctor` prints it."""
    views.doctor_report(Output(False, console, Console(file=io.StringIO())),
                        doctor.DoctorReport(source, tuple(diags)))


def log(name: str) -> str:
    # read_log keeps "\r" (progress bars) inside a line, so line numbers are grep -n's.
    return doctor.read_log(str(LOGS / name))[0]


def grep_n(name: str, needle: str) -> list[int]:
    """Line numbers of `needle` in a fixture, counted as grep -n does."""
    lines = (LOGS / name).read_bytes().decode().split("\n")
    return [i + 1 for i, line in enumerate(lines) if needle in line]


HOST_ONLY = {"port-in-use", "nccl-system-error"}

# fixture -> (failure id, evidence line, captures it must have, ranks, occurrences)
CASES = {
    "compression-format-missing.log": (
        "compression-format-missing", 52,
        {"symbol": "nvfp4_pack_quantized", "min_version": "0.10.0"}, ("0", "1"), 2),
    "compression-format-missing-py311.log": (
        "compression-format-missing", 50,
        {"symbol": "nvfp4_pack_quantized", "min_version": "0.10.0"}, (), 1),
    "sglang-mixed-precision-no-scheme.log": (
        "sglang-mixed-precision-no-scheme", 72, {}, (), 1),
    "sglang-ignore-keyerror.log": (
        "sglang-ignore-dequantized-keyerror", 42,
        {"param": "model.layers.0.mlp.experts.w2_input_global_scale",
         "module": "model.layers.0.mlp.experts", "tensor": "w2_input_global_scale"}, ("0", "1"), 2),
    "sglang-ignore-params.log": (
        "sglang-ignore-dequantized-params", 7,
        {"param": "model.layers.1.mlp.down_proj.input_global_scale",
         "module": "model.layers.1.mlp.down_proj", "tensor": "input_global_scale"}, (), 44),
    "sglang-packed-modules-mapping.log": (
        "sglang-packed-modules-mapping", 75,
        {"layer": "model.layers.0.linear_attn.in_proj_qkvz", "fused": "in_proj_qkvz"}, (), 1),
    "w4a4-nvfp4-hopper.log": (
        "w4a4-nvfp4-unsupported-gpu", 75, {"what": "w4a4 nvfp4"}, ("0", "1"), 2),
    "quant-scheme-capability.log": (
        "quant-scheme-needs-newer-gpu", 52,
        {"min_cc": "80", "cc": "70", "arch": "sm70", "needed_arch": "sm80"}, (), 1),
    "sglang-memory-unbalanced.log": (
        "sglang-gpu-memory-unbalanced", 31,
        {"min_free_gb": "37.56", "local_free_gb": "93.95"}, ("1", "2", "3"), 3),
    "vllm-memory-occupied.log": (
        "vllm-gpu-memory-occupied", 29,
        {"device": "cuda:0", "free_gib": "24.36", "total_gib": "79.19"}, ("0",), 1),
    "torch-arch-sm120.log": (
        "torch-arch-unsupported", 3,
        {"arch": "sm120", "gpu_name": "NVIDIA RTX PRO 6000 Blackwell Server Edition"}, (), 3),
    "no-kernel-image.log": ("no-kernel-image", 22, {}, (), 1),
    "cuda-oom-cuda-graph.log": (
        "cuda-out-of-memory", 18,
        {"alloc": "2.00 GiB", "gpu": "0", "total": "178.36 GiB", "free": "1.06 GiB"}, (), 2),
    "fp8-e4nv-ampere.log": ("fp8-unsupported-gpu", 10, {}, ("0", "1"), 2),
    "port-in-use.log": ("port-in-use", 3, {"port": "8000", "host": "0.0.0.0"}, (), 1),
    # NCCL's "failed to extend" line comes first; the size is taken from the line after it
    "nccl-shm.log": ("nccl-system-error", 5,
                     {"segment": "/dev/shm/nccl-Ae31bQ", "size": "9637888"}, (), 4),
    "flashinfer-no-nvcc.log": ("flashinfer-jit-no-nvcc", 7, {}, ("0", "1"), 2),
    "triton-no-cc.log": ("triton-no-c-compiler", 5, {}, ("0",), 2),
    "hf-gated.log": ("hf-gated-repo", 10, {}, (), 3),
    "vllm-no-scheme.log": ("vllm-no-compatible-scheme", 9, {}, (), 1),
    "vllm-keyerror-weight-scale.log": (
        "vllm-keyerror-weight-scale", 9,
        {"module": "layers.0.mlp.down_proj", "tensor": "weight_scale"}, (), 1),
    # launch failures (imgbuild run): SGLang 0.5.23 without a GPU, /dev/shm full, model not cached
    "no-gpu-visible.log": ("no-gpu-visible", 33, {"sign": "No accelerator"}, (), 1),
    "shm-too-small.log": ("shm-too-small", 17, {"error": "No space left on device"}, (), 2),
    "hf-model-not-cached.log": (
        "hf-model-not-cached", 22,
        {"model": "Qwen/Qwen3-0.6B", "offline": "outgoing traffic has been disabled"}, (), 2),
    # where the container starts (issue 47): the runtime's, Python's, huggingface_hub's, the
    # loader's and NCCL's words; four of them printed here by `docker run` (README.md)
    "driver-older-than-image-cuda.log": (
        "driver-older-than-image-cuda", 3, {"cuda": "12.8", "driver_floor": "570.26"}, (), 1),
    "driver-libraries-not-in-container.log": (
        "driver-libraries-not-in-container", 6, {"said": "NVML Shared Library Not Found"}, (), 2),
    "uid-without-passwd-entry.log": ("uid-without-passwd-entry", 6, {"uid": "12345"}, (), 1),
    "cache-dir-not-writable.log": (
        "cache-dir-not-writable", 36, {"path": "/root/.cache/huggingface/token"}, (), 1),
    "cache-dir-missing.log": (
        "cache-dir-missing", 5, {"path": "/data/.cache/huggingface/hub"}, (), 1),
    "jit-noexec-tmp.log": (
        "jit-noexec-tmp", 8, {"so": "/tmp/home/.cache/torch_extensions/py311_cpu/probe/probe.so"},
        (), 1),
    "nccl-rdma-unusable.log": ("nccl-rdma-unusable", 9, {"error": "No such device"}, ("0",), 1),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_fixture_diagnosed(name):
    fid, line, caps, ranks, occurrences = CASES[name]
    diags = doctor.diagnose(log(name), FAILURES)
    assert [d.id for d in diags] == [fid]
    d = diags[0]
    assert d.line == line
    assert d.evidence[0].role == "match"
    # The evidence is the log's own line, as grep -n numbers it.
    assert line in grep_n(name, d.evidence[0].text)
    for k, v in caps.items():
        assert d.captures.get(k) == v, (k, dict(d.captures))
    assert d.ranks == ranks
    assert d.occurrences == occurrences
    # Templates are filled in: no {placeholder} survives, and the captures appear in the text.
    for text in (d.title, d.cause, d.fix):
        assert not re.search(r"\{\w+\}", text), text
    for k in ("symbol", "module", "layer", "arch", "device", "min_free_gb"):
        if k in caps:
            assert caps[k] in d.cause + d.fix + d.title
    # What an image can change, the fix says with imgbuild; a port another process holds and
    # a container's /dev/shm are the host's, and their fix says so without it.
    assert "imgbuild" in d.fix or fid in HOST_ONLY
    assert d.sources and d.severity in SEVERITIES


def test_every_fingerprint_has_a_fixture():
    covered = {fid for fid, *_ in CASES.values()}
    assert {fp.id for fp in FAILURES.fingerprints} <= covered


def test_specific_captures_and_fix_text():
    d = doctor.diagnose(log("compression-format-missing.log"), FAILURES)[0]
    assert "compressed-tensors>=0.10.0" in d.fix and "imgbuild check-deps TARGET" in d.fix
    d = doctor.diagnose(log("sglang-ignore-keyerror.log"), FAILURES)[0]
    assert "imgbuild check-model PATH --target TARGET --fix OUT" in d.fix
    assert "0.5.17" in d.fix and "images/patches" in d.fix
    d = doctor.diagnose(log("torch-arch-sm120.log"), FAILURES)[0]
    assert "--arch sm120" in d.fix
    d = doctor.diagnose(log("sglang-memory-unbalanced.log"), FAILURES)[0]
    assert "imgbuild preflight" in d.fix and "TP1, TP2, TP3" in d.cause
    d = doctor.diagnose(log("vllm-memory-occupied.log"), FAILURES)[0]
    assert "cuda:0" in d.title


def test_python311_enum_form_needs_the_frame_line():
    d = doctor.diagnose(log("compression-format-missing-py311.log"), FAILURES)[0]
    assert [(e.line, e.role) for e in d.evidence] == [(50, "match"), (46, "frame")]
    # The bare `AttributeError: name` alone names no class: no diagnosis.
    bare = "Traceback (most recent call last):\nAttributeError: nvfp4_pack_quantized\n"
    assert doctor.diagnose(bare, FAILURES) == []
    # ... nor when the frame above names another member than the error.
    text = "    CompressionFormat.dense.value,\nAttributeError: nvfp4_pack_quantized\n"
    assert doctor.diagnose(text, FAILURES) == []


@pytest.mark.parametrize("name", ["benign.log", "illegal-memory-access.log"])
def test_no_known_failure(name):
    assert doctor.diagnose(log(name), FAILURES) == []
    c = Console(record=True, width=120)
    render([], c, source=name)
    assert doctor.NO_MATCH in c.export_text()
    assert doctor.to_dict([]) == {"matched": False, "engine": None, "diagnoses": [],
                                  "message": doctor.NO_MATCH}


def test_two_failures_both_reported_errors_first():
    diags = doctor.diagnose(log("two-failures.log"), FAILURES)
    assert [d.id for d in diags] == ["sglang-ignore-dequantized-keyerror",
                                     "sglang-gpu-memory-unbalanced"]
    assert [d.line for d in diags] == [45, 6]
    assert [d.severity for d in diags] == ["error", "warning"]  # logged, not raised
    assert diags[1].ranks == ("1",)


def test_concatenated_logs_give_both():
    text = log("w4a4-nvfp4-hopper.log") + log("sglang-packed-modules-mapping.log")
    ids = [d.id for d in doctor.diagnose(text, FAILURES)]
    assert sorted(ids) == ["sglang-packed-modules-mapping", "w4a4-nvfp4-unsupported-gpu"]


def test_supersedes_folds_the_explained_failure():
    d, = doctor.diagnose(log("torch-arch-sm120.log"), FAILURES)
    related = [e for e in d.evidence if e.role == "related"]
    assert [e.line for e in related] == grep_n("torch-arch-sm120.log", "no kernel image")[:1]
    assert related[0].rank == "1"
    d, = doctor.diagnose(log("sglang-ignore-keyerror.log") + log("sglang-ignore-params.log"),
                         FAILURES)
    assert d.id == "sglang-ignore-dequantized-keyerror"
    assert any(e.role == "related" and "not found in params_dict" in e.text for e in d.evidence)


def test_dedupe_by_captures():
    # Two different missing members are two diagnoses; the same one on two ranks is one.
    err = "AttributeError: type object 'CompressionFormat' has no attribute '{}'\n"
    text = ("[2026-01-01 00:00:00 TP0] x\n" + err.format("mixed_precision")
            + "[2026-01-01 00:00:00 TP1] x\n" + err.format("mixed_precision")
            + err.format("nvfp4_pack_quantized"))
    diags = doctor.diagnose(text, FAILURES)
    assert [(d.captures["symbol"], d.captures["min_version"], d.occurrences, d.ranks)
            for d in diags] == [("mixed_precision", "0.11.0", 2, ("0", "1")),
                                ("nvfp4_pack_quantized", "0.10.0", 1, ("1",))]


def test_ansi_colours_and_crlf():
    # vLLM colours its prefix when it thinks it writes to a terminal; Windows tools add \r\n.
    plain = log("vllm-memory-occupied.log")
    coloured = "\r\n".join(
        re.sub(r"^\((\S+ pid=\d+)\) (\w+) (\S+ \S+) ",
               "\x1b[0;36m(\\1)\x1b[0;0m \\2 \x1b[90m\\3\x1b[0m ", line)
        for line in plain.split("\n"))
    a, b = doctor.diagnose(plain, FAILURES), doctor.diagnose(coloured, FAILURES)
    assert [(d.id, d.line, d.ranks, dict(d.captures)) for d in b] == \
           [(d.id, d.line, d.ranks, dict(d.captures)) for d in a]
    assert "\x1b" not in b[0].evidence[0].text


@pytest.mark.parametrize("line,rank", [
    ("[2026-01-01 00:00:00.123 DP0 TP5 EP5] {msg}", "5"),
    ("[2026-01-01 00:00:00 PP1 TP12] {msg}", "12"),
    ("(Worker_PP1_TP3_EP3 pid=77) ERROR 01-10 12:00:00 [utils.py:763] {msg}", "3"),
    ("(VllmWorker rank=2 pid=12) ERROR 01-10 12:00:00 multiproc_worker_utils.py:1] {msg}", "2"),
    ("(EngineCore_DP0 pid=214) ERROR 03-05 08:10:26 [core.py:1584] {msg}", None),
    ("ERROR 01-10 12:00:00 [api_server.py:9] {msg}", None),
    ("{msg}", None),
])
def test_log_prefixes_give_the_rank(line, rank):
    # (a message any engine prints: the prefix also says which engine wrote the line)
    msg = "RuntimeError: CUDA error: no kernel image is available for execution on the device"
    d, = doctor.diagnose(line.format(msg=msg) + "\n", FAILURES)
    assert d.id == "no-kernel-image"
    assert d.evidence[0].rank == rank
    # The prefix is cut before matching: a regex anchored at ^ sees the message.
    text = ("    CompressionFormat.nvfp4_pack_quantized.value,\n"
            + line.format(msg="AttributeError: nvfp4_pack_quantized") + "\n")
    d, = doctor.diagnose(text, FAILURES)
    assert (d.captures["symbol"], d.line) == ("nvfp4_pack_quantized", 2)


def test_yaml_examples_match_their_failure():
    for fp in FAILURES.fingerprints:
        assert fp.examples, f"{fp.id} has no examples"
        for ex in fp.examples:
            assert fp.id in [d.id for d in doctor.diagnose(ex, FAILURES)], (fp.id, ex)


def test_fingerprints_are_data():
    fps = FAILURES.fingerprints
    ids = [fp.id for fp in fps]
    assert len(ids) == len(set(ids)) >= 7
    for fp in fps:
        for s in fp.sources:
            assert re.match(r"^[\w.-]+==[\w.+]+$", s.requirement), s
        for alt in fp.alternatives:
            assert alt.line.contains
    assert [p.name for p in FAILURES.prefixes][:1] == ["sglang"]


def test_large_log_is_scanned():
    # 100k+ lines of a healthy server, then a failure: found, with the right line number.
    benign = log("benign.log")
    reps = 100_000 // benign.count("\n") + 1
    text = benign * reps + log("sglang-ignore-keyerror.log")
    diags = doctor.diagnose(text, FAILURES)
    assert [d.id for d in diags] == ["sglang-ignore-dequantized-keyerror"]
    assert diags[0].line == benign.count("\n") * reps + 42
    # A long line full of what the regexes look for does not hang the scan.
    nasty = ("Parameter " + "a." * 20000 + " not found in params_dict\n"
             "KeyError: '" + "b." * 20000 + "'\n") * 50
    assert doctor.diagnose(nasty, FAILURES) == []


def test_to_dict_and_render():
    diags = doctor.diagnose(log("two-failures.log"), FAILURES)
    doc = json.loads(json.dumps(doctor.to_dict(diags, source="two-failures.log")))
    assert doc["matched"] is True and doc["log"] == "two-failures.log"
    first = doc["diagnoses"][0]
    assert first["id"] == "sglang-ignore-dequantized-keyerror"
    assert first["evidence"][0]["line"] == 45 and first["evidence"][0]["rank"] == "0"
    assert first["captures"]["tensor"] == "w2_input_global_scale"
    assert first["applies_to"] == {"sglang": ">=0.5.7,<0.5.17"}
    assert any("qwen3_next.py:1227" in s for s in first["sources"])
    c = Console(record=True, width=200)
    render(diags, c, source="two-failures.log")
    out = c.export_text()
    assert "2 known failures found in two-failures.log" in out
    assert "line 45" in out
    assert "KeyError: 'model.layers.0.mlp.experts.w2_input_global_scale'" in out
    flat = " ".join(out.split())
    for d in diags:
        assert d.id in out and " ".join(d.title.split()) in flat
        assert " ".join(d.fix.split())[:80] in flat.replace("│ ", "").replace(" │", "")


def test_render_does_not_read_log_text_as_markup():
    text = ("[bold red]x[/] [link=http://evil]y[/link]\n"
            "NotImplementedError: No compressed-tensors compatible scheme was found.\n")
    diags = doctor.diagnose(text, FAILURES)
    c = Console(record=True, width=200)
    render(diags, c)
    assert "No compressed-tensors compatible scheme was found." in c.export_text()


def test_read_log(tmp_path):
    stdin = io.TextIOWrapper(io.BytesIO(b"line\r\nKeyError: 'm.experts.w2_weight_scale'\n"))
    text, label = doctor.read_log("-", stdin)
    assert label == "standard input"
    # One line, no engine named: the failures both engines' loaders print are each possible.
    got = [(d.line, d.id, d.certain) for d in doctor.diagnose(text, FAILURES)]
    assert got == [(2, "sglang-ignore-dequantized-keyerror", False),
                   (2, "vllm-keyerror-weight-scale", False)]
    with pytest.raises(InputError, match="no such log file"):
        doctor.read_log(str(tmp_path / "missing.log"))
    with pytest.raises(InputError, match="directory"):
        doctor.read_log(str(tmp_path))


# --- failures.yaml is validated ------------------------------------------------------------------

GOOD = """
prefixes:
  - {name: sglang, regex: '^\\[\\d{4}-\\d\\d-\\d\\d \\d\\d:\\d\\d:\\d\\d(?: TP(?P<rank>\\d+))?\\] '}
failures:
  - id: widget-missing
    title: "widget {name} is missing"
    match:
      - regex: 'WidgetError: no widget (?P<name>\\w+)'
        contains: "WidgetError: no widget "
    cause: the widget {name} was not installed ({occurrences} times, {ranks})
    fix: run `imgbuild check-deps TARGET`
    applies_to: {widgets: "<2"}
    sources: [{in: widgets==1.0, at: widgets/core.py:10}]
    examples: ["WidgetError: no widget gear"]
"""


def write_catalog(tmp_path: Path, text: str) -> Path:
    (tmp_path / "checks").mkdir(exist_ok=True)
    (tmp_path / "checks" / "failures.yaml").write_text(text)
    return tmp_path


def test_a_new_failure_is_data(tmp_path):
    images = write_catalog(tmp_path, GOOD)
    text = "[2026-01-01 00:00:00 TP3] starting\nWidgetError: no widget gear\n"
    d, = doctor.diagnose(text, load_failures(images))
    assert (d.id, d.line, d.ranks, d.title) == \
        ("widget-missing", 2, ("3",), "widget gear is missing")
    assert d.cause == "the widget gear was not installed (1 times, TP3)"
    assert load_fingerprints(images)[0].id == "widget-missing"


@pytest.mark.parametrize("old,new,key", [
    ('        contains: "WidgetError: no widget "\n', "", "failures[0].match[0].contains"),
    ("'WidgetError: no widget (?P<name>\\w+)'", "'WidgetError: (unclosed'",
     "failures[0].match[0].regex"),
    ("fix: run `imgbuild check-deps TARGET`", "fix: run {nmae}", "failures[0].fix"),
    ("fix: run `imgbuild check-deps TARGET`", "fix: run {name!r}", "failures[0].fix"),
    ("    title:", "    titel:", "failures[0].titel"),
    ("    cause:", "    severity: fatal\n    cause:", "failures[0].severity"),
    ('{widgets: "<2"}', '{widgets: "lt 2"}', "failures[0].applies_to.widgets"),
    ("{in: widgets==1.0, at: widgets/core.py:10}", "{in: 'widgets ==', at: x}",
     "failures[0].sources[0].in"),
    ("    cause:", "    supersedes: [nothing-like-it]\n    cause:", "failures[0].supersedes[0]"),
    ("    cause:", "    dedupe_by: [colour]\n    cause:", "failures[0].dedupe_by[0]"),
    ("    cause:", "    derive: {n: {template: '{gone}'}}\n    cause:",
     "failures[0].derive.n.template"),
    ("  - id: widget-missing", "  - id: Widget Missing", "failures[0].id"),
    ("prefixes:", "prefix:", "prefix"),
])
def test_malformed_catalog_names_the_key(tmp_path, old, new, key):
    assert old in GOOD
    images = write_catalog(tmp_path, GOOD.replace(old, new, 1))
    with pytest.raises(SpecError) as e:
        load_fingerprints(images)
    assert e.value.key == key, e.value.message
    assert e.value.path.endswith("checks/failures.yaml")
    assert key in e.value.message


def test_duplicate_ids_and_near_windows(tmp_path):
    entry = GOOD.split("failures:\n", 1)[1]
    images = write_catalog(tmp_path, GOOD + entry)
    with pytest.raises(SpecError) as e:
        load_fingerprints(images)
    assert e.value.key == "failures[1].id" and "failures[0]" in e.value.message
    near = GOOD.replace('        contains: "WidgetError: no widget "\n',
                        '        contains: "WidgetError: no widget "\n'
                        "        near: [{regex: 'x', contains: x}]\n", 1)
    with pytest.raises(SpecError) as e:
        load_fingerprints(write_catalog(tmp_path, near))
    assert e.value.key.startswith("failures[0].match[0].near[0].")


def test_yaml_syntax_error_names_the_file(tmp_path):
    images = write_catalog(tmp_path, "failures: [\n")
    with pytest.raises(SpecError, match="failures.yaml"):
        load_fingerprints(images)
    with pytest.raises(InputError, match="no failure fingerprints"):
        load_fingerprints(tmp_path / "nowhere")


# --- the CLI --------------------------------------------------------------------------------

@pytest.mark.parametrize("name,fid", [
    ("sglang-ignore-keyerror.log", "sglang-ignore-dequantized-keyerror"),
    ("benign.log", None),
])
def test_cli_reads_stdin(name, fid):
    env = dict(os.environ, HF_HUB_OFFLINE="1")
    r = subprocess.run([sys.executable, "-m", "imgbuild.cli", "doctor", "-", "--json"], cwd=ROOT,
                       check=False,
                       input=(LOGS / name).read_bytes(), capture_output=True, env=env, timeout=120)
    assert r.returncode in (0, 1), r.stderr.decode()
    doc = json.loads(r.stdout)
    assert [d["id"] for d in doc["diagnoses"]] == ([fid] if fid else [])
    if fid:
        assert doc["diagnoses"][0]["evidence"][0]["line"] == CASES[name][1]
    r = subprocess.run([sys.executable, "-m", "imgbuild.cli", "doctor", str(LOGS / name)], cwd=ROOT,
                       check=False, capture_output=True, env=env, timeout=120, text=True)
    out = r.stdout + r.stderr
    assert (fid in out) if fid else (doctor.NO_MATCH in out)


# --- a value the log does not give (issue 26) ----------------------------------------------------

# A plain Python server (no engine) that cannot bind its port: the port is on the first line,
# not on the error line; its logging writes a bracketed timestamp, as SGLang's does.
SERVE_PY = """\
[2026-03-02 10:00:00] Starting HTTP server on 0.0.0.0:30000
[2026-03-02 10:00:00] Loading routes from /app/routes.yaml
Traceback (most recent call last):
  File "/app/serve.py", line 41, in <module>
    server = HTTPServer(("0.0.0.0", 30000), Handler)
  File "/usr/lib/python3.11/socketserver.py", line 456, in __init__
    self.server_bind()
  File "/usr/lib/python3.11/socketserver.py", line 472, in server_bind
    self.socket.bind(self.server_address)
OSError: [Errno 98] Address already in use
"""


def _commands(text: str) -> list[str]:
    return re.findall(r"`[^`]*`", text)


def _phrases(fid: str) -> set[str]:
    """What a failure writes for a value the log did not give: its defaults, its tables'."""
    fp = next(f for f in FAILURES.fingerprints if f.id == fid)
    return {v for _, v in fp.defaults if v} | {dv.default for dv in fp.derive if dv.default}


def test_a_value_not_on_the_error_line_is_taken_from_the_lines_around(tmp_path):
    d, = doctor.diagnose(SERVE_PY, FAILURES)
    assert d.id == "port-in-use" and d.line == 10
    assert d.title == "the port 30000 is already in use"
    assert d.cause.startswith("The server could not listen on port 30000: ")
    assert "`ss -ltnp | grep :30000`" in d.fix
    assert "the server wanted" not in d.cause + d.fix + d.title
    # The line that gave the port is evidence, labelled with what it gave.
    assert [(e.line, e.role) for e in d.evidence] == [(10, "match"), (1, "port")]
    assert dict(d.captures) == {"host": "0.0.0.0", "port": "30000"}
    # As a user reads it, for people and as JSON.
    f = tmp_path / "serve.log"
    f.write_text(SERVE_PY)
    r = subprocess.run([sys.executable, "-m", "imgbuild.cli", "doctor", str(f)], cwd=ROOT,
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 1, r.stderr
    assert "could not listen on port 30000" in r.stdout
    assert "`ss -ltnp | grep :30000`" in r.stdout
    assert "line 1 (port): [2026-03-02 10:00:00] Starting HTTP server on 0.0.0.0:30000" \
        in r.stdout
    r = subprocess.run([sys.executable, "-m", "imgbuild.cli", "doctor", str(f), "--json"],
                       cwd=ROOT, capture_output=True, text=True, timeout=120)
    j, = json.loads(r.stdout)["diagnoses"]
    assert j["captures"] == {"host": "0.0.0.0", "port": "30000"}
    assert "`ss -ltnp | grep :30000`" in j["fix"]
    assert [(e["line"], e["role"]) for e in j["evidence"]] == [(10, "match"), (1, "port")]


@pytest.mark.parametrize("before", [
    "[2026-03-02 10:00:00] server_args=ServerArgs(host='127.0.0.1', port=30001, nccl_port=None)",
    "INFO:     Uvicorn running on http://127.0.0.1:30001 (Press CTRL+C to quit)",
    "python3 -m sglang.launch_server --model-path m --nccl-port 5000 --port 30001",
    "Starting vLLM API server 0 on http://[::1]:30001",
])
def test_the_port_is_read_from_how_servers_announce_it(before):
    text = before + "\nLoading model on cuda:0\nOSError: [Errno 98] Address already in use\n"
    d, = doctor.diagnose(text, FAILURES)
    assert d.captures["port"] == "30001" and "`ss -ltnp | grep :30001`" in d.fix


def test_a_value_the_log_does_not_give_is_left_out_of_the_sentence(tmp_path):
    # `on cuda:0` is no port; nothing else around says one.
    text = SERVE_PY.replace("Starting HTTP server on 0.0.0.0:30000", "Loading model on cuda:0")
    d, = doctor.diagnose(text, FAILURES)
    assert d.title == "a port the server wanted is already in use"
    assert d.cause.startswith("The server could not listen on a port it wanted (the log does "
                              "not say which): ")
    assert _commands(d.fix)[0] == "`ss -ltnp`" and "grep" not in d.fix
    assert "port" not in d.captures and [e.role for e in d.evidence] == ["match"]
    f = tmp_path / "serve.log"
    f.write_text(text)
    for args in ((), ("--json",)):
        r = subprocess.run([sys.executable, "-m", "imgbuild.cli", "doctor", str(f), *args],
                           cwd=ROOT, capture_output=True, text=True, timeout=120)
        assert r.returncode == 1, r.stderr
        assert "listen on the server wanted" not in r.stdout and "grep :" not in r.stdout


def test_no_command_holds_a_phrase_for_a_missing_value():
    # Each failure's examples, alone (the fewest values a log gives): every command in the
    # answer runs as written, and no sentence keeps a segment's or a placeholder's marks.
    cases = [(fp.id, ex) for fp in FAILURES.fingerprints for ex in fp.examples]
    cases += [("compression-format-missing",
               "AttributeError: type object 'CompressionFormat' has no attribute 'fp3_new'"),
              ("cuda-out-of-memory", "RuntimeError: CUDA out of memory.")]
    for fid, ex in cases:
        d = next(d for d in doctor.diagnose(ex, FAILURES) if d.id == fid)
        for text in (d.title, d.cause, d.fix):
            assert not re.search(r"\{\w+\}|\[\[|\]\]|\|\|", text), (fid, text)
        for cmd in _commands(d.title + d.cause + d.fix):
            assert not [p for p in _phrases(fid) if p in cmd], (fid, cmd)
        # --json's captures are the log's values, never the phrases for missing ones.
        assert not set(d.captures.values()) & _phrases(fid), (fid, dict(d.captures))
    d, = doctor.diagnose(cases[-2][1], FAILURES)
    assert "compressed-tensors>=" not in d.fix and "CompressionFormat.fp3_new" in d.fix
    d, = doctor.diagnose(cases[-1][1], FAILURES)
    assert d.title == "CUDA out of memory" and " GPU ?" not in d.cause


@pytest.mark.parametrize("old,new,key,said", [
    # a default inside a command: refused, with the way to write it
    ("fix: run `imgbuild check-deps TARGET`",
     "defaults: {colour: red}\n    fix: run `imgbuild paint --colour {colour}`", "failures[0].fix",
     "always gives"),
    ("fix: run `imgbuild check-deps TARGET`", "fix: run [[`imgbuild x {name}`", "failures[0].fix",
     "segments"),
    ("fix: run `imgbuild check-deps TARGET`", "fix: run [[`imgbuild x {nmae}`||it]]",
     "failures[0].fix", "an around line sets"),
    ("    cause:", "    around: [{regex: 'x', before: 3}]\n    cause:",
     "failures[0].around[0].regex", "captures"),
    ("    cause:", "    around: [{regex: '(?P<n>x)', befor: 3}]\n    cause:",
     "failures[0].around[0].befor", "known keys"),
])
def test_segments_and_around_lines_are_checked_when_loaded(tmp_path, old, new, key, said):
    assert old in GOOD
    with pytest.raises(SpecError) as e:
        load_fingerprints(write_catalog(tmp_path, GOOD.replace(old, new, 1)))
    assert e.value.key == key and said in e.value.message, e.value.message


def test_a_segment_takes_a_value_only_from_the_log(tmp_path):
    text = GOOD.replace("fix: run `imgbuild check-deps TARGET`",
                        "fix: run [[`imgbuild paint {colour}`||`imgbuild paint` and pick one]]"
                        "\n    defaults: {colour: a colour}\n"
                        "    around: [{regex: 'colour=(?P<colour>\\w+)', contains: colour=, "
                        "before: 2, role: colour}]", 1)
    cat = load_failures(write_catalog(tmp_path, text))
    d, = doctor.diagnose("colour=red\nWidgetError: no widget gear\n", cat)
    assert d.fix == "run `imgbuild paint red`" and d.captures["colour"] == "red"
    d, = doctor.diagnose("colour=red\n\n\nWidgetError: no widget gear\n", cat)  # too far
    assert d.fix == "run `imgbuild paint` and pick one" and "colour" not in d.captures
