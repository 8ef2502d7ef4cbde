"""The built-in catalog travels in the wheel: images/ and lockfiles/ are copied into the package
(imgbuild/builtin/) when the wheel is built, so the repository keeps one copy of them and an
installed imgbuild needs no checkout. An editable install reads the checkout's own directories
(imgbuild/workspace.py: builtin_catalog), so nothing is copied for it."""

import shutil
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

ROOT = Path(__file__).resolve().parent
CATALOG_DIRS = ("images", "lockfiles")


class BuildWithCatalog(build_py):
    def run(self) -> None:
        super().run()
        if self.editable_mode:
            return
        dest = Path(self.build_lib) / "imgbuild" / "builtin"
        for name in CATALOG_DIRS:
            if (dest / name).exists():
                shutil.rmtree(dest / name)  # a file removed from the catalog leaves the wheel too
            shutil.copytree(ROOT / name, dest / name,
                            ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))


setup(cmdclass={"build_py": BuildWithCatalog})
