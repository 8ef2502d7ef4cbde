"""`imgbuild run`: the endpoint once ready, the doctor's reading when the server never was."""

from __future__ import annotations

import json

from rich.markup import escape

from ...checks.doctor import DoctorReport
from ...pipeline.run import RunReport
from ..console import Output
from . import kv, lines
from .checks import doctor_report


def ready(out: Output, r: RunReport) -> None:
    """Said the moment the server answers (the run then stays in the foreground)."""
    if out.json:
        return
    body = json.dumps({"model": (r.served or r.launch.model), "prompt": "The capital of France is",
                       "max_tokens": 16})
    kv(out.out, f"{r.target} is serving", [
        ("endpoint", r.endpoint),
        ("model", (r.served or r.launch.model)),
        ("container", r.launch.name + ("" if r.kept else "  (removed when this run ends: "
                                       "Ctrl-C)")),
        ("ready after", f"{r.seconds:g} s"),
        ("try", f"curl -s {r.endpoint}/v1/completions -H 'Content-Type: application/json' "
                f"-d '{body}'"),
    ])


def report(out: Output, r: RunReport) -> None:
    if out.json:
        out.print_json(r.to_dict())
        return
    c = out.out
    if r.status == "dry-run":
        c.print(escape(r.launch.dry_run_line()), soft_wrap=True)
        return
    if r.status == "emitted":
        lines(c, [f"wrote {f}" for f in r.files])
        return
    if r.status in ("ready", "stopped"):
        if r.status == "stopped":
            c.print(f"{escape(r.target)}: the server stopped (exit {r.container_exit})"
                    + ("; container kept" if r.kept else "; container removed"))
        return
    what = ("never answered on " + r.launch.health_path + f" within {r.seconds:g} s"
            if r.status == "timeout" else f"exited with code {r.container_exit} after "
            f"{r.seconds:g} s")
    c.print(f"[bold red]{escape(r.target)}: the server {what}[/]"
            + ("" if r.kept else " (container removed)"))
    if r.log_tail:
        lines(c, ["last lines of its log:", *[f"  {ln}" for ln in r.log_tail[-15:]]])
    doctor_report(out, DoctorReport(f"the log of {r.launch.name}", r.diagnoses))
