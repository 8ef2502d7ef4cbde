"""The CI workflow runs: its `matrix`, `build`, `pages` and `outdated` jobs, as written in
.github/workflows/images.yml, executed step by step in a fresh clone with only what the workflow
installs, against the local registry and a local index.

What GitHub provides is stood in for at its boundary only:
- `run:` steps run as GitHub runs them (`bash --noprofile --norc -eo pipefail`), with the
  workflow's, job's and step's `env:`, `${{ }}` expressions evaluated, and GITHUB_OUTPUT,
  GITHUB_PATH, GITHUB_STEP_SUMMARY and GITHUB_ENV files read back between steps;
- actions/checkout: a `git clone` of a repository holding this working tree;
  astral-sh/setup-uv: uv on PATH (it is); docker/login-action: `docker login` when the
  secrets hold credentials (the local registry asks for none); actions/upload-artifact: a
  copy; peter-evans/create-pull-request: the diff it would propose, read with git;
  sigstore/cosign-installer: the project's own cosign 2.5 (scripts/cosign.sh) on PATH, where
  the release asked for is a 2.x.
- Keyless signing needs GitHub's OIDC token, Fulcio and Rekor, none of which can be reached
  here: the jobs run with the COSIGN_PRIVATE_KEY secret (the key path, run in full), and the
  signing step's keyless branch runs with imgbuild stood in for (the command line it is given,
  the summary it writes); imgbuild's keyless signing through the real cosign is
  tests/test_cosign_delegation.py.
- Only hosted CPU runners (`ubuntu-latest`) run here; a job for a self-hosted GPU runner is
  reported as not run, never as passed.
The PyTorch CPU index is out of reach here: the runner's environment carries IMGBUILD_WHEELS
(a local directory with the same torch wheel), as a runner behind a firewall would.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import time
import uuid
from pathlib import Path

import pytest
import yaml

from .conftest import REGISTRY_HOST, ROOT, WHEELS, registry_available, run_imgbuild
from .wheelfactory import LocalIndex, WheelSpec

WORKFLOW = ROOT / ".github" / "workflows" / "images.yml"
COSIGN = Path(os.environ.get("IMGBUILD_STATE", "/var/lib/imgbuild")) / "cosign" / "bin" / "cosign"
HOSTED = {"ubuntu-latest", "ubuntu-24.04", "ubuntu-22.04"}


# --- ${{ }} expressions ---------------------------------------------------------------------

class Ctx(dict):
    """A context: missing keys are '' (GitHub's null), attributes read keys."""

    def __getattr__(self, name):
        v = self.get(name, "")
        return Ctx(v) if isinstance(v, dict) else v


def evaluate(expr: str, ctx: dict):
    py = expr.strip()
    py = re.sub(r"\|\|", " or ", py)
    py = re.sub(r"&&", " and ", py)
    py = re.sub(r"!(?!=)", " not ", py)
    py = re.sub(r"\btrue\b", "True", py)
    py = re.sub(r"\bfalse\b", "False", py)
    py = re.sub(r"\bnull\b", "None", py)
    names = {k: Ctx(v) if isinstance(v, dict) else v for k, v in ctx.items()}
    # Status functions: a failed step ends the run here, so every step that is reached has
    # seen only successes.
    funcs = {"fromJSON": json.loads, "always": lambda: True, "success": lambda: True,
             "failure": lambda: False, "cancelled": lambda: False}
    return eval(py, {"__builtins__": {}} | funcs, names)  # noqa: S307


def condition(expr, ctx: dict) -> bool:
    """An `if:` value: an expression, with or without `${{ }}` (YAML needs the wrapper for one
    that starts with `!`)."""
    whole = re.fullmatch(r"\s*\$\{\{(.*?)\}\}\s*", str(expr), re.S)
    return bool(evaluate(whole.group(1) if whole else str(expr), ctx))


def substitute(text, ctx: dict):
    if not isinstance(text, str):
        return text
    whole = re.fullmatch(r"\s*\$\{\{(.*?)\}\}\s*", text, re.S)
    if whole:
        return evaluate(whole.group(1), ctx)
    return re.sub(r"\$\{\{(.*?)\}\}", lambda m: _str(evaluate(m.group(1), ctx)), text, flags=re.S)


def _str(v) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    return "" if v is None else (json.dumps(v) if isinstance(v, (dict, list)) else str(v))


def test_the_expression_stand_in():
    ctx = {"github": {"event_name": "schedule"}, "inputs": {"relock": False},
           "matrix": {"gpu": False}, "needs": {"m": {"outputs": {"count": "0"}}}}
    assert evaluate("github.event_name == 'schedule' || inputs.relock", ctx) is True
    assert evaluate("needs.m.outputs.count != '0'", ctx) is False
    assert evaluate("matrix.gpu", ctx) is False and evaluate("!matrix.gpu", ctx) is True
    assert substitute("logs-${{ matrix.gpu }}", ctx) == "logs-false"
    assert condition("${{ !cancelled() && needs.m.outputs.count == '0' }}", ctx) is True
    assert substitute("${{ fromJSON('{\"a\": 1}') }}", ctx) == {"a": 1}


# --- a runner -------------------------------------------------------------------------------

class Runner:
    def __init__(self, source: Path, work: Path, env: dict[str, str], event: dict):
        self.source, self.work, self.env, self.event = source, work, env, event
        self.doc = yaml.safe_load(WORKFLOW.read_text())
        self.outputs: dict[str, dict] = {}
        self.logs: list[str] = []
        self.artifacts = work / "artifacts"
        self.pull_requests: list[dict] = []
        self.summaries: dict[str, str] = {}  # "job / step": what it wrote to GITHUB_STEP_SUMMARY

    def ctx(self, extra: dict) -> dict:
        return {"github": {"event_name": self.event["name"], "event": self.event.get("payload", {}),
                           "ref": "refs/heads/main"},
                "inputs": self.event.get("inputs", {}), "vars": self.event.get("vars", {}),
                "secrets": self.event.get("secrets", {}),
                "needs": {k: {"outputs": v} for k, v in self.outputs.items()}} | extra

    def job(self, name: str, matrix: dict | None = None) -> dict:
        """Run one job; return {'ran': bool, 'steps': {id or name: output text}}."""
        job = self.doc["jobs"][name]
        ctx = self.ctx({"matrix": matrix or {}})
        cond = job.get("if")
        if cond is not None and not condition(cond, ctx):
            return {"ran": False, "why": f"if: {cond}", "steps": {}}
        runner = substitute(job["runs-on"], ctx)
        if runner not in HOSTED:
            return {"ran": False, "why": f"needs runner {runner}", "steps": {}}
        ws = self.work / f"{name}-{uuid.uuid4().hex[:6]}"
        files = {k: ws.parent / f"{ws.name}.{k}" for k in ("output", "path", "summary", "env")}
        env = dict(self.env)
        for scope in (self.doc.get("env") or {}, job.get("env") or {}):
            env |= {k: _str(substitute(v, ctx)) for k, v in scope.items()}
        steps_ctx: dict = {}
        out: dict = {"ran": True, "steps": {}}
        paths: list[str] = []
        for step in job["steps"]:
            sid = step.get("id") or step.get("name") or step.get("uses")
            sctx = ctx | {"steps": steps_ctx, "env": env}
            if "if" in step and not condition(step["if"], sctx):
                continue
            for f in files.values():
                f.write_text("")
            senv = env | {k: _str(substitute(v, sctx)) for k, v in (step.get("env") or {}).items()}
            senv |= {"GITHUB_OUTPUT": str(files["output"]), "GITHUB_PATH": str(files["path"]),
                     "GITHUB_STEP_SUMMARY": str(files["summary"]), "GITHUB_ENV": str(files["env"]),
                     "GITHUB_WORKSPACE": str(ws), "PATH": ":".join(paths + [env["PATH"]])}
            t0 = time.monotonic()
            if "uses" in step:
                with_ = {k: _str(substitute(v, sctx)) for k, v in (step.get("with") or {}).items()}
                text = self.action(step["uses"], with_, ws, senv, sctx)
                rc = 0
            else:
                r = subprocess.run(["bash", "--noprofile", "--norc", "-eo", "pipefail", "-c",
                                    substitute(step["run"], sctx)], cwd=ws, env=senv,
                                   capture_output=True, text=True, timeout=3000)
                text, rc = r.stdout + r.stderr, r.returncode
            took = time.monotonic() - t0
            self.logs.append(f"## {name} / {sid} (exit {rc}, {took:.1f} s)\n{text}")
            print(f"WORKFLOW-STEP {name} / {sid}: {took:.1f} s", flush=True)
            self.summaries[f"{name} / {sid}"] = files["summary"].read_text()
            out["steps"][sid] = text
            if rc != 0 and not evaluate(str(step.get("continue-on-error", False)).replace(
                    "${{", "").replace("}}", ""), sctx):
                raise AssertionError(f"{name} / {sid} failed (exit {rc}):\n{text[-4000:]}")
            outputs = dict(line.split("=", 1) for line in files["output"].read_text().splitlines()
                           if "=" in line)
            steps_ctx[step.get("id", sid)] = {"outputs": outputs}
            paths = [p for p in files["path"].read_text().splitlines() if p] + paths
            env |= dict(line.split("=", 1) for line in files["env"].read_text().splitlines()
                        if "=" in line)
        self.outputs[name] = {k: _str(substitute(v, ctx | {"steps": steps_ctx}))
                              for k, v in (job.get("outputs") or {}).items()}
        return out

    def action(self, uses: str, with_: dict, ws: Path, env: dict, ctx: dict) -> str:
        name = uses.split("@")[0]
        if name == "actions/checkout":
            subprocess.run(["git", "clone", "-q", str(self.source), str(ws)], check=True)
            return "cloned"
        if name == "sigstore/cosign-installer":
            assert with_.get("cosign-release", "").startswith("v2."), with_
            if COSIGN.exists():
                Path(env["GITHUB_PATH"]).write_text(f"{COSIGN.parent}\n")
                return f"cosign {with_['cosign-release']} stood in for by {COSIGN}"
            return "no cosign on this machine (the key path does not use it)"
        if name == "astral-sh/setup-uv":
            assert shutil.which("uv", path=env["PATH"]), "uv is not installed on this runner"
            return "uv"
        if name == "docker/login-action":
            if not with_.get("username"):
                return "no credentials in secrets: not logged in"
            r = subprocess.run(["docker", "login", with_["registry"], "-u", with_["username"],
                                "--password-stdin"], input=with_.get("password", ""), text=True,
                               capture_output=True)
            assert r.returncode == 0, r.stderr
            return "logged in"
        if name == "actions/upload-artifact":
            src, dest = ws / with_["path"], self.artifacts / with_["name"]
            dest.mkdir(parents=True, exist_ok=True)
            if src.is_dir():
                shutil.copytree(src, dest, dirs_exist_ok=True)
            elif src.exists():
                shutil.copy(src, dest / src.name)
            return "uploaded"
        if name == "actions/upload-pages-artifact":
            dest = self.artifacts / "github-pages"
            shutil.copytree(ws / with_["path"], dest, dirs_exist_ok=True)
            return "uploaded the site"
        if name == "actions/deploy-pages":
            assert (self.artifacts / "github-pages" / "index.html").is_file()
            return "deployed"
        if name == "peter-evans/create-pull-request":
            paths = with_.get("add-paths", "").split()
            r = subprocess.run(["git", "status", "--porcelain", "--", *paths], cwd=ws,
                               capture_output=True, text=True, check=True)
            diff = subprocess.run(["git", "diff", "--", *paths], cwd=ws, capture_output=True,
                                  text=True, check=True).stdout
            self.pull_requests.append({"branch": with_.get("branch"), "files": r.stdout,
                                       "diff": diff})
            return "pull request: " + r.stdout
        raise AssertionError(f"no stand-in for action {uses}")


def _source(tmp: Path, images: Path | None = None, lockfiles: Path | None = None) -> Path:
    """A repository holding this working tree (tracked and new files), committed."""
    src = tmp / "source"
    files = subprocess.run(["git", "ls-files", "-co", "--exclude-standard", "-z"], cwd=ROOT,
                           capture_output=True, check=True).stdout.decode().split("\0")
    for f in filter(None, files):
        if (ROOT / f).is_file():
            (src / f).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / f, src / f)
    for d, new in (("images", images), ("lockfiles", lockfiles)):
        if new is not None:
            shutil.rmtree(src / d)
            shutil.copytree(new, src / d)
    _git(src, "init", "-q", "-b", "main")
    _git(src, "add", "-A")
    _git(src, "commit", "-qm", "base")
    return src


def _git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(repo), "-c", "user.name=ci", "-c", "user.email=ci@x",
                           *args], check=True, capture_output=True, text=True).stdout


def _runner_env(home: Path) -> dict[str, str]:
    # The runner's own trust store, as a runner behind a TLS-inspecting proxy is set up.
    keep = {k: os.environ[k] for k in ("PATH", "LANG", "DOCKER_HOST", "UV_CACHE_DIR",
                                        "SSL_CERT_FILE", "SSL_CERT_DIR", "REQUESTS_CA_BUNDLE",
                                        "CURL_CA_BUNDLE") if k in os.environ}
    env = keep | {"HOME": str(home), "CI": "true", "UV_PYTHON_DOWNLOADS": "never",
                  "IMGBUILD_CACHE": str(home / ".cache" / "imgbuild")}
    if WHEELS:
        env["IMGBUILD_WHEELS"] = WHEELS  # stands in for the PyTorch CPU index
    return env


@pytest.mark.docker
def test_matrix_and_build_jobs_build_smoke_push_then_pull(tmp_path, docker_client):
    if not registry_available():
        pytest.skip(f"skipped: no registry on {REGISTRY_HOST} (make services starts one)")
    registry = f"{REGISTRY_HOST}/imgbuild-wf-{uuid.uuid4().hex[:8]}"
    src = _source(tmp_path)
    # The signing key as the secrets hold it: a cosign key (tests/fixtures/cosign) and its
    # password.
    keys = ROOT / "tests" / "fixtures" / "cosign"
    event = {"name": "workflow_dispatch", "inputs": {"targets": "tiny-cpu", "relock": False},
             "vars": {"REGISTRY": registry},
             "secrets": {"COSIGN_PRIVATE_KEY": (keys / "cosign.key").read_text(),
                         "COSIGN_PASSWORD": "imgbuild-test"}}
    home = tmp_path / "home"
    home.mkdir()

    def run_once(tag: str) -> tuple[Runner, dict]:
        r = Runner(src, tmp_path / tag, _runner_env(home), event)
        (tmp_path / tag).mkdir()
        m = r.job("matrix")
        assert m["ran"] and r.outputs["matrix"]["count"] == "1", r.logs
        [entry] = json.loads(r.outputs["matrix"]["matrix"])["include"]
        assert entry["target"] == "tiny-cpu" and entry["runner"] == "ubuntu-latest"
        b = r.job("build", matrix=entry)
        assert b["ran"], b
        return r, b

    # What earlier runs of this workflow leave in the registry: the smoke model under its recipe
    # key, which a fresh runner fetches instead of generating it (a generation from nothing is
    # tests/test_anywhere.py's: 15 to 20 CPU-seconds each here).
    seeded = run_imgbuild("smoke-model", "tiny-nvfp4", "--registry", registry, "--push", "--json")
    assert seeded.returncode == 0, seeded.stderr[-2000:]
    r, b = run_once("first")
    build = json.loads((r.artifacts / "logs-tiny-cpu" / "build.json").read_text())
    assert build["smoke"]["ok"] is True
    assert any(p.startswith(f"{registry}:tiny-cpu@") for p in build["pushed"])
    content = build["content_tag"]
    # Signed after the smoke test, before the tags moved: imgbuild verify accepts it under the
    # key (cosign's side of the same: tests/test_verify.py, tests/test_sign_interop.py).
    pushed = next(p for p in build["pushed"] if p.startswith(content + "@")).split("@")[1]
    assert build["signed"] == [pushed.replace(":", "-") + ".sig", pushed.replace(":", "-") + ".att"]
    assert build["signed_by"] == {"method": "key", "key": "$COSIGN_PRIVATE_KEY"}
    said = r.summaries["build / Smoke, push, sign, then move tags after a passing report"]
    assert "signed with the key $COSIGN_PRIVATE_KEY" in said and pushed in said
    from imgbuild.catalog.registries import SignPolicy
    from imgbuild.image import registry as reg
    from imgbuild.image import signstore

    checks, _ = signstore.checks(reg.Repository.parse(registry), pushed,
                                 SignPolicy("test", key=str(keys / "cosign.pub")))
    assert all(ok for _, ok, _ in checks), checks
    # The runner pushed once and kept no copy of the compressed layers (the workflow's env).
    assert build["push"]["cached_layers"] == 0
    assert not (home / ".cache" / "imgbuild" / "blobs" / "layers").exists()
    # The pages job: the documentation site (built --strict from the clone, its references
    # generated there) with the compatibility page in it, from what the registry holds now:
    # the tiny-cpu image this run pushed and its smoke report (the same inputs give the same
    # page bytes: tests/test_report.py, without a second run of this job here).
    pages = r.job("pages")
    assert pages["ran"], pages
    published = r.artifacts / "github-pages"
    assert b"imgbuild" in (published / "index.html").read_bytes()
    assert b"imgbuild run" in (published / "reference" / "cli" / "index.html").read_bytes()
    assert b"root_only" in (published / "reference" / "catalog" / "index.html").read_bytes()
    assert b'href="../../compatibility/"' in (
        published / "explanation" / "compatibility" / "index.html").read_bytes()
    page = (published / "compatibility" / "index.html").read_bytes()
    digest = next(p for p in build["pushed"] if p.startswith(content + "@")).split("@")[1]
    assert digest.encode() in page and b"smoke-tested on CPU" in page
    # A second run on a fresh runner (an Engine without the image): pulled, not built.
    for ref in (content, f"{registry}:tiny-cpu", f"{registry}:tiny-cpu-transformers5.17.0"):
        docker_client.images.remove(ref, force=True)
    r, b = run_once("second")
    said = " ".join(b["steps"]["Build (or pull by content tag) and push the content tag; "
                                  "no tag moves yet"].split())
    assert "found in the registry: pulled instead of building" in said
    again = json.loads((r.artifacts / "logs-tiny-cpu" / "build.json").read_text())
    assert again["content_tag"] == content and again["action"] == "local"


KEY_SECRETS = {"COSIGN_PRIVATE_KEY": (ROOT / "tests" / "fixtures" / "cosign" / "cosign.key"
                                      ).read_text(),
               "COSIGN_PASSWORD": "imgbuild-test"}


def _index_job_until_refused(tmp_path: Path, *, build_amd64: bool) -> tuple[Runner, str, Path]:
    """tiny-cpu-multi: the matrix has a job per platform; here only the amd64 one can run (the
    arm64 one asks for ubuntu-24.04-arm), so the index job refuses, naming linux/arm64, and no
    index or moving tag is pushed. `build_amd64=False` leaves the amd64 job out too (its build,
    smoke and push are the minutes of this test; `imgbuild index` refusing beside a pushed
    amd64 image is test_platforms' multi-platform test), so the index job finds neither."""
    if not registry_available():
        pytest.skip(f"skipped: no registry on {REGISTRY_HOST} (make services starts one)")
    registry = f"{REGISTRY_HOST}/imgbuild-wf-{uuid.uuid4().hex[:8]}"
    src = _source(tmp_path)
    # With the signing secrets: keyless (the jobs' default) needs GitHub's OIDC token.
    event = {"name": "workflow_dispatch", "inputs": {"targets": "tiny-cpu-multi", "relock": False},
             "vars": {"REGISTRY": registry}, "secrets": KEY_SECRETS}
    home = tmp_path / "home"
    home.mkdir()
    r = Runner(src, tmp_path, _runner_env(home), event)
    assert r.job("matrix")["ran"] and r.outputs["matrix"]["count"] == "2", r.logs
    amd, arm = json.loads(r.outputs["matrix"]["matrix"])["include"]
    assert (amd["platform"], amd["runner"]) == ("linux/amd64", "ubuntu-latest")
    assert (arm["platform"], arm["runner"]) == ("linux/arm64", "ubuntu-24.04-arm")
    if build_amd64:
        assert r.job("build", matrix=amd)["ran"]
    skipped = r.job("build", matrix=arm)
    assert not skipped["ran"] and "ubuntu-24.04-arm" in skipped["why"]
    with pytest.raises(AssertionError) as e:
        r.job("index")
    said = " ".join(str(e.value).split())
    assert "linux/arm64: " in said and "is not in the registry" in said, said
    assert ("linux/amd64: " in said) is not build_amd64, said
    assert "index not assembled: tiny-cpu-multi" in said
    from imgbuild.image import registry as reg

    repo = reg.Repository.parse(registry)
    assert reg.manifest_digest(repo, "tiny-cpu-multi") is None
    return r, registry, home


@pytest.mark.docker
def test_index_job_refuses_while_a_platform_is_missing(tmp_path, docker_client):
    _index_job_until_refused(tmp_path, build_amd64=False)


@pytest.mark.docker
@pytest.mark.slow  # the arm64 image built and smoke-tested under QEMU: minutes on two cores
def test_index_job_assembles_only_after_every_platform_passed(tmp_path, docker_client,
                                                              arm64_base):
    """Once the arm64 image is pushed as its runner would push it (here under QEMU), the index
    job that refused assembles the index and moves the tags."""
    from imgbuild.image import registry as reg

    r, registry, home = _index_job_until_refused(tmp_path, build_amd64=True)
    # What the arm64 runner's build job runs, run here under QEMU user emulation.
    env = _runner_env(home) | {"PATH": os.environ["PATH"]} | KEY_SECRETS
    done = subprocess.run([str(ROOT / ".venv" / "bin" / "imgbuild"), "build", "tiny-cpu-multi",
                           "--platform", "linux/arm64", "--registry", registry, "--push",
                           "--sign-key", "env://COSIGN_PRIVATE_KEY"],
                          cwd=r.source, env=env, capture_output=True, text=True, timeout=3600)
    assert done.returncode == 0, done.stderr[-3000:]
    out = r.job("index")
    assert out["ran"], out
    found = reg.fetch_index(reg.Repository.parse(registry), "tiny-cpu-multi")
    assert found is not None and set(found[1]) == {"linux/amd64", "linux/arm64"}


@pytest.mark.docker
def test_index_job_signs_the_index_with_the_build_jobs_key(tmp_path, docker_client):
    """The index job with the signing secret (COSIGN_PRIVATE_KEY, COSIGN_PASSWORD, env://, as
    the build job takes them). The build jobs' platform images stand in as tiny ones written
    through the registry API with what a build job leaves beside them (tests/test_sign_index.py;
    building them is test_index_job_assembles_only_after_every_platform_passed's minutes): the
    job refuses while the arm64 image is not signed by the key, moving no tag, then signs the
    index before its tags move."""
    if not registry_available():
        pytest.skip(f"skipped: no registry on {REGISTRY_HOST} (make services starts one)")
    from imgbuild.catalog.registries import SignPolicy
    from imgbuild.image import cosign, signstore
    from imgbuild.image import registry as reg

    from .test_sign_index import PREDICATES, index_plan, push_platforms

    registry = f"{REGISTRY_HOST}/imgbuild-wf-{uuid.uuid4().hex[:8]}"
    keys = ROOT / "tests" / "fixtures" / "cosign"
    event = {"name": "workflow_dispatch", "inputs": {"targets": "tiny-cpu-multi", "relock": False},
             "vars": {"REGISTRY": registry},
             "secrets": {"COSIGN_PRIVATE_KEY": (keys / "cosign.key").read_text(),
                         "COSIGN_PASSWORD": "imgbuild-test"}}
    home = tmp_path / "home"
    home.mkdir()
    r = Runner(_source(tmp_path), tmp_path, _runner_env(home), event)
    assert r.job("matrix")["ran"] and r.outputs["matrix"]["count"] == "2", r.logs
    repo = reg.Repository.parse(registry)
    key = cosign.load_private_key((keys / "cosign.key").read_bytes(), b"imgbuild-test", "k")
    images = push_platforms(repo, None)
    signstore.sign(repo, images["linux/amd64"], key, PREDICATES)  # the arm64 job did not sign
    with pytest.raises(AssertionError) as e:
        r.job("index")
    said = " ".join(str(e.value).split())
    arm = images["linux/arm64"]
    assert f"linux/arm64: {arm}: signature: none: the registry holds no {cosign.sig_tag(arm)}" \
        in said, said
    assert "linux/amd64: " not in said
    assert (f"asked of each platform image: a signature by {cosign.key_id(key.key.public_key())}"
            " ($COSIGN_PRIVATE_KEY), the key that signs the index") in said
    assert "index not assembled: tiny-cpu-multi" in said
    plan = index_plan(repo)
    assert all(reg.manifest_digest(repo, t) is None for t in (plan.content_tag, *plan.tags))
    # The arm64 image signed (its job run again with the key): the index is signed, then tagged.
    signstore.sign(repo, images["linux/arm64"], key, PREDICATES)
    out = r.job("index")
    assert out["ran"], out
    digest = reg.manifest_digest(repo, "tiny-cpu-multi")
    assert digest is not None and reg.manifest_digest(repo, plan.content_tag) == digest
    step = next(v for k, v in out["steps"].items() if k.startswith("Assemble"))
    assert f"signed the index {registry}@{digest[:19]}… with $COSIGN_PRIVATE_KEY" in " ".join(
        step.split())
    checks, _ = signstore.checks(repo, digest, SignPolicy("test", key=str(keys / "cosign.pub")))
    assert [(c, ok) for c, ok, _ in checks] == [
        ("signature", True), ("attestation cyclonedx", True),
        ("attestation slsaprovenance1", True)]


def test_push_of_one_spec_selects_exactly_that_target(tmp_path):
    src = _source(tmp_path)
    before = _git(src, "rev-parse", "HEAD").strip()
    spec = src / "images" / "tiny-cpu.yaml"
    spec.write_text(spec.read_text().replace("The demo:", "The demo (changed):"))
    _git(src, "commit", "-qam", "spec")
    home = tmp_path / "home"
    home.mkdir()
    event = {"name": "push", "payload": {"before": before}, "vars": {"REGISTRY": "r/x"}}
    r = Runner(src, tmp_path, _runner_env(home), event)
    assert r.job("matrix")["ran"]
    inc = json.loads(r.outputs["matrix"]["matrix"])["include"]
    assert [(e["target"], e["changed"]) for e in inc] == [
        ("tiny-cpu", f"content key changed since {before}")]


SPEC = """description: a target on the test's own index
engine: {name: vllm, version: "1.0"}
archs: [cpu]
os: debian-bookworm
flavor: slim
requirements: [transformers]
"""


def test_outdated_job_relocks_when_the_index_gains_a_release(tmp_path):
    ix = LocalIndex(tmp_path / "index", fallback=True)  # imgbuild's own dependencies: PyPI
    ix.add(WheelSpec("vllm", "1.0", requires=("transformers>=4.0",)))
    ix.add(WheelSpec("transformers", "4.0"))
    ix.start()
    try:
        images = tmp_path / "images"
        (images / "models").mkdir(parents=True)
        for name in ("bases.yaml", "gpus.yaml", "cuda.yaml"):
            shutil.copy(ROOT / "images" / name, images / name)
        (images / "t.yaml").write_text(SPEC)
        home = tmp_path / "home"
        home.mkdir()
        env = _runner_env(home) | {"UV_INDEX_URL": ix.url}
        locks = tmp_path / "lockfiles"
        r = subprocess.run([".venv/bin/imgbuild", "lock", "t", "--images", str(images),
                            "--lockfiles", str(locks)], cwd=ROOT, env=env | {"PATH": os.environ[
                                "PATH"]}, capture_output=True, text=True)
        assert r.returncode == 0, r.stderr
        src = _source(tmp_path, images, locks)
        ix.add(WheelSpec("vllm", "1.1", requires=("transformers>=4.0",)))
        event = {"name": "schedule", "inputs": {}, "vars": {}}
        run = Runner(src, tmp_path / "run", env, event)
        (tmp_path / "run").mkdir()
        assert run.job("outdated")["ran"]
    finally:
        ix.stop()
    [pr] = run.pull_requests
    assert "images/t.yaml" in pr["files"] and "lockfiles/t.py3.11" in pr["files"]
    assert '-engine: {name: vllm, version: "1.0"}' in pr["diff"]
    assert '+engine: {name: vllm, version: "1.1"}' in pr["diff"]
    assert "+vllm==1.1" in pr["diff"]


# --- signing: keyless by default, a key where the secret is set -----------------------------

SIGN_STEP = "Smoke, push, sign, then move tags after a passing report"
GHA_SUBJECT = "https://github.com/acme/serving/.github/workflows/images.yml@refs/heads/main"
GHA_ISSUER = "https://token.actions.githubusercontent.com"


def test_the_build_job_signs_keyless_with_its_own_oidc_token_and_cosign_2():
    doc = yaml.safe_load(WORKFLOW.read_text())
    jobs = doc["jobs"]
    # The OIDC token only where an image or an index is signed: the build and index jobs, not
    # the workflow (pages has its own, for GitHub Pages' deployment).
    assert doc["permissions"] == {"contents": "read"}
    assert jobs["build"]["permissions"] == {"contents": "read", "id-token": "write"}
    assert jobs["index"]["permissions"] == {"contents": "read", "id-token": "write"}
    assert {n for n, j in jobs.items() if "id-token" in (j.get("permissions") or {})} == {
        "build", "index", "pages"}
    isteps = jobs["index"]["steps"]
    inames = [s.get("name") or s.get("uses") for s in isteps]
    [iinst] = [s for s in isteps if str(s.get("uses", "")).startswith("sigstore/cosign-installer")]
    assert iinst["uses"] == "sigstore/cosign-installer@v3"
    assert re.fullmatch(r"v2\.\d+\.\d+", iinst["with"]["cosign-release"])
    assert inames.index(iinst["name"]) < inames.index(INDEX_STEP)
    steps = jobs["build"]["steps"]
    names = [s.get("name") or s.get("uses") for s in steps]
    [installer] = [s for s in steps if str(s.get("uses", "")).startswith("sigstore/cosign-installer")]
    # Pinned as every other action of the file is (a major tag), with a cosign 2 release:
    # imgbuild reads the `.sig`/`.att` tags cosign 2 writes, not cosign 3's referrers.
    pins = {s["uses"].split("@")[1] for j in jobs.values() for s in j["steps"] if "uses" in s}
    assert installer["uses"] == "sigstore/cosign-installer@v3" and all(
        re.fullmatch(r"v\d+", p) for p in pins), pins
    assert re.fullmatch(r"v2\.\d+\.\d+", installer["with"]["cosign-release"])
    sign = names.index(SIGN_STEP)
    assert names.index(installer["name"]) < sign
    # The step before it pushes without moving a tag, and builds whole (a spliced image is
    # only pulled back, and an image only pulled is not signed).
    first = steps[sign - 2 if "Smoke with" in names[sign - 1] else sign - 1]
    assert "--no-smoke --push" in first["run"] and "--no-splice" in first["run"]
    assert "COSIGN_PRIVATE_KEY" not in first["run"]


def _signing_step(tmp_path: Path, secrets: dict, build_json: dict, *, job: str = "build",
                  name: str = SIGN_STEP, extra: dict | None = None) -> tuple[list[str], str]:
    """The signing step's `run:` as written, in bash as GitHub runs it, with its `env:` from
    these secrets and `imgbuild` stood in for (its argv recorded, `build_json` its output):
    (imgbuild's argv, the step summary)."""
    step = next(s for s in yaml.safe_load(WORKFLOW.read_text())["jobs"][job]["steps"]
                if s.get("name") == name)
    ctx = {"secrets": secrets, "matrix": {}, "github": {}, "vars": {}}
    bin_ = tmp_path / "bin"
    bin_.mkdir(parents=True)
    (tmp_path / "canned.json").write_text(json.dumps(build_json))
    (bin_ / "imgbuild").write_text(f'#!/bin/bash\nprintf "%s\\n" "$@" > {tmp_path}/argv\n'
                                   f"cat {tmp_path}/canned.json\n")
    (bin_ / "imgbuild").chmod(0o755)
    (tmp_path / "logs").mkdir()
    summary = tmp_path / "summary"
    env = {"PATH": f"{bin_}:{os.environ['PATH']}", "TARGET": "tiny-cpu", "MODEL": "",
           "PLATFORM": "linux/amd64", "REGISTRY": "ghcr.io/acme/serving",
           "GITHUB_STEP_SUMMARY": str(summary)} | (extra or {})
    env |= {k: _str(substitute(v, ctx)) for k, v in step["env"].items()}
    r = subprocess.run(["bash", "--noprofile", "--norc", "-eo", "pipefail", "-c",
                        substitute(step["run"], ctx)], cwd=tmp_path, env=env,
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    return (tmp_path / "argv").read_text().splitlines(), summary.read_text()


@pytest.mark.parametrize("keyed", [False, True])
def test_the_signing_step_signs_keyless_unless_a_key_is_set_and_says_who(tmp_path, keyed):
    secrets = {"COSIGN_PRIVATE_KEY": "-----BEGIN ENCRYPTED SIGSTORE PRIVATE KEY-----...",
               "COSIGN_PASSWORD": "pw"} if keyed else {}
    by = {"method": "key", "key": "$COSIGN_PRIVATE_KEY"} if keyed else \
        {"method": "keyless", "subject": GHA_SUBJECT, "issuer": GHA_ISSUER}
    argv, summary = _signing_step(tmp_path, secrets, {
        "pushed": ["ghcr.io/acme/serving:tiny-cpu@sha256:1"], "signed_by": by})
    assert argv[0] == "build" and "--push" in argv and "--json" in argv
    assert argv[argv.index("--sign-key") + 1] == ("env://COSIGN_PRIVATE_KEY" if keyed
                                                  else "keyless")
    assert not any("BEGIN" in a or a == "pw" for a in argv)  # secrets stay in the environment
    assert "ghcr.io/acme/serving:tiny-cpu@sha256:1" in summary
    assert summary.rstrip().splitlines()[-1] == (
        "signed with the key $COSIGN_PRIVATE_KEY" if keyed
        else f"signed keyless as {GHA_SUBJECT} (issuer {GHA_ISSUER})")


INDEX_STEP = "Assemble each multi-platform target's index, sign it, then move its tags"


@pytest.mark.parametrize("keyed", [False, True])
def test_the_index_step_signs_keyless_unless_a_key_is_set_and_says_who(tmp_path, keyed):
    secrets = {"COSIGN_PRIVATE_KEY": "-----BEGIN ENCRYPTED SIGSTORE PRIVATE KEY-----...",
               "COSIGN_PASSWORD": "pw"} if keyed else {}
    by = {"method": "key", "key": "$COSIGN_PRIVATE_KEY"} if keyed else \
        {"method": "keyless", "subject": GHA_SUBJECT, "issuer": GHA_ISSUER}
    pushed = "ghcr.io/acme/serving:tiny-cpu-multi-0123@sha256:1"
    matrix = {"include": [{"target": "tiny-cpu-multi", "multi_platform": True}] * 2
              + [{"target": "tiny-cpu", "multi_platform": False}]}
    argv, summary = _signing_step(tmp_path, secrets, {"indexes": [{
        "target": "tiny-cpu-multi", "pushed": [pushed], "signed_by": by}]}, job="index",
        name=INDEX_STEP, extra={"MATRIX": json.dumps(matrix)})
    assert argv[:2] == ["index", "tiny-cpu-multi"]  # one target, once
    assert argv[argv.index("--sign-key") + 1] == ("env://COSIGN_PRIVATE_KEY" if keyed
                                                  else "keyless")
    assert "--json" in argv
    assert not any("BEGIN" in a or a == "pw" for a in argv)
    assert summary.splitlines() == [f"index tiny-cpu-multi: {pushed}", (
        "signed with the key $COSIGN_PRIVATE_KEY" if keyed
        else f"signed keyless as {GHA_SUBJECT} (issuer {GHA_ISSUER})")]


def test_the_signing_summary_of_a_multi_platform_build_and_of_an_unsigned_one(tmp_path):
    kms = {"method": "kms", "key": "awskms:///alias/ci"}
    _, summary = _signing_step(tmp_path / "a", {}, {
        "pushed": [], "platforms": {"linux/amd64": {"signed_by": kms},
                                    "linux/arm64": {"signed_by": kms}}})
    assert summary.splitlines()[-1] == "signed with the KMS key awskms:///alias/ci"
    _, summary = _signing_step(tmp_path / "b", {}, {"pushed": [], "signed_by": None})
    assert summary.splitlines()[-1] == "not signed by this run (the build log says why)"
