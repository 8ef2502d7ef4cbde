"""`imgbuild check-model PATH|ALIAS --target T [--fix OUT]`: the report for one checkpoint on
one target's locked engine."""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from ...catalog.checkpoints import local_checkpoint
from ...catalog.engines import EngineTable
from ...errors import InputError
from ...lock import wheels
from ...workspace import Workspace
from .behaviour import Behaviour
from .checkpoint import Checkpoint, load_checkpoint
from .findings import Finding, analyze
from .fix import FixResult, fix, write_fix
from .ignore import IgnoreAnalysis


@dataclass(frozen=True)
class Report:
    source: str
    target: str
    behaviour: Behaviour
    checkpoint: Checkpoint = field(repr=False)
    findings: tuple[Finding, ...]
    compressed_tensors: str | None = None
    fix: FixResult | None = None
    analysis: IgnoreAnalysis | None = None
    # --image: the image's engine asked about every layer (engine_schemes.py's report)
    in_image: dict[str, Any] | None = field(default=None, hash=False, compare=False)
    image: str | None = None

    @property
    def disagreement(self) -> str | None:
        """Where the reading of the wheels and the engine's own answer differ, in words."""
        if self.in_image is None:
            return None
        static_ok = not self.errors
        engine_ok = bool(self.in_image.get("ok"))
        if static_ok and not engine_ok:
            return ("check-model's reading of the locked wheels finds no error, but the image's "
                    "engine does not give every layer its declared scheme: the engine's answer "
                    "holds (its code ran); the wheels' facts (images/checks/engines.yaml) miss "
                    "this case")
        if engine_ok and not static_ok:
            kinds = ", ".join(sorted({f.kind for f in self.errors}))
            return (f"check-model finds errors ({kinds}) that the image's engine does not show "
                    "in its scheme choice: the engine's run covers which scheme each layer gets, "
                    "not loading the weights, memory or kernels, so an error of those kinds "
                    "stands; one about schemes means the image differs from the wheels read "
                    "(a patch, another version)")
        return None

    @property
    def errors(self) -> list[Finding]:
        return [f for f in self.findings if f.severity == "error"]

    @property
    def exit_code(self) -> int:
        """1 when an error remains that the written fix does not address, else 0."""
        fixed = {"ignore-parent"} if self.fix and self.fix.out else set()
        errors = self.errors
        if self.fix and self.fix.out and (self.fix.packed_added or self.fix.ignore_added):
            # a fused-layer error the fix settles: its layers are now listed, or mapped
            done = set(self.fix.ignore_added)
            errors = [f for f in errors if not (f.kind == "fused-projection" and (
                set(f.examples) <= done or self.fix.packed_added))]
        engine_failed = self.in_image is not None and not self.in_image.get("ok")
        return 1 if engine_failed or any(f.kind not in fixed for f in errors) else 0

    def to_dict(self) -> dict[str, Any]:
        c = self.checkpoint
        return {"checkpoint": self.source, "target": self.target,
                "architecture": c.architecture, "names_from": c.names_from,
                "modules": len(c.module_names), "quantized_modules": len(c.quantized),
                "compressed_tensors": self.compressed_tensors,
                "engine": self.behaviour.to_dict(),
                "ignore": self.analysis.to_dict() if self.analysis else None,
                "findings": [f.to_dict() for f in self.findings],
                "fix": self.fix.to_dict() if self.fix else None,
                "in_image": ({"image": self.image, "report": self.in_image,
                              "disagreement": self.disagreement}
                             if self.in_image is not None else None),
                "exit_code": self.exit_code}


def resolve_checkpoint(path_or_alias: str, ws: Workspace | None) -> Checkpoint:
    """A path or repo id, or a model alias from images/models/ (a generated one from the cache,
    where a build or `imgbuild smoke-model ALIAS` put it)."""
    p = Path(path_or_alias).expanduser()
    if not p.exists() and ws is not None and path_or_alias in ws.catalog.models:
        prof = ws.model(path_or_alias)
        if prof.generated:
            # Imported here: a path (the common case) needs neither the smoke-model generator
            # nor the planner, and check-model's start-up is part of what a user waits for.
            from ... import smokemodel
            from ...plan.decide import smoke_model_key

            spec = smokemodel.spec_for(prof)
            key = smoke_model_key(ws, prof.alias, resolve=False)
            path = smokemodel.cache_path(spec, key=key)
            if not smokemodel.is_complete(path, spec, key):
                raise InputError(f"smoke model {prof.alias} is not in this machine's cache",
                                 facts=[f"looked for {path}"],
                                 hint=f"`imgbuild smoke-model {prof.alias}` fetches or makes it "
                                      "(--registry R to fetch it from there)")
            return load_checkpoint(path)
        local = local_checkpoint(prof, ws.images.parent)  # a relative path is the project's
        return load_checkpoint(local if local is not None else prof.checkpoint,
                               revision=prof.revision)
    return load_checkpoint(path_or_alias)


def check_model(ws: Workspace, path_or_alias: str, target_name: str,
                fix_out: str | Path | None = None, *, engines: EngineTable | None = None,
                ct_formats: Iterable[str] | None = None) -> Report:
    """`imgbuild check-model PATH|ALIAS --target T [--fix OUT]`: the report (a view renders it;
    serialize with `Report.to_dict`; exit with `Report.exit_code`)."""
    ref = ws.target(target_name)
    target = ref.target
    table = engines or ws.engines
    ckpt = resolve_checkpoint(path_or_alias, ws)
    lock = ref.lock() if ref.has_lock else None
    ct = lock.package("compressed-tensors") if lock is not None else None
    ana = analyze(ckpt, target=target, catalog=ws.catalog, lock=lock, engines=table,
                  families=ws.families if lock is not None and ct_formats is None else (),
                  ct_formats=ct_formats,
                  index_urls=wheels.index_urls(ref.request.extra_index_urls))
    findings = list(ana.findings)
    if lock is None and ct_formats is None:
        findings = [f for f in findings if f.kind != "format"] + [Finding(
            "format", "info", f"no lock for {target.name}: formats not checked against its "
            f"compressed-tensors", (f"looked for {ref.display}",),
            f"run `imgbuild lock {target.name}`")]
    result = None
    if fix_out is not None:
        if ana.ignore is None:
            raise InputError("--fix has nothing to fix: the checkpoint is not quantized with "
                             "compressed-tensors",
                             facts=[f.message for f in ana.findings],
                             hint="leave --fix out")
        if not ana.ignore.names_known:
            raise InputError("--fix needs module names, and this checkpoint has none",
                             facts=[f"{ckpt.source}: no model.safetensors.index.json or "
                                    f".safetensors beside config.json"],
                             hint="run check-model on the checkpoint directory")
        result = fix(ckpt.config, ana.index, "substring", quantized=ckpt.quantized,
                     packed=ana.packed or None, add_ignore=ana.add_ignore)
        text = ckpt.config_text if ckpt.config_text is not None else \
            json.dumps(ckpt.config, indent=2) + "\n"
        result = write_fix(result, fix_out, text)
        findings = [replace(f, hint=f"the corrected config.json is at {result.out} (the "
                            f"original is {result.orig})") if f.kind == "ignore-parent"
                    and f.severity == "error" else f for f in findings]
    return Report(ckpt.source, target.name, ana.behaviour, ckpt, tuple(findings),
                  ct.version if ct else None, result, ana.ignore)
