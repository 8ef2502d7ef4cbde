"""`imgbuild --version` (and `imgbuild version`): imgbuild's version and the built-in catalog it
carries, by digest. Cheap: the catalog's files are hashed and counted, not parsed."""

from __future__ import annotations

from ...catalog.catalog import DATA_FILES
from ...project import imgbuild_version
from ...workspace import builtin_catalog
from ..views import project as views


def run(args, out) -> int:
    b = builtin_catalog()
    info: dict = {"version": imgbuild_version(), "catalog": None}
    if b is not None:
        info["catalog"] = {
            "digest": b.digest(), "path": str(b.images.parent), "images": str(b.images),
            "lockfiles": str(b.lockfiles), "packaged": b.packaged,
            "targets": sum(1 for p in b.images.glob("*.yaml") if p.name not in DATA_FILES),
            "model_profiles": sum(1 for _ in (b.images / "models").glob("*.yaml")),
        }
    views.version(out, info)
    return 0
