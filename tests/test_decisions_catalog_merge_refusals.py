"""Decisions of the catalog's readers that other tests pass by: how a higher layer's
failures.yaml merges over a lower one's (catalog/failures.py `_merged`), the refusal when the
catalog lacks a failure the image's preflight names, a target that lists a patch nobody
wrote, and which variant of a patch a pre-release gets (catalog/patches.py)."""

from __future__ import annotations

import dataclasses

import pytest

from imgbuild.catalog import failures
from imgbuild.catalog.patches import Patch, Variant, target_patches
from imgbuild.errors import SpecError

from .conftest import checkout_workspace


def test_a_higher_layer_replaces_entries_of_the_same_id_or_name_and_keeps_the_rest():
    lower = {"failures": [{"id": "a", "v": 1}, {"id": "b", "v": 1}, {"name": "n", "v": 1}],
             "prefixes": ["kept-below"], "engines": [{"name": "sglang", "v": 1}]}
    upper = {"outer_prefixes": "not a list", "failures": [{"id": "b", "v": 2}],
             "engines": [{"name": "vllm"}, {"name": "sglang", "v": 2}],
             "prefixes": ["mine"]}
    assert failures._merged(lower, upper) == {
        "failures": [{"id": "b", "v": 2}, {"id": "a", "v": 1}, {"name": "n", "v": 1}],
        "prefixes": ["mine", "kept-below"],  # entries with no id or name are all kept
        "engines": [{"name": "vllm"}, {"name": "sglang", "v": 2}],
        "outer_prefixes": "not a list"}
    # Where either side is no mapping, the higher layer's file is what counts.
    assert failures._merged({"failures": []}, ["x"]) == ["x"]
    assert failures._merged(None, {"failures": []}) == {"failures": []}
    assert failures._merged({"failures": [{"id": "a"}]}, {"failures": None}) == \
        {"failures": None}


def test_a_catalog_without_a_failure_the_preflight_names_is_refused():
    cat = checkout_workspace().failures
    assert set(failures.preflight_sentences(cat)) == set(failures.PREFLIGHT_FAILURES)
    less = dataclasses.replace(cat, fingerprints=tuple(
        fp for fp in cat.fingerprints if fp.id not in ("jit-noexec-tmp", "uid-without-passwd-entry")))
    with pytest.raises(SpecError) as e:
        failures.preflight_sentences(less)
    assert e.value.message == (
        "checks/failures.yaml: failures: expected the failures the image's preflight names: "
        "uid-without-passwd-entry, cache-dir-not-writable, jit-noexec-tmp, got "
        "'uid-without-passwd-entry, jit-noexec-tmp missing'")


def _patch(pid: str, *variants: Variant) -> Patch:
    return Patch(pid, f"images/patches/{pid}.yaml", "compressed-tensors", ">=0.5", "fix", "u",
                 variants, "")


def test_a_patch_id_nobody_wrote_names_the_target_s_file_and_what_is_known():
    target = dataclasses.replace(checkout_workspace().catalog.target("tiny-cpu"),
                                 patches=("ct-one", "ct-tow"))
    known = {p.id: p for p in (_patch("ct-two"), _patch("ct-one"), _patch("other"))}
    with pytest.raises(SpecError) as e:
        target_patches(target, known)
    assert e.value.message == (f"{target.path}: patches[1]: expected a patch id under "
                               "images/patches/: ct-one, ct-two, other, got 'ct-tow'")
    assert e.value.hint == "did you mean 'ct-two'?"
    with pytest.raises(SpecError) as e:
        target_patches(dataclasses.replace(target, patches=("zzzzzz",)), known)
    assert e.value.hint == f"fix {target.path} and run the command again"
    with pytest.raises(SpecError) as e:
        target_patches(target, {})
    assert e.value.message == (f"{target.path}: patches[0]: expected a patch id under "
                               "images/patches/: (none), got 'ct-one'")
    assert target_patches(dataclasses.replace(target, patches=("other", "ct-one")), known) == \
        [known["other"], known["ct-one"]]


def test_a_pre_release_gets_the_variant_whose_range_holds_it():
    old = Variant("<0.12", "old.diff", "<inline>")
    new = Variant(">=0.12", "new.diff", "<inline>")
    p = _patch("ct", old, new)
    assert p.variant_for("0.11.0") is old and p.variant_for("0.12.0") is new
    assert p.variant_for("0.13.0rc1") is new and p.variant_for("0.11.1a2") is old
    assert _patch("ct", Variant("==0.9.*", "d", "<inline>")).variant_for("0.12.0") is None
