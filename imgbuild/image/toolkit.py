"""Is the NVIDIA Container Toolkit set up for this Docker Engine? Read before `imgbuild run`
starts a GPU container, so that a host whose Engine cannot hand GPUs to a container is told how
to set it up, instead of Docker's `could not select device driver "" with capabilities:
[[gpu]]` after the image was pulled.

The Engine gives a container GPUs three ways, and `docker info` shows two of them:

- the `nvidia` runtime (`nvidia-ctk runtime configure --runtime=docker` writes it into
  /etc/docker/daemon.json): `Runtimes` names it, or `DefaultRuntime` is it;
- CDI (Engine 25 and later, `--device nvidia.com/gpu=all`; `nvidia-ctk cdi generate` writes the
  spec): Engines from 28.2 list the specs' devices under `DiscoveredDevices`;
- `--gpus` through the toolkit's prestart hook, which the Engine finds by looking up
  `nvidia-container-runtime-hook` on its own PATH (moby daemon/nvidia_linux.go): not in
  `docker info`, so read here on this host's PATH where the Engine is local.

The decision (`verdict`) is pure, on `docker info`'s JSON and that lookup, so recorded outputs
test it (tests/fixtures/docker-info).
"""

from __future__ import annotations

import re
import shutil
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ..errors import EnvError

HOOK = "nvidia-container-runtime-hook"
CONFIGURE = ("sudo nvidia-ctk runtime configure --runtime=docker && "
             "sudo systemctl restart docker")


@dataclass(frozen=True)
class Toolkit:
    """What `docker info` (and the hook lookup) say about GPUs for containers. ok: True (set
    up: `how` says by what), False (not: refuse), None (cannot tell: a remote Engine)."""

    ok: bool | None
    how: str
    facts: tuple[str, ...] = ()


def verdict(info: Mapping[str, Any], *, hook: str | None, local: bool) -> Toolkit:
    """Whether an Engine with this `docker info` gives a container `--gpus all`. hook: the
    path of nvidia-container-runtime-hook on this host's PATH (None: not found); local: the
    Engine runs on this host (so its PATH is this host's, roughly)."""
    version = str(info.get("ServerVersion") or "?")
    runtimes = sorted((info.get("Runtimes") or {}).keys())
    default = str(info.get("DefaultRuntime") or "runc")
    devices = [str(d.get("ID", "")) for d in (info.get("DiscoveredDevices") or [])
               if isinstance(d, dict) and d.get("Source") == "cdi"]
    nvidia_cdi = [d for d in devices if d.startswith("nvidia.com/gpu")]
    facts = (f"Docker Engine {version}: runtimes {', '.join(runtimes) or 'none'}, default "
             f"{default}",)
    if default == "nvidia":
        return Toolkit(True, "the Engine's default runtime is nvidia", facts)
    if "nvidia" in runtimes:
        return Toolkit(True, "the Engine has the nvidia runtime", facts)
    if nvidia_cdi:
        return Toolkit(True, f"the Engine's CDI specs name {', '.join(nvidia_cdi[:3])}", facts)
    if hook and local:
        return Toolkit(True, f"the toolkit's hook is installed ({hook}), which --gpus uses",
                       facts)
    facts += (("CDI devices: " + ", ".join(devices)) if devices else
              "no nvidia.com/gpu CDI device discovered",)
    if not local:
        return Toolkit(None, "the Engine is not on this host: its toolkit's hook cannot be "
                             "looked for here", facts)
    return Toolkit(False, "", facts + (f"{HOOK}: not on this host's PATH",))


def refusal(t: Toolkit, gpus: int) -> EnvError:
    """The error (exit 3) for an Engine that cannot give the container its GPUs."""
    return EnvError(
        f"this host has {gpus} NVIDIA GPU{'s' if gpus != 1 else ''}, and its Docker Engine "
        "cannot give them to a container: the NVIDIA Container Toolkit is not set up for it",
        facts=list(t.facts) + ["nothing was started"],
        hint="install the NVIDIA Container Toolkit (nvidia-container-toolkit) and register it "
             f"with the Engine: `{CONFIGURE}`; `docker run --rm --gpus all IMAGE nvidia-smi` "
             "then shows the GPUs")


def info_from_text(text: str) -> dict[str, Any]:
    """The fields `verdict` reads, from `docker info`'s text (what users paste): Server
    Version, Runtimes, Default Runtime, Discovered Devices."""
    out: dict[str, Any] = {}
    lines = text.splitlines()
    for i, line in enumerate(lines):
        key, _, value = line.strip().partition(":")
        value = value.strip()
        if key == "Server Version":
            out["ServerVersion"] = value
        elif key == "Runtimes":
            out["Runtimes"] = {r: {} for r in value.split()}
        elif key == "Default Runtime":
            out["DefaultRuntime"] = value
        elif key == "Discovered Devices":
            devs = []
            indent = len(line) - len(line.lstrip())
            for more in lines[i + 1:]:
                m = re.match(r"^(\s+)(\w+):\s*(\S+)\s*$", more)
                if not m or len(m.group(1)) <= indent:  # the next key, not a device under it
                    break
                devs.append({"Source": m.group(2), "ID": m.group(3)})
            out["DiscoveredDevices"] = devs
    return out


def engine_toolkit(client: Any, *, local: bool) -> Toolkit:
    """The verdict for the Engine `client` (the docker SDK's) talks to."""
    try:
        info = client.info()
    except Exception as e:  # the Engine answered before; say it, never a traceback
        return Toolkit(None, f"docker info failed: {e}")
    return verdict(info, hook=shutil.which(HOOK), local=local)
