"""Every refusal of images/checks/failures.yaml, word for word (catalog/failures.py).

The failure catalog is data a reviewer edits without Python, and its reader is what tells them
what they got wrong: each case below breaks one key of a valid catalog and checks the whole
sentence the user reads (the key, what was expected, what was there) and its hint. Also: which
of a layered catalog's files a refusal names, and the refusal when no layer has the file."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import yaml

from imgbuild.catalog import failures
from imgbuild.catalog.failures import load_failures
from imgbuild.errors import InputError, SpecError

DELETE = object()
GOOD = {
    "engines": [{"name": "widgets", "title": "Widgets", "signs": [
        {"regex": r"widgets (?P<version>[\d.]+) ready", "contains": "widgets ", "weight": 2}]}],
    "outer_prefixes": [{"name": "kubelet", "regex": r"^\S+ stderr F "}],
    "prefixes": [{"name": "widgets", "regex": r"^\[W(?P<rank>\d+)\] ", "engine": "widgets"},
                 {"name": "stamp", "regex": r"^\[\d\d:\d\d\] ", "engine": "widgets",
                  "generic": "any logger writes it"}],
    "failures": [{
        "id": "widget-missing",
        "title": "widget {name} is missing",
        "severity": "warning",
        "match": [{"regex": r"WidgetError: no widget (?P<name>\w+)",
                   "contains": "WidgetError: no widget ",
                   "printed_by": {"widgets": ">=1"},
                   "near": [{"regex": r"loading (?P<part>\w+)", "contains": "loading",
                             "before": 2, "role": "loader"}]}],
        "defaults": {"colour": "a colour"},
        "derive": {"label": {"template": "{name}-{part}"},
                   "size": {"from": "name", "map": {"gear": "small"}, "default": "some size"}},
        "around": [{"regex": r"port (?P<port>\d+)", "contains": "port ", "after": 3}],
        "cause": "the widget {name} was not installed ({occurrences} times, {ranks})"
                 "[[ on port {port}||]]",
        "fix": "run `imgbuild check-deps TARGET`",
        "dedupe_by": ["name"],
        "applies_to": {"widgets": "<2"},
        "sources": [{"in": "widgets==1.0", "at": "widgets/core.py:10"}],
        "examples": ["WidgetError: no widget gear"],
    }],
}


def _edited(path: str, value: object) -> dict:
    """GOOD with the key at a dotted path (list items by index) set to value, or removed."""
    data = copy.deepcopy(GOOD)
    *parents, last = [int(p) if p.isdigit() else p for p in path.split(".")]
    node = data
    for p in parents:
        node = node[p]
    if value is DELETE:
        del node[last]
    else:
        node[last] = value
    return data


def _write(images: Path, data: object) -> Path:
    (images / "checks").mkdir(parents=True, exist_ok=True)
    (images / "checks" / "failures.yaml").write_text(yaml.safe_dump(data, sort_keys=False))
    return images


def test_the_catalog_these_cases_break_is_valid(tmp_path):
    cat = load_failures(_write(tmp_path, GOOD))
    fp, = cat.fingerprints
    assert fp.severity == "warning" and [d.name for d in fp.derive] == ["label", "size"]
    assert [p.name for p in cat.prefixes] == ["widgets", "stamp"]
    assert [p.name for p in cat.outer] == ["kubelet"]
    assert fp.around[0].contains == "port " and fp.alternatives[0].near[0].role == "loader"
    # Every field as read, so a reader that drops one is caught here, not in doctor's output.
    engine, = cat.engines
    sign, = engine.signs
    assert (engine.name, engine.title) == ("widgets", "Widgets")
    assert (sign.regex.pattern, sign.contains, sign.weight) == \
        (r"widgets (?P<version>[\d.]+) ready", "widgets ", 2)
    assert [(p.engine, p.generic) for p in cat.prefixes] == \
        [("widgets", None), ("widgets", "any logger writes it")]
    size = fp.derive[1]
    assert (size.source, size.table, size.default) == ("name", (("gear", "small"),), "some size")
    assert fp.applies_to == (("widgets", "<2"),) and fp.engines == (("widgets", "<2"),)
    assert fp.dedupe_by == ("name",) and fp.defaults == (("colour", "a colour"),)
    assert [str(s) for s in fp.sources] == ["widgets==1.0 widgets/core.py:10"]
    # applies_to names a package that is no engine here: no engine range.
    other = _edited("failures.0.applies_to", {"torch": ">=2"})
    assert load_failures(_write(tmp_path, other)).fingerprints[0].engines == ()


def test_a_second_failure_with_the_same_id_names_the_first(tmp_path):
    data = copy.deepcopy(GOOD)
    data["failures"].append(copy.deepcopy(data["failures"][0]))
    with pytest.raises(SpecError) as e:
        load_failures(_write(tmp_path, data))
    assert e.value.message == (f"{tmp_path.name}/checks/failures.yaml: failures[1].id: expected "
                               "a unique id (failures[0] has it too), got 'widget-missing'")


def test_the_preflight_sentences_are_each_failures_title_cause_and_fix():
    from .conftest import checkout_workspace
    cat = checkout_workspace().failures
    said = failures.preflight_sentences(cat)
    by_id = {fp.id: fp for fp in cat.fingerprints}
    assert said == {f: {"title": by_id[f].title, "cause": by_id[f].cause, "fix": by_id[f].fix}
                    for f in failures.PREFLIGHT_FAILURES}


@pytest.mark.parametrize("path, value, said, hint", [
    ('engines', 4,
     'engines: expected a list of engines, got 4',
     None),
    ('engines.0.signs', 3,
     'engines[0].signs: expected a list of {regex, contains}, got 3',
     None),
    ('engines.0.signs.0.weight', 0,
     'engines[0].signs[0].weight: expected a weight of 1 or more, got 0',
     None),
    ('engines.0.signs.0.weight', 'two',
     "engines[0].signs[0].weight: expected a weight of 1 or more, got 'two'",
     None),
    ('engines.0.signs.0.contains', DELETE,
     'engines[0].signs[0].contains: expected a literal text every line the regex matches contains (lines without it are not searched) (required key is missing)',
     None),
    ('engines.0.signs.0.regex', 'widgets (?P<v>[\\d.]+) (?P<w>x)',
     "engines[0].signs[0].regex: expected no capture but (?P<version>...), got ['v', 'w']",
     None),
    ('prefixes.0.engine', 'gadgets',
     "prefixes[0].engine: expected the name of an engine under engines: (widgets), got 'gadgets'",
     None),
    ('prefixes.1.generic', ' ',
     "prefixes[1].generic: expected a non-empty text, on a prefix that names its engine, got ' '",
     None),
    ('prefixes.1.generic', 5,
     'prefixes[1].generic: expected why other programs write this prefix too, in words in quotes (YAML read a number), got 5',
     None),
    ('outer_prefixes.0.engine', 'nope',
     "outer_prefixes[0].engine: expected the name of an engine under engines: (widgets), got 'nope'",
     None),
    ('outer_prefixes', 7,
     'outer_prefixes: expected a list of log prefixes, got 7',
     None),
    ('prefixes', 'x',
     "prefixes: expected a list of log prefixes, got 'x'",
     None),
    ('failures', [],
     'failures: expected at least one failure',
     None),
    ('failures', 3,
     'failures: expected a list of failures, got 3',
     None),
    ('failures.0.supersedes', ['widget-missing'],
     "failures[0].supersedes[0]: expected the id of another failure in this file, got 'widget-missing'",
     None),
    ('failures.0.supersedes', ['nothing-like-it'],
     "failures[0].supersedes[0]: expected the id of another failure in this file, got 'nothing-like-it'",
     None),
    ('failures.0.id', 'Widget_Missing',
     "failures[0].id: expected a kebab-case id such as 'torch-arch-unsupported', got 'Widget_Missing'",
     None),
    ('failures.0.severity', 'fatal',
     "failures[0].severity: expected one of error, warning, got 'fatal'",
     None),
    ('failures.0.match', [],
     'failures[0].match: expected at least one {regex, contains}',
     None),
    ('failures.0.match', 5,
     'failures[0].match: expected a list of ways the failure shows (regex, contains), got 5',
     None),
    ('failures.0.match.0.printed_by', {'widgets': 1},
     "failures[0].match[0].printed_by.widgets: expected a PEP 440 version range in quotes ('' for any version), got 1",
     None),
    ('failures.0.match.0.printed_by', {'widgets': '=>1'},
     "failures[0].match[0].printed_by.widgets: expected a PEP 440 version range such as '>=0.5.8,<0.5.17', got '=>1'",
     None),
    ('failures.0.match.0.printed_by', 3,
     'failures[0].match[0].printed_by: expected a mapping, got 3',
     None),
    ('failures.0.match.0.near', 3,
     'failures[0].match[0].near: expected a list of lines that must be near the matched one, got 3',
     None),
    ('failures.0.match.0.severity', 'loud',
     "failures[0].match[0].severity: expected one of error, warning, got 'loud'",
     None),
    ('failures.0.match.0.near.0.before', 0,
     "failures[0].match[0].near[0].before: expected how many lines before and/or after the matched line to look (at least one of before, after above 0), got {'before': 0, 'after': 0}",
     None),
    ('failures.0.match.0.near.0.before', -1,
     "failures[0].match[0].near[0].before: expected how many lines before and/or after the matched line to look (at least one of before, after above 0), got {'before': -1, 'after': 0}",
     None),
    ('failures.0.match.0.near.0.before', 'two',
     "failures[0].match[0].near[0].before: expected a number of lines (0 or more), got 'two'",
     None),
    ('failures.0.around.0.after', 'x',
     "failures[0].around[0].after: expected a number of lines (0 or more), got 'x'",
     None),
    ('failures.0.around.0.after', 0,
     "failures[0].around[0].before: expected how many lines before and/or after the matched line to look (at least one of before, after above 0), got {'before': 0, 'after': 0}",
     None),
    ('failures.0.match.0.contains', '',
     "failures[0].match[0].contains: expected a non-empty text, got ''",
     None),
    ('failures.0.match.0.contains', 5,
     'failures[0].match[0].contains: expected a literal text every line the regex matches contains (lines without it are not searched) in quotes (YAML read a number), got 5',
     None),
    ('failures.0.match.0.regex', 'WidgetError: (unclosed',
     'failures[0].match[0].regex: expected a valid regular expression, got "\'WidgetError: (unclosed\' (missing ), unterminated subpattern at position 13)"',
     None),
    ('failures.0.match.0.regex', 'WidgetError: no widget (?P<ranks>\\w+)',
     "failures[0].match[0].regex: expected capture names other than occurrences, ranks (doctor fills those in itself), got 'ranks'",
     None),
    ('failures.0.match.0.regex', 7,
     'failures[0].match[0].regex: expected a regular expression (Python syntax) in quotes (YAML read a number), got 7',
     None),
    ('failures.0.defaults', {'colour': 5},
     'failures[0].defaults.colour: expected a string in quotes, got 5',
     None),
    ('failures.0.defaults', {'bad name': 'x'},
     "failures[0].defaults: expected capture names as keys, got 'bad name'",
     None),
    ('failures.0.defaults', ['x'],
     "failures[0].defaults: expected a mapping, got ['x']",
     None),
    ('failures.0.derive.occurrences', {'template': '{name}'},
     "failures[0].derive: expected names of new captures as keys (not occurrences, ranks), got 'occurrences'",
     None),
    ('failures.0.derive.label', {'template': '{name!r}'},
     "failures[0].derive.label.template: expected plain {name} placeholders (write {{ and }} for literal braces), got '{name!r}'",
     None),
    ('failures.0.derive.label', {'template': '{name:>5}'},
     "failures[0].derive.label.template: expected plain {name} placeholders (write {{ and }} for literal braces), got '{name:>5}'",
     None),
    ('failures.0.derive.label', {'template': '{}'},
     "failures[0].derive.label.template: expected plain {name} placeholders (write {{ and }} for literal braces), got '{}'",
     None),
    ('failures.0.derive.label', {'template': '{nmae}'},
     "failures[0].derive.label.template: expected placeholders that match[0] sets: one of colour, name, part, got '{nmae}'",
     'name the capture in match[...].regex, or give it under defaults: or derive:'),
    ('failures.0.derive.label', {'templat': 'x'},
     'failures[0].derive.label.templat: expected one of the known keys: default, from, map, template, got "unknown key \'templat\'"',
     "did you mean 'template'?"),
    ('failures.0.derive.label', {'default': 'x'},
     'failures[0].derive.label: expected a mapping with template, or with from and map',
     None),
    ('failures.0.derive.label', {'template': 3},
     'failures[0].derive.label.template: expected a string in quotes (YAML read a number), got 3',
     None),
    ('failures.0.derive.size', {'from': 'name', 'map': {'gear': 5}},
     'failures[0].derive.size.map.gear: expected a string in quotes, got 5',
     None),
    ('failures.0.derive.size', {'from': 'nmae', 'map': {'gear': 'small'}},
     "failures[0].derive.size.from: expected placeholders that match[0] sets: one of colour, label, name, part, got '{nmae}'",
     'name the capture in match[...].regex, or give it under defaults: or derive:'),
    ('failures.0.derive.size', {'from': 5, 'map': {'gear': 'small'}},
     'failures[0].derive.size.from: expected the name of a capture in quotes (YAML read a number), got 5',
     None),
    ('failures.0.derive.size', {'from': 'name', 'map': 5},
     'failures[0].derive.size.map: expected a mapping from captured values to results, got 5',
     None),
    ('failures.0.derive.size', {'from': 'name', 'map': {'gear': 'small'}, 'default': 5},
     'failures[0].derive.size.default: expected a string in quotes (YAML read a number), got 5',
     None),
    ('failures.0.derive', ['x'],
     "failures[0].derive: expected a mapping, got ['x']",
     None),
    ('failures.0.around.0.regex', 'port \\d+',
     "failures[0].around[0].regex: expected a regular expression with (?P<name>...) captures, got 'port \\\\d+'",
     None),
    ('failures.0.around.0.aftr', 3,
     'failures[0].around[0].aftr: expected one of the known keys: after, before, contains, regex, role, got "unknown key \'aftr\'"',
     "did you mean 'after'?"),
    ('failures.0.around', 4,
     'failures[0].around: expected a list of lines around the matched one that may give a value it does not, got 4',
     None),
    ('failures.0.title', '  ',
     'failures[0].title: expected a non-empty text',
     None),
    ('failures.0.title', 5,
     'failures[0].title: expected a string in quotes (YAML read a number), got 5',
     None),
    ('failures.0.cause', 5,
     'failures[0].cause: expected the cause, in plain words in quotes (YAML read a number), got 5',
     None),
    ('failures.0.cause', DELETE,
     'failures[0].cause: expected the cause, in plain words (required key is missing)',
     None),
    ('failures.0.fix', ' ',
     'failures[0].fix: expected a non-empty text',
     None),
    ('failures.0.fix', 5,
     'failures[0].fix: expected the fix with imgbuild, in plain words in quotes (YAML read a number), got 5',
     None),
    ('failures.0.fix', 'run [[`x {name}`',
     "failures[0].fix: expected [[with {value}||without]] segments, closed and not nested, got 'run [[`x {name}`'",
     None),
    ('failures.0.fix', 'run [[`x {name}`||y]] ]]',
     "failures[0].fix: expected [[with {value}||without]] segments, closed and not nested, got 'run [[`x {name}`||y]] ]]'",
     None),
    ('failures.0.fix', 'run y]]',
     "failures[0].fix: expected [[with {value}||without]] segments, closed and not nested, got 'run y]]'",
     None),
    ('failures.0.fix', 'run [[`x {nmae}`||y]]',
     "failures[0].fix: expected placeholders that a match or an around line sets: one of colour, label, name, occurrences, part, port, ranks, size, got '{nmae}'",
     None),
    ('failures.0.fix', 'run [[`x {name!r}`||y]]',
     "failures[0].fix: expected plain {name} placeholders (write {{ and }} for literal braces), got '{name!r}'",
     None),
    ('failures.0.fix', 'run [[`x {name}`||try {nmae}]]',
     "failures[0].fix: expected placeholders that match[0] sets: one of colour, label, name, occurrences, part, ranks, size, got '{nmae}'",
     'name the capture in match[...].regex, or give it under defaults: or derive:'),
    ('failures.0.fix', 'run `imgbuild paint {colour}`',
     "failures[0].fix: expected commands (in backticks) with values match[0] always gives, got '{colour}'",
     'write [[`...{colour}...`||a wording that needs no value]]: a default is a phrase, and a phrase in a command does not run'),
    ('failures.0.fix', 'run `imgbuild paint {size}`',
     "failures[0].fix: expected commands (in backticks) with values match[0] always gives, got '{size}'",
     'write [[`...{size}...`||a wording that needs no value]]: a default is a phrase, and a phrase in a command does not run'),
    ('failures.0.fix', 'run {port}',
     "failures[0].fix: expected placeholders that match[0] sets: one of colour, label, name, occurrences, part, ranks, size, got '{port}'",
     'name the capture in match[...].regex, or give it under defaults: or derive:'),
    ('failures.0.fix', 'run {name:>9}',
     "failures[0].fix: expected plain {name} placeholders (write {{ and }} for literal braces), got '{name:>9}'",
     None),
    ('failures.0.dedupe_by', [3],
     'failures[0].dedupe_by[0]: expected a capture name, got 3',
     None),
    ('failures.0.dedupe_by', ['colr'],
     "failures[0].dedupe_by[0]: expected placeholders that match[0] sets: one of colour, label, name, part, size, got '{colr}'",
     'name the capture in match[...].regex, or give it under defaults: or derive:'),
    ('failures.0.dedupe_by', 'name',
     "failures[0].dedupe_by: expected a list of capture names, got 'name'",
     None),
    ('failures.0.applies_to', {'widgets': 2},
     "failures[0].applies_to.widgets: expected a PEP 440 version range in quotes ('' for any version), got 2",
     None),
    ('failures.0.applies_to', {'widgets': 'lt 2'},
     "failures[0].applies_to.widgets: expected a PEP 440 version range such as '>=0.5.8,<0.5.17', got 'lt 2'",
     None),
    ('failures.0.sources.0.in', 'widgets ==',
     "failures[0].sources[0].in: expected a package as name==version, got 'widgets =='",
     None),
    ('failures.0.sources.0.in', 5,
     'failures[0].sources[0].in: expected the package the text is in, as name==version in quotes (YAML read a number), got 5',
     None),
    ('failures.0.sources.0.at', 5,
     'failures[0].sources[0].at: expected a path inside the wheel, with :line in quotes (YAML read a number), got 5',
     None),
    ('failures.0.sources.0.on', 'x',
     'failures[0].sources[0].on: expected one of the known keys: at, in, got "unknown key \'on\'"',
     None),
    ('failures.0.examples', [3],
     'failures[0].examples[0]: expected a string, got 3',
     None),
    ('failures.0.wat', 1,
     'failures[0].wat: expected one of the known keys: applies_to, around, cause, dedupe_by, defaults, derive, examples, fix, id, match, severity, sources, supersedes, title, got "unknown key \'wat\'"',
     None),

    ('failures.0.match.0.near.0.after', -1,
     "failures[0].match[0].near[0].after: expected how many lines before and/or after the matched line to look (at least one of before, after above 0), got {'before': 2, 'after': -1}",
     None),
    ('engines', [],
     "prefixes[0].engine: expected the name of an engine under engines: (none is declared), got 'widgets'",
     None),
    ('outer_prefixes.0.generic', 'why',
     "outer_prefixes[0].generic: expected a non-empty text, on a prefix that names its engine, got 'why'",
     None),
])
def test_each_refusal_word_for_word(tmp_path, path, value, said, hint):
    images = _write(tmp_path, _edited(path, value))
    with pytest.raises(SpecError) as e:
        load_failures(images)
    where = f"{images.name}/checks/failures.yaml"  # named from the images/ directory's parent
    assert e.value.path == where
    assert e.value.message == f"{where}: {said}"
    assert e.value.hint == (hint or f"fix {where} and run the command again")


def test_a_refusal_in_a_higher_layer_names_that_layers_file(tmp_path):
    lower = _write(tmp_path / "catalog", GOOD)
    upper = _write(tmp_path / "project", {"failures": [
        dict(_edited("failures.0.severity", "fatal")["failures"][0], id="widget-gone")]})
    with pytest.raises(SpecError) as e:
        load_failures([lower, upper])
    where = "project/checks/failures.yaml"
    assert e.value.message == f"{where}: failures[0].severity: expected one of error, warning, " \
                              "got 'fatal'"


def test_a_layer_without_the_file_is_passed_over_and_none_with_it_is_said(tmp_path):
    lower = _write(tmp_path / "catalog", GOOD)
    empty = tmp_path / "project"
    empty.mkdir()
    assert load_failures([lower, empty]) == load_failures(lower)
    with pytest.raises(InputError) as e:
        load_failures([empty, tmp_path / "nowhere"])
    assert "failure fingerprints" in e.value.message and str(empty) in e.value.message, \
        e.value.message


def test_a_placeholder_is_named_as_written():
    for written in ("{name!r}", "{name:>5}", "{}", "{0}", "{a.b}", "{x[0]}"):
        with pytest.raises(ValueError) as e:
            failures._fields(f"a {written} b")
        assert str(e.value) == written
    assert failures._fields("{{literal}} {a} and {b_2}") == ["a", "b_2"]


def test_the_plain_wording_keeps_each_segments_fallback():
    assert failures._without("run [[`x {a}`||try {b}]] now [[with {c}]]") == "run try {b} now "
    assert failures._segments("[[one {a}||two]] [[three {b}]]") == \
        [("one {a}", "two"), ("three {b}", "")]


def test_an_unquoted_on_key_is_refused_with_the_yaml_rule_that_made_it_true(tmp_path):
    text = yaml.safe_dump(GOOD, sort_keys=False).replace(
        "at: widgets/core.py:10", "at: widgets/core.py:10\n    on: x")
    assert "\n    on: x" in text
    (tmp_path / "checks").mkdir()
    (tmp_path / "checks" / "failures.yaml").write_text(text)
    with pytest.raises(SpecError) as e:
        load_failures(tmp_path)
    assert e.value.message == (f"{tmp_path.name}/checks/failures.yaml: failures[0].sources[0].True: "
                               "expected one of the known keys: at, in, got 'unknown key True'")
    assert e.value.hint == ("YAML reads a key written on, off, yes or no without quotes as true "
                            "or false: put the key in quotes")
