"""The cut of the rest layer (image/layercut.py), the cases tests/test_layercut.py leaves
open, on tars made in memory: a whiteout removes its own path and what is under it, never a
sibling whose name starts the same; GNU long names and PAX times are read; `./`-prefixed names
are the same path however many times prefixed."""

from __future__ import annotations

import io
import tarfile

import pytest

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


# --- reading a tar stream's members as tarfile itself reads them ------------------------------

def _tar(fmt: int, members: list[tuple[tarfile.TarInfo, bytes]]) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=fmt, encoding="utf-8",
                      errors="surrogateescape") as tf:
        for info, data in members:
            tf.addfile(info, io.BytesIO(data) if data else None)
    return buf.getvalue()


def _members_of_all_kinds() -> list[tuple[tarfile.TarInfo, bytes]]:
    long_dir = "usr/lib/python3.11/site-packages/" + "a-very-long-package-name/" * 4
    out = []
    f = tarfile.TarInfo(long_dir + "module_with_a_long_name\udcff.py")
    f.size, f.uid, f.gid, f.mtime, f.mode = 5, 3_000_000, 4_000_000, 1_700_000_000, 0o644
    out.append((f, b"hello"))
    h = tarfile.TarInfo("usr/bin/short-link")
    h.type, h.linkname = tarfile.LNKTYPE, long_dir + "module_with_a_long_name\udcff.py"
    out.append((h, b""))
    s = tarfile.TarInfo("usr/bin/sym")
    s.type, s.linkname = tarfile.SYMTYPE, "../lib/" + "x" * 120 + "X"
    out.append((s, b""))
    both = tarfile.TarInfo(long_dir + "X-a-long-link-of-its-own")  # two extended headers
    both.type, both.linkname = tarfile.SYMTYPE, "/opt/" + "y" * 110 + "X"
    out.append((both, b""))
    e = tarfile.TarInfo("etc/a=b c\udcff.conf")  # '=', a space, and a byte not UTF-8
    e.size = 2
    out.append((e, b"ok"))
    return out


@pytest.mark.parametrize("fmt", [tarfile.PAX_FORMAT, tarfile.GNU_FORMAT], ids=["pax", "gnu"])
def test_each_member_reads_as_tarfile_reads_it_and_its_headers_pass_on_byte_for_byte(fmt):
    raw = _tar(fmt, _members_of_all_kinds())
    with tarfile.open(fileobj=io.BytesIO(raw), mode="r:", encoding="utf-8",
                      errors="surrogateescape") as tf:
        want = [(m.name, m.linkname, m.size, m.uid, m.gid, int(m.mtime), m.type)
                for m in tf.getmembers()]
    src, got, passed = io.BytesIO(raw), [], b""
    for m, header in layercut._members(src):
        got.append((m.name, m.linkname, m.size, m.uid, m.gid, int(m.mtime), m.type))
        data = src.read(layercut._padded(m.size)) if m.isfile() else b""
        passed += header + data
    assert got == want
    assert raw.startswith(passed)  # the headers, extended ones too, as they were written


def test_a_pax_header_of_several_records_is_read_record_by_record():
    data = b"".join(r for r in (b"30 mtime=1700000000.123456789\n", b"16 path=a=b c d\n",
                                b"12 uid=4242\n"))
    assert layercut._pax(data) == {"mtime": "1700000000.123456789", "path": "a=b c d",
                                   "uid": "4242"}


def test_a_global_header_or_an_early_end_is_not_cut():
    g = tarfile.TarInfo("pax_global_header")
    g.type = tarfile.XGLTYPE
    g.size = 12
    raw = g.tobuf(tarfile.USTAR_FORMAT) + b"12 uid=4242\n".ljust(512, b"\0")
    with pytest.raises(layercut.NotCut) as e:
        list(layercut._members(io.BytesIO(raw)))
    assert str(e.value) == "the filesystem's tar has a global header"
    whole = _tar(tarfile.PAX_FORMAT, _members_of_all_kinds()[:1])
    with pytest.raises(layercut.NotCut) as e:
        list(layercut._members(io.BytesIO(whole[:700])))  # into the PAX header's records
    assert str(e.value) == "the filesystem's tar ended early"


SYM = {"type": tarfile.SYMTYPE}


def test_a_link_or_directory_the_layers_under_it_hold_as_is_is_left_out_and_a_changed_one_kept():
    lower = layercut.lower_entries([io.BytesIO(tar(
        ("d", None, DIR), ("d/l", None, {**SYM, "linkname": "target"}),
        ("d/m", None, {**SYM, "linkname": "old"}), ("d/f", b"data", {})))])
    fs = tar(("d", None, DIR), ("d/l", None, {**SYM, "linkname": "target"}),
             ("d/m", None, {**SYM, "linkname": "new"}), ("d/f", b"data", {}),
             ("d/n", None, {**SYM, "linkname": "added"}))
    stats = layercut.Cut()
    out = b"".join(layercut.cut(io.BytesIO(fs), lower, stats))
    assert members(out) == ["d/m", "d/n"]
    assert (stats.entries, stats.kept) == (5, 2)
    # The layer ends with tar's two zero blocks.
    assert out.endswith(b"\0" * 1024) and len(out) % 512 == 0
    # A directory whose mode changed is kept.
    fs = tar(("d", None, {**DIR, "mode": 0o700}), ("d/l", None, {**SYM, "linkname": "target"}),
             ("d/m", None, {**SYM, "linkname": "old"}), ("d/f", b"data", {}))
    assert members(b"".join(layercut.cut(io.BytesIO(fs), lower, layercut.Cut()))) == ["d"]


def test_a_hard_link_to_a_file_under_it_is_no_cut_and_one_to_a_file_kept_is():
    lower = layercut.lower_entries([io.BytesIO(tar(("f", b"one", {})))])
    fs = tar(("f", b"one", {}), ("h", None, {"type": tarfile.LNKTYPE, "linkname": "f"}))
    with pytest.raises(layercut.NotCut) as e:
        b"".join(layercut.cut(io.BytesIO(fs), lower, layercut.Cut()))
    assert str(e.value) == ("h is a hard link to f, which the layers under it hold: a layer's "
                            "hard links point inside it")
    fs = tar(("f", b"two", {}), ("h", None, {"type": tarfile.LNKTYPE, "linkname": "./f"}))
    assert members(b"".join(layercut.cut(io.BytesIO(fs), lower, layercut.Cut()))) == ["f", "h"]


def test_a_path_gone_from_the_filesystem_is_no_cut():
    lower = layercut.lower_entries([io.BytesIO(tar(("a", b"1", {}), ("b", b"2", {}),
                                                   ("c", b"3", {})))])
    with pytest.raises(layercut.NotCut) as e:
        b"".join(layercut.cut(io.BytesIO(tar(("a", b"1", {}))), lower, layercut.Cut()))
    assert str(e.value) == ("2 paths of the layers under it are not in the filesystem (e.g. /b):"
                            " that takes whiteouts")


def test_a_symlinks_target_is_compared_as_written_and_an_empty_cut_is_two_zero_blocks():
    lower = layercut.lower_entries([io.BytesIO(tar(("l", None, {**SYM, "linkname": "target"})))])
    same = tar(("l", None, {**SYM, "linkname": "target"}))
    assert b"".join(layercut.cut(io.BytesIO(same), lower, layercut.Cut())) == b"\0" * 1024
    # "./target" is another symlink than "target" (a hard link's name is a path; a symlink's
    # target is text the kernel reads).
    dotted = tar(("l", None, {**SYM, "linkname": "./target"}))
    assert members(b"".join(layercut.cut(io.BytesIO(dotted), lower, layercut.Cut()))) == ["l"]
