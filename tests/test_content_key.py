"""The content key covers declared inputs only (spec, lock, patches, payload, bases by digest,
the smoke model's recipe) and nothing of the machine imgbuild runs on.

- the golden tags (tests/golden/content-tags.json) come out the same from the dev venv, from a
  plain install with no dev tools, and from another working directory, HOME and environment;
- changing one declared input changes exactly the keys of the targets that use it, and changing
  what is not an input (a lock's comments, where the lockfiles lie) changes none;
- a lock resolved from another working directory is the same file.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from imgbuild import smokemodel
from imgbuild.lock.lockfile import LockRequest, read_lock, write_lock
from imgbuild.lock.resolve import resolve
from imgbuild.plan.decide import make_plan
from imgbuild.workspace import Workspace

from . import golden
from .conftest import ROOT
from .wheelfactory import LocalIndex, WheelSpec

GOLDEN = golden.recorded()


def tags(images: Path, lockfiles: Path) -> dict[str, str]:
    return golden.compute(images, lockfiles)


def test_golden_tags_from_the_dev_venv():
    got = tags(ROOT / "images", ROOT / "lockfiles")
    assert got == GOLDEN, ("content tags changed; if every one of them is meant to, record "
                           "them: python -m tests.golden --write")
    assert set(GOLDEN) >= {"tiny-cpu", "sglang-blackwell", "smoke-model"}


def _plan_tag(binary: list[str], name: str, cwd: Path, env: dict[str, str]) -> str:
    r = subprocess.run([*binary, "plan", name, "--no-checks", "--json",
                        "--images", str(ROOT / "images"), "--lockfiles", str(ROOT / "lockfiles")],
                       cwd=cwd, env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    return json.loads(r.stdout)["content_tag"]


def _foreign_env(home: Path) -> dict[str, str]:
    """Another user on another machine: HOME, caches, indexes, proxies and CA all elsewhere."""
    keep = {k: os.environ[k] for k in ("PATH", "LANG", "DOCKER_HOST") if k in os.environ}
    return keep | {"HOME": str(home), "IMGBUILD_CACHE": str(home / "cache"),
                   "UV_INDEX_URL": "http://127.0.0.1:9/simple/", "PIP_INDEX_URL": "http://x/",
                   "SSL_CERT_FILE": str(home / "ca.pem"), "HF_HOME": str(home / "hf"),
                   "IMGBUILD_WHEELS": "", "TZ": "Pacific/Kiritimati", "LC_ALL": "C"}


def test_golden_tags_from_a_plain_install_elsewhere(plain_install, tmp_path):
    """A user's install (no torch, no llmcompressor), run from / with another HOME, computes the
    tags CI pushed; so does the dev venv from there."""
    env = _foreign_env(tmp_path / "home")
    (tmp_path / "home").mkdir()
    for name in GOLDEN:
        assert _plan_tag([str(plain_install / "bin" / "imgbuild")], name, Path("/"), env) == \
            GOLDEN[name], name
    dev = [sys.executable, "-m", "imgbuild.cli"]
    env_dev = env | {"PYTHONPATH": str(ROOT)}
    for name in ("tiny-cpu", "sglang-0516-blackwell"):
        assert _plan_tag(dev, name, tmp_path, env_dev) == GOLDEN[name], name


def test_the_recipe_key_ignores_the_host_tooling(monkeypatch):
    spec = smokemodel.SmokeModelSpec()
    before = smokemodel.recipe_key(spec, "sha256:gen"), smokemodel.host_key(spec)
    monkeypatch.setattr(smokemodel, "library_versions", lambda: {"torch": "9.9"})
    assert smokemodel.recipe_key(spec, "sha256:gen") == before[0]
    assert smokemodel.host_key(spec) != before[1]  # host-made checkpoints are keyed apart
    assert smokemodel.recipe_key(spec, "sha256:other") != before[0]


# --- one declared input at a time ---------------------------------------------------------

@pytest.fixture()
def copy(tmp_path) -> Path:
    shutil.copytree(ROOT / "images", tmp_path / "images")
    shutil.copytree(ROOT / "lockfiles", tmp_path / "lockfiles")
    return tmp_path


def _changed(copy: Path) -> set[str]:
    now = tags(copy / "images", copy / "lockfiles")
    return {n for n in GOLDEN if now[n] != GOLDEN[n]}


def _users_of_smoke_model(ws: Workspace) -> set[str]:
    return {n for n, t in ws.catalog.targets.items() if t.smoke_model}


def test_a_patch_changes_only_the_target_that_applies_it(copy):
    diff = copy / "images" / "patches" / "sglang-ct-ignore-exact-match.diff"
    diff.write_text(diff.read_text().replace("+    A plain (non-regex) target", "+    A plain target", 1))
    assert _changed(copy) == {"sglang-0516-blackwell"}


def test_the_nvidia_cuda_digest_changes_exactly_the_cuda_devel_targets_on_it(copy):
    ws = Workspace(copy / "images", copy / "lockfiles")
    on_it = {n for n in ws.catalog.targets
             if make_plan(ws, n, resolve=False).base_image.startswith(
                 "nvidia/cuda:13.0.0-cudnn-devel-ubuntu24.04")}
    assert on_it == {"sglang-hopper", "sglang-vllm-blackwell", "vllm-blackwell"}
    bases = copy / "images" / "bases.yaml"
    bases.write_text(bases.read_text().replace("sha256:c2621d98", "sha256:00000000"))
    assert _changed(copy) == on_it


def test_the_debian_rootfs_changes_the_slim_targets_and_every_smoke_model(copy):
    ws = Workspace(copy / "images", copy / "lockfiles")
    slim = {n for n, t in ws.catalog.targets.items()
            if t.os == "debian-bookworm" and "linux/amd64" in t.platforms}
    assert slim == {"tiny-cpu", "tiny-cpu-multi", "sglang-0516-blackwell",
                    "sglang-blackwell-slim", "sglang-blackwell"}
    bases = copy / "images" / "bases.yaml"
    text = bases.read_text()
    # The arm64 base's own digest changes the arm64 images only, and the index that holds one
    # (tiny-cpu-multi's tag is its index's).
    bases.write_text(re.sub(r"rootfs_aarch64: sha256:\w{8}", "rootfs_aarch64: sha256:00000000",
                            text))
    assert _changed(copy) == {"sglang-gb200", "sglang-dgx-spark", "tiny-cpu-multi"}
    assert "rootfs: sha256:" in text
    bases.write_text(re.sub(r"rootfs: sha256:\w{8}", "rootfs: sha256:00000000", text))
    # The generator image sits on that base too: every smoke model's recipe changes with it.
    assert _changed(copy) == slim | {"smoke-model"} | _users_of_smoke_model(ws)


def test_one_lock_line_changes_only_its_target(copy):
    ws = Workspace(copy / "images", copy / "lockfiles")
    ref = ws.target("vllm-blackwell")
    lock = ref.lock()
    body = re.sub(r"(--hash=sha256:)[0-9a-f]", r"\g<1>f", lock.body, count=1)
    assert body != lock.body
    write_lock(lock.path, ref.request, body, "uv (edited by the test)")
    assert _changed(copy) == {"vllm-blackwell"}


def test_the_generator_lock_changes_every_target_with_a_smoke_model(copy):
    ws = Workspace(copy / "images", copy / "lockfiles")
    ref = ws.target("smoke-model")
    lock = ref.lock()
    body = re.sub(r"(--hash=sha256:)[0-9a-f]", r"\g<1>f", lock.body, count=1)
    write_lock(lock.path, ref.request, body, "uv (edited by the test)")
    assert _changed(copy) == {"smoke-model"} | _users_of_smoke_model(ws)


def test_what_is_not_an_input_changes_nothing(copy, tmp_path):
    ws = Workspace(copy / "images", copy / "lockfiles")
    ref = ws.target("vllm-blackwell")
    lock = ref.lock()
    # uv's annotations say how, not what: another `# via` comment is the same environment.
    write_lock(lock.path, ref.request, lock.body.replace("# via", "#  via"), "uv (another)")
    # A comment in a spec, and lockfiles that lie somewhere else.
    spec = copy / "images" / "tiny-cpu.yaml"
    spec.write_text("# a comment\n" + spec.read_text())
    moved = tmp_path / "elsewhere" / "locks"
    shutil.copytree(copy / "lockfiles", moved)
    assert _changed(copy) == set()
    assert tags(copy / "images", moved) == GOLDEN


# --- locks do not depend on the working directory -----------------------------------------

def test_a_lock_resolved_from_another_directory_is_the_same(tmp_path, monkeypatch):
    ix = LocalIndex(tmp_path / "index")
    ix.add(WheelSpec("eng", "1.0", requires=("dep>=1",)))
    ix.add(WheelSpec("dep", "1.2"))
    ix.start()
    try:
        monkeypatch.setenv("UV_INDEX_URL", ix.url)
        monkeypatch.setenv("UV_CACHE_DIR", str(tmp_path / "uv-cache"))
        req = LockRequest("t", "3.11", "x86_64-manylinux_2_36", ("eng==1.0",))
        bodies = []
        for cwd in (Path("/"), tmp_path, ROOT):
            monkeypatch.chdir(cwd)
            bodies.append(resolve(req))
    finally:
        ix.stop()
    assert bodies[0] == bodies[1] == bodies[2]
    assert "# via -r requirements.in" in bodies[0] and "tmp" not in bodies[0]
    lock = write_lock(tmp_path / req.filename(), req, bodies[0], "uv")
    assert read_lock(lock.path).digest == lock.digest
