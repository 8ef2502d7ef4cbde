"""Reading a checkpoint for check-model: config.json, and module names from the safetensors
index or headers (no weights are read)."""

from __future__ import annotations

import json
import re
import struct
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

# Reading config.json (bounded, with its errors), where the quantization config is, and the hub
# download live in the catalog: model profiles read a checkpoint's config.json the same way.
from ...catalog.checkpoints import MAX_JSON_BYTES, hub_file, hub_module, quant_config
from ...catalog.checkpoints import read_json as _read_json
from ...errors import InputError

__all__ = ["MAX_JSON_BYTES", "QUANT_PARAMS", "Checkpoint", "load_checkpoint", "malformed",
           "quant_config", "safetensors_keys"]

QUANT_PARAMS = ("weight_packed", "weight_scale")


@dataclass(frozen=True)
class Checkpoint:
    """What check-model reads: config.json, and module names when tensors are listed."""

    config: dict[str, Any] = field(hash=False, compare=False)
    module_names: tuple[str, ...]  # modules that own tensors, sorted
    source: str
    quantized: frozenset[str] = frozenset()  # modules with weight_packed / weight_scale
    w4a4: frozenset[str] = frozenset()  # NVFP4 modules with an input_global_scale
    names_from: str | None = None  # file the names were read from; None: config only
    config_path: Path | None = None
    config_text: str | None = field(default=None, hash=False, compare=False, repr=False)

    @classmethod
    def from_tensors(cls, config: dict[str, Any], tensor_names: Iterable[str], source: str, *,
                     names_from: str | None = None, config_path: Path | None = None,
                     config_text: str | None = None) -> Checkpoint:
        modules: set[str] = set()
        quantized: set[str] = set()
        w4a4: set[str] = set()
        for t in tensor_names:
            mod, _, param = t.rpartition(".")
            if not mod:
                continue
            modules.add(mod)
            if param in QUANT_PARAMS:
                quantized.add(mod)
            elif param == "input_global_scale":
                w4a4.add(mod)
        return cls(config, tuple(sorted(modules)), source, frozenset(quantized),
                   frozenset(w4a4 & quantized), names_from, config_path, config_text)

    @property
    def architecture(self) -> str | None:
        archs = self.config.get("architectures")
        return archs[0] if isinstance(archs, list) and archs and isinstance(archs[0], str) \
            else None


def _where(keys: tuple[str, ...], *more: object) -> str:
    return ".".join(keys) + "".join(f"[{m!r}]" if isinstance(m, int) else f".{m}" for m in more)


def _patterns(value: Any, keys: tuple[str, ...], name: str, problems: list[str]) -> None:
    """A list of module names or `re:` expressions (compressed-tensors' `ignore`, `targets`)."""
    if value is None:
        return
    if not isinstance(value, list):
        problems.append(f"{_where(keys, name)} is {type(value).__name__} {_short(value)}; "
                        f"compressed-tensors reads a list of names or `re:` expressions")
        return
    for i, e in enumerate(value):
        if not isinstance(e, str):
            problems.append(f"{_where(keys, name, i)} is {type(e).__name__} {_short(e)}, "
                            f"not a name or `re:` expression")
        elif e.startswith("re:"):
            try:
                re.compile(e[3:])
            except re.error as err:
                problems.append(f"{_where(keys, name, i)} {e!r} is not a regular expression "
                                f"({err}); the engine fails on it when it loads the model")


def _short(v: Any) -> str:
    t = json.dumps(v)
    return t if len(t) <= 60 else t[:57] + "..."


def malformed(q: Mapping[str, Any], keys: tuple[str, ...]) -> list[str]:
    """What in a compressed-tensors quantization config has a shape its reader does not accept
    (compressed-tensors' QuantizationConfig): each a sentence naming the key. Empty: well formed
    enough to judge."""
    problems: list[str] = []
    for k in ("format", "quant_method", "quantization_status"):
        if q.get(k) is not None and not isinstance(q[k], str):
            problems.append(f"{_where(keys, k)} is {type(q[k]).__name__} {_short(q[k])}, "
                            f"not a string")
    _patterns(q.get("ignore"), keys, "ignore", problems)
    groups = q.get("config_groups")
    if groups is not None:
        if not isinstance(groups, dict):
            problems.append(f"{_where(keys, 'config_groups')} is {type(groups).__name__} "
                            f"{_short(groups)}; compressed-tensors reads a mapping of group "
                            f"name to scheme")
            groups = {}
        for g, gc in groups.items():
            if isinstance(gc, list):  # a preset scheme's name -> its targets
                _patterns(gc, (*keys, "config_groups"), g, problems)
                continue
            if not isinstance(gc, dict):
                problems.append(f"{_where(keys, 'config_groups', g)} is {type(gc).__name__} "
                                f"{_short(gc)}, not a scheme (a mapping with targets)")
                continue
            gk = (*keys, "config_groups", g)
            if "targets" not in gc:
                problems.append(f"{_where(gk, 'targets')} is missing: a scheme names the "
                                f"modules it quantizes")
            _patterns(gc.get("targets"), gk, "targets", problems)
            if gc.get("format") is not None and not isinstance(gc["format"], str):
                problems.append(f"{_where(gk, 'format')} is {type(gc['format']).__name__} "
                                f"{_short(gc['format'])}, not a string")
            for part in ("weights", "input_activations", "output_activations"):
                if gc.get(part) is not None and not isinstance(gc[part], dict):
                    problems.append(f"{_where(gk, part)} is {type(gc[part]).__name__} "
                                    f"{_short(gc[part])}, not a mapping (num_bits, type, "
                                    f"strategy ...)")
    return problems


def safetensors_keys(path: Path) -> list[str]:
    """Tensor names in a .safetensors file, from its JSON header (8-byte length, then JSON)."""
    with open(path, "rb") as f:
        head = f.read(8)
        if len(head) != 8:
            raise InputError(f"{path}: not a safetensors file (shorter than its header)")
        (n,) = struct.unpack("<Q", head)
        if n > 512 * 1024 * 1024:
            raise InputError(f"{path}: not a safetensors file (header length {n})")
        try:
            header = json.loads(f.read(n))
        except ValueError as e:
            raise InputError(f"{path}: unreadable safetensors header ({e})") from None
    if not isinstance(header, dict):
        raise InputError(f"{path}: not a safetensors file (its header is JSON "
                         f"{type(header).__name__}, not an object of tensors)")
    return [k for k in header if k != "__metadata__"]


def _index_names(index: Path, err: InputError) -> list[str]:
    """The tensor names a safetensors index maps. One without its weight_map is refused with
    `err`: reading none of its names would pass the checkpoint off as one with no modules."""
    doc, _ = _read_json(index)
    wm = doc.get("weight_map")
    if not isinstance(wm, dict):
        raise err
    return list(wm)


def _tensor_names(d: Path) -> tuple[list[str] | None, str | None]:
    index = d / "model.safetensors.index.json"
    if index.is_file():
        return _index_names(index, InputError(
            f"{index}: no weight_map", hint="the index is truncated; download it again")), \
            index.name
    files = sorted(d.glob("*.safetensors"))
    if files:
        names: list[str] = []
        for f in files:
            names += safetensors_keys(f)
        return names, ", ".join(f.name for f in files[:3]) + (" ..." if len(files) > 3 else "") \
            + " (headers)"
    return None, None


_REPO_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")


def load_checkpoint(path: str | Path, *, revision: str | None = None) -> Checkpoint:
    """A checkpoint directory, its config.json (index or safetensors beside it are read too), a
    bare config file, or a Hugging Face repo id (only when the hub can be reached; at
    `revision`, default its main branch)."""
    p = Path(path).expanduser()
    if p.is_dir():
        cfg = p / "config.json"
        if not cfg.is_file():
            raise InputError(f"{p}: no config.json", hint="point check-model at the checkpoint "
                             "directory (the one with config.json and the .safetensors files)")
        config, text = _read_json(cfg)
        names, src = _tensor_names(p)
        return Checkpoint.from_tensors(config, names or (), str(p), names_from=src,
                                       config_path=cfg, config_text=text)
    if p.is_file():
        config, text = _read_json(p)
        names = src = None
        if p.name == "config.json":
            names, src = _tensor_names(p.parent)
        return Checkpoint.from_tensors(config, names or (), str(p), names_from=src,
                                       config_path=p, config_text=text)
    if _REPO_ID.match(str(path)) and not str(path).startswith((".", "/", "~")):
        return _load_hub(str(path), revision)
    raise InputError(f"no checkpoint at {path}",
                     hint="pass a checkpoint directory, its config.json, a model alias from "
                          "`imgbuild list`, or a Hugging Face repo id")


def _load_hub(repo: str, revision: str | None = None) -> Checkpoint:
    cfg = hub_file(repo, "config.json", revision)
    hh = hub_module()
    from huggingface_hub.utils import EntryNotFoundError

    config, text = _read_json(cfg)
    names: list[str] | None = None
    src = None
    try:
        idx = Path(hh.hf_hub_download(repo, "model.safetensors.index.json", revision=revision))
    except EntryNotFoundError:
        try:
            meta = hh.get_safetensors_metadata(repo, revision=revision)
            names = [t for fm in meta.files_metadata.values() for t in fm.tensors]
            src = f"{repo}: safetensors headers"
        except Exception:
            names = None
    except Exception:
        names = None
    else:  # an index that is there but damaged is refused, as a local one is
        names = _index_names(idx, InputError(
            f"{repo}: model.safetensors.index.json has no weight_map", facts=[f"read from {idx}"],
            hint="the copy in the Hugging Face cache is damaged; delete it and run the command "
                 "again"))
        src = f"{repo}: model.safetensors.index.json"
    return Checkpoint.from_tensors(config, names or (), repo, names_from=src, config_text=text)

