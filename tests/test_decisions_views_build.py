"""What `imgbuild build` shows when it ends, as reviewed: for an image built, smoke-tested,
pushed and signed; for one found here with no smoke test, whose tags stay; for one pulled whose
registry report is reused; for a multi-platform target's index (each platform, then the index);
and each as JSON. Compared with tests/golden/build/ (`make golden` records them after a change
meant to change them).

The outcomes are plain data made from the checkout's plans; tests/test_docker.py makes real
ones on an Engine and a registry."""

from __future__ import annotations

import json

from imgbuild.cli.views import image as views
from imgbuild.image import smoke
from imgbuild.image.buildkit import BuildResult
from imgbuild.pipeline.build import Gate, MultiOutcome, Outcome, Published
from imgbuild.pipeline.index import Assembled
from imgbuild.pipeline.obtain import Built
from imgbuild.plan.decide import make_plan
from imgbuild.plan.index import make_index_plan

from . import golden
from .conftest import checkout_workspace

REPO = "registry.example/acme"
ID = "sha256:" + "a" * 64
DIGEST = "sha256:" + "d" * 64
STAGES = ({"name": "environment", "status": "pass", "duration_s": 0.04},
          {"name": "checkpoint-cpu", "status": "pass", "duration_s": 7.86},
          {"name": "gpu-engine", "status": "skipped"})


def outcomes() -> dict[str, Outcome | MultiOutcome]:
    ws = checkout_workspace()
    plan = make_plan(ws, "tiny-cpu", repository=REPO, resolve=False)
    passed = smoke.SmokeReport(plan.ref(), True, STAGES, 9.5, {}, ID)
    pushed = Outcome(
        plan, Built("built", ID, 1_120_000_000,
                    BuildResult(ID, 312.4, 14, 9, (f"{REPO}:tiny-cpu-cache",))),
        Gate(passed, True),
        Published(pushed=(f"{plan.ref()}@{DIGEST}",) + tuple(f"{r}@{DIGEST}"
                                                             for r in plan.refs[1:]),
                  moved=plan.refs[1:], report_ref=f"{REPO}:sha256-{'d' * 64}.smoke",
                  compression="zstd", sent_bytes=412_000_000, reused_layers=3,
                  cached_layers=2, build_cache=plan.ref(plan.cache_tag), mounted_layers=1,
                  signed=(f"{REPO}:sha256-{'d' * 64}.sig",),
                  signed_by={"method": "key", "key": "keys/ci.key"}),
        seconds=351.27)
    here = Outcome(plan, Built("local", ID, 1_120_000_000),
                   Gate(None, False, "no smoke test ran (--no-smoke)"), Published(), 0.42)
    reused = smoke.SmokeReport(plan.ref(), True, STAGES, 0.0, {}, ID,
                               f"registry, {REPO}@{DIGEST}")
    pulled = Outcome(plan, Built("pulled", ID, 1_120_000_000, registry_digest=DIGEST),
                     Gate(reused, True), Published(moved=plan.refs[1:]), 41.0)
    index = make_index_plan(ws, "tiny-cpu-multi", repository=REPO, resolve=False)
    platform_outcomes = tuple(
        Outcome(p, Built("built", ID, 1_000_000_000), Gate(None, False,
                                                           "no smoke test ran (--no-smoke)"),
                Published(pushed=(f"{p.ref()}@{DIGEST}",)), 100.0)
        for p in index.plans)
    multi = MultiOutcome(index, platform_outcomes,
                         Assembled(index, DIGEST, tuple((p.platform, DIGEST)
                                                        for p in index.plans),
                                   (f"{index.ref()}@{DIGEST}",),
                                   (f"{REPO}:sha256-{'d' * 64}.sig",)),
                         moved=(), held=None, seconds=230.0)
    held = MultiOutcome(index, platform_outcomes, None, moved=index.refs[1:2],
                        held="a platform's smoke test did not run", seconds=230.0)
    return {"pushed": pushed, "here": here, "pulled": pulled, "index": multi,
            "index-held": held}


GOLDEN = golden.page_folder(__name__)


def pages() -> dict[str, str]:
    out = {}
    for name, o in outcomes().items():
        view = views.build_index if isinstance(o, MultiOutcome) else views.build
        out[f"{name}.txt"] = golden.shown(view, o)
        out[f"{name}.json"] = golden.shown(view, o, as_json=True)
    return out


def test_what_a_build_shows_when_it_ends_is_what_was_reviewed():
    GOLDEN.check(pages())


def test_the_json_is_the_outcomes_own_dict():
    for name, o in outcomes().items():
        assert json.loads(pages()[f"{name}.json"]) == json.loads(json.dumps(o.to_dict())), name
