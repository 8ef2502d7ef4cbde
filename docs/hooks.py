"""MkDocs hook: adds the generated pages (imgbuild/docsgen.py) to the site when it is built.

The command-line, catalog, failure and exit-code references and the performance plots are
made from the code and data they describe, on every build. The references' reviewed text is
kept in tests/golden/reference/, which tests/test_docs.py compares them with."""

from __future__ import annotations

from pathlib import Path

from mkdocs.structure.files import File, Files

from imgbuild import docsgen


def on_files(files: Files, config) -> Files:
    root = Path(config.config_file_path).resolve().parent
    for path, content in docsgen.generate(root).items():
        old = files.get_file_from_path(path)
        if old is not None:
            files.remove(old)
        files.append(File.generated(config, path, content=content))
    return files
