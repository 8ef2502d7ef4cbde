"""What `imgbuild relock` decides before and around uv (ci/outdated.py relock), on a copy of
the project's own tiny-cpu target: what it hands the resolver (the request, the lock to keep,
the packages to move, the constraints, the wheel directory, the indexes), which line of the
spec it edits, what it says, and that a resolution that fails, or a write that fails, leaves
the spec and the lock as they were. The resolver is scripted here and checks what it is
given; relock against a real uv and an index that publishes during the test is in
tests/test_outdated.py."""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import pytest

from imgbuild.ci import outdated as od
from imgbuild.errors import InputError, ResolveError
from imgbuild.workspace import Workspace

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture()
def ws(tmp_path) -> Workspace:
    shutil.copytree(ROOT / "images", tmp_path / "images")
    shutil.copytree(ROOT / "lockfiles", tmp_path / "lockfiles")
    (tmp_path / "wheels").mkdir()
    return Workspace(tmp_path / "images", tmp_path / "lockfiles", tmp_path / "wheels")


def _bump(body: str, name: str, version: str) -> str:
    out, n = re.subn(rf"^{re.escape(name)}==\S+", f"{name}=={version}", body, flags=re.M)
    assert n == 1, name
    return out


@pytest.fixture()
def uv(monkeypatch):
    """The resolver, scripted: what each call was given; what it answers is set per test."""
    calls: list[dict] = []
    answer: dict = {"body": None, "error": None}

    def compile_lock(req, **kw):
        calls.append({"req": req} | kw)
        if answer["error"] is not None:
            raise answer["error"]
        return answer["body"](req, kw["prefer"])
    monkeypatch.setattr(od, "compile_lock", compile_lock)
    monkeypatch.setattr(od, "uv_version", lambda: "uv 0.0.0 (scripted)")
    return calls, answer


def test_a_package_the_spec_does_not_pin_moves_by_a_constraint_and_the_spec_stays(ws, uv):
    calls, answer = uv
    ref = ws.target("tiny-cpu")
    lock = ref.lock()
    old = lock.package("safetensors").version
    answer["body"] = lambda req, prefer: _bump(prefer, "safetensors", "9.9.9")
    spec_before = (ws.images / "tiny-cpu.yaml").read_text()
    res = od.relock(ws, "tiny-cpu", ["safetensors==9.9.9"], index_urls=["http://ix/simple"])
    [call] = calls
    assert call["req"] == ref.request
    assert call["wheels"] == ws.wheels and call["prefer"] == lock.body
    assert call["upgrade"] == ("safetensors",)
    assert call["constraints"] == ("safetensors==9.9.9",)
    assert call["index_urls"] == ("http://ix/simple",)
    assert (res.target, res.spec_edits, res.written) == ("tiny-cpu", (), True)
    assert [(c.package, c.old, c.new) for c in res.changes] == [("safetensors", old, "9.9.9")]
    assert (ws.images / "tiny-cpu.yaml").read_text() == spec_before
    assert ws.target("tiny-cpu").lock().package("safetensors").version == "9.9.9"


def test_an_exact_pin_is_edited_in_the_spec_and_resolved_from_the_edited_requirements(ws, uv):
    calls, answer = uv
    answer["body"] = lambda req, prefer: _bump(prefer, "compressed-tensors", "0.20.0")
    res = od.relock(ws, "tiny-cpu", ["compressed-tensors==0.20.0"])
    [call] = calls
    assert "compressed-tensors==0.20.0" in call["req"].requirements
    assert "compressed-tensors==0.19.0" not in call["req"].requirements
    assert call["constraints"] == () and call["index_urls"] is None
    assert res.spec_edits == (
        "images/tiny-cpu.yaml: requirements: compressed-tensors==0.19.0 → "
        "compressed-tensors==0.20.0",)
    text = (ws.images / "tiny-cpu.yaml").read_text()
    assert "  - compressed-tensors==0.20.0\n" in text and "0.19.0" not in text
    # The lock is written for the edited spec: the next command (a new Workspace, reading
    # the edited file) finds it current.
    after = Workspace(ws.images, ws.lockfiles, ws.wheels).target("tiny-cpu")
    assert after.lock().inputs_hash == after.request.inputs_hash()
    assert after.lock().package("compressed-tensors").version == "0.20.0"


def test_the_engine_moves_in_engine_version(ws, uv):
    calls, answer = uv
    answer["body"] = lambda req, prefer: _bump(prefer, "transformers", "5.18.0")
    res = od.relock(ws, "tiny-cpu", ["transformers==5.18.0"])
    assert res.spec_edits == ("images/tiny-cpu.yaml: engine.version 5.17.0 → 5.18.0",)
    assert 'version: "5.18.0"' in (ws.images / "tiny-cpu.yaml").read_text()


def test_nothing_to_do_writes_nothing_and_says_so(ws, uv):
    calls, answer = uv
    answer["body"] = lambda req, prefer: prefer
    lock_path = ws.target("tiny-cpu").lock_path
    before = lock_path.read_bytes()
    res = od.relock(ws, "tiny-cpu", ["compressed-tensors==0.19.0", "safetensors"])
    assert res == od.RelockResult("tiny-cpu", res.lock, (), (), False,
                                  "nothing to do: the lock already has the newest versions "
                                  "the target allows")
    assert lock_path.read_bytes() == before
    [call] = calls
    assert call["upgrade"] == ("compressed-tensors", "safetensors")


def test_a_resolution_that_fails_names_the_target_and_touches_nothing(ws, uv):
    calls, answer = uv
    answer["error"] = ResolveError("uv found no solution", facts=["no solution"])
    spec = (ws.images / "tiny-cpu.yaml").read_text()
    lock = ws.target("tiny-cpu").lock_path.read_bytes()
    with pytest.raises(ResolveError) as e:
        od.relock(ws, "tiny-cpu", ["compressed-tensors==0.20.0", "safetensors"])
    assert e.value.message == "tiny-cpu cannot take compressed-tensors==0.20.0, safetensors"
    assert e.value.hint == "`imgbuild outdated tiny-cpu` shows what each newer release needs"
    assert (ws.images / "tiny-cpu.yaml").read_text() == spec
    assert ws.target("tiny-cpu").lock_path.read_bytes() == lock


def test_a_write_that_fails_part_way_puts_back_every_lock_it_wrote(ws, uv, monkeypatch):
    calls, answer = uv
    answer["body"] = lambda req, prefer: _bump(prefer, "safetensors", "9.9.9")
    locks = {r.lock_path: r.lock_path.read_bytes() for r in ws.platform_refs("tiny-cpu-multi")}
    real, writes = od.write_lock, []

    def second_fails(path, *a):
        writes.append(path)
        if len(writes) == 2:
            raise OSError(28, "No space left on device")
        return real(path, *a)
    monkeypatch.setattr(od, "write_lock", second_fails)
    with pytest.raises(OSError):
        od.relock(ws, "tiny-cpu-multi", ["safetensors"])
    assert len(writes) == 2 and {p: p.read_bytes() for p in locks} == locks


def test_a_write_that_fails_puts_the_spec_back(ws, uv, monkeypatch):
    calls, answer = uv
    answer["body"] = lambda req, prefer: _bump(prefer, "compressed-tensors", "0.20.0")
    spec = (ws.images / "tiny-cpu.yaml").read_text()

    def disk_full(*a, **kw):
        raise OSError(28, "No space left on device")
    monkeypatch.setattr(od, "write_lock", disk_full)
    with pytest.raises(OSError):
        od.relock(ws, "tiny-cpu", ["compressed-tensors==0.20.0"])
    assert (ws.images / "tiny-cpu.yaml").read_text() == spec


def test_a_name_the_lock_does_not_hold_is_refused_before_uv(ws, uv):
    calls, _ = uv
    with pytest.raises(InputError) as e:
        od.relock(ws, "tiny-cpu", ["left-pad==1.0"])
    assert (e.value.message, e.value.hint) == (
        "left-pad is not in tiny-cpu's lock", "name a package the lock holds (see lockfiles/)")
    assert calls == []


def test_every_platforms_lock_moves_with_the_first_or_none_does(ws, uv):
    calls, answer = uv
    refs = ws.platform_refs("tiny-cpu-multi")
    arm_lock = refs[1].lock().body
    # Only the arm64 lock has something to move: relock is not "nothing to do".
    answer["body"] = lambda req, prefer: (_bump(prefer, "safetensors", "9.9.9")
                                          if "aarch64" in req.uv_platform else prefer)
    res = od.relock(ws, "tiny-cpu-multi", ["safetensors"])
    assert res.written and res.changes == ()  # the first platform's lock is unchanged
    assert [c["req"].uv_platform for c in calls] == [r.request.uv_platform for r in refs]
    assert calls[1]["prefer"] == arm_lock and calls[1]["upgrade"] == ("safetensors",)
    again = Workspace(ws.images, ws.lockfiles, ws.wheels).platform_refs("tiny-cpu-multi")
    assert again[1].lock().package("safetensors").version == "9.9.9"
    # A platform that cannot take it: named, and no platform's lock moves.
    calls.clear()
    locks = [r.lock_path.read_bytes() for r in again]

    def arm_fails(req, prefer):
        if "aarch64" in req.uv_platform:
            raise ResolveError("no solution", facts=[f"fact {i}" for i in range(20)])
        return _bump(prefer, "safetensors", "9.9.8")
    answer["body"] = arm_fails
    answer["error"] = None
    with pytest.raises(ResolveError) as e:
        od.relock(ws, "tiny-cpu-multi", ["safetensors"])
    assert e.value.message == "tiny-cpu-multi cannot take safetensors on linux/arm64"
    assert e.value.facts == [f"fact {i}" for i in range(8, 20)]  # uv's last 12 lines
    assert e.value.hint == ("`imgbuild outdated tiny-cpu-multi` shows what each newer release "
                            "needs")
    assert [r.lock_path.read_bytes() for r in again] == locks


# --- base_news: is there a newer CUDA base? ------------------------------------------------------

CUDA = "nvidia/cuda:13.0.0-cudnn-devel-ubuntu24.04"
# Tags as nvidia/cuda names them (the kinds Docker Hub lists: patch releases, a minor release,
# other flavors and OS releases beside them).
TAGS = ["12.9.1-cudnn-devel-ubuntu24.04", "13.0.0-cudnn-devel-ubuntu24.04",
        "13.1.0-cudnn-devel-ubuntu24.04", "13.0.2-cudnn-devel-ubuntu24.04",
        "13.0.1-cudnn-devel-ubuntu24.04", "13.0.2-runtime-ubuntu24.04",
        "13.0.2-cudnn-devel-ubuntu22.04", "latest"]


@pytest.fixture()
def hub(monkeypatch):
    """The registry's tag list, scripted: asked for nvidia/cuda only, with the timeout given."""
    asked: list[float] = []
    answer: dict = {"tags": TAGS}

    def registry_tags(name, *, timeout):
        assert name == "nvidia/cuda", name
        asked.append(timeout)
        if isinstance(answer["tags"], Exception):
            raise answer["tags"]
        return answer["tags"]
    monkeypatch.setattr(od, "registry_tags", registry_tags)
    return asked, answer


def test_newer_patch_and_minor_releases_of_the_same_flavor_are_news(ws, hub):
    asked, _ = hub
    assert od.base_news(ws.catalog, CUDA) == od.BaseNews(
        CUDA, "newer", ("13.0.1-cudnn-devel-ubuntu24.04", "13.0.2-cudnn-devel-ubuntu24.04",
                        "13.1.0-cudnn-devel-ubuntu24.04"),
        "2 newer patch release(s) of CUDA 13.0")
    assert asked == [5]
    od.base_news(ws.catalog, CUDA + "@sha256:" + "a" * 64, timeout=9)  # pinned: same news
    assert asked == [5, 9]


def test_only_a_newer_cuda_says_it_needs_a_torch_for_it_and_none_is_current(ws, hub):
    _, answer = hub
    answer["tags"] = ["13.1.0-cudnn-devel-ubuntu24.04", "14.0.0-cudnn-devel-ubuntu24.04"]
    b = od.base_news(ws.catalog, "nvidia/cuda:13.0.2-cudnn-devel-ubuntu24.04")
    assert (b.status, b.newer, b.note) == (
        "newer", ("13.1.0-cudnn-devel-ubuntu24.04", "14.0.0-cudnn-devel-ubuntu24.04"),
        "newer CUDA releases only (a new CUDA also needs a torch built for it)")
    answer["tags"] = TAGS
    assert od.base_news(ws.catalog, "nvidia/cuda:13.1.0-cudnn-devel-ubuntu24.04") == \
        od.BaseNews("nvidia/cuda:13.1.0-cudnn-devel-ubuntu24.04", "current")


def test_an_unreachable_registry_is_not_checked_and_says_which(ws, hub):
    from imgbuild.errors import EnvError

    _, answer = hub
    answer["tags"] = EnvError("connection refused")
    assert od.base_news(ws.catalog, CUDA) == od.BaseNews(
        CUDA, "not checked", note="registry registry-1.docker.io unreachable (connection refused)")


def test_what_is_not_a_cuda_tag_is_not_asked_about(ws, hub):
    asked, _ = hub
    os_note = "an OS release tag: a newer tag is another OS release, not an update of this one"
    for image in ("ubuntu:24.04", "ubuntu", "nvidia/cuda", "nvidia/cuda:latest",
                  "localhost:5000/nvidia/cuda", "ghcr.io/acme/cuda:13.0.0-devel"):
        b = od.base_news(ws.catalog, image)
        assert b == od.BaseNews(image, "not checked", note=os_note), image
    local = ws.catalog.base("debian-bookworm").image
    assert od.base_news(ws.catalog, local) == od.BaseNews(
        local, "not checked", note="made on the build machine by `imgbuild base bootstrap` from "
        "Debian's packages; it is on no upstream registry")
    assert asked == []


def test_tags_are_read_page_after_page_and_a_missing_repository_has_none(monkeypatch):
    from types import SimpleNamespace

    from imgbuild.errors import EnvError

    pages = {"nvidia/cuda/tags/list?n=1000": (200, ["a", "b"], '</v2/next?last=b>; rel="next"'),
             "/v2/next?last=b": (200, ["c"], "")}
    got = []

    def request(method, url, *, scope, timeout):
        got.append((method, url, scope, timeout))
        status, tags, link = pages.get(url, (404, None, ""))
        return SimpleNamespace(status_code=status, json=lambda: {"tags": tags},
                               headers={"Link": link})
    repo = SimpleNamespace(host="registry-1.docker.io", path="nvidia/cuda",
                           scope=lambda *a: "repository:nvidia/cuda:" + ",".join(a),
                           api=SimpleNamespace(request=request))
    monkeypatch.setattr(od, "_repository_of", lambda name: repo)
    assert od.registry_tags("nvidia/cuda", timeout=4) == ["a", "b", "c"]
    assert got[0] == ("GET", "nvidia/cuda/tags/list?n=1000", "repository:nvidia/cuda:pull",
                      (4, 30))
    assert od.registry_tags("nvidia/cuda", max_pages=1) == ["a", "b"]
    assert got[-1][3] == (5, 30)  # by default 5 s to connect, 30 to read
    del pages["/v2/next?last=b"]  # the next page gone meanwhile: what was read is kept
    assert od.registry_tags("nvidia/cuda") == ["a", "b"]
    pages.clear()
    assert od.registry_tags("nvidia/cuda") == []
    pages["nvidia/cuda/tags/list?n=1000"] = (401, None, "")
    with pytest.raises(EnvError) as e:
        od.registry_tags("nvidia/cuda")
    assert e.value.message == "registry registry-1.docker.io answered 401 listing nvidia/cuda"


def test_a_name_without_a_host_is_on_docker_hub_and_a_bare_one_in_library():
    assert (od._repository_of("ubuntu").host, od._repository_of("ubuntu").path) == (
        "registry-1.docker.io", "library/ubuntu")
    assert od._repository_of("nvidia/cuda").path == "nvidia/cuda"
    assert od._repository_of("ghcr.io/acme/x").host == "ghcr.io"


# --- what relock refuses, and a pin moved to its newest resolving release -----------------------

def test_a_package_an_override_holds_is_refused_with_its_reason(ws, uv):
    calls, _ = uv
    t = ws.target("sglang-vllm-blackwell").target
    ov = next(o for o in t.overrides if o.name == "torch")
    with pytest.raises(InputError) as e:
        od.relock(ws, "sglang-vllm-blackwell", ["torch"])
    assert (e.value.message, e.value.facts, e.value.hint) == (
        f"torch is held by an override in {t.path}: {ov.requirement}",
        [f"reason: {ov.reason}"],
        f"edit or remove the override in {t.path} (with its reason), then `imgbuild lock "
        "sglang-vllm-blackwell`")
    assert calls == []


@pytest.fixture()
def index(monkeypatch):
    """The indexes' version lists, scripted: per package, the versions, or an unreachable
    index; what was asked, and of which index."""
    import requests
    from packaging.version import Version

    asked: list[tuple[str, str]] = []
    lists: dict = {}

    def index_versions(name, url):
        asked.append((name, url))
        got = lists.get(name, [])
        if isinstance(got, Exception):
            raise got
        return [Version(v) for v in got]
    monkeypatch.setattr(od, "index_versions", index_versions)
    lists["_unreachable"] = requests.ConnectionError("refused")
    return asked, lists


def test_a_pin_named_alone_moves_to_its_newest_release_that_resolves(ws, uv, index):
    calls, answer = uv
    asked, lists = index
    lists["compressed-tensors"] = ["0.19.0", "0.20.0", "0.21.0"]

    def body(req, prefer):
        if "compressed-tensors==0.21.0" in req.requirements:
            raise ResolveError("no", facts=[
                "Because torch==2.13.0 depends on compressed-tensors<0.21 and you require "
                "compressed-tensors==0.21.0, we can conclude that..."])
        return _bump(prefer, "compressed-tensors", "0.20.0")
    answer["body"] = body
    res = od.relock(ws, "tiny-cpu", ["compressed-tensors"], index_urls=["https://ix.example/"])
    assert {url for _, url in asked} == {"https://ix.example/",
                                         "https://download.pytorch.org/whl/cpu/"}
    lock = ws.target("tiny-cpu").lock()
    tries = [c for c in calls if c["upgrade"] == ("compressed-tensors",)][:2]
    assert [("compressed-tensors==0.21.0" in c["req"].requirements,
             "compressed-tensors==0.20.0" in c["req"].requirements) for c in tries] == [
        (True, False), (False, True)]  # newest first
    assert all(c["prefer"] is not None and c["index_urls"] == ("https://ix.example/",)
               for c in tries)
    assert res.spec_edits == ("images/tiny-cpu.yaml: requirements: compressed-tensors==0.19.0 "
                              "→ compressed-tensors==0.20.0",)
    assert lock.package("compressed-tensors").version == "0.20.0"


def test_a_pin_none_of_whose_newer_releases_resolves_says_what_blocks_each(ws, uv, index):
    calls, answer = uv
    _, lists = index
    lists["compressed-tensors"] = ["0.20.0", "0.21.0"]

    def body(req, prefer):
        raise ResolveError("no", facts=[
            "Because torch==2.13.0 depends on compressed-tensors<0.20 and safetensors<0.9 and "
            "you require compressed-tensors>=0.20, we can conclude that..."])
    answer["body"] = body
    spec = (ws.images / "tiny-cpu.yaml").read_text()
    with pytest.raises(ResolveError) as e:
        od.relock(ws, "tiny-cpu", ["compressed-tensors"])
    assert e.value.message == "no newer compressed-tensors resolves for tiny-cpu"
    assert e.value.facts == [
        f"compressed-tensors {v}: blocked by torch==2.13.0 requires compressed-tensors<0.20; "
        "images/tiny-cpu.yaml requires compressed-tensors>=0.20" for v in ("0.21.0", "0.20.0")]
    assert e.value.hint == ("relax the pins named above in images/tiny-cpu.yaml, or add an "
                            "override with a reason")
    assert (ws.images / "tiny-cpu.yaml").read_text() == spec
    assert all(c["prefer"] == ws.target("tiny-cpu").lock().body for c in calls)


def test_a_pin_whose_releases_no_index_could_list_is_refused(ws, uv, index):
    calls, _ = uv
    _, lists = index
    lists["compressed-tensors"] = lists["_unreachable"]
    with pytest.raises(ResolveError) as e:
        od.relock(ws, "tiny-cpu", ["compressed-tensors"], index_urls=["https://ix.example/"])
    assert e.value.message == "cannot tell whether compressed-tensors has a newer release"
    assert e.value.facts[0] == ("https://ix.example/ not checked for compressed-tensors: "
                                "unreachable (ConnectionError)")
    assert e.value.hint == "check the network, or give NAME==VERSION"
    assert calls == []


def test_an_engine_version_the_text_edit_cannot_find_is_left_to_the_user(ws, uv):
    calls, answer = uv
    answer["body"] = lambda req, prefer: _bump(prefer, "transformers", "5.18.0")
    path = ws.images / "tiny-cpu.yaml"
    text = path.read_text().replace('  version: "5.17.0"', '  version: >-\n    5.17.0')
    path.write_text(text)
    ws = Workspace(ws.images, ws.lockfiles, ws.wheels)
    lock = ws.target("tiny-cpu").lock_path.read_bytes()
    with pytest.raises(InputError) as e:
        od.relock(ws, "tiny-cpu", ["transformers==5.18.0"])
    assert (e.value.message, e.value.hint) == (
        "cannot edit images/tiny-cpu.yaml by text (engine 5.17.0)",
        "change it by hand to 5.18.0, then `imgbuild lock tiny-cpu`")
    assert path.read_text() == text and ws.target("tiny-cpu").lock_path.read_bytes() == lock


def test_an_edit_that_reads_back_as_other_requirements_is_undone(ws, uv, monkeypatch):
    """The spec read back after the edit gives other requirements than the ones resolved
    (here, a catalog read that does not see the edit): refused, and the spec put back."""
    from imgbuild.catalog.catalog import load_catalog

    calls, answer = uv
    answer["body"] = lambda req, prefer: _bump(prefer, "compressed-tensors", "0.20.0")
    before = load_catalog(list(ws.layers))
    monkeypatch.setattr(od, "load_catalog", lambda layers: before)
    spec = (ws.images / "tiny-cpu.yaml").read_text()
    with pytest.raises(InputError) as e:
        od.relock(ws, "tiny-cpu", ["compressed-tensors==0.20.0"])
    assert e.value.message == ("editing images/tiny-cpu.yaml gave other requirements than "
                               "intended")
    assert e.value.facts[0].startswith("intended [") and "compressed-tensors==0.20.0" in \
        e.value.facts[0]
    assert e.value.facts[1].startswith("got [") and "compressed-tensors==0.19.0" in \
        e.value.facts[1]
    assert e.value.hint == "edit the spec by hand"
    assert (ws.images / "tiny-cpu.yaml").read_text() == spec


def test_a_projects_multi_platform_target_moves_both_locks_in_the_project(tmp_path, uv,
                                                                          monkeypatch):
    """A project's target that extends the built-in one: every platform's lock is written in
    the project's lockfiles/, read through the project's layers (its own over the built-in)."""
    from .test_project import project

    calls, answer = uv
    answer["body"] = lambda req, prefer: _bump(prefer, "safetensors", "9.9.9")
    proj = project(tmp_path / "p", {"images/tiny-cpu-multi.yaml": "extends: tiny-cpu-multi\n"})
    monkeypatch.delenv("IMGBUILD_IMAGES", raising=False)
    monkeypatch.delenv("IMGBUILD_LOCKFILES", raising=False)
    ws = Workspace.open(cwd=proj)
    # A write that fails on the second platform: the first platform's lock is taken back too.
    real, writes = od.write_lock, []

    def second_fails(path, *a):
        writes.append(path)
        if len(writes) == 2:
            raise OSError(28, "No space left on device")
        return real(path, *a)
    monkeypatch.setattr(od, "write_lock", second_fails)
    with pytest.raises(OSError):
        od.relock(ws, "tiny-cpu-multi", ["safetensors"])
    assert not (proj / "lockfiles").exists() or list((proj / "lockfiles").iterdir()) == []
    monkeypatch.setattr(od, "write_lock", real)
    calls.clear()
    res = od.relock(Workspace.open(cwd=proj), "tiny-cpu-multi", ["safetensors"])
    assert res.written and len(calls) == 2
    again = Workspace.open(cwd=proj).platform_refs("tiny-cpu-multi")
    assert [r.lock_path.parent for r in again] == [proj / "lockfiles"] * 2
    assert [r.lock().package("safetensors").version for r in again] == ["9.9.9", "9.9.9"]
