"""What a build asks of BuildKit on each Engine (pipeline/build.py build_export, image/buildkit.py
export_args), decided from the Engines' recorded facts (tests/fixtures/engines), no Docker: the
reproducible route (rewrite-timestamp through an OCI archive) only where the Engine has it, the
registry build cache only where it was asked for and the Engine exports it, and the command line
each gives."""

from __future__ import annotations

from pathlib import Path

from imgbuild.image.buildkit import SOURCE_DATE_EPOCH, Export, export_args
from imgbuild.image.engine import decide
from imgbuild.image.registry import Repository
from imgbuild.pipeline.build import BuildOptions, build_export, cache_ref
from imgbuild.plan.decide import make_plan

from .conftest import checkout_workspace
from .test_engine_facts import BOOKWORM, CLASSIC, CONTAINERD, facts

CACHE = "127.0.0.1:5000/r:tiny-cpu-buildcache-max"


def test_the_reproducible_route_only_where_the_engine_has_it():
    for engine, want in ((BOOKWORM, False), (CLASSIC, False), (CONTAINERD, True)):
        got = build_export(decide(facts(*engine)), "zstd", None, push=True)
        assert got.reproducible is want, engine
        assert got.compression == "zstd" and got.cache_to is None and got.cache_from == ()


def test_the_registry_cache_only_when_asked_for_and_offered():
    containerd = decide(facts(*CONTAINERD))
    # Asked for, pushed, the registry holds it: written, and read alone.
    got = build_export(containerd, "gzip", CACHE, push=True, cache_held=True)
    assert (got.cache_to, got.cache_from) == (CACHE, (CACHE,))
    # Not pushed: nothing written (that needs push rights); not there yet: nothing read.
    got = build_export(containerd, "gzip", CACHE, push=False, cache_held=False)
    assert (got.cache_to, got.cache_from) == (None, ())
    # The classic store's docker driver exports no cache: asked for, it is not used.
    for engine in (BOOKWORM, CLASSIC):
        got = build_export(decide(facts(*engine)), "gzip", CACHE, push=True, cache_held=True)
        assert (got.cache_to, got.cache_from) == (None, ()), engine


def test_the_registry_cache_is_off_unless_asked_for():
    ws = checkout_workspace()
    plan = make_plan(ws, "tiny-cpu", resolve=False, repository="127.0.0.1:5000/r")
    repo = Repository.parse("127.0.0.1:5000/r")
    assert cache_ref(plan, repo, BuildOptions("tiny-cpu")) is None
    asked = BuildOptions("tiny-cpu", registry_cache=True)
    assert cache_ref(plan, repo, asked) == plan.ref(plan.cache_tag + "-max")
    assert cache_ref(plan, Repository.parse("local"), asked) is None  # no registry
    for off in (dict(no_cache=True), dict(cache_from=False)):
        assert cache_ref(plan, repo, BuildOptions("tiny-cpu", registry_cache=True,
                                                  **off)) is None


def test_the_command_line_of_each_export():
    assert export_args(Export(), "r:t", Path("/a.tar")) == []
    args = export_args(Export(reproducible=True, compression="zstd", cache_to=CACHE,
                              cache_from=(CACHE,)), "r:t", Path("/a.tar"))
    out = args[args.index("--output") + 1]
    assert out.startswith("type=oci,dest=/a.tar,name=r:t,") and "rewrite-timestamp=true" in out
    assert "compression=zstd,force-compression=true" in out
    assert f"SOURCE_DATE_EPOCH={SOURCE_DATE_EPOCH}" in args and "--provenance=false" in args
    assert args[args.index("--cache-from") + 1] == f"type=registry,ref={CACHE}"
    assert args[args.index("--cache-to") + 1] == \
        f"type=registry,ref={CACHE},mode=max,ignore-error=true"
