"""Property-based tests of every reader of user input: generated and mutated inputs never end
in a traceback, only in a result or one of imgbuild's errors, whose exit code is a documented
one (1 the job failed, 2 bad input, 3 the environment).

The seeds are the real files (images/, lockfiles/, the doctor's logs); hypothesis mutates them
(keys dropped, values of another type, lines cut, bytes flipped) and generates new ones. In
process, so that hundreds of cases take seconds; a sample goes through the CLI as a user runs
it, for the exit code and the absence of a traceback.
"""

from __future__ import annotations

import functools
import hashlib
import json
import re
import shutil
from pathlib import Path

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from imgbuild.checks import checkmodel as cm
from imgbuild.checks import doctor
from imgbuild.errors import ImgbuildError
from imgbuild.lock.lockfile import read_lock
from imgbuild.workspace import Workspace

from .conftest import ROOT, run_imgbuild

DOCUMENTED = {1, 2, 3}
SETTINGS = settings(max_examples=120, deadline=None, derandomize=True,
                    suppress_health_check=[HealthCheck.function_scoped_fixture,
                                           HealthCheck.too_slow])

# Any JSON/YAML value: what a user can put where the reader expects something else.
scalars = st.one_of(st.none(), st.booleans(), st.integers(-10**6, 10**6),
                    st.floats(allow_nan=False, allow_infinity=False), st.text(max_size=30))
values = st.recursive(scalars, lambda kids: st.one_of(
    st.lists(kids, max_size=4), st.dictionaries(st.text(max_size=12), kids, max_size=4)),
    max_leaves=12)


def mutate(doc, data, depth: int = 0):
    """One structural change somewhere in `doc`: a key dropped, a value of another type, an
    unknown key added, an item removed."""
    if isinstance(doc, dict) and doc:
        key = data.draw(st.sampled_from(sorted(doc, key=str)))
        op = data.draw(st.sampled_from(["drop", "replace", "descend", "add"]))
        out = dict(doc)
        if op == "drop":
            del out[key]
        elif op == "replace":
            out[key] = data.draw(values)
        elif op == "add":
            out[data.draw(st.text(min_size=1, max_size=12))] = data.draw(values)
        else:
            out[key] = mutate(doc[key], data, depth + 1)
        return out
    if isinstance(doc, list) and doc:
        i = data.draw(st.integers(0, len(doc) - 1))
        op = data.draw(st.sampled_from(["drop", "replace", "descend"]))
        out = list(doc)
        if op == "drop":
            del out[i]
        elif op == "replace":
            out[i] = data.draw(values)
        else:
            out[i] = mutate(doc[i], data, depth + 1)
        return out
    return data.draw(values)


def judged(fn) -> object:
    """fn() returns, or raises one of imgbuild's errors with a documented exit code."""
    try:
        return fn()
    except ImgbuildError as e:
        assert e.exit_code in DOCUMENTED, e
        assert e.message.strip()
        return e


@pytest.fixture(scope="module")
def scratch(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("props")
    shutil.copytree(ROOT / "images", d / "images")
    shutil.copytree(ROOT / "lockfiles", d / "lockfiles")
    return d


def load_everything(images: Path) -> None:
    ws = Workspace(images, images.parent / "lockfiles")
    _ = ws.catalog, ws.patches, ws.engines, ws.failures


# --- images/: targets, models, bases, patches ---------------------------------------------------

SPEC_FILES = ["tiny-cpu.yaml", "sglang-blackwell.yaml", "models/k2.6.yaml",
              "models/tiny-nvfp4.yaml", "bases.yaml", "gpus.yaml", "cuda.yaml", "prune.yaml",
              "patches/sglang-ct-ignore-exact-match.yaml", "checks/engines.yaml",
              "checks/failures.yaml", "checks/kernels.yaml"]


# Parsed once per file, not once per example (PyYAML's pure-Python parser took most of the
# time); mutate() copies what it changes and leaves the parsed document as it was.
@functools.cache
def shipped_doc(name: str) -> tuple[str, object]:
    original = (ROOT / "images" / name).read_text()
    return original, yaml.load(original, Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))


DUMPER = getattr(yaml, "CSafeDumper", yaml.SafeDumper)


@pytest.mark.parametrize("name", SPEC_FILES)
@SETTINGS
@given(data=st.data())
def test_a_mutated_spec_file_is_loaded_or_refused(scratch, name, data):
    path = scratch / "images" / name
    original, doc = shipped_doc(name)
    path.write_text(yaml.dump(mutate(doc, data), Dumper=DUMPER, sort_keys=False))
    try:
        judged(lambda: load_everything(scratch / "images"))
    finally:
        path.write_text(original)


@pytest.mark.parametrize("name", ["tiny-cpu.yaml", "bases.yaml", "models/k2.6.yaml"])
@SETTINGS
@given(text=st.one_of(st.text(max_size=200), st.binary(max_size=200).map(
    lambda b: b.decode("latin-1"))))
def test_a_spec_file_of_any_text_is_loaded_or_refused(scratch, name, text):
    path = scratch / "images" / name
    original = (ROOT / "images" / name).read_text()
    path.write_text(text)
    try:
        judged(lambda: load_everything(scratch / "images"))
    finally:
        path.write_text(original)


@SETTINGS
@given(data=st.data())
def test_a_mutated_patch_diff_is_loaded_or_refused(scratch, data):
    path = scratch / "images" / "patches" / "sglang-ct-ignore-exact-match.diff"
    original = (ROOT / "images" / "patches" / "sglang-ct-ignore-exact-match.diff").read_text()
    lines = original.splitlines(keepends=True)
    i = data.draw(st.integers(0, len(lines) - 1))
    op = data.draw(st.sampled_from(["drop", "replace", "cut"]))
    if op == "drop":
        lines = lines[:i] + lines[i + 1:]
    elif op == "replace":
        lines[i] = data.draw(st.text(max_size=40)) + "\n"
    else:
        lines = lines[:i]
    path.write_text("".join(lines))
    try:
        judged(lambda: Workspace(scratch / "images", scratch / "lockfiles").patches)
    finally:
        path.write_text(original)


# --- lockfiles -------------------------------------------------------------------------------

LOCK = ROOT / "lockfiles" / "tiny-cpu.py3.11-manylinux_2_36-x86_64.txt"


def rehash(text: str) -> str:
    """Give a mutated body the header hash it would need, so the parser behind the hash check
    is reached too (a hand edit with the hash redone)."""
    lines = text.splitlines(keepends=True)
    i = 0
    while i < len(lines) and lines[i].startswith("#"):
        i += 1
    body = "".join(lines[i:])
    digest = "sha256:" + hashlib.sha256(body.encode()).hexdigest()
    head = "".join(f"# body: {digest}\n" if ln.startswith("# body:") else ln for ln in lines[:i])
    return head + body


@SETTINGS
@given(data=st.data(), fix_hash=st.booleans())
def test_a_mutated_lockfile_is_read_or_refused(tmp_path, data, fix_hash):
    lines = LOCK.read_text().splitlines(keepends=True)
    for _ in range(data.draw(st.integers(1, 3))):
        i = data.draw(st.integers(0, len(lines) - 1))
        op = data.draw(st.sampled_from(["drop", "replace", "dup", "flip"]))
        if op == "drop":
            lines = lines[:i] + lines[i + 1:]
        elif op == "replace":
            lines[i] = data.draw(st.text(max_size=60)) + "\n"
        elif op == "dup":
            lines.insert(i, lines[i])
        elif lines[i].strip():
            j = data.draw(st.integers(0, len(lines[i]) - 1))
            lines[i] = lines[i][:j] + data.draw(st.characters()) + lines[i][j + 1:]
        if not lines:
            break
    text = "".join(lines)
    p = tmp_path / LOCK.name
    p.write_text(rehash(text) if fix_hash else text)
    got = judged(lambda: read_lock(p))
    if not isinstance(got, ImgbuildError):
        assert all(pkg.name and pkg.version and pkg.hashes for pkg in got.packages)


@SETTINGS
@given(raw=st.binary(max_size=300))
def test_a_lockfile_of_any_bytes_is_refused(tmp_path, raw):
    p = tmp_path / LOCK.name
    p.write_bytes(raw)
    assert isinstance(judged(lambda: read_lock(p)), ImgbuildError)


# --- check-model: config.json and the safetensors index ----------------------------------------

SEED_CONFIG = {
    "architectures": ["LlamaForCausalLM"],
    "quantization_config": {
        "quant_method": "compressed-tensors", "format": "mixed-precision",
        "ignore": ["lm_head", "model.layers.0.mlp", "re:.*gate$"],
        "config_groups": {
            "g0": {"targets": ["re:.*mlp.*"], "format": "nvfp4-pack-quantized",
                   "weights": {"num_bits": 4, "type": "float", "strategy": "tensor_group",
                               "group_size": 16},
                   "input_activations": {"num_bits": 4, "type": "float",
                                         "strategy": "tensor_group", "group_size": 16}},
            "g1": {"targets": ["re:.*self_attn.*"], "format": "float-quantized",
                   "weights": {"num_bits": 8, "type": "float", "strategy": "channel"}}}}}
MODULES = [f"model.layers.{i}.{m}" for i in range(2) for m in (
    "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj", "self_attn.q_proj", "self_attn.k_proj")]


WS = Workspace(ROOT / "images", ROOT / "lockfiles")  # read once: the checks below only read it


def check(d: Path, target: str = "sglang-0516-blackwell") -> object:
    return judged(lambda: cm.check_model(WS, str(d), target,
                                         ct_formats={"nvfp4-pack-quantized", "float-quantized",
                                                     "mixed-precision", "pack-quantized"}))


@SETTINGS
@given(data=st.data(), with_index=st.booleans())
def test_a_mutated_checkpoint_config_is_checked_or_refused(tmp_path_factory, data, with_index):
    d = tmp_path_factory.mktemp("ck")
    (d / "config.json").write_text(json.dumps(mutate(SEED_CONFIG, data)))
    if with_index:
        wm = {f"{m}.weight_packed": "model.safetensors" for m in MODULES}
        (d / "model.safetensors.index.json").write_text(json.dumps(
            {"weight_map": mutate(wm, data) if data.draw(st.booleans()) else wm}))
    got = check(d)
    if not isinstance(got, ImgbuildError):
        json.dumps(got.to_dict())  # and the report serializes
        assert got.exit_code in (0, 1)


@SETTINGS
@given(config=values, index=st.one_of(st.none(), values))
def test_any_json_as_a_checkpoint_is_checked_or_refused(tmp_path_factory, config, index):
    d = tmp_path_factory.mktemp("ck")
    (d / "config.json").write_text(json.dumps(config))
    if index is not None:
        (d / "model.safetensors.index.json").write_text(json.dumps(index))
    check(d)


@SETTINGS
@given(raw=st.binary(max_size=200), header_len=st.integers(0, 2**64 - 1))
def test_a_safetensors_file_of_any_bytes_is_read_or_refused(tmp_path_factory, raw, header_len):
    d = tmp_path_factory.mktemp("ck")
    (d / "config.json").write_text(json.dumps(SEED_CONFIG))
    (d / "model.safetensors").write_bytes(header_len.to_bytes(8, "little") + raw)
    check(d)


# --- doctor: logs ----------------------------------------------------------------------------

LOG_LINES = [ln for p in sorted((ROOT / "tests" / "fixtures" / "logs").glob("*.log"))
             for ln in p.read_text(errors="replace").splitlines()]


@pytest.fixture(scope="module")
def failures():
    return WS.failures


@SETTINGS
@given(picked=st.lists(st.sampled_from(LOG_LINES) | st.text(max_size=120), max_size=60),
       cut=st.integers(0, 200))
def test_a_log_of_real_and_random_lines_is_diagnosed(tmp_path_factory, failures, picked, cut):
    text = "\n".join(picked)
    text = text[:len(text) - cut] if cut < len(text) else text
    for d in doctor.diagnose(text, failures):
        assert d.evidence and d.evidence[0].line >= 1 and d.title
    f = tmp_path_factory.mktemp("log") / "server.log"
    f.write_text(text, errors="replace")
    judged(lambda: doctor.doctor(failures, str(f)))


@SETTINGS
@given(raw=st.binary(max_size=400))
def test_a_log_of_any_bytes_is_read(tmp_path_factory, failures, raw):
    f = tmp_path_factory.mktemp("log") / "server.log"
    f.write_bytes(raw)
    got = judged(lambda: doctor.doctor(failures, str(f)))
    assert not isinstance(got, ImgbuildError) or got.exit_code == 2


# What makes doctor name an engine, in pieces a line can hold several of: entry points,
# banners with and without a version, frames, and the wrappers runtimes put in front
# (`kubectl logs --prefix`, compose, timestamps). Several signs on one line, of one weight,
# one with a version and one without, is what `kubectl logs --prefix` gave ([pod/vllm-0/vllm]
# and vLLM's banner) and what crashed the vote (issue 26).
SIGN_PIECES = ["vLLM API server version 0.11.0", "vllm serve", "vllm/entrypoints/x.py",
               "/vllm/v1/engine.py", "LLM engine (v0.6.4.post1)", "vllm==0.9.1", "sglang==0.5.16",
               "sglang/launch_server.py", "sglang/srt/managers/scheduler.py", "/sglang/srt/x.py",
               "vLLM Version: 0.10.0", "INFO 01-01 12:00:00 [api_server.py:1]",
               "[2026-01-01 00:00:00]", "[2026-01-01 00:00:00 TP1]", "(APIServer pid=1)"]
WRAPPERS = ["", "[pod/vllm-0/vllm] ", "[pod/sglang-0/sglang] ", "vllm-1  | ",
            "2026-01-01T00:00:00.000000Z ", "> "]
sign_lines = st.builds(
    lambda wrap, pieces, sep: wrap + sep.join(pieces), st.sampled_from(WRAPPERS),
    st.lists(st.sampled_from(SIGN_PIECES), min_size=1, max_size=4), st.sampled_from([" ", ": "]))


@SETTINGS
@given(picked=st.lists(sign_lines | st.sampled_from(LOG_LINES), min_size=1, max_size=12))
def test_any_mix_of_engine_signs_names_one_engine_or_none(failures, picked):
    text = "\n".join(picked)
    found: list = []
    doctor.diagnose(text, failures, found)
    e = found[0]
    again: list = []
    doctor.diagnose(text, failures, again)
    assert again == found  # the same log, the same answer: no order of hits decides
    if e is not None:
        assert 0 <= e.evidence.line <= len(picked)
        assert e.version is None or e.version in text
        assert e.certain or e.evidence.line >= 1  # a guess points at its line


EXAMPLES = [ex for fp in WS.failures.fingerprints for ex in fp.examples]


@SETTINGS
@given(picked=st.lists(st.sampled_from(EXAMPLES) | st.sampled_from(LOG_LINES)
                       | st.text(max_size=80), max_size=30))
def test_an_answer_never_holds_a_phrase_where_a_value_goes(failures, picked):
    # A value the log does not give is left out of the sentence: never a default phrase in a
    # command (`ss -ltnp | grep :the server wanted` does not run), never a template's marks.
    by_id = {fp.id: fp for fp in failures.fingerprints}
    for d in doctor.diagnose("\n".join(picked), failures):
        fp = by_id.get(d.sentence_of or d.id)
        phrases = {v for _, v in fp.defaults if v} | {dv.default for dv in fp.derive if dv.default}
        for text in (d.title, d.cause, d.fix):
            assert not re.search(r"\{\w+\}|\[\[|\]\]", text), text
            for cmd in re.findall(r"`[^`]*`", text):
                assert not [p for p in phrases if p in cmd], (d.id, cmd)


# --- the CLI, as a user runs it: a sample ----------------------------------------------------

CLI_CASES = [
    ("check-model", "{config}", "--target", "sglang-blackwell"),
    ("doctor", "{log}"),
    ("plan", "tiny-cpu", "--images", "{images}"),
    ("lock", "tiny-cpu", "--check", "--images", "{images}"),
]


@settings(max_examples=12, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(case=st.sampled_from(CLI_CASES), payload=values, raw=st.binary(max_size=120))
def test_the_cli_answers_bad_input_with_a_documented_exit_code(tmp_path_factory, case, payload,
                                                               raw):
    d = tmp_path_factory.mktemp("cli")
    (d / "config.json").write_text(json.dumps(payload))
    (d / "server.log").write_bytes(raw)
    images = d / "images"
    shutil.copytree(ROOT / "images", images)
    shutil.copytree(ROOT / "lockfiles", d / "lockfiles")
    (images / "tiny-cpu.yaml").write_text(yaml.safe_dump(payload))
    args = [a.format(config=d, log=d / "server.log", images=images) for a in case]
    r = run_imgbuild(*args, env={"IMGBUILD_WHEELS": "", "UV_OFFLINE": "1"}, timeout=120)
    assert "Traceback" not in r.stderr + r.stdout, r.stderr[-2000:]
    assert r.returncode in {0} | DOCUMENTED, (args, r.returncode, r.stderr[-1000:])
