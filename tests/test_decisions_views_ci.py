"""What `imgbuild outdated` and `imgbuild relock` show people, as reviewed: each package's news
(current, available with its lock changes, blocked and by whom, held, not checked), the base
images', the relock line to run for each and the lock diff it would make, the errors; and what
a relock wrote. Plain lines and JSON, compared with tests/golden/ci/ (`make golden` records
them after a change meant to change them).

The news is plain data here: tests/test_outdated.py makes it from real indexes and locks."""

from __future__ import annotations

import json

from imgbuild.ci import outdated as o
from imgbuild.cli.views import ci as views

from . import golden

NEWS = [o.TargetNews(
    "sglang-blackwell", "sglang", "lockfiles/sglang-blackwell.lock",
    packages=(
        o.PackageNews("sglang", "engine", "0.5.16", ("0.5.17", "0.5.18"), "blocked",
                      available="0.5.17",
                      blocked_by=("sglang 0.5.18 needs torch==2.10.0",
                                  "the target pins torch==2.9.1"),
                      changes=(o.Change("sglang", "0.5.16", "0.5.17"),
                               o.Change("sgl-kernel", "0.3.20", "0.3.21"))),
        o.PackageNews("numpy", "dependency", "2.1.0", (), "current"),
        o.PackageNews("flashinfer-python", "pinned", "0.5.3", ("0.6.0",), "held",
                      note="a patch fits 0.5.x [only]"),
        o.PackageNews("triton", "dependency", None, (), "unknown",
                      note="the index did not answer"),
        o.PackageNews("compressed-tensors", "dependency", "0.12.2", ("0.13.0",), "available",
                      available="0.13.0",
                      changes=(o.Change("compressed-tensors", "0.12.2", "0.13.0"),
                               o.Change("old-dep", "1.0", None),
                               o.Change("new-dep", None, "2.0")))),
    bases=(o.BaseNews("nvidia/cuda:13.0.0-cudnn-devel-ubuntu24.04", "newer",
                      ("13.0.1-cudnn-devel-ubuntu24.04", "13.0.2-cudnn-devel-ubuntu24.04"),
                      note="same major"),
           o.BaseNews("debian:bookworm", "not checked")),
    errors=("pypi.org: timed out",))]
RELOCKED = o.RelockResult("tiny-cpu", "lockfiles/tiny-cpu.lock", ("images/tiny-cpu.yaml: x",),
                          (o.Change("numpy", "2.1.0", "2.1.1"),), True,
                          note="wrote [lockfiles/tiny-cpu.lock]")
NOTHING = o.RelockResult("tiny-cpu", "lockfiles/tiny-cpu.lock", (), (), False)


GOLDEN = golden.page_folder(__name__)


def pages() -> dict[str, str]:
    return {"outdated.txt": golden.shown(views.outdated_news, NEWS),
            "relock.txt": golden.shown(views.relock, RELOCKED),
            "relock-nothing.txt": golden.shown(views.relock, NOTHING)}


def test_outdated_and_relock_show_what_they_showed_when_reviewed():
    GOLDEN.check(pages())


def test_a_base_images_tag_is_folded_whole_never_cut():
    page = pages()["outdated.txt"]
    assert "…" not in page
    assert "13.0.2-cudnn-devel-ubuntu24.04" in "".join(
        ln.split("│")[3].strip() for ln in page.splitlines() if ln.count("│") == 5)


def test_the_json_is_the_news_and_the_results_own_dict():
    got = golden.shown(views.outdated_news, NEWS, as_json=True)
    assert json.loads(got) == json.loads(json.dumps(o.to_dict(NEWS)))
    got = golden.shown(views.relock, RELOCKED, as_json=True)
    assert json.loads(got) == json.loads(json.dumps(RELOCKED.to_dict()))
