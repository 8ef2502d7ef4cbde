"""`imgbuild run` (pipeline/run.py, image/launch.py): a model to a serving endpoint on this host.

Here there is no GPU, so the real path is run with the CPU image: tiny-cpu's server
(payload/serve.py, transformers on CPU) is started as `docker run` from the Launch, watched
through its phases until /health and /v1/models answer, asked for a completion, and stopped
by Ctrl-C, leaving no container. The failure path runs a server that cannot load its model:
the doctor reads its log. The headline image without a GPU is the slow test at the end."""

from __future__ import annotations

import json
import os
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import requests

from . import engines
from .conftest import ROOT, WHEELS


def env(**extra: str) -> dict:
    e = dict(os.environ)
    e.setdefault("UV_PYTHON_DOWNLOADS", "never")
    e["HF_HUB_OFFLINE"] = "1"
    if WHEELS:
        e.setdefault("IMGBUILD_WHEELS", WHEELS)
    return e | extra


def imgbuild(*args: str, cwd: Path = ROOT, timeout: int = 900, **extra: str):
    return subprocess.run([sys.executable, "-m", "imgbuild.cli", *args], cwd=cwd,
                          env=env(**extra), capture_output=True, text=True, timeout=timeout)


def containers(label_value: str) -> list[str]:
    r = subprocess.run(["docker", "ps", "-a", "--filter", f"label=imgbuild.run={label_value}",
                        "--format", "{{.Names}}"], capture_output=True, text=True, timeout=60)
    return r.stdout.split()


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# --- without Docker ---------------------------------------------------------------------------

def test_dry_run_prints_the_docker_line_and_starts_nothing():
    r = imgbuild("run", "sglang-blackwell", "--model", "k2.6", "--dry-run", "--port", "31000")
    assert r.returncode == 0, r.stderr[-2000:]
    argv = shlex.split(r.stdout)
    assert argv[:2] == ["docker", "run"]
    image = next(i for i, a in enumerate(argv) if a.startswith("imgbuild:sglang-blackwell-k2.6-"))
    flags, command = argv[2:image], argv[image + 1:]
    pairs = set(zip(flags, flags[1:]))
    assert {("--gpus", "all"), ("--ipc", "host"), ("-p", "31000:30000"),
            ("--ulimit", "memlock=-1")} <= pairs
    assert ("-v", "/root/.cache/huggingface:/cache/huggingface:rw") in pairs or any(
        f.endswith(":/cache/huggingface:rw") for f in flags)
    assert command[:3] == ["python3", "-m", "sglang.launch_server"]
    assert ("--tp", "8") in set(zip(command, command[1:]))
    assert "kimi_k2" in command  # the profile's engine flags
    # Nothing started: this test is not marked docker, so tests/docker_guard.py fails it if
    # the dry run so much as touches the Engine's socket.


def test_run_names_what_it_does_not_know():
    r = imgbuild("run", "no-such-thing", "--dry-run")
    said = " ".join(r.stderr.split())
    assert r.returncode == 2 and "neither a target nor a model profile" in said
    assert "Traceback" not in said
    r = imgbuild("run", "tiny-cpu", "--emit", "helm", "/tmp/x")
    assert r.returncode == 2 and "--emit helm" in r.stderr


def test_emit_writes_compose_and_kubernetes_files(tmp_path):
    r = imgbuild("run", "sglang-blackwell", "--model", "k2.6", "--emit", "k8s",
                 str(tmp_path / "k8s"), "--json")
    assert r.returncode == 0, r.stderr[-2000:]
    doc = json.loads(r.stdout)
    assert doc["status"] == "emitted" and doc["files"]
    assert all(Path(f).is_file() for f in doc["files"])
    r = imgbuild("run", "tiny-cpu", "--emit", "compose", str(tmp_path / "c"), "--json")
    assert r.returncode == 0, r.stderr[-2000:]
    assert any(f.endswith((".yaml", ".yml")) for f in json.loads(r.stdout)["files"])


def test_a_gpu_model_on_a_host_without_gpus_is_refused_before_anything_starts(tmp_path):
    """No nvidia-smi here: the fit says so, exit 3, nothing started."""
    r = imgbuild("run", "k2.6", "--nvidia-smi", str(tmp_path / "no-nvidia-smi"))
    said = " ".join(r.stderr.split())
    assert r.returncode == 3, said
    assert "no NVIDIA GPU visible" in said and "Traceback" not in said


FIXTURES = ROOT / "tests" / "fixtures" / "nvidia-smi"


def recorded_nvidia_smi(tmp_path: Path, host: str) -> Path:
    """An nvidia-smi that answers imgbuild's two queries with a recorded host's outputs."""
    exe = tmp_path / "nvidia-smi"
    d = FIXTURES / host
    exe.write_text("#!/bin/sh\ncase \"$*\" in\n"
                   f"  *--query-gpu=*) cat '{d / 'gpus.csv'}';;\n"
                   f"  *--query-compute-apps=*) cat '{d / 'apps.csv'}' 2>/dev/null;;\n"
                   "  *) exit 2;;\nesac\n")
    exe.chmod(0o755)
    return exe


def test_a_model_alone_is_served_by_the_target_that_fits_the_recorded_host(tmp_path):
    smi = recorded_nvidia_smi(tmp_path, "rtx-pro-6000-8x-ok")
    r = imgbuild("run", "k2.6", "--nvidia-smi", str(smi), "--dry-run", "--progress", "plain")
    assert r.returncode == 0, r.stderr[-2000:]
    assert "imgbuild:sglang-blackwell-k2.6-" in r.stdout
    said = r.stderr
    assert "chosen: sglang-blackwell (linux/amd64): exact SASS match" in said
    assert "no: sglang-hopper (linux/amd64): sm90 code, none runs on sm120" in said
    assert "no: tiny-cpu (linux/amd64): CPU target" in said


@pytest.mark.parametrize("host, code, words", [
    ("h100-8x-sm90", 3, ["driver 565.57.01", "then 'sglang-hopper' fits"]),
    ("b200-8x-driver-570", 3, ["host has 570.133.20", "580.65.06"]),
])
def test_a_host_no_target_fits_is_refused_with_the_facts(tmp_path, host, code, words):
    smi = recorded_nvidia_smi(tmp_path, host)
    r = imgbuild("run", "k2.6", "--nvidia-smi", str(smi), "--dry-run")
    said = " ".join(r.stderr.split())
    assert r.returncode == code, said
    assert "no target fits this host for model k2.6" in said
    assert all(w in said for w in words), said
    assert r.stdout == "" and "Traceback" not in said


def test_a_busy_gpu_stops_the_run_before_anything_starts(tmp_path):
    """GPU0 held by a stale process: the run (not a dry run) is refused, naming it; the guard
    fails this test (not marked docker) if the refusal came after touching the Engine."""
    smi = recorded_nvidia_smi(tmp_path, "rtx-pro-6000-8x-stale-gpu0")
    r = imgbuild("run", "sglang-blackwell", "--model", "k2.6", "--nvidia-smi", str(smi),
                 "--model-dir", str(tmp_path))
    said = " ".join(r.stderr.split())
    assert r.returncode == 3, said
    assert "fits this host, but the host is busy" in said
    assert "GPU0 has 55.0 GiB in use (pid 2841907" in said


# --- with Docker: the CPU image serves ---------------------------------------------------------

@pytest.fixture(scope="module")
def tiny_image(docker_client) -> str:
    """tiny-cpu built here (the demo's image, or built now)."""
    r = imgbuild("tiny-cpu", "--json", timeout=1800)
    assert r.returncode == 0, r.stderr[-3000:]
    return json.loads(r.stdout)["content_tag"]


@pytest.mark.docker
def test_the_dry_run_line_runs_as_printed(tiny_image):
    port = free_port()
    r = imgbuild("run", "tiny-cpu", "--dry-run", "--port", str(port))
    assert r.returncode == 0, r.stderr[-2000:]
    argv = shlex.split(r.stdout)
    name = argv[argv.index("--name") + 1] if "--name" in argv else None
    assert name, argv
    # The line as a user pastes it, detached so the test can talk to it.
    started = subprocess.run([argv[0], argv[1], "-d", *argv[2:]], capture_output=True,
                             text=True, timeout=300)
    try:
        assert started.returncode == 0, started.stderr
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline:
            try:
                if requests.get(f"http://127.0.0.1:{port}/health", timeout=2).ok:
                    break
            except requests.RequestException:
                time.sleep(1)
        models = requests.get(f"http://127.0.0.1:{port}/v1/models", timeout=10).json()
        assert models["data"], models
        got = requests.post(f"http://127.0.0.1:{port}/v1/completions", timeout=120,
                            json={"prompt": "hello", "max_tokens": 4}).json()
        assert got["usage"]["completion_tokens"] == 4
    finally:
        subprocess.run(["docker", "rm", "-f", name], capture_output=True, timeout=120)


def _served_name() -> str:
    r = imgbuild("run", "tiny-cpu", "--dry-run")
    assert r.returncode == 0, r.stderr[-2000:]
    argv = shlex.split(r.stdout)
    return argv[argv.index("--name") + 1]


@pytest.mark.docker
@pytest.mark.parametrize("whose", ["a user's, running", "an earlier run's, exited"])
def test_a_container_holding_the_name_is_named_and_left_alone(docker_client, tiny_image, whose):
    """The served container's name is taken: by a container of the user's (no imgbuild label)
    or by one an earlier `imgbuild run` left (kept, or its imgbuild killed). The run refuses
    before starting anything, says which and what to do, and the container is still there:
    removing it would end a user's container or lose the log the user kept."""
    name = _served_name()
    ours = whose.startswith("an earlier")
    c = docker_client.containers.run(tiny_image, entrypoint=["sh", "-c", "exit 3" if ours
                                                             else "sleep 600"],
                                     name=name, detach=True,
                                     labels={"imgbuild.run": "tiny-nvfp4"} if ours else {})
    try:
        if ours:
            c.wait(timeout=60)
        r = imgbuild("run", "tiny-cpu", "--port", str(free_port()), timeout=300)
        said = " ".join(r.stderr.split())
        assert r.returncode == 2 and "Traceback" not in said, said[-2000:]
        assert f"cannot start {name}" in said
        if ours:
            assert "a container of an earlier `imgbuild run` holds the name" in said
            assert "exited, exit code 3" in said and f"`docker logs {name}`" in said
        else:
            assert "a container imgbuild did not start has that name" in said
            assert f"docker rename {name}" in said
        c.reload()
        assert c.status == ("exited" if ours else "running")
    finally:
        c.remove(force=True)


@pytest.mark.docker
def test_run_serves_until_ctrl_c_and_leaves_no_container(tiny_image):
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "imgbuild.cli", "run", "tiny-cpu", "--port",
                             str(port), "--progress", "plain"], cwd=ROOT, env=env(),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    out_lines: list[str] = []
    try:
        deadline = time.monotonic() + 600
        while time.monotonic() < deadline:
            line = proc.stdout.readline()
            if not line:
                break
            out_lines.append(line)
            if "curl -s" in line or "try" in line:
                break
        said = "".join(out_lines)
        assert "is serving" in said and f"127.0.0.1:{port}" in said, said
        got = requests.post(f"http://127.0.0.1:{port}/v1/completions", timeout=120,
                            json={"prompt": "The capital of France is", "max_tokens": 3}).json()
        assert got["choices"][0]["text"] is not None
        # A second run of the same model while this one serves: refused before starting.
        r = imgbuild("run", "tiny-cpu", "--port", str(free_port()))
        assert r.returncode == 2 and "already served here" in r.stderr, r.stderr[-2000:]
        assert containers("tiny-nvfp4") or containers("tiny-cpu")
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=180)
        assert proc.returncode == 130, err[-2000:]
        assert "preflight: ran on this host" in err and "IMGBUILD_PREFLIGHT=0" in err
        assert "loading weights" in err and "ready" in err  # the phases, as they came
    finally:
        if proc.poll() is None:
            proc.kill()
    assert containers("tiny-nvfp4") == [] and containers("tiny-cpu") == []


@pytest.mark.docker
def test_a_server_that_dies_after_it_served_ends_the_run_with_its_log(tiny_image):
    """Ready, then killed from outside: the run ends (exit 1) with the server's last lines,
    and removes what is left of the container."""
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "imgbuild.cli", "run", "tiny-cpu", "--port",
                             str(port), "--json"], cwd=ROOT, env=env(),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline and proc.poll() is None:
            try:
                if requests.get(f"http://127.0.0.1:{port}/v1/models", timeout=2).ok:
                    break
            except requests.RequestException:
                time.sleep(1)
        names = containers("tiny-cpu")
        assert names, "no container serving"
        subprocess.run(["docker", "kill", names[0]], capture_output=True, timeout=60)
        out, err = proc.communicate(timeout=180)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 1, err[-2000:]
    doc = json.loads(out)
    assert doc["status"] == "exited" and doc["container_exit"] == 137
    assert any("serve: ready" in line for line in doc["log_tail"])
    assert containers("tiny-cpu") == []


@pytest.mark.docker
def test_a_server_that_never_answers_is_read_by_the_doctor(tiny_image, tmp_path):
    """A model the container cannot have (a hub id, offline, no cache mounted): the server
    dies loading it, and the run ends with the doctor's reading of its log, exit 1, no
    container left."""
    proj = tmp_path / "p"
    (proj / "images" / "models").mkdir(parents=True)
    (proj / "imgbuild.yaml").write_text("{}\n")
    (proj / "images" / "models" / "hub.yaml").write_text(
        "checkpoint: Qwen/Qwen3-0.6B\nsize_gb: 1.2\ntensor_parallel: 1\nquantization: {}\n")
    r = imgbuild("tiny-cpu", "--model", "hub", "--json", cwd=proj, timeout=1800)
    assert r.returncode == 0, r.stderr[-3000:]  # its image: the labels name the model
    r = imgbuild("run", "tiny-cpu", "--model", "hub", "--port", str(free_port()), "--json",
                 "--model-cache", str(tmp_path / "empty-cache"), cwd=proj, timeout=900)
    assert r.returncode == 1, r.stdout[-2000:] + r.stderr[-2000:]
    doc = json.loads(r.stdout)
    assert doc["status"] == "exited"
    ids = [d["id"] for d in doc["doctor"]["diagnoses"]]
    assert ids and ids[0] == "hf-model-not-cached", ids
    assert containers("hub") == []


# --- the headline image, no GPU (11 GB) --------------------------------------------------------

@pytest.mark.slow
@pytest.mark.docker
def test_the_headline_image_without_a_gpu_ends_with_the_doctors_diagnosis(docker_client):
    """SGLang 0.5.23 starts for real and stops for want of a GPU; the run says why (the
    doctor's no-gpu-visible), exit 1, no container left. The image's own preflight is let
    through (--no-preflight), as a user may."""
    r = imgbuild("sglang-blackwell", "--model", "tiny-nvfp4", "--json", timeout=3600)
    assert r.returncode == 0, r.stderr[-3000:]
    r = imgbuild("run", "sglang-blackwell", "--model", "tiny-nvfp4", "--no-preflight",
                 "--port", str(free_port()), "--json", "--timeout", "600", timeout=900)
    assert r.returncode == 1, r.stdout[-2000:] + r.stderr[-2000:]
    doc = json.loads(r.stdout)
    assert doc["status"] == "exited"
    assert doc["doctor"]["diagnoses"][0]["id"] == "no-gpu-visible"
    assert any("No accelerator" in line for line in doc["log_tail"])
    assert containers("tiny-nvfp4") == []


def test_a_container_that_could_not_be_removed_is_reported(monkeypatch):
    """`imgbuild run` removes its container on the way out; when `docker rm -f` fails (the
    daemon went away) the caller is told why, to warn that a served container may still hold
    its GPU and port, instead of the failure passing in silence."""
    from imgbuild.image import launch

    monkeypatch.setenv("DOCKER_HOST", "unix:///nonexistent/docker.sock")
    said = launch.remove("imgbuild-run-gone")
    assert said and "Cannot connect to the Docker daemon" in said


@pytest.mark.docker
def test_removing_a_container_that_runs_or_is_gone_is_no_failure(docker_client, tiny_image):
    from imgbuild.image import launch

    name = f"imgbuild-test-rm-{os.getpid()}"
    docker_client.containers.run(tiny_image, entrypoint=["sleep", "60"], name=name,
                                 detach=True)
    assert launch.remove(name) is None
    assert not docker_client.containers.list(all=True, filters={"name": name})
    assert launch.remove(name) is None  # already gone: `docker rm -f` says so and exits 0


# --- read-only root ------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def tiny_local(docker_client) -> str:
    """tiny-cpu's image by its content tag, where this host has it: these tests build nothing."""
    r = imgbuild("run", "tiny-cpu", "--dry-run", "--json")
    assert r.returncode == 0, r.stderr[-2000:]
    ref = shlex.split(json.loads(r.stdout)["docker_run"])
    image = next(a for a in ref if a.startswith("imgbuild:tiny-cpu-"))
    try:
        docker_client.images.get(image)
    except Exception:
        pytest.skip(f"{image} is not on this host (`imgbuild tiny-cpu` builds it)")
    return image


def _created_since(since: float) -> list[str]:
    """Containers the Engine created since `since` (epoch seconds), whoever created them."""
    r = subprocess.run(["docker", "events", "--since", str(int(since)), "--until",
                        str(int(time.time()) + 1), "--filter", "type=container", "--filter",
                        "event=create", "--format", "{{.Actor.Attributes.name}}"],
                       capture_output=True, text=True, timeout=60)
    return r.stdout.split()


@pytest.mark.docker
def test_a_read_only_run_with_a_cache_on_the_root_is_refused_before_anything_starts(tiny_local):
    since = time.time() - 1
    # --detach: were the refusal gone, the run would return once serving, not block.
    r = imgbuild("run", "tiny-cpu", "--read-only", "--env", "TRITON_CACHE_DIR=/opt/triton",
                 "--port", str(free_port()), "--detach", timeout=300)
    if r.returncode == 0:
        subprocess.run(["docker", "rm", "-f", "imgbuild-tiny-nvfp4"], capture_output=True,
                       timeout=120)
    assert r.returncode == 2, r.stderr[-2000:]
    assert "Traceback" not in r.stderr
    assert "cannot run imgbuild-tiny-nvfp4 --read-only: 1 directory the server writes would " \
           "be read-only" in r.stderr
    assert "TRITON_CACHE_DIR=/opt/triton (set by --env) lies on the read-only root" in r.stderr
    assert "nothing was started" in r.stderr
    assert "imgbuild-tiny-nvfp4" not in _created_since(since)
    assert containers("tiny-nvfp4") == []


@pytest.mark.docker
def test_a_read_only_run_s_tmp_is_exec_and_the_server_serves(tiny_local):
    # The dry run's flags, as printed: a script written to /tmp runs there, the root refuses a
    # write. Docker's bare `--tmpfs /tmp` would be noexec (checked too: what the flag prevents).
    r = imgbuild("run", "tiny-cpu", "--read-only", "--dry-run")
    assert r.returncode == 0, r.stderr[-2000:]
    argv = shlex.split(r.stdout)
    assert ("--tmpfs", "/tmp:rw,exec,nosuid,nodev") in set(zip(argv, argv[1:]))
    flags = [a for a in argv[2:argv.index(tiny_local)] if a != "--rm"]
    flags[flags.index("--name") + 1] += "-probe"
    script = ('grep " /tmp " /proc/mounts; printf "#!/bin/sh\\necho jit-ran\\n" > /tmp/k; '
              'chmod +x /tmp/k && /tmp/k; touch /x 2>/dev/null || echo root-read-only')
    probe = ["docker", "run", "--rm", *flags, "--entrypoint", "sh", tiny_local, "-c", script]
    out = subprocess.run(probe, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    mount = out.stdout.splitlines()[0].split()
    assert mount[1] == "/tmp" and "noexec" not in mount[3].split(","), mount
    assert "jit-ran" in out.stdout and "root-read-only" in out.stdout
    bare = subprocess.run(["docker", "run", "--rm", "--read-only", "--tmpfs", "/tmp",
                           "--entrypoint", "sh", tiny_local, "-c", 'grep " /tmp " /proc/mounts'],
                          capture_output=True, text=True, timeout=120)
    assert "noexec" in bare.stdout.split()[3].split(","), bare.stdout

    # The server itself on a read-only root (its torch writes torchinductor_<user> under /tmp).
    port = free_port()
    r = imgbuild("run", "tiny-cpu", "--read-only", "--detach", "--port", str(port),
                 timeout=300)
    try:
        assert r.returncode == 0, r.stderr[-2000:]
        got = requests.post(f"http://127.0.0.1:{port}/v1/completions", timeout=120,
                            json={"prompt": "hello", "max_tokens": 2}).json()
        assert got["usage"]["completion_tokens"] == 2
        ro = subprocess.run(["docker", "inspect", "--format", "{{.HostConfig.ReadonlyRootfs}} "
                             "{{json .HostConfig.Tmpfs}}", "imgbuild-tiny-nvfp4"],
                            capture_output=True, text=True, timeout=60).stdout
        assert ro.startswith("true ") and '"/tmp":"rw,exec,nosuid,nodev"' in ro, ro
    finally:
        subprocess.run(["docker", "rm", "-f", "imgbuild-tiny-nvfp4"], capture_output=True,
                       timeout=120)


# --- the NVIDIA Container Toolkit --------------------------------------------------------------

@pytest.mark.docker
@pytest.mark.parametrize("name", engines.params((engines.SHARED, engines.CLASSIC)))
def test_a_gpu_host_whose_engine_has_no_toolkit_is_refused_with_the_fix(tmp_path, name):
    """A recorded 8-GPU host (nvidia-smi) against this machine's real Engines, which have no
    NVIDIA Container Toolkit: exit 3 with nvidia-ctk's command, before the image is looked
    for (tiny-nvfp4 on sglang-blackwell: an image this host does not have)."""
    engine = engines.get(name)
    smi = recorded_nvidia_smi(tmp_path, "rtx-pro-6000-8x-ok")
    r = imgbuild("run", "sglang-blackwell", "--model", "tiny-nvfp4", "--nvidia-smi", str(smi),
                 "--model-dir", str(tmp_path), "--port", str(free_port()), **engine.env)
    said = " ".join(r.stderr.split())
    assert r.returncode == 3, said
    assert "its Docker Engine cannot give them to a container: the NVIDIA Container Toolkit " \
           "is not set up for it" in said
    assert f"Docker Engine {engine.version}: runtimes " in said
    assert "nvidia-ctk runtime configure --runtime=docker" in said
    assert "no image for" not in said and "Traceback" not in said
