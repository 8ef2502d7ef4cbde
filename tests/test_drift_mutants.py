"""The drift check (imgbuild/checks/drift.py) where mutation testing found it untested (issue 18).

Each test here kills mutants that survived tests/test_drift.py: the wheel a lock's header
selects, what the caches alone answer, what `# via` and a pinner's metadata say, how enums and
classes are read, and the messages themselves, compared whole (a message change is then a
deliberate one). Offline: real wheels on a local pypiserver, one index for the module.
"""

from __future__ import annotations

import shutil
import zipfile
from dataclasses import replace
from pathlib import Path

import pytest

from imgbuild.catalog.families import SymbolFamily, load_families
from imgbuild.checks import drift
from imgbuild.checks.drift import Definition, Finding, Reference
from imgbuild.errors import EnvError, JobFailed
from imgbuild.lock import wheels
from imgbuild.lock.lockfile import LockRequest, write_lock

from . import test_drift
from .test_drift import BASE_NEW, BASE_OLD, ENGINE, FAMILY_YAML, sha256
from .wheelfactory import LocalIndex, WheelSpec

env = test_drift.env  # the fixture: a cache of its own, no default index

DEAD = "http://127.0.0.1:9/simple/"  # nothing listens: any network use fails
LINUX = "cp311-cp311-manylinux_2_28_x86_64"  # what the locks' header (3.11, x86_64) installs
MAC = "cp311-cp311-macosx_11_0_arm64"  # another build of the same version
FILLER = "# padding: the target's build is the bigger file\n" * 400
LINE = {s: ENGINE.splitlines().index(code) + 1 for s, code in (
    ("dense", "    Fmt.dense.value,"), ("packed", "    Fmt.packed.value,"),
    ("nvfp4", "    Fmt.nvfp4.value,"), ("nvfp4-2", "    if fmt == Fmt.nvfp4:"))}
MANY = 16  # releases of `many`: two batches of the first-version search and then some


def _pkg(name: str, body: str) -> dict[str, str]:
    return {f"{name}/__init__.py": "", f"{name}/{'config/base' if name == 'ctensors' else 'm'}.py":
            body}


@pytest.fixture(scope="module")
def index(tmp_path_factory):
    idx = LocalIndex(tmp_path_factory.mktemp("mutants-index"))
    w = {
        "old": idx.add(WheelSpec("ctensors", "0.1.0", files=_pkg("ctensors", BASE_OLD))),
        "new": idx.add(WheelSpec("ctensors", "0.2.0", files=_pkg("ctensors", BASE_NEW))),
        "eng": idx.add(WheelSpec("eng", "1.0.0", requires=("ctensors",), files={
            "eng/__init__.py": "", "eng/quant.py": ENGINE})),
        # Its first requirement is another package, then ctensors under an extra, a line
        # that is no requirement, and the one that pins: behind a marker that holds.
        "pinner": idx.add(WheelSpec("pinner", "1.0.0", requires=(
            "other-thing>=1", 'ctensors>=0.2; extra == "new"', "not a requirement !!",
            'ctensors==0.1.0; python_version >= "3"'))),
        "bare": idx.add(WheelSpec("bare", "1.0.0")),  # no Requires-Dist at all
        # Two builds of one version each, neither pure: the lock's header picks the Linux one.
        "p-linux": idx.add(WheelSpec("ptensors", "1.0", tag=LINUX, files={
            "ptensors/__init__.py": FILLER, "ptensors/config/base.py": BASE_OLD})),
        "p-mac": idx.add(WheelSpec("ptensors", "1.0", tag=MAC, files={
            "ptensors/__init__.py": ""})),
        "p-new": idx.add(WheelSpec("ptensors", "2.0", files={
            "ptensors/__init__.py": "", "ptensors/config/base.py": BASE_NEW})),
        "peng-linux": idx.add(WheelSpec("peng", "1.0", tag=LINUX, files={
            "peng/__init__.py": FILLER, "peng/quant.py": ENGINE})),
        "peng-mac": idx.add(WheelSpec("peng", "1.0", tag=MAC, files={
            "peng/__init__.py": "", "peng/quant.py": ENGINE.replace("nvfp4", "mxfp8")})),
        "noclass": idx.add(WheelSpec("noclass", "1.0", files={
            "noclass/__init__.py": "", "noclass/config/base.py": "X = 1\n"})),
    }
    for i in range(1, MANY + 1):
        body = "class Fmt:\n    always = 'always-value'\n" + (
            "    late = 'late-value'\n" if i == MANY else "")
        idx.add(WheelSpec("many", f"0.{i}", files={"many/__init__.py": "", "many/fmt.py": body}))
    idx.start()
    yield idx, w
    idx.stop()


@pytest.fixture()
def fam(tmp_path) -> SymbolFamily:
    d = tmp_path / "images" / "checks"
    d.mkdir(parents=True)
    (d / "drift.yaml").write_text(FAMILY_YAML)
    return load_families(tmp_path / "images")[0]


def make_lock(tmp: Path, pins: list[tuple[str, str, list[str], list[str]]], name="drifty.txt"):
    """A lock in uv's format, in the order given: (name as written, version, sha256s, via)."""
    body = ""
    for pin, version, shas, via in pins:
        body += f"{pin}=={version}" + "".join(f" \\\n    --hash=sha256:{s}" for s in shas) + "\n"
        if len(via) == 1:
            body += f"    # via {via[0]}\n"
        elif via:
            body += "    # via\n" + "".join(f"    #   {v}\n" for v in via)
    req = LockRequest("drifty", "3.11", "x86_64-manylinux_2_36", tuple(p[0] for p in pins))
    return write_lock(tmp / "locks" / name, req, body, "uv (test)")


def old_lock(tmp: Path, w, via=("eng", "pinner")):
    return make_lock(tmp, [("ctensors", "0.1.0", [sha256(w["old"])], list(via)),
                           ("eng", "1.0.0", [sha256(w["eng"])], ["-r requirements.in"]),
                           ("pinner", "1.0.0", [sha256(w["pinner"])], ["-r requirements.in"])])


def again_offline(tmp: Path) -> None:
    """Forget the kept wheels and the index pages: what is left is the drift check's own cache."""
    shutil.rmtree(tmp / "cache" / "wheels", ignore_errors=True)
    wheels._pages.clear()


def engine_finding(**kw) -> Finding:
    base = dict(family="Fmt", symbol="nvfp4", consumer="eng", consumer_version="1.0.0",
                file="eng/quant.py", line=LINE["nvfp4"], code="Fmt.nvfp4.value,",
                provider="ctensors", provider_version="0.1.0", first_version="0.2.0",
                source="engine", also=(f"eng/quant.py:{LINE['nvfp4-2']}",),
                required_by=(), defined_in="ctensors/config/base.py", target="drifty")
    return Finding(**(base | kw))


# --- which wheel a lock's header selects; what the caches answer without the index -----------

def test_the_lock_header_picks_the_targets_build_of_provider_and_consumer(index, env, fam):
    """Neither version has a pure wheel: the header's python and platform choose the Linux
    build (the macOS one has no Fmt class, and its engine uses another member). The scan is
    kept under the hash of the file read, so a lock that pins only that file needs no index."""
    idx, w = index
    pfam = replace(fam, provider="ptensors", modules=("ptensors/config/base.py",),
                   consumers=("peng",))
    lock = make_lock(env, [
        ("peng", "1.0", [sha256(w["peng-mac"]), sha256(w["peng-linux"])], ["-r requirements.in"]),
        ("ptensors", "1.0", [sha256(w["p-mac"]), sha256(w["p-linux"])], ["-r requirements.in"])])
    found = drift.check(lock, [pfam], index_urls=[idx.url])
    assert found == [engine_finding(consumer="peng", consumer_version="1.0", file="peng/quant.py",
                                    also=(f"peng/quant.py:{LINE['nvfp4-2']}",),
                                    provider="ptensors", provider_version="1.0",
                                    first_version="2.0", required_by=("images/drifty.yaml",),
                                    defined_in="ptensors/config/base.py")]
    again_offline(env)
    only_linux = make_lock(env, [
        ("peng", "1.0", [sha256(w["peng-linux"])], ["-r requirements.in"]),
        ("ptensors", "1.0", [sha256(w["p-linux"])], ["-r requirements.in"])], name="linux.txt")
    assert drift.check(only_linux, [pfam], index_urls=[DEAD]) == found


def test_a_repeated_check_needs_only_the_drift_cache(index, env, fam):
    idx, w = index
    lock = old_lock(env, w)
    first = drift.check(lock, [fam], index_urls=[idx.url])
    assert [(f.symbol, f.first_version) for f in first] == [("nvfp4", "0.2.0")]
    again_offline(env)
    assert drift.check(lock, [fam], index_urls=[DEAD]) == first
    # The provider's class, fresh or from the cache, is the same Definition.
    ctx = drift._Ctx((DEAD,), "3.11", "x86_64-manylinux_2_36", "auto")
    assert drift._locked_definition(lock.package("ctensors"), fam, ctx) == Definition(
        "ctensors", "0.1.0", "ctensors/config/base.py", {"dense": "dense", "packed": "packed"})


def test_each_versions_definition_is_kept(index, env, fam):
    idx, _ = index
    assert drift.first_version(fam, "nvfp4", index_urls=[idx.url]) == "0.2.0"
    again_offline(env)
    new = Definition("ctensors", "0.2.0", "ctensors/config/base.py",
                     {"dense": "dense", "packed": "packed", "nvfp4": "nvfp4-packed"})
    assert drift._version_definition(fam, "0.2.0", (DEAD,)) == new
    with pytest.raises(EnvError):  # not kept: 0.3.0 was never read
        drift._version_definition(fam, "0.3.0", (DEAD,))


def test_range_mode_keeps_no_wheel(index, env, fam):
    idx, w = index
    lock = make_lock(env, [("ctensors", "0.2.0", [sha256(w["new"])], ["eng"]),
                           ("eng", "1.0.0", [sha256(w["eng"])], ["-r requirements.in"])])
    assert drift.check(lock, [fam], index_urls=[idx.url], mode="range") == []
    assert not list((env / "cache" / "wheels").glob("*/*.whl"))
    shutil.rmtree(env / "cache" / "drift")  # the same check again, from the index
    assert drift.check(lock, [fam], index_urls=[idx.url], mode="full") == []
    assert len(list((env / "cache" / "wheels").glob("*/*.whl"))) == 2


def test_a_changed_family_is_scanned_again(index, env, fam):
    idx, w = index
    lock = old_lock(env, w)
    assert [f.symbol for f in drift.check(lock, [fam], index_urls=[idx.url])] == ["nvfp4"]
    quiet = replace(fam, ignore=fam.ignore + ("nvfp4",))
    assert drift.check(lock, [quiet], index_urls=[idx.url]) == []


# --- which families, consumers and formats are checked ---------------------------------------

def test_families_that_find_nothing_do_not_stop_the_rest(index, env, fam):
    idx, w = index
    lock = old_lock(env, w)
    families = [
        replace(fam, name="Unlocked", provider="not-locked"),
        replace(fam, name="NoConsumer", consumers=("absent",), model_quant_method=None),
        replace(fam, name="Clean", ignore=("value", "nvfp4"), model_quant_method=None),
        fam,
    ]
    formats = [("m.yaml: quantization.formats[0]", "packed"),
               ("m.yaml: quantization.formats[1]", "mixed")]
    found = drift.check(lock, families, model_formats=formats, index_urls=[idx.url])
    req_by = ("eng==1.0.0 requires ctensors (any version)", "pinner==1.0.0 requires ctensors==0.1.0")
    assert found == [
        engine_finding(required_by=req_by),
        Finding("Fmt", "mixed", "eng", "1.0.0", "m.yaml: quantization.formats[1]", None,
                "format: mixed", "ctensors", "0.1.0", None, "model", required_by=req_by,
                defined_in="ctensors/config/base.py", target="drifty")]


def test_a_model_finding_without_a_locked_engine(index, env, fam):
    idx, w = index
    lock = make_lock(env, [("ctensors", "0.1.0", [sha256(w["old"])], ["-r requirements.in"])])
    found = drift.check(lock, [fam], model_formats=[("config.json: x", "nvfp4-packed")],
                        index_urls=[idx.url])
    assert found == [Finding("Fmt", "nvfp4-packed", "model", "", "config.json: x", None,
                             "format: nvfp4-packed", "ctensors", "0.1.0", "0.2.0", "model",
                             required_by=("images/drifty.yaml",),
                             defined_in="ctensors/config/base.py", target="drifty")]


def test_a_provider_without_the_class(index, env, fam):
    idx, w = index
    nfam = replace(fam, provider="noclass", modules=("noclass/config/base.py",))
    lock = make_lock(env, [("eng", "1.0.0", [sha256(w["eng"])], ["-r requirements.in"]),
                           ("noclass", "1.0", [sha256(w["noclass"])], ["-r requirements.in"])])
    found = drift.check(lock, [nfam], index_urls=[idx.url])
    assert [(f.symbol, f.defined_in, f.first_version) for f in found] == [
        ("dense", None, None), ("packed", None, None), ("nvfp4", None, None)]
    with wheels.fetch_locked(lock.package("noclass"), [idx.url]) as whl:
        assert drift.definition(whl, nfam) == Definition("noclass", "1.0", None, {})
    assert drift.as_error(found[:1]).facts[2] == "noclass 1.0 defines no class Fmt at all"


# --- who put the provider at this version ----------------------------------------------------

def test_required_by_reads_every_kind_of_via_line(index, env, fam):
    idx, w = index
    lock = make_lock(env, [
        ("bare", "1.0.0", [sha256(w["bare"])], ["-r requirements.in"]),
        ("broken", "1.0.0", ["0" * 64], ["-r requirements.in"]),  # no such file on the index
        ("ctensors", "0.1.0", [sha256(w["old"])], [
            "-c constraints.txt", "-r requirements.in", "--override overrides.txt", "bare",
            "broken", "eng", "ghost", "pinner", "requirements.in"]),
        ("eng", "1.0.0", [sha256(w["eng"])], ["-r requirements.in"]),
        ("Pinner", "1.0.0", [sha256(w["pinner"])], ["-r requirements.in"]),  # as pip-compile spells it
    ])
    assert drift.via(lock, "eng") == ["images/drifty.yaml"]
    assert drift.via(lock, "pinner") == ["images/drifty.yaml"]
    assert drift.via(lock, "absent") == []
    [f] = drift.check(lock, [fam], index_urls=[idx.url])
    assert f.required_by == (
        "the target's requirements (constraints.txt)",
        "images/drifty.yaml",
        "an override in images/drifty.yaml",
        "bare==1.0.0",  # its metadata requires nothing
        "broken==1.0.0",  # its metadata could not be read: the finding stands without it
        "eng==1.0.0 requires ctensors (any version)",
        "ghost",  # not in the lock
        "pinner==1.0.0 requires ctensors==0.1.0",
        "images/drifty.yaml",
    )


# --- reading the provider's class ------------------------------------------------------------

ANNOTATED = '''from enum import Enum


class Fmt(str, Enum):
    dense: str = "dense"
    label: str
    _order_ = "dense packed"
    packed = "packed"
    width = 4

    def describe(self):
        return self.value

    class Inner:
        pass
'''


def test_enum_and_class_members_with_annotations_and_methods(fam):
    # An enum: an annotated assignment is a member, a bare annotation and _sunder_ are not.
    assert drift._parse_definition(ANNOTATED, fam) == {
        "dense": "dense", "packed": "packed", "width": None}
    # A class: bare annotations (fields), methods and nested classes are members too.
    cls = replace(fam, kind="class")
    assert drift._parse_definition(ANNOTATED + "\n    async def later(self):\n        pass\n",
                                   cls) == {
        "dense": "dense", "label": None, "_order_": "dense packed", "packed": "packed",
        "width": None, "describe": None, "Inner": None, "later": None}


def test_the_text_reader_for_source_this_python_cannot_parse(fam):
    text = ("type Alias = int\n\nclass Fmt(str, Enum):\n    dense = 'dense'\n"
            "    NVFP4 = \"nvfp4-packed\"\n    mixed = (\n \"mixed\")\n    empty = ''\n"
            "    width = 4\n\nX = 1\n")
    assert drift._parse_definition(text, fam) == {
        "dense": "dense", "NVFP4": "nvfp4-packed", "mixed": None, "empty": "", "width": None}


def _zip_wheel(tmp: Path, name: str, files: dict[str, bytes]) -> wheels.Wheel:
    """A wheel as the cache holds one, with bytes no make_wheel text can carry."""
    path = tmp / f"{name}-1.0-py3-none-any.whl"
    with zipfile.ZipFile(path, "w") as z:
        for n, data in files.items():
            z.writestr(n, data)
    return wheels.Wheel(name, "1.0", path.name, None, "cache", 0, path.stat().st_size,
                        zipfile.ZipFile(path))


def test_source_that_is_not_utf8_is_read_with_replacements(tmp_path, fam):
    latin1 = "# caf\xe9 (latin-1)\n".encode("latin-1")
    prov = _zip_wheel(tmp_path, "ctensors", {
        "ctensors/__init__.py": b"", "ctensors/moved.py": latin1 + BASE_OLD.encode()})
    assert drift.definition(prov, fam) == Definition(
        "ctensors", "1.0", "ctensors/moved.py", {"dense": "dense", "packed": "packed"})
    assert drift.values(prov, fam) == {"dense", "packed"}
    eng = _zip_wheel(tmp_path, "eng", {"eng/quant.py": latin1 + b"x = Fmt.nvfp4\n"})
    assert drift.scan(eng, fam) == [Reference("nvfp4", "eng/quant.py", 2, "x = Fmt.nvfp4")]


def test_a_listed_module_gives_the_definition_its_wheel(index, env, fam):
    idx, w = index
    with wheels.fetch_version("ctensors", "0.1.0", [idx.url]) as whl:
        assert drift.definition(whl, fam) == Definition(
            "ctensors", "0.1.0", "ctensors/config/base.py", {"dense": "dense", "packed": "packed"})


# --- scanning the consumer -------------------------------------------------------------------

def test_scan_reads_every_file_and_honours_the_needle(tmp_path, fam):
    eng = _zip_wheel(tmp_path, "eng", {
        "eng/a.py": b"from ctensors import Fmt\nx = Fmt.alpha\n",
        "eng/b.py": b"from ctensors import Fmt\ny = Fmt.beta\n",
        "eng/c.py": b"z = Fmt.gamma  # Fmt re-exported: the provider unnamed\n"})
    assert [r.symbol for r in drift.scan(eng, fam)] == ["alpha", "beta", "gamma"]
    # A needle of the family's own: files without it are not read.
    assert [r.symbol for r in drift.scan(eng, replace(fam, needle="ctensors"))] == [
        "alpha", "beta"]
    # No needle (the reference does not spell the class out): every file is read.
    assert [r.symbol for r in drift.scan(eng, replace(fam, needle=None))] == [
        "alpha", "beta", "gamma"]


def test_scan_text_edges(fam):
    # Private names and the family's ignore list are not references.
    assert drift.scan_text("a = Fmt._missing_\nb = Fmt.value\nc = Fmt.real\n", "f.py", fam) == [
        Reference("real", "f.py", 3, "c = Fmt.real")]
    # The last line without a newline; a long line's code is cut at 200 characters.
    long = "x = Fmt.nvfp4" + " + 1" * 100
    assert drift.scan_text("y = 1\n" + long, "f.py", fam) == [
        Reference("nvfp4", "f.py", 2, long[:200])]
    # Names only inside f-strings (either case of the prefix) are executed, so they count.
    text = 'a = f"{Fmt.lower}"\nb = F"{Fmt.upper}"\nc = rf"{Fmt.raw}"\nd = "Fmt.plain"\n'
    assert [r.symbol for r in drift.scan_text(text, "f.py", fam)] == ["lower", "upper", "raw"]


@pytest.mark.parametrize("text", [
    # A dedent to no outer level: tokenize stops with IndentationError.
    "x = Fmt.real\n    # Fmt.commented\nif x:\n        y = 1\n    z = Fmt.later\n",
    # An unterminated triple-quoted string: TokenError.
    'x = Fmt.real\n  # Fmt.commented\ns = """Fmt.later\n',
])
def test_source_tokenize_refuses_drops_only_whole_line_comments(fam, text):
    assert [r.symbol for r in drift.scan_text(text, "f.py", fam)] == ["real", "later"]


def test_a_match_where_a_string_begins_is_inside_it(fam):
    quoted = replace(fam, reference=r"""["']fmt:(\w+)""", needle=None)
    assert drift.scan_text('a = "fmt:inside"\nb = fmt_of("fmt:also")\n', "f.py", quoted) == []


# --- model formats; the first release ----------------------------------------------------------

def test_checkpoint_formats_from_compression_config_and_default_where():
    config = {"compression_config": {"format": "nvfp4-packed"}}
    assert drift.checkpoint_formats(config) == [
        ("config.json: quantization_config.format", "nvfp4-packed")]


def test_first_version_searches_past_the_first_batches(index, env, fam):
    idx, _ = index
    mfam = replace(fam, provider="many", modules=("many/fmt.py",), kind="class")
    assert drift.first_version(mfam, "always", index_urls=[idx.url]) == "0.1"  # the first
    assert drift.first_version(mfam, "late", index_urls=[idx.url]) == f"0.{MANY}"  # the last
    assert drift.first_version(mfam, "late-value", by="value", index_urls=[idx.url]) == \
        f"0.{MANY}"


# --- the messages, compared whole ------------------------------------------------------------

REQ = ("pinner==1.0.0 requires ctensors==0.1.0", "eng==1.0.0 requires ctensors (any version)",
       "images/drifty.yaml", "the target's requirements (constraints.txt)")
# An engine finding in three places, pinned by a package besides the engine, fixed in 0.10.0.
A = Finding("Fmt", "nvfp4", "eng", "1.0.0", "eng/quant.py", 7, "Fmt.nvfp4.value,", "ctensors",
            "0.1.0", "0.10.0", "engine", also=("eng/quant.py:13", "eng/other.py:2"),
            required_by=REQ, defined_in="ctensors/config/base.py", target="drifty")
A2 = replace(A, symbol="mxfp4", line=9, code="Fmt.mxfp4.value,", first_version="0.9.0", also=())
# In two places, no code line, a provider without the class, and no release has it.
B = Finding("Fmt", "mxfp8", "eng", "1.0.0", "eng/mx.py", 3, "", "ctensors", "0.1.0", None,
            "engine", also=("eng/mx.py:9",), defined_in=None)
# A model's format, fixed in 0.9.0, in a lock whose target is not known.
C = Finding("Fmt", "nvfp4-packed", "model", "", "config.json: quantization_config.format", None,
            "format: nvfp4-packed", "ctensors", "0.1.0", "0.9.0", "model",
            defined_in="ctensors/config/base.py")
# A model's format no release has.
D = Finding("Fmt", "mixed", "eng", "1.0.0", "m.yaml: quantization.formats[1]", None,
            "format: mixed", "ctensors", "0.1.0", None, "model",
            defined_in="ctensors/config/base.py", target="drifty")

A_HEAD = "eng 1.0.0 refers to Fmt.nvfp4, which ctensors 0.1.0 does not have"
A_FACTS = [
    "eng 1.0.0 refers to Fmt.nvfp4 at eng/quant.py:7 (and 2 more places): Fmt.nvfp4.value,",
    "the lock pins ctensors 0.1.0 (required by pinner==1.0.0 requires ctensors==0.1.0; "
    "eng==1.0.0 requires ctensors (any version); images/drifty.yaml; the target's requirements "
    "(constraints.txt))",
    "ctensors has Fmt.nvfp4 from 0.10.0 on",
    "so eng fails when it reaches that line (at import or model load, after the model download) "
    "with: AttributeError: type object 'Fmt' has no attribute 'nvfp4'"]
A_HELP = ("add an override to images/drifty.yaml: requirement 'ctensors>=0.10.0' with a reason "
          "('eng uses Fmt.nvfp4, added in ctensors 0.10.0'), then `imgbuild lock drifty`; "
          "or pick versions of eng, pinner that agree")
B_HEAD = "eng 1.0.0 refers to Fmt.mxfp8, which ctensors 0.1.0 does not have"
B_FACTS = [
    "eng 1.0.0 refers to Fmt.mxfp8 at eng/mx.py:3 (and 1 more place)",
    "the lock pins ctensors 0.1.0",
    "ctensors 0.1.0 defines no class Fmt at all",
    "no released ctensors has it (newest checked: the index's latest)",
    "so eng fails when it reaches that line (at import or model load, after the model download) "
    "with: AttributeError: type object 'Fmt' has no attribute 'mxfp8'"]
B_HELP = "pick a eng version that does not use Fmt.mxfp8, or pick versions of eng that agree"


def test_explain_an_engine_finding():
    assert drift.explain([A]) == [f"error: {A_HEAD}"] + [
        f"  ├─▶ {x}" for x in A_FACTS[:-1]] + [f"  ╰─▶ {A_FACTS[-1]}", f"  help: {A_HELP}"]


def test_explain_an_engine_finding_no_release_fixes():
    assert drift.explain([B]) == [f"error: {B_HEAD}"] + [
        f"  ├─▶ {x}" for x in B_FACTS[:-1]] + [f"  ╰─▶ {B_FACTS[-1]}", f"  help: {B_HELP}"]


def test_explain_model_findings():
    assert drift.explain([C]) + drift.explain([D]) == [
        "error: the model declares format 'nvfp4-packed', which ctensors 0.1.0's Fmt does not "
        "have",
        "  ├─▶ config.json: quantization_config.format: 'nvfp4-packed'",
        "  ├─▶ the lock pins ctensors 0.1.0",
        "  ├─▶ ctensors has Fmt('nvfp4-packed') from 0.9.0 on",
        "  ╰─▶ so model cannot load this checkpoint: ValueError: 'nvfp4-packed' is not a valid "
        "Fmt",
        "  help: add an override to the target's yaml: requirement 'ctensors>=0.9.0' with a "
        "reason ('the model's checkpoint declares format nvfp4-packed, added in ctensors "
        "0.9.0'), then `imgbuild lock TARGET`; or pick versions of model that agree",
        "error: the model declares format 'mixed', which ctensors 0.1.0's Fmt does not have",
        "  ├─▶ m.yaml: quantization.formats[1]: 'mixed'",
        "  ├─▶ the lock pins ctensors 0.1.0",
        "  ├─▶ no released ctensors has it (newest checked: the index's latest)",
        "  ╰─▶ so eng cannot load this checkpoint: ValueError: 'mixed' is not a valid Fmt",
        "  help: this checkpoint needs a ctensors newer than any released; use another model"]


def test_one_override_per_provider_with_two_or_more_findings():
    other = replace(A2, provider="other", provider_version="1.0", first_version="2.0")
    unfixed = [replace(B, provider="third"), replace(B, provider="third", symbol="mxfp6")]
    helps = [ln for ln in drift.explain([other, A, *unfixed, A2]) if ln.startswith("help:")]
    # 0.10.0 is the higher version (not the higher string); one finding, or none with a first
    # version, needs no summary.
    assert helps == ["help: 2 findings for ctensors 0.1.0 (nvfp4, mxfp4); one override covers "
                     "them all: 'ctensors>=0.10.0'"]


def test_as_error_for_one_finding():
    err = drift.as_error([A])
    assert isinstance(err, JobFailed) and err.exit_code == 1
    assert (err.message, err.facts, err.hint) == (A_HEAD, A_FACTS, A_HELP)


def test_as_error_for_findings_with_one_override():
    third = replace(B, provider="third")  # another provider's finding: not in the override
    err = drift.as_error([A, third, A2])
    assert err.message == "3 symbols the locked environment lacks"
    assert err.facts == [A_HEAD, *(f"  {x}" for x in A_FACTS[:-1]),
                         B_HEAD.replace("ctensors", "third"),
                         *(f"  {x}".replace("ctensors", "third") for x in B_FACTS[:-1]),
                         "eng 1.0.0 refers to Fmt.mxfp4, which ctensors 0.1.0 does not have",
                         "  eng 1.0.0 refers to Fmt.mxfp4 at eng/quant.py:9: Fmt.mxfp4.value,",
                         f"  {A_FACTS[1]}",
                         "  ctensors has Fmt.mxfp4 from 0.9.0 on"]
    assert err.hint == ("2 findings for ctensors 0.1.0 (nvfp4, mxfp4); one override covers "
                        "them all: 'ctensors>=0.10.0'")


def test_as_error_without_an_override_gives_the_first_findings_way_out():
    err = drift.as_error([B, D])
    assert err.message == "2 symbols the locked environment lacks"
    assert err.hint == B_HELP
    assert drift.as_error([]) is None
