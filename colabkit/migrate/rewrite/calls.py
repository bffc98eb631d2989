"""Calls of google.colab functions: drive.mount and friends -> colabkit's portable ones; Colab-only ones guarded."""
from __future__ import annotations

import ast

from .. import rules as R
from .colab import qualname


def call(ctx, work, node):
    """One call: a function in ``R.CALLS`` is replaced by its colabkit equivalent (CK101, CK105, CK302-306); a
    statement that is only a call in ``R.GUARD_CALLS`` goes under ``if colabkit.on_colab():`` (CK308)."""
    qual, _ = qualname(ctx, node.func)
    if qual is None or work.is_guarded(work.start(node)):
        return
    if qual in R.CALLS:
        code, replacement = R.CALLS[qual]
        if not ctx.on(code):
            return
        work.handled.add(node.func)
        work.consumed.add(node.func)
        func_text = work.text(work.start(node.func), work.end(node.func))
        message = f"{func_text}(...) -> {replacement}(...)"
        manual = None
        if code == "CK304":
            key = node.args[0].value if node.args and isinstance(node.args[0], ast.Constant) else None
            manual = (f"set the environment variable {key} on this machine" if isinstance(key, str)
                      else R.BY_CODE[code].manual)
        found = work.finding(code, node.lineno - 1, message, True, manual)
        work.edit(work.start(node.func), work.end(node.func), replacement, found)
        if code == "CK101":
            _drop_mountpoint(work, node, found)
    elif qual in R.GUARD_CALLS and ctx.on("CK308"):
        work.handled.add(node.func)
        stmt = work.parents.get(node)
        if isinstance(stmt, ast.Expr) and work.owns_lines(stmt):
            found = work.finding("CK308", stmt.lineno - 1, f"{qual}() runs only on Colab", True)
            guard_statement(ctx, work, stmt, found)
        else:
            work.finding("CK308", node.lineno - 1, f"{qual}() runs only on Colab, but its value is used or it "
                         f"shares its line", False, "put it under 'if colabkit.on_colab():' by hand")


def _drop_mountpoint(work, call, found):
    """drive.mount('/content/drive') -> colabkit.mount_drive(): the Colab mount point is colabkit's default."""
    for argument in list(call.args[:1]) + [k.value for k in call.keywords if k.arg == "mountpoint"]:
        if isinstance(argument, ast.Constant):
            work.handled.add(argument)  # the mount point is the call's business, not a path to rewrite
    target = None
    if len(call.args) == 1 and not isinstance(call.args[0], ast.Starred):
        target = call.args[0]
    else:
        target = next((k for k in call.keywords if k.arg == "mountpoint"), None)
    value = target.value if isinstance(target, ast.keyword) else target
    if not (isinstance(value, ast.Constant) and value.value in R.COLAB_MOUNTPOINTS):
        return
    items = sorted(list(call.args) + list(call.keywords), key=lambda n: (n.lineno, n.col_offset))
    position = items.index(target)
    if position + 1 < len(items):
        end = work.start(items[position + 1])
    else:
        end = work.end(call)
        end = (end[0], end[1] - 1)  # up to the closing parenthesis
    work.edit(work.start(target), end, "", found)
    found.message += " (the Colab mount point is colabkit's default)"


def guard_statement(ctx, work, stmt, found, statements=None):
    """Put ``stmt`` (alone on its lines) under 'if colabkit.on_colab():'; ``statements``: consecutive statements of
    one block, from ``stmt`` on, that go under the same 'if'."""
    statements = statements or [stmt]
    (l0, c0), (l1, _) = work.start(statements[0]), work.end(statements[-1])
    indent = work.lines[l0][:c0]
    work.edit((l0, 0), (l0, 0), f"{indent}if colabkit.on_colab():\n", found, order=6)
    inside = set().union(*(_lines_inside_strings(s) for s in statements))
    for line in range(l0, l1 + 1):
        if line not in inside and work.lines[line].strip():
            work.edit((line, 0), (line, 0), ctx.unit, found, order=7)


def _lines_inside_strings(stmt) -> set:
    """0-based lines of ``stmt`` that begin inside a multi-line string (re-indenting them would change it)."""
    inside = set()
    for node in ast.walk(stmt):
        if isinstance(node, (ast.Constant, ast.JoinedStr)) and getattr(node, "end_lineno", None) and \
                node.end_lineno > node.lineno:
            inside.update(range(node.lineno, node.end_lineno))  # 0-based lines after the first
    return inside
