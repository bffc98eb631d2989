"""The rewriter: Colab-only constructs in a notebook's code cells -> minimal edits of their sources + findings.

Works on cell sources only (strings in, strings out); reading and writing files is ``colabkit.migrate``'s job.
Two passes over the notebook: first every cell is read (IPython's transformer + ``ast``) and the names bound to
``google.colab`` anywhere are collected; then each cell gets its edits, which need that notebook-wide view (an
import in cell 1 is dropped only if no later cell still needs the name it binds).

One module per rule family, each a set of functions taking the shared state (``context``): ``colab`` (names bound
to google.colab, guarded code), ``calls`` (drive.mount and the other Colab functions), ``paths`` (Colab paths in
Python strings), ``mounted`` ("is Drive mounted?" tests), ``links`` (links to Drive at the filesystem root and the
paths through them), ``config_text`` (Colab paths in text written to files), ``colab_runtime`` (condacolab,
COLAB_* variables), ``escapes`` (shell escapes and paths in command lines), ``magics``, ``forms``, ``trainers``
(training the notebook does not write: a training script, a transformers Trainer, an accelerate loop; reported
with the colabkit resume that fits), ``imports`` (each cell imports what it uses); ``edits`` applies what they
decided; ``install`` adds the cell that installs colabkit on a fresh runtime.
"""
from __future__ import annotations

import ast
import re

from .. import rules as R
from ..cells import read_cell
from . import (calls, colab, colab_runtime, config_text, escapes, forms, imports, install, links, magics, paths,
               trainers)
from .context import CellWork, Context, indent_unit
from .edits import CellResult, Finding, apply

__all__ = ["CellResult", "Finding", "Rewriter"]


class Rewriter:
    """Compute the migration of one notebook's code cells."""

    def __init__(self, active=None, drive_root=None, install_from=None):
        self.active = frozenset(R.BY_CODE) if active is None else frozenset(active)
        self.drive_root = drive_root
        self.install_from = install_from

    def run(self, sources: list) -> tuple:
        """``sources``: per cell, its source text, or None for a cell that is not code. Returns (one CellResult per
        code cell, in order; the cells to add, as install.NewCell: the install cell, or none)."""
        works = []
        for index, source in enumerate(sources):
            if source is None:
                continue
            code = read_cell(source, R.PYTHON_CELL_MAGICS)
            works.append(CellWork(index, source, code))
        ctx = Context(self.active, self.drive_root, indent_unit(works), install_from=self.install_from)
        if any("$" in e.arg for w in works for e in w.code.escapes):
            for work in works:
                if work.code.tree is not None and work.code.problem is None:
                    ctx.python_names.update(escapes.bound_names(work.code.tree))
        for work in works:
            if work.code.tree is not None and work.code.problem is None and "colab" in work.source:
                colab.collect_bindings(ctx, work)
        links.collect(ctx, works)
        colab_runtime.collect(ctx, works)
        trainers.collect(ctx, works)
        # A cell that mentions none of these has nothing any rule matches (most cells of a notebook).
        names = "".join(f"|\\b{re.escape(name)}\\b" for name in sorted(ctx.bindings) + trainers.trigger_names(ctx))
        names += "".join(f"|{re.escape(link)}\\b" for link in sorted(ctx.links))
        trigger = re.compile(r"colab|COLAB_|content|drive|@(?:title|param|markdown)" + names)
        for work in works:
            if work.code.problem is not None:
                code, line, message = work.code.problem
                work.finding(code, line - 1, f"cell left unchanged: {message}", False)
                continue
            magics.cell_magic(ctx, work)
            trainers.shell_cell(ctx, work)
            if work.code.tree is None:
                continue
            if not work.code.escapes and not trigger.search(work.source):
                work.inert = True
                continue
            colab.guards(work)
            _python(ctx, work)
            _escapes(ctx, work)
            forms.forms(ctx, work)
        installer, binds = install.existing(works)
        imports.replace_imports(ctx, works)
        # the install cell migrate adds imports colabkit before any other cell runs; so does one it added before
        imports.ensure_import(works, bound=binds or (installer is None and ctx.on("CK003")))
        results = [apply(work) for work in works]
        return results, install.new_cells(ctx, works, results, installer)


def _python(ctx, work):
    """The cell's Python: calls of Colab functions, other uses of google.colab names, Colab paths in strings."""
    tree = work.code.tree
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            calls.call(ctx, work, node)
            if ctx.link_sites:
                links.symlink(ctx, work, node)
    colab.references(ctx, work, tree)
    colab_runtime.condacolab(ctx, work, tree)
    colab_runtime.colab_env(ctx, work, tree)
    config_text.strings(ctx, work, tree)
    paths.strings(ctx, work, tree)
    trainers.trainers(ctx, work, tree)


def _escapes(ctx, work):
    """The cell's line magics and shell escapes, outside code already guarded."""
    for esc in work.code.escapes:
        if work.is_guarded((esc.line, esc.col)):
            continue
        if esc.kind == "magic":
            magics.line_magic(ctx, work, esc)
        elif esc.kind in ("system", "getoutput"):
            escapes.shell(ctx, work, esc)
            trainers.shell(ctx, work, esc)
