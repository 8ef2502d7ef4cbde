"""What an image's inline cache lets a fresh builder skip (image/inlinecache.py), the cases
tests/test_build_cache.py leaves open: every heavy step's result must be carried, not one of
them; records of either BuildKit's layout; odd entries ignored."""

from __future__ import annotations

import base64
import json

from imgbuild.image import inlinecache

SPLIT = [{"created_by": "FROM"}, {"created_by": "ENV x", "empty_layer": True},
         {"created_by": "RUN uv pip install -r /opt/imgbuild/heavy-cuda.txt"},
         {"created_by": "RUN uv pip install -r /opt/imgbuild/heavy-torch.txt"},
         {"created_by": "RUN uv pip install -r /opt/imgbuild/rest.txt"}]


def with_cache(records) -> dict:
    raw = base64.b64encode(json.dumps(records).encode()).decode()
    return {"history": SPLIT, inlinecache.CONFIG_KEY: raw}


def test_every_heavy_steps_result_must_be_carried():
    assert inlinecache.heavy_layers({"history": SPLIT}) == (1, 2)
    both = with_cache({"records": [{"results": [{"layer": 1}]}, {"results": [{"layer": 2}]}]})
    assert inlinecache.carries_heavy(both)
    one = with_cache({"records": [{"results": [{"layer": 1}, {"layer": 3}]}]})
    assert inlinecache.cached_layers(one) == {1, 3}
    assert not inlinecache.carries_heavy(one)
    # 20.10's layout: a list of records with "layers".
    assert inlinecache.carries_heavy(with_cache([{"layers": [{"layer": 2}, {"layer": 1}]}]))


def test_an_image_without_heavy_steps_needs_no_result():
    assert inlinecache.carries_heavy({"history": [{"created_by": "FROM"}]})


def test_odd_records_are_left_aside():
    got = inlinecache.cached_layers(with_cache({"records": [
        {"results": [{"layer": "1"}, {"layer": None}, 5, {"layer": 4}]}, "x", None,
        {"layers": [], "results": [{"layer": 6}]}]}))
    assert got == {4, 6}
    assert inlinecache.cached_layers(with_cache({"records": {"layer": 1}})) == set()
    assert inlinecache.cached_layers(with_cache(7)) == set()
    assert inlinecache.cached_layers({inlinecache.CONFIG_KEY: ""}) == set()
