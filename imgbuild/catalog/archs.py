"""GPU architecture names: what users type (B200, "RTX PRO 6000", 10.0, sm100) to sm names,
and which compiled archs run on which GPU."""

from __future__ import annotations

import difflib
import re

from ..errors import InputError
from .catalog import Catalog


def _norm(text: str) -> str:
    return re.sub(r"[\s_-]+", "", text.lower()).removeprefix("nvidia").removeprefix("geforce")


def parse_arch(text: str, cat: Catalog) -> str:
    """sm100 | 10.0 | B200 | "RTX PRO 6000" -> "sm100"."""
    t = text.strip()
    if re.fullmatch(r"sm_?\d{2,3}[a-z]?", t.lower()):
        sm = "sm" + t.lower().removeprefix("sm").lstrip("_")
        if sm in cat.archs:
            return sm
    if re.fullmatch(r"\d{1,2}\.\d", t):
        for info in cat.archs.values():
            if info.capability == t:
                return info.sm
    gpu = gpu_named(t, cat)
    if gpu is not None:
        return gpu.sm
    known = sorted({n for g in cat.gpus for n in g.names} | set(cat.archs))
    close = difflib.get_close_matches(t, known, n=1, cutoff=0.6)
    raise InputError(f"unknown GPU architecture '{text}'",
                     facts=["give an sm name (sm90, sm100, sm103, sm120, sm121), a compute "
                            "capability (9.0, 10.0, 12.0) or a GPU name from images/gpus.yaml"],
                     hint=f"did you mean '{close[0]}'?" if close else "see images/gpus.yaml")


def gpu_named(text: str, cat: Catalog):
    """The images/gpus.yaml entry `text` names (B200, "DGX Spark"), or None for an sm name or a
    compute capability."""
    want = _norm(text.strip())
    return next((g for g in cat.gpus for n in g.names if _norm(n) == want), None)
