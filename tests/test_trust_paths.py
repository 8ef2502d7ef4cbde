"""The paths that decide what is trusted, tested without the Docker Engine or a registry: the
index's refusal of a platform without a passing smoke report (pipeline/index.py), the wheel
RECORD check of a streamed member (lock/wheels.py, what the kernel scan reads through),
verify's recomputed SBOM (image/attest.py), and the build context that holds no credential
(image/context.py). Each decision is a function of plain data or files, so a bug in it fails
here, not only in a build."""

from __future__ import annotations

import base64
import hashlib
import os
import zipfile
from pathlib import Path

import pytest

from builder.errors import JobFailed
from builder.image import attest
from builder.image.context import Secrets, prepare_build
from builder.lock import wheels
from builder.lock.lockfile import LockedPackage, pins_digest
from builder.pipeline.index import Stored, refusals
from builder.plan.decide import make_plan

from .conftest import checkout_workspace
from .wheelfactory import LocalIndex, WheelSpec

WS = checkout_workspace()
DIGEST = "sha256:" + "ab" * 32


# --- the index: every platform's image there, of its platform, with a passing report ---------

def stored(platform: str, *, report: dict | None = None, arch: str | None = None,
           there: bool = True) -> Stored:
    d = {"mediaType": "application/vnd.oci.image.manifest.v1+json",
         "digest": "sha256:" + hashlib.sha256(platform.encode()).hexdigest(), "size": 1}
    return Stored(platform, f"r/t:t-{platform.split('/')[1]}", d if there else None,
                  arch or platform.split("/")[1], report)


PASSED = {"ok": True}


def test_an_index_is_assembled_only_when_every_platform_passed():
    both = (stored("linux/amd64", report=PASSED), stored("linux/arm64", report=PASSED))
    assert refusals(both) == []
    # Forced: the tags moved by a person's decision, which the report records.
    assert refusals((stored("linux/amd64", report={"ok": False, "forced": True}),)) == []


@pytest.mark.parametrize("second,said", [
    (stored("linux/arm64"), "linux/arm64: no smoke report stored for sha256:"),
    (stored("linux/arm64", report={"ok": False}), "says FAILED"),
    (stored("linux/arm64", report={}), "says FAILED"),
    (stored("linux/arm64", report={"ok": False, "forced": False}), "says FAILED"),
    (stored("linux/arm64", report=PASSED, there=False),
     "linux/arm64: r/t:t-arm64 is not in the registry"),
    (stored("linux/arm64", report=PASSED, arch="amd64"),
     "linux/arm64: r/t:t-arm64 is an image for amd64"),
])
def test_one_platform_without_a_passing_report_refuses_the_whole_index(second, said):
    first = stored("linux/amd64", report=PASSED)
    for order in ((first, second), (second, first)):  # wherever the bad one stands
        problems = refusals(order)
        assert len(problems) == 1 and said in problems[0], problems
        assert problems[0].startswith("linux/arm64: ")
    digest = second.descriptor["digest"] if second.descriptor else None
    if digest and second.report is not None and "FAILED" in said:
        assert f"its smoke report for {digest} says FAILED" in problems[0]


def test_every_platforms_problem_is_said_not_only_the_first():
    problems = refusals((stored("linux/amd64", arch="arm64"),
                         stored("linux/arm64", report={"ok": False})))
    assert problems == [
        "linux/amd64: r/t:t-amd64 is an image for arm64",
        f"linux/amd64: no smoke report stored for {stored('linux/amd64').descriptor['digest']}",
        f"linux/arm64: its smoke report for {stored('linux/arm64').descriptor['digest']} "
        "says FAILED"]


# --- a streamed wheel member is checked against the wheel's RECORD ---------------------------

def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def tampered(path: Path, member: str, data: bytes) -> Path:
    """The wheel with one member's bytes replaced and its RECORD left as it was: what a
    replaced or damaged file on an index looks like when the index's own hash is for it."""
    with zipfile.ZipFile(path) as z:
        members = [(i, z.read(i)) for i in z.infolist()]
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as z:
        for info, body in members:
            z.writestr(info, data if info.filename == member else body)
    return path


@pytest.fixture()
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("IMGBUILD_CACHE", str(tmp_path / "cache"))
    wheels._pages.clear()  # pages are memoized per process
    return tmp_path


KERNEL = "kern/_k.so"


@pytest.fixture()
def kernel_index(tmp_path, cache):
    """An index (pypiserver, loopback, which answers Range) with a wheel whose kernel library
    no longer matches the RECORD row for it, and a sound wheel beside it."""
    idx = LocalIndex(tmp_path / "index")
    files = {"kern/__init__.py": "", KERNEL: "ELF" + "k" * 4000}
    sound = idx.add(WheelSpec("kern", "1.0.0", files=files))
    bad = tampered(idx.add(WheelSpec("kern", "1.0.1", files=files)), KERNEL,
                   b"ELF" + b"x" * 4000)
    idx.start()
    yield idx, {"1.0.0": sound, "1.0.1": bad}
    idx.stop()


def _open_range(idx: LocalIndex, path: Path) -> wheels.Wheel:
    [f] = [f for f in wheels.project_files("kern", idx.url) if f.filename == path.name]
    w = wheels.open_file(f, expect={_sha256(path)}, what=f.filename, mode="range")
    assert w.mode == "range"  # the index's hash chose the file; only RECORD checks members
    return w


def test_a_streamed_member_that_does_not_match_record_is_refused(kernel_index):
    idx, paths = kernel_index
    with _open_range(idx, paths["1.0.1"]) as w:
        with pytest.raises(JobFailed) as e:
            for _ in w.stream(KERNEL, chunk=512):  # in chunks, as the kernel scan reads
                pass
        assert f"member {KERNEL} does not match the wheel's RECORD" in str(e.value)
        want = base64.urlsafe_b64encode(hashlib.sha256(
            b"ELF" + b"k" * 4000).digest()).rstrip(b"=").decode()
        assert e.value.facts[0] == f"RECORD sha256={want}"
        # read() refuses it too, and a member that matches its row still reads.
        with pytest.raises(JobFailed):
            w.read(KERNEL)
        assert w.read("kern/__init__.py") == b""


def test_a_streamed_member_that_matches_record_streams_whole(kernel_index):
    idx, paths = kernel_index
    with _open_range(idx, paths["1.0.0"]) as w:
        assert b"".join(w.stream(KERNEL, chunk=512)) == b"ELF" + b"k" * 4000
        assert w.transferred > 0


def test_a_member_the_record_does_not_list_is_not_refused(tmp_path, cache):
    # A RECORD row is what is checked; a wheel whose RECORD names no hash for a member (its
    # own RECORD row, say) has nothing to check it against.
    idx = LocalIndex(tmp_path / "index")
    path = idx.add(WheelSpec("kern", "1.0.0", files={"kern/__init__.py": "x = 1\n"}))
    idx.start()
    try:
        with _open_range(idx, path) as w:
            rec = "kern-1.0.0.dist-info/RECORD"
            assert b"".join(w.stream(rec)).endswith(b"RECORD,,\n")
    finally:
        idx.stop()


# --- verify recomputes the SBOM's pins ------------------------------------------------------

@pytest.fixture(scope="module")
def tiny():
    plan = make_plan(WS, "tiny-cpu", resolve=False)
    return plan, WS.target("tiny-cpu", plan.platform).lock()


def sbom_of(tiny) -> dict:
    plan, lock = tiny
    return attest.sbom(plan, lock, DIGEST, [{"name": "libc6", "version": "2.36-9",
                                             "arch": "amd64"}])


def test_an_sbom_as_written_verifies_against_its_lock(tiny):
    _, lock = tiny
    check, ok, detail = attest.check_sbom(sbom_of(tiny), lock.digest)
    assert (check, ok) == ("sbom", True)
    assert detail == (f"{len(lock.packages)} locked packages, 1 OS packages; their pins match "
                      "the image's lock label")


@pytest.mark.parametrize("tamper", ["version", "drop", "hash", "add"])
def test_a_tampered_sbom_is_caught_although_its_lock_property_is_unchanged(tiny, tamper):
    _, lock = tiny
    doc = sbom_of(tiny)
    pypi = [c for c in doc["components"] if c["purl"].startswith("pkg:pypi/")]
    c = next(c for c in pypi if c["name"] == "torch")
    if tamper == "version":
        c["version"] = "2.13.1"
    elif tamper == "drop":
        doc["components"].remove(c)
    elif tamper == "hash":
        c["hashes"][0]["content"] = "0" * 64
    else:
        doc["components"].append({"type": "library", "name": "evil", "version": "1",
                                  "purl": "pkg:pypi/evil@1", "hashes": []})
    # The property still names the lock: only recomputing the pins tells.
    [prop] = doc["metadata"]["component"]["properties"]
    assert prop == {"name": "io.imgbuild.lock.hash", "value": lock.digest}
    check, ok, detail = attest.check_sbom(doc, lock.digest)
    assert not ok and f"differ from the image's lock label ({lock.digest})" in detail
    got = pins_digest(tuple(LockedPackage(c["name"], c["version"], tuple(
        "sha256:" + h["content"] for h in c["hashes"]))
        for c in doc["components"] if c["purl"].startswith("pkg:pypi/")))
    assert f"({got[:19]}…)" in detail


def test_an_os_package_does_not_count_as_a_locked_one(tiny):
    # A deb component named like a locked package is not one of the lock's pins.
    _, lock = tiny
    doc = sbom_of(tiny)
    doc["components"].append({"type": "library", "name": "torch", "version": "9",
                              "purl": "pkg:deb/debian/torch@9?arch=amd64"})
    check, ok, detail = attest.check_sbom(doc, lock.digest)
    assert ok and "2 OS packages" in detail


def test_verify_judges_report_sbom_lock_and_provenance_on_plain_data(tiny):
    plan, lock = tiny
    labels = {"io.imgbuild.lock.hash": lock.digest}
    prov = attest.provenance(plan, DIGEST, "0" * 40)
    good = attest.judge(DIGEST, labels, {"ok": True}, sbom_of(tiny), prov, lock)
    assert [(c, ok) for c, ok, _ in good] == [("smoke report", True), ("sbom", True),
                                              ("lock", True), ("provenance", True)]
    assert good[0][2] == "passed" and good[3][2] == "names this digest"
    assert good[2][2] == f"{lock.path.name} is the lock the image was built from"
    # Nothing stored beside the image: every attestation check fails, said as such.
    none = attest.judge(DIGEST, labels, None, None, None)
    assert none == [("smoke report", False, "none stored"), ("sbom", False, "none stored"),
                    ("provenance", False, "none stored")]
    failed = attest.judge(DIGEST, labels, {"ok": False}, None, None)[0]
    assert failed == ("smoke report", False, "FAILED")
    forced = attest.judge(DIGEST, labels, {"ok": False, "forced": True}, None, None)[0]
    assert forced == ("smoke report", True, "FAILED (tags moved with --force)")
    # The image's label names another lock than the workspace's.
    other = attest.judge(DIGEST, {"io.imgbuild.lock.hash": "sha256:" + "0" * 64},
                         {"ok": True}, sbom_of(tiny), prov, lock)
    assert [(c, ok) for c, ok, _ in other] == [("smoke report", True), ("sbom", False),
                                               ("lock", False), ("provenance", True)]
    assert other[2][2] == f"{lock.path.name} is not the lock the image was built from"
    # Provenance about another image.
    elsewhere = attest.provenance(plan, "sha256:" + "cd" * 32, None)
    last = attest.judge(DIGEST, labels, {"ok": True}, sbom_of(tiny), elsewhere)[-1]
    assert last == ("provenance", False, f"names another image: {{'sha256': '{'cd' * 32}'}}")
    assert attest.judge(DIGEST, labels, {"ok": True}, None, {})[-1] == (
        "provenance", False, "names another image: None")


# --- the build context holds no credential --------------------------------------------------

SECRET = "s3cr3t-" + "q7" * 8  # in the index URL: what uv needs inside the build
HOST_SECRET = "h0st-" + "z9" * 8  # in the host's own netrc


def _every_byte(root: Path) -> list[tuple[Path, bytes]]:
    out = []
    for dirpath, dirnames, filenames in os.walk(root):
        for n in dirnames + filenames:
            p = Path(dirpath) / n
            out.append((p, os.fsencode(n)))  # a name could leak it too
            if p.is_file() and not p.is_symlink():
                out.append((p, p.read_bytes()))
    return out


def test_the_build_context_holds_no_credential_and_the_netrc_lies_beside_it(tiny, tmp_path):
    plan, lock = tiny
    host_netrc = tmp_path / "host-netrc"
    host_netrc.write_text(f"machine other.example login me password {HOST_SECRET}\n")
    ca = tmp_path / "ca.crt"
    ca.write_text("-----BEGIN CERTIFICATE-----\n")
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    built = prepare_build(plan, lock, scratch, wheels=None, smoke_model_dir=None, patches={},
                          index_urls=(f"https://probe:{SECRET}@idx.example/simple/",),
                          host=Secrets(ca, host_netrc))
    ctx = built.context
    assert (ctx / "Dockerfile").is_file() and (ctx / "lock" / "lock.txt").is_file()
    leaks = [p for p, data in _every_byte(ctx)
             if SECRET.encode() in data or HOST_SECRET.encode() in data]
    assert leaks == []
    netrc = built.secrets.netrc
    assert netrc is not None and not netrc.resolve().is_relative_to(ctx.resolve())
    assert not ctx.resolve().is_relative_to(netrc.parent.resolve())  # beside, not above it
    text = netrc.read_text()
    assert f"password {SECRET}" in text and HOST_SECRET in text  # both reach uv, as a secret
    assert netrc.stat().st_mode & 0o077 == 0 and netrc.parent.stat().st_mode & 0o077 == 0
    # The docker command line names them as secrets, by path outside the context.
    args = built.secrets.args()
    assert args == ["--secret", f"id=cacert,src={ca}", "--secret", f"id=netrc,src={netrc}"]


def test_without_index_credentials_the_hosts_secrets_are_passed_as_they_are(tiny, tmp_path):
    plan, lock = tiny
    host = Secrets(None, None)
    built = prepare_build(plan, lock, tmp_path, wheels=None, smoke_model_dir=None, patches={},
                          index_urls=("https://idx.example/simple/",), host=host)
    assert built.secrets == host and built.carried == ()
    assert built.context == tmp_path / "context" and (tmp_path / "secrets").is_dir()
    assert list((tmp_path / "secrets").iterdir()) == []
