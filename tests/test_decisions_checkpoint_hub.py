"""A model profile's config.json read from the Hugging Face hub (catalog/checkpoints.py
hub_file, read_config), through huggingface_hub itself and its cache laid out on disk as it
lays it out (models--ORG--NAME/refs, snapshots), with HF_HUB_OFFLINE set: the hub cannot be
reached from the machines the tests run on. The one answer only the hub gives (no such
repository) comes through the narrow seam of hf_hub_download raising it. Each failure is
checked word for word: the profile file, the checkpoint, the chain, the way out."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from imgbuild.catalog import checkpoints as C
from imgbuild.catalog.models import ModelProfile
from imgbuild.errors import EnvError, InputError

SHA = "0123456789abcdef0123456789abcdef01234567"
OFFLINE_HINT = (f"{C.PROFILE_HINT}; or, with the hub reachable and HF_HUB_OFFLINE unset (and "
                "HF_TOKEN for a gated model), run the command again: huggingface_hub caches "
                "config.json")


def _profile(checkpoint: str, revision: str | None = None) -> ModelProfile:
    return ModelProfile(alias="m", path="images/models/m.yaml", name="m", checkpoint=checkpoint,
                        size_gb=1.0, quant_method=None, quant_formats=(), quant_summary="",
                        tensor_parallel=1, revision=revision, quant_from_checkpoint=True)


@pytest.fixture()
def hub(tmp_path, monkeypatch):
    """huggingface_hub's cache with acme/nvfp4 at main (and at a second revision), offline."""
    cache = tmp_path / "hf" / "hub"
    repo = cache / "models--acme--nvfp4"
    for rev, sha in (("main", SHA), ("v2", "f" * 40)):
        snap = repo / "snapshots" / sha
        snap.mkdir(parents=True)
        (snap / "config.json").write_text(json.dumps({
            "architectures": ["Qwen3ForCausalLM"], "revision_here": rev,
            "quantization_config": {"quant_method": "compressed-tensors"}}))
        (repo / "refs").mkdir(exist_ok=True)
        (repo / "refs" / rev).write_text(sha)
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    # huggingface_hub reads its settings when imported: point the loaded module at them too.
    import huggingface_hub.constants as hc
    monkeypatch.setattr(hc, "HF_HUB_CACHE", str(cache))
    monkeypatch.setattr(hc, "HF_HUB_OFFLINE", True)
    return repo


def test_a_cached_config_is_read_at_its_revision(hub):
    assert C.hub_file("acme/nvfp4", cache_first=True) == \
        hub / "snapshots" / SHA / "config.json"
    config, where = C.read_config(_profile("acme/nvfp4"), Path("/nowhere"))
    assert (config["revision_here"], where) == ("main", "acme/nvfp4")
    config, where = C.read_config(_profile("acme/nvfp4", "v2"), Path("/nowhere"))
    assert (config["revision_here"], where) == ("v2", "acme/nvfp4@v2")
    # Not cache-first: huggingface_hub decides, offline from its cache.
    assert C.hub_file("acme/nvfp4", revision="v2").parent.name == "f" * 40


def test_a_config_the_hub_cannot_give_offline_says_how_to_go_on(hub):
    with pytest.raises(EnvError) as e:
        C.hub_file("acme/absent")
    err = e.value
    assert err.message == "cannot read acme/absent from the Hugging Face hub"
    # huggingface_hub's own sentence, cut to 200 characters
    assert err.facts[0].startswith("LocalEntryNotFoundError: An error happened while trying ")
    assert len(err.facts[0]) == len("LocalEntryNotFoundError: ") + 200
    assert err.facts[1] == "HF_HUB_OFFLINE=1"
    assert err.hint == ("download config.json and model.safetensors.index.json of the "
                        "checkpoint and pass their directory")
    with pytest.raises(EnvError) as e:
        C.read_config(_profile("acme/absent"), Path("/nowhere"))
    assert e.value.message == ("images/models/m.yaml: checkpoint acme/absent: cannot read "
                               "config.json from the Hugging Face hub")
    assert e.value.facts[:3] == [f"HF_HOME={Path(hub).parents[2] / 'hf'}", err.message,
                                 err.facts[0]]
    assert e.value.hint == OFFLINE_HINT


def test_no_such_repository_is_an_input_error_with_its_own_way_out(hub, monkeypatch):
    import httpx
    import huggingface_hub
    from huggingface_hub.utils import RepositoryNotFoundError

    def not_found(repo, filename, revision=None):
        # What the hub answers for a repo id it does not have (or will not show this token).
        url = f"https://huggingface.co/{repo}/resolve/main/{filename}"
        answer = httpx.Response(404, headers={"X-Error-Code": "RepoNotFound"},
                                request=httpx.Request("GET", url))
        raise RepositoryNotFoundError(f"404 Client Error. Repository Not Found for url: {url}",
                                      response=answer)
    monkeypatch.setattr(huggingface_hub, "hf_hub_download", not_found)
    with pytest.raises(InputError) as e:
        C.hub_file("acme/typo")
    assert (e.value.message, e.value.hint) == (
        "no repository acme/typo on the Hugging Face hub",
        "check the repo id (and HF_TOKEN for a gated model)")
    with pytest.raises(InputError) as e:
        C.read_config(_profile("acme/typo"), Path("/nowhere"))
    assert e.value.hint == ("check the repo id and `revision:` (HF_TOKEN for a gated model); "
                            + C.PROFILE_HINT)


def test_a_cached_config_that_is_not_json_is_named(hub):
    (hub / "snapshots" / SHA / "config.json").write_text("{")
    with pytest.raises(InputError) as e:
        C.read_config(_profile("acme/nvfp4"), Path("/nowhere"))
    assert e.value.message == ("images/models/m.yaml: checkpoint acme/nvfp4: config.json from "
                               "the hub is not readable JSON")
    assert e.value.hint == C.PROFILE_HINT


def test_without_huggingface_hub_a_repo_id_cannot_be_read(monkeypatch):
    import builtins

    real = builtins.__import__

    def no_hub(name, *a, **kw):
        if name == "huggingface_hub":
            raise ImportError(name)
        return real(name, *a, **kw)
    monkeypatch.setattr(builtins, "__import__", no_hub)
    with pytest.raises(EnvError) as e:
        C.hub_file("acme/nvfp4")
    assert (e.value.message, e.value.hint) == (
        "cannot read acme/nvfp4: huggingface_hub is not installed",
        "download the checkpoint's config.json and model.safetensors.index.json and pass their "
        "directory")


def test_a_local_checkpoint_that_is_not_there_says_where_it_looked(tmp_path):
    with pytest.raises(InputError) as e:
        C.read_config(_profile("./models/gone"), tmp_path)
    assert e.value.message == "images/models/m.yaml: checkpoint ./models/gone: no such directory"
    assert e.value.facts == [f"looked for {tmp_path / 'models' / 'gone'}",
                             f"a relative path is read from the project root ({tmp_path})"]
    assert e.value.hint == C.PROFILE_HINT
    with pytest.raises(InputError) as e:
        C.read_config(_profile(str(tmp_path / "abs")), tmp_path)
    assert e.value.facts == [f"looked for {tmp_path / 'abs'}"]  # absolute: no project root
    (tmp_path / "ck").mkdir()
    with pytest.raises(InputError) as e:
        C.read_config(_profile(str(tmp_path / "ck")), tmp_path)
    assert e.value.message.endswith(f"no config.json in {tmp_path / 'ck'}")
    (tmp_path / "ck" / "config.json").write_text("[")
    with pytest.raises(InputError) as e:
        C.read_config(_profile(str(tmp_path / "ck")), tmp_path)
    assert e.value.message.endswith("config.json is not readable JSON")
    assert e.value.hint == ("fix config.json (or download it again), or state `quantization:` "
                            "in the profile")
    # A config.json named directly is read as the file it is.
    (tmp_path / "f.json").write_text('{"architectures": ["X"]}')
    assert C.read_config(_profile(str(tmp_path / "f.json")), tmp_path) == (
        {"architectures": ["X"]}, str(tmp_path / "f.json"))


def test_only_the_first_line_of_what_huggingface_hub_says_is_shown(hub, monkeypatch):
    import huggingface_hub

    said = {"error": OSError("the first line\nthe traceback it carried")}

    def download(repo, filename, revision=None):
        raise said["error"]
    monkeypatch.setattr(huggingface_hub, "hf_hub_download", download)
    with pytest.raises(EnvError) as e:
        C.hub_file("acme/nvfp4")
    assert e.value.facts[0] == "OSError: the first line"
    said["error"] = TimeoutError()
    with pytest.raises(EnvError) as e:
        C.hub_file("acme/nvfp4")
    assert e.value.facts[0] == "TimeoutError: "


def test_planning_reads_the_cache_first_and_otherwise_huggingface_hub_decides(hub, monkeypatch):
    import huggingface_hub

    asked = []
    real = huggingface_hub.try_to_load_from_cache
    monkeypatch.setattr(huggingface_hub, "try_to_load_from_cache",
                        lambda *a, **kw: asked.append(a) or real(*a, **kw))
    C.hub_file("acme/nvfp4")
    assert asked == []
    C.hub_file("acme/nvfp4", cache_first=True)
    assert asked == [("acme/nvfp4", "config.json")]


def test_unset_hub_settings_are_named_empty(hub, monkeypatch):
    import huggingface_hub

    def download(repo, filename, revision=None):
        raise OSError("no network")
    monkeypatch.setattr(huggingface_hub, "hf_hub_download", download)
    monkeypatch.delenv("HF_HUB_OFFLINE")
    monkeypatch.delenv("HF_HOME")
    with pytest.raises(EnvError) as e:
        C.read_config(_profile("acme/elsewhere"), Path("/nowhere"))
    assert e.value.facts == ["HF_HOME=", "cannot read acme/elsewhere from the Hugging Face hub",
                             "OSError: no network", "HF_HUB_OFFLINE="]


def test_a_profile_is_read_from_the_cache_without_asking_the_hub(hub, monkeypatch):
    import huggingface_hub

    def download(repo, filename, revision=None):
        raise AssertionError("asked the hub")
    monkeypatch.setattr(huggingface_hub, "hf_hub_download", download)
    config, where = C.read_config(_profile("acme/nvfp4"), Path("/nowhere"))
    assert (config["revision_here"], where) == ("main", "acme/nvfp4")


def test_a_hub_config_that_is_not_json_says_why(hub):
    (hub / "snapshots" / SHA / "config.json").write_text("{")
    with pytest.raises(InputError) as e:
        C.read_config(_profile("acme/nvfp4"), Path("/nowhere"))
    assert e.value.facts and str(hub / "snapshots" / SHA / "config.json") in e.value.facts[0]
