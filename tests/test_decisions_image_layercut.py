"""The cut of the rest layer (image/layercut.py), the cases tests/test_layercut.py leaves
open, on tars made in memory: a whiteout removes its own path and what is under it, never a
sibling whose name starts the same; GNU long names and PAX times are read; `./`-prefixed names
are the same path however many times prefixed."""

from __future__ import annotations

import io
import tarfile

from imgbuild.image import layercut

from .test_layercut import tar

DIR = {"type": tarfile.DIRTYPE, "mode": 0o755, "mtime": 100}


def members(data: bytes) -> list[str]:
    with tarfile.open(fileobj=io.BytesIO(data)) as tf:
        return [m.name for m in tf]


def test_a_whiteout_removes_its_path_and_below_but_not_a_sibling_of_the_same_prefix():
    base = tar(("a", None, DIR), ("a/b", None, DIR), ("a/b/x", b"1", {}), ("a/bc", b"2", {}),
               ("a/b.txt", b"3", {}))
    over = tar(("a", None, DIR), ("a/.wh.b", b"", {}))
    got = layercut.lower_entries([io.BytesIO(base), io.BytesIO(over)])
    assert sorted(got) == ["a", "a/b.txt", "a/bc"]
    top = tar(("x", None, DIR), (".wh.x", b"", {}), ("xy", b"1", {}))
    assert sorted(layercut.lower_entries([io.BytesIO(top)])) == ["xy"]


def test_an_opaque_directory_keeps_itself_and_no_sibling():
    base = tar(("d", None, DIR), ("d/x", b"1", {}), ("dd", b"2", {}))
    over = tar(("d", None, DIR), ("d/.wh..wh..opq", b"", {}))
    assert sorted(layercut.lower_entries([io.BytesIO(base), io.BytesIO(over)])) == ["d", "dd"]


def test_gnu_long_names_are_the_paths_they_name():
    long = "opt/venv/lib/" + "q" * 150 + "/mod.py"
    lower = layercut.lower_entries([io.BytesIO(tar(("opt", None, DIR)))])
    fs = tar(("opt", None, DIR), (long, b"code", {"mtime": 3}), fmt=tarfile.GNU_FORMAT)
    stats = layercut.Cut()
    out = b"".join(layercut.cut(io.BytesIO(fs), lower, stats))
    assert members(out) == [long] and stats.kept_paths == {long}


def test_a_file_whose_time_alone_changed_is_left_out_and_a_directorys_is_kept():
    lower = layercut.lower_entries([io.BytesIO(tar(("d", None, DIR), ("d/f", b"same", {"mtime": 1})))])
    # PAX carries sub-second times: the mtime read from it is the one compared (whole seconds).
    fs = tar(("d", None, {**DIR, "mtime": 100.5}), ("d/f", b"same", {"mtime": 1.25}))
    stats = layercut.Cut()
    assert members(b"".join(layercut.cut(io.BytesIO(fs), lower, stats))) == []
    fs = tar(("d", None, {**DIR, "mtime": 101.5}), ("d/f", b"same", {"mtime": 1}))
    assert members(b"".join(layercut.cut(io.BytesIO(fs), lower, layercut.Cut()))) == ["d"]


def test_dot_slash_names_are_one_path():
    assert layercut._norm("././a/b/") == "a/b"
    assert layercut._norm("./") == "" and layercut._norm(".") == "" and layercut._norm("/") == ""
    assert layercut._norm("./.wh.x") == ".wh.x"


def test_a_time_only_pax_can_hold_is_read_from_pax():
    far = 9_000_000_000  # past what a ustar header holds: PAX carries it
    lower = layercut.lower_entries([io.BytesIO(tar(("d", None, {**DIR, "mtime": far})))])
    assert lower["d"].mtime == far
    same = tar(("d", None, {**DIR, "mtime": far}))
    assert members(b"".join(layercut.cut(io.BytesIO(same), lower, layercut.Cut()))) == []
    later = tar(("d", None, {**DIR, "mtime": far + 1}))
    assert members(b"".join(layercut.cut(io.BytesIO(later), lower, layercut.Cut()))) == ["d"]
