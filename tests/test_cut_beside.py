"""A cut splice runs two builds side by side (pipeline/obtain.py _cut_splice): the rest install,
whose filesystem is streamed out of BuildKit and cut, and beside it the top without the rest
install, built, checked and sent. The cut waits for the top (it needs the layers under it), so
whatever stops the top must stop the rest install too, and the user must see why.

Here the two builds are stand-ins, so that each can be made to fail at will: the top's is a
function, the rest install's keeps docker_build's tar_sink contract (the sink is handed the
stream at once; an error there stops the build and is raised; a failed step is raised over the
sink's error). tests/test_splice.py runs the real ones, on a Docker Engine and a registry."""

from __future__ import annotations

import os
import threading
import time

import docker
import pytest

from imgbuild.errors import EnvError, JobFailed
from imgbuild.image import layercut, registry, wire
from imgbuild.image.buildkit import BuildResult
from imgbuild.image.compression import GZIP
from imgbuild.pipeline import obtain

from .progress_notes import Notes

TOP = "127.0.0.1:9/bench:t-top"




class Images:
    def __init__(self, have_top: bool) -> None:
        self.have_top = have_top
        self.removed: list[str] = []

    def get(self, ref: str):
        if not self.have_top:
            raise docker.errors.ImageNotFound(ref)
        return object()

    def remove(self, ref: str, noprune: bool = False) -> None:
        self.removed.append(ref)


class Client:
    def __init__(self, have_top: bool) -> None:
        self.images = Images(have_top)


class RestBuild:
    """The rest install's build: `seconds` of install unless its sink stops it first, then the
    tar (empty here) and its end; `fails`, a failed step."""

    def __init__(self, seconds: float = 30.0, fails: Exception | None = None) -> None:
        self.seconds = seconds
        self.fails = fails
        self.stopped = threading.Event()

    def __call__(self, *args, rest: str, tar_sink, **kw) -> BuildResult:
        assert rest == "last" and tar_sink is not None
        r, w = os.pipe()
        errors: list[BaseException] = []

        def drain() -> None:
            try:
                with os.fdopen(r, "rb") as f:
                    tar_sink(f)
            except BaseException as e:
                errors.append(e)
                self.stopped.set()  # docker_build kills the build

        t = threading.Thread(target=drain)
        t.start()
        self.stopped.wait(self.seconds if self.fails is None else 0.2)
        os.close(w)
        t.join()
        if self.fails is not None:
            raise self.fails
        if errors:
            raise errors[0]
        return BuildResult("", 1.0, 1, 0, (), "")


def cut_splice(monkeypatch, top, rest: RestBuild, *, have_top: bool = False):
    """_cut_splice with the stand-ins; (what it returned or raised, the notes, the client)."""
    monkeypatch.setenv("IMGBUILD_BLOB_CACHE_GB", "0")
    monkeypatch.setattr(obtain, "_base_ready", lambda *a: None)
    monkeypatch.setattr(obtain, "_make_top", top)
    monkeypatch.setattr(obtain, "build_image", rest)
    notes, client = Notes(), Client(have_top)
    out: list = []

    def run() -> None:
        try:
            out.append(obtain._cut_splice(None, None, None, client,
                                          registry.Repository.parse("127.0.0.1:9/bench"),
                                          None, TOP, refs=(), comp=GZIP, smoke_dir=None,
                                          log_dir=None, cache_from=(), progress=notes))
        except BaseException as e:
            out.append(e)

    t = threading.Thread(target=run, daemon=True)
    t.start()
    t.join(20)
    assert out, "the cut splice did not end: the rest install waits on a top that never came"
    return out[0], notes, client


def failing_top(error: Exception, after: float = 0.2):
    def top(*args, progress, **kw):
        progress.note("  done [2/6] COPY payload/")
        time.sleep(after)
        raise error
    return top


def test_a_top_that_does_not_fit_the_donor_stops_the_rest_install(monkeypatch):
    rest = RestBuild()
    got, notes, _ = cut_splice(monkeypatch, failing_top(obtain._Whole("the base differs")), rest)
    assert isinstance(got, obtain._Whole) and str(got) == "the base differs"
    assert rest.stopped.is_set()  # not left to install for its 30 s
    # The top's own lines come after the build on the screen, under a heading.
    assert notes.said[0].startswith(f"beside it, {TOP}") and "COPY payload/" in notes.said[1]


def test_a_top_the_cut_does_not_fit_leaves_the_rest_layer_to_the_top(monkeypatch):
    rest = RestBuild()
    got, notes, _ = cut_splice(monkeypatch, failing_top(layercut.NotCut("not this install")),
                               rest)
    assert got is None and rest.stopped.is_set()
    assert notes.said[-1] == "the rest layer is built into the top: not this install"


def test_a_failed_top_is_the_error_the_user_sees(monkeypatch):
    failed = JobFailed("docker build failed at [5/6] COPY payload/ (exit code 1)")
    rest = RestBuild()
    got, _, _ = cut_splice(monkeypatch, failing_top(failed), rest)
    assert got is failed and rest.stopped.is_set()


def test_a_failed_rest_install_is_the_error_and_the_top_is_not_left_behind(monkeypatch):
    failed = JobFailed("docker build failed at [4/4] RUN uv pip install (exit code 2)")

    def top(*args, progress, **kw):
        progress.note("  done [2/6] COPY payload/")
        return obtain._Top(BuildResult("", 1.0, 1, 0, (), ""),
                           wire.Layers("", (), (), None, 0, 0, 0, 0), 0, {}, 1, 0, ())

    got, notes, client = cut_splice(monkeypatch, top, RestBuild(fails=failed), have_top=True)
    assert got is failed
    assert client.images.removed == [TOP]
    assert any("COPY payload/" in n for n in notes.said)


@pytest.mark.parametrize("stage", ["top", "layers under it"])
def test_whatever_stops_the_top_stops_the_cut(monkeypatch, stage):
    """The layers under the rest install are read after the top is sent: an error there stops
    the rest install as the top's own does."""
    rest = RestBuild()
    gone = OSError("registry gone")
    if stage == "top":
        top = failing_top(gone)
    else:
        def top(*args, progress, **kw):
            # One layer under the cut, from a registry that is not there.
            return obtain._Top(BuildResult("", 1.0, 1, 0, (), ""),
                               wire.Layers("", ("sha256:" + "0" * 64,),
                                           ({"mediaType": GZIP.media_type,
                                             "digest": "sha256:" + "1" * 64, "size": 1},),
                                           None, 0, 0, 0, 0), 0, {}, 1, 1, ())
    got, _, _ = cut_splice(monkeypatch, top, rest)
    if stage == "top":
        assert got is gone
    else:  # the read of that layer, not anything after it (the cut, its upload)
        assert isinstance(got, EnvError) and "unreachable" in str(got)
        assert f"/blobs/sha256:{'1' * 64}" in " ".join(got.facts)
    assert rest.stopped.is_set()
