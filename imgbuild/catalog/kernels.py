"""Kernel coverage rules (images/checks/kernels.yaml): per engine, which locked packages' shared
objects must carry GPU code for which archs, which are shown only, which compile at launch."""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass
from pathlib import Path

from ..errors import SpecError
from .schema import read_table

KERNELS_FILE = "checks/kernels.yaml"


@dataclass(frozen=True)
class KernelRule:
    package: str
    files: tuple[str, ...]  # fnmatch over wheel member paths; empty: every shared object
    archs: tuple[str, ...]  # the archs that need it; empty: every arch of the target
    why: str
    required: bool

    def applies(self, arch: str) -> bool:
        return not self.archs or arch in self.archs


@dataclass(frozen=True)
class EngineKernels:
    engine: str
    rules: tuple[KernelRule, ...]
    jit: tuple[str, ...]  # packages that carry no code to read: compiled at first launch

    @property
    def packages(self) -> tuple[str, ...]:
        return tuple(dict.fromkeys(r.package for r in self.rules))

    def digest(self) -> str:
        doc = json.dumps(asdict(self), sort_keys=True).encode()
        return "sha256:" + hashlib.sha256(doc).hexdigest()


def load_kernel_rules(images: Path) -> dict[str, EngineKernels]:
    """The rules by engine; none (coverage not judged) for a catalog without the file."""
    if not (Path(images) / KERNELS_FILE).is_file():
        return {}
    doc = read_table(images, (KERNELS_FILE,), "kernel coverage rules")
    doc.reject_unknown({"engines"})
    out: dict[str, EngineKernels] = {}
    for engine, body in doc.get("engines", dict).items():
        ed = doc.sub(f"engines.{engine}", body)
        ed.reject_unknown({"required", "shown", "jit"})
        rules = []
        for group in ("required", "shown"):
            for i, r in enumerate(ed.get(group, list, [])):
                rd = ed.sub(f"{group}[{i}]", r)
                rd.reject_unknown({"package", "files", "archs", "why"})
                archs = rd.str_list("archs")
                bad = [a for a in archs if not (a.startswith("sm") and a[2:].isdigit())]
                if bad:
                    raise SpecError(doc.path, rd.key("archs"), "archs such as sm100", bad[0])
                rules.append(KernelRule(rd.get("package", str), rd.str_list("files"), archs,
                                        rd.get("why", str, ""), group == "required"))
        out[str(engine)] = EngineKernels(str(engine), tuple(rules), ed.str_list("jit"))
    return out
