"""Small parts no other test without an Engine reached: each is something a user reads or a
secret a log must not show."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta, timezone


def test_a_credential_shown_in_a_log_or_a_traceback_keeps_its_password():
    from imgbuild.catalog.indexes import IndexCredential

    c = IndexCredential("pypi.acme.example", "ci", "s3cret-token")
    assert repr(c) == "IndexCredential('pypi.acme.example', 'ci')" and "s3cret" not in repr([c])
    assert c.netrc() == "machine pypi.acme.example login ci password s3cret-token\n"


def test_a_validity_window_is_said_in_utc_and_an_open_end_as_a_dash():
    from imgbuild.image.keyless import Window

    plus2 = timezone(timedelta(hours=2))
    assert str(Window(datetime(2025, 1, 1, 2, 0, tzinfo=plus2), None)) == \
        "2025-01-01T00:00:00Z to -"
    assert str(Window(None, datetime(2026, 6, 30, 12, 0, 5, tzinfo=UTC))) == \
        "- to 2026-06-30T12:00:05Z"


def test_a_long_step_is_cut_in_its_middle_so_both_ends_show():
    from imgbuild.cli.views.report_html import _cut

    assert _cut("short") == "short" and _cut("x" * 96) == "x" * 96
    cut = _cut("RUN uv pip install --no-deps -r " + "p" * 100 + " /opt/imgbuild/heavy.txt")
    assert len(cut) == 96 and cut.startswith("RUN uv pip install") and \
        cut.endswith("/opt/imgbuild/heavy.txt") and "…" in cut
    assert _cut("abcdefghij", 6) == "abc…ij"


def test_the_report_page_is_written_whole_as_index_html(tmp_path, monkeypatch):
    from imgbuild.cli.views import report_html

    monkeypatch.setattr(report_html, "render", lambda report: "<html>the page</html>")
    got = report_html.write(object(), tmp_path / "site" / "report")
    assert got == tmp_path / "site" / "report" / "index.html"
    assert got.read_text() == "<html>the page</html>"
    assert [p.name for p in got.parent.iterdir()] == ["index.html"]  # no temp file left


def test_a_shell_line_quotes_what_a_shell_would_split():
    from imgbuild.plan.render import shell_quote

    assert shell_quote(["docker", "run", "--env", "A=b c", "img:t", "it's"]) == \
        "docker run --env 'A=b c' img:t 'it'\"'\"'s'"


def test_an_engines_kernel_packages_are_its_rules_packages_once_in_order():
    from imgbuild.catalog.kernels import EngineKernels, KernelRule

    rules = tuple(KernelRule(p, (), (), "why", True) for p in ("b", "a", "b", "c"))
    assert EngineKernels("sglang", rules, ()).packages == ("b", "a", "c")


def test_an_unknown_gpu_architecture_says_what_is_known_and_the_nearest_name():
    import pytest

    from imgbuild.catalog.archs import parse_arch
    from imgbuild.errors import InputError

    from .conftest import checkout_workspace

    cat = checkout_workspace().catalog
    facts = ["give an sm name (sm90, sm100, sm103, sm120, sm121), a compute capability "
             "(9.0, 10.0, 12.0) or a GPU name from images/gpus.yaml"]
    with pytest.raises(InputError) as e:
        parse_arch("sm1000", cat)
    assert (e.value.message, e.value.facts) == ("unknown GPU architecture 'sm1000'", facts)
    assert e.value.hint.startswith("did you mean '")
    with pytest.raises(InputError) as e:
        parse_arch("zzzzzzzz", cat)
    assert (e.value.facts, e.value.hint) == (facts, "see images/gpus.yaml")


# --- check-model: which target a fused layer matches, and the way out a finding offers ---------

def test_a_fused_layer_matches_a_target_by_its_name_a_regex_or_its_modules_class():
    from imgbuild.checks.checkmodel.findings import _target_matches as m

    name = "model.layers.0.self_attn.qkv_proj"
    assert m(name, [name]) and m(name, ["re:.*self_attn"]) and not m(name, ["re:.*mlp"])
    assert not m(name, ["re:(unclosed"])  # a regex that does not compile matches nothing
    # a plain target matches the class by substring, and only for a fused layer
    assert m(name, ["Linear"], "qkv_proj") and m(name, ["qkvparallel"], "qkv_proj")
    assert not m(name, ["Linear"]) and not m(name, ["attn.Linear"], "qkv_proj")
    assert m("model.layers.0.mlp.gate_up_proj", ["MergedColumn"], "gate_up_proj")
    assert not m("model.layers.0.mlp.gate_up_proj", ["QKVParallel"], "gate_up_proj")
    assert not m(name, ["Embedding"], "qkv_proj")


def test_a_findings_way_out_offers_the_fix_the_fixed_release_and_the_patch():
    from types import SimpleNamespace

    from imgbuild.checks.checkmodel.behaviour import Fact
    from imgbuild.checks.checkmodel.findings import Finding, _way_out

    t = SimpleNamespace(name="sglang-0516-blackwell", engine="sglang")
    f = Fact("ignore_matcher", "substring", fixed_in="0.5.17", fix_patch="sglang-ct-exact")
    assert _way_out(f, t, "`--fix OUT` rewrites them") == (
        "`--fix OUT` rewrites them; or serve it with sglang >= 0.5.17; or add `sglang-ct-exact` "
        "to `patches:` in images/sglang-0516-blackwell.yaml")
    assert _way_out(f, None, "") == ("serve it with the engine >= 0.5.17; or add "
                                     "`sglang-ct-exact` to `patches:` in the target's yaml")
    patched = Fact("ignore_matcher", "exact", patched_by="sglang-ct-exact", fixed_in="0.5.17",
                   fix_patch="sglang-ct-exact")
    assert _way_out(patched, t, "") == "serve it with sglang >= 0.5.17"
    assert _way_out(None, t, "do this") == "do this"
    d = Finding("format", "info", "m", ("a fact",), "hint", examples=("e",)).to_dict()
    assert d["facts"] == ["a fact"] and d["examples"] == ["e"]


def test_a_root_only_label_gives_its_reason_or_says_there_is_none():
    from imgbuild.plan.labels import ROOT_ONLY, root_only_reason

    assert root_only_reason(f"{ROOT_ONLY}: Xformers writes beside its modules") == \
        "Xformers writes beside its modules"
    assert root_only_reason(f"{ROOT_ONLY}:: : kernels ") == "kernels"
    assert root_only_reason(ROOT_ONLY) == root_only_reason(f"{ROOT_ONLY}: ") == "no reason given"
    assert root_only_reason("0:0; any uid with gid 0") is None and root_only_reason(None) is None


def test_a_cache_from_that_is_no_registry_image_says_why_and_how():
    import pytest

    from imgbuild.errors import InputError
    from imgbuild.image.reference import parse_cache_ref

    how = "give HOST[:PORT]/REPO:TAG, e.g. --cache-from ghcr.io/acme/imgbuild:tiny-cpu"
    for ref, why in (("ghcr.io/acme/x", "it names no tag"),
                     ("localhost:5000/acme/x", "it names no tag"),
                     ("ghcr.io/acme/x:a tag", "'a tag' is not a tag"),
                     ("acme/x:t", "it names no registry host")):
        with pytest.raises(InputError) as e:
            parse_cache_ref(ref)
        assert (e.value.message, e.value.hint) == (
            f"--cache-from {ref!r} is not an image in a registry: {why}", how), ref
    with pytest.raises(InputError) as e:
        parse_cache_ref("ghcr.io/Acme/x:t")
    # The name's own reason, without the name's own preamble.
    assert e.value.message == (
        "--cache-from 'ghcr.io/Acme/x:t' is not an image in a registry: 'Acme/x' is not a "
        "repository path (lowercase letters, digits and separators . _ - /, no empty part)")
    assert parse_cache_ref("localhost:5000/acme/x:t") == ("localhost:5000", "acme/x", "t")


def test_a_write_the_machine_refuses_says_what_is_left_and_what_to_do(tmp_path):
    import pytest

    from imgbuild.fsutil import cannot_write, check_writable, make_writable_dir

    err = cannot_write(tmp_path / "x.lock", OSError(28, "No space left on device"), "the lock")
    assert (err.message, err.facts, err.hint) == (
        f"cannot write the lock {tmp_path / 'x.lock'}: No space left on device",
        [f"{tmp_path / 'x.lock'} is as it was before this command"],
        "make the directory writable or free space on its disk, then run the command again")
    assert cannot_write(tmp_path, OSError("x"), "a", scratch=True).facts == [
        f"{tmp_path} is removed"]
    make_writable_dir(tmp_path / "a" / "b")
    assert list((tmp_path / "a" / "b").iterdir()) == []  # the probe is gone
    # The probe is written in the directory itself: /proc/self exists and takes no file, even
    # for root.
    with pytest.raises(OSError):
        make_writable_dir("/proc/self")
    from imgbuild.errors import EnvError
    with pytest.raises(EnvError):
        check_writable("/proc/self", "the cache")


def test_the_kernel_scans_spool_lives_in_the_cache_run_after_run(tmp_path, monkeypatch):
    import shutil
    from collections import namedtuple

    from imgbuild.lock import kernels

    monkeypatch.setenv("IMGBUILD_CACHE", str(tmp_path / "cache"))
    usage = namedtuple("usage", "total used free")
    free = {"bytes": 100 << 30}
    monkeypatch.setattr(shutil, "disk_usage", lambda p: usage(0, 0, free["bytes"]))
    spool = str(tmp_path / "cache" / "tmp")
    assert kernels._spool_dir() == spool
    assert kernels._spool_dir() == spool  # there already: still the spool
    free["bytes"] = 4 << 30  # not more than 4 GiB free: the system's temporary directory
    assert kernels._spool_dir() is None
