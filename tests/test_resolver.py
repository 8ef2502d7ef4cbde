"""The resolver's cases, reproduced exactly on a local index (pypiserver on loopback) with
small wheels the tests build, and against real PyPI metadata (marker `live`)."""

from __future__ import annotations

import hashlib
import io
import json
import re
import tarfile
from pathlib import Path

import pytest

from imgbuild.errors import ResolveError
from imgbuild.lock.lockfile import LOCK_FORMAT, LockRequest
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
    # An sdist with no wheel (as NVIDIA's wheel stubs are), and an engine that pins it.
    make_sdist("stubby", "1.0", ix.root)
    ix.add(WheelSpec("engine-stub", "1.0", requires=("stubby==1.0",)))
    ix.start()
    yield ix
    ix.stop()


@pytest.fixture()
def use_index(index, monkeypatch, tmp_path):
    monkeypatch.setenv("UV_INDEX_URL", index.url)
    monkeypatch.setenv("UV_CACHE_DIR", str(tmp_path / "uv-cache"))
    # The override checks' answers too: a test's lock is asked for real, and nothing is kept
    # outside the test.
    monkeypatch.setenv("IMGBUILD_CACHE", str(tmp_path / "imgbuild-cache"))
    return index


def req(*reqs, overrides=(), platform=PLAT, build_from_source=False):
    return LockRequest("t", "3.11", platform, tuple(reqs), tuple(overrides),
                       build_from_source=build_from_source)


def make_sdist(name: str, version: str, dest: Path) -> Path:
    """An sdist whose metadata is static (PKG-INFO 2.2, a pyproject [project] table): uv reads
    it without building anything."""
    base = f"{name}-{version}"
    files = {
        "PKG-INFO": f"Metadata-Version: 2.2\nName: {name}\nVersion: {version}\n",
        "pyproject.toml": f'[project]\nname = "{name}"\nversion = "{version}"\n'
                          '[build-system]\nrequires = ["setuptools"]\n'
                          'build-backend = "setuptools.build_meta"\n',
        f"{name}/__init__.py": "",
    }
    path = dest / f"{base}.tar.gz"
    with tarfile.open(path, "w:gz") as tar:
        for rel, text in files.items():
            data = text.encode()
            info = tarfile.TarInfo(f"{base}/{rel}")
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return path


def test_a_package_with_no_wheel_is_refused_unless_the_target_builds_from_source(use_index):
    """An sdist would be compiled inside the build (no compiler in the slim flavor; NVIDIA's
    stubs fetch from pypi.nvidia.com there): the lock says so and how out, before a build."""
    with pytest.raises(ResolveError) as e:
        resolve_explained(req("engine-stub==1.0"))
    facts = "\n".join(e.value.facts)
    assert "stubby==1.0 has no usable wheels" in facts, facts
    assert "engine-stub depend on stubby==1.0" in facts
    assert "build_from_source: true" in e.value.hint and "override" in e.value.hint
    body = resolve_explained(req("engine-stub==1.0", build_from_source=True))
    assert "stubby==1.0" in body and "engine-stub==1.0" in body
    # The choice is a lock input; wheels only (the default) keeps every earlier lock's hash.
    assert req("x").inputs_hash() != req("x", build_from_source=True).inputs_hash()
    earlier = {"target": "t", "python": "3.11", "uv_platform": PLAT, "requirements": ["x"],
               "overrides": [], "extra_index_urls": [], "format": LOCK_FORMAT}
    assert req("x").inputs_hash() == "sha256:" + hashlib.sha256(
        json.dumps(earlier, sort_keys=True).encode()).hexdigest()


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
    # engine-old's own metadata proves it, without asking uv (lock/staticproof.py).
    assert status.needed and status.effect == ("without it: engine-old 1.0 requires "
                                               "ctensors==0.8.1, the lock has ctensors 0.11.0")
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
    # uv names the asker as its chain reached it ("vllm>=0.33.0" or "vllm==0.33.0"), and which
    # conflict it meets first moves with PyPI's releases: every one is listed, this among them.
    assert re.search(r"vllm(>=|==)0\.33\.0 requires compressed-tensors==0\.17\.0", facts), facts
    assert re.search(r"sglang(>=|==)0\.5\.23 requires compressed-tensors==0\.18\.0", facts)
    assert "torch" in facts
    assert "override compressed-tensors==0.18.0" in facts
    assert "resolve it (checked with uv)" in e.value.hint


@pytest.mark.live
def test_real_sglang_platform_floor():
    with pytest.raises(ResolveError) as e:
        resolve_explained(LockRequest("t", "3.12", "x86_64-manylinux_2_28", ("sglang==0.5.23",)))
    assert "sglang 0.5.23 has no wheel for this image's platform" in e.value.message
    assert "manylinux_2_34_x86_64" in e.value.message


def test_build_from_source_is_read_from_the_target_into_its_lock_request(images_copy):
    from imgbuild.errors import SpecError
    from imgbuild.workspace import Workspace

    def request(extra: str):
        y = images_copy / "tiny-cpu.yaml"
        y.write_text(y.read_text().split("\nbuild_from_source:")[0] + extra)
        return Workspace(images_copy, images_copy.parent / "lockfiles").target("tiny-cpu").request

    assert request("").build_from_source is False
    shipped = request("").inputs_hash()
    assert request("\nbuild_from_source: false\n").inputs_hash() == shipped
    allowed = request("\nbuild_from_source: true\n")
    assert allowed.build_from_source is True and allowed.inputs_hash() != shipped
    with pytest.raises(SpecError):
        request("\nbuild_from_source: sometimes\n")
