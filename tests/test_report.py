"""`imgbuild report`: the compatibility page. Its cells are what the Plan and the registry say
(checked here against make_plan, `plan --json` and the stored smoke report), the same inputs
give the same bytes, every string is escaped, and the page opens in a real browser (headless
Chromium) with the matrix readable from the DOM."""

from __future__ import annotations

import dataclasses
import json
import shutil
import subprocess
import uuid
from html.parser import HTMLParser
from pathlib import Path

import pytest

from imgbuild.cli.views import report_html
from imgbuild.errors import InputError
from imgbuild.pipeline import report as rp
from imgbuild.plan.decide import make_plan

from .conftest import REGISTRY_HOST, ROOT, registry_available, run_imgbuild

HEADLINE = "sglang-blackwell"
SHARED_REPO = f"{REGISTRY_HOST}/imgbuild"  # where `make demo` pushes tiny-cpu


@pytest.fixture(scope="module")
def report(ws) -> rp.Report:
    return rp.collect(ws, targets=("tiny-cpu", HEADLINE))


def _expected_word(rows: tuple[tuple[str, str], ...]) -> str:
    """What the kernel rows mean for one arch, said independently of the report's code: the
    worst status of the required packages (not `(shown)`, not JIT)."""
    required = [s for p, s in rows if not p.endswith("(shown)") and s != "jit"]
    if "none" in required:
        return rp.NONE
    return rp.PTX if "ptx" in required else rp.SASS


# --- the collected Report, without a registry ----------------------------------------------

def test_tiny_cpu_cells_say_what_its_plan_says(ws, report):
    plan = make_plan(ws, "tiny-cpu", resolve=False)
    assert plan.archs == ("cpu",)
    for g in ws.catalog.gpus:
        c = report.cell("tiny-cpu", g.names[0])
        if g.cpu_arch == plan.cpu_arch:
            assert c.status == rp.CPU_ONLY, (g.names[0], c)
            assert c.platform == plan.platform
        else:  # a Grace host (aarch64): tiny-cpu has no arm64 image
            assert c.status == rp.REFUSED, (g.names[0], c)
            assert g.cpu_arch in c.reason and "linux/amd64" in c.reason
        # No registry: nothing is claimed about the image.
        assert c.image in (rp.NOT_KNOWN, ""), c
    sec = next(t for t in report.targets if t.name == "tiny-cpu")
    (p,) = sec.platforms
    assert (p.content_tag, p.lock_hash, p.archs) == (plan.content_tag, plan.lock_hash,
                                                     plan.archs)
    assert p.published is None and p.docker_pull is None
    assert p.pull == "imgbuild pull tiny-cpu --registry REGISTRY/REPO"


def test_headline_cells_are_the_plans_kernel_record(ws, report):
    plan = make_plan(ws, HEADLINE, resolve=False)
    coverage = dict(plan.kernel_coverage)
    checked = 0
    for g in ws.catalog.gpus:
        if g.sm not in plan.archs or g.cpu_arch != plan.cpu_arch:
            continue
        c = report.cell(HEADLINE, g.names[0])
        assert c.kernels == coverage[g.sm], g.names[0]
        assert c.status == _expected_word(coverage[g.sm]) == rp.SASS, (g.names[0], c)
        assert f"#{rp.anchor('t', HEADLINE, plan.platform, 'kernels', g.sm)}".lstrip("#") \
            in c.evidence
        checked += 1
    assert checked >= 3  # B200, RTX 5090, RTX PRO 6000
    sec = next(t for t in report.targets if t.name == HEADLINE)
    (p,) = sec.platforms
    assert (p.cuda, p.min_driver, p.content_tag) == (plan.cuda, plan.min_driver,
                                                     plan.content_tag)
    assert {o[0] for o in sec.overrides} == {o.requirement for o in plan.overrides}
    assert {m.alias for m in sec.models if m.role == "default"} == {plan.model}
    # Every kernel package in the record has its pin in the lock named as evidence.
    lock = ws.target(HEADLINE).lock()
    for label, line in p.kernel_lock_lines:
        pkg = lock.package(label.split(" ")[0])
        assert f"{pkg.name}=={pkg.version}" in line and line.startswith(plan.lock_path)


def test_a_gpu_outside_the_archs_gets_the_plans_refusal(ws, report):
    """V100 (sm70): the headline's CUDA 13 cannot compile for it. The cell carries the
    refusal make_plan itself raises for that arch, not words of the report's own."""
    with pytest.raises(InputError) as refused:
        make_plan(ws, HEADLINE, resolve=False, archs=("sm70",))
    c = report.cell(HEADLINE, "V100")
    assert c.status == rp.REFUSED
    assert refused.value.message in c.reason
    assert c.image == ""  # the image never starts there: nothing said about it
    # H100 (sm90): not one of the archs, but the lock carries code for it: "not built".
    make_plan(ws, HEADLINE, resolve=False, archs=("sm90",))
    h = report.cell(HEADLINE, "H100")
    assert h.status == rp.NOT_BUILT and "--arch sm90" in h.reason
    # GB200 sits in Grace (aarch64) hosts; the headline is amd64 only.
    gb = report.cell(HEADLINE, "GB200")
    assert gb.status == rp.REFUSED and "aarch64" in gb.reason and gb.platform is None


def test_failures_are_those_of_the_locked_versions(ws, report):
    lock = ws.target(HEADLINE).lock()
    sec = next(t for t in report.targets if t.name == HEADLINE)
    ids = {f.id for f in sec.failures}
    for fp in ws.failures.fingerprints:
        pkgs = [p for p, _ in fp.applies_to]
        if not fp.applies_to:
            assert fp.id in ids  # any engine
        elif not any(lock.package(p) for p in pkgs):
            assert fp.id not in ids, fp.id  # about a package this image does not carry
    assert all("{" not in f.fix and "[[" not in f.fix for f in sec.failures)


# --- the page -------------------------------------------------------------------------------

def test_same_inputs_same_bytes(ws, report):
    again = rp.collect(ws, targets=("tiny-cpu", HEADLINE))
    assert report_html.render(report) == report_html.render(again)
    assert json.dumps(report.to_dict()) == json.dumps(again.to_dict())


def test_the_report_and_its_page_are_the_reviewed_ones():
    """Every cell's claim, reason and evidence, and the page around them, as last reviewed
    (tests/golden/report/; `make golden` records them after a change meant to change a
    claim): a cell may say no more than the plan, the kernel record and the catalog hold.
    Collected here, not taken from the module's fixture: a test that reads a cached report
    runs none of the code that made it (mutation testing picks the tests that do)."""
    from . import golden

    got = golden.report_pages(ROOT / "images", ROOT / "lockfiles")
    want = golden.recorded_report()
    assert not (said := golden.differences(got, want, "collected")), said


class _Tags(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.tags: list[str] = []
        self.attrs: list[tuple[str, str | None]] = []

    def handle_starttag(self, tag, attrs):
        self.tags.append(tag)
        self.attrs += attrs


def test_odd_strings_are_escaped(report):
    odd = '<script>alert("x")</script> & \'quoted\' <b>'
    t = dataclasses.replace(report.targets[0], description=odd,
                            overrides=(("pkg==1", odd, 'javascript:alert("x")'),))
    cells = tuple(dataclasses.replace(c, reason=odd) if c.target == t.name else c
                  for c in report.cells)
    page = report_html.render(dataclasses.replace(report, targets=(t, *report.targets[1:]),
                                                  cells=cells))
    assert odd not in page and '<script>alert' not in page
    assert "&lt;script&gt;alert(&quot;x&quot;)&lt;/script&gt; &amp; &#x27;quoted&#x27;" in page
    p = _Tags()
    p.feed(page)
    assert p.tags.count("script") == 1  # the page's own filter, nothing injected
    assert p.tags.count("b") == page.count("<b>")  # no <b> from the odd string
    assert not any((v or "").startswith("javascript:") for _, v in p.attrs)


def test_cli_needs_an_output_and_writes_json(tmp_path):
    r = run_imgbuild("report", "tiny-cpu")
    assert r.returncode == 2 and "--html DIR" in r.stderr
    r = run_imgbuild("report", "tiny-cpu", "--json", "--html", str(tmp_path / "site"))
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    assert [t["name"] for t in doc["targets"]] == ["tiny-cpu"]
    assert len(doc["cells"]) == len(doc["gpus"])
    assert doc["registry"] is None
    page = (tmp_path / "site" / "index.html").read_text()
    assert page.startswith("<!doctype html>") and "http://" not in page.split("<main>")[0]


# --- against the registry, in a browser --------------------------------------------------

CHROMIUM_FLAGS = ("--headless", "--no-sandbox", "--disable-gpu", "--disable-quic",
                  "--no-first-run", "--disable-background-networking",
                  "--disable-component-update", "--disable-sync")


def _chromium() -> str:
    exe = shutil.which("chromium") or shutil.which("chromium-browser")
    if exe is None:
        pytest.skip("skipped: no headless Chromium here (Debian's `chromium` package; "
                    "scripts/services.sh installs it)")
    return exe


def _browser(exe: str, tmp: Path, page: Path, *what: str) -> subprocess.CompletedProcess:
    profile = tmp / f"chromium-{uuid.uuid4().hex[:6]}"
    profile.mkdir()
    return subprocess.run([exe, *CHROMIUM_FLAGS, f"--user-data-dir={profile}",
                           "--window-size=1280,2000", *what, page.as_uri()],
                          capture_output=True, text=True, timeout=180)


class _Matrix(HTMLParser):
    """Each matrix cell as the browser's DOM has it: (target, gpu) -> [word, image word]."""

    def __init__(self) -> None:
        super().__init__()
        self.cells: dict[str, list[str]] = {}
        self._in: str | None = None
        self._depth = 0
        self.ids: set[str] = set()
        self.table = False

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        if a.get("id"):
            self.ids.add(a["id"])
        if tag == "table" and a.get("id") == "matrix-table":
            self.table = True
        if self.table and tag == "a" and (a.get("href") or "").startswith("#c-"):
            self._in = a["href"][1:]
            self.cells[self._in] = []

    def handle_endtag(self, tag):
        if tag == "a":
            self._in = None
        if tag == "table":
            self.table = False

    def handle_data(self, data):
        if self._in and data.strip():
            self.cells[self._in].append(data.strip())


@pytest.mark.docker
def test_page_from_the_registry_in_chromium(ws, tmp_path):
    """The page made with `--registry` from what `make demo` pushed, opened in Chromium:
    tiny-cpu's cells say what `plan --json` and the stored smoke report say, the headline's
    what its kernel record says."""
    exe = _chromium()
    if not registry_available():
        pytest.skip(f"skipped: no registry on {REGISTRY_HOST} (make services starts one)")
    from imgbuild.image import registry as reg

    r = run_imgbuild("plan", "tiny-cpu", "--json", "--no-checks", "--registry", SHARED_REPO)
    assert r.returncode == 0, r.stderr
    tiny = json.loads(r.stdout)
    repo = reg.Repository.parse(SHARED_REPO)
    digest = reg.manifest_digest(repo, tiny["content_tag"])
    if digest is None:
        pytest.skip(f"skipped: {SHARED_REPO}:{tiny['content_tag']} is not pushed (make demo "
                    "pushes it)")
    stored = reg.fetch_report(repo, digest)
    site = tmp_path / "site"
    r = run_imgbuild("report", "tiny-cpu", HEADLINE, "--registry", SHARED_REPO,
                     "--html", str(site))
    assert r.returncode == 0, r.stderr
    page = site / "index.html"
    shot = tmp_path / "report.png"
    try:
        dom = _browser(exe, tmp_path, page, "--dump-dom")
        assert dom.returncode == 0 and "<table" in dom.stdout, dom.stderr[-2000:]
        m = _Matrix()
        m.feed(dom.stdout)
        assert "filter" in m.ids  # the inline script ran (and added the filter box)
        head = json.loads(run_imgbuild("plan", HEADLINE, "--json", "--no-checks",
                                       "--registry", SHARED_REPO).stdout)
        head_digest = reg.manifest_digest(repo, head["content_tag"])
        for g in ws.catalog.gpus:
            key = g.names[0]
            got = m.cells[rp.anchor("c", "tiny-cpu", key)]
            if g.cpu_arch != "x86_64":
                assert got == [rp.REFUSED], (key, got)
            else:
                assert got[0] == rp.CPU_ONLY, (key, got)
                if stored is None:
                    assert got[1] == rp.BUILT
                elif not stored["ok"]:
                    assert got[1] == rp.SMOKE_FAILED
                else:  # tiny-cpu's GPU stage never runs: no torch CUDA in a CPU image
                    gpu = next(s for s in stored["stages"] if s["name"] == "gpu-engine")
                    assert gpu["status"] != "pass"
                    assert got[1] == rp.SMOKE_CPU, (key, got)
            if g.sm in head["archs"] and g.cpu_arch == "x86_64":
                hot = m.cells[rp.anchor("c", HEADLINE, key)]
                rows = tuple(sorted(head["kernel_coverage"][g.sm].items()))
                assert hot[0] == _expected_word(rows), (key, hot)
                assert hot[1] == (rp.ABSENT if head_digest is None else hot[1])
        # The evidence the tiny-cpu cells link to: the digest, the docker pull line, the
        # stored report's stages with their statuses.
        text = dom.stdout
        assert f"docker pull {SHARED_REPO}@{digest}" in text
        if stored is not None:
            assert reg.report_tag(digest) in text
            for s in stored["stages"]:
                assert f"<th>{s['name']}</th><td class=" in text
        shotrun = _browser(exe, tmp_path, page, f"--screenshot={shot}")
        assert shotrun.returncode == 0 and shot.stat().st_size > 10_000, shotrun.stderr[-2000:]
    except AssertionError:
        if not shot.exists():
            _browser(exe, tmp_path, page, f"--screenshot={shot}")
        print(f"the page: {page}\nits screenshot: {shot}")
        raise


@pytest.mark.docker
def test_page_after_a_push_of_its_own(docker_client, tmp_path):
    """tiny-cpu built and pushed to a repository of this test's own, then the page: its
    cells say the image is there and smoke-tested, with the pushed digest."""
    if not registry_available():
        pytest.skip(f"skipped: no registry on {REGISTRY_HOST} (make services starts one)")
    from imgbuild.image import registry as reg

    repo = f"{REGISTRY_HOST}/imgbuild-test-report-{uuid.uuid4().hex[:8]}"
    r = run_imgbuild("build", "tiny-cpu", "--push", "--registry", repo)
    assert r.returncode == 0, r.stderr[-3000:]
    r = run_imgbuild("report", "tiny-cpu", "--registry", repo, "--json")
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    (sec,) = doc["targets"]
    (p,) = sec["platforms"]
    digest = reg.manifest_digest(reg.Repository.parse(repo), p["content_tag"])
    assert digest and p["published"]["digest"] == digest
    assert p["docker_pull"] == f"docker pull {repo}@{digest}"
    assert p["published"]["layers"] and all(x["size"] > 0 for x in p["published"]["layers"])
    stored = reg.fetch_report(reg.Repository.parse(repo), digest)
    assert stored is not None and p["published"]["smoke"]["ok"] == stored["ok"]
    words = {c["image"] for c in doc["cells"] if c["status"] == rp.CPU_ONLY}
    assert words == {rp.SMOKE_CPU if stored["ok"] else rp.SMOKE_FAILED}
