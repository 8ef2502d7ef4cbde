"""Offline twins of what only `live` tests used to catch: the same behaviours on a local
pypiserver with wheels built here, so `make test PYTEST_ARGS='-m "not live"'` still catches a
conflict "resolved" without uv, model-format findings dropped, and a build that ignores the
drift check."""

from __future__ import annotations

import shutil

import pytest

from imgbuild.errors import ResolveError
from imgbuild.lock.lockfile import LockRequest
from imgbuild.lock.resolve import resolve_explained

from .conftest import ROOT, run_imgbuild
from .test_drift import BASE_NEW, BASE_OLD, ENGINE, FAMILY_YAML
from .wheelfactory import LocalIndex, WheelSpec


@pytest.fixture(scope="module")
def index(tmp_path_factory):
    ix = LocalIndex(tmp_path_factory.mktemp("twins-index"))
    for v, base in (("0.1.0", BASE_OLD), ("0.2.0", BASE_NEW)):
        ix.add(WheelSpec("ctensors", v, files={"ctensors/__init__.py": "",
                                               "ctensors/config/base.py": base}))
    ix.add(WheelSpec("sglang", "0.5.23", requires=("ctensors",),
                     files={"sglang/__init__.py": "", "sglang/quant.py": ENGINE}))
    # A conflict whose obvious override does not resolve: the newer pin needs a package that
    # does not exist.
    ix.add(WheelSpec("ctensors", "0.8.1"))
    ix.add(WheelSpec("ctensors", "0.12.0", requires=("no-such-dependency>=1",)))
    ix.add(WheelSpec("engine-a", "1.0", requires=("ctensors==0.8.1",)))
    ix.add(WheelSpec("engine-b", "1.0", requires=("ctensors==0.12.0",)))
    ix.start()
    yield ix
    ix.stop()


@pytest.fixture()
def drifty(tmp_path):
    """A catalog whose one target locks SGLang beside a ctensors that lacks a member SGLang
    uses, with the drift family for them and a model that declares a format none has."""
    images = tmp_path / "images"
    (images / "models").mkdir(parents=True)
    (images / "checks").mkdir()
    for data in ("bases.yaml", "gpus.yaml", "cuda.yaml"):
        shutil.copy(ROOT / "images" / data, images)
    shutil.copy(ROOT / "images" / "models" / "tiny-nvfp4.yaml", images / "models")
    shutil.copytree(ROOT / "images" / "generators", images / "generators")
    (images / "checks" / "drift.yaml").write_text(
        FAMILY_YAML.replace("consumers: [eng, absent-engine]", "consumers: [sglang]"))
    (images / "models" / "fakemodel.yaml").write_text(
        "name: fake\ncheckpoint: fake/fake\nsize_gb: 1\narchitecture: dense\n"
        "quantization: {method: ctensors, formats: [mxfp4-packed]}\ntensor_parallel: 1\n")
    (images / "drifty.yaml").write_text(
        "engine: {name: sglang, version: '0.5.23'}\narchs: [cpu]\nos: debian-bookworm\n"
        "flavor: slim\nrequirements: ['ctensors==0.1.0']\n")
    return images


def test_a_build_stops_at_the_drift_check_before_any_docker_work(index, drifty):
    env = {"UV_INDEX_URL": index.url, "UV_NO_CACHE": "1", "IMGBUILD_WHEELS": "",
           "DOCKER_HOST": "unix:///nonexistent.sock"}
    r = run_imgbuild("drifty", "--images", str(drifty), env=env)
    assert r.returncode == 1, r.stdout + r.stderr
    assert "Fmt.nvfp4" in r.stderr and "Docker" not in r.stderr


def test_a_model_format_the_provider_lacks_is_a_finding(index, drifty):
    spec = drifty / "drifty.yaml"
    spec.write_text(spec.read_text().replace("ctensors==0.1.0", "ctensors==0.2.0"))
    env = {"UV_INDEX_URL": index.url, "UV_NO_CACHE": "1", "IMGBUILD_WHEELS": ""}
    clean = run_imgbuild("check-deps", "drifty", "--images", str(drifty), env=env)
    assert clean.returncode == 0, clean.stdout + clean.stderr  # 0.2.0 has what SGLang uses
    r = run_imgbuild("check-deps", "drifty", "--model", "fakemodel", "--images", str(drifty),
                     env=env)
    assert r.returncode == 1, r.stdout + r.stderr
    assert "mxfp4-packed" in r.stdout


def test_an_override_is_offered_only_once_uv_resolves_with_it(index, monkeypatch, tmp_path):
    monkeypatch.setenv("UV_INDEX_URL", index.url)
    monkeypatch.setenv("UV_CACHE_DIR", str(tmp_path / "uv-cache"))
    req = LockRequest("t", "3.11", "x86_64-manylinux_2_36", ("engine-a==1.0", "engine-b==1.0"))
    with pytest.raises(ResolveError) as e:
        resolve_explained(req)
    facts = "\n".join(e.value.facts)
    assert "ctensors==0.12.0" in facts and "ctensors==0.8.1" in facts
    # The newer pin is the proposal, and uv, run again with it, still finds no environment.
    assert "no set of overrides found resolves it" in e.value.hint
    assert "checked with uv" not in e.value.hint
