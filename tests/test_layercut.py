"""The rest layer cut from the built filesystem (image/layercut.py), and the pieces of a splice
that puts it in place of a built one: the Dockerfiles either side of the cut (plan/render.py)
and the history entry BuildKit would have written for it (image/splice.py rest_history).

The cut is checked here on tars made to hold each case; tests/test_splice.py checks a real cut
(BuildKit's tar exporter, Docker Engine 20.10) file by file against the image built whole."""

from __future__ import annotations

import io
import json
import tarfile

import pytest

from imgbuild.image import layercut, splice
from imgbuild.plan import render
from imgbuild.plan.decide import make_plan

from .conftest import checkout_workspace
from .test_splice import donor_of, recorded

DIR = {"type": tarfile.DIRTYPE, "mode": 0o755, "mtime": 100}


def tar(*entries: tuple[str, bytes | None, dict], fmt: int = tarfile.PAX_FORMAT) -> bytes:
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w", format=fmt) as tf:
        for name, data, attrs in entries:
            m = tarfile.TarInfo(name)
            for k, v in attrs.items():
                setattr(m, k, v)
            if data is None:
                tf.addfile(m)
            else:
                m.size = len(data)
                tf.addfile(m, io.BytesIO(data))
    return out.getvalue()


def tree(*tars: bytes) -> dict[str, tuple]:
    """The filesystem the tars make, one over the other (no whiteouts in these)."""
    fs: dict[str, tuple] = {}
    for t in tars:
        with tarfile.open(fileobj=io.BytesIO(t)) as tf:
            for m in tf:
                name = m.name.strip("/")
                if name in ("", "."):
                    continue
                f = tf.extractfile(m) if m.isfile() else None
                fs[name] = (m.type, m.mode, m.uid, m.gid, m.linkname,
                            f.read() if f is not None else None)
    return fs


LONG = "opt/venv/lib/python3.11/site-packages/" + "p" * 120 + "/__init__.py"
LOWER = tar((".", None, DIR), ("etc", None, DIR), ("etc/os-release", b"debian", {"mtime": 5}),
            ("etc/same-size", b"aaaa", {"mtime": 5}), ("opt", None, DIR),
            ("opt/venv", None, DIR), ("opt/venv/pyvenv.cfg", b"home = /usr/bin", {"mtime": 9}),
            ("usr/bin/python3", b"ELF", {"mode": 0o755, "mtime": 5}))
FS = tar((".", None, DIR), ("etc", None, DIR), ("etc/os-release", b"debian", {"mtime": 5}),
         ("etc/same-size", b"bbbb", {"mtime": 5}),  # rewritten, same size and mtime
         ("opt", None, DIR), ("opt/venv", None, {**DIR, "mtime": 200}),  # the install added
         ("opt/venv/pyvenv.cfg", b"home = /usr/bin", {"mtime": 9}),
         ("opt/venv/bin/cli", b"#!/opt/venv/bin/python\n", {"mode": 0o755, "uid": 0}),
         (LONG, b"x" * 70000, {"mtime": 7}),  # a PAX path, data over a block
         ("opt/venv/bin/cli-again", None, {"type": tarfile.LNKTYPE,
                                           "linkname": "opt/venv/bin/cli"}),
         ("opt/venv/bin/python", None, {"type": tarfile.SYMTYPE,
                                        "linkname": "/usr/bin/python3"}),
         ("usr/bin/python3", b"ELF", {"mode": 0o755, "mtime": 5}))


def test_the_cut_is_what_the_install_changed_and_with_the_layers_under_it_makes_the_fs():
    stats = layercut.Cut()
    out = b"".join(layercut.cut(io.BytesIO(FS), layercut.lower_entries([io.BytesIO(LOWER)]),
                                stats))
    with tarfile.open(fileobj=io.BytesIO(out)) as tf:
        names = [m.name for m in tf]
    # Kept: the rewritten file (same size and mtime: its bytes tell), the directory whose
    # metadata changed, every new entry; left out: what the layers under it hold as it is.
    assert names == ["etc/same-size", "opt/venv", "opt/venv/bin/cli", LONG,
                     "opt/venv/bin/cli-again", "opt/venv/bin/python"]
    assert stats.kept == 6 and stats.entries == 12
    assert tree(LOWER, out) == tree(FS)
    # Kept members go out as BuildKit wrote them, headers and all (no re-encoding).
    with tarfile.open(fileobj=io.BytesIO(FS)) as tf:
        long_member = next(m for m in tf if m.name == LONG)
    assert FS[long_member.offset:long_member.offset_data + 70000] in out


def test_what_a_layer_of_additions_cannot_say_is_refused():
    lower = layercut.lower_entries([io.BytesIO(LOWER)])
    # A path of the layers under it gone from the filesystem: a whiteout's job.
    gone = tar(*[e for e in [(".", None, DIR), ("etc", None, DIR)]])
    with pytest.raises(layercut.NotCut, match="not in the filesystem"):
        b"".join(layercut.cut(io.BytesIO(gone), lower, layercut.Cut()))
    # A new hard link to a file the cut leaves out: a layer's links point inside it.
    linked = tar((".", None, DIR), ("usr/bin/python3", b"ELF", {"mode": 0o755, "mtime": 5}),
                 ("opt/venv/bin/py", None, {"type": tarfile.LNKTYPE,
                                            "linkname": "usr/bin/python3"}))
    with pytest.raises(layercut.NotCut, match="hard link"):
        b"".join(layercut.cut(io.BytesIO(linked), lower, layercut.Cut()))


def test_the_layers_under_it_are_read_with_their_whiteouts():
    base = tar(("a", None, DIR), ("a/x", b"1", {}), ("a/y", b"2", {}), ("b", None, DIR),
               ("b/z", b"3", {}))
    over = tar(("a", None, DIR), ("a/.wh.x", b"", {}), ("b", None, DIR),
               ("b/.wh..wh..opq", b"", {}), ("c", b"4", {}))
    got = layercut.lower_entries([io.BytesIO(base), io.BytesIO(over)])
    assert sorted(got) == ["a", "a/y", "b", "c"]
    assert got["c"].digest is not None and got["a"].digest is None


def test_the_dockerfiles_either_side_of_the_cut():
    ws = checkout_workspace()
    plan = make_plan(ws, "tiny-cpu", resolve=False)
    whole = render.dockerfile(plan, with_heavy=False)
    install = render.rest_install(plan)
    skip = render.dockerfile(plan, with_heavy=False, rest="skip")
    last = render.dockerfile(plan, with_heavy=False, rest="last")
    # The small layers' build: everything but the rest install, the rest.txt COPY kept.
    assert install in whole and install not in skip
    assert skip == whole.replace(install, "")
    # The filesystem's build: the same steps up to the rest install, and nothing after it.
    assert last == whole[:whole.index(install) + len(install)]
    with pytest.raises(ValueError):
        render.dockerfile(plan, rest="some")


def test_the_rest_history_entry_is_the_one_buildkit_wrote():
    """The recorded image (Docker Engine 20.10's BuildKit) has both installs: the entry made
    for its rest install from its heavy one is the one BuildKit wrote, byte for byte."""
    full = recorded()
    donor = donor_of(full)
    rest = next(h for h in full["history"] if "-r /opt/imgbuild/rest.txt" in h.get("created_by", ""))
    ws = checkout_workspace()
    command = render.recorded_command(render.rest_install(make_plan(ws, "tiny-cpu",
                                                                    resolve=False)))
    flags = "--find-links /opt/imgbuild-wheels --index-strategy unsafe-best-match"
    assert rest["created_by"].startswith(f"RUN |1 IMGBUILD_INDEX_FLAGS={flags} /bin/sh -c ")
    assert splice.rest_history(donor, command, flags, rest["created"]) == rest
    # Another install than the donor's (a uv flag, a prune): no entry, no cut.
    assert splice.rest_history(donor, command.replace("--compile-bytecode", ""), flags,
                               rest["created"]) is None


def test_the_cut_layer_goes_where_the_built_one_was():
    full = recorded()
    at = next(i for i, h in enumerate(full["history"])
              if "-r /opt/imgbuild/rest.txt" in h.get("created_by", ""))
    layer_at = sum(1 for h in full["history"][:at] if not h.get("empty_layer"))
    top = {**full, "history": full["history"][:at] + full["history"][at + 1:],
           "rootfs": {**full["rootfs"], "diff_ids": full["rootfs"]["diff_ids"][:layer_at]
                      + full["rootfs"]["diff_ids"][layer_at + 1:]}}
    cut = splice.CutLayer(at, layer_at, full["history"][at],
                          full["rootfs"]["diff_ids"][layer_at], {}, 0)
    assert json.loads(splice.with_rest(json.dumps(top).encode(), cut)) == full


@pytest.mark.parametrize("run, recorded", [
    ("RUN echo X\n", "echo X"),
    ("RUN   echo hi  \n", "echo hi  "),  # what follows RUN, as BuildKit keeps it
    ("RUN --mount=type=cache,target=/c  uv pip install x \\\n    --no-deps\n",
     "uv pip install x     --no-deps"),
])
def test_the_command_buildkit_records_for_a_run_step(run, recorded):
    from imgbuild.plan.render import recorded_command

    assert recorded_command(run) == recorded


class _Stream(io.RawIOBase):
    """A layer as `docker save` or the blob cache hands it on: read once, no seeking back."""

    def __init__(self, data: bytes):
        self._src = io.BytesIO(data)

    def readable(self) -> bool:
        return True

    def readinto(self, b) -> int:
        chunk = self._src.read(min(len(b), 1000))
        b[:len(chunk)] = chunk
        return len(chunk)


def _pax_sized(name: str, data: bytes) -> bytes:
    """A member whose size only its PAX header gives, as tar writes one over 8 GiB: the ustar
    header's size field holds 0."""
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w", format=tarfile.PAX_FORMAT) as tf:
        m = tarfile.TarInfo(name)
        m.size, m.mtime, m.pax_headers = len(data), 7, {"size": str(len(data))}
        tf.addfile(m, io.BytesIO(data))
    raw = bytearray(out.getvalue())
    ustar = 1024  # the PAX header's block and its one block of records come first
    hdr = raw[ustar:ustar + 512]
    hdr[124:136] = b"00000000000\0"
    hdr[148:156] = b" " * 8
    hdr[148:156] = b"%06o\0 " % sum(hdr)
    raw[ustar:ustar + 512] = hdr
    return bytes(raw)


def test_a_size_only_a_pax_header_gives_is_the_member_s_size():
    data = b"w" * 1500
    fs = _pax_sized("opt/big.bin", data)
    with tarfile.open(fileobj=io.BytesIO(fs)) as tf:  # Python's tar reads it so too
        assert [(m.name, m.size) for m in tf] == [("opt/big.bin", 1500)]
    out = b"".join(layercut.cut(io.BytesIO(fs), {}, layercut.Cut()))
    assert tree(out) == {"opt/big.bin": (tarfile.REGTYPE, 0o644, 0, 0, "", data)}


def test_the_layers_under_it_are_read_as_a_stream():
    got = layercut.lower_entries([_Stream(LOWER)])
    assert sorted(got) == ["etc", "etc/os-release", "etc/same-size", "opt", "opt/venv",
                           "opt/venv/pyvenv.cfg", "usr/bin/python3"]
