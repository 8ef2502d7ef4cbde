"""Golden content tags: every shipped target's (and generator's) content tag, as committed.

    python -m tests.golden          # print what this checkout computes
    python -m tests.golden --write  # record it (after a change meant to give new tags)

tests/test_content_key.py recomputes them from the dev venv, from a plain install and from
another working directory and HOME, and fails when any differs: a changed tag means every user
and CI looks for an image nobody pushed, so it must be on purpose.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

FILE = Path(__file__).with_name("content-tags.json")


def compute(images: Path, lockfiles: Path) -> dict[str, str]:
    from imgbuild.plan.decide import make_plan
    from imgbuild.plan.index import make_index_plan
    from imgbuild.workspace import Workspace

    ws = Workspace(images, lockfiles)
    names = sorted(ws.catalog.targets) + sorted(ws.catalog.generators)
    # A multi-platform target's is its index's tag, whose key covers every platform's image.
    return {n: (make_index_plan if n in ws.catalog.targets and ws.catalog.target(n).multi_platform
                else make_plan)(ws, n, resolve=False).content_tag for n in names}


def recorded() -> dict[str, str]:
    return json.loads(FILE.read_text())


def main(argv: list[str]) -> int:
    root = Path(__file__).resolve().parents[2]
    tags = compute(root / "images", root / "lockfiles")
    text = json.dumps(tags, indent=2, sort_keys=True) + "\n"
    if "--write" in argv:
        FILE.write_text(text)
    sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
