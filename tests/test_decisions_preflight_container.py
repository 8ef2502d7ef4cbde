"""The image speaks for itself (issue 47): the entrypoint's preflight looks at its own container
(a UID with no passwd entry and no user name set, a cache it cannot write, JIT directories on a
noexec mount) and says what it finds in `imgbuild doctor`'s words. The decisions are pure
functions of plain data (a passwd lookup's answer, the environment, /proc/mounts text, a
writable check's answer), tested here without Docker; the sentences are the catalog's own."""

from __future__ import annotations

import json

import pytest

from imgbuild.catalog import failures as catalog
from imgbuild.catalog.failures import load_failures, preflight_sentences_text
from imgbuild.payload import preflight as pf

from .conftest import ROOT

FAILURES = load_failures(ROOT / "images")
SENTENCES = json.loads((ROOT / "imgbuild" / "payload" / pf.SENTENCES_FILE).read_text())


# --- who the container runs as -------------------------------------------------------------------

def test_a_uid_without_passwd_entry_and_no_user_name_is_the_doctors_failure():
    v, said = pf.check_user(1000910000, None, {"HOME": "/tmp/home"})
    assert v.status == pf.WARN and "1000910000" in v.detail
    assert said == pf.Said("uid-without-passwd-entry", (("uid", "1000910000"),))


@pytest.mark.parametrize("env", [{"USER": "imgbuild"}, {"LOGNAME": "x"}, {"USERNAME": "y"},
                                 {"LNAME": "z"}])
def test_a_user_name_variable_answers_getpass_without_a_passwd_entry(env):
    v, said = pf.check_user(12345, None, env)
    assert (v.status, said) == (pf.PASS, None)
    assert "no passwd entry" in v.detail


def test_an_empty_user_variable_is_no_answer():
    # getpass skips an empty value, as `docker run -e USER=` leaves it
    v, said = pf.check_user(12345, None, {"USER": "", "LOGNAME": ""})
    assert v.status == pf.WARN and said is not None


def test_a_passwd_entry_is_enough():
    assert pf.check_user(0, "root", {}) == (pf.Verdict("user", pf.PASS, "uid 0 (root)"), None)


# --- where it writes -----------------------------------------------------------------------------

def test_caches_resolve_as_their_tools_resolve_them():
    env = {"HOME": "/tmp/home", "HF_HOME": "/models/hf", "TRITON_CACHE_DIR": ""}
    got = {name: path for name, _, path in pf.resolve_caches(env, "/tmp/home", "/tmp", "u")}
    assert got["hf"] == "/models/hf"  # its variable wins
    assert got["triton"] == "/tmp/home/.triton/cache"  # empty: the default under HOME
    assert got["torchinductor"] == "/tmp/torchinductor_u"
    assert got["tmp"] == "/tmp"  # absolute defaults stay


def test_without_home_only_absolute_caches_are_checked():
    got = {name for name, _, _ in pf.resolve_caches({}, "", "/tmp", "u")}
    assert got == {"tmp", "torchinductor"}


def test_can_write_looks_at_the_nearest_directory_and_makes_nothing(tmp_path):
    assert pf.can_write(str(tmp_path / "a" / "b")) is None
    assert not (tmp_path / "a").exists()
    (tmp_path / "f").write_text("")
    assert "is not a directory" in pf.can_write(str(tmp_path / "f" / "hf"))
    ro = tmp_path / "ro"
    ro.mkdir(mode=0o555)
    if pf.os.access(ro, pf.os.W_OK):  # root passes permission bits
        pytest.skip("running as root: permission bits do not stop this user")
    assert "permission denied at" in pf.can_write(str(ro / "hub"))


def test_the_first_unwritable_cache_is_the_failure_and_every_one_is_named():
    v, said = pf.check_caches([("HOME", "/tmp/home", None),
                               ("HF_HOME", "/root/.cache/huggingface", "PermissionError: ..."),
                               ("TRITON_CACHE_DIR", "/ro/triton", "OSError: read-only")])
    assert v.status == pf.WARN
    assert v.detail == "not writable: HF_HOME: PermissionError: ...; TRITON_CACHE_DIR: OSError: read-only"
    assert said == pf.Said("cache-dir-not-writable", (("path", "/root/.cache/huggingface"),))
    assert pf.check_caches([("HOME", "/tmp/home", None)])[1] is None


# --- whether JIT code can run from there ---------------------------------------------------------

MOUNTS = """overlay / overlay ro,relatime,lowerdir=/a,upperdir=/b,workdir=/c 0 0
proc /proc proc rw,nosuid,nodev,noexec,relatime 0 0
tmpfs /tmp tmpfs rw,nosuid,nodev,noexec,relatime 0 0
tmpfs /tmp/home/.triton tmpfs rw,nosuid,nodev,relatime 0 0
/dev/sda1 /models\\040cache ext4 ro,relatime 0 0
"""


def test_mounts_are_read_with_their_options_and_escapes():
    mounts = pf.parse_mounts(MOUNTS + "garbage\n")
    assert ("/models cache", frozenset({"ro", "relatime"})) in mounts
    assert len(mounts) == 5


@pytest.mark.parametrize("path,point", [
    ("/tmp/home/.cache/torch_extensions", "/tmp"),
    ("/tmp/home/.triton/cache", "/tmp/home/.triton"),  # the longest mount point
    ("/tmpfoo/x", "/"),  # a prefix of the name is not a parent
    ("/tmp", "/tmp"),
    ("/models cache/hub", "/models cache"),
])
def test_a_path_lies_on_the_longest_mount_above_it(path, point):
    assert pf.mount_of(path, pf.parse_mounts(MOUNTS))[0] == point


def test_jit_directories_on_a_noexec_mount_are_the_doctors_failure():
    mounts = pf.parse_mounts(MOUNTS)
    v, said = pf.check_exec([("TRITON_CACHE_DIR", "/tmp/home/.triton/cache"),
                             ("TORCH_EXTENSIONS_DIR", "/tmp/home/.cache/torch_extensions")],
                            mounts)
    assert v.status == pf.WARN
    assert "TORCH_EXTENSIONS_DIR" in v.detail and "TRITON_CACHE_DIR" not in v.detail
    assert said == pf.Said("jit-noexec-tmp", (("so", "/tmp/home/.cache/torch_extensions"),))
    # the same directories on `--tmpfs /tmp:rw,exec`
    ok = pf.parse_mounts(MOUNTS.replace("nodev,noexec,relatime 0 0\ntmpfs /tmp/home",
                                        "nodev,relatime 0 0\ntmpfs /tmp/home"))
    assert pf.check_exec([("TORCH_EXTENSIONS_DIR", "/tmp/home/.cache/torch_extensions")],
                         ok) == (pf.Verdict("jit exec", pf.PASS, "1 JIT directories on mounts "
                                            "that allow exec"), None)


def test_no_proc_mounts_is_no_finding():
    assert pf.check_exec([("TRITON_CACHE_DIR", "/x")], [])[1] is None


# --- in the doctor's words -----------------------------------------------------------------------

def test_the_shipped_sentences_are_the_catalogs():
    # One wording: payload/doctor-sentences.json is extracted from images/checks/failures.yaml
    # (`make payload-sentences`, then `make golden`: the file is payload, in the content key).
    shipped = (ROOT / "imgbuild" / "payload" / pf.SENTENCES_FILE).read_text()
    assert shipped == preflight_sentences_text(FAILURES)
    assert set(SENTENCES) == set(catalog.PREFLIGHT_FAILURES)
    assert pf.SENTENCES_FILE == catalog.SENTENCES_FILE


@pytest.mark.parametrize("fid", catalog.PREFLIGHT_FAILURES)
@pytest.mark.parametrize("given", [True, False])
def test_the_image_fills_a_sentence_as_the_doctor_does(fid, given):
    fp = next(f for f in FAILURES.fingerprints if f.id == fid)
    values = {"uid": "1000910000", "path": "/root/.cache/huggingface", "so": "/tmp/x"}
    names = {"uid-without-passwd-entry": "uid", "cache-dir-not-writable": "path",
             "jit-noexec-tmp": "so"}
    have = {names[fid]: values[names[fid]]} if given else {}
    for key in ("title", "cause", "fix"):
        assert pf.fill(SENTENCES[fid][key], have) == catalog.fill(getattr(fp, key), have,
                                                                   set(have))


def test_the_printed_text_names_the_failure_and_its_values():
    text = pf.doctor_text(pf.Said("uid-without-passwd-entry", (("uid", "1000910000"),)),
                          SENTENCES)
    assert text.startswith("imgbuild doctor: uid-without-passwd-entry: ")
    assert "(1000910000)" in text.splitlines()[0] and "Fix: " in text
    assert "{" not in text and "[[" not in text
    # an image whose sentences file lacks the id still names it
    assert pf.doctor_text(pf.Said("jit-noexec-tmp"), {}) == "imgbuild doctor: jit-noexec-tmp"


def test_the_catalog_must_keep_the_failures_the_image_names(tmp_path):
    broken = type(FAILURES)(FAILURES.prefixes,
                            tuple(f for f in FAILURES.fingerprints if f.id != "jit-noexec-tmp"))
    with pytest.raises(catalog.SpecError, match="jit-noexec-tmp missing"):
        catalog.preflight_sentences(broken)


def test_the_container_only_check_is_silent_when_all_pass_and_speaks_on_stderr(monkeypatch,
                                                                              capsys):
    """With the host check skipped (`imgbuild run`, --no-preflight), stdout is the server's or
    the command's: the container's check says nothing when nothing is found, and what it finds
    goes to stderr."""
    from imgbuild.payload import preflight as pf

    ok = [(pf.Verdict("user", pf.PASS, "uid 0 (root)"), None)]
    monkeypatch.setattr(pf, "container_checks", lambda: ok)
    assert pf._container_main(False) == 0
    assert capsys.readouterr() == ("", "")
    bad = ok + [(pf.Verdict("caches", pf.WARN, "HF_HOME not writable"),
                 pf.Said("cache-dir-not-writable", (("path", "/root/.cache/huggingface"),)))]
    monkeypatch.setattr(pf, "container_checks", lambda: bad)
    assert pf._container_main(False) == 0
    out, err = capsys.readouterr()
    assert out == "" and "imgbuild preflight (the container)" in err and "caches" in err


# --- the entrypoint's command line --------------------------------------------------------------

def test_the_preflights_help_says_each_option_and_hides_the_debug_one(capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "100")
    with pytest.raises(SystemExit) as e:
        pf.main(["--help"])
    assert e.value.code == 0
    said = " ".join(capsys.readouterr().out.split())
    assert said.startswith("usage: preflight.py [-h] [--facts FACTS] [--model-dir MODEL_DIR] "
                           "[--json] [--nvidia-smi NVIDIA_SMI] [--container] [--container-only]")
    for words in (pf.__doc__.split("\n\n")[0].split(),
                  ["--facts", "FACTS", "the", "image's", "facts", "file", "(default",
                   "/opt/imgbuild/image.json)"],
                  "--model-dir MODEL_DIR where the model will be stored (default "
                  "IMGBUILD_MODEL_DIR, else the Hugging Face cache)".split(),
                  "--json print a JSON report".split(),
                  "--nvidia-smi NVIDIA_SMI the nvidia-smi binary to run".split()):
        assert " ".join(words) in said, words
    assert "--recording" not in said


def test_the_facts_file_is_the_environments_else_the_images(capsys, monkeypatch, tmp_path):
    monkeypatch.setenv("IMGBUILD_FACTS", str(tmp_path / "elsewhere.json"))
    assert pf.main([]) == 2
    assert capsys.readouterr().err == (f"preflight: no facts file at {tmp_path / 'elsewhere.json'}"
                                       "; pass --facts PATH\n")
    monkeypatch.delenv("IMGBUILD_FACTS")
    if not (pf.Path(pf.FACTS_PATH).exists()):  # not inside an image: the image's path is said
        assert pf.main([]) == 2
        assert capsys.readouterr().err == ("preflight: no facts file at /opt/imgbuild/image.json;"
                                           " pass --facts PATH\n")
