"""build, pull, smoke, preflight and base-image reports."""

from __future__ import annotations

from typing import TYPE_CHECKING

from rich.markup import escape
from rich.table import Table

from ...image.indexsign import verified
from ...image.smoke import SmokeReport
from ...payload.preflight import FAIL, PASS, SKIP, WARN, Report
from ...pipeline.build import MultiOutcome, Outcome, said_by
from ...pipeline.index import Assembled
from ...progress import human_bytes
from ..console import Output
from . import kv, table

if TYPE_CHECKING:  # named in annotations only: the build's view loads no base-image, pull,
    # preflight or size stage (and so no Docker SDK: tests/test_layering.py)
    from ...image.base import BaseResult
    from ...image.sizes import SizeReport
    from ...pipeline.preflight import Preflight
    from ...pipeline.pull import PullOutcome


def build(out: Output, o: Outcome, *, title: str | None = None) -> None:
    """What a build did. title: the heading (a platform's image of an index names its
    platform)."""
    if out.json:
        out.print_json(o.to_dict())
        return
    b, g, p = o.built, o.gate, o.published
    rows = [("action", b.action), ("image", b.image_id[:19]),
            ("size", f"{b.size_bytes / 1e6:.0f} MB"), ("time", f"{o.seconds:.1f} s")]
    if b.build:
        rows.append(("build", f"{b.build.seconds:.1f} s, {b.build.steps} steps, "
                              f"{b.build.cached_steps} cached"))
    if g.report:
        rows.append(("smoke", ("passed" if g.report.ok else "FAILED") + (
            f" (not run again: the report from the {g.report.reused}; --resmoke runs it)"
            if g.report.reused else "") + "; " + ", ".join(
            f"{s['name']} {s['status']} {s.get('duration_s', 0):.1f}s"
            for s in g.report.stages)))
    rows.append(("tags", "\n".join([o.plan.ref()] + list(p.moved))))
    if g.held and o.plan.tags:
        # A platform's image of an index has no moving tags of its own: nothing stays put.
        rows.append(("not moved", f"{', '.join(o.plan.tags)}: {g.held}"))
    if p.report_ref:
        rows.append(("smoke report", p.report_ref))
    if p.pushed:
        rows.append(("pushed", "\n".join(p.pushed)))
    if p.signed_by:
        rows.append(("signed", said_by(p.signed_by) + "".join(f"\n{t}" for t in p.signed)))
    if p.compression:
        rows.append(("layers", f"{p.compression}: {human_bytes(p.sent_bytes)} sent, "
                               f"{p.reused_layers} already in the registry"
                               + (f" ({p.mounted_layers} mounted from another repository)"
                                  if p.mounted_layers else "")))
    kv(out.out, title or f"{o.plan.target}: {b.action}", rows)


def build_index(out: Output, o: MultiOutcome) -> None:
    if out.json:
        out.print_json(o.to_dict())
        return
    for one in o.outcomes:
        build(out, one, title=f"{one.plan.target} {one.plan.platform}: {one.action}")
    rows = [("platforms", "\n".join(f"{p.platform}: {p.ref()}" for p in o.index.plans)),
            ("time", f"{o.seconds:.1f} s")]
    if o.moved:
        rows.append(("tags here", "\n".join(o.moved) + "\n(onto this host's platform image)"))
    if o.assembled is not None:
        rows.append(("pushed", "\n".join(o.assembled.pushed)))
        if o.assembled.signed:
            rows.append(("signed", "\n".join(o.assembled.signed)))
    if o.held:
        rows.append(("not assembled", o.held))
    kv(out.out, f"{o.index.target}: index {o.index.content_tag}", rows)


def indexes(out: Output, done: list[Assembled]) -> None:
    if out.json:
        out.print_json({"indexes": [a.to_dict() for a in done]})
        return
    for a in done:
        kv(out.out, f"{a.plan.target}: index assembled", [
            ("manifests", "\n".join(f"{p}: {d}" for p, d in a.manifests)),
            ("pushed", "\n".join(a.pushed))]
            + ([("signed", said_by(a.signed_by) + "".join(f"\n{t}" for t in a.signed))]
               if a.signed_by else []))


def pull(out: Output, o: PullOutcome) -> None:
    if out.json:
        out.print_json(o.to_dict())
        return
    rep = o.report
    smoke_row = ("no smoke report stored for this digest: moving tags not set" if rep is None
                 else ("passed" if rep.get("ok") else "FAILED (tags moved with --force)"
                       if rep.get("forced") else "FAILED") + "; " + ", ".join(
                           f"{s_['name']} {s_['status']}" for s_ in rep.get("stages", [])))
    rows = [("platform", f"{o.platform} ({o.platform_why})"), ("image", o.ref),
            ("digest", o.digest)]
    if o.index_digest:
        rows.append(("from index", o.index_digest))
    rows.append(("smoke", smoke_row))
    if o.verified is not None:
        rows.append(("verified", "\n".join(f"{'ok' if ok else 'NO'}  {c}: {d}"
                                           for c, ok, d in o.verified.checks)))
    kv(out.out, f"pulled {o.plan.target}", rows + [("tags", "\n".join((o.ref, *o.moving)))])


def smoke(out: Output, image: str, rep: SmokeReport) -> None:
    if out.json:
        out.print_json(rep.to_dict() | {"ok": rep.ok})
        return
    table(out.out, f"smoke {image}: {'passed' if rep.ok else 'FAILED'}",
          ["stage", "status", "seconds", "reason"],
          [[s["name"], s["status"], f"{s.get('duration_s', 0):.2f}", s.get("reason") or ""]
           for s in rep.stages])


def _gb(n: int) -> str:
    return f"{n / 1e9:.2f} GB" if n >= 1e8 else f"{n / 1e6:.1f} MB"


def size(out: Output, rep: SizeReport, *, top: int = 15) -> None:
    if out.json:
        out.print_json(rep.to_dict())
        return
    c = out.out
    c.print(f"{escape(rep.image)}: {_gb(rep.total)} in {rep.files:,} files")
    table(c, "layers (largest first)", ["size", "created by"],
          [[_gb(s), escape(cmd.replace("/bin/sh -c ", "")[:90])]
           for cmd, s in sorted(rep.layers, key=lambda x: -x[1]) if s][:8])
    table(c, "by kind", ["kind", "size", "share"],
          [[k, _gb(v), f"{100 * v / max(rep.total, 1):.1f}%"] for k, v in rep.by_kind])
    table(c, f"by package (top {top})", ["package", "size", "of which"],
          [[escape(o), _gb(v), ", ".join(f"{k} {_gb(b)}" for k, b in sorted(
              rep.by_owner_kind.get(o, {}).items(), key=lambda kv: -kv[1])[:3])]
           for o, v in rep.by_owner[:top]])
    if rep.duplicates:
        table(c, "the same bytes more than once (1 MiB or more)", ["size", "copies", "paths"],
              [[_gb(d["size"]), str(len(d["paths"])), escape("\n".join(d["paths"]))]
               for d in rep.duplicates[:top]])
    dead = rep.dead_weight
    c.print("dead weight: " + ", ".join(f"{k} {_gb(v)}" for k, v in dead.items())
            + f" (total {_gb(sum(dead.values()))}, {100 * sum(dead.values()) / max(rep.total, 1):.1f}%)")


PREFLIGHT_STYLE = {PASS: "bold green", FAIL: "bold red", WARN: "bold yellow", SKIP: "dim"}


def preflight(out: Output, result: Preflight) -> None:
    report: Report = result.report
    if out.json:
        out.print_json(report.to_dict())
        return
    c = out.out
    t = Table(title=f"preflight: this host for {result.subject}", title_justify="left")
    t.add_column("check", no_wrap=True)
    t.add_column("verdict", no_wrap=True)
    t.add_column("detail", overflow="fold")
    for v in report.verdicts:
        t.add_row(v.check, f"[{PREFLIGHT_STYLE.get(v.status, '')}]{v.status}[/]", escape(v.detail))
    c.print(t)
    if report.ok:
        c.print("[green]preflight ok[/]: no check failed")
    else:
        failed = ", ".join(v.check for v in report.verdicts if v.status == FAIL)
        c.print(f"[bold red]preflight failed[/] ({failed}): the server would not start here")



def base(out: Output, key: str, res: BaseResult) -> None:
    doc = {"image": res.image, "image_id": res.image_id, "built": res.built,
           "seconds": round(res.seconds, 1), "size_bytes": res.size_bytes,
           "rootfs": res.rootfs, "pushed": list(res.pushed)}
    if out.json:
        out.print_json(doc)
    else:
        kv(out.out, f"base {key}", [(k, str(v)) for k, v in doc.items()])


def digests(out: Output, found: dict[str, str | None]) -> None:
    if out.json:
        out.print_json({"digests": found})
    else:
        table(out.out, "nvidia/cuda digests (images/bases.yaml)", ["image", "digest"],
              [[k, v or "tag not found"] for k, v in found.items()])



def smoke_model(out: Output, doc: dict) -> None:
    if out.json:
        out.print_json(doc)
    else:
        kv(out.out, f"smoke model {doc['model']}",
           [("path", doc["path"]), ("key", doc["key"] or ""),
            ("files", f"{doc['files']} ({doc['bytes'] / 1e6:.2f} MB)"),
            ("made with", ", ".join(f"{k} {v}" for k, v in (doc["versions"] or {}).items())),
            ("pushed", doc["pushed"] or "no")])


def index_verification(out: Output, ref: str, digest: str, found: dict,
                       own: list | None = None) -> None:
    """found: platform → image.attest.Verification of the manifest the index lists for it;
    own: the index's own checks (its signature and attestations; [] with no policy)."""
    own = list(own or [])
    ok = verified(own, [v.ok for v in found.values()])
    if out.json:
        out.print_json({"ref": ref, "index_digest": digest, "ok": ok,
                        "checks": [{"check": c, "ok": o, "detail": d} for c, o, d in own],
                        "platforms": {p: v.to_dict() for p, v in found.items()}})
        return
    out.out.print(f"{escape(ref)} is an index ({digest}) of {', '.join(found) or 'nothing'}")
    if own:
        table(out.out, f"the index itself: {'ok' if all(o for _, o, _ in own) else 'FAILED'}",
              ["check", "result", "detail"],
              [[c, "ok" if o else "FAILED", d] for c, o, d in own])
    for p, v in found.items():
        table(out.out, f"{p}: {'ok' if v.ok else 'FAILED'} ({v.digest})",
              ["check", "result", "detail"],
              [[c, "ok" if ok else "FAILED", d] for c, ok, d in v.checks])


def signature_policy(out: Output, policy, repository: str, found,
                     index_digest: str | None = None) -> None:
    """Under verify's table: which signature policy applied, and cosign's own check of the
    same (the index's digest for an index, else the first image's)."""
    if out.json:
        return
    if policy is None:
        out.out.print(f"signatures: not checked (no signed-by policy for {repository} in "
                      "images/registries.yaml; `--key PUB` checks one)", markup=False,
                      highlight=False)
        return
    # imported on use: the crypto, for a policy only
    from ...image.cosign import cosign_commands, key_path
    from ...image.registry import Repository

    digest = index_digest or next((v.digest for v in found), None)
    if digest is not None:
        out.out.print("cosign checks the same: " + cosign_commands(
            policy, key_path(policy), f"{repository}@{digest}",
            plain_http=Repository.parse(repository).plain_http)[0], markup=False,
            highlight=False)


def verification(out: Output, v) -> None:
    """v: image.attest.Verification."""
    if out.json:
        out.print_json(v.to_dict())
        return
    table(out.out, f"verify {v.ref}: {'ok' if v.ok else 'FAILED'} ({v.digest})",
          ["check", "result", "detail"],
          [[c, "ok" if ok else "FAILED", d] for c, ok, d in v.checks])
