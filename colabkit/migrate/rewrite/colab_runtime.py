"""What only Colab's runtime has: the condacolab installer (CK311) and environment variables only Colab sets (CK312).

condacolab installs Miniforge into Colab's own Python and restarts the runtime; off Colab ``import condacolab``
itself raises ("This module must ONLY run as part of a Colab notebook"). Its statements (the import, the
``condacolab.install()`` / ``.check()`` calls) run only on Colab; at home the notebook runs in a conda environment
the user starts Jupyter from, which the report says.

``os.environ['COLAB_TPU_ADDR']`` (COLAB_GPU, COLAB_RELEASE_TAG, ...) raises KeyError wherever Colab did not set it.
What the value is needed for is the notebook's business, so such a read is reported with the read that does not
raise (``os.environ.get('COLAB_TPU_ADDR')``, None off Colab). Reads already under a test of that variable or of
Colab (``if 'COLAB_TPU_ADDR' in os.environ:``), inside ``try`` blocks that catch KeyError, and ``.get`` /
``os.getenv`` reads are fine as they are.
"""
from __future__ import annotations

import ast

from .calls import guard_statement
from .colab import dotted

CONDACOLAB_MANUAL = ("condacolab installs conda into Colab's Python and restarts the runtime; on this machine start "
                     "Jupyter from a conda (or mamba) environment that has the packages this notebook installs with "
                     "conda or mamba")
_ENVIRON = frozenset({"os.environ", "environ"})
_KEY_ERRORS = frozenset({"KeyError", "LookupError", "Exception", "BaseException"})


def collect(ctx, works):
    """The names bound to condacolab anywhere in the notebook (``import condacolab as cc``)."""
    for work in works:
        if work.code.tree is None or work.code.problem is not None or "condacolab" not in work.source:
            continue
        for node in ast.walk(work.code.tree):
            if isinstance(node, ast.Import):
                ctx.condacolab.update(a.asname or a.name for a in node.names if a.name == "condacolab")
            elif isinstance(node, ast.ImportFrom) and node.module == "condacolab" and not node.level:
                ctx.condacolab.update(a.asname or a.name for a in node.names)


def condacolab(ctx, work, tree):
    """Statements that import condacolab or call it: under 'if colabkit.on_colab():', consecutive ones together."""
    if not ctx.condacolab or not ctx.on("CK311"):
        return
    runs, current = [], None
    for node in ast.walk(tree):
        for field in ("body", "orelse", "finalbody"):
            block = getattr(node, field, None)
            if not isinstance(block, list):
                continue
            for index, stmt in enumerate(block):
                if not _is_condacolab(ctx, stmt) or work.is_guarded(work.start(stmt)):
                    current = None
                    continue
                if current is not None and current[0] is block and current[2] == index - 1:
                    current[1].append(stmt)
                    current[2] = index
                else:
                    current = [block, [stmt], index]
                    runs.append(current)
            current = None
    for _, statements, _ in runs:
        first = statements[0]
        if not all(work.owns_lines(s) for s in statements):
            work.finding("CK311", first.lineno - 1, "condacolab works only on Colab, but this statement shares its "
                         "line", False, "put it under 'if colabkit.on_colab():' by hand; " + CONDACOLAB_MANUAL)
            continue
        found = work.finding("CK311", first.lineno - 1, "condacolab (installs conda into Colab's Python, restarts "
                             "the runtime) runs only on Colab", True, CONDACOLAB_MANUAL)
        for stmt in statements:
            for inner in ast.walk(stmt):
                work.handled.add(inner)
        guard_statement(ctx, work, first, found, statements)
    reported = set()
    for node in ast.walk(tree):  # condacolab used some other way: its name is not there off Colab
        if isinstance(node, ast.Name) and node.id in ctx.condacolab and isinstance(node.ctx, ast.Load) and \
                node not in work.handled and not work.is_guarded(work.start(node)) and node.lineno not in reported:
            reported.add(node.lineno)
            work.finding("CK311", node.lineno - 1, f"{node.id} (condacolab) is used here, but it works only on "
                         f"Colab", False, "put this under 'if colabkit.on_colab():' by hand; " + CONDACOLAB_MANUAL)


def _is_condacolab(ctx, stmt) -> bool:
    if isinstance(stmt, ast.Import):
        return all(a.name == "condacolab" for a in stmt.names)
    if isinstance(stmt, ast.ImportFrom):
        return stmt.module == "condacolab" and not stmt.level
    if isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Call):
        func = stmt.value.func
        while isinstance(func, ast.Attribute):
            func = func.value
        return isinstance(func, ast.Name) and func.id in ctx.condacolab
    return False


def colab_env(ctx, work, tree):
    """os.environ['COLAB_...'] read where nothing makes sure Colab set it (CK312)."""
    if not ctx.on("CK312") or "COLAB_" not in work.source:
        return
    for node in ast.walk(tree):
        if not (isinstance(node, ast.Subscript) and isinstance(node.ctx, ast.Load) and dotted(node.value) in _ENVIRON
                and isinstance(node.slice, ast.Constant) and isinstance(node.slice.value, str)
                and node.slice.value.startswith("COLAB_")):
            continue
        if node.lineno - 1 in work.escape_lines or _protected(work, node):
            continue
        name = node.slice.value
        segment = work.text(work.start(node), work.end(node))
        work.finding("CK312", node.lineno - 1, f"{segment}: only Colab sets {name}; elsewhere this raises KeyError",
                     False, f"read it with os.environ.get({name!r}) (None off Colab) and handle None, or put this "
                            f"under 'if colabkit.on_colab():'")


def _protected(work, node) -> bool:
    """Something around ``node`` already makes sure the variable is there (or catches its absence)."""
    child, parent = node, work.parents.get(node)
    while parent is not None:
        if isinstance(parent, (ast.If, ast.IfExp, ast.While)) and child is not parent.test and \
                _about_colab(parent.test):
            return True
        if isinstance(parent, ast.BoolOp) and isinstance(parent.op, ast.And) and \
                any(_about_colab(v) for v in parent.values[:parent.values.index(child)]):
            return True
        if isinstance(parent, ast.Try) and child in parent.body and any(
                h.type is None or any(dotted(t) in _KEY_ERRORS for t in
                                      (h.type.elts if isinstance(h.type, ast.Tuple) else [h.type]))
                for h in parent.handlers):
            return True
        child, parent = parent, work.parents.get(parent)
    return False


def _about_colab(expr) -> bool:
    for node in ast.walk(expr):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and (
                node.value.startswith("COLAB_") or "google.colab" in node.value):
            return True
        if isinstance(node, ast.Name) and "colab" in node.id.lower():
            return True
        if isinstance(node, ast.Attribute) and "colab" in node.attr.lower():
            return True
    return False
