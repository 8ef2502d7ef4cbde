"""The content tag and the moving tags that key.finalize attaches: one platform's image of a
multi-platform target names its arch and carries no moving tags (the index carries them); a
single-platform image carries the target's and the engine's. Pure: no Docker, no network."""

from __future__ import annotations

import dataclasses

from imgbuild.plan.decide import make_plan
from imgbuild.plan.key import finalize

from .conftest import checkout_workspace

WS = checkout_workspace()


def test_one_platform_of_an_index_names_its_arch_and_carries_no_moving_tags():
    for platform, arch in (("linux/amd64", "amd64"), ("linux/arm64", "arm64")):
        p = make_plan(WS, "tiny-cpu-multi", resolve=False, platform=platform)
        assert p.index_platforms == ("linux/amd64", "linux/arm64")
        assert p.platform == platform
        key = p.content_key.removeprefix("sha256:")
        assert p.content_key == f"sha256:{key}" and len(key) == 64
        stem = "tiny-cpu-multi" + (f"-{p.model}" if p.model else "")
        assert p.content_tag == f"{stem}-{arch}-{key[:16]}"
        assert p.tags == ()
        assert p.refs == (f"imgbuild:{p.content_tag}",)


def test_refinalizing_an_index_image_recomputes_its_tag_and_drops_stale_tags():
    """finalize decides the content tag and the tags from the inputs alone: a plan finalized
    again with another lock gets the new key's tag, and no tag the draft carried survives."""
    p = make_plan(WS, "tiny-cpu-multi", resolve=False, platform="linux/arm64")
    lock = WS.target("tiny-cpu-multi", "linux/arm64").lock()
    other_lock = dataclasses.replace(lock, packages=lock.packages[1:])
    draft = dataclasses.replace(p, tags=("tiny-cpu-multi", "stale"))
    again = finalize(draft, other_lock)
    assert again.content_key != p.content_key
    assert again.content_tag == f"{p.content_tag[:-16]}{again.content_key[7:23]}"
    assert again.content_tag != p.content_tag
    assert again.tags == ()


def test_a_single_platform_image_carries_the_target_and_engine_tags():
    p = make_plan(WS, "tiny-cpu", resolve=False)
    assert p.index_platforms == ("linux/amd64",)
    assert p.engine == "transformers" and p.engine_version
    stem = "tiny-cpu" + (f"-{p.model}" if p.model else "")
    assert p.content_tag == f"{stem}-{p.content_key[7:23]}"
    assert p.tags == (stem, f"{stem}-transformers{p.engine_version}")
