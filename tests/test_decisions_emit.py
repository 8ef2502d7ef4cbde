"""What `imgbuild run --emit` writes for a cluster or for compose, as reviewed.

The files are what a cluster or `docker compose` receives: the image, the GPUs, the shared
memory, the probes, the caches and where the engine writes, the nodes of a multi-node server.
tests/test_launch.py validates them against the Kubernetes schemas and compose's; this file
pins every field to its reviewed copy in tests/golden/emit/ (`make golden` records them after
a change meant to change them), so a change to any is seen in review.

Each case is emitted by `imgbuild run` in-process, for a target (nothing of the host is read)
and a fixed model cache, so nothing of the machine that runs the test is in the files.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from imgbuild.errors import InputError
from imgbuild.pipeline import run as run_mod
from imgbuild.plan.launch import cluster_for

from . import golden
from .conftest import checkout_workspace

CACHE = Path("/models/huggingface")
# (case, subject, model, kind, options)
CASES = (
    ("tiny-cpu-compose", "tiny-cpu", None, "compose", {}),
    ("tiny-cpu-k8s", "tiny-cpu", None, "k8s", {}),
    ("tiny-cpu-multi-k8s", "tiny-cpu-multi", None, "k8s", {}),
    ("sglang-blackwell-k2.6-compose-read-only", "sglang-blackwell", "k2.6", "compose",
     {"read_only_root": True, "env": (("SGLANG_LOG_LEVEL", "debug"),)}),
    ("sglang-blackwell-k2.6-k8s-4-per-node-rdma-gke", "sglang-blackwell", "k2.6", "k8s",
     {"gpus_per_node": 4, "cluster": "rdma+gke"}),
    ("sglang-blackwell-k2.6-k8s-read-only", "sglang-blackwell", "k2.6", "k8s",
     {"read_only_root": True}),
)


GOLDEN = golden.page_folder(__name__)


def pages() -> dict[str, str]:
    """Every emitted file, as CASE/FILE."""
    ws = checkout_workspace()
    out: dict[str, str] = {}
    for case, subject, model, kind, options in CASES:
        options = dict(options)
        if options.get("cluster") == "rdma+gke":
            options["cluster"] = cluster_for(ws.launch, gke=True, rdma=True)
        with golden.scratch("imgbuild-emit-"):
            # Emitted into a directory named as a user would (`--emit k8s deploy`): the
            # files' headers name it.
            r = run_mod.run(ws, subject, model=model, emit=(kind, Path("deploy")),
                            model_cache=CACHE, **options)
            assert r.status == "emitted"
            for f in sorted(r.files):
                out[f"{case}/{Path(f).name}"] = Path(f).read_text()
    return out




def test_the_emitted_files_are_the_reviewed_ones():
    GOLDEN.check(pages())


def test_each_case_emits_what_its_kind_needs():
    names = {}
    for key in pages():
        case, name = key.split("/")
        names.setdefault(case, []).append(name)
    assert names["tiny-cpu-compose"] == ["compose.yaml"]
    assert all(n.endswith(".yaml") for v in names.values() for n in v)
    assert any("leaderworkerset" in n for n in
               names["sglang-blackwell-k2.6-k8s-4-per-node-rdma-gke"])


def test_a_read_only_root_whose_image_writes_to_its_root_is_refused(monkeypatch, tmp_path):
    """The refusal comes before any file is written."""
    ws = checkout_workspace()
    import dataclasses

    from imgbuild.plan import launch as launch_mod

    real = launch_mod.launch_for

    def root_only(*a, **kw):
        return dataclasses.replace(real(*a, **kw), root_only="the engine writes beside itself")

    monkeypatch.setattr(run_mod, "launch_for", root_only)
    with pytest.raises(InputError) as e:
        run_mod.run(ws, "tiny-cpu", emit=("k8s", tmp_path / "k"), model_cache=CACHE,
                    read_only_root=True)
    assert e.value.message.startswith("cannot run imgbuild-")
    assert "--read-only" in e.value.message
    assert not (tmp_path / "k").exists()
