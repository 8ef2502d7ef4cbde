"""A model profile's quantization as list and plan show it."""

from __future__ import annotations

from typing import Any

from ...catalog.models import ModelProfile

# What `imgbuild list` says of a profile that leaves its quantization to the checkpoint: list
# reads the catalog only (offline, fast), never a checkpoint.
FROM_CONFIG = "from config.json"


def quantization(m: ModelProfile) -> dict[str, Any]:
    """method, formats, activations and summary; `from_checkpoint` says whether they are the
    checkpoint's config.json's (not yet read in an unresolved profile: all but the summary
    are then null)."""
    read = not m.quant_from_checkpoint or bool(m.quant_summary)
    return {"method": m.quant_method, "formats": list(m.quant_formats),
            "activations": m.activations,
            "summary": m.quant_summary if read else FROM_CONFIG,
            "from_checkpoint": m.quant_from_checkpoint}


def quantization_cell(m: ModelProfile) -> str:
    return m.quant_summary or (FROM_CONFIG if m.quant_from_checkpoint else "")
