"""`imgbuild plan` and `check-deps` as pipeline/plan.py puts them together: which arguments
reach the Plan and the drift check, when the check is skipped, where the spec came from and
which built-in names a project shadows. The Plan and the check themselves are faked at their
calls here (tests/test_plan.py, tests/test_drift.py own them)."""

from __future__ import annotations

from pathlib import Path

import pytest

from imgbuild.pipeline import plan as pplan
from imgbuild.workspace import Workspace

from .conftest import ROOT, checkout_workspace


@pytest.fixture(scope="module")
def ws():
    return checkout_workspace()


class Calls:
    """make_plan, make_index_plan and check_deps, recorded; the real Plans come back."""

    def __init__(self, monkeypatch, findings=()):
        self.plan: list[dict] = []
        self.index: list[dict] = []
        self.deps: list[tuple] = []
        self.deps_in: list = []  # the workspace each check was given
        real_plan, real_index = pplan.make_plan, pplan.make_index_plan

        def make_plan(ws, target, **kw):
            self.plan.append(kw)
            return real_plan(ws, target, **{**kw, "resolve": False})

        def make_index_plan(ws, target, **kw):
            self.index.append(kw)
            return real_index(ws, target, **{**kw, "resolve": False})

        def check_deps(ws_, target, **kw):
            self.deps.append((target, kw))
            self.deps_in.append(ws_)
            return list(findings)

        monkeypatch.setattr(pplan, "make_plan", make_plan)
        monkeypatch.setattr(pplan, "make_index_plan", make_index_plan)
        monkeypatch.setattr(pplan, "check_deps", check_deps)


def test_plan_target_passes_every_argument_and_checks_what_it_planned(ws, monkeypatch):
    c = Calls(monkeypatch)
    r = pplan.plan_target(ws, "tiny-cpu", repository="127.0.0.1:5000/acme", archs=None,
                          flavor=None, platform="linux/amd64")
    assert c.plan == [{"model": None, "repository": "127.0.0.1:5000/acme", "archs": None,
                       "flavor": None, "platform": "linux/amd64"}]
    assert c.deps == [("tiny-cpu", {"model": r.plan.model, "platform": "linux/amd64"})]
    assert r.findings == () and r.ok and r.exit_code == 0
    assert r.plan.repository == "127.0.0.1:5000/acme"
    assert r.source is not None and r.source.file == ws.catalog.target("tiny-cpu").path
    # --no-checks: the check is not run, and says so (None, not "no findings").
    c = Calls(monkeypatch)
    r = pplan.plan_target(ws, "tiny-cpu", checks=False)
    assert c.deps == [] and r.findings is None and r.to_dict()["checks"] is None
    assert c.plan[0]["repository"] == "imgbuild"  # the local name by default


def test_a_finding_fails_the_plan_with_exit_1(ws, monkeypatch):
    class Finding:  # what the report reads of a drift.Finding
        def to_dict(self) -> dict:
            return {"symbol": "c"}

    f = Finding()
    Calls(monkeypatch, findings=[f])
    r = pplan.plan_target(ws, "tiny-cpu")
    assert r.findings == (f,) and not r.ok and r.exit_code == 1
    assert r.to_dict()["checks"] == {"ok": False, "findings": [{"symbol": "c"}]}


def test_plan_index_plans_each_platform_and_checks_each(ws, monkeypatch):
    c = Calls(monkeypatch)
    r = pplan.plan_index(ws, "tiny-cpu-multi", repository="r.example/x", archs=None,
                         flavor=None)
    assert c.index == [{"model": None, "repository": "r.example/x", "archs": None,
                        "flavor": None}]
    assert [kw["platform"] for _, kw in c.deps] == ["linux/amd64", "linux/arm64"]
    assert {t for t, _ in c.deps} == {"tiny-cpu-multi"}
    assert [p.plan.platform for p in r.reports] == ["linux/amd64", "linux/arm64"]
    assert all(p.source is not None and p.source.file == ws.catalog.target(
        "tiny-cpu-multi").path for p in r.reports)
    d = r.to_dict()
    assert d["target"] == "tiny-cpu-multi" and d["content_tag"] == r.index.content_tag
    assert set(d["platforms"]) == {"linux/amd64", "linux/arm64"}
    # The JSON `imgbuild plan --json` prints for an index, key by key.
    assert d == {"target": "tiny-cpu-multi", "content_tag": r.index.content_tag,
                 "refs": list(r.index.refs), "index": r.index.to_dict(),
                 "platforms": {p.plan.platform: p.to_dict() for p in r.reports}}
    assert d["refs"] and d["index"]
    assert r.exit_code == 0
    c = Calls(monkeypatch)
    r = pplan.plan_index(ws, "tiny-cpu-multi", checks=False)
    assert c.deps == [] and all(p.findings is None for p in r.reports)


def test_the_spec_source_of_a_built_in_target(ws):
    s = pplan.spec_source(ws, "tiny-cpu")
    t = ws.catalog.target("tiny-cpu")
    assert s.file == t.path and s.shadowing == ()
    assert s.layer == ws.catalog.origin.get("tiny-cpu", "project")
    assert dict(s.fields) == dict(ws.catalog.provenance.get("tiny-cpu", {}))
    assert s.to_dict() == {"file": s.file, "layer": s.layer, "fields": dict(s.fields),
                           "shadowing": []}


def _project(root: Path, files: dict[str, str]) -> Workspace:
    (root / "images").mkdir(parents=True)
    (root / "imgbuild.yaml").write_text("# an imgbuild project\n")
    for rel, text in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
    return Workspace.open(env={}, cwd=root)


def test_what_a_project_shadows_is_said_once_each(tmp_path):
    model = (ROOT / "images" / "models" / "tiny-nvfp4.yaml").read_text()
    ws = _project(tmp_path / "p", {"images/tiny-cpu.yaml": "extends: tiny-cpu\n",
                                   "images/models/tiny-nvfp4.yaml": model})
    s = pplan.spec_source(ws, "tiny-cpu")
    assert s.layer == "project"
    assert [x.split(" is the project's")[0] for x in s.shadowing] == [
        "target 'tiny-cpu'", "model 'tiny-nvfp4'"]
    assert s.shadowing[0].startswith("target 'tiny-cpu' is the project's (images/tiny-cpu.yaml)"
                                     ", shadowing the built-in one (")
    assert "model 'tiny-nvfp4' is the project's (images/models/tiny-nvfp4.yaml)" in \
        s.shadowing[1]
    # The model named (the default and the smoke model are the same one): said once.
    assert pplan.spec_source(ws, "tiny-cpu", "tiny-nvfp4").shadowing == s.shadowing
    # A project that shadows nothing: nothing said.
    plain = _project(tmp_path / "q", {"images/mine.yaml": "extends: tiny-cpu\n"})
    got = pplan.spec_source(plain, "mine")
    assert got.shadowing == () and got.layer == "project"
    assert dict(got.fields)["extends"] == "images/mine.yaml (project)"


def test_a_model_an_arch_and_a_flavor_asked_reach_the_plan_and_the_check(ws, monkeypatch):
    c = Calls(monkeypatch)
    r = pplan.plan_target(ws, "sglang-blackwell", model="k2.6", archs=("sm100",),
                          flavor="devel", platform=None)
    assert c.plan == [{"model": "k2.6", "repository": "imgbuild", "archs": ("sm100",),
                       "flavor": "devel", "platform": None}]
    assert c.deps == [("sglang-blackwell", {"model": "k2.6", "platform": r.plan.platform})]
    assert r.plan.model == "k2.6"
    c = Calls(monkeypatch)
    r = pplan.plan_index(ws, "tiny-cpu-multi", model="tiny-nvfp4", archs=("cpu",),
                         flavor="devel")
    assert c.index == [{"model": "tiny-nvfp4", "repository": "imgbuild", "archs": ("cpu",),
                        "flavor": "devel"}]
    assert [kw["model"] for _, kw in c.deps] == [p.plan.model for p in r.reports]
    assert c.deps_in == [ws, ws]
    assert all(p.source.file == ws.catalog.target("tiny-cpu-multi").path for p in r.reports)


def test_a_model_named_on_the_command_line_is_said_when_the_project_shadows_it(tmp_path,
                                                                                monkeypatch):
    k26 = (ROOT / "images" / "models" / "k2.6.yaml").read_text()
    ws = _project(tmp_path / "p", {"images/models/k2.6.yaml": k26})
    assert ws.catalog.target("tiny-cpu").default_model != "k2.6"
    assert pplan.spec_source(ws, "tiny-cpu").shadowing == ()
    [said] = pplan.spec_source(ws, "tiny-cpu", "k2.6").shadowing
    assert said.startswith("model 'k2.6' is the project's (images/models/k2.6.yaml), shadowing "
                           "the built-in one (")
    # and the plan of it says so, for one platform or each of an index's
    monkeypatch.setattr(pplan, "check_deps", lambda *a, **k: [])
    assert pplan.plan_target(ws, "tiny-cpu", model="k2.6").source.shadowing == (said,)
    assert [r.source.shadowing for r in pplan.plan_index(ws, "tiny-cpu-multi",
                                                         model="k2.6").reports] == [(said,)] * 2
