"""What `imgbuild doctor`, `doctor --host`, `check-model` and `patches` show people, as
reviewed.

Each view is rendered from real inputs (the recorded server logs in tests/fixtures/logs, the
recorded Engines in tests/fixtures/engines, the shipped patch set and engine facts, checkpoints
in the shapes tests/test_checkmodel.py builds) as a terminal shows
it (panels, colours: ANSI codes, read them with `less -R`) and as a pipe or CI log gets it
(plain lines, never cut). tests/golden/views/ holds the pages as last reviewed; `make golden`
records them after a change meant to change what people read.

tests/test_doctor.py, tests/test_engine_facts.py and tests/test_checkmodel.py check what each
report finds; this file checks how it is said.
"""

from __future__ import annotations

import functools
import io
import json
import re
from dataclasses import replace
from pathlib import Path

from rich.console import Console

from imgbuild.catalog.failures import load_failures
from imgbuild.checks import checkmodel as cm
from imgbuild.checks import doctor
from imgbuild.checks.patches import PatchReport, PatchResult, listing
from imgbuild.cli.console import Output
from imgbuild.cli.views import checks as views
from imgbuild.image.daemon import DockerCLI
from imgbuild.image.engine import (
    buildx_driver_from,
    buildx_version_from,
    decide,
    facts_from,
    release,
)

from . import golden
from .conftest import ROOT, checkout_workspace
from .test_checkmodel import ct_now, moe_config, moe_names, qwen3_next_checkpoint

LOGS = ROOT / "tests" / "fixtures" / "logs"
ENGINES = ROOT / "tests" / "fixtures" / "engines"
WIDTH = 100
# Logs chosen for what their report shows: two failures (an error before a warning), ranks
# (TP0, TP1), a failure seen more than once, and no known failure.
DOCTOR_LOGS = ("two-failures.log", "nccl-shm.log", "sglang-memory-unbalanced.log",
               "benign.log")


# What a view shows on stdout, then on stderr, headed.
_shown = functools.partial(golden.shown, width=WIDTH, stderr=True)


def _facts(info: str, version: str, buildx: bool = True):
    version_doc = json.loads((ENGINES / version).read_text())
    v = version_doc["Client"]["Version"]
    cli = DockerCLI("/usr/bin/docker", v, 0 < release(v)[0] < 23)
    return facts_from(json.loads((ENGINES / info).read_text()), version_doc, cli,
                      buildx_version_from((ENGINES / "buildx-version.txt").read_text())
                      if buildx else None,
                      buildx_driver_from((ENGINES / "buildx-inspect.txt").read_text())
                      if buildx else None, host="unix:///test.sock")


# An image reference long enough that each head line of --image is longer than the page.
IN_IMAGE = "registry.example/acme/serving:sglang-0516-blackwell-k2.6"


GOLDEN = golden.page_folder(__name__)


def pages() -> dict[str, str]:
    """Every page, by file name."""
    out: dict[str, str] = {}
    failures = load_failures(ROOT / "images")
    for name in DOCTOR_LOGS:
        report = doctor.doctor(failures, str(LOGS / name))
        report = doctor.DoctorReport(f"tests/fixtures/logs/{name}", report.diagnoses,
                                     report.engine)
        stem = name.removesuffix(".log")
        out[f"doctor-{stem}.terminal.txt"] = _shown(views.doctor_report, report, terminal=True)
        out[f"doctor-{stem}.plain.txt"] = _shown(views.doctor_report, report, terminal=False)
        if stem in ("two-failures", "sglang-memory-unbalanced"):
            # --json: what a tool reads of each diagnosis, its evidence and the log's engine
            out[f"doctor-{stem}.json"] = _shown(views.doctor_report, report, as_json=True)
    # Only a known sentence with another cause (SGLang's prefix, vLLM's sentence): no finding.
    other = doctor.diagnose(
        "[2026-03-02 10:00:00 TP0] Starting\nValueError: Free memory on device cuda:0 "
        "(2.11/22.05 GiB) on startup is less than desired GPU memory utilization (0.9, "
        "19.84 GiB).\n", failures)
    assert [d.id for d in other] == [doctor.OTHER_CAUSE]
    for mode in ("terminal", "plain"):
        out[f"doctor-other-cause.{mode}.txt"] = _shown(
            views.doctor_report, doctor.DoctorReport("server.log", tuple(other)),
            terminal=mode == "terminal")
    out["doctor-other-cause.json"] = _shown(
        views.doctor_report, doctor.DoctorReport("server.log", tuple(other)), as_json=True)
    # An evidence line longer than a panel shows whole (300 characters): cut, with "...".
    long = doctor.doctor(failures, str(LOGS / "nccl-shm.log")).diagnoses[0]
    long = replace(long, evidence=(replace(long.evidence[0], text="x" * 290 + " " + "y" * 40),
                                   replace(long.evidence[0], text="z" * 300)))
    out["doctor-long-evidence.terminal.txt"] = _shown(
        views.doctor_report, doctor.DoctorReport("server.log", (long,)), terminal=True)
    # Said by the user: the engine is named beside the source.
    report = doctor.doctor(failures, str(LOGS / "nccl-shm.log"),
                           engine=doctor.engine_given("sglang==0.5.16", failures))
    out["doctor-engine-given.plain.txt"] = _shown(
        views.doctor_report, doctor.DoctorReport("server.log", report.diagnoses, report.engine),
        terminal=False)
    out["doctor-engine-given.json"] = _shown(
        views.doctor_report, doctor.DoctorReport("server.log", report.diagnoses, report.engine),
        as_json=True)
    for name, info, version, buildx in (
            ("containerd", "info-26-containerd.json", "version-26-containerd.json", True),
            ("classic", "info-26-classic.json", "version-26-classic.json", True),
            ("bookworm", "info-20.10.json", "version-20.10.json", True),
            ("refused", "info-20.10.json", "version-client28-server20.10.json", False)):
        f = _facts(info, version, buildx)
        out[f"doctor-host-{name}.plain.txt"] = _shown(views.doctor_host, f, decide(f),
                                                       terminal=False)
    ws = checkout_workspace()
    out["patches-sglang-0516-blackwell.plain.txt"] = _shown(
        views.patches, listing(ws, "sglang-0516-blackwell"), terminal=False)
    out["patches-tiny-cpu.plain.txt"] = _shown(views.patches, listing(ws, "tiny-cpu"),
                                               terminal=False)
    # Each status a check can give, with its style on a terminal.
    checked = PatchReport("t", True, tuple(
        PatchResult(f"p-{s}", s, f"detail of {s} [not markup]", "pkg",
                    None if s == "not-applicable" else "1.0", "<2" if s == "applies" else None,
                    ("a.py",), f"https://example.org/{s}", f"fixes {s}")
        for s in ("applies", "obsolete", "fails", "not-applicable", "unchecked")))
    out["patches-checked.terminal.txt"] = _shown(views.patches, checked, terminal=True)
    out.update(check_model_pages(ws))
    return out | layout_pages()


def _moe_checkpoint(d: Path) -> Path:
    """An MoE checkpoint's config.json and index (no weights): two layers of 12 NVFP4 experts,
    attention in bf16, and ignore entries that name a parent (an expert, a whole MLP)."""
    tensors, _ = moe_names(2, 12)
    ignore = [f"model.language_model.layers.{n}.self_attn.{a}" for n in range(2)
              for a in ("q_proj", "k_proj", "v_proj", "o_proj")]
    ignore += ["model.language_model.layers.0.mlp.experts.1", "model.language_model.layers.1.mlp"]
    d.mkdir()
    (d / "config.json").write_text(json.dumps(moe_config(ignore)))
    (d / "model.safetensors.index.json").write_text(json.dumps(
        {"metadata": {}, "weight_map": {t: "model.safetensors" for t in tensors}}))
    return d


def check_model_pages(ws) -> dict[str, str]:
    """check-model on checkpoints made in a scratch directory, named relative to it (the pages
    hold no machine's path)."""
    out: dict[str, str] = {}
    with golden.scratch("imgbuild-views-"):
        qwen3_next_checkpoint(Path("qwen3-next"))
        _moe_checkpoint(Path("moe"))
        # Fused projections without a mapping, fixed: the fused names added.
        r = cm.check_model(ws, "qwen3-next", "sglang-0516-blackwell", "fixed",
                           ct_formats=ct_now())
        out["check-model-fused-fix.terminal.txt"] = _shown(views.check_model, r,
                                                          terminal=True)
        # --json: the report's own fields, what a tool reads.
        out["check-model-fused-fix.json"] = _shown(views.check_model, r, as_json=True)
        # Parent entries on the patched engine: no finding; the fix still collapses them.
        r = cm.check_model(ws, "moe", "sglang-0516-blackwell", "moe-fixed",
                           ct_formats=ct_now())
        for mode in ("plain", "terminal"):
            out[f"check-model-parents-fix.{mode}.txt"] = _shown(views.check_model, r,
                                                               terminal=mode == "terminal")
        # The same checkpoint on SGLang 0.5.16 as released: the substring matcher.
        released = replace(ws.catalog.target("sglang-0516-blackwell"), patches=())
        ck = cm.load_checkpoint(Path("moe"))
        r = cm.Report("moe", released.name, cm.target_behaviour(released, ws.engines), ck,
                      tuple(cm.check(ck, target=released, catalog=ws.catalog,
                                     engines=ws.engines, ct_formats=ct_now())))
        out["check-model-parents-released.terminal.txt"] = _shown(views.check_model, r,
                                                                 terminal=True)
        # --image: what the image's engine answered, three ways.
        base = dict(engine="sglang", version="0.5.16", archs=["sm100", "sm120"],
                    modules_checked=72)
        for name, answer in (
                ("ok", base | {"ok": True}),
                ("mismatch", base | {"ok": False, "mismatches": [
                    {"module": f"model.layers.{n}.mlp", "arch": "sm120",
                     "declared": "nvfp4", "got": None if n else "fp8",
                     "error": ("no kernel for this scheme on this arch; the engine "
                               "fell back and said so in a sentence longer than a line")
                     if n == 1 else None} for n in range(12)]}),
                ("failed", base | {"ok": False, "version": None, "archs": None,
                                   "modules_checked": 0,
                                   # longer than a line: said whole, never wrapped
                                   "error": "ImportError: cannot import name "
                                            "'fp4_quantize' from 'sglang.srt.layers.quantization"
                                            ".modelopt_quant' (/usr/local/lib/python3.12/"
                                            "dist-packages/sglang/srt/layers/quantization/"
                                            "modelopt_quant.py)"})):
            for mode in ("plain", "terminal"):
                out[f"check-model-in-image-{name}.{mode}.txt"] = _shown(
                    views.check_model, replace(r, in_image=answer, image=IN_IMAGE),
                    terminal=mode == "terminal")
            if name == "mismatch":
                out[f"check-model-in-image-{name}.json"] = _shown(
                    views.check_model, replace(r, in_image=answer, image=IN_IMAGE), as_json=True)
        # What a fix says when its proof fails, an earlier original was kept and a mapping
        # was added; a checkpoint read from config.json alone, of no known architecture;
        # an engine behaviour no rule covers; an info finding.
        fixed = cm.check_model(ws, "moe", "sglang-0516-blackwell", "moe-fixed",
                               ct_formats=ct_now())
        fx = fixed.fix
        odd = replace(
            fixed, checkpoint=replace(fixed.checkpoint, names_from=None, config={}),
            behaviour=replace(fixed.behaviour, facts={
                **fixed.behaviour.facts, "ignore_matcher": replace(
                    fixed.behaviour.facts["ignore_matcher"], value=None, patched_by=None)}),
            findings=(cm.Finding("format", "info", "an info finding", ("a fact",),
                                 "a way out", examples=("an example",)),
                      cm.Finding("format", "warning", "a warning finding", ("a fact",),
                                 "a way out")),
            fix=replace(fx, orig_kept=True, proof=replace(fx.proof, equal=False),
                        packed_added={"in_proj_qkvz": ("in_proj_qkv", "in_proj_z")}))
        for mode in ("plain", "terminal"):
            out[f"check-model-odd-fix.{mode}.txt"] = _shown(views.check_model, odd,
                                                           terminal=mode == "terminal")
        out["check-model-odd-fix.json"] = _shown(views.check_model, odd, as_json=True)
    return out


def layout_pages() -> dict[str, str]:
    """The two layouts every view is made of (cli/views/__init__.py table and kv), on a narrow
    terminal and in a pipe: the first column never cut, the others folded, a key's value of
    several lines under it, numbers and addresses of other people's words never coloured."""
    from imgbuild.cli.views import kv, lines, table

    rows = [["sglang-blackwell-k2.6-with-a-long-name", "sm100, sm120", "the engine at 10.0.0.1 "
             "took 12 s [bold]not markup[/] and a cell long enough to fold in a narrow one"],
            ["tiny-cpu", "cpu", "ok"], ["", "", ""]]
    pairs = [("image", "127.0.0.1:5000/acme:t-1"), ("tags", "a\nb [x]"), ("empty", "")]
    out = {}
    def layouts(o: Output) -> None:
        table(o.out, "targets (3)", ["target", "archs", "note"], rows)
        table(o.out, "nothing", ["target"], [])
        kv(o.out, "tiny-cpu: built", pairs)
        kv(o.out, "no pairs", [])
        lines(o.out, ["a line of 10.0.0.1 and 12 s", "[not markup]"])

    for mode in ("plain", "terminal"):
        out[f"layout.{mode}.txt"] = golden.shown(layouts, terminal=mode == "terminal", width=60)
    return out




def test_the_pages_people_read_are_the_reviewed_ones():
    GOLDEN.check(pages())


def test_a_terminal_shows_panels_and_a_pipe_plain_lines_never_cut():
    got = pages()
    terminal, plain = got["doctor-two-failures.terminal.txt"], got["doctor-two-failures.plain.txt"]
    assert "╭" in terminal and "\x1b[" in terminal
    assert "╭" not in plain and "\x1b[" not in plain
    assert plain.startswith("2 known failures found in tests/fixtures/logs/two-failures.log "
                            "(written by SGLang: line 15)\n")
    assert max(len(ln) for ln in plain.splitlines()) > WIDTH  # a long line stays whole


def test_the_json_report_is_the_reports_own_dict(capsys):
    failures = load_failures(ROOT / "images")
    report = doctor.doctor(failures, str(LOGS / "two-failures.log"))
    views.doctor_report(Output(True, Console(file=io.StringIO()), Console(file=io.StringIO())),
                        report)
    assert json.loads(capsys.readouterr().out) == json.loads(json.dumps(report.to_dict()))


def test_an_evidence_line_is_labelled_by_its_rank_and_role():
    E = doctor.Evidence
    assert views._evidence_label(E(1, "x", "match")) == ""
    assert views._evidence_label(E(1, "x", "match", rank="0")) == " (TP0)"
    assert views._evidence_label(E(1, "x", "context", rank="3")) == " (TP3, context)"
    assert views._evidence_label(E(1, "x", "engine")) == " (engine)"


def test_recorded_pages_exist_for_each_view():
    names = set(GOLDEN.recorded())
    for prefix in ("doctor-", "doctor-host-", "patches-", "check-model-"):
        assert any(n.startswith(prefix) for n in names), prefix
    assert GOLDEN.folder.is_dir()


# --- the words and cuts the pages above do not reach ------------------------------------------

def _diag(text: str) -> doctor.Diagnosis:
    return doctor.Diagnosis("nccl-shm", "NCCL ran out of shared memory", "error", "cause.",
                            "fix.", (doctor.Evidence(7, text),))


def test_a_terminal_cuts_an_evidence_line_past_300_characters_only():
    shown = _shown(lambda o: views._doctor_human([_diag("a" * 300), _diag("b" * 301)], o.out),
                   terminal=True)
    # the panel wraps: compare without its colours, borders and breaks
    shown = "".join(re.sub(r"\x1b\[[0-9;]*m|│", "", shown).split())
    assert "a" * 300 in shown
    assert "b" * 297 + "..." in shown and "b" * 298 not in shown


def test_a_log_read_from_no_file_is_said_without_a_place():
    shown = _shown(lambda o: views._doctor_human([_diag("x")], o.out))
    assert shown.startswith("1 known failure found\n")
    shown = _shown(lambda o: views._doctor_human([_diag("x")], o.out, source="server.log"))
    assert shown.startswith("1 known failure found in server.log\n")


def test_an_engine_store_imgbuild_does_not_know_is_said_so():
    f = replace(_facts("info-26-classic.json", "version-26-classic.json"), store="nydus")
    assert views._store_words(f) == f"not known ({f.storage_driver})"


def test_a_decision_without_a_name_of_its_own_is_shown_by_its_key():
    class Use:  # an EngineUse with one decision the report has no words for
        refusal = None

        def decisions(self):
            return {"save": Decision(True, "why one"), "newly-decided": Decision("x", "why two")}

    class Decision:
        def __init__(self, value, why):
            self.value, self.why = value, why

    f = _facts("info-26-classic.json", "version-26-classic.json")
    shown = _shown(views.doctor_host, f, Use(), terminal=False)
    assert "push reads" in shown and "newly-decided" in shown and "why two" in shown


def test_a_patch_status_without_a_style_is_shown_plain():
    r = PatchReport("t", True, (PatchResult("p1", "reviewing", "d", "pkg", "1.0"),))
    shown = _shown(views.patches, r, terminal=True)
    assert "reviewing" in shown and "[]" not in shown and "None" not in shown


def test_an_answer_that_names_no_layer_count_asked_none():
    ws = checkout_workspace()
    with golden.scratch("imgbuild-views-"):
        _moe_checkpoint(Path("moe"))
        r = cm.check_model(ws, "moe", "sglang-0516-blackwell", None, ct_formats=ct_now())
    shown = _shown(lambda o: views._in_image(
        replace(r, in_image={"engine": "sglang", "ok": True}, image="reg/img:t"), o.out))
    assert shown == ("in reg/img:t: sglang ? on : 0 layers asked; each got its declared "
                              "scheme\n")
