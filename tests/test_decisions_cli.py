"""Decision tests for the command line (imgbuild/cli/): which command runs, which exit code and
which message a known error gets, how --arch/--platform/--registry are read, which progress
display a run gets. No Docker Engine: the commands used here stop before any Engine call."""

from __future__ import annotations

import argparse
import importlib
import io
import json
import sys
from pathlib import Path

import pytest
from rich.console import Console

from imgbuild import errors
from imgbuild.cli import args as cli_args
from imgbuild.cli import console as cli_console
from imgbuild.cli.main import main
from imgbuild.progress import SILENT
from imgbuild.workspace import Workspace


@pytest.fixture(scope="module")
def ws() -> Workspace:
    return Workspace.open(None, None, None)


# ------------------------------------------------------------------------------------------------
# main(): argv rewriting and exit codes
# ------------------------------------------------------------------------------------------------


def test_exit_codes_per_error_class():
    assert errors.ImgbuildError("x").exit_code == errors.EXIT_FAILED == 1
    assert errors.InputError("x").exit_code == errors.EXIT_INPUT == 2
    assert errors.SpecError("f.yaml", "k", "a list").exit_code == 2
    assert errors.LockError("x").exit_code == 2
    assert errors.ResolveError("x").exit_code == 1
    assert errors.EnvError("x").exit_code == errors.EXIT_ENV == 3
    assert errors.JobFailed("x").exit_code == 1


def test_spec_error_names_the_file_the_key_and_what_was_expected():
    e = errors.SpecError("images/t.yaml", "archs", "a list of sm archs", got=5)
    assert e.message == "images/t.yaml: archs: expected a list of sm archs, got 5"
    assert e.hint == "fix images/t.yaml and run the command again"
    assert errors.SpecError("images/t.yaml", "", "a mapping").message == \
        "images/t.yaml: expected a mapping"
    assert errors.SpecError("f", "k", "x", got=None, hint="h").hint == "h"
    assert errors.SpecError("f", "k", "a positive number", got=0).message == \
        "f: k: expected a positive number, got 0"
    assert errors.JobFailed("m", log_tail=["a"]).to_dict()["exit_code"] == 1


def test_a_bare_target_is_a_build_and_an_unknown_one_exits_2_with_json(capsys):
    assert main(["no-such-target", "--json"]) == 2
    doc = json.loads(capsys.readouterr().out)
    assert doc["error"] == "InputError" and doc["exit_code"] == 2
    assert doc["message"] == "unknown target 'no-such-target'"


def test_an_input_error_for_people_goes_to_stderr_with_its_facts_and_hint(capsys):
    assert main(["plan", "no-such-target"]) == 2
    got = capsys.readouterr()
    assert got.out == ""
    assert "error: unknown target 'no-such-target'" in got.err
    assert "╰─▶ known targets:" in got.err and "help: see `imgbuild list`" in got.err


def test_version_flag_before_the_command_is_the_version_command(capsys):
    assert main(["--version", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["version"] and doc["catalog"]["digest"].startswith("sha256:")
    # After a positional it is not rewritten: it belongs to that command's grammar.
    with pytest.raises(SystemExit) as e:
        main(["plan", "tiny-cpu", "--version"])
    assert e.value.code == 2
    assert "unrecognized arguments: --version" in capsys.readouterr().err


def test_insecure_registries_add_to_the_environment(monkeypatch, capsys):
    monkeypatch.setenv("IMGBUILD_INSECURE_REGISTRIES", "a:5000,")
    main(["plan", "no-such-target", "--insecure-registry", "b:5000", "--json"])
    import os
    assert os.environ["IMGBUILD_INSECURE_REGISTRIES"] == "a:5000,b:5000"
    capsys.readouterr()


# ------------------------------------------------------------------------------------------------
# console: how an error reads, which progress display
# ------------------------------------------------------------------------------------------------


def _output(as_json: bool, mode: str = "auto", *, terminal: bool = False):
    err = io.StringIO()
    out = cli_console.Output(as_json, Console(file=io.StringIO()),
                             Console(file=err, width=200, force_terminal=terminal,
                                     highlight=False), mode)
    return out, err


def test_error_for_people_facts_chain_and_log_tail():
    out, err = _output(False)
    out.error(errors.JobFailed("the build failed", facts=["one", "two"], hint="read the log",
                               log_tail=["step 3/9", "exit 1"]))
    text = err.getvalue()
    assert text.index("── log tail ──") < text.index("error: the build failed")
    assert "│ exit 1" in text
    assert "  ├─▶ one\n  ╰─▶ two\n" in text and "help: read the log" in text
    out, err = _output(False)
    out.error(errors.InputError("bad [markup]"))
    assert "bad [markup]" in err.getvalue() and "help" not in err.getvalue()


def test_error_lines_are_the_errors_own_words_on_a_console_that_highlights():
    # A console of someone else's making highlights numbers, paths and addresses: a log line
    # or a fact is shown as written, never coloured as if imgbuild had judged it.
    err = io.StringIO()
    out = cli_console.Output(False, Console(file=io.StringIO()),
                             Console(file=err, width=200, force_terminal=True,
                                     color_system="standard", highlight=True))
    out.error(errors.JobFailed("m", facts=["port 8000 on 10.0.0.1 is taken"],
                               log_tail=["exit 137 at /usr/lib/x.py:42"]))
    lines = err.getvalue().splitlines()
    assert lines[0] == "\x1b[2m── log tail ──\x1b[0m"
    assert lines[1] == "│ exit 137 at /usr/lib/x.py:42"
    assert lines[-1] == "  ╰─▶ port 8000 on 10.0.0.1 is taken"


def test_a_plain_progress_line_is_never_highlighted():
    err = io.StringIO()
    console = Console(file=err, width=200, force_terminal=True, color_system="standard",
                      highlight=True)
    cli_console.PlainProgress(console).note("pushed 3 layers to 127.0.0.1:5000 in 2.5 s")
    assert err.getvalue() == "pushed 3 layers to 127.0.0.1:5000 in 2.5 s\n"


def test_error_as_json_carries_the_log_tail_of_a_failed_job_only(capsys):
    out, _ = _output(True)
    out.error(errors.JobFailed("m", log_tail=["x"]))
    assert json.loads(capsys.readouterr().out)["log_tail"] == ["x"]
    out.error(errors.EnvError("no daemon"))
    doc = json.loads(capsys.readouterr().out)
    assert "log_tail" not in doc and doc["exit_code"] == 3


@pytest.mark.parametrize(("as_json", "mode", "terminal", "kind"), [
    (True, "auto", True, None),  # --json: silent unless asked
    (False, "auto", True, cli_console.RichProgress),
    (False, "auto", False, cli_console.PlainProgress),
    (True, "json", False, cli_console.JsonProgress),
    (True, "plain", False, cli_console.PlainProgress),
    (False, "tty", False, cli_console.RichProgress),
])
def test_progress_display_per_mode(as_json, mode, terminal, kind):
    out, _ = _output(as_json, mode, terminal=terminal)
    got = out.progress()
    if kind is None:
        assert got is SILENT
    else:
        assert isinstance(got, kind)
        # on the stream for people: the error console, or stderr for JSON events
        assert (got.stream is sys.stderr) if kind is cli_console.JsonProgress \
            else got.console is out.err


def test_middle_cut_keeps_both_ends():
    assert cli_console.middle_cut("abcdef", 6) == "abcdef"
    cut = cli_console.middle_cut("registry.example/repo:tag-0123456789", 16)
    assert len(cut) == 16 and cut.startswith("regis") and cut.endswith("456789")
    assert cli_console.middle_cut("abcdef", 1) == "…"
    assert cli_console.middle_cut("abcdef", 0) == ""
    assert cli_console.middle_cut("abcdef", 2) == "…f"  # two columns: the end, not a mark alone


def test_the_consoles_colour_nothing_of_their_own_and_keep_the_mode():
    out = cli_console.make_output(False, "plain")
    assert out.progress_mode == "plain" and not out.json
    assert not out.out._highlight and not out.err._highlight and out.err.stderr
    assert cli_console.make_output(True).progress_mode == "auto"


def test_json_on_stdout_keeps_the_documents_order_and_says_what_json_cannot(capsys):
    out, _ = _output(True)
    out.print_json({"z": 1, "a": Path("/x"), "m": None})
    assert capsys.readouterr().out == '{\n  "z": 1,\n  "a": "/x",\n  "m": null\n}\n'


def test_an_error_on_a_terminal_reads_its_log_and_facts_as_plain_text():
    out, err = _output(False, terminal=True)
    out.error(errors.JobFailed("m", facts=["took 12 s at 10.0.0.1"], log_tail=["exit 137"]))
    text = err.getvalue()
    # no colour put on numbers or addresses of someone else's words
    assert "│ exit 137\n" in text and "  ╰─▶ took 12 s at 10.0.0.1\n" in text


def test_a_transfers_totals_say_what_is_known():
    from imgbuild.progress import Transfer

    t = Transfer("push", "r/x:1")
    assert cli_console._totals("push", "r/x:1", t) == (
        "push r/x:1: 0 B of 0 B (0%), 0 B/s; 0 of 0 layers done")
    t.feed({"id": "a", "status": "Pushing", "progressDetail": {"current": 5, "total": 10}})
    said = cli_console._totals("push", "r/x:1", t)
    assert said.startswith("push r/x:1: 5 B of 10 B (50%), ") and "unpacked" not in said
    p = Transfer("pull", "r/x:1")
    p.feed({"id": "a", "status": "Downloading", "progressDetail": {"current": 4, "total": 10}})
    assert "unpacked" not in cli_console._totals("pull", "r/x:1", p)  # nothing unpacked yet
    p.feed({"id": "a", "status": "Extracting", "progressDetail": {"current": 4, "total": 10}})
    assert cli_console._totals("pull", "r/x:1", p).endswith("; unpacked 4 B")


# ------------------------------------------------------------------------------------------------
# args: --arch, --platform, --registry
# ------------------------------------------------------------------------------------------------


def _ns(**kw) -> argparse.Namespace:
    return argparse.Namespace(**kw)


@pytest.mark.parametrize(("given", "want"), [
    (None, None), (["linux/arm64"], ("linux/arm64",)), (["arm64"], ("linux/arm64",)),
    (["aarch64"], ("linux/arm64",)), (["amd64,x86_64"], ("linux/amd64",)),
    (["linux/amd64", "arm64"], ("linux/amd64", "linux/arm64")),
])
def test_platforms_read_bare_arches_and_drop_repeats(given, want):
    assert cli_args.platforms(_ns(platform=given)) == want


@pytest.mark.parametrize("given", [["linux/s390x"], ["riscv64"], ["arm64,"], [" "]])
def test_platforms_refuse_what_imgbuild_does_not_build(given):
    with pytest.raises(errors.InputError) as e:
        cli_args.platforms(_ns(platform=given))
    assert e.value.exit_code == 2


def test_archs_by_gpu_name_sm_or_capability(ws):
    assert cli_args.archs(_ns(arch=["B200", "sm120"]), ws) == ("sm100", "sm120")
    assert cli_args.archs(_ns(arch=None), ws) is None
    with pytest.raises(errors.InputError, match="empty entry"):
        cli_args.archs(_ns(arch=["sm100,"]), ws)


def test_a_gpu_of_the_other_cpu_is_refused_for_a_single_cpu_target(ws):
    with pytest.raises(errors.InputError) as e:
        cli_args.archs(_ns(arch=["GB10"], target="sglang-blackwell"), ws)
    assert "sits in aarch64 hosts, and sglang-blackwell has no linux/arm64 image" in \
        e.value.message
    assert "sglang-dgx-spark" in e.value.hint and "--arch sm121" in e.value.hint
    # By arch, not by product: no CPU is implied.
    assert cli_args.archs(_ns(arch=["sm121"], target="sglang-blackwell"), ws) == ("sm121",)
    # The right CPU passes; an unknown target is left for the command to report.
    assert cli_args.archs(_ns(arch=["GB10"], target="sglang-dgx-spark"), ws) == ("sm121",)
    assert cli_args.archs(_ns(arch=["GB10"], target="nope"), ws) == ("sm121",)


def test_repository_default_and_check():
    assert cli_args.repository(_ns(registry=None)) == "imgbuild"
    assert cli_args.repository(_ns(registry="localhost:5000/team/img")) == \
        "localhost:5000/team/img"
    with pytest.raises(errors.InputError):
        cli_args.repository(_ns(registry="Bad//Name"))


# ------------------------------------------------------------------------------------------------
# views: what a report shows (list, plan) and how a table reads in a log
# ------------------------------------------------------------------------------------------------


def _kv(text: str) -> dict[str, str]:
    out = {}
    for line in text.splitlines()[1:]:
        k, _, v = line.partition("  ")
        if k.strip():
            out[k.strip()] = v.strip()
    return out


def test_plan_view_for_a_cpu_target_without_checks(capsys):
    assert main(["plan", "tiny-cpu", "--no-checks"]) == 0
    rows = _kv(capsys.readouterr().out)
    assert rows["CUDA"] == "none (CPU)" and rows["driver"] == "none (CPU)"
    assert rows["dependency check"] == "skipped (--no-checks)"
    assert rows["model"] == "none" and "quantization" not in rows
    assert rows["runs as"].startswith("root, or any UID with group 0")
    assert main(["plan", "tiny-cpu"]) == 0  # checked, nothing found
    assert _kv(capsys.readouterr().out)["dependency check"].startswith("ok: every symbol")


def test_plan_view_for_a_gpu_target_with_a_model(capsys):
    assert main(["plan", "sglang-blackwell", "--model", "k2.6", "--no-checks"]) == 0
    rows = _kv(capsys.readouterr().out)
    assert rows["driver"].startswith("≥ ") and rows["CUDA"][0].isdigit()
    assert rows["model"].startswith("k2.6: Kimi K2.6 (moonshotai/Kimi-K2.6), TP 8")
    assert rows["quantization"].startswith("INT4 (W4A16)")
    assert main(["plan", "sglang-blackwell", "--model", "k2.6", "--no-checks", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert "quantization" in doc
    assert main(["plan", "tiny-cpu", "--no-checks", "--json"]) == 0
    assert "quantization" not in json.loads(capsys.readouterr().out)


def test_list_json_says_where_each_target_comes_from(capsys):
    assert main(["list", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["targets"]["tiny-cpu"]["platforms"] == ["linux/amd64"]
    assert doc["targets"]["tiny-cpu"]["engine"].startswith("transformers==")
    assert "layer" in doc["targets"]["tiny-cpu"] and "quantization" in doc["models"]["k2.6"]


def test_table_in_a_log_is_one_padded_record_per_line_and_never_cut():
    from imgbuild.cli.views import kv, table
    buf = io.StringIO()
    c = Console(file=buf, width=20, force_terminal=False)
    table(c, "t", ["name", "value"], [["a-very-long-target-name-indeed", "x\ny"], ["b", 3]])
    assert buf.getvalue().splitlines() == [
        "t", "name                            value",
        "a-very-long-target-name-indeed  x, y", "b                               3"]
    buf = io.StringIO()
    kv(Console(file=buf, width=20, force_terminal=False), "p", [("tags", "a\nb"), ("k", "")])
    assert buf.getvalue().splitlines() == ["p", "tags  a", "      b", "k"]


def test_insecure_registries_start_the_variable_when_it_is_unset(monkeypatch, capsys):
    import os
    monkeypatch.delenv("IMGBUILD_INSECURE_REGISTRIES", raising=False)
    main(["plan", "no-such-target", "--insecure-registry", "b:5000", "--insecure-registry",
          "c:5000", "--json"])
    assert os.environ["IMGBUILD_INSECURE_REGISTRIES"] == "b:5000,c:5000"
    capsys.readouterr()


@pytest.mark.parametrize("raised, said, code", [
    ("interrupt", "interrupted", 130), ("terminate", "terminated", 143)])
def test_ctrl_c_and_sigterm_unwind_to_their_exit_codes(monkeypatch, capsys, raised, said, code):
    cli_main = importlib.import_module("imgbuild.cli.main")
    from imgbuild.cli.commands import version

    def stop(args, out):
        raise cli_main.Terminated() if raised == "terminate" else KeyboardInterrupt()
    monkeypatch.setattr(version, "run", stop)
    assert main(["version"]) == code
    assert capsys.readouterr().err.strip() == said


def test_the_command_line_installs_its_signal_handlers_and_a_caller_keeps_its_own(monkeypatch,
                                                                                  capsys):
    import signal

    cli_main = importlib.import_module("imgbuild.cli.main")

    before = signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)
    try:
        monkeypatch.setattr("sys.argv", ["imgbuild", "version", "--json"])
        signal.signal(signal.SIGINT, signal.default_int_handler)
        assert main() == 0
        assert signal.getsignal(signal.SIGINT) is cli_main._interrupt
        assert signal.getsignal(signal.SIGTERM) is cli_main._terminate
        # An ignored Ctrl-C (a background job) stays ignored.
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        assert main() == 0
        assert signal.getsignal(signal.SIGINT) is signal.SIG_IGN
        # Called with its arguments (a caller's process), nothing is installed.
        signal.signal(signal.SIGINT, signal.default_int_handler)
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        assert main(["version", "--json"]) == 0
        assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
        assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL
    finally:
        signal.signal(signal.SIGINT, before[0])
        signal.signal(signal.SIGTERM, before[1])
    capsys.readouterr()


def test_the_output_is_made_as_the_common_options_ask(monkeypatch, capsys):
    made = []
    real = cli_console.make_output
    monkeypatch.setattr(cli_console, "make_output", lambda as_json, progress="auto": (
        made.append((as_json, progress)) or real(as_json, progress)))
    assert main(["list", "--progress", "plain", "--json"]) == 0
    assert main(["list"]) == 0
    assert made == [(True, "plain"), (False, "auto")]


# ------------------------------------------------------------------------------------------------
# parser(): what argparse is told besides the help texts (those are the reviewed references)
# ------------------------------------------------------------------------------------------------


def test_the_environment_gives_the_images_and_the_signing_key_when_no_flag_does(monkeypatch):
    from imgbuild.cli.parser import parser
    monkeypatch.setenv("IMGBUILD_IMAGES", "/srv/my-images")
    monkeypatch.setenv("IMGBUILD_SIGN_KEY", "env://KEY")
    p = parser()  # the defaults are read when the parser is made
    build = p.parse_args(["build", "tiny-cpu"])
    assert (build.images, build.sign_key) == ("/srv/my-images", "env://KEY")
    assert p.parse_args(["index", "t", "--registry", "r"]).sign_key == "env://KEY"
    assert p.parse_args(["build", "tiny-cpu", "--images", "x", "--sign-key", "k.key"]).sign_key \
        == "k.key"
    monkeypatch.setenv("IMGBUILD_SIGN_KEY", "")  # set but empty: no key, as when unset
    monkeypatch.delenv("IMGBUILD_IMAGES")
    p = parser()
    assert p.parse_args(["build", "tiny-cpu"]).sign_key is None
    assert p.parse_args(["index", "t", "--registry", "r"]).sign_key is None
    assert p.parse_args(["list"]).images is None


def test_numbers_are_read_as_numbers():
    from imgbuild.cli.parser import parser
    init = parser().parse_args(["init", "--size-gb", "1.5", "--tp", "2"])
    assert init.size_gb == 1.5 and isinstance(init.size_gb, float) and init.tp == 2
    run = parser().parse_args(["run", "tiny-cpu", "--gpus-per-node", "4"])
    assert run.gpus_per_node == 4 and isinstance(run.gpus_per_node, int)
    assert parser().parse_args(["run", "tiny-cpu"]).gpus_per_node == 8


def test_smoke_model_takes_the_profile_as_alias_and_base_needs_a_subcommand(capsys):
    from imgbuild.cli.parser import parser
    assert parser().parse_args(["smoke-model", "tiny-nvfp4"]).alias == "tiny-nvfp4"
    assert parser().parse_args(["base", "bootstrap"]).base_command == "bootstrap"
    with pytest.raises(SystemExit) as e:
        parser().parse_args(["base"])
    assert e.value.code == 2
    assert "the following arguments are required: COMMAND" in capsys.readouterr().err
