"""Golden content tags: every shipped target's (and generator's) content tag, as committed.
And the generated reference pages (imgbuild/docsgen.py), as reviewed.

    python -m tests.golden          # print what this checkout computes
    python -m tests.golden --write  # record it (after a change meant to give new tags or text)

tests/test_content_key.py recomputes them from the dev venv, from a plain install and from
another working directory and HOME, and fails when any differs: a changed tag means every user
and CI looks for an image nobody pushed, so it must be on purpose.

tests/test_docs.py compares the command-line, catalog, failure and exit-code references with
reference/*.md here: what a user reads in `--help` and on the site changes only where a
reviewer saw it change (the site itself is still generated when it is built). The command
line's usage lines are argparse's, whose layout differs between Python minors: REFERENCE_PYTHON
says which one made them.

tests/test_matrix.py compares the CI matrix documents of the shipped targets (`imgbuild matrix
--format json|github|bake`, for a registry repository) with matrix/ here: each job's runner,
refs, lock and base, the workflow's matrix values, and each Bake target's Dockerfile, labels,
index flags and cache entries are what CI reads, and a change to any is seen in review.

tests/test_decisions_emit.py compares what `imgbuild run --emit k8s|compose` writes for a
cluster or compose, for a few targets and options, with emit/ here.

tests/test_decisions_views_plan.py compares what `imgbuild list` and `imgbuild plan` show
(plain lines and JSON) with cli/ here.

tests/test_decisions_imagepolicy.py compares the admission policies and TrustRoot that
`imgbuild run --emit k8s` writes for a signed-by policy (their names, headers and trust root)
with admission/ here.

tests/test_decisions_views_ci.py compares what `imgbuild outdated` and `imgbuild relock` show
with ci/ here.

tests/test_decisions_views_build.py compares what `imgbuild build` shows when it ends (an
image, an index; plain and JSON) with build/ here.

tests/test_decisions_index_attestations.py compares the SBOM and provenance a multi-platform
index is attested with with attest/ here.

tests/test_decisions_engine_behaviour.py compares what check-model holds each engine version
to (behaviours, fixes, patches, model classes' mappings) with checkmodel/ here.

tests/test_decisions_refusals.py compares what each refusal of bad input says (message,
facts, way out, exit code) with refusals.json here.

tests/test_decisions_views_checks.py compares what `imgbuild doctor`, `doctor --host` and
`patches` show people (on a terminal and in a pipe) with views/ here.

tests/test_report.py compares the compatibility report of tiny-cpu and sglang-blackwell
without a registry (its JSON and its page) with report/ here: a cell says what it may claim
from the plan, the lock's kernel record and the failure catalog, and a change to any claim is
seen in review.
"""

from __future__ import annotations

import contextlib
import io
import json
import sys
import tempfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

HERE = Path(__file__).parent
FILE = HERE / "content-tags.json"
REFERENCES = HERE / "reference"
REFERENCE_PYTHON = (3, 11)  # the dev venv's (Makefile PYTHON)
REPORT = HERE / "report"
REPORT_TARGETS = ("tiny-cpu", "sglang-blackwell")
MATRIX = HERE / "matrix"
REFUSALS = HERE / "refusals.json"  # made by tests/test_decisions_refusals.py
MATRIX_REPOSITORY = "ghcr.io/acme/imgbuild"  # a registry host: Bake's cache entries are in


@dataclass(frozen=True)
class PageFolder:
    """A folder of reviewed pages here, made by the `pages()` of the test module that checks
    them. `make golden` walks PAGE_FOLDERS, so a folder that is not named there is never
    written again (tests/test_golden_pages.py fails on one)."""

    name: str  # the folder under tests/golden/, and the name its diffs are given
    maker: str  # the test module whose pages() makes them
    pattern: str = "*"  # which files in the folder are pages ("*/*": a folder per case)

    @property
    def folder(self) -> Path:
        return HERE / self.name

    def recorded(self) -> dict[str, str]:
        """The reviewed pages, by their path in the folder."""
        return {p.relative_to(self.folder).as_posix(): p.read_text()
                for p in sorted(self.folder.glob(self.pattern)) if p.is_file()}

    def make(self) -> dict[str, str]:
        import importlib

        return importlib.import_module(self.maker).pages()

    def check(self, got: dict[str, str]) -> None:
        """Each page made is its reviewed copy, and each reviewed copy is still made."""
        want = self.recorded()
        said = differences(got, want, self.name)
        assert not said, said
        gone = sorted(set(want) - set(got))
        assert not gone, f"recorded pages nothing makes any more (`make golden` drops them): {gone}"


PAGE_FOLDERS = (
    PageFolder("views", "tests.test_decisions_views_checks"),
    PageFolder("emit", "tests.test_decisions_emit", "*/*"),
    PageFolder("cli", "tests.test_decisions_views_plan"),
    PageFolder("admission", "tests.test_decisions_imagepolicy"),
    PageFolder("ci", "tests.test_decisions_views_ci", "*.txt"),
    PageFolder("build", "tests.test_decisions_views_build"),
    PageFolder("attest", "tests.test_decisions_index_attestations", "*.json"),
    PageFolder("checkmodel", "tests.test_decisions_engine_behaviour", "*.json"),
)
# Made here, from the checkout, not by a test module's pages().
MADE_HERE = ("reference", "report", "matrix")


def page_folder(maker: str) -> PageFolder:
    """The folder the test module `maker` (its __name__) makes."""
    [folder] = [f for f in PAGE_FOLDERS if f.maker == maker]
    return folder


def shown(view: Callable[..., object], *args: object, as_json: bool = False,
          terminal: bool = False, width: int = 100, stderr: bool = False) -> str:
    """What `view(output, *args)` shows, as one string: on a terminal (colours, panels) or in
    a pipe (plain lines), at `width` columns. JSON is caught whether the view prints it on
    its console or on stdout itself; with `stderr`, what it says there follows, headed."""
    from rich.console import Console

    from imgbuild.cli.console import Output

    out, err = io.StringIO(), io.StringIO()
    kw = dict(width=width, force_terminal=terminal, color_system="standard" if terminal
              else None, legacy_windows=False, _environ={})
    with contextlib.redirect_stdout(out):
        view(Output(as_json, Console(file=out, **kw), Console(file=err, **kw)), *args)
    return out.getvalue() + (f"--- stderr ---\n{err.getvalue()}"
                             if stderr and err.getvalue() else "")


@contextlib.contextmanager
def scratch(prefix: str) -> Iterator[Path]:
    """A scratch directory to work in: paths a page names relative to it hold nothing of the
    machine that made the page."""
    with tempfile.TemporaryDirectory(prefix=prefix) as d, contextlib.chdir(d):
        yield Path(d)


def run_cli(argv: list[str]) -> tuple[int, str, str]:
    """`imgbuild ARGV` in this process: its exit code, stdout and stderr."""
    from imgbuild.cli.main import main

    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(argv)
    return code, out.getvalue(), err.getvalue()


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


def references(root: Path) -> dict[str, str]:
    """The generated reference pages, by file name."""
    from imgbuild import docsgen

    return {Path(path).name: text for path, text in docsgen.generate(root).items()
            if path.startswith("reference/")}


def recorded_references() -> dict[str, str]:
    return {p.name: p.read_text() for p in sorted(REFERENCES.glob("*.md"))}


def report_pages(images: Path, lockfiles: Path) -> dict[str, str]:
    """The compatibility report of REPORT_TARGETS, no registry: its JSON and its page."""
    from imgbuild.cli.views import report_html
    from imgbuild.pipeline import report as rp
    from imgbuild.workspace import Workspace

    r = rp.collect(Workspace(images, lockfiles), targets=REPORT_TARGETS)
    return {"report.json": json.dumps(r.to_dict(), indent=1, sort_keys=True) + "\n",
            "page.html": report_html.render(r)}


def matrix_documents(images: Path, lockfiles: Path) -> dict[str, str]:
    """`imgbuild matrix` in each format for MATRIX_REPOSITORY, on a host with no mirror index:
    the Bake file's index flags name a mirror the host's environment names."""
    import os

    from imgbuild.ci import matrix
    from imgbuild.lock.wheels import MIRROR_VARS
    from imgbuild.workspace import Workspace

    saved = {v: os.environ.pop(v) for v in MIRROR_VARS if v in os.environ}
    try:
        ws = Workspace(images, lockfiles)
        return {f"{fmt}.json": json.dumps(matrix.document(ws, fmt, repository=MATRIX_REPOSITORY),
                                          indent=1, sort_keys=True) + "\n"
                for fmt in ("json", "github", "bake")}
    finally:
        os.environ.update(saved)


def recorded_matrix() -> dict[str, str]:
    return {p.name: p.read_text() for p in sorted(MATRIX.glob("*.json"))}


def recorded_report() -> dict[str, str]:
    return {p.name: p.read_text() for p in sorted(REPORT.iterdir())}


def differences(got: dict[str, str], want: dict[str, str], what: str) -> str:
    """The first lines of each page's diff from its recorded copy, with the way out; "" when
    every page is the recorded one."""
    import difflib

    stale = ["".join(list(difflib.unified_diff(
        want.get(name, "").splitlines(True), page.splitlines(True), f"golden/{name}",
        f"{what}/{name}"))[:60]) for name, page in got.items() if want.get(name) != page]
    return (f"the {what} pages differ from the reviewed ones (`make golden` records them, if "
            "the change is meant):\n" + "\n".join(stale)) if stale else ""


def _rewrite(folder: Path, pages: dict[str, str]) -> None:
    """folder holds exactly `pages` (NAME or SUBDIR/NAME): a page nothing makes any more goes."""
    import shutil

    shutil.rmtree(folder, ignore_errors=True)
    for name, page in pages.items():
        (folder / name).parent.mkdir(parents=True, exist_ok=True)
        (folder / name).write_text(page)


def main(argv: list[str]) -> int:
    root = Path(__file__).resolve().parents[2]
    images, lockfiles = root / "images", root / "lockfiles"
    tags = compute(images, lockfiles)
    text = json.dumps(tags, indent=2, sort_keys=True) + "\n"
    if "--write" in argv:
        from tests.test_decisions_refusals import page as refusals

        FILE.write_text(text)
        if sys.version_info[:2] != REFERENCE_PYTHON:
            sys.stderr.write(f"reference pages not written: argparse's layout is Python "
                             f"{'.'.join(map(str, REFERENCE_PYTHON))}'s (the dev venv's)\n")
        else:
            _rewrite(REFERENCES, references(root))
        _rewrite(REPORT, report_pages(images, lockfiles))
        _rewrite(MATRIX, matrix_documents(images, lockfiles))
        # The pages made by the test modules that check them (each says what its pages are).
        for folder in PAGE_FOLDERS:
            _rewrite(folder.folder, folder.make())
        REFUSALS.write_text(refusals())
    sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
