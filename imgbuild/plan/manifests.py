"""How `imgbuild run --emit` writes what a person reads and applies (the compose file, the
Kubernetes manifests, the admission policy): one YAML style and one write, so that the files
of one run read alike and fail alike."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from ..fsutil import atomic_write_text, cannot_write


class _Dumper(yaml.SafeDumper):
    """Every value written out where it is used: no &anchors / *aliases for a reader to chase
    (a probe and its twin share one dict). Text of several lines (a PEM public key) as the
    block a person pastes (`|`), not a quoted line of `\\n`s."""

    def ignore_aliases(self, data: Any) -> bool:
        return True


_Dumper.add_representer(str, lambda d, v: d.represent_scalar(
    "tag:yaml.org,2002:str", v, style="|" if "\n" in v else None))


def dump(doc: dict[str, Any]) -> str:
    """One document as YAML, its keys in the order they were written."""
    return yaml.dump(doc, Dumper=_Dumper, sort_keys=False, default_flow_style=False, width=100)


def write(path: Path, text: str) -> None:
    """Write a launch file whole (a reader sees the old file or the new one); a write the
    machine refuses is the one error that names the file and leaves it as it was."""
    try:
        atomic_write_text(path, text)
    except OSError as e:
        raise cannot_write(path, e, "a launch file") from None
