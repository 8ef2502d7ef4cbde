"""What a build decides from BuildKit's own words (image/buildkit.py docker_build), without an
Engine: the client is a script that prints a recorded `docker build --progress=plain` log
(tests/data/buildkit/) and exits as the real one did. Decided and tested: each step is said
once done and counted (a cached one counted only); the image id is the one the build wrote; a failed step
fails the build with that step's lines, and the log is kept where asked."""

from __future__ import annotations

from pathlib import Path

import pytest

from imgbuild.errors import JobFailed
from imgbuild.image import buildkit
from imgbuild.image.context import Secrets
from imgbuild.image.daemon import DockerCLI
from imgbuild.plan.decide import make_plan

from .conftest import checkout_workspace
from .progress_notes import Notes

LOGS = Path(__file__).parent / "data" / "buildkit"
IID = "sha256:0b20d199f52258243a848314732cd28aed27a41538aab23d694c41a88f17cf68"


def _client(tmp_path, log: str, rc: int) -> DockerCLI:
    """A client that prints the recorded `log` and exits `rc`, writing the image id where
    --iidfile says (_scripted, below)."""
    return _scripted(tmp_path, (LOGS / log).read_bytes(), rc)


@pytest.fixture(scope="module")
def plan():
    return make_plan(checkout_workspace(), "tiny-cpu", resolve=False)


def _build(plan, tmp_path, monkeypatch, log, rc=0, **kw):
    return _run(plan, tmp_path, monkeypatch, _client(tmp_path, log, rc), **kw)


def test_a_build_says_each_step_done_and_counts_them(plan, tmp_path, monkeypatch):
    got, notes = _build(plan, tmp_path, monkeypatch, "built.log")
    assert (got.image_id, got.steps, got.cached_steps, got.cache_imported) == (IID, 4, 1, ())
    # a step BuildKit found CACHED says no DONE: it is counted, not said
    assert notes.said == ["  done [2/4] RUN echo one > /one",
                          "  done [3/4] RUN echo two > /two && sleep 0.1",
                          "  done [4/4] COPY a.txt /a.txt"]
    assert f"building {plan.content_tag}: [2/4] RUN echo one > /one" in notes.statuses


def test_a_build_from_cache_counts_the_steps_buildkit_found_cached(plan, tmp_path, monkeypatch):
    got, notes = _build(plan, tmp_path, monkeypatch, "built-again-cached.log")
    # BuildKit says the FROM step DONE again, and the three after it CACHED
    assert (got.steps, got.cached_steps) == (4, 3)
    assert notes.said == ["  done [1/4] FROM docker.io/library/imgbuild-base:debian-bookworm-py3.11"]


def test_a_failed_step_fails_the_build_with_its_own_lines(plan, tmp_path, monkeypatch):
    log = tmp_path / "build.log"
    with pytest.raises(JobFailed) as e:
        _build(plan, tmp_path, monkeypatch, "failed-step.log", rc=1, log_path=log)
    assert e.value.message == ('docker build failed at [3/3] RUN echo "something broke" >&2 && '
                               "exit 3 (exit code 1)")
    assert e.value.facts == [f"image {plan.ref()} was not tagged"]
    assert e.value.hint == f"the log tail above shows the failing step; full log in {log}"
    assert e.value.log_tail[-2:] == [
        "#6 0.421 something broke",
        '#6 ERROR: executor failed running [/bin/sh -c echo "something broke" >&2 && exit 3]: '
        "exit code: 3"]
    assert not any("first" in ln for ln in e.value.log_tail)  # the other step's lines: not its
    assert log.read_text() == (LOGS / "failed-step.log").read_text()  # kept whole


def test_what_a_build_asks_beyond_the_default_is_said_in_words():
    from imgbuild.image.buildkit import SOURCE_DATE_EPOCH, Export

    assert Export().describe() == []
    assert Export(reproducible=True, compression="zstd",
                  cache_to="127.0.0.1:5000/acme:buildcache").describe() == [
        f"layers rewritten to SOURCE_DATE_EPOCH={SOURCE_DATE_EPOCH}, zstd, through an OCI "
        "archive", "registry cache (mode=max) to 127.0.0.1:5000/acme:buildcache"]
    assert Export(cache_from=("x",)).describe() == []  # reading a cache asks nothing more


def test_caches_that_could_not_be_read_and_uvs_downloads_are_said_their_way(plan, tmp_path,
                                                                            monkeypatch):
    got, notes = _build(plan, tmp_path, monkeypatch, "cache-from-and-uv.log",
                        cache_from=("127.0.0.1:5000/imgbuild-never-pushed:none",
                                    "127.0.0.1:5999/nowhere:tag"))
    assert (got.steps, got.cached_steps, got.cache_imported) == (3, 1, ())
    # a tag not pushed yet is the usual case and said nothing; an unreachable one is a warning
    assert notes.notes[-1] == (
        "warn", 'no cache read from 127.0.0.1:5999/nowhere:tag: failed to do request: Head '
        '"http://127.0.0.1:5999/v2/nowhere/manifests/tag": dial tcp 127.0.0.1:5999: connect: '
        "connection refused")
    assert not any("never-pushed" in m for m in notes.said)
    tag = plan.content_tag
    assert f"building {tag}: reading the cache of 127.0.0.1:5999/nowhere:tag" in notes.statuses
    assert f"building {tag}: reading the cache of 127.0.0.1:5000/imgbuild-never-pushed:none" \
        in notes.statuses
    # uv's downloads, as they come: what it said it fetches, and how much has arrived
    step = f'building {tag}: [2/3] RUN echo "Resolved 3 packages in 12ms" && echo "Downloading'
    said = [d for text, d in notes.details if text.startswith(step)]
    assert said == ["uv fetched 0 B of 15.9 MB", "uv fetched 0 B of 867.8 MB",  # 15.2 MiB
                    "uv fetched 15.9 MB of 867.8 MB"] + ["uv fetched 867.8 MB of 867.8 MB"] * 3


# --- the client's whole run: what it is given, what comes back on each way it ends -------------
# The client below is a script as _client's, which also keeps its arguments and environment,
# streams a tar on stdout (the tar exporter's way), and answers `load` and `image inspect` (the
# reproducible build's loading). Where a log is not one of tests/data/buildkit/ it is written
# inline from the recorded ones' lines, and says so.

def _scripted(tmp_path, log: bytes, rc: int = 0, *, tar: bytes | None = None,
              archive: Path | None = None) -> DockerCLI:
    d = tmp_path / "client"
    d.mkdir(exist_ok=True)
    (d / "out.log").write_bytes(log)
    # BuildKit's progress goes to stderr, as the real client prints it; the tar to stdout.
    out = (f"cat {d / 'out.tar'}\n" if tar is not None else "") + f"cat {d / 'out.log'} >&2\n"
    if tar is not None:
        (d / "out.tar").write_bytes(tar)
    script = d / "docker"
    script.write_text(
        "#!/bin/sh\n"
        f'case "$1" in load|image) echo "$*" >> {d / "asked"}; '
        f'[ "$1" = image ] && echo {IID}; exit 0;; esac\n'
        f'echo "$*" > {d / "args"}\n'
        f'echo "buildkit=${{DOCKER_BUILDKIT-unset}}" > {d / "env"}\n'
        + (f"touch {archive}\n" if archive is not None else "")
        + 'while [ $# -gt 0 ]; do [ "$1" = --iidfile ] && '
        f'printf %s {IID} > "$2"; shift; done\n'
        + out + f"exit {rc}\n")
    script.chmod(0o755)
    return DockerCLI(str(script), "20.10.24+dfsg1", True)


def _run(plan, tmp_path, monkeypatch, client: DockerCLI, **kw):
    from imgbuild.image import daemon

    monkeypatch.setattr(buildkit, "cli", lambda: client)
    monkeypatch.setattr(daemon, "cli", lambda: client)
    ctx = tmp_path / "ctx"
    ctx.mkdir(exist_ok=True)
    notes = Notes()
    return buildkit.docker_build(plan, ctx, secrets=Secrets(), flags="", progress=notes,
                                 **kw), notes


def test_the_client_builds_with_buildkit_on_and_the_cache_unless_told(plan, tmp_path,
                                                                       monkeypatch):
    log = (LOGS / "built.log").read_bytes()
    client = _scripted(tmp_path, log)
    got, notes = _run(plan, tmp_path, monkeypatch, client)
    assert (got.image_id, got.steps, got.cached_steps) == (IID, 4, 1)
    args = (tmp_path / "client" / "args").read_text().split()
    assert args[:2] == ["build", "--progress=plain"] and "--no-cache" not in args
    assert (tmp_path / "client" / "env").read_text() == "buildkit=1\n"
    assert notes.statuses[0] == f"building {plan.ref()}"
    _run(plan, tmp_path, monkeypatch, client, no_cache=True)
    assert "--no-cache" in (tmp_path / "client" / "args").read_text().split()


def test_a_build_s_filesystem_goes_to_the_sink_as_it_streams(plan, tmp_path, monkeypatch):
    import io
    import tarfile

    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tf:
        info = tarfile.TarInfo("opt/venv/x.py")
        info.size = 3000
        tf.addfile(info, io.BytesIO(b"x" * 3000))
    tar = buf.getvalue()
    got_names: list[str] = []

    def sink(stream) -> None:
        with tarfile.open(fileobj=stream, mode="r|") as tf:
            got_names.extend(m.name for m in tf)

    client = _scripted(tmp_path, (LOGS / "built.log").read_bytes(), tar=tar)
    got, notes = _run(plan, tmp_path, monkeypatch, client, tar_sink=sink)
    assert got_names == ["opt/venv/x.py"] and got.image_id == "" and got.steps == 4
    args = (tmp_path / "client" / "args").read_text().split()
    assert args[2:4] == ["-o", "type=tar,dest=-"] and "--iidfile" not in args
    streamed = [d for text, d in notes.details
                if text == f"building {plan.ref()}: the built filesystem streamed out"]
    assert streamed and streamed[0].endswith(" read")


def test_a_sink_that_fails_stops_the_build_and_is_raised(plan, tmp_path, monkeypatch):
    def sink(stream) -> None:
        stream.read(10)
        raise ValueError("the layer cut found a hard link it cannot keep")

    client = _scripted(tmp_path, (LOGS / "built.log").read_bytes(), tar=b"\0" * 10240)
    with pytest.raises(ValueError, match="hard link it cannot keep"):
        _run(plan, tmp_path, monkeypatch, client, tar_sink=sink)


# Written from built.log's first steps; the last line is the 20.10 client's when dockerd stopped
# answering mid-build (moby's "error reading from server: EOF").
GONE = b"".join(ln + b"\n" for ln in (LOGS / "built.log").read_bytes().splitlines()[:13]) + \
    b"#5 [2/4] RUN echo one > /one\n\nerror reading from server: EOF\n"


def test_a_daemon_gone_mid_build_is_an_environment_error(plan, tmp_path, monkeypatch):
    with pytest.raises(buildkit.EnvError) as e:
        _run(plan, tmp_path, monkeypatch, _scripted(tmp_path, GONE, rc=1))
    assert e.value.message == "the Docker daemon went away during the build"
    assert e.value.facts == [f"image {plan.ref()} was not tagged",
                             "#5 [2/4] RUN echo one > /one", "error reading from server: EOF"]
    assert e.value.hint == ("check that dockerd runs (`docker info`; make services starts it), "
                            "then run the command again: the steps that finished are in "
                            "BuildKit's cache")


def test_a_build_that_fails_in_no_step_shows_the_last_forty_lines(plan, tmp_path, monkeypatch):
    log = b"".join(b"line %d of the client's own output\n" % i for i in range(60))
    with pytest.raises(JobFailed) as e:
        _run(plan, tmp_path, monkeypatch, _scripted(tmp_path, log, rc=2))
    assert e.value.message == "docker build failed at the build (exit code 2)"
    assert e.value.log_tail == [f"line {i} of the client's own output" for i in range(20, 60)]
    assert e.value.hint == "the log tail above shows the failing step"


def test_a_failed_step_shows_its_last_thirty_lines_even_when_they_are_not_utf8(plan, tmp_path,
                                                                              monkeypatch):
    # Written in failed-step.log's form: a RUN step that prints 40 lines, one not UTF-8.
    log = (b"#5 [2/2] RUN ./noisy\n"
           + b"".join(b"#5 0.%03d out %d\n" % (i, i) for i in range(40))
           + b"#5 0.500 \xff bytes\n#5 ERROR: executor failed running [/bin/sh -c ./noisy]: "
             b"exit code: 3\n")
    with pytest.raises(JobFailed) as e:
        _run(plan, tmp_path, monkeypatch, _scripted(tmp_path, log, rc=1))
    assert len(e.value.log_tail) == 30
    assert e.value.log_tail[-2:] == ["#5 0.500 \ufffd bytes", "#5 ERROR: executor failed running "
                                     "[/bin/sh -c ./noisy]: exit code: 3"]
    assert e.value.message == "docker build failed at [2/2] RUN ./noisy (exit code 1)"


def test_a_step_is_said_done_at_buildkit_s_done_not_at_its_own_output(plan, tmp_path,
                                                                      monkeypatch):
    # Written in built.log's form: the step's own output ends in " done" (uv says so), and
    # BuildKit's " DONE" ends the step.
    log = (b"#5 [2/2] RUN uv pip install\n#5 0.200 Installed 3 packages in 12ms done\n"
           b"#5 DONE 0.3s\n")
    _got, notes = _run(plan, tmp_path, monkeypatch, _scripted(tmp_path, log))
    assert notes.said == ["  done [2/2] RUN uv pip install"]


def test_a_cache_read_is_said_and_one_not_read_is_said_in_two_hundred_characters(
        plan, tmp_path, monkeypatch):
    # Written in cache-from-and-uv.log's form: one --cache-from read, one refused with a long
    # reason.
    # (BuildKit's reason may quote the registry's own "ERROR: ": the reason is all after the
    # first.)
    why = "failed to authorize: upstream ERROR: " + "no basic auth credentials " * 12
    log = (b"#2 importing cache manifest from 127.0.0.1:5000/acme:one\n#2 DONE 0.1s\n"
           b"#3 importing cache manifest from 127.0.0.1:5000/acme:two\n"
           + f"#3 ERROR: {why}\n".encode() + b"#4 [1/1] FROM base\n#4 DONE 0.0s\n")
    got, notes = _run(plan, tmp_path, monkeypatch, _scripted(tmp_path, log),
                      cache_from=("127.0.0.1:5000/acme:one", "127.0.0.1:5000/acme:two"))
    assert got.cache_imported == ("127.0.0.1:5000/acme:one",)
    assert ("warn", f"no cache read from 127.0.0.1:5000/acme:two: {why[:200]}") in notes.notes
    assert notes.said[-1] == "  cache read from 127.0.0.1:5000/acme:one"


def test_a_reproducible_build_is_loaded_from_its_archive_and_the_archive_removed(
        plan, tmp_path, monkeypatch):
    archive = tmp_path / "ctx.oci.tar"
    client = _scripted(tmp_path, (LOGS / "built.log").read_bytes(), archive=archive)
    got, notes = _run(plan, tmp_path, monkeypatch, client,
                      export=buildkit.Export(reproducible=True))
    assert got.image_id == IID and not archive.exists()
    assert (tmp_path / "client" / "asked").read_text().splitlines() == [
        f"load -i {archive}", f"image inspect --format {{{{.Id}}}} {plan.ref()}"]
    assert f"loading {plan.ref()} into the Engine" in notes.statuses


def test_an_archive_the_engine_does_not_load_is_said_with_its_words(tmp_path, monkeypatch):
    import subprocess

    answers: dict[str, subprocess.CompletedProcess] = {}
    monkeypatch.setattr(buildkit, "run_cli", lambda args, **kw: answers[args[0]])
    archive = tmp_path / "ctx.oci.tar"
    archive.write_bytes(b"x")
    long = "open /var/lib/docker/tmp/x: no space left on device " + "y" * 400
    answers["load"] = subprocess.CompletedProcess([], 1, "", long)
    with pytest.raises(JobFailed) as e:
        buildkit._load(archive, "r/x:t", Notes())
    assert e.value.message == "the Engine did not load the image BuildKit built (r/x:t)"
    assert e.value.facts == [long[-300:]]
    assert e.value.hint == "image r/x:t was not tagged; run the command again"
    assert not archive.exists()
    answers["load"] = subprocess.CompletedProcess([], 0, "Loaded image: r/x:other\n" * 20, "")
    answers["image"] = subprocess.CompletedProcess([], 1, "", "No such image: r/x:t")
    with pytest.raises(JobFailed) as e:
        buildkit._load(archive, "r/x:t", Notes())
    assert e.value.message == "the Engine loaded the image BuildKit built, but not as r/x:t"
    assert e.value.facts == [("Loaded image: r/x:other\n" * 20).strip()[-300:]]
