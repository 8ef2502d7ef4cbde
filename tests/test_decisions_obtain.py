"""How a build has its image (pipeline/obtain.py obtain), without an Engine or a registry, both
scripted: already here, else in the registry (its signature enforced before the pull, as `pull`
does), else spliced from a donor's heavy layers where asked and possible, else built. --rebuild
skips the first two; the smoke checkpoint is asked for only by a target that carries one."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from imgbuild.catalog.registries import SignPolicy
from imgbuild.errors import JobFailed
from imgbuild.image import daemon, registry, signstore
from imgbuild.pipeline import obtain as ob
from imgbuild.plan.decide import make_plan

from .conftest import checkout_workspace

REPO = registry.Repository.parse("127.0.0.1:5000/acme")
IMG = SimpleNamespace(id="sha256:img", attrs={"Size": 123})


@pytest.fixture()
def world(monkeypatch):
    w = SimpleNamespace(local=None, digest=None, policy=None, spliced=None, asked=[])
    monkeypatch.setattr(daemon, "local_image", lambda client, ref: w.local)
    monkeypatch.setattr(registry, "manifest_digest", lambda repo, tag: w.digest)
    monkeypatch.setattr(registry, "pull", lambda client, ref, d, progress: w.asked.append(
        ("pull", d)))
    monkeypatch.setattr(signstore, "enforce", lambda repo, d, policy, ref: w.asked.append(
        ("enforce", d)))
    monkeypatch.setattr("imgbuild.catalog.registries.RegistryTable.policy_for",
                        lambda self, name: w.policy)

    def splice_image(ws, plan, lock, client, repo, **kw):
        w.asked.append(("splice", kw["refs"], kw["smoke_dir"]))
        return w.spliced
    monkeypatch.setattr(ob, "splice_image", splice_image)

    def build_image(ws, plan, lock, client, repo, **kw):
        w.asked.append(("build", kw["smoke_dir"], kw["no_cache"], kw["cache_from"]))
        return "the build's result"
    monkeypatch.setattr(ob, "build_image", build_image)
    w.client = SimpleNamespace(images=SimpleNamespace(get=lambda ref: IMG))
    return w


@pytest.fixture(scope="module")
def plan():
    return make_plan(checkout_workspace(), "tiny-cpu", repository=REPO.name, resolve=False)


def _obtain(plan, w, **kw):
    ws = checkout_workspace()
    return ob.obtain(ws, plan, None, w.client, REPO, **kw)


def test_an_image_already_here_is_used_as_it_is(plan, world):
    world.local, world.digest = IMG, "sha256:there"
    got = _obtain(plan, world)
    assert (got.action, got.image_id, got.size_bytes) == ("local", "sha256:img", 123)
    assert world.asked == []


def test_an_image_in_the_registry_is_pulled_by_digest_after_its_signature(plan, world):
    world.digest = "sha256:there"
    world.policy = SignPolicy("images/registries.yaml", key="k.pub")
    got = _obtain(plan, world)
    assert (got.action, got.registry_digest) == ("pulled", "sha256:there")
    assert world.asked == [("enforce", "sha256:there"), ("pull", "sha256:there")]
    world.asked.clear()
    world.policy = None  # no policy for the registry: nothing to enforce
    _obtain(plan, world)
    assert world.asked == [("pull", "sha256:there")]


def test_a_repository_without_a_registry_is_not_asked(plan, world):
    world.digest = "sha256:there"
    local = make_plan(checkout_workspace(), "tiny-cpu", repository="imgbuild", resolve=False)
    ws = checkout_workspace()
    got = ob.obtain(ws, local, None, world.client, registry.Repository.parse("imgbuild"))
    assert got.action == "built" and ("pull", "sha256:there") not in world.asked


def test_rebuild_builds_even_what_is_here_and_in_the_registry(plan, world):
    world.local, world.digest = IMG, "sha256:there"
    got = _obtain(plan, world, rebuild=True, smoke_dir=lambda: "ckpt", cache_from=("c",))
    assert (got.action, got.build) == ("built", "the build's result")
    assert world.asked == [("build", "ckpt", False, ("c",))]


def test_a_splice_is_tried_first_where_asked_and_a_build_follows_where_it_cannot(plan, world):
    from imgbuild.image.compression import GZIP

    got = _obtain(plan, world, splice_from=("r:prev",), compression=GZIP,
                  smoke_dir=lambda: "ckpt")
    assert world.asked == [("splice", ("r:prev",), "ckpt"), ("build", "ckpt", False, ())]
    assert got.action == "built"
    world.asked.clear()
    world.spliced = "the spliced image"
    assert _obtain(plan, world, splice_from=("r:prev",), compression=GZIP) == "the spliced image"
    world.asked.clear()
    # no splice without a compression to push in, nor with --no-cache
    _obtain(plan, world, splice_from=("r:prev",), compression=None)
    _obtain(plan, world, splice_from=("r:prev",), compression=GZIP, no_cache=True)
    assert [a[0] for a in world.asked] == ["build", "build"]


def test_the_smoke_checkpoint_is_asked_for_only_by_a_target_that_carries_one(plan, world):
    from dataclasses import replace

    asked = []
    _obtain(replace(plan, smoke_model=None), world,
            smoke_dir=lambda: asked.append("asked") or "ckpt")
    assert asked == [] and world.asked[-1][1] is None


# --- a build: its context, its log, what its failure says ------------------------------------

@pytest.fixture()
def builds(monkeypatch, tmp_path):
    from imgbuild.image import buildkit

    w = SimpleNamespace(calls=[], fail=None)
    monkeypatch.setattr(ob, "_base_ready", lambda ws, plan, client, repo: None)
    monkeypatch.setattr(ob, "mirror_index", lambda: None)

    def docker_build(plan, context, **kw):
        w.calls.append((sorted(p.name for p in context.iterdir()), kw))
        if w.fail is not None:
            raise w.fail
        return "built"
    monkeypatch.setattr(buildkit, "docker_build", docker_build)
    return w


def test_a_build_gets_its_context_its_log_and_its_cache_sources(plan, builds, tmp_path):
    from .test_decisions_smokemodel_flow import checkpoint

    ckpt = checkpoint(tmp_path / "ckpt", plan.smoke_model_key)
    got = ob.build_image(checkout_workspace(), plan, checkout_workspace().target("tiny-cpu")
                         .lock(), None, REPO, smoke_dir=ckpt, log_dir=tmp_path,
                         cache_from=("r:cache",), no_cache=True)
    assert got == "built"
    [(context, kw)] = builds.calls
    assert "Dockerfile" in context
    assert kw["log_path"] == tmp_path / f"{plan.content_tag}.build.log"
    assert (kw["cache_from"], kw["no_cache"], kw["tag"]) == (("r:cache",), True, None)


def test_a_target_with_a_smoke_model_is_not_built_without_its_checkpoint(plan, builds):
    with pytest.raises(JobFailed) as e:
        ob.build_image(checkout_workspace(), plan, None, None, REPO)
    assert e.value.message == (f"{plan.target} carries smoke model {plan.smoke_model}, and "
                               "none was given to build it with")
    assert builds.calls == []


def test_a_build_that_could_not_reach_an_index_says_which_and_the_way_round(plan, builds,
                                                                          tmp_path):
    from dataclasses import replace

    from .test_decisions_smokemodel_flow import checkpoint

    url = "https://download.pytorch.org/whl/cpu"
    p = replace(plan, extra_index_urls=(url,))
    builds.fail = JobFailed("docker build failed", hint="the log tail above",
                            log_tail=[f"error: Failed to fetch: {url}/torch/"])
    with pytest.raises(JobFailed) as e:
        ob.build_image(checkout_workspace(), p, checkout_workspace().target("tiny-cpu").lock(),
                       None, REPO, smoke_dir=checkpoint(tmp_path / "c", plan.smoke_model_key))
    assert e.value.hint.startswith(f"{url} is out of reach from the build")
    builds.fail = JobFailed("docker build failed", hint="the log tail above",
                            log_tail=["something else"])
    with pytest.raises(JobFailed) as e:
        ob.build_image(checkout_workspace(), p, checkout_workspace().target("tiny-cpu").lock(),
                       None, REPO, smoke_dir=tmp_path / "c")
    assert e.value.hint == "the log tail above"
