"""Reusing a smoke report: by image ID only, passing only, and not where this host could run
the stage the report skipped. (The end-to-end path, a no-op build against the real Engine and
registry, is in tests/test_docker.py.)"""

from __future__ import annotations

import json

import pytest

from imgbuild.image import smoke

PASSING = ({"name": "environment", "status": "pass"},
           {"name": "checkpoint-cpu", "status": "pass"},
           {"name": "gpu-engine", "status": "skipped", "reason": "skipped: no GPU"})


@pytest.fixture()
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("IMGBUILD_CACHE", str(tmp_path / "cache"))
    return tmp_path / "cache"


def _report(image_id: str, ok: bool = True, stages=PASSING) -> smoke.SmokeReport:
    return smoke.SmokeReport("r:t", ok, tuple(stages), 4.0, {"ok": ok, "stages": list(stages)},
                             image_id)


def test_a_passing_report_is_recalled_by_its_image_id_only(cache, monkeypatch):
    monkeypatch.setattr(smoke, "host_has_gpu_runtime", lambda: False)
    smoke.remember(_report("sha256:aaa"))
    got = smoke.recall("r:t", "sha256:aaa")
    assert got is not None and got.ok and got.reused.startswith("local cache, run ")
    assert got.stages == PASSING and got.seconds == 0.0
    assert smoke.recall("r:t", "sha256:bbb") is None  # another image: its own test
    # A failed report is kept (for the record) but never reused.
    smoke.remember(_report("sha256:ccc", ok=False))
    assert json.loads(smoke._cache_file("sha256:ccc").read_text())["ok"] is False
    assert smoke.recall("r:t", "sha256:ccc") is None


def test_a_report_that_skipped_the_gpu_stage_is_not_reused_where_a_gpu_is(cache, monkeypatch):
    smoke.remember(_report("sha256:aaa"))
    # The seam: whether this host can give a container a GPU (Docker's NVIDIA runtime and a
    # driver), which no machine without a GPU can answer yes to.
    monkeypatch.setattr(smoke, "host_has_gpu_runtime", lambda: True)
    assert smoke.recall("r:t", "sha256:aaa") is None
    ran_on_gpu = [*PASSING[:2], {"name": "gpu-engine", "status": "pass"}]
    smoke.remember(_report("sha256:ddd", stages=ran_on_gpu))
    assert smoke.recall("r:t", "sha256:ddd") is not None


@pytest.mark.parametrize("text", ["{not json", "[]", json.dumps({"format": 99, "ok": True}),
                                  json.dumps({"format": 1, "image_id": "sha256:other",
                                              "ok": True, "stages": []})])
def test_an_unreadable_or_foreign_cache_entry_is_not_trusted(cache, monkeypatch, text):
    monkeypatch.setattr(smoke, "host_has_gpu_runtime", lambda: False)
    path = smoke._cache_file("sha256:aaa")
    path.parent.mkdir(parents=True)
    path.write_text(text)
    assert smoke.recall("r:t", "sha256:aaa") is None


def test_a_reused_report_is_not_stored_again(cache):
    smoke.remember(smoke.SmokeReport("r:t", True, PASSING, 0.0, {}, "sha256:eee", "registry"))
    assert not smoke._cache_file("sha256:eee").exists()
