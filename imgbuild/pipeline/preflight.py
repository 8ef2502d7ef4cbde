"""`imgbuild preflight IMAGE|TARGET`: this host judged for a built image (its labels) or for a
target (its plan)."""

from __future__ import annotations

from dataclasses import dataclass

from ..errors import InputError
from ..image.base import host_platform
from ..image.preflight import preflight_facts, preflight_image
from ..payload.preflight import Report
from ..plan.decide import make_plan
from ..plan.labels import facts_from_plan
from ..workspace import Workspace


@dataclass(frozen=True)
class Preflight:
    subject: str  # what was judged, in words
    report: Report


def preflight(ws: Workspace, subject: str, *, model: str | None = None,
              archs: tuple[str, ...] | None = None, flavor: str | None = None,
              model_dir: str | None = None, nvidia_smi: str | None = None) -> Preflight:
    if subject in ws.catalog.targets:
        # The image this host would run: its own platform's, where the target has one.
        host = host_platform()
        plan = make_plan(ws, subject, model=model, archs=archs, flavor=flavor,
                         platform=host if host in ws.catalog.target(subject).platforms else None)
        report = preflight_facts(facts_from_plan(plan), model_dir=model_dir,
                                 nvidia_smi=nvidia_smi)
        return Preflight(f"target {plan.target}" + (f" --model {plan.model}" if plan.model
                                                     else ""), report)
    if model:
        raise InputError("--model goes with a target; an image carries its model in its labels",
                         hint=f"`imgbuild preflight TARGET --model {model}`")
    return Preflight(subject, preflight_image(subject, model_dir=model_dir,
                                              nvidia_smi=nvidia_smi))
