"""The override checks' decisions (lock/resolve.py) around uv, with uv's answer given: how
many checks run at once, what each check's cache key is made of, what a check says for each
answer uv can give, and how `lock_many` hands each target to ensure_lock. uv itself answers in
tests/test_lock_checks_cache.py and tests/test_resolver.py; here `resolve` stands in for it,
with uv's words as uv writes them."""

from __future__ import annotations

import concurrent.futures
import dataclasses
from pathlib import Path

import pytest

from imgbuild.errors import LockError, ResolveError
from imgbuild.lock import checkcache
from imgbuild.lock import resolve as resolve_mod
from imgbuild.lock.lockfile import LockedPackage, Lockfile, LockRequest
from imgbuild.lock.resolve import OverrideStatus, check_workers

H = "--hash=sha256:" + "a" * 64


def pins(**versions: str) -> str:
    """A body as `uv pip compile --generate-hashes` writes one."""
    return "".join(f"{n}=={v} \\\n    {H}\n    # via eng\n" for n, v in versions.items())


def lock(**versions: str) -> Lockfile:
    pkgs = tuple(LockedPackage(n, v, (H.split("=", 1)[1],)) for n, v in versions.items())
    return Lockfile(Path("t.lock"), "t", "sha256:in", "sha256:body", pins(**versions), pkgs)


REQ = LockRequest("t", "3.11", "x86_64-manylinux_2_36", ("eng-a==1.0", "eng-b==1.0"),
                  ("ctensors>=0.10", "servo>=1"), extra_index_urls=(
                      "https://user:secret@mirror.example/torch/cpu",), build_from_source=True)


@pytest.mark.parametrize(("n", "cpus", "want"), [
    (1, 16, 1), (3, 16, 3), (10, 16, 4), (10, 2, 2), (10, None, 2), (3, None, 2), (0, 16, 1)])
def test_checks_at_once_are_the_overrides_the_cores_or_four_whichever_is_fewest(
        monkeypatch, n, cpus, want):
    monkeypatch.setattr(resolve_mod.os, "cpu_count", lambda: cpus)
    assert check_workers(n) == want


class Answers:
    """uv's answers by the override left out: a body, or the ResolveError it raised."""

    def __init__(self, monkeypatch, answers: dict[str, str | ResolveError]):
        self.asked: list[tuple[LockRequest, Path | None]] = []
        self.answers = answers
        monkeypatch.setattr(resolve_mod, "resolve", self)

    def __call__(self, req: LockRequest, wheels: Path | None = None) -> str:
        self.asked.append((req, wheels))
        dropped = set(REQ.overrides) - set(req.overrides)
        got = self.answers[dropped.pop() if dropped else "*"]
        if isinstance(got, ResolveError):
            raise got
        return got


def check(ov: str, locked: Lockfile, wheels: Path | None = None) -> OverrideStatus:
    without = LockRequest(REQ.target, REQ.python, REQ.uv_platform, REQ.requirements,
                          tuple(o for o in REQ.overrides if o != ov))
    return resolve_mod._check_one(without, ov, wheels, locked)


def test_no_resolution_without_it_names_who_requires_the_package(monkeypatch):
    facts = ["Because eng-a==1.0 depends on ctensors==0.8.1",
             "and eng-b==1.0 depends on ctensors>=0.10, we can conclude that ..."]
    uv = Answers(monkeypatch, {"ctensors>=0.10": ResolveError("no", facts=facts)})
    wheels = Path("/wheels")
    assert check("ctensors>=0.10", lock(ctensors="0.11"), wheels) == OverrideStatus(
        "ctensors>=0.10", True, "without it there is no resolution (eng-a==1.0 requires "
        "ctensors==0.8.1; eng-b==1.0 requires ctensors>=0.10)")
    assert uv.asked[0][1] == wheels  # uv reads the same local wheels the lock did
    # The override's name is read past extras and markers, and compared as a canonical name.
    uv.answers["*"] = ResolveError("no", facts=[
        "Because eng-a==1.0 depends on compressed-tensors==0.8.1"])
    got = resolve_mod._check_one(REQ, "Compressed_Tensors[x]>=0.10; python_version>'3'", None,
                                 lock())
    assert got.effect == "without it there is no resolution (eng-a==1.0 requires " \
                         "compressed-tensors==0.8.1)"


def test_no_resolution_that_names_nobody_says_just_that(monkeypatch):
    Answers(monkeypatch, {"servo>=1": ResolveError("no", facts=[
        "Because eng-a==1.0 depends on numbra==1.0 and numbra==1.0 depends on python>=4"])})
    assert check("servo>=1", lock(servo="1.0")) == OverrideStatus(
        "servo>=1", True, "without it there is no resolution")


def test_the_same_resolution_makes_it_removable_and_any_difference_is_shown(monkeypatch):
    uv = Answers(monkeypatch, {"servo>=1": pins(enga="1.0", servo="2.0")})
    assert check("servo>=1", lock(enga="1.0", servo="2.0")) == OverrideStatus(
        "servo>=1", False, "the resolution is the same without it: removable")
    # A package the lock has and the resolution without the override does not is a change.
    assert check("servo>=1", lock(enga="1.0", servo="2.0", gone="3.0")) == OverrideStatus(
        "servo>=1", True, "without it: gone 3.0 → -")
    uv.answers["servo>=1"] = pins(enga="1.0", servo="1.0", new="1.0")
    assert check("servo>=1", lock(enga="1.0", servo="2.0")).effect == \
        "without it: new - → 1.0, servo 2.0 → 1.0"
    uv.answers["servo>=1"] = pins(**{f"p{i}": "2" for i in range(6)})
    assert check("servo>=1", lock(**{f"p{i}": "1" for i in range(6)})).effect == \
        "without it: p0 1 → 2, p1 1 → 2, p2 1 → 2, p3 1 → 2 (+2 more)"


def test_an_answer_that_is_no_lock_names_the_check(monkeypatch):
    Answers(monkeypatch, {"servo>=1": "servo==2.0\n"})
    with pytest.raises(LockError) as e:
        check("servo>=1", lock(servo="2.0"))
    assert e.value.message == "resolution without servo>=1: servo==2.0 has no --hash"


class Pool(concurrent.futures.ThreadPoolExecutor):
    sizes: list[int | None] = []

    def __init__(self, max_workers=None):
        Pool.sizes.append(max_workers)
        super().__init__(max_workers=max_workers)


@pytest.fixture()
def pool(monkeypatch) -> list[int | None]:
    Pool.sizes = []
    monkeypatch.setattr(resolve_mod, "ThreadPoolExecutor", Pool)
    return Pool.sizes


def test_each_check_is_keyed_by_all_of_the_request_but_the_override(monkeypatch, tmp_path, pool):
    """What the cache key is made of: the request less the override left out, credentials
    taken out of every index address, and what all the checks share."""
    monkeypatch.setenv("IMGBUILD_CACHE", str(tmp_path))
    monkeypatch.setattr(resolve_mod, "mirror_index",
                        lambda: "https://me:pw@pypi-mirror.example/simple")
    monkeypatch.setattr(resolve_mod, "uv_version", lambda: "uv 0.13.9")
    keyed: list[checkcache.CheckInputs] = []
    real_key = checkcache.check_key
    monkeypatch.setattr(checkcache, "check_key", lambda i: keyed.append(i) or real_key(i))
    checked: list[tuple] = []

    def one(without, ov, wheels, locked):
        checked.append((without.overrides, ov, wheels))
        return OverrideStatus(ov, ov.startswith("c"), "given")

    monkeypatch.setattr(resolve_mod, "_check_one", one)
    locked = lock(servo="2.0")
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    got = resolve_mod.check_overrides(REQ, wheels, locked, use_cache=False)
    assert got == [OverrideStatus("ctensors>=0.10", True, "given"),
                   OverrideStatus("servo>=1", False, "given")]
    assert sorted(checked) == [(("ctensors>=0.10",), "servo>=1", wheels),
                               (("servo>=1",), "ctensors>=0.10", wheels)]
    first = min(keyed, key=lambda i: i.dropped)
    assert first == checkcache.CheckInputs(
        dropped="ctensors>=0.10", python="3.11", uv_platform="x86_64-manylinux_2_36",
        requirements=("eng-a==1.0", "eng-b==1.0"), overrides=("servo>=1",),
        extra_index_urls=("https://mirror.example/torch/cpu",), build_from_source=True,
        default_index="https://pypi-mirror.example/simple", uv_version="uv 0.13.9",
        uv_settings=checkcache.uv_settings(resolve_mod.uv_env()),
        wheels=checkcache.wheels_signature(wheels), locked_pins=locked.digest)
    assert pool == [2]  # two overrides: two checks at once
    resolve_mod.check_overrides(REQ, wheels, locked, jobs=1, use_cache=False)
    assert pool == [2, 1]
    # With nothing to check, no pool and no uv.
    assert resolve_mod.check_overrides(
        LockRequest("t", "3.11", "x86_64-manylinux_2_36", ("a",), ()), None, locked) == []
    assert pool == [2, 1]


def test_lock_many_hands_each_target_to_ensure_lock_and_says_how_long_it_took(
        monkeypatch, tmp_path, pool):
    calls: list[tuple] = []
    a = LockRequest("a", "3.11", "x86_64-manylinux_2_36", ("x",), ())
    b = LockRequest("b", "3.11", "aarch64-manylinux_2_36", ("x",), ())
    (tmp_path / b.filename()).write_text("already locked")

    def ensure(r, lock_dir, wheels, *, refresh):
        calls.append((r.target, lock_dir, wheels, refresh))
        if r.target == "b" and refresh:
            raise ResolveError("no resolution", facts=[])
        return lock(x="1.0", y="2.0"), r.target == "a"

    monkeypatch.setattr(resolve_mod, "ensure_lock", ensure)
    clock = iter([100.0, 102.5, 200.0])
    monkeypatch.setattr(resolve_mod.time, "monotonic", lambda: next(clock))
    notes: list[str] = []
    wheels = tmp_path / "w"
    got = resolve_mod.lock_many([a, b], tmp_path, wheels, jobs=1, note=notes.append)
    assert [(lk is not None, w, e) for lk, w, e in got] == [(True, True, None),
                                                            (True, False, None)]
    assert calls == [("a", tmp_path, wheels, False), ("b", tmp_path, wheels, False)]
    # Only the target with no lock yet is announced; only a written lock is timed.
    assert notes == ["locking a (x86_64-manylinux_2_36) with uv ...",
                     "locked a (x86_64-manylinux_2_36): 2 packages in 2.5 s"]
    assert pool == [1]
    clock = iter([0.0, 1.0, 2.0, 3.0])
    calls.clear()
    notes.clear()
    got = resolve_mod.lock_many([b], tmp_path, wheels, refresh=True, note=notes.append)
    assert calls == [("b", tmp_path, wheels, True)]
    assert got[0][:2] == (None, False) and isinstance(got[0][2], ResolveError)
    assert notes == ["locking b (aarch64-manylinux_2_36) with uv ..."]
    assert pool == [1, 4]  # four targets at once unless told
    resolve_mod.lock_many([], tmp_path, jobs=0)
    assert pool == [1, 4, 1]


# --- resolve(): the uv command it builds and what each way uv ends becomes -------------------
# uv here is a script that keeps its arguments, working directory and input files, and answers
# as uv does: the body in out.txt, or uv's own words on stderr and its exit code.

@pytest.fixture()
def uv(tmp_path, monkeypatch):
    log = tmp_path / "uv-log"
    log.mkdir()
    answer = tmp_path / "answer"
    script = tmp_path / "uv"
    script.write_text(
        "#!/bin/sh\n"
        f'echo "$*" > {log}/argv\npwd > {log}/cwd\n'
        f'for f in constraints.txt overrides.txt; do [ -f "$f" ] && cp "$f" {log}/; done\n'
        f'. {answer}\n')
    script.chmod(0o755)
    monkeypatch.setattr(resolve_mod, "uv_bin", lambda: str(script))

    def answers(text: str) -> None:
        answer.write_text(text)

    answers(f"printf 'a==1 \\\\\\n    {H}\\n' > out.txt\n")
    return log, answers


def test_the_uv_command_names_the_indexes_the_constraints_and_the_packages_to_upgrade(uv):
    log, _ = uv
    req = LockRequest("t", "3.11", "x86_64-manylinux_2_36", ("a",), ("b>=2",))
    body = resolve_mod.resolve(req, constraints=("c<3", "d==1"), upgrade=("a",),
                               index_urls=("https://one/simple", "https://two/simple",
                                           "https://three/simple"))
    assert body.startswith("a==1 ")
    argv = (log / "argv").read_text().split()
    assert argv[argv.index("-c") + 1] == "constraints.txt"
    assert (log / "constraints.txt").read_text() == "c<3\nd==1\n"
    assert (log / "overrides.txt").read_text() == "b>=2\n"
    assert argv[:2] == ["pip", "compile"]
    i = argv.index("--default-index")
    assert argv[i:i + 6] == ["--default-index", "https://one/simple", "--extra-index-url",
                             "https://two/simple", "--extra-index-url", "https://three/simple"]
    assert argv[argv.index("--upgrade-package") + 1] == "a"
    # uv ran in a scratch directory named for imgbuild, gone after
    cwd = Path((log / "cwd").read_text().strip())
    assert cwd.name.startswith("imgbuild-lock-") and not cwd.exists()


def test_each_way_uv_fails_becomes_its_own_error(uv):
    from imgbuild.errors import EnvError

    _, answers = uv
    req = LockRequest("t", "3.11", "x86_64-manylinux_2_36", ("a",), ())
    answers("echo '  × No solution found when resolving dependencies:' >&2\n"
            "echo '  ╰─▶ Because a was not found in the package registry' >&2\nexit 1\n")
    with pytest.raises(ResolveError) as e:
        resolve_mod.resolve(req)
    assert e.value.message == ("no environment satisfies target 't' on Python 3.11, "
                               "x86_64-manylinux_2_36")
    assert e.value.facts == ["× No solution found when resolving dependencies:",
                             "  ╰─▶ Because a was not found in the package registry"]
    assert e.value.hint == "relax a requirement, or add an override with a reason to " \
                           "images/t.yaml"
    answers("echo 'Because torch==2.13.0 has no usable wheels and you require torch==2.13.0' "
            ">&2\nexit 1\n")
    with pytest.raises(ResolveError) as e:
        resolve_mod.resolve(req)
    assert e.value.hint == ("pin a release that has a wheel for this platform (an override with "
                            "a reason in images/t.yaml), or allow compiling sdists in the build: "
                            "`build_from_source: true`")
    with pytest.raises(ResolveError) as e:  # sdists allowed: not the wheels' fault
        resolve_mod.resolve(dataclasses.replace(req, build_from_source=True))
    assert e.value.hint.startswith("relax a requirement")
    answers("for i in $(seq 1 20); do echo \"line $i\" >&2; done\n"
            "echo 'error: Failed to fetch: https://pypi.org/simple/a/' >&2\nexit 2\n")
    with pytest.raises(EnvError) as e:
        resolve_mod.resolve(req)
    assert e.value.message == "cannot reach the package index to lock target 't'"
    assert e.value.facts == [f"line {i}" for i in range(10, 21)] + [
        "error: Failed to fetch: https://pypi.org/simple/a/"]
    assert e.value.hint == ("check the network, the proxy (HTTPS_PROXY) and the index "
                            "(UV_DEFAULT_INDEX for a mirror, SSL_CERT_FILE for its CA); offline, "
                            "pass --wheels DIR with the wheels the target needs")


def test_exactly_four_changes_are_all_shown(monkeypatch):
    Answers(monkeypatch, {"servo>=1": pins(**{f"p{i}": "2" for i in range(4)})})
    assert check("servo>=1", lock(**{f"p{i}": "1" for i in range(4)})).effect == \
        "without it: p0 1 → 2, p1 1 → 2, p2 1 → 2, p3 1 → 2"


def test_a_conflict_is_explained_with_uv_asked_on_the_same_wheels(monkeypatch, tmp_path):
    """resolve_explained: uv's chain, who asks for what, and the overrides that resolve it,
    each tried with uv reading the same local wheels."""
    chain = ("Because engine-old==1.0 depends on ctensors==0.8.1, and you require "
             "ctensors>=0.10, we can conclude that you require engine-old<1.0.")
    asked: list = []

    def resolve(req, wheels=None, **kw):
        asked.append(wheels)
        if not req.overrides:
            raise ResolveError("no environment satisfies target 't'", facts=[chain])
        return pins(ctensors="0.10")

    monkeypatch.setattr(resolve_mod, "resolve", resolve)
    wheels = tmp_path / "w"
    req = LockRequest("t", "3.11", "x86_64-manylinux_2_36", ("engine-old==1.0",
                                                             "ctensors>=0.10"), ())
    with pytest.raises(ResolveError) as e:
        resolve_mod.resolve_explained(req, wheels)
    assert e.value.facts[:2] == [chain, "who asks for what:"]
    assert e.value.hint.startswith("these overrides resolve it (checked with uv)")
    assert len(asked) > 1 and all(w == wheels for w in asked)


def test_a_lock_is_resolved_with_the_wheels_it_was_given(monkeypatch, tmp_path):
    got: list = []
    monkeypatch.setattr(resolve_mod, "resolve_explained",
                        lambda req, wheels: got.append(wheels) or pins(a="1"))
    monkeypatch.setattr(resolve_mod, "uv_version", lambda: "uv 0.13.9")
    req = LockRequest("t", "3.11", "x86_64-manylinux_2_36", ("a",), ())
    lk, written = resolve_mod.ensure_lock(req, tmp_path, tmp_path / "w")
    assert written and got == [tmp_path / "w"] and [p.name for p in lk.packages] == ["a"]
