"""`imgbuild lock` / `lock --check` as pipeline/lock.py decides them: one lock per platform, a
kernel record that is missing or stale makes a lock stale, an error stays with its target and
sets the exit code, the overrides each lock still needs are said. uv is faked at the calls
pipeline/lock.py makes (freshness, lock_many, check_overrides): the resolver itself is
tests/test_lock.py's, against a real index."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pytest

from imgbuild.errors import EXIT_ENV, EXIT_FAILED, EXIT_INPUT, EnvError, InputError, JobFailed
from imgbuild.lock.freshness import Freshness
from imgbuild.lock.resolve import OverrideStatus
from imgbuild.pipeline import lock as plock

from .conftest import checkout_workspace
from .progress_notes import Notes


@pytest.fixture(scope="module")
def ws():
    return checkout_workspace()


# -- the report's data ------------------------------------------------------------------------

def test_an_entry_says_what_its_mode_knows():
    written = plock.LockEntry("t", "l.txt", written=True, packages=3, hash="sha256:1")
    assert written.to_dict() == {"target": "t", "lock": "l.txt", "written": True,
                                 "packages": 3, "hash": "sha256:1"}
    checked = plock.LockEntry("t", "l.txt", stale=True, diff=("-a==1", "+a==2"))
    assert checked.to_dict() == {"target": "t", "lock": "l.txt", "stale": True,
                                 "diff": ["-a==1", "+a==2"]}
    fresh = plock.LockEntry("t", "l.txt", stale=False)
    assert fresh.to_dict()["stale"] is False and "written" not in fresh.to_dict()
    ov = ({"requirement": "x==1", "needed": True, "effect": "e", "reason": "r"},)
    assert plock.LockEntry("t", "l", stale=False, overrides=ov).to_dict()["overrides"] == list(ov)
    assert "overrides" not in fresh.to_dict()
    # An error replaces everything else the entry would say.
    err = plock.LockEntry("t", "l.txt", stale=True, overrides=ov, error=InputError("no such"))
    assert err.to_dict() == {"target": "t", "lock": "l.txt", "error": "no such"}


@pytest.mark.parametrize("entries, code, stale, failed", [
    ((), 0, [], []),
    (((False, None), (False, None)), 0, [], []),
    (((True, None), (False, None)), 1, ["a"], []),  # stale: exit 1
    (((True, None), (False, InputError("x"))), EXIT_INPUT, ["a"], ["b"]),
    (((False, EnvError("uv")), (False, InputError("x"))), EXIT_ENV, [], ["a", "b"]),
    (((False, JobFailed("y")), (None, None)), EXIT_FAILED, [], ["a"]),
])
def test_the_exit_code_is_the_worst_failure_else_stale_else_zero(entries, code, stale, failed):
    es = tuple(plock.LockEntry(n, f"{n}.txt", stale=s, error=e)
               for n, (s, e) in zip("ab", entries))
    r = plock.LockReport(True, es)
    assert r.exit_code == code
    assert r.stale == stale
    assert [e.message for e in r.failed] == [e.error.message for e in es if e.error]
    d = r.to_dict()
    assert d["stale"] == stale and d["failed"] == failed
    assert [x["target"] for x in d["locks"]] == list("ab"[:len(entries)])


def test_no_target_named_is_refused(ws):
    with pytest.raises(InputError, match="name a target or pass --all"):
        plock.lock_targets(ws, [])


# -- --check ----------------------------------------------------------------------------------

def test_check_is_one_entry_per_platform_and_a_stale_kernel_record_is_stale(ws, monkeypatch):
    asked: list[Path] = []

    def fresh(req, path, wheels):
        asked.append(path)
        stale = "aarch64" in path.name
        return Freshness(stale, ("-x==1", "+x==2") if stale else ())

    monkeypatch.setattr(plock, "freshness", fresh)
    monkeypatch.setattr(plock, "_kernel_record_diff", lambda ws, ref: ())
    r = plock.lock_targets(ws, ["tiny-cpu-multi"], check=True)
    refs = ws.platform_refs("tiny-cpu-multi")
    assert len(refs) == 2 and sorted(asked) == sorted(r_.lock_path for r_ in refs)
    by = {Path(e.lock).name: e for e in r.entries}
    [arm] = [e for n, e in by.items() if "aarch64" in n]
    [amd] = [e for n, e in by.items() if "aarch64" not in n]
    assert arm.stale is True and arm.diff == ("-x==1", "+x==2")
    assert amd.stale is False and amd.diff == ()
    assert r.exit_code == 1 and r.stale == ["tiny-cpu-multi"]
    # The pins unchanged, the kernel record not: stale, with the record's line as its diff.
    monkeypatch.setattr(plock, "freshness", lambda req, path, wheels: Freshness(False, ()))
    monkeypatch.setattr(plock, "_kernel_record_diff", lambda ws, ref: ("record: missing",))
    r = plock.lock_targets(ws, ["tiny-cpu"], check=True)
    assert [(e.stale, e.diff) for e in r.entries] == [(True, ("record: missing",))]
    # A stale lock's record is not read: its diff is the pins'.
    seen = []
    monkeypatch.setattr(plock, "freshness", lambda req, path, wheels: Freshness(True, ("-a",)))
    monkeypatch.setattr(plock, "_kernel_record_diff", lambda ws, ref: seen.append(ref) or ())
    assert plock.lock_targets(ws, ["tiny-cpu"], check=True).entries[0].diff == ("-a",)
    assert seen == []


def test_check_keeps_an_error_with_its_target_and_goes_on(ws, monkeypatch):
    def fresh(req, path, wheels):
        if "aarch64" in path.name:
            raise JobFailed("no solution", facts=["uv: because x"])
        return Freshness(False, ())

    monkeypatch.setattr(plock, "freshness", fresh)
    monkeypatch.setattr(plock, "_kernel_record_diff", lambda ws, ref: ())
    r = plock.lock_targets(ws, ["tiny-cpu-multi"], check=True)
    errs = [e for e in r.entries if e.error is not None]
    assert len(errs) == 1 and "aarch64" in Path(errs[0].lock).name
    assert errs[0].error.message == "no solution"
    assert r.exit_code == EXIT_FAILED and r.to_dict()["failed"] == ["tiny-cpu-multi"]


# -- lock -------------------------------------------------------------------------------------

@dataclass
class FakeLock:
    path: Path
    packages: tuple = ("a", "b", "c")
    digest: str = "sha256:feed"


def test_lock_writes_each_platform_and_records_its_kernels_or_keeps_the_error(ws, monkeypatch,
                                                                              tmp_path):
    refs = ws.platform_refs("tiny-cpu-multi")
    got_jobs = []

    def lock_many(reqs, lockfiles, wheels, *, refresh, jobs, note):
        got_jobs.append((len(reqs), refresh, jobs))
        return [(FakeLock(tmp_path / "one.txt"), True, None),
                (None, None, EnvError("uv could not reach the index"))]

    recorded = []
    monkeypatch.setattr(plock, "lock_many", lock_many)
    monkeypatch.setattr(plock, "check_writable", lambda d, what: None)
    monkeypatch.setattr(plock, "_kernel_record",
                        lambda ws, ref, lock, progress: recorded.append(lock) or None)
    r = plock.lock_targets(ws, ["tiny-cpu-multi"], refresh=True, jobs=7)
    assert got_jobs == [(len(refs), True, 7)]
    ok, bad = r.entries
    assert (ok.written, ok.packages, ok.hash, ok.lock) == (True, 3, "sha256:feed",
                                                           str(tmp_path / "one.txt"))
    assert bad.error.message == "uv could not reach the index" and bad.lock == str(
        refs[1].lock_path)
    assert [x.path for x in recorded] == [tmp_path / "one.txt"]  # the failed one: no record
    assert r.exit_code == EXIT_ENV and r.check is False
    # A kernel record that cannot be made fails its lock.
    monkeypatch.setattr(plock, "_kernel_record",
                        lambda ws, ref, lock, progress: JobFailed("wheel has no sm100 code"))
    r = plock.lock_targets(ws, ["tiny-cpu-multi"])
    assert r.entries[0].error.message == "wheel has no sm100 code"


def test_a_lock_directory_that_cannot_take_the_lock_is_said_before_resolving(ws, monkeypatch):
    def refuse(d, what):
        raise InputError(f"cannot write {what} {d}")

    monkeypatch.setattr(plock, "check_writable", refuse)
    monkeypatch.setattr(plock, "lock_many", lambda *a, **k: pytest.fail("resolved anyway"))
    with pytest.raises(InputError, match="cannot write lockfiles to"):
        plock.lock_targets(ws, ["tiny-cpu"])


# -- which overrides each lock still needs ----------------------------------------------------

def test_the_overrides_still_needed_are_said_with_their_reasons(ws, monkeypatch):
    [ref] = ws.platform_refs("sglang-vllm-blackwell")
    assert ref.request.overrides and ref.has_lock
    reqs = [ov.requirement for ov in ref.target.overrides]
    asked = []

    def check(req, wheels, locked):
        asked.append(locked.digest)
        return [OverrideStatus(r, i == 0, f"effect {i}") for i, r in enumerate(reqs)]

    monkeypatch.setattr(plock, "check_overrides", check)
    entry = plock.LockEntry(ref.name, str(ref.lock_path), stale=False)
    got = plock._with_overrides(ws, ref, entry)
    assert asked == [ref.lock().digest]
    assert [o["requirement"] for o in got.overrides] == reqs
    assert got.overrides[0]["needed"] is True and got.overrides[0]["effect"] == "effect 0"
    assert all(o["needed"] is False for o in got.overrides[1:])
    reasons = {ov.requirement: ov.reason for ov in ref.target.overrides}
    assert [o["reason"] for o in got.overrides] == [reasons[r] for r in reqs]
    assert all(o["reason"] for o in got.overrides)  # every override carries its reason
    # Not asked where there is nothing to say: an error, no overrides, no lock yet.
    monkeypatch.setattr(plock, "check_overrides", lambda *a: pytest.fail("checked anyway"))
    failed = plock.LockEntry(ref.name, "l", error=EnvError("x"))
    assert plock._with_overrides(ws, ref, failed) is failed
    [plain] = ws.platform_refs("tiny-cpu")
    assert not plain.request.overrides
    e = plock.LockEntry("tiny-cpu", "l", stale=False)
    assert plock._with_overrides(ws, plain, e) is e


def test_a_target_without_kernel_rules_has_no_record_to_make_or_check(ws, monkeypatch):
    [ref] = ws.platform_refs("tiny-cpu")
    monkeypatch.setattr(plock.coverage, "rules_for", lambda ws, target: None)
    monkeypatch.setattr(plock.coverage, "ensure_record",
                        lambda *a, **k: pytest.fail("a record made without rules"))
    assert plock._kernel_record(ws, ref, FakeLock(Path("x"))) is None
    assert plock._kernel_record_diff(ws, ref) == ()


def test_a_kernel_record_error_is_returned_not_raised(ws, monkeypatch):
    [ref] = ws.platform_refs("tiny-cpu")
    monkeypatch.setattr(plock.coverage, "rules_for", lambda ws, target: object())

    def ensure(ref, lock, rules, note):
        raise JobFailed("no record")

    monkeypatch.setattr(plock.coverage, "ensure_record", ensure)
    err = plock._kernel_record(ws, ref, FakeLock(Path("x")))
    assert isinstance(err, JobFailed) and err.message == "no record"


def test_a_missing_kernel_record_makes_a_diff_line_naming_the_fix(ws, monkeypatch):
    [ref] = ws.platform_refs("tiny-cpu")

    class Rules:
        def digest(self):
            return "sha256:rules"

    monkeypatch.setattr(plock.coverage, "rules_for", lambda ws, target: Rules())
    monkeypatch.setattr(plock.kernels, "read_record", lambda path, lock, rules: None)
    [line] = plock._kernel_record_diff(ws, ref)
    assert line.endswith(": missing, or not for this lock and images/checks/kernels.yaml "
                         "(run `imgbuild lock tiny-cpu`)")
    assert ".kernels.json" in line
    monkeypatch.setattr(plock.kernels, "read_record", lambda path, lock, rules: {"ok": 1})
    assert plock._kernel_record_diff(ws, ref) == ()


# -- what each call is handed -------------------------------------------------------------------
# The fakes above answer; these check what pipeline/lock.py hands uv's side: the target's own
# request and lock, the workspace's wheel directory and lockfiles, the defaults, and that its
# notes reach the progress the user sees.



@pytest.fixture
def wheeled(tmp_path):
    """The checkout's catalog with a local wheel directory, as `--wheels DIR` gives it."""
    from imgbuild.workspace import Workspace

    base = checkout_workspace()
    (tmp_path / "wheels").mkdir()
    return Workspace(base.images, base.lockfiles, tmp_path / "wheels")


def test_no_target_named_says_where_to_look(ws):
    with pytest.raises(InputError) as e:
        plock.lock_targets(ws, [])
    assert (e.value.message, e.value.hint) == ("name a target or pass --all",
                                               "see `imgbuild list`")


def test_check_hands_each_platforms_request_lock_and_the_wheels(wheeled, monkeypatch):
    refs = {r.lock_path: r for r in wheeled.platform_refs("tiny-cpu-multi")}
    asked = []

    def fresh(req, path, wheels):
        assert req == refs[path].request and wheels == wheeled.wheels
        asked.append(path)
        return Freshness(False, ())

    def kdiff(w, ref):
        assert w is wheeled and ref.lock_path in refs
        return ()

    monkeypatch.setattr(plock, "freshness", fresh)
    monkeypatch.setattr(plock, "_kernel_record_diff", kdiff)
    r = plock.lock_targets(wheeled, ["tiny-cpu-multi"], check=True)
    assert sorted(asked) == sorted(refs) and {e.target for e in r.entries} == {"tiny-cpu-multi"}


def test_lock_hands_the_requests_lockfiles_wheels_and_defaults(wheeled, monkeypatch, tmp_path):
    [ref] = wheeled.platform_refs("tiny-cpu")
    calls, notes = [], Notes()

    def lock_many(reqs, lockfiles, wheels, *, refresh, jobs, note):
        calls.append((reqs, lockfiles, wheels, refresh, jobs))
        note("resolving tiny-cpu")
        return [(FakeLock(tmp_path / "t.txt"), True, None)]

    def writable(d, what):
        assert (d, what) == (wheeled.lock_dir(), "lockfiles to")

    def record(w, r, lock, progress):
        assert w is wheeled and r.name == "tiny-cpu" and lock.path == tmp_path / "t.txt"
        progress.note("kernel record kept")

    monkeypatch.setattr(plock, "lock_many", lock_many)
    monkeypatch.setattr(plock, "check_writable", writable)
    monkeypatch.setattr(plock, "_kernel_record", record)
    monkeypatch.setattr(type(wheeled), "adopt_builtin_locks",
                        lambda self, refs: ["lockfiles/tiny-cpu.lock.txt"])
    r = plock.lock_targets(wheeled, ["tiny-cpu"], progress=notes)
    assert calls == [([ref.request], wheeled.lockfiles, wheeled.wheels, False, 4)]
    assert notes.said == ["copied the built-in lock into the project: "
                          "lockfiles/tiny-cpu.lock.txt", "resolving tiny-cpu",
                          "kernel record kept"]
    assert [e.target for e in r.entries] == ["tiny-cpu"]
    # A failed lock keeps its target's name too.
    monkeypatch.setattr(plock, "lock_many", lambda *a, **k: [(None, None, EnvError("uv"))])
    assert [e.target for e in plock.lock_targets(wheeled, ["tiny-cpu"]).entries] == ["tiny-cpu"]


def test_the_overrides_are_checked_against_the_targets_own_lock_and_wheels(wheeled,
                                                                           monkeypatch):
    [ref] = wheeled.platform_refs("sglang-vllm-blackwell")
    seen = []

    def check(req, wheels, locked):
        seen.append((req, wheels, locked.digest))
        return [OverrideStatus(ov.requirement, True, "e") for ov in ref.target.overrides]

    monkeypatch.setattr(plock, "freshness", lambda req, path, wheels: Freshness(False, ()))
    monkeypatch.setattr(plock, "_kernel_record_diff", lambda w, r: ())
    monkeypatch.setattr(plock, "check_overrides", check)
    r = plock.lock_targets(wheeled, ["sglang-vllm-blackwell"], check=True)
    assert seen == [(ref.request, wheeled.wheels, ref.lock().digest)]
    assert [o["requirement"] for o in r.entries[0].overrides] == \
        [ov.requirement for ov in ref.target.overrides]


def test_a_committed_kernel_record_is_read_and_kept_for_its_lock_and_rules(ws):
    """Real rules, lock and record (sglang-blackwell's, committed): the record is this lock's,
    so --check has nothing to say and a lock keeps it, reading no wheel."""
    [ref] = ws.platform_refs("sglang-blackwell")
    assert plock.coverage.rules_for(ws, ref.target) is not None
    assert plock._kernel_record_diff(ws, ref) == ()
    notes = Notes()
    assert plock._kernel_record(ws, ref, ref.lock(), notes) is None


def test_a_record_for_another_lock_or_other_rules_is_missing(ws, monkeypatch):
    [ref] = ws.platform_refs("sglang-blackwell")
    real = plock.kernels.read_record
    for lock_digest, rules_digest in (("sha256:other", None), (None, "sha256:other")):
        def read(path, lock, rules, _l=lock_digest, _r=rules_digest):
            return real(path, _l or lock, _r or rules)

        monkeypatch.setattr(plock.kernels, "read_record", read)
        [line] = plock._kernel_record_diff(ws, ref)
        assert "run `imgbuild lock sglang-blackwell`" in line
