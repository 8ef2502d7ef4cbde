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
