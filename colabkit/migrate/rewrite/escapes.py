"""Shell escapes (!cmd: !pip, apt, nvidia-smi, kaggle, ln to Drive) and the Colab path words of any shell-like
command line."""
from __future__ import annotations

import ast
import re

from ...portable import classify_colab_path
from .. import rules as R
from ..shell import path_spans, split_words
from . import links
from .colab import binding
from .paths import EMBEDDED_PATH, path_code, path_expr, path_manual

_PIP_HEAD = re.compile(r"!\s*(?:pip3?|python3?\s+-m\s+pip|\{sys\.executable\}\s+-m\s+pip)(?=\s|$)")
_SHELL_META = frozenset("|&;<>`$\n")
# Colab paths anywhere in a shell command line (to find those that are not words of their own)
_SHELL_PATH = re.compile(r"(?:(?<=^)|(?<=[\s'\"=,:;(]))(?:/content|/gdrive|drive/MyDrive)(?:/[^\s'\",:;)]*)?"
                         r"(?=$|[\s'\",:;)/])")
_APT = re.compile(r"^\s*(?:sudo\s+)?apt(?:-get)?\s+(?:.*\s)?install\b")
_NVIDIA_SMI = re.compile(r"^\s*nvidia-smi(?:\s+[-\w=.,]+)*\s*$")
_DOLLAR = re.compile(r"\$(\$?)([A-Za-z_]\w*)")


def shell(ctx, work, esc):
    """One shell escape (!cmd, x = !cmd): !pip -> %pip (CK203), apt (CK204), nvidia-smi (CK205), Kaggle
    credentials (CK206), then its Colab path words."""
    command = esc.arg
    line_text = work.content(esc.line)
    link = links.site(ctx, work, esc.line)
    if link is not None and ctx.on("CK109"):
        path, target, handled = link
        found = links.link_finding(ctx, work, esc.line, path, target, handled)
        if handled and esc.kind == "system" and not line_text[:esc.col].strip() and esc.end_line == esc.line:
            indent = line_text[:esc.col]
            work.edit((esc.line, 0), (esc.line, 0), f"{indent}if colabkit.on_colab():\n", found, order=6)
            work.edit((esc.line, 0), (esc.line, 0), ctx.unit, found, order=7)
            return
        if handled:
            found.applied = False
            found.manual = "put this line under 'if colabkit.on_colab():' by hand"
    head = _PIP_HEAD.match(line_text, esc.col)
    if head and esc.kind == "system" and not esc.assign and ctx.on("CK203"):
        if _unquoted_meta(command):
            work.finding("CK203", esc.line, "!pip with shell redirection or pipes kept as it is", False,
                         "!pip installs into the first pip on PATH, not necessarily the kernel's Python: "
                         "prefer %pip")
        else:
            found = work.finding("CK203", esc.line, f"{head.group(0)} -> %pip", True)
            work.edit((esc.line, esc.col), (esc.line, head.end()), "%pip", found)
    if _APT.match(command) and ctx.on("CK204"):
        segment = next((part for part in re.split(r"[|&;<>]", command) if _APT.match(part)), command)
        words = segment.split()
        after = words[words.index("install") + 1:] if "install" in words else []
        packages = [w for w in after if not w.startswith("-")]
        work.finding("CK204", esc.line, f"system package install: {command.strip()}", False,
                     f"install {' '.join(packages) or 'these packages'} with your system package manager")
    if "kaggle.json" in command and ctx.on("CK206"):
        work.finding("CK206", esc.line, "Kaggle credentials are copied here", False)
    if _NVIDIA_SMI.match(command) and esc.end_line == esc.line and ctx.on("CK205"):
        end = (esc.line, len(line_text))
        found = work.finding("CK205", esc.line, "nvidia-smi kept; explains itself where there is no GPU", True)
        work.edit(end, end, R.NVIDIA_SMI_FALLBACK, found)
        return
    shell_paths(ctx, work, esc, "!")


def shell_paths(ctx, work, esc, what):
    """Colab paths among the words of a shell escape or word magic -> {colabkit.drive(..., quoted=True)}."""
    command = esc.arg
    if not ctx.mentions_paths(command):
        return
    if esc.end_line != esc.line:
        _continued_paths(ctx, work, esc, what)
        return
    why = _dollar_problem(ctx, command)
    if why:
        report_paths(ctx, work, esc.line, command, what, why, hint=_dollar_hint(command, ctx.python_names))
        return
    line_text = work.content(esc.line)
    if line_text[esc.content_col:esc.content_col + len(command)] != command:
        report_paths(ctx, work, esc.line, command, what, "colabkit cannot locate its words in the line")
        return
    _rewrite_words(ctx, work, esc.line, esc.content_col, command, what)


def _dollar_problem(ctx, command) -> str:
    """Why a {colabkit...} expression cannot be added to this command because of its $ expansions ("" if it
    can). IPython expands $name and {expr} in one pass, all or nothing: if one name is missing (a shell
    variable), nothing is expanded. So every $name must be a name the notebook's Python binds."""
    if "$" not in command:
        return ""
    if "${" in command:
        return "it uses ${...}, which IPython reads as a Python expression"
    missing = sorted({name for name in _dollar_names(command) if name not in ctx.python_names})
    if missing:
        return (f"it uses {', '.join('$' + n for n in missing)}, which no Python code in the notebook binds "
                f"(a shell variable?); IPython would then expand nothing, colabkit expressions included")
    return ""


def _continued_paths(ctx, work, esc, what):
    """A shell escape continued with '\\' over several lines (CK209): each line's words, in place."""
    pieces = []
    for number in range(esc.line, esc.end_line + 1):
        start = esc.content_col if number == esc.line else 0
        text = work.content(number)[start:]
        if number < esc.end_line:
            stripped = text.rstrip()
            if not stripped.endswith("\\"):
                pieces = None
                break
            text = stripped[:-1]
        pieces.append((number, start, text))
    joined = " ".join(text for _, _, text in pieces or [])
    if pieces is None or " ".join(joined.split()) != " ".join(esc.arg.split()):
        report_paths(ctx, work, esc.line, esc.arg, what, "colabkit cannot locate its words in the lines",
                     code="CK209")
        return
    # A quote opened on one line and closed on another: each line read alone would be misread.
    spanning = split_words(joined) is None or any(split_words(text) is None for _, _, text in pieces)
    for number, start, text in pieces:
        if not ctx.mentions_paths(text):
            continue
        if spanning:
            report_paths(ctx, work, number, text, what, "a quoted string spans its lines", code="CK209")
            continue
        why = _dollar_problem(ctx, esc.arg)
        if why:
            report_paths(ctx, work, number, text, what, why, code="CK209",
                         hint=_dollar_hint(esc.arg, ctx.python_names))
            continue
        _rewrite_words(ctx, work, number, start, text, what, continued=True)


def _rewrite_words(ctx, work, line, col, command, what, continued=False):
    """Rewrite the Colab path words of ``command``, which starts at column ``col`` of ``line``; report any
    Colab path that is not a word of its own."""
    spans = path_spans(command, lambda p: ctx.classify(p) is not None)
    if spans is None:
        report_paths(ctx, work, line, command, what, "its quoting is unbalanced",
                     code="CK209" if continued else None)
        return
    covered = []
    for span, word in spans:
        if EMBEDDED_PATH.search(span.path[1:]):
            continue  # "/content/a.npz,/content/b.npz": a list of paths in one word (reported below)
        covered.append((word.start, word.end))
        found = ctx.classify(span.path)
        if found.kind == "mountpoint":
            if ctx.on("CK104"):
                work.finding("CK104", line, f"{span.path} is a Drive path outside My Drive", False)
            continue
        code = path_code(found)
        if not ctx.on(code) or (continued and not ctx.on("CK209")):
            continue
        code = "CK209" if continued else code
        text = _word_text(found, span)
        if text is None:
            work.finding(code, line, f"{span.path} has characters IPython would expand", False,
                         "replace the path by hand")
            continue
        start = (line, col + span.start)
        end = (line, col + span.end)
        item = work.finding(code, line, f"{span.path} -> {text}", True, path_manual(ctx, found))
        work.edit(start, end, text, item)
    for match in _SHELL_PATH.finditer(command):
        if any(s <= match.start() < e for s, e in covered):
            continue
        found = classify_colab_path(match.group(0))
        if found is None:
            continue
        code = "CK209" if continued else "CK104" if found.kind == "mountpoint" else path_code(found)
        if ctx.on(code):
            work.finding(code, line, f"Colab path {match.group(0)} in {what} left as it is: it is not a word "
                         f"of its own (part of a quoted list or a longer word)", False, _by_hand(found))
        return


def _word_text(found, span):
    """What a Colab path word of a shell command line becomes ({colabkit.drive('...', quoted=True)}); None when the
    path holds characters IPython would expand."""
    if any(c in found.rest for c in "{}!"):
        return None
    return "{" + path_expr(found, quoted=True) + "}" + ("/" if found.trailing_slash else "") + span.suffix


def ipython_expands(ctx, command) -> bool:
    """IPython expands the {expr} and $name of this shell escape (it expands all of them or none, see
    ``_dollar_problem``); where it does not, the shell gets the text as it is, '{{' included."""
    return not _dollar_problem(ctx, command)


def portable_command(ctx, command) -> str:
    """``command`` (one line of a shell escape) with its Colab path words as ``shell_paths`` writes them: the text
    the line has in the migrated notebook. Words it would leave (and every word, where it would rewrite none)
    stay as they are."""
    if not ctx.mentions_paths(command) or _dollar_problem(ctx, command):
        return command
    spans = path_spans(command, lambda p: ctx.classify(p) is not None)
    pieces, last = [], 0
    for span, _ in spans or []:
        found = ctx.classify(span.path)
        if EMBEDDED_PATH.search(span.path[1:]) or found.kind == "mountpoint" or not ctx.on(path_code(found)):
            continue
        text = _word_text(found, span)
        if text is not None:
            pieces.append(command[last:span.start] + text)
            last = span.end
    return "".join(pieces) + command[last:]


def report_paths(ctx, work, line, text, what, why="colabkit cannot rewrite paths there", code=None,
                 hint=""):
    """Report the first Colab path among the words of ``text`` as left as it is, and ``why``."""
    override = code
    words = split_words(text)
    tokens = [piece for w in words for piece in re.split(r"[=,]", w.value)] if words is not None else \
        re.split(r"[\s\"'=,]+", text)
    for token in tokens:
        found = ctx.classify(token.rstrip(";,)"))
        if found is None:
            continue
        code = override or ("CK104" if found.kind == "mountpoint" else path_code(found))
        if ctx.on(code):
            work.finding(code, line, f"Colab path {token} in {what} left as it is: {why}", False,
                         _by_hand(found) + hint)
        return


def _by_hand(found) -> str:
    """The by-hand step for a Colab path in a shell line that migrate could not rewrite."""
    if found.kind == "mountpoint":
        return R.BY_CODE["CK104"].manual
    func = "colabkit.drive" if found.kind == "drive" else "colabkit.workdir"
    args = f"{found.rest!r}, quoted=True" if found.rest else "quoted=True"
    return f"replace {found.prefix}{'/' + found.rest if found.rest else ''} by hand with {{{func}({args})}}"


def _dollar_names(command: str) -> list:
    """The names IPython's $-expansion looks up in ``command`` ($name, $name.attr; not $$name, not inside single
    quotes, as IPython's DollarFormatter)."""
    names = []
    for match in _DOLLAR.finditer(command):
        if match.group(1) or command[:match.start()].count("'") % 2:
            continue
        names.append(match.group(2))
    return names


def _dollar_hint(command: str, bound) -> str:
    """The second half of the by-hand step for a line whose $ expansions block the rewrite."""
    missing = sorted({n for n in _dollar_names(command) if n not in bound})
    if missing:
        env = ", ".join(f"${n} by {{os.environ['{n}']}}" for n in missing)
        return f", and {env} (IPython expands the line only when every name in it is a Python value)"
    return ", and each ${...} by a Python expression IPython can evaluate"


def bound_names(tree) -> set:
    """Names a cell binds in the notebook's namespace: assignments, loop and with targets, imports, defs and
    classes, outside function bodies (a function's locals are not what a top-level $name sees)."""
    names = set()
    stack = [tree]   # not recursion: a tree Python parses can be thousands of levels deep
    while stack:
        node = stack.pop()
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
            continue
        if isinstance(node, ast.Lambda):
            continue
        if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            names.add(node.id)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            names.update(binding(node, a) for a in node.names if a.name != "*")
        stack.extend(ast.iter_child_nodes(node))
    return names


def _unquoted_meta(command: str) -> bool:
    """The shell would treat some character of ``command`` as a pipe, redirection, list or expansion:
    |&;<> outside quotes, $ and ` outside single quotes. A quoted "pkg<2" is a plain word."""
    quote = ""
    i = 0
    while i < len(command):
        c = command[i]
        if quote == "'":
            quote = "" if c == "'" else quote
        elif c == "\\" and i + 1 < len(command):
            i += 2
            continue
        elif quote == '"':
            if c == '"':
                quote = ""
            elif c in "$`":
                return True
        elif c in "'\"":
            quote = c
        elif c in _SHELL_META:
            return True
        i += 1
    return False
