"""What `imgbuild outdated` decides for each target (ci/outdated.py target_news, _package_news,
_blockers, index_versions), on a copy of the project's own tiny-cpu target: which versions it
asks the resolver about and how (newest first, in place of the pin, against the lock), what a
refusal by the resolver says in the target's words, when it stops trying, and what a target
without a lock, a package no index answers for, or a base image reads as.

The resolver and the version lists are scripted here and check what they are given; the same
report against a real uv and an index that publishes while the test runs is in
tests/test_outdated.py. PyPI's JSON API is served from this machine, in the shape PyPI
answers (releases by version, each with its files and their yanked flag)."""

from __future__ import annotations

import http.server
import json
import re
import shutil
import threading
from dataclasses import replace
from pathlib import Path

import pytest
from packaging.version import Version

from imgbuild.ci import outdated as od
from imgbuild.errors import InputError, ResolveError
from imgbuild.workspace import Workspace

ROOT = Path(__file__).resolve().parent.parent
TARGET = "tiny-cpu"


@pytest.fixture()
def ws(tmp_path) -> Workspace:
    shutil.copytree(ROOT / "images", tmp_path / "images")
    shutil.copytree(ROOT / "lockfiles", tmp_path / "lockfiles")
    return Workspace(tmp_path / "images", tmp_path / "lockfiles")


def _bump(body: str, name: str, version: str) -> str:
    out, n = re.subn(rf"^{re.escape(name)}==\S+", f"{name}=={version}", body, flags=re.M)
    assert n == 1, name
    return out


class Uv:
    """The resolver, scripted. `answers` maps a requested version of the package under test
    to a lock body (available) or a ResolveError (blocked); each call is recorded."""

    def __init__(self, monkeypatch, name: str, answers: dict):
        self.name, self.answers, self.calls = name, answers, []
        monkeypatch.setattr(od, "compile_lock", self)

    def __call__(self, req, **kw):
        self.calls.append((req, kw))
        asked = next((r.split("==", 1)[1].split(";")[0] for r in req.requirements
                      if r.split("==")[0].split("[")[0] == self.name and "==" in r), None)
        # the package's newest allowed version, where nothing pins it: key "*"
        got = self.answers.get(asked, self.answers.get("*")) if asked not in self.answers \
            else self.answers[asked]
        if isinstance(got, Exception):
            raise got
        return got


def _chain(*lines: str) -> ResolveError:
    return ResolveError("uv could not resolve", facts=list(lines))


# --- a pinned package: tried newest first, in place of its pin --------------------------------

def test_a_pinned_package_is_tried_newest_first_in_place_of_its_pin(ws, monkeypatch):
    ref = ws.target(TARGET)
    lock = ref.lock()
    blocked = _chain("Because transformers==2.15.0 depends on torch>=2.15 and you require "
                     "torch==2.15.0, we can conclude that...")
    uv = Uv(monkeypatch, "compressed-tensors", {
        "0.22.0": _chain("Because torch==2.13.0 depends on compressed-tensors<0.21 and you "
                         "require compressed-tensors==0.22.0, we can conclude that your "
                         "requirements are unsatisfiable."),
        "0.21.0": blocked,
        "0.20.0": _bump(lock.body, "compressed-tensors", "0.20.0")})
    news = od._package_news("compressed-tensors", "pinned", ref.target, ref.request, lock,
                            [Version(v) for v in ("0.18.0", "0.19.0", "0.20.0", "0.21.0",
                                                  "0.22.0")],
                            None, ("https://index.example/simple/",), 3)
    assert news.newer == ("0.20.0", "0.21.0", "0.22.0")  # only those newer than the lock
    assert [c.version for c in news.tried] == ["0.22.0", "0.21.0", "0.20.0"]
    assert [c.status for c in news.tried] == ["blocked", "blocked", "available"]
    assert news.status == "blocked" and news.available == "0.20.0"  # the newest is what counts
    assert news.blocked_by == ("torch==2.13.0 requires compressed-tensors<0.21",)
    assert news.needs == (f"{ref.target.path} requires compressed-tensors==0.22.0",)
    assert od.diff_lines(news.changes) == ["-compressed-tensors==0.19.0",
                                           "+compressed-tensors==0.20.0"]
    assert news.note == ""
    for (req, kw), v in zip(uv.calls, ("0.22.0", "0.21.0", "0.20.0"), strict=True):
        assert f"compressed-tensors=={v}" in req.requirements
        assert "compressed-tensors==0.19.0" not in req.requirements
        assert kw == {"wheels": None, "prefer": lock.body, "index_urls":
                      ("https://index.example/simple/",), "upgrade": ("compressed-tensors",)}


def test_a_pin_none_of_whose_tried_releases_resolves_says_how_many_were_tried(ws, monkeypatch):
    ref = ws.target(TARGET)
    no = _chain("Because torch==2.13.0 depends on compressed-tensors<0.20 and you require "
                "compressed-tensors>=0.20, we can conclude that...")
    uv = Uv(monkeypatch, "compressed-tensors", {"*": no})
    newer = [Version(f"0.{n}.0") for n in range(20, 25)]
    news = od._package_news("compressed-tensors", "pinned", ref.target, ref.request,
                            ref.lock(), newer, None, None, 3)
    assert len(uv.calls) == 3 and news.status == "blocked" and news.available is None
    assert news.note == "the 3 newest releases were tried"
    two = od._package_news("compressed-tensors", "pinned", ref.target, ref.request,
                           ref.lock(), newer[:2], None, None, 3)
    assert two.note == ""  # every newer release was tried


# --- a dependency: the newest, else what the others allow -------------------------------------

def test_a_dependency_is_asked_at_its_newest_then_at_what_the_others_allow(ws, monkeypatch):
    ref = ws.target(TARGET)
    lock = ref.lock()
    uv = Uv(monkeypatch, "safetensors", {
        "0.10.0": _chain("Because transformers==5.17.0 depends on safetensors<0.10 and you "
                         "require safetensors==0.10.0, we can conclude that..."),
        None: _bump(lock.body, "safetensors", "0.9.0")})
    news = od._package_news("safetensors", "dependency", ref.target, ref.request, lock,
                            [Version("0.9.0"), Version("0.10.0")], None, None, 3)
    first, second = uv.calls
    assert first[0].requirements == ref.request.requirements + ("safetensors==0.10.0",)
    assert second[0].requirements == ref.request.requirements  # no pin: the newest allowed
    assert second[1]["upgrade"] == ("safetensors",) and second[1]["prefer"] == lock.body
    assert [(c.version, c.status) for c in news.tried] == [("0.10.0", "blocked"),
                                                           ("0.9.0", "available")]
    assert news.blocked_by == ("transformers==5.17.0 requires safetensors<0.10",)
    assert news.needs == (f"{ref.target.path} requires safetensors==0.10.0",)  # the ask
    assert (news.status, news.available) == ("blocked", "0.9.0")
    assert od.diff_lines(news.changes) == ["-safetensors==0.8.0", "+safetensors==0.9.0"]


def test_a_dependency_another_package_pins_at_the_locked_version_is_not_asked_again(
        ws, monkeypatch):
    ref = ws.target(TARGET)
    uv = Uv(monkeypatch, "safetensors", {
        "0.10.0": _chain("Because transformers==5.17.0 depends on safetensors==0.8.0 and you "
                         "require safetensors==0.10.0, we can conclude that...")})
    news = od._package_news("safetensors", "dependency", ref.target, ref.request, ref.lock(),
                            [Version("0.9.0"), Version("0.10.0")], None, None, 3)
    assert len(uv.calls) == 1 and [c.status for c in news.tried] == ["blocked"]
    assert news.blocked_by == ("transformers==5.17.0 requires safetensors==0.8.0",)


def test_a_dependency_whose_newest_resolves_is_available(ws, monkeypatch):
    ref = ws.target(TARGET)
    lock = ref.lock()
    Uv(monkeypatch, "safetensors", {"0.9.0": _bump(lock.body, "safetensors", "0.9.0")})
    news = od._package_news("safetensors", "dependency", ref.target, ref.request, lock,
                            [Version("0.9.0")], None, None, 3)
    assert (news.status, news.available, news.tried[0].version) == ("available", "0.9.0",
                                                                    "0.9.0")


def test_the_newest_allowed_that_is_the_locked_one_is_no_news(ws, monkeypatch):
    ref = ws.target(TARGET)
    lock = ref.lock()
    Uv(monkeypatch, "safetensors", {
        "0.10.0": _chain("Because transformers==5.17.0 depends on safetensors<0.9 and you "
                         "require safetensors==0.10.0, we can conclude that..."),
        None: lock.body})
    news = od._package_news("safetensors", "dependency", ref.target, ref.request, lock,
                            [Version("0.9.0"), Version("0.10.0")], None, None, 3)
    assert [c.status for c in news.tried] == ["blocked"] and news.available is None


def test_cuda_wheels_into_a_cpu_target_are_said_with_its_own_index(ws, monkeypatch):
    ref = ws.target(TARGET)
    lock = ref.lock()
    body = _bump(lock.body, "torch", "2.14.0") + (
        "nvidia-cublas==13.0.0 \\\n    --hash=sha256:" + "a" * 64 + "\n")
    Uv(monkeypatch, "torch", {"2.14.0": body})
    news = od._package_news("torch", "pinned", ref.target, ref.request, lock,
                            [Version("2.14.0")], None, None, 3)
    assert news.status == "available"
    assert news.note == (
        "brings CUDA wheels (nvidia-*) into a CPU target: torch 2.14.0 from the default index "
        "is a CUDA build; the target's own index (https://download.pytorch.org/whl/cpu) is "
        "where its CPU build comes from")
    # a package already in the lock that moves is not news of that kind
    body = _bump(lock.body, "torch", "2.14.0")
    Uv(monkeypatch, "torch", {"2.14.0": body})
    assert od._package_news("torch", "pinned", ref.target, ref.request, lock,
                            [Version("2.14.0")], None, None, 3).note == ""


# --- uv's chain in the target's words ---------------------------------------------------------

def test_a_chain_with_no_conflict_of_its_own_shows_its_last_three_lines(ws):
    ref = ws.target(TARGET)
    err = _chain("one", "", "two", "three", "four")
    assert od._blockers(err, ref.target, ref.request, ("torch", "2.14.0")) == (
        ("two", "three", "four"), ())


def test_only_the_candidates_own_pin_is_what_it_needs(ws):
    """`you require torch==2.14.0` is the candidate itself; another pin of the user's on the
    same package, or the same pin on another, is what blocks it."""
    ref = ws.target(TARGET)
    err = _chain("Because transformers==5.17.0 depends on torch==2.13.0 and you require "
                 "torch==2.14.0, we can conclude that...")
    by, needs = od._blockers(err, ref.target, ref.request, ("torch", "2.14.0"))
    assert needs == (f"{ref.target.path} requires torch==2.14.0",)
    assert by == ("transformers==5.17.0 requires torch==2.13.0",)
    by, needs = od._blockers(err, ref.target, ref.request, ("torch", "2.15.0"))
    assert needs == () and f"{ref.target.path} requires torch==2.14.0" in by
    by, needs = od._blockers(err, ref.target, ref.request, ("safetensors", "2.14.0"))
    assert needs == ()


def test_an_engine_named_by_its_range_is_shown_with_the_targets_pin(ws):
    ref = ws.target(TARGET)
    err = _chain("Because transformers<=5.17.0 depends on torch<2.14 and you require "
                 "torch==2.14.0, we can conclude that...")
    by, _ = od._blockers(err, ref.target, ref.request, ("torch", "2.14.0"))
    assert by == ("transformers==5.17.0 requires torch<2.14",)


# --- a target's news -----------------------------------------------------------------------------

class Versions:
    """The indexes' version lists, scripted: per package, (versions, errors); what was asked."""

    def __init__(self, found: dict[str, tuple[list[str], list[str]]]):
        self.found, self.asked = found, []

    def get(self, name, urls):
        self.asked.append((name, urls))
        vers, errs = self.found.get(name, ([], []))
        return [Version(v) for v in vers], errs


def test_a_target_without_a_lock_says_so_and_asks_nothing(ws):
    next(ws.lockfiles.glob(f"{TARGET}.py*")).unlink()
    versions = Versions({})
    news = od.target_news(ws, TARGET, versions=versions)
    assert (news.target, news.engine, news.packages, news.errors) == (
        TARGET, "transformers", (), ("target 'tiny-cpu' has no lock yet",))
    assert news.to_dict()["target"] == TARGET and versions.asked == []


def test_a_target_asks_each_key_package_on_its_indexes_and_says_what_it_could_not(ws,
                                                                                  monkeypatch):
    ref = ws.target(TARGET)
    lock = ref.lock()
    bases = []
    monkeypatch.setattr(od, "base_news", lambda cat, image: bases.append(image) or
                        od.BaseNews(image, "current"))
    uv = Uv(monkeypatch, "compressed-tensors", {"0.20.0": _bump(lock.body, "compressed-tensors",
                                                                "0.20.0")})
    down = "https://index.example/simple/ not checked for torch: unreachable (ConnectionError)"
    versions = Versions({"compressed-tensors": (["0.19.0", "0.20.0"], []),
                         "torch": ([], [down])})
    news = od.target_news(ws, TARGET, versions=versions,
                          index_urls=["https://index.example/simple/"])
    assert [n for n, _ in versions.asked] == ["transformers", "torch", "compressed-tensors"]
    assert {urls for _, urls in versions.asked} == {
        ("https://index.example/simple/", "https://download.pytorch.org/whl/cpu/")}
    by = {p.package: p for p in news.packages}
    assert (by["transformers"].status, by["transformers"].locked) == ("current", "5.17.0")
    assert by["torch"] == od.PackageNews("torch", "pinned", "2.13.0+cpu", (), "unknown",
                                         note=down)
    assert (by["compressed-tensors"].status, by["compressed-tensors"].available) == (
        "available", "0.20.0")
    assert uv.calls[0][1]["index_urls"] == ("https://index.example/simple/",)
    assert news.errors == (down,)
    assert bases == [ws.catalog.base("debian-bookworm").image]  # checked by default
    assert news.bases == (od.BaseNews(bases[0], "current"),)
    assert news.engine == "transformers" and news.patches == ref.target.patches


def test_a_package_whose_news_fails_is_unknown_with_the_reason(ws, monkeypatch):
    def refuse(*a, **kw):
        raise InputError("the lock's body does not parse")
    monkeypatch.setattr(od, "_package_news", refuse)
    news = od.target_news(ws, TARGET, check_bases=False,
                          versions=Versions({"torch": (["2.14.0"], [])}))
    torch = next(p for p in news.packages if p.package == "torch")
    assert torch == od.PackageNews("torch", "pinned", "2.13.0+cpu", (), "unknown",
                                   note="the lock's body does not parse")
    assert news.bases == ()


def test_a_base_that_cannot_be_planned_is_an_error_of_the_report(ws, monkeypatch):
    from imgbuild.errors import InputError as Refused

    def no_plan(ws, name, **kw):
        assert (name, kw) == (TARGET, {"resolve": False})
        raise Refused("no base for this platform")
    monkeypatch.setattr(od, "make_plan", no_plan)
    news = od.target_news(ws, TARGET, versions=Versions({}))
    assert news.errors == ("base image not checked: no base for this platform",)


def test_outdated_runs_each_target_with_the_report_settings(ws, monkeypatch):
    seen = []
    monkeypatch.setattr(od, "target_news", lambda ws, n, **kw: seen.append((n, kw)) or n)
    assert od.outdated(ws, targets=[TARGET, "tiny-cpu-multi"], check_bases=False,
                       index_urls=["https://i/"], max_tries=2) == [TARGET, "tiny-cpu-multi"]
    assert {n for n, _ in seen} == {TARGET, "tiny-cpu-multi"}
    assert all(kw["check_bases"] is False and kw["max_tries"] == 2
               and tuple(kw["index_urls"]) == ("https://i/",) for _, kw in seen)


# --- index_versions on PyPI's JSON API ------------------------------------------------------------

class PyPI:
    """PyPI's JSON API on this machine: /pypi/NAME/json, as PyPI answers it."""

    def __init__(self, releases: dict[str, dict]):
        self.seen: list[tuple[str, str]] = []
        outer = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self):  # noqa: N802 (http.server's name)
                outer.seen.append((self.path, self.headers.get("User-Agent")))
                doc = releases.get(self.path)
                self.send_response(404 if doc is None else 200)
                self.send_header("Content-Type", "application/json")
                self.end_headers()
                self.wfile.write(json.dumps(doc or {}).encode())

            def log_message(self, *a):
                pass

        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}/simple/"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def close(self):
        self.httpd.shutdown()
        self.httpd.server_close()


def test_pypis_releases_less_the_yanked_the_empty_and_the_pre_releases(monkeypatch):
    pypi = PyPI({"/pypi/compressed-tensors/json": {"releases": {
        "0.9.0": [{"yanked": False}], "0.10.0": [{"yanked": True}],
        "0.11.0": [{"yanked": True}, {"yanked": False}], "0.12.0": [],
        "0.13.0rc1": [{"yanked": False}], "not a version": [{"yanked": False}]}},
        "/pypi/nothing-yet/json": {"releases": None}})
    timeouts = []
    real = od.requests.Session

    class Session(real):
        def get(self, url, **kw):
            timeouts.append(kw.get("timeout"))
            return super().get(url, **kw)
    monkeypatch.setattr(od.requests, "Session", Session)
    monkeypatch.setattr(od, "_is_pypi", lambda url: url == pypi.url)
    try:
        assert od.index_versions("Compressed_Tensors", pypi.url) == [Version("0.9.0"),
                                                                      Version("0.11.0")]
        assert od.index_versions("nothing-yet", pypi.url) == []
        assert od.index_versions("absent", pypi.url) == []  # 404: the index has none
    finally:
        pypi.close()
    assert [p for p, _ in pypi.seen] == ["/pypi/compressed-tensors/json",
                                         "/pypi/nothing-yet/json", "/pypi/absent/json"]
    assert {ua for _, ua in pypi.seen} == {"imgbuild-outdated (+requests)"}
    assert set(timeouts) == {od.TIMEOUT}


def test_the_package_news_as_json_keeps_each_try_without_its_diff():
    news = od.PackageNews("torch", "pinned", "2.13.0", ("2.14.0",), "blocked",
                          blocked_by=("x requires torch<2.14",),
                          tried=(od.Candidate("2.14.0", "blocked", ("x requires torch<2.14",),
                                              ("t.yaml requires torch==2.14.0",),
                                              (od.Change("torch", "2.13.0", "2.14.0"),)),))
    d = news.to_dict()
    assert d["tried"] == [{"version": "2.14.0", "status": "blocked",
                           "blocked_by": ["x requires torch<2.14"],
                           "needs": ["t.yaml requires torch==2.14.0"], "lock_changes": 1}]
    assert d["latest"] == "2.14.0"
    r = od.RelockResult("t", "lockfiles/t.txt", ("engine.version: 1 -> 2",),
                        (od.Change("vllm", "1", "2"),), True, "a note")
    assert r.to_dict() == {"target": "t", "lock": "lockfiles/t.txt",
                           "spec_edits": ["engine.version: 1 -> 2"],
                           "changes": [{"package": "vllm", "old": "1", "new": "2"}],
                           "diff": ["--- lockfiles/t.txt (committed)",
                                    "+++ lockfiles/t.txt (relocked)", "-vllm==1", "+vllm==2"],
                           "written": True, "note": "a note"}


def test_a_target_news_as_json(ws):
    tn = od.TargetNews("t", "vllm", "lockfiles/t.txt", (), (od.BaseNews("img", "current"),),
                       ("an error",), ("a-patch",))
    assert tn.to_dict() == {"target": "t", "engine": "vllm", "lock": "lockfiles/t.txt",
                            "packages": [], "bases": [{"image": "img", "status": "current",
                                                       "newer": (), "note": ""}],
                            "errors": ["an error"], "patches": ["a-patch"]}
    assert replace(tn, errors=()).to_dict()["errors"] == []


def test_only_new_cuda_wheels_in_a_cpu_target_are_that_news(ws, monkeypatch):
    """New nvidia-* or cuda-* packages are; a new package of another name is not, nor an
    nvidia-* package the lock already had."""
    ref = ws.target(TARGET)
    lock = ref.lock()
    pin = "\\\n    --hash=sha256:" + "a" * 64 + "\n"
    moved = _bump(lock.body, "torch", "2.14.0")
    for extra, said in (("cuda-bindings==13.0.0 " + pin, True), ("triton==3.5.0 " + pin, False)):
        Uv(monkeypatch, "torch", {"2.14.0": moved + extra})
        note = od._package_news("torch", "pinned", ref.target, ref.request, lock,
                                [Version("2.14.0")], None, None, 3).note
        assert note.startswith("brings CUDA wheels") is said, extra


def test_a_resolution_that_does_not_read_as_a_lock_is_named(ws, monkeypatch):
    ref = ws.target(TARGET)
    lock = ref.lock()
    Uv(monkeypatch, "safetensors", {
        "0.10.0": _chain("Because transformers==5.17.0 depends on safetensors<0.10 and you "
                         "require safetensors==0.10.0, we can conclude that..."),
        None: "this is not a pin\n"})
    from imgbuild.errors import LockError

    with pytest.raises(LockError) as e:
        od._package_news("safetensors", "dependency", ref.target, ref.request, lock,
                         [Version("0.9.0"), Version("0.10.0")], None, None, 3)
    assert e.value.message.startswith("resolution: line 1 is not an exact pin")


def test_every_index_that_could_not_be_read_is_in_the_packages_note(ws):
    errs = ["https://a.example/ not checked for torch: unreachable (ConnectTimeout)",
            "https://b.example/ not checked for torch: unreachable (ConnectionError)"]
    news = od.target_news(ws, TARGET, check_bases=False,
                          versions=Versions({"torch": ([], errs)}))
    torch = next(p for p in news.packages if p.package == "torch")
    assert torch.note == "; ".join(errs) and news.errors == tuple(errs)


def test_targets_are_read_four_at_a_time_by_default(ws, monkeypatch):
    sizes = []
    real = od.ThreadPoolExecutor

    class Pool(real):
        def __init__(self, max_workers):
            sizes.append(max_workers)
            super().__init__(max_workers=max_workers)
    monkeypatch.setattr(od, "ThreadPoolExecutor", Pool)
    monkeypatch.setattr(od, "target_news", lambda ws, n, **kw: n)
    od.outdated(ws, targets=[TARGET])
    od.outdated(ws, targets=[TARGET], jobs=0)
    assert sizes == [4, 1]


def test_a_column_0_comment_ends_what_the_engine_edit_reads_as_its_block():
    """Below a line at column 0 the edit no longer knows whose `version:` it reads (a comment
    there may be followed by another mapping's keys): it edits nothing rather than guess."""
    text = 'engine:\n  name: vllm\n# pinned by CI\n  version: "1.0"\narchs: [cpu]\n'
    assert od.edit_engine_version(text, "1.0", "1.1") is None
    assert od.edit_engine_version(text.replace("# pinned by CI\n", ""), "1.0", "1.1") == \
        'engine:\n  name: vllm\n  version: "1.1"\narchs: [cpu]\n'
