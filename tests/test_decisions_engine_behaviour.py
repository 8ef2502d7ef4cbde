"""What check-model holds each engine version to (checks/checkmodel/behaviour.py): for each
engine and version the catalog's table covers (images/checks/engines.yaml), the behaviours
with the rule and evidence each comes from, the patches a target applies, the first release
that fixes each and the patch that does, and the model classes' packed_modules_mapping, as
reviewed in tests/golden/checkmodel/ (`make golden` records them after a change meant to
change them). check-model's findings are only as right as these answers."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from imgbuild.catalog.engines import Rule
from imgbuild.checks.checkmodel.behaviour import _first_fixed, behaviour
from imgbuild.errors import InputError

from . import golden
from .conftest import checkout_workspace

CASES = (
    ("sglang", "0.5.16", ()),
    ("sglang", "0.5.16", ("sglang-ct-mixed-precision-format", "sglang-ct-ignore-exact-match")),
    ("sglang", "0.5.23", ()),
    ("sglang", "0.4.0", ()),  # before the table: every behaviour unknown, the fixes still said
    # A pre-release no rule covers: the behaviours unknown, yet the release and the patch that
    # fix them said; its model classes read from the range that holds it.
    ("sglang", "0.5.17rc1", ()),
    ("vllm", "0.5.0", ()),  # before the table, with fixes that are releases, not patches
    ("vllm", "0.33.0", ()),
    ("transformers", "5.17.0", ()),
    ("an-engine-the-table-has-not", "1.0", ()),
)
# The last but one is a class no engine records: the recorded ones are named.
ARCHS = ("Qwen3NextForCausalLM", "Qwen3MoeForCausalLM", "MistralForCausalLM", None)


GOLDEN = golden.page_folder(__name__)


def pages() -> dict[str, str]:
    table = checkout_workspace().engines
    out = {}
    for engine, version, patches in CASES:
        b = behaviour(engine, version, patches, table=table)
        doc = b.to_dict() | {"model_mapping": {str(a): list(b.model_mapping(a)) for a in ARCHS},
                             "w4a4": {k: b.w4a4(k) for k in ("linear", "moe")}
                             if b.value("w4a4_without_fp4_arch") else None}
        name = f"{engine}-{version}{'-patched' if patches else ''}.json"
        out[name] = json.dumps(doc, indent=1, sort_keys=True, default=list) + "\n"
    return out




def test_each_engine_versions_behaviours_are_the_reviewed_ones():
    GOLDEN.check(pages())


def test_a_version_that_is_not_pep_440_is_refused():
    with pytest.raises(InputError) as e:
        behaviour("sglang", "latest", table=checkout_workspace().engines)
    assert e.value.message == "engine version 'latest' is not a PEP 440 version"


def test_each_fact_is_named_for_the_behaviour_it_answers():
    table = checkout_workspace().engines
    for engine, version, patches in CASES:
        for name, fact in behaviour(engine, version, patches, table=table).facts.items():
            assert fact.name == name, (engine, version)


def test_an_engine_with_no_model_class_recorded_says_none():
    b = behaviour("vllm", "0.33.0", table=checkout_workspace().engines)
    b = replace(b, data=replace(b.data, classes={}))
    assert b.model_mapping("Qwen3MoeForCausalLM") == (
        None, "Qwen3MoeForCausalLM is not among the model classes recorded for vllm (none)")


def test_a_behaviour_with_no_known_fixed_value_has_no_first_fix():
    # a behaviour the table gains before FIXED says which of its values are the fixed ones
    rules = (Rule(">=1.0", "new", ("1.0",), ("evidence",)),)
    assert _first_fixed(rules, "a-behaviour-not-yet-judged") is None
    assert _first_fixed(rules + (Rule(">=2.0", "exact", ("2.0",), ()),), "ignore_matcher") == "2.0"
