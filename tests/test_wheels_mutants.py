"""lock/wheels.py against an index whose answers a test chooses: what the mutation run found
untested (bench/mutation.py). Engine-free and PyPI-free: a small PEP 691/503 index runs in this
process on loopback (JSON or HTML pages, PEP 658 metadata, Range, chosen failures) and serves
real wheels built by tests/wheelfactory.py; every request it answers is logged, so a test can
say what went over the network and what did not.
"""

from __future__ import annotations

import hashlib
import json
import os
import threading
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from packaging.tags import Tag
from packaging.version import Version

from imgbuild.errors import EnvError, JobFailed
from imgbuild.lock import wheels
from imgbuild.lock.lockfile import LockedPackage

from .wheelfactory import WheelSpec, make_wheel


def _sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@dataclass
class Served:
    """One file on the index and how the index describes it."""

    path: Path
    yanked: bool | str = False
    metadata: bool = False
    hashed: bool = True
    sha256: str | None = None  # what the index claims, when not the file's own


class _Handler(BaseHTTPRequestHandler):
    def do_GET(self):  # noqa: N802
        idx: Index = self.server.index  # type: ignore[attr-defined]
        idx.log.append((self.path, self.headers.get("Range")))
        idx.agents.add(self.headers.get("User-Agent"))
        codes = idx.fail.get(self.path)
        if codes:
            self._send(codes.pop(0), b"no", "text/plain")
            return
        parts = self.path.strip("/").split("/")
        if len(parts) == 3 and parts[1] == "simple":
            self._page(idx, parts[0], parts[2])
        elif parts[0] == "files" and len(parts) == 2:
            self._file(idx, parts[1])
        else:
            self._send(404, b"", "text/plain")

    def _page(self, idx: Index, kind: str, project: str) -> None:
        files = idx.projects.get(project)
        if files is None or kind not in ("json", "html"):
            self._send(404, b"not here", "text/plain")
            return
        if kind == "json" and "application/vnd.pypi.simple.v1+json" in self.headers.get(
                "Accept", ""):
            doc = {"meta": {"api-version": "1.0"}, "name": project, "files": [
                {"filename": s.path.name, "url": f"../../../files/{s.path.name}",
                 "hashes": {"sha256": s.sha256 or _sha(s.path)} if s.hashed else {},
                 "size": s.path.stat().st_size, "yanked": s.yanked,
                 **({"core-metadata": {"sha256": "x"}} if s.metadata else {})}
                for s in files]}
            self._send(200, json.dumps(doc).encode(), "application/vnd.pypi.simple.v1+json")
            return
        # HTML, with a <base> that the links are relative to
        links = []
        for s in files:
            frag = f"#sha256={(s.sha256 or _sha(s.path)).upper()}" if s.hashed else ""
            attrs = (' data-yanked=""' if s.yanked else "") + (
                ' data-core-metadata="true"' if s.metadata else ' data-core-metadata="false"')
            links.append(f'<a href="{s.path.name}{frag}"{attrs}>{s.path.name}</a><br>')
        body = ('<html><head><base href="/files/"></head><body><a>no href</a>'
                + "".join(links) + "</body></html>")
        self._send(200, body.encode(), "text/html")

    def _file(self, idx: Index, name: str) -> None:
        if name.endswith(".metadata"):
            whl = idx.root / name[:-len(".metadata")]
            import zipfile
            with zipfile.ZipFile(whl) as z:
                meta = next(n for n in z.namelist() if n.endswith("METADATA"))
                self._send(200, z.read(meta), "text/plain")
            return
        p = idx.root / name
        if not p.exists():
            self._send(404, b"", "text/plain")
            return
        data = p.read_bytes()
        rng = self.headers.get("Range")
        if rng and idx.range:
            spec = rng.split("=", 1)[1]
            a, b = spec.split("-")
            if a == "":
                start, end = max(0, len(data) - int(b)), len(data) - 1
            else:
                start, end = int(a), min(int(b), len(data) - 1)
            cr = "bytes */0" if idx.garbled_range else f"bytes {start}-{end}/{len(data)}"
            self._send(206, data[start:end + 1], "application/octet-stream",
                       {} if idx.no_content_range else {"Content-Range": cr})
            return
        self._send(200, data, "application/octet-stream")

    def _send(self, code: int, body: bytes, ctype: str, extra: dict | None = None) -> None:
        self.send_response(code)
        if not self.server.index.untyped:  # type: ignore[attr-defined]
            self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(body)))
        for k, v in (extra or {}).items():
            self.send_header(k, v)
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *a):
        pass


class Index:
    """The index: `projects` maps a name to its files; `fail` maps a path to status codes
    answered (once each) before the real answer; `log` is every (path, Range) asked."""

    def __init__(self, root: Path):
        self.root = root
        self.projects: dict[str, list[Served]] = {}
        self.fail: dict[str, list[int]] = {}
        self.log: list[tuple[str, str | None]] = []
        self.agents: set[str | None] = set()
        self.range = True
        self.garbled_range = False
        self.no_content_range = False
        self.untyped = False
        self.srv = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
        self.srv.index = self  # type: ignore[attr-defined]
        self.base = f"http://127.0.0.1:{self.srv.server_address[1]}"
        self.json = self.base + "/json/simple/"
        self.html = self.base + "/html/simple/"
        # a short poll: shutdown waits for it, once per test
        threading.Thread(target=self.srv.serve_forever, args=(0.01,), daemon=True).start()

    def add(self, spec: WheelSpec, **how) -> Path:
        path = make_wheel(spec, self.root)
        self.projects.setdefault(spec.name, []).append(Served(path, **how))
        return path

    def files(self) -> list[str]:
        return [p for p, _ in self.log if p.startswith("/files/")]


@pytest.fixture()
def idx(tmp_path, monkeypatch):
    monkeypatch.setenv("IMGBUILD_CACHE", str(tmp_path / "cache"))
    for var in ("UV_DEFAULT_INDEX", "UV_INDEX_URL", "PIP_INDEX_URL"):
        monkeypatch.delenv(var, raising=False)
    wheels._pages.clear()
    i = Index(tmp_path / "files")
    yield i
    i.srv.shutdown()
    i.srv.server_close()
    wheels._pages.clear()


def _pkg(path: Path, name: str, version: str, *more: str) -> LockedPackage:
    return LockedPackage(name, version, (f"sha256:{_sha(path)}", *more))


# --- where things are ------------------------------------------------------------------------

def test_the_cache_root_is_imgbuild_cache_else_under_home(tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.setenv("IMGBUILD_CACHE", "~/elsewhere")
    assert wheels.cache_root() == tmp_path / "home" / "elsewhere"
    assert wheels.wheel_cache_dir() == tmp_path / "home" / "elsewhere" / "wheels"
    monkeypatch.delenv("IMGBUILD_CACHE")
    assert wheels.cache_root() == tmp_path / "home" / ".cache" / "imgbuild"


def test_the_default_index_is_uvs_choice_in_uvs_order(monkeypatch):
    for var in ("UV_DEFAULT_INDEX", "UV_INDEX_URL", "PIP_INDEX_URL"):
        monkeypatch.delenv(var, raising=False)
    assert wheels.default_index_urls() == ("https://pypi.org/simple/",)
    monkeypatch.setenv("PIP_INDEX_URL", "http://pip/simple")
    monkeypatch.setenv("UV_INDEX_URL", "")  # set but empty: not a choice
    assert wheels.default_index_urls() == ("http://pip/simple",)
    monkeypatch.setenv("UV_INDEX_URL", "http://uv/simple")
    assert wheels.default_index_urls() == ("http://uv/simple",)
    monkeypatch.setenv("UV_DEFAULT_INDEX", "http://default/simple/")
    assert wheels.index_urls(["http://extra/simple", "http://default/simple/",
                              "http://extra/simple/"]) == (
        "http://default/simple/", "http://extra/simple/")


def test_a_cached_wheel_is_the_verified_whl_not_a_partial_download(tmp_path, monkeypatch):
    monkeypatch.setenv("IMGBUILD_CACHE", str(tmp_path))
    d = tmp_path / "wheels" / "ab"
    assert wheels.cached_wheel("ab") is None  # no directory
    d.mkdir(parents=True)
    (d / ".x-1.0-py3-none-any.whl.tmp").write_text("")  # a download under way
    (d / ".y-1.0-py3-none-any.whl").write_text("")
    (d / "notes.txt").write_text("")
    assert wheels.cached_wheel("ab") is None
    (d / "x-1.0-py3-none-any.whl").write_text("")
    assert wheels.cached_wheel("ab") == d / "x-1.0-py3-none-any.whl"


# --- reading the index -----------------------------------------------------------------------

@pytest.mark.parametrize("kind", ["json", "html"])
def test_an_index_page_is_read_whole(idx, kind):
    a = idx.add(WheelSpec("Proj.Name", "1.0"), metadata=True)
    idx.add(WheelSpec("Proj.Name", "2.0rc1", tag="cp311-cp311-manylinux_2_28_x86_64"),
                yanked="broken", hashed=False)
    sdist = idx.root / "proj_name-1.0.tar.gz"
    sdist.write_bytes(b"sdist")
    odd = idx.root / "proj_name-x.whl"  # not a wheel name a version can be read from
    odd.write_bytes(b"")
    idx.projects["proj-name"] = idx.projects.pop("Proj.Name") + [Served(sdist), Served(odd)]
    url = idx.json if kind == "json" else idx.html
    files = wheels.project_files("Proj.Name", url)
    assert [p for p, _ in idx.log] == [f"/{kind}/simple/proj-name/"]  # canonical name
    fa, fb, fs, fo = files
    assert (fa.filename, fa.url, fa.sha256, fa.yanked, fa.version, fa.index) == (
        a.name, f"{idx.base}/files/{a.name}", _sha(a), False, Version("1.0"), url)
    assert fa.tags == frozenset({Tag("py3", "none", "any")}) and fa.is_wheel
    assert fa.metadata_url == f"{idx.base}/files/{a.name}.metadata"
    assert fa.size == (a.stat().st_size if kind == "json" else None)
    assert (fb.sha256, fb.yanked, fb.version, fb.metadata_url) == (
        None, True, Version("2.0rc1"), None)
    assert Tag("cp311", "cp311", "manylinux_2_28_x86_64") in fb.tags
    assert (fs.version, fs.tags, fs.is_wheel) == (None, frozenset(), False)
    assert (fo.version, fo.tags) == (None, frozenset())
    # one page, read once for the life of the process
    assert wheels.project_files("proj-name", url) is files and len(idx.log) == 1


def test_an_html_link_without_a_label_is_named_by_its_url(idx):
    p = idx.add(WheelSpec("lab", "1.0"))
    from imgbuild.lock.wheels import _parse_html
    [f] = _parse_html(f'<a href="/files/{p.name}#md5=00"> </a>', idx.html + "lab/", idx.html)
    assert (f.filename, f.url, f.sha256) == (p.name, f"{idx.base}/files/{p.name}", None)
    # a page without <base> resolves links against the page itself
    [g] = _parse_html('<a href="x-1.0-py3-none-any.whl">x</a>', "http://h/simple/x/", "i")
    assert g.url == "http://h/simple/x/x-1.0-py3-none-any.whl"


def test_a_project_the_index_lacks_is_no_files_and_refusals_are_environment_errors(idx):
    assert wheels.project_files("absent", idx.json) == []
    idx.projects["locked"] = []
    idx.fail["/json/simple/locked/"] = [403]
    with pytest.raises(wheels.IndexUnreachable) as e:
        wheels.project_files("locked", idx.json)
    assert e.value.exit_code == 3
    assert e.value.message == f"the package index {idx.json} refused access (403)"
    assert e.value.facts == [f"GET {idx.json}locked/ -> 403"]
    assert e.value.hint == "put the index's credentials in the URL (UV_INDEX_URL) or a .netrc"
    idx.fail["/json/simple/locked/"] = [401]
    with pytest.raises(wheels.IndexUnreachable, match=r"refused access \(401\)"):
        wheels.project_files("locked", idx.json)
    idx.fail["/json/simple/locked/"] = [418]
    with pytest.raises(wheels.IndexUnreachable) as e:
        wheels.project_files("locked", idx.json)
    assert e.value.message == f"the package index {idx.json} answered 418"
    assert e.value.facts[0].startswith(f"GET {idx.json}locked/ -> 418 ")
    assert e.value.hint == "try again later, or point UV_INDEX_URL at another mirror"
    assert wheels.project_files("locked", idx.json) == []  # a failure is not remembered


def test_a_busy_index_is_asked_again(idx):
    # 503 once, then the page: the session retries what a loaded mirror answers.
    p = idx.add(WheelSpec("busy", "1.0"))
    idx.fail["/json/simple/busy/"] = [503]
    [f] = wheels.project_files("busy", idx.json)
    assert f.filename == p.name and len(idx.log) == 2


def test_versions_are_releases_with_a_wheel_unless_asked(idx):
    idx.add(WheelSpec("v", "1.0"))
    idx.add(WheelSpec("v", "1.0", tag="cp311-cp311-linux_x86_64"))
    idx.add(WheelSpec("v", "0.9"), yanked=True)
    idx.add(WheelSpec("v", "1.1rc1"))
    sdist = idx.root / "v-2.0.tar.gz"
    sdist.write_bytes(b"")
    idx.projects["v"].append(Served(sdist))
    other = Index(idx.root.parent / "other")
    try:
        other.add(WheelSpec("v", "0.5"))
        urls = [idx.json, other.html]
        assert [str(v) for v in wheels.list_versions("v", urls)] == ["0.5", "1.0"]
        assert [str(v) for v in wheels.list_versions("v", urls, prereleases=True)] == [
            "0.5", "1.0", "1.1rc1"]
        assert [str(v) for v in wheels.list_versions("v", urls, yanked=True)] == [
            "0.5", "0.9", "1.0"]
    finally:
        other.srv.shutdown()
        other.srv.server_close()


# --- choosing a file -------------------------------------------------------------------------

def test_the_targets_tags_follow_its_glibc_and_python():
    tags = wheels.compatible_tags("3.12", "x86_64-manylinux_2_28")
    for t in ("cp312-cp312-manylinux_2_28_x86_64", "cp312-cp312-manylinux_2_17_x86_64",
              "cp312-cp312-manylinux_2_0_x86_64", "cp312-cp312-manylinux2014_x86_64",
              "cp312-cp312-manylinux2010_x86_64", "cp312-cp312-manylinux1_x86_64",
              "cp312-abi3-linux_x86_64", "cp311-abi3-manylinux_2_5_x86_64",
              "py3-none-any", "py312-none-manylinux_2_28_x86_64"):
        assert Tag(*t.split("-")) in tags, t
    for t in ("cp312-cp312-manylinux_2_29_x86_64", "cp311-cp311-manylinux_2_28_x86_64",
              "cp312-cp312-manylinux_2_28_aarch64", "cp313-cp313-manylinux_2_28_x86_64"):
        assert Tag(*t.split("-")) not in tags, t
    # each legacy alias from the glibc it stands for
    for glibc, alias in ((17, "manylinux2014"), (12, "manylinux2010"), (5, "manylinux1")):
        for k in (glibc, glibc - 1):
            assert (Tag("cp312", "cp312", f"{alias}_x86_64") in wheels.compatible_tags(
                "3.12", f"x86_64-manylinux_2_{k}")) == (k == glibc), (glibc, k)
    # legacy aliases are glibc 2's only
    assert Tag("cp312", "cp312", "manylinux2014_x86_64") not in wheels.compatible_tags(
        "3.12", "x86_64-manylinux_3_17")
    assert Tag("cp312", "cp312", "manylinux_3_0_x86_64") in wheels.compatible_tags(
        "3.12", "x86_64-manylinux_3_17")
    arm = wheels.compatible_tags("3.11.9", "aarch64-musllinux_1_2")
    assert Tag("cp311", "cp311", "linux_aarch64") in arm
    assert not any("musllinux" in t.platform or "manylinux" in t.platform for t in arm)
    for python, platform in ((None, "x86_64-manylinux_2_28"), ("3.12", None),
                             ("3.12", "manylinux_2_28")):
        assert wheels.compatible_tags(python, platform) == frozenset()


def _locked_index(idx: Index):
    """One version built four ways: two pure (the bigger listed first), this target's (bigger
    than the next) and another's."""
    spec = dict(files={"r/__init__.py": "x = 1\n"})
    big = idx.add(WheelSpec("r", "1.0", tag="py2.py3-none-any",
                            files={"r/__init__.py": "x = 1\n" + "#" * 5000}))
    pure = idx.add(WheelSpec("r", "1.0", **spec))
    mine = idx.add(WheelSpec("r", "1.0", tag="cp312-cp312-manylinux_2_28_x86_64",
                             files={"r/__init__.py": "x = 1\n" + "#" * 3000}))
    arm = idx.add(WheelSpec("r", "1.0", tag="cp312-cp312-manylinux_2_28_aarch64", **spec))
    assert big.stat().st_size > pure.stat().st_size and mine.stat().st_size > arm.stat().st_size
    idx.add(WheelSpec("r", "0.9", **spec))
    return pure, big, mine, arm


def test_the_locked_file_is_the_pure_then_the_targets_then_the_smallest(idx):
    pure, big, mine, arm = _locked_index(idx)
    where = dict(python="3.12", platform="x86_64-manylinux_2_28")
    pick = lambda *ps: wheels.locate_locked(  # noqa: E731
        LockedPackage("r", "1.0", tuple(f"sha256:{_sha(p)}" for p in ps)), [idx.json], **where)
    assert pick(arm, mine, big, pure).filename == pure.name
    assert pick(arm, big).filename == big.name
    assert pick(arm, mine).filename == mine.name
    assert pick(mine, arm).filename == mine.name
    assert pick(arm).filename == arm.name
    # fetching passes the target on: this target's build, though the other is smaller
    with wheels.fetch_locked(LockedPackage("r", "1.0", (f"sha256:{_sha(arm)}",
                                                        f"sha256:{_sha(mine)}")),
                             [idx.json], mode="range", **where) as w:
        assert w.filename == mine.name and w.mode == "range"
    # HTML pages give no sizes: a file without one is ranked last among its kind
    wheels._pages.clear()
    [f] = [f for f in wheels.project_files("r", idx.html) if f.filename == big.name]
    assert f.size is None and wheels._rank(f, frozenset()) == (0, 1 << 40)


def test_an_index_that_is_down_is_passed_over_for_one_that_has_the_file(idx):
    pure, *_ = _locked_index(idx)
    pkg = _pkg(pure, "r", "1.0")
    idx.projects["down"] = []
    idx.fail["/json/simple/r/"] = [403, 403]
    assert wheels.locate_locked(pkg, [idx.json, idx.html]).filename == pure.name
    wheels._pages.clear()
    with pytest.raises(wheels.IndexUnreachable):
        wheels.locate_locked(pkg, [idx.json, idx.base + "/none/simple/"])


def test_an_index_without_hashes_gives_its_file_to_be_checked_after_download(idx):
    pure = idx.add(WheelSpec("n", "1.0"), hashed=False)
    mine = idx.add(WheelSpec("n", "1.0", tag="cp312-cp312-manylinux_2_28_x86_64"),
                   hashed=False)
    idx.add(WheelSpec("n", "1.1"), hashed=False)
    pkg = LockedPackage("n", "1.0", (f"sha256:{'1' * 64}",))
    f = wheels.locate_locked(pkg, [idx.json, idx.base + "/none/simple/"], python="3.12",
                             platform="x86_64-manylinux_2_28")
    assert f.filename == pure.name and f.sha256 is None  # what every index listed counts
    idx.projects["n"] = [s for s in idx.projects["n"] if s.path != pure]
    wheels._pages.clear()
    assert wheels.locate_locked(pkg, [idx.json], python="3.12",
                                platform="x86_64-manylinux_2_28").filename == mine.name


def test_no_locked_file_says_what_the_index_has_instead(idx):
    files = [idx.add(WheelSpec("m", "1.0", tag=f"cp3{k}-cp3{k}-linux_x86_64")) for k in range(7)]
    idx.add(WheelSpec("m", "1.1"))
    hashes = tuple(f"sha256:{c * 64}" for c in "abcdef")
    with pytest.raises(JobFailed) as e:
        wheels.locate_locked(LockedPackage("m", "1.0", hashes), [idx.json, idx.html])
    err = e.value
    assert err.exit_code == 1
    assert err.message == "no wheel of m 1.0 on the index matches a hash the lock pins"
    a, b, c, d = (f"sha256:{x * 12}…" for x in "abcd")
    assert err.facts[0] == f"the lock pins m==1.0 with {a}, {b}, {c}, {d} and 2 more"
    assert err.facts[1] == f"indexes asked: {idx.json}, {idx.html}"
    listed = ", ".join(f"{p.name} (sha256:{_sha(p)[:12]}…)" for p in files[:6])
    assert err.facts[2] == f"the index lists {listed}"
    assert err.hint == ("the lock was made against another index, or the file was replaced: "
                        "regenerate the lock (`imgbuild lock TARGET --refresh`), or set "
                        "UV_INDEX_URL to the index it was made from")
    with pytest.raises(JobFailed) as e:
        wheels.locate_locked(LockedPackage("m", "3.0", hashes[:4]), [idx.json])
    assert e.value.facts[0].endswith(f"{c}, {d}")
    with pytest.raises(JobFailed) as e:
        wheels.locate_locked(LockedPackage("m", "3.0", hashes[:5]), [idx.json])
    assert e.value.facts[0].endswith(f"{d} and 1 more")
    assert e.value.facts[2] == "the index lists no wheel of m 3.0"


# --- fetching --------------------------------------------------------------------------------

def test_a_full_download_is_verified_kept_and_read_from_the_cache_next_time(idx):
    p = idx.add(WheelSpec("d", "1.0"))
    pkg = _pkg(p, "d", "1.0", "md5:00")
    with wheels.fetch_locked(pkg, [idx.json], mode="full") as w:
        assert (w.name, w.version, w.filename, w.sha256, w.mode, w.transferred, w.size) == (
            "d", "1.0", p.name, _sha(p), "full", p.stat().st_size, p.stat().st_size)
        assert w.read("d/__init__.py") == b'__version__ = "1.0"\n'
    kept = wheels.cached_wheel(_sha(p))
    assert kept.read_bytes() == p.read_bytes() and kept.stat().st_mode & 0o777 == 0o644
    assert [n for n in os.listdir(kept.parent.parent) if n.startswith(".")] == []
    n = len(idx.log)
    wheels._pages.clear()
    with wheels.fetch_locked(pkg, [idx.json]) as w:
        assert (w.mode, w.transferred, w.sha256) == ("cache", 0, _sha(p))
    assert len(idx.log) == n  # no network at all
    with wheels.open_file(wheels.project_files("d", idx.json)[0], expect=None, what="d") as w:
        assert w.mode == "cache"


def test_a_download_with_another_hash_is_refused_and_not_kept(idx):
    p = idx.add(WheelSpec("e", "1.0"), hashed=False)
    pins = [c * 64 for c in "012345"]
    pkg = LockedPackage("e", "1.0", tuple(f"sha256:{h}" for h in pins))
    with pytest.raises(JobFailed) as e:
        wheels.fetch_locked(pkg, [idx.json])
    assert e.value.message == f"{p.name} does not have a hash the lock pins for e==1.0"
    assert e.value.facts == [f"downloaded from {idx.base}/files/{p.name}",
                             f"its sha256 is {_sha(p)}", "the lock pins " + ", ".join(pins[:4])]
    assert "regenerate the lock" in e.value.hint
    assert os.listdir(wheels.wheel_cache_dir()) == []  # the partial file is gone
    # the index's own hash is the check when the caller pins none
    idx.projects["e"] = [Served(p, sha256="1" * 64)]
    wheels._pages.clear()
    with pytest.raises(JobFailed, match="does not have a hash the lock pins for e==1.0"):
        wheels.fetch_version("e", "1.0", [idx.json])


def test_a_cached_wheel_counts_only_if_it_is_the_file_the_index_describes(idx, tmp_path):
    a = idx.add(WheelSpec("c", "1.0"))
    b = make_wheel(WheelSpec("c", "1.0", files={"c/x.py": ""}), tmp_path / "other")
    for p in (a, b):
        d = wheels.wheel_cache_dir() / _sha(p)
        d.mkdir(parents=True)
        (d / p.name).write_bytes(p.read_bytes())
    [f] = wheels.project_files("c", idx.json)
    with wheels.open_file(f, expect={_sha(b)}, what="c") as w:
        assert w.sha256 == _sha(a) and w.mode == "cache"  # the index's hash, not another pin
    unhashed = wheels.IndexFile(f.filename, f.url, None, None, False, f.version, f.tags, "i")
    with wheels.open_file(unhashed, expect={_sha(b)}, what="c") as w:
        assert w.sha256 == _sha(b)
    with pytest.raises(ValueError, match="mode must be auto, full or range, not 'fast'"):
        wheels.open_file(unhashed, expect={"f" * 64}, what="c", mode="fast")
    assert idx.files() == []


def test_a_big_wheel_is_read_by_range_and_a_small_one_whole(idx, monkeypatch, caplog):
    caplog.set_level("INFO", logger="imgbuild.lock.wheels")
    p = idx.add(WheelSpec("b", "1.0", files={"b/__init__.py": "", "b/k.so": "k" * 3000}))
    [f] = wheels.project_files("b", idx.json)
    size = p.stat().st_size
    monkeypatch.setattr(wheels, "RANGE_MIN_BYTES", size)
    with wheels.open_file(f, expect={_sha(p)}, what="b") as w:
        assert (w.mode, w.size, w.sha256, w.name, w.version, w.filename) == (
            "range", size, _sha(p), "b", "1.0", p.name)
        assert w.transferred == size  # the whole tail: the file is smaller than RANGE_TAIL
    assert idx.log[-1] == (f"/files/{p.name}", f"bytes=-{wheels.RANGE_TAIL}")
    assert caplog.messages == [f"range: {p.name} ({size} bytes on the index)"]
    monkeypatch.setattr(wheels, "RANGE_MIN_BYTES", size + 1)
    with wheels.open_file(f, expect={_sha(p)}, what="b") as w:
        assert w.mode == "full"
    assert idx.log[-1] == (f"/files/{p.name}", None)


def test_range_is_asked_only_for_a_file_the_index_hashes(idx):
    p = idx.add(WheelSpec("u", "1.0"), hashed=False)
    [f] = wheels.project_files("u", idx.json)
    with wheels.open_file(f, expect={_sha(p)}, what="u", mode="range") as w:
        assert w.mode == "full"
    assert idx.log[-1] == (f"/files/{p.name}", None)


def test_a_partial_answer_that_cannot_be_placed_is_asked_for_whole(idx):
    p = idx.add(WheelSpec("g", "1.0"))
    idx.garbled_range = True
    [f] = wheels.project_files("g", idx.json)
    with wheels.open_file(f, expect={_sha(p)}, what="g", mode="range") as w:
        assert w.mode == "full" and w.read("g/__init__.py") == b'__version__ = "1.0"\n'
    assert idx.files() == [f"/files/{p.name}"] * 2 and idx.log[-1][1] is None


def test_a_file_the_index_will_not_serve_is_an_environment_error(idx):
    p = idx.add(WheelSpec("f", "1.0"))
    idx.fail[f"/files/{p.name}"] = [404]
    [f] = wheels.project_files("f", idx.json)
    with pytest.raises(EnvError) as e:
        wheels.open_file(f, expect=None, what="f", mode="full")
    assert e.value.message == f"cannot download {p.name}: the index answered 404"
    assert e.value.facts == [f"GET {idx.base}/files/{p.name} -> 404 Not Found"]
    assert e.value.hint == "try again later, or point UV_INDEX_URL at another mirror"


def test_a_file_on_a_host_that_is_down_is_an_environment_error(idx):
    # Its own test: the session retries a refused connection for 3 s.
    p = idx.add(WheelSpec("f", "1.0"))
    with pytest.raises(EnvError) as e:
        wheels.open_file(wheels.IndexFile(p.name, "http://127.0.0.1:9/x.whl", None, None,
                                          False, None, frozenset(), "i"),
                         expect=None, what="f", mode="full")
    assert e.value.message == f"cannot download {p.name}"
    assert e.value.facts[0].startswith("GET http://127.0.0.1:9/x.whl failed: ConnectionError")
    assert len(e.value.facts[0].split("failed: ConnectionError: ", 1)[1]) == 200
    assert e.value.hint == "check the network, then run the command again"


# --- Range reads -----------------------------------------------------------------------------

def _range_wheel(idx: Index, monkeypatch, n: int = 6):
    """A wheel of n incompressible members, read by Range with a small tail."""
    files = {f"z/m{k}.py": os.urandom(2000).hex() for k in range(n)}
    p = idx.add(WheelSpec("z", "1.0", files=files))
    monkeypatch.setattr(wheels, "RANGE_TAIL", 1024)
    [f] = wheels.project_files("z", idx.json)
    return p, files, wheels.open_file(f, expect={_sha(p)}, what="z", mode="range")


def test_range_reads_fetch_the_members_asked_in_few_requests(idx, monkeypatch):
    monkeypatch.setattr(wheels, "RANGE_MERGE_GAP", 0)
    p, files, w = _range_wheel(idx, monkeypatch)
    with w:
        assert w.mode == "range" and w.size == p.stat().st_size
        rf = w._range
        assert rf.readable() and rf.seekable() and rf.requests >= 1
        before = len(idx.files())
        w.prefetch(["z/m0.py", "z/m1.py", "z/m4.py"])
        asked = idx.files()[before:]
        assert len(asked) == 2  # m0 and m1 adjoin: one request; m4 another
        assert w.transferred == rf.fetched < p.stat().st_size
        n = len(idx.log)
        assert w.read_text("z/m1.py") == files["z/m1.py"]
        assert w.read("z/m4.py") == files["z/m4.py"].encode()
        assert w.read("z/m0.py") == files["z/m0.py"].encode()
        # RECORD, not yet fetched, is read by a block of its own; the members were there
        assert len(idx.log) - n == 1
        w.prefetch(["z/m0.py"])  # already here: nothing asked
        assert len(idx.log) - n == 1
        assert dict(wheels.iter_py(w)) == {k: v.encode() for k, v in files.items()}


def test_range_spans_closer_than_the_gap_are_one_request(idx, monkeypatch):
    p, files, w = _range_wheel(idx, monkeypatch)
    with w:
        before = len(idx.files())
        w.prefetch(["z/m0.py", "z/m4.py"])
        assert len(idx.files()) - before == 1
        rf = w._range
        assert rf.seek(5) == 5 and rf.seek(3, 1) == 8 and rf.tell() == 8
        assert rf.seek(-4, 2) == rf.size - 4
        buf = bytearray(10)
        assert rf.readinto(buf) == 4 and bytes(buf[:4]) == p.read_bytes()[-4:]
        assert rf.readinto(buf) == 0
        rf.seek(rf.size + 3)
        assert rf.readinto(buf) == 0


def test_a_server_that_stops_honouring_range_is_an_environment_error(idx, monkeypatch):
    p, files, w = _range_wheel(idx, monkeypatch)
    with w:
        idx.range = False
        with pytest.raises(EnvError) as e:
            w.read("z/m2.py")
        assert e.value.message == (f"{idx.base}/files/{p.name}: a Range request got 200 after "
                                   "the server had honoured Range")
        assert e.value.hint == ("try again; set IMGBUILD_RANGE_MIN_MB=1e9 to download whole "
                                "wheels instead")


def test_only_the_wheels_own_record_checks_a_member(idx, monkeypatch):
    # A RECORD nested deeper (vendored) is not the wheel's; a row without sha256 checks nothing.
    files = {"q/__init__.py": "x = 1\n",
             "q/vendored/a.dist-info/RECORD": "q/__init__.py,sha256=AAAA,1\n"}
    p = idx.add(WheelSpec("q", "1.0", files=files))
    monkeypatch.setattr(wheels, "RANGE_TAIL", 1 << 20)
    [f] = wheels.project_files("q", idx.json)
    with wheels.open_file(f, expect={_sha(p)}, what="q", mode="range") as w:
        assert w.read("q/__init__.py") == b"x = 1\n"
        assert w._record["q/__init__.py"] != "AAAA"
        assert "q-1.0.dist-info/RECORD" not in w._record  # its own row carries no hash


# --- other versions and metadata -------------------------------------------------------------

def test_another_version_is_a_release_not_yanked_the_pure_wheel_first(idx):
    plat = idx.add(WheelSpec("o", "2.0", tag="cp311-cp311-linux_x86_64"))
    pure = idx.add(WheelSpec("o", "2.0", files={"o/__init__.py": "#" * 3000}))
    # smaller and pure too, but yanked: taken only when nothing else is left
    idx.add(WheelSpec("o", "2.0", tag="py2.py3-none-any"), yanked="bad")
    yanked = idx.add(WheelSpec("o", "1.0"), yanked=True)
    with wheels.fetch_version("o", Version("2.0"), [idx.json]) as w:
        assert w.filename == pure.name and w.mode == "full"
    with wheels.fetch_version("o", "1.0", [idx.json], mode="range") as w:
        assert w.filename == yanked.name and w.mode == "range"
    with pytest.raises(JobFailed) as e:
        wheels.fetch_version("O", "3.0", [idx.json, idx.html])
    assert e.value.message == "no wheel of o 3.0 on the index"
    assert e.value.facts == [f"indexes asked: {idx.json}, {idx.html}"]
    assert e.value.hint == "the version may exist only as an sdist; pick another version"
    assert plat.name not in idx.files()


def test_metadata_comes_from_the_indexs_metadata_file_and_is_kept(idx):
    p = idx.add(WheelSpec("meta", "1.0", requires=("a>=1", "b")), metadata=True)
    pkg = _pkg(p, "meta", "1.0")
    doc = wheels.fetch_metadata(pkg, [idx.json])
    assert doc["Name"] == ["meta"] and doc["Requires-Dist"] == ["a>=1", "b"]
    assert idx.files() == [f"/files/{p.name}.metadata"]  # not the wheel
    assert json.loads((wheels.cache_root() / "metadata" / f"{_sha(p)}.json").read_text()) == doc
    n = len(idx.log)
    assert wheels.fetch_metadata(pkg, [idx.json]) == doc and len(idx.log) == n


def test_metadata_without_a_metadata_file_is_read_from_the_wheel(idx):
    p = idx.add(WheelSpec("nometa", "1.0", requires=("c",)))
    q = idx.add(WheelSpec("gone", "1.0", requires=("d",)), metadata=True)
    idx.fail[f"/files/{q.name}.metadata"] = [404]
    assert wheels.fetch_metadata(_pkg(p, "nometa", "1.0"), [idx.json])["Requires-Dist"] == ["c"]
    assert idx.log[-1] == (f"/files/{p.name}", f"bytes=-{wheels.RANGE_TAIL}")
    assert wheels.fetch_metadata(_pkg(q, "gone", "1.0"), [idx.json])["Requires-Dist"] == ["d"]
    assert (wheels.cache_root() / "metadata" / f"{_sha(q)}.json").exists()


def test_metadata_of_a_kept_wheel_needs_no_index(idx):
    p = idx.add(WheelSpec("kept", "1.0", requires=("e",)))
    pkg = _pkg(p, "kept", "1.0", f"sha256:{'0' * 64}")
    wheels.fetch_locked(pkg, [idx.json], mode="full").close()
    n = len(idx.log)
    assert wheels.fetch_metadata(pkg, ["http://127.0.0.1:9/simple/"])["Requires-Dist"] == ["e"]
    assert len(idx.log) == n
    assert (wheels.cache_root() / "metadata" / f"{_sha(p)}.json").exists()
    assert wheels._metadata_member(__import__("zipfile").ZipFile(p)).startswith(b"Metadata")


def test_an_index_on_a_host_that_is_down_is_unreachable():
    # Its own test, like the one above: 3 s of retries.
    wheels._pages.clear()
    url = "http://user:secret@127.0.0.1:9/simple/"
    with pytest.raises(wheels.IndexUnreachable) as e:
        wheels.project_files("x", url)
    assert e.value.exit_code == 3
    assert e.value.message == "the package index http://***@127.0.0.1:9/simple/ is unreachable"
    assert e.value.facts[0].startswith(
        "GET http://***@127.0.0.1:9/simple/x/ failed: ConnectionError: ")
    assert e.value.hint == ("check the network (proxy, CA bundle), or point UV_INDEX_URL at a "
                            "reachable mirror of PyPI")
    assert ("http://user:secret@127.0.0.1:9/simple/", "x") not in wheels._pages


# --- what the first mutation run left alive ---------------------------------------------------

def test_each_thread_keeps_one_session_that_retries_a_loaded_index(idx):
    # In a thread of its own: the session is made there, by the code under test.
    for code in (429, 500, 502, 503, 504):
        idx.add(WheelSpec(f"s{code}", "1.0"))
        idx.fail[f"/json/simple/s{code}/"] = [code]
    out: dict = {}

    def work() -> None:
        try:
            first = wheels._session()
            out["same"] = wheels._session() is first
            out["https"] = first.get_adapter("https://pypi.org/") is first.get_adapter(
                "http://127.0.0.1/")
            out["files"] = [len(wheels.project_files(f"s{c}", idx.json))
                            for c in (429, 500, 502, 503, 504)]
        except BaseException as e:  # noqa: BLE001 - said by the assertion below
            out["error"] = repr(e)

    t = threading.Thread(target=work)
    t.start()
    t.join()
    assert out == {"same": True, "https": True, "files": [1] * 5}
    assert idx.agents == {"imgbuild-drift (+requests)"}


def test_an_index_that_stays_busy_fails_after_three_more_tries(idx):
    idx.projects["busy"] = []
    idx.fail["/json/simple/busy/"] = [503] * 4
    out: dict = {}

    def work() -> None:
        try:
            wheels.project_files("busy", idx.json)
        except wheels.IndexUnreachable as e:
            out["error"] = e.message

    t = threading.Thread(target=work)  # a session of its own, made by the code under test
    t.start()
    t.join()
    assert out == {"error": f"the package index {idx.json} is unreachable"}
    assert len(idx.log) == 4


def test_a_kept_directory_without_the_wheel_is_filled_and_the_cache_may_be_elsewhere(
        idx, monkeypatch, tmp_path):
    p = idx.add(WheelSpec("k", "1.0"))
    (wheels.wheel_cache_dir() / _sha(p)).mkdir(parents=True)  # left by an interrupted run
    with wheels.fetch_locked(_pkg(p, "k", "1.0"), [idx.json], mode="full") as w:
        assert w.mode == "full"
    # a cache on another filesystem than the temporary directory: the download is renamed
    # into place, so it is written beside its destination
    shm = Path("/dev/shm")
    if not shm.is_dir() or shm.stat().st_dev == tmp_path.stat().st_dev:
        return
    monkeypatch.setenv("IMGBUILD_CACHE", str(shm / f"imgbuild-test-{os.getpid()}"))
    try:
        with wheels.fetch_locked(_pkg(p, "k", "1.0"), [idx.json], mode="full") as w:
            assert w.mode == "full"
    finally:
        import shutil
        shutil.rmtree(shm / f"imgbuild-test-{os.getpid()}", ignore_errors=True)


def test_a_downloads_failure_says_what_the_connection_said_cut_to_200_characters(idx):
    wheels._pages.clear()
    with pytest.raises(wheels.IndexUnreachable) as e:
        wheels.project_files("x", "http://127.0.0.1:9/simple/")
    said = e.value.facts[0].split("failed: ConnectionError: ", 1)[1]
    assert len(said) == 200 and "127.0.0.1" in said


def test_older_metadata_attribute_names_and_pages_without_files_or_a_type(idx):
    from imgbuild.lock.wheels import _parse_html, _parse_json
    [f] = _parse_html('<a href="x-1.0-py3-none-any.whl" data-dist-info-metadata="sha256=ab">'
                      "x-1.0-py3-none-any.whl</a>", "http://h/x/", "i")
    assert f.metadata_url == "http://h/x/x-1.0-py3-none-any.whl.metadata"
    [g] = _parse_json({"files": [{"filename": "x-1.0-py3-none-any.whl", "url": "x.whl",
                                  "hashes": {}, "data-dist-info-metadata": True}]},
                      "http://h/x/", "i")
    assert g.metadata_url == "http://h/x/x.whl.metadata"
    assert _parse_json({"meta": {}}, "http://h/x/", "i") == []
    p = idx.add(WheelSpec("plain", "1.0"))
    idx.untyped = True  # no Content-Type: read as the HTML every index can serve
    [h] = wheels.project_files("plain", idx.html)
    assert h.filename == p.name


def test_html_links_are_read_whatever_surrounds_them():
    from imgbuild.lock.wheels import _parse_html
    page = ('</a><p>x-0.1-py3-none-any.whl</p></a>'
            '<a href="/get?id=1"><span>x-1.0-py3-none-any.whl</span></a>'
            '<a href="/get?id=2">x-2.0-py3<b></b>-none-any.whl</a>'  # text in two pieces
            '</a></body>')  # a stray end tag after a link
    a, b = _parse_html(page, "http://h/simple/x/", "i")
    assert (a.filename, a.url, a.version) == ("x-1.0-py3-none-any.whl", "http://h/get?id=1",
                                              Version("1.0"))
    assert b.filename == "x-2.0-py3-none-any.whl"


def test_a_metadata_only_read_of_an_unhashed_index_still_checks_the_lock(idx):
    p = idx.add(WheelSpec("um", "1.0"), hashed=False)
    idx.range = False
    pkg = LockedPackage("um", "1.0", (f"sha256:{'0' * 64}",))
    with pytest.raises(JobFailed, match="does not have a hash the lock pins for um==1.0"):
        wheels.fetch_metadata(pkg, [idx.json])
    assert p.exists()
    # two pins: the metadata is kept under the file's own hash, not the first pin
    q = idx.add(WheelSpec("two", "1.0", requires=("z",)), metadata=True)
    wheels.fetch_metadata(LockedPackage("two", "1.0", (f"sha256:{_sha(q)}",
                                                       f"sha256:{'0' * 64}")), [idx.json])
    assert [x.name for x in (wheels.cache_root() / "metadata").iterdir()] == [f"{_sha(q)}.json"]


def test_a_file_is_opened_only_when_its_index_hash_is_one_expected(idx):
    p = idx.add(WheelSpec("x", "1.0"))
    [f] = wheels.project_files("x", idx.json)
    with pytest.raises(JobFailed, match="does not have a hash the lock pins for x"):
        wheels.open_file(f, expect={"0" * 64}, what="x", mode="full")
    assert p.exists()


def test_a_partial_answer_without_content_range_is_asked_for_whole(idx):
    p = idx.add(WheelSpec("h", "1.0"))
    idx.no_content_range = True
    [f] = wheels.project_files("h", idx.json)
    with wheels.open_file(f, expect={_sha(p)}, what="h", mode="range") as w:
        assert w.mode == "full"


def _bare_zip(path: Path, members: dict[str, bytes]) -> Path:
    import zipfile
    with zipfile.ZipFile(path, "w") as z:
        for n, b in members.items():
            z.writestr(n, b)
    return path


def test_a_wheel_without_metadata_or_record_is_read_without_them(idx, tmp_path):
    import zipfile
    z = _bare_zip(tmp_path / "n-1.0-py3-none-any.whl", {"n/__init__.py": b"x"})
    assert wheels._metadata_member(zipfile.ZipFile(z)) is None
    served = idx.root / z.name
    idx.root.mkdir(parents=True, exist_ok=True)
    served.write_bytes(z.read_bytes())
    idx.projects["n"] = [Served(served)]
    [f] = wheels.project_files("n", idx.json)
    with wheels.open_file(f, expect={_sha(z)}, what="n", mode="range") as w:
        assert w.read("n/__init__.py") == b"x"


def test_record_rows_without_a_size_and_members_that_are_not_utf8(idx):
    body = "é".encode("latin-1")  # not UTF-8
    record = (f"r2/__init__.py,sha256={_b64(b'x = 1')}\n"  # no size column; says x = 1
              f"r2/data.txt,sha256={_b64(body)},1\n"
              "r2/\xff\n").encode("latin-1")  # and a row RECORD cannot decode
    idx.root.mkdir(parents=True, exist_ok=True)
    z = _bare_zip(idx.root / "r2-1.0-py3-none-any.whl", {
        "r2/__init__.py": b"x = 2", "r2/data.txt": body, "r2-1.0.dist-info/RECORD": record})
    idx.projects["r2"] = [Served(z)]
    [f] = wheels.project_files("r2", idx.json)
    with wheels.open_file(f, expect={_sha(z)}, what="r2", mode="range") as w:
        assert w.read_text("r2/data.txt") == "\ufffd"
        with pytest.raises(JobFailed, match="member r2/__init__.py does not match") as e:
            w.read("r2/__init__.py")
        assert e.value.hint == ("the file on the index is damaged or was replaced; try again, "
                                "then regenerate the lock")


def test_a_member_streams_in_chunks_and_reads_count_what_came(idx, monkeypatch):
    p, files, w = _range_wheel(idx, monkeypatch)
    with w:
        blocks = list(w.stream("z/m3.py", chunk=512))
        assert len(blocks) > 1 and max(map(len, blocks)) <= 512
        before = w.transferred
        w.read("z/m5.py")
        assert w.transferred == w._range.fetched > before


def test_a_range_file_reads_and_fetches_exactly_what_is_asked(idx):
    p = idx.add(WheelSpec("rf", "1.0", files={"rf/a.py": os.urandom(4000).hex()}))
    data = p.read_bytes()
    size = len(data)
    url = f"{idx.base}/files/{p.name}"
    rf = wheels._RangeFile(url, size, data[-100:])
    assert rf.fetched == 100 and rf.tell() == 0
    rf.prefetch([(size - 100, size)])  # held already, to its last byte
    assert idx.log == []
    rf.prefetch([(size - 50, size), (0, 10), (20, 30)])  # one held, then two close together
    assert idx.log == [(f"/files/{p.name}", "bytes=0-29")]
    assert rf.fetched == 130
    rf.prefetch([(0, 10), (40, 50)])  # the first held: the next is still fetched
    assert idx.log[-1] == (f"/files/{p.name}", "bytes=40-49") and rf.fetched == 140
    rf.seek(size - 100)
    one = bytearray(1)
    assert rf.readinto(one) == 1 and one == data[-100:-99]
    buf = bytearray(10)
    assert rf.readinto(buf) == 10 and buf == data[-99:-89]
    rf.seek(60)  # not fetched: a block from here
    assert rf.readinto(buf) == 10 and buf == data[60:70]
    assert idx.log[-1] == (f"/files/{p.name}", f"bytes=60-{min(size, 60 + (256 << 10)) - 1}")


def _b64(data: bytes) -> str:
    import base64
    return base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
