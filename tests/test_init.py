"""`imgbuild init` and `imgbuild --version`: the project init writes parses and is read as a
layer above the built-in catalog (list, lock, plan from inside it); a refusal (a file in the
way, DIR a file, an unknown --extends, a write that fails half way) leaves the disk as it was;
the CI workflow it writes validates against SchemaStore's github-workflows schema and its
`run:` steps pass as written, with imgbuild installed from the wheel by `uv tool install`
(the build-and-push step under the docker marker, into a registry repository of its own)."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import uuid
from importlib.metadata import version
from pathlib import Path

import pytest
import yaml

from imgbuild.catalog.catalog import load_catalog
from imgbuild.catalog.models import parse_model
from imgbuild.project import TEMPLATES
from imgbuild.workspace import PROJECT_FILE, Workspace, builtin_catalog, read_project

from .conftest import REGISTRY_HOST, ROOT, WHEELS
from .test_matrix import _check_jsonschema

# A checkpoint's config.json as llm-compressor writes it for NVFP4 (no weights: nothing here
# reads them); the formats are ones the locked compressed-tensors has.
NVFP4_CONFIG = {"architectures": ["Qwen3ForCausalLM"], "quantization_config": {
    "quant_method": "compressed-tensors", "format": "nvfp4-pack-quantized",
    "ignore": ["lm_head"], "config_groups": {"group_0": {
        "targets": ["Linear"], "format": "nvfp4-pack-quantized",
        "weights": {"num_bits": 4, "type": "float", "strategy": "tensor_group",
                    "group_size": 16, "symmetric": True},
        "input_activations": {"num_bits": 4, "type": "float", "group_size": 16,
                              "strategy": "tensor_group", "dynamic": "local"}}}}}
WRITTEN = {".github/workflows/imgbuild.yml", "README.md", "imgbuild.yaml", "lockfiles/README.md"}


def env_without_imgbuild(**extra: str) -> dict[str, str]:
    """This machine's environment without IMGBUILD_* (the project alone says where the catalog
    is) and without this checkout's venv on PATH."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("IMGBUILD_")}
    env["PATH"] = os.pathsep.join(p for p in env.get("PATH", "").split(os.pathsep)
                                  if p and not p.startswith(str(ROOT)))
    env |= {"UV_PYTHON_DOWNLOADS": "never", "HF_HUB_OFFLINE": "1"}
    if WHEELS:
        env["IMGBUILD_WHEELS"] = WHEELS  # the CPU torch without the PyTorch index
    return env | extra


def imgbuild(*args: str, cwd: Path, timeout: int = 900) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "imgbuild.cli", *args], cwd=cwd,
                          env=env_without_imgbuild(), capture_output=True, text=True,
                          timeout=timeout)


def tree(d: Path) -> dict[str, bytes | None]:
    """Every path under d with its bytes (None: a directory)."""
    return {str(p.relative_to(d)): (p.read_bytes() if p.is_file() else None)
            for p in sorted(d.rglob("*"))}


# --- --version --------------------------------------------------------------------------------

def test_version_names_the_built_in_catalog_by_digest(tmp_path):
    b = builtin_catalog()
    cat = load_catalog(b.images)
    r = imgbuild("--version", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    digest = b.digest()
    assert r.stdout.strip() == (f"imgbuild {version('imgbuild')} (built-in catalog "
                                f"{digest[:23]}…, {len(cat.targets)} targets, "
                                f"{len(cat.models)} model profiles)")
    doc = json.loads(imgbuild("--version", "--json", cwd=tmp_path).stdout)
    assert doc["version"] == version("imgbuild")
    assert doc["catalog"]["digest"] == digest and len(digest) == len("sha256:") + 64
    assert doc["catalog"]["images"] == str(b.images) and doc["catalog"]["packaged"] is False
    assert doc["catalog"]["targets"] == len(cat.targets) == 10  # generators are not targets
    # --json first, and the command's own spelling, say the same.
    assert json.loads(imgbuild("--json", "--version", cwd=tmp_path).stdout) == doc
    assert json.loads(imgbuild("version", "--json", cwd=tmp_path).stdout) == doc
    bad = imgbuild("--version", "list", cwd=tmp_path)
    assert bad.returncode == 2 and "unrecognized arguments: list" in bad.stderr


# --- what init writes -------------------------------------------------------------------------

def test_init_writes_a_project_that_parses_and_extends_the_built_in_target(tmp_path):
    r = imgbuild("init", "proj", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    proj = tmp_path / "proj"
    files = {str(p.relative_to(proj)) for p in proj.rglob("*") if p.is_file()}
    assert files == WRITTEN | {"images/my-sglang-blackwell.yaml", "images/models/my-model.yaml"}
    for f in files:
        assert "@{" not in (proj / f).read_text(), f  # every placeholder filled
        assert f"  {f}" in r.stdout.splitlines()  # each file said, one line each
    assert "cd proj" in r.stdout and "imgbuild lock my-sglang-blackwell" in r.stdout
    assert (TEMPLATES / PROJECT_FILE).is_file()  # the marker Workspace discovery looks for
    assert read_project(proj / PROJECT_FILE) == (proj / "images", proj / "lockfiles")

    target = yaml.safe_load((proj / "images" / "my-sglang-blackwell.yaml").read_text())
    assert target == {"extends": "sglang-blackwell", "model": "my-model"}
    profile = yaml.safe_load((proj / "images" / "models" / "my-model.yaml").read_text())
    assert profile["checkpoint"] == "your-org/your-model" and "quantization" not in profile
    text = (proj / "images" / "models" / "my-model.yaml").read_text()
    assert text.count("PLACEHOLDER") == 2  # the checkpoint, and the size nobody gave
    m = parse_model("my-model", profile, "images/models/my-model.yaml")
    assert (m.checkpoint, m.tensor_parallel) == ("your-org/your-model", 1)
    # The commented example pins the version the built-in lock holds.
    ws0 = Workspace(ROOT / "images", ROOT / "lockfiles")
    pinned = ws0.target("sglang-blackwell").lock().package("transformers").version
    assert f"#   - transformers=={pinned}\n" in (proj / "images" / "my-sglang-blackwell.yaml"
                                                 ).read_text()

    # Discovered from a directory inside the project: its target on the built-in one.
    (proj / "images" / "models").mkdir(exist_ok=True)
    ws = Workspace.open(env={}, cwd=proj / "images" / "models")
    assert ws.images == proj / "images" and ws.base is not None
    mine, theirs = ws.catalog.targets["my-sglang-blackwell"], ws0.catalog.targets[
        "sglang-blackwell"]
    assert (mine.engine, mine.engine_version, mine.archs, mine.flavor) == (
        theirs.engine, theirs.engine_version, theirs.archs, theirs.flavor)
    assert mine.default_model == "my-model" and ws.catalog.origin["my-sglang-blackwell"] == \
        "project" and ws.catalog.origin["sglang-blackwell"] == "built-in"


def test_init_options_land_in_the_files(tmp_path):
    ckpt = tmp_path / "models" / "Qwen3-8B-NVFP4"
    ckpt.mkdir(parents=True)
    (ckpt / "config.json").write_text(json.dumps(NVFP4_CONFIG))
    (ckpt / "model.safetensors").write_bytes(b"\0" * 3_000_000)
    r = imgbuild("init", ".", "--extends", "tiny-cpu", "--name", "edge", "--model",
                 "models/Qwen3-8B-NVFP4", "--tp", "2", "--json", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    assert (doc["target"], doc["extends"], doc["model"]) == ("edge", "tiny-cpu", "qwen3-8b-nvfp4")
    assert not doc["next"][0].startswith("cd ")  # written here: no cd
    profile = yaml.safe_load((tmp_path / "images/models/qwen3-8b-nvfp4.yaml").read_text())
    # A checkpoint inside the project is written relative to it; its size measured.
    assert profile == {"name": "Qwen3-8B-NVFP4", "checkpoint": "models/Qwen3-8B-NVFP4",
                       "size_gb": 0.01, "tensor_parallel": 2}
    assert yaml.safe_load((tmp_path / "images/edge.yaml").read_text()) == {
        "extends": "tiny-cpu", "model": "qwen3-8b-nvfp4"}

    r = imgbuild("init", "hub", "--model", "Qwen/Qwen3-8B", "--size-gb", "16.4", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    profile = yaml.safe_load((tmp_path / "hub/images/models/qwen3-8b.yaml").read_text())
    assert (profile["checkpoint"], profile["size_gb"]) == ("Qwen/Qwen3-8B", 16.4)
    assert "PLACEHOLDER" not in (tmp_path / "hub/images/models/qwen3-8b.yaml").read_text()


def test_an_installed_imgbuild_writes_the_same_project(plain_install, tmp_path):
    """From the wheel (templates as package data, the dot-github folder included), byte for
    byte what the checkout writes."""
    args = ["init", "proj", "--extends", "tiny-cpu", "--model", "Qwen/Qwen3-8B", "--tp", "2"]
    (tmp_path / "wheel").mkdir()
    r = subprocess.run([str(plain_install / "bin" / "imgbuild"), *args], cwd=tmp_path / "wheel",
                       env=env_without_imgbuild(), capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    (tmp_path / "checkout").mkdir()
    assert imgbuild(*args, cwd=tmp_path / "checkout").returncode == 0
    there = tree(tmp_path / "wheel" / "proj")
    assert ".github/workflows/imgbuild.yml" in there
    assert there == tree(tmp_path / "checkout" / "proj")


# --- refusals: exit 2, nothing written --------------------------------------------------------

def test_a_file_in_the_way_refuses_and_leaves_every_byte(tmp_path):
    proj = tmp_path / "proj"
    (proj / "images" / "models").mkdir(parents=True)
    (proj / "images" / "models" / "my-model.yaml").write_text("name: mine\n")
    (proj / "notes.txt").write_text("keep me\n")
    before = tree(tmp_path)
    r = imgbuild("init", "proj", cwd=tmp_path)
    assert r.returncode == 2, r.stderr
    said = " ".join(r.stderr.split())
    assert f"{proj}/images/models/my-model.yaml exists" in said and "nothing was written" in said
    assert "Traceback" not in r.stderr
    assert tree(tmp_path) == before

    # Every file it would write is named, not only the first.
    (proj / "imgbuild.yaml").write_text("{}\n")
    r = imgbuild("init", "proj", "--json", cwd=tmp_path)
    assert r.returncode == 2
    facts = json.loads(r.stdout)["facts"]
    assert {f"{proj}/imgbuild.yaml exists", f"{proj}/images/models/my-model.yaml exists"} <= set(
        facts)

    # DIR is a file; a path on the way is a file.
    (tmp_path / "afile").write_text("x")
    (tmp_path / "p2").mkdir()
    (tmp_path / "p2" / "lockfiles").write_text("not a directory")
    before = tree(tmp_path)
    for d, why in (("afile", "afile is a file, not a directory"),
                   ("p2", "p2/lockfiles is a file, not a directory")):
        r = imgbuild("init", d, cwd=tmp_path)
        assert r.returncode == 2 and why in " ".join(r.stderr.split()), r.stderr
    assert tree(tmp_path) == before


def test_unknown_extends_and_bad_names_write_nothing(tmp_path):
    for args, said in ((["--extends", "sglang-blackwel"], "did you mean 'sglang-blackwell'?"),
                       (["--name", "Bad Name"], "not a name imgbuild can use"),
                       (["--name", "plan"], "is an imgbuild command"),
                       (["--tp", "0"], "not a GPU count"),
                       (["--size-gb", "-1"], "not a size"),
                       (["--model", "./nowhere"], "no such directory"),
                       (["--model", "not a repo!"], "neither a local directory")):
        r = imgbuild("init", "proj", *args, cwd=tmp_path)
        assert r.returncode == 2, (args, r.stderr)
        assert said in " ".join(r.stderr.split()), (args, r.stderr)
        assert "Traceback" not in r.stderr
    assert list(tmp_path.iterdir()) == []
    r = imgbuild("init", "proj", "--extends", "tiny-cpx", "--json", cwd=tmp_path)
    doc = json.loads(r.stdout)
    assert doc["exit_code"] == 2 and doc["hint"] == "did you mean 'tiny-cpu'?"
    assert doc["message"] == "--extends tiny-cpx: not a built-in target"
    # A generator's name (images/generators/) is no target's: the catalog would refuse both.
    from imgbuild.errors import InputError
    from imgbuild.project import plan_project

    with pytest.raises(InputError, match="imgbuild itself runs"):
        plan_project(builtin_catalog(), tmp_path / "proj", extends="tiny-cpu", name="smoke-model")
    assert list(tmp_path.iterdir()) == []


def test_a_write_that_fails_half_way_removes_what_it_wrote(tmp_path):
    """A real failure after some files are written (a file name longer than the file system
    takes, from a template whose name repeats the target's name): what was made is removed,
    the directories too, and the error says so."""
    from imgbuild.errors import EnvError
    from imgbuild.project import plan_project, write_project

    templates = tmp_path / "templates"
    shutil.copytree(TEMPLATES, templates)
    (templates / "zz").mkdir()
    (templates / "zz" / ("@{name}" * 6 + ".txt")).write_text("never written\n")
    root = tmp_path / "here"
    (root / "images").mkdir(parents=True)
    (root / "images" / "other.yaml").write_text("kept\n")
    before = tree(tmp_path)
    spec = plan_project(builtin_catalog(), root, extends="tiny-cpu", name="n" * 48)
    with pytest.raises(EnvError) as e:
        write_project(spec, templates)
    assert "File name too long" in e.value.message and "as it was" in e.value.facts[0]
    assert tree(tmp_path) == before


# --- the project from inside: list, lock, plan ------------------------------------------------

@pytest.fixture(scope="module")
def project(tmp_path_factory) -> Path:
    """A project whose target extends tiny-cpu, for a local checkpoint, locked once."""
    top = tmp_path_factory.mktemp("init")
    ckpt = top / "ckpt" / "Tiny-NVFP4"
    ckpt.mkdir(parents=True)
    (ckpt / "config.json").write_text(json.dumps(NVFP4_CONFIG))
    r = imgbuild("init", "proj", "--extends", "tiny-cpu", "--name", "my-tiny", "--model",
                 str(ckpt), "--size-gb", "0.01", cwd=top)
    assert r.returncode == 0, r.stderr
    proj = top / "proj"
    r = imgbuild("lock", "my-tiny", "--json", cwd=proj)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    return proj


def test_the_project_lists_locks_and_plans_from_inside(project):
    r = imgbuild("list", "--json", cwd=project / "images")
    assert r.returncode == 0, r.stderr
    listed = json.loads(r.stdout)
    assert listed["targets"]["my-tiny"]["layer"] == "project"
    assert listed["targets"]["tiny-cpu"]["layer"] == "built-in"
    # The checkpoint's directory is named as the built-in smoke model's profile: the user's
    # profile gets an alias of its own rather than shadow the one every target smoke-tests with.
    assert listed["models"]["tiny-nvfp4"]["layer"] == "built-in"
    assert listed["models"]["my-tiny-nvfp4"]["layer"] == "project"
    assert listed["models"]["my-tiny-nvfp4"]["checkpoint"].endswith("/ckpt/Tiny-NVFP4")
    locks = sorted(p.name for p in (project / "lockfiles").iterdir())
    assert locks == ["README.md", "my-tiny.py3.11-manylinux_2_36-x86_64.txt"]

    r = imgbuild("plan", "my-tiny", "--json", cwd=project)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    plan = json.loads(r.stdout)
    assert (plan["target"], plan["model"], plan["tensor_parallel"]) == ("my-tiny",
                                                                        "my-tiny-nvfp4", 1)
    assert plan["lock_path"] == "lockfiles/my-tiny.py3.11-manylinux_2_36-x86_64.txt"
    assert plan["engine"] == "transformers" and plan["archs"] == ["cpu"]
    assert plan["source"]["layer"] == "project"
    assert plan["source"]["fields"]["requirements[torch]"] == "images/tiny-cpu.yaml (built-in)"
    assert plan["source"]["fields"]["model"] == "images/my-tiny.yaml (project)"


# --- the CI workflow --------------------------------------------------------------------------

def test_the_workflow_validates_against_the_github_workflows_schema(project, tmp_path):
    cmd = _check_jsonschema()
    if cmd is None:
        pytest.skip("skipped: check-jsonschema is not installed (dev group in pyproject.toml)")
    wf = project / ".github" / "workflows" / "imgbuild.yml"
    ok = subprocess.run([*cmd, "--builtin-schema", "vendor.github-workflows", str(wf)],
                        capture_output=True, text=True)
    assert ok.returncode == 0, ok.stdout + ok.stderr
    bad = tmp_path / "bad.yml"  # the validator can fail: a misspelt key
    bad.write_text(wf.read_text().replace("runs-on: ubuntu-latest", "runs_on: ubuntu-latest"))
    assert subprocess.run([*cmd, "--builtin-schema", "vendor.github-workflows", str(bad)],
                          capture_output=True).returncode == 1
    doc = yaml.safe_load(wf.read_text())
    assert doc["env"]["IMGBUILD_SPEC"] == f"imgbuild=={version('imgbuild')}"
    used = [s["uses"].split("@")[0] for s in doc["jobs"]["build"]["steps"] if "uses" in s]
    assert used == ["actions/checkout", "astral-sh/setup-uv", "docker/login-action"]


def run_workflow(project: Path, wheel: Path, tmp: Path, registry: str, *,
                 skip: tuple[str, ...] = ()) -> dict[str, subprocess.CompletedProcess]:
    """The build job's `run:` steps in order, each with bash as GitHub runs it (-eo pipefail),
    in the project, with the env the workflow sets; `uses:` steps (checkout, setup-uv, the
    registry login) are the runner's, not run here. IMGBUILD_SPEC is the wheel; uv installs
    the tool under tmp. GITHUB_PATH, GITHUB_OUTPUT and GITHUB_STEP_SUMMARY work as on a runner."""
    doc = yaml.safe_load((project / ".github" / "workflows" / "imgbuild.yml").read_text())
    job = doc["jobs"]["build"]
    secrets = {"REGISTRY": registry, "REGISTRY_USER": "u", "REGISTRY_PASSWORD": "p"}

    def value(v: str) -> str:
        v = str(v)
        for k, s in secrets.items():
            v = v.replace("${{ secrets." + k + " }}", s)
        assert "${{" not in v, f"an expression this runner does not evaluate: {v}"
        return v

    gh = {k: tmp / k.lower() for k in ("GITHUB_PATH", "GITHUB_OUTPUT", "GITHUB_STEP_SUMMARY")}
    for f in gh.values():
        f.write_text("")
    env = env_without_imgbuild(UV_TOOL_DIR=str(tmp / "tools"), UV_TOOL_BIN_DIR=str(tmp / "bin"),
                               UV_PYTHON=sys.executable, **{k: str(f) for k, f in gh.items()})
    env |= {k: value(v) for k, v in {**doc.get("env", {}), **job.get("env", {})}.items()}
    assert env["IMGBUILD_SPEC"] == f"imgbuild=={version('imgbuild')}"  # as written, then:
    env["IMGBUILD_SPEC"] = str(wheel)
    out = {}
    for step in job["steps"]:
        if "uses" in step or step["name"] in skip:
            continue
        added = [p for p in gh["GITHUB_PATH"].read_text().splitlines() if p]
        path = os.pathsep.join([*reversed(added), env["PATH"]])
        r = subprocess.run(["bash", "--noprofile", "--norc", "-eo", "pipefail", "-c",
                            value(step["run"])], cwd=project, env=env | {"PATH": path},
                           capture_output=True, text=True, timeout=1800)
        assert r.returncode == 0, (step["name"], r.stdout[-3000:], r.stderr[-3000:])
        r.which = shutil.which("imgbuild", path=path)  # the imgbuild the step ran
        out[step["name"]] = r
    return out


@pytest.fixture(scope="module")
def tool_tmp(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("tool")


def test_the_workflow_steps_run_as_written(project, imgbuild_wheel, tool_tmp):
    """Install (uv tool install of the wheel), registry host, lock check, plan: all but the
    build, which needs the Engine (the docker test below)."""
    ran = run_workflow(project, imgbuild_wheel, tool_tmp, f"{REGISTRY_HOST}/imgbuild-init-x",
                       skip=("Build, smoke, push, then move the tags",))
    assert list(ran) == ["Install imgbuild", "Registry host", "Lock check", "Plan"]
    assert (tool_tmp / "bin" / "imgbuild").exists()
    assert ran["Install imgbuild"].stdout.startswith(f"imgbuild {version('imgbuild')} (built-in "
                                                     f"catalog {builtin_catalog().digest()[:23]}")
    assert (tool_tmp / "github_output").read_text() == f"host={REGISTRY_HOST}\n"
    assert "plan for my-tiny" in ran["Plan"].stdout
    # The steps after the install ran the tool uv installed (through GITHUB_PATH), whose
    # catalog is the wheel's copy, not this checkout's.
    tool = str(tool_tmp / "bin" / "imgbuild")
    assert [r.which for r in ran.values()][2:] == [tool, tool]
    doc = json.loads(subprocess.run([tool, "--version", "--json"], capture_output=True,
                                    text=True, cwd=project).stdout)
    assert doc["catalog"]["packaged"] is True
    assert doc["catalog"]["digest"] == builtin_catalog().digest()


@pytest.mark.docker
def test_the_workflow_builds_and_pushes(project, imgbuild_wheel, tmp_path, docker_client):
    from .conftest import registry_available

    if not registry_available():
        pytest.skip(f"skipped: no registry on {REGISTRY_HOST} (make services starts one)")
    repo = f"{REGISTRY_HOST}/imgbuild-init-{uuid.uuid4().hex[:8]}"
    ran = run_workflow(project, imgbuild_wheel, tmp_path, repo)
    # The workflow sets FORCE_COLOR: the report comes in colour.
    built = re.sub(r"\x1b\[[0-9;]*m", "", ran["Build, smoke, push, then move the tags"].stdout)
    assert re.search(r"^my-tiny: (built|pulled)", built, re.M), built
    assert re.search(r"^smoke +passed", built, re.M) and re.search(r"^pushed +", built, re.M), \
        built
    r = subprocess.run([str(tmp_path / "bin" / "imgbuild"), "plan", "my-tiny", "--registry",
                        repo, "--json"], cwd=project, env=env_without_imgbuild(),
                       capture_output=True, text=True, timeout=600)
    plan = json.loads(r.stdout)
    for ref in plan["refs"]:
        name, tag = ref.rsplit(":", 1)
        host, path = name.split("/", 1)
        got = subprocess.run(["curl", "-sf", "-o", "/dev/null", "-H",
                              "Accept: application/vnd.oci.image.manifest.v1+json, "
                              "application/vnd.docker.distribution.manifest.v2+json",
                              f"http://{host}/v2/{path}/manifests/{tag}"])
        assert got.returncode == 0, f"{ref} is not in the registry"
