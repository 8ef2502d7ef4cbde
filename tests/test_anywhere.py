"""An image pushed from one install is found by any other: the content key comes from declared
inputs only, the smoke model is an artifact fetched by its recipe key (or made by the pinned
generator image), and the base is the one its recipe records. Real Engine, real registry."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from imgbuild.payload import smoke as payload

from . import golden
from .conftest import ROOT, WHEELS

pytestmark = pytest.mark.docker

SHARED_CACHE = Path(os.environ.get("IMGBUILD_CACHE") or Path.home() / ".cache" / "imgbuild")


def imgbuild(binary: list[str], *args: str, cwd: Path, home: Path, cache: Path,
             extra: dict | None = None) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith("IMGBUILD_")}
    env |= {"HOME": str(home), "IMGBUILD_CACHE": str(cache), "UV_PYTHON_DOWNLOADS": "never",
            "HF_HUB_OFFLINE": "1"} | ({"IMGBUILD_WHEELS": WHEELS} if WHEELS else {})
    env |= extra or {}
    return subprocess.run([*binary, *args], cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=1800)


def test_pushed_by_the_dev_venv_pulled_by_a_plain_install_elsewhere(plain_install, own_repo,
                                                                      tmp_path):
    dev = [sys.executable, "-m", "imgbuild.cli"]
    # This machine's own cache: the smoke model is there already, or made by its generator
    # (a generation from nothing is test_the_generator_makes_the_checkpoint_and_keeps_its_logs'
    # job: 15 to 20 CPU-seconds each here). The push carries it either way.
    r = imgbuild(dev, "tiny-cpu", "--push", "--registry", own_repo, "--json", cwd=ROOT,
                 home=Path.home(), cache=SHARED_CACHE)
    assert r.returncode == 0, r.stderr[-3000:]
    built = json.loads(r.stdout)
    assert built["content_tag"] == f"{own_repo}:{golden.recorded()['tiny-cpu']}"
    pushed = built["pushed"][0].split("@")[1]
    # Another user: a plain install (no torch), another directory, another HOME and cache.
    elsewhere, home = tmp_path / "elsewhere", tmp_path / "home"
    elsewhere.mkdir()
    home.mkdir()
    loc = ["--images", str(ROOT / "images"), "--lockfiles", str(ROOT / "lockfiles")]
    r = imgbuild([str(plain_install / "bin" / "imgbuild")], "pull", "tiny-cpu", "--registry",
                 own_repo, *loc, "--json", cwd=elsewhere, home=home, cache=home / "cache")
    assert r.returncode == 0, r.stderr[-3000:]
    pulled = json.loads(r.stdout)
    assert pulled["digest"] == pulled["registry_digest"] == pushed
    assert pulled["smoke_report"]["ok"] is True
    # The smoke model went to the registry with the image: a plain install that must build
    # fetches it by its recipe key instead of making it.
    r = imgbuild([str(plain_install / "bin" / "imgbuild")], "smoke-model", "tiny-nvfp4",
                 "--registry", own_repo, *loc, cwd=elsewhere, home=home,
                 cache=home / "cache")
    assert r.returncode == 0, r.stderr[-3000:]
    assert "fetched from" in r.stderr and "made by the generator" not in r.stderr


def test_the_generator_makes_the_checkpoint_and_keeps_its_logs(images_copy, tmp_path):
    """A smoke model made from nothing builds the generator image and runs it: with --log-dir
    both logs are kept there, the way a target's build log is (a failed generator build left
    nothing to read but a tail). The generator here differs from the catalog's in its
    description only, so its image is new (its own content key: a build, not a reuse) while
    its steps come from BuildKit's cache.

    Regeneration is byte-identical, so the recipe key alone names the checkpoint (README:
    content key): what it made in an empty cache is compared with the checkpoint this machine's
    cache holds, made by the generator before (another run, another day), or made now where
    that cache has none."""
    gen = images_copy / "generators" / "smoke-model.yaml"
    gen.write_text(gen.read_text().replace(
        "The smoke-model generator:", f"The smoke-model generator ({uuid.uuid4().hex[:8]}):", 1))
    dev = [sys.executable, "-m", "imgbuild.cli"]
    loc = ["--images", str(images_copy), "--lockfiles", str(images_copy.parent / "lockfiles")]
    plan = imgbuild(dev, "plan", "smoke-model", "--no-checks", "--json", *loc, cwd=tmp_path,
                    home=Path.home(), cache=tmp_path / "cache")
    assert plan.returncode == 0, plan.stderr[-2000:]
    planned = json.loads(plan.stdout)
    tag, ref = planned["content_tag"], planned["refs"][0]
    assert ref == f"imgbuild:{tag}"
    logs = tmp_path / "logs"
    try:
        r = imgbuild(dev, "smoke-model", "tiny-nvfp4", "--json", "--log-dir", str(logs), *loc,
                     cwd=tmp_path, home=Path.home(), cache=tmp_path / "cache")
        assert r.returncode == 0, r.stderr[-3000:]
        key = json.loads(r.stdout)["key"]
        build_log = (logs / f"{tag}.build.log").read_text()
        assert re.search(r"^#\d+ \[[^\]]*\] RUN .*-r /opt/imgbuild/heavy", build_log, re.M)
        # BuildKit's plain progress writes "naming to REF done", or "naming to REF 0.0s done"
        # where the step spanned two of its display ticks (seen under load).
        assert re.search(rf"naming to docker\.io/library/{re.escape(ref)}( [\d.]+s)? done",
                         build_log), build_log[-2000:]
        made = (logs / f"smoke-model-tiny-nvfp4-{key[:16]}.generate.log").read_text()
        assert made.startswith("$ ") and "--network none" in made.splitlines()[0]
        assert f"--key {key}" in made.splitlines()[0] and len(made.splitlines()) > 1
        path = Path(json.loads(r.stdout)["path"])
        assert path.is_relative_to(tmp_path / "cache")  # made here and now
        kept = imgbuild(dev, "smoke-model", "tiny-nvfp4", "--json", cwd=ROOT, home=Path.home(),
                        cache=SHARED_CACHE)
        assert kept.returncode == 0, kept.stderr[-3000:]
        manifests = []
        for p in (path, Path(json.loads(kept.stdout)["path"])):
            said = json.loads((p / payload.REFERENCE_DIR / payload.REFERENCE_JSON).read_text())
            assert said["versions"]["torch"] == "2.13.0+cpu"  # the generator's, not the host's
            manifests.append((said["files"], payload.file_manifest(p)))
        assert manifests[0] == manifests[1]
    finally:
        subprocess.run(["docker", "rmi", ref], capture_output=True)


def test_a_target_without_a_smoke_model_builds_again(tmp_path):
    """--rebuild of a target that carries no smoke model (the generator's own; a user's target
    without `smoke:`) asked the catalog for the smoke model None and died in a traceback."""
    r = imgbuild([sys.executable, "-m", "imgbuild.cli"], "build", "smoke-model", "--rebuild",
                 "--no-smoke", "--json", cwd=ROOT, home=Path.home(), cache=tmp_path / "cache")
    assert r.returncode == 0 and "Traceback" not in r.stderr, r.stderr[-3000:]
    built = json.loads(r.stdout)
    assert built["action"] == "built" and built["build"]["steps"] > 0
    assert not (tmp_path / "cache" / "smoke-models").exists()  # nothing was asked for one


def test_a_base_that_is_not_the_recorded_one_is_refused(images_copy, tmp_path):
    bases = images_copy / "bases.yaml"
    bases.write_text(re.sub(r"rootfs: sha256:\w+", "rootfs: sha256:" + "0" * 64,
                            bases.read_text()))
    r = imgbuild([sys.executable, "-m", "imgbuild.cli"], "tiny-cpu", "--images", str(images_copy),
                 "--registry", "imgbuild-refused", cwd=tmp_path, home=Path.home(),
                 cache=Path(os.environ.get("IMGBUILD_CACHE") or
                            Path.home() / ".cache" / "imgbuild"))
    assert r.returncode == 3, r.stderr[-2000:]
    said = " ".join(r.stderr.split())  # the terminal width wraps lines
    assert "is not the one images/bases.yaml records" in said
    assert "--rebuild" in said and "Traceback" not in said


@pytest.mark.slow
def test_bootstrap_is_reproducible(docker_client, monkeypatch):
    """debootstrap twice (a minute each): the same rootfs digest, the one the recipe records,
    from a caller whose PYTHONDONTWRITEBYTECODE is empty (as make exports it) and from one
    where it is set (as a shell may): each once gave another digest."""
    from imgbuild.image import base
    from imgbuild.workspace import Workspace

    b = Workspace(ROOT / "images", ROOT / "lockfiles").catalog.base("debian-bookworm")
    got = []
    for caller in ("", "1"):
        monkeypatch.setenv("PYTHONDONTWRITEBYTECODE", caller)
        got.append(base.bootstrap(docker_client, b, rebuild=True).rootfs)
    assert got == [b.bootstrap["rootfs"]] * 2
