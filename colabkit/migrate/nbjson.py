"""Read a notebook's JSON and write back changed cell sources without touching any other byte.

The new text is the original text with only the JSON values of the changed ``cells[i].source`` replaced, each
rendered in the style the file already uses (a string or a list of lines; indentation, separators and line
breaks copied from the original list; ``\\uXXXX`` escapes or raw UTF-8 as the file has them; lines that did not
change keep their exact original JSON text). Key order, indentation, metadata Colab or any other tool wrote,
outputs and ``nbformat_minor`` are therefore byte-for-byte what they were.
"""
from __future__ import annotations

import json
import re
from json.decoder import scanstring

_WS = re.compile(r"[ \t\n\r]*")
_DECODER = json.JSONDecoder()
BOM = "\ufeff"


class NotebookFormatError(ValueError):
    """The text is not JSON, or not an nbformat 4 notebook colabkit can rewrite."""


def parse(text: str) -> dict:
    """The notebook as Python data; NotebookFormatError with a clear message for anything else."""
    body = text[1:] if text.startswith(BOM) else text
    try:
        notebook = json.loads(body)
    except json.JSONDecodeError as exc:
        raise NotebookFormatError(f"not JSON ({exc.msg} at line {exc.lineno} column {exc.colno}); "
                                  f"a notebook file (.ipynb) is a JSON document") from None
    except RecursionError:  # the decoder's depth is bounded by the recursion limit: it stops, memory stays small
        raise NotebookFormatError("not a notebook colabkit can read: its JSON is nested deeper than Python's json "
                                  "module reads (a notebook nests a few levels)") from None
    if not isinstance(notebook, dict) or "nbformat" not in notebook:
        raise NotebookFormatError("not a Jupyter notebook: expected a JSON object with 'nbformat', 'metadata' "
                                  "and 'cells'")
    major = notebook.get("nbformat")
    if not isinstance(major, int) or isinstance(major, bool):
        raise NotebookFormatError(f"not a Jupyter notebook: 'nbformat' is {major!r}, expected a whole number")
    if major < 4:
        raise NotebookFormatError(
            f"nbformat {major} notebook (the pre-2015 format); colabkit migrate reads nbformat 4. Convert it "
            f"first: jupyter nbconvert --to notebook --nbformat 4 --output NEW.ipynb OLD.ipynb")
    if major > 4:
        raise NotebookFormatError(f"nbformat {major} notebook; this colabkit understands nbformat 4 only")
    cells = notebook.get("cells")
    if not isinstance(cells, list):
        raise NotebookFormatError("not a valid nbformat 4 notebook: 'cells' is missing or not a list")
    for number, cell in enumerate(cells, 1):
        if not isinstance(cell, dict) or not isinstance(cell.get("cell_type"), str):
            raise NotebookFormatError(f"not a valid nbformat 4 notebook: cell {number} has no 'cell_type'")
        source = cell.get("source")
        if not (isinstance(source, str) or (isinstance(source, list) and all(isinstance(s, str) for s in source))):
            raise NotebookFormatError(f"not a valid nbformat 4 notebook: the 'source' of cell {number} is not "
                                      f"text or a list of lines")
    return notebook


def source_text(cell: dict) -> str:
    source = cell.get("source", "")
    return source if isinstance(source, str) else "".join(source)


def split_lines(text: str) -> list:
    """Lines with their "\\n" (the last one may lack it), as notebooks store them."""
    if not text:
        return []
    parts = text.split("\n")
    lines = [part + "\n" for part in parts[:-1]]
    if parts[-1]:
        lines.append(parts[-1])
    return lines


def _skip_ws(text, i):
    return _WS.match(text, i).end()


def source_spans(text: str) -> dict:
    """{cell index: (start, end)} of each ``cells[i].source`` value in ``text`` (character offsets)."""
    i = _skip_ws(text, 1 if text.startswith(BOM) else 0)
    if text[i:i + 1] != "{":
        raise NotebookFormatError("not a JSON object")
    spans = {}
    i = _skip_ws(text, i + 1)
    while text[i] != "}":
        key, i = scanstring(text, i + 1)
        i = _skip_ws(text, _skip_ws(text, i) + 1)  # past ':'
        if key == "cells":
            i = _cells(text, i, spans)
        else:
            _, i = _DECODER.raw_decode(text, i)
        i = _skip_ws(text, i)
        if text[i] == ",":
            i = _skip_ws(text, i + 1)
    return spans


def _cells(text, i, spans):
    i = _skip_ws(text, i + 1)  # past '['
    index = 0
    while text[i] != "]":
        i = _skip_ws(text, i + 1)  # past '{'
        while text[i] != "}":
            key, i = scanstring(text, i + 1)
            i = _skip_ws(text, _skip_ws(text, i) + 1)
            start = i
            _, i = _DECODER.raw_decode(text, i)
            if key == "source":
                spans[index] = (start, i)
            i = _skip_ws(text, i)
            if text[i] == ",":
                i = _skip_ws(text, i + 1)
        index += 1
        i = _skip_ws(text, i + 1)
        if text[i] == ",":
            i = _skip_ws(text, i + 1)
    return i + 1


def _items(span_text):
    """[(start, end, decoded)] of the strings in a JSON list's text."""
    items, i = [], _skip_ws(span_text, 1)
    while span_text[i] != "]":
        value, end = scanstring(span_text, i + 1)
        items.append((i, end, value))
        i = _skip_ws(span_text, end)
        if span_text[i] == ",":
            i = _skip_ws(span_text, i + 1)
    return items


def _indent_unit(text: str) -> str:
    match = re.match(r"\ufeff?\{[ \t]*\r?\n([ \t]+)", text)
    return match.group(1) if match else " "


def render_source(text: str, span: tuple, new_source: str) -> str:
    """The JSON text for ``new_source`` in the style of the original value at ``span``."""
    start, end = span
    original = text[start:end]
    # Raw UTF-8 in the original value: keep raw. All ASCII: any non-ASCII character of the new text came from
    # this value, where it was written as a \uXXXX escape, so escape again.
    ensure_ascii = original.isascii()

    def dump(s):
        return json.dumps(s, ensure_ascii=ensure_ascii)

    if original.startswith('"'):
        return dump(new_source)
    items = _items(original)
    known = {}
    for item_start, item_end, value in items:
        known.setdefault(value, original[item_start:item_end])
    newline = "\r\n" if "\r\n" in text[:2000] else "\n"
    if len(items) >= 2:
        opening = original[1:items[0][0]]
        separator = original[items[0][1]:items[1][0]]
        closing = original[items[-1][1]:-1]
    elif len(items) == 1 and "\n" in original[1:items[0][0]]:
        opening = original[1:items[0][0]]
        separator = "," + opening
        closing = original[items[0][1]:-1]
    elif "\n" not in text.strip():  # a file on one line (json.dumps without indent)
        opening = closing = ""
        separator = ", " if '": ' in text else ","
    else:
        line_start = text.rfind("\n", 0, start) + 1
        key_indent = re.match(r"[ \t]*", text[line_start:start]).group(0)
        opening = newline + key_indent + _indent_unit(text)
        separator = "," + opening
        closing = newline + key_indent
    lines = split_lines(new_source)
    if not lines:
        return "[]"
    return "[" + opening + separator.join(known.get(line) or dump(line) for line in lines) + closing + "]"


def replace_sources(text: str, new_sources: dict) -> str:
    """``text`` with the source of each cell index in ``new_sources`` replaced, nothing else changed."""
    if not new_sources:
        return text
    spans = source_spans(text)
    pieces, last = [], 0
    for index in sorted(new_sources):
        if index not in spans:
            raise NotebookFormatError(f"cell {index + 1} has no 'source' to replace")
        start, end = spans[index]
        pieces.append(text[last:start])
        pieces.append(render_source(text, spans[index], new_sources[index]))
        last = end
    pieces.append(text[last:])
    return "".join(pieces)


def cell_spans(text: str) -> list:
    """(start, end) of each cell object of ``cells`` in ``text`` (character offsets)."""
    i = _skip_ws(text, 1 if text.startswith(BOM) else 0)
    if text[i:i + 1] != "{":
        raise NotebookFormatError("not a JSON object")
    i = _skip_ws(text, i + 1)
    while text[i] != "}":
        key, i = scanstring(text, i + 1)
        i = _skip_ws(text, _skip_ws(text, i) + 1)
        if key == "cells":
            spans = []
            i = _skip_ws(text, i + 1)
            while text[i] != "]":
                start = i
                _, i = _DECODER.raw_decode(text, i)
                spans.append((start, i))
                i = _skip_ws(text, i)
                if text[i] == ",":
                    i = _skip_ws(text, i + 1)
            return spans
        _, i = _DECODER.raw_decode(text, i)
        i = _skip_ws(text, i)
        if text[i] == ",":
            i = _skip_ws(text, i + 1)
    raise NotebookFormatError("not a valid nbformat 4 notebook: 'cells' is missing")


def insert_code_cell(text: str, index: int, source: str, cell_id: str) -> str:
    """``text`` with a new code cell holding ``source`` inserted before cell ``index``; every other byte unchanged.

    The new cell copies the layout of the cell it goes before: its key order, its indentation, its separators,
    a source stored as a string or as a list of lines, and where it keeps its id (Colab: ``metadata.id``; nbformat
    4.5: an ``id`` key); ``cell_id`` is used, with a number added if the notebook already has it."""
    notebook = parse(text)
    spans = cell_spans(text)
    if not spans:
        raise NotebookFormatError("the notebook has no cell to put a new cell before")
    index = min(index, len(spans) - 1)
    template = notebook["cells"][index]
    taken = {str(c.get("id")) for c in notebook["cells"]} | \
        {str((c.get("metadata") or {}).get("id")) for c in notebook["cells"] if isinstance(c.get("metadata"), dict)}
    unique, number = cell_id, 1
    while unique in taken:
        number += 1
        unique = f"{cell_id}-{number}"
    has_meta_id = isinstance(template.get("metadata"), dict) and "id" in template["metadata"]
    values = {"cell_type": "code", "execution_count": None, "metadata": {"id": unique} if has_meta_id else {},
              "outputs": [], "id": unique,
              "source": source if isinstance(template.get("source"), str) else split_lines(source)}
    keys = [k for k in template if k in values]
    keys += [k for k in ("cell_type", "metadata", "source", "outputs", "execution_count") if k not in keys]
    if "id" in template and "id" not in keys:
        keys.append("id")
    cell = {key: values[key] for key in keys}
    start, _ = spans[index]
    newline = "\r\n" if "\r\n" in text[:2000] else "\n"
    ensure_ascii = text.isascii()
    before = text[:start]
    gap = before[len(before.rstrip(" \t\r\n")):]  # the whitespace between '[' (or ',') and the cell
    if "\n" not in text.strip():
        rendered = json.dumps(cell, ensure_ascii=ensure_ascii,
                              separators=(", ", ": ") if '": ' in text else (",", ":"))
    else:
        indent = gap[gap.rfind("\n") + 1:] if "\n" in gap else ""
        rendered = json.dumps(cell, ensure_ascii=ensure_ascii, indent=_indent_unit(text))
        rendered = rendered.replace("\n", newline + indent)
    return before + rendered + "," + gap + text[start:]
