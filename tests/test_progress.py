"""Progress a person can watch: real pushes and pulls through a real registry, their events
counted against the registry's own manifest; the plain and JSON modes of the CLI."""

from __future__ import annotations

import io
import json
import os
import re
import uuid

import pytest
from rich.console import Console

from imgbuild.cli.console import JsonProgress, PlainProgress, RichProgress
from imgbuild.image import registry, wire
from imgbuild.image.registry import MANIFEST_TYPES, Repository
from imgbuild.progress import Transfer

from .conftest import run_imgbuild
from .registries import Registry

# Its docker tests push to a registry of their own: the group of test_registry_auth.py.
pytestmark = pytest.mark.xdist_group("private-registries")


@pytest.fixture()
def private_registry(docker_client, tmp_path):
    reg = Registry(tmp_path / "reg").start()
    yield reg
    reg.stop()
    # The images tagged for it go with it (their layers are the base's and random bytes).
    for img in docker_client.images.list():
        for tag in img.tags:
            if tag.startswith(reg.host + "/"):
                docker_client.images.remove(tag, noprune=False)


def unique_image(client, tmp_path, ref: str) -> str:
    """A small image of its own: the base the tests share, and two layers of random bytes
    nothing else holds (so a pull must fetch them, and the base's layer is there already)."""
    d = tmp_path / "ctx"
    d.mkdir()
    (d / "a").write_bytes(os.urandom(3_000_000))
    (d / "b").write_bytes(os.urandom(1_000_000))
    base = client.images.list(name="imgbuild-base")
    if not base:
        pytest.skip("skipped: no imgbuild-base image here (make demo bootstraps it)")
    (d / "Dockerfile").write_text(f"FROM {base[0].tags[0]}\nCOPY a /a\nCOPY b /b\n")
    client.images.build(path=str(d), tag=ref, rm=True)
    # The Engine says "Already exists" for a layer it holds only when it knows the blob's
    # digest (its record of what it pushed and pulled): the base's layer as imgbuild's push
    # compresses it, pulled once here, so that what the test sees does not hang on what ran
    # before it.
    # (An image of its own on the base: the Engine does not fetch a layer of an image whose
    # config it already holds, so pulling the base itself would teach it nothing.)
    k = tmp_path / "known"
    k.mkdir()
    (k / "c").write_bytes(os.urandom(1000))
    (k / "Dockerfile").write_text(f"FROM {base[0].tags[0]}\nCOPY c /c\n")
    known = f"{ref.split('/', 1)[0]}/base-known:1"
    client.images.build(path=str(k), tag=known, rm=True)
    wire.push_ref(client, known)
    client.images.remove(known)
    registry.pull(client, known, None)
    client.images.remove(known)
    return ref


def layer_sizes(reg: Registry, repo: str, tag: str) -> list[tuple[str, int]]:
    r = Repository.parse(f"{reg.host}/{repo}")
    m = r.api.request("GET", f"{r.path}/manifests/{tag}", scope=r.scope("pull"),
                      headers={"Accept": MANIFEST_TYPES}).json()
    return [(la["digest"], la["size"]) for la in m["layers"]]


def events(stream: io.StringIO) -> list[dict]:
    return [json.loads(ln) for ln in stream.getvalue().splitlines()]


@pytest.mark.docker
def test_push_then_pull_events_add_up_to_the_manifest(docker_client, private_registry,
                                                      tmp_path):
    repo = f"progress-{uuid.uuid4().hex[:8]}"
    ref = unique_image(docker_client, tmp_path, f"{private_registry.host}/{repo}:one")
    out = io.StringIO()
    digest = wire.push_ref(docker_client, ref, JsonProgress(out))
    pushed = events(out)
    [done] = [e for e in pushed if e["event"] == "transfer-done"]
    sizes = layer_sizes(private_registry, repo, "one")
    assert done["kind"] == "push" and done["layers"] == len(sizes) == 3
    # The base's layer went to base-known from here (unique_image): mounted from there, said
    # as Docker says it ("Mounted from"), an existing layer; the two of random bytes sent.
    assert done["layers_done"] == 2 and done["layers_existing"] == 1
    # A push counts the layers as the Engine reads them (tar, before gzip): at least the
    # random bytes, which do not compress.
    assert done["bytes"] >= 4_000_000
    # The same image under a second tag: every layer is there already, said once each, and
    # nothing is counted as traffic.
    docker_client.images.get(ref).tag(f"{private_registry.host}/{repo}", "two")
    out2 = io.StringIO()
    assert wire.push_ref(docker_client, f"{private_registry.host}/{repo}:two",
                         JsonProgress(out2)) == digest
    again = events(out2)
    assert [e["state"] for e in again if e["event"] == "layer"] == ["exists"] * 3
    [done2] = [e for e in again if e["event"] == "transfer-done"]
    assert done2["bytes"] == 0 and done2["layers_existing"] == 3

    # Pulled back from cold: the two layers of its own are fetched, compressed bytes equal to
    # what the manifest lists for them; the base's layer is there already, said so once.
    for tag in docker_client.images.get(ref).tags:
        docker_client.images.remove(tag)
    out3 = io.StringIO()
    registry.pull(docker_client, ref, digest, JsonProgress(out3))
    pulled = events(out3)
    [done3] = [e for e in pulled if e["event"] == "transfer-done"]
    layer_events = [e for e in pulled if e["event"] == "layer"]
    exists = [e["layer"] for e in layer_events if e["state"] == "exists"]
    assert len(exists) == len(set(exists)) == 1
    fetched = {d[7:19]: s for d, s in sizes if d[7:19] not in exists}
    assert len(fetched) == 2
    assert done3["bytes"] == done3["total_bytes"] == sum(fetched.values())
    assert done3["unpacked_bytes"] == sum(fetched.values())
    assert {e["layer"]: e["bytes"] for e in layer_events if e["state"] == "done"} == fetched


@pytest.mark.docker
def test_plain_mode_says_existing_layers_once_and_the_totals(docker_client, private_registry,
                                                            tmp_path):
    repo = f"progress-{uuid.uuid4().hex[:8]}"
    ref = unique_image(docker_client, tmp_path, f"{private_registry.host}/{repo}:one")
    wire.push_ref(docker_client, ref)
    docker_client.images.remove(ref)
    console = Console(file=io.StringIO(), width=200, force_terminal=False)
    plain = PlainProgress(console)
    plain.INTERVAL = 0.0  # every change a line, so that the test sees the totals lines
    registry.pull(docker_client, ref, None, plain)
    lines = console.file.getvalue().splitlines()
    assert lines[0] == f"pull {ref} ..."
    assert sum("already here, not fetched" in ln for ln in lines) == 1
    assert any(" of " in ln and "layers done" in ln for ln in lines)
    assert lines[-1].startswith(f"pulled {ref}: ") and "2 layer(s) moved, 1 already there" \
        in lines[-1]
    assert not any("\x1b[" in ln for ln in lines)  # no terminal codes in a log


def test_the_terminal_display_shows_bars_then_one_line():
    # A terminal of its own (rich records what it drew): bars while it runs, and the line
    # that stays.
    console = Console(file=io.StringIO(), width=120, force_terminal=True, record=True)
    tty = RichProgress(console)
    with tty.transfer("pull", "r/x:1") as t:
        t.feed({"id": "aaa", "status": "Already exists"})
        t.feed({"id": "bbb", "status": "Downloading",
                "progressDetail": {"current": 500, "total": 1000}})
        t.feed({"id": "bbb", "status": "Pull complete"})
    text = console.export_text()
    assert "pulled r/x:1: 1.0 kB" in text and "1 already there" in text


def test_a_transfer_counts_from_the_engines_words():
    t = Transfer("pull", "r/x:1")
    t.feed({"status": "Pulling from r/x", "id": "1"})  # the tag, not a layer
    for lid in ("a", "b"):
        t.feed({"id": lid, "status": "Pulling fs layer", "progressDetail": {}})
    t.feed({"id": "c", "status": "Already exists", "progressDetail": {}})
    t.feed({"id": "a", "status": "Downloading", "progressDetail": {"current": 10, "total": 100}})
    assert (t.done_bytes, t.total_bytes, t.existing) == (10, 100, 1)
    t.feed({"id": "b", "status": "Downloading", "progressDetail": {"current": 5, "total": 50}})
    t.feed({"id": "a", "status": "Download complete", "progressDetail": {}})
    assert (t.done_bytes, t.total_bytes, t.finished) == (105, 150, 0)
    t.feed({"id": "a", "status": "Extracting", "progressDetail": {"current": 40, "total": 100}})
    assert t.unpacked_bytes == 40
    t.feed({"id": "a", "status": "Pull complete", "progressDetail": {}})
    t.feed({"id": "b", "status": "Download complete", "progressDetail": {}})
    t.feed({"id": "b", "status": "Pull complete", "progressDetail": {}})
    assert (t.done_bytes, t.total_bytes, t.finished, t.unpacked_bytes) == (150, 150, 2, 150)
    assert len(t.layers) == 3
    # its summary, as a report gives it: what was unpacked only for a pull, seconds to a tenth
    t.started -= 12.345
    got = t.summary()
    assert {k: v for k, v in got.items() if k not in ("seconds", "rate_bps")} == {
        "kind": "pull", "ref": "r/x:1", "bytes": 150, "total_bytes": 150, "unpacked_bytes": 150,
        "layers": 3, "layers_done": 2, "layers_existing": 1}
    assert round(got["seconds"], 1) == got["seconds"] and 12.3 <= got["seconds"] < 13
    assert got["seconds"] != int(got["seconds"])
    push = Transfer("push", "r/x:1")
    push.feed({"id": "a", "status": "Pushing", "progressDetail": {"current": 5, "total": 9}})
    assert "unpacked_bytes" not in push.summary() and push.summary()["bytes"] == 5


def test_each_layer_s_state_follows_the_engine_and_is_said_once():
    said: list[str | None] = []
    t = Transfer("pull", "localhost:5000/team/x:v1", on_change=lambda _t, s: said.append(s))
    # The tag's own line: the part after the last colon, not after a registry's port.
    t.feed({"status": "Pulling from team/x", "id": "v1"})
    assert t.layers == {}
    t.feed({"id": "a", "status": "Downloading", "progressDetail": {"current": 1, "total": 9}})
    assert t.layers["a"].state == "moving"
    t.feed({"id": "a", "status": "Download complete"})
    assert t.layers["a"].state == "downloaded" and t.layers["a"].current == 9
    t.feed({"id": "a", "status": "Pull complete"})
    t.feed({"id": "a", "status": "Pull complete"})  # said again by the Engine: done once
    assert t.layers["a"].state == "done"
    # A layer first heard of as it unpacks takes its size from that event.
    t.feed({"id": "b", "status": "Extracting", "progressDetail": {"current": 3, "total": 70}})
    assert (t.layers["b"].total, t.layers["b"].current, t.layers["b"].unpacked,
            t.layers["b"].state) == (70, 70, 3, "unpacking")
    assert [s for s in said if s] == ["a moving", "a done"]


@pytest.mark.docker
def test_the_cli_json_mode_keeps_stdout_for_the_report(docker_client, private_registry):
    repo = f"{private_registry.host}/imgbuild"
    r = run_imgbuild("tiny-cpu", "--push", "--registry", repo, "--no-smoke", "--json",
                     "--progress", "json", timeout=1800)
    assert r.returncode == 0, r.stderr[-3000:]
    report = json.loads(r.stdout)  # stdout: the report alone
    assert report["content_tag"]
    got = [json.loads(ln) for ln in r.stderr.splitlines() if ln.strip()]  # stderr: events only
    done = [e for e in got if e["event"] == "transfer-done" and e["kind"] == "push"]
    assert done and done[0]["bytes"] > 0 and done[0]["layers_done"] > 0
    # pull in plain mode: the image is here, so every layer is there already, said once.
    p = run_imgbuild("pull", "tiny-cpu", "--registry", repo, "--progress", "plain")
    assert p.returncode == 0, p.stderr[-2000:]
    said = p.stderr.splitlines()
    assert sum("already here, not fetched" in ln for ln in said) <= 1
    assert any(ln.startswith("pulled ") for ln in said)


# --- the bars fit the terminal (issue 26) --------------------------------------------------------

HEADLINE = "127.0.0.1:5000/imgbuild:sglang-blackwell-k2.6-013e33f44eb40580"
GB = 1_000_000_000


def cold_pull(t: Transfer) -> None:
    """A cold pull of the headline image part way: 11 layers, one there already, three done,
    4.7 of 11.0 GB moved (the last 0.2 GB while the clock ran: a rate), 2.0 GB unpacked."""
    t.feed({"id": "l0", "status": "Already exists"})
    sizes = [3 * GB, 2 * GB, 2 * GB, GB] + [GB // 2] * 6
    moved = [13 * GB // 10, GB, GB // 5, GB, GB // 2, GB // 2] + [0] * 4
    for i, (size, cur) in enumerate(zip(sizes, moved, strict=True), start=1):
        t.feed({"id": f"l{i}", "status": "Downloading",
                "progressDetail": {"current": cur, "total": size}})
    for i in (4, 5, 6):
        t.feed({"id": f"l{i}", "status": "Download complete"})
        t.feed({"id": f"l{i}", "status": "Pull complete"})
    for cur in (14 * GB // 10, 15 * GB // 10):
        t.feed({"id": "l1", "status": "Downloading",
                "progressDetail": {"current": cur, "total": 3 * GB}})


def drawn_bars(width: int, kind: str = "pull", ref: str = HEADLINE) -> list[str]:
    """The bars mid-transfer, drawn into a terminal of `width` columns (the clock moves a
    tenth of a second a reading, so that a rate and a time left are known)."""
    console = Console(file=io.StringIO(), width=width, force_terminal=True)
    ticks = iter(range(10**6))
    tty = RichProgress(console, clock=lambda: next(ticks) / 10)
    with tty.transfer(kind, ref) as t:
        cold_pull(t)
        frame = Console(file=io.StringIO(), width=width, force_terminal=True, record=True)
        frame.print(tty.bars)
    return [ln for ln in frame.export_text().splitlines() if ln.strip()]


@pytest.mark.parametrize("width", [80, 120])
def test_the_bars_keep_their_figures_whole_in_a_narrow_terminal(width):
    lines = drawn_bars(width)
    assert all(len(ln) <= width for ln in lines), lines
    moving, unpacking = lines
    # The figures a person watches are whole: bytes done of total with the unit, the rate
    # with its unit, the time left.
    assert re.search(r" 4\.7/11\.0 GB ", moving), moving
    assert re.search(r" \d+(\.\d)? ?[kMG]?B/s ", moving), moving
    assert re.search(r" (\d+:\d\d:\d\d|-:--:--)$", moving), moving
    assert "…" not in moving.split("━")[-1] and "…" not in unpacking.split("━")[-1]
    # The reference gives way instead: cut in its middle, its tag's end (the content hash)
    # kept, with the layer counts.
    desc = moving.split(" ━")[0].split(" ╸")[0].strip()
    assert desc.startswith("pull 127.0") and "33f44eb40580 (" in desc, desc
    assert width < 120 or "-013e33f44eb40580 (" in desc, desc  # the whole hash, given room
    assert "…" in desc and "(3/10 layers" in desc, desc
    assert re.search(r" \d\.\d+/11\.0 GB ", unpacking) and unpacking.startswith("unpacking")


def test_a_wide_terminal_shows_the_whole_reference():
    moving = drawn_bars(200)[0]
    assert moving.startswith(f"pull {HEADLINE} (3/10 layers, 1 there already) ")
    assert re.search(r" 4\.7/11\.0 GB ", moving)


@pytest.mark.parametrize("ref", ["[::1]:5000/x:[bold]y", "r/" + "n" * 300 + ":tag-end"])
def test_a_reference_is_shown_as_written_and_fitted(ref):
    # A reference is text, never markup; one longer than the terminal keeps its tag's end.
    lines = drawn_bars(80, "push", ref)
    assert all(len(ln) <= 80 for ln in lines)
    assert lines[0].startswith("push ") and ("[bold]y" in lines[0] or "tag-end" in lines[0])


def test_a_transfer_line_gives_way_in_order():
    from imgbuild.cli.console import fit_transfer

    counts = ("3/10 layers", "1 there already")
    whole = f"pull {HEADLINE} (3/10 layers, 1 there already)"
    assert fit_transfer("pull", HEADLINE, counts, 200) == whole
    # First the reference, cut in its middle (its start and, longer, its end kept) ...
    line = fit_transfer("pull", HEADLINE, counts, 70)
    assert len(line) == 70 and line.endswith("-013e33f44eb40580 (3/10 layers, 1 there already)")
    assert line.startswith("pull 127.0.0.1") and line.count("…") == 1
    # ... then, before it says too little, the count of layers there already ...
    line = fit_transfer("pull", HEADLINE, counts, 36)
    assert line.endswith("44eb40580 (3/10 layers)") and len(line) == 36
    # ... and last of all what cannot fit at all is cut, never wider than asked.
    assert [len(fit_transfer("pull", HEADLINE, counts, w)) for w in (1, 8, 20)] == [1, 8, 20]


def test_a_transfer_line_keeps_its_counts_while_the_reference_has_its_least_room():
    from imgbuild.cli.console import MIN_REF, fit_transfer

    ref = "r" * MIN_REF
    width = len("pull ") + MIN_REF + len(" (1/2 layers)")  # the least room, exactly
    assert fit_transfer("pull", ref, ("1/2 layers",), width) == f"pull {ref} (1/2 layers)"
    # one column less and the counts go, the reference whole
    assert fit_transfer("pull", ref, ("1/2 layers",), width - 1) == f"pull {ref}"


def test_a_transfer_with_no_counts_says_none():
    from imgbuild.cli.console import fit_transfer

    assert fit_transfer("push", "r:t", (), 80) == "push r:t"


def test_the_counts_go_one_by_one_to_none_when_even_one_leaves_the_reference_too_little():
    from imgbuild.cli.console import MIN_REF, fit_transfer

    ref = "r" * MIN_REF
    line = fit_transfer("pull", ref, ("1/2 layers", "1 there already"), len("pull ") + MIN_REF + 3)
    assert line == f"pull {ref}"


def test_a_transfer_line_is_fitted_to_its_column_and_gives_way_to_the_kind_at_least():
    from rich.console import Console

    from imgbuild.cli.console import _TransferLine

    line = _TransferLine("pull", "registry.example/acme:tag", ("1/2 layers",))
    frame = Console(file=io.StringIO(), width=12, record=True)
    frame.print(line)
    assert frame.export_text() == "pull re…:tag\n"
    # the column may be squeezed down to the kind and one character of the reference
    assert tuple(line.__rich_measure__(frame, frame.options)) == (
        len("pull") + 2, len("pull registry.example/acme:tag (1/2 layers)"))


def test_a_task_without_a_fitted_line_keeps_to_one_line_in_the_bars_column():
    from rich.console import Console
    from rich.progress import Task
    from rich.table import Column, Table

    from imgbuild.cli.console import _LineColumn

    task = Task(0, "unpacking a very long description", None, 0, _get_time=lambda: 0.0)
    grid = Table.grid(Column(ratio=3, no_wrap=True))  # as the bars' first column is made
    grid.add_row(_LineColumn().render(task))
    frame = Console(file=io.StringIO(), width=10, record=True)
    frame.print(grid)
    assert frame.export_text() == "unpacking…\n"
