"""Imports: google.colab imports replaced by (or kept beside) "import colabkit", and every cell that uses colabkit
importing it itself, at its top level, before the first use.

A cell is often run on its own (the "unzip the dataset" cell a user runs first in a new kernel), so no cell relies
on another cell's import: each cell that calls colabkit gets one ``import colabkit`` of its own, where Python runs
it before any use (not inside an ``if``), and only one: with the cell's leading imports when it has some (above its
code, where linters expect imports), else above its first statement, below leading comments and form titles.
"""
from __future__ import annotations

import ast

from .colab import binding, is_colab

DROPPED = "google.colab import dropped: the cell imports colabkit before its first use"


def replace_imports(ctx, works):
    """Each unguarded google.colab import -> "import colabkit", keeping under 'if colabkit.on_colab():' the
    names some use still needs (CK301). Each such edit also carries the text to write instead when the cell's
    "import colabkit" ends up elsewhere (``Edit.drop``); ``ensure_import`` decides."""
    if not ctx.on("CK301"):
        return
    # A name is still needed if some use of it was not rewritten to colabkit. A use inside code the notebook
    # already runs only on Colab is covered when the notebook also imports that name under such a guard
    # (the "try: from google.colab import drive / except ImportError" idiom).
    guarded_imports = set()
    for work in works:
        if work.code.tree is None or work.code.problem is not None or work.inert:
            continue
        for node in ast.walk(work.code.tree):
            if isinstance(node, (ast.Import, ast.ImportFrom)) and work.is_guarded(work.start(node)):
                guarded_imports.update(binding(node, a) for a in node.names)
    residual = set()
    for work in works:
        for ref in work.refs:
            if ref.guarded and ref.binding in guarded_imports:
                continue
            if ref.node not in work.consumed or ref.guarded:
                residual.add(ref.binding)
    for work in works:
        if work.code.tree is None or work.code.problem is not None or work.inert or "colab" not in work.source:
            continue
        for node in ast.walk(work.code.tree):
            if not isinstance(node, (ast.Import, ast.ImportFrom)) or work.is_guarded(work.start(node)):
                continue
            if node.lineno - 1 in work.escape_lines:
                continue
            colab, other = [], []
            for alias in node.names:
                qual = alias.name if isinstance(node, ast.Import) else f"{node.module}.{alias.name}"
                if isinstance(node, ast.ImportFrom) and node.level:
                    qual = None
                (colab if is_colab(qual) else other).append(alias)
            if not colab:
                continue
            if not work.owns_lines(node):
                work.finding("CK301", node.lineno - 1, "google.colab import shares its line; left as it is",
                             False, "move it to its own line and run colabkit migrate again")
                continue
            keep = [a for a in colab if binding(node, a) in residual]
            (l0, c0), end = work.start(node), work.end(node)
            indent = work.lines[l0][:c0]
            before = [_import_text(node, other)] if other else []
            guard = ["if colabkit.on_colab():", ctx.unit + _import_text(node, keep)] if keep else []
            kept = ", ".join(a.name for a in keep)
            message = ("google.colab import replaced by import colabkit" if not keep else
                       f"google.colab import kept for Colab only ({kept}: no portable equivalent)")
            found = work.finding("CK301", l0, message, True)
            e = work.edit((l0, c0), end, ("\n" + indent).join(before + ["import colabkit"] + guard), found,
                          provides_import=True, top_level=node in work.code.tree.body)
            e.needs_import = bool(keep)
            e.drop = _without_import(work, node, before + guard, indent)


def _without_import(work, node, parts, indent) -> tuple:
    """(start, end, text) for the import once the cell imports colabkit elsewhere: what else it held, else
    'pass' where a block would be left empty, else nothing (the line goes)."""
    start, end = work.start(node), work.end(node)
    if parts:
        return start, end, ("\n" + indent).join(parts)
    if work.only_in_block(node):
        return start, end, "pass"
    last = end[0]
    return (start[0], 0), ((last + 1, 0) if last + 1 < len(work.lines) else (last, len(work.lines[last]))), ""


def ensure_import(works, bound=False):
    """Every cell whose new source calls colabkit imports it once, at the top level, before the first call (CK301).

    bound: colabkit is already imported when the first cell runs (the install cell imports it). Cells that cannot
    hold an import (cell magics such as %%writefile, whose first line IPython expands) rely on an earlier cell's
    import; without one their colabkit edits are withdrawn and reported."""
    for work in works:
        providers = [e for e in work.edits if e.provides_import]
        uses = [e for e in work.edits if "colabkit." in e.text and not e.provides_import]
        if work.code.tree is None:
            if uses and not bound and not providers:
                for e in uses:
                    work.edits.remove(e)
                    if e.finding is not None:
                        e.finding.applied = False
                        e.finding.manual = ("add 'import colabkit' to an earlier cell, then run colabkit migrate "
                                            "again")
            bound = bound or bool(providers)
            continue
        need = [e.start[0] for e in uses] + [e.start[0] for e in providers if not e.top_level and e.needs_import]
        if not need:
            bound = bound or bool(work.imports_colabkit) or any(e.top_level for e in providers)
            continue
        first = min(need)
        first = next((esc.line for esc in work.code.escapes if esc.line <= first <= esc.end_line), first)
        _, line = work.top_level_statement(first)
        line = first if line is None else line
        line = min(line, _after_leading_imports(work, line))
        earlier = [(n, None) for n in work.imports_colabkit if n < line] + \
            [(e.start[0], e) for e in providers if e.top_level and e.start[0] < line]
        anchor = min(earlier, key=lambda item: item[0])[1] if earlier else None
        if not earlier:
            found = work.finding("CK301", line, "import colabkit added before its first use", True)
            work.edit((line, 0), (line, 0), "import colabkit\n", found, order=0)
        for e in providers:
            if e is anchor:
                continue
            e.start, e.end, e.text = e.drop
            e.provides_import = False
            if not e.needs_import:
                e.finding.message = DROPPED
        bound = True


def _after_leading_imports(work, limit) -> int:
    """The first line of the cell's first top-level statement that is not an import, a docstring, a shell line or
    a magic: an import put there sits with the cell's other imports, above its code (where linters expect it),
    and after a "%pip install" that the imports may need."""
    escapes = {esc.line for esc in work.code.escapes}
    for index, node in enumerate(work.code.tree.body):
        if isinstance(node, (ast.Import, ast.ImportFrom)) or node.lineno - 1 in escapes:
            continue  # imports, and shell lines and magics before any code (a "%pip install" the imports need)
        if index == 0 and isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant) and \
                isinstance(node.value.value, str):
            continue
        return min([node.lineno] + [d.lineno for d in getattr(node, "decorator_list", [])]) - 1
    return limit


def _import_text(node, aliases) -> str:
    names = ", ".join(a.name + (f" as {a.asname}" if a.asname else "") for a in aliases)
    if isinstance(node, ast.Import):
        return f"import {names}"
    return f"from {'.' * node.level}{node.module or ''} import {names}"
