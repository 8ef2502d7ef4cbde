"""`imgbuild report --html DIR`: the compatibility page, one static index.html.

No external resource (CSS inline, no fonts, no images), no script needed to read the matrix
(a small inline one adds a filter), readable on a phone (the matrix scrolls sideways under a
sticky first column) and printable. Every string from the catalog, the locks or the registry
is escaped here and nowhere else; the same Report gives the same bytes.
"""

from __future__ import annotations

from html import escape
from pathlib import Path

from ...fsutil import atomic_write_text
from ...pipeline.report import (
    ABSENT,
    BUILT,
    CPU_ONLY,
    NO_RECORD,
    NONE,
    NOT_BUILT,
    NOT_KNOWN,
    PTX,
    REFUSED,
    SASS,
    SMOKE_CPU,
    SMOKE_FAILED,
    SMOKE_GPU,
    Cell,
    PlatformSection,
    Report,
    TargetSection,
    anchor,
)

# One CSS class per word; colours that survive greyscale printing by their text alone.
STATUS_CLASS = {SASS: "ok", PTX: "warn", NONE: "bad", REFUSED: "bad", NOT_BUILT: "off",
                CPU_ONLY: "off", NO_RECORD: "warn"}
IMAGE_CLASS = {SMOKE_GPU: "ok", SMOKE_CPU: "ok", SMOKE_FAILED: "bad", BUILT: "warn",
               ABSENT: "off", NOT_KNOWN: "off"}

CSS = """
:root{--fg:#1b1f24;--mute:#57606a;--line:#d0d7de;--bg:#fff;--ok:#dafbe1;--okb:#1a7f37;
--warn:#fff8c5;--warnb:#9a6700;--bad:#ffebe9;--badb:#cf222e;--off:#f6f8fa;--offb:#57606a}
*{box-sizing:border-box}
body{margin:0;font:15px/1.45 system-ui,-apple-system,"Segoe UI",Roboto,sans-serif;color:var(--fg);
background:var(--bg)}
main{max-width:1400px;margin:0 auto;padding:1rem;overflow-wrap:anywhere}
h1{font-size:1.5rem;margin:.2rem 0}h2{font-size:1.25rem;margin-top:2rem;
border-bottom:1px solid var(--line)}h3{font-size:1.05rem;margin:1.2rem 0 .4rem}
code,pre{font:13px/1.4 ui-monospace,SFMono-Regular,Menlo,Consolas,monospace}
pre{background:var(--off);padding:.5rem;overflow-x:auto;white-space:pre-wrap;word-break:break-all}
small,.mute{color:var(--mute)}
.matrix td small{display:block}
a{color:#0969da}
.scroll{overflow-x:auto;-webkit-overflow-scrolling:touch;border:1px solid var(--line)}
table{border-collapse:collapse;width:100%}
th,td{border:1px solid var(--line);padding:.3rem .4rem;vertical-align:top;text-align:left}
.matrix th,.matrix td{font-size:12px;min-width:4.6rem;overflow-wrap:normal}
.matrix td a{display:block;text-decoration:none;color:inherit}
.matrix thead th{background:var(--off);position:sticky;top:0}
.matrix tbody th{position:sticky;left:0;background:var(--bg);min-width:9rem;z-index:1}
.w{font-weight:600;display:block}
.ok{background:var(--ok)}.ok .w{color:var(--okb)}
.warn{background:var(--warn)}.warn .w{color:var(--warnb)}
.bad{background:var(--bad)}.bad .w{color:var(--badb)}
.off{background:var(--off)}.off .w{color:var(--offb)}
.legend span{display:inline-block;padding:0 .4rem;margin:.1rem;border:1px solid var(--line)}
dl.kv{display:grid;grid-template-columns:max-content 1fr;gap:.15rem .8rem;margin:.3rem 0}
dl.kv dt{color:var(--mute)}dl.kv dd{margin:0;overflow-wrap:anywhere}
.bars{display:grid;grid-template-columns:minmax(6rem,18rem) minmax(0,1fr) max-content;gap:.15rem .5rem;
align-items:center;font-size:12px}
.bar{height:.9rem;background:#0969da;min-width:1px}
.target{border-top:3px solid var(--line);margin-top:2rem}
.cells td{font-size:13px}
@media (max-width:700px){body{font-size:14px}main{padding:.5rem}
dl.kv{grid-template-columns:1fr}dl.kv dt{margin-top:.3rem}
.matrix tbody th{min-width:6.5rem}
.bars{grid-template-columns:minmax(0,1fr) max-content}.bars .step{grid-column:1/-1}}
@media print{nav,#filter{display:none}main{max-width:none;padding:0}
.scroll{overflow:visible;border:0}.matrix th,.matrix td{font-size:9px;min-width:0}
.matrix thead th,.matrix tbody th{position:static}.target{break-before:page}
a{color:inherit;text-decoration:none}
.ok,.warn,.bad,.off,.bar{-webkit-print-color-adjust:exact;print-color-adjust:exact}}
"""

# Optional: hides matrix rows whose target does not contain the text typed. Without it the
# page is whole; the box is made by the script, so a reader without scripts sees no dead box.
SCRIPT = """
(function(){var m=document.getElementById('matrix-table');if(!m)return;
var i=document.createElement('input');i.id='filter';i.type='search';
i.placeholder='filter targets (name, engine)';i.setAttribute('aria-label','filter targets');
m.parentNode.parentNode.insertBefore(i,m.parentNode);
i.addEventListener('input',function(){var q=i.value.toLowerCase();
m.querySelectorAll('tbody tr').forEach(function(r){
r.style.display=r.getAttribute('data-key').indexOf(q)<0?'none':'';});});})();
"""


def e(text: object) -> str:
    return escape(str(text), quote=True)


def human(n: int) -> str:
    """Bytes as the page shows them (decimal units, as registries and `docker images` do)."""
    for unit, size in (("GB", 10**9), ("MB", 10**6), ("kB", 10**3)):
        if n >= size:
            return f"{n / size:.2f} {unit}"
    return f"{n} B"


def render(report: Report) -> str:
    out: list[str] = [
        "<!doctype html>", '<html lang="en">', "<head>", '<meta charset="utf-8">',
        '<meta name="viewport" content="width=device-width, initial-scale=1">',
        "<title>imgbuild: which image runs on which GPU</title>",
        f"<style>{CSS}</style>", "</head>", "<body>", "<main>",
        "<h1>Which image runs on which GPU</h1>",
        "<p>Made by <code>imgbuild report</code> from the catalog's targets, their committed "
        "locks and kernel records, the GPU table (images/gpus.yaml) and the doctor's failure "
        "catalog" + (f", and what <code>{e(report.registry)}</code> holds (content tags, "
                     "layers, stored smoke reports)" if report.registry else
                     "; no registry was given, so whether an image was built or smoke-tested "
                     "is not known") + ". Each cell links to its evidence.</p>",
        _nav(report), _matrix(report), _legend()]
    for t in report.targets:
        out.append(_target(report, t))
    out.append(_failure_catalog(report))
    out += ["</main>", f"<script>{SCRIPT}</script>", "</body>", "</html>", ""]
    return "\n".join(out)


def write(report: Report, directory: str | Path) -> Path:
    d = Path(directory)
    d.mkdir(parents=True, exist_ok=True)
    path = d / "index.html"
    atomic_write_text(path, render(report))
    return path


def _nav(report: Report) -> str:
    items = "".join(f'<li><a href="#{anchor("t", t.name)}">{e(t.name)}</a> '
                    f"<small>{e(t.engine)} {e(t.engine_version)}</small></li>"
                    for t in report.targets)
    return f'<nav><h2>Targets</h2><ul>{items}</ul></nav>'


def _matrix(report: Report) -> str:
    archs: list[tuple[str, str, int]] = []  # (sm, generation, columns)
    for g in report.gpus:
        if archs and archs[-1][0] == g.sm:
            archs[-1] = (g.sm, archs[-1][1], archs[-1][2] + 1)
        else:
            archs.append((g.sm, g.generation, 1))
    head1 = "".join(f'<th colspan="{n}" scope="colgroup">{e(sm)}<br><small>{e(gen)}</small>'
                    "</th>" for sm, gen, n in archs)
    head2 = "".join(f'<th scope="col" title="{e(", ".join(g.names))}">{e(g.key)}<br>'
                    f"<small>{g.memory_gb:g} GB, {e(g.cpu_arch)}</small></th>"
                    for g in report.gpus)
    rows = []
    for t in report.targets:
        cells = "".join(_matrix_cell(report.cell(t.name, g.key)) for g in report.gpus)
        key = f"{t.name} {t.engine} {t.engine_version}".lower()
        rows.append(f'<tr data-key="{e(key)}"><th scope="row"><a href="#{anchor("t", t.name)}">'
                    f"{e(t.name)}</a><br><small>{e(t.engine)} {e(t.engine_version)}</small>"
                    f"</th>{cells}</tr>")
    return ('<section id="matrix"><h2>Targets × GPUs</h2>'
            '<div class="scroll"><table class="matrix" id="matrix-table">'
            f'<thead><tr><th rowspan="2" scope="col">target</th>{head1}</tr>'
            f"<tr>{head2}</tr></thead><tbody>{''.join(rows)}</tbody></table></div></section>")


def _matrix_cell(c: Cell) -> str:
    cls = STATUS_CLASS.get(c.status, "off")
    if c.status in (SASS, PTX, NO_RECORD, CPU_ONLY) and c.image in (SMOKE_FAILED,):
        cls = "bad"
    image = f"<small>{e(c.image)}</small>" if c.image else ""
    fit = ""
    if c.model_fit and " does not fit " in c.model_fit:
        fit = "<small>model does not fit</small>"
    title = c.reason + (f" | image: {c.image_reason}" if c.image_reason else "") + (
        f" | {c.model_fit}" if c.model_fit else "")
    return (f'<td class="{cls}" title="{e(title)}"><a href="#{anchor("c", c.target, c.gpu)}">'
            f'<span class="w">{e(c.status)}</span>{image}{fit}</a></td>')


def _legend() -> str:
    words = [
        (SASS, "ok", "every required kernel package carries SASS for the GPU's arch (or an "
         "earlier minor of its major)"),
        (PTX, "warn", "a required package carries only PTX: the driver compiles it at first "
         "launch"),
        (NO_RECORD, "warn", "no kernel rules for this engine: coverage not judged"),
        (REFUSED, "bad", "the plan refuses this GPU (the reason says why: no code for the arch, "
         "another CPU, CUDA)"),
        (NOT_BUILT, "off", "not one of the target's archs; the plan would take it with --arch"),
        (CPU_ONLY, "off", "a CPU image: runs, the GPU stays idle"),
        (SMOKE_GPU, "ok", "the stored smoke report's GPU stage passed on this arch"),
        (SMOKE_CPU, "ok", "the stored smoke report passed; its GPU stage did not run on this "
         "arch"),
        (SMOKE_FAILED, "bad", "the stored smoke report failed"),
        (BUILT, "warn", "the content tag is in the registry, with no smoke report"),
        (ABSENT, "off", "the content tag is not in the registry"),
        (NOT_KNOWN, "off", "no registry given"),
    ]
    items = "".join(f'<span class="{cls}"><b>{e(w)}</b>: {e(text)}</span> '
                    for w, cls, text in words)
    return f'<p class="legend">{items}</p>'


def _target(report: Report, t: TargetSection) -> str:
    tid = anchor("t", t.name)
    out = [f'<section class="target" id="{tid}"><h2>{e(t.name)}</h2>',
           f"<p>{e(t.description)}</p>",
           f'<dl class="kv"><dt>engine</dt><dd>{e(t.engine)} {e(t.engine_version)}</dd>',
           f"<dt>platforms</dt><dd>{e(', '.join(p.platform for p in t.platforms))}</dd></dl>"]
    if t.error:
        out.append(f'<p class="bad">does not plan: {e(t.error)}</p>')
    out.append(_cells_table(report, t))
    for p in t.platforms:
        out.append(_platform(t, p))
    out.append(_overrides(t))
    out.append(_models(t))
    out.append(_failures(t))
    out.append("</section>")
    return "\n".join(out)


def _cells_table(report: Report, t: TargetSection) -> str:
    rows = []
    for g in report.gpus:
        c = report.cell(t.name, g.key)
        ev = " ".join(f'<a href="#{a}">{e(_evidence_label(a))}</a>' for a in c.evidence)
        image = (f'<span class="w">{e(c.image)}</span>{e(c.image_reason)}' if c.image else "")
        rows.append(
            f'<tr id="{anchor("c", t.name, g.key)}"><th scope="row">{e(g.key)}<br>'
            f"<small>{e(g.sm)}, {e(g.cpu_arch)}</small></th>"
            f'<td class="{STATUS_CLASS.get(c.status, "off")}"><span class="w">{e(c.status)}'
            f"</span>{e(c.reason)}</td>"
            f'<td class="{IMAGE_CLASS.get(c.image, "off") if c.image else ""}">{image}</td>'
            f"<td>{e(c.model_fit or '')}</td><td>{ev}</td></tr>")
    return ('<h3>On each GPU</h3><div class="scroll"><table class="cells"><thead><tr>'
            "<th>GPU</th><th>kernels / plan</th><th>image</th><th>model</th><th>evidence</th>"
            f"</tr></thead><tbody>{''.join(rows)}</tbody></table></div>")


def _evidence_label(a: str) -> str:
    if "-kernels-" in a:
        return "kernels " + a.rsplit("-kernels-", 1)[1]
    return next((w for w in ("registry", "lock") if a.endswith(f"-{w}")), "plan")


def _platform(t: TargetSection, p: PlatformSection) -> str:
    pid = anchor("t", t.name, p.platform)
    out = [f'<h3 id="{pid}">{e(p.platform)}</h3>']
    if p.error:
        out.append(f'<p class="bad">refused by the plan: {e(p.error)}</p>')
        return "\n".join(out)
    kv = [("content tag", f"<code>{e(p.content_tag)}</code>"),
          ("content key", f"<code>{e(p.content_key)}</code>"),
          ("archs", e(", ".join(p.archs))), ("flavor", e(p.flavor)),
          ("CUDA", e(p.cuda or "none (CPU image)")),
          ("driver floor", e(f">= {p.min_driver}" if p.min_driver else "none (CPU image)")),
          ("base", f"<code>{e(p.base_image)}</code>"), ("python", e(p.python)),
          ("heavy layer", e(", ".join(p.heavy) or "none"))]
    out.append(f'<dl class="kv" id="{anchor("t", t.name, p.platform, "plan")}">'
               + "".join(f"<dt>{k}</dt><dd>{v}</dd>" for k, v in kv) + "</dl>")
    if p.selection:
        out.append("<p>why this CUDA and base:</p><pre>" + e("\n".join(p.selection))
                   + "</pre>")
    lock_lines = "".join(f"<li><code>{e(line)}</code></li>" for _, line in p.kernel_lock_lines)
    out.append(f'<div id="{anchor("t", t.name, p.platform, "lock")}"><b>lock</b>: '
               f"<code>{e(p.lock_path)}</code> <small>({p.lock_packages} packages, "
               f"{e(p.lock_hash)})</small>"
               + (f"<ul>{lock_lines}</ul>" if lock_lines else "") + "</div>")
    if p.kernel_coverage:
        out.append(_coverage(t, p))
    out.append(_published(t, p))
    return "\n".join(out)


def _coverage(t: TargetSection, p: PlatformSection) -> str:
    archs = [a for a, _ in p.kernel_coverage]
    by = {a: dict(rows) for a, rows in p.kernel_coverage}
    packages = sorted({pkg for rows in by.values() for pkg in rows})
    head = "".join(f'<th id="{anchor("t", t.name, p.platform, "kernels", a)}">{e(a)}</th>'
                   for a in archs)
    body = "".join(
        f"<tr><th>{e(pkg)}</th>" + "".join(
            f'<td class="{_kclass(by[a].get(pkg, "-"))}">{e(_kword(by[a].get(pkg, "-")))}</td>'
            for a in archs) + "</tr>" for pkg in packages)
    return (f"<p><b>kernel record</b>: <code>{e(p.kernel_record or '')}</code> (the GPU code "
            "each locked wheel carries, read from its .nv_fatbin)</p>"
            f'<div class="scroll"><table><thead><tr><th>package</th>{head}</tr></thead>'
            f"<tbody>{body}</tbody></table></div>")


def _kword(status: str) -> str:
    return {"sass": "SASS", "ptx": "PTX (JIT by the driver)", "jit": "JIT at first use",
            "none": "nothing", "-": "not needed"}.get(status, status)


def _kclass(status: str) -> str:
    return {"sass": "ok", "ptx": "warn", "jit": "off", "none": "bad"}.get(status, "off")


def _published(t: TargetSection, p: PlatformSection) -> str:
    rid = anchor("t", t.name, p.platform, "registry")
    lines = [f"<pre>{e(p.pull)}" + (f"\n{e(p.docker_pull)}" if p.docker_pull else "") + "</pre>"]
    pub = p.published
    if pub is None:
        lines.append("<p>registry: not known (no registry given)</p>")
        return f'<div id="{rid}"><b>pull</b>' + "".join(lines) + "</div>"
    if pub.digest is None:
        lines.append(f"<p><code>{e(pub.ref)}</code> is not in <code>{e(pub.repository)}</code>"
                     "</p>")
        return f'<div id="{rid}"><b>pull</b>' + "".join(lines) + "</div>"
    lines.append(f'<dl class="kv"><dt>image</dt><dd><code>{e(pub.ref)}</code></dd>'
                 f"<dt>digest</dt><dd><code>{e(pub.digest)}</code></dd>"
                 f"<dt>compressed size</dt><dd>{e(human(pub.total_bytes))} in "
                 f"{len(pub.layers)} layers</dd></dl>")
    if pub.layers:
        top = max(x.size for x in pub.layers) or 1
        bars = "".join(
            '<span class="step" title="'
            + (f"{e(x.step)} ({e(x.digest)})" if x.step else e(x.digest)) + '"><code>'
            f"{e(_cut(x.step or x.digest))}"
            f'</code></span><span class="bar" style="width:{100 * x.size / top:.1f}%"></span>'
            f"<span>{e(human(x.size))}</span>" for x in pub.layers)
        lines.append(f'<p>where the bytes are (each layer, compressed, as the manifest says; '
                     f'the step from the image config\'s history):</p><div class="bars">{bars}'
                     "</div>")
    if pub.signature is not None:
        lines.append(f"<p><b>signature</b>: {e(pub.signature)}</p>")
    sm = pub.smoke
    if sm is None:
        lines.append("<p>smoke report: none stored for this digest</p>")
    else:
        stages = "".join(f'<tr><th>{e(n)}</th><td class="{_sclass(s)}">{e(s)}</td>'
                         f"<td>{e(r)}</td></tr>" for n, s, r in sm.stages)
        lines.append(
            f'<p id="{anchor("t", t.name, p.platform, "smoke")}"><b>smoke report</b> '
            f"<code>{e(pub.smoke_tag or '')}</code>: {'passed' if sm.ok else 'failed'}"
            + (f", GPU stage on {e(sm.gpu)}" if sm.gpu else ", on CPU (no GPU stage ran)")
            + (f", {e(sm.when)}" if sm.when else ", time not recorded in the report")
            + (" <b>(forced)</b>" if sm.forced else "") + "</p>"
            f'<div class="scroll"><table><tbody>{stages}</tbody></table></div>')
    return f'<div id="{rid}"><b>pull</b>' + "".join(lines) + "</div>"


def _cut(s: str, n: int = 96) -> str:
    """Cut in the middle: a step's command and its end (the file it installs) both show."""
    return s if len(s) <= n else s[:n // 2] + "…" + s[-(n // 2 - 1):]


def _sclass(status: str) -> str:
    return {"pass": "ok", "fail": "bad"}.get(status, "off")


def _overrides(t: TargetSection) -> str:
    out = ["<h3>Overrides and patches</h3>"]
    if t.overrides:
        out.append("<ul>" + "".join(
            f"<li><code>{e(req)}</code>: {e(why)}"
            + (f' (<a href="{e(link)}">{e(link)}</a>)' if link.startswith("https://") else "")
            + "</li>" for req, why, link in t.overrides) + "</ul>")
    else:
        out.append("<p>no overrides</p>")
    if t.patches:
        out.append("<ul>" + "".join(
            f"<li><code>{e(pid)}</code> for {e(pkg)}: {e(fixes)}"
            + (f" <small>upstream: {e(up)}</small>" if up else "") + "</li>"
            for pid, pkg, fixes, up in t.patches) + "</ul>")
    else:
        out.append("<p>no patches</p>")
    return "\n".join(out)


def _models(t: TargetSection) -> str:
    rows = "".join(f"<tr><td>{e(m.role)}</td><th>{e(m.alias)}</th><td>{e(m.name)}<br><small>"
                   f"{e(m.checkpoint)}</small></td><td>{m.size_gb:g} GB</td>"
                   f"<td>{m.tensor_parallel}</td><td>{e(m.quantization)}</td></tr>"
                   for m in t.models)
    return ("<h3>Model profiles</h3><div class=\"scroll\"><table><thead><tr><th>role</th>"
            "<th>profile</th><th>model</th><th>size</th><th>TP</th><th>quantization</th></tr>"
            f"</thead><tbody>{rows}</tbody></table></div>")


def _failures(t: TargetSection) -> str:
    if not t.failures:
        return "<h3>Known failures</h3><p>none in the doctor's catalog for this lock</p>"
    items = "".join(f'<li><a href="#{anchor("failure", f.id)}">{e(f.id)}</a> '
                    f"<small>({e(f.severity)}; {e(f.why)})</small>: {e(f.title)}</li>"
                    for f in t.failures)
    return ("<h3>Known failures</h3><p>what <code>imgbuild doctor</code> recognises in this "
            f"engine's logs, for the locked versions (cause and fix below):</p><ul>{items}</ul>")


def _failure_catalog(report: Report) -> str:
    """Each failure once, with its cause and fix, and the targets it holds for."""
    seen: dict[str, tuple] = {}
    for t in report.targets:
        for f in t.failures:
            seen.setdefault(f.id, (f, []))[1].append(t.name)
    if not seen:
        return ""
    items = "".join(
        f'<div id="{anchor("failure", fid)}"><h3>{e(fid)} <small>({e(f.severity)})</small>'
        f"</h3><p>{e(f.title)}</p><ul><li><b>cause</b>: {e(f.cause)}</li><li><b>fix</b>: "
        f"{e(f.fix)}</li><li><b>targets</b>: {e(', '.join(names))}</li></ul></div>"
        for fid, (f, names) in sorted(seen.items()))
    return ('<section class="target" id="failures"><h2>Known failures and their fixes</h2>'
            "<p>From the doctor's catalog (images/checks/failures.yaml); "
            "<code>imgbuild doctor LOGFILE</code> matches a server log against them.</p>"
            f"{items}</section>")
