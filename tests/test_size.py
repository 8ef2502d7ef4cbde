"""`imgbuild size IMAGE`: where the bytes are, in imgbuild's images and in any image with
Python; and the dead weight images/prune.yaml drops, gone from the image that was built."""

from __future__ import annotations

import io
import json
import tarfile

import pytest

from .conftest import run_imgbuild

pytestmark = pytest.mark.docker


@pytest.fixture(scope="module")
def tiny(docker_client) -> dict:
    r = run_imgbuild("tiny-cpu", "--json")
    assert r.returncode == 0, r.stderr[-3000:]
    return json.loads(r.stdout)


def _size(image: str) -> dict:
    r = run_imgbuild("size", image, "--json")
    assert r.returncode == 0, r.stderr[-2000:]
    return json.loads(r.stdout)


def test_the_breakdown_adds_up_and_names_the_packages(tiny, docker_client):
    d = _size(tiny["content_tag"])
    assert sum(d["by_kind"].values()) == d["total"] == sum(d["by_owner"].values())
    # The venv's distributions by their RECORD (bytecode by its source's), the rest by directory.
    assert d["by_owner"]["torch"] > 0.4e9 and d["by_owner_kind"]["torch"]["shared library"] > 0
    assert d["by_owner_kind"]["transformers"]["bytecode"] > 0
    assert "/usr" in d["by_owner"]
    # Within what the Engine counts for the image (its layers also hold directories and
    # metadata): a walk that missed a layer or counted one twice would fall outside.
    engine = docker_client.images.get(tiny["content_tag"]).attrs["Size"]
    assert 0.9 * engine < d["total"] <= engine
    assert [la["size"] for la in d["layers"]] and sum(la["size"] for la in d["layers"]) == engine


def test_the_slim_image_carries_none_of_the_dead_weight_its_rules_name(tiny, docker_client):
    d = _size(tiny["content_tag"])
    assert d["by_kind"].get("static library", 0) == 0
    assert not any("/tests/" in p or "torch/test/" in p
                   for dup in d["duplicates"] for p in dup["paths"])
    out = docker_client.containers.run(
        tiny["content_tag"], ["-c", "cat /opt/imgbuild/pruned-heavy.txt; echo ---; "
                              "test -e /opt/venv/lib/python3.11/site-packages/torch/test "
                              "&& echo present || echo gone; "
                              "ls -d /opt/venv/lib/python3.11/site-packages/numpy/_core/tests "
                              "2>&1 | tail -1"],
        entrypoint="sh", remove=True, network_disabled=True).decode()
    listed, rest = out.split("---")
    assert "./torch/test" in listed.split() and "gone" in rest
    assert "No such file" in rest  # numpy's test suite went with the rest layer


def test_any_image_with_python_and_a_clear_error_without(docker_client):
    base = _size("imgbuild-base:debian-bookworm-py3.11")
    assert base["total"] > 50e6 and "/usr" in base["by_owner"]
    # An image with no Python at all: a one-file image made here.
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tf:
        info = tarfile.TarInfo("hello.txt")
        info.size = 2
        tf.addfile(info, io.BytesIO(b"hi"))
    docker_client.api.import_image_from_data(buf.getvalue(), repository="imgbuild-test-nopy",
                                             tag="1")
    r = run_imgbuild("size", "imgbuild-test-nopy:1")
    said = " ".join(r.stderr.split())
    assert r.returncode == 1 and "could not read imgbuild-test-nopy:1's files" in said, said
    assert "without python3 or python" in said and "Traceback" not in said
    r = run_imgbuild("size", "imgbuild-test-no-such-image:1")
    assert r.returncode == 2 and "is not here" in r.stderr
