"""The in-image preflight's verdicts word for word (imgbuild/payload/preflight.py): what a
person reads when a host does not fit, for each check and each way it ends. Hosts are built
from the facts nvidia-smi gives (tests/fixtures/nvidia-smi has the recorded outputs these
shapes come from); no GPU is needed."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from imgbuild.payload import preflight as pf
from imgbuild.payload.preflight import (
    FAIL,
    PASS,
    SKIP,
    WARN,
    Gpu,
    Host,
    ImageFacts,
    ModelFacts,
    Process,
    Said,
    Verdict,
)

MIB = 1024


def gpu(i: int, cap: str | None = "10.0", total: int | None = 180 * MIB, used: int | None = 0,
        name: str = "NVIDIA B200", source: str = "nvidia-smi") -> Gpu:
    return Gpu(i, f"GPU-{i}", name, cap, source, total, used)


B200 = ImageFacts(archs=("sm100",), cuda="12.8", model=ModelFacts("k2.6", 594.0, 8))


def test_gpus_that_say_the_same_are_grouped_by_index():
    assert pf._grouped([(0, "x"), (1, "x"), (3, "y")]) == "GPU0-1 x; GPU3 y"
    assert pf._grouped([(0, "x"), (2, "x"), (5, "x")]) == "GPU0,2,5 x"
    assert pf._grouped([(4, "x")]) == "GPU4 x"


def test_the_arch_verdicts():
    assert pf.check_arch(ImageFacts(archs=("cpu",)), Host()) == Verdict(
        "arch", PASS, "CPU image: runs on any host, no GPU arch needed")
    mixed = ImageFacts(archs=("cpu", "sm100"), cuda="12.8")
    got = pf.check_arch(mixed, Host(gpus=(gpu(0), gpu(1))))
    assert got.status == PASS and got.detail.startswith("GPU0-1 sm100: ")


def test_the_driver_verdicts():
    assert pf.check_driver(ImageFacts(archs=("cpu",)), Host()) == Verdict(
        "driver", SKIP, "CPU image: no NVIDIA driver needed")
    assert pf.check_driver(ImageFacts(archs=("sm100",)), Host()) == Verdict(
        "driver", SKIP, "the image names no driver floor (cuda unknown)")
    assert pf.check_driver(B200, Host(gpus=(gpu(0),))) == Verdict(
        "driver", FAIL, "nvidia-smi reported no driver version")


def test_the_fit_verdicts():
    assert pf.check_fit(ImageFacts(archs=("sm100",)), Host()) == Verdict(
        "model fits", SKIP, "the image names no model")
    unsized = ImageFacts(archs=("sm100",), model=ModelFacts("m", None, 2))
    assert pf.check_fit(unsized, Host()) == Verdict(
        "model fits", SKIP, "model m: size or tensor-parallel size unknown")
    # A GPU that reports no memory does not stop the others being checked.
    two = ImageFacts(archs=("sm121",), model=ModelFacts("m", 100.0, 2))
    got = pf.check_fit(two, Host(gpus=(gpu(0, total=None), gpu(1, total=40 * MIB))))
    assert got.status == FAIL and got.detail.startswith(
        "model m does not fit: GPU1 NVIDIA B200 has 40.0 GiB; weights only: 100 GB / TP 2")


def test_the_taken_verdicts_name_who_holds_each_gpu():
    procs = (Process("GPU-0", 11, "python", 2 * MIB), Process("GPU-0", 12, "vllm", 60 * MIB))
    host = Host(gpus=(gpu(0, used=62 * MIB), gpu(1), gpu(2, used=5 * MIB)), processes=procs,
                apps_visible=False)
    facts = ImageFacts(archs=("sm100",), model=ModelFacts("m", 10.0, 2))
    got = pf.check_taken(facts, host)
    assert got.status == FAIL
    assert got.detail.startswith(
        "GPU0 has 62.0 GiB in use (pid 12 vllm holds 60.0 GiB, pid 11 python holds 2.0 GiB). ")
    assert got.detail.endswith(
        " Stop the process (or pick other GPUs with CUDA_VISIBLE_DEVICES) and launch again."
        " Outside the server's GPUs: GPU2 has 5.0 GiB in use (processes not visible "
        "(compute-apps query failed)).")
    only_outside = Host(gpus=(gpu(0), gpu(1), gpu(2, used=5 * MIB)), apps_visible=True)
    assert pf.check_taken(facts, only_outside) == Verdict(
        "gpus free", WARN, "GPU2 has 5.0 GiB in use (no process listed: inside a container "
        "other containers' and the host's processes are hidden; run `nvidia-smi` on the host "
        "to name it) (outside the first 2 GPUs the server uses)")


def test_the_cpu_and_disk_verdicts():
    arm = ImageFacts(archs=("cpu",), cpu_arch="aarch64")
    got = pf.check_cpu(arm, Host(cpu_arch="x86_64"))
    assert got.status == FAIL and got.detail.endswith(
        "use the image for x86_64 (`imgbuild pull TARGET --platform linux/amd64` where the "
        "target has one)")
    x86 = ImageFacts(archs=("cpu",), cpu_arch="x86_64")
    assert "--platform linux/arm64`" in pf.check_cpu(x86, Host(cpu_arch="aarch64")).detail
    facts = ImageFacts(archs=("cpu",), model=ModelFacts("m", 1.0, 1))
    assert pf.check_disk(facts, Host(disk_free_bytes=2 * 10**9)).detail == \
        "1.9 GiB free at ? >= 1 GB for m"


def test_the_container_verdicts():
    env = {"USER": "svc"}
    assert pf.check_user(1234, None, env) == (
        Verdict("user", PASS, "uid 1234 has no passwd entry; USER=svc answers for it"), None)
    v, said = pf.check_user(1234, None, {})
    assert v.check == "user" and v.status == WARN
    assert said == Said("uid-without-passwd-entry", (("uid", "1234"),))
    assert pf.check_caches([("HF_HOME", "/h", None), ("XDG_CACHE_HOME", "/x", None)]) == (
        Verdict("caches", PASS, "2 cache and JIT directories writable"), None)
    v, said = pf.check_caches([("HF_HOME", "/h", "permission denied at /h (/h)"),
                               ("XDG_CACHE_HOME", "/x", None)])
    assert v == Verdict("caches", WARN, "not writable: HF_HOME: permission denied at /h (/h)")
    assert said == Said("cache-dir-not-writable", (("path", "/h"),))
    v, _ = pf.check_exec([("TRITON_CACHE_DIR", "/tmp/t")],
                         [("/", frozenset({"rw"})), ("/tmp", frozenset({"rw", "noexec"}))])
    assert v == Verdict("jit exec", WARN, "TRITON_CACHE_DIR on /tmp, mounted noexec: JIT-built "
                                          "kernels there cannot be loaded")


def test_a_tool_that_hangs_is_named(monkeypatch):
    import subprocess

    def hang(argv, **kw):
        raise subprocess.TimeoutExpired(argv, 60)

    monkeypatch.setattr(pf.subprocess, "run", hang)
    assert pf._subprocess_runner(["/usr/bin/nvidia-smi", "-q"]) == (
        124, "", "/usr/bin/nvidia-smi did not answer in 60 s (a hung GPU or driver)")


def test_the_facts_and_sentences_files_are_read_as_utf8(tmp_path):
    f = tmp_path / "facts.json"
    f.write_text(json.dumps({"archs": ["sm100"], "model": {"alias": "modèle-ü",
                                                          "size_gb": 1, "tensor_parallel": 1}}),
                 encoding="utf-8")
    assert pf.load_facts(f).model.alias == "modèle-ü"
    s = tmp_path / "sentences.json"
    s.write_text(json.dumps({"x": {"title": "é"}}, ensure_ascii=False), encoding="utf-8")
    assert pf.load_sentences(s) == {"x": {"title": "é"}}
    shipped = pf.load_sentences()
    assert set(shipped) >= {"uid-without-passwd-entry", "cache-dir-not-writable"}


def test_nothing_found_prints_nothing(capsys):
    pf._print_doctor([])
    assert capsys.readouterr().out == ""
    pf._print_doctor([Said("uid-without-passwd-entry", (("uid", "7"),))])
    assert "7" in capsys.readouterr().out


@pytest.mark.parametrize("make", [lambda p: None, lambda p: p.mkdir()])
def test_a_path_is_writable_where_its_nearest_directory_is(tmp_path, make):
    p = tmp_path / "cache" / "deep"
    make(tmp_path / "cache")
    assert pf.can_write(str(p)) is None


# --- reading the host: nvidia-smi's answers, recorded, and the ways it fails ------------------


NVSMI = Path(__file__).parent / "fixtures" / "nvidia-smi"


def _runner(name: str, **answers):
    """The recording `name`, with some queries answered otherwise: gpu=, apps=, uname=
    (rc, out, err) each."""
    recorded = pf.recording_runner(NVSMI / name)
    asked: list[list[str]] = []

    def run(argv):
        asked.append(list(argv))
        if argv[0] == "uname" and "uname" in answers:
            return answers["uname"]
        if any(a.startswith("--query-gpu=") for a in argv) and "gpu" in answers:
            got = answers["gpu"]
            return got(argv) if callable(got) else got
        if any(a.startswith("--query-compute-apps=") for a in argv) and "apps" in answers:
            return answers["apps"]
        return recorded(argv)

    run.asked = asked
    return run


def test_a_host_is_read_from_nvidia_smi_s_two_queries_and_uname():
    host = pf.probe(runner=_runner("gb10-1x-sm121", uname=(0, "arm64\n", "")))
    assert host.cpu_arch == "aarch64" and host.driver == "580.159.03"
    assert [g.name for g in host.gpus] == ["NVIDIA GB10"] and host.apps_visible
    assert host.nvidia_smi == "nvidia-smi" and host.error is None and host.notes == ()
    assert pf.probe(runner=_runner("gb10-1x-sm121", uname=(0, "amd64", ""))).cpu_arch == \
        "x86_64"
    assert pf.probe(runner=_runner("gb10-1x-sm121", uname=(1, "", "no"))).cpu_arch is None


def test_a_driver_before_510_is_asked_again_without_compute_cap():
    def gpu(argv):
        if "compute_cap" in argv[1]:
            return 2, 'Field "compute_cap" is not a valid field to query.\n', ""
        return 0, "0, GPU-0, NVIDIA H100 80GB HBM3, 470.82.01, 81559, 0\n", ""

    run = _runner("h100-8x-sm90", gpu=gpu)
    host = pf.probe(runner=run)
    assert [g.compute_cap for g in host.gpus] == ["9.0"] and host.gpus[0].cap_source == \
        "name table"
    assert host.notes[0] == ("this driver's nvidia-smi has no compute_cap field (drivers "
                             "before 510); capabilities come from the GPU names")
    gpu_asks = [a for a in run.asked if a[1].startswith("--query-gpu=")]
    assert len(gpu_asks) == 2 and gpu_asks[1][1] == \
        "--query-gpu=index,uuid,name,driver_version,memory.total,memory.used"
    assert gpu_asks[1][2] == "--format=csv,noheader,nounits"


@pytest.mark.parametrize("gpu,error", [
    ((6, "", "No devices were found\nmore\n"), "nvidia-smi exited 6: No devices were found"),
    ((9, "NVML: Driver/library version mismatch\n", ""),
     "nvidia-smi exited 9: NVML: Driver/library version mismatch"),
    ((9, "", ""), "nvidia-smi exited 9: no output"),
    ((0, "", ""), "nvidia-smi lists no GPU"),
])
def test_no_usable_gpu_is_a_fact_with_its_reason(gpu, error):
    host = pf.probe(runner=_runner("gb10-1x-sm121", gpu=gpu))
    assert host.gpus == () and host.error == error and host.nvidia_smi == "nvidia-smi"


def test_unreadable_answers_are_said_and_the_memory_is_judged_alone():
    host = pf.probe(runner=_runner("gb10-1x-sm121", gpu=(0, "0, x\n", "")))
    assert host.error.startswith("unreadable nvidia-smi output: ")
    host = pf.probe(runner=_runner("gb10-1x-sm121", apps=(4, "", "failed")))
    assert not host.apps_visible and host.notes == (
        "compute-apps query failed; judging by memory.used alone",)
    host = pf.probe(runner=_runner("gb10-1x-sm121", apps=(0, "GPU-0, 12\n", "")))
    assert not host.apps_visible and host.notes[0].startswith("compute-apps list unreadable (")
    assert host.notes[0].endswith("); judging by memory.used alone")
    host = pf.probe(runner=_runner("gb10-1x-sm121",
                                   apps=(0, "No running processes found\n", "")))
    assert host.apps_visible and host.processes == ()


def test_an_nvidia_smi_that_is_not_there_is_said_so(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path))
    host = pf.probe(nvidia_smi="nvidia-smi-x")
    assert host.error == "nvidia-smi not found ('nvidia-smi-x' is not on PATH or not executable)"


def test_the_verdicts_in_the_order_a_person_fixes_them():
    cpu_img = ImageFacts(archs=("cpu",))
    got = pf.verdicts(cpu_img, Host(error="nvidia-smi lists no GPU"))
    assert [(v.check, v.status) for v in got] == [
        ("cpu", SKIP), ("nvidia-smi", SKIP), ("arch", PASS), ("driver", SKIP),
        ("model fits", SKIP), ("gpus free", SKIP), ("disk", SKIP)]
    assert got[1].detail == "CPU image: GPUs not needed (nvidia-smi lists no GPU)"
    assert got[4:6] == [Verdict("model fits", SKIP, "CPU image"),
                        Verdict("gpus free", SKIP, "CPU image")]
    got = pf.verdicts(B200, Host(error="nvidia-smi exited 6: No devices were found"))
    skip = "skipped: no NVIDIA GPU / nvidia-smi exited 6: No devices were found"
    assert got[1] == Verdict("nvidia-smi", SKIP, "no NVIDIA GPU: nvidia-smi exited 6: No "
                                                 f"devices were found; {pf.NO_GPU_HINT}")
    assert got[2:6] == [Verdict("arch", SKIP, skip), Verdict("driver", SKIP, skip),
                        Verdict("model fits", SKIP, skip), Verdict("gpus free", SKIP, skip)]
    host = Host(gpus=(gpu(0), gpu(1, name="NVIDIA B300")), driver="580.65.06",
                notes=("a note", "another"))
    got = pf.verdicts(B200, host)
    assert got[1] == Verdict("nvidia-smi", PASS, "2 GPU(s): NVIDIA B200, NVIDIA B300; driver "
                                                 "580.65.06; a note; another")
    assert [v.check for v in got] == ["cpu", "nvidia-smi", "arch", "driver", "model fits",
                                      "gpus free", "disk"]


@pytest.mark.parametrize("have,floor,ok", [
    ("580.65.06", "580.65.06", True), ("580.65", "580.65.06", False),
    ("580.65.06", "580.65", True), ("580", "580.0.1", False), ("580.0.1", "580", True),
    ("570.x.1", "570.0.1", True), ("570.0.1", "570.x.2", False), ("575.51.03", "580", False),
    ("570.0.0", "570.x.0", True)])
def test_a_driver_is_compared_part_by_part_missing_parts_zero(have, floor, ok):
    assert pf.version_at_least(have, floor) is ok


def test_a_report_carries_the_doctor_s_findings_by_id():
    r = pf.Report(ImageFacts(archs=("cpu",)), Host(), (Verdict("cpu", SKIP, "x"),),
                  (Said("uid-without-passwd-entry", (("uid", "7"),)),))
    assert r.to_dict()["doctor"] == [{"id": "uid-without-passwd-entry", "values": {"uid": "7"}}]
    assert "doctor" not in pf.Report(ImageFacts(archs=("cpu",)), Host()).to_dict()


def test_a_recording_without_apps_answers_with_none(tmp_path):
    (tmp_path / "gpus.csv").write_text((NVSMI / "gb10-1x-sm121" / "gpus.csv").read_text())
    run = pf.recording_runner(tmp_path)
    assert run(["nvidia-smi", "--query-compute-apps=gpu_uuid", "x"]) == (0, "", "")
    assert run(["uname", "-m"])[0] == 2


def test_more_of_what_the_host_reading_says():
    host = pf.probe(runner=_runner("gb10-1x-sm121", gpu=(0, "0, x\n", "")))
    assert host.nvidia_smi == "nvidia-smi"
    unknown = "0, GPU-0, NVIDIA Mystery, [N/A], 580.1, 1000, 0\n"
    host = pf.probe(runner=_runner("gb10-1x-sm121", gpu=(0, unknown, "")))
    assert host.notes == ("compute capability unknown for: GPU0 NVIDIA Mystery",)
    # `uname -m` that failed is not read, whatever it printed.
    assert pf.probe(runner=_runner("gb10-1x-sm121", uname=(1, "x86_64", ""))).cpu_arch is None
    run = _runner("gb10-1x-sm121")
    pf.probe(runner=run)
    assert [a[1] for a in run.asked[1:]] == [
        "--query-gpu=index,uuid,name,compute_cap,driver_version,memory.total,memory.used",
        "--query-compute-apps=gpu_uuid,pid,process_name,used_memory"]
    assert pf.verdicts(ImageFacts(archs=("cpu",)), Host(gpus=(gpu(0),)))[1] == Verdict(
        "nvidia-smi", SKIP, "CPU image: GPUs not needed")


FOUND = [(Verdict("user", WARN, "uid 7 has no passwd entry"),
          Said("uid-without-passwd-entry", (("uid", "7"),))),
         (Verdict("caches", PASS, "3 cache and JIT directories writable"), None)]


def test_the_container_s_own_checks_as_json(monkeypatch, capsys):
    monkeypatch.setattr(pf, "container_checks", lambda: FOUND)
    assert pf.main(["--container-only", "--json"]) == 0
    assert json.loads(capsys.readouterr().out) == {
        "verdicts": [{"check": "user", "status": "warn", "detail": "uid 7 has no passwd entry"},
                     {"check": "caches", "status": "pass",
                      "detail": "3 cache and JIT directories writable"}],
        "doctor": [{"id": "uid-without-passwd-entry", "values": {"uid": "7"}}]}

    def broken():
        raise RuntimeError("boom")

    monkeypatch.setattr(pf, "container_checks", broken)
    assert pf.main(["--container-only"]) == 3
    assert capsys.readouterr().err == "preflight: internal error: RuntimeError: boom\n"


def test_the_host_s_and_the_container_s_checks_in_one_report(monkeypatch, capsys, tmp_path):
    monkeypatch.setattr(pf, "container_checks", lambda: FOUND)
    facts = tmp_path / "facts.json"
    facts.write_text(json.dumps({"archs": ["sm121"], "cuda": "13.0"}))
    assert pf.main(["--facts", str(facts), "--recording", str(NVSMI / "gb10-1x-sm121"),
                    "--model-dir", str(tmp_path), "--container", "--json"]) == 0
    out = capsys.readouterr().out
    assert out.startswith('{\n  "ok": true,\n  "verdicts": [\n    {\n')
    doc = json.loads(out)
    assert [v["check"] for v in doc["verdicts"]] == [
        "cpu", "nvidia-smi", "arch", "driver", "model fits", "gpus free", "disk", "user",
        "caches"]
    assert doc["doctor"] == [{"id": "uid-without-passwd-entry", "values": {"uid": "7"}}]
    with pytest.raises(SystemExit):
        pf.main(["--help"])
    assert "only the container's own checks (the host's were run elsewhere)" in \
        " ".join(capsys.readouterr().out.split())
