"""The validator every file under images/ goes through: each helper checks one key and says what
was expected, so a reviewer can fix a spec without reading Python."""

from __future__ import annotations

import difflib
from pathlib import Path
from typing import Any

import yaml
from packaging.requirements import InvalidRequirement, Requirement

from ..errors import InputError, SpecError


class Doc:
    """One mapping in a spec file, with its location for error messages."""

    def __init__(self, path: str, data: Any, prefix: str = ""):
        if not isinstance(data, dict):
            raise SpecError(path, prefix or "(top level)", "a mapping of keys to values",
                            type(data).__name__)
        self.path, self.data, self.prefix = path, data, prefix

    def key(self, k: str) -> str:
        return f"{self.prefix}.{k}" if self.prefix else k

    def reject_unknown(self, allowed: set[str]) -> None:
        for k in self.data:
            if k not in allowed:
                close = difflib.get_close_matches(str(k), sorted(allowed), n=1)
                hint = f"did you mean '{close[0]}'?" if close else None
                if isinstance(k, bool):  # YAML 1.1, which PyYAML reads: `on:` is the key True
                    hint = ("YAML reads a key written on, off, yes or no without quotes as "
                            "true or false: put the key in quotes")
                raise SpecError(self.path, self.key(str(k)),
                                "one of the known keys: " + ", ".join(sorted(allowed)),
                                f"unknown key {k!r}", hint=hint)

    def get(self, k: str, typ: type | tuple[type, ...], default: Any = ..., *,
            what: str | None = None) -> Any:
        if k not in self.data or self.data[k] is None:
            if default is ...:
                raise SpecError(self.path, self.key(k), f"{what or tname(typ)} (required key is missing)")
            return default
        v = self.data[k]
        if typ is float and isinstance(v, int) and not isinstance(v, bool):
            v = float(v)
        if typ is str and isinstance(v, (int, float)) and not isinstance(v, bool):
            # YAML reads 3.12 and 0.5 as numbers; the spec means the text. (A `what` that asks
            # for quotes already says so: it is not said twice.)
            want = what or "a string"
            raise SpecError(self.path, self.key(k), want + ("" if "in quotes" in want else
                                                            " in quotes") + " (YAML read a number)", v)
        if not isinstance(v, typ) or (isinstance(v, bool) and typ is not bool):
            raise SpecError(self.path, self.key(k), what or tname(typ), v)
        return v

    def str_list(self, k: str, *, default: Any = ()) -> tuple[str, ...]:
        v = self.get(k, list, default=list(default) if default is not ... else ..., what="a list of strings")
        for i, item in enumerate(v):
            if not isinstance(item, str):
                raise SpecError(self.path, f"{self.key(k)}[{i}]", "a string", item)
        return tuple(v)

    def sub(self, k: str, value: Any) -> Doc:
        return Doc(self.path, value, self.key(k))


def tname(typ: type | tuple[type, ...]) -> str:
    names = {str: "a string", int: "an integer", float: "a number", bool: "true or false",
             list: "a list", dict: "a mapping"}
    if isinstance(typ, tuple):
        return " or ".join(names.get(t, t.__name__) for t in typ)
    return names.get(typ, typ.__name__)


# libyaml's safe loader (in PyYAML's wheels) parses the catalog about six times faster than the
# pure-Python one, and every command reads the catalog whole; the values are built by the same
# Python constructors either way. Its error messages say less ("found undefined alias", not
# which), so a document it refuses is parsed again by the pure-Python loader, which has the
# last word: the cost falls on the broken file only.
FAST_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


def read_yaml(path: Path, root: Path) -> Any:
    where = rel(path, root)
    try:
        text = path.read_text()
    except OSError as e:
        raise InputError(f"{where}: cannot read: {e.strerror}") from None
    try:
        return yaml.load(text, Loader=FAST_LOADER)  # noqa: S506 (a safe loader)
    except yaml.YAMLError:
        pass
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        at = f" line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        problem = getattr(e, "problem", None) or str(e).splitlines()[0]
        raise SpecError(where, "", f"valid YAML (parse error at{at}: {problem})",
                        hint=f"fix the YAML syntax in {where}") from None


def rel(path: Path, root: Path) -> str:
    try:
        return str(path.relative_to(root.parent))
    except ValueError:
        return str(path)


def requirement(doc: Doc, key: str, text: str) -> Requirement:
    try:
        return Requirement(text)
    except InvalidRequirement as e:
        raise SpecError(doc.path, key, "a PEP 508 requirement such as 'torch==2.13.0'",
                        f"{text!r} ({e})") from None



def unknown(kind: str, name: str, known, cmd: str = "imgbuild list") -> InputError:
    """`unknown target 'x'`, with the known names and the closest one."""
    close = difflib.get_close_matches(name, list(known), n=1, cutoff=0.5)
    facts = [f"known {kind}s: " + ", ".join(sorted(known))]
    hint = f"did you mean '{close[0]}'?" if close else f"see `{cmd}`"
    return InputError(f"unknown {kind} '{name}'", facts=facts, hint=hint)


def read_table(images: Path, names: tuple[str, ...], what: str) -> Doc:
    """One of the tables under images/ (the first of `names`, relative to it), read as a Doc;
    an InputError that says what is missing and where it was looked for."""
    root = Path(images)
    path = next((root / n for n in names if (root / n).is_file()), None)
    if path is None:
        raise InputError(f"no {what} under {root}",
                         facts=[f"looked for {', '.join(str(root / n) for n in names)}"],
                         hint=f"pass --images DIR with {names[0]} in it (the checkout's "
                              "images/ has one)")
    where = rel(path, root)
    return Doc(where, read_yaml(path, root))
