"""What a build decides from BuildKit's own words (image/buildkit.py docker_build), without an
Engine: the client is a script that prints a recorded `docker build --progress=plain` log
(tests/data/buildkit/) and exits as the real one did. Decided and tested: each step is said
once done and counted (a cached one counted only); the image id is the one the build wrote; a failed step
fails the build with that step's lines, and the log is kept where asked."""

from __future__ import annotations

import shlex
from pathlib import Path

import pytest

from imgbuild.errors import JobFailed
from imgbuild.image import buildkit
from imgbuild.image.context import Secrets
from imgbuild.image.daemon import DockerCLI
from imgbuild.plan.decide import make_plan

from .conftest import checkout_workspace
from .progress_notes import Notes

LOGS = Path(__file__).parent / "data" / "buildkit"
IID = "sha256:0b20d199f52258243a848314732cd28aed27a41538aab23d694c41a88f17cf68"




def _client(tmp_path, log: str, rc: int) -> DockerCLI:
    """A client that prints `log` and exits `rc`, writing the image id where --iidfile says."""
    script = tmp_path / "docker"
    script.write_text(
        "#!/bin/sh\n"
        'while [ $# -gt 0 ]; do [ "$1" = --iidfile ] && '
        f"printf %s {IID} > \"$2\"; shift; done\n"
        f"cat {shlex.quote(str(LOGS / log))}\nexit {rc}\n")
    script.chmod(0o755)
    return DockerCLI(str(script), "20.10.24+dfsg1", True)


@pytest.fixture(scope="module")
def plan():
    return make_plan(checkout_workspace(), "tiny-cpu", resolve=False)


def _build(plan, tmp_path, monkeypatch, log, rc=0, **kw):
    monkeypatch.setattr(buildkit, "cli", lambda: _client(tmp_path, log, rc))
    ctx = tmp_path / "ctx"
    ctx.mkdir(exist_ok=True)
    notes = Notes()
    return buildkit.docker_build(plan, ctx, secrets=Secrets(), flags="", progress=notes,
                                 **kw), notes


def test_a_build_says_each_step_done_and_counts_them(plan, tmp_path, monkeypatch):
    got, notes = _build(plan, tmp_path, monkeypatch, "built.log")
    assert (got.image_id, got.steps, got.cached_steps, got.cache_imported) == (IID, 4, 1, ())
    # a step BuildKit found CACHED says no DONE: it is counted, not said
    assert notes.said == ["  done [2/4] RUN echo one > /one",
                          "  done [3/4] RUN echo two > /two && sleep 0.1",
                          "  done [4/4] COPY a.txt /a.txt"]
    assert f"building {plan.content_tag}: [2/4] RUN echo one > /one" in notes.statuses


def test_a_build_from_cache_counts_the_steps_buildkit_found_cached(plan, tmp_path, monkeypatch):
    got, notes = _build(plan, tmp_path, monkeypatch, "built-again-cached.log")
    # BuildKit says the FROM step DONE again, and the three after it CACHED
    assert (got.steps, got.cached_steps) == (4, 3)
    assert notes.said == ["  done [1/4] FROM docker.io/library/imgbuild-base:debian-bookworm-py3.11"]


def test_a_failed_step_fails_the_build_with_its_own_lines(plan, tmp_path, monkeypatch):
    log = tmp_path / "build.log"
    with pytest.raises(JobFailed) as e:
        _build(plan, tmp_path, monkeypatch, "failed-step.log", rc=1, log_path=log)
    assert e.value.message == ('docker build failed at [3/3] RUN echo "something broke" >&2 && '
                               "exit 3 (exit code 1)")
    assert e.value.facts == [f"image {plan.ref()} was not tagged"]
    assert e.value.hint == f"the log tail above shows the failing step; full log in {log}"
    assert e.value.log_tail[-2:] == [
        "#6 0.421 something broke",
        '#6 ERROR: executor failed running [/bin/sh -c echo "something broke" >&2 && exit 3]: '
        "exit code: 3"]
    assert not any("first" in ln for ln in e.value.log_tail)  # the other step's lines: not its
    assert log.read_text() == (LOGS / "failed-step.log").read_text()  # kept whole


def test_what_a_build_asks_beyond_the_default_is_said_in_words():
    from imgbuild.image.buildkit import SOURCE_DATE_EPOCH, Export

    assert Export().describe() == []
    assert Export(reproducible=True, compression="zstd",
                  cache_to="127.0.0.1:5000/acme:buildcache").describe() == [
        f"layers rewritten to SOURCE_DATE_EPOCH={SOURCE_DATE_EPOCH}, zstd, through an OCI "
        "archive", "registry cache (mode=max) to 127.0.0.1:5000/acme:buildcache"]
    assert Export(cache_from=("x",)).describe() == []  # reading a cache asks nothing more


def test_caches_that_could_not_be_read_and_uvs_downloads_are_said_their_way(plan, tmp_path,
                                                                            monkeypatch):
    got, notes = _build(plan, tmp_path, monkeypatch, "cache-from-and-uv.log",
                        cache_from=("127.0.0.1:5000/imgbuild-never-pushed:none",
                                    "127.0.0.1:5999/nowhere:tag"))
    assert (got.steps, got.cached_steps, got.cache_imported) == (3, 1, ())
    # a tag not pushed yet is the usual case and said nothing; an unreachable one is a warning
    assert notes.notes[-1] == (
        "warn", 'no cache read from 127.0.0.1:5999/nowhere:tag: failed to do request: Head '
        '"http://127.0.0.1:5999/v2/nowhere/manifests/tag": dial tcp 127.0.0.1:5999: connect: '
        "connection refused")
    assert not any("never-pushed" in m for m in notes.said)
    tag = plan.content_tag
    assert f"building {tag}: reading the cache of 127.0.0.1:5999/nowhere:tag" in notes.statuses
    assert f"building {tag}: reading the cache of 127.0.0.1:5000/imgbuild-never-pushed:none" \
        in notes.statuses
    # uv's downloads, as they come: what it said it fetches, and how much has arrived
    step = f'building {tag}: [2/3] RUN echo "Resolved 3 packages in 12ms" && echo "Downloading'
    said = [d for text, d in notes.details if text.startswith(step)]
    assert said == ["uv fetched 0 B of 15.9 MB", "uv fetched 0 B of 867.8 MB",  # 15.2 MiB
                    "uv fetched 15.9 MB of 867.8 MB"] + ["uv fetched 867.8 MB of 867.8 MB"] * 3
