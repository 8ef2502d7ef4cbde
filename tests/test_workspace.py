"""The Workspace: every command reads images/ and lockfiles/ from where it is told, and from
nowhere else; a plain (non-editable) install run from another directory works the same; each
reporting command writes its report to stdout, and only JSON under --json.

The copied workspace differs from the checkout in ways each command can see: a patch removed
(and dropped from the target that listed it), a target added (with its committed lock), a
known failure added to the doctor's catalog."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from imgbuild.lock.lockfile import read_lock, write_lock
from imgbuild.workspace import Workspace

from .conftest import ROOT, WHEELS

MIXED, IGNORE = "sglang-ct-mixed-precision-format", "sglang-ct-ignore-exact-match"
LOG = "[2026-01-01 00:00:00 TP0] starting\nWidgetError: no widget gear\n"
FAILURE = """
  - id: widget-missing
    title: a widget is missing
    severity: error
    match:
      - regex: 'WidgetError: no widget (?P<name>\\w+)'
        contains: "WidgetError: no widget "
    cause: the {name} widget was not installed
    fix: run `imgbuild plan TARGET` and install it
    sources:
      - {in: widgets==1.0, at: widgets/core.py:10}
"""
# compressed-tensors, no formats declared: check-model needs no wheel (no network) for it.
CONFIG = {"architectures": ["Qwen3ForCausalLM"], "quantization_config": {
    "quant_method": "compressed-tensors", "ignore": ["lm_head"],
    "config_groups": {"group_0": {"targets": ["Linear"], "weights": {"num_bits": 4}}}}}


def make_copy(root: Path) -> Path:
    """images/ and lockfiles/ under root, changed as the module docstring says."""
    images = root / "ws" / "images"
    shutil.copytree(ROOT / "images", images)
    shutil.copytree(ROOT / "lockfiles", root / "ws" / "lockfiles")
    (images / "patches" / f"{IGNORE}.yaml").unlink()
    (images / "patches" / f"{IGNORE}.diff").unlink()
    t = images / "sglang-0516-blackwell.yaml"
    t.write_text(t.read_text().replace(f"  - {IGNORE}\n", ""))
    (images / "tiny-copy.yaml").write_text((images / "tiny-cpu.yaml").read_text().replace(
        "  The demo:", "  A copy made by the workspace test of the demo:", 1))
    ws = Workspace(images, root / "ws" / "lockfiles")
    tiny = ws.target("tiny-cpu").lock()
    req = ws.target("tiny-copy").request
    write_lock(ws.lockfiles / req.filename(), req, tiny.body, "uv (copied by the test)")
    f = images / "checks" / "failures.yaml"
    f.write_text(f.read_text().rstrip() + "\n" + FAILURE)
    (root / "ckpt").mkdir()
    (root / "ckpt" / "config.json").write_text(json.dumps(CONFIG))
    (root / "server.log").write_text(LOG)
    return images


@pytest.fixture(scope="module")
def copy(tmp_path_factory) -> Path:
    return make_copy(tmp_path_factory.mktemp("copy"))


def run(binary: list[str], args: list[str], *, cwd: Path, home: Path,
        timeout: int = 600) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith("IMGBUILD_")}
    env.update(HOME=str(home), UV_PYTHON_DOWNLOADS="never", HF_HUB_OFFLINE="1",
               IMGBUILD_CACHE=str(Path(os.environ.get("IMGBUILD_CACHE") or
                                       Path.home() / ".cache" / "imgbuild")))
    if WHEELS:
        env["IMGBUILD_WHEELS"] = WHEELS
    return subprocess.run([*binary, *args], cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=timeout)


# --- Workspace.open ---------------------------------------------------------------------------

def test_open_takes_arguments_then_environment_then_the_nearest_images(tmp_path, copy):
    ws = Workspace.open(copy, env={})
    assert (ws.images, ws.lockfiles, ws.wheels) == (copy, copy.parent / "lockfiles", None)
    other = tmp_path / "locks"
    other.mkdir()
    ws = Workspace.open(env={"IMGBUILD_IMAGES": str(copy), "IMGBUILD_LOCKFILES": str(other),
                             "IMGBUILD_WHEELS": str(tmp_path)})
    assert (ws.images, ws.lockfiles, ws.wheels) == (copy, other, tmp_path)
    deep = copy.parent / "a" / "b"
    deep.mkdir(parents=True)
    assert Workspace.open(env={}, cwd=deep).images == copy  # images/ above the directory
    assert Workspace.open(env={}, cwd=Path("/")).images == ROOT / "images"  # this checkout
    from imgbuild.errors import InputError

    with pytest.raises(InputError, match="no such directory"):
        Workspace.open(tmp_path / "nope", env={})
    with pytest.raises(InputError, match="--wheels"):
        Workspace.open(copy, wheels=tmp_path / "nope", env={})


def test_every_table_is_read_from_the_workspace(copy):
    ws = Workspace.open(copy, env={})
    assert "tiny-copy" in ws.catalog.targets
    assert set(ws.patches) == {MIXED}
    assert "widget-missing" in {f.id for f in ws.failures.fingerprints}
    assert ws.engines.source == "images/checks/engines.yaml"
    assert ws.families and all(f.source.startswith("images/") for f in ws.families)
    ref = ws.target("tiny-copy")
    assert ref.lock_path.parent == copy.parent / "lockfiles" and ref.display.startswith(
        "lockfiles/tiny-copy.")
    assert read_lock(ref.lock_path).target == "tiny-copy"


def test_a_missing_lock_is_one_error_for_every_command(tmp_path, copy):
    ws = Workspace.open(copy, tmp_path, env={})
    from imgbuild.errors import InputError

    with pytest.raises(InputError) as e:
        ws.target("tiny-copy").lock()
    assert e.value.message == "target 'tiny-copy' has no lock yet"
    assert e.value.hint.startswith("run `imgbuild lock tiny-copy`")


# --- every command, against the copy, from another directory ----------------------------------

def _commands(copy: Path) -> list[tuple[str, list[str], object]]:
    """(name, arguments, check(stdout as JSON)) for each command that needs neither the
    network nor Docker."""
    root = copy.parent.parent
    loc = ["--images", str(copy), "--lockfiles", str(copy.parent / "lockfiles")]

    def patches_of(doc):
        return [p["id"] for p in doc["patches"]]

    return [
        ("list", ["list", *loc], lambda d: "tiny-copy" in d["targets"]),
        ("plan", ["plan", "tiny-copy", "--no-checks", *loc],
         lambda d: d["target"] == "tiny-copy" and d["lock_path"].startswith("lockfiles/")),
        ("plan-patches", ["plan", "sglang-0516-blackwell", "--no-checks", *loc],
         lambda d: d["patches"] == [MIXED] and d["needed_patches"] == [MIXED]),
        ("lock", ["lock", "tiny-copy", *loc],
         lambda d: d["locks"][0]["target"] == "tiny-copy" and d["locks"][0]["written"] is False),
        ("patches", ["patches", "sglang-0516-blackwell", *loc],
         lambda d: patches_of(d) == [MIXED]),
        ("check-model", ["check-model", str(root / "ckpt"), "--target", "tiny-copy", *loc],
         lambda d: d["target"] == "tiny-copy" and d["checkpoint"].endswith("ckpt")),
        ("matrix", ["matrix", *loc], lambda d: "tiny-copy" in [j["target"] for j in d["jobs"]]),
        ("doctor", ["doctor", str(root / "server.log"), *loc],
         lambda d: [x["id"] for x in d["diagnoses"]] == ["widget-missing"]),
        ("preflight", ["preflight", "tiny-copy", "--nvidia-smi", str(root / "no-nvidia-smi"),
                       "--model-dir", str(root), *loc],
         lambda d: d["image"]["archs"] == ["cpu"]),
    ]


def _exercise(binary: list[str], copy: Path, tmp_path: Path) -> None:
    cwd = tmp_path / "elsewhere"
    cwd.mkdir()
    home = tmp_path / "home"
    home.mkdir()
    failures = []
    for name, args, check in _commands(copy):
        r = run(binary, [*args, "--json"], cwd=cwd, home=home)
        try:
            doc = json.loads(r.stdout)  # --json: stdout is one JSON document and nothing else
        except ValueError:
            failures.append(f"{name}: stdout is not JSON (exit {r.returncode}): "
                            f"{r.stdout[-300:]!r} {r.stderr[-500:]!r}")
            continue
        if r.returncode not in (0, 1) or not check(doc):
            failures.append(f"{name}: exit {r.returncode}, {json.dumps(doc)[:400]}")
        human = run(binary, args, cwd=cwd, home=home)
        # The report is on stdout for people too (`imgbuild doctor LOG | less` shows it).
        if not human.stdout.strip() or human.returncode != r.returncode:
            failures.append(f"{name}: the human report is not on stdout (exit "
                            f"{human.returncode}); stderr: {human.stderr[-300:]!r}")
    assert not failures, "\n".join(failures)


def test_every_command_sees_the_copy_from_another_directory(copy, tmp_path):
    _exercise([sys.executable, "-m", "imgbuild.cli"], copy, tmp_path)


def test_a_plain_install_works_on_every_command_from_another_directory(plain_install, copy,
                                                                       tmp_path):
    _exercise([str(plain_install / "bin" / "imgbuild")], copy, tmp_path)
    # With no project in sight and no checkout behind it, the catalog in the wheel answers.
    r = run([str(plain_install / "bin" / "imgbuild"), "list"], [], cwd=tmp_path, home=tmp_path)
    assert r.returncode == 0 and "sglang-blackwell" in r.stdout and "only-in-copy" not in r.stdout
    # A project directory that is not there is said, with what to do.
    r = run([str(plain_install / "bin" / "imgbuild"), "list"], ["--images", str(tmp_path / "no")],
            cwd=tmp_path, home=tmp_path)
    assert r.returncode == 2 and "no such directory" in r.stderr and "Traceback" not in r.stderr


def test_json_errors_are_json_on_stdout(copy, tmp_path):
    r = run([sys.executable, "-m", "imgbuild.cli"],
            ["plan", "no-such", "--json", "--images", str(copy)], cwd=tmp_path, home=tmp_path)
    assert r.returncode == 2
    doc = json.loads(r.stdout)
    assert doc["exit_code"] == 2 and doc["message"] == "unknown target 'no-such'"


@pytest.mark.docker
def test_build_push_pull_and_smoke_see_the_copy(copy, tmp_path, registry_repo):
    """The Docker commands, from another directory, on the target only the copy has."""
    imgbuild = [sys.executable, "-m", "imgbuild.cli"]
    loc = ["--images", str(copy), "--lockfiles", str(copy.parent / "lockfiles")]
    cwd = tmp_path / "elsewhere"
    cwd.mkdir()

    def go(*args: str) -> dict:
        r = run(imgbuild, [*args, *loc, "--json"], cwd=cwd, home=Path.home(), timeout=1800)
        assert r.returncode == 0, (args, r.stdout[-2000:], r.stderr[-2000:])
        return json.loads(r.stdout)

    base = go("base", "bootstrap", "--registry", registry_repo)
    assert base["pushed"] and base["image"] == "imgbuild-base:debian-bookworm-py3.11"
    plan = go("plan", "tiny-copy", "--no-checks", "--registry", registry_repo)
    built = go("build", "tiny-copy", "--push", "--registry", registry_repo)
    assert built["content_tag"] == plan["refs"][0]
    assert built["smoke"]["ok"] and f"{registry_repo}:tiny-copy" in built["moved"]
    pulled = go("pull", "tiny-copy", "--registry", registry_repo)
    assert pulled["digest"] == pulled["registry_digest"]
    assert built["pushed"][0].endswith("@" + pulled["digest"])
    smoke = go("smoke", f"{registry_repo}:tiny-copy")
    assert smoke["ok"] and {s["name"] for s in smoke["stages"]} >= {"environment",
                                                                   "checkpoint-cpu"}
