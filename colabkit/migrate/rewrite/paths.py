"""Colab paths in Python strings (/content, /content/drive) -> colabkit.drive()/workdir(); mount checks: mounted."""
from __future__ import annotations

import ast
import io
import re
import tokenize
from pathlib import Path

from ...portable import classify_colab_path
from .. import rules as R
from . import mounted
from .colab import dotted
from .forms import FORM, form_path
from .links import LinkedPath, literal_rest

# String methods whose argument is text to match, not a place to open: '/content/...' there is text (CK108).
_TEXT_METHODS = frozenset({"replace", "startswith", "endswith", "removeprefix", "removesuffix", "split", "rsplit",
                           "partition", "rpartition", "find", "rfind", "index", "rindex", "count", "strip", "lstrip",
                           "rstrip", "sub", "subn", "match", "search", "fullmatch"})
# Calls that only show text: a Colab path used as text inside them changes nothing but what is printed.
_DISPLAY_CALLS = frozenset({"print", "display", "Markdown", "HTML", "write", "info", "warning", "warn", "error",
                            "debug", "log", "exception", "critical", "set_description", "set_postfix", "set_title",
                            "title", "xlabel", "ylabel", "suptitle"})
# A Colab path somewhere inside a longer string (not at its start), e.g. "x:/content/models/research".
EMBEDDED_PATH = re.compile(r"(?<=[\s:;,=(\[{'\"])(?:/content(?:/[^\s:;,'\"]*)?|/gdrive(?:/[^\s:;,'\"]*)?)"
                           r"(?=$|[\s:;,)\]}'\"])")
_STR_PREFIX = re.compile(r"([rRuUfF]{0,2})('''|\"\"\"|'|\")")


def path_code(found, chdir=False) -> str:
    """The rule of a Colab path (kind "drive" or "content")."""
    if chdir:
        return "CK202"
    if found.spelling == "link":
        return "CK109"
    if found.kind == "content":
        return "CK201"
    return {"current": "CK102", "escaped": "CK106"}.get(found.spelling, "CK103")


def path_expr(found, quoted) -> str:
    """The colabkit call that gives the path (``quoted``: shell-quoted, for a shell command line)."""
    func = "colabkit.drive" if found.kind == "drive" else "colabkit.workdir"
    args = []
    if found.rest:
        args.append(repr(found.rest))
    if quoted:
        args.append("quoted=True")
    return f"{func}({', '.join(args)})"


def path_manual(ctx, found, static=True) -> str:
    """The by-hand step for a path: sample_data, or (with --drive-root) a Drive file missing there."""
    if found.kind == "content":
        if found.rest.split("/")[0] == "sample_data":
            return ("Colab's sample_data folder exists only on Colab: copy the files used into sample_data/ "
                    "in the working folder")
        return ""
    if ctx.drive_root is not None and found.rest and static:
        if not (Path(ctx.drive_root) / found.rest).exists():
            return f"{found.rest} is not in {ctx.drive_root} (fine if the notebook creates it)"
    return ""


def strings(ctx, work, tree):
    """Every string literal and f-string of the cell that no other rule has dealt with."""
    for node in ast.walk(tree):
        if node in work.handled or (node.lineno - 1 if hasattr(node, "lineno") else -1) in work.escape_lines:
            continue
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            parent = work.parents.get(node)
            if isinstance(parent, (ast.Expr, ast.JoinedStr, ast.FormattedValue)):
                continue
            _literal(ctx, work, node, node.value, parent)
        elif isinstance(node, ast.JoinedStr):
            parent = work.parents.get(node)
            if isinstance(parent, (ast.Expr, ast.JoinedStr, ast.FormattedValue)):
                continue
            if node.values and isinstance(node.values[0], ast.Constant) and isinstance(node.values[0].value, str):
                _literal(ctx, work, node, node.values[0].value, parent)
            elif not work.is_guarded(work.start(node)):
                _embedded(ctx, work, node, parent)


def _literal(ctx, work, node, value, parent):
    if work.is_guarded(work.start(node)):
        return
    found = ctx.classify(value)
    line = node.lineno - 1
    if found is None:
        quoted = len(value) > 2 and value[0] == value[-1] and value[0] in "'\"" and ctx.classify(value[1:-1])
        last = work.content(node.end_lineno - 1)
        if quoted and FORM.search(last) and "@param" in last:  # "\"/content/drive/MyDrive/x\"": for a shell line
            if ctx.on(path_code(quoted)):
                form_path(ctx, work, node, value)
            return
        _embedded(ctx, work, node, parent)
        return
    if _as_text(ctx, work, node, parent, value, found):
        return
    constant_fstring = isinstance(node, ast.JoinedStr) and all(isinstance(v, ast.Constant) for v in node.values)
    if isinstance(node, ast.JoinedStr) and not (found.rest or found.trailing_slash) and not constant_fstring:
        # f"/content{x}": the static part does not end at a folder boundary
        if found.kind != "mountpoint" and _fstring_prefix(ctx, work, node, value, found):
            return
        if ctx.on("CK108"):
            work.finding("CK108", line, f"{work.text(work.start(node), work.end(node))}: a Colab path joined to "
                         f"an expression without a '/' between them is left as it is", False,
                         "write the path with colabkit.drive() / colabkit.workdir(), e.g. "
                         "f\"{colabkit.drive()}{...}\"")
        return
    chdir = isinstance(parent, ast.Call) and parent.args and parent.args[0] is node and \
        dotted(parent.func) in ("os.chdir", "chdir")
    if mounted.check(ctx, work, node, parent, found):
        return
    if mounted.is_mount_point(found):
        mounted.report_mount_point(ctx, work, node, value)
        return
    if found.kind == "mountpoint":
        if ctx.on("CK104"):
            work.finding("CK104", line, f"{value!r} is a Drive path outside My Drive", False)
        return
    code = path_code(found, chdir)
    if not ctx.on(code):
        return
    if EMBEDDED_PATH.search(value[1:]):  # "/content/a.npz,/content/b.npz": several paths in one string
        if ctx.on("CK108"):
            work.finding("CK108", line, f"{value!r} holds several Colab paths; left as it is", False)
        return
    if FORM.search(work.content(node.end_lineno - 1)) and "@param" in work.content(node.end_lineno - 1):
        form_path(ctx, work, node, value)
        return
    func = "colabkit.drive" if found.kind == "drive" else "colabkit.workdir"
    replacement = _literal_replacement(work, node, value, found, func, parent)
    if replacement is None:
        work.finding(code, line, f"{value!r} is a Colab path, but its string is too unusual to rewrite", False,
                     f"replace it by hand with {func}(...)")
        return
    manual = path_manual(ctx, found, static=isinstance(node, ast.Constant))
    segment = work.text(work.start(node), work.end(node))
    found_ = work.finding(code, line, f"{segment} -> {replacement}", True, manual)
    work.edit(work.start(node), work.end(node), replacement, found_)


def _fstring_prefix(ctx, work, node, value, found) -> bool:
    """f"/content{x}" -> f"{colabkit.workdir()}{x}": only the prefix is replaced by its equivalent, so the
    string is the same on Colab whatever x holds."""
    code = path_code(found)
    if not ctx.on(code):
        return True
    segment = work.text(work.start(node), work.end(node))
    match = _STR_PREFIX.match(segment)
    if not (match and _single_literal(segment) and "f" in match.group(1).lower()):
        return False
    letters, quote = match.groups()
    body_start = match.end()
    if not segment[body_start:].startswith(value):
        return False
    func = "colabkit.drive" if found.kind == "drive" else "colabkit.workdir"
    (l0, c0) = work.start(node)
    if work.end(node)[0] != l0:
        return False
    start = (l0, c0 + body_start)
    end = (l0, c0 + body_start + len(value))
    text = "{" + func + "()}"
    found_ = work.finding(code, l0, f"{segment} -> {letters}{quote}{text}{segment[body_start + len(value):]}",
                          True, path_manual(ctx, found))
    work.edit(start, end, text, found_)
    return True


def _display_only(work, node) -> bool:
    """The value is only shown: it sits in print(...), logging, a raised exception's message."""
    current = node
    while current is not None and not isinstance(current, ast.Module):
        parent = work.parents.get(current)
        if isinstance(parent, ast.Call) and current is not parent.func:
            name = dotted(parent.func).rsplit(".", 1)[-1] or \
                (parent.func.attr if isinstance(parent.func, ast.Attribute) else "")
            if name in _DISPLAY_CALLS or name.endswith(("Error", "Exception", "Warning")):
                return True
        if isinstance(parent, (ast.Raise, ast.Assert)):
            return True
        if isinstance(parent, ast.stmt):
            return False
        current = parent
    return False


def _as_text(ctx, work, node, parent, value, found) -> bool:
    """A Colab path used as text (a string method's argument, 'x' in s). Where the result is only shown it is
    left alone (at home the message shows the full local path: harmless). Otherwise a path with a portable
    equivalent is rewritten like any other (the text it is matched against is a real path, which at home
    starts with colabkit.drive() / colabkit.workdir()); the bare mount point has none: reported (CK108)."""
    method = None
    if isinstance(parent, ast.Call) and node in parent.args and isinstance(parent.func, ast.Attribute) and \
            parent.func.attr in _TEXT_METHODS and not dotted(parent.func).startswith("os."):
        method = f".{parent.func.attr}(...)"
    elif isinstance(parent, ast.Compare) and any(isinstance(op, (ast.In, ast.NotIn)) for op in parent.ops):
        method = "an 'in' test"
    if method is None:
        return False
    if _display_only(work, node):
        work.handled.add(node)
        return True
    if found.kind != "mountpoint":
        return False
    work.handled.add(node)
    if ctx.on("CK108"):
        work.finding("CK108", node.lineno - 1, f"{value!r} is used as text in {method}; left as it is", False,
                     f"at home paths do not start with {value!r}: match against colabkit.drive() (My Drive) "
                     f"instead, by hand")
    return True


def _embedded(ctx, work, node, parent):
    """A Colab path inside a longer string: cannot be rewritten without knowing the string's syntax (CK108)."""
    if not ctx.on("CK108"):
        return
    values = [node.value] if isinstance(node, ast.Constant) else \
        [v.value for v in getattr(node, "values", []) if isinstance(v, ast.Constant) and isinstance(v.value, str)]
    for value in values:
        match, inner = _embedded_path(ctx, value)
        if match is None:
            continue
        if _display_only(work, node):
            return
        func = "colabkit.drive" if inner.kind == "drive" else "colabkit.workdir"
        manual = (f"build this string with {func}({inner.rest!r}) in place of {match.group(0)}"
                  if inner.kind != "mountpoint" else R.BY_CODE["CK104"].manual)
        work.finding("CK108", node.lineno - 1, f"Colab path {match.group(0)} inside a longer string is left as "
                     f"it is", False, manual)
        return


def _embedded_path(ctx, value):
    """(match, path) of the first Colab path inside ``value``, or of a path through one of the notebook's root
    links ('--cfg /mydrive/x.cfg', 'backup = /mydrive/backup'); (None, None) when there is none."""
    match = EMBEDDED_PATH.search(value)
    if match is not None:
        found = classify_colab_path(match.group(0))
        return (match, found) if found is not None else (None, None)
    for link in ctx.links or ():
        match = re.search(r"(?<=[\s:;,=(\[{'\"])" + re.escape(link) + r"(?:/[^\s:;,'\"]*)?(?=$|[\s:;,)\]}'\"])",
                          value)
        found = ctx.classify(match.group(0)) if match is not None else None
        if found is not None:
            return match, found
    return None, None


def _literal_replacement(work, node, value, found, func, parent):
    segment = work.text(work.start(node), work.end(node))
    linked = isinstance(found, LinkedPath)
    head_len = len(found.prefix) if linked else len(value) - len(found.rest) if found.rest else len(value)
    head = value[:head_len]
    rest_expr = None
    if _single_literal(segment):
        match = _STR_PREFIX.match(segment)
        if match and not set(match.group(1).lower()) - set("rfu"):
            letters, quote = match.groups()
            body = segment[match.end():len(segment) - len(quote)]
            if body.startswith(head):
                raw_rest = body[len(head):]
                if linked:  # '/proj/x' through a link to My Drive/proj: 'proj' + '/x'
                    raw_rest = literal_rest(found, raw_rest, quote, "f" in letters.lower())
                    if raw_rest is None:
                        return None
                rest_expr = f"{letters}{quote}{raw_rest}{quote}" if raw_rest else ""
    elif isinstance(node, ast.Constant):
        rest_expr = repr(found.rest) if found.rest else ""
    if rest_expr is None:
        return None
    if rest_expr:
        return f"{func}({rest_expr})"
    if not found.trailing_slash:
        return f"{func}()"
    text = f"{func}() + '/'"
    wrap = isinstance(parent, (ast.Attribute, ast.Subscript)) or (
        isinstance(parent, ast.BinOp) and not isinstance(parent.op, ast.Add))
    return f"({text})" if wrap else text


def _single_literal(segment: str) -> bool:
    """The source segment is one string literal (not an implicit concatenation)."""
    count, depth = 0, 0
    fstart = getattr(tokenize, "FSTRING_START", None)
    fend = getattr(tokenize, "FSTRING_END", None)
    try:
        for token in tokenize.generate_tokens(io.StringIO(segment).readline):
            if token.type == tokenize.STRING and depth == 0:
                count += 1
            elif fstart is not None and token.type == fstart:
                count += depth == 0
                depth += 1
            elif fend is not None and token.type == fend:
                depth -= 1
            elif token.type in (tokenize.NL, tokenize.NEWLINE, tokenize.ENDMARKER, tokenize.COMMENT):
                continue
            elif depth == 0:
                return False
    except (tokenize.TokenError, SyntaxError, IndentationError):
        return False
    return count == 1
