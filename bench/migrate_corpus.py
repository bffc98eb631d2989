"""colabkit migrate over a folder of real notebooks: does it leave anything Colab-only behind?

    python bench/migrate_corpus.py DIR [--json OUT.json] [-v]

For every ``*.ipynb`` under DIR, migrate it in memory (colabkit.migrate.migrate_text: nothing is written, notebook
code is never run) and check, independently of the rewriter's own bookkeeping:

- ok:        migrate returned a notebook (no exception, valid JSON out);
- changed:   how many cells changed;
- left:      Colab-only paths ('/content...', '/gdrive', 'drive/MyDrive', 'My Drive' under a mount point) still
             in strings of the code, google.colab and condacolab imports not under a Colab guard, and reads of
             os.environ['COLAB_...'] (set only on Colab) outside such a guard, after migration. Code means
             what IPython runs: each cell is put through IPython's TransformerManager (so '!cmd' and '%magic' lines
             count, as the strings IPython passes on) and parsed; comments and docstrings do not count, nor do the
             notebook's own Colab branches (an ``if`` whose test names something with "colab" in it, e.g.
             ``if IN_COLAB:`` / ``if colabkit.on_colab():``, and a ``try:`` whose body imports google.colab).
             Each leftover is one of: *mapped* (a form field's literal followed by ``x = colabkit.portable_path(x)``:
             the form keeps working on Colab and the program never uses the Colab path elsewhere); *shown* (text
             inside print()/logging/an exception message: at home it shows the local path, harmless); *reported*
             (an unapplied finding of migrate's report in that cell names that path: the user is told what to do);
             *silent* (none of these: nothing tells the user). Silent ones are defects;
- idem:      a second migration of the output changes nothing;
- parses:    every cell that IPython could turn into valid Python before still can after;
- sources:   nothing but code-cell sources changed (the JSON with code sources removed is equal), apart from the
             one cell migrate adds to install colabkit (CK003), which is set aside first.

A notebook is clean when ok, idem, parses, sources and no silent leftover all hold. Prints one line per notebook
and a summary; -v adds each leftover. Exit status 0 when every notebook is clean, 1 otherwise.
"""
from __future__ import annotations

import argparse
import ast
import json
import platform
import re
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

# Colab-only places, matched inside string tokens of the code IPython runs.
COLAB_PATH = re.compile(r"(?<![\w.~-])(/content(?=$|[/\s'\"\\;:,)}\]])|/gdrive(?=$|[/\s'\"\\])|"
                        r"(?<![\w/])drive/(?:MyDrive|My\\? Drive)(?=$|[/\s'\"\\]))")


def _transform(source: str):
    from IPython.core.inputtransformer2 import TransformerManager
    try:
        python = TransformerManager().transform_cell(source)
    except Exception:  # noqa: BLE001
        return None, None
    try:
        tree = ast.parse(python)
    except (SyntaxError, ValueError):
        return python, None
    return python, tree


def _guarded_lines(tree) -> set:
    lines = set()
    for node in ast.walk(tree):
        guarded = False
        if isinstance(node, (ast.If, ast.IfExp)):
            guarded = any((isinstance(n, ast.Name) and "colab" in n.id.lower()) or
                          (isinstance(n, ast.Attribute) and "colab" in n.attr.lower()) or
                          (isinstance(n, ast.Constant) and isinstance(n.value, str) and
                           ("google.colab" in n.value or n.value.startswith("COLAB_")))
                          for n in ast.walk(node.test))
        elif isinstance(node, ast.Try):
            guarded = any(_imports_colab(n) for stmt in node.body for n in ast.walk(stmt))
        if guarded:
            lines.update(range(node.lineno, node.end_lineno + 1))
    return lines


def _env_checked_lines(tree) -> set:
    """Lines where a COLAB_ variable is known to be set (under `if 'COLAB_X' in os.environ:`) or its absence is
    caught (`try:` ... `except KeyError:`)."""
    lines = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.If, ast.While)) and any(
                isinstance(n, ast.Constant) and str(n.value).startswith("COLAB_") for n in ast.walk(node.test)):
            lines.update(range(node.body[0].lineno, node.end_lineno + 1))
        elif isinstance(node, ast.Try) and any(h.type is None or "Error" in ast.unparse(h.type) or
                                               "Exception" in ast.unparse(h.type) for h in node.handlers):
            lines.update(range(node.lineno, node.body[-1].end_lineno + 1))
    return lines


def _imports_colab(node) -> bool:
    if isinstance(node, ast.Import):
        return any(a.name == "google.colab" or a.name.startswith("google.colab.") for a in node.names)
    if isinstance(node, ast.ImportFrom) and node.module and not node.level:
        return node.module.startswith("google.colab") or (node.module == "google" and
                                                            any(a.name == "colab" for a in node.names))
    return False


_DISPLAY = frozenset({"print", "display", "Markdown", "HTML", "write", "info", "warning", "warn", "error", "debug",
                      "log", "exception", "critical", "set_description", "set_postfix", "set_title", "title",
                      "xlabel", "ylabel", "suptitle"})


def _parents(tree) -> dict:
    parents = {}
    for parent in ast.walk(tree):
        for child in ast.iter_child_nodes(parent):
            parents[child] = parent
    return parents


def _shown_only(node, parents) -> bool:
    """The string is only shown to the user: inside print()/logging/display or a raised exception's message."""
    current = node
    while current in parents:
        parent = parents[current]
        if isinstance(parent, ast.Call) and current is not parent.func:
            func = parent.func
            name = func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else ""
            if name in _DISPLAY or name.endswith(("Error", "Exception", "Warning")):
                return True
        if isinstance(parent, (ast.Raise, ast.Assert)):
            return True
        if isinstance(parent, ast.stmt):
            return False
        current = parent
    return False


def _mapped_form_fields(tree) -> set:
    """Constants of 'x = "/content/..."' statements followed by 'x = colabkit.portable_path(x)': the form keeps its
    literal and the next line maps it, so the program never uses the Colab path off Colab."""
    mapped = set()
    for node in ast.walk(tree):
        for field in ("body", "orelse", "finalbody"):
            block = getattr(node, field, None)
            if not isinstance(block, list):
                continue
            for stmt, following in zip(block, block[1:]):
                if not (isinstance(stmt, ast.Assign) and len(stmt.targets) == 1 and
                        isinstance(stmt.targets[0], ast.Name) and isinstance(stmt.value, ast.Constant)):
                    continue
                name = stmt.targets[0].id
                call = getattr(following, "value", None)
                if isinstance(following, ast.Assign) and isinstance(call, ast.Call) and \
                        ast.unparse(call.func) == "colabkit.portable_path" and \
                        [ast.unparse(a) for a in call.args] == [name] and \
                        [ast.unparse(t) for t in following.targets] == [name]:
                    mapped.add(stmt.value)
    return mapped


# Cell magics whose body IPython runs as Python: the body is checked as code, not as one string.
_PYTHON_CELL_MAGIC = re.compile(r"\A(?:[ \t]*(?:#[^\n]*)?\n)*%%(?:capture|time|timeit|prun)\b[^\n]*(?:\n|\Z)")
# 'ln -s <Colab path> /name' (a link at the filesystem root): /name/... stands for that Colab path.
_ROOT_LINK = re.compile(r"\bln\s+(?:-\w+\s+)*-\w*s\w*\s+(?:-\w+\s+)*(?:\S|\\ )+\s+['\"]?(/[\w.-]+)/?['\"]?\s*$", re.M)


def root_links(sources) -> list:
    """The links a notebook makes at the filesystem root to a Colab path (``!ln -s /content/gdrive/My\\ Drive/
    /mydrive``): paths through them are Colab-only too."""
    links = set()
    for source in sources:
        for match in _ROOT_LINK.finditer(source):
            line = source[source.rfind("\n", 0, match.start()) + 1:match.end()]
            if COLAB_PATH.search(line[:line.rfind(match.group(1))]) and match.group(1) not in ("/content", "/gdrive"):
                links.add(match.group(1))
    return sorted(links)


def leftovers(source: str, links=()) -> list:
    """(kind, what, path) for each Colab-only path or unguarded google.colab import left in one code cell. kind:
    "left" (the program uses it), "shown" (only printed), "mapped" (a form field mapped on the next line).
    ``links``: the notebook's root links to Colab paths (root_links), whose paths count as Colab paths."""
    magic = _PYTHON_CELL_MAGIC.match(source)
    if magic:  # %%capture / %%time ...: IPython runs the rest of the cell as Python
        return leftovers("\n" * source[:magic.end()].count("\n") + source[magic.end():], links)
    colab_path = COLAB_PATH if not links else re.compile(
        COLAB_PATH.pattern + "|" + "|".join(rf"(?<![\w.~/-]){re.escape(link)}(?=$|[/\s'\"\\])" for link in links))
    _, tree = _transform(source)
    if tree is None:
        return []
    guarded = _guarded_lines(tree)
    env_checked = guarded | _env_checked_lines(tree)
    parents = _parents(tree)
    mapped = _mapped_form_fields(tree)
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and node.lineno not in guarded:
            if isinstance(parents.get(node), ast.Expr):
                continue  # a docstring or a bare string: not used
            match = colab_path.search(node.value)
            if match is None:
                continue
            path = re.split(r"[\s'\",;:]", node.value[match.start():])[0][:60]
            kind = "mapped" if node in mapped else "shown" if _shown_only(node, parents) else "left"
            found.append((kind, f"line {node.lineno}: {node.value.strip()[:100]!r}", path))
        elif _imports_colab(node) and node.lineno not in guarded:
            found.append(("left", f"line {node.lineno}: unguarded google.colab import", "google.colab"))
        elif isinstance(node, ast.Import) and any(a.name == "condacolab" for a in node.names) and \
                node.lineno not in guarded:
            found.append(("left", f"line {node.lineno}: unguarded import condacolab (Colab only)", "condacolab"))
        elif isinstance(node, ast.Subscript) and isinstance(node.ctx, ast.Load) and \
                ast.unparse(node.value) in ("os.environ", "environ") and isinstance(node.slice, ast.Constant) and \
                str(node.slice.value).startswith("COLAB_") and node.lineno not in env_checked:
            found.append(("left", f"line {node.lineno}: {ast.unparse(node)} (set only on Colab)", node.slice.value))
    return found


def _sources(cell) -> str:
    source = cell.get("source", "")
    return "".join(source) if isinstance(source, list) else source


def _without_code_sources(notebook) -> dict:
    copy = json.loads(json.dumps(notebook))
    for cell in copy.get("cells", []):
        if cell.get("cell_type") == "code":
            cell["source"] = None
    return copy


def check(path: Path) -> dict:
    from colabkit.migrate import migrate_text
    from colabkit.migrate.report import NotebookReport
    text = path.read_bytes().decode("utf-8")
    row = {"notebook": path.name, "ok": False, "changed": 0, "reported": [], "silent": [], "shown": [],
           "mapped": [], "idem": False, "added_cells": 0,
           "parses": False, "sources": False, "by_hand": [], "error": None}
    try:
        started = time.perf_counter()
        new_text, findings, changes = migrate_text(text)
        row["seconds"] = time.perf_counter() - started
        before, after = json.loads(text), json.loads(new_text)
        # the cell migrate adds to install colabkit (CK003): set aside, so cell i of each is the same cell
        added = {c.cell for c in changes if c.new}
        row["added_cells"] = len(added)
        after["cells"] = [cell for i, cell in enumerate(after["cells"]) if i not in added]
    except Exception as exc:  # noqa: BLE001 - a crash is what this bench is here to find
        row["error"] = f"{type(exc).__name__}: {exc}"
        return row
    row["ok"] = True
    row["changed"] = sum(not c.new for c in changes)
    report = NotebookReport(path=path.name, status="migrated", findings=findings, changes=changes)
    row["by_hand"] = report.manual_steps
    notes = {}
    for f in findings:
        if not f.applied:
            notes.setdefault(f.cell, []).append(f.message + "\n" + "\n".join(f.before or []))
    links = root_links(_sources(c) for c in before["cells"] if c.get("cell_type") == "code")
    for index, cell in enumerate(after["cells"]):
        if cell.get("cell_type") != "code":
            continue
        for kind, what, path in leftovers(_sources(cell), links):
            entry = f"cell {index + 1} {what}"
            if kind != "left":
                row[kind].append(entry)
            elif any(path in note for note in notes.get(index, [])):
                row["reported"].append(entry)  # migrate's report names this path in this cell
            else:
                row["silent"].append(entry)
    twice, _, again = migrate_text(new_text)
    row["idem"] = twice == new_text and not again
    row["parses"] = all(_transform(_sources(a))[1] is not None or _transform(_sources(b))[1] is None
                        for b, a in zip(before["cells"], after["cells"]) if a.get("cell_type") == "code")
    row["sources"] = _without_code_sources(before) == _without_code_sources(after)
    return row


def clean(row) -> bool:
    return row["ok"] and row["idem"] and row["parses"] and row["sources"] and not row["silent"]


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("dir")
    parser.add_argument("--json", metavar="OUT")
    parser.add_argument("-v", "--verbose", action="store_true")
    args = parser.parse_args(argv)
    paths = sorted(Path(args.dir).rglob("*.ipynb"))
    if not paths:
        print(f"no notebooks under {args.dir}", file=sys.stderr)
        return 2
    rows = [check(p) for p in paths]
    for row in rows:
        flags = "clean" if clean(row) else "NOT CLEAN"
        print(f"{flags:9}  {row['notebook'][:80]:80}  changed {row['changed']:3}  silent {len(row['silent']):2}  "
              f"reported {len(row['reported']):2}  idem {'y' if row['idem'] else 'N'}  "
              f"parses {'y' if row['parses'] else 'N'}  sources-only {'y' if row['sources'] else 'N'}"
              + (f"  error {row['error']}" if row["error"] else ""))
        if args.verbose:
            for entry in row["silent"]:
                print(f"      silent:   {entry}")
            for entry in row["reported"]:
                print(f"      reported: {entry}")
            for entry in row["shown"]:
                print(f"      shown:    {entry}")
    n = len(rows)
    print()
    print(f"machine: {platform.platform()}, Python {platform.python_version()}")
    print(f"notebooks: {n}; clean: {sum(map(clean, rows))} ({100 * sum(map(clean, rows)) / n:.0f}%)")
    print(f"  migrated without error: {sum(r['ok'] for r in rows)}; changed: {sum(r['changed'] > 0 for r in rows)} "
          f"({sum(r['changed'] for r in rows)} cells)")
    print(f"  with silent leftovers: {sum(bool(r['silent']) for r in rows)} "
          f"({sum(len(r['silent']) for r in rows)} places); with reported leftovers: "
          f"{sum(bool(r['reported']) for r in rows)} ({sum(len(r['reported']) for r in rows)} places)")
    print(f"  left in text that is only shown (print, messages): {sum(len(r['shown']) for r in rows)} places; "
          f"form fields kept and mapped on the next line: {sum(len(r['mapped']) for r in rows)}")
    print(f"  second run a no-op: {sum(r['idem'] for r in rows)}; every cell parses: {sum(r['parses'] for r in rows)}; "
          f"only code sources changed: {sum(r['sources'] for r in rows)}")
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1), encoding="utf-8")
    return 0 if all(map(clean, rows)) else 1


if __name__ == "__main__":
    sys.exit(main())
