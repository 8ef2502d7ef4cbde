"""What `imgbuild list` and `imgbuild plan` show, as reviewed: for people (a pipe's plain
lines) and as JSON, for a CPU target, a multi-platform one (each platform's plan and the
index) and a GPU target serving a model (its CUDA choice, driver floor and kernel table).

Each command runs in-process on the checkout's catalog with `--no-checks` (the dependency
check reads the locked wheels: tests/test_drift.py), from an empty directory; the pages are
compared with tests/golden/cli/ (`make golden` records them after a change meant to change
them). The checkout's path is written CHECKOUT.
"""

from __future__ import annotations

import json
from pathlib import Path

from . import golden

ROOT = Path(__file__).resolve().parents[1]
CASES = (
    ("list.txt", ("list",)),
    ("list.json", ("list", "--json")),
    ("plan-tiny-cpu.txt", ("plan", "tiny-cpu", "--no-checks")),
    ("plan-tiny-cpu-multi.txt", ("plan", "tiny-cpu-multi", "--no-checks")),
    ("plan-tiny-cpu-multi.json", ("plan", "tiny-cpu-multi", "--no-checks", "--json")),
    ("plan-tiny-cpu-multi-arm64.txt", ("plan", "tiny-cpu-multi", "--no-checks", "--platform",
                                       "linux/arm64")),
    ("plan-sglang-blackwell-k2.6.txt", ("plan", "sglang-blackwell", "--model", "k2.6",
                                        "--no-checks")),
    ("plan-sglang-blackwell-k2.6.json", ("plan", "sglang-blackwell", "--model", "k2.6",
                                         "--no-checks", "--json")),
    ("plan-sglang-0516-blackwell-sm120.txt", ("plan", "sglang-0516-blackwell", "--arch",
                                              "sm120", "--no-checks",
                                              "--registry", "ghcr.io/acme/imgbuild")),
)


GOLDEN = golden.page_folder(__name__)


def pages() -> dict[str, str]:
    out: dict[str, str] = {}
    with golden.scratch("imgbuild-views-plan-"):
        for name, argv in CASES:
            code, said, err = golden.run_cli([*argv, "--images", str(ROOT / "images"),
                                              "--lockfiles", str(ROOT / "lockfiles")])
            assert code == 0, (argv, said, err)
            out[name] = said.replace(str(ROOT), "CHECKOUT")
    return out




def test_list_and_plan_show_what_they_showed_when_reviewed():
    GOLDEN.check(pages())


def test_the_json_pages_are_json_and_the_index_names_both_platforms():
    got = pages()
    doc = json.loads(got["plan-tiny-cpu-multi.json"])
    assert set(doc["platforms"]) == {"linux/amd64", "linux/arm64"}
    assert doc["content_tag"].startswith("tiny-cpu-multi-")
    assert json.loads(got["plan-sglang-blackwell-k2.6.json"])["checks"] is None
    assert set(json.loads(got["list.json"])) == {"targets", "models"}
