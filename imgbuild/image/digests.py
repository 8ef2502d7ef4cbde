"""Pin the catalog's nvidia/cuda tags by digest: ask the registry what each tag names now.

Docker Hub speaks the Distribution API behind a token service; a mirror (any registry that
holds the same repository path) can stand in with --mirror. The digests land in
images/bases.yaml (`cuda_images.digests`), where `plan` pins the FROM line with them.
"""

from __future__ import annotations

import re
from pathlib import Path

from ..catalog.catalog import Catalog, load_catalog
from ..errors import EnvError
from ..fsutil import atomic_write_text
from ..workspace import Workspace
from .registry import MANIFEST_TYPES, Repository

HUB_HOST = "registry-1.docker.io"


def _digest(repo: Repository, tag: str) -> str | None:
    """The manifest digest of repo:tag (the registry's challenge answered: Docker Hub gives an
    anonymous pull token for public repositories), or None when the tag does not exist."""
    r = repo.api.request("HEAD", f"{repo.path}/manifests/{tag}", scope=repo.scope("pull"),
                         headers={"Accept": MANIFEST_TYPES}, timeout=(15, 30))
    return r.headers.get("Docker-Content-Digest") if r.status_code == 200 else None


def tags(cat: Catalog) -> list[str]:
    ci = cat.cuda_images
    return sorted({t for r in ci.releases for o in r.os for k in ci.kinds
                   if (t := ci.tag(r.cuda, k, o))})


def refresh(cat: Catalog, *, mirror: str | None = None) -> dict[str, str | None]:
    """{image: digest or None (tag not found)}; EnvError when the registry cannot be reached."""
    out: dict[str, str | None] = {}
    for image in tags(cat):
        name, _, tag = image.rpartition(":")
        repo = Repository.parse(f"{mirror}/{name}" if mirror else f"{HUB_HOST}/{name}")
        try:
            out[image] = _digest(repo, tag)
        except EnvError as e:
            where = repo.host if mirror else f"Docker Hub ({HUB_HOST})"
            raise EnvError(f"{where} is unreachable: the digests stay as they are",
                           facts=[e.message, *e.facts],
                           hint="run it where the registry is reachable, or point --mirror at "
                                "a registry that mirrors nvidia/cuda") from None
    return out


def write(bases_yaml: Path, digests: dict[str, str | None]) -> None:
    """Replace the `digests:` block of cuda_images, keeping every other line and comment."""
    text = bases_yaml.read_text()
    found = {k: v for k, v in sorted(digests.items()) if v}
    block = "  digests:" + (" {}\n" if not found else "\n" + "".join(
        f'    "{k}": "{v}"\n' for k, v in found.items()))
    new, n = re.subn(r"^  digests:(?: \{\})?\n(?:    .*\n)*", block, text, flags=re.M)
    if n != 1:
        raise EnvError(f"{bases_yaml}: found no `digests:` block under cuda_images to update")
    atomic_write_text(bases_yaml, new)


def refresh_catalog(ws: Workspace, *, mirror: str | None = None) -> dict[str, str | None]:
    """`imgbuild base refresh-digests`: ask, write images/bases.yaml, and read it back (what
    was written must still load)."""
    path = ws.spec_file("bases.yaml", "base refresh-digests")
    found = refresh(ws.catalog, mirror=mirror)
    write(path, found)
    load_catalog(ws.images)
    return found
