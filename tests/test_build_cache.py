"""A fresh builder reuses the layers of the target's previous image from the registry.

CI runners start with an empty BuildKit cache. Every image carries its inline cache
(BUILDKIT_INLINE_CACHE=1: the `moby.buildkit.cache.v0` key of its config), and `imgbuild build
--registry R` names the target's images in R (content tag, moving tags) as --cache-from. Here:
tiny-cpu built and pushed with its moving tags; the Engine's images of that repository removed
and BuildKit's whole cache pruned (a fresh runner); then a variant whose only change is one
more package in the rest of the lock (what an engine bump changes) built with the same
--registry. The heavy layer (torch) must come from the registry's cache, not run again: its
step CACHED and the image's layers up to it identical, by diff id, to the pushed image's.
"""

from __future__ import annotations

import json
import re
import subprocess
import uuid

import pytest
import requests

from imgbuild.image import daemon

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
    assert cache_refs(plan, repo, opts) == plan.refs
    assert plan.refs[0] == plan.ref() and "ghcr.io/acme/imgbuild:tiny-cpu" in plan.refs[1:]
    assert cache_refs(plan, Repository.parse("imgbuild"), opts) == ()
    assert cache_refs(plan, repo, BuildOptions("tiny-cpu", no_cache=True)) == ()
    args = parser().parse_args(["build", "tiny-cpu", "--no-cache-from"])
    assert args.no_cache_from is True
    assert cache_refs(plan, repo, BuildOptions("tiny-cpu", cache_from=False)) == ()


@pytest.mark.docker
@pytest.mark.engine_exclusive  # it prunes BuildKit's whole cache: no other build meanwhile
# slow: the prune empties BuildKit's cache for every test after it (uv's cache mount with it),
# and in make test those rebuilt what they had cached: the suite took 31 min instead of 18.
@pytest.mark.slow
def test_a_fresh_builder_takes_the_heavy_layer_from_the_registry(docker_client, tmp_path):
    if not registry_available():
        pytest.skip(f"skipped: no registry on {REGISTRY_HOST} (make services starts one)")
    repo = f"{REGISTRY_HOST}/imgbuild-test-cache-{uuid.uuid4().hex[:8]}"
    first = _ok(run_imgbuild("tiny-cpu", "--push", "--registry", repo, "--json"))
    assert f"{repo}:tiny-cpu" in first["moved"], first  # the previous image a bump reads
    pushed = registry_config(f"{repo}:tiny-cpu")
    assert "moby.buildkit.cache.v0" in pushed  # the inline cache went with the config

    # The variant: the same target with one more package, in the rest of the lock only.
    proj = project(tmp_path / "p", {"images/tiny-cpu.yaml":
                                    "extends: tiny-cpu\nrequirements:\n  - six\n"})
    assert cli("lock", "tiny-cpu", cwd=proj).returncode == 0

    # A fresh runner: none of this repository's images, nothing in BuildKit's cache.
    # By tag: the same image may carry another repository's tags, which stay.
    for tag in {t for img in docker_client.images.list(name=repo) for t in img.tags
                if t.startswith(repo + ":")}:
        docker_client.images.remove(tag)
    assert not docker_client.images.list(name=repo)
    subprocess.run([daemon.cli().path, "builder", "prune", "-af"], check=True,
                   capture_output=True)

    logs = tmp_path / "logs"
    second = _ok(cli("tiny-cpu", "--registry", repo, "--no-smoke", "--json", "--log-dir",
                     str(logs), "--push", cwd=proj))
    assert second["action"] == "built" and second["content_tag"] != first["content_tag"]
    assert f"{repo}:tiny-cpu" in second["build"]["cache_imported"], second["build"]
    # The content tag is new: BuildKit found no image there, said so, and built on.
    assert second["content_tag"] not in second["build"]["cache_imported"]

    log = next(logs.glob("*.build.log")).read_text()
    by_id = steps(log)
    [(heavy_title, heavy)] = [v for v in by_id.values()
                              if v[0].startswith("[") and "-r /opt/imgbuild/heavy.txt" in v[0]]
    [(rest_title, rest)] = [v for v in by_id.values()
                            if v[0].startswith("[") and "-r /opt/imgbuild/rest.txt" in v[0]]
    assert "CACHED" in heavy, (heavy_title, heavy)  # from the registry: this BuildKit had none
    assert "CACHED" not in rest  # the change: installed here

    # Byte for byte the same layers up to the heavy one; the rest differs.
    new = docker_client.images.get(second["content_tag"]).attrs["RootFS"]["Layers"]
    old = pushed["rootfs"]["diff_ids"]
    h = heavy_layer_index(pushed)
    assert h >= 1 and new[:h + 1] == old[:h + 1]
    assert new[h + 1:] != old[h + 1:]

    # Pushed: the unchanged layers are not sent again (the registry's blobs for them are the
    # previous image's), and what is sent is the changed layers only.
    old_m = registry_manifest(f"{repo}:tiny-cpu")
    new_m = registry_manifest(second["content_tag"])
    old_blobs = {la["digest"] for la in old_m["layers"]}
    unchanged = [la for d, la in zip(new, new_m["layers"]) if d in set(old)]
    changed = [la for d, la in zip(new, new_m["layers"]) if d not in set(old)]
    assert len(unchanged) >= h + 1 and all(la["digest"] in old_blobs for la in unchanged)
    assert second["push"]["reused_layers"] == len({la["digest"] for la in unchanged})
    assert second["push"]["sent_bytes"] == sum(la["size"] for la in changed) > 0


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
