"""Names bound to google.colab across the notebook, their uses, and code already guarded to run only on Colab."""
from __future__ import annotations

import ast
import dataclasses

from .. import rules as R


@dataclasses.dataclass
class Ref:
    """A use of a google.colab name."""
    node: ast.AST
    qualname: str
    binding: str
    guarded: bool


def is_colab(qualname) -> bool:
    return qualname is not None and (qualname == "google.colab" or qualname.startswith("google.colab."))


def binding(node, alias) -> str:
    """The name an import binds for one of its aliases."""
    if alias.asname:
        return alias.asname
    if isinstance(node, ast.Import):
        return alias.name.split(".")[0]
    return alias.name


def collect_bindings(ctx, work):
    """Pass 1: the names this cell binds to google.colab, into ``ctx.bindings``."""
    for node in ast.walk(work.code.tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if is_colab(alias.name):
                    if alias.asname:
                        ctx.bindings[alias.asname] = alias.name
                    else:
                        ctx.bindings[alias.name.split(".")[0]] = alias.name.split(".")[0]
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            for alias in node.names:
                qual = f"{node.module}.{alias.name}"
                if is_colab(qual) and alias.name != "*":
                    ctx.bindings[alias.asname or alias.name] = qual


def qualname(ctx, node):
    """(google.colab qualified name, the binding it goes through) of a name or attribute chain; (None, None) for
    anything else."""
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if not isinstance(node, ast.Name) or node.id not in ctx.bindings:
        return None, None
    qual = ".".join([ctx.bindings[node.id]] + parts[::-1])
    return (qual, node.id) if is_colab(qual) else (None, None)


def dotted(node) -> str:
    """The text of a name or attribute chain ("os.path.ismount"); "" for anything else."""
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if isinstance(node, ast.Name):
        parts.append(node.id)
        return ".".join(parts[::-1])
    return ""


def guards(work):
    """Regions the notebook already runs only on Colab (or only elsewhere), and its top-level "import colabkit"."""
    for node in ast.walk(work.code.tree):
        guarded = False
        if isinstance(node, (ast.If, ast.IfExp)):
            guarded = _mentions_colab(node.test)
        elif isinstance(node, ast.Try) or type(node).__name__ == "TryStar":
            guarded = any(_imports_colab(s) for s in ast.walk(ast.Module(body=node.body, type_ignores=[])))
        if guarded:
            work.guarded.append((work.start(node), work.end(node)))
        if isinstance(node, ast.Import) and any(a.name == "colabkit" and not a.asname for a in node.names):
            if node in work.code.tree.body:
                work.imports_colabkit.append(node.lineno - 1)


def references(ctx, work, tree):
    """Uses of google.colab names that no rule rewrote."""
    stack = [tree]   # depth first in source order, without recursion (a tree can be thousands of levels deep)
    while stack:
        node = stack.pop()
        if isinstance(node, (ast.Attribute, ast.Name)) and not isinstance(node.ctx, ast.Store):
            qual, bound = qualname(ctx, node)
            if qual is not None:
                guarded = work.is_guarded(work.start(node))
                work.refs.append(Ref(node, qual, bound, guarded))
                if node not in work.handled and not guarded and work.start(node)[0] not in work.escape_lines:
                    code = next((c for p, c in R.REPORT_PREFIXES if qual.startswith(p)), "CK309")
                    if ctx.on(code):
                        work.finding(code, node.lineno - 1, f"{qual} has no portable equivalent", False)
                continue
        stack.extend(reversed(list(ast.iter_child_nodes(node))))


def _mentions_colab(expr) -> bool:
    for node in ast.walk(expr):
        if isinstance(node, ast.Name) and "colab" in node.id.lower():
            return True
        if isinstance(node, ast.Attribute) and "colab" in node.attr.lower():
            return True
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and (
                "google.colab" in node.value or node.value.startswith("COLAB_")):
            return True
    return False


def _imports_colab(node) -> bool:
    if isinstance(node, ast.Import):
        return any(is_colab(a.name) for a in node.names)
    if isinstance(node, ast.ImportFrom):
        return bool(node.module) and (is_colab(node.module) or (
            node.module == "google" and any(a.name == "colab" for a in node.names)))
    return False
