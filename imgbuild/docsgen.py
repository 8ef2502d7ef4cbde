"""The documentation's generated pages: the command line, the catalog's keys, the doctor's known
failures, the exit codes and the performance plots, each made from the code or data it
describes when the site is built (docs/hooks.py), so that the pages cannot drift from it.

Pure functions of the checkout: no network, no Docker. tests/test_docs.py calls them without
MkDocs and compares what they write with the parser and the catalog's readers.
"""

from __future__ import annotations

import argparse
import io
import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from . import errors
from .catalog import models, patches, prune, registries, targets
from .cli.parser import parser

KEYS_FILE = Path(__file__).with_name("catalog") / "keys.yaml"
# The tables under images/ that are not targets (each has its own reader).
NOT_TARGETS = {"bases.yaml", "cuda.yaml", "gpus.yaml", "prune.yaml", "registries.yaml"}


class DocsError(Exception):
    """The code and its description disagree: a key or a page is missing."""


# --- the command line -----------------------------------------------------------------------

@dataclass(frozen=True)
class Command:
    name: str  # "plan", "base bootstrap"
    parser: argparse.ArgumentParser
    help: str

    @property
    def anchor(self) -> str:
        return self.name.replace(" ", "-")


def commands(p: argparse.ArgumentParser | None = None) -> list[Command]:
    """Every command and subcommand of the parser, in the order it defines them."""
    if p is None:
        p = parser()
    out: list[Command] = []

    def walk(ap: argparse.ArgumentParser, prefix: str) -> None:
        for action in ap._actions:
            if not isinstance(action, argparse._SubParsersAction):
                continue
            helps = {a.dest: a.help or "" for a in action._choices_actions}
            for name, sub in action.choices.items():
                full = f"{prefix} {name}".strip()
                out.append(Command(full, sub, helps.get(name, "")))
                walk(sub, full)

    walk(p, "")
    return out


def options(ap: argparse.ArgumentParser) -> list[argparse.Action]:
    """A parser's own arguments and options, without --help and subcommand groups."""
    return [a for a in ap._actions if not isinstance(a, (argparse._HelpAction,
                                                         argparse._SubParsersAction))]


def _sig(a: argparse.Action) -> tuple:
    return (tuple(a.option_strings), a.dest, a.help)


def common_options(cmds: list[Command]) -> list[argparse.Action]:
    """The options every command takes (the same flags, the same words)."""
    if not cmds:
        return []
    shared = {_sig(a) for a in options(cmds[0].parser) if a.option_strings}
    for c in cmds[1:]:
        shared &= {_sig(a) for a in options(c.parser)}
    return [a for a in options(cmds[0].parser) if _sig(a) in shared]


def _cell(text: Any) -> str:
    return " ".join(str(text).split()).replace("|", "\\|")


def _arg_name(a: argparse.Action) -> str:
    if a.option_strings:
        names = ", ".join(f"`{o}`" for o in a.option_strings)
        if a.nargs == 0:
            return names
        if isinstance(a.metavar, tuple):
            meta = " ".join(a.metavar)
        else:
            meta = a.metavar or (("{" + ",".join(a.choices) + "}") if a.choices else
                                 a.dest.upper())
        return f"{names} `{meta}`"
    meta = a.metavar or a.dest
    return f"`{meta}`" + (" …" if a.nargs in ("*", "+") else "")


def _arg_default(a: argparse.Action) -> str:
    if a.nargs == 0 or a.default in (None, [], argparse.SUPPRESS):
        return ""
    return f"`{a.default}`"


def _arg_row(a: argparse.Action) -> str:
    what = a.help or ""
    if a.choices and a.option_strings:
        what += (" " if what else "") + "One of " + ", ".join(f"`{c}`" for c in a.choices) + "."
    if a.required and a.option_strings:
        what = "Required. " + what
    if isinstance(a, argparse._AppendAction):
        what += " Repeatable."
    return f"| {_cell(_arg_name(a))} | {_cell(_arg_default(a))} | {_cell(what)} |"


# The usage lines' width: argparse folds them at the terminal's (COLUMNS), which would make
# the page depend on the window of whoever built the site.
USAGE_WIDTH = 96


def usage(p: argparse.ArgumentParser) -> str:
    """The parser's usage as `--help` prints it, folded at USAGE_WIDTH on any terminal."""
    f = p.formatter_class(prog=p.prog, width=USAGE_WIDTH)
    f.add_usage(p.usage, p._actions, p._mutually_exclusive_groups)
    return f.format_help().strip()


def cli_reference(p: argparse.ArgumentParser | None = None) -> str:
    if p is None:
        p = parser()
    cmds = commands(p)
    common = common_options(cmds)
    common_sigs = {_sig(a) for a in common}
    lines = [
        "# Command line",
        "",
        "Generated from imgbuild's argument parser (`imgbuild/cli/parser.py`) when this site "
        "is built. `imgbuild TARGET ...` is `imgbuild build TARGET ...`.",
        "",
        "```text",
        usage(p),
        "```",
        "",
        "| command | what it does |",
        "| --- | --- |",
    ]
    lines += [f"| [`imgbuild {c.name}`](#{c.anchor}) | {_cell(c.help)} |" for c in cmds]
    top = [a for a in options(p)]
    lines += ["", "## imgbuild {#imgbuild}", "", _cell(p.description or ""), "",
              "| option | default | what it does |", "| --- | --- | --- |"]
    lines += [_arg_row(a) for a in top]
    lines += ["", "## Options every command takes {#common-options}", "",
              "| option | default | what it does |", "| --- | --- | --- |"]
    lines += [_arg_row(a) for a in common]
    for c in cmds:
        own = [a for a in options(c.parser) if _sig(a) not in common_sigs]
        lines += ["", f"## imgbuild {c.name} {{#{c.anchor}}}", "", _cell(c.help), "",
                  "```text", usage(c.parser).replace("usage: ", "", 1), "```",
                  ""]
        if own:
            lines += ["| argument | default | what it does |", "| --- | --- | --- |"]
            lines += [_arg_row(a) for a in own]
            lines.append("")
        subs = [x for x in cmds if x.name.startswith(c.name + " ")]
        if subs:
            lines += ["Subcommands: " + ", ".join(f"[`{x.name}`](#{x.anchor})" for x in subs)
                      + ".", ""]
        lines.append("And the [options every command takes](#common-options).")
    return "\n".join(lines) + "\n"


# --- the catalog's keys ---------------------------------------------------------------------

def schema() -> dict[str, dict[str, set[str]]]:
    """The keys the catalog's readers accept, per kind of file and per mapping in it ("" the
    file's top level, "engine" a mapping, "overrides[]" each item of a list)."""
    return {
        "target": {"": set(targets.TARGET_KEYS) | {"extends"}, "engine": targets.ENGINE_KEYS,
                   "overrides[]": targets.OVERRIDE_KEYS, "indexes[]": targets.INDEX_KEYS,
                   "smoke": targets.SMOKE_KEYS},
        "model": {"": models.MODEL_KEYS, "quantization": models.QUANTIZATION_KEYS,
                  "generator": models.GENERATOR_KEYS},
        "patch": {"": patches.PATCH_KEYS, "variants[]": patches.VARIANT_KEYS},
        "registries": {"": registries.REGISTRIES_KEYS, "default": registries.DEFAULT_KEYS,
                       "registries[]": registries.RULE_KEYS},
        "prune": {"": prune.PRUNE_KEYS, "rules[]": prune.RULE_KEYS},
    }


def schema_paths(kind: str) -> set[str]:
    """Every key path of a kind of file: `engine.name`, `overrides[].reason`."""
    out: set[str] = set()
    for prefix, keys in schema()[kind].items():
        out |= {f"{prefix}.{k}" if prefix else k for k in keys}
    return out


def described() -> dict[str, Any]:
    return yaml.safe_load(KEYS_FILE.read_text())


def check_keys(desc: dict | None = None) -> list[str]:
    """What the description and the readers disagree on, in words; empty when they agree."""
    desc = desc or described()
    problems = []
    for kind in schema():
        if kind not in desc:
            problems.append(f"{KEYS_FILE.name}: no section '{kind}'")
            continue
        said = {k for k in desc[kind]["keys"] if "<" not in k}
        accepted = schema_paths(kind)
        for k in sorted(accepted - said):
            problems.append(f"{kind}: key '{k}' is accepted by the reader but not described "
                            f"in imgbuild/catalog/{KEYS_FILE.name}")
        for k in sorted(said - accepted):
            problems.append(f"{kind}: key '{k}' is described in imgbuild/catalog/"
                            f"{KEYS_FILE.name} but the reader refuses it")
    return problems


def key_anchor(kind: str, path: str) -> str:
    slug = path.replace("[]", "").replace(".", "-").replace("<", "").replace(">", "")
    return f"{kind}-{slug}".replace("_", "-")


def _lookup(data: Any, path: str) -> Any:
    """The value at a key path in one file's data; ... when it is not there."""
    parts = path.replace("[]", ".[]").split(".")
    cur = [data]
    for part in parts:
        nxt = []
        for v in cur:
            if part == "[]":
                nxt += [x for x in v if isinstance(x, dict)] if isinstance(v, list) else []
            elif part.startswith("<"):
                nxt += list(v.values()) if isinstance(v, dict) else []
            elif isinstance(v, dict) and part in v and v[part] is not None:
                nxt.append(v[part])
        cur = nxt
    return cur[0] if cur else ...


def _example(images: Path, globs: list[str], path: str,
             prefer: tuple[str, ...] = ()) -> tuple[str, Any] | None:
    for g in globs:
        for f in sorted(images.glob(g), key=lambda f: (f.name not in prefer, f.name)):
            if f.name in NOT_TARGETS and g == "*.yaml":
                continue
            try:
                data = yaml.safe_load(f.read_text())
            except yaml.YAMLError:
                continue
            v = _lookup(data, path)
            if v is not ...:
                return str(f.relative_to(images.parent)), v
    return None


class _Dumper(yaml.SafeDumper):
    pass


def _str_rep(dumper, data):
    # A version or number-like text is written in quotes, as a spec must write it.
    style = '"' if data.replace(".", "").isdigit() else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", data, style=style)


_Dumper.add_representer(str, _str_rep)


def _nest(path: str, value: Any) -> Any:
    """{'engine': {'name': v}} for engine.name; a list item for `overrides[].reason`."""
    parts = path.split(".")
    for part in reversed(parts):
        if part.startswith("<"):
            value = {"sglang": value}
        elif part.endswith("[]"):
            value = {part[:-2]: [value]}
        else:
            value = {part: value}
    return value


def _yaml_value(path: str, value: Any, limit: int = 8) -> str:
    if isinstance(value, str) and len(value) > 160:
        value = value[:157].rstrip() + "..."
    text = yaml.dump(_nest(path, value), Dumper=_Dumper, sort_keys=False, width=96,
                     allow_unicode=True, default_flow_style=None)
    lines = text.splitlines()
    if len(lines) > limit:
        lines = lines[:limit] + ["# ..."]
    return "\n".join(lines)


def catalog_reference(images: Path, desc: dict | None = None) -> str:
    desc = desc or described()
    problems = check_keys(desc)
    if problems:
        raise DocsError("the catalog reference is stale:\n" + "\n".join(problems))
    lines = ["# Catalog files", "",
             "Generated from the catalog's readers (`imgbuild/catalog/`) and the words in "
             "`imgbuild/catalog/keys.yaml` when this site is built. Each example is taken from "
             "a file imgbuild ships under `images/`. A project's files take the same keys.", ""]
    for kind in schema():
        d = desc[kind]
        lines += [f"- [{d['title']}](#{kind}): `{d['file']}`"]
    for kind in schema():
        d = desc[kind]
        lines += ["", f"## {d['title']} {{#{kind}}}", "", f"`{d['file']}`. " + _cell(d["about"]),
                  ""]
        for path, k in d["keys"].items():
            req = "required" if "default" not in k else f"default: {k['default']}"
            lines += [f"### `{path}` {{#{key_anchor(kind, path)}}}", "",
                      f"*{k['type']}; {req}.* " + _cell(k["about"]), ""]
            ex = _example(images, d["glob"], path, tuple(d.get("prefer", ())))
            if ex is not None:
                where, value = ex
                lines += [f"From `{where}`:", "", "```yaml", _yaml_value(path, value), "```", ""]
    return "\n".join(lines) + "\n"


# --- the doctor's failures ------------------------------------------------------------------

def failures_reference(failures_file: Path) -> str:
    data = yaml.safe_load(failures_file.read_text()) or {}
    items = data.get("failures") or []
    lines = ["# Known failures", "",
             f"Generated from `images/checks/failures.yaml` when this site is built: the "
             f"{len(items)} failures `imgbuild doctor` knows. A project adds its own in its "
             "`images/checks/failures.yaml`. `{name}` in a text is a value read from the log.",
             "", "| failure | severity | title |", "| --- | --- | --- |"]
    for f in items:
        lines.append(f"| [`{f['id']}`](#{f['id']}) | {f.get('severity', '')} | "
                     f"{_cell(f.get('title', ''))} |")
    for f in items:
        lines += ["", f"## {f['id']} {{#{f['id']}}}", "", f"**{_cell(f.get('title', ''))}** "
                  f"({f.get('severity', '')})", ""]
        for label, key in (("Cause", "cause"), ("Fix", "fix")):
            if f.get(key):
                lines += [f"**{label}.** " + _cell(_plain(f[key])), ""]
        applies = f.get("applies_to") or {}
        if applies:
            lines += ["**Applies to.** " + ", ".join(
                f"{pkg} {rng or '(any version)'}" for pkg, rng in applies.items()), ""]
        sources = f.get("sources") or []
        if sources:
            lines += ["**Read from.** " + "; ".join(
                _cell(f"`{s.get('in', '')}` {s.get('at', '')}") for s in sources
                if isinstance(s, dict)), ""]
        examples = f.get("examples") or []
        if examples:
            lines += ["```text", str(examples[0]).rstrip()[:400], "```"]
    return "\n".join(lines) + "\n"


def _plain(text: str) -> str:
    """[[with {x}||without]] as the doctor writes it when the log gave no value."""
    return re.sub(r"\[\[(.*?)\|\|(.*?)\]\]", r"\1", str(text), flags=re.S)


# --- exit codes -----------------------------------------------------------------------------

EXIT_WORDS = {
    0: "ok",
    1: "the job failed: a build, a smoke test, a check",
    2: "bad input: a spec, an argument, a lockfile",
    3: "the environment: no Docker daemon, a registry out of reach, a full or read-only disk; "
       "the message says the fix",
    130: "interrupted (Ctrl-C): uv, the docker client and smoke containers are ended, scratch "
         "directories removed, no tag moved",
    143: "terminated (SIGTERM), as Ctrl-C",
}


def exit_codes_reference() -> str:
    codes = {v: k for k, v in vars(errors).items() if k.startswith("EXIT_")}
    classes = {}
    for name, obj in vars(errors).items():
        if isinstance(obj, type) and issubclass(obj, errors.ImgbuildError):
            classes.setdefault(obj.exit_code, []).append(name)
    missing = set(codes) - set(EXIT_WORDS)
    if missing:
        raise DocsError(f"exit codes without words in imgbuild/docsgen.py: {sorted(missing)}")
    lines = ["# Exit codes", "",
             "Generated from `imgbuild/errors.py` when this site is built. Every command "
             "exits with one of these. A known error never shows a traceback: it says what "
             "happened and what to do next (with `--json`, as a JSON document on stdout).", "",
             "| code | meaning | constant | errors |", "| --- | --- | --- | --- |"]
    for code, words in EXIT_WORDS.items():
        const = f"`{codes[code]}`" if code in codes else ""
        errs = ", ".join(f"`{c}`" for c in sorted(classes.get(code, []))) if code in codes else ""
        lines.append(f"| {code} | {words} | {const} | {errs} |")
    return "\n".join(lines) + "\n"


# --- performance plots ----------------------------------------------------------------------

def _machine(m: dict | None) -> str:
    m = m or {}
    # the day of a recorded date (an ISO time cut to YYYY-MM-DD); the words when none is
    date = str(m["date"])[:10] if m.get("date") else "date not recorded"
    return f"{m.get('cpu', 'a machine')}, {m.get('cores', '?')} cores, {date}"


def _svg(fig) -> bytes:
    buf = io.BytesIO()
    fig.savefig(buf, format="svg", bbox_inches="tight", metadata={"Date": None})
    import matplotlib.pyplot as plt

    plt.close(fig)
    return buf.getvalue()


def _barh(title: str, bars: list[tuple[str, float]], unit: str, note: str):
    import matplotlib

    matplotlib.use("Agg")
    matplotlib.rcParams["svg.hashsalt"] = "imgbuild"
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 0.45 * len(bars) + 1.4))
    labels = [b[0] for b in bars][::-1]
    values = [b[1] for b in bars][::-1]
    ax.barh(labels, values, color="#3f6fb5")
    for i, v in enumerate(values):
        ax.text(v, i, f" {v:,.1f} {unit}", va="center", fontsize=9)
    ax.set_title(title, fontsize=11, loc="left")
    ax.set_xlabel(f"{unit}  ({note})", fontsize=9)
    ax.set_xlim(0, max(values) * 1.25 if values else 1)
    ax.spines[["top", "right"]].set_visible(False)
    return fig


def plots(results: Path) -> tuple[str, dict[str, bytes]]:
    """The performance page's markdown and its SVG files (name -> bytes), drawn from
    bench/results/*.json. A file of an unknown shape is skipped, not guessed at."""
    figs: dict[str, bytes] = {}
    sections: list[str] = []

    def add(name: str, heading: str, fig, words: str, source: str) -> None:
        figs[name] = _svg(fig)
        sections.extend([f"### {heading}", "", words, "",
                         f"![{heading}]({name})", "", f"Source: `bench/results/{source}`.", ""])

    def load(p: Path) -> dict | None:
        try:
            d = json.loads(p.read_text())
        except (OSError, ValueError):
            return None
        return d if isinstance(d, dict) else None

    sections += ["## Push and pull against the Docker Engine", ""]
    for p in sorted(results.glob("wire-*.json")):
        d = load(p)
        if not d or "engine_push" not in d:
            continue
        m = _machine(d.get("machine"))
        bars = [("Engine push (gzip)", d["engine_push"]["seconds"])]
        for k, label in (("imgbuild_push_gzip", "imgbuild push (gzip)"),
                         ("imgbuild_push_zstd", "imgbuild push (zstd)")):
            if isinstance(d.get(k), dict):
                bars.append((label, d[k]["seconds"]))
        for k, label in (("engine_pull_engine_gzip_s", "Engine pull, its own gzip"),
                         ("engine_pull_engine_gzip_unpigz_s", "Engine pull, with unpigz"),
                         ("engine_pull_imgbuild_gzip_s", "Engine pull, imgbuild's gzip"),
                         ("containerd_pull_imgbuild_gzip_s", "containerd pull, gzip"),
                         ("containerd_pull_imgbuild_zstd_s", "containerd pull, zstd")):
            if isinstance(d.get(k), (int, float)):
                bars.append((label, d[k]))
        add(p.stem + ".svg", f"{d.get('target', p.stem)}: push and cold pull",
            _barh(f"{d.get('target', '')}: push and cold pull, seconds", bars, "s", m),
            f"{m}. One run, loopback registry. Lower is faster.", p.name)
    for p in sorted(results.glob("pull-*.json")):
        d = load(p)
        if not d or not isinstance(d.get("layouts"), dict):
            continue
        m = _machine(d.get("machine"))
        bars = []
        for name, lay in d["layouts"].items():
            if "push_s" in lay:
                bars.append((f"{name} layers: push", lay["push_s"]))
            if "cold_pull_median_s" in lay:
                bars.append((f"{name} layers: cold pull", lay["cold_pull_median_s"]))
        if bars:
            add(p.stem + ".svg", f"{d.get('target', p.stem)}: layer layouts",
                _barh(f"{d.get('target', '')}: push and pull by layer layout, seconds",
                      bars, "s", m),
                f"{m}. Today's layers against `split_heavy_layer: true`; the pull is the "
                f"median of {d.get('rounds', '?')} rounds. Kept: {d.get('kept', '?')}.", p.name)

    sections += ["## An engine bump against a rebuild", ""]
    for p in sorted(results.glob("bump-*.json")):
        d = load(p)
        if not d or not isinstance(d.get("today"), dict) or not isinstance(d.get("imgbuild"),
                                                                            dict):
            continue
        m = _machine(d.get("machine"))
        bars = [("rebuild (no cache, Engine push)", d["today"]["seconds"])]
        if isinstance(d.get("imgbuild_no_splice"), dict):
            bars.append(("imgbuild, built whole", d["imgbuild_no_splice"]["seconds"]))
        how = d["imgbuild"].get("action", "bump")
        bars.append((f"imgbuild ({how})", d["imgbuild"]["seconds"]))
        if isinstance(d.get("second_bump"), dict):
            bars.append(("imgbuild, a second bump", d["second_bump"]["seconds"]))
        sent = d["imgbuild"].get("sent_bytes")
        said = f" imgbuild sent {sent / 1e6:,.0f} MB." if sent else ""
        add(p.stem + ".svg", f"{d.get('target', p.stem)}: engine bump",
            _barh(f"{d.get('target', '')}: {d.get('engine_pin', 'engine bump')}, seconds",
                  bars, "s", m),
            f"{m}. A fresh runner: the previous image in the registry, nothing local.{said}",
            p.name)

    sections += ["## The slim image's bytes by kind", ""]
    for p in sorted(results.glob("size-*.json")):
        d = load(p)
        if not d:
            continue
        stacks: list[tuple[str, dict]] = []
        if isinstance(d.get("before_rules"), dict):
            stacks.append(("before prune rules", d["before_rules"].get("by_kind", {})))
        if isinstance(d.get("with_rules"), dict):
            stacks.append(("with prune rules", d["with_rules"].get("by_kind", {})))
        if isinstance(d.get("size"), dict):
            stacks.append((d.get("content_tag", p.stem).rsplit(":", 1)[-1],
                           d["size"].get("by_kind", {})))
        stacks = [(n, k) for n, k in stacks if k]
        if not stacks:
            continue
        m = _machine(d.get("machine"))
        add(p.stem + ".svg", f"{p.stem.removeprefix('size-')}: bytes by kind",
            _stacked(f"{p.stem.removeprefix('size-')}: GB by kind of file", stacks, m),
            f"{m}. `imgbuild size` of the image.", p.name)

    sections += ["## The test suite's time per run", ""]
    suite = results / "test-suite.json"
    d = load(suite) if suite.is_file() else None
    if d:
        runs = [(k, v) for k, v in d.items() if isinstance(v, dict) and "wall_seconds" in v]
        runs.sort(key=lambda kv: str((kv[1].get("machine") or {}).get("date", "")))
        if runs:
            first = _machine(runs[0][1].get("machine"))
            last = _machine(runs[-1][1].get("machine"))
            add("test-suite.svg", "make test, wall time per run",
                _series(runs), f"From {first} to {last}. Each point is one run of the suite; "
                "the line is the 20-minute budget.", suite.name)
    return "\n".join(sections), figs


def _stacked(title: str, stacks: list[tuple[str, dict]], note: str):
    import matplotlib

    matplotlib.use("Agg")
    matplotlib.rcParams["svg.hashsalt"] = "imgbuild"
    import matplotlib.pyplot as plt

    kinds: list[str] = []
    for _, by in stacks:
        kinds += [k for k in by if k not in kinds]
    fig, ax = plt.subplots(figsize=(8, 0.6 * len(stacks) + 1.8))
    left = [0.0] * len(stacks)
    names = [n for n, _ in stacks]
    for kind in kinds:
        vals = [by.get(kind, 0) / 1e9 for _, by in stacks]
        ax.barh(names, vals, left=left, label=kind)
        left = [a + b for a, b in zip(left, vals)]
    for i, total in enumerate(left):
        ax.text(total, i, f" {total:.2f} GB", va="center", fontsize=9)
    ax.set_title(title, fontsize=11, loc="left")
    ax.set_xlabel(f"GB  ({note})", fontsize=9)
    ax.set_xlim(0, max(left) * 1.2)
    ax.legend(fontsize=8, ncol=3, loc="upper center", bbox_to_anchor=(0.5, -0.35))
    ax.invert_yaxis()
    ax.spines[["top", "right"]].set_visible(False)
    return fig


def _series(runs: list[tuple[str, dict]]):
    import matplotlib

    matplotlib.use("Agg")
    matplotlib.rcParams["svg.hashsalt"] = "imgbuild"
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 3.2))
    xs = list(range(len(runs)))
    ys = [v["wall_seconds"] / 60 for _, v in runs]
    ax.plot(xs, ys, marker="o", color="#3f6fb5")
    ax.axhline(20, color="#b53f3f", linestyle="--", linewidth=1)
    dates = [str((v.get("machine") or {}).get("date", ""))[5:10] for _, v in runs]
    ax.set_xticks(xs[::3], dates[::3], fontsize=8, rotation=45)
    ax.set_ylabel("minutes", fontsize=9)
    ax.set_title("make test: wall time per run (minutes)", fontsize=11, loc="left")
    ax.set_ylim(0, max(ys + [20]) * 1.1)
    ax.spines[["top", "right"]].set_visible(False)
    return fig


PERFORMANCE_INTRO = """# Performance

What imgbuild's fast paths are worth, measured. Each plot is drawn from a result file under
`bench/results/` when this site is built, and names the machine and the date of the run.
Ratios are measured side by side in one run; these machines are shared and noisy. A plot
shows imgbuild as it was on the run's date: what changed since, and the goals and every
measurement with its history, are in
[the measurements](measurements.md) (`bench/README.md`).
"""


# --- the site's generated files -------------------------------------------------------------

def generate(root: Path) -> dict[str, str | bytes]:
    """Every generated file of the site, by its path under docs/."""
    root = Path(root)
    images = root / "images"
    out: dict[str, str | bytes] = {
        "reference/cli.md": cli_reference(),
        "reference/catalog.md": catalog_reference(images),
        "reference/failures.md": failures_reference(images / "checks" / "failures.yaml"),
        "reference/exit-codes.md": exit_codes_reference(),
    }
    text, figs = plots(root / "bench" / "results")
    out["performance/index.md"] = PERFORMANCE_INTRO + "\n" + text
    for name, data in figs.items():
        out[f"performance/{name}"] = data
    bench = root / "bench" / "README.md"
    if bench.is_file():
        out["performance/measurements.md"] = bench.read_text()
    return out
