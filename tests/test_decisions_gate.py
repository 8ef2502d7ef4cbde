"""The smoke gate of a build (pipeline/build.py gate and earlier_report), without an Engine:
which report decides (the registry's for a pulled image; one made before for this very image;
or a run now), and what a failed one does to the tags: the content tag is moved aside to
`…-smoke-failed` and the build fails, unless --force, which moves the tags and says so.

The Engine's and the registry's side are a scripted client and a scripted registry: the image
the Engine holds (its tag and its removal are what the gate asks of it) and the reports the
registry stores. smoke.run itself is replayed in tests/test_decisions_image_smoke.py, and the
gate's own rule (decide) is tested in tests/test_gate_decision.py."""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest

from imgbuild.errors import JobFailed
from imgbuild.image import registry, smoke
from imgbuild.pipeline import build as build_mod
from imgbuild.pipeline.obtain import Built
from imgbuild.plan.decide import make_plan

from .conftest import checkout_workspace
from .progress_notes import Notes

PASS = smoke.SmokeReport("r", True, ({"name": "checkpoint-cpu", "status": "pass"},), 3.0,
                         {}, "sha256:img")
FAIL = smoke.SmokeReport("r", False, ({"name": "checkpoint-cpu", "status": "fail",
                                       "reason": "logits differ"},
                                      {"name": "gpu-engine", "status": "skipped"}), 3.0, {},
                         "sha256:img")


@dataclass
class Image:
    attrs: dict
    tagged: list = field(default_factory=list)

    def tag(self, repository: str, tag: str) -> None:
        self.tagged.append((repository, tag))


@dataclass
class Images:
    image: Image
    removed: list = field(default_factory=list)

    def get(self, ref: str) -> Image:
        return self.image

    def remove(self, ref: str) -> None:
        self.removed.append(ref)


@dataclass
class Client:
    images: Images




@pytest.fixture(scope="module")
def plan():
    return make_plan(checkout_workspace(), "tiny-cpu", repository="127.0.0.1:5000/acme",
                     resolve=False)


@pytest.fixture()
def world(monkeypatch):
    """The registry's stored reports by digest, the runs of smoke.run, the client."""
    w = type("World", (), {})()
    w.stored, w.runs, w.recalled = {}, [], None
    w.run_result = PASS
    w.client = Client(Images(Image({"RepoDigests": []})))
    monkeypatch.setattr(registry, "fetch_report", lambda repo, digest: w.stored.get(digest))
    monkeypatch.setattr(registry, "get_manifest", lambda repo, ref: None)
    monkeypatch.setattr(smoke, "recall", lambda ref, image_id: w.recalled)
    monkeypatch.setattr(smoke, "host_has_gpu_runtime", lambda: False)

    def run(ref):
        w.runs.append(ref)
        return w.run_result
    monkeypatch.setattr(smoke, "run", run)
    return w


REPO = registry.Repository.parse("127.0.0.1:5000/acme")


def _gate(plan, world, built=None, **kw):
    notes = Notes()
    built = built or Built("built", "sha256:img", 1)
    got = build_mod.gate(plan, built, world.client, REPO, progress=notes, **kw)
    return got, notes


def test_a_passing_run_opens_the_gate(plan, world):
    got, notes = _gate(plan, world)
    assert got.open and got.report is PASS and not got.forced and got.held is None
    assert world.runs == [plan.ref()]
    assert plan.ref() in notes.statuses[0]


def test_a_pulled_image_is_judged_by_the_report_the_registry_stores_for_its_digest(plan, world):
    world.stored["sha256:pulled"] = {"ok": True, "stages": [{"name": "x", "status": "pass"}]}
    got, _ = _gate(plan, world, Built("pulled", "sha256:img", 1,
                                      registry_digest="sha256:pulled"))
    assert got.open and world.runs == []
    assert got.report.reused == "registry" and got.report.stages == (
        {"name": "x", "status": "pass"},)
    assert got.report.image_id == "sha256:img"


def test_a_report_made_before_for_this_image_is_taken_and_said(plan, world):
    world.recalled = PASS
    got, notes = _gate(plan, world)
    assert got.open and world.runs == []
    assert notes.notes == [("info", f"smoke test not run again: {plan.ref()} passed it before "
                                   f"({PASS.reused}); --resmoke runs it")]
    assert notes.statuses == []  # nothing ran to show a status for


def test_resmoke_runs_it_again_whatever_was_made_before(plan, world):
    world.recalled = PASS
    _gate(plan, world, resmoke=True)
    assert world.runs == [plan.ref()]


def test_the_registrys_report_for_the_image_in_this_repository_is_taken(plan, world):
    world.client.images.image.attrs["RepoDigests"] = [
        "127.0.0.1:5000/other@sha256:elsewhere", "127.0.0.1:5000/acme@sha256:here"]
    world.stored["sha256:elsewhere"] = {"ok": True, "stages": []}  # another repository's
    world.stored["sha256:here"] = {"ok": True, "stages": [{"name": "x", "status": "pass"}]}
    got, _ = _gate(plan, world)
    assert got.report.reused == "registry, 127.0.0.1:5000/acme@sha256:here"
    assert world.runs == []


def test_without_a_smoke_run_the_tags_stay_and_say_why(plan, world):
    got, notes = _gate(plan, world, run_smoke=False)
    assert not got.open and got.held == "no smoke test ran (--no-smoke)"
    assert notes.notes == [("info", "moving tags not moved: no smoke test ran (--no-smoke)")]
    assert notes.statuses == []


def test_a_failed_smoke_test_moves_the_content_tag_aside_and_fails(plan, world):
    world.run_result = FAIL
    with pytest.raises(JobFailed) as e:
        _gate(plan, world)
    failed = plan.ref(plan.content_tag + "-smoke-failed")
    assert world.client.images.image.tagged == [tuple(failed.rsplit(":", 1))]
    assert world.client.images.removed == [plan.ref()]
    assert e.value.message == f"smoke test failed for {plan.target}; no tag was moved"
    assert e.value.facts == ["checkpoint-cpu: fail: logits differ", "gpu-engine: skipped: "]
    assert e.value.hint == (f"the image is kept as {failed} to inspect; "
                            f"`imgbuild smoke {failed}` reruns the check")


def test_force_moves_the_tags_of_a_failed_image_and_says_so_loudly(plan, world):
    world.run_result = FAIL
    got, notes = _gate(plan, world, force=True)
    assert got.open and got.forced and world.client.images.removed == []
    [(level, said)] = notes.notes
    assert level == "warn" and said.startswith(f"FORCED: the smoke test FAILED for {plan.ref()}")


def test_an_image_for_no_registry_asks_no_registry(plan, world, monkeypatch):
    local = registry.Repository.parse("imgbuild")
    assert local.host is None

    def asked(*a):
        raise AssertionError("a registry was asked")
    monkeypatch.setattr(registry, "fetch_report", asked)
    monkeypatch.setattr(registry, "get_manifest", asked)
    assert build_mod.earlier_report(plan, Built("built", "sha256:img", 1), world.client,
                                    local) is None


# --- which manifest under the content tag is this run's image ---------------------------------
# A content tag, once published, never moves: a push finds the tag taken, and asks whether
# what it holds is this very image (then nothing is pushed over it) or not.

@pytest.fixture()
def configs(monkeypatch):
    """The registry's manifests by digest, as their configs' digests; the local image's."""
    from imgbuild.image import wire

    held = {"sha256:held": "sha256:cfg-a"}
    mine = {"digest": "sha256:cfg-a"}
    monkeypatch.setattr(registry, "image_config", lambda repo, digest: (
        {"config": {"digest": held[digest]}}, {}))
    monkeypatch.setattr(wire, "config_digest_of", lambda client, ref, platform: mine["digest"])
    return mine


def test_a_pulled_image_is_the_held_one_when_it_came_from_that_digest(plan, configs):
    pulled = Built("pulled", "sha256:img", 1, registry_digest="sha256:held")
    assert build_mod.held_is_this_image(plan, pulled, "sha256:held", None, REPO)
    assert not build_mod.held_is_this_image(plan, pulled, "sha256:other", None, REPO)
    assert not build_mod.held_is_this_image(plan, None, "sha256:held", None, REPO)


def test_a_built_image_is_the_held_one_when_their_configs_are_one(plan, configs):
    built = Built("built", "sha256:img", 1)
    assert build_mod.held_is_this_image(plan, built, "sha256:held", None, REPO)
    configs["digest"] = "sha256:cfg-b"  # the same tag, other bytes: another build's image
    assert not build_mod.held_is_this_image(plan, built, "sha256:held", None, REPO)
    configs["digest"] = None  # the Engine cannot say: not taken for this image
    assert not build_mod.held_is_this_image(plan, built, "sha256:held", None, REPO)


def test_a_spliced_image_is_the_held_one_when_its_config_is(plan, configs):
    from types import SimpleNamespace

    spliced = Built("spliced", "sha256:img", 1,
                    spliced=SimpleNamespace(config_digest="sha256:cfg-a"))
    assert build_mod.held_is_this_image(plan, spliced, "sha256:held", None, REPO)
    configs["digest"] = "sha256:cfg-c"  # the local Engine's image is not asked: it has none
    other = Built("spliced", "sha256:img", 1,
                  spliced=SimpleNamespace(config_digest="sha256:cfg-c"))
    assert not build_mod.held_is_this_image(plan, other, "sha256:held", None, REPO)
    assert build_mod.held_is_this_image(plan, spliced, "sha256:held", None, REPO)


# --- the build cache tag ----------------------------------------------------------------------

def test_the_cache_tag_moves_only_onto_an_image_whose_inline_cache_has_the_heavy_steps(
        plan, monkeypatch):
    from .test_decisions_image_inlinecache import with_cache

    moved, notes = [], Notes()
    carried = with_cache({"records": [{"results": [{"layer": 1}]}, {"results": [{"layer": 2}]}]})
    lacking = with_cache({"records": [{"results": [{"layer": 1}]}]})
    configs = {"sha256:good": carried, "sha256:bad": lacking}
    monkeypatch.setattr(registry, "image_config", lambda repo, d: ({}, configs[d]))
    monkeypatch.setattr(registry, "tag_manifest", lambda repo, src, dst: moved.append((src, dst)))
    assert build_mod.keep_build_cache(plan, REPO, "sha256:good", notes) == plan.ref(plan.cache_tag)
    assert moved == [(plan.content_tag, plan.cache_tag)] and notes.said == []
    assert build_mod.keep_build_cache(plan, REPO, "sha256:bad", notes) is None
    assert moved == [(plan.content_tag, plan.cache_tag)]  # left where it was, and said
    [(level, said)] = notes.notes
    assert said.startswith(f"{plan.ref(plan.cache_tag)} left where it was")


def test_a_platform_image_of_an_index_has_no_moving_tags_to_say_were_held(world):
    from imgbuild.plan.index import make_index_plan

    index = make_index_plan(checkout_workspace(), "tiny-cpu-multi",
                            repository="127.0.0.1:5000/acme", resolve=False)
    platform_plan = index.plans[0]
    assert platform_plan.tags == ()
    got, notes = _gate(platform_plan, world, run_smoke=False)
    assert not got.open and got.held == "no smoke test ran (--no-smoke)"
    assert notes.notes == [] and notes.statuses == []


# --- which --cache-from images this Engine can read -------------------------------------------

def test_a_cache_this_engine_cannot_unpack_is_not_offered_to_the_build(monkeypatch):
    asked = []

    def can_read(client, repo, tag):
        asked.append((repo.name, tag))
        return tag != "zstd-cache"  # an Engine before 23 reads no zstd layer
    monkeypatch.setattr(registry, "engine_can_read", can_read)
    refs = (f"{REPO.name}:gzip-cache", f"{REPO.name}:zstd-cache",
            "127.0.0.1:5000/other:cache")
    assert build_mod.readable_cache("client", REPO, refs) == (
        f"{REPO.name}:gzip-cache", "127.0.0.1:5000/other:cache")
    # each asked of its own repository, the build's own by the build's repository
    assert asked == [(REPO.name, "gzip-cache"), (REPO.name, "zstd-cache"),
                     ("127.0.0.1:5000/other", "cache")]
