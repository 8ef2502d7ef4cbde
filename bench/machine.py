"""What a benchmark ran on, recorded beside its numbers."""

from __future__ import annotations

import datetime
import os
import platform
import subprocess


def machine() -> dict:
    cpu = ""
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    mem_gb = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    uv = subprocess.run(["uv", "--version"], capture_output=True, text=True).stdout.strip()
    return {"date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
            "host": platform.node(), "cpu": cpu, "cores": os.cpu_count(),
            "memory_gb": round(mem_gb, 1), "python": platform.python_version(), "uv": uv}
