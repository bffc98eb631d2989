"""Minimal-diff writing: only changed cell sources change, in the file's own JSON style."""
from __future__ import annotations

import json

import pytest

from colabkit.migrate import migrate_text as _migrate_text
from colabkit.migrate.nbjson import (NotebookFormatError, cell_spans, insert_code_cell, parse, render_source,
                                     replace_sources, source_spans)

MOUNT = "from google.colab import drive\ndrive.mount('/content/drive')"
MIGRATED = "import colabkit\ncolabkit.mount_drive()"


def _notebook(source, **dump):
    nb = {"nbformat": 4, "nbformat_minor": 2, "metadata": {"kernelspec": {"name": "python3"}},
          "cells": [{"cell_type": "code", "execution_count": None, "metadata": {"x-unknown": {"keep": [1, 2.50, None]}},
                     "outputs": [], "source": source},
                    {"cell_type": "markdown", "metadata": {}, "source": ["é \\u00e9 \U0001F600"]}]}
    return json.dumps(nb, **dump)


def migrate_text(text):
    """Source rewriting alone: without the install cell (CK003), whose insertion is tested below."""
    return _migrate_text(text, ignore="install-cell")


def _only_source_changed(old, new, index=0):
    spans_old, spans_new = source_spans(old), source_spans(new)
    (a, b), (c, d) = spans_old[index], spans_new[index]
    assert old[:a] == new[:c] and old[b:] == new[d:]


@pytest.mark.parametrize("dump", [dict(indent=1), dict(indent=2), dict(indent=4, sort_keys=True), dict(indent="\t"),
                                  dict(indent=1, ensure_ascii=False), dict()])
def test_list_sources_in_any_layout(dump):
    text = _notebook(MOUNT.splitlines(True), **dump)
    new, _, changes = migrate_text(text)
    assert len(changes) == 1
    _only_source_changed(text, new)
    assert json.loads(new)["cells"][0]["source"] == MIGRATED.splitlines(True)
    if dump.get("indent"):
        # the new list is laid out like the old one: one item per line at the item indentation
        expected = json.dumps({"cells": [{"source": MIGRATED.splitlines(True)}]}, **dump)
        assert json.loads(expected)  # sanity
        item_indent = text[:source_spans(text)[0][1]].rsplit("\n", 2)[-2]
        item_indent = item_indent[:len(item_indent) - len(item_indent.lstrip())]
        assert f'\n{item_indent}"import colabkit\\n",\n{item_indent}"colabkit.mount_drive()"' in new


def test_string_source_stays_a_string():
    text = _notebook(MOUNT, indent=1)
    new, _, _ = migrate_text(text)
    assert json.loads(new)["cells"][0]["source"] == MIGRATED
    _only_source_changed(text, new)


def test_crlf_file_keeps_crlf():
    text = _notebook(MOUNT.splitlines(True), indent=2).replace("\n", "\r\n")
    new, _, _ = migrate_text(text)
    assert "\r\n" in new and "\n" not in new.replace("\r\n", "")
    _only_source_changed(text, new)


def test_bom_and_trailing_newline_kept():
    text = "\ufeff" + _notebook(MOUNT.splitlines(True), indent=1) + "\n"
    new, _, _ = migrate_text(text)
    assert new.startswith("\ufeff{") and new.endswith("}\n")
    _only_source_changed(text, new)


def test_escaped_unicode_stays_escaped_and_raw_stays_raw():
    src = "# caf\u00e9\n" + MOUNT
    escaped = _notebook(src.splitlines(True), indent=1, ensure_ascii=True)
    raw = _notebook(src.splitlines(True), indent=1, ensure_ascii=False)
    new_escaped, _, _ = migrate_text(escaped)
    new_raw, _, _ = migrate_text(raw)
    assert '"# caf\\u00e9\\n"' in new_escaped and new_escaped.isascii()
    assert '"# café\\n"' in new_raw


def test_unchanged_lines_keep_their_exact_json_text():
    # a line written with an unusual but valid escape (\/) keeps it when the cell is rewritten
    text = _notebook(["print('a\\/b')\n", "drive.mount('/content/drive')"], indent=1).replace("a\\\\/b", "a\\/b")
    text = text.replace('"print(', '"from google.colab import drive\\n",\n    "print(')
    assert "a\\/b" in text
    new, _, changes = migrate_text(text)
    assert changes and "a\\/b" in new


def test_empty_and_one_line_lists_get_the_files_indentation():
    text = _notebook([], indent=2)
    span = source_spans(text)[0]
    rendered = render_source(text, span, MIGRATED)
    assert rendered == '[\n        "import colabkit\\n",\n        "colabkit.mount_drive()"\n      ]'
    one = _notebook(["drive.mount('/content/drive')"], indent=2)
    rendered = render_source(one, source_spans(one)[0], MIGRATED)
    assert rendered == '[\n        "import colabkit\\n",\n        "colabkit.mount_drive()"\n      ]'
    compact = _notebook(["x"])
    assert render_source(compact, source_spans(compact)[0], "a\nb") == '["a\\n", "b"]'


def test_numbers_and_unknown_metadata_are_not_reformatted():
    text = _notebook(MOUNT.splitlines(True), indent=1).replace("2.5,", "2.50,")  # json.dumps would write 2.5
    new, _, changes = migrate_text(text)
    assert changes
    assert '"x-unknown": {\n     "keep": [\n      1,\n      2.50,' in new


def test_replace_sources_without_changes_returns_the_same_text():
    text = _notebook(MOUNT)
    assert replace_sources(text, {}) is text


@pytest.mark.parametrize("text, message", [
    ("not json", "not JSON"),
    ("[1, 2]", "not a Jupyter notebook"),
    ('{"cells": []}', "not a Jupyter notebook"),
    ('{"nbformat": "4", "cells": []}', "expected a whole number"),
    ('{"nbformat": 3, "nbformat_minor": 0, "worksheets": []}', "nbformat 3 notebook"),
    ('{"nbformat": 5, "cells": []}', "nbformat 5"),
    ('{"nbformat": 4, "metadata": {}}', "'cells' is missing"),
    ('{"nbformat": 4, "cells": [{"source": "x"}]}', "cell 1 has no 'cell_type'"),
    ('{"nbformat": 4, "cells": [{"cell_type": "code", "source": 5}]}', "the 'source' of cell 1"),
])
def test_what_is_not_a_notebook(text, message):
    with pytest.raises(NotebookFormatError, match=message):
        parse(text)


def test_nbformat_3_message_says_how_to_convert():
    with pytest.raises(NotebookFormatError, match="jupyter nbconvert --to notebook --nbformat 4"):
        parse('{"nbformat": 3, "nbformat_minor": 0, "worksheets": []}')


LAYOUTS = [dict(indent=1), dict(indent=2), dict(indent=4, sort_keys=True), dict(indent="\t"),
           dict(indent=1, ensure_ascii=False), dict(), dict(separators=(",", ":"))]


@pytest.mark.parametrize("dump", LAYOUTS)
@pytest.mark.parametrize("crlf", [False, True])
def test_a_new_cell_is_laid_out_like_its_neighbour_and_nothing_else_moves(dump, crlf):
    text = _notebook(MOUNT.splitlines(True), **dump)
    if crlf and "\n" in text:
        text = text.replace("\n", "\r\n")
    new = insert_code_cell(text, 0, "a = 1\nb = 2", "colabkit-install")
    start, end = cell_spans(new)[0]
    following = cell_spans(new)[1][0]
    assert new[:start] + new[following:] == text  # only the new cell and one separator were added
    cells = json.loads(new)["cells"]
    assert cells[0] == {"cell_type": "code", "execution_count": None, "metadata": {}, "outputs": [],
                        "source": ["a = 1\n", "b = 2"]}
    assert list(cells[0]) == list(json.loads(text)["cells"][0])  # the neighbour's key order
    inserted = new[start:end]
    neighbour = new[following:cell_spans(new)[1][1]]
    if "\n" in text:  # the same indentation for the same keys
        key_indent = neighbour.split('"cell_type"')[0].split("\n")[-1]
        assert f'\n{key_indent}"cell_type": "code"' in inserted
        if crlf:
            assert "\r\n" in inserted and "\n" not in inserted.replace("\r\n", "")
        else:
            assert "\r" not in inserted
    else:
        assert "\n" not in inserted


def test_a_new_cell_takes_a_free_id_where_the_notebook_keeps_ids():
    text = json.dumps({"nbformat": 4, "nbformat_minor": 5, "metadata": {},
                       "cells": [{"cell_type": "code", "execution_count": None, "id": "colabkit-install",
                                  "metadata": {}, "outputs": [], "source": "x"}]}, indent=1)
    new = insert_code_cell(text, 0, "y", "colabkit-install")
    assert [c["id"] for c in json.loads(new)["cells"]] == ["colabkit-install-2", "colabkit-install"]
    assert json.loads(new)["cells"][0]["source"] == "y"  # a string source, like its neighbour
