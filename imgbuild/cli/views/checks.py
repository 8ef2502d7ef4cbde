"""check-model, doctor and patches reports."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import TYPE_CHECKING

from rich.console import Console
from rich.markup import escape
from rich.panel import Panel
from rich.table import Table
from rich.text import Text

from ...checks import checkmodel, doctor
from ...checks.checkmodel.findings import engine_label
from ...checks.patches import PatchReport
from ..console import Output
from . import kv, table

if TYPE_CHECKING:  # the Docker SDK is loaded by `doctor --host` alone
    from ...image.engine import EngineFacts, EngineUse


def _check_model_human(report: checkmodel.Report, console: Console) -> None:
    """What was read, the engine's behaviours, findings uv-style, the fix."""
    c, b = report.checkpoint, report.behaviour
    head = Table(show_header=False, box=None, pad_edge=False)
    head.add_row("checkpoint", report.source)
    head.add_row("architecture", c.architecture or "?")
    head.add_row("modules", f"{len(c.module_names)} ({len(c.quantized)} quantized)"
                 + (f", from {c.names_from}" if c.names_from else ", no tensor names"))
    head.add_row("target", f"{report.target}: {engine_label(b)}"
                 + (f", compressed-tensors {report.compressed_tensors}"
                    if report.compressed_tensors else ""))
    for name, f in b.facts.items():
        v = f.value or "unknown"
        if f.patched_by:
            v += f" (patched by {f.patched_by}; was {f.base_value})"
        head.add_row(name.replace("_", " "), v)
    console.print(head)
    styles = {"error": "bold red", "warning": "bold yellow", "info": "bold blue"}
    for f in report.findings:
        lines = f.lines()
        t = Text()
        t.append(f.severity + ":", style=styles.get(f.severity, ""))
        t.append(" " + f.message)
        console.print(t)
        for ln in lines[1:]:
            if ln.startswith("  help:"):
                t = Text("  ")
                t.append("help:", style="bold green")
                t.append(ln[len("  help:"):])
                console.print(t)
            else:
                console.print(Text(ln))
        for ex in f.examples:
            console.print(Text("      " + ex, style="dim"))
    if report.fix is not None:
        fx = report.fix
        p = fx.proof
        console.print(Text(f"fix: {len(fx.replaced)} entries -> {len(fx.added)} `re:` "
                           f"expressions; wrote {fx.out} (original: {fx.orig}"
                           f"{', kept from before' if fx.orig_kept else ''})", style="bold"))
        if p is not None:
            t = Table("ignored set", "modules", title="proof (over "
                      f"{p.modules} module names)", title_justify="left")
            t.add_row("original, exact matching (intended)", str(p.intended))
            t.add_row("fixed, exact matching", str(p.exact))
            t.add_row("fixed, dotted-suffix matching", str(p.suffix))
            t.add_row("fixed, substring matching", str(p.substring))
            t.add_row("quantized modules hidden before -> after",
                      f"{p.hidden_before} -> {p.hidden_after}")
            console.print(t)
            console.print(Text("equal: yes" if p.equal else "equal: NO", style="green"
                               if p.equal else "red"))
        if fx.unignored:
            console.print(Text(f"note: {len(fx.unignored)} modules with plain weights (e.g. "
                               f"{fx.unignored[0]}) were ignored only through the replaced "
                               f"entries; the engine now applies the config groups' targets to "
                               f"them, as compressed-tensors did when it wrote the checkpoint",
                               style="yellow"))
        if fx.ignore_added:
            console.print(Text(f"added {len(fx.ignore_added)} fused layer names to ignore "
                               f"(e.g. {fx.ignore_added[0]})"))
        if fx.packed_added:
            console.print(Text("added packed_modules_mapping: " + json.dumps(
                {k: list(v) for k, v in fx.packed_added.items()})))
    if not report.findings:
        console.print(Text(f"ok: nothing in config.json that {engine_label(b)} would "
                           f"mishandle", style="green"))
    if report.in_image is not None:
        _in_image(report, console)


def _in_image(report: checkmodel.Report, console: Console) -> None:
    """What the image's own engine answered, and where it and the wheels' reading differ."""
    r = report.in_image or {}
    head = (f"in {report.image}: {r.get('engine')} {r.get('version') or '?'} on "
            f"{', '.join(r.get('archs') or [])}: {r.get('modules_checked', 0)} layers asked")
    if r.get("error"):
        console.print(Text(f"{head}; the engine failed: {r['error']}", style="bold red"),
                      soft_wrap=True)
    elif r.get("mismatches"):
        console.print(Text(f"{head}; {len(r['mismatches'])} did not get their declared scheme:",
                           style="bold red"), soft_wrap=True)
        for m in r["mismatches"][:10]:
            console.print(Text(f"  {m['module']} on {m['arch']}: declared {m['declared']}, got "
                               f"{m['got'] or 'no scheme'}"
                               + (f" ({m['error']})" if m.get("error") else "")), soft_wrap=True)
    else:
        console.print(Text(f"{head}; each got its declared scheme", style="green"),
                      soft_wrap=True)
    if report.disagreement:
        console.print(Text(f"disagree: {report.disagreement}", style="yellow"), soft_wrap=True)


# --- doctor ---

def _doctor_human(diags: Sequence[doctor.Diagnosis], console: Console, *,
                  source: str | None = None, engine: doctor.LogEngine | None = None) -> None:
    """Each diagnosis for people: cause, fix, evidence lines. Log text is never read as markup.
    On a terminal each is a panel; in a pipe or a file, plain lines that are never cut."""
    where = f" in {source}" if source else ""
    if engine is not None:
        where += f" ({engine.said})"
    if not any(d.id != doctor.OTHER_CAUSE for d in diags):
        for d in diags:  # a known sentence with another cause is said, but is no finding
            console.print(Text(f"{d.title}. {d.cause}", style="yellow"), soft_wrap=True)
        t = Text()
        t.append(doctor.NO_MATCH, style="bold")
        t.append(where + ".\n")
        t.append("imgbuild doctor only names failures it knows (images/checks/failures.yaml) "
                 "and does not guess; start from the last exception in the log.", style="dim")
        console.print(t)
        return
    n = sum(d.id != doctor.OTHER_CAUSE for d in diags)
    console.print(Text(f"{n} known failure{'s' if n != 1 else ''} found{where}", style="bold"),
                  soft_wrap=True)
    if not console.is_terminal:
        _doctor_plain(diags, console)
        return
    for d in diags:
        body = Text()
        body.append(d.title + "\n", style="bold")
        body.append("cause ", style="bold")
        body.append(d.cause + "\n")
        body.append("fix   ", style="bold cyan")
        body.append(d.fix + "\n")
        body.append("evidence", style="bold")
        for e in d.evidence:
            body.append(f"\n  line {e.line}", style="bold")
            body.append(_evidence_label(e), style="dim")
            body.append(": ")
            text = e.text.strip()
            body.append(text if len(text) <= 300 else text[:297] + "...")
        seen = []
        if d.occurrences > 1:
            seen.append(f"seen {d.occurrences} times")
        if d.ranks:
            seen.append("on " + doctor.ranks_text(d.ranks))
        if seen:
            body.append("\n" + ", ".join(seen), style="dim")
        style = "red" if d.severity == "error" else "yellow"
        title = Text()
        title.append(d.severity, style=f"bold {style}")
        title.append(f" {d.id}", style="bold")
        console.print(Panel(body, title=title, title_align="left", border_style=style))


def _evidence_label(e: doctor.Evidence) -> str:
    label = [x for x in (f"TP{e.rank}" if e.rank is not None else None,
                         e.role if e.role != "match" else None) if x]
    return f" ({', '.join(label)})" if label else ""


def _doctor_plain(diags: Sequence[doctor.Diagnosis], console: Console) -> None:
    """One field a line, whole: what `doctor LOG | less` and CI logs show."""
    for d in diags:
        lines = [f"{d.severity} {d.id}: {d.title}", f"  cause: {d.cause}", f"  fix:   {d.fix}",
                 "  evidence:"]
        lines += [f"    line {e.line}{_evidence_label(e)}: {e.text.strip()}" for e in d.evidence]
        seen = ([f"seen {d.occurrences} times"] if d.occurrences > 1 else []) + \
            (["on " + doctor.ranks_text(d.ranks)] if d.ranks else [])
        if seen:
            lines.append("  " + ", ".join(seen))
        for ln in lines:
            console.print(Text(ln), soft_wrap=True)
        console.print()


def doctor_report(out: Output, report: doctor.DoctorReport) -> None:
    if out.json:
        out.print_json(report.to_dict())
    else:
        _doctor_human(report.diagnoses, out.out, source=report.source, engine=report.engine)


# What each of EngineUse's decisions is called in the report, in its order.
HOST_DECISIONS = {"save": "push reads", "image_id": "image id", "cache": "build cache",
                  "source_date_epoch": "SOURCE_DATE_EPOCH", "rewrite_timestamp":
                  "rewrite-timestamp", "zstd": "pulls zstd", "publish": "publishes"}


def _store_words(f: EngineFacts) -> str:
    detail = ", ".join(x for x in (f.storage_driver, f.driver_type) if x)
    name = {"classic": "classic", "containerd": "containerd image store"}.get(f.store,
                                                                               "not known")
    return f"{name} ({detail})"


def doctor_host(out: Output, facts: EngineFacts, use: EngineUse) -> None:
    """The Engine and the client, then each decision with its reason; a refusal on stderr."""
    if out.json:
        out.print_json({"engine": facts.to_dict()} | use.to_dict())
        return
    f = facts
    kv(out.out, f"{f.product} {f.version} at {f.host}", [
        ("engine", f"{f.version} (API {f.api_version}), {f.platform}, {f.operating_system}"),
        ("store", _store_words(f)),
        ("builder", f.builder),
        ("client", f"{f.client_path} {f.client_version}")])
    out.out.print()
    table(out.out, "what imgbuild does with it", ["decision", "choice", "why"], [
        [HOST_DECISIONS.get(k, k), ("yes" if d.value else "no") if isinstance(d.value, bool)
         else str(d.value), d.why] for k, d in use.decisions().items()])
    if use.refusal is None:
        out.out.print("[green]ok[/]: imgbuild can build and publish with this Engine")
    else:
        out.error(use.refusal.error())


def check_model(out: Output, report: checkmodel.Report) -> None:
    if out.json:
        out.print_json(report.to_dict())
    else:
        _check_model_human(report, out.out)



PATCH_STYLE = {"applies": "green", "obsolete": "yellow", "fails": "bold red",
               "not-applicable": "dim", "unchecked": "cyan"}


def patches(out: Output, report: PatchReport) -> None:
    if out.json:
        out.print_json(report.to_dict())
        return
    c = out.out
    if not report.results:
        c.print(f"target '{report.target}' lists no patches")
        return
    t = Table(title=f"patches for {report.target}", title_justify="left")
    for col in ("patch", "package", "status", "variant", "detail"):
        t.add_column(col, overflow="fold")
    for r in report.results:
        pkg = f"{r.package} {r.version}" if r.version else r.package
        # A Text, not markup: a status without a style would make "[]x[/]", which rich
        # refuses (a closing tag with nothing open).
        t.add_row(r.id, pkg, Text(r.status, style=PATCH_STYLE.get(r.status, "")),
                  r.variant or "-", escape(r.detail))
    c.print(t)
    for r in report.results:
        if r.status in ("applies", "fails"):
            c.print(f"[bold]{r.id}[/]: {escape(r.fixes)} [dim]({escape(r.upstream)})[/]")

