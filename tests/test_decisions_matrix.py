"""The CI matrix's decisions, without an Engine: what each document says (as reviewed, in
tests/golden/matrix/), what the Bake checker refuses and why, which jobs `--changed-since`
keeps and the reason it gives, and which bytes a patch digest covers.

tests/test_matrix.py checks the documents against the workflow and Bake's format; this file
pins each decision to the sentence or field a user reads.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import re
import shutil
import subprocess
from dataclasses import replace
from pathlib import Path

import pytest

from imgbuild.ci import matrix
from imgbuild.errors import ImgbuildError, InputError
from imgbuild.lock.lockfile import write_lock
from imgbuild.workspace import Workspace

from . import golden
from .conftest import ROOT, checkout_workspace

WS = checkout_workspace()


@pytest.fixture(scope="module")
def jobs() -> list[matrix.Job]:
    return matrix.jobs(WS)


# --- the documents, as reviewed -----------------------------------------------------------------

def test_the_matrix_documents_are_the_reviewed_ones():
    """Every field CI reads from `imgbuild matrix` (a job's runner, refs, lock and base; the
    workflow's matrix values; each Bake target's Dockerfile, labels, index flags and cache
    entries) changes only where a reviewer saw it change (tests/golden/matrix/; `make golden`
    records them after a change meant to change them)."""
    got = golden.matrix_documents(ROOT / "images", ROOT / "lockfiles")
    assert set(got) == {"json.json", "github.json", "bake.json"}
    assert not (said := golden.differences(got, golden.recorded_matrix(), "matrix")), said


def test_the_default_repository_is_the_local_one_and_a_document_per_format(monkeypatch):
    doc = matrix.document(WS, "json")
    assert doc["jobs"][0]["refs"][0].startswith("imgbuild:")
    assert matrix.document(WS, "github")["include"][0]["content_tag"] == \
        doc["jobs"][0]["content_tag"]
    bake = matrix.document(WS, "bake")
    assert bake["target"]["tiny-cpu"]["tags"] == [
        next(j["refs"][0] for j in doc["jobs"] if j["name"] == "tiny-cpu")]
    # Any other format is the job list.
    assert matrix.document(WS, "other") == doc


def test_bake_with_a_contexts_directory_writes_each_jobs_context_there(monkeypatch, tmp_path):
    """The contexts themselves need the smoke checkpoint (an Engine, tests/test_matrix.py's
    docker test); the decision here is that `--contexts DIR` hands every job on, for the
    repository asked, and the document is still the Bake file."""
    seen = []
    monkeypatch.setattr(matrix, "write_contexts",
                        lambda job_list, ws, dest, *, repository: seen.append(
                            ([j.name for j in job_list], ws, dest, repository)))
    doc = matrix.document(WS, "bake", repository="ghcr.io/acme/x", contexts=tmp_path)
    assert seen == [([j.name for j in matrix.jobs(WS)], WS, tmp_path, "ghcr.io/acme/x")]
    assert set(doc) == {"group", "target"}
    seen.clear()
    matrix.document(WS, "bake")
    assert seen == []  # no directory, no context written


def test_every_job_lists_its_target_model_and_plan(jobs):
    by = {j.name: j for j in jobs}
    multi = [j for j in jobs if j.multi_platform]
    assert {j.name for j in multi} == {"tiny-cpu-multi-amd64", "tiny-cpu-multi-arm64"}
    assert not by["tiny-cpu"].multi_platform
    for j in jobs:
        assert j.lock == j.plan.lock_path and j.lock.startswith("lockfiles/")
        assert (j.flavor, j.smoke_model, j.base_image) == (
            j.plan.flavor, j.plan.smoke_model, j.plan.base_image)
        assert j.smoke_arch == (j.archs[0] if j.gpu else None)
    assert by["tiny-cpu"].smoke_arch is None and by["tiny-cpu"].runner == "ubuntu-latest"
    assert by["sglang-blackwell-k2_6"].model == "k2.6"


def test_jobs_plan_the_committed_lock_and_never_resolve(tmp_path):
    """CI builds what the repository pins: a missing lock is an error that says so, not a
    resolution on the runner."""
    shutil.copytree(ROOT / "images", tmp_path / "images")
    shutil.copytree(ROOT / "lockfiles", tmp_path / "lockfiles")
    for p in (tmp_path / "lockfiles").glob("tiny-cpu.*"):
        p.unlink()
    with pytest.raises(ImgbuildError, match="tiny-cpu"):
        matrix.jobs(Workspace(tmp_path / "images", tmp_path / "lockfiles"))


@pytest.mark.parametrize(("args", "name"), [
    (("tiny-cpu", None), "tiny-cpu"),
    (("sglang-blackwell", "k2.6"), "sglang-blackwell-k2_6"),
    (("Tiny.CPU", "M"), "Tiny_CPU-M"),  # capitals are Bake- and CI-safe; dots are not
    (("t", None, "linux/arm64"), "t-arm64"),
    (("t", None, "linux/arm/v7"), "t-arm_v7"),  # the whole arch after the OS
])
def test_a_job_name_is_target_model_and_arch(args, name):
    assert matrix.job_name(*args) == name


def test_a_runner_is_hosted_for_cpu_and_labelled_for_gpu(jobs):
    j = next(j for j in jobs if j.name == "sglang-dgx-spark")
    assert j.runner == ["self-hosted", "linux", "arm64", "gpu", j.archs[0]]
    assert replace(j, smoke_arch=None).runner[-1] == "gpu"
    cpu = next(j for j in jobs if j.name == "tiny-cpu-multi-arm64")
    assert cpu.runner == "ubuntu-24.04-arm"


def test_a_job_without_its_plan_cannot_be_baked(jobs):
    with pytest.raises(InputError) as e:
        matrix.bake([replace(jobs[0], plan=None)], WS)
    assert e.value.message == f"job {jobs[0].name} carries no plan"
    assert e.value.hint == "make jobs with matrix.jobs()"


# --- the Bake checker ---------------------------------------------------------------------------

def _doc(**target) -> dict:
    t = {"context": "c", "dockerfile-inline": "FROM x\n", "tags": ["r/x:t"],
         "platforms": ["linux/amd64"]} | target
    return {"group": {"default": {"targets": ["a"]}}, "target": {"a": t}}


def test_a_well_formed_bake_file_has_no_problem():
    doc = _doc(args={"A": "1"}, labels={"l": "v"}, contexts={"c": "d"}, pull=True,
               **{"no-cache": False, "cache-from": ["r/x:t", "type=registry,ref=r/x:t",
                                                    "ref=r/x:t", "type=local,src=d=e",
                                                    "type=gha", "type=local,src="],
                  "cache-to": ["type=inline", "type=local,dest=d"]})
    doc["variable"] = {}
    doc["function"] = {}
    doc["group"]["all"] = {"targets": ["default", "a"], "description": "d", "name": "all"}
    assert matrix.check_bake(doc) == []


T = "target 'a'"


@pytest.mark.parametrize(("change", "problems"), [
    ({"dockerfile": "Dockerfile"}, [f"{T}: both dockerfile and dockerfile-inline"]),
    ({"dockerfile-inline": "RUN x\n"}, [f"{T}: dockerfile-inline has no FROM"]),
    ({"tags": ["Not A Tag"]}, [f"{T}: 'Not A Tag' is not a valid image reference"]),
    ({"tags": "r/x:t"}, [f"{T}: tags must be list, got str"]),
    ({"tags": [1]}, [f"{T}: tags must be a list of strings",
                     f"{T}: 1 is not a valid image reference"]),
    ({"platforms": ["amd64"]}, [f"{T}: platform 'amd64' is not os/arch"]),
    ({"platforms": "linux/amd64"}, [f"{T}: platforms must be list, got str"]),
    ({"context": True}, [f"{T}: context must be str, got bool"]),
    ({"pull": "yes"}, [f"{T}: pull must be bool, got str"]),
    ({"args": {"A": 1}}, [f"{T}: args must map strings to strings"]),
    ({"contexts": {"c": 1}}, [f"{T}: contexts must map strings to strings"]),
    ({"labels": {"l": None}}, [f"{T}: labels must map strings to strings"]),
    ({"platform": ["linux/amd64"]}, [f"{T}: unknown attribute 'platform'"]),
    ({"cache-from": "r/x:t"}, [f"{T}: cache-from must be list, got str"]),
    ({"cache-from": ["Not A Ref"]},
     [f"{T}: cache-from 'Not A Ref' is not an image reference nor type=...,key=value"]),
    ({"cache-from": ["src=d"]}, [f"{T}: cache-from type=registry needs ref="]),
    ({"cache-from": ["type=local,=d"]}, [f"{T}: cache-from 'type=local,=d' is not a list "
                                         "of key=value"]),
    ({"cache-from": ["type=local,src=a=b"]}, []),  # a value may hold '='
])
def test_each_bad_attribute_is_named(change, problems):
    assert matrix.check_bake(_doc(**change)) == problems


def test_a_target_without_context_and_a_later_bad_target_are_both_named():
    doc = _doc()
    del doc["target"]["a"]["context"]
    doc["target"]["b"] = "not an object"
    doc["target"]["c.d"] = {"context": "c", "platforms": [1]}
    doc["group"]["default"]["targets"] = ["a"]
    assert matrix.check_bake(doc) == [
        f"{T}: no context", "target 'b': not an object",
        "target 'c.d': name must match ^[a-zA-Z0-9_-]+$", "target 'c.d': platforms must be a "
        "list of strings", "target 'c.d': platform 1 is not os/arch"]


@pytest.mark.parametrize(("doc", "problems"), [
    ([], ["the document is not a JSON object"]),
    ({"targets": {}}, ["unknown top-level block 'targets'", "no targets"]),
    ({"target": []}, ["no targets"]),
    ({"target": {"a": {"context": "c"}}, "group": ["a"]}, ["group must be an object"]),
])
def test_a_document_without_targets_or_groups_is_named(doc, problems):
    assert matrix.check_bake(doc) == problems


def test_each_bad_group_is_named():
    doc = _doc()
    doc["group"] = {"g.h": {"targets": ["a"]}, "a": {"targets": ["a"]}, "x": {"targets": "a"},
                    "y": [], "z": {"targets": ["a", "nope"], "inherits": []}}
    assert matrix.check_bake(doc) == [
        "group 'g.h': name must match ^[a-zA-Z0-9_-]+$",
        "group 'a': a target has the same name",
        "group 'x': needs a list of targets", "group 'y': needs a list of targets",
        "group 'z': unknown attribute 'inherits'",
        "group 'z': names 'nope', which is neither a target nor a group"]


# --- --changed-since ----------------------------------------------------------------------------

def _git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@t",
                           *args], check=True, capture_output=True, text=True).stdout.strip()


@pytest.fixture()
def repo(tmp_path) -> Path:
    """A git repository holding images/ and lockfiles/ (one commit) and a file outside them."""
    repo = tmp_path / "repo"
    shutil.copytree(ROOT / "images", repo / "images")
    shutil.copytree(ROOT / "lockfiles", repo / "lockfiles")
    (repo / "README").write_text("r\n")
    _git(repo, "init", "-q")
    _git(repo, "add", "-A")
    _git(repo, "commit", "-q", "-m", "base")
    return repo


def _changed(repo: Path, ref: str, repository: str = "imgbuild") -> dict[str, str]:
    """The jobs kept, by name, with why: read afresh (a Workspace keeps the catalog it read)."""
    ws = Workspace(repo / "images", repo / "lockfiles")
    return {j.name: j.changed for j in matrix.jobs(ws, changed_since=ref, repository=repository)}


def test_changed_since_says_why_each_job_is_in_the_list(repo):
    names = [j.name for j in matrix.jobs(Workspace(repo / "images", repo / "lockfiles"))]
    assert _changed(repo, "0" * 40) == {n: "no previous commit: every job" for n in names}
    # The engine, the archs and the patches, named together.
    spec = repo / "images" / "sglang-0516-blackwell.yaml"
    text = spec.read_text()
    spec.write_text(text.replace('version: "0.5.16"', 'version: "0.5.17"'))
    got = _changed(repo, "HEAD")
    assert got == {"sglang-0516-blackwell": "content key changed since HEAD (engine)"}
    spec.write_text(text)
    # A repository is no input of the content key: the same jobs, for any registry.
    assert _changed(repo, "HEAD", "ghcr.io/acme/x") == {}
    # A patch file: the digest of its bytes, not the content key.
    d = repo / "images" / "patches" / "sglang-ct-ignore-exact-match.yaml"
    d.write_text(d.read_text() + "\n")
    got = _changed(repo, "HEAD")
    assert got == {"sglang-0516-blackwell": "patch files changed since HEAD"}
    _git(repo, "commit", "-qam", "patch")
    # The archs and the patch list: named in the order lock, engine, base, archs, patches.
    spec.write_text(text.replace("archs: [sm100, sm120]", "archs: [sm100]").replace(
        "  - sglang-ct-ignore-exact-match\n", ""))
    assert _changed(repo, "HEAD") == {
        "sglang-0516-blackwell": "content key changed since HEAD (archs, patches)"}


def test_changed_since_keeps_a_new_platform_and_what_the_ref_cannot_plan(repo):
    spec = repo / "images" / "tiny-cpu-multi.yaml"
    text = spec.read_text()
    arm_lock = next(p.name for p in (repo / "lockfiles").glob("tiny-cpu-multi.*aarch64*"))
    # At the ref, the target has its amd64 platform only.
    spec.write_text(text.replace("platforms: [linux/amd64, linux/arm64]",
                                 "platforms: [linux/amd64]"))
    _git(repo, "rm", "-q", "--cached", f"lockfiles/{arm_lock}")
    _git(repo, "commit", "-qam", "amd64 only")
    spec.write_text(text)
    assert _changed(repo, "HEAD") == {
        "tiny-cpu-multi-arm64": "platform linux/arm64 new since HEAD"}
    # At the ref, both platforms but no arm64 lock: the ref cannot plan that job.
    _git(repo, "commit", "-qam", "both platforms, one lock")
    got = _changed(repo, "HEAD")
    assert list(got) == ["tiny-cpu-multi-arm64"]
    assert got["tiny-cpu-multi-arm64"].startswith("cannot be planned at HEAD: ")


def test_changed_since_at_a_ref_without_images_or_with_images_that_do_not_load(repo):
    names = [j.name for j in matrix.jobs(Workspace(repo / "images", repo / "lockfiles"))]
    first = _git(repo, "rev-parse", "HEAD")
    _git(repo, "rm", "-rq", "images")
    _git(repo, "commit", "-q", "-m", "no images")
    # Checked out again for this run's side; HEAD has none.
    _git(repo, "checkout", "-q", first, "--", "images")
    assert _changed(repo, "HEAD") == {n: "images/ does not exist at HEAD" for n in names}
    _git(repo, "add", "-A")
    _git(repo, "commit", "-q", "-m", "images again")
    bases = repo / "images" / "bases.yaml"
    good = bases.read_text()
    bases.write_text("not: [valid\n")
    _git(repo, "commit", "-qam", "broken")
    bases.write_text(good)
    got = _changed(repo, "HEAD")
    assert set(got) == set(names)
    assert all(w.startswith("images/ at HEAD does not load: ") for w in got.values())


def test_changed_since_refusals_say_what_and_the_way_out(repo, tmp_path, monkeypatch):
    ws = Workspace(repo / "images", repo / "lockfiles")
    with pytest.raises(InputError) as e:
        matrix.jobs(ws, changed_since="deadbeef" * 5)
    assert e.value.message == f"--changed-since {'deadbeef' * 5}: no such commit in this checkout"
    assert e.value.hint == ("fetch more history (actions/checkout with fetch-depth: 0), or "
                            "leave --changed-since out to list every job")
    # images/ outside any checkout.
    loose = tmp_path / "loose"
    shutil.copytree(ROOT / "images", loose / "images")
    shutil.copytree(ROOT / "lockfiles", loose / "lockfiles")
    with pytest.raises(InputError) as e:
        matrix.jobs(Workspace(loose / "images", loose / "lockfiles"), changed_since="HEAD")
    assert e.value.message == f"--changed-since HEAD: {loose / 'images'} is not in a git checkout"
    assert e.value.facts and "not a git repository" in e.value.facts[0]
    # lockfiles/ outside the checkout images/ is in.
    with pytest.raises(InputError) as e:
        matrix.jobs(Workspace(repo / "images", loose / "lockfiles"), changed_since="HEAD")
    assert e.value.message == (f"lockfiles/ {loose / 'lockfiles'} is not inside the git "
                               f"checkout at {repo.resolve()}")
    assert e.value.hint == "--changed-since compares files the repository tracks"
    # No git at all.
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    with pytest.raises(InputError) as e:
        matrix.jobs(ws, changed_since="HEAD")
    assert e.value.message == "--changed-since needs git, which is not installed"
    assert e.value.hint == "install git, or leave --changed-since out"


# --- a patch's bytes ----------------------------------------------------------------------------

def test_a_patch_digest_covers_its_yaml_its_diff_and_every_file_of_its_directory(tmp_path):
    images = tmp_path / "images"
    pdir = images / "patches"
    (pdir / "p" / "sub").mkdir(parents=True)
    (pdir / "p.yaml").write_text("y\n")
    (pdir / "p.diff").write_text("d\n")
    (pdir / "p" / "sub" / "f.py").write_text("f\n")
    (pdir / "other.yaml").write_text("o\n")

    def digest() -> str:
        return matrix.patch_digest(images, ("p",))

    first = digest()
    assert first != hashlib.sha256().hexdigest()  # the patch's bytes are in it
    assert matrix.patch_digest(images, ()) == hashlib.sha256().hexdigest()
    seen = {first}
    for edit in (lambda: (pdir / "p.diff").write_text("d2\n"),
                 lambda: (pdir / "p.yaml").write_text("y2\n"),
                 lambda: (pdir / "p" / "sub" / "f.py").write_text("f2\n"),
                 lambda: (pdir / "p" / "sub" / "f.py").rename(pdir / "p" / "sub" / "g.py")):
        edit()
        assert digest() not in seen  # each change is seen
        seen.add(digest())
    before = digest()
    (pdir / "other.yaml").write_text("o2\n")
    assert digest() == before  # another patch's file is not this one's
    # Name and bytes are kept apart: a byte moved from a name into its file is a change.
    a, b = tmp_path / "a" / "patches", tmp_path / "b" / "patches"
    a.mkdir(parents=True)
    b.mkdir(parents=True)
    (a / "q.yaml").write_text("x")
    (b / "q.yaml").write_text("x\0")
    assert matrix.patch_digest(a.parent, ("q",)) != matrix.patch_digest(b.parent, ("q",))


def test_the_recorded_documents_parse_and_check():
    """The reviewed Bake file is one Bake reads (a broken golden copy is no review)."""
    doc = json.loads((golden.MATRIX / "bake.json").read_text())
    assert matrix.check_bake(doc) == []


def test_a_ref_whose_images_hold_a_link_out_of_the_checkout_is_refused_not_followed(repo):
    (repo / "images" / "evil.yaml").symlink_to("/etc/passwd")
    _git(repo, "add", "-A")
    _git(repo, "commit", "-q", "-m", "a link out")
    (repo / "images" / "evil.yaml").unlink()
    with pytest.raises(InputError) as e:
        matrix.jobs(Workspace(repo / "images", repo / "lockfiles"), changed_since="HEAD")
    assert e.value.message == ("--changed-since HEAD: images/ or lockfiles/ at HEAD holds a "
                               "file imgbuild will not unpack")
    assert e.value.facts == ["'images/evil.yaml' is a link to an absolute path"]
    assert e.value.hint == ("a spec or lock is a plain file; remove the link from the commit, "
                            "or leave --changed-since out")


# --- what the documents carry besides the golden copies --------------------------------------

def test_the_documents_carry_why_each_job_changed():
    doc = matrix.document(WS, "json", changed_since="0" * 40)
    assert {j["changed"] for j in doc["jobs"]} == {"no previous commit: every job"}
    gh = matrix.document(WS, "github", changed_since="0" * 40)
    assert {j["changed"] for j in gh["include"]} == {"no previous commit: every job"}
    assert "changed" not in matrix.document(WS, "github")["include"][0]


def test_a_bake_context_is_under_the_directory_given_once_slashed(jobs):
    doc = matrix.bake(jobs[:1], WS, context_dir="/abs/ctx/")
    assert doc["target"][jobs[0].name]["context"] == f"/abs/ctx/{jobs[0].name}"


def test_an_engine_group_named_like_a_target_or_default_is_prefixed(jobs):
    j = jobs[0]
    clash = [dataclasses.replace(j, name=j.engine)]
    assert set(matrix.bake(clash, WS)["group"]) == {"default", f"engine-{j.engine}"}
    named_default = [dataclasses.replace(j, engine="default")]
    assert set(matrix.bake(named_default, WS)["group"]) == {"default", "engine-default"}


def test_a_target_whose_locked_wheels_are_in_the_wheel_directory_installs_from_it(tmp_path):
    """With a wheel directory (IMGBUILD_WHEELS) holding a wheel the target's lock pins, its
    Bake target installs from the context's wheelhouse; a target none of whose wheels are
    there reaches its indexes as without one."""
    shutil.copytree(ROOT / "images", tmp_path / "images")
    shutil.copytree(ROOT / "lockfiles", tmp_path / "lockfiles")
    wheel = tmp_path / "wheels" / "safetensors-0-py3-none-any.whl"
    wheel.parent.mkdir()
    wheel.write_bytes(b"a wheel the lock pins")
    digest = hashlib.sha256(wheel.read_bytes()).hexdigest()
    ws = Workspace(tmp_path / "images", tmp_path / "lockfiles")
    ref = ws.target("tiny-cpu")
    lock = ref.lock()
    body = re.sub(r"(\nsafetensors==\S+ \\\n)", rf"\1    --hash=sha256:{digest} \\\n", lock.body,
                  count=1)
    assert body != lock.body
    write_lock(lock.path, ref.request, body, "uv test")
    ws = Workspace(tmp_path / "images", tmp_path / "lockfiles", tmp_path / "wheels")
    jobs = [j for j in matrix.jobs(ws) if j.name in ("tiny-cpu", "sglang-hopper")]
    doc = matrix.bake(jobs, ws)
    flags = {n: t["args"]["IMGBUILD_INDEX_FLAGS"] for n, t in doc["target"].items()}
    assert "--find-links" in flags["tiny-cpu"] and "download.pytorch.org" not in flags["tiny-cpu"]
    assert "--find-links" not in flags["sglang-hopper"]


def test_a_failed_git_archive_is_said_with_gits_words(repo, monkeypatch):
    real = matrix._git

    def archive_fails(root, *args, binary=False):
        if args[0] == "archive":
            return subprocess.CompletedProcess(args, 128, b"", b"fatal: \xff bad object\n")
        return real(root, *args, binary=binary)

    monkeypatch.setattr(matrix, "_git", archive_fails)
    with pytest.raises(InputError) as e:
        matrix.jobs(Workspace(repo / "images", repo / "lockfiles"), changed_since="HEAD")
    assert e.value.message == "--changed-since HEAD: git archive failed"
    assert e.value.facts == ["fatal: \ufffd bad object"]  # undecodable bytes replaced


# --- each job's build context, as CI's Bake build reads it ------------------------------------

def test_each_jobs_context_is_assembled_whole_with_its_smoke_checkpoint(tmp_path, monkeypatch):
    """write_contexts, the smoke checkpoint a stand-in by its recipe key (where it comes from
    is tests/test_decisions_smokemodel_flow.py's): the context `imgbuild build` would make, with
    the Dockerfile Bake reads inline, and a context left by an earlier run replaced whole."""
    from .test_decisions_smokemodel_flow import checkpoint

    ws = checkout_workspace()
    [job] = [j for j in matrix.jobs(ws) if j.target == "tiny-cpu"]
    asked = []
    ckpt = checkpoint(tmp_path / "ckpt", job.plan.smoke_model_key)

    def smoke_model(ws_, alias, key, client, repo):
        asked.append((alias, key, repo.name))
        return ckpt
    monkeypatch.setattr(matrix, "smoke_model", smoke_model)
    monkeypatch.setattr(matrix.daemon, "client", lambda: None)
    dest = tmp_path / "contexts"
    (dest / job.name).mkdir(parents=True)
    (dest / job.name / "left-by-an-earlier-run").write_text("x")
    got = matrix.write_contexts([job], ws, dest, repository="ghcr.io/acme/imgbuild")
    assert got == {job.name: dest / job.name}
    ctx = got[job.name]
    assert not (ctx / "left-by-an-earlier-run").exists()
    assert asked == [(job.plan.smoke_model, job.plan.smoke_model_key, "ghcr.io/acme/imgbuild")]
    doc = matrix.bake([job], ws, context_dir=str(dest))
    assert (ctx / "Dockerfile").read_text() == doc["target"][job.name]["dockerfile-inline"]
    # the checkpoint is in the context, as the Dockerfile copies it
    assert any(p.name == "config.json" for p in ctx.rglob("config.json"))


def test_a_job_made_without_a_plan_is_refused():
    job = dataclasses.replace(matrix.jobs(checkout_workspace())[0], plan=None)
    with pytest.raises(InputError) as e:
        matrix.write_contexts([job], checkout_workspace(), Path("/nonexistent"))
    assert e.value.message == f"job {job.name} carries no plan"
