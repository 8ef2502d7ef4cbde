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

from imgbuild.errors import JobFailed
from imgbuild.image import attest
from imgbuild.image.context import Secrets, prepare_build
from imgbuild.lock import wheels
from imgbuild.lock.lockfile import LockedPackage, pins_digest
from imgbuild.pipeline.index import Stored, refusals
from imgbuild.plan.decide import make_plan

from .conftest import checkout_workspace
from .wheelfactory import LocalIndex, WheelSpec, make_wheel

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


def test_a_missing_platform_does_not_hide_the_next_ones_problem():
    problems = refusals((stored("linux/amd64", there=False),
                         stored("linux/arm64", report={"ok": False})))
    assert [p.split(":")[0] for p in problems] == ["linux/amd64", "linux/arm64"]
    assert problems[0] == "linux/amd64: r/t:t-amd64 is not in the registry"


def test_an_assembled_index_says_what_it_lists_and_pushed():
    from imgbuild.pipeline.index import Assembled
    from imgbuild.plan.index import make_index_plan

    ix = make_index_plan(WS, "tiny-cpu-multi", repository="reg.example/r", resolve=False)
    digest = "sha256:" + "ef" * 32
    a = Assembled(ix, digest, (("linux/amd64", "sha256:a"), ("linux/arm64", "sha256:b")),
                  (f"{ix.ref()}@{digest}",))
    assert a.to_dict() == {
        "target": "tiny-cpu-multi", "content_tag": ix.content_tag, "refs": list(ix.refs),
        "digest": digest, "manifests": {"linux/amd64": "sha256:a", "linux/arm64": "sha256:b"},
        "pushed": [f"{ix.ref()}@{digest}"], "signed": [], "signed_by": None}


# --- which platform's image a pull takes -----------------------------------------------------

def test_a_pull_takes_the_platform_asked_for_else_the_hosts_else_the_only_one():
    from imgbuild.errors import InputError
    from imgbuild.pipeline.pull import choose_platform

    both = ("linux/amd64", "linux/arm64")
    assert choose_platform(both, "linux/arm64", "linux/amd64", "t") == (
        "linux/arm64", "asked for with --platform")
    assert choose_platform(both, None, "linux/arm64", "t") == (
        "linux/arm64", "this host's platform")
    assert choose_platform(("linux/arm64",), None, "linux/amd64", "t") == (
        "linux/arm64", "the target's only platform (this host is linux/amd64)")
    with pytest.raises(InputError) as e:
        choose_platform(both, "linux/riscv64", "linux/amd64", "t")
    assert str(e.value) == "target 't' has no image for linux/riscv64"
    assert e.value.facts == ["it is built for linux/amd64, linux/arm64"]
    assert e.value.hint == "pass one of those to --platform"
    with pytest.raises(InputError) as e:  # asked for: never swapped for the host's own
        choose_platform(("linux/amd64",), "linux/arm64", "linux/amd64", "t")
    with pytest.raises(InputError) as e:
        choose_platform(both, None, "linux/s390x", "t")
    assert str(e.value) == "target 't' has no image for this host's platform linux/s390x"
    assert e.value.facts == ["it is built for linux/amd64, linux/arm64"]
    assert e.value.hint == ("pass --platform to pull one of those anyway (another CPU's image "
                            "runs here only under QEMU user emulation)")


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


def test_a_build_that_could_not_reach_an_extra_index_is_told_to_use_a_wheel_directory():
    from imgbuild.pipeline.obtain import unreachable_hint

    torch, other = "https://download.pytorch.org/whl/cpu", "https://idx.example/simple"
    tail = ["#9 1.2 error: Failed to fetch: https://download.pytorch.org/whl/cpu/torch/"]
    assert unreachable_hint((other, torch), tail, False) == (
        f"{torch} is out of reach from the build; a local directory holding the same wheels "
        "can stand in for it: --wheels DIR (or IMGBUILD_WHEELS)")
    # The first of several that failed is named.
    both = [f"error: Failed to fetch: {other}/x/", *tail]
    assert unreachable_hint((other, torch), both, False).startswith(f"{other} is out of reach")
    # A wheel directory stood in already, or nothing failed to fetch: the build's own hint.
    assert unreachable_hint((torch,), tail, True) is None
    assert unreachable_hint((torch,), ["error: No space left on device"], False) is None
    assert unreachable_hint((), tail, False) is None


# --- what the attestations say, whole --------------------------------------------------------

def test_an_sboms_document_whole(tiny):
    plan, lock = tiny
    doc = sbom_of(tiny)
    pypi = [c for c in doc["components"] if c["purl"].startswith("pkg:pypi/")]
    assert len(pypi) == len(lock.packages) == len(doc["components"]) - 1
    torch = lock.package("torch")
    assert next(c for c in pypi if c["name"] == "torch") == {
        "type": "library", "name": "torch", "version": torch.version,
        "purl": f"pkg:pypi/torch@{torch.version}",
        "hashes": [{"alg": "SHA-256", "content": h.split(":", 1)[1]} for h in torch.hashes]}
    assert doc["components"][-1] == {"type": "library", "name": "libc6", "version": "2.36-9",
                                     "purl": "pkg:deb/debian/libc6@2.36-9?arch=amd64"}
    assert {k: v for k, v in doc.items() if k != "components"} == {
        "bomFormat": "CycloneDX", "specVersion": "1.5", "version": 1,
        # The same digest always gives this serial number (a version-5-shaped UUID).
        "serialNumber": "urn:uuid:7b28e61b-c1d2-5223-8192-478f2c9d3b56",
        "metadata": {
            "tools": {"components": [{"type": "application", "name": "imgbuild",
                                      "version": attest.imgbuild_version()}]},
            "component": {"type": "container", "name": "imgbuild",
                          "version": plan.content_tag, "bom-ref": DIGEST,
                          "properties": [{"name": "io.imgbuild.lock.hash",
                                          "value": lock.digest}]}}}


def test_a_provenance_statement_whole(tiny):
    import dataclasses

    plan, _ = tiny
    patched = dataclasses.replace(plan, patch_digest="sha256:" + "11" * 32,
                                  applied_patches=("one", "two"))
    doc = attest.provenance(patched, DIGEST, "c0ffee")
    assert doc == {
        "_type": "https://in-toto.io/Statement/v1",
        "subject": [{"name": plan.ref(), "digest": {"sha256": "ab" * 32}}],
        "predicateType": "https://slsa.dev/provenance/v1",
        "predicate": {
            "buildDefinition": {
                "buildType": "https://github.com/imgbuild/imgbuild/build/v1",
                "externalParameters": {"target": "tiny-cpu", "model": None, "archs": ["cpu"],
                                       "flavor": plan.flavor,
                                       "content_key": plan.content_key},
                "resolvedDependencies": [
                    {"uri": plan.base_image,
                     "digest": {"sha256": plan.base_digest.split(":", 1)[1]}},
                    {"uri": f"lockfiles/{Path(plan.lock_path).name}",
                     "digest": {"sha256": plan.lock_hash.split(":", 1)[1]}},
                    {"uri": "images/tiny-cpu.yaml",
                     "digest": {"sha256": plan.spec_digest.split(":", 1)[1]}},
                    {"uri": "patches:one,two", "digest": {"sha256": "11" * 32}},
                    {"uri": "smoke-model:tiny-nvfp4",
                     "digest": {"sha256": plan.smoke_model_key}}]},
            "runDetails": {"builder": {"id": f"imgbuild {attest.imgbuild_version()}"},
                           "metadata": {"source": {"git_commit": "c0ffee"}}}}}
    # No patches, no smoke model, a base known by no digest: those lines are left out.
    bare = dataclasses.replace(plan, smoke_model_key=None, base_digest=None)
    deps = attest.provenance(bare, DIGEST, None)["predicate"]["buildDefinition"][
        "resolvedDependencies"]
    assert [d["uri"].split(":")[0].split("/")[0] for d in deps] == [
        plan.base_image.split(":")[0], "lockfiles", "images"]
    assert deps[0]["digest"] == {}


def test_artifact_tags_version_and_bytes():
    assert attest.tag(DIGEST, "sbom") == "sha256-" + "ab" * 32 + ".sbom"
    assert attest.tag(DIGEST, "provenance").endswith(".provenance")
    from importlib.metadata import version
    assert attest.imgbuild_version() == version("imgbuild")
    assert attest.dumps({"b": 1, "a": [1]}) == b'{\n  "a": [\n    1\n  ],\n  "b": 1\n}'


def test_the_workspaces_git_commit_is_recorded_and_none_outside_git(tmp_path):
    import subprocess

    assert attest.git_commit(tmp_path) is None
    subprocess.run(["git", "init", "-q", str(tmp_path)], check=True)
    subprocess.run(["git", "-C", str(tmp_path), "-c", "user.name=t", "-c", "user.email=t@t",
                    "commit", "-q", "--allow-empty", "-m", "x"], check=True)
    head = subprocess.run(["git", "-C", str(tmp_path), "rev-parse", "HEAD"],
                          capture_output=True, text=True, check=True).stdout.strip()
    assert attest.git_commit(tmp_path) == head and len(head) == 40


DPKG = """Package: zlib1g
Status: install ok installed
Version: 1:1.2.13.dfsg-1
Architecture: amd64
Description: compression library: deflate
 a continuation line: with a colon
Conffiles:
 /etc/zlib.conf 0123abcd

Package: libc6
Status: install ok installed
Version: 2.36-9+deb12u4
Architecture: amd64

Package: gone
Status: deinstall ok config-files
Version: 1.0

Package: half
Status: install reinstreq half-installed
Version: 1.0

Package: bare
Status: install ok installed
"""


def test_the_base_os_packages_are_the_installed_ones_by_name():
    assert attest.dpkg_packages(DPKG) == [
        {"name": "bare", "version": "", "arch": ""},
        {"name": "libc6", "version": "2.36-9+deb12u4", "arch": "amd64"},
        {"name": "zlib1g", "version": "1:1.2.13.dfsg-1", "arch": "amd64"}]
    assert attest.dpkg_packages("") == []
    assert attest.dpkg_packages("Status: install ok installed\nVersion: 1\n") == []


# --- the build's inputs: secrets from the host, the context's files --------------------------

def test_the_hosts_secrets_come_from_the_environment_then_the_usual_places(tmp_path,
                                                                          monkeypatch):
    from imgbuild.image import context

    ca, other_ca, netrc = (tmp_path / n for n in ("ca.crt", "ssl.crt", "netrc"))
    for p in (ca, other_ca, netrc):
        p.write_text("x\n")
    for var in ("IMGBUILD_CA_BUNDLE", "SSL_CERT_FILE", "IMGBUILD_NETRC"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))  # no ~/.netrc there
    monkeypatch.setattr(context, "CA_BUNDLES", (str(tmp_path / "none.crt"), str(other_ca)))
    assert Secrets.from_host() == Secrets(other_ca, None)  # the first bundle that exists
    monkeypatch.setattr(context, "CA_BUNDLES", (str(tmp_path / "none.crt"),))
    assert Secrets.from_host() == Secrets(None, None)  # none: the build goes without one
    monkeypatch.setattr(context, "CA_BUNDLES", (str(tmp_path / "none.crt"), str(other_ca)))
    monkeypatch.setenv("SSL_CERT_FILE", str(other_ca))
    monkeypatch.setenv("IMGBUILD_CA_BUNDLE", str(ca))
    monkeypatch.setenv("IMGBUILD_NETRC", str(netrc))
    assert Secrets.from_host() == Secrets(ca, netrc)  # imgbuild's own variable first
    monkeypatch.delenv("IMGBUILD_CA_BUNDLE")
    assert Secrets.from_host().cacert == other_ca
    # Named but missing: no secret (a build secret whose file is missing fails the build).
    monkeypatch.setenv("SSL_CERT_FILE", str(tmp_path / "gone.crt"))
    monkeypatch.setenv("IMGBUILD_NETRC", str(tmp_path / "gone"))
    assert Secrets.from_host() == Secrets(None, None)
    monkeypatch.delenv("IMGBUILD_NETRC")
    (tmp_path / "home").mkdir()
    (tmp_path / "home" / ".netrc").write_text("machine h\n")
    assert Secrets.from_host().netrc == tmp_path / "home" / ".netrc"
    assert Secrets(None, None).args() == []
    assert Secrets(ca, None).args() == ["--secret", f"id=cacert,src={ca}"]


def test_the_index_netrc_names_each_credentialed_host_before_the_hosts_own(tmp_path):
    host = tmp_path / "host-netrc"
    host.write_text("machine other.example login me password p0\n")
    s = Secrets(None, host).with_index_credentials(
        ("https://u%40x:p%2F1@one.example/simple/", "https://two.example/simple/",
         "http://v:p2@three.example:8080/simple/"), tmp_path)
    assert s.netrc == tmp_path / "netrc" and s.cacert is None
    assert s.netrc.read_text() == (
        "machine one.example login u@x password p/1\n"
        "machine three.example login v password p2\n"
        "machine other.example login me password p0\n")
    assert s.netrc.stat().st_mode & 0o777 == 0o600
    # No host netrc: only the index's lines.
    again = Secrets(None, None).with_index_credentials(("https://a:b@one.example/s/",),
                                                       tmp_path)
    assert again.netrc.read_text() == "machine one.example login a password b\n"


def test_the_context_carries_only_the_wheels_the_lock_pins(tiny, tmp_path):
    from imgbuild.image.context import index_flags, local_wheels

    plan, lock = tiny
    torch = lock.package("torch")
    d = tmp_path / "wheels"
    stranger = make_wheel(WheelSpec("stranger", "1.0"), d)
    assert local_wheels(lock, None) == [] and local_wheels(lock, d) == []
    # A wheel whose sha256 the lock pins (the lock as if it pinned it among torch's hashes).
    import dataclasses
    sha = "sha256:" + _sha256(stranger)
    lock2 = dataclasses.replace(lock, packages=tuple(
        dataclasses.replace(p, hashes=(*p.hashes, sha)) if p is torch else p
        for p in lock.packages))
    assert local_wheels(lock2, d) == [stranger]
    built = prepare_build(plan, lock2, tmp_path / "s", wheels=d, smoke_model_dir=None,
                          patches={}, index_urls=(), host=Secrets(None, None))
    assert built.carried == (stranger,)
    assert (built.context / "wheels" / stranger.name).read_bytes() == stranger.read_bytes()
    assert index_flags(plan, True) == (
        "--find-links /opt/imgbuild-wheels --index-strategy unsafe-best-match")
    assert index_flags(plan, False) == ("--extra-index-url https://download.pytorch.org/whl/"
                                        "cpu --index-strategy unsafe-best-match")
    assert index_flags(dataclasses.replace(plan, extra_index_urls=()), False) == ""


def test_the_hosts_pypi_mirror_is_where_lock_and_build_fetch_from(tiny, tmp_path, monkeypatch):
    """Behind a firewall that reaches only a mirror: UV_DEFAULT_INDEX, UV_INDEX_URL or
    PIP_INDEX_URL (uv reads the first two, not the third) names it for the lock's uv and the
    build's, its password in the build's netrc secret only, and no tag changes."""
    import dataclasses

    from imgbuild.image.context import index_flags
    from imgbuild.lock import uv
    from imgbuild.lock.lockfile import LockRequest

    plan, lock = tiny
    for v in wheels.MIRROR_VARS:
        monkeypatch.delenv(v, raising=False)
    req = LockRequest("t", "3.11", "x86_64-manylinux_2_36", ("x",), ())
    assert wheels.mirror_index() is None and uv.index_args(req, None) == []
    assert index_flags(plan, False, None) == index_flags(plan, False)
    url = f"https://ci:{SECRET}@mirror.example/pypi/simple/"
    monkeypatch.setenv("PIP_INDEX_URL", "https://pip-only.example/simple/")
    monkeypatch.setenv("UV_INDEX_URL", url)
    assert wheels.mirror_index() == url  # uv's variables before pip's
    assert wheels.default_index_urls() == (url,)
    assert uv.index_args(req, None) == ["--default-index", url]
    assert uv.index_args(req, None, mirror=False) == []  # a caller that names its own index
    assert make_plan(WS, "tiny-cpu", resolve=False).content_tag == plan.content_tag
    bare = dataclasses.replace(plan, extra_index_urls=())
    assert index_flags(bare, False, url) == "--default-index https://mirror.example/pypi/simple/"
    assert index_flags(plan, True, url) == (
        "--default-index https://mirror.example/pypi/simple/ --find-links /opt/imgbuild-wheels "
        "--index-strategy unsafe-best-match")
    assert index_flags(plan, False, url).startswith(
        "--default-index https://mirror.example/pypi/simple/ --extra-index-url ")
    netrc = Secrets(None, None).with_index_credentials((url,), tmp_path).netrc
    assert netrc is not None and f"password {SECRET}" in netrc.read_text()
    assert "mirror.example" in netrc.read_text()
    monkeypatch.delenv("UV_INDEX_URL")
    assert uv.index_args(req, None) == ["--default-index", "https://pip-only.example/simple/"]


def test_the_context_holds_the_rendered_build_and_the_smoke_checkpoint(tiny, tmp_path):
    from imgbuild.plan import render

    plan, lock = tiny
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text("{}")
    built = prepare_build(plan, lock, tmp_path / "s", wheels=None, smoke_model_dir=model,
                          patches={}, index_urls=(), host=Secrets(None, None))
    ctx = built.context
    assert (ctx / "Dockerfile").read_text() == render.dockerfile(plan)
    assert (ctx / "lock" / "heavy.txt").read_text() == lock.requirements_text(heavy=True)
    assert (ctx / "lock" / "rest.txt").read_text() == lock.requirements_text(heavy=False)
    assert (ctx / "lock" / "lock.txt").read_bytes() == lock.path.read_bytes()
    assert not (ctx / "lock" / "heavy-torch.txt").exists()  # not split: one heavy layer
    assert os.access(ctx / "tools" / "uv", os.X_OK)
    for name in render.PAYLOAD_FILES:
        assert (ctx / "payload" / name).read_bytes() == (render.PAYLOAD_DIR / name).read_bytes()
    assert (ctx / "payload" / "entrypoint.sh").read_text() == render.entrypoint_sh()
    assert (ctx / "payload" / "image.json").read_text() == render.image_facts(plan)
    assert (ctx / "smoke" / "model" / "config.json").read_text() == "{}"
    assert list((ctx / "wheels").iterdir()) == [] and not (ctx / "patchset").exists()
    assert sorted(os.listdir(ctx)) == ["Dockerfile", "lock", "payload", "smoke", "tools",
                                       "wheels"]
    bare = prepare_build(plan, lock, tmp_path / "t", wheels=None, smoke_model_dir=None,
                         patches={}, index_urls=(), host=Secrets(None, None)).context
    assert os.listdir(bare / "smoke") == ["model"] and os.listdir(bare / "smoke" / "model") == []


def test_a_patched_targets_context_carries_its_patch_layer(tmp_path):
    from imgbuild.plan import patchset

    plan = make_plan(WS, "sglang-0516-blackwell", resolve=False)
    lock = WS.target("sglang-0516-blackwell", plan.platform).lock()
    assert plan.patch_digest
    built = prepare_build(plan, lock, tmp_path, wheels=None, smoke_model_dir=None,
                          patches=WS.patches, index_urls=(), host=Secrets(None, None))
    want = patchset.context_files(plan.patches, lock, WS.patches)
    got = {str(p.relative_to(built.context / "patchset")): p.read_text()
           for p in (built.context / "patchset").rglob("*") if p.is_file()}
    assert got == want and "patcher.py" in got


def test_a_file_on_another_filesystem_is_copied_into_the_context(tmp_path):
    from imgbuild.image.context import _link_or_copy

    shm = Path("/dev/shm")
    if not shm.is_dir() or shm.stat().st_dev == tmp_path.stat().st_dev:
        pytest.skip("needs a second filesystem (/dev/shm) to make os.link fail")
    src = shm / f"imgbuild-test-{os.getpid()}"
    src.write_bytes(b"uv")
    try:
        _link_or_copy(src, tmp_path / "tools" / "uv")
        assert (tmp_path / "tools" / "uv").read_bytes() == b"uv"
        assert (tmp_path / "tools" / "uv").stat().st_ino != src.stat().st_ino
    finally:
        src.unlink()


def test_a_context_that_cannot_be_written_is_said_with_the_path(tiny, tmp_path):
    from imgbuild.errors import EnvError

    plan, lock = tiny
    (tmp_path / "context").mkdir()  # in the way: prepare_context makes it
    (tmp_path / "context" / "lock").mkdir()
    with pytest.raises(EnvError) as e:
        prepare_build(plan, lock, tmp_path, wheels=None, smoke_model_dir=None, patches={},
                      index_urls=(), host=Secrets(None, None))
    assert str(e.value).startswith(f"cannot write the build context {tmp_path / 'context'}: ")
    assert e.value.facts == [f"{tmp_path / 'context'} is removed"]


def test_a_pulls_outcome_says_what_was_pulled_and_verified(tiny):
    from imgbuild.pipeline.pull import PullOutcome

    plan, _ = tiny
    v = attest.Verification(plan.ref(), DIGEST, (("sbom", True, "d"),))
    out = PullOutcome(plan, plan.ref(), DIGEST, DIGEST, {"ok": True}, v, "linux/amd64",
                      "this host's platform", ("imgbuild:tiny-cpu",), "sha256:" + "9" * 64)
    assert out.to_dict() == {
        "target": "tiny-cpu", "ref": plan.ref(), "digest": DIGEST, "registry_digest": DIGEST,
        "refs": [plan.ref(), "imgbuild:tiny-cpu"], "platform": "linux/amd64",
        "platform_why": "this host's platform", "index_digest": "sha256:" + "9" * 64,
        "smoke_report": {"ok": True},
        "verified": {"ref": plan.ref(), "digest": DIGEST, "ok": True,
                     "checks": [{"check": "sbom", "ok": True, "detail": "d"}]}}
    bare = PullOutcome(plan, plan.ref(), DIGEST, DIGEST).to_dict()
    assert bare["verified"] is None and bare["refs"] == [plan.ref()] and bare["platform"] == ""
    assert not attest.Verification("r", DIGEST, (("a", True, ""), ("b", False, ""))).ok


def test_an_sbom_missing_parts_fails_its_check_without_a_traceback(tiny):
    # Whoever tampers with an SBOM may drop any key; verify still answers, as a failed check.
    _, lock = tiny
    empty = pins_digest(())
    assert attest.check_sbom({}, lock.digest) == (
        "sbom", False, f"0 locked packages, 0 OS packages; their pins ({empty[:19]}…) differ "
        f"from the image's lock label ({lock.digest})")
    doc = {"components": [{"name": "torch", "version": "1", "purl": "pkg:pypi/torch@1"},
                          {"name": "nameless-purl", "version": "1"}]}
    unhashed = pins_digest((LockedPackage("torch", "1", ()),))
    assert attest.check_sbom(doc, unhashed) == (
        "sbom", True, "1 locked packages, 0 OS packages; their pins match the image's lock "
        "label")


def test_the_hosts_proxy_reaches_the_build_by_name_only():
    """The docker CLI reads each named proxy variable from its environment: a proxy password
    is on no command line (`ps` shows them), and an unset or empty one is not passed."""
    from imgbuild.image.buildkit import proxy_args

    env = {"HTTPS_PROXY": f"http://u:{SECRET}@proxy.example:3128", "no_proxy": "127.0.0.1",
           "HTTP_PROXY": "", "PATH": "/usr/bin"}
    assert proxy_args(env) == ["--build-arg", "HTTPS_PROXY", "--build-arg", "no_proxy"]
    assert proxy_args({}) == []
