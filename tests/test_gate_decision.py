"""The smoke gate's decision, every case (pipeline/build.py decide): a moving tag moves only on
a passing smoke report, or with --force, which is labelled; without a report it stays, and the
reason is said. (tests/test_docker.py and test_survivors.py run the gate through real builds.)"""

from __future__ import annotations

import pytest

from imgbuild.image.smoke import SmokeReport
from imgbuild.pipeline.build import Gate, decide

PASSED = SmokeReport("imgbuild:t-1", True, (), 1.0, {"ok": True})
FAILED = SmokeReport("imgbuild:t-1", False, ({"name": "checkpoint-cpu", "status": "fail"},),
                     1.0, {"ok": False})


@pytest.mark.parametrize("report, has_model, force, want", [
    (PASSED, True, False, Gate(PASSED, True, None, False)),
    (PASSED, True, True, Gate(PASSED, True, None, True)),
    (FAILED, True, False, Gate(FAILED, False, "the smoke test failed", False)),
    (FAILED, True, True, Gate(FAILED, True, None, True)),
    (None, True, False, Gate(None, False, "no smoke test ran (--no-smoke)", False)),
    (None, False, False, Gate(None, False, "the target has no smoke model", False)),
    (None, True, True, Gate(None, True, None, True)),
    (None, False, True, Gate(None, True, None, True)),
])
def test_the_moving_tags_move_only_on_a_passing_report_or_force(report, has_model, force, want):
    assert decide(report, has_smoke_model=has_model, force=force) == want
