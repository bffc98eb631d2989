"""Colab forms (#@param, #@title, #@markdown): kept, reported, and Colab paths in form fields mapped portably."""
from __future__ import annotations

import ast
import io
import re
import tokenize
from collections import Counter

FORM = re.compile(r"#\s*@(title|param|markdown)\b")


def forms(ctx, work):
    """One CK401 finding per cell with form comments: they stay (plain comments off Colab)."""
    if not ctx.on("CK401") or "@" not in work.source:
        return
    masked = "".join(work.code.masked or work.lines)
    try:
        comments = [(t.start[0] - 1, t.string) for t in tokenize.generate_tokens(io.StringIO(masked).readline)
                    if t.type == tokenize.COMMENT]
    except (tokenize.TokenError, SyntaxError, IndentationError):
        comments = [(i, line) for i, line in enumerate(work.lines) if FORM.search(line)]
    kinds = Counter(m.group(1) for _, text in comments for m in [FORM.search(text)] if m)
    if kinds:
        first = min(line for line, text in comments if FORM.search(text))
        summary = ", ".join(f"{n} {k}" for k, n in sorted(kinds.items()))
        work.finding("CK401", first, f"Colab form kept ({summary}); plain comments elsewhere", False)


def form_path(ctx, work, node, value):
    """A form field holding a Colab path (CK402): kept as the form shows it, mapped on the next line with
    colabkit.portable_path()."""
    stmt = work.parents.get(node)
    if not (isinstance(stmt, ast.Assign) and stmt.value is node and len(stmt.targets) == 1
            and isinstance(stmt.targets[0], ast.Name) and work.owns_lines(stmt)):
        if ctx.on("CK402"):
            work.finding("CK402", node.lineno - 1, f"form field holds the Colab path {value!r}", False,
                         "map it with colabkit.portable_path(...) where it is used")
        return
    if not ctx.on("CK402"):
        return
    name = stmt.targets[0].id
    mapped = f"{name} = colabkit.portable_path({name})"
    last = stmt.end_lineno - 1
    if last + 1 < len(work.lines) and work.lines[last + 1].strip() == mapped:
        return  # already migrated
    indent = work.lines[stmt.lineno - 1][:work.start(stmt)[1]]
    found = work.finding("CK402", stmt.lineno - 1,
                         f"form field {name} = {value!r} kept; its value is mapped on the next line", True)
    work.edit((last, len(work.content(last))), (last, len(work.content(last))), f"\n{indent}{mapped}", found)
