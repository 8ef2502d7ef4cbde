"""The containerd harness (tests/containerd.py) against the shared registry: what the Engine
pushed, containerd pulls as the same digest and runs; a tag that does not exist fails, named."""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest
import requests

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
