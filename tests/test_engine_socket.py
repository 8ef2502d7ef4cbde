"""The Engine client on the local socket (image/daemon.py Engine): what a no-op build asks (is
the image here, tag it) it asks the socket itself, and answers as the docker SDK's client does;
everything else is the SDK's. (tests/test_layering.py holds that a no-op build loads no SDK.)"""

from __future__ import annotations

import io
import tarfile
import uuid

import pytest
from docker.errors import ImageNotFound

from imgbuild.image import daemon

pytestmark = pytest.mark.docker


@pytest.fixture()
def one_file_image(docker_client):
    """An image of one file, made here (no registry, no base), removed after."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tf:
        info = tarfile.TarInfo("hello.txt")
        info.size = 2
        tf.addfile(info, io.BytesIO(b"hi"))
    repo = f"imgbuild-test-socket-{uuid.uuid4().hex[:8]}"
    docker_client.api.import_image_from_data(buf.getvalue(), repository=repo, tag="1")
    yield f"{repo}:1"
    for img in docker_client.images.list(name=repo):
        for t in img.tags:
            docker_client.images.remove(t, noprune=True)


def test_the_local_socket_answers_as_the_sdk(docker_client, one_file_image):
    if daemon.local_socket() is None:
        pytest.skip("skipped: the Engine is not on a local socket here (DOCKER_HOST)")
    client = daemon.client()
    assert isinstance(client, daemon.Engine) and client._sdk is None
    img = client.images.get(one_file_image)
    assert img.id == docker_client.images.get(one_file_image).id
    assert img.attrs == docker_client.images.get(one_file_image).attrs
    assert img.labels == docker_client.images.get(one_file_image).labels
    repo = one_file_image.rpartition(":")[0]
    assert img.tag(repo, "moved") is True
    assert docker_client.images.get(f"{repo}:moved").id == img.id
    assert client._sdk is None  # so far, nothing asked of the SDK
    # Not here: the SDK's own answer, and local_image's None.
    with pytest.raises(ImageNotFound):
        client.images.get(f"{repo}:absent")
    assert daemon.local_image(client, f"{repo}:absent") is None
    # The rest is the SDK's, on the same Engine.
    assert img.tags and set(img.tags) >= {one_file_image, f"{repo}:moved"}
    assert client.version()["ApiVersion"] == docker_client.version()["ApiVersion"]
    assert [i.id for i in client.images.list(name=repo)] == [img.id]


# Which socket is asked, and no daemon on it: tests/test_decisions_daemon_socket.py (no Engine).
