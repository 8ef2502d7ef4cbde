"""A prune rule for a package's GPU library (images/prune.yaml `package:`) drops it only where
the lock's kernel record says none of the target's archs runs any of its code; kept
everywhere else. Read from the shipped locks' real kernel records (no Engine)."""

from __future__ import annotations

import pytest

from imgbuild.catalog.prune import parse_prune
from imgbuild.errors import SpecError
from imgbuild.plan import coverage
from imgbuild.plan.decide import make_plan

from .conftest import checkout_workspace

FA3 = ("path", "sgl_kernel/flash_ops.abi3.so")


@pytest.fixture(scope="module")
def ws():
    return checkout_workspace()


def test_a_blackwell_only_target_drops_the_hopper_only_library(ws):
    plan = make_plan(ws, "sglang-blackwell-slim", resolve=False)
    assert FA3 in plan.prune
    # Not in the image, so not among the kernel files the smoke test checks are installed
    # (that stage failed the first image built with the rule: "flash_ops.abi3.so is not
    # installed").
    assert not [f for f in plan.kernel_files if f[1] == FA3[1]]
    # The same target with sm90 keeps it, and lists it.
    with_hopper = make_plan(ws, "sglang-blackwell-slim", resolve=False, archs=("sm90", "sm100"))
    assert [f[0] for f in with_hopper.kernel_files if f[1] == FA3[1]] == ["sglang-kernel"]
    # And the Dockerfile's install step removes it, listing it in pruned-rest.txt.
    from imgbuild.plan import render

    assert "sgl_kernel/flash_ops.abi3.so" in render.dockerfile(plan)


def test_a_target_with_an_arch_that_runs_it_keeps_it(ws):
    # Hopper runs its sm90a SASS.
    assert FA3 not in make_plan(ws, "sglang-hopper", resolve=False).prune
    # The same Blackwell target asked for sm90 as well keeps it, and its content tag moves.
    both = make_plan(ws, "sglang-blackwell", resolve=False, archs=("sm90", "sm100"))
    alone = make_plan(ws, "sglang-blackwell", resolve=False, archs=("sm100",))
    assert FA3 not in both.prune and FA3 in alone.prune
    assert both.content_key != alone.content_key


def test_status_is_read_from_the_codes_not_the_name():
    codes = ("sm_80", "sm_86", "sm_90a")
    assert [coverage.status_for(codes, a) for a in ("sm90", "sm100", "sm120")] == \
        ["sass", "none", "none"]
    assert coverage.status_for(("compute_80",), "sm100") == "ptx"  # PTX JITs forward


def test_package_needs_a_path_rule():
    with pytest.raises(SpecError) as e:
        parse_prune({"rules": [{"name": "x", "dirs": "tests", "package": "torch",
                                "flavors": ["slim"], "why": "w"}]}, "images/prune.yaml")
    assert "package" in str(e.value)
