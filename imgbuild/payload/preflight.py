"""Host preflight: will this image's server start on this machine?

Reads the host through `nvidia-smi` (driver, each GPU's compute capability and memory, memory
held by other processes) and the filesystem (free disk where the model will be stored), and
judges it against the image's facts (the archs it was built for, its CUDA's driver floor, the
model it serves at which tensor-parallel size). Each check ends in a Verdict; a `fail` means the
server would not start, or would start and die, on this host.

This file is copied into images and run by their entrypoint before the server:

    python /opt/imgbuild/preflight.py [--facts /opt/imgbuild/image.json] [--model-dir DIR]
                                      [--json] [--nvidia-smi PATH] [--container]
    python /opt/imgbuild/preflight.py --container-only

With --container it also looks at the container itself, where the host cannot: a UID with no
passwd entry and no user name set, a cache directory it cannot write, JIT directories on a
noexec mount. What it finds there it says in the words of `imgbuild doctor` (the catalog's
sentences, shipped beside this file as doctor-sentences.json), and warns: the server starts.

so it imports only the standard library (no rich, no yaml, not this package). The host side
(builder.preflight) imports the same logic, so `imgbuild preflight` and the image agree.

Exit status: 0 when no check failed (pass, warn or skip), 1 when one did, 2 for bad input,
3 for an error of the preflight itself. The entrypoint refuses to start the server on 1 only.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import shutil
import string
import subprocess
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

try:  # imgbuild.payload.preflight, in the package
    from .anyuser import CACHES
except ImportError:  # /opt/imgbuild/preflight.py, a script beside anyuser.py in the image
    from anyuser import CACHES  # type: ignore[no-redef]

PASS, FAIL, WARN, SKIP = "pass", "fail", "warn", "skip"

# Where images carry the facts file and this script (the entrypoint's defaults).
FACTS_PATH = "/opt/imgbuild/image.json"
PREFLIGHT_PATH = "/opt/imgbuild/preflight.py"

GPU_FIELDS = ("index", "uuid", "name", "compute_cap", "driver_version", "memory.total",
              "memory.used")
APP_FIELDS = ("gpu_uuid", "pid", "process_name", "used_memory")
CSV_FORMAT = "--format=csv,noheader,nounits"

# The image's weights may take at most this share of a GPU's total memory. The rest is what the
# engine needs besides weights (CUDA context, activations, a KV cache worth serving with); 90%
# is already generous, so a model that only fits above it will not serve in practice.
WEIGHTS_HEADROOM = 0.90
# Memory another process may hold on a GPU before we call the GPU taken. An idle GPU reports a
# few MiB used (driver bookkeeping: 1-14 MiB in the recordings the fixtures come from); anything
# past 1 GiB is someone's CUDA context and tensors.
TAKEN_THRESHOLD_MIB = 1024
# SGLang's check (model_runner.init_torch_distributed): each TP rank compares the minimum free
# memory across ranks with its own; below 90% it raises "The memory capacity is unbalanced.
# Some GPUs may be occupied by other processes." (SGLANG_ENABLE_TP_MEMORY_INBALANCE_CHECK,
# on by default in current releases).
SGLANG_BALANCE_RATIO = 0.90

# Linux driver floors of CUDA minor releases (DESIGN.md, from NVIDIA's release notes); used
# when the facts name a CUDA version but no explicit floor.
CUDA_MIN_DRIVER = {"12.8": "570.26", "12.9": "575.51.03", "13.0": "580.65.06"}

# Drivers before 510 lack the compute_cap query field. Such a driver cannot run any image this
# tool builds (CUDA 12.8+ needs 570+), but the arch verdict should still be right, so the
# capability falls back to the product name. Matched as substrings, so a key comes before any
# shorter key it contains: "H200" before "H20", "A100" before "A10", "L40" before "L4".
NAME_CAPABILITY = (
    ("GH200", "9.0"), ("H100", "9.0"), ("H200", "9.0"), ("H800", "9.0"), ("H20", "9.0"),
    ("A100", "8.0"), ("A800", "8.0"), ("A30", "8.0"),
    ("RTX A6000", "8.6"), ("A40", "8.6"), ("A10", "8.6"), ("RTX 3090", "8.6"),
    ("L40", "8.9"), ("L4", "8.9"), ("RTX 4090", "8.9"), ("RTX 6000 Ada", "8.9"),
    ("V100", "7.0"), ("T4", "7.5"),
)

NO_GPU_HINT = ("inside a container, start it with `--gpus all` (NVIDIA Container Toolkit) so "
               "the driver's nvidia-smi is mounted in")

# argv -> (exit status, stdout, stderr). Tests pass one that replays recorded outputs; it is
# asked for nvidia-smi's two queries and `uname -m`, and answers non-zero for what it lacks.
Runner = Callable[[Sequence[str]], tuple[int, str, str]]


# ----------------------------------------------------------------------------------------------
# Facts: the host and the image
# ----------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Gpu:
    index: int
    uuid: str
    name: str
    compute_cap: str | None  # "12.0"; None when neither nvidia-smi nor the name table knows
    cap_source: str  # "nvidia-smi", "name table" or "unknown": says how far to trust it
    memory_total_mib: int | None  # None: "[N/A]" (unified-memory parts such as GB10)
    memory_used_mib: int | None

    @property
    def sm(self) -> str | None:
        cap = parse_capability(self.compute_cap) if self.compute_cap else None
        return f"sm{cap[0]}{cap[1]}" if cap else None


@dataclass(frozen=True)
class Process:
    gpu_uuid: str
    pid: int | None
    name: str
    used_mib: int | None


@dataclass(frozen=True)
class Host:
    gpus: tuple[Gpu, ...] = ()
    driver: str | None = None
    processes: tuple[Process, ...] = ()
    apps_visible: bool = False  # the compute-apps query answered (it may still list nothing)
    disk_free_bytes: int | None = None
    disk_path: str | None = None  # where free space was measured (nearest existing parent)
    nvidia_smi: str | None = None  # the binary that answered; None when none was found
    error: str | None = None  # why there are no GPU facts
    notes: tuple[str, ...] = ()
    cpu_arch: str | None = None  # `uname -m`: x86_64, aarch64 (None: unknown)

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        for g, gd in zip(self.gpus, d["gpus"]):
            gd["sm"] = g.sm
        return d


@dataclass(frozen=True)
class ModelFacts:
    alias: str
    size_gb: float | None  # weights on disk, decimal GB as model cards state them
    tensor_parallel: int | None


@dataclass(frozen=True)
class ImageFacts:
    archs: tuple[str, ...]  # ("sm100", "sm120") or ("cpu",)
    cuda: str | None = None  # "13.0"; None for a CPU image
    min_driver: str | None = None  # "580.65.06"; derived from cuda when not given
    model: ModelFacts | None = None
    cpu_arch: str | None = None  # the CPU the image's binaries are for: x86_64, aarch64

    @property
    def driver_floor(self) -> str | None:
        if self.min_driver:
            return self.min_driver
        return CUDA_MIN_DRIVER.get(".".join((self.cuda or "").split(".")[:2]))

    @property
    def cpu_only(self) -> bool:
        return all(a == "cpu" for a in self.archs)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> ImageFacts:
        """The facts file's shape: {archs, cuda, min_driver, model: null | {alias, size_gb,
        tensor_parallel}}. Raises ValueError naming the key that is wrong."""
        if not isinstance(d, dict):
            raise ValueError("expected a JSON object")
        archs = d.get("archs")
        if isinstance(archs, str):
            archs = [a for a in archs.split(",") if a.strip()]
        if not isinstance(archs, list) or not archs or not all(isinstance(a, str) for a in archs):
            raise ValueError(f"archs: expected a non-empty list such as [\"sm100\", \"sm120\"], "
                             f"got {archs!r}")
        for a in archs:
            if a.strip() != "cpu" and parse_arch(a) is None:
                raise ValueError(f"archs: {a!r} is not an arch such as sm90, sm100a or cpu")
        m = d.get("model")
        model = None
        if m not in (None, "", "none"):
            if not isinstance(m, dict) or not m.get("alias"):
                raise ValueError(f"model: expected null or {{alias, size_gb, tensor_parallel}}, "
                                 f"got {m!r}")
            try:
                size = None if m.get("size_gb") in (None, "") else float(m["size_gb"])
                tp = None if m.get("tensor_parallel") in (None, "") else int(m["tensor_parallel"])
            except (TypeError, ValueError):
                raise ValueError(f"model: size_gb must be a number and tensor_parallel an "
                                 f"integer, got {m!r}") from None
            if tp is not None and tp < 1:
                raise ValueError(f"model.tensor_parallel: expected 1 or more, got {tp}")
            model = ModelFacts(str(m["alias"]), size, tp)
        cuda = d.get("cuda")
        min_driver = d.get("min_driver")
        cpu = d.get("cpu_arch")
        if cpu not in (None, "", "none") and cpu not in ("x86_64", "aarch64"):
            raise ValueError(f"cpu_arch: expected x86_64 or aarch64, got {cpu!r}")
        return cls(archs=tuple(a.strip() for a in archs),
                   cuda=None if cuda in (None, "", "none") else str(cuda),
                   min_driver=None if min_driver in (None, "", "none") else str(min_driver),
                   model=model, cpu_arch=None if cpu in (None, "", "none") else str(cpu))

    def to_dict(self) -> dict[str, Any]:
        return {"archs": list(self.archs), "cuda": self.cuda, "min_driver": self.min_driver,
                "model": asdict(self.model) if self.model else None, "cpu_arch": self.cpu_arch}


@dataclass(frozen=True)
class Verdict:
    check: str
    status: str  # PASS, FAIL, WARN or SKIP
    detail: str


@dataclass(frozen=True)
class Said:
    """A failure of imgbuild doctor's catalog found at start-up: its id, and the values its
    sentences are filled with (what the container showed)."""

    failure: str
    values: tuple[tuple[str, str], ...] = ()


@dataclass(frozen=True)
class Report:
    image: ImageFacts
    host: Host
    verdicts: tuple[Verdict, ...] = field(default=())
    said: tuple[Said, ...] = ()  # the container's own failures (--container)

    @property
    def ok(self) -> bool:
        return not any(v.status == FAIL for v in self.verdicts)

    @property
    def exit_code(self) -> int:
        return 0 if self.ok else 1

    def to_dict(self) -> dict[str, Any]:
        d = {"ok": self.ok, "verdicts": [asdict(v) for v in self.verdicts],
             "image": self.image.to_dict(), "host": self.host.to_dict()}
        if self.said:
            d["doctor"] = [{"id": x.failure, "values": dict(x.values)} for x in self.said]
        return d


# ----------------------------------------------------------------------------------------------
# Reading nvidia-smi
# ----------------------------------------------------------------------------------------------


def _na(value: str) -> bool:
    # nvidia-smi prints these where a field does not apply to the part ("[N/A]" for
    # memory.total on unified-memory GB10) or the driver cannot read it.
    return value.strip().strip("[]").lower() in ("n/a", "not supported", "unknown error",
                                                  "insufficient permissions", "")


def _int(value: str) -> int | None:
    if _na(value):
        return None
    try:
        return int(float(value.strip()))
    except ValueError:
        return None


def _rows(text: str) -> list[list[str]]:
    # GPU rows only: product names carry no commas. Process names may (parse_apps).
    return [[c.strip() for c in line.split(",")] for line in text.splitlines() if line.strip()]


def capability_from_name(name: str) -> str | None:
    for key, cap in NAME_CAPABILITY:
        if key.lower() in name.lower():
            return cap
    return None


def parse_gpus(text: str, fields: Sequence[str] = GPU_FIELDS) -> tuple[list[Gpu], str | None]:
    """Rows of `--query-gpu=<fields> --format=csv,noheader,nounits` -> GPUs and the driver."""
    gpus: list[Gpu] = []
    drivers: list[str] = []
    for row in _rows(text):
        if len(row) != len(fields):
            raise ValueError(f"expected {len(fields)} comma-separated fields "
                             f"({','.join(fields)}), got {len(row)}: {', '.join(row)!r}")
        r = dict(zip(fields, row))
        name = r["name"]
        cap, source = r.get("compute_cap"), "nvidia-smi"
        if cap is None or _na(cap) or parse_capability(cap) is None:
            cap, source = capability_from_name(name), "name table"
            if cap is None:
                source = "unknown"
        if r.get("driver_version") and not _na(r["driver_version"]):
            drivers.append(r["driver_version"])
        index = _int(r["index"])
        gpus.append(Gpu(index=len(gpus) if index is None else index,
                        uuid=r.get("uuid", ""), name=name, compute_cap=cap, cap_source=source,
                        memory_total_mib=_int(r["memory.total"]),
                        memory_used_mib=_int(r["memory.used"])))
    return gpus, (drivers[0] if drivers else None)


def parse_apps(text: str) -> list[Process]:
    """Rows of `--query-compute-apps=gpu_uuid,pid,process_name,used_memory`."""
    procs = []
    for line in text.splitlines():
        if not line.strip() or line.lower().startswith("no running"):
            continue
        # process_name may contain commas (a command line); uuid and pid lead, memory trails.
        head = line.split(",", 2)
        if len(head) < 3 or "," not in head[2]:
            raise ValueError(f"expected gpu_uuid, pid, process_name, used_memory, got {line!r}")
        name, used = head[2].rsplit(",", 1)
        procs.append(Process(gpu_uuid=head[0].strip(), pid=_int(head[1]), name=name.strip(),
                             used_mib=_int(used)))
    return procs


def _subprocess_runner(argv: Sequence[str]) -> tuple[int, str, str]:
    try:
        p = subprocess.run(list(argv), capture_output=True, text=True, timeout=60)
    except subprocess.TimeoutExpired:
        return 124, "", f"{argv[0]} did not answer in 60 s (a hung GPU or driver)"
    except OSError as e:
        return 127, "", str(e)
    return p.returncode, p.stdout, p.stderr


def recorded_runner(gpus_csv: str, apps_csv: str, machine: str | None = None) -> Runner:
    """A runner that answers the two queries (and `uname -m`, where the recording has it) with
    recorded outputs (tests, `--recording`)."""

    def run(argv: Sequence[str]) -> tuple[int, str, str]:
        if list(argv) == ["uname", "-m"] and machine:
            return 0, machine, ""
        if any(a.startswith("--query-gpu=") for a in argv):
            return 0, gpus_csv, ""
        if any(a.startswith("--query-compute-apps=") for a in argv):
            return 0, apps_csv, ""
        return 2, "", f"recording has no answer for {' '.join(argv)}"

    return run


def recording_runner(directory: str | os.PathLike[str]) -> Runner:
    d = Path(directory)
    apps, machine = d / "apps.csv", d / "uname-m.txt"
    return recorded_runner((d / "gpus.csv").read_text(),
                           apps.read_text() if apps.exists() else "",
                           machine.read_text() if machine.exists() else None)


def default_model_dir() -> str:
    """Where the engine will put the model: IMGBUILD_MODEL_DIR, else the Hugging Face cache."""
    explicit = os.environ.get("IMGBUILD_MODEL_DIR")
    if explicit:
        return explicit
    hf_home = os.environ.get("HF_HOME") or os.path.join(os.path.expanduser("~"), ".cache",
                                                         "huggingface")
    return os.environ.get("HF_HUB_CACHE") or os.path.join(hf_home, "hub")


def disk_free(path: str | os.PathLike[str]) -> tuple[int | None, str | None]:
    """Free bytes on the filesystem that will hold `path`, measured at its nearest existing
    ancestor (the model directory usually does not exist before the first download)."""
    p = Path(path).expanduser().absolute()
    for candidate in (p, *p.parents):
        try:
            # exists() raises, not answers False, under a directory this user may not enter
            # (HF_HOME under /root for a non-root UID): such a path is measured higher up.
            if not candidate.exists():
                continue
            return shutil.disk_usage(candidate).free, str(candidate)
        except OSError:
            continue
    return None, None


def probe(*, nvidia_smi: str | None = None, runner: Runner | None = None,
          model_dir: str | os.PathLike[str] | None = None) -> Host:
    """Read the host. `runner` replaces subprocess (recorded outputs); `nvidia_smi` names the
    binary (default: the one on PATH). Never raises for a missing GPU: that is a fact."""
    free, where = disk_free(model_dir) if model_dir is not None else (None, None)
    rc, out, _ = (runner or _subprocess_runner)(["uname", "-m"])
    machine = out.strip() if rc == 0 and out.strip() else None
    base = Host(disk_free_bytes=free, disk_path=where,
                cpu_arch={"arm64": "aarch64", "amd64": "x86_64"}.get(machine or "", machine))
    binary = nvidia_smi or "nvidia-smi"
    if runner is None:
        found = shutil.which(binary)
        if not found:
            return _replace(base, error=f"nvidia-smi not found ({binary!r} is not on PATH or "
                                        f"not executable)")
        binary, runner = found, _subprocess_runner
    notes: list[str] = []
    fields = GPU_FIELDS
    rc, out, err = runner([binary, "--query-gpu=" + ",".join(fields), CSV_FORMAT])
    if rc != 0 and "compute_cap" in out + err:
        # Drivers before 510: 'Field "compute_cap" is not a valid field to query.' (exit 2).
        fields = tuple(f for f in GPU_FIELDS if f != "compute_cap")
        notes.append("this driver's nvidia-smi has no compute_cap field (drivers before 510); "
                     "capabilities come from the GPU names")
        rc, out, err = runner([binary, "--query-gpu=" + ",".join(fields), CSV_FORMAT])
    if rc != 0:
        said = (err or out).strip().splitlines()
        # "No devices were found" (exit 6) and NVML failures land here: no usable GPU.
        return _replace(base, nvidia_smi=binary, notes=tuple(notes),
                        error=f"nvidia-smi exited {rc}: {said[0] if said else 'no output'}")
    try:
        gpus, driver = parse_gpus(out, fields)
    except ValueError as e:
        return _replace(base, nvidia_smi=binary, error=f"unreadable nvidia-smi output: {e}")
    if not gpus:
        return _replace(base, nvidia_smi=binary, driver=driver,
                        error="nvidia-smi lists no GPU")
    if any(g.cap_source == "unknown" for g in gpus):
        notes.append("compute capability unknown for: " + ", ".join(
            f"GPU{g.index} {g.name}" for g in gpus if g.cap_source == "unknown"))
    rc, out, err = runner([binary, "--query-compute-apps=" + ",".join(APP_FIELDS), CSV_FORMAT])
    procs: list[Process] = []
    apps_visible = rc == 0
    if apps_visible:
        try:
            procs = parse_apps(out)
        except ValueError as e:
            apps_visible = False
            notes.append(f"compute-apps list unreadable ({e}); judging by memory.used alone")
    else:
        notes.append("compute-apps query failed; judging by memory.used alone")
    return _replace(base, gpus=tuple(gpus), driver=driver, processes=tuple(procs),
                    apps_visible=apps_visible, nvidia_smi=binary, notes=tuple(notes))


def _replace(h: Host, **kw: Any) -> Host:
    d = {f: getattr(h, f) for f in h.__dataclass_fields__}
    d.update(kw)
    return Host(**d)


# ----------------------------------------------------------------------------------------------
# Judging
# ----------------------------------------------------------------------------------------------


def parse_capability(text: str | None) -> tuple[int, int] | None:
    """"12.0" -> (12, 0)."""
    if not text:
        return None
    parts = text.strip().split(".")
    if len(parts) != 2 or not all(p.isdigit() for p in parts):
        return None
    return int(parts[0]), int(parts[1])


def parse_arch(arch: str) -> tuple[int, int, str] | None:
    """"sm120" / "sm_120" / "sm100a" / "12.0" -> (major, minor, suffix). The last digit of an
    sm number is the minor: sm90 = 9.0, sm103 = 10.3, sm121 = 12.1."""
    a = arch.strip().lower()
    if parse_capability(a):
        major, minor = parse_capability(a)  # type: ignore[misc]
        return major, minor, ""
    a = a.removeprefix("sm").removeprefix("_")
    suffix = ""
    if a[-1:] in ("a", "f"):
        a, suffix = a[:-1], a[-1]
    if not a.isdigit() or len(a) < 2:
        return None
    return int(a[:-1]), int(a[-1]), suffix


def arch_covers(arch: str, cap: tuple[int, int]) -> str | None:
    """Why a cubin built for `arch` runs on a GPU of capability `cap`, or None when it does not.

    CUDA's binary compatibility: a cubin for sm_XY runs on sm_XZ with Z >= Y of the same major
    (sm100 code on sm103, sm120 on sm121), never across majors (sm90 code does not run on
    sm100, nor sm100 on sm120). Arch-specific cubins (sm100a) run only on that exact
    capability; family cubins (sm100f, CUDA 12.9+) on the family's later minors.
    """
    p = parse_arch(arch)
    if p is None:
        return None
    major, minor, suffix = p
    if (major, minor) == cap:
        return f"built for {arch}: exact match"
    if suffix == "a" or major != cap[0] or cap[1] < minor:
        return None
    return (f"binary compatibility: {arch} code runs on sm{cap[0]}{cap[1]} (same major "
            f"{major}, minor {cap[1]} >= {minor})")


def version_tuple(v: str) -> tuple[int, ...]:
    """"580.65.06" -> (580, 65, 6): drivers compare numerically per dotted part."""
    out = []
    for part in v.strip().split("."):
        digits = "".join(ch for ch in part if ch.isdigit())
        out.append(int(digits) if digits else 0)
    return tuple(out)


def version_at_least(have: str, floor: str) -> bool:
    a, b = version_tuple(have), version_tuple(floor)
    n = max(len(a), len(b))
    return a + (0,) * (n - len(a)) >= b + (0,) * (n - len(b))


def _gib(mib: float) -> str:
    return f"{mib / 1024:.1f} GiB"


def _gib_bytes(b: float) -> str:
    return f"{b / 2**30:.1f} GiB"


def _tp_gpus(facts: ImageFacts, host: Host) -> tuple[Gpu, ...]:
    """The GPUs the server will use: the first TP in index order (CUDA's default ordering when
    CUDA_VISIBLE_DEVICES is unset), or all when the image names no model."""
    tp = facts.model.tensor_parallel if facts.model else None
    return host.gpus[:tp] if tp else host.gpus


def check_arch(facts: ImageFacts, host: Host) -> Verdict:
    if facts.cpu_only:
        return Verdict("arch", PASS, "CPU image: runs on any host, no GPU arch needed")
    good: list[tuple[int, str]] = []
    bad: list[tuple[int, str]] = []
    for g in host.gpus:
        cap = parse_capability(g.compute_cap)
        if cap is None:
            bad.append((g.index, f"{g.name}: compute capability unknown"))
            continue
        reasons = [r for r in (arch_covers(a, cap) for a in facts.archs if a != "cpu") if r]
        src = "" if g.cap_source == "nvidia-smi" else f" (capability from {g.cap_source})"
        if reasons:
            good.append((g.index, f"{g.sm}{src}: {reasons[0]}"))
        else:
            bad.append((g.index, f"{g.name} is {g.sm}{src}"))
    if bad:
        return Verdict("arch", FAIL,
                       _grouped(bad) + f"; the image carries code for {', '.join(facts.archs)} "
                       f"only, and no cubin runs across majors or on an older minor; build an "
                       f"image whose archs include this GPU's")
    return Verdict("arch", PASS, _grouped(good))


def _grouped(items: list[tuple[int, str]]) -> str:
    """[(0, x), (1, x), (3, y)] -> "GPU0-1 x; GPU3 y": eight identical GPUs read as one line."""
    groups: dict[str, list[int]] = {}
    for index, text in items:
        groups.setdefault(text, []).append(index)
    out = []
    for text, idx in groups.items():
        contiguous = idx == list(range(idx[0], idx[0] + len(idx)))
        which = (f"GPU{idx[0]}-{idx[-1]}" if contiguous and len(idx) > 1
                 else "GPU" + ",".join(map(str, idx)))
        out.append(f"{which} {text}")
    return "; ".join(out)


def check_driver(facts: ImageFacts, host: Host) -> Verdict:
    floor = facts.driver_floor
    if facts.cpu_only:
        return Verdict("driver", SKIP, "CPU image: no NVIDIA driver needed")
    if not floor:
        return Verdict("driver", SKIP, f"the image names no driver floor (cuda "
                                       f"{facts.cuda or 'unknown'})")
    if not host.driver:
        return Verdict("driver", FAIL, "nvidia-smi reported no driver version")
    why = f"CUDA {facts.cuda} needs driver >= {floor}" if facts.cuda else f"floor {floor}"
    if version_at_least(host.driver, floor):
        return Verdict("driver", PASS, f"driver {host.driver} >= {floor} ({why})")
    return Verdict("driver", FAIL,
                   f"driver {host.driver} is older than {floor} ({why}); CUDA calls fail with "
                   f"'CUDA driver version is insufficient for CUDA runtime version'; upgrade "
                   f"the host driver to {floor} or later, or use an image built for an older "
                   f"CUDA")


def check_fit(facts: ImageFacts, host: Host) -> Verdict:
    m = facts.model
    if m is None:
        return Verdict("model fits", SKIP, "the image names no model")
    if m.size_gb is None or m.tensor_parallel is None:
        return Verdict("model fits", SKIP, f"model {m.alias}: size or tensor-parallel size "
                                           f"unknown")
    tp = m.tensor_parallel
    if len(host.gpus) < tp:
        return Verdict("model fits", FAIL,
                       f"model {m.alias} is served at TP {tp} but this host has "
                       f"{len(host.gpus)} GPU(s); the engine cannot start fewer ranks than "
                       f"its tensor-parallel size")
    per_gpu = m.size_gb * 1e9 / tp
    over, unknown = [], []
    for g in host.gpus[:tp]:
        if g.memory_total_mib is None:
            unknown.append(f"GPU{g.index}")
            continue
        allowed = g.memory_total_mib * 2**20 * WEIGHTS_HEADROOM
        if per_gpu > allowed:
            over.append(f"GPU{g.index} {g.name} has {_gib(g.memory_total_mib)}")
    basis = (f"weights only: {m.size_gb:g} GB / TP {tp} = {_gib_bytes(per_gpu)} per GPU, "
             f"allowed <= {WEIGHTS_HEADROOM:.0%} of each GPU's total memory (KV cache and "
             f"activations not counted)")
    if over:
        return Verdict("model fits", FAIL, f"model {m.alias} does not fit: {'; '.join(over)}; "
                                           f"{basis}")
    if unknown:
        return Verdict("model fits", WARN,
                       f"{', '.join(unknown)} report no memory.total ([N/A]: unified memory), "
                       f"fit not checked there; {basis}")
    smallest = min(g.memory_total_mib or 0 for g in host.gpus[:tp])
    return Verdict("model fits", PASS, f"model {m.alias} fits GPU0-{tp - 1} (smallest "
                                       f"{_gib(smallest)}); {basis}")


def check_taken(facts: ImageFacts, host: Host) -> Verdict:
    used_set = {g.index for g in _tp_gpus(facts, host)}
    taken_fail, taken_warn = [], []
    for g in host.gpus:
        procs = [p for p in host.processes if p.gpu_uuid and p.gpu_uuid == g.uuid]
        held = max(g.memory_used_mib or 0, sum(p.used_mib or 0 for p in procs))
        if held <= TAKEN_THRESHOLD_MIB:
            continue
        if procs:
            who = ", ".join(f"pid {p.pid} {p.name} holds {_gib(p.used_mib or 0)}"
                            for p in sorted(procs, key=lambda p: -(p.used_mib or 0)))
        elif host.apps_visible:
            who = ("no process listed: inside a container other containers' and the host's "
                   "processes are hidden; run `nvidia-smi` on the host to name it")
        else:
            who = "processes not visible (compute-apps query failed)"
        line = f"GPU{g.index} has {_gib(held)} in use ({who})"
        (taken_fail if g.index in used_set else taken_warn).append(line)
    if not taken_fail and not taken_warn:
        return Verdict("gpus free", PASS, f"no GPU holds more than {_gib(TAKEN_THRESHOLD_MIB)} "
                                          f"of other processes' memory")
    sglang = _sglang_rule(facts, host)
    if taken_fail:
        detail = "; ".join(taken_fail) + ". " + sglang + (
            " Stop the process (or pick other GPUs with CUDA_VISIBLE_DEVICES) and launch again.")
        if taken_warn:
            detail += " Outside the server's GPUs: " + "; ".join(taken_warn) + "."
        return Verdict("gpus free", FAIL, detail)
    return Verdict("gpus free", WARN, "; ".join(taken_warn) + " (outside the first "
                                      f"{len(used_set)} GPUs the server uses)")


def _sglang_rule(facts: ImageFacts, host: Host) -> str:
    gpus = [g for g in _tp_gpus(facts, host) if g.memory_total_mib is not None]
    base = ("SGLang refuses to start tensor parallelism when one rank's free memory is below "
            f"{SGLANG_BALANCE_RATIO:.0%} of another's: 'The memory capacity is unbalanced. "
            "Some GPUs may be occupied by other processes.'")
    if len(gpus) < 2:
        return base + " (single GPU here: the engine starts, with less memory for KV cache)."
    free = [(g.memory_total_mib or 0) - (g.memory_used_mib or 0) for g in gpus]
    lo, hi = min(free), max(free)
    if lo < SGLANG_BALANCE_RATIO * hi:
        return base + (f" Here: min free {_gib(lo)} < {SGLANG_BALANCE_RATIO:.0%} of "
                       f"{_gib(hi)}, so SGLang would reject the launch.")
    return base + (f" Here min free {_gib(lo)} is within {SGLANG_BALANCE_RATIO:.0%} of "
                   f"{_gib(hi)}, but the engine would size its KV cache to the fullest GPU.")


def check_cpu(facts: ImageFacts, host: Host) -> Verdict:
    """The image's binaries are for this host's CPU: an aarch64 image (Grace, DGX Spark) on an
    x86_64 host stops at its first exec with "exec format error", and the reverse likewise."""
    if facts.cpu_arch is None or host.cpu_arch is None:
        return Verdict("cpu", SKIP, "unknown: " + ("the image names no CPU arch"
                                                   if facts.cpu_arch is None else
                                                   "`uname -m` did not answer"))
    if facts.cpu_arch == host.cpu_arch:
        return Verdict("cpu", PASS, f"{facts.cpu_arch} image on an {host.cpu_arch} host")
    return Verdict("cpu", FAIL, f"{facts.cpu_arch} image on an {host.cpu_arch} host: its "
                                f"programs do not run here (exec format error); use the "
                                f"image for {host.cpu_arch} (`imgbuild pull TARGET --platform "
                                f"linux/{'arm64' if host.cpu_arch == 'aarch64' else 'amd64'}`"
                                f" where the target has one)")


def check_disk(facts: ImageFacts, host: Host) -> Verdict:
    m = facts.model
    if m is None or m.size_gb is None:
        return Verdict("disk", SKIP, "the image names no model to download")
    need = m.size_gb * 1e9
    if host.disk_free_bytes is None:
        return Verdict("disk", SKIP, "model directory not given or not measurable")
    where = host.disk_path or "?"
    if host.disk_free_bytes >= need:
        return Verdict("disk", PASS, f"{_gib_bytes(host.disk_free_bytes)} free at {where} >= "
                                     f"{m.size_gb:g} GB for {m.alias}")
    return Verdict("disk", FAIL,
                   f"{_gib_bytes(host.disk_free_bytes)} free at {where} < {m.size_gb:g} GB "
                   f"({_gib_bytes(need)}) for {m.alias}; the download would stop part way. "
                   f"Free space, or point --model-dir / IMGBUILD_MODEL_DIR at a larger disk "
                   f"(or at the directory where the model is already downloaded)")


def verdicts(facts: ImageFacts, host: Host) -> list[Verdict]:
    """Every check, in the order a person fixes them: GPU visible, arch, driver, fit, memory
    held by others, disk. A host without a usable GPU gets `skip`s, never `pass`es, for the
    GPU checks (a CPU image passes those: it needs no GPU)."""
    disk = check_disk(facts, host)
    cpu = check_cpu(facts, host)
    if facts.cpu_only:
        gpu_line = Verdict("nvidia-smi", SKIP, "CPU image: GPUs not needed" + (
            "" if host.gpus else f" ({host.error})" if host.error else ""))
        return [cpu, gpu_line, check_arch(facts, host), check_driver(facts, host),
                Verdict("model fits", SKIP, "CPU image"), Verdict("gpus free", SKIP,
                                                                  "CPU image"), disk]
    if not host.gpus:
        why = host.error or "no NVIDIA GPU"
        skip = f"skipped: no NVIDIA GPU / {why}"
        return [cpu, Verdict("nvidia-smi", SKIP, f"no NVIDIA GPU: {why}; {NO_GPU_HINT}"),
                Verdict("arch", SKIP, skip), Verdict("driver", SKIP, skip),
                Verdict("model fits", SKIP, skip), Verdict("gpus free", SKIP, skip), disk]
    names = sorted({g.name for g in host.gpus})
    seen = f"{len(host.gpus)} GPU(s): {', '.join(names)}; driver {host.driver or 'unknown'}"
    if host.notes:
        seen += "; " + "; ".join(host.notes)
    return [cpu, Verdict("nvidia-smi", PASS, seen), check_arch(facts, host),
            check_driver(facts, host), check_fit(facts, host), check_taken(facts, host), disk]


def run(facts: ImageFacts, *, nvidia_smi: str | None = None, runner: Runner | None = None,
        model_dir: str | os.PathLike[str] | None = None) -> Report:
    host = probe(nvidia_smi=nvidia_smi, runner=runner, model_dir=model_dir)
    return Report(facts, host, tuple(verdicts(facts, host)))



# ----------------------------------------------------------------------------------------------
# The container itself: who it runs as, where it writes, whether JIT code can run from there
# ----------------------------------------------------------------------------------------------

# Where the catalog's sentences for these failures lie in an image (beside this file). They are
# images/checks/failures.yaml's own text, extracted by imgbuild.catalog.failures and checked
# against it by the tests: one wording, whichever side says it.
SENTENCES_FILE = "doctor-sentences.json"
# getpass.getuser() reads these first, in this order; an empty value counts as unset.
USER_VARS = ("LOGNAME", "USER", "LNAME", "USERNAME")
# The caches (anyuser.CACHES) whose files are loaded as code: torch's extensions and inductor,
# Triton, FlashInfer, DeepGEMM, TVM FFI. A noexec mount under them breaks the first JIT kernel.
JIT_CACHES = ("triton", "torchinductor", "torch-extensions", "flashinfer", "deep-gemm", "tvm-ffi")


def check_user(uid: int, passwd_name: str | None, env: Mapping[str, str]) -> tuple[Verdict, Said | None]:
    """A UID with no passwd entry is fine while a user-name variable answers getpass; with
    none set, getpass.getuser() (torch's inductor cache directory, the engines) raises."""
    named = next((f"{v}={env[v]}" for v in USER_VARS if env.get(v)), None)
    if passwd_name is not None:
        return Verdict("user", PASS, f"uid {uid} ({passwd_name})"), None
    if named is not None:
        return Verdict("user", PASS, f"uid {uid} has no passwd entry; {named} answers for "
                                     "it"), None
    return (Verdict("user", WARN, f"uid {uid} has no passwd entry and none of "
                                  f"{', '.join(USER_VARS)} is set: getpass.getuser() fails"),
            Said("uid-without-passwd-entry", (("uid", str(uid)),)))


def resolve_caches(env: Mapping[str, str], home: str, tmp: str,
                   user: str) -> list[tuple[str, str, str]]:
    """(name, variable, path) of every cache anyuser.CACHES names, as its tool resolves it: its
    variable when set, else its default under HOME (torch's inductor: TMP/torchinductor_USER)."""
    out = []
    for name, var, default in CACHES:
        if env.get(var):
            path = env[var]
        elif var == "TORCHINDUCTOR_CACHE_DIR":
            path = os.path.join(tmp, f"torchinductor_{user}")
        elif default is not None and default.startswith("/"):
            path = default
        elif default is not None and home:
            path = os.path.join(home, default)
        else:
            continue  # HOME itself, or a default under HOME, with HOME unset: nothing to check
        out.append((name, var, path))
    return out


def can_write(path: str) -> str | None:
    """None when files can be made in `path` or, where it does not exist yet, in the nearest
    directory above it that does; else why not. It makes nothing: the entrypoint runs it on
    every start, and a check leaves no directories behind (access(2) also answers for a
    read-only filesystem)."""
    p = os.path.abspath(path)
    while True:
        try:
            exists = os.path.exists(p)
        except OSError:
            exists = False
        if exists:
            break
        parent = os.path.dirname(p)
        if parent == p:
            return f"no directory of {path} exists"
        p = parent
    if not os.path.isdir(p):
        return f"{p} is not a directory ({path})"
    if os.access(p, os.W_OK | os.X_OK):
        return None
    try:
        ro = os.statvfs(p).f_flag & os.ST_RDONLY
    except OSError:
        ro = 0
    return f"{'read-only file system' if ro else 'permission denied'} at {p} ({path})"


def check_caches(results: Sequence[tuple[str, str, str | None]]) -> tuple[Verdict, Said | None]:
    """results: (variable, path, why it cannot be written or None) for each cache. The first
    unwritable one is the failure the server meets; every one is named."""
    bad = [(var, path, why) for var, path, why in results if why is not None]
    if not bad:
        return Verdict("caches", PASS, f"{len(results)} cache and JIT directories writable"), None
    named = "; ".join(f"{var}: {why}" for var, path, why in bad)
    return (Verdict("caches", WARN, f"not writable: {named}"),
            Said("cache-dir-not-writable", (("path", bad[0][1]),)))


def parse_mounts(text: str) -> list[tuple[str, frozenset[str]]]:
    """(mount point, options) of each line of /proc/mounts (octal escapes such as \040 for a
    space decoded)."""
    out = []
    for line in text.splitlines():
        parts = line.split()
        if len(parts) < 4:
            continue
        point = re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), parts[1])
        out.append((point, frozenset(parts[3].split(","))))
    return out


def mount_of(path: str, mounts: Sequence[tuple[str, frozenset[str]]]) -> tuple[str, frozenset[str]] | None:
    """The mount a path lies on: the longest mount point that is the path or a parent of it
    (the last such line when one is mounted over another)."""
    best: tuple[str, frozenset[str]] | None = None
    path = os.path.normpath(path)
    for point, opts in mounts:
        inside = point == "/" or path == point or path.startswith(point.rstrip("/") + "/")
        if inside and (best is None or len(point) >= len(best[0])):
            best = (point, opts)
    return best


def check_exec(dirs: Sequence[tuple[str, str]],
               mounts: Sequence[tuple[str, frozenset[str]]]) -> tuple[Verdict, Said | None]:
    """dirs: (variable, path) of the JIT caches. Code built into a noexec mount cannot be
    loaded ("failed to map segment from shared object")."""
    bad = []
    for var, path in dirs:
        m = mount_of(path, mounts)
        if m is not None and "noexec" in m[1]:
            bad.append((var, path, m[0]))
    if not bad:
        return Verdict("jit exec", PASS, f"{len(dirs)} JIT directories on mounts that allow "
                                         "exec"), None
    where = sorted({point for _, _, point in bad})
    return (Verdict("jit exec", WARN, f"{', '.join(var for var, _, _ in bad)} on "
                                      f"{', '.join(where)}, mounted noexec: JIT-built kernels "
                                      "there cannot be loaded"),
            Said("jit-noexec-tmp", (("so", bad[0][1]),)))


def container_checks(env: Mapping[str, str] | None = None,
                     mounts_text: str | None = None) -> list[tuple[Verdict, Said | None]]:
    """The checks above on this process: its UID and passwd entry, its caches (made and
    written, as anyuser.py does), /proc/mounts."""
    import pwd
    import tempfile

    env = os.environ if env is None else env
    uid = os.getuid()
    try:
        passwd_name: str | None = pwd.getpwuid(uid).pw_name
    except KeyError:
        passwd_name = None
    user = next((env[v] for v in USER_VARS if env.get(v)), passwd_name or f"uid_{uid}")
    caches = resolve_caches(env, env.get("HOME", ""), tempfile.gettempdir(), user)
    if mounts_text is None:
        try:
            mounts_text = Path("/proc/mounts").read_text()
        except OSError:
            mounts_text = ""
    return [check_user(uid, passwd_name, env),
            check_caches([(var, path, can_write(path)) for name, var, path in caches]),
            check_exec([(var, path) for name, var, path in caches if name in JIT_CACHES],
                       parse_mounts(mounts_text))]


# The catalog's template rules (imgbuild/catalog/failures.py fill), for the sentences shipped
# here: a [[with {value}||without]] segment takes its first wording only when every value it
# names is given; {name} is filled in, an unset one left empty.
_SEGMENT = re.compile(r"\[\[(.*?)(?:\|\|(.*?))?\]\]", re.S)


class _Blank(dict):
    def __missing__(self, key: str) -> str:
        return ""


def fill(template: str, values: Mapping[str, str]) -> str:
    def names(text: str) -> list[str]:
        return [n for _, n, _, _ in string.Formatter().parse(text) if n]

    def choose(m: re.Match[str]) -> str:
        with_, without = m.group(1), m.group(2) or ""
        return with_ if all(n in values for n in names(with_)) else without
    return _SEGMENT.sub(choose, template).format_map(_Blank(values))


def load_sentences(path: str | os.PathLike[str] | None = None) -> dict[str, dict[str, str]]:
    """The catalog's title, cause and fix of each failure the container checks can find."""
    p = Path(path) if path is not None else Path(__file__).resolve().with_name(SENTENCES_FILE)
    with open(p, encoding="utf-8") as f:
        return json.load(f)


def doctor_text(said: Said, sentences: Mapping[str, Mapping[str, str]]) -> str:
    """What `imgbuild doctor` would answer for this failure, as the entrypoint prints it."""
    s = sentences.get(said.failure)
    values = dict(said.values)
    if s is None:  # an image whose sentences file lacks the id: still name the failure
        return f"imgbuild doctor: {said.failure}"
    return (f"imgbuild doctor: {said.failure}: {fill(s['title'], values)}\n"
            f"  {fill(s['cause'], values)}\n"
            f"  Fix: {fill(s['fix'], values)}")


# ----------------------------------------------------------------------------------------------
# Output and entry points
# ----------------------------------------------------------------------------------------------


def format_table(vs: Sequence[Verdict]) -> str:
    """Plain text (images have no rich): one line a check, details wrapped under it."""
    import textwrap

    width = max(len(v.check) for v in vs) if vs else 5
    lines = []
    for v in vs:
        head = f"{v.status.upper():<4}  {v.check:<{width}}  "
        wrapped = textwrap.wrap(v.detail, 100 - len(head)) or [""]
        lines.append(head + wrapped[0])
        lines.extend(" " * len(head) + w for w in wrapped[1:])
    return "\n".join(lines)


def load_facts(path: str | os.PathLike[str]) -> ImageFacts:
    with open(path, encoding="utf-8") as f:
        return ImageFacts.from_dict(json.load(f))


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="preflight.py", description=__doc__.split("\n\n")[0])
    ap.add_argument("--facts", default=os.environ.get("IMGBUILD_FACTS", FACTS_PATH),
                    help=f"the image's facts file (default {FACTS_PATH})")
    ap.add_argument("--model-dir", default=None,
                    help="where the model will be stored (default IMGBUILD_MODEL_DIR, else the "
                         "Hugging Face cache)")
    ap.add_argument("--json", action="store_true", help="print a JSON report")
    ap.add_argument("--nvidia-smi", default=None, help="the nvidia-smi binary to run")
    ap.add_argument("--recording", default=None, help=argparse.SUPPRESS)  # fixture dir: debug
    ap.add_argument("--container", action="store_true",
                    help="also check the container itself: its user, caches and JIT mounts")
    ap.add_argument("--container-only", action="store_true",
                    help="only the container's own checks (the host's were run elsewhere)")
    args = ap.parse_args(argv)
    if args.container_only:
        return _container_main(args.json)
    try:
        facts = load_facts(args.facts)
    except FileNotFoundError:
        print(f"preflight: no facts file at {args.facts}; pass --facts PATH", file=sys.stderr)
        return 2
    except (OSError, ValueError) as e:
        print(f"preflight: {args.facts}: {e}", file=sys.stderr)
        return 2
    runner = recording_runner(args.recording) if args.recording else None
    try:
        report = run(facts, nvidia_smi=args.nvidia_smi, runner=runner,
                     model_dir=args.model_dir or default_model_dir())
        if args.container:
            found = container_checks()
            report = Report(report.image, report.host,
                            report.verdicts + tuple(v for v, _ in found),
                            tuple(x for _, x in found if x is not None))
    except Exception as e:  # noqa: BLE001 - a bug here must not read as a failed host (exit 1)
        print(f"preflight: internal error: {type(e).__name__}: {e}", file=sys.stderr)
        return 3
    if args.json:
        print(json.dumps(report.to_dict(), indent=2))
    else:
        print("imgbuild preflight")
        print(format_table(report.verdicts))
        _print_doctor(report.said)
        print("preflight: " + ("ok" if report.ok else "FAILED: the server would not start "
                                                      "here"))
    return report.exit_code


def _print_doctor(said: Sequence[Said]) -> None:
    """Each failure found in the container, in the doctor's words. Only a warning: the checks
    cannot see everything (a model given as a path needs no Hugging Face cache), so the server
    starts, and its log says the rest."""
    if not said:
        return
    try:
        sentences = load_sentences()
    except (OSError, ValueError):
        sentences = {}
    for x in said:
        print(doctor_text(x, sentences))


def _container_main(as_json: bool) -> int:
    """--container-only: the container's checks, as advice; never stops the server."""
    try:
        found = container_checks()
    except Exception as e:  # noqa: BLE001 - advice must not keep a server from starting
        print(f"preflight: internal error: {type(e).__name__}: {e}", file=sys.stderr)
        return 3
    said = [x for _, x in found if x is not None]
    if as_json:
        print(json.dumps({"verdicts": [asdict(v) for v, _ in found],
                          "doctor": [{"id": x.failure, "values": dict(x.values)}
                                     for x in said]}, indent=2))
    elif said:
        # On stderr, and only when there is something to say: with the host check skipped
        # (`imgbuild run`, --no-preflight) stdout is the server's, or the command's a user
        # runs through the entrypoint.
        with contextlib.redirect_stdout(sys.stderr):
            print("imgbuild preflight (the container)")
            print(format_table([v for v, _ in found]))
            _print_doctor(said)
    return 0


# The image's entrypoint. POSIX sh (images may lack bash). Kept here, not in a separate file,
# because the package ships payload/*.py only and the renderer writes this text into the build
# context. IMGBUILD_PREFLIGHT=0 or a first argument --no-preflight skips the host check (which
# `imgbuild run` runs on the host instead); the container's own checks (its user, caches, JIT
# mounts: only the container can see them) still run as advice, unless
# IMGBUILD_CONTAINER_CHECK=0.
ENTRYPOINT_SH = r"""#!/bin/sh
# imgbuild entrypoint: check the host and this container (preflight.py), then start the
# server ("$@"). Skip the host check with IMGBUILD_PREFLIGHT=0 or --no-preflight as the first
# argument; the container's checks only warn (IMGBUILD_CONTAINER_CHECK=0 skips them too).
if [ "${1:-}" = "--no-preflight" ]; then
    shift
    IMGBUILD_PREFLIGHT=0
fi
py="${IMGBUILD_PYTHON:-}"
if [ -z "$py" ]; then
    if command -v python >/dev/null 2>&1; then py=python; else py=python3; fi
fi
if [ "${IMGBUILD_CONTAINER_CHECK:-1}" != "0" ]; then container=--container; else container=; fi
if [ "${IMGBUILD_PREFLIGHT:-1}" = "0" ]; then
    if [ -n "$container" ]; then
        "$py" "${IMGBUILD_PREFLIGHT_SCRIPT:-/opt/imgbuild/preflight.py}" --container-only \
            || echo "imgbuild: the container check could not run; starting the server." >&2
    fi
else
    "$py" "${IMGBUILD_PREFLIGHT_SCRIPT:-/opt/imgbuild/preflight.py}" \
        --facts "${IMGBUILD_FACTS:-/opt/imgbuild/image.json}" $container
    rc=$?
    if [ "$rc" -eq 1 ]; then
        # 1: a check failed. The server would not start, or would die after the download.
        echo "imgbuild: preflight failed; the server was not started." >&2
        echo "imgbuild: fix the host, or start anyway with IMGBUILD_PREFLIGHT=0" \
             "(docker run -e IMGBUILD_PREFLIGHT=0 ...) or --no-preflight as the first argument." >&2
        exit 1
    elif [ "$rc" -ne 0 ]; then
        # 2: bad facts file, 3: preflight's own error, 127: no python. The check is advice;
        # its own breakage must not keep a working server from starting.
        echo "imgbuild: preflight could not run (exit $rc); starting the server without it." >&2
    fi
fi
if [ "$#" -eq 0 ]; then
    echo "imgbuild: no command to run after preflight" >&2
    exit 2
fi
exec "$@"
"""


if __name__ == "__main__":
    sys.exit(main())
