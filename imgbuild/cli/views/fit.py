"""Which targets fit this host (plan/fit.py): one row a target, the chosen one first."""

from __future__ import annotations

from ...plan.fit import FitReport, TargetFit, describe_host
from ..console import Output
from . import table


def _verdict(report: FitReport, r: TargetFit) -> str:
    if not r.fits:
        return "no"
    word = "busy" if r.blocked else "yes"
    return f"{word} (chosen)" if r is report.chosen else word


def _why(report: FitReport, r: TargetFit) -> str:
    # A busy host's reason comes first: it is what stops the run; it is the host's, so it is
    # spelled out once, on the chosen row. Then the ranking facts for a fitting target (and
    # the memory verdict's numbers), the failed checks in short for the others.
    chosen = report.chosen
    if r.blocked and chosen is not None and r is not chosen and r.blocked == chosen.blocked:
        lines = ["busy: as above"]
    else:
        lines = [f"busy: {b}" for b in r.blocked]
    lines.append(r.summary)
    if r.fits:
        lines += [x.split("; weights only")[0] for x in r.reasons[1:]
                  if x.startswith(("model fits", "cpu: not checked"))]
    return "\n".join(lines)


def fit_table(out: Output, report: FitReport) -> None:
    """The targets judged for this host: target, fits (yes, busy, no; the chosen one says
    so) and why, the chosen first. --json: the report's document."""
    if out.json:
        out.print_json(report.to_dict())
        return
    counts: dict[str, int] = {}
    for r in report.rows:
        counts[r.name] = counts.get(r.name, 0) + 1
    rows = [[r.name + (f" ({r.platform})" if counts[r.name] > 1 else ""), _verdict(report, r),
             _why(report, r)] for r in report.rows]
    title = (f"targets for {report.model}" if report.model else "targets") + \
        f" on this host: {describe_host(report.host)}"
    table(out.out, title, ["target", "fits", "why"], rows)
