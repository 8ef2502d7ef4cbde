"""Bad input answered, faults survived, nothing lost: each case a user met, run as they run it.

Real components throughout: the CLI as a subprocess, uv against a local pypiserver or an
address that refuses, tmpfs mounts for a read-only or full disk (root only; skipped
elsewhere, saying so), real signals.
"""

from __future__ import annotations

import gzip
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from rich.console import Console

from imgbuild.catalog.failures import load_failures
from imgbuild.errors import EnvError, SpecError
from imgbuild.lock.lockfile import LockRequest
from imgbuild.lock.resolve import ensure_lock
from imgbuild.workspace import Workspace

from .conftest import ROOT, run_imgbuild
from .wheelfactory import LocalIndex, WheelSpec, free_port

LOGS = ROOT / "tests" / "fixtures" / "logs"
NVFP4 = {"num_bits": 4, "type": "float", "strategy": "tensor_group", "group_size": 16}


def ct_config(**quant) -> dict:
    q = {"quant_method": "compressed-tensors", "format": "nvfp4-pack-quantized", "ignore": [],
         "config_groups": {"g": {"targets": ["Linear"], "weights": NVFP4,
                                 "input_activations": NVFP4}}}
    q.update(quant)
    return {"architectures": ["LlamaForCausalLM"], "quantization_config": q}


def write_ckpt(d: Path, config: dict, modules: list[str] | None = None) -> Path:
    d.mkdir(parents=True, exist_ok=True)
    (d / "config.json").write_text(json.dumps(config))
    if modules is not None:
        wm = {f"{m}.{t}": "model.safetensors" for m in modules
              for t in ("weight_packed", "weight_scale")}
        (d / "model.safetensors.index.json").write_text(json.dumps({"weight_map": wm}))
    return d


def said(r: subprocess.CompletedProcess) -> str:
    """What the command printed, one space between words, as a reader would quote it."""
    return " ".join((r.stdout + r.stderr).split())


def no_traceback(r: subprocess.CompletedProcess) -> None:
    assert "Traceback" not in r.stdout + r.stderr, r.stderr[-3000:]


@pytest.fixture()
def tmpfs(tmp_path):
    """mount(size, ro=False) -> a fresh tmpfs: a disk that is full or read-only for real."""
    mounted: list[Path] = []

    def mount(size: str = "1m", *, ro: bool = False, seed: dict[str, bytes] | None = None) -> Path:
        d = tmp_path / f"tmpfs{len(mounted)}"
        d.mkdir()
        r = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(d)],
                           capture_output=True, text=True)
        if r.returncode != 0:
            pytest.skip(f"skipped: cannot mount a tmpfs here (needs root): {r.stderr.strip()}")
        mounted.append(d)
        for name, data in (seed or {}).items():
            (d / name).write_bytes(data)
        if ro:
            subprocess.run(["mount", "-o", "remount,ro", str(d)], check=True)
        return d

    yield mount
    for d in mounted:
        subprocess.run(["umount", "-l", str(d)], capture_output=True)


def fill(d: Path) -> None:
    """Take every free byte of d's filesystem."""
    fd = os.open(d / "filler", os.O_WRONLY | os.O_CREAT, 0o644)
    try:
        for size in (65536, 4096, 1):
            try:
                while os.write(fd, b"\0" * size):
                    pass
            except OSError:
                continue
    finally:
        os.close(fd)


# --- check-model: what its reader accepts ---------------------------------------------------

@pytest.mark.parametrize("quant, says", [
    ({"ignore": "lm_head"}, "quantization_config.ignore is str"),
    ({"format": 5}, "quantization_config.format is int 5"),
    ({"config_groups": []}, "quantization_config.config_groups is list"),
    ({"ignore": ["re:(unclosed"]}, "is not a regular expression"),
    ({"config_groups": {"g": {"weights": NVFP4}}}, "config_groups.g.targets is missing"),
    ({"config_groups": {"g": {"targets": "Linear"}}}, "config_groups.g.targets is str"),
    ({"config_groups": {"g": {"targets": ["Linear"], "weights": 4}}},
     "config_groups.g.weights is int"),
    ({"config_groups": {"g": "W4A16"}}, "config_groups.g is str"),
])
def test_a_malformed_quantization_config_is_refused_not_passed(tmp_path, quant, says):
    d = write_ckpt(tmp_path / "ck", ct_config(**quant))
    r = run_imgbuild("check-model", str(d), "--target", "sglang-blackwell")
    no_traceback(r)
    assert r.returncode == 2, r.stdout + r.stderr
    assert "malformed" in said(r) and says in said(r)
    j = run_imgbuild("check-model", str(d), "--target", "sglang-blackwell", "--json")
    assert j.returncode == 2 and json.loads(j.stdout)["exit_code"] == 2
    assert any(says in f for f in json.loads(j.stdout)["facts"])


def test_a_well_formed_config_still_passes(tmp_path):
    # The other side of the check above: a preset group (name -> targets) is compressed-tensors'
    # own shape, and a null ignore is what some savers write.
    d = write_ckpt(tmp_path / "ck", ct_config(ignore=None, config_groups={"NVFP4": ["Linear"]}))
    r = run_imgbuild("check-model", str(d), "--target", "sglang-blackwell")
    no_traceback(r)
    assert r.returncode == 0, r.stdout + r.stderr


@pytest.mark.parametrize("config", [
    {"architectures": ["X"]}, {"quantization_config": None},
    {"quantization_config": {"quant_method": "gptq", "bits": 4}},
    {"quantization_config": {"quant_method": "fp8", "activation_scheme": "dynamic"}},
])
def test_a_checkpoint_that_is_not_compressed_tensors_is_said_so(tmp_path, config):
    d = write_ckpt(tmp_path / "ck", config)
    for extra in ((), ("--json",)):
        r = run_imgbuild("check-model", str(d), "--target", "sglang-blackwell", *extra)
        no_traceback(r)
        assert r.returncode == 0
        assert "nothing" in (r.stdout + r.stderr)


def test_check_model_refuses_a_huge_config_before_reading_it(tmp_path):
    d = tmp_path / "ck"
    d.mkdir()
    with open(d / "config.json", "wb") as f:  # sparse: 65 MiB that take no disk
        f.truncate(65 * 2**20)
    r = run_imgbuild("check-model", str(d), "--target", "sglang-blackwell")
    no_traceback(r)
    assert r.returncode == 2 and "more than check-model reads (64 MiB)" in said(r)


def test_check_model_says_a_config_that_is_not_utf8(tmp_path):
    d = tmp_path / "ck"
    d.mkdir()
    (d / "config.json").write_bytes(json.dumps(ct_config()).encode("utf-16"))
    r = run_imgbuild("check-model", str(d), "--target", "sglang-blackwell")
    no_traceback(r)
    assert r.returncode == 2 and "not UTF-8" in said(r)


def parent_ckpt(tmp_path: Path) -> Path:
    mods = [f"model.layers.{i}.mlp.{p}" for i in range(2) for p in ("gate_proj", "up_proj",
                                                                       "down_proj")]
    return write_ckpt(tmp_path / "ck", ct_config(ignore=["lm_head", "model.layers.0.mlp"]), mods)


def test_fix_into_an_existing_file_or_an_unwritable_place(tmp_path, tmpfs):
    d = parent_ckpt(tmp_path)
    before = (d / "config.json").read_bytes()
    args = ("check-model", str(d), "--target", "sglang-0516-blackwell")
    # Where --fix works, the checkpoint has something to fix (the parent entry).
    ok = run_imgbuild(*args, "--fix", str(tmp_path / "out"))
    assert (tmp_path / "out" / "config.json").is_file(), ok.stdout + ok.stderr
    notes = tmp_path / "notes.txt"
    notes.write_text("mine")
    r = run_imgbuild(*args, "--fix", str(notes))
    no_traceback(r)
    assert r.returncode == 2 and "not a .json" in said(r) and notes.read_text() == "mine"
    ro = tmpfs("1m", ro=True)
    r = run_imgbuild(*args, "--fix", str(ro / "out"))
    no_traceback(r)
    assert r.returncode == 3 and "Read-only file system" in said(r), r.stderr
    r = run_imgbuild(*args, "--fix", str(notes / "below-a-file"))
    no_traceback(r)
    assert r.returncode == 3, r.stderr
    assert (d / "config.json").read_bytes() == before


# --- lock: the index, the disk, signals -----------------------------------------------------

def refusing_url() -> str:
    return f"http://127.0.0.1:{free_port()}/simple"  # nothing listens: connection refused


@pytest.mark.parametrize("command", ["lock", "plan"])
def test_an_unreachable_index_is_the_environment_not_the_requirements(images_copy, command):
    locks = images_copy.parent / "lockfiles"
    for f in locks.glob("tiny-cpu.*"):
        f.unlink()
    url = refusing_url()
    env = {"UV_DEFAULT_INDEX": url, "UV_INDEX_URL": url, "IMGBUILD_WHEELS": ""}
    t = images_copy / "tiny-cpu.yaml"
    t.write_text(t.read_text().replace("https://download.pytorch.org/whl/cpu", url))
    r = run_imgbuild(command, "tiny-cpu", "--images", str(images_copy), "--lockfiles",
                     str(locks), env=env)
    no_traceback(r)
    assert r.returncode == 3, r.stdout + r.stderr
    assert "cannot reach the package index" in said(r) and "--wheels" in said(r)
    assert "relax a requirement" not in said(r)
    assert not list(locks.glob("tiny-cpu.*"))


def test_lock_into_a_read_only_directory_fails_first_and_keeps_the_lock(tmp_path, tmpfs):
    old = (ROOT / "lockfiles" / "tiny-cpu.py3.11-manylinux_2_36-x86_64.txt").read_bytes()
    ro = tmpfs("1m", ro=True, seed={"tiny-cpu.py3.11-manylinux_2_36-x86_64.txt": old})
    t = time.monotonic()
    r = run_imgbuild("lock", "tiny-cpu", "--refresh", "--lockfiles", str(ro), "--json")
    no_traceback(r)
    assert r.returncode == 3
    doc = json.loads(r.stdout)
    assert doc["exit_code"] == 3 and "Read-only file system" in doc["message"]
    # Said before resolving (which takes seconds), not after.
    assert time.monotonic() - t < 30
    assert (ro / "tiny-cpu.py3.11-manylinux_2_36-x86_64.txt").read_bytes() == old


@pytest.fixture(scope="module")
def small_index(tmp_path_factory):
    ix = LocalIndex(tmp_path_factory.mktemp("hardening-index"))
    ix.add(WheelSpec("alpha", "1.0"))
    ix.add(WheelSpec("alpha", "2.0"))
    ix.start()
    yield ix
    ix.stop()


def test_a_full_disk_under_the_lockfiles_keeps_the_previous_lock(small_index, tmpfs,
                                                                   monkeypatch, tmp_path):
    monkeypatch.setenv("UV_INDEX_URL", small_index.url)
    monkeypatch.setenv("UV_CACHE_DIR", str(tmp_path / "uv-cache"))
    d = tmpfs("256k")
    plat = "x86_64-manylinux_2_36"
    first, written = ensure_lock(LockRequest("t", "3.11", plat, ("alpha==1.0",), ()), d)
    assert written
    before = first.path.read_bytes()
    fill(d)
    with pytest.raises(EnvError) as e:
        ensure_lock(LockRequest("t", "3.11", plat, ("alpha==2.0",), ()), d)
    assert "No space left on device" in e.value.message
    assert first.path.read_bytes() == before
    assert sorted(p.name for p in d.iterdir()) == sorted([first.path.name, "filler"])


class HangingIndex:
    """An index that accepts connections and never answers: uv waits on it."""

    def __init__(self):
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(64)
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}/simple"
        self.conns: list[socket.socket] = []
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self):
        while True:
            try:
                self.conns.append(self.sock.accept()[0])
            except OSError:
                return

    def close(self):
        self.sock.close()
        for c in self.conns:
            c.close()


def uv_children(pid: int) -> list[int]:
    out = []
    for p in Path("/proc").iterdir():
        if p.name.isdigit():
            try:
                stat = (p / "stat").read_text()
                cmd = (p / "cmdline").read_bytes()
            except OSError:
                continue
            if int(stat.rsplit(")", 1)[1].split()[1]) == pid and b"uv" in cmd:
                out.append(int(p.name))
    return out


def _lock_against_a_hanging_index(images_copy: Path, scratch: Path,
                                  **popen) -> tuple[subprocess.Popen, HangingIndex]:
    """`imgbuild lock --refresh` whose uv waits on an index that never answers, once uv runs
    (or a minute has passed); the caller closes the index."""
    locks = images_copy.parent / "lockfiles"
    hang = HangingIndex()
    env = dict(os.environ, UV_DEFAULT_INDEX=hang.url, UV_INDEX_URL=hang.url, IMGBUILD_WHEELS="",
               TMPDIR=str(scratch), UV_PYTHON_DOWNLOADS="never")
    p = subprocess.Popen([sys.executable, "-m", "imgbuild.cli", "lock", "sglang-blackwell",
                          "--refresh", "--images", str(images_copy), "--lockfiles", str(locks)],
                         cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         text=True, **popen)
    deadline = time.monotonic() + 60
    while not uv_children(p.pid) and time.monotonic() < deadline:
        time.sleep(0.1)
    return p, hang


@pytest.mark.parametrize("sig, code", [(signal.SIGTERM, 143), (signal.SIGINT, 130)])
def test_a_signal_during_lock_ends_uv_and_removes_the_scratch(images_copy, tmp_path, sig,
                                                               code):
    scratch = tmp_path / "tmp"
    scratch.mkdir()
    locks = images_copy.parent / "lockfiles"
    before = {p.name: p.read_bytes() for p in locks.iterdir()}
    p, hang = _lock_against_a_hanging_index(images_copy, scratch)
    try:
        kids = uv_children(p.pid)
        assert kids, "uv never started"
        assert any(scratch.iterdir())  # uv's scratch directory is there while it runs
        p.send_signal(sig)
        out, err = p.communicate(timeout=60)
    finally:
        p.kill()
        hang.close()
    assert p.returncode == code, err[-2000:]
    assert "Traceback" not in err
    time.sleep(0.2)
    assert not [k for k in kids if Path(f"/proc/{k}").exists()
                and "Z" not in Path(f"/proc/{k}/stat").read_text().split(")")[1][:3]]
    assert not list(scratch.iterdir())
    assert {p.name: p.read_bytes() for p in locks.iterdir()} == before


def test_an_imgbuild_started_with_sigint_ignored_keeps_it_ignored(images_copy, tmp_path):
    """A background job of a script (`imgbuild lock ... &`, nohup) starts with SIGINT ignored,
    so that a Ctrl-C at the terminal that started it does not end it: imgbuild keeps it so.
    SIGTERM still ends it, cleanly."""
    scratch = tmp_path / "tmp"
    scratch.mkdir()
    p, hang = _lock_against_a_hanging_index(
        images_copy, scratch, preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN))
    try:
        assert uv_children(p.pid), "uv never started"
        # The uv runs that wait on the index, seen a moment later: a quick one that was
        # starting then (a version probe) may have ended by itself meanwhile (seen once under
        # a loaded make test).
        time.sleep(0.5)
        kids = uv_children(p.pid)
        assert kids, "uv ended before the index answered"
        p.send_signal(signal.SIGINT)
        time.sleep(2)
        assert p.poll() is None, p.communicate()[1][-2000:]
        # uv goes on too: those waiting on the index end only when told to.
        assert set(uv_children(p.pid)) & set(kids), (kids, uv_children(p.pid))
        p.send_signal(signal.SIGTERM)
        _, err = p.communicate(timeout=60)
    finally:
        p.kill()
        hang.close()
    assert p.returncode == 143 and "Traceback" not in err, err[-2000:]
    assert not list(scratch.iterdir())


# --- arguments and data ----------------------------------------------------------------------

@pytest.mark.parametrize("arch", ["", ",,,", "sm100,", " , sm100"])
def test_an_empty_arch_is_refused_not_ignored(arch):
    r = run_imgbuild("plan", "sglang-blackwell", "--arch", arch)
    no_traceback(r)
    assert r.returncode == 2 and "--arch has an empty entry" in said(r)


# The build must not reach the Engine here, even if --log-dir were checked too late: a socket
# nothing listens on makes that a quick exit 3 (no daemon), never a build on the shared Engine.
NO_ENGINE = {"DOCKER_HOST": "unix:///nonexistent/imgbuild-test.sock"}


def test_the_log_dir_is_made_as_mkdir_p(tmp_path):
    import argparse

    from imgbuild.cli.args import log_dir

    want = tmp_path / "logs" / "today"
    assert log_dir(argparse.Namespace(log_dir=str(want))) == want and want.is_dir()
    assert log_dir(argparse.Namespace(log_dir=str(want))) == want  # there already: fine
    assert list(want.iterdir()) == []  # the writability probe leaves nothing
    assert log_dir(argparse.Namespace(log_dir=None)) is None
    # From the CLI, before the build starts (which here ends at once: no daemon answers).
    later = tmp_path / "new" / "logs"
    r = run_imgbuild("tiny-cpu", "--no-smoke", "--log-dir", str(later), env=NO_ENGINE)
    no_traceback(r)
    assert later.is_dir() and r.returncode == 3 and "no Docker daemon" in said(r), said(r)


@pytest.mark.parametrize("where, says", [
    ("a-file", "it is a file, not a directory"),
    ("a-file/logs", "a part of the path is a file, not a directory"),
    ("", "--log-dir is empty"),
    ("read-only/logs", "Read-only file system"),
])
def test_a_log_dir_that_cannot_be_one_is_refused_before_the_build(tmp_path, tmpfs, where, says):
    (tmp_path / "a-file").write_text("mine")
    if where.startswith("read-only"):
        where = str(tmpfs("64k", ro=True) / "logs")
    elif where:
        where = str(tmp_path / where)
    r = run_imgbuild("tiny-cpu", "--no-smoke", "--log-dir", where, env=NO_ENGINE)
    no_traceback(r)
    assert r.returncode == 2, said(r)
    assert says in said(r) and "leave --log-dir out" in said(r), said(r)
    assert (tmp_path / "a-file").read_text() == "mine"


@pytest.mark.parametrize("versions", [">=0.5.17,<0.5.7", ">=0.5.7,<0.5.7", ">0.5.7,<=0.5.7"])
def test_a_patch_range_no_version_satisfies_is_refused(images_copy, versions):
    y = images_copy / "patches" / "sglang-ct-ignore-exact-match.yaml"
    y.write_text(y.read_text().replace('versions: ">=0.5.7,<0.5.17"', f'versions: "{versions}"'))
    with pytest.raises(SpecError) as e:
        _ = Workspace(images_copy, images_copy.parent / "lockfiles").patches
    assert e.value.key == "versions" and "no version satisfies" in e.value.message
    r = run_imgbuild("plan", "sglang-0516-blackwell", "--images", str(images_copy))
    no_traceback(r)
    assert r.returncode == 2 and "sglang-ct-ignore-exact-match.yaml" in said(r)


# Which engine behaviour (images/checks/engines.yaml) each SGLang failure follows from: the
# versions a failure names must be the versions the table records with that behaviour.
CAUSED_BY = {
    "sglang-mixed-precision-no-scheme": ("activation_gate", "top-level"),
    "sglang-ignore-dequantized-keyerror": ("ignore_matcher", "substring"),
    "sglang-ignore-dequantized-params": ("ignore_matcher", "substring"),
}


@pytest.mark.parametrize("failure", sorted(CAUSED_BY))
def test_failure_ranges_agree_with_the_engine_table(failure):
    from packaging.specifiers import SpecifierSet
    from packaging.version import Version

    ws = Workspace(ROOT / "images", ROOT / "lockfiles")
    fp = next(f for f in load_failures(ROOT / "images").fingerprints if f.id == failure)
    spec = SpecifierSet(dict(fp.applies_to)["sglang"], prereleases=True)
    key, value = CAUSED_BY[failure]
    rules = ws.engines.engines["sglang"].rules[key]
    with_it = {v for r in rules if r.value == value for v in r.checked}
    without = {v for r in rules if r.value != value for v in r.checked}
    assert with_it and all(Version(v) in spec for v in with_it), (fp.applies_to, with_it)
    assert not [v for v in without if Version(v) in spec]
    # The patch that changes the behaviour covers versions the failure names, no others.
    for r in rules:
        if r.value == value and r.patch:
            patch = ws.patches[r.patch]
            for v in r.checked:
                assert Version(v) in SpecifierSet(patch.versions, prereleases=True)


def test_the_no_scheme_failure_does_not_promise_what_fix_does_not_do():
    fp = next(f for f in load_failures(ROOT / "images").fingerprints
              if f.id == "sglang-mixed-precision-no-scheme")
    assert "writes a corrected config" not in fp.fix
    assert "--fix` leaves its format alone" in " ".join(fp.fix.split())


# --- doctor: how the log comes ----------------------------------------------------------------

def diagnosis_ids(r: subprocess.CompletedProcess) -> list[str]:
    return [d["id"] for d in json.loads(r.stdout)["diagnoses"]]


@pytest.mark.parametrize("encode", [
    lambda b: b.decode().encode("utf-16"),
    lambda b: b.decode().encode("utf-16-le"),
    lambda b: b.decode().encode("utf-16-be"),
    lambda b: b"\xef\xbb\xbf" + b,
    gzip.compress,
    lambda b: gzip.compress(b.decode().encode("utf-16")),
], ids=["utf16-bom", "utf16le", "utf16be", "utf8-bom", "gzip", "gzip-utf16"])
def test_doctor_reads_the_log_however_it_was_saved(tmp_path, encode):
    src = (LOGS / "compression-format-missing.log").read_bytes()
    plain = run_imgbuild("doctor", str(LOGS / "compression-format-missing.log"), "--json")
    assert plain.returncode == 1 and diagnosis_ids(plain)
    f = tmp_path / "server.log"
    f.write_bytes(encode(src))
    r = run_imgbuild("doctor", str(f), "--json")
    assert r.returncode == 1 and diagnosis_ids(r) == diagnosis_ids(plain)
    piped = subprocess.run([sys.executable, "-m", "imgbuild.cli", "doctor", "-", "--json"],
                           cwd=ROOT, input=encode(src), capture_output=True)
    assert piped.returncode == 1
    assert [d["id"] for d in json.loads(piped.stdout)["diagnoses"]] == diagnosis_ids(plain)


def test_doctor_on_a_truncated_gzip_says_so(tmp_path):
    f = tmp_path / "server.log.gz"
    f.write_bytes(gzip.compress((LOGS / "benign.log").read_bytes() * 50)[:200])
    r = run_imgbuild("doctor", str(f))
    no_traceback(r)
    assert r.returncode == 2 and "cannot read" in said(r)


def peak_rss_kb(args: list[str]) -> int:
    """The peak resident memory of one run of the CLI, measured in a process of its own."""
    probe = ("import resource, subprocess, sys\n"
             "subprocess.run(sys.argv[1:], stdout=subprocess.DEVNULL)\n"
             "print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)\n")
    r = subprocess.run([sys.executable, "-c", probe, sys.executable, "-m", "imgbuild.cli", *args],
                       cwd=ROOT, capture_output=True, text=True, check=True)
    return int(r.stdout.strip())


def test_doctor_memory_stays_flat_in_the_log_size(tmp_path):
    tail = (LOGS / "compression-format-missing.log").read_text()
    line = "[2026-01-01 00:00:00 TP0] INFO an ordinary line of server output, of some length\n"
    small, big = tmp_path / "small.log", tmp_path / "big.log"
    small.write_text(line * 20_000 + tail)  # 1.6 MB
    with open(big, "w") as f:  # 40 MB
        for _ in range(25):
            f.write(line * 20_000)
        f.write(tail)
    a, b = peak_rss_kb(["doctor", str(small)]), peak_rss_kb(["doctor", str(big)])
    # Read whole, 40 MB of text is 40 MB more at least, and held as lines about twice that
    # (an object and a list slot a line); streamed, the peak is the interpreter's and the
    # catalog's, whatever the log's length. (80 MB told the same, at twice the CPU.)
    assert b - a < 20_000, (a, b)


# --- output a user types from -----------------------------------------------------------------

def test_list_in_a_pipe_keeps_every_target_name_whole():
    r = run_imgbuild("list")
    assert r.returncode == 0
    from imgbuild.catalog.catalog import DATA_FILES

    names = sorted(p.stem for p in (ROOT / "images").glob("*.yaml") if p.name not in DATA_FILES)
    listed = {ln.split()[0] for ln in r.stdout.splitlines() if ln.strip()}
    assert set(names) <= listed, set(names) - listed
    assert "…" not in r.stdout


def test_a_narrow_terminal_wraps_the_other_columns_not_the_names():
    from imgbuild.cli.views import table

    c = Console(width=40, force_terminal=True, color_system=None, record=True)
    table(c, "targets", ["target", "engine", "archs"],
          [["sglang-0516-blackwell", "sglang 0.5.16", "sm100 sm120"],
           ["sglang-vllm-blackwell", "sglang 0.5.23", "sm100"]])
    text = c.export_text()
    assert "sglang-0516-blackwell" in text and "sglang-vllm-blackwell" in text
    assert "…" not in text


def test_the_writable_probe_leaves_nothing(tmpfs):
    # The probe that tells a writable directory removes its file.
    from imgbuild.fsutil import check_writable

    d = tmpfs("64k")
    check_writable(d, "lockfiles to")
    assert not list(d.iterdir())



# --- the build and the smoke test: the disk, the daemon, signals -----------------------------

def local_id(client, ref: str) -> str | None:
    try:
        return client.images.get(ref).id
    except Exception:
        return None


@pytest.mark.docker
def test_a_full_disk_under_the_build_context_is_said_and_cleaned(docker_client, tmpfs):
    small = tmpfs("4m")  # uv alone (about 40 MB) does not fit
    r = run_imgbuild("tiny-cpu", "--rebuild", "--no-smoke", env={"TMPDIR": str(small)})
    no_traceback(r)
    assert r.returncode == 3, r.stdout[-2000:] + r.stderr[-2000:]
    assert "cannot write the build context" in said(r) and "No space left" in said(r)
    assert not [p for p in small.iterdir() if p.name.startswith("imgbuild-ctx-")]


def containers_of(client, pid: int, prefix: str = "imgbuild-smoke-") -> list:
    """The containers named PREFIX-* that the imgbuild process `pid` started (their owner
    label), so that tests running beside this one on the same Engine, with smoke containers
    of their own, are not counted. A container that goes (`--rm`) between the Engine's list and
    docker-py's look at it is gone, not an error."""
    from imgbuild.image.daemon import OWNER_LABEL

    return [c for c in client.containers.list(all=True, ignore_removed=True,
                                              filters={"label": f"{OWNER_LABEL}={pid}"})
            if c.name.startswith(prefix)]


@pytest.mark.docker
@pytest.mark.parametrize("sig, code", [(signal.SIGTERM, 143), (signal.SIGINT, 130)])
def test_a_signal_during_the_smoke_test_removes_its_container(docker_client, sig, code):
    built = run_imgbuild("tiny-cpu", "--no-smoke", "--json")
    assert built.returncode == 0, built.stderr[-2000:]
    ref = json.loads(built.stdout)["content_tag"]
    p = subprocess.Popen([sys.executable, "-m", "imgbuild.cli", "smoke", ref], cwd=ROOT,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 120
        while not containers_of(docker_client, p.pid) and \
                time.monotonic() < deadline and p.poll() is None:
            time.sleep(0.1)
        assert containers_of(docker_client, p.pid), "the smoke test never started"
        p.send_signal(sig)
        _, err = p.communicate(timeout=120)
    finally:
        p.kill()
    assert p.returncode == code and "Traceback" not in err, err[-2000:]
    # Gone when imgbuild has exited, not later: its cleanup's `docker rm -f` returns once the
    # container is removed. (Waiting here would pass without any cleanup: the payload ends
    # within seconds and `--rm` removes it.)
    assert not containers_of(docker_client, p.pid)


# The install step of an image build, as it runs on this host inside its container (the
# image's own uv, not the host's, which tests outside the docker marker run beside these).
IN_IMAGE_INSTALL = "/opt/imgbuild-tools/uv pip install"


@pytest.fixture(scope="module")
def own_engine(tmp_path_factory):
    """A Docker Engine of these tests' own (tests/fresh_engine.py), with the tiny-cpu base
    loaded from the shared one, and a project whose tiny-cpu differs from the built-in one in
    its description only: its own content key, so its own build lock. A build on it can be
    interrupted, its daemon restarted and its processes counted without stopping or counting
    any other test's: these tests need not hold the shared Engine alone."""
    from imgbuild.image import base, daemon

    from . import fresh_engine
    from .conftest import checkout_workspace
    from .test_project import cli, project

    if why := fresh_engine.missing():
        pytest.skip(f"skipped: {why}")
    proj = project(tmp_path_factory.mktemp("own-engine") / "p", {
        "images/tiny-cpu.yaml": "extends: tiny-cpu\n"
                                "description: tiny-cpu, for tests/test_hardening.py\n"})
    assert cli("lock", "tiny-cpu", cwd=proj).returncode == 0
    # The base from the catalog, bootstrapped on the shared Engine (reused when there already).
    os_base = checkout_workspace().catalog.base("debian-bookworm")
    base.bootstrap(daemon.client(), os_base)
    docker = daemon.cli().path
    cache = _pushed_from_the_shared_engine(proj)
    with fresh_engine.fresh_engine() as engine:
        subprocess.run(f"{docker} save {os_base.image} | {docker} -H {engine.host} load",
                       shell=True, check=True, capture_output=True)
        yield engine, proj, cache


def _pushed_from_the_shared_engine(proj: Path) -> tuple[str, ...]:
    """`--cache-from` for the reruns below: the project's tiny-cpu built on the shared Engine
    (whose BuildKit holds its steps) and pushed to a repository of these tests' own, so a
    rerun on the fresh Engine takes torch's layer from the registry instead of installing it
    (a minute of the suite's two cores each time). What the reruns check is that the build
    lock and the Engine let the same build run again and complete; the interrupted builds
    above them run with --no-cache. No registry: () and the reruns build from nothing."""
    import uuid

    from .conftest import REGISTRY_HOST, registry_available

    if not registry_available():
        return ()
    repo = f"{REGISTRY_HOST}/imgbuild-test-hardening-{uuid.uuid4().hex[:8]}"
    for args in (("base", "bootstrap", "--base", "debian-bookworm"),
                 ("tiny-cpu", "--no-smoke", "--push")):
        r = run_imgbuild(*args, "--registry", repo, "--json", cwd=proj)
        assert r.returncode == 0, r.stderr[-2000:]
    return ("--cache-from", json.loads(r.stdout)["content_tag"])


def build_in_flight(engine, args: list[str], scratch: Path, cwd: Path) -> subprocess.Popen:
    """`imgbuild ARGS` on `engine`, returned once its `docker build` runs the install step."""
    env = dict(os.environ, TMPDIR=str(scratch), UV_PYTHON_DOWNLOADS="never", HF_HUB_OFFLINE="1",
               DOCKER_HOST=engine.host)
    from .conftest import WHEELS

    if WHEELS:
        env.setdefault("IMGBUILD_WHEELS", WHEELS)
    p = subprocess.Popen([sys.executable, "-m", "imgbuild.cli", *args], cwd=cwd, env=env,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline and p.poll() is None:
        if engine.running(IN_IMAGE_INSTALL):
            return p
        time.sleep(0.1)
    p.kill()
    raise AssertionError("the build never reached its install step: "
                         + (p.stderr.read() if p.stderr else "")[-2000:])


@pytest.mark.docker
def test_sigterm_during_a_build_ends_it_and_frees_the_build_lock(own_engine, tmp_path):
    engine, proj, cache = own_engine
    client = engine.client()
    scratch = tmp_path / "tmp"
    scratch.mkdir()
    before = local_id(client, "imgbuild:tiny-cpu")
    p = build_in_flight(engine, ["tiny-cpu", "--rebuild", "--no-cache", "--no-smoke"], scratch,
                        proj)
    p.send_signal(signal.SIGTERM)
    _, err = p.communicate(timeout=120)
    assert p.returncode == 143 and "Traceback" not in err, err[-2000:]
    deadline = time.monotonic() + 60  # BuildKit cancels the build when its client goes
    while engine.running(IN_IMAGE_INSTALL) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not engine.running(IN_IMAGE_INSTALL)
    assert not list(scratch.iterdir())  # the context and the secrets directory are gone
    assert local_id(client, "imgbuild:tiny-cpu") == before  # no tag moved
    # The build lock went with the process: the same build runs at once, and completes.
    again = run_imgbuild("tiny-cpu", "--no-smoke", *cache, timeout=900, cwd=proj,
                         env={"DOCKER_HOST": engine.host})
    assert again.returncode == 0, again.stderr[-2000:]
    assert "waiting for" not in again.stderr


@pytest.mark.docker
def test_dockerd_restarted_during_a_build_is_exit_3_and_a_rerun_completes(own_engine, tmp_path):
    engine, proj, cache = own_engine
    client = engine.client()
    scratch = tmp_path / "tmp"
    scratch.mkdir()
    before = local_id(client, "imgbuild:tiny-cpu")
    p = build_in_flight(engine, ["tiny-cpu", "--rebuild", "--no-cache", "--no-smoke"], scratch,
                        proj)
    try:
        engine.restart()
        out, err = p.communicate(timeout=300)
    finally:
        p.kill()
    assert p.returncode == 3 and "Traceback" not in err, (out + err)[-3000:]
    assert not list(scratch.iterdir())
    assert local_id(engine.client(), "imgbuild:tiny-cpu") == before
    again = run_imgbuild("tiny-cpu", "--no-smoke", *cache, timeout=900, cwd=proj,
                         env={"DOCKER_HOST": engine.host})
    assert again.returncode == 0, again.stderr[-2000:]


@pytest.mark.docker
def test_two_pushes_of_one_image_run_side_by_side(docker_client, tmp_path):
    """The build lock covers making the image and its smoke test, not the push: while one
    imgbuild is stopped in the middle of uploading tiny-cpu to one registry, another pushes the
    same image to a second registry without waiting for it."""
    from imgbuild.image.registry import Repository, manifest_digest

    from .conftest import WHEELS
    from .registries import Registry

    first, second = Registry(tmp_path / "a").start(), Registry(tmp_path / "b").start()
    held = None
    try:
        env = dict(os.environ, UV_PYTHON_DOWNLOADS="never", HF_HUB_OFFLINE="1",
                   IMGBUILD_BLOB_CACHE_GB="0") | ({"IMGBUILD_WHEELS": WHEELS} if WHEELS else {})
        held = subprocess.Popen([sys.executable, "-m", "imgbuild.cli", "tiny-cpu", "--push",
                                 "--registry", f"{first.host}/imgbuild"], cwd=ROOT, env=env,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        first.wait_for_upload(held)
        os.kill(held.pid, signal.SIGSTOP)  # mid-upload, holding whatever it holds
        try:
            # Waiting for the stopped one would never end: the timeout is the failure.
            other = run_imgbuild("tiny-cpu", "--push", "--registry", f"{second.host}/imgbuild",
                                 "--json", timeout=600)
        finally:
            held.kill()  # the rest of its upload is not what this test is about
            held.wait()
        assert other.returncode == 0, other.stderr[-3000:]
        assert "waiting for" not in other.stderr
        content = json.loads(other.stdout)["content_tag"].rsplit(":", 1)[1]
        assert manifest_digest(Repository.parse(f"{second.host}/imgbuild"), content)
    finally:
        if held is not None and held.poll() is None:
            held.kill()
        first.stop()
        second.stop()


@pytest.mark.docker
@pytest.mark.parametrize("sig, code", [(signal.SIGTERM, 143), (signal.SIGINT, 130)])
def test_a_signal_during_a_push_moves_no_tag_and_a_rerun_completes(docker_client, tmp_path,
                                                                   sig, code):
    from imgbuild.image.registry import Repository, manifest_digest

    from .conftest import WHEELS
    from .registries import Registry

    reg = Registry(tmp_path / "reg").start()
    try:
        repo = f"{reg.host}/imgbuild"
        env = dict(os.environ, UV_PYTHON_DOWNLOADS="never", HF_HUB_OFFLINE="1",
                   # compressed as it goes, not sent from the blob cache: slow enough
                   IMGBUILD_BLOB_CACHE_GB="0") | (
            {"IMGBUILD_WHEELS": WHEELS} if WHEELS else {})
        p = subprocess.Popen([sys.executable, "-m", "imgbuild.cli", "tiny-cpu", "--push",
                              "--registry", repo], cwd=ROOT, env=env, stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True)
        reg.wait_for_upload(p)
        p.send_signal(sig)
        _, err = p.communicate(timeout=300)
        assert p.returncode == code and "Traceback" not in err, err[-2000:]
        r = Repository.parse(repo)
        assert manifest_digest(r, "tiny-cpu") is None  # no moving tag on a partial image
        done = run_imgbuild("tiny-cpu", "--push", "--registry", repo, "--json", timeout=1800)
        assert done.returncode == 0, done.stderr[-3000:]
        content = json.loads(done.stdout)["content_tag"].rsplit(":", 1)[1]
        assert manifest_digest(r, "tiny-cpu") == manifest_digest(r, content) is not None
    finally:
        reg.stop()


SWEEP = """
import importlib, os, subprocess, sys, time, types
m = importlib.import_module("imgbuild.cli.main")  # the module (imgbuild.cli.main is its main())
if sys.argv[1] == "inside":  # a sweep with no pause: its rounds fall inside exec, under load
    m.time = types.SimpleNamespace(sleep=lambda s: None)
m._end_children()  # as a signal does: from now on every child is ended, but clean-up commands
env = dict(os.environ, IMGBUILD_CLEANUP="1")
# In "slow" the child waits 0.1 s between fork and exec, as under load.
wait = (lambda: time.sleep(0.1)) if sys.argv[1] == "slow" else None
killed = sum(subprocess.run(["true"], env=env, preexec_fn=wait).returncode != 0
             for _ in range(int(sys.argv[2])))
t = time.monotonic()
other = subprocess.run(["sleep", "30"])  # no mark: ended by the sweep
print(killed, other.returncode, round(time.monotonic() - t, 1))
"""


def _sweep(window: str, runs: int) -> tuple[int, int, float]:
    r = subprocess.run([sys.executable, "-c", SWEEP, window, str(runs)], cwd=ROOT,
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    killed, other, secs = r.stdout.split()
    return int(killed), int(other), float(secs)


def test_the_sweep_after_a_signal_spares_clean_up_commands_and_ends_the_rest():
    """After Ctrl-C or SIGTERM, imgbuild ends its children (uv, the docker client) from a sweep
    every 50 ms, but not the clean-up commands it starts on the way out (`docker rm -f` of a
    served container). A child read too early lacks the clean-up mark: between fork and exec
    it still has imgbuild's environment, and inside exec, once the new program is named, its
    environment is empty for a moment. Either way a clean-up command was ended (2 of 300
    `docker --version` here; all 20 of these whose exec waits 0.1 s; about 90 of 1000 `true`
    under a pauseless sweep with every core busy), and a served container outlived
    `imgbuild run`."""
    killed, other, secs = _sweep("slow", 20)
    assert killed == 0
    assert other == -signal.SIGTERM and secs < 10
    busy = [subprocess.Popen(["sh", "-c", "while :; do :; done"])
            for _ in range(2 * (os.cpu_count() or 1))]
    try:
        killed, other, secs = _sweep("inside", 1000)
    finally:
        for b in busy:
            b.kill()
            b.wait()
    assert killed == 0
