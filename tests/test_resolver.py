"""The resolver's cases, reproduced exactly on a local index (pypiserver on loopback) with
small wheels the tests build, and against real PyPI metadata (marker `live`)."""

from __future__ import annotations

import pytest

from imgbuild.errors import ResolveError
from imgbuild.lock.lockfile import LockRequest
from imgbuild.lock.resolve import check_overrides, ensure_lock, resolve_explained

from .wheelfactory import LocalIndex, WheelSpec

PLAT = "x86_64-manylinux_2_36"


@pytest.fixture(scope="module")
def index(tmp_path_factory):
    ix = LocalIndex(tmp_path_factory.mktemp("index"))
    ix.add(WheelSpec("ctensors", "0.8.1"))
    ix.add(WheelSpec("ctensors", "0.10.0"))
    ix.add(WheelSpec("ctensors", "0.11.0"))
    ix.add(WheelSpec("engine-old", "1.0", requires=("ctensors==0.8.1",)))
    ix.add(WheelSpec("engine-new", "2.0", requires=("ctensors==0.11.0",)))
    ix.add(WheelSpec("engine-loose", "1.0", requires=("ctensors>=0.10",)))
    # Backtracking bait: 1.0 installs anywhere, 2.0 only on glibc >= 2.34.
    ix.add(WheelSpec("servo", "1.0"))
    ix.add(WheelSpec("servo", "2.0", tag="py3-none-manylinux_2_34_x86_64"))
    ix.start()
    yield ix
    ix.stop()


@pytest.fixture()
def use_index(index, monkeypatch, tmp_path):
    monkeypatch.setenv("UV_INDEX_URL", index.url)
    monkeypatch.setenv("UV_CACHE_DIR", str(tmp_path / "uv-cache"))
    return index


def req(*reqs, overrides=(), platform=PLAT):
    return LockRequest("t", "3.11", platform, tuple(reqs), tuple(overrides))


def test_exact_pin_conflict_is_explained_with_an_override_that_works(use_index):
    with pytest.raises(ResolveError) as e:
        resolve_explained(req("engine-old==1.0", "ctensors>=0.10"))
    facts = "\n".join(e.value.facts)
    assert "engine-old==1.0 requires ctensors==0.8.1" in facts
    assert "you require ctensors>=0.10" in facts
    assert "override ctensors>=0.10" in facts
    assert "resolve it (checked with uv)" in e.value.hint
    assert "requirement: ctensors>=0.10" in e.value.hint and "reason:" in e.value.hint


def test_two_engines_pinning_different_versions(use_index):
    with pytest.raises(ResolveError) as e:
        resolve_explained(req("engine-old==1.0", "engine-new==2.0"))
    facts = "\n".join(e.value.facts)
    assert "engine-new==2.0 requires ctensors==0.11.0" in facts
    assert "engine-old==1.0 requires ctensors==0.8.1" in facts
    assert "override ctensors==0.11.0 (the newer of the exact pins)" in facts


def test_override_reconciles_and_removable_override_is_reported(use_index, tmp_path):
    r = req("engine-old==1.0", "ctensors>=0.10", overrides=("ctensors>=0.10",))
    lock, written = ensure_lock(r, tmp_path)
    assert written and lock.package("ctensors").version == "0.11.0"
    assert lock.package("engine-old").version == "1.0"
    [status] = check_overrides(r, None, lock)
    assert status.needed and "no resolution" in status.effect
    # The same override beside an engine that already allows it changes nothing.
    r2 = req("engine-loose==1.0", overrides=("ctensors>=0.10",))
    lock2, _ = ensure_lock(r2, tmp_path / "2")
    [status2] = check_overrides(r2, None, lock2)
    assert not status2.needed and "removable" in status2.effect
    # An override that picks another version than the resolver would is doing something.
    r3 = req("engine-loose==1.0", overrides=("ctensors==0.10.0",))
    lock3, _ = ensure_lock(r3, tmp_path / "3")
    [status3] = check_overrides(r3, None, lock3)
    assert status3.needed and "ctensors 0.10.0 → 0.11.0" in status3.effect


def test_no_silent_backtracking_by_platform_tag(use_index):
    # The danger, shown with uv itself: a range quietly falls back to 1.0 on an old glibc.
    from imgbuild.lock.resolve import resolve

    body = resolve(req("servo>=1", platform="x86_64-manylinux_2_28"))
    assert "servo==1.0" in body
    # imgbuild pins the engine exactly, and says why it cannot be had.
    with pytest.raises(ResolveError) as e:
        resolve_explained(req("servo==2.0", platform="x86_64-manylinux_2_28"))
    assert e.value.message.startswith("servo 2.0 has no wheel for this image's platform "
                                      "x86_64-manylinux_2_28")
    assert "manylinux_2_34_x86_64" in e.value.message
    assert "will not fall back to an older servo" in e.value.message
    assert "glibc" in e.value.hint
    # On a new enough platform it resolves.
    assert "servo==2.0" in resolve(req("servo==2.0", platform="x86_64-manylinux_2_36"))
    # For another CPU: the same rule, and the sentence names the platforms it does ship.
    with pytest.raises(ResolveError) as e:
        resolve_explained(req("servo==2.0", platform="aarch64-manylinux_2_36"))
    assert e.value.message.startswith("servo 2.0 has no wheel for this image's platform "
                                      "aarch64-manylinux_2_36")
    assert "manylinux_2_34_x86_64" in e.value.message, e.value.message
    assert "ships no aarch64 wheel at all" in e.value.hint and "glibc" not in e.value.hint


@pytest.mark.live
def test_real_vllm_066_against_nvfp4_compressed_tensors():
    with pytest.raises(ResolveError) as e:
        resolve_explained(req("vllm==0.6.6", "compressed-tensors>=0.10"))
    facts = "\n".join(e.value.facts)
    assert "vllm==0.6.6 requires compressed-tensors==0.8.1" in facts
    assert "override compressed-tensors>=0.10" in facts


@pytest.mark.live
def test_real_sglang_0523_with_vllm_0330():
    r = LockRequest("sglang-vllm-blackwell", "3.12", "x86_64-manylinux_2_39",
                    ("sglang==0.5.23", "vllm==0.33.0"))
    with pytest.raises(ResolveError) as e:
        resolve_explained(r)
    facts = "\n".join(e.value.facts)
    assert "vllm>=0.33.0 requires compressed-tensors==0.17.0" in facts
    assert "sglang>=0.5.23 requires compressed-tensors==0.18.0" in facts
    assert "torch" in facts
    assert "override compressed-tensors==0.18.0" in facts
    assert "resolve it (checked with uv)" in e.value.hint


@pytest.mark.live
def test_real_sglang_platform_floor():
    with pytest.raises(ResolveError) as e:
        resolve_explained(LockRequest("t", "3.12", "x86_64-manylinux_2_28", ("sglang==0.5.23",)))
    assert "sglang 0.5.23 has no wheel for this image's platform" in e.value.message
    assert "manylinux_2_34_x86_64" in e.value.message
