"""The containerd harness (tests/containerd.py) against the shared registry: what the Engine
pushed, containerd pulls as the same digest and runs, by `ctr images pull` and as a kubelet
does (CRI PullImage); a tag that does not exist fails, named; a containerd >= 2.2 told to
apply layers at once (IMGBUILD_CONTAINERD_BIN) does, and sees what the Engine sees."""

from __future__ import annotations

import io
import os
import re
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import requests
from packaging.version import Version

from imgbuild.errors import ImgbuildError

from .conftest import REGISTRY_HOST, registry_available
from .containerd import Containerd, CtrFailed, containerd_daemon

pytestmark = [pytest.mark.docker, pytest.mark.xdist_group("containerd")]

BASE = "imgbuild-base:debian-bookworm-py3.11"  # small (160 MB) and already here after bootstrap
MANIFEST_TYPES = ", ".join([
    "application/vnd.docker.distribution.manifest.v2+json",
    "application/vnd.docker.distribution.manifest.list.v2+json",
    "application/vnd.oci.image.manifest.v1+json",
    "application/vnd.oci.image.index.v1+json",
])


@pytest.fixture(scope="module")
def pushed(docker_client) -> Iterator[str]:
    """BASE pushed by the Engine (gzip layers) under a repository of its own; the local tag
    goes away afterwards."""
    if not registry_available():
        pytest.skip(f"skipped: no registry on {REGISTRY_HOST} (make services starts one)")
    try:
        image = docker_client.images.get(BASE)
    except Exception:
        pytest.skip(f"skipped: no {BASE} image here (make demo bootstraps it)")
    repo = f"{REGISTRY_HOST}/imgbuild-test-ctr-{uuid.uuid4().hex[:8]}"
    image.tag(repo, "t")
    try:
        for line in docker_client.images.push(repo, tag="t", stream=True, decode=True):
            assert "error" not in line, line
        yield f"{repo}:t"
    finally:
        docker_client.images.remove(f"{repo}:t")


@pytest.fixture(scope="module")
def ctrd(tmp_path_factory) -> Iterator[Containerd]:
    with containerd_daemon(tmp_path_factory.mktemp("ctrd")) as c:
        yield c


def registry_digest(ref: str) -> str:
    repo, _, tag = ref.removeprefix(f"{REGISTRY_HOST}/").rpartition(":")
    r = requests.get(f"http://{REGISTRY_HOST}/v2/{repo}/manifests/{tag}",
                     headers={"Accept": MANIFEST_TYPES}, timeout=30)
    r.raise_for_status()
    return r.headers["Docker-Content-Digest"]


def test_pull_records_the_registry_digest_and_runs(ctrd: Containerd, pushed: str):
    want = registry_digest(pushed)
    assert ctrd.pull(pushed) == want
    assert ctrd.snapshotter in ("overlayfs", "native"), ctrd.snapshotter_reason
    # Unpacked, not only fetched: a node needs the layers in its snapshotter.
    check = ctrd.ctr("images", "check").stdout
    assert any(line.split()[0] == pushed and " true" in line
               for line in check.splitlines()[1:]), check

    r = ctrd.run(pushed, ["python3", "-c", "import os; print(42, os.environ['X'])"],
                 env={"X": "y"})
    assert (r.returncode, r.stdout) == (0, "42 y\n"), r.stderr
    # The container's own status comes back, not ctr's.
    r = ctrd.run(pushed, ["sh", "-c", "echo oops >&2; exit 3"])
    assert (r.returncode, r.stderr) == (3, "oops\n")


def test_pull_of_a_missing_tag_raises_naming_it(ctrd: Containerd, pushed: str):
    missing = pushed.rpartition(":")[0] + ":no-such-tag"
    with pytest.raises(CtrFailed) as e:
        ctrd.pull(missing)
    assert missing in str(e.value) and "not found" in e.value.stderr, str(e.value)


def test_run_of_an_image_it_does_not_hold_raises(ctrd: Containerd):
    ref = f"{REGISTRY_HOST}/imgbuild-test-ctr-never:pulled"
    with pytest.raises(CtrFailed) as e:
        ctrd.run(ref, ["true"])
    assert ref in str(e.value) and "not found" in str(e.value), str(e.value)


# -- the kubelet's way: CRI ImageService/PullImage --------------------------------------------

@pytest.fixture(scope="module")
def kubelet(tmp_path_factory) -> Iterator[Containerd]:
    with containerd_daemon(tmp_path_factory.mktemp("cri"), cri=True) as c:
        yield c


def test_a_kubelet_pull_records_the_registry_digest_unpacks_and_runs(kubelet: Containerd,
                                                                      pushed: str):
    want = registry_digest(pushed)
    assert kubelet.kubelet_pull(pushed) == want
    # The CRI plugin served the pull (it logs each PullImage and what it returned), not ctr:
    # an image ctr pulls into k8s.io gets the CRI's label too, so the label proves nothing.
    log = kubelet.log.read_text(errors="replace")
    assert f'PullImage \\"{pushed}\\" returns image reference' in log, log[-2000:]
    listed = [ln for ln in kubelet.ctr("images", "ls").stdout.splitlines()[1:]
              if ln.split()[0] == pushed]
    assert listed and "io.cri-containerd.image=managed" in listed[0], listed
    check = kubelet.ctr("images", "check").stdout
    assert any(line.split()[0] == pushed and " true" in line
               for line in check.splitlines()[1:]), check
    r = kubelet.run(pushed, ["python3", "-c", "print(6 * 7)"])
    assert (r.returncode, r.stdout) == (0, "42\n"), r.stderr


def test_a_kubelet_pull_of_a_missing_tag_raises_naming_it(kubelet: Containerd, pushed: str):
    missing = pushed.rpartition(":")[0] + ":no-such-tag"
    with pytest.raises(CtrFailed) as e:
        kubelet.kubelet_pull(missing)
    # CRI's words (the gRPC status a kubelet shows in the pod's events), not ctr's.
    assert missing in str(e.value) and "not found" in e.value.stderr, str(e.value)
    assert e.value.stderr.startswith("NOT_FOUND: failed to pull and unpack image"), e.value.stderr


def test_kubelet_pull_needs_the_cri_plugin(ctrd: Containerd, pushed: str):
    # The plain harness has CRI off: asking it for a kubelet's pull says how to get one.
    with pytest.raises(ImgbuildError) as e:
        ctrd.kubelet_pull(pushed)
    assert "cri=True" in str(e.value)


def test_another_releases_binaries_are_looked_for_in_its_directory_only(tmp_path):
    # bench/node_pull_bench.py --containerd-bin: a directory without them is named, and the
    # system's containerd on PATH is not taken in their place.
    from .containerd import find_tools

    assert find_tools(tmp_path) == f"skipped: containerd and ctr are not both in {tmp_path}"
    for name in ("containerd", "ctr"):
        (tmp_path / name).write_text("#!/bin/sh\n")
        (tmp_path / name).chmod(0o755)
    tools = find_tools(tmp_path)
    if tools == "skipped: containerd needs root (it mounts snapshots and owns its state)":
        pytest.skip(tools)
    assert not isinstance(tools, str), tools
    assert (tools.containerd, tools.ctr) == (str(tmp_path / "containerd"), str(tmp_path / "ctr"))


# -- layers applied at once: containerd >= 2.2's max_concurrent_unpacks -----------------------
# What made a node's cold pull of the slim image 0.42x of the Engine's on two cores
# (bench/node_pull_bench.py, kubelet2p_zstd). Each layer is applied into a snapshot of its own
# and rebased onto its parent at commit, so deletions in an upper layer (whiteouts, opaque
# directories) are where it could go wrong: the image below has both.

# Three layers: files, then a file's directory removed and another directory replaced (an
# opaque directory), then one more file.
LAYERED = f"""FROM {BASE}
RUN mkdir -p /opt/t/gone /opt/t/opaque && echo a > /opt/t/gone/f && echo old > /opt/t/opaque/old \\
    && echo keep > /opt/t/keep
RUN rm -rf /opt/t/gone /opt/t/opaque && mkdir /opt/t/opaque && echo new > /opt/t/opaque/new
RUN echo top > /opt/t/top
"""
LISTING = ["sh", "-c", "cd /opt/t && find . | sort && cat keep opaque/new top"]
SEEN = "\n".join([".", "./keep", "./opaque", "./opaque/new", "./top", "keep", "new", "top"]) + "\n"


@pytest.fixture(scope="module")
def parallel_bin() -> Path:
    """IMGBUILD_CONTAINERD_BIN: a directory with containerd >= 2.2 and its ctr and shims (no
    Debian release packages one yet); else the test skips, saying so."""
    d = os.environ.get("IMGBUILD_CONTAINERD_BIN")
    if not d:
        pytest.skip("skipped: layers applied at once need containerd >= 2.2; set "
                    "IMGBUILD_CONTAINERD_BIN to a directory with one, its ctr and shims")
    try:  # "containerd github.com/containerd/containerd/v2 v2.2.7 REVISION"; Debian's say
        said = subprocess.run([str(Path(d) / "containerd"), "--version"], capture_output=True,
                              text=True, timeout=30).stdout.strip()  # "1.6.20~ds1"
    except OSError as e:
        said = str(e)
    m = re.search(r" v?(\d+\.\d+)[.~+-]", said + " ")
    if not m or Version(m.group(1)) < Version("2.2"):
        pytest.skip(f"skipped: IMGBUILD_CONTAINERD_BIN={d} holds {said or 'nothing'}, "
                    "not containerd >= 2.2")
    return Path(d)


@pytest.fixture(scope="module")
def layered(docker_client) -> Iterator[str]:
    if not registry_available():
        pytest.skip(f"skipped: no registry on {REGISTRY_HOST} (make services starts one)")
    try:
        docker_client.images.get(BASE)
    except Exception:
        pytest.skip(f"skipped: no {BASE} image here (make demo bootstraps it)")
    repo = f"{REGISTRY_HOST}/imgbuild-test-ctr-{uuid.uuid4().hex[:8]}"
    image, _ = docker_client.images.build(fileobj=io.BytesIO(LAYERED.encode()),
                                          tag=f"{repo}:layered", rm=True)
    try:
        for line in docker_client.images.push(repo, tag="layered", stream=True, decode=True):
            assert "error" not in line, line
        # What the Engine itself shows of the image: the reference the node must match.
        seen = docker_client.containers.run(image.id, LISTING, remove=True).decode()
        assert seen == SEEN, seen
        yield f"{repo}:layered"
    finally:
        docker_client.images.remove(image.id, force=True)


def test_a_node_that_applies_layers_at_once_sees_the_files_the_engine_sees(
        tmp_path, parallel_bin: Path, layered: str):  # parallel_bin first: it may skip
    with containerd_daemon(tmp_path, cri=True, bin_dir=parallel_bin, unpacks=4) as c:
        assert c.kubelet_pull(layered) == registry_digest(layered)
        assert c.unpack_modes() == ["parallel=true"], c.log.read_text()[-3000:]
        r = c.run(layered, LISTING)
        assert (r.returncode, r.stdout) == (0, SEEN), r.stderr


def test_one_layer_at_a_time_unless_asked(tmp_path, parallel_bin: Path, layered: str):
    # The same release with the harness's default: the setting above is what changed it.
    with containerd_daemon(tmp_path, cri=True, bin_dir=parallel_bin, log_debug=True) as c:
        c.kubelet_pull(layered)
        assert c.unpack_modes() == ["parallel=false"], c.log.read_text()[-3000:]
        r = c.run(layered, LISTING)
        assert (r.returncode, r.stdout) == (0, SEEN), r.stderr
