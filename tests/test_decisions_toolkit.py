"""Is the NVIDIA Container Toolkit set up for the Engine (image/toolkit.py verdict), on recorded
`docker info` outputs (tests/fixtures/docker-info/README.md says where each comes from): this
project's Engines, which have no toolkit, and a public recording of an Engine with it."""

from __future__ import annotations

import json

import pytest

from imgbuild.image import toolkit

from .conftest import ROOT

INFO = ROOT / "tests" / "fixtures" / "docker-info"
NO_TOOLKIT = ("engine-20.10.24-no-toolkit.json", "engine-26.1.5-classic-no-toolkit.json",
              "engine-26.1.5-containerd-no-toolkit.json")
WITH_TOOLKIT = "engine-28.0.0-rc.1-toolkit-1.17.6.txt"


def _json(name: str) -> dict:
    return json.loads((INFO / name).read_text())


@pytest.mark.parametrize("name", NO_TOOLKIT)
def test_this_project_s_engines_have_no_toolkit_and_are_refused(name):
    info = _json(name)
    t = toolkit.verdict(info, hook=None, local=True)
    assert t.ok is False
    assert t.facts[0].startswith(f"Docker Engine {info['ServerVersion']}: runtimes ")
    assert "default runc" in t.facts[0] and "nvidia" not in t.facts[0]
    assert "nvidia-container-runtime-hook: not on this host's PATH" in t.facts
    err = toolkit.refusal(t, 8)
    assert err.exit_code == 3
    assert err.message.startswith("this host has 8 NVIDIA GPUs, and its Docker Engine cannot "
                                  "give them to a container")
    assert "nvidia-ctk runtime configure --runtime=docker" in err.hint
    assert err.facts[-1] == "nothing was started"


@pytest.mark.parametrize("name", NO_TOOLKIT)
def test_the_same_engines_with_the_hook_installed_pass_where_the_engine_is_local(name):
    info = _json(name)
    assert toolkit.verdict(info, hook="/usr/bin/nvidia-container-runtime-hook",
                           local=True).ok is True
    # A remote Engine's PATH is not this host's: neither yes nor no.
    assert toolkit.verdict(info, hook="/usr/bin/nvidia-container-runtime-hook",
                           local=False).ok is None
    assert toolkit.verdict(info, hook=None, local=False).ok is None


def test_a_recorded_engine_with_the_nvidia_runtime_passes():
    info = toolkit.info_from_text((INFO / WITH_TOOLKIT).read_text())
    assert info["ServerVersion"] == "28.0.0-rc.1"
    assert sorted(info["Runtimes"]) == ["io.containerd.runc.v2", "nvidia", "runc"]
    assert info["DefaultRuntime"] == "runc"
    t = toolkit.verdict(info, hook=None, local=True)
    assert (t.ok, t.how) == (True, "the Engine has the nvidia runtime")
    # The text and the JSON of this project's Engines read alike.
    assert toolkit.verdict(info, hook=None, local=False).ok is True


@pytest.mark.parametrize("edit, ok, how", [
    ({"DefaultRuntime": "nvidia"}, True, "default runtime is nvidia"),
    ({"DiscoveredDevices": [{"Source": "cdi", "ID": "nvidia.com/gpu=all"}]}, True,
     "CDI specs name nvidia.com/gpu=all"),
    # Docker Desktop's own CDI device is not an NVIDIA GPU.
    ({"DiscoveredDevices": [{"Source": "cdi", "ID": "docker.com/gpu=webgpu"}]}, False, ""),
    ({"Runtimes": {"runc": {}, "nvidia-cdi": {}}}, False, ""),
])
def test_each_way_the_engine_gives_gpus(edit, ok, how):
    info = _json(NO_TOOLKIT[1]) | edit
    t = toolkit.verdict(info, hook=None, local=True)
    assert t.ok is ok and how in t.how


def test_text_with_discovered_devices():
    text = (" Discovered Devices:\n  cdi: docker.com/gpu=webgpu\n  cdi: nvidia.com/gpu=0\n"
            " Swarm: inactive\n Runtimes: io.containerd.runc.v2 runc\n Default Runtime: runc\n")
    info = toolkit.info_from_text(text)
    assert info["DiscoveredDevices"] == [{"Source": "cdi", "ID": "docker.com/gpu=webgpu"},
                                         {"Source": "cdi", "ID": "nvidia.com/gpu=0"}]
    assert toolkit.verdict(info, hook=None, local=True).ok is True


def test_an_engine_that_does_not_answer_info_is_not_refused():
    class Broken:
        def info(self):
            raise RuntimeError("connection reset")

    t = toolkit.engine_toolkit(Broken(), local=True)
    assert t.ok is None and "connection reset" in t.how


# -- word for word: what `run` and `preflight` show of each verdict ----------------------------

FACT = "Docker Engine 26.1.5+dfsg1: runtimes io.containerd.runc.v2, runc, default runc"
HOOK = "nvidia-container-runtime-hook: not on this host's PATH"
CDI = [{"Source": "cdi", "ID": f"nvidia.com/gpu={i}"} for i in range(5)]


@pytest.mark.parametrize("edit, hook, local, want", [
    ({"DefaultRuntime": "nvidia", "Runtimes": {"nvidia": {}}}, None, True, toolkit.Toolkit(
        True, "the Engine's default runtime is nvidia",
        ("Docker Engine 26.1.5+dfsg1: runtimes nvidia, default nvidia",))),
    ({"Runtimes": {"runc": {}, "nvidia": {}}}, None, True, toolkit.Toolkit(
        True, "the Engine has the nvidia runtime",
        ("Docker Engine 26.1.5+dfsg1: runtimes nvidia, runc, default runc",))),
    ({"DiscoveredDevices": CDI + ["not a device"]}, None, False, toolkit.Toolkit(
        True, "the Engine's CDI specs name nvidia.com/gpu=0, nvidia.com/gpu=1, nvidia.com/gpu=2",
        (FACT,))),
    ({}, "/usr/bin/nvidia-container-runtime-hook", True, toolkit.Toolkit(
        True, "the toolkit's hook is installed (/usr/bin/nvidia-container-runtime-hook), which "
        "--gpus uses", (FACT,))),
    ({}, "/usr/bin/nvidia-container-runtime-hook", False, toolkit.Toolkit(
        None, "the Engine is not on this host: its toolkit's hook cannot be looked for here",
        (FACT, "no nvidia.com/gpu CDI device discovered"))),
    ({"DiscoveredDevices": [{"Source": "cdi", "ID": "docker.com/gpu=webgpu"},
                            {"Source": "other", "ID": "nvidia.com/gpu=0"}, {"Source": "cdi"}]},
     None, True, toolkit.Toolkit(False, "", (FACT, "CDI devices: docker.com/gpu=webgpu, ",
                                             HOOK))),
    ({"ServerVersion": None, "Runtimes": None, "DefaultRuntime": None}, None, True,
     toolkit.Toolkit(False, "", ("Docker Engine ?: runtimes none, default runc",
                                 "no nvidia.com/gpu CDI device discovered", HOOK))),
])
def test_each_verdict_word_for_word(edit, hook, local, want):
    info = _json(NO_TOOLKIT[1]) | edit
    assert toolkit.verdict(info, hook=hook, local=local) == want


@pytest.mark.parametrize("gpus, said", [(1, "1 NVIDIA GPU,"), (2, "2 NVIDIA GPUs,"),
                                        (8, "8 NVIDIA GPUs,")])
def test_the_refusal_counts_the_gpus_and_says_the_way_out(gpus, said):
    e = toolkit.refusal(toolkit.Toolkit(False, "", ("f1", "f2")), gpus)
    assert e.message == (f"this host has {said} and its Docker Engine cannot give them to a "
                         "container: the NVIDIA Container Toolkit is not set up for it")
    assert e.facts == ["f1", "f2", "nothing was started"]
    assert e.hint == ("install the NVIDIA Container Toolkit (nvidia-container-toolkit) and "
                      f"register it with the Engine: `{toolkit.CONFIGURE}`; `docker run --rm "
                      "--gpus all IMAGE nvidia-smi` then shows the GPUs")


def test_the_engines_own_info_and_this_hosts_hook_are_what_is_judged(monkeypatch):
    info = _json(NO_TOOLKIT[1])

    class Client:
        def info(self):
            return info

    looked = []
    monkeypatch.setattr(toolkit.shutil, "which", lambda name: looked.append(name) or "/x/hook")
    assert toolkit.engine_toolkit(Client(), local=True) == toolkit.verdict(
        info, hook="/x/hook", local=True)
    assert looked == [toolkit.HOOK]
    assert toolkit.engine_toolkit(Client(), local=False).ok is None


def test_a_pasted_value_with_a_colon_is_read_whole():
    info = toolkit.info_from_text(" Server Version: 28.0.0:rc1\n Default Runtime: runc\n")
    assert info == {"ServerVersion": "28.0.0:rc1", "DefaultRuntime": "runc"}
