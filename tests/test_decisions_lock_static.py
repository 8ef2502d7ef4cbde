"""The static proof's decisions (lock/staticproof.py) on plain data, with no network: which
requirement applies to the target, whether it excludes the locked version, who requires what
by the lock's `# via` lines, which requirers are read, what proves an override needed, and the
effect in words. The proof against a real index: tests/test_lock_static.py."""

from __future__ import annotations

import pytest

from imgbuild.lock import staticproof as sp
from imgbuild.lock import wheels
from imgbuild.lock.lockfile import LockedPackage

from .wheelfactory import WheelSpec, make_wheel

ENV = sp.marker_environment("3.12", "x86_64-manylinux_2_39")


def pkg(name: str, version: str) -> LockedPackage:
    return LockedPackage(name, version, ("sha256:" + "a" * 64,))


def test_the_marker_environment_is_what_the_request_fixes():
    assert ENV == {"python_version": "3.12", "sys_platform": "linux",
                   "platform_system": "Linux", "os_name": "posix",
                   "platform_machine": "x86_64"}
    assert sp.marker_environment("3.11", "aarch64-manylinux_2_28")["platform_machine"] == \
        "aarch64"
    assert sp.marker_environment("3.12", "aarch64-musllinux_1_2") is not None
    # A platform or python this does not know fixes nothing.
    assert sp.marker_environment("3.12", "x86_64-apple-darwin") is None
    assert sp.marker_environment("3.12.1", "x86_64-manylinux_2_39") is None
    assert sp.marker_environment("3", "x86_64-manylinux_2_39") is None


@pytest.mark.parametrize(("marker", "applies"), [
    (None, True),
    ("", True),
    ('python_version >= "3.12"', True),
    ('python_version < "3.12"', False),
    ("sys_platform == 'linux' and platform_machine == 'x86_64'", True),
    ("platform_machine == 'aarch64'", False),
    ('sys_platform == "darwin"', False),
    ('python_version >= "3.10" or sys_platform == "win32"', True),
    # Not fixed by the request: never judged, so never a proof.
    ('extra == "audio"', False),
    ('python_version >= "3" and extra == "audio"', False),
    ('extra == "audio" or python_version >= "3"', False),
    ('platform_release >= "5"', False),
    ('python_full_version >= "3.12.0"', False),
    ('implementation_name == "cpython"', False),
    ('platform_python_implementation == "CPython"', False),
    # A quoted value that spells a variable's name is a value, not a variable.
    ("sys_platform != 'extra'", True),
    ("python_version >=", False),  # does not parse
])
def test_which_markers_surely_apply_to_the_target(marker, applies):
    assert sp.marker_applies(marker, ENV) is applies


def test_with_no_environment_only_a_requirement_without_a_marker_applies():
    assert sp.marker_applies(None, None)
    assert not sp.marker_applies('python_version >= "3"', None)


def test_the_variables_of_a_marker_leave_out_values_and_words():
    assert sp.marker_variables("python_version in 'extra os_name' and not extra == \"x\"") == \
        {"python_version", "extra"}


@pytest.mark.parametrize(("spec", "version", "excluded"), [
    ("==0.17.0", "0.18.0", True),
    ("==0.18.0", "0.18.0", False),
    ("==0.18", "0.18.0", False),  # the same version
    (">=0.10", "0.11.0", False),
    (">=0.10,<0.11", "0.11.0", True),
    ("!=0.18.0", "0.18.0", True),
    ("~=2.8", "2.54.0", False),
    ("~=2.8.0", "2.54.0", True),
    ("==2.14.0", "2.14.0+cu130", False),  # a local version matches its public one
    (">=1.0", "1.1rc1", False),  # a pre-release inside the range is in it
    ("==0.7.2", "0.7.2.post1", True),
    ("==bogus", "1.0", False),  # what does not parse proves nothing
    ("==1.0", "not a version", False),
])
def test_whether_a_specifier_excludes_the_locked_version(spec, version, excluded):
    assert sp.excludes(spec, version) is excluded


def test_the_requirements_that_break_the_lock_are_the_ones_on_that_package_that_apply():
    dist = ("Compressed_Tensors==0.17.0",  # another spelling of the name
            "compressed-tensors==0.16.0; python_version < '3.12'",  # not this python
            "compressed-tensors==0.15.0; extra == 'quant'",  # an extra: not known asked for
            "compressed-tensors>=0.10",  # allows the lock's
            "compressed-tensors @ https://example.com/ct.whl",  # a URL: no specifier
            "compressed-tensors-extra==0.1",  # another package, same prefix
            "torch==2.14.0",
            "???")  # does not parse
    assert sp.breaking_requirements(dist, "compressed-tensors", "0.18.0", ENV) == \
        ("compressed-tensors==0.17.0",)
    assert sp.breaking_requirements(dist, "torch", "2.14.1", ENV) == ("torch==2.14.0",)
    assert sp.breaking_requirements(dist, "torch", "2.14.0", ENV) == ()
    assert sp.breaking_requirements(dist, "numba", "1.0", ENV) == ()


def test_a_requirer_conflicts_only_when_every_wheel_uv_could_read_breaks_the_lock():
    vllm = pkg("vllm", "0.33.0")
    pins = ("torch==2.14.0",)
    assert sp.requirer_conflict(vllm, (pins,), "torch", "2.14.1", ENV) == \
        sp.Conflict("vllm", "0.33.0", "torch==2.14.0")
    assert sp.requirer_conflict(vllm, (pins, ("torch==2.13.0",)), "torch", "2.14.1", ENV) == \
        sp.Conflict("vllm", "0.33.0", "torch==2.14.0")
    # Metadata differs between wheels of one version: one that allows the lock, no proof.
    assert sp.requirer_conflict(vllm, (pins, ("torch>=2",)), "torch", "2.14.1", ENV) is None
    assert sp.requirer_conflict(vllm, (("torch>=2",), pins), "torch", "2.14.1", ENV) is None
    assert sp.requirer_conflict(vllm, (), "torch", "2.14.1", ENV) is None  # no wheel known


BODY = """\
compressed-tensors==0.18.0 \\
    --hash=sha256:aa
    # via
    #   --override overrides.txt
    #   sglang
    #   VLLM
numba==0.65.1 \\
    --hash=sha256:bb
    # via vllm
outlines-core==0.2.14 \\
    --hash=sha256:cc
    # via
    #   -r requirements.in
    #   outlines
sglang==0.5.23 \\
    --hash=sha256:dd
    # via -r requirements.in
torch==2.14.1 \\
    --hash=sha256:ee
vllm==0.33.0 \\
    --hash=sha256:ff
    # via
    #   -c constraints.txt
    #   outlines_core
"""


def test_who_requires_what_is_read_from_the_via_lines():
    assert sp.requirers(BODY) == {
        "compressed-tensors": ("sglang", "vllm"), "numba": ("vllm",),
        "outlines-core": ("outlines",), "sglang": (), "torch": (), "vllm": ("outlines-core",)}


def test_the_requirers_read_are_the_most_shared_first_and_a_few_each():
    pending = {"ct": ("sglang", "vllm"), "numba": ("vllm",),
               "torch": ("a", "b", "sglang", "c", "vllm", "d")}
    assert sp.requirers_to_read(pending) == {
        "ct": ("vllm", "sglang"), "numba": ("vllm",), "torch": ("vllm", "sglang", "a", "b")}
    assert sp.requirers_to_read(pending, limit=1) == {
        "ct": ("vllm",), "numba": ("vllm",), "torch": ("vllm",)}
    assert sp.requirers_to_read({}) == {}


def test_the_effect_names_who_requires_what_and_what_the_lock_has():
    a = sp.Conflict("vllm", "0.33.0", "compressed-tensors==0.17.0")
    b = sp.Conflict("llmcompressor", "0.9", "compressed-tensors<0.18")
    assert sp.effect((a,), "compressed-tensors", "0.18.0") == (
        "without it: vllm 0.33.0 requires compressed-tensors==0.17.0, the lock has "
        "compressed-tensors 0.18.0")
    assert sp.effect((a, b), "compressed-tensors", "0.18.0") == (
        "without it: vllm 0.33.0 requires compressed-tensors==0.17.0; llmcompressor 0.9 "
        "requires compressed-tensors<0.18, the lock has compressed-tensors 0.18.0")
    four = tuple(sp.Conflict(f"p{i}", "1", "x==1") for i in range(4))
    assert sp.effect(four, "x", "2") == (
        "without it: p0 1 requires x==1; p1 1 requires x==1; p2 1 requires x==1 (+1 more), "
        "the lock has x 2")
    assert sp.effect(four[:3], "x", "2").count("requires") == 3 and "more" not in \
        sp.effect(four[:3], "x", "2")


PACKAGES = {p.name: p for p in (pkg("compressed-tensors", "0.18.0"), pkg("sglang", "0.5.23"),
                                pkg("vllm", "0.33.0"), pkg("llmcompressor", "0.9"))}
META = {"sglang": (("compressed-tensors==0.18.0",),),
        "vllm": (("compressed-tensors==0.17.0", "torch"),),
        "llmcompressor": (("compressed-tensors<0.18; python_version >= '3.10'",),)}


def test_an_override_is_proven_needed_by_every_requirer_whose_metadata_breaks_the_lock():
    got = sp.prove("compressed-tensors==0.18.0", ("torch==2.14.1",), PACKAGES,
                   ("sglang", "vllm", "llmcompressor"), META, ENV)
    assert got == ("without it: vllm 0.33.0 requires compressed-tensors==0.17.0; "
                   "llmcompressor 0.9 requires compressed-tensors<0.18, the lock has "
                   "compressed-tensors 0.18.0")
    # Any spelling of the override: its name is what counts.
    assert sp.prove("Compressed_Tensors>=0.18; python_version >= '3'", (), PACKAGES,
                    ("vllm",), META, ENV) == sp.effect(
        (sp.Conflict("vllm", "0.33.0", "compressed-tensors==0.17.0"),),
        "compressed-tensors", "0.18.0")


def test_no_proof_where_nothing_surely_breaks_the_lock():
    ov = "compressed-tensors==0.18.0"
    # Only a requirer that agrees with the lock, or whose metadata is unknown.
    assert sp.prove(ov, (), PACKAGES, ("sglang",), META, ENV) is None
    assert sp.prove(ov, (), PACKAGES, ("vllm",), {"vllm": None}, ENV) is None
    assert sp.prove(ov, (), PACKAGES, ("vllm",), {}, ENV) is None
    # A requirer the lock does not hold proves nothing about the lock.
    assert sp.prove(ov, (), PACKAGES, ("gone",), {"gone": (("compressed-tensors==0.1",),)},
                    ENV) is None
    # Another override on the same package still replaces every requirement on it.
    assert sp.prove(ov, ("compressed-tensors<1",), PACKAGES, ("vllm",), META, ENV) is None
    # The overridden package is not in the lock, or the override does not parse.
    assert sp.prove("numba==0.65.1", (), PACKAGES, ("vllm",), META, ENV) is None
    assert sp.prove("???", (), PACKAGES, ("vllm",), META, ENV) is None
    # The marker decides: llmcompressor's requirement holds on 3.10 and up only.
    assert sp.prove(ov, (), PACKAGES, ("llmcompressor",), META,
                    sp.marker_environment("3.9", "x86_64-manylinux_2_39")) is None


def test_requires_dist_is_read_from_core_metadata():
    raw = (b"Metadata-Version: 2.1\nName: vllm\nVersion: 0.33.0\n"
           b"Requires-Dist: torch==2.14.0\nRequires-Dist: numba==0.65.0; python_version<'3.13'"
           b"\n\nThe description, with Requires-Dist: not-a-header\n")
    assert sp.requires_dist(raw) == ("torch==2.14.0", "numba==0.65.0; python_version<'3.13'")
    assert sp.requires_dist(b"Name: x\n") == ()


def test_metadata_is_read_from_a_wheels_tail_only_when_all_of_it_is_there(tmp_path):
    path = make_wheel(WheelSpec("eng-a", "1.0", requires=("ctensors==0.8.1",)), tmp_path)
    data = path.read_bytes()
    meta = (b"Metadata-Version: 2.1\nName: eng-a\nVersion: 1.0\n"
            b"Requires-Dist: ctensors==0.8.1\n")
    assert wheels.metadata_from_tail(data, len(data)) == meta
    # The member's own bytes not in the tail, or the directory cut short: read another way.
    assert wheels.metadata_from_tail(data[-200:], len(data)) is None
    assert wheels.metadata_from_tail(data[-20:], len(data)) is None
    # A member whose bytes do not match their CRC is no answer.
    body_at = data.index(b"eng_a-1.0.dist-info/METADATA") + len("eng_a-1.0.dist-info/METADATA")
    torn = data[:body_at] + bytes([data[body_at] ^ 0xFF]) + data[body_at + 1:]
    assert wheels.metadata_from_tail(torn, len(torn)) is None


# --- what mutation testing showed untested ----------------------------------------------------

def test_the_marker_environment_is_made_when_asked():
    """(ENV above is made when this module is imported: here the function runs in the test.)"""
    assert sp.marker_environment("3.11", "aarch64-manylinux_2_28") == {
        "python_version": "3.11", "sys_platform": "linux", "platform_system": "Linux",
        "os_name": "posix", "platform_machine": "aarch64"}


def test_a_requirement_that_does_not_parse_is_passed_over_not_the_end_of_the_list():
    dist = ("torch @", "torch==2.14.0")
    assert sp.breaking_requirements(dist, "torch", "2.14.1", ENV) == ("torch==2.14.0",)
    assert sp.breaking_requirements(("numba>=0", "torch==2.14.0"), "torch", "2.14.1", ENV) == \
        ("torch==2.14.0",)


def test_only_the_via_block_names_requirers():
    body = ("ctensors==0.11.0 \\\n    --hash=sha256:aa\n    # from https://pypi.org/simple\n"
            "    #   not-a-requirer\n    # via eng-a\n")
    assert sp.requirers(body) == {"ctensors": ("eng-a",)}


def _zip(tmp_path, members, *, comment=b"") -> bytes:
    """A wheel-shaped zip: (name, bytes, stored?) members in order, each with a comment."""
    import zipfile
    path = tmp_path / "w.whl"
    with zipfile.ZipFile(path, "w") as z:
        for name, data, stored in members:
            info = zipfile.ZipInfo(name, (2020, 1, 1, 0, 0, 0))
            info.compress_type = zipfile.ZIP_STORED if stored else zipfile.ZIP_DEFLATED
            info.comment = comment
            z.writestr(info, data)
    return path.read_bytes()


WHEEL_META = b"Metadata-Version: 2.1\nName: p\nVersion: 1\nRequires-Dist: q==1\n" * 3


@pytest.mark.parametrize("stored", [True, False])
def test_the_metadata_member_is_found_past_others_stored_or_deflated(tmp_path, stored):
    data = _zip(tmp_path, [("p/__init__.py", b"x" * 500, False),
                           ("p-1.dist-info/RECORD", b"r", True),
                           ("p-1.dist-info/METADATA", WHEEL_META, stored)], comment=b"a comment")
    assert wheels.metadata_from_tail(data, len(data)) == WHEEL_META
    # The tail may start anywhere before the member: offsets are the file's, not the tail's.
    start = data.index(b"p-1.dist-info/METADATA") - 40
    assert wheels.metadata_from_tail(data[start:], len(data)) == WHEEL_META


def test_only_the_top_level_dist_info_metadata_counts(tmp_path):
    data = _zip(tmp_path, [("p/vendored/q-1.dist-info/METADATA", b"Name: q\n", True)])
    assert wheels.metadata_from_tail(data, len(data)) is None


def test_a_member_name_that_is_not_utf8_does_not_stop_the_search(tmp_path):
    data = _zip(tmp_path, [("p/a.py", b"x", True), ("p-1.dist-info/METADATA", WHEEL_META, True)])
    bad = data.replace(b"p/a.py", b"p/\xff.py")
    assert wheels.metadata_from_tail(bad, len(bad)) == WHEEL_META


def test_a_zip64_directory_or_a_cut_end_record_is_left_to_zipfile(tmp_path):
    import struct
    data = _zip(tmp_path, [("p-1.dist-info/METADATA", WHEEL_META, True)])
    at = data.rfind(b"PK\x05\x06")
    assert wheels.metadata_from_tail(data[:at + 10], len(data)) is None  # end record cut short
    for field, value in ((10, 0xFFFF), (16, 0xFFFFFFFF)):  # member count, directory offset
        fmt = "<H" if value == 0xFFFF else "<L"
        z64 = bytearray(data)
        struct.pack_into(fmt, z64, at + field, value)
        assert wheels.metadata_from_tail(bytes(z64), len(z64)) is None
    # A local header beyond the tail (a tail that starts after it) is no answer either.
    cd = data.index(b"PK\x01\x02")
    assert wheels.metadata_from_tail(data[cd:], len(data)) is None
