"""The Plan and the Dockerfile rendered from it (pure: no Docker, no network)."""

from __future__ import annotations

import dataclasses

import pytest

from imgbuild.plan import render
from imgbuild.plan.decide import make_plan
from imgbuild.plan.key import finalize

from .conftest import checkout_workspace

WS = checkout_workspace()


@pytest.fixture(scope="module")
def cat():
    return WS.catalog


def plan(cat, target="tiny-cpu", **kw):
    return make_plan(WS, target, resolve=False, **kw)


def test_layer_order_puts_what_changes_least_first(cat):
    text = render.dockerfile(plan(cat))
    pos = {k: text.index(k) for k in (
        "FROM imgbuild-base:debian-bookworm-py3.11", "uv venv", "heavy.txt", "rest.txt",
        "COPY payload/", "COPY smoke/model", "LABEL ", "ENTRYPOINT ", "CMD ")}
    assert list(pos) == sorted(pos, key=pos.get)
    # Every instruction is explained by a comment right above it.
    lines = text.splitlines()
    for i, ln in enumerate(lines):
        if ln.startswith(("FROM", "RUN", "LABEL", "ENTRYPOINT")) and i and not lines[i - 1].startswith("#"):
            assert lines[i - 1].startswith(("COPY", "ENV", "ARG")), ln


def test_secrets_and_tools_are_mounts_not_layers(cat):
    text = render.dockerfile(plan(cat))
    assert "--mount=type=secret,id=cacert" in text
    assert "--mount=type=secret,id=netrc" in text
    assert "--mount=type=cache,id=imgbuild-uv" in text
    assert "--require-hashes --no-deps" in text
    assert "COPY tools" not in text and "ADD " not in text


def test_labels_carry_lock_hash_archs_cuda_patches(cat):
    p = plan(cat, "sglang-blackwell", model="k2.6")
    labels = dict(p.labels)
    assert labels["io.imgbuild.lock.hash"] == p.lock_hash
    assert labels["io.imgbuild.archs"] == "sm100,sm120"
    assert labels["io.imgbuild.cuda"] == "13.0"
    assert labels["io.imgbuild.patches"] == "none"
    assert labels["org.opencontainers.image.base.name"] == p.base_image
    text = render.dockerfile(p)
    assert f'io.imgbuild.lock.hash="{p.lock_hash}"' in text
    # devel: the host compiler and headers from the OS, the toolkit from the lock as CUDA_HOME.
    assert "apt-get install -y --no-install-recommends g++ python3-dev" in text
    assert f"ENV CUDA_HOME={p.cuda_home} " in text and "-soname,libcuda.so.1" in text
    assert text.index("heavy.txt") < text.index("ENV CUDA_HOME") < text.index("rest.txt")
    assert labels["io.imgbuild.kernels.sm120"].startswith("flash-attn-4=jit,")
    assert "sglang-kernel=sass" in labels["io.imgbuild.kernels.sm120"]
    hopper = render.dockerfile(plan(cat, "sglang-hopper", model="k2.6"))
    assert "apt-get install" in hopper and "python3.12" in hopper  # CUDA bases bring no python
    assert "CUDA_HOME" not in hopper  # cuda-devel: nvidia/cuda's own toolkit
    assert '"sglang.launch_server"' in text and '"kimi_k2"' in text


def test_content_key_same_inputs_same_key(cat):
    a, b = plan(cat), plan(cat)
    assert a.content_key == b.content_key and a.content_tag == b.content_tag
    # Where the image is pushed is not part of its content.
    c = plan(cat, repository="127.0.0.1:5000/elsewhere")
    assert c.content_key == a.content_key and c.ref() != a.ref()


def test_content_key_changes_with_what_decides_the_bytes(cat):
    base = plan(cat, "sglang-blackwell")  # its default model is k2.6
    assert base.model == "k2.6"
    assert plan(cat, "sglang-hopper").content_key != plan(cat, "sglang-hopper", model="k2.6").content_key
    assert plan(cat, "sglang-blackwell", model="tiny-nvfp4").content_key != base.content_key
    lock = WS.target(base.target).lock()
    other_lock = dataclasses.replace(lock, packages=lock.packages[1:])  # one pin fewer
    assert finalize(base, other_lock).content_key != base.content_key
    comments = dataclasses.replace(lock, body=lock.body.replace("# via", "#  via"),
                                   body_hash="sha256:" + "0" * 64)
    assert finalize(base, comments).content_key == base.content_key  # not what is installed
    other_base = dataclasses.replace(base, base_image="nvidia/cuda:12.9.1-cudnn-devel-ubuntu24.04")
    assert finalize(other_base, lock).content_key != base.content_key


def test_plan_tags_and_json(cat):
    p = plan(cat, repository="127.0.0.1:5000/imgbuild")
    d = p.to_dict()
    assert d["refs"][0] == f"127.0.0.1:5000/imgbuild:{p.content_tag}"
    assert "127.0.0.1:5000/imgbuild:tiny-cpu" in d["refs"]
    for k in ("target", "engine", "archs", "cuda", "base_image", "python", "platform_tag",
              "lock_path", "lock_hash", "overrides", "patches", "tags", "content_key"):
        assert k in d


def _instructions(text: str) -> list[str]:
    """Dockerfile instructions, continuation lines joined."""
    out, cur = [], ""
    for ln in text.splitlines():
        if ln.startswith("#") and not cur:
            continue
        cur += ln.rstrip("\\") + " "
        if not ln.endswith("\\"):
            out.append(cur.strip())
            cur = ""
    return out


def test_dead_weight_goes_in_the_step_that_installs_it(cat):
    """Each flavor's prune rules (images/prune.yaml) are applied in the same RUN as each
    install: a later RUN would leave the bytes in the install's layer."""
    slim = [i for i in _instructions(render.dockerfile(plan(cat))) if "uv pip install" in i]
    assert len(slim) == 2  # heavy and rest
    for step, part in zip(slim, ("heavy", "rest")):
        assert step.startswith("RUN ") and "-r /opt/imgbuild/" + part in step
        assert "find . -mindepth 2 \\( -path './torch/test' -o -type d -name 'tests' -o " \
               "-type f -name '*.a' \\) -prune -print -exec rm -rf {} +" in step
        assert step.index("uv pip install") < step.index("find .")
        assert step.endswith(f"> /opt/imgbuild/pruned-{part}.txt")
    # devel keeps static libraries (nvcc links the CUDA runtime statically by default).
    devel = render.dockerfile(plan(cat, "sglang-blackwell"))
    assert "-path './torch/test' -o -type d -name 'tests'" in devel and "'*.a'" not in devel
    # No rule for the flavor, no step: the Dockerfile (and so the content key) carries them.
    assert "find ." not in render.dockerfile(dataclasses.replace(plan(cat), prune=()))


@pytest.mark.parametrize("rule, said", [
    ({"name": "x", "path": "../etc", "flavors": ["slim"], "why": "w"}, "no .., not absolute"),
    ({"name": "x", "path": "/usr", "flavors": ["slim"], "why": "w"}, "no .., not absolute"),
    ({"name": "x", "files": "*.a; rm -rf /", "flavors": ["slim"], "why": "w"}, "letters, digits"),
    ({"name": "x", "path": "a", "files": "*.a", "flavors": ["slim"], "why": "w"},
     "exactly one of path, dirs, files"),
    ({"name": "x", "dirs": "tests", "flavors": ["fat"], "why": "w"}, "one of devel"),
    ({"name": "x", "dirs": "tests", "flavors": ["slim"]}, "why nothing in the image reads"),
])
def test_prune_rules_are_checked(rule, said):
    from imgbuild.catalog.prune import parse_prune
    from imgbuild.errors import SpecError

    with pytest.raises(SpecError) as e:
        parse_prune({"rules": [rule]}, "images/prune.yaml")
    assert said in str(e.value) + " ".join(e.value.facts or ()), str(e.value)


def test_a_split_heavy_layer_installs_the_same_packages_in_two_steps(images_copy, tmp_path):
    from imgbuild.image.context import prepare_context
    from imgbuild.workspace import Workspace

    y = images_copy / "sglang-blackwell-slim.yaml"
    y.write_text(y.read_text() + "\nsplit_heavy_layer: true\n")
    ws = Workspace(images_copy, images_copy.parent / "lockfiles")
    one = make_plan(WS, "sglang-blackwell-slim", resolve=False)
    two = make_plan(ws, "sglang-blackwell-slim", resolve=False)
    assert two.split_heavy and not one.split_heavy
    assert two.content_key != one.content_key  # a declared input: another image
    # Said as `false`, or not said: the same image as before the key existed.
    y.write_text(y.read_text().replace("split_heavy_layer: true", "split_heavy_layer: false"))
    off = make_plan(Workspace(images_copy, images_copy.parent / "lockfiles"),
                    "sglang-blackwell-slim", resolve=False)
    assert off.content_key == one.content_key
    y.write_text(y.read_text().replace("split_heavy_layer: false", "split_heavy_layer: true"))
    steps = [i for i in _instructions(render.dockerfile(two)) if "uv pip install" in i]
    assert [s.split("-r /opt/imgbuild/")[1].split()[0] for s in steps] == \
        ["heavy-cuda.txt", "heavy-torch.txt", "rest.txt"]
    assert all("find . -mindepth 2" in s for s in steps)  # pruned where each installs
    lock = ws.target("sglang-blackwell-slim").lock()
    ctx = tmp_path / "ctx"
    prepare_context(two, lock, ctx, wheels=None, smoke_model_dir=None, patches={})
    parts = {n: (ctx / "lock" / f"{n}.txt").read_text().splitlines()
             for n in ("heavy-cuda", "heavy-torch", "heavy", "rest")}
    names = {n: {ln.split("==")[0] for ln in lines} for n, lines in parts.items()}
    # The two halves are the heavy layer exactly, and nothing of the rest.
    assert names["heavy-cuda"] | names["heavy-torch"] == names["heavy"]
    assert not names["heavy-cuda"] & names["heavy-torch"]
    assert {"torch", "triton"} <= names["heavy-torch"]
    assert all(n.startswith(("nvidia-", "cuda-")) for n in names["heavy-cuda"])
    assert "nvidia-cublas" in names["heavy-cuda"]
    assert sorted(parts["heavy-cuda"] + parts["heavy-torch"]) == sorted(parts["heavy"])


def test_a_root_only_target_says_so_in_its_plan_labels_and_key(images_copy):
    from imgbuild.plan.labels import root_only_reason
    from imgbuild.workspace import Workspace

    y = images_copy / "sglang-blackwell-slim.yaml"
    reason = "the engine writes its kernels beside its modules (upstream issue 123)"
    y.write_text(y.read_text().replace("smoke:\n", f"smoke:\n  root_only: >-\n    {reason}\n"))
    any_user = make_plan(WS, "sglang-blackwell-slim", resolve=False)
    root = make_plan(Workspace(images_copy, images_copy.parent / "lockfiles"),
                     "sglang-blackwell-slim", resolve=False)
    assert root.root_only == reason and any_user.root_only is None
    assert root.content_key != any_user.content_key  # a declared input: another image
    user = dict(root.labels)["io.imgbuild.user"]
    assert root_only_reason(user) == reason  # what the smoke test of a pulled image reads
    assert root_only_reason(dict(any_user.labels)["io.imgbuild.user"]) is None
