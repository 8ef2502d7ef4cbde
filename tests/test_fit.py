"""Which target fits this host (imgbuild/plan/fit.py), on the recorded nvidia-smi hosts of
tests/fixtures/nvidia-smi (each directory's README says what is recorded and what is not) and
the checkout's real catalog and committed locks. No GPU, no Docker."""

from __future__ import annotations

import io
import json
import shutil
from pathlib import Path

import pytest
from rich.console import Console

from imgbuild.cli.console import Output
from imgbuild.cli.views.fit import fit_table
from imgbuild.errors import EXIT_ENV, EXIT_INPUT, EnvError, InputError
from imgbuild.payload import preflight as pf
from imgbuild.payload.preflight import FAIL, PASS, WARN, ImageFacts
from imgbuild.plan import fit
from imgbuild.plan.fit import COMPATIBLE, CPU_ONLY, EXACT, fit_targets

FIXTURES = Path(__file__).parent / "fixtures" / "nvidia-smi"
BLACKWELL_AMD64 = ["sglang-blackwell", "sglang-blackwell-slim", "sglang-vllm-blackwell",
                   "sglang-0516-blackwell", "vllm-blackwell"]


def host(name: str) -> pf.Host:
    return pf.probe(runner=pf.recording_runner(FIXTURES / name))


def row(report: fit.FitReport, name: str, platform: str | None = None) -> fit.TargetFit:
    found = [r for r in (*report.rows, *report.others)
             if r.name == name and (platform is None or r.platform == platform)]
    assert len(found) == 1, [(r.name, r.platform) for r in found]
    return found[0]


def verdict(r: fit.TargetFit, check: str) -> pf.Verdict:
    return next(v for v in r.verdicts if v.check == check)


# ----------------------------------------------------------------------------------------------
# Hosts where a target fits
# ----------------------------------------------------------------------------------------------


def test_rtx_pro_6000_k26_chooses_sglang_blackwell_by_the_ranking(ws):
    rep = fit_targets(ws, host("rtx-pro-6000-8x-ok"), model="k2.6")
    assert rep.ok and rep.refusal() is None
    assert rep.chosen is not None and rep.chosen.name == "sglang-blackwell"
    # Every amd64 Blackwell target fits (sm120 code, driver 580.65.06 at its floor, 8x 95.6
    # GiB holds 69.3 GiB of weights a GPU); the ranking orders them: the two that name k2.6
    # as their default first, then engine (sglang before vllm) and its newer release
    # (0.5.23 before 0.5.16), then name.
    assert [r.name for r in rep.fitting] == BLACKWELL_AMD64
    chosen = rep.chosen
    assert chosen.rank[:3] == (EXACT, 0, 1)
    assert chosen.reasons[0] == ("exact SASS match; 1 arch(s) unused here (sm100); names k2.6 "
                                 "as its default model")
    assert row(rep, "sglang-vllm-blackwell").rank[:3] == (EXACT, 1, 1)
    assert "can serve k2.6 (its default model is none)" in row(rep, "vllm-blackwell").reasons[0]
    why = " | ".join(chosen.reasons)
    assert "GPU0-7 sm120: built for sm120: exact match" in why
    assert "driver 580.65.06 >= 580.65.06 (CUDA 13.0 needs driver >= 580.65.06)" in why
    assert "model k2.6 fits GPU0-7 (smallest 95.6 GiB)" in why
    assert "595 GB / TP 8 = 69.3 GiB per GPU" in why
    # No uname-m.txt in this recording: the CPU is unknown and said so, not guessed.
    assert "cpu: not checked: unknown: `uname -m` did not answer" in why
    # And why the others do not fit, each with its facts.
    assert row(rep, "sglang-hopper").failed == ("arch",)
    assert row(rep, "sglang-hopper").summary == "sm90 code, none runs on sm120"
    assert row(rep, "sglang-gb200").summary == "sm100, sm103 code, none runs on sm120"
    assert row(rep, "sglang-dgx-spark").summary == "sm121 code, none runs on sm120"
    for cpu in ("tiny-cpu", "tiny-cpu-multi"):
        for r in rep.rows:
            if r.name == cpu:
                assert not r.fits and not r.candidate
                assert r.reasons[0].startswith("CPU target (archs [cpu]): serves no GPU model, "
                                               "and k2.6 is one (595 GB at TP 8")


def test_a_known_cpu_keeps_only_that_platform(ws, tmp_path):
    # The same recording with `uname -m`: tiny-cpu-multi is judged on linux/amd64 only, and
    # the arm64-only targets fail on the CPU as well as the arch.
    d = tmp_path / "rtx-x86"
    shutil.copytree(FIXTURES / "rtx-pro-6000-8x-ok", d)
    (d / "uname-m.txt").write_text("x86_64\n")
    rep = fit_targets(ws, pf.probe(runner=pf.recording_runner(d)), model="tiny-nvfp4")
    assert [r.platform for r in rep.rows if r.name == "tiny-cpu-multi"] == ["linux/amd64"]
    gb200 = row(rep, "sglang-gb200")
    assert gb200.failed == ("cpu", "arch")
    assert gb200.summary == "aarch64 image, x86_64 host; sm100, sm103 code, none runs on sm120"
    # tiny-nvfp4 is no target's default model: the engine's newer release, then the name.
    assert rep.chosen.name == "sglang-blackwell"
    assert [r.name for r in rep.fitting] == [*BLACKWELL_AMD64, "tiny-cpu", "tiny-cpu-multi"]
    # The CPU targets serve this small generated model, ranked after every GPU target.
    assert row(rep, "tiny-cpu").rank[0] == CPU_ONLY
    assert "cpu: x86_64 image on an x86_64 host" in rep.chosen.reasons


def test_gb300_sm103_chooses_sglang_gb200_for_the_small_model(ws):
    rep = fit_targets(ws, host("gb300-4x-sm103"), model="tiny-nvfp4")
    assert rep.ok
    assert (rep.chosen.name, rep.chosen.platform) == ("sglang-gb200", "linux/arm64")
    assert rep.chosen.rank[0] == EXACT  # sm103 is one of its archs
    why = " | ".join(rep.chosen.reasons)
    # sm100 code would run on sm103 too (check_arch says so), but the GPU loads its own.
    assert rep.chosen.reasons[0].startswith("exact SASS match; 1 arch(s) unused here (sm100)")
    assert "GPU0-3 sm103: binary compatibility: sm100 code runs on sm103" in why
    assert "driver 580.105.08 >= 580.65.06" in why
    assert "cpu: aarch64 image on an aarch64 host" in why
    # The x86_64 targets: their programs do not run on Grace.
    assert row(rep, "sglang-blackwell").summary == "x86_64 image, aarch64 host"


def test_gb10_dgx_spark_chooses_sglang_dgx_spark_with_unified_memory(ws):
    rep = fit_targets(ws, host("gb10-1x-sm121"), model="tiny-nvfp4")
    assert (rep.chosen.name, rep.chosen.platform) == ("sglang-dgx-spark", "linux/arm64")
    assert rep.chosen.rank[0] == EXACT
    # GB10 reports no memory.total: the fit is a warning, not a pass and not a failure.
    assert verdict(rep.chosen, "model fits").status == WARN
    assert "[N/A]: unified memory" in " ".join(rep.chosen.reasons)
    # sm120 code would run on sm121 (binary compatibility): ranked as compatible, but the
    # x86_64 image does not run on this CPU.
    bw = row(rep, "sglang-blackwell")
    assert bw.failed == ("cpu",) and bw.rank[0] == COMPATIBLE
    # The CPU image for arm64 fits too, after the GPU target.
    assert [r.name for r in rep.fitting] == ["sglang-dgx-spark", "tiny-cpu-multi"]


def test_arch_match_exact_before_compatible():
    gb10 = host("gb10-1x-sm121")
    assert fit._arch_match(ImageFacts(archs=("sm121",)), gb10) == (EXACT, ())
    assert fit._arch_match(ImageFacts(archs=("sm100", "sm120")), gb10) == (COMPATIBLE, ("sm100",))
    assert fit._arch_match(ImageFacts(archs=("cpu",)), gb10) == (CPU_ONLY, ())
    # Own SASS beside earlier-minor code: the earlier is unused.
    gb300 = host("gb300-4x-sm103")
    assert fit._arch_match(ImageFacts(archs=("sm100", "sm103")), gb300) == (EXACT, ("sm100",))
    assert fit._arch_match(ImageFacts(archs=("sm100",)), gb300) == (COMPATIBLE, ())


# ----------------------------------------------------------------------------------------------
# Fits, but the host is busy
# ----------------------------------------------------------------------------------------------


def test_stale_process_on_gpu0_fits_but_is_refused(ws):
    rep = fit_targets(ws, host("rtx-pro-6000-8x-stale-gpu0"), model="k2.6")
    # The hardware choice is the same as on the idle host ...
    assert rep.chosen.name == "sglang-blackwell" and rep.chosen.fits
    assert [r.name for r in rep.fitting] == BLACKWELL_AMD64
    # ... but the run is refused, with the process and the engine's rule.
    assert not rep.ok and not rep.chosen.ready
    (busy,) = rep.chosen.blocked
    assert busy.startswith("gpus free: GPU0 has 55.0 GiB in use (pid 2841907 /usr/bin/python3 "
                           "holds 55.0 GiB)")
    assert "min free 40.6 GiB < 90% of 95.6 GiB" in busy
    err = rep.refusal()
    assert isinstance(err, EnvError) and err.exit_code == EXIT_ENV
    assert err.message == "target 'sglang-blackwell' fits this host, but the host is busy"
    assert any("pid 2841907" in f for f in err.facts)
    assert "stop the process" in err.hint


# ----------------------------------------------------------------------------------------------
# Nothing fits: the refusal, its facts and its exit code
# ----------------------------------------------------------------------------------------------


def test_h100_k26_refused_for_the_driver_names_sglang_hopper(ws):
    rep = fit_targets(ws, host("h100-8x-sm90"), model="k2.6")
    assert rep.chosen is None and not rep.ok
    hopper = row(rep, "sglang-hopper")
    # 8x H100 80 GB hold k2.6 (69.3 GiB a GPU <= 90% of 79.6 GiB); only the driver is short.
    assert verdict(hopper, "model fits").status == PASS
    assert verdict(hopper, "arch").status == PASS
    assert hopper.failed == ("driver",)
    assert rep.rows[0] is hopper  # the nearest target leads the rows
    err = rep.refusal()
    # The machine must change, not the command: exit 3.
    assert isinstance(err, EnvError) and err.exit_code == EXIT_ENV
    assert err.message == "no target fits this host for model k2.6"
    assert err.facts[0] == ("host: 8x NVIDIA H100 80GB HBM3 (sm90, 79.6 GiB), driver 565.57.01, "
                            "CPU unknown (`uname -m` did not answer)")
    assert err.facts[1] == "model k2.6: 595 GB at TP 8 (69.3 GiB of weights per GPU)"
    assert "sglang-hopper: needs driver >= 580.65.06 (CUDA 13.0), host has 565.57.01" in err.facts
    assert ("sglang-0516-blackwell, sglang-blackwell, sglang-blackwell-slim, "
            "sglang-vllm-blackwell, vllm-blackwell: sm100, sm120 code, none runs on sm90; needs "
            "driver >= 580.65.06 (CUDA 13.0), host has 565.57.01") in err.facts
    assert err.hint == ("update the NVIDIA driver to 580.65.06 or later (CUDA 13.0 needs it; "
                        "this host has 565.57.01): then 'sglang-hopper' fits")


def test_h100_asked_for_sglang_blackwell_is_bad_input_with_ways_out(ws):
    rep = fit_targets(ws, host("h100-8x-sm90"), model="k2.6", targets=["sglang-blackwell"])
    assert [r.name for r in rep.rows] == ["sglang-blackwell"]
    assert row(rep, "sglang-hopper") in rep.others  # judged for the way out only
    err = rep.refusal()
    # The target asked for has no sm90 code: a new driver alone would not run it. Exit 2.
    assert isinstance(err, InputError) and err.exit_code == EXIT_INPUT
    assert err.message == "target 'sglang-blackwell' does not fit this host for model k2.6"
    assert ("sglang-blackwell: sm100, sm120 code, none runs on sm90; needs driver >= 580.65.06 "
            "(CUDA 13.0), host has 565.57.01") in err.facts
    assert "then 'sglang-hopper' fits" in err.hint
    # Its locked kernels carry sm90 code (make_plan's coverage check agrees): --arch works.
    assert ("build 'sglang-blackwell' for this GPU with `--arch sm90` (its locked kernels carry "
            "sm90 code)") in err.hint


def test_b200_driver_570_refused_with_the_driver_numbers(ws):
    rep = fit_targets(ws, host("b200-8x-driver-570"), model="k2.6")
    assert rep.chosen is None
    bw = row(rep, "sglang-blackwell")
    assert bw.failed == ("driver",)
    assert "driver: driver 570.133.20 is older than 580.65.06 (CUDA 13.0 needs driver >= " \
           "580.65.06)" in bw.reasons[0]
    err = rep.refusal()
    assert isinstance(err, EnvError) and err.exit_code == EXIT_ENV
    assert err.facts[0].startswith("host: 8x NVIDIA B200 (sm100, 179.1 GiB), driver 570.133.20")
    assert any(f.endswith(": needs driver >= 580.65.06 (CUDA 13.0), host has 570.133.20")
               and "sglang-blackwell" in f for f in err.facts)
    # The nearest by the ranking: exact sm100, names k2.6, then name.
    assert "then 'sglang-blackwell' fits" in err.hint
    assert "570.133.20" in err.hint and "580.65.06" in err.hint


def test_gb200_driver_570_refused_for_driver_and_gpu_count(ws):
    rep = fit_targets(ws, host("gb200-4x-driver-570"), model="k2.6")
    gb = row(rep, "sglang-gb200")
    assert gb.failed == ("driver", "model fits")
    assert gb.summary == ("needs driver >= 580.65.06 (CUDA 13.0), host has 570.172.08; model "
                          "k2.6 is served at TP 8 but this host has 4 GPU(s)")
    assert row(rep, "sglang-blackwell").failed[0] == "cpu"
    err = rep.refusal()
    # A new driver would not be enough: k2.6 needs 8 GPUs. The request must change: exit 2.
    assert isinstance(err, InputError) and err.exit_code == EXIT_INPUT
    assert "CPU aarch64" in err.facts[0] and "4x NVIDIA GB200 (sm100, 185.0 GiB)" in err.facts[0]
    assert "update the NVIDIA driver to 580.65.06 or later" in err.hint
    assert "for 'sglang-gb200'" in err.hint and "serve a smaller model" in err.hint
    # The small model: the GPU target is short of the driver only; the arm64 CPU image runs.
    small = fit_targets(ws, host("gb200-4x-driver-570"), model="tiny-nvfp4")
    assert row(small, "sglang-gb200").failed == ("driver",)
    assert (small.chosen.name, small.chosen.platform) == ("tiny-cpu-multi", "linux/arm64")


def test_gb300_and_gb10_refuse_k26_for_gpu_count(ws):
    rep = fit_targets(ws, host("gb300-4x-sm103"), model="k2.6")
    assert row(rep, "sglang-gb200").failed == ("model fits",)
    err = rep.refusal()
    assert isinstance(err, InputError) and err.exit_code == EXIT_INPUT
    assert "sglang-gb200: model k2.6 is served at TP 8 but this host has 4 GPU(s)" in err.facts
    assert err.hint.startswith("'sglang-gb200' runs on these GPUs: serve a smaller model")

    spark = fit_targets(ws, host("gb10-1x-sm121"), model="k2.6")
    assert spark.chosen is None
    assert row(spark, "sglang-dgx-spark").summary == ("model k2.6 is served at TP 8 but this "
                                                      "host has 1 GPU(s)")
    assert spark.refusal().exit_code == EXIT_INPUT


def test_no_gpu_nothing_fits_a_gpu_model_and_the_cpu_target_runs_the_small_one(ws):
    # The real probe with no nvidia-smi to find: `uname -m` is this machine's.
    bare = pf.probe(nvidia_smi="/nonexistent/nvidia-smi")
    assert not bare.gpus and bare.cpu_arch in ("x86_64", "aarch64")
    rep = fit_targets(ws, bare, model="k2.6")
    err = rep.refusal()
    assert isinstance(err, EnvError) and err.exit_code == EXIT_ENV
    assert err.message == "no target fits this host for model k2.6: no NVIDIA GPU visible"
    assert err.facts[0].startswith("host: no NVIDIA GPU visible: nvidia-smi not found")
    assert "--gpus all" in err.hint
    bw = row(rep, "sglang-blackwell")
    assert bw.failed[-1] == "nvidia-smi"
    assert "nvidia-smi: no NVIDIA GPU visible: nvidia-smi not found" in bw.reasons[-1]

    small = fit_targets(ws, bare, model="tiny-nvfp4")
    assert small.ok and small.chosen.facts.cpu_only
    assert small.chosen.facts.cpu_arch == bare.cpu_arch


# ----------------------------------------------------------------------------------------------
# Arguments, JSON, the view
# ----------------------------------------------------------------------------------------------


def test_unknown_model_or_target_is_bad_input(ws):
    h = host("rtx-pro-6000-8x-ok")
    with pytest.raises(InputError) as e:
        fit_targets(ws, h, model="k2.7")
    assert e.value.exit_code == EXIT_INPUT
    with pytest.raises(InputError):
        fit_targets(ws, h, targets=["sglang-blackwel"])


def test_given_a_target_without_model_uses_its_default(ws):
    rep = fit_targets(ws, host("rtx-pro-6000-8x-ok"), targets=["sglang-blackwell-slim"])
    assert rep.chosen.name == "sglang-blackwell-slim" and rep.chosen.model == "k2.6"
    assert verdict(rep.chosen, "model fits").status == PASS
    assert rep.others == ()  # it fits: nothing else is judged


def test_report_json_and_table(ws, capsys):
    rep = fit_targets(ws, host("rtx-pro-6000-8x-stale-gpu0"), model="k2.6")
    doc = json.loads(json.dumps(rep.to_dict()))
    assert doc["chosen"] == "sglang-blackwell" and doc["ok"] is False
    assert doc["refusal"]["exit_code"] == EXIT_ENV
    assert doc["rows"][0]["blocked"][0].startswith("gpus free: GPU0 has 55.0 GiB")
    assert doc["rows"][0]["facts"]["archs"] == ["sm100", "sm120"]

    buf = io.StringIO()
    fit_table(Output(False, Console(file=buf, width=200), Console(file=io.StringIO())), rep)
    lines = buf.getvalue().splitlines()
    assert lines[0].startswith("targets for k2.6 on this host: 8x NVIDIA RTX PRO 6000")
    first = next(ln for ln in lines if ln.startswith("sglang-blackwell "))
    assert "busy (chosen)" in first and "pid 2841907" in first
    slim = next(ln for ln in lines if ln.startswith("sglang-blackwell-slim "))
    assert "busy: as above" in slim
    hopper = next(ln for ln in lines if ln.startswith("sglang-hopper "))
    assert hopper.split()[1] == "no" and hopper.endswith("sm90 code, none runs on sm120")

    fit_table(Output(True, Console(file=io.StringIO()), Console(file=io.StringIO())), rep)
    assert json.loads(capsys.readouterr().out)["chosen"] == "sglang-blackwell"


def test_every_fit_check_failure_keeps_the_target_out(ws):
    # The checks fit.py counts: a failed one of each kind, on the recorded hosts above.
    kinds = {f for h in ("h100-8x-sm90", "gb200-4x-driver-570", "gb10-1x-sm121")
             for r in fit_targets(ws, host(h), model="k2.6").rows for f in r.failed}
    assert {"arch", "driver", "cpu", "model fits"} <= kinds
    for h in ("h100-8x-sm90", "gb200-4x-driver-570", "gb10-1x-sm121"):
        for r in fit_targets(ws, host(h), model="k2.6").rows:
            assert not r.fits
            assert all(verdict(r, c).status == FAIL for c in r.failed if r.verdicts)


def test_the_sentences_a_fit_is_made_of(ws):
    bare = pf.probe(nvidia_smi="/nonexistent/nvidia-smi")
    rep = fit_targets(ws, bare, model="k2.6")
    k26 = ws.model("k2.6")
    cpu = row(rep, "tiny-cpu")
    assert (cpu.fits, cpu.candidate, cpu.failed) == (False, False, ("model",))
    assert cpu.reasons == (
        f"CPU target (archs [cpu]): serves no GPU model, and k2.6 is one ({k26.size_gb:g} GB at "
        f"TP {k26.tensor_parallel}" + (f"; gpus: {k26.gpus}" if k26.gpus else "") + ")",)
    bw = row(rep, "sglang-blackwell")
    assert bw.short[-1] == "needs an NVIDIA GPU, none visible"
    d = bw.to_dict()
    assert d["verdicts"] == [{"check": v.check, "status": v.status, "detail": v.detail}
                             for v in bw.verdicts] and d["verdicts"]
    assert d["failed"] == list(bw.failed) and d["candidate"] is True
    ok = fit_targets(ws, host("rtx-pro-6000-8x-ok"), model="k2.6").chosen
    assert ok.reasons[0].endswith("; names k2.6 as its default model")
    other = fit_targets(ws, host("rtx-pro-6000-8x-ok"), model="k2.6",
                        targets=["sglang-vllm-blackwell"]).chosen
    t = ws.catalog.target("sglang-vllm-blackwell")
    if t.default_model != "k2.6":
        assert other.reasons[0].endswith(
            f"; can serve k2.6 (its default model is {t.default_model or 'none'})")


def test_a_gpu_model_without_a_gpus_line_and_a_fit_without_a_model_asked(ws):
    import dataclasses

    bare = pf.probe(nvidia_smi="/nonexistent/nvidia-smi")
    k26 = dataclasses.replace(ws.model("k2.6"), gpus=None)
    cpu = fit._judge(ws, bare, "tiny-cpu", "linux/amd64", "k2.6", k26)
    assert cpu.reasons == (f"CPU target (archs [cpu]): serves no GPU model, and k2.6 is one "
                           f"({k26.size_gb:g} GB at TP {k26.tensor_parallel})",)
    slim = fit_targets(ws, host("rtx-pro-6000-8x-ok"), targets=["sglang-blackwell-slim"]).chosen
    # No model asked: the match and the archs it leaves unused, nothing about a model.
    assert slim.fits and slim.reasons[0] == "exact SASS match; 1 arch(s) unused here (sm100)"
