"""An engine bump spliced in the registry (image/splice.py): the layers above the heavy ones
built alone, put beside the previous image's heavy layers, which never come to this machine.

The unit tests splice real configs (tests/fixtures/inline-cache: tiny-cpu as Docker Engine 20.10
built it). The live test does what a CI runner does on a fresh Engine, then checks the spliced
image against the same image built whole: the same files, the same config, and it passes the
smoke test when pulled.
"""

from __future__ import annotations

import copy
import hashlib
import io
import json
import subprocess
import tarfile
from pathlib import Path

import docker.errors
import pytest

from imgbuild.image import attest, daemon, inlinecache, splice
from imgbuild.image import registry as reg
from imgbuild.image.compression import GZIP, ZSTD
from imgbuild.plan.decide import make_plan

from . import fresh_engine
from .conftest import checkout_workspace, run_imgbuild
from .test_build_cache import registry_config, registry_manifest, runner_setup
from .test_project import cli

RECORDED = Path(__file__).parent / "fixtures" / "inline-cache"


def recorded(name: str = "first") -> dict:
    return json.loads((RECORDED / f"{name}.json").read_text())


def donor_of(config: dict) -> splice.Donor:
    """The recorded image as a donor: its heavy steps are history entries 4-5 (COPY, RUN), its
    layers 2-3."""
    history = config["history"]
    assert "COPY lock/heavy.txt" in history[4]["created_by"]
    assert "-r /opt/imgbuild/heavy.txt" in history[5]["created_by"]
    layers = tuple({"mediaType": GZIP.media_type, "digest": f"sha256:{n:064x}", "size": n}
                   for n in (2, 3))
    return splice.Donor("tiny-cpu", "sha256:" + "d" * 64, {}, config, 4,
                        tuple(history[4:6]), 2, layers,
                        tuple(config["rootfs"]["diff_ids"][2:4]))


def top_of(config: dict) -> dict:
    """What BuildKit makes of the same Dockerfile without the heavy steps: their history entries
    and layers gone, the rest as it was."""
    top = copy.deepcopy(config)
    del top["history"][4:6]
    del top["rootfs"]["diff_ids"][2:4]
    return top


def test_a_spliced_config_is_the_full_builds_less_its_inline_cache():
    full = recorded()
    got = json.loads(splice.spliced_config(donor_of(full), json.dumps(top_of(full)).encode()))
    assert got["rootfs"]["diff_ids"] == full["rootfs"]["diff_ids"]
    assert got["history"] == full["history"]
    # Its records index the top's layers: in the spliced image they would name the wrong ones.
    assert inlinecache.CONFIG_KEY in full and inlinecache.CONFIG_KEY not in got
    assert {k: v for k, v in got.items() if k not in ("rootfs", "history")} == \
        {k: v for k, v in full.items() if k not in ("rootfs", "history", inlinecache.CONFIG_KEY)}
    # The heavy steps sit where the full build has them: every layer-making entry lines up.
    made = [h for h in got["history"] if not h.get("empty_layer")]
    assert len(made) == len(got["rootfs"]["diff_ids"])
    assert inlinecache.heavy_layers(got) == (3,)


def created_by(config: dict) -> list[str]:
    return [h.get("created_by", "") for h in config["history"]]


def test_a_top_that_fits_the_donor_passes_and_each_difference_is_named():
    full = recorded()
    donor, top = donor_of(full), top_of(full)
    assert splice.check_top(donor, created_by(top), top["rootfs"]["diff_ids"]) is None

    # A base or venv layer that BuildKit did not take from the registry's cache.
    ids = list(top["rootfs"]["diff_ids"])
    ids[1] = "sha256:" + "0" * 64
    assert "layers under the heavy layer" in splice.check_top(donor, created_by(top), ids)

    # Another step before the heavy ones (another interpreter, say).
    steps = created_by(top)
    steps[1] = steps[1].replace("python3.11", "python3.12")
    assert "steps before the heavy layer" in splice.check_top(donor, steps,
                                                                top["rootfs"]["diff_ids"])

    # The rest install run otherwise than the donor's heavy install (a prune added, another
    # uv flag): the heavy layer would not be what this build makes.
    steps = created_by(top)
    rest = next(i for i, c in enumerate(steps) if "-r /opt/imgbuild/rest.txt" in c)
    steps[rest] = steps[rest].replace("--compile-bytecode", "--no-compile")
    assert "heavy install command is not this build's" in splice.check_top(
        donor, steps, top["rootfs"]["diff_ids"])

    # Where the wheels came from is no difference: the build argument's value is left out.
    steps = created_by(top)
    steps[rest] = steps[rest].replace("IMGBUILD_INDEX_FLAGS=--find-links /opt/imgbuild-wheels",
                                      "IMGBUILD_INDEX_FLAGS=--default-index http://mirror/simple")
    assert steps != created_by(top)
    assert splice.check_top(donor, steps, top["rootfs"]["diff_ids"]) is None


def test_what_cannot_be_spliced_whatever_the_registry_holds():
    from imgbuild.plan.decide import make_plan

    from .conftest import checkout_workspace

    ws = checkout_workspace()
    plan = make_plan(ws, "tiny-cpu", resolve=False, repository="r")
    assert splice.refused(plan, lambda p: False) is None
    assert "no heavy layer" in splice.refused(
        plan.__class__(**{**plan.__dict__, "heavy_packages": ()}), lambda p: False)
    assert "toolkit" in splice.refused(
        plan.__class__(**{**plan.__dict__, "cuda_home": "/opt/venv/cuda"}), lambda p: False)
    patched = plan.__class__(**{**plan.__dict__, "applied_patches": ("torch-fix",)})
    assert splice.refused(patched, lambda p: False) is None
    assert "patch torch-fix changes a package of the heavy layer" in splice.refused(
        patched, lambda p: p == "torch-fix")


def test_a_splice_is_for_a_pushed_image_no_smoke_test_runs_here():
    from imgbuild.cli.parser import parser
    from imgbuild.image.registry import Repository
    from imgbuild.pipeline.build import BuildOptions, cache_refs, splice_refs
    from imgbuild.plan.decide import make_plan

    from .conftest import checkout_workspace

    ws = checkout_workspace()
    repo = Repository.parse("ghcr.io/acme/imgbuild")
    plan = make_plan(ws, "tiny-cpu", resolve=False, repository=repo.name)
    pushed = BuildOptions("tiny-cpu", registry=repo.name, push=True, smoke=False)
    assert splice_refs(plan, repo, pushed) == cache_refs(plan, repo, pushed) != ()
    assert splice_refs(plan, repo, BuildOptions("tiny-cpu", registry=repo.name, push=True)) == ()
    assert splice_refs(plan, repo, BuildOptions("tiny-cpu", registry=repo.name,
                                                smoke=False)) == ()
    assert splice_refs(plan, repo, BuildOptions("tiny-cpu", registry=repo.name, push=True,
                                                smoke=False, splice=False)) == ()
    # No smoke model: nothing runs here either.
    bare = plan.__class__(**{**plan.__dict__, "smoke_model": None})
    assert splice_refs(bare, repo, BuildOptions("tiny-cpu", registry=repo.name,
                                                push=True)) != ()
    assert parser().parse_args(["build", "tiny-cpu", "--no-splice"]).no_splice is True


# --- live ------------------------------------------------------------------------------------

def _ok(r: subprocess.CompletedProcess) -> dict:
    assert r.returncode == 0, f"exit {r.returncode}\n{r.stdout[-3000:]}\n{r.stderr[-3000:]}"
    return json.loads(r.stdout)


def files(client, ref: str) -> dict[str, tuple]:
    """Every path of the image's filesystem: type, mode, owner, size, link, content digest.
    Compiled bytecode carries its source file's mtime, which is the install's clock in any two
    builds: that field is left out."""
    c = client.containers.create(ref, command=["true"])
    try:
        out = {}
        with tarfile.open(fileobj=io.BytesIO(b"".join(c.export()))) as tf:
            for m in tf:
                digest = None
                if m.isfile():
                    data = tf.extractfile(m).read()
                    if m.name.endswith(".pyc"):
                        data = data[:8] + data[12:]
                    digest = hashlib.sha256(data).hexdigest()
                out[m.name] = (m.type, m.mode, m.uid, m.gid, m.size, m.linkname, digest)
        return out
    finally:
        c.remove()


@pytest.mark.docker
@pytest.mark.xdist_group("fresh-engine-splice")
def test_an_engine_bump_is_spliced_in_the_registry_and_is_the_image_built_whole(tmp_path):
    repo, proj = runner_setup(tmp_path, "splice")

    with fresh_engine.fresh_engine() as engine:
        env = {"DOCKER_HOST": engine.host, "IMGBUILD_BLOB_CACHE_GB": "0"}
        client = engine.client()
        # The previous image: nothing in the registry to splice onto, so built whole (and said).
        # Built on this fresh Engine, not on the shared one whose BuildKit holds tiny-cpu's
        # steps already: that one's long history leaves the layers under the heavy ones out of
        # the image's inline cache (moby/buildkit#1992), and the bump below, finding them
        # nowhere, would be built whole ("not spliced after all"), as it should be.
        r = run_imgbuild("tiny-cpu", "--push", "--no-smoke", "--registry", repo, "--json",
                         "--progress", "plain", env=env, cwd=proj)
        first = _ok(r)
        assert first["action"] == "built"
        assert "not spliced, the image is built whole: no earlier image" in r.stderr
        for ref in first["refs"][1:]:  # as its passing smoke test would move them
            reg.tag_manifest(reg.Repository.parse(repo), first["content_tag"].rsplit(":", 1)[1],
                             ref.rsplit(":", 1)[1])
        old_cfg = registry_config(first["content_tag"])
        old_m = registry_manifest(first["content_tag"])
        [h] = inlinecache.heavy_layers(old_cfg)
        heavy_ids = set(old_cfg["rootfs"]["diff_ids"][h - 1:h + 1])  # its COPY and its RUN

        # What makes that image a donor, asked of the registry directly: the heavy lock part
        # in its own layer, and the compression its heavy layers are in.
        ws = checkout_workspace()
        plan = make_plan(ws, "tiny-cpu", resolve=False, repository=repo)
        lock = ws.target("tiny-cpu", plan.platform).lock()
        r_ = reg.Repository.parse(repo)
        donor, why = splice.find_donor(r_, plan, lock, [f"{repo}:tiny-cpu"], GZIP)
        assert donor is not None and donor.diff_ids == tuple(
            old_cfg["rootfs"]["diff_ids"][h - 1:h + 1]), why

        class OtherTorch:
            """The same lock but for one more line in its heavy part."""

            def requirements_text(self, heavy=None, layer=None):
                return lock.requirements_text(heavy, layer) + ("extra==1\n" if heavy else "")

        donor, why = splice.find_donor(r_, plan, OtherTorch(), [f"{repo}:tiny-cpu"], GZIP)
        assert donor is None and why == [f"{repo}:tiny-cpu: its heavy lock part is not this "
                                         "build's"]
        donor, why = splice.find_donor(r_, plan, lock, [f"{repo}:tiny-cpu"], ZSTD)
        assert donor is None and "this push writes application/vnd.oci.image.layer.v1.tar+zstd" \
            in why[0]

        # The engine bump on the next fresh runner: one more package in the rest of the lock.
        (proj / "images/tiny-cpu.yaml").write_text("extends: tiny-cpu\nrequirements:\n  - six\n")
        assert cli("lock", "tiny-cpu", cwd=proj).returncode == 0
        for img in client.images.list():
            client.images.remove(img.id, force=True)
        subprocess.run([daemon.cli().path, "-H", engine.host, "builder", "prune", "-af"],
                       check=True, capture_output=True)
        logs = tmp_path / "logs"
        r = run_imgbuild("tiny-cpu", "--push", "--no-smoke", "--registry", repo, "--json",
                         "--progress", "plain", "--log-dir", str(logs), env=env, cwd=proj)
        bump = _ok(r)
        # Where it was not, the output said why ("not spliced ..."): those lines first.
        assert bump["action"] == "spliced", "\n".join(
            [ln for ln in r.stderr.splitlines() if "splice" in ln] + [r.stderr[-2000:]])
        assert f"heavy layers are {repo}:" in r.stderr
        # No patch step: the rest layer is cut from the filesystem BuildKit streams, never
        # exported into the Engine (image/layercut.py).
        assert "the rest layer cut from the built filesystem" in r.stderr, r.stderr[-2000:]
        # While the tar streams, BuildKit says nothing: the status line says what is read.
        assert "the built filesystem streamed out" in r.stderr

        # Two builds side by side, a log each: the rest install (the filesystem streamed out)
        # and the top without it (built, checked and sent while the install ran).
        tag = bump["content_tag"].rsplit(":", 1)[1]
        log = (logs / f"{tag}.build.log").read_text()
        top_log = (logs / f"{tag}.top.build.log").read_text()
        assert "-r /opt/imgbuild/rest.txt" in log and "COPY payload/" not in log
        assert "COPY payload/" in top_log and "-r /opt/imgbuild/rest.txt" not in top_log
        # No inline cache asked of the streamed build: it would have the Engine put the rest
        # layer into its layer store before a byte of the tar is sent.
        assert "exporting cache" not in log and "exporting to client" in log
        # The heavy layers never came here: no step installed them, no image holds them, and
        # neither the content tag nor the top's own tag is left in the Engine.
        assert "/opt/imgbuild/heavy.txt" not in log + top_log
        here = {d for img in client.images.list(all=True)
                for d in img.attrs["RootFS"].get("Layers", [])}
        assert here and not heavy_ids & here
        with pytest.raises(docker.errors.ImageNotFound):
            client.images.get(bump["content_tag"])
        assert not [t for img in client.images.list() for t in img.tags if t.endswith("-top")]

        # In the registry: the previous image's heavy blobs, the changed layers sent once each.
        new_cfg = registry_config(bump["content_tag"])
        new_m = registry_manifest(bump["content_tag"])
        assert new_m["layers"][h - 1:h + 1] == old_m["layers"][h - 1:h + 1]
        assert new_cfg["rootfs"]["diff_ids"][:h + 1] == old_cfg["rootfs"]["diff_ids"][:h + 1]
        old_blobs = {la["digest"] for la in old_m["layers"]}
        changed = [la for la in new_m["layers"] if la["digest"] not in old_blobs]
        assert changed and bump["push"]["sent_bytes"] == sum(la["size"] for la in changed)
        assert bump["push"]["reused_layers"] == len(new_m["layers"]) - len(changed)
        assert inlinecache.CONFIG_KEY not in new_cfg
        # The cache tag stays on the image whose inline cache has the heavy step's result.
        assert bump["push"]["build_cache"] is None
        assert registry_manifest(f"{repo}:tiny-cpu-buildcache") == old_m
        # The SBOM follows the pushed digest: the lock's packages and the OS's, the latter read
        # from the top (the same base and steps under the heavy layer).
        digest = bump["pushed"][0].rsplit("@", 1)[1]
        got = reg.fetch_artifact(reg.Repository.parse(repo), attest.tag(digest, "sbom"),
                                 attest.SBOM_TYPE)
        assert got is not None and got[1]["metadata"]["component"]["bom-ref"] == digest
        purls = {c["purl"].split("@")[0] for c in got[1]["components"]}
        assert {"pkg:pypi/six", "pkg:pypi/torch"} <= purls
        assert any(p.startswith("pkg:deb/") for p in purls)

        # CI's next step: the same build with the smoke test pulls the spliced image by its
        # content tag, smoke-tests it and moves the tags.
        gated = _ok(run_imgbuild("tiny-cpu", "--push", "--registry", repo, "--json", env=env,
                                 cwd=proj))
        assert gated["action"] == "pulled" and gated["smoke"]["ok"], gated["smoke"]
        assert f"{repo}:tiny-cpu" in gated["moved"]
        client.images.get(bump["content_tag"]).tag(repo, "spliced-copy")

        # The same content built whole on this Engine (the heavy layer from the registry's
        # cache): the same files, the same config, the same steps.
        whole = _ok(run_imgbuild("tiny-cpu", "--no-smoke", "--rebuild", "--no-splice",
                                 "--registry", repo, "--json", env=env, cwd=proj))
        assert whole["action"] == "built" and whole["content_tag"] == bump["content_tag"]
        a, b = (client.images.get(f"{repo}:spliced-copy"), client.images.get(bump["content_tag"]))
        assert a.id != b.id  # two builds: other layer bytes (mtimes), so another config
        assert a.attrs["Config"] == b.attrs["Config"]
        assert [h.get("CreatedBy") for h in client.api.history(a.id)] == \
            [h.get("CreatedBy") for h in client.api.history(b.id)]
        fa, fb = files(client, a.id), files(client, b.id)
        assert len(fa) > 1000 and "opt/venv/lib/python3.11/site-packages/six.py" in fa
        assert {k for k in fa.keys() | fb.keys() if fa.get(k) != fb.get(k)} == set()


@pytest.mark.parametrize("comp", [GZIP, ZSTD], ids=["gzip", "zstd"])
def test_a_heavy_part_is_read_from_its_layer_in_either_compression(comp):
    """The donor's `COPY lock/heavy.txt` layer as the registry holds it, compressed as imgbuild
    compresses (image/compression.py), read back to the file."""
    text = b"torch==2.13.0 --hash=sha256:" + b"ab" * 32 + b"\n"
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tf:
        info = tarfile.TarInfo("opt/imgbuild/heavy.txt")
        info.size = len(text)
        tf.addfile(info, io.BytesIO(text))
    layer = buf.getvalue()
    blob = b"".join(comp.compressor(len(layer))(iter([layer])))
    assert blob != layer
    got = splice.decompressed(comp.media_type, blob)
    with tarfile.open(fileobj=io.BytesIO(got)) as tf:
        assert tf.extractfile("opt/imgbuild/heavy.txt").read() == text
