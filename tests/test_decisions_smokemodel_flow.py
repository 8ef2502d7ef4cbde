"""Where a build's smoke model comes from (pipeline/smokemodel.py smoke_model and
publish_smoke_model), without an Engine or a registry: this machine's cache first, then the
registry's artifact (unpacked and verified before it is used), else the generator; a generated
one that does not verify fails the build; a push skips a registry that has it already.

The checkpoint here is a stand-in that carries a reference a real one would (the files it
lists, with their sizes and sha256, and the recipe key): smokemodel.is_complete judges it as it
judges a real one. tests/test_smokemodel.py generates real ones."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

from imgbuild.errors import InputError, JobFailed
from imgbuild.image import registry
from imgbuild.payload import smoke as payload
from imgbuild.pipeline import smokemodel as sm
from imgbuild.plan.decide import smoke_model_key
from imgbuild.progress import SILENT

from .conftest import checkout_workspace
from .progress_notes import Notes

ALIAS = "tiny-nvfp4"
REPO = registry.Repository.parse("127.0.0.1:5000/acme")


def checkpoint(path: Path, key: str) -> Path:
    """A stand-in checkpoint `is_complete` accepts for `key`."""
    path.mkdir(parents=True)
    (path / "config.json").write_text('{"model_type": "llama"}')
    (path / "model.safetensors").write_bytes(b"\0" * 64)
    ref = path / payload.REFERENCE_DIR
    ref.mkdir()
    (ref / payload.REFERENCE_TENSORS).write_bytes(b"tensors")
    (ref / payload.REFERENCE_JSON).write_text(json.dumps({
        "key": key, "schema": payload.REFERENCE_SCHEMA, "files": payload.file_manifest(path)}))
    return path


@pytest.fixture()
def ws(tmp_path, monkeypatch):
    monkeypatch.setenv("IMGBUILD_CACHE", str(tmp_path / "cache"))
    return checkout_workspace()


@pytest.fixture()
def key(ws):
    return smoke_model_key(ws, ALIAS)


@pytest.fixture()
def world(monkeypatch, tmp_path):
    w = type("World", (), {})()
    w.artifact, w.generated, w.pushed, w.tags = None, [], [], {}
    w.generated_with = []

    def fetch(repo, tag, artifact_type):
        assert artifact_type == sm.ARTIFACT_TYPE
        return w.artifact
    monkeypatch.setattr(registry, "fetch_artifact", fetch)
    monkeypatch.setattr(registry, "manifest_digest", lambda repo, tag: w.tags.get(tag))
    monkeypatch.setattr(registry, "push_artifact", lambda *a, **kw: w.pushed.append((a, kw)))

    def generate(ws, alias, key, client, repo, path, *, log_dir, progress):
        w.generated.append(alias)
        w.generated_with.append((repo, log_dir))
        checkpoint(tmp_path / "made", w.generate_key or key)
        path.parent.mkdir(parents=True, exist_ok=True)
        sm._publish(tmp_path / "made", path, sm.smokemodel.spec_for(ws.catalog.model(alias)),
                    key)
    w.generate_key = None
    monkeypatch.setattr(sm, "_generate", generate)
    return w




def _entry(ws, key) -> Path:
    spec = sm.smokemodel.spec_for(ws.catalog.model(ALIAS))
    return sm.smokemodel.cache_path(spec, key=key)


def test_a_checkpoint_this_machine_has_is_used_and_nothing_is_asked(ws, key, world):
    checkpoint(_entry(ws, key), key)
    world.artifact = "not asked"
    assert sm.smoke_model(ws, ALIAS, key, None, REPO) == _entry(ws, key)
    assert world.generated == []


def test_the_registrys_artifact_is_unpacked_verified_and_kept(ws, key, world, tmp_path):
    layer = sm.layer_tar(checkpoint(tmp_path / "theirs", key))
    world.artifact = ("sha256:x", {}, layer)
    notes = Notes()
    got = sm.smoke_model(ws, ALIAS, key, None, REPO, progress=notes)
    assert got == _entry(ws, key) and sm.smokemodel.is_complete(
        got, sm.smokemodel.spec_for(ws.catalog.model(ALIAS)), key)
    assert world.generated == []
    [said] = notes.said
    assert said.startswith(f"smoke model {ALIAS} ({key[:12]}): fetched from {REPO.name} in ")


def test_an_artifact_made_for_another_key_is_refused_and_not_kept(ws, key, world, tmp_path):
    world.artifact = ("sha256:x", {}, sm.layer_tar(checkpoint(tmp_path / "theirs", "other")))
    with pytest.raises(JobFailed) as e:
        sm.smoke_model(ws, ALIAS, key, None, REPO)
    assert e.value.message == (f"{REPO.name}:{sm.artifact_tag(ALIAS, key)} does not hold the "
                               "smoke model its tag names")
    assert e.value.hint == "nothing was used; delete the tag, and a build makes it anew"
    assert not _entry(ws, key).exists()
    # Not a tar at all: said with why, and nothing kept either.
    world.artifact = ("sha256:x", {}, b"not a tar")
    with pytest.raises(JobFailed) as e:
        sm.smoke_model(ws, ALIAS, key, None, REPO)
    assert e.value.facts[0].startswith("its layer cannot be unpacked: ")
    assert e.value.hint == "nothing was used; delete the tag, and a build makes it anew"
    assert not _entry(ws, key).exists()
    assert [p.name for p in _entry(ws, key).parent.iterdir()] == []  # no scratch left


def test_without_a_registry_or_an_artifact_the_generator_makes_it(ws, key, world):
    notes = Notes()
    local = registry.Repository.parse("imgbuild")
    world.artifact = "never asked: no registry"
    assert sm.smoke_model(ws, ALIAS, key, None, local, progress=notes) == _entry(ws, key)
    assert world.generated == [ALIAS]
    assert notes.said[0].startswith(f"smoke model {ALIAS} ({key[:12]}): made by the generator")


def test_a_generated_checkpoint_that_does_not_verify_fails_the_build(ws, key, world):
    world.generate_key = "a key the generator got wrong"
    with pytest.raises(JobFailed) as e:
        sm.smoke_model(ws, ALIAS, key, None, REPO)
    assert e.value.message == (f"the generator made smoke model {ALIAS} ({key[:12]}), but it "
                               "does not verify")
    gen = ws.catalog.model(ALIAS).generator_image
    assert e.value.hint.endswith(f"`imgbuild build {gen} --rebuild`")


def test_a_push_skips_a_registry_that_has_it_and_a_repository_with_no_registry(ws, key,
                                                                                world):
    assert sm.publish_smoke_model(ws, ALIAS, key, None, registry.Repository.parse("x")) is None
    tag = sm.artifact_tag(ALIAS, key)
    world.tags[tag] = "sha256:there"
    assert sm.publish_smoke_model(ws, ALIAS, key, None, REPO) == tag
    assert world.pushed == [] and world.generated == []


def test_a_push_sends_the_checkpoint_as_an_artifact_with_its_file_list(ws, key, world):
    notes = Notes()
    tag = sm.publish_smoke_model(ws, ALIAS, key, None, REPO, progress=notes)
    assert tag == sm.artifact_tag(ALIAS, key) and world.generated == [ALIAS]
    [(args, kw)] = world.pushed
    repo, pushed_tag, artifact_type, doc, layer, layer_type = args
    assert (repo, pushed_tag, artifact_type, layer_type) == (
        REPO, tag, sm.ARTIFACT_TYPE, sm.LAYER_TYPE)
    spec = sm.smokemodel.spec_for(ws.catalog.model(ALIAS))
    assert doc == {"name": ALIAS, "key": key, "spec": spec.key(),
                   "files": payload.file_manifest(_entry(ws, key))}
    assert layer == sm.layer_tar(_entry(ws, key))
    assert kw == {"annotations": {"io.imgbuild.smoke-model.key": key}}
    assert notes.said[-1] == f"pushed {REPO.name}:{tag}"


def test_the_artifacts_tag_names_the_model_and_the_keys_first_16_digits():
    assert sm.artifact_tag("tiny-nvfp4", "0123456789abcdef" + "f" * 48) == \
        "smoke-model-tiny-nvfp4-0123456789abcdef"


def test_the_generator_is_given_the_repository_and_the_log_directory(ws, key, world, tmp_path):
    logs = tmp_path / "logs"
    sm.publish_smoke_model(ws, ALIAS, key, None, REPO, log_dir=logs)
    assert world.generated_with == [(REPO, logs)]


def test_a_fetch_says_how_long_it_took(ws, key, world, tmp_path, monkeypatch):
    from types import SimpleNamespace

    world.artifact = ("sha256:x", {}, sm.layer_tar(checkpoint(tmp_path / "theirs", key)))
    clock = iter([100.0, 102.5])
    monkeypatch.setattr(sm, "time", SimpleNamespace(monotonic=lambda: next(clock)))
    notes = Notes()
    sm.smoke_model(ws, ALIAS, key, None, REPO, progress=notes)
    assert notes.said == [f"smoke model {ALIAS} ({key[:12]}): fetched from {REPO.name} in 2.5 s"]


def test_an_artifact_is_unpacked_in_a_hidden_scratch_directory_named_for_its_entry(
        ws, key, world, tmp_path, monkeypatch):
    """Beside the cache entry (one rename puts it in place), hidden from a listing of the
    cache, and named for the entry it will become: one left by a killed run says whose it
    was."""
    world.artifact = ("sha256:x", {}, sm.layer_tar(checkpoint(tmp_path / "theirs", key)))
    seen = []
    real = sm.smokemodel.is_complete

    def is_complete(path, spec, k=None):
        seen.append(path)
        return real(path, spec, k)
    monkeypatch.setattr(sm.smokemodel, "is_complete", is_complete)
    sm.smoke_model(ws, ALIAS, key, None, REPO)
    entry = _entry(ws, key)
    [scratch] = [p.parent for p in seen if p.name == "m"]
    assert scratch.parent == entry.parent and scratch.name.startswith(f".{entry.name}.")


def test_silent_progress_is_the_default(ws, key, world):
    checkpoint(_entry(ws, key), key)
    assert sm.smoke_model(ws, ALIAS, key, None, REPO, progress=SILENT) == _entry(ws, key)


# --- check-model on a model named by its alias -----------------------------------------------

def test_a_generated_alias_is_read_from_this_machines_cache_or_said_missing(ws, key,
                                                                            monkeypatch):
    from imgbuild.checks.checkmodel import report

    monkeypatch.setattr(report, "load_checkpoint", lambda path, **kw: ("loaded", path, kw))
    with pytest.raises(InputError) as e:
        report.resolve_checkpoint(ALIAS, ws)
    assert e.value.message == f"smoke model {ALIAS} is not in this machine's cache"
    assert e.value.facts == [f"looked for {_entry(ws, key)}"]
    assert e.value.hint == (f"`imgbuild smoke-model {ALIAS}` fetches or makes it (--registry R "
                            "to fetch it from there)")
    checkpoint(_entry(ws, key), key)
    assert report.resolve_checkpoint(ALIAS, ws) == ("loaded", _entry(ws, key), {})


def test_a_generated_alias_is_looked_up_without_resolving_the_generators_lock(ws, key,
                                                                               monkeypatch):
    # check-model reads: it never runs uv to lock the generator image again to find a key
    from imgbuild.checks.checkmodel import report
    from imgbuild.plan import decide

    asked, make_plan = [], decide.make_plan
    monkeypatch.setattr(decide, "make_plan", lambda *a, **kw: asked.append(kw.get("resolve"))
                        or make_plan(*a, **kw))
    monkeypatch.setattr(report, "load_checkpoint", lambda path, **kw: path)
    checkpoint(_entry(ws, key), key)
    assert report.resolve_checkpoint(ALIAS, ws) == _entry(ws, key)
    assert asked == [False]


def test_a_hub_alias_is_its_checkpoint_at_its_revision_and_a_path_is_itself(ws, monkeypatch,
                                                                           tmp_path):
    from imgbuild.checks.checkmodel import report

    monkeypatch.setattr(report, "load_checkpoint", lambda path, **kw: ("loaded", path, kw))
    prof = ws.model("k2.6")
    assert report.resolve_checkpoint("k2.6", ws) == (
        "loaded", prof.checkpoint, {"revision": prof.revision})

    class Pinned:  # the same catalog, with the alias pinned to a revision of its repository
        def __getattr__(self, name):
            return getattr(ws, name)

        def model(self, alias):
            return replace(ws.model(alias), revision="0123abcd")

    assert report.resolve_checkpoint("k2.6", Pinned()) == (
        "loaded", prof.checkpoint, {"revision": "0123abcd"})
    # a directory of that name here is a path, not the alias
    (tmp_path / "k2.6").mkdir()
    monkeypatch.chdir(tmp_path)
    assert report.resolve_checkpoint("k2.6", ws) == ("loaded", "k2.6", {})
    assert report.resolve_checkpoint("k2.6", None) == ("loaded", "k2.6", {})


def test_a_checkpoints_layer_depends_on_its_files_names_and_bytes_only(tmp_path):
    import io
    import os
    import tarfile

    def made(d, mtime, mode):
        (d / "sub").mkdir(parents=True)
        for name, data in (("config.json", b"{}"), ("sub/model.safetensors", b"w" * 10)):
            (d / name).write_bytes(data)
            os.chmod(d / name, mode)
            os.utime(d / name, (mtime, mtime))
        return d
    a = sm.layer_tar(made(tmp_path / "a", 1_000_000, 0o600))
    b = sm.layer_tar(made(tmp_path / "b", 2_000_000, 0o664))
    assert a == b
    with tarfile.open(fileobj=io.BytesIO(a)) as tf:
        members = [(m.name, m.type, m.mode, m.mtime, m.uid, m.gid, m.uname, m.gname, m.size)
                   for m in tf.getmembers()]
    assert members == [
        ("config.json", tarfile.REGTYPE, 0o644, 0, 0, 0, "", "", 2),
        ("sub", tarfile.DIRTYPE, 0o755, 0, 0, 0, "", "", 0),
        ("sub/model.safetensors", tarfile.REGTYPE, 0o644, 0, 0, 0, "", "", 10)]
