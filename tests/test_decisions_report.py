"""What a compatibility-page cell may claim (pipeline/report.py, cli/views/report_html.py),
on plain data: the image cell from what a registry holds (nothing, a tag, a smoke report that
passed on this GPU, on another, on CPU only, or failed), the kernel cell from a coverage row,
which doctor entries apply to a lock, and how the page colours and words them. No registry,
no Docker: the registry's answers are the dataclasses it is read into."""

from __future__ import annotations

import pytest

from imgbuild.catalog.failures import Fingerprint
from imgbuild.cli.views import report_html as H
from imgbuild.lock.lockfile import LockedPackage, Lockfile
from imgbuild.pipeline import report as R
from imgbuild.pipeline.report import (
    ABSENT,
    BUILT,
    NO_RECORD,
    NONE,
    NOT_KNOWN,
    PTX,
    SASS,
    SMOKE_CPU,
    SMOKE_FAILED,
    SMOKE_GPU,
    Cell,
    GpuColumn,
    PlatformSection,
    Published,
    Smoke,
)

B200 = GpuColumn("B200", ("B200",), "sm100", "Blackwell", 180, "x86_64")
RTX = GpuColumn("RTX PRO 6000", ("RTX PRO 6000",), "sm120", "Blackwell", 96, "x86_64")
DIGEST = "sha256:" + "ab" * 32


def _sec(published: Published | None) -> PlatformSection:
    return PlatformSection("linux/amd64", "x86_64", "tag", "key", ("sm100",), "13.0", "580",
                           (), "slim", "base", "3.12", "lockfiles/t.txt", "h", 10, None, (), (),
                           (), "imgbuild pull t", None, published)


def _smoke(ok=True, gpu="NVIDIA B200 (sm100)", when=None, stages=None):
    stages = stages or (("versions", "pass", ""), ("gpu-engine", "pass" if ok else "fail", ""))
    return Smoke(ok, stages, gpu, when, "img", False)


def _pub(digest=DIGEST, smoke=None):
    return Published("reg/r", "reg/r:tag", digest, (), smoke, "sha256-ab.smoke" if smoke else None)


def test_without_a_registry_nothing_is_claimed():
    for sec in (None, _sec(None)):
        word, why, ev = R._image_cell("t", sec, B200)
        assert word == NOT_KNOWN and "not known" in why and ev == ()


def test_a_tag_not_in_the_registry_is_absent():
    word, why, ev = R._image_cell("t", _sec(_pub(digest=None)), B200)
    assert word == ABSENT and why == "reg/r:tag is not in reg/r"
    assert ev == (R.anchor("t", "t", "linux/amd64", "registry"),)


def test_a_pushed_image_without_a_report_is_built_not_tested():
    word, why, _ = R._image_cell("t", _sec(_pub()), B200)
    assert word == BUILT and DIGEST in why and "no smoke report" in why


def test_smoke_tested_on_gpu_only_on_the_gpus_arch():
    word, why, _ = R._image_cell("t", _sec(_pub(smoke=_smoke(when="2026-12-01T20:05:01"))), B200)
    assert word == SMOKE_GPU
    assert why == "on NVIDIA B200 (sm100), 2026-12-01T20:05:01; passed: versions, gpu-engine"
    # The same report on another arch's column: it passed, but not on this GPU.
    word, why, _ = R._image_cell("t", _sec(_pub(smoke=_smoke())), RTX)
    assert word == SMOKE_CPU and why.startswith("on NVIDIA B200 (sm100), not this GPU")
    # sm10 must not match sm100 by prefix.
    other = GpuColumn("X", ("X",), "sm10", "old", 1, "x86_64")
    assert R._image_cell("t", _sec(_pub(smoke=_smoke())), other)[0] == SMOKE_CPU


def test_a_cpu_only_report_is_never_a_gpu_claim():
    word, why, _ = R._image_cell("t", _sec(_pub(smoke=_smoke(gpu=None))), B200)
    assert word == SMOKE_CPU and why.startswith("on CPU only, no GPU stage ran")


def test_a_failed_report_is_a_failure_even_with_a_gpu():
    sm = _smoke(ok=False, stages=(("versions", "pass", ""), ("model", "fail", "x"),
                                  ("gpu-engine", "fail", "y")))
    word, why, _ = R._image_cell("t", _sec(_pub(smoke=sm)), B200)
    assert word == SMOKE_FAILED and why == "stages failed: model, gpu-engine"
    word, why, _ = R._image_cell("t", _sec(_pub(smoke=_smoke(ok=False, stages=(
        ("a", "pass", ""),)))), B200)
    assert word == SMOKE_FAILED and why == "stages failed: ?"


def test_the_smoke_report_read_from_the_registry():
    doc = {"ok": True, "image": "i", "forced": True,
           "reused": "local cache, run 2026-12-01T20:05:01+00:00",
           "stages": [{"name": "versions", "status": "pass", "reason": "r"},
                      {"name": "gpu-engine", "status": "pass",
                       "details": {"gpu": "NVIDIA B200", "sm": "sm100"}}, "junk"]}
    s = R._smoke(doc)
    assert s.ok and s.forced and s.image == "i"
    assert s.gpu == "NVIDIA B200 (sm100)" and s.when == "2026-12-01T20:05:01+00:00"
    assert s.stages == (("versions", "pass", "r"), ("gpu-engine", "pass", ""))
    # A GPU stage that did not pass names no GPU; no `reused`: no time.
    doc["stages"][1]["status"] = "skip"
    doc.pop("reused")
    s = R._smoke(doc)
    assert s.gpu is None and s.when is None
    assert R._smoke({}).ok is False


# --- kernels ---------------------------------------------------------------------------------

BASE = dict(target="t", gpu="B200", platform="linux/amd64", image=NOT_KNOWN, image_reason="",
            model_fit=None)


@pytest.mark.parametrize("rows, status", [
    ((("torch", "sass"), ("flashinfer", "sass")), SASS),
    ((("torch", "sass"), ("flashinfer", "ptx")), PTX),
    ((("torch", "ptx"), ("flashinfer", "none")), NONE),
    ((("torch", "sass"), ("deep-gemm (shown)", "none")), SASS),  # shown only: not required
    ((("torch", "sass"), ("triton", "jit")), SASS),  # JIT: not required
    ((("x (shown)", "ptx"),), SASS),  # nothing required: nothing missing
])
def test_a_kernel_cell_is_the_worst_over_the_required_packages(rows, status):
    c = R._kernel_cell(dict(BASE), rows, "sm100", "built for sm100", ("ev",))
    assert c.status == status and c.kernels == rows and c.evidence == ("ev",)
    assert c.reason.startswith("built for sm100")


def test_a_kernel_cells_reason_names_each_kind():
    rows = (("torch", "sass"), ("flashinfer", "ptx"), ("deep-gemm (shown)", "none"),
            ("triton", "jit"))
    c = R._kernel_cell(dict(BASE), rows, "sm100", "", ())
    assert c.reason == ("PTX only (the driver compiles it at first launch): flashinfer; "
                        "nothing for sm100 in deep-gemm (not required); JIT at first use: triton")
    c = R._kernel_cell(dict(BASE), (("torch", "sass"), ("fi", "sass")), "sm100", "", ())
    assert c.reason == "SASS for sm100 in every required package (2)"
    c = R._kernel_cell(dict(BASE), (), "sm100", "lead", ())
    assert c.status == NO_RECORD and c.reason.startswith("lead; no kernel coverage recorded")


# --- which doctor entries a lock's page lists ------------------------------------------------

def _lock(**versions: str) -> Lockfile:
    from pathlib import Path
    pkgs = tuple(LockedPackage(n, v, ("sha256:" + "0" * 64,)) for n, v in versions.items())
    return Lockfile(Path("lockfiles/t.txt"), "t", "", "", "", pkgs)


def _fp(applies_to) -> Fingerprint:
    return Fingerprint("f", "t", "error", (), "", "", applies_to=applies_to)


def test_a_failure_applies_inside_its_range_only():
    lock = _lock(sglang="0.5.16", vllm="0.11.0rc1")
    assert R._applies(_fp(()), lock) == "any engine"
    assert R._applies(_fp((("sglang", ">=0.5.7,<0.5.17"),)), lock) == \
        "sglang 0.5.16 (in >=0.5.7,<0.5.17)"
    assert R._applies(_fp((("sglang", ">=0.5.17"),)), lock) is None
    assert R._applies(_fp((("sglang", "<0.5.16"),)), lock) is None
    assert R._applies(_fp((("sglang", "<=0.5.16"),)), lock) is not None
    assert R._applies(_fp((("sglang", ""),)), lock) == "sglang 0.5.16"
    assert R._applies(_fp((("torch", ""),)), lock) is None  # not in the lock
    assert R._applies(_fp((("vllm", "<0.11"),)), lock) is None
    assert R._applies(_fp((("vllm", ">=0.10"),)), lock) is not None  # a pre-release counts
    assert R._applies(_fp((("sglang", "not a spec"),)), lock) is None
    assert R._applies(_fp((("torch", ""), ("sglang", ">=0.5"))), lock) == \
        "sglang 0.5.16 (in >=0.5)"


def test_a_cause_without_a_log_takes_the_wording_without():
    assert R._plain("load [[of {model}||of the model]] failed: {error} ") == \
        "load of the model failed: <error>"
    assert R._plain("a[[ only with a log]] b") == "a b"


@pytest.mark.parametrize("created_by, comment, step", [
    ("RUN |1 A=b c /bin/sh -c uv pip install x # buildkit", "", "RUN uv pip install x"),
    ("/bin/sh -c #(nop)  CMD [\"x\"]", "", "CMD [\"x\"]"),
    ("RUN /bin/sh -c if [ -f a ]; then b; fi; uv sync # buildkit", "", "RUN uv sync"),
    ("", "imported", "base layer (imported)"), ("", "", "base layer"),
])
def test_a_layers_step_as_people_read_it(created_by, comment, step):
    assert R._step(created_by, comment) == step


def test_anchors():
    assert R.anchor("t", "SGLang Blackwell", "linux/amd64", "") == \
        "t-sglang-blackwell-linux-amd64"


# --- the page ----------------------------------------------------------------------------------

def _cell(status=SASS, image=NOT_KNOWN, model_fit=None):
    return Cell("t", "B200", status, "r", "linux/amd64", image=image, image_reason="ir",
                model_fit=model_fit)


@pytest.mark.parametrize("status, image, cls", [
    (SASS, NOT_KNOWN, "ok"), (SASS, SMOKE_FAILED, "bad"), (PTX, SMOKE_FAILED, "bad"),
    (PTX, SMOKE_GPU, "warn"), (NONE, SMOKE_GPU, "bad"), (R.REFUSED, "", "bad"),
    (R.NOT_BUILT, "", "off"), (R.CPU_ONLY, SMOKE_CPU, "off"), (NO_RECORD, NOT_KNOWN, "warn"),
    (R.CPU_ONLY, SMOKE_FAILED, "bad"), (SASS, BUILT, "ok"), (SASS, ABSENT, "ok"),
])
def test_a_matrix_cells_colour(status, image, cls):
    assert H._matrix_cell(_cell(status, image)).startswith(f'<td class="{cls}"')


def test_a_matrix_cell_says_when_the_model_does_not_fit():
    html = H._matrix_cell(_cell(model_fit="k2.6 does not fit on 8x B200 (...)"))
    assert "model does not fit" in html
    assert "model does not fit" not in H._matrix_cell(_cell(model_fit="k2.6 fits on 8x B200"))
    assert "| image: ir" in html and f"<small>{NOT_KNOWN}</small>" in html
    assert "<small>" not in H._matrix_cell(_cell(R.REFUSED, image="")).split("</span>", 1)[1]


def test_image_and_status_classes_claim_no_more_than_the_words():
    assert H.IMAGE_CLASS[NOT_KNOWN] == "off" and H.IMAGE_CLASS[ABSENT] == "off"
    assert H.IMAGE_CLASS[BUILT] == "warn" and H.IMAGE_CLASS[SMOKE_FAILED] == "bad"
    assert H.IMAGE_CLASS[SMOKE_GPU] == "ok"
    assert H.STATUS_CLASS[PTX] == "warn" and H.STATUS_CLASS[NONE] == "bad"


def test_the_published_block_says_whether_and_by_whom_it_is_signed():
    from dataclasses import replace

    from imgbuild.catalog.registries import SignPolicy
    from imgbuild.pipeline.report import TargetSection, signature_words

    t = TargetSection("t", "", "sglang", "1", (), (), (), (), ())
    assert signature_words(None, [], 0, "reg/r") == "not signed"
    assert "2 cosign signatures stored; no signed-by policy for reg/r" in \
        signature_words(None, [], 2, "reg/r")
    policy = SignPolicy("images/registries.yaml", key="k.pub")
    ok = [("signature", True, "signed by sha256:1234 (the policy's key)"),
          ("attestation cyclonedx", True, "https://cyclonedx.org/bom, signed by sha256:1234")]
    words = signature_words(policy, ok, 0, "reg/r")
    assert words.startswith("signed by sha256:1234") and "NOT" not in words
    bad = signature_words(policy, [ok[0], ("attestation slsaprovenance1", False, "none")], 0,
                          "reg/r")
    assert bad.startswith("NOT accepted by the signed-by policy (images/registries.yaml)")
    assert "attestation slsaprovenance1: none" in bad
    html = H._published(t, _sec(replace(_pub(), signature=words)))
    assert "<b>signature</b>: signed by sha256:1234" in html
    assert "<b>signature</b>" not in H._published(t, _sec(_pub()))


def test_the_published_block_says_what_was_stored():
    from imgbuild.pipeline.report import TargetSection
    t = TargetSection("t", "", "sglang", "1", (), (), (), (), ())
    assert "registry: not known" in H._published(t, _sec(None))
    assert "is not in" in H._published(t, _sec(_pub(digest=None)))
    html = H._published(t, _sec(_pub()))
    assert "smoke report: none stored" in html
    html = H._published(t, _sec(_pub(smoke=_smoke(gpu=None))))
    assert "passed, on CPU (no GPU stage ran), time not recorded" in html
    html = H._published(t, _sec(_pub(smoke=_smoke(ok=False, when="2026-12-01"))))
    assert "failed, GPU stage on NVIDIA B200 (sm100), 2026-12-01" in html


def test_the_pages_small_parts_word_for_word():
    from imgbuild.cli.views import report_html as page
    from imgbuild.pipeline.report import TargetSection

    assert [page.human(n) for n in (999, 1000, 1_500_000, 2_000_000_000)] == [
        "999 B", "1.00 kB", "1.50 MB", "2.00 GB"]
    t = TargetSection("t", "d", "sglang", "0.5.23", (), (
        ("compressed-tensors==0.19.0", "NVFP4 needs it", "https://github.com/x/y/issues/1"),
        ("numpy==2.0.0", "a pin <of ours>", "http://not-https.example")), (), (), ())
    assert page._overrides(t).split("<ul>")[1].split("</ul>")[0] == (
        "<li><code>compressed-tensors==0.19.0</code>: NVFP4 needs it (<a href=\""
        "https://github.com/x/y/issues/1\">https://github.com/x/y/issues/1</a>)</li>"
        "<li><code>numpy==2.0.0</code>: a pin &lt;of ours&gt;</li>")
    assert page._failures(t) == ("<h3>Known failures</h3><p>none in the doctor's catalog for "
                                 "this lock</p>")


def test_which_models_a_targets_section_lists_and_in_what_role(tmp_path):
    import shutil

    from imgbuild.pipeline import report as rp
    from imgbuild.workspace import Workspace

    from .conftest import ROOT

    shutil.copytree(ROOT / "images", tmp_path / "images")
    (tmp_path / "images" / "models" / "plain.yaml").write_text(
        "checkpoint: org/plain\nsize_gb: 1\nquantization: {formats: [float-quantized]}\n")
    ws = Workspace(tmp_path / "images", ROOT / "lockfiles")
    gpu = ws.catalog.target("sglang-blackwell")
    rows = {r.alias: r for r in rp._models(ws, gpu, None)}
    assert [(a, r.role) for a, r in sorted(rows.items(), key=lambda x: list(rows).index(x[0]))] \
        == [("k2.6", "default"), ("tiny-nvfp4", "smoke test"), ("plain", "with --model")]
    assert rows["plain"].quantization == "float-quantized"  # no summary: the formats
    cpu = ws.catalog.target("tiny-cpu")
    assert [r.alias for r in rp._models(ws, cpu, None)] == ["tiny-nvfp4", "plain"]  # no k2.6
    (tmp_path / "images" / "models" / "plain.yaml").write_text("checkpoint: org/plain\n"
                                                               "size_gb: 1\nquantization: {}\n")
    ws = Workspace(tmp_path / "images", ROOT / "lockfiles")
    assert {r.alias: r.quantization for r in rp._models(ws, gpu, None)}["plain"] == "not stated"


LONG_STEP = ("RUN uv pip install --no-deps -r /opt/imgbuild/heavy.txt && rm -rf /root/.cache/uv "
             "/tmp/* && echo done with it")


def test_the_published_block_word_for_word():
    """Everything a registry can hold for one content tag, as the page shows it: the pull
    lines, the layers by step (a long step cut in the middle, a layer no step names by its
    digest), the signature, and a stored smoke report that was forced."""
    from dataclasses import replace

    from imgbuild.pipeline.report import Layer, TargetSection

    t = TargetSection("t", "", "sglang", "1", (), (), (), (), ())
    zstd = "application/vnd.oci.image.layer.v1.tar+zstd"
    pub = Published("reg/r", "reg/r:tag", DIGEST, (
        Layer("sha256:" + "1" * 64, 2_000_000, zstd, LONG_STEP),
        Layer("sha256:" + "2" * 64, 500_000, zstd, "")), Smoke(
            True, (("versions", "pass", "41 packages"), ("gpu-engine", "fail", "<no GPU>"),
                   ("kernels", "skipped", "")),
            "NVIDIA B200 (sm100)", "2026-12-01T10:00:00", "img", True),
        "sha256-ab.smoke", "signed by k")
    html = H._published(t, replace(_sec(pub), docker_pull=f"docker pull reg/r@{DIGEST}"))
    assert html == (
        f'<div id="t-t-linux-amd64-registry"><b>pull</b><pre>imgbuild pull t\n'
        f"docker pull reg/r@{DIGEST}</pre>"
        f'<dl class="kv"><dt>image</dt><dd><code>reg/r:tag</code></dd><dt>digest</dt><dd>'
        f"<code>{DIGEST}</code></dd><dt>compressed size</dt><dd>2.50 MB in 2 layers</dd></dl>"
        "<p>where the bytes are (each layer, compressed, as the manifest says; the step from "
        "the image config's history):</p><div class=\"bars\">"
        '<span class="step" title="RUN uv pip install --no-deps -r /opt/imgbuild/heavy.txt '
        '&amp;&amp; rm -rf /root/.cache/uv /tmp/* &amp;&amp; echo done with it (sha256:'
        + "1" * 64 + ')"><code>RUN uv pip install --no-deps -r /opt/imgbuild/he…-rf '
        "/root/.cache/uv /tmp/* &amp;&amp; echo done with it</code></span>"
        '<span class="bar" style="width:100.0%"></span><span>2.00 MB</span>'
        '<span class="step" title="sha256:' + "2" * 64 + '"><code>sha256:' + "2" * 64
        + '</code></span><span class="bar" style="width:25.0%"></span><span>500.00 kB</span>'
        "</div><p><b>signature</b>: signed by k</p>"
        '<p id="t-t-linux-amd64-smoke"><b>smoke report</b> <code>sha256-ab.smoke</code>: '
        "passed, GPU stage on NVIDIA B200 (sm100), 2026-12-01T10:00:00 <b>(forced)</b></p>"
        '<div class="scroll"><table><tbody>'
        '<tr><th>versions</th><td class="ok">pass</td><td>41 packages</td></tr>'
        '<tr><th>gpu-engine</th><td class="bad">fail</td><td>&lt;no GPU&gt;</td></tr>'
        '<tr><th>kernels</th><td class="off">skipped</td><td></td></tr>'
        "</tbody></table></div></div>")
    # the other two endings, word for word too
    assert H._published(t, _sec(None)) == (
        '<div id="t-t-linux-amd64-registry"><b>pull</b><pre>imgbuild pull t</pre>'
        "<p>registry: not known (no registry given)</p></div>")
    assert H._published(t, _sec(_pub(digest=None))) == (
        '<div id="t-t-linux-amd64-registry"><b>pull</b><pre>imgbuild pull t</pre>'
        "<p><code>reg/r:tag</code> is not in <code>reg/r</code></p></div>")
    # a report stored without its tag said: an empty code, not the word None
    html = H._published(t, _sec(replace(_pub(smoke=_smoke()), smoke_tag=None)))
    assert "<b>smoke report</b> <code></code>: passed" in html


def test_a_step_is_cut_in_the_middle_past_96_characters():
    assert H._cut("x" * 96) == "x" * 96
    assert H._cut("a" * 48 + "b" + "c" * 48) == "a" * 48 + "…" + "c" * 47


def test_the_kernel_and_stage_words_and_colours():
    assert [(H._kword(s), H._kclass(s)) for s in ("sass", "ptx", "jit", "none", "-", "odd")] == [
        ("SASS", "ok"), ("PTX (JIT by the driver)", "warn"), ("JIT at first use", "off"),
        ("nothing", "bad"), ("not needed", "off"), ("odd", "off")]
    assert [H._sclass(s) for s in ("pass", "fail", "skipped")] == ["ok", "bad", "off"]


def test_an_evidence_link_is_named_for_what_it_points_at():
    from imgbuild.pipeline.report import anchor

    # a target whose own name holds "-kernels-": the arch is after the last one
    assert H._evidence_label(anchor("t", "my-kernels-test", "linux/amd64", "kernels",
                                    "sm100")) == "kernels sm100"
    assert H._evidence_label(anchor("t", "x", "linux/amd64", "registry")) == "registry"
    assert H._evidence_label(anchor("t", "x", "linux/amd64", "lock")) == "lock"
    assert H._evidence_label(anchor("t", "x", "linux/amd64", "plan")) == "plan"
    assert H._evidence_label(anchor("t", "x", "linux/amd64")) == "plan"


def test_a_package_an_arch_does_not_list_is_not_needed_there():
    from imgbuild.pipeline.report import TargetSection

    t = TargetSection("t", "", "sglang", "1", (), (), (), (), ())
    sec = _sec(None)
    from dataclasses import replace

    sec = replace(sec, kernel_coverage=(("sm100", (("flashinfer", "sass"),)),
                                        ("sm120", (("deep-gemm", "none"),))))
    html = H._coverage(t, sec)
    assert '<tr><th>deep-gemm</th><td class="off">not needed</td><td class="bad">nothing</td>' \
        in html


def test_a_targets_patches_and_its_refusal_are_on_its_section():
    from imgbuild.pipeline.report import Report, TargetSection

    t = TargetSection("t", "d", "sglang", "1", (), (), (
        ("sglang-nvfp4-moe", "sglang >=0.5.16,<0.5.17", "NVFP4 MoE weights load", "sgl#123"),
        ("other", "vllm ==0.6.5", "a fix", "")), (), (), error="no lock yet")
    page = H._overrides(t)
    assert page.endswith(
        "<ul><li><code>sglang-nvfp4-moe</code> for sglang &gt;=0.5.16,&lt;0.5.17: NVFP4 MoE "
        "weights load <small>upstream: sgl#123</small></li>"
        "<li><code>other</code> for vllm ==0.6.5: a fix</li></ul>")
    html = H._target(Report(None, (), (t,), ()), t)
    assert '<p class="bad">does not plan: no lock yet</p>' in html


def test_the_page_names_the_registry_it_read_and_is_written_again_in_place(tmp_path):
    from imgbuild.pipeline.report import Report

    page = H.render(Report("reg.example/acme", (), (), ()))
    assert ", and what <code>reg.example/acme</code> holds (content tags, layers, stored " \
           "smoke reports)" in page
    assert "no registry was given" in H.render(Report(None, (), (), ()))
    out = tmp_path / "site"
    assert H.write(Report(None, (), (), ()), out) == out / "index.html"
    assert H.write(Report(None, (), (), ()), out).read_text().startswith("<!doctype html>")
