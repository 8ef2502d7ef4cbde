"""What the commands read from their arguments (cli/args.py), each refusal with its words: the
workspace, --registry, --arch (GPU words, a GPU in hosts of the other CPU), --platform,
--cache-from against --no-cache-from, --log-dir. argparse Namespaces in, values or exit-2
errors out: no Engine."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from imgbuild.cli import args as cli_args
from imgbuild.errors import InputError

from .conftest import ROOT, checkout_workspace


def ns(**kw) -> argparse.Namespace:
    return argparse.Namespace(**kw)


@pytest.fixture(scope="module")
def ws():
    return checkout_workspace()


def test_the_workspace_is_opened_from_the_three_paths(monkeypatch):
    got = []
    monkeypatch.setattr(cli_args.Workspace, "open",
                        classmethod(lambda cls, *a: got.append(a) or "ws"))
    assert cli_args.workspace(ns(images="i", lockfiles="l", wheels="w")) == "ws"
    assert got == [("i", "l", "w")]


def test_the_repository_defaults_to_the_local_name_and_is_checked_as_docker_does():
    assert cli_args.repository(ns()) == "imgbuild"
    assert cli_args.repository(ns(registry="")) == "imgbuild"
    assert cli_args.repository(ns(registry="127.0.0.1:5000/acme/serving")) == \
        "127.0.0.1:5000/acme/serving"
    with pytest.raises(InputError):
        cli_args.repository(ns(registry="Bad/UPPER"))


# -- --arch -------------------------------------------------------------------------------------

def test_archs_reads_gpu_words_comma_separated_and_repeated(ws):
    assert cli_args.archs(ns(), ws) is None
    assert cli_args.archs(ns(arch=[]), ws) is None
    assert cli_args.archs(ns(arch=["B200, 12.0", "sm90"]), ws) == ("sm100", "sm120", "sm90")


@pytest.mark.parametrize("given", [[""], ["sm100,"], ["sm90", " , sm100"]])
def test_an_empty_arch_entry_is_refused_naming_the_flag(ws, given):
    with pytest.raises(InputError) as e:
        cli_args.archs(ns(arch=given), ws)
    assert e.value.message == "--arch has an empty entry"
    assert e.value.facts == [f"--arch {v!r}" for v in given if any(
        not a.strip() for a in v.split(","))]
    assert len(e.value.facts) == 1
    assert e.value.hint == ("name a GPU or an arch (B200, sm100, 12.0), comma-separated, or "
                            "leave --arch out for the target's archs")


def test_a_gpu_of_the_other_cpu_is_refused_for_a_one_platform_target(ws):
    # GB200 sits in Grace (aarch64) hosts; sglang-blackwell is linux/amd64 only.
    gpu = next(g for g in ws.catalog.gpus if "GB200" in g.names)
    t = ws.catalog.target("sglang-blackwell")
    assert gpu.cpu_arch == "aarch64" and t.platforms == ("linux/amd64",)
    with pytest.raises(InputError) as e:
        cli_args.archs(ns(arch=["GB200"], target="sglang-blackwell"), ws)
    err = e.value
    assert err.message == "GB200 sits in aarch64 hosts, and sglang-blackwell has no " \
                          "linux/arm64 image"
    assert err.facts == [f"images/gpus.yaml: {', '.join(gpu.names)}: sm100, cpu_arch aarch64",
                         f"{t.path}: platforms: [linux/amd64]"]
    others = sorted(n for n, x in ws.catalog.targets.items()
                    if "linux/arm64" in x.platforms and "sm100" in x.archs)
    assert err.hint == ((f"use {' or '.join(others)}" if others else
                         "use a target with `platforms: [linux/arm64]`")
                        + ", or --arch sm100 for linux/amd64 hosts with that GPU")
    # The sm name itself says nothing of the CPU: taken.
    assert cli_args.archs(ns(arch=["sm100"], target="sglang-blackwell"), ws) == ("sm100",)
    # An unknown target is the command's to refuse; a target argument that is no name either.
    assert cli_args.archs(ns(arch=["GB200"], target="no-such-target"), ws) == ("sm100",)
    assert cli_args.archs(ns(arch=["GB200"], target=["a", "b"]), ws) == ("sm100",)


def test_the_hint_names_targets_of_that_cpu_and_arch_or_says_what_to_make(ws):
    import dataclasses

    t = ws.catalog.target("sglang-blackwell")
    arm = dataclasses.replace(t, name="sglang-grace", platforms=("linux/arm64",))
    amd_only = {n: x for n, x in ws.catalog.targets.items() if "linux/arm64" not in x.platforms}
    # _same_cpu reads the workspace's catalog only.
    one = argparse.Namespace(catalog=dataclasses.replace(
        ws.catalog, targets={**amd_only, "sglang-grace": arm}))
    with pytest.raises(InputError) as e:
        cli_args._same_cpu(["GB200"], one, "sglang-blackwell")
    assert e.value.hint == "use sglang-grace, or --arch sm100 for linux/amd64 hosts with that GPU"
    none = argparse.Namespace(catalog=dataclasses.replace(ws.catalog, targets=amd_only))
    with pytest.raises(InputError) as e:
        cli_args._same_cpu(["GB200"], none, "sglang-blackwell")
    assert e.value.hint == ("use a target with `platforms: [linux/arm64]`, or --arch sm100 for "
                            "linux/amd64 hosts with that GPU")
    # An arm64 target whose archs lack the GPU's is not offered.
    old = dataclasses.replace(arm, name="sglang-grace-hopper", archs=("sm90",))
    odd = argparse.Namespace(catalog=dataclasses.replace(
        ws.catalog, targets={**amd_only, "sglang-grace-hopper": old}))
    with pytest.raises(InputError) as e:
        cli_args._same_cpu(["GB200"], odd, "sglang-blackwell")
    assert e.value.hint.startswith("use a target with")


# -- --platform -------------------------------------------------------------------------------

def test_platforms_takes_full_names_bare_archs_and_drops_repeats():
    assert cli_args.platforms(ns()) is None
    assert cli_args.platforms(ns(platform=["linux/arm64"])) == ("linux/arm64",)
    assert cli_args.platforms(ns(platform=["arm64,aarch64", "amd64", "x86_64"])) == (
        "linux/arm64", "linux/amd64")


@pytest.mark.parametrize("given, message", [
    (["arm64,"], "--platform has an empty entry"),
    (["linux/riscv64"], "--platform linux/riscv64: not a platform imgbuild builds"),
    (["ppc64le"], "--platform ppc64le: not a platform imgbuild builds"),
])
def test_a_platform_imgbuild_does_not_build_is_refused(given, message):
    with pytest.raises(InputError) as e:
        cli_args.platforms(ns(platform=given))
    assert e.value.message == message
    names = ", ".join(cli_args.PLATFORMS)
    assert e.value.hint in (f"name a platform: {names}", f"one of {names}")


# -- --cache-from -----------------------------------------------------------------------------

def test_cache_from_refs_are_checked_and_never_with_no_cache_from():
    assert cli_args.cache_from_refs(ns()) == ()
    refs = ["127.0.0.1:5000/acme/serving:tiny-cpu", "ghcr.io/acme/x:y"]
    assert cli_args.cache_from_refs(ns(cache_from=refs, no_cache_from=False)) == tuple(refs)
    assert cli_args.cache_from_refs(ns(cache_from=refs)) == tuple(refs)
    with pytest.raises(InputError) as e:
        cli_args.cache_from_refs(ns(cache_from=refs, no_cache_from=True))
    assert e.value.message == "--cache-from and --no-cache-from ask for opposite things"
    assert e.value.facts == [f"--cache-from {refs[0]}",
                             "--no-cache-from: reuse no image's layers from a registry"]
    assert e.value.hint == "drop one of them"
    assert cli_args.cache_from_refs(ns(cache_from=[], no_cache_from=True)) == ()
    with pytest.raises(InputError):
        cli_args.cache_from_refs(ns(cache_from=["not a ref"]))


# -- --log-dir --------------------------------------------------------------------------------

HINT = "name a directory imgbuild can create and write in, or leave --log-dir out"


def test_log_dir_is_made_and_proven_writable(tmp_path):
    assert cli_args.log_dir(ns()) is None
    assert cli_args.log_dir(ns(log_dir=None)) is None
    d = tmp_path / "a" / "b"
    assert cli_args.log_dir(ns(log_dir=str(d))) == d and d.is_dir()


@pytest.mark.parametrize("make, why", [
    (lambda t: ("", None), None),
    (lambda t: (str(t / "f"), (t / "f").write_text("x")), "it is a file, not a directory"),
    (lambda t: (str(t / "f" / "sub"), (t / "f").write_text("x")),
     "a part of the path is a file, not a directory"),
])
def test_a_log_dir_that_cannot_be_one_is_refused_before_any_work(tmp_path, make, why):
    given, _ = make(tmp_path)
    with pytest.raises(InputError) as e:
        cli_args.log_dir(ns(log_dir=given))
    err = e.value
    assert err.hint == HINT
    if why is None:
        assert err.message == "--log-dir is empty" and err.facts == []
    else:
        assert err.message == f"--log-dir {given}: {why}"
        assert err.facts == ["nothing was built"]


def test_a_log_dir_that_cannot_be_written_says_the_systems_words(tmp_path, monkeypatch):
    def refuse(path: Path) -> None:
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr(cli_args, "make_writable_dir", refuse)
    with pytest.raises(InputError) as e:
        cli_args.log_dir(ns(log_dir=str(tmp_path / "logs")))
    assert e.value.message == (f"--log-dir {tmp_path / 'logs'}: cannot create it or write in "
                               "it: Permission denied")
    assert ROOT.exists()
