"""The documentation site, checked as a reader meets it.

- The generated references cannot go stale: every command and flag of the parser, and every key
  the catalog's readers accept, is on its reference page (imgbuild/docsgen.py, called directly).
- `mkdocs build --strict` builds the site (once for this module), with the compatibility page
  in it as `make docs` and the workflow's `pages` job put it there.
- The built site is served on a free port and opened in headless Chromium: every internal link
  and anchor, and every image, is checked in the browser's own view of each page (its DOM after
  the page's scripts ran), and the front page and the command-line reference are screenshotted
  (under the test's tmp dir and build/docs-screenshots/).
"""

from __future__ import annotations

import argparse
import functools
import http.server
import json
import os
import re
import shutil
import subprocess
import sys
import threading
import uuid
from pathlib import Path
from urllib.parse import urldefrag, urlsplit

import pytest

from imgbuild import docsgen
from imgbuild.cli.parser import parser

from .conftest import ROOT
from .test_report import CHROMIUM_FLAGS, _chromium

SHOTS = ROOT / "build" / "docs-screenshots"
GENERATED = ("reference/cli", "reference/catalog", "reference/failures", "reference/exit-codes",
             "performance")


# --- the references cannot drift from the code ----------------------------------------------

def _sections(page: str) -> dict[str, str]:
    """The CLI page cut at each `## ... {#anchor}` heading: anchor -> its text."""
    parts = re.split(r"^## .*\{#([\w-]+)\}$", page, flags=re.M)
    return {parts[i]: parts[i + 1] for i in range(1, len(parts) - 1, 2)}


def test_every_command_and_flag_is_in_the_cli_reference():
    page = docsgen.cli_reference()
    # A table cell writes | as \|; the reader sees |.
    sections = {k: v.replace("\\|", "|") for k, v in _sections(page).items()}
    common = sections["common-options"]
    cmds = docsgen.commands(parser())
    assert {c.name for c in cmds} >= {"build", "run", "doctor", "base bootstrap"}
    missing = []
    for c in cmds:
        text = sections.get(c.anchor)
        if text is None:
            missing.append(f"command `imgbuild {c.name}` has no section")
            continue
        for a in c.parser._actions:
            if isinstance(a, (argparse._HelpAction, argparse._SubParsersAction)):
                continue
            names = a.option_strings or [a.metavar if isinstance(a.metavar, str) else a.dest]
            for n in names:
                if f"`{n}" not in text and not ("(#common-options)" in text and f"`{n}`" in common):
                    missing.append(f"`imgbuild {c.name}`: `{n}` is not in its section")
    top = sections["imgbuild"]
    for a in parser()._actions:
        for n in a.option_strings:
            if n not in ("-h", "--help") and f"`{n}`" not in top:
                missing.append(f"`imgbuild {n}` is not in the reference")
    assert not missing, "\n".join(missing)


def test_the_references_are_the_reviewed_ones():
    """What a user reads in `--help` and on the reference pages changes only where a reviewer
    saw it change: each page as generated is the one in tests/golden/reference/ (`make golden`
    records it after a change meant to give new text)."""
    import sys

    from . import golden

    got, want = golden.references(ROOT), golden.recorded_references()
    assert set(got) == set(want), "pages: make golden"
    if sys.version_info[:2] != golden.REFERENCE_PYTHON:  # argparse lays out usage its own way
        del got["cli.md"], want["cli.md"]
    assert not (said := golden.differences(got, want, "generated")), said


def test_the_usage_lines_do_not_depend_on_the_terminal(monkeypatch):
    pages = []
    for columns in ("40", "250"):
        monkeypatch.setenv("COLUMNS", columns)
        pages.append(docsgen.cli_reference())
    assert pages[0] == pages[1]
    usages = [block.split("```")[0] for block in pages[0].split("```text")[1:]]
    # Folded at the fixed width; a single word longer than that (the command choices) stays
    # whole, as argparse leaves it.
    assert all(len(ln) <= docsgen.USAGE_WIDTH or len(ln.split()) == 1
               for u in usages for ln in u.splitlines())


def test_a_flag_added_to_the_parser_reaches_the_reference():
    p = parser()
    sub = next(a for a in p._actions if isinstance(a, argparse._SubParsersAction))
    sub.choices["run"].add_argument("--brand-new", help="a flag the reference must show")
    sections = _sections(docsgen.cli_reference(p))
    assert "`--brand-new`" in sections["run"] and "a flag the reference must show" in sections["run"]


def test_every_catalog_key_is_described_and_in_the_catalog_reference():
    assert docsgen.check_keys() == []
    page = docsgen.catalog_reference(ROOT / "images")
    for kind in docsgen.schema():
        assert f"{{#{kind}}}" in page
        for path in docsgen.schema_paths(kind):
            assert f"### `{path}` {{#{docsgen.key_anchor(kind, path)}}}" in page, (kind, path)
    # The keys the issue names, with an example from a shipped file.
    for anchor in ("target-smoke", "target-smoke-root-only", "prune-rules-package",
                   "registries-registries-compression", "model-tensor-parallel", "patch-probe"):
        assert f"{{#{anchor}}}" in page, anchor
    assert "From `images/sglang-blackwell.yaml`:" in page


def test_a_key_the_reader_accepts_but_nobody_described_fails_the_reference(monkeypatch):
    from imgbuild.catalog import targets

    monkeypatch.setattr(targets, "SMOKE_KEYS", targets.SMOKE_KEYS | {"gpu_only"})
    assert docsgen.check_keys() == [
        "target: key 'smoke.gpu_only' is accepted by the reader but not described in "
        "imgbuild/catalog/keys.yaml"]
    with pytest.raises(docsgen.DocsError, match="smoke.gpu_only"):
        docsgen.catalog_reference(ROOT / "images")
    desc = docsgen.described()
    desc["target"]["keys"]["smoke.gpu_only"] = {"type": "string", "about": "x"}
    desc["target"]["keys"]["smoke.retired"] = {"type": "string", "about": "x"}
    assert docsgen.check_keys(desc) == [
        "target: key 'smoke.retired' is described in imgbuild/catalog/keys.yaml but the reader "
        "refuses it"]


def test_every_known_failure_and_exit_code_is_on_its_page():
    import yaml

    failures = yaml.safe_load((ROOT / "images" / "checks" / "failures.yaml").read_text())
    page = docsgen.failures_reference(ROOT / "images" / "checks" / "failures.yaml")
    for f in failures["failures"]:
        assert f"## {f['id']} {{#{f['id']}}}" in page
    codes = docsgen.exit_codes_reference()
    for code in (0, 1, 2, 3, 130, 143):
        assert f"| {code} |" in codes


# --- the site, built once ---------------------------------------------------------------------

@pytest.fixture(scope="module")
def site(tmp_path_factory) -> Path:
    """`mkdocs build --strict`, then the compatibility page into it (as `make docs` does)."""
    out = tmp_path_factory.mktemp("docs") / "site"
    env = dict(os.environ, NO_MKDOCS_2_WARNING="1")
    r = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir",
                        str(out)], cwd=ROOT, env=env, capture_output=True, text=True,
                       timeout=300)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-5000:]
    r = subprocess.run([sys.executable, "-m", "imgbuild.cli", "report", "--html",
                        str(out / "compatibility")], cwd=ROOT, env=env, capture_output=True,
                       text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    return out


# Under xdist the tests that read the built site run on one worker: one build for them all.
SITE_GROUP = pytest.mark.xdist_group("docs-site")


@SITE_GROUP
def test_the_strict_build_has_every_generated_page(site):
    for page in GENERATED:
        assert (site / page / "index.html").is_file(), page
    assert list((site / "performance").glob("*.svg")), "no plot was drawn"
    assert (site / "compatibility" / "index.html").is_file()
    # Plots are generated files: none is committed.
    tracked = subprocess.run(["git", "ls-files", "docs"], cwd=ROOT, capture_output=True,
                             text=True, check=True).stdout.split()
    assert not [t for t in tracked if t.endswith(".svg") or "/reference/cli" in t]


class _Quiet(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args) -> None:
        pass


@pytest.fixture(scope="module")
def served(site):
    handler = functools.partial(_Quiet, directory=str(site))
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    t = threading.Thread(target=httpd.serve_forever, daemon=True)
    t.start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}"
    httpd.shutdown()
    httpd.server_close()


# One browser for every page: a page of the test's own loads each page of the site in a
# same-origin iframe, waits for it, and reads from its DOM what the browser made of it: every
# link (resolved by the browser), every id, every image and whether it loaded.
CRAWLER = """<!doctype html><html><body><pre id="out">running</pre><script>
const pages = %s;
function load(url) {
  return new Promise(resolve => {
    const f = document.createElement('iframe');
    f.style.width = '1280px'; f.style.height = '900px';
    f.onload = () => setTimeout(() => resolve(f), 50);
    f.src = url;
    document.body.appendChild(f);
  });
}
(async () => {
  const out = {};
  for (const p of pages) {
    const f = await load(p);
    const d = f.contentDocument;
    out[p] = {
      title: d.title,
      ids: [...d.querySelectorAll('[id]')].map(e => e.id)
             .concat([...d.querySelectorAll('a[name]')].map(e => e.name)),
      links: [...d.querySelectorAll('a[href]')].map(a => a.href),
      images: [...d.querySelectorAll('img')].map(i => [i.src, i.complete && i.naturalWidth > 0]),
    };
    f.remove();
  }
  document.getElementById('out').textContent = JSON.stringify(out);
})();
</script></body></html>
"""


def _pages(site: Path) -> list[str]:
    return sorted("/" + str(p.relative_to(site)).removesuffix("index.html")
                  for p in site.rglob("*.html") if "assets" not in p.parts
                  and p.name != "_crawl.html")


def _browser(exe: str, tmp: Path, url: str, *what: str) -> subprocess.CompletedProcess:
    profile = tmp / f"chromium-{uuid.uuid4().hex[:6]}"
    profile.mkdir()
    return subprocess.run([exe, *CHROMIUM_FLAGS, f"--user-data-dir={profile}",
                           "--window-size=1280,1600", *what, url],
                          capture_output=True, text=True, timeout=300)


def crawl(exe: str, site: Path, base: str, tmp: Path) -> dict:
    pages = _pages(site)
    (site / "_crawl.html").write_text(CRAWLER % json.dumps(pages))
    r = _browser(exe, tmp, f"{base}/_crawl.html", "--virtual-time-budget=120000", "--dump-dom")
    m = re.search(r'<pre id="out">(.*?)</pre>', r.stdout, re.S)
    assert r.returncode == 0 and m and m.group(1) != "running", r.stderr[-3000:]
    import html

    return json.loads(html.unescape(m.group(1)))


def broken(seen: dict, base: str) -> list[str]:
    """Every internal link whose page or anchor the browser did not find, and every image that
    did not load."""
    out = []
    for page, got in seen.items():
        for href in got["links"]:
            if not href.startswith(base + "/"):
                continue  # another site: not ours to check here
            url, frag = urldefrag(href)
            path = urlsplit(url).path
            path = path.removesuffix("index.html")
            target = seen.get(path) or seen.get(path + "/")
            if target is None:
                out.append(f"{page}: link to {path} (no such page)")
            elif frag and frag not in target["ids"]:
                out.append(f"{page}: link to {path}#{frag} (no such anchor)")
        for src, ok in got["images"]:
            if not ok:
                out.append(f"{page}: image {src} did not load")
    return out


@SITE_GROUP
def test_every_link_anchor_and_image_in_chromium(site, served, tmp_path):
    exe = _chromium()
    seen = crawl(exe, site, served, tmp_path)
    for page in GENERATED:
        assert f"/{page}/" in seen, f"{page}: not in the built site"
    assert len(seen) >= 25
    # The reference pages carry what they promise, as the browser shows them.
    assert "target-smoke-root-only" in seen["/reference/catalog/"]["ids"]
    assert "run" in seen["/reference/cli/"]["ids"]
    assert any(h.endswith("/compatibility/") for h in seen["/explanation/compatibility/"]["links"])
    bad = broken(seen, served)
    assert not bad, "\n".join(bad)
    # Screenshots a person can look at: the front page and a reference page.
    SHOTS.mkdir(parents=True, exist_ok=True)
    for name, path in (("front-page.png", "/"), ("reference-cli.png", "/reference/cli/")):
        shot = tmp_path / name
        r = _browser(exe, tmp_path, served + path, f"--screenshot={shot}")
        assert r.returncode == 0 and shot.stat().st_size > 10_000, r.stderr[-2000:]
        shutil.copy(shot, SHOTS / name)


def test_the_link_check_sees_a_broken_link_and_a_missing_page(tmp_path):
    """The checker itself: a page with a link to a missing page, a missing anchor and an image
    that does not load is reported three times; its good link is not."""
    exe = _chromium()
    site = tmp_path / "site"
    (site / "a").mkdir(parents=True)
    (site / "index.html").write_text(
        '<h1 id="top">x</h1><a href="a/#here">ok</a> <a href="a/#gone">bad anchor</a> '
        '<a href="missing/">missing page</a> <img src="plot.svg"> '
        '<a href="https://example.invalid/">elsewhere</a>')
    (site / "a" / "index.html").write_text('<h2 id="here">here</h2><a href="../#top">up</a>')
    handler = functools.partial(_Quiet, directory=str(site))
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    try:
        base = f"http://127.0.0.1:{httpd.server_address[1]}"
        bad = broken(crawl(exe, site, base, tmp_path), base)
    finally:
        httpd.shutdown()
        httpd.server_close()
    assert sorted(bad) == sorted([
        "/: link to /a/#gone (no such anchor)",
        "/: link to /missing/ (no such page)",
        f"/: image {base}/plot.svg did not load"]), bad
