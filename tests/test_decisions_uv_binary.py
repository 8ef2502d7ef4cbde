"""Which uv binary a build for the other CPU gets (lock/uv.py uv_bin_for): this machine's uv
for its own CPU; for the other, the same uv release's binary out of its manylinux wheel for
that CPU on the index (pypiserver on loopback, real wheels laid out as uv's are), kept in the
cache and not fetched again. Against PyPI itself: tests/test_platforms.py."""

from __future__ import annotations

import os
import stat

import pytest

from imgbuild.errors import EnvError
from imgbuild.lock import uv as uvmod

from .wheelfactory import LocalIndex, WheelSpec

VERSION = "0.9.99"


def _uv_wheel(cpu: str, body: str, version: str = VERSION) -> WheelSpec:
    # uv's wheels carry the binary as a script of the .data directory, on a compressed tag set.
    return WheelSpec("uv", version, files={f"uv-{version}.data/scripts/uv": body},
                     tag=f"py3-none-manylinux_2_17_{cpu}.manylinux2014_{cpu}")


@pytest.fixture()
def index(tmp_path, monkeypatch):
    ix = LocalIndex(tmp_path / "index")
    ix.add(_uv_wheel("aarch64", "uv for arm64"))
    ix.add(_uv_wheel("x86_64", "uv for x86_64"))
    ix.add(_uv_wheel("aarch64", "an older uv for arm64", version="0.9.98"))
    ix.add(WheelSpec("uv", VERSION, tag="py3-none-macosx_11_0_arm64"))
    # A plain linux build someone uploaded (it sorts first): no manylinux wheel, not taken.
    ix.add(WheelSpec("uv", VERSION, files={f"uv-{VERSION}.data/scripts/uv": "a local build"},
                     tag="py3-none-linux_aarch64"))
    ix.start()
    monkeypatch.setenv("UV_INDEX_URL", ix.url)
    monkeypatch.setenv("IMGBUILD_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(uvmod, "uv_version", lambda: f"uv {VERSION} (test)")
    yield ix
    ix.stop()


def test_the_other_cpus_uv_is_the_same_release_out_of_its_wheel_and_kept(index, tmp_path):
    got = uvmod.uv_bin_for("aarch64", "x86_64")
    dest = tmp_path / "cache" / "tools" / f"uv-{VERSION}-aarch64" / "uv"
    assert got == str(dest)
    assert dest.read_text() == "uv for arm64"
    assert stat.S_IMODE(dest.stat().st_mode) == 0o755
    assert os.listdir(dest.parent) == ["uv"]  # nothing half-written beside it
    # Kept: a second build takes the cached binary as it is, without fetching it again.
    dest.write_text("cached")
    index.stop()
    assert uvmod.uv_bin_for("aarch64", "x86_64") == str(dest)
    assert dest.read_text() == "cached"


def test_this_cpus_uv_is_the_one_imgbuild_runs(index):
    assert uvmod.uv_bin_for("x86_64", "x86_64") == uvmod.uv_bin()


def test_no_wheel_for_that_cpu_names_the_indexes_asked(index):
    with pytest.raises(EnvError) as e:
        uvmod.uv_bin_for("riscv64", "x86_64")
    assert (e.value.message, e.value.facts, e.value.hint) == (
        f"no uv {VERSION} wheel for riscv64 on the index", [f"indexes asked: {index.url}"],
        "use an index that mirrors PyPI's uv wheels")
