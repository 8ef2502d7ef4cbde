"""Host-fit decisions (plan/fit.py) on plain data: which platforms of a target are judged,
which model is a GPU model, what a row's failures mean, which target is chosen, which error
class and which ways out a refusal carries. A few use the checkout's catalog (the `ws`
fixture) where the decision asks make_plan; no GPU, no Docker."""

from __future__ import annotations

import pytest

from imgbuild.catalog.models import ModelProfile
from imgbuild.errors import EnvError, InputError
from imgbuild.payload.preflight import Gpu, Host, ImageFacts
from imgbuild.plan import fit
from imgbuild.plan.fit import FitReport, TargetFit, fit_targets


def _gpu(i: int, cap: str, name: str = "NVIDIA X") -> Gpu:
    return Gpu(i, f"GPU-{i}", name, cap, "nvidia-smi", 81920, 0)


HOST = Host(gpus=(_gpu(0, "9.0", "NVIDIA H100"),), driver="565.57.01", cpu_arch="x86_64")


def _profile(tp: int = 1, gpus: str | None = None) -> ModelProfile:
    return ModelProfile(alias="m", path="images/models/m.yaml", name="m", checkpoint="org/m",
                        size_gb=10.0, quant_method=None, quant_formats=(), quant_summary="",
                        tensor_parallel=tp, gpus=gpus)


@pytest.mark.parametrize("platforms, cpu, judged", [
    (("linux/amd64", "linux/arm64"), "x86_64", ("linux/amd64",)),
    (("linux/amd64", "linux/arm64"), "aarch64", ("linux/arm64",)),
    (("linux/arm64", "linux/amd64"), None, ("linux/arm64", "linux/amd64")),  # unknown: every one
    (("linux/arm64", "linux/amd64"), "riscv64", ("linux/arm64",)),  # none: the first, to say so
])
def test_which_platforms_of_a_target_are_judged(platforms, cpu, judged):
    assert fit._platforms(platforms, cpu) == judged


@pytest.mark.parametrize("tp, gpus, is_gpu", [(1, None, False), (2, None, True), (8, None, True),
                                               (1, "1x RTX 5090", True)])
def test_a_gpu_model_names_gpus_or_a_tensor_parallel_size_above_1(tp, gpus, is_gpu):
    assert fit.gpu_model(_profile(tp, gpus)) is is_gpu


def _row(name="t", fits=False, failed=(), blocked=(), rank=None, facts=None, short=(),
         reasons=("r",), platform="linux/amd64") -> TargetFit:
    return TargetFit(name, platform, "m", fits, reasons, blocked=blocked, rank=rank,
                     facts=facts, failed=failed, short=short)


@pytest.mark.parametrize("failed, hardware, host_side", [
    ((), False, False),  # fails on nothing: not "the nearest that fails on the driver"
    (("driver",), True, True),
    (("model fits",), True, False),
    (("driver", "model fits"), True, False),
    (("arch", "driver"), False, False),
    (("cpu",), False, False),
    (("plan",), False, False),
])
def test_what_a_rows_failures_say(failed, hardware, host_side):
    r = _row(failed=failed)
    assert r.matches_hardware is hardware
    assert r.host_side_only is host_side


def test_ready_summary_and_chosen():
    ok = _row("a", fits=True, reasons=("exact SASS match",), rank=(0,))
    busy = _row("b", fits=True, blocked=("disk: 1 GB free",), rank=(0,))
    no = _row("c", failed=("arch",), reasons=("arch: long",), short=("sm100 code",))
    assert ok.ready and not busy.ready and not no.ready
    assert ok.summary == "exact SASS match"
    assert no.summary == "sm100 code"
    assert _row(failed=("arch",), reasons=("x", "y")).summary == "x; y"
    assert FitReport(HOST, None, (ok, no)).chosen is ok
    assert FitReport(HOST, None, (ok, no)).ok
    assert FitReport(HOST, None, (no, ok)).chosen is None  # rows are sorted: first or none
    assert FitReport(HOST, None, ()).chosen is None
    assert not FitReport(HOST, None, (busy,)).ok
    assert FitReport(HOST, None, (ok, no, busy)).fitting == (ok, busy)


def test_ranking_order_fitting_then_nearest_then_by_name():
    a = _row("a", failed=("arch",))
    b = _row("b", fits=True, rank=(1, 0, 0, "sglang", (), "b", 0))
    c = _row("c", fits=True, rank=(0, 1, 0, "sglang", (), "c", 0))
    d = _row("d", failed=("driver",), rank=(0, 0, 0, "sglang", (), "d", 0))
    e = _row("0e", failed=("cpu",))
    assert [r.name for r in fit._sorted([a, b, c, d, e])] == ["c", "b", "d", "0e", "a"]


def test_a_busy_chosen_target_is_refused_with_the_way_for_each_reason():
    busy = _row("t", fits=True, rank=(0,), blocked=("gpus free: GPU0 holds 10 GiB",
                                                    "disk: 3 GB free"))
    err = FitReport(HOST, None, (busy,)).refusal()
    assert isinstance(err, EnvError)
    assert "t: gpus free: GPU0 holds 10 GiB" in err.facts and "t: disk: 3 GB free" in err.facts
    assert "CUDA_VISIBLE_DEVICES" in err.hint and "--model-dir" in err.hint
    err = FitReport(HOST, None, (_row("t", fits=True, rank=(0,), blocked=("disk: x",)),)).refusal()
    assert "CUDA_VISIBLE_DEVICES" not in err.hint and "--model-dir" in err.hint
    assert FitReport(HOST, None, (_row("t", fits=True, rank=(0,)),)).refusal() is None


def test_refusal_class_follows_the_way_out():
    drv = ImageFacts(archs=("sm90",), cuda="13.0", min_driver="580.65.06")
    # Fails on the driver alone: the machine must change (exit 3).
    err = FitReport(HOST, None, (_row("t", failed=("driver",), facts=drv,
                                      short=("needs driver",)),)).refusal()
    assert isinstance(err, EnvError)
    assert "update the NVIDIA driver to 580.65.06" in err.hint and "then 't' fits" in err.hint
    # Driver and memory: the request must change too (exit 2), the driver named for 't'.
    err = FitReport(HOST, "m", (_row("t", failed=("driver", "model fits"), facts=drv),)).refusal()
    assert isinstance(err, InputError)
    assert "for 't'" in err.hint and "then 't' fits" not in err.hint
    assert "'t' runs on these GPUs: serve a smaller model" in err.hint
    # No target has code for the GPU: add one.
    err = FitReport(HOST, None, (_row("t", failed=("arch",)),)).refusal()
    assert isinstance(err, InputError) and "archs include sm90" in err.hint
    assert err.message == "no target fits this host"
    err = FitReport(HOST, "m", (_row("t", failed=("cpu",)),), asked=("t",)).refusal()
    assert "use a target built for x86_64" in err.hint
    assert err.message == "target 't' does not fit this host for model m"
    err = FitReport(HOST, None, (_row("a", failed=("cpu",)), _row("b", failed=("cpu",))),
                    asked=("a", "b")).refusal()
    assert err.message == "targets 'a', 'b' do not fit this host"


def test_no_gpu_refusal_names_it_unless_only_cpu_targets_were_judged():
    nogpu = Host(driver=None, cpu_arch="x86_64", error="nvidia-smi not found")
    gpu_row = _row("g", failed=("nvidia-smi",), facts=ImageFacts(archs=("sm100",)))
    err = FitReport(nogpu, None, (gpu_row,)).refusal()
    assert isinstance(err, EnvError) and err.message.endswith(": no NVIDIA GPU visible")
    cpu_row = _row("c", failed=("cpu",), facts=ImageFacts(archs=("cpu",)))
    err = FitReport(nogpu, None, (cpu_row,)).refusal()
    assert isinstance(err, InputError) and "no NVIDIA GPU" not in err.message


def test_another_target_is_a_way_out_only_when_it_fits():
    asked = _row("a", failed=("arch",))
    fits = _row("b", fits=True, rank=(0,))
    no = _row("c", failed=("arch",))
    err = FitReport(HOST, None, (asked,), asked=("a",), others=(no, fits)).refusal()
    assert "target 'b' fits this host: run it instead" in err.hint
    err = FitReport(HOST, None, (asked,), asked=("a",), others=(no,)).refusal()
    assert "run it instead" not in err.hint
    err = FitReport(HOST, None, (asked,), asked=("a",), arch_builds=(("a", "sm90"),)).refusal()
    assert "build 'a' for this GPU with `--arch sm90`" in err.hint


def test_refusal_groups_targets_by_their_short_reason():
    rows = (_row("a", failed=("arch",), short=("x",)), _row("b", failed=("arch",), short=("x",)),
            _row("a", failed=("arch",), short=("x",), platform="linux/arm64"),
            _row("c", failed=("cpu",), short=("y",)))
    assert fit._grouped(rows) == ["a, b: x", "c: y"]


def test_describe_host():
    h = Host(gpus=(_gpu(0, "9.0", "H100"), _gpu(1, "9.0", "H100"),
                   Gpu(2, "u", "GB10", "12.1", "name table", None, None)),
             driver="580.1", cpu_arch="aarch64")
    assert fit.describe_host(h) == ("2x H100 (sm90, 80.0 GiB), 1x GB10 (sm121, memory [N/A]), "
                                    "driver 580.1, CPU aarch64")
    assert fit.describe_host(Host(error="no nvidia-smi")) == \
        "no NVIDIA GPU visible: no nvidia-smi, CPU unknown (`uname -m` did not answer)"


# --- with the checkout's catalog -----------------------------------------------------------

def test_arch_builds_only_for_one_gpu_arch(ws):
    r = TargetFit("sglang-blackwell", "linux/amd64", "k2.6", False, ("x",),
                  failed=("arch", "driver"))
    assert fit._arch_builds(ws, HOST, [r], "k2.6") == [("sglang-blackwell", "sm90")]
    mixed = Host(gpus=(_gpu(0, "9.0"), _gpu(1, "10.0")), driver="580.65.06", cpu_arch="x86_64")
    assert fit._arch_builds(ws, mixed, [r], "k2.6") == []
    # A target failing on more than the arch and the driver is not offered --arch.
    other = TargetFit("sglang-blackwell", "linux/amd64", "k2.6", False, ("x",),
                      failed=("arch", "model fits"))
    assert fit._arch_builds(ws, HOST, [other], "k2.6") == []


def test_over_the_catalog_arch_is_offered_for_one_target_at_most(ws):
    ada = Host(gpus=tuple(_gpu(i, "8.9", "NVIDIA L40S") for i in range(8)), driver="590.1",
               cpu_arch="x86_64")
    rep = fit_targets(ws, ada, model="k2.6")
    assert rep.chosen is None and not any(r.matches_hardware for r in rep.rows)
    assert len(rep.arch_builds) == 1 and rep.arch_builds[0][1] == "sm89"
    # Given by name, each target asked for is offered its build.
    asked = fit_targets(ws, ada, model="k2.6", targets=["sglang-blackwell", "vllm-blackwell"])
    assert asked.arch_builds == (("sglang-blackwell", "sm89"), ("vllm-blackwell", "sm89"))


# --- CUDA and base selection (plan/select.py) and pruning (plan/decide.py) -----------------

def _lock_with_torch(ws, version):
    import dataclasses

    from imgbuild.lock.lockfile import LockedPackage
    lock = ws.target("sglang-blackwell").lock()
    pkgs = tuple(p for p in lock.packages if p.name != "torch") + (
        LockedPackage("torch", version, ("sha256:" + "0" * 64,)),)
    return dataclasses.replace(lock, packages=pkgs)


def test_the_newest_arch_sets_the_cuda_floor_whatever_the_order(ws):
    from imgbuild.plan.select import select
    cat = ws.catalog
    t = cat.target("sglang-blackwell")
    for archs in (("sm90", "sm121"), ("sm121", "sm90")):
        with pytest.raises(InputError) as e:
            select(cat, t, archs=archs, flavor="slim", lock=_lock_with_torch(ws, "2.10.0"),
                   model=None)
        assert e.value.message.startswith("sm121 needs CUDA ≥ 12.9")


def test_a_torch_built_for_exactly_the_needed_cuda_is_enough(ws):
    from imgbuild.plan.select import select
    cat = ws.catalog
    sel = select(cat, cat.target("sglang-blackwell"), archs=("sm120",), flavor="slim",
                 lock=_lock_with_torch(ws, "2.10.0"), model=None)  # sm120 needs 12.8, has 12.8
    assert sel.cuda == "12.8" and sel.min_driver == cat.cuda["12.8"].min_driver
    assert "sm120 needs CUDA ≥ 12.8" in sel.reasoning
    # One below: the nearest variant of that torch that is enough is the hint (12.8, not 13.0).
    with pytest.raises(InputError) as e:
        select(cat, cat.target("sglang-blackwell"), archs=("sm120",), flavor="slim",
               lock=_lock_with_torch(ws, "2.10.0+cu126"), model=None)
    assert "CUDA 12.8 build from the PyTorch index (+cu128)" in e.value.hint


def test_w4a4_nvfp4_needs_one_fp4_arch_not_all(ws):
    from imgbuild.plan.select import select
    cat = ws.catalog
    t = cat.target("sglang-blackwell")
    nvfp4 = ws.model("tiny-nvfp4")
    assert nvfp4.w4a4_nvfp4
    sel = select(cat, t, archs=("sm90", "sm100"), flavor="slim",
                 lock=_lock_with_torch(ws, "2.14.1"), model=nvfp4)
    assert sel.cuda == "13.0"
    with pytest.raises(InputError, match="w4a4 NVFP4"):
        select(cat, t, archs=("sm90",), flavor="slim", lock=_lock_with_torch(ws, "2.14.1"),
               model=nvfp4)
    # A CPU image carries no kernels to refuse.
    assert select(cat, t, archs=("cpu",), flavor="slim", lock=_lock_with_torch(ws, "2.14.1"),
                  model=nvfp4).cuda is None


def test_a_gpu_library_is_pruned_only_where_no_arch_runs_its_code():
    from imgbuild.catalog.prune import PruneRule
    from imgbuild.plan import coverage
    from imgbuild.plan.decide import _prunes_here

    def fv(member, codes):
        return coverage.FileVerdict("pkg", "1", member, "0" * 64, codes, False, "", ())

    def cov(archs, *files):
        return coverage.Coverage(archs, files, (), "record")

    rule = PruneRule("r", "path", "lib/x.so", ("slim",), "why", package="pkg")
    assert _prunes_here(PruneRule("r", "path", "p", ("slim",), "why"), None)  # not a GPU library
    assert not _prunes_here(rule, None)
    assert not _prunes_here(rule, cov((), fv("lib/x.so", ("sm_90",))))  # no GPU arch: kept
    assert _prunes_here(rule, cov(("sm120",), fv("lib/x.so", ("sm_90",))))
    assert not _prunes_here(rule, cov(("sm90",), fv("lib/x.so", ("sm_90",))))
    # One arch that runs it keeps it.
    assert not _prunes_here(rule, cov(("sm120", "sm90"), fv("lib/x.so", ("sm_90",))))
    assert not _prunes_here(rule, cov(("sm121",), fv("lib/x.so", ("sm_120",))))
    # Not in the record (another layout): kept.
    assert not _prunes_here(rule, cov(("sm120",), fv("lib/y.so", ("sm_90",))))
