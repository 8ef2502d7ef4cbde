"""How a Debian base is made here (image/base.py _debootstrap_import, _load_foreign,
check_emulation), without an Engine or a mirror: which bytes its one layer is, what the
Engine is handed and what it must have stored, and what each failure says.

debootstrap is a stand-in that lays out a small root the way the real one leaves it (logs,
apt's lists, the build host's name, files owned by a user, mtimes of the moment); tar is the
machine's GNU tar, as in a real bootstrap; the docker client is a script that keeps what it was
handed. A real bootstrap against Debian's mirror is tests/test_anywhere.py's
test_bootstrap_is_reproducible (slow group)."""

from __future__ import annotations

import hashlib
import io
import json
import sys
import tarfile
from pathlib import Path
from types import SimpleNamespace

import pytest

from imgbuild.errors import EnvError, JobFailed
from imgbuild.image import base

EPOCH = 1700000000
# The real debootstrap's arguments end in SUITE ROOT MIRROR; the root it leaves holds what
# _normalize clears beside what it keeps, a file of another owner, and mtimes of the moment.
DEBOOTSTRAP = """#!/bin/sh
for a in "$@"; do echo "$a"; done > {seen}/args
root=$(eval echo \\${{$(($# - 1))}})
mkdir -p $root/etc $root/var/log/apt $root/var/lib/apt/lists $root/usr/bin $root/home/u
printf 'ID=debian\\n' > $root/etc/os-release
printf 'buildhost\\n' > $root/etc/hostname
printf 'nameserver 10.0.0.1\\n' > $root/etc/resolv.conf
echo log > $root/var/log/dpkg.log
echo list > $root/var/lib/apt/lists/mirror_Packages
printf '#!/bin/sh\\n' > $root/usr/bin/python3 && chmod 755 $root/usr/bin/python3
ln -s python3 $root/usr/bin/python
echo mine > $root/home/u/.profile && chown 1000:1000 $root/home/u/.profile
n=$(cat {seen}/runs 2>/dev/null || echo 0); echo $((n + 1)) > {seen}/runs
touch -d @$((1600000000 + n * 86400)) $root/etc/os-release $root/usr/bin/python3
"""
# The docker client: keeps its arguments and what it was given (stdin, or load -i FILE).
DOCKER = """import json, shutil, sys
seen = sys.argv[1]
json.dump(sys.argv[2:], open(seen + "/docker-args", "w"))
if sys.argv[2] == "load":
    shutil.copy(sys.argv[sys.argv.index("-i") + 1], seen + "/given")
else:
    open(seen + "/given", "wb").write(sys.stdin.buffer.read())
fail = open(seen + "/fail").read() if __import__("os").path.exists(seen + "/fail") else ""
if fail:
    sys.stderr.write(fail)
    sys.exit(1)
"""


class Engine:
    """The docker SDK's images.get: the image the client's import or load made, its one layer
    the digest of the tar it was given (as the Engine's diff_id is), unless told otherwise."""

    def __init__(self, seen: Path, arch: str) -> None:
        self.seen, self.arch, self.stored = seen, arch, None
        self.images = self

    def get(self, name: str) -> SimpleNamespace:
        given = (self.seen / "given").read_bytes()
        if given[257:262] != b"ustar" or (self.seen / "docker-args").read_text().startswith(
                '["load"'):  # a docker-archive: its layer.tar is the layer
            with tarfile.open(fileobj=io.BytesIO(given)) as t:
                given = t.extractfile("layer.tar").read()
        layer = self.stored or "sha256:" + hashlib.sha256(given).hexdigest()
        return SimpleNamespace(name=name, attrs={"RootFS": {"Type": "layers", "Layers": [layer]},
                                                 "Architecture": self.arch})


def recipe(cpu_arch: str = "x86_64", debian_arch: str = "amd64") -> SimpleNamespace:
    return SimpleNamespace(
        key="debian-bookworm", image="imgbuild-base:debian-bookworm-py3.11", cpu_arch=cpu_arch,
        debian_arch=debian_arch,
        bootstrap={"suite": "bookworm", "variant": "minbase", "include": ["python3", "ca"],
                   "source_date_epoch": EPOCH, "mirror": "http://mirror.example/debian"})


@pytest.fixture()
def here(tmp_path, monkeypatch):
    seen = tmp_path / "seen"
    seen.mkdir()
    bin_ = tmp_path / "bin"
    bin_.mkdir()
    (bin_ / "debootstrap").write_text(DEBOOTSTRAP.format(seen=seen))
    (bin_ / "debootstrap").chmod(0o755)
    (tmp_path / "docker.py").write_text(DOCKER)
    monkeypatch.setenv("PATH", f"{bin_}:/usr/bin:/bin")
    monkeypatch.setattr(base.os, "geteuid", lambda: 0)
    monkeypatch.setattr(base.daemon, "cli_command",
                        lambda args: [sys.executable, str(tmp_path / "docker.py"), str(seen),
                                      *args])
    return seen


def members(data: bytes) -> list[tarfile.TarInfo]:
    with tarfile.open(fileobj=io.BytesIO(data)) as t:
        return t.getmembers()


def test_the_base_is_one_reproducible_tar_of_the_cleared_root_and_its_digest_is_checked(here):
    engine = Engine(here, "amd64")
    img, rootfs = base._debootstrap_import(engine, recipe(), base.SILENT)
    given = (here / "given").read_bytes()
    assert rootfs == "sha256:" + hashlib.sha256(given).hexdigest()
    assert img.name == "imgbuild-base:debian-bookworm-py3.11"
    assert json.loads((here / "docker-args").read_text()) == [
        "import", "--change", 'CMD ["/bin/bash"]', "-", "imgbuild-base:debian-bookworm-py3.11"]
    assert (here / "args").read_text().splitlines()[:3] == [
        "--variant=minbase", "--include=python3,ca", "bookworm"]
    assert (here / "args").read_text().splitlines()[-1] == "http://mirror.example/debian"
    # GNU tar's own header, every name sorted, one mtime, owners by number only
    assert given[257:265] == b"ustar  \0"
    ms = members(given)
    names = [m.name for m in ms]
    assert names == sorted(names) and names[0] == "."
    assert {m.mtime for m in ms} == {EPOCH}
    assert {(m.uname, m.gname) for m in ms} == {("", "")}
    assert {m.name: (m.uid, m.gid) for m in ms}["./home/u/.profile"] == (1000, 1000)
    assert {m.name: m.linkname for m in ms if m.issym()} == {"./usr/bin/python": "python3"}
    # what the machine and the moment left is cleared; the rest is there as debootstrap left it
    with tarfile.open(fileobj=io.BytesIO(given)) as t:
        assert t.extractfile("./etc/hostname").read() == b"localhost\n"
        assert t.extractfile("./etc/resolv.conf").read() == b""
        assert t.extractfile("./etc/os-release").read() == b"ID=debian\n"
    assert "./var/log/dpkg.log" not in names and "./var/lib/apt/lists/mirror_Packages" not in names
    assert "./var/log/apt" in names


def test_two_bootstraps_made_at_other_moments_are_one_digest(here):
    # the stand-in dates its files a day later each run, as a real one dates them by the clock
    first = base._debootstrap_import(Engine(here, "amd64"), recipe(), base.SILENT)[1]
    again = base._debootstrap_import(Engine(here, "amd64"), recipe(), base.SILENT)[1]
    assert again == first and (here / "runs").read_text() == "2\n"
    other = recipe()
    other.bootstrap = dict(other.bootstrap, source_date_epoch=EPOCH + 1)
    assert base._debootstrap_import(Engine(here, "amd64"), other, base.SILENT)[1] != first


def test_an_engine_that_stored_another_layer_or_failed_the_import_is_refused(here):
    engine = Engine(here, "amd64")
    engine.stored = "sha256:" + "9" * 64
    with pytest.raises(JobFailed) as e:
        base._debootstrap_import(engine, recipe(), base.SILENT)
    assert e.value.message.startswith(f"docker import stored sha256:{'9' * 64}, not the tar it "
                                      "was given (sha256:")
    assert e.value.hint == "report this: the Engine changed the layer"
    (here / "fail").write_text("Error response from daemon: no space left on device\n")
    with pytest.raises(JobFailed) as e:
        base._debootstrap_import(Engine(here, "amd64"), recipe(), base.SILENT)
    assert e.value.message == "docker import failed"
    assert e.value.log_tail == ["Error response from daemon: no space left on device"]


def test_a_base_is_made_only_by_root_and_only_with_debootstrap(here, monkeypatch, tmp_path):
    monkeypatch.setattr(base.os, "geteuid", lambda: 1000)
    with pytest.raises(EnvError) as e:
        base._debootstrap_import(None, recipe(), base.SILENT)
    assert (e.value.message, e.value.hint) == (
        "debootstrap needs root", "run `imgbuild base bootstrap` as root")
    monkeypatch.setenv("PATH", str(tmp_path / "nothing"))
    with pytest.raises(EnvError) as e:
        base._debootstrap_import(None, recipe(), base.SILENT)
    assert e.value.message == "debootstrap is not installed" and "apt-get install" in e.value.hint
    assert not (here / "args").exists()


# --- another CPU's base ----------------------------------------------------------------------

def test_another_cpus_base_is_a_loaded_archive_whose_config_names_its_cpu(here, monkeypatch):
    monkeypatch.setattr(base, "host_cpu", lambda: "x86_64")
    asked = []
    monkeypatch.setattr(base, "check_emulation", asked.append)
    rec = recipe("aarch64", "arm64")
    rec.image += "-aarch64"
    img, rootfs = base._debootstrap_import(Engine(here, "arm64"), rec, base.SILENT)
    assert asked == ["aarch64"]
    assert (here / "args").read_text().splitlines()[:2] == ["--variant=minbase", "--arch=arm64"]
    assert json.loads((here / "docker-args").read_text())[:2] == ["load", "-i"]
    with tarfile.open(here / "given") as t:
        config = json.loads(t.extractfile("config.json").read())
        manifest = json.loads(t.extractfile("manifest.json").read())
        layer = t.extractfile("layer.tar").read()
    assert rootfs == "sha256:" + hashlib.sha256(layer).hexdigest()
    assert {m.mtime for m in members(layer)} == {EPOCH}
    assert config == {
        "architecture": "arm64", "os": "linux", "created": "2023-11-14T22:13:20Z",
        "config": {"Cmd": ["/bin/bash"]}, "rootfs": {"type": "layers", "diff_ids": [rootfs]},
        "history": [{"created": "2023-11-14T22:13:20Z",
                     "created_by": "imgbuild base bootstrap"}]}
    assert manifest == [{"Config": "config.json", "RepoTags": [rec.image],
                         "Layers": ["layer.tar"]}]
    # an Engine that labels it with another CPU, or fails the load, is refused
    with pytest.raises(JobFailed) as e:
        base._debootstrap_import(Engine(here, "amd64"), rec, base.SILENT)
    assert e.value.message == f"docker load stored {rootfs} for amd64, not {rootfs} for arm64"
    (here / "fail").write_text("open /var/lib/docker/tmp: no space left on device\n")
    with pytest.raises(JobFailed) as e:
        base._debootstrap_import(Engine(here, "arm64"), rec, base.SILENT)
    assert e.value.message == "docker load of the bootstrapped base failed"
    assert e.value.log_tail == ["open /var/lib/docker/tmp: no space left on device"]


@pytest.mark.parametrize("entry, ok", [
    ("enabled\ninterpreter /usr/libexec/qemu-binfmt/aarch64-binfmt-P\nflags: POCF\n", True),
    ("enabled\ninterpreter /usr/bin/qemu-aarch64-static\nflags: F\n", True),
    ("enabled\ninterpreter /usr/bin/qemu-aarch64\nflags: P\n", False),  # not in a chroot
    ("disabled\ninterpreter /usr/bin/qemu-aarch64-static\nflags: F\n", False),
    ("enabled\ninterpreter /usr/bin/qemu-aarch64-static\n", False),
    (None, False),
])
def test_another_cpus_programs_run_only_through_qemu_registered_to_work_in_a_chroot(
        tmp_path, entry, ok):
    if entry is not None:
        (tmp_path / "qemu-aarch64").write_text(entry)
    if ok:
        base.check_emulation("aarch64", tmp_path)
        return
    with pytest.raises(EnvError) as e:
        base.check_emulation("aarch64", tmp_path)
    assert e.value.message == f"this {base.host_cpu()} machine cannot run aarch64 programs"
    assert e.value.facts == [f"{tmp_path / 'qemu-aarch64'}: " + (
        entry.splitlines()[0] if entry else "not registered")]
    assert e.value.hint == (
        "as root: `apt-get install -y qemu-user-static`, then `mount -t binfmt_misc binfmt_misc "
        "/proc/sys/fs/binfmt_misc` if it is not mounted and register "
        "/usr/lib/binfmt.d/qemu-aarch64.conf's line into /proc/sys/fs/binfmt_misc/register "
        "(`make setup` does all of this)")
