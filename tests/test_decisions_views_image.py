"""What the build, pull, smoke, size, preflight, base and smoke-model reports say
(imgbuild/cli/views/image.py), as a pipe or CI's log shows them: the whole text for plain data,
and the JSON document beside it. No Engine: the values are what the stages return."""

from __future__ import annotations

import io
import json
from pathlib import Path
from types import SimpleNamespace

import pytest
from rich.console import Console

from imgbuild.cli.console import Output
from imgbuild.cli.views import image as views
from imgbuild.image import attest
from imgbuild.image.base import BaseResult
from imgbuild.image.sizes import SizeReport
from imgbuild.image.smoke import SmokeReport
from imgbuild.payload import preflight as pf
from imgbuild.payload.preflight import ImageFacts, ModelFacts
from imgbuild.pipeline.index import Assembled
from imgbuild.pipeline.preflight import Preflight
from imgbuild.pipeline.pull import PullOutcome

RECORDED = Path(__file__).parent / "fixtures" / "nvidia-smi"


def text(view, *args, **kw) -> str:
    """The view's text as a pipe gets it (not a terminal: one record per line)."""
    buf = io.StringIO()
    # As make_output sets it for a pipe: a line is not folded.
    out = Output(False, Console(file=buf, width=100, highlight=False, color_system=None,
                                soft_wrap=True), Console(file=io.StringIO()))
    view(out, *args, **kw)
    return buf.getvalue()


def as_json(capsys, view, *args, **kw) -> dict:
    out = Output(True, Console(file=io.StringIO()), Console(file=io.StringIO()))
    view(out, *args, **kw)
    return json.loads(capsys.readouterr().out)


SIZE = SizeReport(
    "reg/img:t", 1_234_567_890, 4321,
    # oldest first; a step that adds no bytes is left out; the shell prefix is dropped
    (("/bin/sh -c apt-get install -y curl", 50_000_000), ("COPY x /x", 0),
     ("RUN uv pip install -r heavy.txt", 900_000_000),
     ("RUN uv pip install -r rest.txt " + "x" * 100, 284_567_890),
     *((f"RUN step {i}", 1_000_000 + i) for i in range(6))),
    (("python", 1_000_000_000), ("native library", 200_000_000), ("static library", 30_000_000),
     ("test file", 4_567_890)),
    (("torch", 700_000_000), ("triton", 200_000_000), ("numpy", 90_000_000)),
    {"torch": {"python": 150_000_000, "native library": 500_000_000, "test file": 10_000_000,
               "static library": 40_000_000}},
    ({"size": 2_000_000, "paths": ["/a/libx.so", "/b/libx.so", "/c/libx.so"]},
     {"size": 1_500_000, "paths": ["/d/y", "/e/y"]},
     {"size": 1_100_000, "paths": ["/f/z", "/g/z"]}))


def test_size_largest_first_each_table_capped_and_the_dead_weight_summed():
    # A command is cut at 90 characters; eight layers at most.
    assert text(views.size, SIZE, top=2) == f"""\
reg/img:t: 1.23 GB in 4,321 files
layers (largest first)
size     created by
0.90 GB  RUN uv pip install -r heavy.txt
0.28 GB  RUN uv pip install -r rest.txt {"x" * 59}
50.0 MB  apt-get install -y curl
1.0 MB   RUN step 5
1.0 MB   RUN step 4
1.0 MB   RUN step 3
1.0 MB   RUN step 2
1.0 MB   RUN step 1
by kind
kind            size     share
python          1.00 GB  81.0%
native library  0.20 GB  16.2%
static library  30.0 MB  2.4%
test file       4.6 MB   0.4%
by package (top 2)
package  size     of which
torch    0.70 GB  native library 0.50 GB, python 0.15 GB, static library 40.0 MB
triton   0.20 GB
the same bytes more than once (1 MiB or more)
size    copies  paths
2.0 MB  3       /a/libx.so, /b/libx.so, /c/libx.so
1.5 MB  2       /d/y, /e/y
dead weight: static library 30.0 MB, test file 4.6 MB, duplicate copies 6.6 MB (total 41.2 MB, 3.3%)
"""


def test_size_without_duplicates_or_bytes_says_so():
    empty = SizeReport("img", 0, 0, (), (), (), {}, ())
    assert text(views.size, empty) == """\
img: 0.0 MB in 0 files
layers (largest first)
size  created by
by kind
kind  size  share
by package (top 15)
package  size  of which
dead weight: static library 0.0 MB, test file 0.0 MB, duplicate copies 0.0 MB (total 0.0 MB, 0.0%)
"""


def test_size_as_json_is_the_report(capsys):
    doc = as_json(capsys, views.size, SIZE)
    assert doc == json.loads(json.dumps(SIZE.to_dict()))


def test_sizes_switch_to_gigabytes_at_a_tenth():
    assert views._gb(99_999_999) == "100.0 MB"
    assert views._gb(100_000_000) == "0.10 GB"


SMOKE = SmokeReport("reg/img:t", False, (
    {"name": "environment", "status": "pass", "duration_s": 0.123},
    {"name": "checkpoint-cpu", "status": "fail", "duration_s": 5.1, "reason": "logits differ"},
    {"name": "gpu-engine", "status": "skipped"}), 5.3, {})


def test_smoke_table_names_each_stage_and_the_verdict(capsys):
    assert text(views.smoke, "reg/img:t", SMOKE) == """\
smoke reg/img:t: FAILED
stage           status   seconds  reason
environment     pass     0.12
checkpoint-cpu  fail     5.10     logits differ
gpu-engine      skipped  0.00
"""
    passed = SmokeReport("i", True, ({"name": "environment", "status": "pass",
                                      "duration_s": 1},), 1.0, {})
    assert text(views.smoke, "i", passed).splitlines()[0] == "smoke i: passed"
    assert as_json(capsys, views.smoke, "i", SMOKE) == SMOKE.to_dict() | {"ok": False}


def test_base_lists_every_field(capsys):
    res = BaseResult("imgbuild-base:x", "sha256:abc", 12.345, 161040567, True,
                     ("r/b:x@sha256:1",), "sha256:fs")
    assert text(views.base, "debian-bookworm", res) == """\
base debian-bookworm
image       imgbuild-base:x
image_id    sha256:abc
built       True
seconds     12.3
size_bytes  161040567
rootfs      sha256:fs
pushed      ['r/b:x@sha256:1']
"""
    assert as_json(capsys, views.base, "k", res) == {
        "image": "imgbuild-base:x", "image_id": "sha256:abc", "built": True, "seconds": 12.3,
        "size_bytes": 161040567, "rootfs": "sha256:fs", "pushed": ["r/b:x@sha256:1"]}


def test_digests_say_which_tag_is_gone(capsys):
    found = {"nvidia/cuda:13.0.1-devel": "sha256:aa", "nvidia/cuda:13.0.1-base": None}
    assert text(views.digests, found) == """\
nvidia/cuda digests (images/bases.yaml)
image                     digest
nvidia/cuda:13.0.1-devel  sha256:aa
nvidia/cuda:13.0.1-base   tag not found
"""
    assert as_json(capsys, views.digests, found) == {"digests": found}


def test_smoke_model_rows_and_their_empty_forms(capsys):
    doc = {"model": "tiny-nvfp4", "path": "/c/m", "key": "k1", "files": 5, "bytes": 1_890_000,
           "versions": {"torch": "2.13.0", "compressed-tensors": "0.19.0"}, "pushed": None}
    assert text(views.smoke_model, doc) == """\
smoke model tiny-nvfp4
path       /c/m
key        k1
files      5 (1.89 MB)
made with  torch 2.13.0, compressed-tensors 0.19.0
pushed     no
"""
    bare = doc | {"key": None, "versions": None, "pushed": "r/m:k1@sha256:9"}
    assert text(views.smoke_model, bare) == """\
smoke model tiny-nvfp4
path       /c/m
key
files      5 (1.89 MB)
made with
pushed     r/m:k1@sha256:9
"""
    assert as_json(capsys, views.smoke_model, doc) == doc


def _preflight(host: str, facts: ImageFacts) -> Preflight:
    return Preflight("target sglang-blackwell --model k2.6",
                     pf.run(facts, runner=pf.recording_runner(RECORDED / host)))


K26 = ImageFacts(archs=("sm100", "sm120"), cuda="13.0", min_driver="580.65.06",
                 model=ModelFacts("k2.6", 595.0, 8), cpu_arch="x86_64")


def test_preflight_names_the_subject_each_verdict_and_the_failed_checks(capsys):
    got = text(views.preflight, _preflight("rtx-pro-6000-8x-stale-gpu0", K26))
    lines = [ln.rstrip() for ln in got.splitlines()]
    assert lines[0] == "preflight: this host for target sglang-blackwell --model k2.6"
    assert lines[-1] == "preflight failed (gpus free): the server would not start here"
    assert [ln.split("│")[1:3] for ln in lines if "│ " in ln][:3] == [
        [" cpu        ", " skip    "], [" nvidia-smi ", " pass    "], [" arch       ", " pass    "]]
    assert "│ gpus free  │ fail    │ GPU0 has 55.0 GiB in use (pid 2841907" in got
    ok = text(views.preflight, _preflight("rtx-pro-6000-8x-ok", K26))
    assert ok.splitlines()[-1] == "preflight ok: no check failed"
    r = _preflight("b200-8x-driver-570", K26)
    assert text(views.preflight, r).splitlines()[-1].startswith("preflight failed (driver")
    assert as_json(capsys, views.preflight, r) == json.loads(json.dumps(r.report.to_dict()))


def test_preflight_marks_each_status_in_its_colour():
    assert views.PREFLIGHT_STYLE == {pf.PASS: "bold green", pf.FAIL: "bold red",
                                     pf.WARN: "bold yellow", pf.SKIP: "dim"}
    buf = io.StringIO()
    out = Output(False, Console(file=buf, width=200, force_terminal=True, color_system="standard"),
                 Console(file=io.StringIO()))
    views.preflight(out, _preflight("rtx-pro-6000-8x-stale-gpu0", K26))
    said = buf.getvalue()
    assert "\x1b[1;31mfail" in said and "\x1b[1;32mpass" in said  # bold red, bold green


def _pull(**kw) -> PullOutcome:
    base = dict(plan=SimpleNamespace(target="tiny-cpu"), ref="r/i:tiny-cpu-abc",
                digest="sha256:d1", registry_digest="sha256:d1", platform="linux/amd64",
                platform_why="this host's", moving=("r/i:tiny-cpu",))
    return PullOutcome(**(base | kw))


def test_pull_rows_with_an_index_a_verification_and_the_tags(capsys):
    v = attest.Verification("r/i:tiny-cpu-abc", "sha256:d1", (
        ("signature", True, "key k1"), ("provenance", False, "missing")))
    o = _pull(report={"ok": True, "stages": [{"name": "environment", "status": "pass"}]},
              verified=v, index_digest="sha256:ix")
    assert text(views.pull, o) == """\
pulled tiny-cpu
platform    linux/amd64 (this host's)
image       r/i:tiny-cpu-abc
digest      sha256:d1
from index  sha256:ix
smoke       passed; environment pass
verified    ok  signature: key k1
            NO  provenance: missing
tags        r/i:tiny-cpu-abc
            r/i:tiny-cpu
"""
    assert as_json(capsys, views.pull, o) == json.loads(json.dumps(o.to_dict()))


@pytest.mark.parametrize("report, row", [
    (None, "no smoke report stored for this digest: moving tags not set"),
    ({"ok": False, "forced": True, "stages": []}, "FAILED (tags moved with --force); "),
    ({"ok": False, "stages": [{"name": "a", "status": "fail"}, {"name": "b", "status": "pass"}]},
     "FAILED; a fail, b pass"),
])
def test_pull_smoke_row(report, row):
    lines = text(views.pull, _pull(report=report)).splitlines()
    assert [ln for ln in lines if ln.startswith("smoke")] == [f"smoke     {row}".rstrip()]
    assert not any(ln.startswith(("from index", "verified")) for ln in lines)


def test_indexes_list_manifests_pushes_and_who_signed(capsys):
    plan = SimpleNamespace(target="tiny-cpu-multi", content_tag="r/i:m-1", refs=("r/i:m",))
    signed = Assembled(plan, "sha256:ix", (("linux/amd64", "sha256:a"), ("linux/arm64",
                                                                         "sha256:b")),
                       ("r/i:m-1@sha256:ix", "r/i:m@sha256:ix"), ("r/i:sha256-ix.sig",),
                       {"method": "key", "key": "k1"})
    unsigned = Assembled(plan, "sha256:iy", (("linux/amd64", "sha256:c"),),
                         ("r/i:m-2@sha256:iy",))
    assert text(views.indexes, [signed, unsigned]) == """\
tiny-cpu-multi: index assembled
manifests  linux/amd64: sha256:a
           linux/arm64: sha256:b
pushed     r/i:m-1@sha256:ix
           r/i:m@sha256:ix
signed     with the key k1
           r/i:sha256-ix.sig
tiny-cpu-multi: index assembled
manifests  linux/amd64: sha256:c
pushed     r/i:m-2@sha256:iy
"""
    assert as_json(capsys, views.indexes, [signed]) == {"indexes": [signed.to_dict()]}


def _v(ref: str, digest: str, *checks) -> attest.Verification:
    return attest.Verification(ref, digest, tuple(checks))


def test_verification_table_and_its_verdict(capsys):
    good = _v("r/i:t", "sha256:d1", ("signature", True, "key k1"), ("sbom", True, "present"))
    bad = _v("r/i:t", "sha256:d1", ("signature", False, "no signature"))
    assert text(views.verification, good) == """\
verify r/i:t: ok (sha256:d1)
check      result  detail
signature  ok      key k1
sbom       ok      present
"""
    assert text(views.verification, bad).splitlines()[:3] == [
        "verify r/i:t: FAILED (sha256:d1)", "check      result  detail",
        "signature  FAILED  no signature"]
    assert as_json(capsys, views.verification, bad) == json.loads(json.dumps(bad.to_dict()))


def test_index_verification_the_index_then_each_platform(capsys):
    found = {"linux/amd64": _v("r/i:m", "sha256:a", ("signature", True, "key k1")),
             "linux/arm64": _v("r/i:m", "sha256:b", ("signature", False, "none"))}
    own = [("index signature", True, "key k1")]
    assert text(views.index_verification, "r/i:m", "sha256:ix", found, own) == """\
r/i:m is an index (sha256:ix) of linux/amd64, linux/arm64
the index itself: ok
check            result  detail
index signature  ok      key k1
linux/amd64: ok (sha256:a)
check      result  detail
signature  ok      key k1
linux/arm64: FAILED (sha256:b)
check      result  detail
signature  FAILED  none
"""
    said = text(views.index_verification, "r/i:m", "sha256:ix", {},
                [("index signature", False, "none")])
    assert said.splitlines()[:4] == ["r/i:m is an index (sha256:ix) of nothing",
                                     "the index itself: FAILED", "check            result  detail",
                                     "index signature  FAILED  none"]
    # No policy, no checks of its own: no table for it.
    assert "the index itself" not in text(views.index_verification, "r/i:m", "sha256:ix", found)
    doc = as_json(capsys, views.index_verification, "r/i:m", "sha256:ix", found, own)
    assert doc == {"ref": "r/i:m", "index_digest": "sha256:ix", "ok": False,
                   "checks": [{"check": "index signature", "ok": True, "detail": "key k1"}],
                   "platforms": {p: json.loads(json.dumps(v.to_dict()))
                                 for p, v in found.items()}}
    both_ok = {"linux/amd64": found["linux/amd64"]}
    assert as_json(capsys, views.index_verification, "r", "d", both_ok, own)["ok"] is True


def test_signature_policy_says_what_was_checked_and_cosigns_command(tmp_path, capsys):
    from imgbuild.catalog.registries import SignPolicy

    assert text(views.signature_policy, None, "r.example/team/img", []) == (
        "signatures: not checked (no signed-by policy for r.example/team/img in "
        "images/registries.yaml; `--key PUB` checks one)\n")
    policy = SignPolicy(where=str(tmp_path / "images" / "registries.yaml"), key="keys/pub.pem")
    found = [_v("r", "sha256:first", ("signature", True, "k"))]
    said = text(views.signature_policy, policy, "127.0.0.1:5000/team/img", found)
    assert said.startswith("cosign checks the same: cosign verify --key "
                           f"{tmp_path / 'images' / 'keys' / 'pub.pem'}")
    assert "127.0.0.1:5000/team/img@sha256:first" in said
    assert "--allow-insecure-registry --allow-http-registry" in said  # a loopback registry
    said = text(views.signature_policy, policy, "r.example/team/img", found,
                index_digest="sha256:ix")
    assert "r.example/team/img@sha256:ix" in said and "--allow-http-registry" not in said
    # Nothing to name a digest of: no command.
    assert text(views.signature_policy, policy, "r.example/team/img", []) == ""
    # --json: verify's document says it all; nothing is printed here.
    out = Output(True, Console(file=io.StringIO()), Console(file=io.StringIO()))
    views.signature_policy(out, policy, "r.example/team/img", found)
    assert capsys.readouterr().out == ""


def test_sizes_round_half_up_at_the_shown_digit():
    # 0.135 GB and 1.35 MB sit on a rounding edge: the exact quotient rounds up.
    assert views._gb(135_000_000) == "0.14 GB"
    assert views._gb(1_350_000) == "1.4 MB"
    doc = {"model": "m", "path": "/p", "key": None, "files": 1, "bytes": 1_235_000,
           "versions": None, "pushed": None}
    assert "files      1 (1.24 MB)" in text(views.smoke_model, doc)


def test_a_packages_kinds_are_listed_largest_first_not_by_name():
    rep = SizeReport("i", 1_000_000_000, 1, (), (), (("torch", 700_000_000),),
                     {"torch": {"python": 10_000_000, "native library": 500_000_000,
                                "test file": 60_000_000, "static library": 40_000_000}}, ())
    [row] = [ln for ln in text(views.size, rep).splitlines() if ln.startswith("torch")]
    assert row.endswith("native library 0.50 GB, test file 60.0 MB, static library 40.0 MB")


def test_the_policy_lines_are_printed_as_they_are_on_a_terminal(tmp_path):
    """A key path is printed as it is: no markup read from it, no colours added to it."""
    from imgbuild.catalog.registries import SignPolicy

    buf = io.StringIO()
    out = Output(False, Console(file=buf, width=300, force_terminal=True,
                                color_system="standard", soft_wrap=True),
                 Console(file=io.StringIO()))
    policy = SignPolicy(where=str(tmp_path / "images" / "registries.yaml"),
                        key="/keys/[prod]/pub.pem")
    views.signature_policy(out, policy, "r.example/team/img",
                           [_v("r", "sha256:1", ("signature", True, "k"))])
    views.signature_policy(out, None, "r.example/team/img", [])
    said = buf.getvalue()
    assert "--key /keys/[prod]/pub.pem" in said
    assert "\x1b[" not in said
