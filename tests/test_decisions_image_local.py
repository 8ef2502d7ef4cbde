"""The image package's decisions about this machine's own things, without the Docker Engine:
which local base is the recorded one (image/base.py), what is written back into bases.yaml
(base.record_rootfs, digests.write), the Engine socket's chunked answers and the docker clients
tried (image/daemon.py), how a file is classed and a size report ordered (image/sizeprobe.py,
image/sizes.py), uv's index flags inside the build (image/context.py)."""

from __future__ import annotations

import json
import os
from pathlib import Path
from types import SimpleNamespace

import pytest

from imgbuild.errors import EnvError, InputError, JobFailed
from imgbuild.image import base, daemon, digests, sizeprobe, sizes
from imgbuild.image.context import index_flags

from .progress_notes import Notes

ROOTFS = "sha256:" + "1" * 64
OTHER = "sha256:" + "2" * 64


def image(*layers: str) -> SimpleNamespace:
    return SimpleNamespace(attrs={"RootFS": {"Type": "layers", "Layers": list(layers)}})


# --- which local base is the recorded one -------------------------------------------------------

def test_a_bases_filesystem_is_its_only_layers():
    assert base.rootfs_of(image(ROOTFS)) == ROOTFS
    assert base.rootfs_of(image(ROOTFS, OTHER)) is None  # not a bootstrapped base
    assert base.rootfs_of(image()) is None
    assert base.rootfs_of(SimpleNamespace(attrs={})) is None


def test_a_local_base_other_than_the_recorded_one_is_refused():
    rec = SimpleNamespace(image="imgbuild-base:debian-bookworm-py3.11",
                          bootstrap={"rootfs": ROOTFS})
    base._check_rootfs(image(ROOTFS), rec, "here")
    with pytest.raises(EnvError, match="not the one images/bases.yaml records") as e:
        base._check_rootfs(image(OTHER), rec, "here")
    assert f"its filesystem is {OTHER}" in e.value.facts
    with pytest.raises(EnvError):
        base._check_rootfs(image(ROOTFS, OTHER), rec, "here")
    # Nothing recorded: nothing to hold it to.
    base._check_rootfs(image(OTHER), SimpleNamespace(image=rec.image, bootstrap={}), "here")
    base._check_rootfs(image(OTHER), SimpleNamespace(image=rec.image, bootstrap=None), "here")


def test_a_bases_registry_tag_is_its_local_tag():
    assert base.registry_tag(SimpleNamespace(image="imgbuild-base:debian-bookworm-py3.11")) == \
        "base-debian-bookworm-py3.11"
    assert base.registry_tag(SimpleNamespace(
        image="registry.example:5000/imgbuild-base:debian-bookworm-py3.11")) == \
        "base-debian-bookworm-py3.11"


BASES = """\
os:
  debian-bookworm:
    image: imgbuild-base:debian-bookworm-py3.11
    # a comment that stays
    bootstrap:
      suite: bookworm
      rootfs: sha256:old
      rootfs_aarch64: sha256:oldarm
    glibc: "2.36"
  ubuntu-noble:
    image: ubuntu:24.04
    bootstrap:
      suite: noble
cuda_images:
  kinds: [base]
  digests:
    "nvidia/cuda:old": "sha256:x"
  after: kept
"""


def test_a_recorded_rootfs_replaces_only_its_own_line(tmp_path):
    path = tmp_path / "bases.yaml"
    path.write_text(BASES)
    base.record_rootfs(path, "debian-bookworm", ROOTFS)
    got = path.read_text()
    assert f"      rootfs: {ROOTFS}\n" in got and "sha256:old\n" not in got
    assert "      rootfs_aarch64: sha256:oldarm\n" in got and "# a comment that stays" in got
    assert got.count("rootfs:") == 1
    base.record_rootfs(path, "debian-bookworm", OTHER, "aarch64")
    got = path.read_text()
    assert f"      rootfs_aarch64: {OTHER}\n" in got and f"      rootfs: {ROOTFS}\n" in got
    assert "sha256:oldarm" not in got
    base.record_rootfs(path, "ubuntu-noble", OTHER)
    noble = path.read_text().split("  ubuntu-noble:")[1].split("cuda_images:")[0]
    assert f"      rootfs: {OTHER}\n" in noble
    assert path.read_text().split("  ubuntu-noble:")[0].count(OTHER) == 1  # aarch64's only
    with pytest.raises(InputError, match="no os.debian-trixie.bootstrap"):
        base.record_rootfs(path, "debian-trixie", ROOTFS)


def test_digests_are_written_sorted_and_only_where_found(tmp_path):
    path = tmp_path / "bases.yaml"
    path.write_text(BASES)
    digests.write(path, {"nvidia/cuda:b": "sha256:bb", "nvidia/cuda:a": "sha256:aa",
                         "nvidia/cuda:gone": None})
    got = path.read_text()
    assert '  digests:\n    "nvidia/cuda:a": "sha256:aa"\n    "nvidia/cuda:b": "sha256:bb"\n' \
        "  after: kept\n" in got
    assert "nvidia/cuda:old" not in got and "gone" not in got
    digests.write(path, {"nvidia/cuda:gone": None})
    assert "  digests: {}\n  after: kept\n" in path.read_text()
    digests.write(path, {"nvidia/cuda:a": "sha256:aa"})  # from {} again
    assert '  digests:\n    "nvidia/cuda:a": "sha256:aa"\n  after: kept\n' in path.read_text()
    (tmp_path / "none.yaml").write_text("os: {}\n")
    with pytest.raises(EnvError, match="no `digests:` block"):
        digests.write(tmp_path / "none.yaml", {})


# --- the Engine's socket and the docker clients -----------------------------------------------

def _serve_once(path, answer: bytes) -> None:
    """A unix socket at path that reads one request and sends `answer`, then hangs up."""
    import socket
    import threading

    srv = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    srv.bind(str(path))
    srv.listen(1)

    def serve():
        conn, _ = srv.accept()
        conn.recv(65536)
        conn.sendall(answer)
        conn.close()
        srv.close()

    threading.Thread(target=serve, daemon=True).start()


def test_an_engine_answer_is_read_whole_and_one_cut_short_goes_to_the_sdk(tmp_path):
    chunked = (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
               b"5\r\nhello\r\n7;ext=1\r\n, world\r\n0\r\n\r\n")
    _serve_once(tmp_path / "a.sock", chunked)
    assert daemon._ask(str(tmp_path / "a.sock"), "GET", "/_ping") == (200, b"hello, world")
    _serve_once(tmp_path / "b.sock", b"HTTP/1.1 404 Not Found\r\nContent-Length: 2\r\n\r\n{}")
    assert daemon._ask(str(tmp_path / "b.sock"), "GET", "/images/x/json") == (404, b"{}")
    # cut short: the caller asks the SDK instead of trusting half an answer
    _serve_once(tmp_path / "c.sock", b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\n01234")
    assert daemon._ask(str(tmp_path / "c.sock"), "GET", "/_ping") is None
    _serve_once(tmp_path / "d.sock", b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
                b"a\r\n01234")
    assert daemon._ask(str(tmp_path / "d.sock"), "GET", "/_ping") is None
    assert daemon._ask(str(tmp_path / "nobody.sock"), "GET", "/_ping") is None


def test_the_clients_tried_are_the_named_one_first_and_only_those_that_exist(tmp_path,
                                                                             monkeypatch):
    mine = tmp_path / "docker"
    mine.write_text("")
    monkeypatch.setenv("IMGBUILD_DOCKER", str(mine))
    monkeypatch.setenv("PATH", str(tmp_path))
    got = daemon.candidates()
    assert got[0] == str(mine) and all(__import__("os").path.exists(c) for c in got)
    monkeypatch.setenv("IMGBUILD_DOCKER", str(tmp_path / "missing"))
    assert str(tmp_path / "missing") not in daemon.candidates()


# --- file kinds and the size report -------------------------------------------------------------

@pytest.mark.parametrize("path,kind", [
    ("/usr/lib/libcuda.so", "shared library"), ("/opt/x/libtorch.so.2.13", "shared library"),
    ("/opt/x/not.something", "other"), ("/opt/x/libfoo.a", "static library"),
    ("/opt/venv/include/cuda.h", "header"), ("/usr/include/c++/12/vector", "header"),
    ("/opt/x/kernel.cuh", "header"), ("/opt/x/mod.pyc", "bytecode"),
    ("/opt/venv/lib/python3.11/site-packages/torch/tests/test_a.py", "test file"),
    ("/opt/venv/lib/python3.11/site-packages/torch/test/data.bin", "test file"),
    ("/opt/tests/run.py", "python source"), ("/opt/venv/bin/x.py", "python source"),
    ("/etc/os-release", "other"),
])
def test_each_file_is_classed_by_its_name_and_place(path, kind):
    assert sizeprobe.kind(path) == kind


def test_bytecode_belongs_to_the_distribution_of_its_source():
    assert sizeprobe._source_of("/s/pkg/__pycache__/mod.cpython-311.pyc") == "/s/pkg/mod.py"
    assert sizeprobe._source_of("/s/pkg/mod.pyc") == ""
    assert sizeprobe._source_of("/s/pkg/__pycache__/notes.txt") == ""


def test_a_size_report_lists_layers_oldest_first_and_the_rest_largest_first():
    history = [{"CreatedBy": "RUN rest", "Size": 30}, {"CreatedBy": "RUN heavy", "Size": 900},
               {"CreatedBy": "FROM base", "Size": None}]
    doc = {"total": 1000, "files": 3, "by_kind": {"other": 5, "shared library": 900,
                                                  "test file": 20, "static library": 7},
           "by_owner": {"six": 1, "torch": 950}, "by_owner_kind": {},
           "duplicates": [{"size": 10, "paths": ["a", "b", "c"]}]}
    got = sizes.report_of("img", history, doc)
    assert got.layers == (("FROM base", 0), ("RUN heavy", 900), ("RUN rest", 30))
    assert [k for k, _ in got.by_kind] == ["shared library", "test file", "static library",
                                           "other"]
    assert got.by_owner == (("torch", 950), ("six", 1))
    assert got.dead_weight == {"static library": 7, "test file": 20, "duplicate copies": 20}
    assert got.to_dict() == {
        "image": "img", "total": 1000, "files": 3,
        "layers": [{"created_by": "FROM base", "size": 0}, {"created_by": "RUN heavy",
                                                           "size": 900},
                   {"created_by": "RUN rest", "size": 30}],
        "by_kind": {"shared library": 900, "test file": 20, "static library": 7, "other": 5},
        "by_owner": {"torch": 950, "six": 1}, "by_owner_kind": {},
        "duplicates": [{"size": 10, "paths": ["a", "b", "c"]}],
        "dead_weight": {"static library": 7, "test file": 20, "duplicate copies": 20}}
    # A step's command is cut to 200 characters; a step the Engine names no command is "".
    long = sizes.report_of("img", [{"CreatedBy": "RUN " + "x" * 300, "Size": 1}, {}], doc)
    assert long.layers == (("", 0), ("RUN " + "x" * 196, 1))


# --- uv's index flags inside the build --------------------------------------------------------

def test_the_builds_index_flags():
    plain = SimpleNamespace(extra_index_urls=())
    extra = SimpleNamespace(extra_index_urls=("https://download.pytorch.org/whl/cpu",))
    assert index_flags(plain, False) == ""
    assert index_flags(extra, False) == ("--extra-index-url https://download.pytorch.org/whl/cpu"
                                         " --index-strategy unsafe-best-match")
    # The wheelhouse stands in for the extra indexes.
    wheels = index_flags(extra, True)
    assert "--extra-index-url" not in wheels and "--find-links" in wheels
    assert wheels.endswith("--index-strategy unsafe-best-match")
    mirrored = index_flags(plain, False, "https://user:pw@mirror.example/simple")
    assert mirrored == "--default-index https://mirror.example/simple"
    assert index_flags(plain, True, "https://m/simple").startswith("--default-index https://m/simple --find-links")


# --- which engine an image asks about its schemes ----------------------------------------------

def test_the_engine_and_its_gpu_archs_are_read_from_the_labels():
    from imgbuild.image import schemes

    labels = {"io.imgbuild.engine": "sglang==0.5.16", "io.imgbuild.archs": "sm100,sm120,cpu",
              "io.imgbuild.target": "sglang-blackwell"}
    assert schemes.engine_of(labels) == ("sglang", "0.5.16", ["sm100", "sm120"],
                                         "sglang-blackwell")
    assert schemes.engine_of({"io.imgbuild.archs": "cpu"}) == ("", None, [], None)
    assert schemes.engine_of({"io.imgbuild.engine": "vllm", "io.imgbuild.archs": "sm90"}) == \
        ("vllm", None, ["sm90"], None)


# --- asking a registry for the catalog's CUDA digests ------------------------------------------

def test_every_cuda_tag_of_the_catalog_is_asked_of_docker_hub_or_the_mirror(monkeypatch):
    from .conftest import checkout_workspace

    cat = checkout_workspace().catalog
    asked = []
    monkeypatch.setattr(digests, "_digest", lambda repo, tag: asked.append(
        (repo.host, repo.path, tag)) or (None if tag.endswith("ubuntu22.04") else "sha256:x"))
    got = digests.refresh(cat)
    want = digests.tags(cat)
    assert list(got) == want and len(want) > 2
    assert [(h, t) for h, _, t in asked] == [(digests.HUB_HOST, i.rpartition(":")[2])
                                            for i in want]
    assert {p for _, p, _ in asked} == {"nvidia/cuda"}
    assert {k for k, v in got.items() if v is None} == {i for i in want
                                                       if i.endswith("ubuntu22.04")}
    asked.clear()
    digests.refresh(cat, mirror="mirror.example:5000")
    assert {h for h, _, _ in asked} == {"mirror.example:5000"}


@pytest.mark.parametrize("mirror, where", [(None, f"Docker Hub ({digests.HUB_HOST})"),
                                           ("mirror.example:5000", "mirror.example:5000")])
def test_an_unreachable_registry_leaves_the_digests_as_they_are_and_says_where(monkeypatch,
                                                                               mirror, where):
    from .conftest import checkout_workspace

    def unreachable(repo, tag):
        raise EnvError("connection refused", facts=["tried 3 times"])
    monkeypatch.setattr(digests, "_digest", unreachable)
    with pytest.raises(EnvError) as e:
        digests.refresh(checkout_workspace().catalog, mirror=mirror)
    assert e.value.message == f"{where} is unreachable: the digests stay as they are"
    assert e.value.facts == ["connection refused", "tried 3 times"]
    assert "--mirror" in e.value.hint


def test_the_refreshed_digests_are_written_to_the_projects_bases_and_read_back(monkeypatch,
                                                                               tmp_path):
    import shutil

    from imgbuild.workspace import Workspace

    from .conftest import ROOT

    shutil.copytree(ROOT / "images", tmp_path / "images")
    ws = Workspace(tmp_path / "images", ROOT / "lockfiles")
    monkeypatch.setattr(digests, "_digest", lambda repo, tag: "sha256:" + "a" * 64)
    got = digests.refresh_catalog(ws)
    text = (tmp_path / "images" / "bases.yaml").read_text()
    assert all(f'"{image}": "sha256:{"a" * 64}"' in text for image in got)
    assert (ROOT / "images" / "bases.yaml").read_text() != text  # the checkout's is untouched


# --- what an image's bytes are, measured on a tree ---------------------------------------------

def test_the_size_probe_counts_each_file_once_by_owner_and_kind(tmp_path):
    """sizeprobe.measure on a tree laid out as an image is (the probe walks / in the image):
    a file a distribution's RECORD lists is that distribution's, bytecode its source's, the
    rest its top directory's; a hard link is counted once, a link and /tmp not at all; files of
    1 MiB or more with the same bytes are duplicates, with every path."""
    import os

    root = tmp_path / "image"
    site = root / "opt/venv/lib/python3.11/site-packages"
    big = os.urandom(sizeprobe.BIG)
    files = {"pkg/__init__.py": b"x = 1\n", "pkg/_core.so": big, "pkg/tests/test_a.py": b"t\n",
             "pkg/__pycache__/mod.cpython-311.pyc": b"\0" * 10, "pkg/mod.py": b"m\n"}
    for rel, data in files.items():
        (site / rel).parent.mkdir(parents=True, exist_ok=True)
        (site / rel).write_bytes(data)
    info = site / "pkg-1.0.dist-info"
    info.mkdir()
    (info / "RECORD").write_text("".join(f"{r},sha256=x,{len(d)}\n" for r, d in files.items()
                                         if not r.endswith(".pyc"))
                                 + "pkg-1.0.dist-info/RECORD,,\n")
    (root / "usr/lib").mkdir(parents=True)
    (root / "usr/lib/libcopy.so.1").write_bytes(big)  # the same bytes: a duplicate
    os.link(root / "usr/lib/libcopy.so.1", root / "usr/lib/libcopy-hardlink.so.1")
    (root / "usr/lib/libcopy.so").symlink_to("libcopy.so.1")
    (root / "usr/include").mkdir()
    (root / "usr/include/api.h").write_text("int f();\n")
    (root / "tmp").mkdir()
    (root / "tmp/scratch").write_bytes(b"\0" * 1000)
    got = sizeprobe.measure(str(root))
    record = len((info / "RECORD").read_bytes())
    assert got["files"] == 8 and got["total"] == sum(len(d) for d in files.values()) + \
        record + len(big) + len("int f();\n")
    assert got["by_owner"] == {"pkg": sum(len(d) for d in files.values()) + record,
                               "/usr": len(big) + len("int f();\n")}
    assert got["by_owner_kind"]["pkg"] == {
        "python source": 8, "shared library": len(big), "test file": 2, "bytecode": 10,
        "other": record}
    assert got["by_kind"]["header"] == len("int f();\n")
    [dup] = got["duplicates"]
    assert dup["size"] == len(big) and dup["owners"] == ["/usr", "pkg"]
    core, lib = dup["paths"]  # the hard link's two names are one file: one of them is listed
    assert core == "/opt/venv/lib/python3.11/site-packages/pkg/_core.so"
    assert lib in ("/usr/lib/libcopy.so.1", "/usr/lib/libcopy-hardlink.so.1")


def test_an_image_is_measured_inside_itself_with_python3_else_python(monkeypatch):
    import subprocess

    tried = []
    doc = {"total": 10, "files": 1, "by_owner": {"/usr": 10}, "by_kind": {"other": 10},
           "by_owner_kind": {"/usr": {"other": 10}}, "duplicates": []}

    def run_cli(args, **kw):
        # its output read as text, and a probe of a large image given half an hour
        assert kw == {"capture_output": True, "text": True, "timeout": 1800}
        tried.append(args[args.index("--entrypoint") + 1])
        assert args[:6] == ["run", "--rm", "--network", "none", "--user", "0"]
        assert args[-2:] == ["-c", Path(sizeprobe.__file__).read_text()]
        ok = tried[-1] == "python"
        return subprocess.CompletedProcess(args, 0 if ok else 127, json.dumps(doc) if ok else "",
                                           "" if ok else "exec: python3: not found")
    monkeypatch.setattr(sizes, "run_cli", run_cli)
    monkeypatch.setattr(sizes, "docker_client", lambda: SimpleNamespace(api=SimpleNamespace(
        history=lambda image: [{"CreatedBy": "RUN x", "Size": 10}])))
    got = sizes.measure("reg/img:t")
    assert tried == ["python3", "python"] and got.total == 10
    assert got.image == "reg/img:t" and got.layers == (("RUN x", 10),)


def test_an_image_without_python_or_not_here_is_said_so(monkeypatch):
    import subprocess

    monkeypatch.setattr(sizes, "run_cli", lambda args, **kw: subprocess.CompletedProcess(
        args, 127, "", "line 1\nexec: python: executable file not found in $PATH"))
    monkeypatch.setattr(sizes, "docker_client", lambda: SimpleNamespace(api=SimpleNamespace(
        history=lambda image: [])))
    with pytest.raises(JobFailed) as e:
        sizes.measure("reg/img:t")
    assert e.value.message == "could not read reg/img:t's files"
    assert e.value.facts == ["line 1", "exec: python: executable file not found in $PATH"]
    assert e.value.hint == ("the breakdown runs Python inside the image; an image without "
                            "python3 or python cannot be measured this way")

    def missing(image):
        raise RuntimeError("404 Client Error: No such image: reg/img:t " + "x" * 300)
    monkeypatch.setattr(sizes, "docker_client", lambda: SimpleNamespace(api=SimpleNamespace(
        history=missing)))
    with pytest.raises(InputError) as e:
        sizes.measure("reg/img:t")
    assert e.value.message == "image reg/img:t is not here"
    said = "404 Client Error: No such image: reg/img:t " + "x" * 300
    assert e.value.facts == [said[:200]]  # the Engine's words, cut to 200 characters
    assert e.value.hint == "build or pull it first"


# --- where the builder's base comes from ------------------------------------------------------

def test_what_debootstrap_leaves_of_the_machine_and_the_moment_is_cleared(tmp_path):
    root = tmp_path / "rootfs"
    for rel, text in {"var/cache/apt/archives/x.deb": "deb", "var/lib/apt/lists/mirror_Packages":
                      "list", "var/log/dpkg.log": "log", "var/cache/apt/pkgcache.bin": "c",
                      "var/cache/ldconfig/aux-cache": "aux", "etc/hostname": "buildhost\n",
                      "etc/resolv.conf": "nameserver 10.0.0.1\n",
                      "var/lib/dpkg/status": "Package: bash\n", "etc/os-release": "ID=debian\n"
                      }.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
    (root / "var/log/apt").mkdir()  # a directory stays (its files are the logs)
    (root / "var/log/link").symlink_to("/nowhere")
    base._normalize(root)
    left = sorted(str(p.relative_to(root)) for p in root.rglob("*") if not p.is_dir())
    assert left == ["etc/hostname", "etc/os-release", "etc/resolv.conf", "var/lib/dpkg/status"]
    assert (root / "etc/hostname").read_text() == "localhost\n"
    assert (root / "etc/resolv.conf").read_text() == ""
    assert (root / "var/log/apt").is_dir()
    bare = tmp_path / "bare"  # a root without ldconfig's cache, logs or lists: nothing to clear
    (bare / "etc").mkdir(parents=True)
    base._normalize(bare)
    assert sorted(p.name for p in (bare / "etc").iterdir()) == ["hostname", "resolv.conf"]


DECLARED = {"PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
            "LC_ALL": "C", "PYTHONDONTWRITEBYTECODE": "1", "SOURCE_DATE_EPOCH": "1700000000"}


def test_a_base_is_made_in_a_declared_environment_whatever_the_callers():
    # make exports PYTHONDONTWRITEBYTECODE empty, a shell may set it: each gave another digest
    # of the same recipe on the same mirror (python3's postinst writes debpython's bytecode
    # or not), so neither reaches debootstrap; nor does anything else but the proxies.
    for host in ({"PYTHONDONTWRITEBYTECODE": ""}, {"PYTHONDONTWRITEBYTECODE": "1"}, {},
                 {"PATH": "/root/.local/bin:/usr/bin", "LANG": "de_DE.UTF-8", "TZ": "Asia/Tokyo",
                  "PYTHONHASHSEED": "7", "SOURCE_DATE_EPOCH": "1", "LD_PRELOAD": "/x.so",
                  "DEBIAN_FRONTEND": "noninteractive", "TMPDIR": "/scratch"}):
        assert base.bootstrap_env("1700000000", host) == DECLARED, host
    proxied = {"http_proxy": "http://proxy:3128", "HTTPS_PROXY": "http://proxy:3129",
               "no_proxy": "deb.example", "ALL_PROXY": "socks5://proxy", "ftp_proxy": "ftp://p"}
    assert base.bootstrap_env("1700000000", proxied) == DECLARED | {
        "http_proxy": "http://proxy:3128", "HTTPS_PROXY": "http://proxy:3129",
        "no_proxy": "deb.example", "ALL_PROXY": "socks5://proxy"}
    assert base.bootstrap_env("1", {})["SOURCE_DATE_EPOCH"] == "1"  # the recipe's epoch


def test_debootstrap_is_run_in_that_environment_and_its_failure_said(tmp_path, monkeypatch):
    # A debootstrap that writes down its arguments and environment, then fails as one whose
    # mirror is out of reach does: nothing past it runs (no tar, no Engine).
    seen = tmp_path / "seen"
    exe = tmp_path / "bin" / "debootstrap"
    exe.parent.mkdir()
    exe.write_text(f"#!/bin/sh\necho \"$*\" > {seen}.args\nenv > {seen}.env\n"
                   "echo 'E: Failed getting release file' >&2\nexit 1\n")
    exe.chmod(0o755)
    monkeypatch.setenv("PATH", f"{exe.parent}:/usr/bin:/bin")
    monkeypatch.setenv("PYTHONDONTWRITEBYTECODE", "")
    monkeypatch.setenv("http_proxy", "http://proxy:3128")
    monkeypatch.setattr(base.os, "geteuid", lambda: 0)
    rec = SimpleNamespace(key="debian-bookworm", image="imgbuild-base:debian-bookworm-py3.11",
                          cpu_arch=base.host_cpu(), debian_arch="amd64",
                          bootstrap={"suite": "bookworm", "variant": "minbase",
                                     "include": ["python3"], "source_date_epoch": 1700000000,
                                     "mirror": "http://deb.debian.org/debian"})
    with pytest.raises(JobFailed) as e:
        base._debootstrap_import(None, rec, base.SILENT)
    assert e.value.message == "debootstrap failed"
    assert e.value.log_tail == ["E: Failed getting release file"]
    env = dict(line.split("=", 1) for line in (tmp_path / "seen.env").read_text().splitlines()
               if "=" in line and line.split("=", 1)[0] not in ("PWD", "SHLVL", "_"))
    assert env == DECLARED | {"http_proxy": "http://proxy:3128"}
    args = (tmp_path / "seen.args").read_text().split()
    assert args[:3] == ["--variant=minbase", "--include=python3", "bookworm"]
    assert args[4] == "http://deb.debian.org/debian" and args[3].endswith("/rootfs")


@pytest.fixture()
def bases(monkeypatch):
    w = SimpleNamespace(local=None, held=None, pulled=[], asked=[])
    monkeypatch.setattr(base.daemon, "local_image",
                        lambda client, ref: w.asked.append(("here?", client, ref)) or w.local)
    monkeypatch.setattr(base, "manifest_digest",
                        lambda repo, tag: w.asked.append(("held?", repo.name, tag)) or w.held)

    class Images:
        def pull(self, name, tag):
            w.pulled.append((name, tag))
            return SimpleNamespace(attrs=image(ROOTFS).attrs, tag=lambda ref: w.pulled.append(
                ("tagged", ref)))
    w.client = SimpleNamespace(images=Images())
    return w


REC = SimpleNamespace(key="debian-bookworm", image="imgbuild-base:debian-bookworm-py3.11",
                      bootstrap={"rootfs": ROOTFS})


def test_a_base_here_is_used_when_it_is_the_recorded_one(bases):
    bases.local = image(ROOTFS)
    base.ensure_local(bases.client, REC, None)
    assert bases.asked == [("here?", bases.client, REC.image)]
    bases.local = image(OTHER)
    with pytest.raises(EnvError) as e:
        base.ensure_local(bases.client, REC, None)
    assert e.value.message == (f"base image {REC.image} on this machine is not the one "
                               "images/bases.yaml records")
    assert e.value.facts == [f"its filesystem is {OTHER}", f"the recipe records {ROOTFS}",
                             "content tags name the recorded base, so an image built on this "
                             "one would carry a tag that says otherwise"]
    assert e.value.hint == (
        "`imgbuild base bootstrap --rebuild` makes it again from the recipe; if Debian's mirror "
        "has moved since it was recorded, `--record` writes the new digest into images/bases.yaml"
        " (every slim target gets a new content tag)")


def test_a_base_not_here_is_pulled_from_the_registry_and_tagged_as_the_recipe_names_it(bases):
    from imgbuild.image.registry import Repository

    bases.held = "sha256:held"
    base.ensure_local(bases.client, REC, Repository.parse("127.0.0.1:5000/imgbuild"))
    assert bases.pulled == [("127.0.0.1:5000/imgbuild", "base-debian-bookworm-py3.11"),
                            ("tagged", REC.image)]
    assert bases.asked[1:] == [("held?", "127.0.0.1:5000/imgbuild", "base-debian-bookworm-py3.11")]
    notes = Notes()
    base._pull_from(bases.client, REC, Repository.parse("127.0.0.1:5000/imgbuild"), notes)
    assert notes.said == ["pulled 127.0.0.1:5000/imgbuild:base-debian-bookworm-py3.11 as "
                          f"{REC.image}"]


def test_a_base_pulled_that_is_not_the_recorded_one_is_refused_naming_the_registry(bases,
                                                                                   monkeypatch):
    from imgbuild.image.registry import Repository

    bases.held = "sha256:held"
    other = SimpleNamespace(key=REC.key, image=REC.image, bootstrap={"rootfs": OTHER})
    with pytest.raises(EnvError) as e:
        base.ensure_local(bases.client, other, Repository.parse("127.0.0.1:5000/imgbuild"))
    assert e.value.message == (f"base image {REC.image} in 127.0.0.1:5000/imgbuild is not the "
                               "one images/bases.yaml records")


@pytest.mark.parametrize("machine, cpu, plat", [
    ("x86_64", "x86_64", "linux/amd64"), ("amd64", "x86_64", "linux/amd64"),
    ("aarch64", "aarch64", "linux/arm64"), ("arm64", "aarch64", "linux/arm64"),
    ("riscv64", "riscv64", "linux/riscv64")])
def test_this_machines_cpu_is_named_as_the_catalog_names_cpus(monkeypatch, machine, cpu, plat):
    monkeypatch.setattr(base.platform, "machine", lambda: machine)
    assert (base.host_cpu(), base.host_platform()) == (cpu, plat)


def test_bootstrap_hands_on_the_base_for_the_cpu_and_refuses_what_it_cannot_name(monkeypatch):
    from imgbuild.workspace import Workspace

    from .conftest import ROOT

    ws = Workspace(ROOT / "images", ROOT / "lockfiles")
    client = object()
    monkeypatch.setattr(base.daemon, "client", lambda: client)
    handed = []
    monkeypatch.setattr(base, "bootstrap", lambda *a, **kw: handed.append((a, kw)) or "made")
    notes = Notes()
    assert base.bootstrap_base(ws, "debian-bookworm", progress=notes) == "made"
    (got_client, got_base), kw = handed[-1]
    assert got_client is client and got_base == ws.catalog.bases["debian-bookworm"]
    assert kw == {"registry": None, "rebuild": False, "record": None, "progress": notes}
    base.bootstrap_base(ws, "debian-bookworm", registry="127.0.0.1:5000/imgbuild",
                        cpu_arch="aarch64", record=True)
    (_, got_base), kw = handed[-1]
    assert got_base == ws.catalog.bases["debian-bookworm"].for_cpu("aarch64")
    assert got_base.image.endswith("-aarch64")
    assert kw["registry"].name == "127.0.0.1:5000/imgbuild"
    assert kw["rebuild"] is True and kw["record"] == ROOT / "images" / "bases.yaml"
    base.bootstrap_base(ws, "debian-bookworm", rebuild=True)
    assert handed[-1][1]["rebuild"] is True and handed[-1][1]["record"] is None
    with pytest.raises(InputError) as e:
        base.bootstrap_base(ws, "debian-sid")
    assert e.value.message == "unknown base 'debian-sid'"
    assert e.value.facts == ["bases: " + ", ".join(sorted(ws.catalog.bases))]
    with pytest.raises(InputError) as e:
        base.bootstrap_base(ws, "debian-bookworm", registry="imgbuild")
    assert (e.value.message, e.value.hint) == (
        "--registry imgbuild names no registry host", "e.g. --registry 127.0.0.1:5000/imgbuild")
    assert len(handed) == 3


@pytest.mark.parametrize("registry, hint", [
    (None, "run `imgbuild base bootstrap`"),
    ("127.0.0.1:5000/imgbuild", "run `imgbuild base bootstrap --registry 127.0.0.1:5000/imgbuild`")])
def test_a_base_neither_here_nor_in_the_registry_says_how_to_make_it(bases, registry, hint):
    from imgbuild.image.registry import Repository

    with pytest.raises(EnvError) as e:
        base.ensure_local(bases.client, REC, Repository.parse(registry) if registry else None)
    assert e.value.message == f"base image {REC.image} is not here"
    assert e.value.facts == ["base 'debian-bookworm' is made by `imgbuild base bootstrap`"]
    assert e.value.hint == hint and bases.pulled == []


def test_a_pulled_base_like_cuda_is_left_to_the_build(bases):
    base.ensure_local(bases.client, SimpleNamespace(key="cuda", image="nvidia/cuda:x",
                                                    bootstrap=None), None)
    assert bases.pulled == []


def _dist(site, name: str, files: dict[str, bytes]) -> None:
    for rel, data in files.items():
        (site / rel).parent.mkdir(parents=True, exist_ok=True)
        (site / rel).write_bytes(data)
    info = site / f"{name}-1.0.dist-info"
    info.mkdir(parents=True)
    (info / "RECORD").write_text("".join(f"{r},sha256=x,{len(d)}\n" for r, d in files.items()))


def test_the_probe_reads_venvs_five_levels_down_under_the_usual_places_only(tmp_path):
    """A venv's site-packages five levels below /opt is read; one deeper is not, nor one
    outside the places images keep venvs (their files are their top directory's); every
    distribution of a site-packages is read, whatever else lies there."""
    root = tmp_path / "image"
    _dist(root / "opt/a/venv/lib/python3.11/site-packages", "five", {"five/x.py": b"5\n"})
    _dist(root / "opt/a/b/venv/lib/python3.11/site-packages", "six", {"six/x.py": b"6\n"})
    _dist(root / "srv/venv/lib/python3.11/site-packages", "srv", {"srvpkg/x.py": b"s\n"})
    many = root / "opt/m/lib/python3.11/site-packages"
    for n in range(12):  # directories and dist-infos side by side, in the directory's order
        _dist(many, f"d{n}", {f"d{n}/x.py": b"d\n"})
    got = sizeprobe.measure(str(root))["by_owner"]
    assert "five" in got and "six" not in got and "srv" not in got
    assert {f"d{n}" for n in range(12)} <= set(got)
    assert got["/srv"] > 0 and got["/opt"] > 0


def test_duplicates_are_listed_by_the_bytes_their_copies_waste(tmp_path):
    """Size times copies beyond the first: many small copies can waste more than a big one
    twice, and the other way round."""
    import os

    mib = sizeprobe.BIG

    def listed(groups: dict[str, tuple[int, int]], where) -> list[str]:
        (where / "usr/lib").mkdir(parents=True)
        for name, (size, copies) in groups.items():
            data = os.urandom(size)
            for n in range(copies):
                (where / f"usr/lib/{name}{n}.so").write_bytes(data)
        return [d["paths"][0].rsplit("/", 1)[1].removesuffix("0.so") for d in
                sizeprobe.measure(str(where))["duplicates"]]
    # 4 MiB twice wastes 4 MiB; 1.5 MiB three times wastes 3 MiB
    assert listed({"big": (4 * mib, 2), "mid": (3 * mib // 2, 3)}, tmp_path / "one") == [
        "big", "mid"]
    # 1 MiB five times wastes 4 MiB; 2 MiB twice wastes 2 MiB
    assert listed({"many": (mib, 5), "two": (2 * mib, 2)}, tmp_path / "two") == ["many", "two"]


def test_a_size_alone_among_the_big_files_does_not_end_the_search_for_copies(tmp_path):
    import os

    mib = sizeprobe.BIG
    (tmp_path / "usr/lib").mkdir(parents=True)
    # A directory's files are walked before its subdirectories': the size with no copy first.
    (tmp_path / "usr/alone.so").write_bytes(os.urandom(mib))
    data = os.urandom(2 * mib)
    for n in range(2):
        (tmp_path / f"usr/lib/pair{n}.so").write_bytes(data)
    [dup] = sizeprobe.measure(str(tmp_path))["duplicates"]
    assert sorted(dup["paths"]) == ["/usr/lib/pair0.so", "/usr/lib/pair1.so"]


def test_this_interpreter_s_distributions_are_read_from_its_site_packages_only(tmp_path,
                                                                              monkeypatch):
    """By default the probe reads the RECORDs under the interpreter's own site-packages
    directories; another directory on sys.path (an app's, the standard library) is no
    distribution's even where a stray .dist-info lies."""
    site = tmp_path / "lib" / "site-packages"
    _dist(site, "mine", {"mine/x.py": b"m\n"})
    app = tmp_path / "app"
    _dist(app, "stray", {"stray/x.py": b"s\n"})
    monkeypatch.setattr(sizeprobe.sys, "path", [str(app), str(site), str(tmp_path / "gone")])
    got = sizeprobe.owners()
    assert got[str(site / "mine" / "x.py")] == "mine"
    assert str(app / "stray" / "x.py") not in got


def test_a_type_is_named_in_words():
    from imgbuild.catalog.schema import tname

    assert [tname(t) for t in (str, int, float, bool, list, dict)] == [
        "a string", "an integer", "a number", "true or false", "a list", "a mapping"]
    assert tname((str, list)) == "a string or a list" and tname(Path) == "Path"


def test_a_file_gone_while_the_probe_walks_is_passed_over(tmp_path, monkeypatch):
    """A file removed between the directory's listing and its stat (a process in the image
    cleaning up): the files after it in that directory are still counted."""
    (tmp_path / "srv").mkdir()
    for name in ("a.txt", "b.txt", "c.txt"):
        (tmp_path / "srv" / name).write_bytes(b"x" * 10)
    real = sizeprobe.os.lstat
    order = next(os.walk(tmp_path / "srv"))[2]  # the walk's own order: the first fails

    def lstat(path, *a, **kw):
        if os.path.basename(path) == order[0]:
            raise FileNotFoundError(path)
        return real(path, *a, **kw)

    monkeypatch.setattr(sizeprobe.os, "lstat", lstat)
    got = sizeprobe.measure(str(tmp_path))
    assert (got["files"], got["total"]) == (2, 20)
