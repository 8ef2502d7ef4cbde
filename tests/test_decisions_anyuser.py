"""The any-user stage's decisions (payload/anyuser.py) without an image: where each cache is
resolved, what counts as writable, which check passes or fails, how the smoke payload's and
the preflight's outcomes are read, and the exit status. The script runs as it does in the
image: a copy of it in a directory beside the smoke.py / preflight.py it calls, here small
scripts that print and exit as told."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from imgbuild.payload import anyuser

SCRIPT = Path(anyuser.__file__)


def test_a_variable_set_wins_over_the_default(monkeypatch, tmp_path):
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.setenv("TRITON_CACHE_DIR", "/x/triton")
    assert anyuser._resolve("TRITON_CACHE_DIR", ".triton/cache", "u") == "/x/triton"
    monkeypatch.delenv("TRITON_CACHE_DIR")
    assert anyuser._resolve("TRITON_CACHE_DIR", ".triton/cache", "u") == \
        str(tmp_path / "home" / ".triton" / "cache")
    monkeypatch.setenv("TRITON_CACHE_DIR", "")  # empty: unset
    assert anyuser._resolve("TRITON_CACHE_DIR", ".triton/cache", "u") == \
        str(tmp_path / "home" / ".triton" / "cache")
    monkeypatch.delenv("TMPDIR", raising=False)
    assert anyuser._resolve("TMPDIR", "/tmp", "u") == "/tmp"  # absolute: as it is
    monkeypatch.delenv("HOME")
    assert anyuser._resolve("HOME", None, "u") is None


def test_torchinductor_resolves_under_the_temp_dir_by_user(monkeypatch):
    monkeypatch.delenv("TORCHINDUCTOR_CACHE_DIR", raising=False)
    assert anyuser._resolve("TORCHINDUCTOR_CACHE_DIR", None, "alice") == \
        os.path.join(tempfile.gettempdir(), "torchinductor_alice")
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", "/c")
    assert anyuser._resolve("TORCHINDUCTOR_CACHE_DIR", None, "alice") == "/c"


def test_writable_makes_the_directory_and_leaves_no_probe(tmp_path):
    d = tmp_path / "a" / "b"
    assert anyuser._writable(str(d)) is None
    assert d.is_dir() and list(d.iterdir()) == []
    f = tmp_path / "file"
    f.write_text("x")
    why = anyuser._writable(str(f / "sub"))
    assert why is not None and why.endswith(f"({f / 'sub'})") and "Error" in why


def _env(tmp_path: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in {c[1] for c in anyuser.CACHES}}
    env["HOME"] = str(tmp_path / "home")
    env["TMPDIR"] = str(tmp_path / "tmp")
    return env | extra


def test_every_cache_is_checked_and_an_unset_home_fails(monkeypatch, tmp_path):
    for k, v in _env(tmp_path).items():
        monkeypatch.setenv(k, v)
    for _n, var, _d in anyuser.CACHES:
        if var not in ("HOME", "TMPDIR"):
            monkeypatch.delenv(var, raising=False)
    checks = anyuser.check(None)
    names = [c["name"] for c in checks]
    assert names[0] == "user"
    assert names[1:1 + len(anyuser.CACHES)] == [f"writable:{n}" for n, _v, _d in anyuser.CACHES]
    by = {c["name"]: c for c in checks}
    assert all(c["status"] == "pass" for c in checks if c["name"].startswith("writable:"))
    assert by["writable:home"]["reason"] == f"HOME={tmp_path / 'home'}"
    assert by["writable:hf"]["reason"] == \
        f"{tmp_path / 'home' / '.cache' / 'huggingface'} (HF_HOME unset: the default)"
    assert (tmp_path / "home" / ".deep_gemm").is_dir()
    monkeypatch.delenv("HOME")
    by = {c["name"]: c for c in anyuser.check(None)}
    assert by["writable:home"] == {"name": "writable:home", "status": "fail",
                                   "reason": "HOME is not set"}
    # A cache under a file cannot be made: that check fails, the others still pass.
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    (tmp_path / "blocker").write_text("")
    monkeypatch.setenv("NUMBA_CACHE_DIR", str(tmp_path / "blocker" / "numba"))
    by = {c["name"]: c for c in anyuser.check(None)}
    assert by["writable:numba"]["status"] == "fail"
    assert by["writable:hf"]["status"] == "pass"


def _stage(tmp_path: Path, *, smoke: str | None = None, preflight: str | None = None) -> Path:
    d = tmp_path / "opt"
    d.mkdir()
    shutil.copy(SCRIPT, d / "anyuser.py")
    if smoke is not None:
        (d / "smoke.py").write_text(smoke)
    if preflight is not None:
        (d / "preflight.py").write_text(preflight)
        (d / "image.json").write_text("{}")
    return d


def _run(d: Path, tmp_path: Path, *args: str) -> tuple[int, dict]:
    r = subprocess.run([sys.executable, str(d / "anyuser.py"), "--json", *args],
                       capture_output=True, text=True, env=_env(tmp_path), timeout=120)
    return r.returncode, json.loads(r.stdout)


def _prints(doc: object, code: int, before: str = "") -> str:
    return (f"import sys, json\nprint({before!r} + json.dumps({doc!r}))\n"
            f"sys.exit({code})\n")


SMOKE_OK = {"ok": True, "stages": [{"name": "versions", "status": "pass"},
                                   {"name": "model", "status": "pass"}]}


def test_all_pass_exits_0(tmp_path):
    d = _stage(tmp_path, smoke=_prints(SMOKE_OK, 0, "a log line before the report\n"))
    code, doc = _run(d, tmp_path, "--", "--model", "m")
    assert code == 0 and doc["ok"] is True
    smoke = next(c for c in doc["checks"] if c["name"] == "smoke")
    assert smoke == {"name": "smoke", "status": "pass", "reason": "versions pass, model pass"}
    assert doc["smoke"]["ok"] is True


@pytest.mark.parametrize("doc, code", [
    (SMOKE_OK, 1),  # said ok, exited 1: a failure
    ({"ok": False, "stages": [{"name": "model", "status": "fail"}]}, 0),
    ({"stages": []}, 0),  # no verdict: not a pass
])
def test_the_smoke_payload_passes_only_when_it_says_ok_and_exits_0(tmp_path, doc, code):
    d = _stage(tmp_path, smoke=_prints(doc, code))
    rc, out = _run(d, tmp_path, "--", "x")
    assert rc == 1 and out["ok"] is False
    assert next(c for c in out["checks"] if c["name"] == "smoke")["status"] == "fail"


def test_a_smoke_payload_without_a_report_fails_with_its_output(tmp_path):
    d = _stage(tmp_path, smoke="import sys\nprint('boom'); sys.stderr.write('Trace: bad\\n')\n"
                               "sys.exit(2)\n")
    rc, out = _run(d, tmp_path, "--", "x")
    assert rc == 1
    said = next(c for c in out["checks"] if c["name"] == "smoke")
    assert said["status"] == "fail" and "boom" in said["reason"] and "Trace: bad" in said["reason"]
    assert out["smoke"] == {"ok": False, "stages": [], "error": "boom\nTrace: bad\n"}


def test_no_smoke_args_no_smoke_check(tmp_path):
    d = _stage(tmp_path)
    code, doc = _run(d, tmp_path)
    assert code == 0 and "smoke" not in doc
    assert not any(c["name"] == "smoke" for c in doc["checks"])
    # Without preflight.py and image.json beside it: no preflight check.
    assert not any(c["name"] == "preflight" for c in doc["checks"])


@pytest.mark.parametrize("code, status, reason", [
    (0, "pass", "ran, exit 0"), (1, "pass", "ran, exit 1"),  # a failed host check: it ran
    (2, "fail", "cannot read facts"), (3, "fail", "cannot read facts")])
def test_the_preflight_as_this_user_is_judged_on_running_not_on_the_host(tmp_path, code, status,
                                                                           reason):
    d = _stage(tmp_path, preflight=f"import sys\nsys.stderr.write('x\\ncannot read facts\\n')\n"
                                   f"sys.exit({code})\n")
    rc, doc = _run(d, tmp_path)
    pre = next(c for c in doc["checks"] if c["name"] == "preflight")
    assert pre == {"name": "preflight", "status": status, "reason": reason}
    assert rc == (0 if status == "pass" else 1)


@pytest.mark.parametrize("module, status", [
    ("import sys\n", "pass"), ("raise ImportError('libcuda.so.1: cannot open')\n", "fail")])
def test_the_engine_import_check_follows_the_import(tmp_path, module, status):
    d = _stage(tmp_path)
    mods = tmp_path / "mods"
    mods.mkdir()
    (mods / "vllm.py").write_text(module)  # found first on PYTHONPATH: this import's outcome
    r = subprocess.run([sys.executable, str(d / "anyuser.py"), "--json", "--engine", "vllm"],
                       capture_output=True, text=True, timeout=120,
                       env=_env(tmp_path, PYTHONPATH=str(mods)))
    doc = json.loads(r.stdout)
    imp = next(c for c in doc["checks"] if c["name"] == "import:vllm")
    assert imp["status"] == status and r.returncode == (0 if status == "pass" else 1)
    if status == "pass":
        assert imp["reason"].endswith(" s")
    else:
        assert imp["reason"] == "ImportError: libcuda.so.1: cannot open"


@pytest.mark.skipif(not hasattr(os, "geteuid") or os.geteuid() != 0,
                    reason="starting a process as another UID needs root")
def test_a_uid_without_a_passwd_entry_fails_the_user_check_and_the_run(tmp_path):
    """As the smoke test runs it: UID 1000770000, group 0, no passwd entry, no USER/LOGNAME."""
    import pwd
    uid = 1000770000
    with pytest.raises(KeyError):
        pwd.getpwuid(uid)
    # The image's python is the one any user runs; here, the system's (the venv's interpreter
    # may lie in root's home, which another UID cannot read). anyuser.py is standard library.
    py = "/usr/bin/python3"
    if not os.access(py, os.X_OK) or os.stat(py).st_mode & 0o001 == 0:
        pytest.skip("no python3 another UID can run")
    top = Path(tempfile.mkdtemp(prefix="anyuser-"))
    try:
        top.chmod(0o777)
        d = top / "opt"
        d.mkdir()
        shutil.copy(SCRIPT, d / "anyuser.py")
        (d / "anyuser.py").chmod(0o644)
        home = top / "home"
        home.mkdir()
        home.chmod(0o777)
        env = {k: v for k, v in _env(tmp_path).items()
               if k not in ("USER", "LOGNAME", "LNAME", "USERNAME")}
        env |= {"HOME": str(home), "TMPDIR": str(home / "tmp")}
        r = subprocess.run([py, "-S", str(d / "anyuser.py"), "--json"],
                           capture_output=True, text=True, env=env, timeout=120, user=uid,
                           group=0, extra_groups=[], cwd=str(top))
        doc = json.loads(r.stdout)
        user = doc["checks"][0]
        assert user["name"] == "user" and user["status"] == "fail", user
        assert "getpass.getuser() failed for uid 1000770000" in user["reason"]
        assert doc["uid"] == uid and doc["gid"] == 0
        # Every cache is writable there: the user check alone fails the run.
        assert all(c["status"] == "pass" for c in doc["checks"][1:]), doc["checks"]
        assert r.returncode == 1 and doc["ok"] is False
        # With USER set (as the image sets it), the same UID passes.
        r = subprocess.run([py, "-S", str(d / "anyuser.py"), "--json"],
                           capture_output=True, text=True, env=env | {"USER": "imgbuild"},
                           timeout=120, user=uid, group=0, extra_groups=[], cwd=str(top))
        assert r.returncode == 0, r.stdout + r.stderr
    finally:
        shutil.rmtree(top, ignore_errors=True)


# --- the same checks in this process (the runs above are the script's, as in the image) -------

@pytest.fixture()
def here(tmp_path, monkeypatch):
    """check() as anyuser.py in a folder of the test's, with its caches under tmp_path."""
    for k, v in _env(tmp_path).items():
        monkeypatch.setenv(k, v)
    for _n, var, _d in anyuser.CACHES:  # set by something else in this process (torch's own)
        if var not in ("HOME", "TMPDIR"):
            monkeypatch.delenv(var, raising=False)
    d = tmp_path / "opt"
    d.mkdir()
    monkeypatch.setattr(anyuser, "__file__", str(d / "anyuser.py"))
    return d


def test_the_user_check_names_who_runs_or_says_what_to_set(here, monkeypatch):
    monkeypatch.setattr(anyuser.getpass, "getuser", lambda: "imgbuild")
    [user] = [c for c in anyuser.check(None) if c["name"] == "user"]
    assert user == {"name": "user", "status": "pass",
                    "reason": f"uid {os.getuid()} gid {os.getgid()} groups "
                              f"{sorted(os.getgroups())}; getpass: imgbuild"}

    def no_entry():
        raise KeyError(f"getpwuid(): uid not found: {os.getuid()}")
    monkeypatch.setattr(anyuser.getpass, "getuser", no_entry)
    checks = anyuser.check(None)
    assert checks[0] == {"name": "user", "status": "fail", "reason": (
        f"getpass.getuser() failed for uid {os.getuid()}: "
        f"KeyError('getpwuid(): uid not found: {os.getuid()}') (set USER or LOGNAME in the "
        "image)")}
    # the caches are still checked, each resolved for that uid
    assert [c["name"] for c in checks[1:]] == [f"writable:{n}" for n, _v, _d in anyuser.CACHES]
    assert all(c["status"] == "pass" for c in checks[1:]), checks
    [inductor] = [c for c in checks if c["name"] == "writable:torchinductor"]
    assert inductor["reason"] == (f"{Path(tempfile.gettempdir()) / f'torchinductor_{os.getuid()}'}"
                                  " (TORCHINDUCTOR_CACHE_DIR unset: the default)")


@pytest.mark.parametrize("code, stderr, status, reason", [
    (0, "", "pass", "ran, exit 0"), (1, "GPU0 is busy\n", "pass", "ran, exit 1"),
    (2, "x\ncannot read facts\n", "fail", "cannot read facts"),
    (3, "", "fail", "exit 3"), (2, "y" * 400 + "\n", "fail", "y" * 300)])
def test_the_preflight_runs_beside_it_only_with_its_facts(here, code, stderr, status, reason):
    assert "preflight" not in [c["name"] for c in anyuser.check(None)]  # neither file
    (here / "preflight.py").write_text(
        "import sys\n"
        "assert sys.argv[1:] == ['--facts', sys.argv[2]] and sys.argv[2].endswith('image.json')\n"
        f"sys.stderr.write({stderr!r})\nsys.exit({code})\n")
    assert "preflight" not in [c["name"] for c in anyuser.check(None)]  # no facts: not run
    (here / "image.json").write_text("{}")
    [pre] = [c for c in anyuser.check(None) if c["name"] == "preflight"]
    assert pre == {"name": "preflight", "status": status, "reason": reason}
    (here / "preflight.py").unlink()
    assert "preflight" not in [c["name"] for c in anyuser.check(None)]  # facts alone: not run


def test_the_engine_is_imported_by_its_module_name(here, monkeypatch, tmp_path):
    mods = tmp_path / "mods"
    mods.mkdir()
    (mods / "fine.py").write_text("")
    (mods / "broken.py").write_text("import sys\nprint('noise', file=sys.stderr)\n"
                                    "raise ImportError('libcuda.so.1: cannot open')\n")
    (mods / "silent.py").write_text("import os\nos._exit(1)\n")
    monkeypatch.setenv("PYTHONPATH", str(mods))
    monkeypatch.setitem(anyuser.ENGINE_MODULE, "a", "fine")
    monkeypatch.setitem(anyuser.ENGINE_MODULE, "b", "broken")
    monkeypatch.setitem(anyuser.ENGINE_MODULE, "c", "silent")
    [ok] = [c for c in anyuser.check("a") if c["name"].startswith("import:")]
    assert ok["name"] == "import:fine" and ok["status"] == "pass"
    assert ok["reason"].endswith(" s") and float(ok["reason"][:-2]) < 60
    [bad] = [c for c in anyuser.check("b") if c["name"].startswith("import:")]
    assert bad == {"name": "import:broken", "status": "fail",
                   "reason": "ImportError: libcuda.so.1: cannot open"}
    [quiet] = [c for c in anyuser.check("c") if c["name"].startswith("import:")]
    assert quiet == {"name": "import:silent", "status": "fail", "reason": "no output"}
    assert not [c for c in anyuser.check(None) if c["name"].startswith("import:")]
