"""The compatibility report's target sections and cells where planning refuses, a registry is
given, or the catalog's data takes a path the shipped page does not show (pipeline/report.py
collect, _section, _cell, _patches, _failures, _model_fit, _smoke, _step), without a
registry: where one is read, a scripted one answers (tests/test_decisions_report_registry.py
says how), and a platform's refusal is make_plan's own error, raised for that platform.

tests/test_report.py checks the shipped page against its reviewed copy."""

from __future__ import annotations

import dataclasses

import pytest

from imgbuild.catalog.registries import SignPolicy
from imgbuild.errors import InputError
from imgbuild.image import registry as reg
from imgbuild.image import signstore
from imgbuild.pipeline import report as rp

from .conftest import checkout_workspace

MULTI = "tiny-cpu-multi"


@pytest.fixture(scope="module")
def ws():
    return checkout_workspace()


def _refusing(monkeypatch, *platforms: str) -> None:
    """make_plan refuses the given platforms, each in words of its own; plans the others."""
    real = rp.make_plan

    def make_plan(ws, name, **kw):
        if kw.get("platform") in platforms:
            raise InputError(f"no lock for {kw['platform']}", facts=["looked in lockfiles/"],
                             hint=f"run `imgbuild lock {name}`")
        return real(ws, name, **kw)
    monkeypatch.setattr(rp, "make_plan", make_plan)


def _gpu(report: rp.Report, key: str) -> rp.GpuColumn:
    return next(g for g in report.gpus if g.key == key)


def test_a_platform_that_does_not_plan_is_refused_in_its_own_words(ws, monkeypatch):
    _refusing(monkeypatch, "linux/arm64")
    report = rp.collect(ws, targets=(MULTI,))
    [section] = report.targets
    amd, arm = section.platforms
    said = "no lock for linux/arm64; looked in lockfiles/; help: run `imgbuild lock tiny-cpu-multi`"
    assert (arm.platform, arm.error, amd.error) == ("linux/arm64", said, None)
    assert section.error is None  # one platform plans: the target does
    cell = next(c for c in report.cells if c.gpu == "GB200")  # a Grace host: arm64
    assert cell == rp.Cell(MULTI, "GB200", rp.REFUSED, said, "linux/arm64", image="",
                           image_reason="", evidence=(rp.anchor("t", MULTI, "linux/arm64"),))
    assert next(c for c in report.cells if c.gpu == "B200").status == rp.CPU_ONLY


def test_a_target_no_platform_of_which_plans_says_the_first_refusal(ws, monkeypatch):
    _refusing(monkeypatch, "linux/amd64", "linux/arm64")
    [section] = rp.collect(ws, targets=(MULTI,)).targets
    assert section.error == ("no lock for linux/amd64; looked in lockfiles/; help: run "
                             "`imgbuild lock tiny-cpu-multi`")
    assert (section.failures, section.patches) == ((), ())  # no lock read, no plan


def test_a_registry_given_is_checked_first_and_its_images_fill_the_cells(ws, monkeypatch):
    reached, digest = [], "sha256:" + "d" * 64
    monkeypatch.setattr(reg, "check_reachable", lambda repo: reached.append(repo.name))
    monkeypatch.setattr(reg, "manifest_digest", lambda repo, tag: digest)
    monkeypatch.setattr(reg, "get_manifest", lambda repo, d: (d, {"config": {}, "layers": []}))
    monkeypatch.setattr(reg, "image_config", lambda repo, d: ({}, {"history": []}))
    monkeypatch.setattr(reg, "fetch_report", lambda repo, d: None)
    monkeypatch.setattr(signstore, "fetch_layers", lambda repo, tag: [])
    report = rp.collect(ws, registry="registry.example/acme", targets=("tiny-cpu",))
    assert reached == ["registry.example/acme"]
    cell = next(c for c in report.cells if c.gpu == "B200")
    assert (cell.image, cell.image_reason) == (
        rp.BUILT, f"registry.example/acme:{report.targets[0].platforms[0].content_tag} is "
                  f"pushed ({digest}); no smoke report stored for it")


def test_an_override_without_a_link_has_an_empty_one(ws):
    section, _ = rp._section(ws, "sglang-vllm-blackwell", None)
    assert section.overrides and all(link == "" for _, _, link in section.overrides)
    assert [o[0] for o in section.overrides] == sorted(o[0] for o in section.overrides)


def test_a_sections_patches_are_those_its_plan_applies_or_needs(ws):
    from imgbuild.plan.decide import make_plan

    plan = make_plan(ws, "sglang-0516-blackwell", resolve=False)
    ids = sorted(set(plan.applied_patches) | set(plan.needed_patches))
    assert ids  # this target carries patches
    got = rp._patches(ws, plan)
    assert [row[0] for row in got] == [i for i in ids if i in ws.patches]
    p = ws.patches[got[0][0]]
    assert got[0] == (got[0][0], f"{p.package} {p.versions}", p.fixes.strip(), p.upstream)
    assert rp._patches(ws, None) == ()


def test_the_failures_that_apply_list_errors_first_then_by_id(ws):
    both = 0
    for name in sorted(ws.catalog.targets):
        got = rp._failures(ws, ws.target(name).lock())
        severities = [f.severity for f in got]
        both += "error" in severities and bool(set(severities) - {"error"})
        assert severities == sorted(severities, key=lambda s: s != "error"), name
        for kind in set(severities):
            ids = [f.id for f in got if f.severity == kind]
            assert ids == sorted(ids), name
    assert both  # a lock that both kinds apply to: the order is put to the test


def test_a_kernel_cell_with_no_record_and_no_lead_starts_with_the_fact(ws):
    cell = rp._kernel_cell(dict(target="t", gpu="B200", platform="linux/amd64", image="",
                                image_reason="", model_fit=None), (), "sm100", "", ())
    assert cell.reason == ("no kernel coverage recorded for this engine "
                           "(images/checks/kernels.yaml)")
    assert cell.status == rp.NO_RECORD


def test_a_model_fit_needs_the_models_size(ws):
    from imgbuild.plan.decide import make_plan

    plan = make_plan(ws, "sglang-blackwell", resolve=False)
    report = rp.collect(ws, targets=("tiny-cpu",))
    b200 = _gpu(report, "B200")
    assert rp._model_fit(ws, plan, b200).startswith(f"{plan.model} fits on ")
    assert rp._model_fit(ws, dataclasses.replace(plan, model_size_gb=None), b200) is None


def test_a_smoke_report_read_with_what_it_leaves_out(ws):
    got = rp._smoke({"ok": True, "stages": [
        {"name": "gpu-engine", "status": "pass", "details": {"sm": "sm100"}}]})
    assert (got.gpu, got.image) == ("a GPU (sm100)", "")


def test_a_base_layer_without_a_comment_is_just_that():
    assert rp._step("") == "base layer"


def test_a_policy_that_refuses_says_each_refused_check():
    words = rp.signature_words(SignPolicy("images/registries.yaml", key="k.pub"), [
        ("signature", False, "no signature by k.pub"), ("sbom", False, "none attached"),
        ("provenance", True, "ok")], 0, "r/x")
    assert words == ("NOT accepted by the signed-by policy (images/registries.yaml): "
                     "signature: no signature by k.pub; sbom: none attached")


def test_binary_compatible_code_whose_own_plan_refuses_says_both(ws, monkeypatch):
    """B300 (sm103) runs sglang-blackwell's sm100 code; where planning for sm103 alone
    refuses, the cell says what would load and why the plan refuses."""
    real = rp.make_plan

    def make_plan(ws, name, **kw):
        if kw.get("archs") == ("sm103",):
            raise InputError("flashinfer-python has no code for sm103")
        return real(ws, name, **kw)
    monkeypatch.setattr(rp, "make_plan", make_plan)
    cell = rp.collect(ws, targets=("sglang-blackwell",)).cell("sglang-blackwell", "B300")
    assert (cell.status, cell.reason) == (
        rp.REFUSED, "the image's sm100 code would load on sm103, but `imgbuild plan "
                    "sglang-blackwell --arch sm103` refuses: flashinfer-python has no code for "
                    "sm103")


def test_the_page_never_resolves_it_reads_the_committed_locks(ws, monkeypatch):
    real, asked = rp.make_plan, []

    def make_plan(ws, name, **kw):
        asked.append(kw["resolve"])
        return real(ws, name, **kw)
    monkeypatch.setattr(rp, "make_plan", make_plan)
    rp.collect(ws, targets=("sglang-blackwell", MULTI))
    assert asked and set(asked) == {False}
