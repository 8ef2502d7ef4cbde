"""The CPU-seconds per test that the run's summary gives (tests/cpu_record.py)."""

from __future__ import annotations

import subprocess
import sys

from .cpu_record import Spent, cpu_now, summary


def test_the_summary_sums_and_orders_what_the_tests_cost():
    spent = [Spent("t::a", 1.0, False), Spent("t::b", 5.0, True), Spent("t::c", 2.0, False)]
    first, *most = summary(spent, top=2)
    assert first.startswith("8 CPU-seconds in 3 tests: docker tests 5 ")
    assert first.endswith("the others 3")
    assert [line.split()[1] for line in most] == ["t::b", "t::c"]
    assert most[0].endswith("[docker]") and not most[1].endswith("[docker]")
    assert summary([]) == []


def test_a_waited_for_subprocess_counts_for_the_test():
    before = cpu_now()
    subprocess.run([sys.executable, "-c", "sum(i * i for i in range(3_000_000))"], check=True)
    assert cpu_now() - before >= 0.1
