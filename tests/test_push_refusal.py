"""The push refuses a manifest that would not describe its image, and the registry is left as
it was: the real push code (image/wire.py) against the real registry, on an image of the
Engine's own.

What it guards against happened on Docker Engine 26 with the containerd image store: the image
id is a manifest's digest there (an image pulled by digest); the push took `docker save`'s blob
of that digest, the image's manifest, for the config, and published a manifest whose config was
that manifest. Here the same wrong config is handed to the last step of the push,
`publish_manifest`, with layers that were really sent: the check before the PUT must stop it.
Break image/imagecheck.py's check and this test goes red (the registry gets the manifest)."""

from __future__ import annotations

import dataclasses
import hashlib
import io
import json
import tarfile
import uuid

import pytest
import requests

from imgbuild.errors import JobFailed
from imgbuild.image import wire
from imgbuild.image.compression import GZIP
from imgbuild.image.registry import Repository

from .conftest import REGISTRY_HOST

MANIFEST_TYPES = "application/vnd.oci.image.manifest.v1+json"


def tiny_image(client, name: str) -> str:
    """A one-layer image of a few bytes, imported into the Engine (no build, no base)."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tf:
        data = f"{name}\n".encode()
        info = tarfile.TarInfo("hello.txt")
        info.size, info.mtime = len(data), 0
        tf.addfile(info, io.BytesIO(data))
    repo = f"{REGISTRY_HOST}/imgbuild-test-refusal"
    client.api.import_image_from_data(buf.getvalue(), repository=repo, tag=name)
    return f"{repo}:{name}"


def state(repo: Repository) -> tuple:
    """What a reader of the repository sees: its tags and the manifest each names."""
    base = f"http://{repo.host}/v2/{repo.path}"
    r = requests.get(f"{base}/tags/list", timeout=30)
    tags = sorted((r.json().get("tags") or []) if r.status_code == 200 else [])
    return tuple((t, requests.head(f"{base}/manifests/{t}", headers={"Accept": MANIFEST_TYPES},
                                   timeout=30).headers.get("Docker-Content-Digest"))
                 for t in tags)


@pytest.mark.docker
def test_a_manifest_whose_config_is_not_its_images_is_refused_and_nothing_is_written(
        docker_client, own_repo):
    repo = Repository.parse(own_repo)
    old = tiny_image(docker_client, f"old-{uuid.uuid4().hex[:6]}")
    new = tiny_image(docker_client, f"new-{uuid.uuid4().hex[:6]}")
    try:
        # The previous image, pushed: its manifest is what the bug took for a config.
        old_push = wire.push(docker_client, old, repo, comp=GZIP)
        old_manifest = old_push.manifest
        assert hashlib.sha256(old_manifest).hexdigest() == old_push.digest.split(":")[1]

        # The new image's layers, really sent; then its manifest with the old manifest as its
        # config: what the containerd store's image id led the push to.
        got = wire.send_layers(docker_client, new, repo, comp=GZIP, hint_refs=(),
                               platform="linux/amd64", feed=lambda e: None, config_wanted=True)
        bad = dataclasses.replace(got, config=old_manifest, config_digest=old_push.digest)
        before = state(repo)
        tag = new.rsplit(":", 1)[1]
        with pytest.raises(JobFailed) as e:
            wire.publish_manifest(repo, tag, bad, ref=new, immutable=True)
        assert "refused" in e.value.message
        assert any("not an image config: it is an image manifest" in f for f in e.value.facts)
        assert state(repo) == before  # no manifest, no tag

        # Its layers in another order than its config's diff ids: refused the same way.
        other = wire.send_layers(docker_client, old, repo, comp=GZIP, hint_refs=(),
                                 platform="linux/amd64", feed=lambda e: None,
                                 config_wanted=True)
        mixed = dataclasses.replace(got, descriptors=other.descriptors, facts=other.facts)
        with pytest.raises(JobFailed) as e:
            wire.publish_manifest(repo, tag, mixed, ref=new, immutable=True)
        assert any(f.startswith("layer 0:") for f in e.value.facts), e.value.facts
        assert state(repo) == before

        # The image as it is: published, and its config is its own.
        digest, manifest = wire.publish_manifest(repo, tag, got, ref=new, immutable=True)
        assert json.loads(manifest)["config"]["digest"] == got.config_digest
        assert dict(state(repo))[tag] == digest
        # A content tag never moves: another manifest under it is refused, the same is a no-op.
        with pytest.raises(wire.TagTaken):
            wire.put_manifest(repo, tag, old_manifest, immutable=True)
        assert wire.put_manifest(repo, tag, manifest, immutable=True) == digest
        assert dict(state(repo))[tag] == digest
    finally:
        for ref in (old, new):
            docker_client.images.remove(ref, force=True)


@pytest.mark.docker
def test_moving_tags_move_only_onto_a_digest_that_verifies(docker_client, own_repo):
    """The registry holds the content tag already, for an image made elsewhere that carries no
    smoke report (nor SBOM, nor provenance). publish leaves the content tag as it is (content
    tags never move) and, even with the gate open (--force), moves no moving tag onto a digest
    `verify` refuses. The registry's tags are as they were."""
    from imgbuild.pipeline.build import Gate, publish
    from imgbuild.plan.decide import make_plan

    from .conftest import checkout_workspace

    repo = Repository.parse(own_repo)
    plan = make_plan(checkout_workspace(), "tiny-cpu", resolve=False, repository=own_repo)
    elsewhere = tiny_image(docker_client, f"elsewhere-{uuid.uuid4().hex[:6]}")
    here = tiny_image(docker_client, f"here-{uuid.uuid4().hex[:6]}")
    try:
        # Made elsewhere, pushed under the content tag by a client that published nothing
        # beside it.
        docker_client.images.get(elsewhere).tag(own_repo, plan.content_tag)
        held = wire.push(docker_client, plan.ref(), repo, comp=GZIP, immutable=True).digest
        # This machine's image for the same content tag: other bytes.
        docker_client.images.remove(plan.ref())
        docker_client.images.get(here).tag(own_repo, plan.content_tag)
        before = state(repo)
        with pytest.raises(JobFailed) as e:
            publish(plan, Gate(None, True, forced=True), docker_client, repo, push=True)
        assert "did not pass verify" in e.value.message
        assert any(f.startswith("smoke report: none stored") for f in e.value.facts), \
            e.value.facts
        assert state(repo) == before and dict(before)[plan.content_tag] == held
    finally:
        for ref in (elsewhere, here, plan.ref()):
            try:
                docker_client.images.remove(ref, force=True)
            except Exception:  # noqa: BLE001 - already gone
                pass
