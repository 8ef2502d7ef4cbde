"""A fresh builder reuses the layers of the target's previous image from the registry.

CI runners start with an empty BuildKit cache. Every image carries its inline cache
(BUILDKIT_INLINE_CACHE=1: the `moby.buildkit.cache.v0` key of its config), and `imgbuild build
--registry R` names the target's images in R (content tag, moving tags) as --cache-from. Here,
on a Docker Engine of the test's own (tests/fresh_engine.py) that starts empty, as a runner's
does: tiny-cpu pushed with its moving tags (from the shared Engine, where its steps are cached:
the previous run, wherever it ran); the fresh Engine's images removed and its BuildKit cache
pruned before each build (the next fresh runner); then a variant whose only change is one more
package in the rest of the lock (what an engine bump changes) built with the same --registry.
The heavy layer (torch) must come from the registry's cache, not run again: its step CACHED,
the image's layers up to it identical, by diff id, to the pushed image's, and not sent again.
"""

from __future__ import annotations

import base64
import json
import re
import subprocess
import uuid
from pathlib import Path

import pytest
import requests

from imgbuild.image import daemon, inlinecache
from imgbuild.image import registry as reg

from . import fresh_engine
from .conftest import REGISTRY_HOST, registry_available, run_imgbuild
from .test_project import cli, project

MANIFEST_TYPES = ", ".join(("application/vnd.docker.distribution.manifest.v2+json",
                            "application/vnd.oci.image.manifest.v1+json"))


def _ok(r: subprocess.CompletedProcess) -> dict:
    assert r.returncode == 0, f"exit {r.returncode}\n{r.stdout[-3000:]}\n{r.stderr[-3000:]}"
    return json.loads(r.stdout)


def registry_config(ref: str) -> dict:
    """The image config a tag points at, read from the registry: manifest, then config blob."""
    repo, tag = ref.split("/", 1)[1].rsplit(":", 1)
    base = f"http://{REGISTRY_HOST}/v2/{repo}"
    m = requests.get(f"{base}/manifests/{tag}", headers={"Accept": MANIFEST_TYPES}, timeout=30)
    m.raise_for_status()
    digest = m.json()["config"]["digest"]
    c = requests.get(f"{base}/blobs/{digest}", timeout=30)
    c.raise_for_status()
    return c.json()


def registry_manifest(ref: str) -> dict:
    repo, tag = ref.split("/", 1)[1].rsplit(":", 1)
    m = requests.get(f"http://{REGISTRY_HOST}/v2/{repo}/manifests/{tag}",
                     headers={"Accept": MANIFEST_TYPES}, timeout=30)
    m.raise_for_status()
    return m.json()


def heavy_layer_index(config: dict) -> int:
    """Which layer (index into rootfs.diff_ids) the heavy install step made."""
    made = [h for h in config["history"] if not h.get("empty_layer")]
    assert len(made) == len(config["rootfs"]["diff_ids"])
    return next(i for i, h in enumerate(made)
                if "-r /opt/imgbuild/heavy.txt" in h.get("created_by", ""))


def steps(log: str) -> dict[str, tuple[str, list[str]]]:
    """BuildKit's plain log by step id: (its title, the lines under it)."""
    out: dict[str, tuple[str, list[str]]] = {}
    for line in log.splitlines():
        m = re.match(r"^#(\d+) (.*)$", line)
        if m and m.group(1) not in out:
            out[m.group(1)] = (m.group(2), [])
        elif m:
            out[m.group(1)][1].append(m.group(2))
    return out


def test_the_refs_a_build_reads_the_cache_of():
    """The content tag (a --rebuild), then the moving tags (the previous image); none without a
    registry host, with --no-cache (BuildKit would ignore them) or --no-cache-from."""
    from imgbuild.cli.parser import parser
    from imgbuild.image.registry import Repository
    from imgbuild.pipeline.build import BuildOptions, cache_refs
    from imgbuild.plan.decide import make_plan

    from .conftest import checkout_workspace

    ws = checkout_workspace()
    repo = Repository.parse("ghcr.io/acme/imgbuild")
    plan = make_plan(ws, "tiny-cpu", resolve=False, repository=repo.name)
    opts = BuildOptions("tiny-cpu", registry=repo.name)
    assert cache_refs(plan, repo, opts) == (*plan.refs, "ghcr.io/acme/imgbuild:tiny-cpu-buildcache")
    assert plan.refs[0] == plan.ref() and "ghcr.io/acme/imgbuild:tiny-cpu" in plan.refs[1:]
    assert cache_refs(plan, Repository.parse("imgbuild"), opts) == ()
    assert cache_refs(plan, repo, BuildOptions("tiny-cpu", no_cache=True)) == ()
    args = parser().parse_args(["build", "tiny-cpu", "--no-cache-from"])
    assert args.no_cache_from is True
    assert cache_refs(plan, repo, BuildOptions("tiny-cpu", cache_from=False)) == ()


def test_cache_from_adds_other_images_after_the_targets_own_and_never_to_a_splice():
    """--cache-from REF: another repository's image (the release one, building for staging),
    read after the target's own images, each once; with no --registry, alone. A splice takes
    heavy blobs from the target's own repository only: the manifest it writes names them
    there. --no-cache reads none; --no-cache-from with --cache-from is refused."""
    from imgbuild.cli.args import cache_from_refs
    from imgbuild.cli.parser import parser
    from imgbuild.errors import InputError
    from imgbuild.image.registry import Repository
    from imgbuild.pipeline.build import BuildOptions, cache_refs, splice_refs
    from imgbuild.plan.decide import make_plan

    from .conftest import checkout_workspace

    ws = checkout_workspace()
    repo = Repository.parse("ghcr.io/acme/staging")
    plan = make_plan(ws, "tiny-cpu", resolve=False, repository=repo.name)
    other = "ghcr.io/acme/release:tiny-cpu"
    own = (*plan.refs, plan.ref(plan.cache_tag))
    opts = BuildOptions("tiny-cpu", registry=repo.name, push=True, smoke=False,
                        cache_from_refs=(other, plan.refs[0], other))
    assert cache_refs(plan, repo, opts) == (*own, other)
    assert splice_refs(plan, repo, opts) == own
    assert cache_refs(plan, Repository.parse("imgbuild"), opts) == (other, plan.refs[0])
    assert cache_refs(plan, repo, BuildOptions("tiny-cpu", no_cache=True,
                                               cache_from_refs=(other,))) == ()
    args = parser().parse_args(["build", "tiny-cpu", "--cache-from", other,
                                "--cache-from", "127.0.0.1:5000/x/y:t-1.0"])
    assert cache_from_refs(args) == (other, "127.0.0.1:5000/x/y:t-1.0")
    for bad, why in (("release:tiny-cpu", "no registry host"),
                     ("ghcr.io/acme/release", "no tag"),
                     ("127.0.0.1:5000/release", "no tag"),
                     ("ghcr.io/Acme/release:t", "not a repository path"),
                     ("ghcr.io/acme/release:-t", "not a tag")):
        with pytest.raises(InputError) as e:
            cache_from_refs(parser().parse_args(["build", "tiny-cpu", "--cache-from", bad]))
        assert why in e.value.message and e.value.exit_code == 2, (bad, e.value.message)
    with pytest.raises(InputError, match="opposite"):
        cache_from_refs(parser().parse_args(["build", "tiny-cpu", "--cache-from", other,
                                             "--no-cache-from"]))


RECORDED = Path(__file__).parent / "fixtures" / "inline-cache"


def recorded(name: str) -> dict:
    return json.loads((RECORDED / f"{name}.json").read_text())


def test_the_inline_cache_of_recorded_images_names_the_results_it_carries():
    """Real configs from Engine 20.10 (fixtures/inline-cache/README.md): the first build on an
    empty builder carries the heavy step's result; the bump that took it from the registry
    does not (moby/buildkit#1981); the bump after that, which ran it again, does."""
    first, bump1, bump2 = (recorded(n) for n in ("first", "bump-1", "bump-2"))
    for c in (first, bump1, bump2):
        assert inlinecache.heavy_layers(c) == (heavy_layer_index(c),) == (3,)
    assert inlinecache.cached_layers(first) == set(range(1, 9))
    assert inlinecache.cached_layers(bump1) == {1, 2, 4, 5, 6, 7, 8}
    assert inlinecache.carries_heavy(first) and inlinecache.carries_heavy(bump2)
    assert not inlinecache.carries_heavy(bump1)


def test_an_unreadable_or_missing_inline_cache_carries_nothing():
    c = recorded("first")
    assert not inlinecache.carries_heavy({k: v for k, v in c.items()
                                          if k != inlinecache.CONFIG_KEY})
    assert not inlinecache.carries_heavy(c | {inlinecache.CONFIG_KEY: "not base64 json"})
    # Later BuildKit's layout ({"records": [{"results": ...}]}) is read too.
    later = {"records": [{"digest": "sha256:x", "results": [{"layer": 3}]}]}
    assert inlinecache.cached_layers(
        {inlinecache.CONFIG_KEY: base64.b64encode(json.dumps(later).encode()).decode()}) == {3}
    # The split heavy layers are both heavy steps.
    split = {"history": [{"created_by": "FROM"}, {"created_by": "ENV x", "empty_layer": True},
                         {"created_by": "RUN uv pip install -r /opt/imgbuild/heavy-cuda.txt"},
                         {"created_by": "RUN uv pip install -r /opt/imgbuild/heavy-torch.txt"},
                         {"created_by": "RUN uv pip install -r /opt/imgbuild/rest.txt"}]}
    assert inlinecache.heavy_layers(split) == (1, 2)


def runner_setup(tmp_path: Path, name: str) -> tuple[str, Path]:
    """A repository of the test's own in the local registry, holding the bootstrapped base (the
    workflow's base job pushes it first), and a project that extends tiny-cpu, locked; skipped
    where there is no registry or no fresh Engine."""
    if not registry_available():
        pytest.skip(f"skipped: no registry on {REGISTRY_HOST} (make services starts one)")
    if why := fresh_engine.missing():
        pytest.skip(f"skipped: {why}")
    repo = f"{REGISTRY_HOST}/imgbuild-test-{name}-{uuid.uuid4().hex[:8]}"
    _ok(run_imgbuild("base", "bootstrap", "--base", "debian-bookworm", "--registry", repo,
                     "--json"))
    proj = project(tmp_path / "p", {"images/tiny-cpu.yaml": "extends: tiny-cpu\n"})
    assert cli("lock", "tiny-cpu", cwd=proj).returncode == 0
    return repo, proj


@pytest.mark.docker
# A group of its own: its builds run on its own Engine, so it need not queue behind the
# shared Engine's group on one worker (tests/docker_guard.py).
@pytest.mark.xdist_group("fresh-engine")
# make test: one bump (the check: the unchanged layers are not sent again). The slow
# group adds the bump after it, the one that needs the cache tag (moby/buildkit#1981): another
# two minutes of `make test`'s two cores; the cache tag's parts are checked in make test by
# the one bump (the tag stays on the image that carries the heavy step) and the unit tests
# above (the recorded configs, cache_refs).
@pytest.mark.parametrize("bumps", [1, pytest.param(2, marks=pytest.mark.slow)])
def test_a_fresh_builder_takes_the_heavy_layer_from_the_registry(tmp_path, bumps):
    repo, proj = runner_setup(tmp_path, "cache")
    cache_tag = f"{repo}:tiny-cpu-buildcache"

    with fresh_engine.fresh_engine() as engine:
        # No blob cache either: a runner has none, and every byte sent is counted below.
        env = {"DOCKER_HOST": engine.host, "IMGBUILD_BLOB_CACHE_GB": "0"}
        client = engine.client()

        # The previous CI run: tiny-cpu built and pushed, then its moving tags moved as its
        # passing smoke test would move them (the smoke test is not what is measured here: a
        # smoke run is half a minute of the suite's two cores). It runs on the shared Engine,
        # whose BuildKit holds tiny-cpu's steps already: a build from nothing is what this test
        # does not measure (the bumps below are), and tests/test_engines.py does one on each
        # Engine.
        first = _ok(run_imgbuild("tiny-cpu", "--push", "--no-smoke", "--registry", repo,
                                 "--json", cwd=proj))
        moving = first["refs"][1:]
        assert f"{repo}:tiny-cpu" in moving and first["moved"] == [], first
        for ref in moving:  # the previous image a bump reads
            reg.tag_manifest(reg.Repository.parse(repo), first["content_tag"].rsplit(":", 1)[1],
                             ref.rsplit(":", 1)[1])
        pushed = registry_config(f"{repo}:tiny-cpu")
        h = heavy_layer_index(pushed)
        assert h in inlinecache.cached_layers(pushed)  # it carries the heavy step's result
        # ... so the build cache tag went onto it as well.
        assert first["push"]["build_cache"] == cache_tag
        assert registry_manifest(cache_tag) == registry_manifest(first["content_tag"])

        # Engine bumps, one after the other, each on the next fresh runner: one more package
        # each time, in the rest of the lock only. The second is the one BuildKit's inline
        # cache alone gets wrong on this Engine (moby/buildkit#1981).
        previous = first
        for n, extra in enumerate(("six", "attrs")[:bumps]):
            (proj / "images/tiny-cpu.yaml").write_text(
                "extends: tiny-cpu\nrequirements:\n" + "".join(
                    f"  - {p}\n" for p in ("six", "attrs")[:n + 1]))
            assert cli("lock", "tiny-cpu", cwd=proj).returncode == 0
            for img in client.images.list():  # a fresh runner: no images, no BuildKit cache
                client.images.remove(img.id, force=True)
            subprocess.run([daemon.cli().path, "-H", engine.host, "builder", "prune", "-af"],
                           check=True, capture_output=True)
            assert not client.images.list()
            logs = tmp_path / f"logs-{extra}"
            # No smoke test: it is not what is measured here, and on an empty Engine it costs
            # a minute of this suite's two cores. The moving tags are moved below instead.
            # Built whole (--no-splice): the path a build takes when the image must be here
            # (its smoke test runs on this machine); the splice is tests/test_splice.py's.
            bump = _ok(run_imgbuild("tiny-cpu", "--registry", repo, "--json", "--log-dir",
                                    str(logs), "--push", "--no-smoke", "--no-splice", env=env,
                                    cwd=proj))
            assert bump["moved"] == []
            new = client.images.get(bump["content_tag"]).attrs["RootFS"]["Layers"]
            check_bump(previous, bump, new, h, next(logs.glob("*.build.log")).read_text(),
                       cache_tag)
            # What a passing smoke test would do: the moving tags go to the bump, so the next
            # bump reads this one's image there, as on CI.
            for ref in moving:
                reg.tag_manifest(reg.Repository.parse(repo),
                                 bump["content_tag"].rsplit(":", 1)[1], ref.rsplit(":", 1)[1])
            assert registry_manifest(f"{repo}:tiny-cpu") == registry_manifest(bump["content_tag"])
            previous = bump


def check_bump(previous: dict, bump: dict, new: list[str], h: int, log: str,
               cache_tag: str) -> None:
    """One engine bump on a fresh runner: built with the registry's cache, the heavy step
    CACHED, its layers up to the heavy one the previous image's, and only the changed ones
    sent."""
    repo = cache_tag.rsplit(":", 1)[0]
    assert bump["action"] == "built" and bump["content_tag"] != previous["content_tag"]
    by_id = steps(log)
    [(heavy_title, heavy)] = [v for v in by_id.values()
                              if v[0].startswith("[") and "-r /opt/imgbuild/heavy.txt" in v[0]]
    [(rest_title, rest)] = [v for v in by_id.values()
                            if v[0].startswith("[") and "-r /opt/imgbuild/rest.txt" in v[0]]
    assert "CACHED" in heavy, (heavy_title, heavy)  # from the registry: this BuildKit had none
    assert "CACHED" not in rest  # the change: installed here

    assert f"{repo}:tiny-cpu" in bump["build"]["cache_imported"], bump["build"]
    assert cache_tag in bump["build"]["cache_imported"]
    # The content tag is new: BuildKit found no image there, said so, and built on.
    assert bump["content_tag"] not in bump["build"]["cache_imported"]

    # Byte for byte the same layers up to the heavy one; the rest differs.
    old = registry_config(previous["content_tag"])["rootfs"]["diff_ids"]
    assert h >= 1 and new[:h + 1] == old[:h + 1]
    assert new[h + 1:] != old[h + 1:]

    # Pushed: the unchanged layers are not sent again (the registry's blobs for them are the
    # previous image's), and what is sent is the changed layers only.
    old_m = registry_manifest(previous["content_tag"])
    new_m = registry_manifest(bump["content_tag"])
    old_blobs = {la["digest"] for la in old_m["layers"]}
    unchanged = [la for d, la in zip(new, new_m["layers"]) if d in set(old)]
    changed = [la for d, la in zip(new, new_m["layers"]) if d not in set(old)]
    assert len(unchanged) >= h + 1 and all(la["digest"] in old_blobs for la in unchanged)
    assert bump["push"]["reused_layers"] == len({la["digest"] for la in unchanged})
    assert bump["push"]["sent_bytes"] == sum(la["size"] for la in changed) > 0

    # The cache tag follows the bump only when its inline cache carries the heavy step's
    # result; on this Engine it does not (the step came from the registry's cache), and the
    # tag stays on the image that has it.
    if inlinecache.carries_heavy(registry_config(bump["content_tag"])):
        assert bump["push"]["build_cache"] == cache_tag
        assert registry_manifest(cache_tag) == new_m
    else:
        assert bump["push"]["build_cache"] is None
        assert registry_manifest(cache_tag) != new_m


@pytest.mark.docker
def test_a_cache_ref_that_does_not_exist_is_neither_the_build_nor_its_failure(docker_client,
                                                                             tmp_path):
    """BuildKit says ERROR for a --cache-from it cannot read and builds on (exit 0): the build
    succeeds with nothing imported, and when a step of its own fails, that step is the one
    named, with its log, not the cache's lookup."""
    from imgbuild.errors import JobFailed
    from imgbuild.image import base
    from imgbuild.image.buildkit import docker_build
    from imgbuild.image.context import Secrets
    from imgbuild.plan.decide import make_plan

    from .conftest import checkout_workspace

    ws = checkout_workspace()
    base.bootstrap(docker_client, ws.catalog.base("debian-bookworm"))  # reused when here
    repo = f"{REGISTRY_HOST}/imgbuild-test-cache-{uuid.uuid4().hex[:8]}"
    plan = make_plan(ws, "tiny-cpu", resolve=False, repository=repo)
    missing = (f"{repo}:no-such-tag", "127.0.0.1:5999/imgbuild-nowhere:x")
    ctx = tmp_path / "ctx"
    ctx.mkdir()
    (ctx / "Dockerfile").write_text(f"FROM {plan.base_image}\nRUN echo built > /built\n")
    ok = docker_build(plan, ctx, secrets=Secrets(), flags="", cache_from=missing)
    assert ok.image_id and ok.cache_imported == ()
    try:
        (ctx / "Dockerfile").write_text(f"FROM {plan.base_image}\n"
                                        "RUN echo imgbuild-step-of-its-own && false\n")
        with pytest.raises(JobFailed) as e:
            docker_build(plan, ctx, secrets=Secrets(), flags="", cache_from=missing)
        assert "RUN echo imgbuild-step-of-its-own" in e.value.message
        assert any("imgbuild-step-of-its-own" in ln for ln in e.value.log_tail)
        assert not any("importing cache manifest" in ln for ln in e.value.log_tail)
    finally:
        docker_client.images.remove(plan.ref())
