"""lock/conflicts.py, the mutants test_conflicts_text.py left: the rationale that names several
ranges, what reconcile returns when uv resolves at once or says several facts, and how many
rounds it tries by default before it gives up."""

from __future__ import annotations

from dataclasses import dataclass

from imgbuild.errors import ResolveError
from imgbuild.lock import conflicts as cf
from imgbuild.lock.conflicts import Constraint


@dataclass(frozen=True)
class Req:
    overrides: tuple[str, ...] = ()


def test_the_rationale_names_every_range_the_pin_satisfies():
    c = cf.propose([Constraint("ct", "==0.2.0", "eng==1"), Constraint("ct", "==0.1.0", "old==1"),
                    Constraint("ct", ">=0.1.5", "you"), Constraint("ct", "<0.3", "lib==2")],
                   set())
    assert c.override == "ct==0.2.0"
    assert c.rationale == "the newest pin that also satisfies >=0.1.5,<0.3"


def test_reconcile_that_resolves_at_once_finds_nothing_and_has_no_message():
    seen = []
    found, ok, last = cf.reconcile(Req(("a>=1",)), lambda r: seen.append(r.overrides))
    assert (found, ok, last) == ([], True, "")
    assert seen == [("a>=1",)]


def test_reconcile_returns_uvs_facts_one_a_line():
    facts = ["Because engine-old==1.0 depends on ctensors==0.8.1 and you require ctensors>=0.10,",
             "we can conclude that your requirements are unsatisfiable."]

    def resolve(r: Req):
        raise ResolveError("no", facts=facts)

    found, ok, last = cf.reconcile(Req(), resolve)
    assert last == facts[0] + "\n" + facts[1]
    # Read across the line break, the chain still names both sides; once its override is in,
    # the same chain proposes nothing new and reconcile stops.
    assert not ok and [c.override for c in found] == ["ctensors>=0.10"]


def test_reconcile_gives_up_after_twelve_rounds_by_default():
    rounds = []

    def resolve(r: Req):
        n = len(r.overrides)
        rounds.append(n)
        raise ResolveError("no", facts=[f"Because a{n}==1 depends on p{n}==1 and you require "
                                        f"p{n}>=2, we can conclude that a{n} cannot be used."])

    found, ok, last = cf.reconcile(Req(), resolve)
    assert not ok and rounds == list(range(12))
    assert [c.override for c in found] == [f"p{n}>=2" for n in range(12)]
    assert "p11>=2" in last
