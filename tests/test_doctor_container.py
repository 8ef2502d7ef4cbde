"""doctor knows where a server's container starts (issue 47): a driver older than the image's
CUDA (the toolkit's refusal, in `docker run`'s own stderr), NVIDIA's libraries not found, a UID
with no passwd entry, caches it cannot write or that do not exist, JIT kernels on a noexec
/tmp, InfiniBand that NCCL cannot use across the nodes. Each answer's fix says what `imgbuild
run` (or `--emit k8s`) does instead. The docker-marked tests provoke two of them live on this
machine's Engine, in an image already here (no build): the doctor names the one, the image's
entrypoint the others before its server starts."""

from __future__ import annotations

import json
import subprocess

import pytest

from imgbuild.catalog.failures import load_failures
from imgbuild.checks import doctor
from imgbuild.plan import render

from .conftest import ROOT

FAILURES = load_failures(ROOT / "images")
LOGS = ROOT / "tests" / "fixtures" / "logs"
CORPUS = ROOT / "tests" / "fixtures" / "corpus"
BY_ID = {fp.id: fp for fp in FAILURES.fingerprints}


def run(text: str) -> tuple[list[doctor.Diagnosis], doctor.LogEngine | None]:
    found: list = []
    diags = doctor.diagnose(text, FAILURES, found)
    return diags, found[0]


def read(path) -> str:
    return doctor.read_log(str(path))[0]


# What each fix says imgbuild does instead: the names `imgbuild run` and `--emit` give them.
WAY_OUT = {
    "driver-older-than-image-cuda": (
        "`imgbuild run` checks the driver against the image's CUDA floor",
        "NVIDIA Container Toolkit is configured for the Engine"),
    "driver-libraries-not-in-container": (
        "`imgbuild run --emit k8s DIR --gke`", "LD_LIBRARY_PATH and PATH name the node's driver "
        "at /usr/local/nvidia"),
    "uid-without-passwd-entry": (
        "`imgbuild run` runs as any UID with group 0",
        "entrypoint sets HOME and USER for a UID without a passwd entry"),
    "cache-dir-not-writable": (
        "`imgbuild run --read-only`", "`imgbuild run --emit k8s` writes an emptyDir for every "
        "cache the engine writes"),
    "cache-dir-missing": ("`imgbuild run` mounts this host's model cache",
                          "`imgbuild run --emit k8s` writes an emptyDir"),
    "jit-noexec-tmp": ("`imgbuild run --read-only` mounts every tmpfs with `exec`",
                       "refuses a read-only run that would leave a JIT or cache directory "
                       "unwritable, naming which"),
    "nccl-rdma-unusable": ("`imgbuild run --emit k8s --rdma`",
                           "NCCL_IB_HCA and NCCL_IB_GID_INDEX"),
}


@pytest.mark.parametrize("fid", sorted(WAY_OUT))
def test_each_fix_says_what_imgbuild_run_does_instead(fid):
    for words in WAY_OUT[fid]:
        assert words in BY_ID[fid].fix, (fid, words)


# --- the driver, as the toolkit says it before any engine runs -----------------------------------

def test_the_toolkits_refusal_is_read_from_docker_runs_stderr_and_names_no_engine():
    diags, engine = run(read(LOGS / "driver-older-than-image-cuda.log"))
    assert engine is None and [d.id for d in diags] == ["driver-older-than-image-cuda"]
    d = diags[0]
    assert d.certain and d.captures == {"cuda": "12.8", "driver_floor": "570.26"}
    assert "no engine ran" in d.cause and "570.26" in d.fix


def test_the_toolkits_refusal_in_an_engines_log_is_still_the_drivers():
    # A pasted log that names vLLM (its banner) does not make the toolkit's words vLLM's.
    text = ("INFO 05-01 10:00:00 [api_server.py:1] vLLM API server version 0.33.0\n"
            + read(LOGS / "driver-older-than-image-cuda.log"))
    diags, engine = run(text)
    assert engine.name == "vllm"
    assert [(d.id, d.certain) for d in diags] == [("driver-older-than-image-cuda", True)]


def test_older_releases_wording_with_spaces_and_a_cuda_without_a_known_floor():
    diags, _ = run(read(CORPUS / "nvidia-docker-536-cuda90-spaces.log"))
    d = diags[0]
    assert d.id == "driver-older-than-image-cuda" and d.captures == {"cuda": "9.0"}
    assert d.occurrences == 2  # the hook's error and the daemon's: one answer
    assert "driver the driver NVIDIA's" in d.cause  # the phrase, not a made-up version


# --- NVIDIA's libraries --------------------------------------------------------------------------

def test_nvml_not_found_explains_no_platform_and_takes_its_line():
    diags, _ = run(read(LOGS / "driver-libraries-not-in-container.log"))
    assert [d.id for d in diags] == ["driver-libraries-not-in-container"]
    assert "related" in [e.role for e in diags[0].evidence]  # no-gpu-visible's line, folded in


def test_nvml_not_found_where_another_platform_runs_is_nothing():
    # On an Ascend machine vLLM probes CUDA too; a platform plugin then runs.
    assert run(read(CORPUS / "vllm-ascend-2416-nvml-debug-outside.log"))[0] == []


def test_libcuda_missing_alone_is_no_finding():
    # A CPU build's import warning: only with the engine's no-platform line is it this failure.
    line = ("WARNING 06-02 09:14:04 [_custom_ops.py:20] Failed to import from vllm._C with "
            "ImportError('libcuda.so.1: cannot open shared object file: No such file or "
            "directory')\n")
    assert run(line)[0] == []


# --- the user, the caches ------------------------------------------------------------------------

def test_a_uid_without_passwd_entry_names_the_uid():
    diags, _ = run("KeyError: 'getpwuid(): uid not found: 1000910000'\n")
    d = diags[0]
    assert d.id == "uid-without-passwd-entry" and "(1000910000)" in d.title
    assert "UID 1000910000" in d.cause and "-e USER=" in d.fix


@pytest.mark.parametrize("line,path", [
    ("PermissionError: [Errno 13] Permission denied: '/.cache'", "/.cache"),
    ("OSError: [Errno 30] Read-only file system: '/model-cache/models--x--y'",
     "/model-cache/models--x--y"),
])
def test_an_unwritable_cache_names_the_path(line, path):
    diags, _ = run(line + "\n")
    assert [(d.id, d.captures["path"]) for d in diags] == [("cache-dir-not-writable", path)]


@pytest.mark.parametrize("line", [
    # a device, not a cache: another cause
    "PermissionError: [Errno 13] Permission denied: '/dev/nvidia0'",
    # a file missing inside a snapshot, not the cache itself missing
    "FileNotFoundError: [Errno 2] No such file or directory: "
    "'/root/.cache/huggingface/hub/models--x--y/snapshots/abc/config.json'",
    # the image's own library under a memory limit, not a JIT build on a noexec mount
    "ImportError: libtorch_cuda.so: failed to map segment from shared object",
])
def test_near_misses_are_not_named(line):
    assert run(line + "\n")[0] == []


def test_a_missing_cache_root_is_named():
    diags, _ = run("FileNotFoundError: [Errno 2] No such file or directory: "
                   "'/data/.cache/huggingface'\n")
    assert [(d.id, d.captures["path"]) for d in diags] == [("cache-dir-missing",
                                                             "/data/.cache/huggingface")]


# --- RDMA against NCCL's own system error: which answer, deliberately ----------------------------

def test_rdma_explains_nccls_system_error_and_only_it_is_named():
    diags, engine = run(read(CORPUS / "nccl-1657-vllm-leader-ece.log"))
    assert engine.name == "vllm"
    assert [d.id for d in diags] == ["nccl-rdma-unusable"]
    d = diags[0]
    related = [e.text for e in d.evidence if e.role == "related"]
    assert any("unhandled system error" in t for t in related)
    # ECE not supported is NCCL's INFO line it goes past: not the evidence
    assert "ibv_set_ece" not in d.evidence[0].text


def test_ncclS_system_error_without_an_ib_failure_stays_the_shared_memory_answer():
    diags, _ = run(read(LOGS / "nccl-shm.log"))
    assert [d.id for d in diags] == ["nccl-system-error"]


def test_another_verbs_error_is_not_the_missing_device():
    assert run(read(CORPUS / "nccl-tests-185-unreachable-outside.log"))[0] == []


# --- live, on this machine's Engine (an image already here; no build) ----------------------------

def _local_image() -> str | None:
    """A tiny-cpu image already in the Engine (the demo's, or one the image tests built)."""
    r = subprocess.run(["docker", "images", "--format", "{{.Repository}}:{{.Tag}}"],
                       capture_output=True, text=True, timeout=60)
    refs = [ref for ref in r.stdout.split() if "tiny-cpu" in ref and "<none>" not in ref]
    return min(refs, key=lambda ref: (not ref.startswith("imgbuild:"), len(ref)), default=None)


@pytest.fixture(scope="module")
def image(docker_client) -> str:
    ref = _local_image()
    if ref is None:
        pytest.skip("no tiny-cpu image in this Engine (make demo builds one)")
    return ref


@pytest.mark.docker
def test_a_jit_library_on_dockers_default_tmpfs_is_named_by_the_doctor(image):
    # The image has no compiler: its own _ctypes library, copied where torch's extensions go
    # under HOME=/tmp/home, stands for a JIT-built one. Docker's `--tmpfs /tmp` is noexec.
    script = ('d=$HOME/.cache/torch_extensions/probe; mkdir -p "$d" && cp "$(python -c '
              '"import _ctypes; print(_ctypes.__file__)")" "$d/probe.so" && python -c '
              '"import ctypes, os; ctypes.CDLL(os.path.expanduser(\'~/.cache/torch_extensions/'
              'probe/probe.so\'))"')
    r = subprocess.run(["docker", "run", "--rm", "--read-only", "--tmpfs", "/tmp", "--user",
                        "12345:0", "--entrypoint", "sh", image, "-c", script],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode != 0
    diags, _ = run(r.stdout + r.stderr)
    assert [d.id for d in diags] == ["jit-noexec-tmp"], r.stderr
    assert diags[0].captures["so"] == "/tmp/home/.cache/torch_extensions/probe/probe.so"


@pytest.mark.docker
def test_the_images_entrypoint_says_the_doctors_sentences_before_the_server(image, tmp_path):
    # The working tree's payload over the image's (the image predates it): the entrypoint, as
    # UID 12345 with no user name, on a read-only root with Docker's noexec /tmp, HF_HOME under
    # root's home. It warns in the catalog's words and starts the server all the same.
    payload = ROOT / "imgbuild" / "payload"
    (tmp_path / "entrypoint.sh").write_text(render.entrypoint_sh())
    mounts = [f"{payload / name}:{render.ASSETS}/{name}:ro"
              for name in ("preflight.py", "anyuser.py", "doctor-sentences.json")]
    mounts.append(f"{tmp_path / 'entrypoint.sh'}:{render.ASSETS}/entrypoint.sh:ro")
    cmd = ["docker", "run", "--rm", "--user", "12345:0", "--read-only", "--tmpfs", "/tmp",
           "-e", "USER=", "-e", "LOGNAME=", "-e", "HF_HOME=/root/.cache/huggingface"]
    for m in mounts:
        cmd += ["-v", m]
    r = subprocess.run([*cmd, "--entrypoint", "sh", image, f"{render.ASSETS}/entrypoint.sh",
                        "echo", "SERVER STARTED"], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    out = r.stdout
    assert out.rstrip().endswith("SERVER STARTED")
    sentences = json.loads((payload / "doctor-sentences.json").read_text())
    for fid in sentences:
        assert f"imgbuild doctor: {fid}: " in out, (fid, out)
    said = " ".join(out.split())  # the table wraps its details
    assert "uid 12345 has no passwd entry" in said
    assert "not writable: HF_HOME: read-only file system at /root" in said
    assert "on /tmp, mounted noexec" in said
    assert "{" not in out.split("imgbuild doctor:", 1)[1]  # every template filled
