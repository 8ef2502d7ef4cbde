"""Decision tests for imgbuild/ci/: the pure helpers `imgbuild outdated` and `imgbuild relock`
decide with (which spec line an upgrade edits, which pin is the target's own, what the report
says), on plain strings. No network, no Docker."""

from __future__ import annotations

import pytest
from packaging.version import Version

from imgbuild.ci import outdated as od
from imgbuild.errors import InputError

SPEC = """\
name: t
engine:
  name: sglang
  version: "0.5.9"  # the engine
python: "3.12"
requirements:
  - torch==2.13.0
  - sglang[all]==0.5.9 ; platform_machine == 'x86_64'
  # - torch==2.13.0 (a comment is never edited)
other:
  version: "0.5.9"
"""


def test_engine_version_edit_keeps_quotes_and_comments_and_touches_the_engine_only():
    got = od.edit_engine_version(SPEC, "0.5.9", "0.5.10")
    assert '  version: "0.5.10"  # the engine\n' in got
    assert 'other:\n  version: "0.5.9"\n' in got  # not under engine:
    assert od.edit_engine_version(SPEC, "0.5.8", "0.5.10") is None
    flow = "engine: {name: sglang, version: '0.5.9'}\n"
    assert od.edit_engine_version(flow, "0.5.9", "0.5.10") == \
        "engine: {name: sglang, version: '0.5.10'}\n"
    # 0.5.9 is not 0.5.91: the version must end there.
    assert od.edit_engine_version("engine: {version: '0.5.91'}\n", "0.5.9", "1") is None
    assert od.edit_engine_version("engine:\n  version: 0.5.91\n", "0.5.9", "1") is None
    # Two engine version lines: the edit is not sure which, so it makes none.
    two = "engine:\n  version: 1\n  version: 1\n"
    assert od.edit_engine_version(two, "1", "2") is None


def test_requirement_edit_once_outside_comments():
    got = od.edit_requirement(SPEC, "torch==2.13.0", "torch==2.14.0")
    assert "  - torch==2.14.0\n" in got
    assert "# - torch==2.13.0 (a comment is never edited)" in got
    assert od.edit_requirement(SPEC, "torch==2.12.0", "torch==2.14.0") is None
    twice = "a: [torch==1]\nb: [torch==1]\n"
    assert od.edit_requirement(twice, "torch==1", "torch==2") is None
    # A longer name or version that merely contains the old text is not it.
    assert od.edit_requirement("- xtorch==1\n", "torch==1", "torch==2") is None
    assert od.edit_requirement("- torch==1.5\n", "torch==1", "torch==2") is None
    assert od.edit_requirement("- torch==1 ; x\n", "torch==1", "torch==2") == "- torch==2 ; x\n"


@pytest.mark.parametrize(("spec", "want"), [
    ("SGLang", ("sglang", None)), ("flash_attn==2.8.3", ("flash-attn", "2.8.3")),
])
def test_upgrade_argument(spec, want):
    assert od._parse_upgrade(spec) == want


@pytest.mark.parametrize("spec", ["torch>=2.14", "not a name!"])
def test_upgrade_argument_must_be_a_name_or_an_exact_pin(spec):
    with pytest.raises(InputError) as e:
        od._parse_upgrade(spec)
    assert e.value.exit_code == 2


def test_exact_pin_and_repin():
    reqs = ("torch>=2.1", "bad req!!", "Flash_Attn[x]==2.8.3 ; python_version >= '3.10'")
    assert od._exact_pin(reqs, "flash-attn") == reqs[2]
    assert od._exact_pin(reqs, "torch") is None  # not exact: not the target's own pin
    assert od._pinned_version(reqs[2]) == "2.8.3"
    assert od._repin(reqs[2], "2.9.0") == 'Flash_Attn[x]==2.9.0; python_version >= "3.10"'
    assert od._repin("torch==2.13.0", "2.14.0") == "torch==2.14.0"


@pytest.mark.parametrize(("name", "version"), [
    ("torch-2.13.0-cp312-cp312-manylinux_2_28_x86_64.whl", Version("2.13.0")),
    ("sglang-0.5.9.tar.gz", Version("0.5.9")), ("sglang-0.5.9.zip", Version("0.5.9")),
    ("sglang-0.5.9.exe", None), ("not a wheel.whl", None),
])
def test_version_of_an_index_file(name, version):
    assert od._version_of(name) == version


def test_pypi_is_told_by_host():
    assert od._is_pypi("https://pypi.org/simple") and od._is_pypi("https://test.pypi.org/simple")
    assert not od._is_pypi("https://pypi.org.example/simple")
    assert not od._is_pypi("https://download.pytorch.org/whl/cu128")


def test_diff_lines():
    changes = [od.Change("torch", "2.13.0", "2.14.0"), od.Change("new", None, "1"),
               od.Change("gone", "1", None)]
    assert od.diff_lines(changes, "lockfiles/t.txt") == [
        "--- lockfiles/t.txt (committed)", "+++ lockfiles/t.txt (relocked)",
        "-torch==2.13.0", "+torch==2.14.0", "+new==1", "-gone==1"]
    assert od.diff_lines([], "lockfiles/t.txt") == []
    assert od.diff_lines(changes[:1]) == ["-torch==2.13.0", "+torch==2.14.0"]


def _news(**kw) -> od.PackageNews:
    return od.PackageNews(**{"package": "sglang", "role": "engine", "locked": "0.5.9",
                             "newer": ("0.5.10", "0.5.11"), "status": "available", **kw})


def test_summary_per_status():
    assert od.summary(_news(status="current", newer=())) == "current"
    assert od.summary(_news(status="unknown", note="index down")) == "not checked: index down"
    assert od.summary(_news(status="held", note="patched")) == "0.5.11 held: patched"
    assert od.summary(_news(changes=(od.Change("a", "1", "2"),))) == \
        "0.5.11 available (1 lock change(s))"
    blocked = _news(status="blocked", blocked_by=("vllm needs torch==2.9",), available="0.5.10",
                    note="n")
    assert od.summary(blocked) == \
        "0.5.11 blocked by vllm needs torch==2.9; 0.5.10 available (0 lock change(s)); n"
    assert od.summary(_news(status="blocked", blocked_by=("x",))) == "0.5.11 blocked by x"
    assert _news().latest == "0.5.11" and _news(newer=()).latest is None
