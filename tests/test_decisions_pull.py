"""`imgbuild pull` without an Engine or a registry (pipeline/pull.py pull_target, _from_index):
the registry and the Engine are scripted, answering as Distribution and dockerd do. What is
decided and tested: nothing is pulled that the registry does not hold; the signature policy is
enforced before a byte is downloaded (the index's first, for a multi-platform target); the
pulled digest must be the registry's; an image whose attestations do not match is refused; and
the moving tags are set here only over a passing (or forced) smoke report.

tests/test_docker.py pulls real images from a real registry."""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest

from imgbuild.catalog.registries import SignPolicy
from imgbuild.errors import JobFailed
from imgbuild.image import attest, daemon, registry, signstore
from imgbuild.pipeline import pull as pull_mod
from imgbuild.plan.decide import make_plan
from imgbuild.plan.index import make_index_plan

from .conftest import checkout_workspace

REPO = "127.0.0.1:5000/acme"
WANT = "sha256:" + "a" * 64
INDEX = "sha256:" + "1" * 64


@dataclass
class Image:
    tagged: list = field(default_factory=list)

    def tag(self, repository: str, tag: str) -> None:
        self.tagged.append(f"{repository}:{tag}")


@dataclass
class World:
    """What the scripted registry holds and what was asked of it, in order."""

    digests: dict = field(default_factory=dict)  # tag -> manifest digest
    index: tuple | None = None  # (digest, {platform: manifest digest})
    report: dict | None = None
    pulled: str = WANT
    checks: tuple = (("sbom", True, "matches the lock"),)
    policy: SignPolicy | None = None
    asked: list = field(default_factory=list)
    image: Image = field(default_factory=Image)


@pytest.fixture()
def world(monkeypatch) -> World:
    w = World()
    client = type("Client", (), {"images": type("Images", (), {
        "get": staticmethod(lambda ref: w.image)})()})()
    monkeypatch.setattr(daemon, "client", lambda: client)
    monkeypatch.setattr(registry, "check_reachable", lambda repo: w.asked.append("reachable"))
    monkeypatch.setattr(registry, "manifest_digest", lambda repo, tag: w.digests.get(tag))
    monkeypatch.setattr(registry, "fetch_index", lambda repo, tag: w.index)
    monkeypatch.setattr(registry, "fetch_report", lambda repo, d: w.report)

    def pull(client, ref, want, progress):
        w.asked.append(("pull", want))
        return w.pulled
    monkeypatch.setattr(registry, "pull", pull)

    def enforce(repo, digest, policy, ref, **kw):
        w.asked.append(("enforce", digest))
    monkeypatch.setattr(signstore, "enforce", enforce)
    monkeypatch.setattr(attest, "verify", lambda repo, tag, lock, policy: attest.Verification(
        f"{REPO}:{tag}", WANT, w.checks))
    monkeypatch.setattr("imgbuild.catalog.registries.RegistryTable.policy_for",
                        lambda self, name: w.policy)
    monkeypatch.setattr(pull_mod, "host_platform", lambda: "linux/amd64")
    return w


@pytest.fixture(scope="module")
def plan():
    return make_plan(checkout_workspace(), "tiny-cpu", repository=REPO, resolve=False)


def _pull(target="tiny-cpu", **kw):
    return pull_mod.pull_target(checkout_workspace(), target, model=None, registry_name=REPO,
                                **kw)


def test_an_image_the_registry_does_not_hold_is_not_pulled(world, plan):
    with pytest.raises(JobFailed) as e:
        _pull()
    assert e.value.message == f"no image for tiny-cpu in {REPO}"
    assert e.value.facts == [f"content tag {plan.content_tag} is not in the registry"]
    assert e.value.hint == f"build and push it: `imgbuild tiny-cpu --push --registry {REPO}`"
    assert world.asked == ["reachable"]


def test_a_passing_report_sets_the_moving_tags_here(world, plan):
    world.digests[plan.content_tag] = WANT
    world.report = {"ok": True}
    got = _pull()
    assert (got.digest, got.registry_digest, got.ref) == (WANT, WANT, plan.ref())
    assert world.image.tagged == [f"{REPO}:{t}" for t in plan.tags] and plan.tags
    assert got.moving == tuple(f"{REPO}:{t}" for t in plan.tags)
    assert (got.platform, got.platform_why) == ("linux/amd64", "this host's platform")


@pytest.mark.parametrize("report, moved", [
    (None, False), ({"ok": False}, False), ({"ok": False, "forced": True}, True)])
def test_without_a_passing_report_the_moving_tags_stay_unless_forced(world, plan, report, moved):
    world.digests[plan.content_tag] = WANT
    world.report = report
    got = _pull()
    assert bool(world.image.tagged) is moved and got.report == report


def test_a_pull_that_got_other_bytes_than_the_registry_named_is_refused(world, plan):
    world.digests[plan.content_tag] = WANT
    world.pulled = "sha256:" + "b" * 64
    with pytest.raises(JobFailed) as e:
        _pull()
    assert e.value.message == (f"pulled {plan.ref()} by digest {world.pulled}, but the registry "
                               f"holds {WANT}")
    assert world.image.tagged == []


def test_an_image_whose_attestations_do_not_match_is_refused(world, plan):
    world.digests[plan.content_tag] = WANT
    world.report = {"ok": True}
    world.checks = (("sbom", False, "lists torch 2.9.0, the lock 2.9.1"),
                    ("provenance", False, "none stored"), ("labels", True, "ok"))
    with pytest.raises(JobFailed) as e:
        _pull()
    assert e.value.message == f"{plan.ref()} does not verify"
    # what is not stored is no mismatch: only what contradicts the lock is named
    assert e.value.facts == ["sbom: lists torch 2.9.0, the lock 2.9.1"]
    assert world.image.tagged == []


def test_the_signature_is_enforced_before_any_byte_is_pulled(world, plan):
    world.digests[plan.content_tag] = WANT
    world.policy = SignPolicy("images/registries.yaml", key="keys/ci.pub")
    _pull()
    assert world.asked == ["reachable", ("enforce", WANT), ("pull", WANT)]


@pytest.fixture(scope="module")
def index():
    return make_index_plan(checkout_workspace(), "tiny-cpu-multi", repository=REPO,
                           resolve=False)


def test_a_multi_platform_target_is_pulled_through_its_index_for_this_host(world, index):
    amd64 = index.plan_for("linux/amd64")
    world.digests[amd64.content_tag] = WANT
    world.index = (INDEX, {"linux/amd64": WANT, "linux/arm64": "sha256:" + "c" * 64})
    world.policy = SignPolicy("images/registries.yaml", key="keys/ci.pub")
    world.report = {"ok": True}
    got = _pull("tiny-cpu-multi")
    assert got.index_digest == INDEX and got.digest == WANT
    # the index's signature first, then the image's, then the pull
    assert world.asked == ["reachable", ("enforce", INDEX), ("enforce", WANT), ("pull", WANT)]
    # the moving tags are the index's (the platform images have none of their own)
    assert world.image.tagged == [f"{REPO}:{t}" for t in index.tags]


def test_an_index_that_lists_another_image_than_the_platforms_tag_is_refused(world, index):
    amd64 = index.plan_for("linux/amd64")
    world.digests[amd64.content_tag] = "sha256:" + "e" * 64
    world.index = (INDEX, {"linux/amd64": WANT})
    with pytest.raises(JobFailed) as e:
        _pull("tiny-cpu-multi")
    assert e.value.message.startswith(f"the index {index.ref()} lists {WANT[:19]}… for "
                                      "linux/amd64, but that platform's content tag names")
    assert ("pull", WANT) not in world.asked


def test_an_index_without_this_platform_or_not_there_at_all_is_refused(world, index):
    world.index = (INDEX, {"linux/arm64": WANT})
    with pytest.raises(JobFailed) as e:
        _pull("tiny-cpu-multi")
    assert e.value.message == f"the index {index.ref()} lists no image for linux/amd64"
    assert e.value.facts == ["it lists linux/arm64"]
    world.index = None
    world.digests[index.plan_for("linux/arm64").content_tag] = WANT
    with pytest.raises(JobFailed) as e:
        _pull("tiny-cpu-multi")
    assert e.value.message == f"no index for tiny-cpu-multi in {REPO}"
    assert e.value.facts[1:] == [
        f"linux/amd64: {index.plan_for('linux/amd64').content_tag} is not",
        f"linux/arm64: {index.plan_for('linux/arm64').content_tag} is there"]
