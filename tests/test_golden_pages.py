"""The reviewed pages' own rules (tests/golden/): every folder of pages is made by a test
module that `make golden` walks, and a comparison fails on a changed page and on a reviewed
page nothing makes any more."""

from __future__ import annotations

import importlib

import pytest

from . import golden


def test_every_folder_of_pages_is_walked_by_make_golden():
    folders = {p.name for p in golden.HERE.iterdir() if p.is_dir() and p.name != "__pycache__"}
    walked = {f.name for f in golden.PAGE_FOLDERS}
    assert folders - set(golden.MADE_HERE) == walked, \
        "a folder of pages that `make golden` does not write: add it to golden.PAGE_FOLDERS"


@pytest.mark.parametrize("folder", golden.PAGE_FOLDERS, ids=lambda f: f.name)
def test_each_folder_is_made_and_checked_by_the_module_it_names(folder):
    module = importlib.import_module(folder.maker)
    assert callable(module.pages)
    assert module.GOLDEN == folder  # the module checks the folder make golden writes
    assert golden.page_folder(folder.maker) is folder
    assert folder.recorded(), f"{folder.name}: no reviewed page matches {folder.pattern}"


def _folder(tmp_path, pages: dict[str, str], pattern: str = "*") -> golden.PageFolder:
    for name, text in pages.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    # An absolute name: HERE / name is then the name itself.
    return golden.PageFolder(str(tmp_path), "tests.none", pattern)


def test_the_same_pages_pass(tmp_path):
    _folder(tmp_path, {"a.txt": "one\n", "case/b.txt": "two\n"}, "**/*").check(
        {"a.txt": "one\n", "case/b.txt": "two\n"})


def test_a_changed_page_fails_with_its_diff_and_the_way_out(tmp_path):
    folder = _folder(tmp_path, {"a.txt": "one\n"})
    with pytest.raises(AssertionError) as e:
        folder.check({"a.txt": "uno\n"})
    said = str(e.value)
    assert "-one" in said and "+uno" in said and "`make golden` records them" in said


def test_a_new_page_fails_until_it_is_recorded(tmp_path):
    with pytest.raises(AssertionError, match=r"\+\+\+ .*new\.txt"):
        _folder(tmp_path, {"a.txt": "one\n"}).check({"a.txt": "one\n", "new.txt": "x\n"})


def test_a_reviewed_page_nothing_makes_fails(tmp_path):
    with pytest.raises(AssertionError, match=r"nothing makes any more .*\['gone\.txt'\]"):
        _folder(tmp_path, {"a.txt": "one\n", "gone.txt": "x\n"}).check({"a.txt": "one\n"})


def test_only_the_files_the_pattern_names_are_pages(tmp_path):
    folder = _folder(tmp_path, {"a.txt": "one\n", "notes.md": "not a page\n"}, "*.txt")
    assert folder.recorded() == {"a.txt": "one\n"}


def test_shown_catches_json_a_view_prints_itself_and_heads_stderr():
    import json

    def view(output, doc):
        if output.json:
            print(json.dumps(doc))
        else:
            output.out.print("plain")
            output.err.print("said aside")

    assert json.loads(golden.shown(view, {"a": 1}, as_json=True)) == {"a": 1}
    assert golden.shown(view, {}) == "plain\n"
    assert golden.shown(view, {}, stderr=True) == "plain\n--- stderr ---\nsaid aside\n"
