"""The cross-package API drift check (imgbuild/checks/drift.py, imgbuild/lock/wheels.py).

Deterministic tests build real wheels and serve them from pypiserver on loopback: a provider
`ctensors` whose enum gains a member in 0.2.0, an engine `eng` whose source refers to it, and
a `pinner` that pins the old provider (the vLLM 0.6.6 role). Tests marked `live` read the
real wheels from PyPI: the committed sglang-blackwell lock passes, and SGLang beside
compressed-tensors 0.8.1 (the failure DESIGN.md describes) is caught.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import threading
from functools import partial
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from imgbuild.catalog.families import load_families
from imgbuild.catalog.models import ModelProfile
from imgbuild.checks import drift
from imgbuild.errors import EnvError, JobFailed, SpecError
from imgbuild.lock import wheels
from imgbuild.lock.lockfile import LockRequest, read_lock, write_lock
from imgbuild.lock.uv import uv_bin, uv_env
from tests.wheelfactory import LocalIndex, WheelSpec, make_wheel

ROOT = Path(__file__).resolve().parent.parent

FAMILY_YAML = r"""
families:
  - name: Fmt
    provider: ctensors
    modules: [ctensors/config/base.py]
    class: Fmt
    kind: enum
    consumers: [eng, absent-engine]
    reference: '\bFmt\.([A-Za-z_][A-Za-z0-9_]*)'
    ignore: [value]
    model:
      quant_method: ctensors
      match: value
"""

BASE_OLD = '''from enum import Enum


class Fmt(str, Enum):
    dense = "dense"
    packed = "packed"
    _ignore_ = ["helper"]

    def describe(self):
        return self.value
'''
BASE_NEW = BASE_OLD.replace('    packed = "packed"\n',
                            '    packed = "packed"\n    nvfp4 = "nvfp4-packed"  # new in 0.2.0\n')

ENGINE = '''"""Engine quantization glue. Mentions Fmt.docstring_only in a docstring."""
from ctensors.config.base import Fmt

# Fmt.comment_only would fail, but it is a comment.
SUPPORTED = [
    Fmt.dense.value,
    Fmt.packed.value,
    Fmt.nvfp4.value,
]


def check(fmt):
    if fmt == Fmt.nvfp4:
        raise ValueError(f"{Fmt.packed.value} expected")
    return "Fmt.string_only"
'''
NVFP4_LINE = ENGINE.splitlines().index("    Fmt.nvfp4.value,") + 1
NVFP4_LINE_2 = ENGINE.splitlines().index("    if fmt == Fmt.nvfp4:") + 1


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.fixture(scope="module")
def index(tmp_path_factory):
    root = tmp_path_factory.mktemp("index")
    idx = LocalIndex(root)
    w = {
        "old": idx.add(WheelSpec("ctensors", "0.1.0", files={
            "ctensors/__init__.py": "", "ctensors/config/base.py": BASE_OLD})),
        # A pre-release that has the member: "first version" means first release.
        "pre": idx.add(WheelSpec("ctensors", "0.2.0rc1", files={
            "ctensors/__init__.py": "", "ctensors/config/base.py": BASE_NEW})),
        "new": idx.add(WheelSpec("ctensors", "0.2.0", files={
            "ctensors/__init__.py": "", "ctensors/config/base.py": BASE_NEW})),
        # 0.3.0 moved the class: found by searching the package, not by the listed module.
        "moved": idx.add(WheelSpec("ctensors", "0.3.0", files={
            "ctensors/__init__.py": "", "ctensors/formats.py": BASE_NEW})),
        "eng": idx.add(WheelSpec("eng", "1.0.0", requires=("ctensors",), files={
            "eng/__init__.py": "", "eng/quant.py": ENGINE})),
        "pinner": idx.add(WheelSpec("pinner", "1.0.0", requires=("ctensors==0.1.0",))),
    }
    idx.start()
    yield idx, w
    idx.stop()


@pytest.fixture()
def env(tmp_path, monkeypatch):
    """A cache of its own, and no default index but the one a test names."""
    monkeypatch.setenv("IMGBUILD_CACHE", str(tmp_path / "cache"))
    for var in ("UV_DEFAULT_INDEX", "UV_INDEX_URL", "PIP_INDEX_URL"):
        monkeypatch.delenv(var, raising=False)
    wheels._pages.clear()  # page memo is per process; each test sees the index afresh
    return tmp_path


@pytest.fixture()
def families(tmp_path) -> tuple[drift.SymbolFamily, ...]:
    d = tmp_path / "images" / "checks"
    d.mkdir(parents=True)
    (d / "drift.yaml").write_text(FAMILY_YAML)
    return load_families(tmp_path / "images")


def lock_of(tmp_path: Path, pins: dict[str, tuple[str, Path, list[str]]]):
    """A lock in uv's format: name -> (version, wheel, via)."""
    body = ""
    for name in sorted(pins):
        version, wheel, via = pins[name]
        body += f"{name}=={version} \\\n    --hash=sha256:{sha256(wheel)}\n"
        if len(via) == 1:
            body += f"    # via {via[0]}\n"
        elif via:
            body += "    # via\n" + "".join(f"    #   {v}\n" for v in via)
    req = LockRequest("drifty", "3.11", "x86_64-manylinux_2_36", tuple(pins))
    return write_lock(tmp_path / "locks" / req.filename(), req, body, "uv (test)")


def old_lock(tmp_path, w):
    return lock_of(tmp_path, {
        "ctensors": ("0.1.0", w["old"], ["eng", "pinner"]),
        "eng": ("1.0.0", w["eng"], ["-r requirements.in"]),
        "pinner": ("1.0.0", w["pinner"], ["-r requirements.in"]),
    })


# --- the check, against a local index ------------------------------------------------------

def test_old_provider_gives_a_finding(index, env, families):
    idx, w = index
    findings = drift.check(old_lock(env, w), families, index_urls=[idx.url])
    assert len(findings) == 1
    f = findings[0]
    assert (f.family, f.symbol, f.source) == ("Fmt", "nvfp4", "engine")
    assert (f.consumer, f.consumer_version) == ("eng", "1.0.0")
    assert (f.file, f.line) == ("eng/quant.py", NVFP4_LINE)
    assert f.code == "Fmt.nvfp4.value,"
    assert f.also == (f"eng/quant.py:{NVFP4_LINE_2}",)
    assert (f.provider, f.provider_version) == ("ctensors", "0.1.0")
    assert f.first_version == "0.2.0"  # not 0.2.0rc1: pre-releases are not offered by >=
    assert f.defined_in == "ctensors/config/base.py"
    assert "pinner==1.0.0 requires ctensors==0.1.0" in f.required_by
    assert "eng==1.0.0 requires ctensors (any version)" in f.required_by

    text = "\n".join(drift.explain(findings))
    assert f"eng 1.0.0 refers to Fmt.nvfp4 at eng/quant.py:{NVFP4_LINE}" in text
    assert "the lock pins ctensors 0.1.0 (required by" in text
    assert "ctensors has Fmt.nvfp4 from 0.2.0 on" in text
    assert "AttributeError: type object 'Fmt' has no attribute 'nvfp4'" in text
    assert "'ctensors>=0.2.0'" in text and "images/drifty.yaml" in text
    err = drift.as_error(findings)
    assert isinstance(err, JobFailed) and err.exit_code == 1 and "ctensors>=0.2.0" in err.hint


def test_comments_docstrings_and_plain_strings_are_not_references(index, env, families):
    idx, w = index
    with wheels.fetch_locked(old_lock(env, w).package("eng"), [idx.url]) as whl:
        refs = drift.scan(whl, families[0])
    syms = {r.symbol for r in refs}
    assert syms == {"dense", "packed", "nvfp4"}  # f-string use counts; comment/docstring not
    assert "value" not in syms  # the family's ignore list


def test_new_provider_is_clean(index, env, families):
    idx, w = index
    lock = lock_of(env, {"ctensors": ("0.2.0", w["new"], ["eng"]),
                         "eng": ("1.0.0", w["eng"], ["-r requirements.in"])})
    assert drift.check(lock, families, index_urls=[idx.url]) == []


def test_moved_class_is_found_by_search(index, env, families):
    idx, w = index
    lock = lock_of(env, {"ctensors": ("0.3.0", w["moved"], ["eng"]),
                         "eng": ("1.0.0", w["eng"], ["-r requirements.in"])})
    assert drift.check(lock, families, index_urls=[idx.url]) == []
    with wheels.fetch_locked(lock.package("ctensors"), [idx.url]) as whl:
        d = drift.definition(whl, families[0])
        assert drift.members(whl, families[0]) == {"dense", "packed", "nvfp4"}
        assert drift.values(whl, families[0]) == {"dense", "packed", "nvfp4-packed"}
    assert d.file == "ctensors/formats.py"
    assert d.members == {"dense": "dense", "packed": "packed", "nvfp4": "nvfp4-packed"}


def test_model_format_missing_is_a_model_finding(index, env, families):
    idx, w = index
    config = {"quantization_config": {
        "format": "mixed", "config_groups": {
            "group_0": {"format": "nvfp4-packed"}, "group_1": {"format": "packed"}}}}
    formats = drift.checkpoint_formats(config, "ckpt/config.json")
    assert formats == [("ckpt/config.json: quantization_config.format", "mixed"),
                       ("ckpt/config.json: quantization_config.config_groups.group_0.format",
                        "nvfp4-packed"),
                       ("ckpt/config.json: quantization_config.config_groups.group_1.format",
                        "packed")]
    lock = lock_of(env, {"ctensors": ("0.1.0", w["old"], ["pinner"]),
                         "pinner": ("1.0.0", w["pinner"], ["-r requirements.in"])})
    findings = drift.check(lock, families, model_formats=formats, index_urls=[idx.url])
    by_symbol = {f.symbol: f for f in findings}
    assert set(by_symbol) == {"mixed", "nvfp4-packed"}  # "packed" exists in 0.1.0
    f = by_symbol["nvfp4-packed"]
    assert f.source == "model" and f.line is None
    assert f.file == "ckpt/config.json: quantization_config.config_groups.group_0.format"
    assert (f.provider_version, f.first_version) == ("0.1.0", "0.2.0")
    assert by_symbol["mixed"].first_version is None  # no release has it
    text = "\n".join(drift.explain(findings))
    assert "ValueError: 'nvfp4-packed' is not a valid Fmt" in text


def test_profile_formats_only_for_the_familys_quant_method(families):
    p = ModelProfile("m", "images/models/m.yaml", "M", "org/m", 1.0, "ctensors",
                     ("nvfp4-packed",), "", 1)
    assert drift.profile_formats(p, families) == [
        ("images/models/m.yaml: quantization.formats[0]", "nvfp4-packed")]
    other = ModelProfile("m", "images/models/m.yaml", "M", "org/m", 1.0, "gptq", ("x",), "", 1)
    assert drift.profile_formats(other, families) == []


def test_absent_consumer_and_provider_are_skipped(index, env, families):
    idx, w = index
    only_pinner = lock_of(env, {"ctensors": ("0.1.0", w["old"], ["pinner"]),
                                "pinner": ("1.0.0", w["pinner"], ["-r requirements.in"])})
    assert drift.check(only_pinner, families, index_urls=[idx.url]) == []
    no_provider = lock_of(env, {"pinner": ("1.0.0", w["pinner"], ["-r requirements.in"])})
    assert drift.check(no_provider, families, index_urls=["http://127.0.0.1:9/simple/"]) == []


def test_second_run_reads_the_cache_only(tmp_path_factory, env, families):
    """With the index gone, a repeated check answers the same from the cache."""
    idx = LocalIndex(tmp_path_factory.mktemp("index2"))
    w = {"old": idx.add(WheelSpec("ctensors", "0.1.0", files={
             "ctensors/__init__.py": "", "ctensors/config/base.py": BASE_OLD})),
         "new": idx.add(WheelSpec("ctensors", "0.2.0", files={
             "ctensors/__init__.py": "", "ctensors/config/base.py": BASE_NEW})),
         "eng": idx.add(WheelSpec("eng", "1.0.0", requires=("ctensors",), files={
             "eng/__init__.py": "", "eng/quant.py": ENGINE})),
         "pinner": idx.add(WheelSpec("pinner", "1.0.0", requires=("ctensors==0.1.0",)))}
    idx.start()
    try:
        lock = old_lock(env, w)
        first = drift.check(lock, families, index_urls=[idx.url])
    finally:
        idx.stop()
    wheels._pages.clear()
    assert drift.check(lock, families, index_urls=[idx.url]) == first
    assert first and first[0].first_version == "0.2.0"
    members = json.loads((env / "cache" / "drift" / "members.json").read_text())
    assert any(k.startswith("ctensors==0.1.0|Fmt|") for k in members)
    assert list((env / "cache" / "wheels").glob("*/eng-1.0.0-py3-none-any.whl"))


# --- fetching: hashes, errors, Range ---------------------------------------------------------

def test_no_file_with_a_locked_hash_is_a_job_failure(index, env):
    idx, w = index
    bad = LockRequest("bad", "3.11", "x86_64-manylinux_2_36", ("eng",))
    lock = write_lock(env / "bad.txt", bad, "eng==1.0.0 \\\n    --hash=sha256:" + "0" * 64 + "\n",
                      "uv (test)")
    with pytest.raises(JobFailed) as e:
        wheels.fetch_locked(lock.package("eng"), [idx.url])
    msg = e.value.message + " ".join(e.value.facts)
    assert "eng 1.0.0" in msg and "sha256:0000000000" in msg
    assert "eng-1.0.0-py3-none-any.whl" in msg  # what the index has instead


def test_unreachable_index_is_an_environment_error(env):
    pkg = read_lock(next((ROOT / "lockfiles").glob("tiny-cpu*.txt"))).packages[0]
    with pytest.raises(EnvError) as e:
        wheels.fetch_locked(pkg, ["http://127.0.0.1:9/simple/"])
    assert e.value.exit_code == 3
    assert "http://127.0.0.1:9/simple/" in e.value.message


def test_index_env_vars_are_honoured(monkeypatch):
    monkeypatch.delenv("UV_DEFAULT_INDEX", raising=False)
    monkeypatch.delenv("UV_INDEX_URL", raising=False)
    monkeypatch.setenv("PIP_INDEX_URL", "http://mirror.example/simple")
    assert wheels.index_urls(["https://extra.example/simple/"]) == (
        "http://mirror.example/simple/", "https://extra.example/simple/")
    monkeypatch.setenv("UV_INDEX_URL", "http://uv.example/simple/")
    assert wheels.default_index_urls() == ("http://uv.example/simple/",)


def test_range_reads_only_what_is_needed(tmp_path, env, monkeypatch):
    """A wheel with a big binary member: Range mode reads the .py files, not the binary."""
    idx = LocalIndex(tmp_path / "bigindex")
    spec = WheelSpec("big", "1.0.0", tag="cp311-cp311-manylinux_2_28_x86_64", files={
        "big/__init__.py": "", "big/quant.py": ENGINE,
        # incompressible, so the zip really is big
        "big/_kernels.so": os.urandom(3 << 20).hex()})
    path = idx.add(spec)
    idx.start()
    try:
        f = wheels.project_files("big", idx.url)[0]
        with wheels.open_file(f, expect={sha256(path)}, what="big==1.0.0", mode="range") as w:
            assert w.mode == "range"
            assert w.read_text("big/quant.py") == ENGINE  # checked against RECORD too
            assert dict(wheels.iter_py(w))["big/quant.py"] == ENGINE.encode()
            assert w.transferred < path.stat().st_size // 2
        wheels._pages.clear()
        with wheels.open_file(f, expect={sha256(path)}, what="big==1.0.0", mode="full") as w:
            assert w.mode == "full" and w.transferred == path.stat().st_size
        with wheels.open_file(f, expect={sha256(path)}, what="big==1.0.0", mode="range") as w:
            assert w.mode == "cache" and w.transferred == 0  # a kept full download wins
    finally:
        idx.stop()


class _NoRangeJSONIndex(SimpleHTTPRequestHandler):
    """A PEP 691 JSON index whose file server ignores Range (answers 200 with everything)."""

    def do_GET(self):  # noqa: N802
        root = Path(self.directory)
        if self.path.startswith("/simple/"):
            name = self.path.split("/")[2]
            files = [{"filename": p.name, "url": f"/files/{p.name}",
                      "hashes": {"sha256": sha256(p)}, "size": p.stat().st_size}
                     for p in sorted(root.glob(f"{name}-*.whl"))]
            body = json.dumps({"meta": {"api-version": "1.0"}, "name": name,
                               "files": files}).encode()
            self.send_response(200 if files else 404)
            self.send_header("Content-Type", "application/vnd.pypi.simple.v1+json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)
            return
        self.path = self.path.replace("/files/", "/", 1)
        super().do_GET()

    def log_message(self, *a):
        pass


def test_json_index_without_range_falls_back_to_a_full_download(tmp_path, env):
    d = tmp_path / "plain"
    path = make_wheel(WheelSpec("ctensors", "0.2.0", files={
        "ctensors/__init__.py": "", "ctensors/config/base.py": BASE_NEW}), d)
    srv = ThreadingHTTPServer(("127.0.0.1", 0), partial(_NoRangeJSONIndex, directory=str(d)))
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{srv.server_address[1]}/simple/"
    try:
        f = wheels.project_files("ctensors", url)[0]
        assert f.size == path.stat().st_size and f.sha256 == sha256(path)
        with wheels.open_file(f, expect={sha256(path)}, what="ctensors==0.2.0", mode="range") as w:
            assert w.mode == "full"  # the server answered 200: taken whole, verified, kept
            assert "nvfp4" in w.read_text("ctensors/config/base.py")
        assert wheels.cached_wheel(sha256(path)) is not None
        assert [str(v) for v in wheels.list_versions("ctensors", [url])] == ["0.2.0"]
    finally:
        srv.shutdown()


# --- the families file -----------------------------------------------------------------------

def test_repository_families_load():
    fams = load_families(ROOT / "images")
    cf = next(f for f in fams if f.name == "CompressionFormat")
    assert cf.provider == "compressed-tensors" and cf.kind == "enum"
    assert {"sglang", "vllm"} <= set(cf.consumers)
    assert cf.modules == ("compressed_tensors/config/base.py",)
    assert cf.model_quant_method == "compressed-tensors"
    line = "x = CompressionFormat.nvfp4_pack_quantized.value  # CompressionFormat.no"
    assert drift.scan_text(line + "\n", "f.py", cf) == [
        drift.Reference("nvfp4_pack_quantized", "f.py", 1, line)]


@pytest.mark.parametrize("yaml_text,key", [
    ("families:\n  - {name: X, provider: p, class: X, consumers: [a], reference: 'X\\.'}\n",
     "families[0].reference"),
    ("families:\n  - {name: X, provider: p, class: X, consumers: [a], reference: 'X\\.(\\w+)', "
     "kind: table}\n", "families[0].kind"),
    ("families:\n  - {name: X, provider: p, class: X, consumers: [a], reference: 'X\\.(\\w+)', "
     "consumer: [b]}\n", "families[0].consumer"),
])
def test_bad_families_name_the_key(tmp_path, yaml_text, key):
    (tmp_path / "images" / "checks").mkdir(parents=True)
    (tmp_path / "images" / "checks" / "drift.yaml").write_text(yaml_text)
    with pytest.raises(SpecError) as e:
        load_families(tmp_path / "images")
    assert "images/checks/drift.yaml" in e.value.message and key in e.value.message
    assert e.value.exit_code == 2


def test_definition_of_source_this_python_cannot_parse(families):
    # PEP 695 (3.12) syntax: ast on 3.11 refuses it, the indentation reader does not.
    text = ("type Alias = int\n\nclass Fmt(str, Enum):\n    dense = 'dense'\n"
            "    nvfp4 = \"nvfp4-packed\"\n    _x_ = 1\n\nX = 1\n")
    assert drift._parse_definition(text, families[0]) == {"dense": "dense",
                                                           "nvfp4": "nvfp4-packed"}


# --- live: real wheels from PyPI -------------------------------------------------------------

@pytest.fixture()
def live_env(monkeypatch):
    # The user's cache (reruns are fast) and PyPI unless a mirror is configured.
    monkeypatch.setenv("UV_PYTHON_DOWNLOADS", "never")
    wheels._pages.clear()


@pytest.mark.live
def test_live_committed_sglang_blackwell_lock_is_clean(live_env):
    from .conftest import checkout_workspace

    ws = checkout_workspace()
    cat, ref = ws.catalog, ws.target("sglang-blackwell")
    req, lock = ref.request, ref.lock()
    fams = load_families(ROOT / "images")
    formats = [x for m in ("tiny-nvfp4", "k2.6") for x in drift.profile_formats(cat.model(m), fams)]
    assert formats  # the profiles are compressed-tensors: their formats are checked too
    assert lock.package("compressed-tensors").version == "0.18.0"
    findings = drift.check(lock, fams, model_formats=formats,
                           index_urls=wheels.index_urls(req.extra_index_urls))
    assert findings == [], drift.explain(findings)


@pytest.mark.live
def test_live_sglang_beside_compressed_tensors_0_8_1_is_caught(live_env, tmp_path):
    req = LockRequest("sglang-old-ct", "3.11", "x86_64-manylinux_2_36",
                      ("sglang==0.5.10", "compressed-tensors==0.8.1"))
    (tmp_path / "requirements.in").write_text("\n".join(req.requirements) + "\n")
    proc = subprocess.run(
        [uv_bin(), "pip", "compile", "requirements.in", "--generate-hashes", "--no-header",
         "--python-version", req.python, "--python-platform", req.uv_platform, "--quiet",
         "--no-progress", "-o", "out.txt"],
        cwd=tmp_path, capture_output=True, text=True, env=uv_env(), timeout=300)
    assert proc.returncode == 0, proc.stderr
    lock = write_lock(tmp_path / req.filename(), req, (tmp_path / "out.txt").read_text(), "uv")
    findings = drift.check(lock, load_families(ROOT / "images"),
                           model_formats=[("images/models/tiny-nvfp4.yaml: quantization.formats[0]",
                                           "nvfp4-pack-quantized")])
    f = next(f for f in findings if f.symbol == "nvfp4_pack_quantized")
    assert (f.consumer, f.consumer_version) == ("sglang", "0.5.10")
    assert (f.provider_version, f.first_version) == ("0.8.1", "0.10.0")
    assert f.file.startswith("sglang/srt/") and f.file.endswith(".py") and f.line > 0
    assert "CompressionFormat.nvfp4_pack_quantized" in f.code
    m = next(f for f in findings if f.source == "model")
    assert (m.symbol, m.first_version) == ("nvfp4-pack-quantized", "0.10.0")
    text = "\n".join(drift.explain(findings))
    assert (f"sglang 0.5.10 refers to CompressionFormat.nvfp4_pack_quantized "
            f"at {f.file}:{f.line}") in text
    assert "compressed-tensors has CompressionFormat.nvfp4_pack_quantized from 0.10.0 on" in text


FAM = "families:\n  - {name: X, provider: Ctensors_X, class: Fmt, consumers: [a], "


@pytest.mark.parametrize("tail, said", [
    ("reference: 'Fmt\\.'}\n",
     "families[0].reference: expected a regular expression with a group for the symbol, e.g. "
     "'\\bName\\.(\\w+)', got 'Fmt\\\\.'"),
    ("reference: 'Fmt\\.(\\w+', kind: enum}\n",
     "families[0].reference: expected a valid regular expression, got \"'Fmt\\\\\\\\.(\\\\\\\\w+' "
     "(missing ), unterminated subpattern at position 5)\""),
    ("reference: 'Fmt\\.(\\w+)', kind: table}\n",
     "families[0].kind: expected one of enum, class, got 'table'"),
    ("reference: 'Fmt\\.(\\w+)', model: {match: key}}\n",
     "families[0].model.match: expected 'value' (models declare enum values), got 'key'"),
    ("}\n", "families[0].reference: expected a regular expression whose group 1 is the symbol "
            "(required key is missing)"),
])
def test_a_bad_family_word_for_word(tmp_path, tail, said):
    (tmp_path / "images" / "checks").mkdir(parents=True)
    (tmp_path / "images" / "checks" / "drift.yaml").write_text(FAM + tail)
    with pytest.raises(SpecError) as e:
        load_families(tmp_path / "images")
    assert e.value.message == f"images/checks/drift.yaml: {said}"


def test_a_family_read_with_its_defaults(tmp_path):
    (tmp_path / "images" / "checks").mkdir(parents=True)
    (tmp_path / "images" / "checks" / "drift.yaml").write_text(
        FAM + "reference: '\\bFmt\\.(\\w+)', modules: [m/base.py], ignore: [Fmt.other], "
        "model: {quant_method: ctensors}}\n"
        "  - {name: Y, provider: p, class: Yc, consumers: [a], reference: 'Other\\.(\\w+)', "
        "kind: class}\n"
        "  - {name: Z, provider: p, class: Zc, consumers: [a], reference: 'Z\\.(\\w+)', "
        "needle: Zed}\n")
    x, y, z = load_families(tmp_path / "images")
    assert (x.name, x.provider, x.kind, x.modules, x.class_name, x.consumers) == (
        "X", "ctensors-x", "enum", ("m/base.py",), "Fmt", ("a",))
    assert (x.ignore, x.needle, x.model_quant_method, x.model_match) == (
        ("Fmt.other",), "Fmt", "ctensors", "value")
    assert x.source == "images/checks/drift.yaml"
    # The class name is the prefilter only where the reference spells it out.
    assert (y.kind, y.needle, y.ignore, y.model_quant_method) == ("class", None, (), None)
    assert z.needle == "Zed"  # as given
