"""Kernel coverage read from wheels: the fat-binary reader against NVIDIA's own cuobjdump on
kernels NVIDIA's nvcc (both from PyPI) compiled here, the arch rules, and a real published
wheel that lacks an arch refusing a target before anything is built."""

from __future__ import annotations

import dataclasses
import json
import os
import re
import shutil
import struct
import subprocess
from pathlib import Path

import pytest

from imgbuild.catalog.kernels import EngineKernels, KernelRule
from imgbuild.errors import InputError
from imgbuild.lock import fatbin, kernels
from imgbuild.plan import coverage

from .conftest import run_imgbuild

# Every kind of entry nvcc writes: arch-specific, family-specific and plain SASS, plain and
# arch-specific PTX.
GENCODES = {
    "sm_90a": "arch=compute_90a,code=sm_90a",
    "sm_100a": "arch=compute_100a,code=sm_100a",
    "sm_100f": "arch=compute_100f,code=sm_100f",
    "sm_120": "arch=compute_120,code=sm_120",
    "compute_120": "arch=compute_120,code=compute_120",
    "sm_89": "arch=compute_89,code=sm_89",
    "compute_103a": "arch=compute_103a,code=compute_103a",
}
KERNEL = ('extern "C" __global__ void axpy(float a, const float *x, float *y, int n) '
          "{ int i = blockIdx.x * blockDim.x + threadIdx.x; if (i < n) y[i] += a * x[i]; }\n")


@pytest.fixture(scope="module")
def cuda_wheels(tmp_path_factory) -> Path:
    """CUDA_HOME from NVIDIA's wheels on PyPI (the devel flavor's toolkit), plus cuobjdump."""
    venv = tmp_path_factory.mktemp("cuda") / "venv"
    env = dict(os.environ, UV_PYTHON_DOWNLOADS="never")
    subprocess.run(["uv", "venv", "-q", "--python", "python3.11", str(venv)], check=True, env=env)
    subprocess.run(["uv", "pip", "install", "-q", "--python", str(venv / "bin" / "python"),
                    "cuda-toolkit[nvcc,cccl,cudart,crt]==13.0.*", "nvidia-cuda-cuobjdump==13.5.37"],
                   check=True, env=env)
    home = next(venv.glob("lib/python*/site-packages/nvidia/cu13"))
    assert (home / "bin" / "nvcc").exists() and (home / "bin" / "cuobjdump").exists()
    return home


def test_the_reader_finds_what_cuobjdump_lists(cuda_wheels, tmp_path):
    src = tmp_path / "k.cu"
    src.write_text(KERNEL)
    so = tmp_path / "k.so"
    cmd = [str(cuda_wheels / "bin" / "nvcc"), "-shared", "-Xcompiler", "-fPIC",
           f"-L{cuda_wheels / 'lib'}", "-o", str(so), str(src)]
    for g in GENCODES.values():
        cmd += ["-gencode", g]
    subprocess.run(cmd, check=True, capture_output=True)
    found = kernels.codes_in(so)
    assert {c.name for c in found} == set(GENCODES)
    listed = subprocess.run([str(cuda_wheels / "bin" / "cuobjdump"), "--list-elf", "--list-ptx",
                             str(so)], capture_output=True, text=True, check=True).stdout
    sass = set(re.findall(r"\.(sm_\d+[af]?)\.cubin", listed))
    ptx = {n.replace("sm_", "compute_") for n in re.findall(r"\.(sm_\d+[af]?)\.ptx", listed)}
    # cuobjdump prints a family-specific cubin (sm_100f) as plain sm_100; the headers keep it.
    assert sass | ptx == {c.name.replace("sm_100f", "sm_100") for c in found}
    # A host-only library and a file that is not ELF carry no GPU code.
    host = tmp_path / "host.so"
    subprocess.run(["cc", "-shared", "-fPIC", "-o", str(host), "-x", "c", "-"], input=b"int f;",
                   check=True)
    assert kernels.codes_in(host) == set()
    (tmp_path / "script.so").write_text("INPUT(-lfoo)\n")
    assert kernels.codes_in(tmp_path / "script.so") == set()


def test_the_scan_does_not_depend_on_how_the_stream_is_cut(cuda_wheels, tmp_path):
    src = tmp_path / "k.cu"
    src.write_text(KERNEL)
    cubin = tmp_path / "k.fatbin"
    subprocess.run([str(cuda_wheels / "bin" / "nvcc"), "-fatbin", "-o", str(cubin), str(src),
                    "-gencode", GENCODES["sm_100a"], "-gencode", GENCODES["compute_120"]],
                   check=True)
    data = cubin.read_bytes()
    want = {"sm_100a", "compute_120"}
    for size in (1, 3, 16, 4096, len(data)):
        got = fatbin.scan(data[i:i + size] for i in range(0, len(data), size))
        assert {c.name for c in got} == want, size
    # Magic bytes by chance, and a header whose entries do not add up, are not fat binaries.
    junk = fatbin.MAGIC + b"\x01\x00\x10\x00" + (10 ** 6).to_bytes(8, "little") + b"\0" * 64
    assert fatbin.scan([junk + data]) == {fatbin.Code.parse(n) for n in want}


@pytest.mark.parametrize("codes,arch,status", [
    (("sm_120a",), "sm120", "sass"),
    (("sm_120a",), "sm121", "none"),  # arch-specific: that arch only (DGX Spark is sm121)
    (("sm_120",), "sm121", "sass"),  # plain SASS: later minors of the major
    (("sm_100f",), "sm103", "sass"),  # family: B300
    (("sm_100f",), "sm110", "none"),  # another major
    (("sm_90",), "sm100", "none"),  # SASS never crosses majors
    (("compute_80",), "sm120", "ptx"),  # PTX: any newer arch, JIT at first launch
    (("compute_103a",), "sm100", "none"),
    (("compute_90", "sm_120"), "sm120", "sass"),  # SASS wins over PTX
])
def test_which_code_runs_on_which_arch(codes, arch, status):
    assert coverage.status_for(codes, arch) == status


def test_a_published_wheel_without_an_arch_refuses_the_target(ws):
    """sgl-flash-mla 1.0.0 (a real wheel on PyPI, in the headline lock) carries SASS for
    Hopper and the B200/B300 family only: required on sm120, it refuses the plan."""
    ref = ws.target("sglang-blackwell")
    lock = ref.lock()
    req = ref.request
    record, scans = kernels.make_record(lock, [("sgl-flash-mla", ())], "test",
                                        python=req.python, platform=req.uv_platform)
    assert [s.package for s in scans] == ["sgl-flash-mla"]
    files = record["packages"]["sgl-flash-mla"]["files"]
    assert {m for m, f in files.items() if f["codes"]} == {
        "flash_mla/_C_legacy.abi3.so", "flash_mla/cuda.abi3.so"}
    assert all(len(f["sha256"]) == 64 for f in files.values())
    rules = EngineKernels("sglang", (KernelRule("sgl-flash-mla", (), (), "MLA decode", True),), ())
    ok = coverage.judge(record, rules, ("sm100",), lock, "test")
    assert dict(ok.table()[0][1]) == {"sgl-flash-mla": "sass"}
    with pytest.raises(InputError) as e:
        coverage.judge(record, rules, ("sm100", "sm120"), lock, "test")
    assert e.value.message.startswith("sgl-flash-mla 1.0.0 carries no GPU code for sm120: "
                                      "flash_mla/")
    assert any("sm_100a" in f and "sm_90a" in f for f in e.value.facts)
    # Limited to the archs that load it, the same rule passes and the table says 'none'.
    limited = EngineKernels("sglang", (KernelRule("sgl-flash-mla", (), ("sm100",), "", True),), ())
    cov = coverage.judge(record, limited, ("sm100", "sm120"), lock, "test")
    assert dict(cov.table()[1][1]) == {}  # not needed on sm120: not judged


def test_plan_refuses_dgx_spark_for_the_headline_lock_before_building():
    # sglang-kernel 0.4.10's sm100/common_ops carries sm_120a (arch-specific): nothing for
    # sm121. Read from the committed record: no network, no Docker.
    r = run_imgbuild("plan", "sglang-blackwell", "--arch", "sm121", "--no-checks")
    assert r.returncode == 2, r.stderr
    err = " ".join(r.stderr.split())
    assert "sglang-kernel 0.4.10 carries no GPU code for sm121: " \
           "sgl_kernel/sm100/common_ops.abi3.so" in err
    assert "sm_120a" in err and "Traceback" not in err
    r = run_imgbuild("plan", "sglang-blackwell", "--json", "--no-checks")
    assert r.returncode == 0, r.stderr
    p = json.loads(r.stdout)
    for arch in ("sm100", "sm120"):
        assert p["kernel_coverage"][arch]["torch"] == "sass"
        assert p["kernel_coverage"][arch]["sglang-kernel"] == "sass"
        assert p["kernel_coverage"][arch]["flashinfer-python"] == "jit"
    assert p["kernel_coverage"]["sm120"]["sgl-flash-mla (shown)"] == "none"
    assert p["labels"]["io.imgbuild.kernels.sm120"].count("=sass") == 2


def test_the_committed_record_is_what_the_wheels_hold(ws):
    """lockfiles/<lock>.kernels.json is read again from PyPI and must match (cached by wheel
    hash: a second run reads nothing)."""
    ref = ws.target("sglang-blackwell")
    rules = ws.kernel_rules["sglang"]
    path = kernels.record_path(ref.lock_path)
    committed = kernels.read_record(path, ref.lock().digest, rules.digest())
    assert committed is not None, f"{path} is stale: run `imgbuild lock sglang-blackwell`"
    fresh, _ = kernels.make_record(ref.lock(), [(r.package, r.files) for r in rules.rules],
                                   rules.digest(), python=ref.request.python,
                                   platform=ref.request.uv_platform)
    assert fresh["packages"] == committed["packages"]


def test_lock_check_reports_a_missing_record(images_copy):
    lockfiles = images_copy.parent / "lockfiles"
    rec = next(lockfiles.glob("sglang-blackwell.*.kernels.json"))
    saved = rec.read_bytes()
    rec.unlink()
    args = ("--images", str(images_copy), "--lockfiles", str(lockfiles))
    r = run_imgbuild("lock", "sglang-blackwell", "--check", *args)
    assert r.returncode == 1, r.stderr
    assert "kernels.json: missing, or not for this lock" in " ".join(r.stdout.split())
    r = run_imgbuild("lock", "sglang-blackwell", *args)
    assert r.returncode == 0, r.stderr
    assert json.loads(rec.read_bytes())["packages"] == json.loads(saved)["packages"]
    shutil.rmtree(lockfiles)


def _record(files: dict) -> dict:
    return {"packages": {"fa": {"version": "3.0", "wheel": "fa-3.0-cp311-linux_aarch64.whl",
                                "files": files}}}


def test_coverages_refusals_word_for_word(ws):
    lock = ws.target("tiny-cpu").lock()
    rule = KernelRule("fa", ("fa/_C*.so",), ("sm100",), "attention", True)
    with pytest.raises(InputError) as e:
        coverage.judge(_record({"fa/other.so": {"codes": ["sm_100a"], "sha256": "0" * 64}}),
                       EngineKernels("sglang", (rule,), ()), ("sm90", "sm100"), lock, "x")
    assert (e.value.message, e.value.facts, e.value.hint) == (
        "fa 3.0 has no fa/_C*.so in its wheel for this platform, needed on sm100",
        ["images/checks/kernels.yaml: fa is required on sm100: attention",
         "fa-3.0-cp311-linux_aarch64.whl has: fa/other.so"],
        "drop sm100 from the target, or pin a fa whose wheel for this platform has it; if the "
        "package moved its libraries, update `files:` in images/checks/kernels.yaml")
    every = KernelRule("fa", (), (), "", True)
    files = {"fa/_C.so": {"codes": ["sm_90a"], "sha256": "1" * 64},
             "fa/_D.so": {"codes": [], "sha256": "2" * 64},
             "fa/_E.so": {"codes": ["sm_80"], "sha256": "3" * 64}}
    with pytest.raises(InputError) as e:
        coverage.judge(_record(files), EngineKernels("sglang", (every,), ()),
                       ("sm100", "sm120"), lock, "the committed record")
    assert e.value.message == "fa 3.0 carries no GPU code for sm100: fa/_C.so"
    assert e.value.facts == [
        "fa/_C.so carries sm_90a (read from the locked wheel's .nv_fatbin; the committed "
        "record)",
        "sm100 runs none of it: no SASS of its own (or an earlier minor of its major), no PTX "
        "it can JIT",
        "images/checks/kernels.yaml: fa is required",
        "fa: fa/_C.so has nothing for sm120", "fa: fa/_E.so has nothing for sm100",
        "fa: fa/_E.so has nothing for sm120"]
    assert e.value.hint == (
        "drop sm100 from the target (or --arch without it), or pin a fa built for sm100; if "
        "this engine never loads fa/_C.so on sm100, say so with `archs:` on its rule in "
        "images/checks/kernels.yaml")
    shown = KernelRule("fa", (), (), "flash attention", False)
    cov = coverage.judge(_record(files), EngineKernels("sglang", (shown,), ("torch", "nope")),
                         ("sm100",), lock, "x")
    assert [(v.member, v.required, v.why, v.status) for v in cov.files] == [
        ("fa/_C.so", False, "flash attention", (("sm100", "none"),)),
        ("fa/_E.so", False, "flash attention", (("sm100", "none"),))]
    assert cov.jit == (f"torch=={lock.package('torch').version}",)
    # A package the lock does not hold is not judged.
    assert coverage.judge({"packages": {}}, EngineKernels("sglang", (every,), ()), ("sm100",),
                          lock, "x").files == ()


def test_more_of_coverages_refusals_word_for_word(ws):
    lock = ws.target("tiny-cpu").lock()
    two = KernelRule("fa", ("fa/_C*.so", "fa/_X*.so"), ("sm100", "sm120"), "attention", True)
    with pytest.raises(InputError) as e:
        coverage.judge(_record({}), EngineKernels("sglang", (two,), ()), ("sm100", "sm120"),
                       lock, "x")
    assert (e.value.message, e.value.facts) == (
        "fa 3.0 has no fa/_C*.so or fa/_X*.so in its wheel for this platform, needed on sm100, "
        "sm120",
        ["images/checks/kernels.yaml: fa is required on sm100, sm120: attention",
         "fa-3.0-cp311-linux_aarch64.whl has: no .so"])
    anywhere = KernelRule("fa", (), (), "", True)
    with pytest.raises(InputError) as e:
        coverage.judge(_record({}), EngineKernels("sglang", (anywhere,), ()), ("sm100",), lock,
                       "x")
    assert e.value.message.startswith("fa 3.0 has no .so in its wheel")
    assert e.value.facts[0] == "images/checks/kernels.yaml: fa is required on every arch"
    on_100 = KernelRule("fa", ("fa/_D*.so",), ("sm100",), "attention", True)
    with pytest.raises(InputError) as e:
        coverage.judge(_record({"fa/_D.so": {"codes": [], "sha256": "2" * 64}}),
                       EngineKernels("sglang", (on_100,), ()), ("sm100",), lock, "x")
    assert e.value.facts[0] == ("fa/_D.so carries no GPU code at all (read from the locked "
                                "wheel's .nv_fatbin; x)")
    assert e.value.facts[2] == "images/checks/kernels.yaml: fa is required on sm100: attention"


def test_a_record_read_from_the_wheels_is_kept_beside_the_lock_by_default(ws, monkeypatch):
    ref = ws.target("sglang-blackwell")
    lock = ref.lock()
    rules = ws.kernel_rules["sglang"]
    written = []
    monkeypatch.setattr(coverage.kernels, "read_record", lambda path, lock_digest, digest: None)
    monkeypatch.setattr(coverage.kernels, "make_record", lambda *a, **kw: ({"packages": {}}, 0))
    monkeypatch.setattr(coverage.kernels, "write_record", lambda path, doc: written.append(path))
    mine = dataclasses.replace(ref, builtin=False)
    assert coverage.ensure_record(mine, lock, rules) == ({"packages": {}}, True)
    assert written == [coverage.kernels.record_path(ref.lock_path)]
    coverage.ensure_record(mine, lock, rules, write=False)
    coverage.ensure_record(dataclasses.replace(ref, builtin=True), lock, rules)
    assert len(written) == 1  # not when asked not to, nor over a built-in lock's record


# --- fat binaries as nvcc lays them out, built here byte by byte -------------------------------

def _fat_entry(kind: int, arch: int, flags: int = 0, *, header: int = 64,
               payload: bytes = b"\0" * 32) -> bytes:
    head = bytearray(header)
    fatbin.ENTRY_HEAD.pack_into(head, 0, kind, 1, header, len(payload))
    struct.pack_into("<I", head, 28, arch)
    struct.pack_into("<Q", head, 40, flags)
    return bytes(head) + payload


def _fat(*entries: bytes, hsize: int = 16) -> bytes:
    body = b"".join(entries)
    return fatbin.FATBIN_HEADER.pack(0xBA55ED50, 1, hsize, len(body)) + b"\0" * (hsize - 16) \
        + body


def test_an_entry_header_of_48_bytes_holds_all_that_is_read():
    """The arch (offset 28) and the flags (offset 40, 8 bytes) end at 48: the shortest header
    that says what its payload is for."""
    got = fatbin.scan([_fat(_fat_entry(fatbin.KIND_ELF, 100, fatbin.ARCH_SPECIFIC, header=48))])
    assert got == {fatbin.Code("sass", 100, "a")}


def test_a_header_of_another_size_is_magic_by_chance():
    body = _fat_entry(fatbin.KIND_ELF, 90)
    assert fatbin.scan([_fat(body, hsize=24)]) == set()
    assert fatbin.scan([_fat(body, hsize=24) + _fat(_fat_entry(fatbin.KIND_PTX, 120))]) == {
        fatbin.Code("ptx", 120)}


def test_a_fat_binary_whose_entries_do_not_add_up_does_not_end_the_scan():
    bad = _fat(_fat_entry(fatbin.KIND_ELF, 90), _fat_entry(7, 100))  # kind 7: no such entry
    good = _fat(_fat_entry(fatbin.KIND_ELF, 120, fatbin.FAMILY_SPECIFIC))
    assert fatbin.scan([bad + b"padding" + good]) == {fatbin.Code("sass", 120, "f")}


def test_family_ptx_runs_within_its_major_only():
    family = fatbin.Code("ptx", 100, "f")
    assert family.runs_on(100) and family.runs_on(103)
    assert not family.runs_on(120) and not family.runs_on(90)
    assert fatbin.Code("ptx", 100).runs_on(120)  # plain PTX: any arch at least as new


def test_the_window_skips_what_it_was_told_across_chunks():
    w = fatbin._Window(iter([b"0123", b"4567", b"89ab", b"cdef"]))
    assert w.peek(2) == b"01"
    w.skip(6)  # past the buffer: the rest is dropped from the stream ahead
    w.skip(3)
    assert w.peek(3) == b"9ab"
