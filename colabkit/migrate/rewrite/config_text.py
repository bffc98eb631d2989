"""Colab paths inside text a notebook writes to a file (CK110): a training config in a triple-quoted string, a
%%writefile cell.

Such text is read by another program (a trainer reading its TOML or YAML), so the path has to be in the text itself,
as this machine spells it. The text becomes an f-string that gives exactly the same text except that each Colab
path is the value of colabkit.drive() / colabkit.workdir() (braces of the text doubled, nothing else touched):

    config = '''                          config = f'''
    root = "/content/drive/MyDrive/d"  ->  root = "{colabkit.drive("d")}"
    sizes = {a = 1}                        sizes = {{a = 1}}
    '''                                    '''

A %%writefile cell becomes the very call IPython makes for it, with its text as that f-string (raw, so backslashes
stay as they were): ``get_ipython().run_cell_magic('writefile', 'x.yaml', rf'''...''')``; the file name, the -a
flag and the message are IPython's as before. Text that is only shown (print, messages) and docstrings are left
alone; a path that cannot be put into the text this way is reported with its replacement.
"""
from __future__ import annotations

import ast
import re

from .. import rules as R
from ..shell import path_spans
from .paths import _STR_PREFIX, _display_only, _single_literal, path_expr

# A Colab path inside text: from '/content' or '/gdrive' (with "My Drive" and its space) to the next character
# that ends a path in config files (quotes, blanks, separators, brackets).
_PATH = re.compile(r"(?<![\w.~/-])(?:/content/g?drive/My Drive|/gdrive/My Drive|/content|/gdrive)"
                   r"(?:/[^\s'\"`,;:()\[\]{}\\<>|]*)?")
_SAFE_REST = re.compile(r"^[^'\"\\{}\n]*$")


def _paths(ctx, text):
    """[(start, end, ColabPath)] of the Colab paths in ``text`` (a trailing '.' ends a sentence, not the path)."""
    found = []
    for match in _PATH.finditer(text):
        path = match.group(0)
        while path.endswith(".") and len(path) > 1:
            path = path[:-1]
        colab = ctx.classify(path)
        if colab is not None:
            found.append((match.start(), match.start() + len(path), colab))
    return found


def _expression(colab, quote) -> str:
    """{colabkit.drive('x')} for an f-string delimited by ``quote`` (the other quote inside), or None."""
    if colab.kind == "mountpoint" or not _SAFE_REST.match(colab.rest):
        return None
    inner = '"' if quote.startswith("'") else "'"
    func = "colabkit.drive" if colab.kind == "drive" else "colabkit.workdir"
    return "{" + func + (f"({inner}{colab.rest}{inner})" if colab.rest else "()") + "}" + \
        ("/" if colab.trailing_slash and colab.rest == "" else "")


def strings(ctx, work, tree):
    """The cell's multi-line string literals (before paths.strings, which skips those dealt with here)."""
    for node in ast.walk(tree):
        if not isinstance(node, (ast.Constant, ast.JoinedStr)) or getattr(node, "end_lineno", 0) == node.lineno:
            continue
        if isinstance(node, ast.Constant) and (not isinstance(node.value, str) or ctx.classify(node.value)):
            continue
        parent = work.parents.get(node)
        if isinstance(parent, (ast.Expr, ast.JoinedStr, ast.FormattedValue)) or node in work.handled or \
                work.is_guarded(work.start(node)) or node.lineno - 1 in work.escape_lines:
            continue
        multiline(ctx, work, node, parent)


def multiline(ctx, work, node, parent) -> bool:
    """A multi-line string literal holding Colab paths that is not only shown: rewritten as an f-string (True), or
    reported when it cannot be (True); False when this rule has nothing to say about it."""
    if node.end_lineno == node.lineno or _display_only(work, node):
        return False
    segment = work.text(work.start(node), work.end(node))
    match = _STR_PREFIX.match(segment)
    if not match or not segment.endswith(match.group(2)):
        return False
    letters, quote = match.groups()
    body_start, body_end = match.end(), len(segment) - len(quote)
    body = segment[body_start:body_end]
    found = [(s, e, c) for s, e, c in _paths(ctx, body) if not _in_braces(body, s, "f" in letters.lower())]
    if not found:
        return False
    if not ctx.on("CK110"):
        return True
    work.handled.add(node)
    for s, e, _ in [item for item in found if item[2].kind == "mountpoint"]:
        work.finding("CK110", _pos(work, work.start(node), segment, body_start + s)[0],
                     f"{body[s:e]} in multi-line text is a Drive path outside My Drive; left as it is", False,
                     R.BY_CODE["CK104"].manual)
    found = [item for item in found if item[2].kind != "mountpoint"]
    if not found:
        return True
    line = node.lineno - 1
    problem = None
    if "b" in letters.lower():
        problem = "it is a bytes literal"
    elif not _single_literal(segment):
        problem = "it is joined from several literals"
    elif "\\N{" in body and "r" not in letters.lower():
        problem = "it uses \\N{...} escapes"
    expressions = [_expression(c, quote) for _, _, c in found]
    if problem is None and None in expressions:
        problem = "a path in it has no portable equivalent or characters an f-string cannot hold"
    if problem is not None:
        _report(work, line, found, problem)
        return True
    start = work.start(node)
    fstring = "f" in letters.lower()
    if not fstring:
        u = letters.lower().find("u")
        if u >= 0:
            work.edit(_pos(work, start, segment, u), _pos(work, start, segment, u + 1), "f", None)
        else:
            work.edit(start, start, "f", None)
        for offset, char in enumerate(body):
            if char in "{}":
                at = _pos(work, start, segment, body_start + offset)
                work.edit(at, at, char, None)
    for (s, e, _), expression in zip(found, expressions):
        path = body[s:e]
        item = work.finding("CK110", _pos(work, start, segment, body_start + s)[0],
                            f"{path} in multi-line text -> {expression} (the text becomes an f-string that gives "
                            f"the same text with this machine's path)", True, "")
        work.edit(_pos(work, start, segment, body_start + s), _pos(work, start, segment, body_start + e), expression,
                  item)
    return True


def writefile(ctx, work) -> bool:
    """A %%writefile cell whose text holds Colab paths: the call IPython makes for it, its text as an f-string
    (True); False when the text holds none (the file name alone is rewritten as any %%writefile line is)."""
    name, args = work.code.magic
    magic_line = work.code.magics[-1][2]
    if work.code.comments_above or magic_line + 1 >= len(work.lines):
        return False
    body = "".join(work.lines[magic_line + 1:])
    found = _paths(ctx, body)
    if not found or not ctx.on("CK110"):
        return False
    quote = '"""' if '"""' not in body else "'''"
    expressions = [_expression(c, quote) for _, _, c in found]
    new_args = _args(ctx, args)
    problem = ("its text holds both kinds of triple quotes" if '"""' in body and "'''" in body else
               "a path in it has no portable equivalent or characters an f-string cannot hold"
               if None in expressions else "its file name is built with {...} or $" if new_args is None else None)
    if problem is not None:
        _report(work, magic_line + 1, [(s, e, c) for s, e, c in found], problem)
        return True
    call = f"import colabkit\nget_ipython().run_cell_magic('writefile', {new_args!r}, rf{quote}"
    head = work.finding("CK110", magic_line, f"%%{name} {args} -> the call IPython makes for it, its text as an "
                        f"f-string: get_ipython().run_cell_magic('writefile', {new_args!r}, rf{quote}...{quote})",
                        True, "")
    work.edit((magic_line, 0), (magic_line + 1, 0), call, head, provides_import=True, top_level=True)
    body_lines = work.lines[magic_line + 1:]

    def position(offset):
        for number, text in enumerate(body_lines):
            if offset < len(text) or number == len(body_lines) - 1:
                return magic_line + 1 + number, offset
            offset -= len(text)

    for offset, char in enumerate(body):
        if char in "{}":
            work.edit(position(offset), position(offset), char, None)
    for (s, e, _), expression in zip(found, expressions):
        item = work.finding("CK110", position(s)[0], f"{body[s:e]} in the file's text -> {expression}", True, "")
        work.edit(position(s), position(e), expression, item)
    last = len(work.lines) - 1
    end = (last, len(work.lines[last]))
    work.edit(end, end, ("" if body.endswith("\n") else "\n") + quote + ")", head)
    return True


def _args(ctx, args):
    """%%writefile's argument text with Colab path words as {colabkit...(quoted=True)}, as IPython expands them; None
    when it already uses IPython's {...} / $ expansion."""
    if "{" in args or "$" in args:
        return None
    spans = path_spans(args, lambda p: ctx.classify(p) is not None) or []
    for span, _ in reversed(spans):
        colab = ctx.classify(span.path)
        if colab.kind == "mountpoint":
            return None
        text = "{" + path_expr(colab, quoted=True) + "}" + ("/" if colab.trailing_slash else "") + span.suffix
        args = args[:span.start] + text + args[span.end:]
    return args


def _report(work, line, found, problem):
    first = found[0][2]
    func = "colabkit.drive" if first.kind == "drive" else "colabkit.workdir"
    work.finding("CK110", line, f"Colab path {first.prefix}{'/' + first.rest if first.rest else ''} in multi-line "
                 f"text is left as it is: {problem}", False,
                 f"build this text with {func}({first.rest!r}) in place of the Colab path (e.g. as an f-string)")


def _in_braces(body, offset, fstring) -> bool:
    """``offset`` of an f-string's body is inside a {...} replacement field (its code, not its text)."""
    if not fstring:
        return False
    depth, i = 0, 0
    while i < offset:
        if body.startswith("{{", i) and depth == 0 or body.startswith("}}", i) and depth == 0:
            i += 2
            continue
        depth += body[i] == "{"
        depth -= body[i] == "}" and depth > 0
        i += 1
    return depth > 0


def _pos(work, start, segment, offset):
    """(line, column) in the cell of character ``offset`` of ``segment``, which starts at ``start``."""
    before = segment[:offset]
    newlines = before.count("\n")
    if not newlines:
        return start[0], start[1] + offset
    return start[0] + newlines, len(before) - before.rfind("\n") - 1

