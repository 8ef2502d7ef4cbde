"""Host preflight on recorded hosts (tests/fixtures/nvidia-smi: each directory's README says
which values are recorded and which are synthesized), no GPU needed.

The four hosts the issue names: all good, driver too old, wrong arch, another process holding
memory on one GPU. Plus: no GPU, fewer GPUs than TP, disk too small, the binary-compatibility
rule, a driver without the compute_cap field, and the entrypoint script run by a real `sh`.
"""

from __future__ import annotations

import ast
import io
import json
import os
import platform
import subprocess
import sys
from pathlib import Path

import pytest
from rich.console import Console

from imgbuild.errors import EnvError, InputError
from imgbuild.image import preflight as host_side
from imgbuild.payload import preflight as pf
from imgbuild.payload.preflight import FAIL, PASS, SKIP, WARN, ImageFacts, ModelFacts
from imgbuild.plan.labels import facts_from_labels, facts_from_plan

FIXTURES = Path(__file__).parent / "fixtures" / "nvidia-smi"
PAYLOAD = Path(pf.__file__)

# The image the issue is about: SGLang for Blackwell (sm100, sm120), CUDA 13.0, serving Kimi
# K2.6 (images/models/k2.6.yaml: 595 GB at TP 8).
BLACKWELL_K26 = ImageFacts(archs=("sm100", "sm120"), cuda="13.0", min_driver="580.65.06",
                           model=ModelFacts("k2.6", 595.0, 8), cpu_arch="x86_64")


def report(host: str, facts: ImageFacts = BLACKWELL_K26, model_dir=None) -> pf.Report:
    return pf.run(facts, runner=pf.recording_runner(FIXTURES / host), model_dir=model_dir)


def by_check(r: pf.Report) -> dict[str, pf.Verdict]:
    return {v.check: v for v in r.verdicts}


# ----------------------------------------------------------------------------------------------
# The four recorded hosts
# ----------------------------------------------------------------------------------------------


def test_all_good_host_passes_every_check():
    r = report("rtx-pro-6000-8x-ok")
    v = by_check(r)
    assert r.ok and r.exit_code == 0
    # cpu: this recording has no `uname -m` (skipped, not passed); disk: no model dir given.
    assert [x.status for x in r.verdicts] == [SKIP, PASS, PASS, PASS, PASS, PASS, SKIP]
    assert "8 GPU(s): NVIDIA RTX PRO 6000 Blackwell Server Edition" in v["nvidia-smi"].detail
    assert "GPU0-7 sm120: built for sm120: exact match" == v["arch"].detail
    # Equal to the floor is enough: the comparison is numeric and inclusive.
    assert "driver 580.65.06 >= 580.65.06" in v["driver"].detail
    # The fit states its basis: weights only, 90% headroom.
    assert "weights only" in v["model fits"].detail and "90%" in v["model fits"].detail
    assert "69.3 GiB per GPU" in v["model fits"].detail
    assert v["disk"].detail == "model directory not given or not measurable"


def test_driver_too_old_host_fails_on_the_driver_only():
    r = report("b200-8x-driver-570")
    v = by_check(r)
    assert not r.ok and r.exit_code == 1
    assert v["driver"].status == FAIL
    assert "driver 570.133.20 is older than 580.65.06" in v["driver"].detail
    assert "CUDA 13.0 needs driver >= 580.65.06" in v["driver"].detail
    # B200 is sm100, which the image carries; the driver is the only thing wrong here.
    assert v["arch"].status == PASS and "sm100: built for sm100" in v["arch"].detail
    assert [c for c, x in v.items() if x.status == FAIL] == ["driver"]


def test_wrong_arch_host_fails_and_says_no_cubin_crosses_majors():
    r = report("h100-8x-sm90")
    v = by_check(r)
    assert not r.ok
    assert v["arch"].status == FAIL
    assert v["arch"].detail.startswith("GPU0-7 NVIDIA H100 80GB HBM3 is sm90;")
    assert "sm100, sm120 only" in v["arch"].detail and "across majors" in v["arch"].detail
    # This recorded host also runs driver 565: too old for CUDA 13.0, said separately.
    assert v["driver"].status == FAIL and "565.57.01" in v["driver"].detail
    # The same host is right for a Hopper image on an older CUDA, save the driver floor.
    hopper = ImageFacts(archs=("sm90",), cuda="12.8")
    v2 = by_check(report("h100-8x-sm90", hopper))
    assert v2["arch"].status == PASS
    assert v2["driver"].status == FAIL and ">= 570.26" in v2["driver"].detail


def test_process_holding_memory_on_gpu0_fails_naming_it_and_sglangs_rule():
    r = report("rtx-pro-6000-8x-stale-gpu0")
    v = by_check(r)
    assert not r.ok
    taken = v["gpus free"]
    assert taken.status == FAIL
    assert "GPU0 has 55.0 GiB in use (pid 2841907 /usr/bin/python3 holds 55.0 GiB)" in taken.detail
    assert "The memory capacity is unbalanced" in taken.detail
    assert "SGLang would reject the launch" in taken.detail
    assert "GPU1" not in taken.detail
    # Everything else about this host is fine: the verdict points at the one thing to fix.
    assert [c for c, x in v.items() if x.status == FAIL] == ["gpus free"]


def test_memory_held_by_a_process_hidden_from_the_container_still_fails(tmp_path):
    # Inside a container, other containers' processes are invisible to --query-compute-apps,
    # but memory.used still counts them.
    d = tmp_path / "host"
    d.mkdir()
    (d / "gpus.csv").write_text((FIXTURES / "rtx-pro-6000-8x-stale-gpu0" / "gpus.csv").read_text())
    (d / "apps.csv").write_text("")
    v = by_check(report(str(d)))
    assert v["gpus free"].status == FAIL
    assert "GPU0 has 55.0 GiB in use (no process listed" in v["gpus free"].detail


def test_memory_held_outside_the_tp_gpus_warns_only():
    small_tp = ImageFacts(archs=("sm120",), cuda="13.0",
                          model=ModelFacts("one-gpu", 10.0, 1))
    lines = (FIXTURES / "rtx-pro-6000-8x-stale-gpu0" / "gpus.csv").read_text().splitlines()
    # Move the stale process to GPU7: a TP 1 server on GPU0 does not care.
    gpus = "\n".join([lines[1].replace("1, GPU-", "0, GPU-", 1)] + lines[1:7]
                     + [lines[0].replace("0, GPU-", "7, GPU-", 1)])
    r = pf.run(small_tp, runner=pf.recorded_runner(gpus, ""))
    v = by_check(r)
    assert r.ok, r.verdicts
    assert v["gpus free"].status == WARN and "GPU7" in v["gpus free"].detail


# ----------------------------------------------------------------------------------------------
# No GPU, too few GPUs, disk
# ----------------------------------------------------------------------------------------------


def test_no_nvidia_smi_is_a_skip_never_a_pass(tmp_path):
    r = pf.run(BLACKWELL_K26, nvidia_smi=str(tmp_path / "nvidia-smi"), model_dir=tmp_path)
    v = by_check(r)
    assert v["nvidia-smi"].status == SKIP
    assert "no NVIDIA GPU: nvidia-smi not found" in v["nvidia-smi"].detail
    assert "--gpus all" in v["nvidia-smi"].detail
    for check in ("arch", "driver", "model fits", "gpus free"):
        assert v[check].status == SKIP, v[check]
        assert v[check].detail.startswith("skipped: no NVIDIA GPU / nvidia-smi not found")
    # The CPU check reads this host's `uname -m`, which needs no GPU.
    assert v["cpu"].status == (PASS if platform.machine() == "x86_64" else pf.FAIL)
    assert not any(x.status == PASS for c, x in v.items() if c not in ("disk", "cpu"))


def test_nvidia_smi_that_finds_no_device_is_a_skip():
    def runner(argv):
        return 6, "No devices were found\n", ""

    v = by_check(pf.run(BLACKWELL_K26, runner=runner))
    assert v["nvidia-smi"].status == SKIP
    assert "nvidia-smi exited 6: No devices were found" in v["nvidia-smi"].detail
    assert v["arch"].status == SKIP


def test_cpu_image_needs_no_gpu(tmp_path):
    cpu = ImageFacts(archs=("cpu",))
    r = pf.run(cpu, nvidia_smi=str(tmp_path / "nvidia-smi"))
    v = by_check(r)
    assert r.ok
    assert v["nvidia-smi"].status == SKIP and v["arch"].status == PASS
    assert v["driver"].status == SKIP


def test_fewer_gpus_than_tensor_parallel_fails():
    four = "\n".join((FIXTURES / "rtx-pro-6000-8x-ok" / "gpus.csv").read_text().splitlines()[:4])
    v = by_check(pf.run(BLACKWELL_K26, runner=pf.recorded_runner(four, "")))
    assert v["model fits"].status == FAIL
    assert "served at TP 8 but this host has 4 GPU(s)" in v["model fits"].detail


def test_model_too_big_for_the_gpus_fails_with_its_basis():
    huge = ImageFacts(archs=("sm120",), cuda="13.0", model=ModelFacts("huge", 1400.0, 8))
    v = by_check(report("rtx-pro-6000-8x-ok", huge))
    assert v["model fits"].status == FAIL
    assert "does not fit: GPU0 NVIDIA RTX PRO 6000 Blackwell Server Edition has 95.6 GiB" in \
        v["model fits"].detail
    assert "163.0 GiB per GPU" in v["model fits"].detail


def test_disk_too_small_fails_and_enough_passes(tmp_path):
    model_dir = tmp_path / "models" / "not-yet-created"
    enormous = ImageFacts(archs=("sm120",), cuda="13.0",
                          model=ModelFacts("enormous", 10.0**9, 8))  # 1 EB
    v = by_check(report("rtx-pro-6000-8x-ok", enormous, model_dir=model_dir))
    assert v["disk"].status == FAIL
    # Measured at the nearest existing parent: the model directory does not exist yet.
    assert f"free at {tmp_path}" in v["disk"].detail
    assert "1e+09 GB" in v["disk"].detail and "--model-dir" in v["disk"].detail
    tiny = ImageFacts(archs=("sm120",), cuda="13.0", model=ModelFacts("tiny", 0.002, 1))
    v = by_check(report("rtx-pro-6000-8x-ok", tiny, model_dir=model_dir))
    assert v["disk"].status == PASS and "0.002 GB for tiny" in v["disk"].detail


def test_disk_is_skipped_without_a_model(tmp_path):
    no_model = ImageFacts(archs=("sm120",), cuda="13.0")
    v = by_check(report("rtx-pro-6000-8x-ok", no_model, model_dir=tmp_path))
    assert v["disk"].status == SKIP and v["model fits"].status == SKIP


# ----------------------------------------------------------------------------------------------
# Binary compatibility, versions, old drivers
# ----------------------------------------------------------------------------------------------


def test_sm121_gpu_runs_an_sm120_image_and_the_rule_is_stated():
    facts = ImageFacts(archs=("sm120",), cuda="13.0", model=ModelFacts("small", 8.0, 1))
    r = report("gb10-1x-sm121", facts)
    v = by_check(r)
    assert v["arch"].status == PASS
    assert v["arch"].detail == ("GPU0 sm121: binary compatibility: sm120 code runs on sm121 "
                                "(same major 12, minor 1 >= 0)")
    # GB10 reports memory as [N/A] (unified memory): the fit is not claimed, it is a warning.
    assert v["model fits"].status == WARN and "[N/A]" in v["model fits"].detail
    assert v["gpus free"].status == PASS
    assert r.ok


@pytest.mark.parametrize("arch,cap,ok", [
    ("sm100", (10, 3), True),   # B300 runs B200 code
    ("sm120", (12, 1), True),   # GB10 runs RTX PRO 6000 code
    ("sm100", (9, 0), False),   # never backwards
    ("sm90", (10, 0), False),   # never across majors
    ("sm100", (12, 0), False),  # sm120 is not a later sm100
    ("sm103", (10, 0), False),  # not to an older minor
    ("sm100a", (10, 3), False),  # arch-specific cubins run on that capability only
    ("sm100a", (10, 0), True),
    ("sm100f", (10, 3), True),  # family cubins run on the family's later minors
])
def test_binary_compatibility_rule(arch, cap, ok):
    assert (pf.arch_covers(arch, cap) is not None) is ok


def test_mixed_host_names_only_the_gpus_the_image_cannot_run_on():
    h100 = (FIXTURES / "h100-8x-sm90" / "gpus.csv").read_text().splitlines()[0]
    rtx = (FIXTURES / "rtx-pro-6000-8x-ok" / "gpus.csv").read_text().splitlines()
    gpus = "\n".join([rtx[0], h100.replace("0, GPU-", "1, GPU-", 1), rtx[2]])
    v = by_check(pf.run(ImageFacts(archs=("sm120",)), runner=pf.recorded_runner(gpus, "")))
    assert v["arch"].status == FAIL
    assert v["arch"].detail.startswith("GPU1 NVIDIA H100 80GB HBM3 is sm90;")


def test_sm90_gpu_with_an_sm100_image_fails():
    v = by_check(report("h100-8x-sm90", ImageFacts(archs=("sm100",), cuda="12.8")))
    assert v["arch"].status == FAIL and "sm100 only" in v["arch"].detail


def test_driver_versions_compare_numerically():
    assert pf.version_at_least("580.105.08", "580.65.06")  # "105" < "65" as text
    assert not pf.version_at_least("570.195.03", "580.65.06")
    assert pf.version_at_least("580.65.06", "580.65.6")
    assert pf.version_at_least("590", "580.65.06")
    assert ImageFacts(archs=("sm120",), cuda="12.9").driver_floor == "575.51.03"


def test_driver_without_compute_cap_field_falls_back_to_the_name():
    # Drivers before 510 print this on stdout and exit 2 (recorded in public issues, e.g.
    # huggingface/candle#733, CoHDI/composable-resource-operator#37 for another field).
    gpus = (FIXTURES / "h100-8x-sm90" / "gpus.csv").read_text()
    without_cap = "\n".join(", ".join(c for i, c in enumerate(line.split(", ")) if i != 3)
                            for line in gpus.splitlines())

    def runner(argv):
        query = next((a for a in argv if a.startswith("--query")), None)
        if query is None:
            return 2, "", "no answer"
        if query.startswith("--query-gpu=") and "compute_cap" in query:
            return 2, 'Field "compute_cap" is not a valid field to query.\n\n', ""
        if query.startswith("--query-gpu="):
            return 0, without_cap, ""
        return 0, "", ""

    r = pf.run(ImageFacts(archs=("sm90",), cuda="12.8"), runner=runner)
    v = by_check(r)
    assert r.host.gpus[0].cap_source == "name table" and r.host.gpus[0].sm == "sm90"
    assert "no compute_cap field" in v["nvidia-smi"].detail
    assert v["arch"].status == PASS and "capability from name table" in v["arch"].detail


def test_parsers_handle_na_and_commas_in_process_names():
    gpus, driver = pf.parse_gpus("0, GPU-a, NVIDIA GB10, [N/A], 580.159.03, [N/A], "
                                 "[Not Supported]\n")
    assert driver == "580.159.03"
    assert gpus[0].compute_cap is None and gpus[0].cap_source == "unknown"
    assert gpus[0].memory_total_mib is None and gpus[0].memory_used_mib is None
    procs = pf.parse_apps("GPU-a, 12, python -c import a,b, 2048\n")
    assert procs == [pf.Process("GPU-a", 12, "python -c import a,b", 2048)]
    with pytest.raises(ValueError, match="expected 7 comma-separated fields"):
        pf.parse_gpus("0, GPU-a, NVIDIA B200\n")


# ----------------------------------------------------------------------------------------------
# Image facts, the payload's CLI, the host side
# ----------------------------------------------------------------------------------------------


def test_facts_from_labels():
    facts = facts_from_labels({
        "io.imgbuild.archs": "sm100,sm120", "io.imgbuild.cuda": "13.0",
        "io.imgbuild.model": "k2.6", "io.imgbuild.model-size-gb": "595", "io.imgbuild.tp": "8"})
    assert facts == ImageFacts(("sm100", "sm120"), "13.0", None, ModelFacts("k2.6", 595.0, 8))
    assert facts.driver_floor == "580.65.06"  # from CUDA 13.0 when the label is missing
    no_model = facts_from_labels({"io.imgbuild.archs": "cpu", "io.imgbuild.cuda": "none",
                                            "io.imgbuild.model": "none"})
    assert no_model == ImageFacts(("cpu",))
    with pytest.raises(InputError, match="no io.imgbuild.archs label"):
        facts_from_labels({"org.opencontainers.image.title": "something else"})
    with pytest.raises(InputError, match="malformed"):
        facts_from_labels({"io.imgbuild.archs": "sm100", "io.imgbuild.model": "x",
                                     "io.imgbuild.tp": "eight"})


def test_host_side_target_and_rich_table():
    # model_dir unset: the host side measures the Hugging Face cache's disk (IMGBUILD_MODEL_DIR
    # or HF_HOME); whether 595 GB fit there depends on this machine, so the disk verdict is not
    # asserted.
    r = host_side.preflight_facts(
        BLACKWELL_K26, runner=pf.recording_runner(FIXTURES / "rtx-pro-6000-8x-stale-gpu0"))
    assert not r.ok
    assert r.host.disk_path is not None
    buf = io.StringIO()
    from imgbuild.cli.console import Output
    from imgbuild.cli.views import image as views
    from imgbuild.pipeline.preflight import Preflight

    views.preflight(Output(False, Console(file=buf, width=200, highlight=False),
                           Console(file=io.StringIO())), Preflight("target t", r))
    out = buf.getvalue()
    assert "gpus free" in out and "fail" in out and "preflight failed (gpus free" in out
    doc = json.loads(json.dumps(r.to_dict()))
    assert doc["ok"] is False and doc["host"]["gpus"][0]["sm"] == "sm120"


def test_host_side_image_reads_labels_through_the_engine_api(tmp_path, monkeypatch):
    import docker.errors

    class Images:
        def get(self, ref):
            if ref != "imgbuild/sglang-blackwell:k2.6":
                raise docker.errors.ImageNotFound("nope")
            return type("Img", (), {"labels": {
                "io.imgbuild.archs": "sm100,sm120", "io.imgbuild.cuda": "13.0",
                "io.imgbuild.driver-min": "580.65.06", "io.imgbuild.model": "k2.6",
                "io.imgbuild.model-size-gb": "595", "io.imgbuild.tp": "8",
                "io.imgbuild.platform": "manylinux_2_36_x86_64"}})()

    client = type("Client", (), {"images": Images()})()
    r = host_side.preflight_image("imgbuild/sglang-blackwell:k2.6", client=client,
                                  runner=pf.recording_runner(FIXTURES / "b200-8x-driver-570"),
                                  model_dir=tmp_path)
    assert r.image == BLACKWELL_K26
    failed = [v.check for v in r.verdicts if v.status == FAIL]
    # The disk verdict depends on this machine's free space (595 GB needed at tmp_path).
    assert failed in (["driver"], ["driver", "disk"])
    with pytest.raises(InputError) as e:
        host_side.preflight_image("other", client=client)
    assert (e.value.message, e.value.hint) == (
        "no local image other", "pull it first (`docker pull other` or `imgbuild pull`), or "
                                "pass a target name")

    class Down:
        def get(self, ref):
            raise docker.errors.DockerException("Error while fetching server API version")
    with pytest.raises(EnvError) as e:
        host_side.image_labels("x", client=type("Client", (), {"images": Down()})())
    assert (e.value.message, e.value.hint) == (
        "cannot inspect image x: Error while fetching server API version",
        "check that the Docker daemon runs and DOCKER_HOST points at it")
    # The same runner and model directory reach the host's checks.
    seen = []
    real = host_side.preflight_facts
    monkeypatch.setattr(host_side, "preflight_facts",
                        lambda facts, **kw: seen.append(kw) or real(facts, **kw))
    runner = pf.recording_runner(FIXTURES / "b200-8x-driver-570")
    host_side.preflight_image("imgbuild/sglang-blackwell:k2.6", client=client, runner=runner,
                              model_dir=tmp_path, nvidia_smi="/x/nvidia-smi")
    assert seen == [{"model_dir": tmp_path, "nvidia_smi": "/x/nvidia-smi", "runner": runner}]


def test_payload_main_prints_a_table_or_json_and_exits_by_verdict(tmp_path, capsys):
    facts = tmp_path / "image.json"
    facts.write_text(json.dumps({"archs": ["sm100", "sm120"], "cuda": "13.0",
                                 "min_driver": "580.65.06",
                                 "model": {"alias": "tiny", "size_gb": 0.002,
                                           "tensor_parallel": 8}}))
    ok = pf.main(["--facts", str(facts), "--model-dir", str(tmp_path),
                  "--recording", str(FIXTURES / "rtx-pro-6000-8x-ok")])
    out = capsys.readouterr().out
    assert ok == 0 and "PASS  arch" in out and "preflight: ok" in out
    bad = pf.main(["--facts", str(facts), "--model-dir", str(tmp_path), "--json",
                   "--recording", str(FIXTURES / "h100-8x-sm90")])
    doc = json.loads(capsys.readouterr().out)
    assert bad == 1 and doc["ok"] is False
    assert {v["check"] for v in doc["verdicts"] if v["status"] == "fail"} == {"arch", "driver"}
    assert pf.main(["--facts", str(tmp_path / "missing.json")]) == 2
    facts.write_text(json.dumps({"archs": ["hopper"]}))
    assert pf.main(["--facts", str(facts)]) == 2
    assert "is not an arch" in capsys.readouterr().err


def test_payload_imports_only_the_standard_library():
    # It runs inside images, which have neither this package nor rich nor yaml; a script
    # copied beside it (anyuser.py, whose cache list it shares) is held to the same.
    siblings = {p.stem for p in PAYLOAD.parent.glob("*.py")}
    for path in (PAYLOAD, PAYLOAD.with_name("anyuser.py")):
        tree = ast.parse(path.read_text())
        mods = {n.module.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)
                and n.module} | {a.name.split(".")[0] for n in ast.walk(tree)
                                 if isinstance(n, ast.Import) for a in n.names}
        assert mods - {"__future__"} - siblings <= set(sys.stdlib_module_names), (path, mods)
        assert mods & siblings <= {"anyuser"}, (path, mods)


# ----------------------------------------------------------------------------------------------
# The entrypoint: a real sh, a fake nvidia-smi on PATH printing a fixture
# ----------------------------------------------------------------------------------------------


@pytest.fixture()
def entrypoint(tmp_path):
    """Run ENTRYPOINT_SH with sh, nvidia-smi on PATH replaying a fixture host, and a "server"
    that prints its pid and arguments."""
    script = tmp_path / "entrypoint.sh"
    script.write_text(pf.ENTRYPOINT_SH)
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    smi = bin_dir / "nvidia-smi"
    smi.write_text('#!/bin/sh\ncase "$*" in\n'
                   '  *--query-gpu=*) cat "$FIXTURE_HOST/gpus.csv" ;;\n'
                   '  *--query-compute-apps=*) cat "$FIXTURE_HOST/apps.csv" ;;\n'
                   '  *) echo "unexpected: $*" >&2; exit 2 ;;\nesac\n')
    smi.chmod(0o755)
    facts = tmp_path / "image.json"
    facts.write_text(json.dumps({"archs": ["sm100", "sm120"], "cuda": "13.0",
                                 "min_driver": "580.65.06",
                                 "model": {"alias": "tiny", "size_gb": 0.002,
                                           "tensor_parallel": 8}}))

    def run(host: str, *args: str, env: dict | None = None) -> subprocess.CompletedProcess:
        e = {"PATH": f"{bin_dir}:{os.environ['PATH']}", "FIXTURE_HOST": str(FIXTURES / host),
             "IMGBUILD_PYTHON": sys.executable, "IMGBUILD_PREFLIGHT_SCRIPT": str(PAYLOAD),
             "IMGBUILD_FACTS": str(facts), "IMGBUILD_MODEL_DIR": str(tmp_path),
             "HOME": str(tmp_path / "home")}
        e.update(env or {})
        server = ["sh", "-c", 'echo "SERVER pid=$$ args=$*"', "server"]
        p = subprocess.Popen(["sh", str(script), *args, *server, "--port", "30000"], env=e,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        out, err = p.communicate(timeout=120)
        return subprocess.CompletedProcess(p.args, p.returncode, out, err), p.pid

    return run


def test_entrypoint_starts_the_server_in_place_when_preflight_passes(entrypoint):
    (r, pid) = entrypoint("rtx-pro-6000-8x-ok")
    assert r.returncode == 0, r.stderr
    assert "PASS  gpus free" in r.stdout
    # exec, not a child: the server has the entrypoint's pid and gets its arguments unchanged.
    assert f"SERVER pid={pid} args=--port 30000" in r.stdout


def test_entrypoint_refuses_to_start_the_server_when_preflight_fails(entrypoint):
    (r, _) = entrypoint("rtx-pro-6000-8x-stale-gpu0")
    assert r.returncode == 1
    assert "SERVER" not in r.stdout
    assert "FAIL  gpus free" in r.stdout and "GPU0 has 55.0 GiB in use" in r.stdout
    assert "preflight failed; the server was not started" in r.stderr
    assert "IMGBUILD_PREFLIGHT=0" in r.stderr


def test_entrypoint_preflight_can_be_turned_off(entrypoint):
    (r, pid) = entrypoint("rtx-pro-6000-8x-stale-gpu0", env={"IMGBUILD_PREFLIGHT": "0"})
    assert r.returncode == 0 and f"SERVER pid={pid} args=--port 30000" in r.stdout
    assert "gpus free" not in r.stdout
    (r, pid) = entrypoint("rtx-pro-6000-8x-stale-gpu0", "--no-preflight")
    assert r.returncode == 0 and f"SERVER pid={pid} args=--port 30000" in r.stdout
    assert "gpus free" not in r.stdout


def test_entrypoint_says_the_containers_own_failures_in_the_doctors_words(entrypoint, tmp_path):
    # A cache the container cannot write: warned in the catalog's words, and the server starts;
    # with the host check off (imgbuild run ran it on the host) the container's still runs.
    (tmp_path / "file").write_text("")
    hf = {"HF_HOME": str(tmp_path / "file" / "hf")}
    (r, pid) = entrypoint("rtx-pro-6000-8x-ok", env=hf)
    assert r.returncode == 0 and f"SERVER pid={pid} args=--port 30000" in r.stdout, r.stderr
    assert "WARN  caches" in r.stdout and "PASS  gpus free" in r.stdout
    assert "imgbuild doctor: cache-dir-not-writable: " in r.stdout
    (r, pid) = entrypoint("rtx-pro-6000-8x-ok", env={**hf, "IMGBUILD_PREFLIGHT": "0"})
    # The host check skipped: the container's finding goes to stderr, stdout is the server's.
    assert r.returncode == 0 and r.stdout.startswith(f"SERVER pid={pid}"), r.stdout
    assert "imgbuild doctor: cache-dir-not-writable: " in r.stderr and "gpus free" not in r.stderr
    (r, pid) = entrypoint("rtx-pro-6000-8x-ok", env={**hf, "IMGBUILD_PREFLIGHT": "0",
                                                     "IMGBUILD_CONTAINER_CHECK": "0"})
    assert r.returncode == 0 and "caches" not in r.stdout + r.stderr
    assert f"SERVER pid={pid}" in r.stdout


def test_entrypoint_without_gpu_skips_and_starts(entrypoint, tmp_path):
    # No nvidia-smi on PATH at all (a container started without --gpus): skip, not fail; the
    # server then reports its own error. PATH keeps only what sh and python need.
    (r, _) = entrypoint("rtx-pro-6000-8x-ok", env={"PATH": "/usr/bin:/bin"})
    if Path("/usr/bin/nvidia-smi").exists() or Path("/bin/nvidia-smi").exists():
        pytest.skip("this machine has a real nvidia-smi on /usr/bin")
    assert r.returncode == 0, r.stdout + r.stderr
    assert "SKIP  nvidia-smi  no NVIDIA GPU: nvidia-smi not found" in r.stdout


def test_entrypoint_starts_the_server_when_preflight_itself_cannot_run(entrypoint, tmp_path):
    # A missing facts file (exit 2) is the image's problem, not the host's: warn and start.
    (r, pid) = entrypoint("rtx-pro-6000-8x-stale-gpu0",
                          env={"IMGBUILD_FACTS": str(tmp_path / "missing.json")})
    assert r.returncode == 0 and f"SERVER pid={pid}" in r.stdout
    assert "preflight could not run (exit 2)" in r.stderr


def test_facts_from_plan_reads_the_labels_the_plan_writes():
    # The Plan carries its labels (imgbuild.plan.key.finalize); a stand-in with the same shape.
    plan = type("Plan", (), {"labels": (
        ("io.imgbuild.archs", "sm100,sm120"), ("io.imgbuild.cuda", "13.0"),
        ("io.imgbuild.driver-min", "580.65.06"), ("io.imgbuild.model", "k2.6"),
        ("io.imgbuild.model-size-gb", "595"), ("io.imgbuild.tp", "8"),
        ("io.imgbuild.target", "sglang-blackwell"),
        ("io.imgbuild.platform", "manylinux_2_36_x86_64"))})()
    assert facts_from_plan(plan) == BLACKWELL_K26


def test_a_real_plans_labels_give_the_facts_the_tests_use():
    # `imgbuild plan --json` from the committed lockfiles: no network, under a second.
    from tests.conftest import run_imgbuild

    r = run_imgbuild("plan", "sglang-blackwell", "--model", "k2.6", "--json", timeout=120)
    assert r.returncode == 0, r.stderr
    labels = json.loads(r.stdout)["labels"]
    labels = labels if isinstance(labels, dict) else dict(labels)
    assert facts_from_labels(labels) == BLACKWELL_K26


def test_payload_mains_words_for_each_way_it_ends(tmp_path, capsys, monkeypatch):
    facts = tmp_path / "image.json"
    assert pf.main(["--facts", str(tmp_path / "missing.json")]) == 2
    assert capsys.readouterr().err == (f"preflight: no facts file at {tmp_path / 'missing.json'};"
                                       " pass --facts PATH\n")
    facts.write_text("{")
    assert pf.main(["--facts", str(facts)]) == 2
    assert capsys.readouterr().err.startswith(f"preflight: {facts}: ")
    # The default facts file is IMGBUILD_FACTS where set.
    monkeypatch.setenv("IMGBUILD_FACTS", str(tmp_path / "from-env.json"))
    assert pf.main([]) == 2
    assert f"no facts file at {tmp_path / 'from-env.json'}" in capsys.readouterr().err
    facts.write_text(json.dumps({"archs": ["sm100"], "cuda": "13.0",
                                 "min_driver": "580.65.06"}))

    def bug(*a, **kw):
        raise KeyError("boom")
    monkeypatch.setattr(pf, "run", bug)
    assert pf.main(["--facts", str(facts)]) == 3  # a bug is no failed host
    assert capsys.readouterr().err == "preflight: internal error: KeyError: 'boom'\n"


def test_payload_mains_table_ends_with_its_verdict(tmp_path, capsys):
    facts = tmp_path / "image.json"
    facts.write_text(json.dumps({"archs": ["sm100", "sm120"], "cuda": "13.0",
                                 "min_driver": "580.65.06"}))
    assert pf.main(["--facts", str(facts), "--model-dir", str(tmp_path),
                    "--recording", str(FIXTURES / "h100-8x-sm90")]) == 1
    out = capsys.readouterr().out.splitlines()
    assert out[0] == "imgbuild preflight"
    assert out[-1] == "preflight: FAILED: the server would not start here"


# --- the small parts, word for word ---------------------------------------------------------------

def test_what_nvidia_smi_prints_for_a_field_it_cannot_read():
    for said in ("[N/A]", " N/A ", "[Not Supported]", "Unknown Error", "[Insufficient Permissions]",
                 "", " [] "):
        assert pf._na(said), said
    for said in ("12.0", "570.26", "0", "[12.0]"):
        assert not pf._na(said), said


def test_where_the_model_goes_by_default(monkeypatch):
    for var in ("IMGBUILD_MODEL_DIR", "HF_HOME", "HF_HUB_CACHE"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("HOME", "/home/u")
    assert pf.default_model_dir() == "/home/u/.cache/huggingface/hub"
    monkeypatch.setenv("HF_HOME", "/hf")
    assert pf.default_model_dir() == "/hf/hub"
    monkeypatch.setenv("HF_HUB_CACHE", "/hub-cache")
    assert pf.default_model_dir() == "/hub-cache"
    monkeypatch.setenv("IMGBUILD_MODEL_DIR", "/models")
    assert pf.default_model_dir() == "/models"


def _g(i: int, total: int | None, used: int | None) -> pf.Gpu:
    return pf.Gpu(index=i, uuid=f"GPU-{i}", name="NVIDIA H100", compute_cap="9.0",
                  cap_source="nvidia-smi", memory_total_mib=total, memory_used_mib=used)


def test_sglangs_balance_rule_in_its_words_and_this_hosts_numbers():
    facts = pf.ImageFacts(archs=("sm90",))
    base = ("SGLang refuses to start tensor parallelism when one rank's free memory is below 90% "
            "of another's: 'The memory capacity is unbalanced. Some GPUs may be occupied by "
            "other processes.'")
    one = pf.Host(gpus=(_g(0, 81920, 0), _g(1, None, None)))
    assert pf._sglang_rule(facts, one) == base + (
        " (single GPU here: the engine starts, with less memory for KV cache).")
    unbalanced = pf.Host(gpus=(_g(0, 81920, 10240), _g(1, 81920, None)))
    assert pf._sglang_rule(facts, unbalanced) == base + (
        " Here: min free 70.0 GiB < 90% of 80.0 GiB, so SGLang would reject the launch.")
    # Exactly 90% (a GPU whose used memory nvidia-smi does not give counts as free): within.
    edge = pf.Host(gpus=(_g(0, 73728, None), _g(1, 81920, 0), _g(2, 81920, 4096)))
    assert pf._sglang_rule(facts, edge) == base + (
        " Here min free 72.0 GiB is within 90% of 80.0 GiB, but the engine would size its KV "
        "cache to the fullest GPU.")


def test_a_directory_is_writable_or_says_why_not(tmp_path):
    assert pf.can_write(str(tmp_path / "not" / "yet")) is None  # its nearest parent is
    (tmp_path / "f").write_text("")
    assert pf.can_write(str(tmp_path / "f" / "x")) == f"{tmp_path / 'f'} is not a directory " \
                                                      f"({tmp_path / 'f' / 'x'})"
    # /proc/sys exists and takes no file, even for root; its filesystem is not mounted
    # read-only, so the reason is the permission.
    assert pf.can_write("/proc/sys/x") == "permission denied at /proc/sys (/proc/sys/x)"


def test_a_read_only_filesystem_is_named_as_one(tmp_path, monkeypatch):
    import os
    from types import SimpleNamespace

    # What the kernel answers on a read-only mount (tests/test_hardening.py mounts one).
    monkeypatch.setattr(os, "access", lambda p, mode: False)
    monkeypatch.setattr(os, "statvfs", lambda p: SimpleNamespace(f_flag=os.ST_RDONLY | 0x400))
    assert pf.can_write(str(tmp_path)) == f"read-only file system at {tmp_path} ({tmp_path})"
    monkeypatch.setattr(os, "statvfs", lambda p: SimpleNamespace(f_flag=0x400))
    assert pf.can_write(str(tmp_path)) == f"permission denied at {tmp_path} ({tmp_path})"

    def gone(p):
        raise OSError("stale file handle")
    monkeypatch.setattr(os, "statvfs", gone)
    assert pf.can_write(str(tmp_path)) == f"permission denied at {tmp_path} ({tmp_path})"


def test_the_plain_table_wraps_each_detail_under_its_check():
    vs = [pf.Verdict("arch", "pass", "sm100 code runs on sm100"),
          pf.Verdict("driver", "fail", "needs " + "x" * 120), pf.Verdict("disk", "skip", "")]
    lines = pf.format_table(vs).split("\n")
    assert lines[0] == "PASS  arch    sm100 code runs on sm100"
    # 100 columns: the detail wraps at 100 less the head's 14, under the detail's start.
    assert lines[1] == "FAIL  driver  needs " + "x" * 80
    assert lines[2] == " " * 14 + "x" * 40
    assert lines[3] == "SKIP  disk    "
    assert pf.format_table([]) == ""


def test_a_row_without_index_uuid_or_driver_is_read_for_what_it_has():
    gpus, driver = pf.parse_gpus("[N/A], , NVIDIA H100 80GB HBM3, [N/A], [N/A], 81559, 0\n"
                                 "[N/A], GPU-2, NVIDIA H100 80GB HBM3, 9.0, 570.26, 81559, 1\n")
    assert [(g.index, g.uuid, g.compute_cap, g.cap_source) for g in gpus] == [
        (0, "", "9.0", "name table"), (1, "GPU-2", "9.0", "nvidia-smi")]
    assert driver == "570.26"
    assert pf.parse_gpus("")[1] is None
    with pytest.raises(ValueError) as e:
        pf.parse_gpus("0, GPU-0, NVIDIA H100\n")
    assert str(e.value) == ("expected 7 comma-separated fields (index,uuid,name,compute_cap,"
                            "driver_version,memory.total,memory.used), got 3: "
                            "'0, GPU-0, NVIDIA H100'")
