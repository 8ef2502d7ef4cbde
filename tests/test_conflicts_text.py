"""lock/conflicts.py to the letter: what a user reads when a resolution fails (the chain, the
override proposed and its YAML) and the reconciling loop, pinned exactly so that a changed
word or a changed branch shows (the mutants that survived bench/mutation.py's first run).
The real uv path is exercised in test_resolver.py and test_offline_twins.py."""

from __future__ import annotations

from dataclasses import dataclass

from imgbuild.errors import ResolveError
from imgbuild.lock import conflicts as cf
from imgbuild.lock.conflicts import Conflict, Constraint

UV_CHAIN = ("Because engine-old==1.0 depends on ctensors==0.8.1, and you require "
            "ctensors>=0.10, we can conclude that you require engine-old<1.0.")


def test_a_conflict_reads_who_asks_for_what():
    c = Conflict("ctensors", (Constraint("ctensors", "==0.8.1", "engine-old==1.0"),
                              Constraint("ctensors", ">=0.10", "you")),
                 "ctensors>=0.10", "why")
    assert c.lines() == [
        "ctensors: engine-old==1.0 requires ctensors==0.8.1; you require ctensors>=0.10",
        "  → override ctensors>=0.10 (why)"]


def test_the_override_yaml_is_ready_to_paste():
    a = Conflict("ctensors", (Constraint("ctensors", "==0.8.1", "vllm==0.6.6"),
                              Constraint("ctensors", "==0.11.0", "sglang==0.5.23"),
                              Constraint("ctensors", ">=0.10", "you")), "ctensors==0.11.0", "w")
    b = Conflict("numpy", (Constraint("numpy", "<2", "you"), Constraint("numpy", ">=2", "you")),
                 "numpy>=2", "w")
    assert cf.override_yaml([a, b]) == (
        "overrides:\n"
        "  - requirement: ctensors==0.11.0\n"
        "    reason: <why ctensors==0.11.0 is safe for sglang==0.5.23, vllm==0.6.6>\n"
        "  - requirement: numpy>=2\n"
        "    reason: <why numpy>=2 is safe for you>")


def test_constraints_are_read_from_uvs_chain():
    got = cf.parse_constraints(UV_CHAIN)
    assert got == [Constraint("ctensors", "==0.8.1", "engine-old==1.0"),
                   Constraint("ctensors", ">=0.10", "you")]
    # "all versions of X depend on": the dependent is named with the user's own pin.
    got = cf.parse_constraints("Because all versions of engine-old depend on ctensors==0.8.1 "
                               "and you require engine-old==1.0 and ctensors>=0.10, we can "
                               "conclude that your requirements are unsatisfiable.")
    assert Constraint("ctensors", "==0.8.1", "engine-old==1.0") in got
    assert Constraint("ctensors", ">=0.10", "you") in got


def test_pins_are_the_exact_versions_only():
    assert cf._pins("==1.0,>=0.5") == [cf.Version("1.0")]
    assert cf._pins(">=0.5,==2.0") == [cf.Version("2.0")]
    assert cf._pins("==1.*") == [] and cf._pins("<2") == [] and cf._pins("==not-a-version") == []


def test_the_newest_pin_the_ranges_admit_prereleases_included():
    cs = [Constraint("ct", "==0.2.0rc1", "eng==1"), Constraint("ct", "==0.1.0", "old==1"),
          Constraint("ct", ">=0.1.5", "you")]
    c = cf.propose(cs, set())
    assert c.override == "ct==0.2.0rc1"
    assert c.rationale == "the newest pin that also satisfies >=0.1.5"
    c = cf.propose([Constraint("ct", "==0.8.1", "a==1"), Constraint("ct", "==0.11.0", "b==1")],
                   set())
    assert (c.override, c.rationale) == ("ct==0.11.0", "the newer of the exact pins")
    # No pin fits the ranges: the ranges win.
    c = cf.propose([Constraint("ct", "==0.8.1", "a==1"), Constraint("ct", ">=0.10", "you"),
                    Constraint("ct", "<0.12", "b==1")], set())
    assert c.override == "ct>=0.10,<0.12"
    assert c.rationale == "what the range requirement asks; the exact pin is overridden"


def test_propose_skips_what_is_settled_and_goes_on():
    cs = [Constraint("done", "==1", "a==1"), Constraint("done", "==2", "b==1"),
          Constraint("same", "==1", "a==1"), Constraint("same", "==1", "b==1"),
          Constraint("next", "==1", "a==1"), Constraint("next", "==2", "b==1")]
    c = cf.propose(cs, {"done"})
    assert c.package == "next" and c.override == "next==2"
    assert cf.propose(cs[:4], {"done"}) is None


@dataclass(frozen=True)
class Req:
    overrides: tuple[str, ...] = ()


def test_reconcile_replaces_an_earlier_override_on_the_package_and_reruns():
    seen: list[tuple[str, ...]] = []

    def resolve(r: Req):
        seen.append(r.overrides)
        if "ctensors>=0.10" in r.overrides:
            return "ok"
        raise ResolveError("no", facts=[UV_CHAIN])

    found, ok, last = cf.reconcile(Req(("ctensors[extra]==0.9", "other>=1")), resolve)
    assert ok and [c.override for c in found] == ["ctensors>=0.10"]
    # The old override on ctensors went; the unrelated one stayed; uv ran again with them.
    assert seen == [("ctensors[extra]==0.9", "other>=1"), ("other>=1", "ctensors>=0.10")]
    assert last == UV_CHAIN


def test_reconcile_says_so_when_rounds_run_out():
    def resolve(r: Req):
        n = len(r.overrides)
        raise ResolveError("no", facts=[f"Because a{n}==1 depends on p{n}==1 and you require "
                                        f"p{n}>=2, we can conclude that a{n} cannot be used."])

    found, ok, last = cf.reconcile(Req(), resolve, max_rounds=3)
    assert not ok and len(found) == 3 and "p2" in last


def test_the_platform_sentence_names_what_ships():
    msg = ("Because flash-attn==2.8.3 has no wheels with a matching platform tag (e.g. "
           "`manylinux_2_36_aarch64`) and you require flash-attn==2.8.3, ...\n"
           "hint: Wheels are available for `flash-attn` (v2.8.3) on the following platform: "
           "`manylinux_2_28_x86_64`")
    assert cf.platform_sentence(msg, "aarch64-manylinux_2_36") == (
        "flash-attn 2.8.3 has no wheel for this image's platform aarch64-manylinux_2_36 (it "
        "ships wheels for `manylinux_2_28_x86_64`); imgbuild pins it exactly and will not fall "
        "back to an older flash-attn")
    bare = msg.split("\n")[0]
    assert cf.platform_sentence(bare, "p").endswith(
        "platform p; imgbuild pins it exactly and will not fall back to an older flash-attn")
    assert cf.ships_cpu(msg, "x86_64") is True and cf.ships_cpu(msg, "aarch64") is False
    assert cf.ships_cpu(msg.replace("`manylinux_2_28_x86_64`", "`any`"), "aarch64") is True
    assert cf.ships_cpu(bare, "x86_64") is None
