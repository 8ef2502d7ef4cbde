"""imgbuild's core path on the three Docker Engines users have (tests/engines.py): Debian
bookworm's 20.10 (the shared Engine), Engine 26 with the classic store and Engine 26 with the
containerd store (scripts/engines.sh starts the two 26 daemons beside the system's); and the
client newer than its server (the 26 client with buildx against the 20.10 Engine).

One sequence per Engine, each step on what the one before left, against a repository of the
test's own in the shared registry:

  base           the Debian base pushed into it from the shared Engine (where it is already
                 local); the other Engines pull it from there to build on (pipeline/obtain.py)
  push-empty     build, smoke-test and push tiny-cpu into the empty repository; `verify` it
                 (the containerd store's build reuses the layers of the classic store's
                 image, `--cache-from`, as a CI runner reuses a release repository's)
  push-existing  every image removed from the Engine (a fresh machine; on the shared Engine
                 only this test's tags), the same build-and-push again: the image is pulled,
                 the registry's content tag keeps its digest (a push into a repository that
                 held the layers once published a manifest whose config did not match it)
  pull           `imgbuild pull` after the image was removed; then a plain `docker pull` of
                 the moving tag works and gives as many layers as its diff ids
  zstd           the image pushed in zstd to a second repository, then pulled from it: Engine
                 26 (either store) pulls it; 20.10 is refused before a byte moves (exit 3)
  run            `imgbuild run` serves until ready, answers, stops at Ctrl-C, leaves nothing
  no-op          the build again with the image here: "local", nothing built

"Every image removed" leaves BuildKit's cache (rebuilding it costs minutes of CPU on a 26
Engine): its layers are not downloaded again, and under the containerd store such a pull
fetches no layer blob at all (the image is there but incomplete, and `docker images` does not
list it). IMGBUILD_TEST_FRESH_BUILDER=1 prunes the build cache as well, for pulls that download
everything, as on a new machine (Sequence.forget).

A step that fails does not stop the ones that do not need it: each Engine's table says what
works there. `pytest -s` prints a line per step (`ENGINE-STEP 26-classic pull pass 8.1s (cpu:
...)`), with the CPU-seconds of imgbuild, of the Engine (exact for Engine 26: engine_cpu_s) and
of the registry; the table is also printed after the run and written to
engine-steps/<engine>.json in the session's tmp dir (pytest's --basetemp).
"""

from __future__ import annotations

import fcntl
import json
import os
import resource
import signal
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

import pytest
import requests

from . import engines
from .conftest import (
    REGISTRY_HOST,
    ROOT,
    SUMMARIES,
    WHEELS,
    checkout_workspace,
    registry_available,
    run_imgbuild,
)

ACCEPT = ", ".join(("application/vnd.oci.image.index.v1+json",
                    "application/vnd.docker.distribution.manifest.list.v2+json",
                    "application/vnd.oci.image.manifest.v1+json",
                    "application/vnd.docker.distribution.manifest.v2+json"))
ZSTD_LAYER = "application/vnd.oci.image.layer.v1.tar+zstd"


# --- the registry, read directly -------------------------------------------------------------

def _url(repo: str, what: str) -> str:
    return f"http://{REGISTRY_HOST}/v2/{repo.removeprefix(REGISTRY_HOST + '/')}/{what}"


def manifest_digest(repo: str, reference: str) -> str | None:
    """The digest the registry serves for repo:reference (a HEAD), None when it has none."""
    r = requests.head(_url(repo, f"manifests/{reference}"), headers={"Accept": ACCEPT},
                      timeout=30)
    if r.status_code == 404:
        return None
    r.raise_for_status()
    return r.headers["Docker-Content-Digest"]


def manifest(repo: str, reference: str) -> dict:
    r = requests.get(_url(repo, f"manifests/{reference}"), headers={"Accept": ACCEPT}, timeout=30)
    r.raise_for_status()
    return r.json()


def config(repo: str, reference: str) -> dict:
    r = requests.get(_url(repo, f"blobs/{manifest(repo, reference)['config']['digest']}"),
                     timeout=30)
    r.raise_for_status()
    return r.json()


# --- the steps, timed ------------------------------------------------------------------------

CLK_TCK = os.sysconf("SC_CLK_TCK")


def _proc_stats() -> dict[int, tuple[str, int, float]]:
    """pid -> (command name, parent pid, CPU-seconds of it and its waited-for children)."""
    out = {}
    for p in Path("/proc").iterdir():
        if not p.name.isdigit():
            continue
        try:
            stat = (p / "stat").read_text()
        except OSError:
            continue
        comm, rest = stat[stat.index("(") + 1:stat.rindex(")")], stat[stat.rindex(")") + 2:]
        f = rest.split()
        out[int(p.name)] = (comm, int(f[1]), sum(int(x) for x in f[11:15]) / CLK_TCK)
    return out


def _pidfile(path: Path) -> int | None:
    try:
        return int(path.read_text().strip())
    except (OSError, ValueError):
        return None


CPUACCT = Path("/sys/fs/cgroup/cpuacct")


def engine_cpu_s(engine: engines.Engine) -> float:
    """CPU-seconds this Engine spent so far: its daemon, its containerd and shims, its
    containers and build steps. Exact for an Engine 26 of scripts/engines.sh where cgroup v1's
    cpuacct is (it puts all of that in a cgroup of its own); else its dockerd and containerd
    processes, and for the shared Engine the cgroup of every container under /docker (another
    test's too: the shared Engine serves the whole suite)."""
    pidfile = Path("/var/run/docker.pid") if engine.shared \
        else engines.ENGINES_DIR / engine.name / "dockerd.pid"
    pid = _pidfile(pidfile)
    if not engine.shared and (own := _own_cgroup(pid)) is not None:
        return int(own.read_text()) / 1e9
    cpu = sum(c for p, (_, ppid, c) in _proc_stats().items() if pid in (p, ppid))
    if engine.shared:
        v1 = CPUACCT / "docker" / "cpuacct.usage"  # ns
        v2 = Path("/sys/fs/cgroup/docker/cpu.stat")  # usage_usec
        try:
            if v1.exists():
                cpu += int(v1.read_text()) / 1e9
            elif v2.exists():
                cpu += next(int(ln.split()[1]) for ln in v2.read_text().splitlines()
                            if ln.startswith("usage_usec")) / 1e6
        except (OSError, ValueError, StopIteration):
            pass
    return cpu


def _own_cgroup(pid: int | None) -> Path | None:
    """cpuacct.usage of the cgroup scripts/engines.sh put this dockerd's Engine in
    (/<imgbuild-engines...>/<name>/daemon holds the daemon; its containers are beside it)."""
    try:
        lines = Path(f"/proc/{pid}/cgroup").read_text().splitlines()
    except OSError:
        return None
    for line in lines:
        _, controllers, path = line.split(":", 2)
        if "cpuacct" in controllers.split(",") and path.endswith("/daemon") and \
                path.startswith("/imgbuild-engines"):
            usage = CPUACCT / path.strip("/").removesuffix("/daemon") / "cpuacct.usage"
            return usage if usage.exists() else None
    return None


def registry_cpu_s() -> float:
    """CPU-seconds of the shared registry (docker-registry) so far: every test's pushes."""
    return sum(c for comm, _, c in _proc_stats().values() if comm == "docker-registry")


def children_cpu_s() -> float:
    """CPU-seconds of this process's finished children (imgbuild, docker clients)."""
    ru = resource.getrusage(resource.RUSAGE_CHILDREN)
    return ru.ru_utime + ru.ru_stime


@dataclass
class Step:
    engine: str
    version: str
    store: str
    step: str
    status: str  # pass | fail | skip
    seconds: float
    imgbuild_cpu_s: float  # the test's processes: imgbuild, the docker clients
    engine_cpu_s: float  # the Engine's (engine_cpu_s): daemon, containers, build steps
    registry_cpu_s: float
    detail: str = ""

    def line(self) -> str:
        return (f"ENGINE-STEP {self.engine} {self.step} {self.status} {self.seconds:.1f}s"
                f" (cpu: imgbuild {self.imgbuild_cpu_s:.1f}s, engine {self.engine_cpu_s:.1f}s,"
                f" registry {self.registry_cpu_s:.1f}s)"
                + (f": {self.detail}" if self.detail and self.status != "pass" else ""))


class Sequence:
    """The core path on one Engine: its steps in order, each timed and recorded."""

    def __init__(self, engine: engines.Engine, shared: engines.Engine, out_dir: Path,
                 work_dir: Path, label: str, cache_from: str | None = None):
        self.engine, self.shared, self.out_dir, self.label = engine, shared, out_dir, label
        self.cache_from = cache_from  # an image another Engine pushed: its layers to reuse
        slug = label.replace(".", "-")
        self.repo = f"{REGISTRY_HOST}/imgbuild-test-{slug}-{uuid.uuid4().hex[:8]}"
        self.zrepo = f"{self.repo}-zstd"
        from imgbuild.plan.decide import make_plan

        plan = make_plan(checkout_workspace(), "tiny-cpu", resolve=False, repository=self.repo)
        self.tag = plan.content_tag
        self.ref = plan.ref()
        self.steps: list[Step] = []
        self.digest: str | None = None  # the content tag's, as pushed by push-empty
        # imgbuild's build lock is the Engine's (image/buildlock.py): a first build of
        # tiny-cpu on an empty Engine 26 does not hold the shared Engine's builds behind it.
        self.cache_env: dict[str, str] = {}
        self.cleanup_failed: list[str] = []

    # -- running them --

    def run(self, name: str, body: Callable[[], str | None], needs: tuple[str, ...] = ()) -> None:
        store = "containerd" if self.engine.containerd_store else "classic"
        done = {s.step: s.status for s in self.steps}
        blocked = [n for n in needs if done.get(n) != "pass"]
        t0, k0 = time.monotonic(), children_cpu_s()
        e0, r0 = engine_cpu_s(self.engine), registry_cpu_s()
        status, detail = "pass", ""
        if blocked:
            status, detail = "skip", f"needs {', '.join(blocked)}"
        else:
            try:
                detail = body() or ""
            except Exception as e:  # noqa: BLE001 - a failed step is recorded, the rest go on
                status, detail = "fail", (f"{type(e).__name__}: " if not isinstance(
                    e, AssertionError) else "") + " ".join(str(e).split())[:1500]
        step = Step(self.label, self.engine.version, store, name, status,
                    round(time.monotonic() - t0, 1), round(children_cpu_s() - k0, 1),
                    round(engine_cpu_s(self.engine) - e0, 1),
                    round(registry_cpu_s() - r0, 1), detail)
        self.steps.append(step)
        print(step.line(), flush=True)

    def finish(self) -> None:
        self.out_dir.mkdir(parents=True, exist_ok=True)
        out = self.out_dir / f"{self.label}.json"
        out.write_text(json.dumps({"engine": self.label, "host": self.engine.host,
                                   "version": self.engine.version,
                                   "storage": self.engine.storage,
                                   "repository": self.repo,
                                   "steps": [asdict(s) for s in self.steps]}, indent=1))
        print(f"ENGINE-STEPS {self.label}: {out}", flush=True)
        SUMMARIES.append((f"core path on {self.label} ({self.engine.what}, "
                          f"{self.engine.version}, {self.engine.storage})",
                          [s.line() for s in self.steps]))
        failed = [s for s in self.steps if s.status == "fail"]
        if failed or self.cleanup_failed:
            pytest.fail(f"on {self.engine.what} ({self.engine.version}), "
                        + "; ".join([*(f"{s.step} failed: {s.detail}" for s in failed),
                                     *(f"{s.step} not run ({s.detail})"
                                       for s in self.steps if s.status == "skip"),
                                     *self.cleanup_failed]), pytrace=False)

    def clean_up(self) -> None:
        """The test's images off its Engine (every image of an Engine 26) and its tags off the
        shared one; a failure here is reported after the steps', not in their place."""
        for what in (self.forget, lambda: self.untag(self.shared)):
            try:
                what()
            except Exception as e:  # noqa: BLE001
                self.cleanup_failed.append(f"cleaning up: {' '.join(str(e).split())[:500]}")

    # -- helpers --

    def imgbuild(self, *args: str, **extra: str) -> subprocess.CompletedProcess:
        return run_imgbuild(*args, env=self.engine.env | self.cache_env | extra)

    @staticmethod
    def ok(r: subprocess.CompletedProcess) -> dict:
        if r.returncode != 0:  # with --json the error is the report, on stdout
            said = " ".join((r.stdout + r.stderr).split())
            raise AssertionError(f"exit {r.returncode}: {said[-1500:]}")
        return json.loads(r.stdout)

    def images(self) -> list:
        return self.engine.client().images.list()

    def local(self, ref: str):
        import docker

        try:
            return self.engine.client().images.get(ref)
        except docker.errors.ImageNotFound:
            return None

    def forget(self) -> None:
        """What a fresh machine has of the test's images: nothing. Every image of a 26 Engine
        goes (`docker rmi`, then `docker image prune -a`: under the containerd store an image
        pulled while its layers were already unpacked here lacks their blobs, and `docker
        images` does not list it, though it is there); on the shared Engine, other tests' images
        stay: the test's tags alone go (the image's layers may stay under another test's tags).

        BuildKit's cache stays (rebuilding it costs minutes of CPU): layers it holds are not
        downloaded again by a pull, which under the containerd store then fetches no layer blob
        at all. IMGBUILD_TEST_FRESH_BUILDER=1 prunes it too (`docker builder prune -a`): every
        pull after it downloads every layer, and the next run builds from nothing."""
        if self.engine.shared:
            self.untag(self.engine)
            return
        ids = sorted({img.id for img in self.engine.client().images.list(all=True)})
        if ids:
            self.engine.docker("rmi", "-f", *ids, check=True)
        self.engine.docker("image", "prune", "-af", check=True)
        if os.environ.get("IMGBUILD_TEST_FRESH_BUILDER") == "1":
            self.engine.docker("builder", "prune", "-af", check=True)
        left = self.engine.docker("images", "-aq", check=True).stdout.split()
        assert left == [], f"images left after docker rmi: {left}"

    def untag(self, engine: engines.Engine) -> None:
        """The test's tags on `engine` removed (the base step's too, on the shared Engine)."""
        tags = [t for img in engine.client().images.list() for t in img.tags
                if t.startswith((self.repo + ":", self.zrepo + ":"))]
        if tags:
            engine.docker("rmi", *tags, check=True)

    def have_image(self) -> None:
        assert self.local(self.ref) is not None, \
            f"{self.ref} is not on this Engine (an earlier step failed)"

    # -- the steps --

    def base(self) -> str:
        """The base, pushed from the shared Engine where it is already local."""
        doc = self.ok(run_imgbuild("base", "bootstrap", "--base", "debian-bookworm",
                                   "--registry", self.repo, "--json", env=self.shared.env))
        assert doc["pushed"] and all(p.startswith(self.repo + ":") for p in doc["pushed"]), doc
        return ""

    def push_empty(self) -> str:
        assert manifest_digest(self.repo, self.tag) is None
        reuse = ("--cache-from", self.cache_from) if self.cache_from else ()
        doc = self.ok(self.imgbuild("tiny-cpu", "--push", "--registry", self.repo, "--json",
                                    *reuse))
        assert doc["content_tag"] == self.ref, (doc["content_tag"], self.ref)
        assert doc["action"] == "built", doc["action"]
        digest = manifest_digest(self.repo, self.tag)
        assert digest is not None and doc["pushed"][0] == f"{self.ref}@{digest}", doc["pushed"]
        assert f"{self.repo}:tiny-cpu" in doc["moved"], doc["moved"]
        assert manifest_digest(self.repo, "tiny-cpu") == digest
        m, c = manifest(self.repo, self.tag), config(self.repo, self.tag)
        assert len(m["layers"]) == len(c["rootfs"]["diff_ids"]) > 0, \
            (len(m["layers"]), len(c["rootfs"]["diff_ids"]))
        v = self.imgbuild("verify", f"{self.repo}:tiny-cpu")
        assert v.returncode == 0, f"verify: exit {v.returncode}: {(v.stdout + v.stderr)[-1200:]}"
        self.digest = digest
        push, build, smoke = doc["push"], doc["build"] or {}, doc["smoke"] or {}
        if self.cache_from:
            assert self.cache_from in build.get("cache_imported", []), build
        return (f"{doc['action']} in {build.get('seconds')} s ({build.get('cached_steps')} of "
                f"{build.get('steps')} steps cached"
                + (f", reusing {self.cache_from}" if self.cache_from else "")
                + f"), smoke {smoke.get('seconds')} s, "
                f"{len(m['layers'])} layers, sent {push['sent_bytes']} B ({push['reused_layers']}"
                f" reused, {push['cached_layers']} from the blob cache); imgbuild "
                f"{doc['seconds']} s in all")

    def push_existing(self) -> str:
        before = manifest_digest(self.repo, self.tag)
        assert before == self.digest, (before, self.digest)
        self.forget()
        # A fresh machine has no blob cache either: every layer comes from the Engine.
        doc = self.ok(self.imgbuild("tiny-cpu", "--push", "--registry", self.repo, "--json",
                                    IMGBUILD_BLOB_CACHE_GB="0"))
        assert doc["action"] == "pulled", doc["action"]
        after = manifest_digest(self.repo, self.tag)
        assert after == before, f"the content tag moved: {before} -> {after}"
        assert manifest_digest(self.repo, "tiny-cpu") == before
        m, c = manifest(self.repo, self.tag), config(self.repo, self.tag)
        assert len(m["layers"]) == len(c["rootfs"]["diff_ids"]), \
            (len(m["layers"]), len(c["rootfs"]["diff_ids"]))
        return f"pulled, pushed again: {before[:19]}… unchanged"

    def pull(self) -> str:
        self.forget()
        doc = self.ok(self.imgbuild("pull", "tiny-cpu", "--registry", self.repo, "--json"))
        assert doc["digest"] == self.digest, (doc["digest"], self.digest)
        assert self.local(self.ref) is not None
        assert self.local(f"{self.repo}:tiny-cpu") is not None  # its report passed: tags moved
        # What a user does next: a plain `docker pull` of the moving tag. imgbuild's pull above
        # is the Engine's own (its API, by digest), so the download is not done twice (about
        # 20 CPU-seconds of an Engine 26 under the containerd store): the client resolves the
        # tag, reads its manifest and config and finds every layer here.
        self.engine.docker("pull", f"{self.repo}:tiny-cpu", check=True)
        img = self.local(f"{self.repo}:tiny-cpu")
        assert img is not None
        c = config(self.repo, self.tag)
        layers = img.attrs["RootFS"].get("Layers") or []
        assert len(layers) == len(c["rootfs"]["diff_ids"]), \
            (len(layers), len(c["rootfs"]["diff_ids"]))
        return ""

    def zstd(self) -> str:
        self.have_image()
        # The image here, under the second repository's content tag: pushed from here in zstd.
        self.local(self.ref).tag(self.zrepo, self.tag)
        doc = self.ok(self.imgbuild("tiny-cpu", "--push", "--registry", self.zrepo,
                                    "--compression", "zstd", "--no-smoke", "--json"))
        assert doc["action"] == "local", doc["action"]
        assert doc["push"]["compression"] == "zstd", doc["push"]
        zdigest = manifest_digest(self.zrepo, self.tag)
        assert doc["pushed"][0] == f"{self.zrepo}:{self.tag}@{zdigest}", doc["pushed"]
        m = manifest(self.zrepo, self.tag)
        assert {layer["mediaType"] for layer in m["layers"]} == {ZSTD_LAYER}, m["layers"]
        self.engine.docker("rmi", f"{self.zrepo}:{self.tag}", check=True)
        r = self.imgbuild("pull", "tiny-cpu", "--registry", self.zrepo, "--json")
        major = int(self.engine.version.split(".")[0])
        if major >= 23:  # the Engine reads zstd
            got = self.ok(r)
            assert got["digest"] == zdigest, (got["digest"], zdigest)
            assert self.local(f"{self.zrepo}:{self.tag}") is not None
            return "pushed in zstd, pulled"
        said = " ".join((r.stdout + r.stderr).split())
        assert r.returncode == 3, f"exit {r.returncode}: {said[-1200:]}"
        err = json.loads(r.stdout)  # --json: the error is the report
        assert err["error"] == "EnvError" and err["exit_code"] == 3, err
        assert "cannot unpack" in err["message"] and "zstd" in err["message"], err
        assert "nothing was downloaded" in err["facts"], err
        assert "Traceback" not in said
        assert not any(d.startswith(self.zrepo + "@") for img in self.images()
                       for d in img.attrs.get("RepoDigests") or []), "a zstd image got in"
        return "pushed in zstd; the pull refused before the download (exit 3)"

    def serve(self) -> str:
        self.have_image()
        client = self.engine.client()

        def served() -> list[str]:
            return [c.name for c in client.containers.list(
                all=True, filters={"label": "imgbuild.run=tiny-cpu"})]

        assert served() == [], f"a container serves tiny-cpu already: {served()}"
        port = free_port()
        env = dict(os.environ, UV_PYTHON_DOWNLOADS="never", HF_HUB_OFFLINE="1") | (
            {"IMGBUILD_WHEELS": WHEELS} if WHEELS else {}) | self.engine.env | self.cache_env
        proc = subprocess.Popen([sys.executable, "-m", "imgbuild.cli", "run", "tiny-cpu",
                                 "--registry", self.repo, "--port", str(port), "--progress",
                                 "plain", "--timeout", "300"], cwd=ROOT, env=env,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        said: list[str] = []
        try:
            assert proc.stdout is not None
            for line in proc.stdout:  # ends when the run does (--timeout bounds it)
                said.append(line)
                if "curl -s" in line or "try" in line:
                    break
            out = "".join(said)
            if "is serving" not in out:
                proc.kill()
                _, err = proc.communicate(timeout=60)
                raise AssertionError(f"never served (exit {proc.returncode}): {out[-600:]} "
                                     f"{' '.join(err.split())[-1200:]}")
            assert f"127.0.0.1:{port}" in out, out
            got = requests.post(f"http://127.0.0.1:{port}/v1/completions", timeout=120,
                                json={"prompt": "The capital of France is",
                                      "max_tokens": 3}).json()
            assert got["usage"]["completion_tokens"] == 3, got
            assert served(), "no container labelled imgbuild.run=tiny-cpu on this Engine"
            proc.send_signal(signal.SIGINT)
            _, err = proc.communicate(timeout=180)
            assert proc.returncode == 130, f"exit {proc.returncode}: {err[-1200:]}"
            assert "ready" in err, err[-1200:]
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
            left = served()
            for name in left:  # what a killed run could not remove
                client.containers.get(name).remove(force=True)
        assert left == [], f"left: {left}"
        return ""

    def no_op(self) -> str:
        self.have_image()
        doc = self.ok(self.imgbuild("tiny-cpu", "--registry", self.repo, "--json"))
        assert doc["action"] == "local" and doc["build"] is None, (doc["action"], doc["build"])
        return ""

    def client_is_26(self) -> str:
        """imgbuild picks the 26 client with buildx (not the 20.10 one with BuildKit built in)."""
        r = subprocess.run([sys.executable, "-c", "from imgbuild.image import daemon; "
                            "d = daemon.cli(); print(d.path, d.version, d.buildkit_env)"],
                           env=os.environ | self.engine.env, capture_output=True, text=True,
                           timeout=120, cwd=ROOT)
        assert r.returncode == 0, r.stderr[-1200:]
        path, version, builtin = r.stdout.split()
        assert path == self.engine.docker_path and int(version.split(".")[0]) >= 23, r.stdout
        assert builtin == "False", r.stdout  # buildx, not DOCKER_BUILDKIT=1
        return f"client {version} on server {self.engine.version}"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class _Held:
    """A persistent Engine 26 to this sequence alone: it empties the Engine, which another
    pytest run on this machine may be using at the same time."""

    def __init__(self, name: str):
        self.path = Path(tempfile.gettempdir()) / f"imgbuild-tests-engine-{name}.lock"

    def __enter__(self):
        self.f = open(self.path, "a")
        fcntl.flock(self.f, fcntl.LOCK_EX)

    def __exit__(self, *exc):
        fcntl.flock(self.f, fcntl.LOCK_UN)
        self.f.close()


@pytest.fixture()
def steps_dir(tmp_path_factory) -> Path:
    """Where each Engine's table goes: the session's tmp dir (a passed test's own tmp_path is
    removed after it: tmp_path_retention_policy)."""
    return tmp_path_factory.getbasetemp() / "engine-steps"


def _engines(name: str) -> tuple[engines.Engine, engines.Engine]:
    if not registry_available():
        pytest.skip(f"skipped: no registry on {REGISTRY_HOST} (make services starts one)")
    shared = engines.get(engines.SHARED)  # the base goes out from it
    return engines.get(name), shared


@pytest.fixture(scope="session")
def pushed_on_engines() -> dict[str, str]:
    """Engine name -> the tiny-cpu image its core path pushed (its content tag), this session."""
    return {}


@pytest.mark.docker
@pytest.mark.parametrize("name", engines.params())
def test_the_core_path_on_each_engine(name, steps_dir, tmp_path, pushed_on_engines):
    engine, shared = _engines(name)
    # The containerd store's first build reuses the classic store's image (both Engine 26, one
    # worker, classic first: tests/engines.py group), as a CI runner reuses the release
    # repository's: torch is built from nothing once, not twice (about 90 CPU-s). Run alone,
    # it builds from nothing. BuildKit 26 does not match 20.10's inline cache (0 of 9 steps).
    cache_from = pushed_on_engines.get(engines.CLASSIC) if name == engines.CONTAINERD else None
    seq = Sequence(engine, shared, steps_dir, tmp_path, name, cache_from=cache_from)
    with _Held(name):
        try:
            seq.run("base", seq.base)
            seq.run("push-empty", seq.push_empty, needs=("base",))
            seq.run("push-existing", seq.push_existing, needs=("push-empty",))
            seq.run("pull", seq.pull, needs=("push-empty",))
            seq.run("zstd", seq.zstd, needs=("base",))
            seq.run("run", seq.serve, needs=("base",))
            seq.run("no-op", seq.no_op, needs=("base",))
        finally:
            seq.clean_up()
    if seq.digest is not None:
        pushed_on_engines[name] = seq.ref
    seq.finish()


@pytest.mark.docker
@pytest.mark.xdist_group(engines.group(engines.CLIENT_MIX))
def test_a_client_newer_than_its_server_builds_and_pushes(steps_dir, tmp_path):
    """The Docker 26 client (buildx) against the 20.10 Engine: a mix users have (a newer
    docker-ce-cli, or Docker's static client, on an older distribution Engine)."""
    engine, shared = _engines(engines.CLIENT_MIX)
    seq = Sequence(engine, shared, steps_dir, tmp_path, "26-client-on-20.10")
    try:
        seq.run("client", seq.client_is_26)
        seq.run("base", seq.base)
        seq.run("push-empty", seq.push_empty, needs=("base", "client"))
    finally:
        seq.clean_up()
    seq.finish()


@pytest.mark.docker
@pytest.mark.slow  # two builds from nothing: about 4 minutes of two cores
@pytest.mark.xdist_group("fresh-engine-26")
def test_a_rebuild_with_no_cache_on_a_fresh_engine_gives_the_same_layers(tmp_path):
    """Where the Engine rewrites the layers' file times (the containerd store, through
    BuildKit's OCI exporter: image/engine.py), tiny-cpu built twice, each time on an Engine
    started empty with no cache read, has the same layers byte for byte (their diff ids), the
    torch install and its bytecode included. Engine 20.10 and the classic store of Engine 26
    cannot (image/engine.py says why); nothing is claimed for them."""
    from .fresh_engine import fresh_engine, missing

    bin_dir = engines.engine26_bin_dir()
    if bin_dir is None:
        pytest.skip("skipped: no Engine 26 installed (make services installs it)")
    if why := missing(bin_dir):
        pytest.skip(f"skipped: {why}")
    if not registry_available():
        pytest.skip(f"skipped: no registry on {REGISTRY_HOST} (make services starts one)")
    repo = f"{REGISTRY_HOST}/imgbuild-test-reproducible-{uuid.uuid4().hex[:8]}"
    shared = engines.get(engines.SHARED)
    Sequence.ok(run_imgbuild("base", "bootstrap", "--base", "debian-bookworm", "--registry",
                             repo, "--json", env=shared.env))
    layers = []
    for _ in range(2):
        with fresh_engine(bin_dir=bin_dir, containerd_store=True) as engine:
            doc = Sequence.ok(run_imgbuild("tiny-cpu", "--registry", repo, "--no-smoke",
                                           "--no-cache-from", "--json", env=engine.env))
            assert doc["action"] == "built" and doc["build"]["cached_steps"] == 0, doc["build"]
            layers.append(engine.client().images.get(doc["content_tag"]).attrs["RootFS"]
                          ["Layers"])
    assert len(layers[0]) == 9 and layers[0] == layers[1]
