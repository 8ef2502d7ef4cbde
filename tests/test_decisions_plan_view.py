"""What `imgbuild list`, `plan`, `check-deps` and `lock` print (cli/views/plan.py), read back
row by row and held against the data they show: each row says what its Plan, catalog or lock
report holds, in the words a user reads. Out of a pipe, as CI's log has it: one record a line,
nothing cut. No Engine, no resolution (the plans are of the committed locks)."""

from __future__ import annotations

import json

import pytest

from imgbuild.cli.console import make_output
from imgbuild.cli.views import plan as views
from imgbuild.errors import InputError
from imgbuild.pipeline.lock import LockEntry, LockReport
from imgbuild.pipeline.plan import PlanReport, plan_index
from imgbuild.plan.decide import make_plan
from imgbuild.plan.labels import ANY_USER

from .conftest import checkout_workspace


@pytest.fixture(scope="module")
def ws():
    return checkout_workspace()


def kv_rows(text: str, title: str) -> dict[str, list[str]]:
    """The rows of one `kv` block (views.kv out of a terminal): key -> its value's lines."""
    lines = text.splitlines()
    at = lines.index(title)
    block = []
    for ln in lines[at + 1:]:
        if not ln.startswith(" ") and block and ln.split("  ")[0].strip() == "":
            break
        block.append(ln)
    keys = {"target", "engine", "model", "quantization", "archs", "CUDA", "driver", "base",
            "why", "python", "platform", "lock", "heavy layer", "overrides", "patches",
            "smoke model", "runs as", "content key", "tags", "dependency check", "platforms"}
    width = max(len(k) for k in keys if any(ln.startswith(k + " ") for ln in block))
    rows: dict[str, list[str]] = {}
    last = None
    for ln in block:
        key = ln[:width].strip()
        if key and key not in keys:
            break
        last = key or last
        rows.setdefault(last, []).append(ln[width + 2:])
    return rows


def _plan_text(capsys, report, model=None) -> str:
    views.plan(make_output(False), report, model)
    return capsys.readouterr().out


def test_each_row_of_a_gpu_plan_says_what_the_plan_holds(ws, capsys):
    p = make_plan(ws, "sglang-vllm-blackwell", model="k2.6", resolve=False)
    profile = ws.model(p.model) if p.model else None
    rows = kv_rows(_plan_text(capsys, PlanReport(p, ()), profile), f"plan for {p.target}")
    assert rows["target"] == [f"{p.target}  ({p.description[:70]})"]
    assert rows["engine"] == [f"{p.engine} {p.engine_version}"]
    assert rows["model"] == [f"{p.model}: {p.model_name} ({p.checkpoint}), TP "
                             f"{p.tensor_parallel}"]
    assert rows["quantization"] == [views.quantization_cell(profile)]
    assert rows["archs"] == [", ".join(p.archs)]
    assert rows["CUDA"] == [p.cuda] and rows["driver"] == [f"≥ {p.min_driver}"]
    assert rows["base"] == [f"{p.base_image}  [{p.flavor}, {p.base_os}]"]
    assert rows["why"] == list(p.selection)
    assert rows["python"] == [p.python]
    assert rows["platform"] == [f"{p.platform} ({p.platform_tag})"]
    assert rows["lock"] == [f"{p.lock_path}  ({p.lock_packages} packages, {p.lock_hash[:19]}…)"]
    assert rows["heavy layer"] == [", ".join(p.heavy_packages) or "none"]
    assert p.overrides  # this target reconciles pins: each override with its reason
    assert rows["overrides"] == [f"{o.requirement}: {o.reason}" + (f" ({o.link})" if o.link
                                                                    else "")
                                 for o in p.overrides]
    assert rows["patches"] == [", ".join(p.patches) or "none"]
    assert rows["content key"] == [p.content_key]
    assert rows["tags"] == list(p.refs)
    assert rows["dependency check"] == [
        "ok: every symbol the engines use exists in the locked versions"]
    assert rows["runs as"] == [f"root, or any UID with group 0 on a read-only root (the smoke "
                               f"test runs as {ANY_USER})"] if not p.root_only else True


def test_a_cpu_plan_says_none_where_a_gpu_plan_has_a_value(ws, capsys):
    p = make_plan(ws, "tiny-cpu", resolve=False)
    text = _plan_text(capsys, PlanReport(p, None))
    rows = kv_rows(text, "plan for tiny-cpu")
    assert rows["model"] == ["none"] and "quantization" not in rows  # no model named
    assert rows["CUDA"] == ["none (CPU)"] and rows["driver"] == ["none (CPU)"]
    assert rows["overrides"] == ["none"]
    assert rows["smoke model"] == [f"{p.smoke_model} ({(p.smoke_model_key or '')[:12]})"]
    assert rows["dependency check"] == ["skipped (--no-checks)"]


def test_findings_are_counted_in_the_plan_and_explained_below_it(ws, capsys, monkeypatch):
    p = make_plan(ws, "tiny-cpu", resolve=False)
    monkeypatch.setattr(views.drift, "explain", lambda fs: [f"finding {i}" for i in range(
        len(fs))])
    text = _plan_text(capsys, PlanReport(p, ("f1", "f2")))
    assert kv_rows(text, "plan for tiny-cpu")["dependency check"] == ["2 finding(s): see below"]
    assert text.splitlines()[-2:] == ["finding 0", "finding 1"]
    views.check_deps(make_output(False), PlanReport(p, ("f1",)))
    assert capsys.readouterr().out.splitlines() == ["finding 0"]


def test_check_deps_ok_names_the_lock_and_the_model(ws, capsys):
    p = make_plan(ws, "tiny-cpu", resolve=False)
    views.check_deps(make_output(False), PlanReport(p, ()))
    assert capsys.readouterr().out == (
        f"ok: tiny-cpu ({p.lock_path}): every symbol the locked engines use and every format "
        "the smoke model declares exists in the locked versions\n")
    views.check_deps(make_output(True), PlanReport(p, ()))
    assert json.loads(capsys.readouterr().out) == {"target": "tiny-cpu", "model": p.model,
                                                   "lock": p.lock_path, "ok": True,
                                                   "findings": []}


def test_a_plan_under_json_is_its_report_with_the_models_quantization(ws, capsys):
    p = make_plan(ws, "sglang-vllm-blackwell", model="k2.6", resolve=False)
    profile = ws.model(p.model)
    r = PlanReport(p, ())
    views.plan(make_output(True), r, profile)
    assert json.loads(capsys.readouterr().out) == json.loads(json.dumps(
        r.to_dict() | {"quantization": views.quantization(profile)}))
    views.plan(make_output(True), r)
    assert "quantization" not in json.loads(capsys.readouterr().out)


def test_an_index_plan_shows_each_platform_then_the_index(ws, capsys, monkeypatch):
    import imgbuild.pipeline.plan as pplan

    real = pplan.make_index_plan
    monkeypatch.setattr(pplan, "make_index_plan",
                        lambda ws, t, **kw: real(ws, t, **{**kw, "resolve": False}))
    r = plan_index(ws, "tiny-cpu-multi", checks=False)
    views.index_plan(make_output(False), r)
    text = capsys.readouterr().out
    assert text.count("plan for tiny-cpu-multi") == 2
    rows = kv_rows(text, "index for tiny-cpu-multi")
    assert rows["platforms"] == [f"{p.platform}: {p.ref()}" for p in r.index.plans]
    assert rows["content key"] == [r.index.content_key]
    assert rows["tags"] == list(r.index.refs)
    views.index_plan(make_output(True), r)
    assert json.loads(capsys.readouterr().out)["content_tag"] == r.index.content_tag


def _table(text: str, title: str) -> list[list[str]]:
    lines = text.splitlines()
    at = lines.index(title)
    out = []
    for ln in lines[at + 1:]:
        if not ln.strip() or ln in ("targets", "model profiles"):
            break
        out.append([c for c in ln.split("  ") if c.strip()])
    return [[c.strip() for c in r] for r in out]


def test_list_shows_each_target_and_model_profile(ws, capsys):
    cat = ws.catalog
    views.catalog(make_output(False), cat)
    text = capsys.readouterr().out
    targets = _table(text, "targets")
    assert targets[0] == ["target", "engine", "archs", "platforms", "os", "flavor"]
    want = [[n, f"{t.engine} {t.engine_version}", " ".join(t.archs),
             " ".join(p.split("/")[1] for p in t.platforms), t.os, t.flavor]
            for n, t in cat.targets.items()]
    assert targets[1:] == want
    models = _table(text, "model profiles")
    assert models[0] == ["model", "name", "checkpoint", "size", "TP", "quantization"]
    assert [r[:5] for r in models[1:]] == [
        [a, m.name, m.checkpoint, f"{m.size_gb:g} GB", str(m.tensor_parallel)]
        for a, m in cat.models.items()]
    views.catalog(make_output(True), cat)
    doc = json.loads(capsys.readouterr().out)
    t = cat.target("tiny-cpu")
    assert doc["targets"]["tiny-cpu"] == {
        "engine": f"{t.engine}=={t.engine_version}", "archs": list(t.archs), "os": t.os,
        "flavor": t.flavor, "platforms": list(t.platforms), "description": t.description,
        "layer": cat.origin.get("tiny-cpu")}
    a, m = next(iter(cat.models.items()))
    assert doc["models"][a] == {"name": m.name, "checkpoint": m.checkpoint,
                                "size_gb": m.size_gb, "tensor_parallel": m.tensor_parallel,
                                "layer": cat.model_origin.get(a),
                                "quantization": views.quantization(m)}


def test_the_kernel_table_puts_required_packages_first_and_names_what_each_arch_gets(capsys):
    class P:  # what kernel_table reads of a Plan
        archs = ("sm100", "sm120")
        kernel_coverage = (("sm100", (("flashinfer", "jit"), ("torch", "sass"),
                                      ("triton (shown)", "ptx"))),
                           ("sm120", (("torch", "none"), ("flashinfer", "jit"))))

    views.kernel_table(make_output(False), P())
    rows = [r.split("  ") for r in capsys.readouterr().out.splitlines()[1:]]
    rows = [[c.strip() for c in r if c.strip()] for r in rows]
    assert rows == [["package", "sm100", "sm120"],
                    ["torch", "SASS", "nothing"],
                    ["triton (shown)", "PTX only: JIT at first launch", "-"],
                    ["flashinfer", "JIT at first use", "JIT at first use"]]


def test_the_lock_report_says_each_entry_its_way(capsys):
    ov = {"requirement": "compressed-tensors==0.9.0", "needed": True, "effect": "x 1 -> 2"}
    rm = {"requirement": "six==1.16.0", "needed": False, "effect": "nothing changes"}
    r = LockReport(False, (LockEntry("a", "l/a.txt", written=True, packages=3, overrides=(ov,)),
                           LockEntry("b", "l/b.txt", written=False, packages=5,
                                     overrides=(rm,)),
                           LockEntry("c", "l/c.txt", error=InputError("no solution"))))
    views.lock(make_output(False), r)
    got = capsys.readouterr()
    assert got.out.splitlines() == [
        "wrote  a  l/a.txt  (3 packages)",
        "    override needed    compressed-tensors==0.9.0: x 1 -> 2",
        "up to date  b  l/b.txt  (5 packages)",
        "    override removable six==1.16.0: nothing changes",
        "failed  c  no solution"]
    assert "error: no solution" in got.err  # each failure, in full, on stderr
    check = LockReport(True, (LockEntry("a", "l/a.txt", stale=True, diff=("-x==1", "+x==2")),
                              LockEntry("b", "l/b.txt", stale=False)))
    views.lock(make_output(False), check)
    assert capsys.readouterr().out.splitlines() == [
        "stale  a  l/a.txt", "    -x==1", "    +x==2", "fresh  b  l/b.txt"]
    views.lock(make_output(True), check)
    assert json.loads(capsys.readouterr().out) == check.to_dict()


def test_the_rows_that_say_none_or_root_only_and_a_link_given(ws, capsys):
    from dataclasses import replace

    from imgbuild.catalog.targets import Override

    p = replace(make_plan(ws, "tiny-cpu", resolve=False), heavy_packages=(), smoke_model=None,
                root_only=True, overrides=(
                    Override("compressed-tensors==0.18.0", "NVFP4 needs it",
                             "https://example.org/why"),
                    Override("numpy<3", "the engine says so")))
    rows = kv_rows(_plan_text(capsys, PlanReport(p, None)), "plan for tiny-cpu")
    assert rows["heavy layer"] == ["none"] and rows["smoke model"] == ["none"]
    assert rows["overrides"] == [
        "compressed-tensors==0.18.0: NVFP4 needs it (https://example.org/why)",
        "numpy<3: the engine says so"]
    assert rows["runs as"] == ["root only: True (the smoke test's any-user stage is skipped; "
                               "its Kubernetes manifests ask for root)"]
    # a smoke model whose key is not known yet: its name and empty brackets
    p = replace(p, smoke_model="tiny-nvfp4", smoke_model_key=None)
    assert kv_rows(_plan_text(capsys, PlanReport(p, None)), "plan for tiny-cpu")[
        "smoke model"] == ["tiny-nvfp4 ()"]


def test_each_platform_of_an_index_plan_shows_the_models_quantization(ws, capsys, monkeypatch):
    import imgbuild.pipeline.plan as pplan

    real = pplan.make_index_plan
    monkeypatch.setattr(pplan, "make_index_plan",
                        lambda ws, t, **kw: real(ws, t, **{**kw, "resolve": False}))
    r = plan_index(ws, "tiny-cpu-multi", checks=False)
    profile = ws.model("k2.6")
    views.index_plan(make_output(False), r, profile)
    text = capsys.readouterr().out
    assert [ln.split(None, 1)[1] for ln in text.splitlines() if ln.startswith("quantization ")] \
        == [views.quantization_cell(profile)] * 2
