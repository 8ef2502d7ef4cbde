"""imgbuild as a user installs it: the wheel `uv build` makes, installed into a fresh venv
outside the checkout, run from an empty directory with a fresh HOME and no --images. The
built-in catalog travels in the wheel, so every command works there, and a target plans to
the content tag the checkout computes: the image CI pushed is the one a GPU host pulls."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
import requests

from imgbuild.catalog.catalog import DATA_FILES
from imgbuild.workspace import Builtin

from . import golden
from .conftest import REGISTRY_HOST, ROOT
from .test_init import NVFP4_CONFIG

CORPUS = ROOT / "tests" / "fixtures" / "corpus"


def user(venv: Path, *args: str, cwd: Path, home: Path,
         extra: dict | None = None) -> subprocess.CompletedProcess:
    """The installed `imgbuild`, with nothing of this checkout or this user in reach: no
    IMGBUILD_* variable, a HOME of its own, not even the local wheel directory."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("IMGBUILD_")}
    env |= {"HOME": str(home), "UV_PYTHON_DOWNLOADS": "never", "HF_HUB_OFFLINE": "1"}
    env |= extra or {}
    return subprocess.run([str(venv / "bin" / "imgbuild"), *args], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=1800)


@pytest.fixture()
def empty(tmp_path) -> tuple[Path, Path]:
    cwd, home = tmp_path / "empty", tmp_path / "home"
    cwd.mkdir()
    home.mkdir()
    return cwd, home


def _tree(d: Path) -> dict[str, tuple[int, int]]:
    return {str(p.relative_to(d)): (p.stat().st_size, p.stat().st_mtime_ns)
            for p in d.rglob("*") if p.is_file() and "__pycache__" not in p.parts}


def _installed_catalog(venv: Path) -> Path:
    out = subprocess.run([str(venv / "bin" / "python"), "-c",
                          "import imgbuild.workspace as w; print(w.builtin_catalog().images.parent)"],
                         capture_output=True, text=True, cwd="/", check=True).stdout.strip()
    return Path(out)


def _tracked(*dirs: str) -> list[str]:
    return subprocess.run(["git", "ls-files", *dirs], cwd=ROOT, capture_output=True, text=True,
                          check=True).stdout.split()


def test_the_wheel_carries_the_catalog_and_nothing_of_the_tests(imgbuild_wheel):
    with zipfile.ZipFile(imgbuild_wheel) as z:
        names = z.namelist()
        for f in _tracked("images", "lockfiles"):  # every file, byte for byte
            assert z.read(f"imgbuild/builtin/{f}") == (ROOT / f).read_bytes(), f
        assert "imgbuild/payload/smoke.py" in names and "imgbuild/cli/main.py" in names
    assert not [n for n in names if n.split("/")[0] in ("tests", "bench", "images", "lockfiles")
                or "/fixtures/" in n or "__pycache__" in n or n.endswith(".pyc")]
    # The import package is the tool's own name, not a generic word at the top level.
    assert {n.split("/")[0] for n in names if not n.startswith("imgbuild-")} == {"imgbuild"}


def test_the_built_in_catalog_reads_the_same_from_the_wheel_and_the_checkout(plain_install):
    installed = _installed_catalog(plain_install)
    assert installed != ROOT and "site-packages" in str(installed)
    here = Builtin(ROOT / "images", ROOT / "lockfiles", packaged=False).digest()
    there = Builtin(installed / "images", installed / "lockfiles", packaged=True).digest()
    assert here == there


def test_every_command_works_from_an_empty_directory(plain_install, empty):
    cwd, home = empty
    builtin = _installed_catalog(plain_install)
    before = _tree(builtin)

    r = user(plain_install, "list", "--json", cwd=cwd, home=home)
    assert r.returncode == 0, r.stderr[-2000:]
    listed = json.loads(r.stdout)
    assert set(listed["targets"]) == {p.stem for p in (ROOT / "images").glob("*.yaml")
                                      if p.name not in DATA_FILES}
    assert set(listed["models"]) == {p.stem for p in (ROOT / "images" / "models").glob("*.yaml")}

    # plan: the content tags the checkout records (tests/golden), the headline one included.
    recorded = golden.recorded()
    for name, args in (("tiny-cpu", ()), ("sglang-blackwell", ("--model", "k2.6"))):
        r = user(plain_install, "plan", name, *args, "--json", cwd=cwd, home=home)
        assert r.returncode == 0, r.stderr[-2000:]
        doc = json.loads(r.stdout)
        want = recorded[name] if not args else None
        if want:
            assert doc["content_tag"] == want
        assert doc["source"]["layer"] == "built-in"
        assert doc["lock_path"].startswith("lockfiles/")

    # doctor reads the failure catalog that ships in the wheel.
    r = user(plain_install, "doctor", str(CORPUS / "vllm-19853-no-scheme.log"), "--json",
             cwd=cwd, home=home)
    assert r.returncode == 1, r.stderr[-2000:]  # a known failure found
    assert json.loads(r.stdout)["diagnoses"][0]["id"] == "vllm-no-compatible-scheme"

    # check-model with a built-in --target: that target's locked engine and compressed-tensors.
    ckpt = cwd.parent / "ckpt"
    ckpt.mkdir()
    (ckpt / "config.json").write_text(json.dumps(NVFP4_CONFIG))
    r = user(plain_install, "check-model", str(ckpt), "--target", "sglang-blackwell", "--json",
             cwd=cwd, home=home)
    assert r.returncode == 0, r.stderr[-2000:]
    doc = json.loads(r.stdout)
    assert doc["target"] == "sglang-blackwell"
    assert doc["engine"]["engine"] == "sglang" and doc["engine"]["version"] == "0.5.23"

    # preflight of a built-in target on this host: it reads the target's plan (archs, driver
    # floor, the model's size) and judges the host; no GPU here is a verdict, not a crash.
    r = user(plain_install, "preflight", "sglang-blackwell", "--model", "k2.6", "--json",
             cwd=cwd, home=home)
    assert r.returncode in (0, 1), r.stderr[-2000:]
    checks = {v["check"] for v in json.loads(r.stdout)["verdicts"]}
    assert {"nvidia-smi", "driver", "disk"} <= checks

    r = user(plain_install, "matrix", "--json", cwd=cwd, home=home)
    assert r.returncode == 0, r.stderr[-2000:]
    assert {j["target"] for j in json.loads(r.stdout)["jobs"]} >= {"tiny-cpu",
                                                                    "sglang-blackwell"}

    # lock with no project: the installed catalog is read-only, and says what to do instead.
    r = user(plain_install, "lock", "tiny-cpu", cwd=cwd, home=home)
    said = " ".join(r.stderr.split())
    assert r.returncode == 2 and "the built-in catalog is read-only" in said, said
    assert "imgbuild init" in said and "Traceback" not in said

    assert _tree(builtin) == before  # nothing written into site-packages
    assert list(cwd.iterdir()) == []  # nor into the directory it ran from


@pytest.mark.docker
def test_a_gpu_host_pulls_by_the_tag_the_checkout_computes(plain_install, empty, docker_client):
    """The image `make demo` pushed (127.0.0.1:5000/imgbuild), pulled by the installed wheel
    with no checkout: same content tag, same digest, smoke-tested. Where the demo has not run
    (a test run on its own), the checkout pushes it first, as the demo does."""
    cwd, home = empty
    repo = f"{REGISTRY_HOST}/imgbuild"
    tag = golden.recorded()["tiny-cpu"]
    try:
        there = requests.head(f"http://{REGISTRY_HOST}/v2/imgbuild/manifests/{tag}", timeout=10,
                              headers={"Accept": "application/vnd.oci.image.manifest.v1+json, "
                                       "application/vnd.docker.distribution.manifest.v2+json"})
    except requests.RequestException:
        pytest.skip(f"skipped: no registry on {REGISTRY_HOST} (make services starts one)")
    if there.status_code != 200:
        r = subprocess.run([sys.executable, "-m", "imgbuild.cli", "tiny-cpu", "--push",
                            "--registry", repo], cwd=ROOT, capture_output=True, text=True,
                           timeout=1800)
        assert r.returncode == 0, r.stderr[-3000:]
        there = requests.head(f"http://{REGISTRY_HOST}/v2/imgbuild/manifests/{tag}", timeout=10,
                              headers={"Accept": "application/vnd.oci.image.manifest.v1+json, "
                                       "application/vnd.docker.distribution.manifest.v2+json"})
    pushed = there.headers["Docker-Content-Digest"]

    r = user(plain_install, "pull", "tiny-cpu", "--registry", repo, "--json", cwd=cwd,
             home=home)
    assert r.returncode == 0, r.stderr[-3000:]
    pulled = json.loads(r.stdout)
    assert pulled["ref"] == f"{repo}:{tag}"
    assert pulled["registry_digest"] == pushed
    assert pulled["smoke_report"]["ok"] is True

    image = f"{repo}:{tag}"
    for args in (("verify", image), ("smoke", image), ("size", image)):
        r = user(plain_install, *args, "--json", cwd=cwd, home=home)
        assert r.returncode == 0, (args, r.stderr[-2000:])
    assert list(cwd.iterdir()) == []


@pytest.mark.docker
def test_a_users_project_locks_builds_and_smoke_tests_with_nothing_written_outside_it(
        plain_install, tmp_path, docker_client):
    """init, then the user's own model profile (a real compressed-tensors NVFP4 checkpoint on
    disk, its quantization read from its config.json) and a target that extends the built-in
    tiny-cpu: lock, build (with its smoke gate) and smoke, all from the installed wheel. The
    project holds everything written; HOME only caches; the installed catalog is untouched."""
    from imgbuild import smokemodel

    from .conftest import WHEELS, smoke_checkpoint

    ckpt = smoke_checkpoint(smokemodel.SmokeModelSpec(name="ckm-nvfp4", scheme="NVFP4"),
                            "checkmodel")
    top, home = tmp_path / "work", tmp_path / "home"
    top.mkdir()
    home.mkdir()
    # The user's mirror of the PyTorch CPU index, where there is one (as a firewall allows).
    mirror = {"IMGBUILD_WHEELS": WHEELS} if WHEELS else {}
    builtin = _installed_catalog(plain_install)
    before = _tree(builtin)

    def go(*args: str) -> subprocess.CompletedProcess:
        r = user(plain_install, *args, cwd=proj, home=home, extra=mirror)
        assert r.returncode == 0, (args, r.stdout[-2000:], r.stderr[-3000:])
        return r

    r = user(plain_install, "init", "proj", cwd=top, home=home)
    assert r.returncode == 0, r.stderr[-2000:]
    proj = top / "proj"
    (proj / "images" / "models" / "edge-nvfp4.yaml").write_text(
        f"checkpoint: {ckpt}\nsize_gb: 0.01\ntensor_parallel: 1\n")
    (proj / "images" / "edge.yaml").write_text(
        "extends: tiny-cpu\ndescription: our CPU image\nmodel: edge-nvfp4\n")

    plan = json.loads(go("plan", "edge", "--json").stdout)  # locks first: into the project
    assert plan["quantization"]["formats"] == ["nvfp4-pack-quantized"]
    assert plan["quantization"]["activations"] == "fp4"
    assert plan["source"]["fields"]["engine.version"] == "images/tiny-cpu.yaml (built-in)"
    assert plan["source"]["fields"]["model"] == "images/edge.yaml (project)"
    lock = "edge.py3.11-manylinux_2_36-x86_64.txt"
    assert plan["lock_path"] == f"lockfiles/{lock}" and (proj / "lockfiles" / lock).is_file()
    go("lock", "edge", "--check")  # exit 0: the project's lock answers its target

    repo = f"{REGISTRY_HOST}/imgbuild-project-{os.urandom(4).hex()}"
    built = json.loads(go("edge", "--registry", repo, "--json").stdout)
    assert built["content_tag"] == f"{repo}:{plan['content_tag']}"
    assert built["smoke"]["ok"] is True
    again = json.loads(go("smoke", built["content_tag"], "--json").stdout)
    assert again["ok"] is True

    assert sorted(p.name for p in top.iterdir()) == ["proj"]
    assert _tree(builtin) == before
    # HOME: caches (~/.cache/imgbuild, uv's) and the Docker client's own state, nothing else.
    outside = [p for p in home.rglob("*") if p.is_file()
               and p.relative_to(home).parts[0] not in (".cache", ".docker")]
    assert outside == [], outside


def test_commands_that_rewrite_the_catalog_refuse_the_installed_one(plain_install, empty):
    cwd, home = empty
    builtin = _installed_catalog(plain_install)
    before = _tree(builtin)
    for args in (("relock", "tiny-cpu", "--upgrade", "torch"),
                 ("base", "refresh-digests")):
        r = user(plain_install, *args, cwd=cwd, home=home)
        said = " ".join(r.stderr.split())
        assert r.returncode == 2, (args, said)
        assert "which is the built-in catalog's" in said and "imgbuild init" in said, said
    assert _tree(builtin) == before and list(cwd.iterdir()) == []


@pytest.mark.live
def test_outdated_from_an_empty_directory(plain_install, empty):
    """outdated asks PyPI about the built-in targets' pins (live: it needs the network)."""
    cwd, home = empty
    r = user(plain_install, "outdated", "tiny-cpu", "--json", cwd=cwd, home=home)
    assert r.returncode in (0, 1), r.stderr[-2000:]  # 1: something is outdated
    assert "tiny-cpu" in r.stdout and list(cwd.iterdir()) == []
