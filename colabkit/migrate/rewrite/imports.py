"""Imports: google.colab imports replaced by (or kept beside) "import colabkit", which is added before first use."""
from __future__ import annotations

import ast

from .colab import binding, is_colab


def replace_imports(ctx, works):
    """Each unguarded google.colab import -> "import colabkit", keeping under 'if colabkit.on_colab():' the
    names some use still needs (CK301)."""
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
        dedupe = bool(work.imports_colabkit)
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
            parts = []
            if other:
                parts.append(_import_text(node, other))
            top = node in work.code.tree.body
            provides = False
            if not (dedupe and top and not keep):
                parts.append("import colabkit")
                provides = True
            if keep:
                parts.append("if colabkit.on_colab():")
                parts.append(ctx.unit + _import_text(node, keep))
            if parts:
                text = ("\n" + indent).join(parts)
            elif work.only_in_block(node):
                text = "pass"
            else:
                text = None
            kept = ", ".join(a.name for a in keep)
            message = ("google.colab import replaced by import colabkit" if not keep else
                       f"google.colab import kept for Colab only ({kept}: no portable equivalent)")
            found = work.finding("CK301", l0, message, True)
            if text is None:  # another "import colabkit" is already in this cell: drop the whole line(s)
                work.edit((l0, 0), (end[0] + 1, 0) if end[0] + 1 < len(work.lines) else
                          (end[0], len(work.lines[end[0]])), "", found)
            else:
                e = work.edit((l0, c0), end, text, found, provides_import=provides, top_level=top)
                if text == "import colabkit" and not top:
                    e.drop = ((l0, c0), end, "pass") if work.only_in_block(node) else \
                        ((l0, 0), (end[0] + 1, 0) if end[0] + 1 < len(work.lines) else
                         (end[0], len(work.lines[end[0]])), "")
            if provides and top:
                dedupe = True


def ensure_import(works):
    """'import colabkit' at the top of the first cell that uses colabkit before importing it (CK301)."""
    have = False
    for work in works:
        uses = [e.start[0] for e in work.edits if "colabkit." in e.text and not e.provides_import]
        provides = [e.start[0] for e in work.edits if e.provides_import and e.top_level]
        provides += work.imports_colabkit
        if not have and uses and (not provides or min(provides) > min(uses)):
            if work.code.tree is None:  # a cell magic cell (%%writefile): no room for an import
                for e in [e for e in work.edits if "colabkit." in e.text]:
                    work.edits.remove(e)
                    e.finding.applied = False
                    e.finding.manual = "add 'import colabkit' to an earlier cell, then run colabkit migrate again"
                continue
            _, line = work.top_level_statement(min(uses))
            line = min(uses) if line is None else line
            found = work.finding("CK301", line, "import colabkit added before its first use", True)
            work.edit((line, 0), (line, 0), "import colabkit\n", found, order=0)
            have = True
            for e in work.edits:  # a google.colab import nested below now needs no replacement of its own
                if e.drop is not None and e.start[0] >= line:
                    e.start, e.end, e.text = e.drop
                    e.provides_import = False
                    e.finding.message = "google.colab import dropped: colabkit is imported at the top of the cell"
        if provides:
            have = True


def _import_text(node, aliases) -> str:
    names = ", ".join(a.name + (f" as {a.asname}" if a.asname else "") for a in aliases)
    if isinstance(node, ast.Import):
        return f"import {names}"
    return f"from {'.' * node.level}{node.module or ''} import {names}"
