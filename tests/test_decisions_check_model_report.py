"""What `imgbuild check-model` decides around its analysis (checks/checkmodel/report.py):
what it says for a target with no lock, when --fix refuses and why, what it keeps as the
original config beside a fix, and the way out an error finding gives once a fix is written.

The checkpoints are config.json and an index written in a scratch directory (as
tests/test_checkmodel.py makes them); the workspace is the checkout's, seen through a view
that changes one target's patches or lock, as a user's project would."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

from imgbuild.checks import checkmodel as cm
from imgbuild.checks.checkmodel import report
from imgbuild.errors import InputError

from .conftest import checkout_workspace
from .test_checkmodel import ct_now
from .test_decisions_views_checks import _moe_checkpoint

TARGET = "sglang-0516-blackwell"


class Seen:
    """The checkout's workspace with one change to how a target is seen."""

    def __init__(self, ws, *, patches: tuple[str, ...] | None = None,
                 lock_path: Path | None = None) -> None:
        self._ws, self._patches, self._lock_path = ws, patches, lock_path

    def __getattr__(self, name):
        return getattr(self._ws, name)

    def target(self, name: str):
        ref = self._ws.target(name)
        if self._patches is not None:
            ref = replace(ref, target=replace(ref.target, patches=self._patches))
        if self._lock_path is not None:
            ref = replace(ref, lock_path=self._lock_path, display=str(self._lock_path))
        return ref


@pytest.fixture()
def moe(tmp_path, monkeypatch) -> Path:
    monkeypatch.chdir(tmp_path)
    return _moe_checkpoint(tmp_path / "moe")


# --- no lock ----------------------------------------------------------------------------------

def test_a_target_with_no_lock_says_its_formats_were_not_checked_and_how_to_lock(moe, tmp_path):
    ws = Seen(checkout_workspace(), lock_path=tmp_path / "lockfiles" / "none.lock")
    r = cm.check_model(ws, str(moe), TARGET)
    [said] = [f for f in r.findings if f.kind == "format"]
    assert said == cm.Finding(
        "format", "info", f"no lock for {TARGET}: formats not checked against its "
        "compressed-tensors", (f"looked for {tmp_path / 'lockfiles' / 'none.lock'}",),
        f"run `imgbuild lock {TARGET}`")
    assert r.compressed_tensors is None
    assert r.to_dict()["compressed_tensors"] is None


def test_formats_given_are_checked_without_a_lock_and_nothing_is_said_of_it(moe, tmp_path):
    ws = Seen(checkout_workspace(), lock_path=tmp_path / "none.lock")
    r = cm.check_model(ws, str(moe), TARGET, ct_formats=ct_now())
    assert not [f for f in r.findings if f.kind == "format"]


def test_with_a_lock_the_locked_compressed_tensors_is_named(moe):
    ws = checkout_workspace()
    r = cm.check_model(ws, str(moe), TARGET, ct_formats=ct_now())
    assert r.compressed_tensors == ws.target(TARGET).lock().package("compressed-tensors").version


# --- --fix refusals ---------------------------------------------------------------------------

def test_fix_refuses_a_checkpoint_that_is_not_quantized_and_says_what_was_found(tmp_path):
    d = tmp_path / "plain"
    d.mkdir()
    (d / "config.json").write_text(json.dumps({"architectures": ["Qwen3MoeForCausalLM"]}))
    ws = checkout_workspace()
    found = cm.check_model(ws, str(d), TARGET, ct_formats=ct_now())
    with pytest.raises(InputError) as e:
        cm.check_model(ws, str(d), TARGET, tmp_path / "out", ct_formats=ct_now())
    assert e.value.message == ("--fix has nothing to fix: the checkpoint is not quantized with "
                               "compressed-tensors")
    assert e.value.facts == [f.message for f in found.findings] and e.value.facts
    assert e.value.hint == "leave --fix out"
    assert not (tmp_path / "out").exists()


def test_fix_refuses_a_checkpoint_whose_module_names_are_unknown(moe, tmp_path):
    (moe / "model.safetensors.index.json").unlink()  # config.json alone
    with pytest.raises(InputError) as e:
        cm.check_model(checkout_workspace(), str(moe), TARGET, tmp_path / "out",
                       ct_formats=ct_now())
    assert e.value.message == "--fix needs module names, and this checkpoint has none"
    assert e.value.facts == [f"{moe}: no model.safetensors.index.json or .safetensors beside "
                             "config.json"]
    assert e.value.hint == "run check-model on the checkpoint directory"
    assert not (tmp_path / "out").exists()


# --- what a fix keeps and says ----------------------------------------------------------------

def test_the_original_kept_beside_a_fix_is_the_files_own_bytes(moe, tmp_path):
    original = (moe / "config.json").read_text()
    (moe / "config.json").write_text(original.replace("{", "{ ", 1))  # not json.dumps' layout
    r = cm.check_model(checkout_workspace(), str(moe), TARGET, tmp_path / "out",
                       ct_formats=ct_now())
    assert r.fix.orig.read_text() == original.replace("{", "{ ", 1)
    assert json.loads(r.fix.out.read_text()) == r.fix.config


def test_a_checkpoint_read_without_its_text_keeps_its_config_as_json(moe, tmp_path, monkeypatch):
    # a hub checkpoint's config is parsed, not kept as text: the original is written from it
    ck = replace(cm.load_checkpoint(moe), config_text=None)
    monkeypatch.setattr(report, "resolve_checkpoint", lambda p, ws: ck)
    r = cm.check_model(checkout_workspace(), "hub/repo", TARGET, tmp_path / "out",
                       ct_formats=ct_now())
    assert r.fix.orig.read_text() == json.dumps(ck.config, indent=2) + "\n"


def test_the_fix_is_made_for_the_matcher_an_unpatched_engine_has(moe, tmp_path):
    # SGLang 0.5.16 as released matches ignore entries as substrings: the fix rewrites the
    # parent entries to the modules they meant, and the error's way out names the fixed file.
    ws = Seen(checkout_workspace(), patches=())
    r = cm.check_model(ws, str(moe), TARGET, tmp_path / "out", ct_formats=ct_now())
    errors = [f for f in r.findings if f.kind == "ignore-parent" and f.severity == "error"]
    assert errors
    for f in errors:
        assert f.hint == (f"the corrected config.json is at {tmp_path / 'out' / 'config.json'} "
                          f"(the original is {tmp_path / 'out' / 'config.json.orig'})")
    assert r.fix.replaced == ("model.language_model.layers.0.mlp.experts.1",
                              "model.language_model.layers.1.mlp")
