"""The rewriter: Colab-only constructs in a notebook's code cells -> minimal edits of their sources + findings.

Works on cell sources only (strings in, strings out); reading and writing files is ``colabkit.migrate``'s job.
Two passes over the notebook: first every cell is read (IPython's transformer + ``ast``) and the names bound to
``google.colab`` anywhere are collected; then each cell gets its edits, which need that notebook-wide view (an
import in cell 1 is dropped only if no later cell still needs the name it binds).
"""
from __future__ import annotations

import ast
import bisect
import dataclasses
import io
import re
import tokenize
from collections import Counter

from ..portable import classify_colab_path
from . import rules as R
from .cells import read_cell
from .shell import path_spans, split_words

_PIP_HEAD = re.compile(r"!\s*(?:pip3?|python3?\s+-m\s+pip|\{sys\.executable\}\s+-m\s+pip)(?=\s|$)")
_SHELL_META = frozenset("|&;<>`$\n")
# Colab paths anywhere in a shell command line (to find those that are not words of their own)
_SHELL_PATH = re.compile(r"(?:(?<=^)|(?<=[\s'\"=,:;(]))(?:/content|/gdrive|drive/MyDrive)(?:/[^\s'\",:;)]*)?"
                         r"(?=$|[\s'\",:;)/])")
_APT = re.compile(r"^\s*(?:sudo\s+)?apt(?:-get)?\s+(?:.*\s)?install\b")
_NVIDIA_SMI = re.compile(r"^\s*nvidia-smi(?:\s+[-\w=.,]+)*\s*$")
_FORM = re.compile(r"#\s*@(title|param|markdown)\b")
_STR_PREFIX = re.compile(r"([rRuUfF]{0,2})('''|\"\"\"|'|\")")


@dataclasses.dataclass
class Finding:
    """One thing migrate found: what, where, what it did, and what is left to do by hand."""
    code: str
    cell: int                 # 0-based index in the notebook's cells
    line: int                 # 1-based line in the cell
    message: str
    applied: bool             # the fix was written (or would be, with --check)
    manual: str = ""          # what the user still has to do by hand
    before: list = dataclasses.field(default_factory=list)  # the original line(s)
    after: list = None        # the same place after migration (None: unchanged)

    @property
    def title(self) -> str:
        return R.BY_CODE[self.code].title


@dataclasses.dataclass
class _Edit:
    start: tuple               # (line, col), 0-based, in the original cell source
    end: tuple
    text: str
    finding: Finding = None
    order: int = 5             # tie-break for insertions at the same place
    provides_import: bool = False
    drop: tuple = None         # (start, end, text) that removes a nested "import colabkit" made redundant
    top_level: bool = False
    new_span: tuple = None     # (start, end) offsets in the new source, set when applied


@dataclasses.dataclass
class CellResult:
    index: int
    source: str
    new_source: str
    findings: list


@dataclasses.dataclass
class _Ref:
    node: ast.AST
    qualname: str
    binding: str
    guarded: bool


def _path_code(found, chdir=False) -> str:
    """The rule of a Colab path (kind "drive" or "content")."""
    if chdir:
        return "CK202"
    if found.kind == "content":
        return "CK201"
    return {"current": "CK102", "escaped": "CK106"}.get(found.spelling, "CK103")


# Calls whose first argument is tested for existence: '/content/drive' there asks "is Drive mounted?" (CK107).
_EXISTS_CALLS = frozenset({"os.path.exists", "os.path.isdir", "os.path.lexists", "os.path.ismount", "path.exists",
                           "path.isdir", "path.lexists", "path.ismount", "exists", "isdir", "lexists", "ismount"})
# String methods whose argument is text to match, not a place to open: '/content/...' there is text (CK108).
_TEXT_METHODS = frozenset({"replace", "startswith", "endswith", "removeprefix", "removesuffix", "split", "rsplit",
                           "partition", "rpartition", "find", "rfind", "index", "rindex", "count", "strip", "lstrip",
                           "rstrip", "sub", "subn", "match", "search", "fullmatch"})
# Calls that only show text: a Colab path used as text inside them changes nothing but what is printed.
_DISPLAY_CALLS = frozenset({"print", "display", "Markdown", "HTML", "write", "info", "warning", "warn", "error",
                            "debug", "log", "exception", "critical", "set_description", "set_postfix", "set_title",
                            "title", "xlabel", "ylabel", "suptitle"})
# A Colab path somewhere inside a longer string (not at its start), e.g. "x:/content/models/research".
_EMBEDDED_PATH = re.compile(r"(?<=[\s:;,=(\[{'\"])(?:/content(?:/[^\s:;,'\"]*)?|/gdrive(?:/[^\s:;,'\"]*)?)"
                            r"(?=$|[\s:;,)\]}'\"])")


def _by_hand(found) -> str:
    """The by-hand step for a Colab path in a shell line that migrate could not rewrite."""
    if found.kind == "mountpoint":
        return R.BY_CODE["CK104"].manual
    func = "colabkit.drive" if found.kind == "drive" else "colabkit.workdir"
    args = f"{found.rest!r}, quoted=True" if found.rest else "quoted=True"
    return f"replace {found.prefix}{'/' + found.rest if found.rest else ''} by hand with {{{func}({args})}}"


_DOLLAR = re.compile(r"\$(\$?)([A-Za-z_]\w*)")


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


def _bound_names(tree) -> set:
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
            names.update(_binding(node, a) for a in node.names if a.name != "*")
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


def _is_colab(qualname) -> bool:
    return qualname is not None and (qualname == "google.colab" or qualname.startswith("google.colab."))


class _CellWork:
    """Per-cell state while edits are computed."""

    def __init__(self, index, source, code):
        self.index, self.source, self.code = index, source, code
        self.lines = code.lines
        self.edits, self.findings = [], []
        self.guarded = []
        self._parents = None
        self.refs = []
        self.handled = set()    # nodes a rule has dealt with (not reported again)
        self.consumed = set()   # google.colab references rewritten to colabkit (no longer need the import)
        self.escape_lines = set()
        self.imports_colabkit = []     # line numbers (0-based) of unguarded top-level "import colabkit"
        self.inert = False             # nothing in the cell any rule could match: only its syntax was checked
        for esc in code.escapes:
            self.escape_lines.update(range(esc.line, esc.end_line + 1))

    @property
    def parents(self) -> dict:
        if self._parents is None:
            self._parents = {}
            if self.code.tree is not None:
                for parent in ast.walk(self.code.tree):
                    for child in ast.iter_child_nodes(parent):
                        self._parents[child] = parent
        return self._parents

    # positions --------------------------------------------------------------------------------------------
    def col(self, lineno, byte_col) -> int:
        """Character column of ``byte_col`` (ast's UTF-8 offset) on 1-based line ``lineno``."""
        line = self.lines[lineno - 1] if lineno - 1 < len(self.lines) else ""
        return byte_col if line.isascii() else len(line.encode("utf-8")[:byte_col].decode("utf-8", "replace"))

    def start(self, node):
        return node.lineno - 1, self.col(node.lineno, node.col_offset)

    def end(self, node):
        return node.end_lineno - 1, self.col(node.end_lineno, node.end_col_offset)

    def text(self, start, end) -> str:
        (l0, c0), (l1, c1) = start, end
        if l0 == l1:
            return self.lines[l0][c0:c1]
        return self.lines[l0][c0:] + "".join(self.lines[l0 + 1:l1]) + self.lines[l1][:c1]

    def content(self, line) -> str:
        """The line without its line break ("\\n" or "\\r\\n")."""
        text = self.lines[line]
        return text[:-2] if text.endswith("\r\n") else text.rstrip("\n")

    def is_guarded(self, pos) -> bool:
        return any(s <= pos < e for s, e in self.guarded)

    def owns_lines(self, node) -> bool:
        """The statement is alone on its lines (no 'a; b', no 'if x: b'); a trailing comment is fine."""
        (l0, c0), (l1, c1) = self.start(node), self.end(node)
        after = self.lines[l1][c1:].strip()
        return not self.lines[l0][:c0].strip() and (not after or after.startswith("#"))

    def statement_of(self, node):
        while node is not None and not isinstance(node, ast.stmt):
            node = self.parents.get(node)
        return node

    def only_in_block(self, stmt) -> bool:
        parent = self.parents.get(stmt)
        if parent is None or isinstance(parent, ast.Module):
            return False
        for field in ("body", "orelse", "finalbody", "handlers"):
            block = getattr(parent, field, None)
            if isinstance(block, list) and stmt in block:
                return len(block) == 1
        return False

    def top_level_statement(self, line):
        """The top-level statement holding 0-based ``line`` (None if none does)."""
        for node in self.code.tree.body:
            first = min([node.lineno] + [d.lineno for d in getattr(node, "decorator_list", [])]) - 1
            if first <= line <= node.end_lineno - 1:
                return node, first
        return None, None

    # findings ---------------------------------------------------------------------------------------------
    def finding(self, code, line, message, applied, manual=None) -> Finding:
        """Record a finding; ``manual`` None means the rule's own "by hand" text."""
        found = Finding(code=code, cell=self.index, line=line + 1, message=message, applied=applied,
                        manual=R.BY_CODE[code].manual if manual is None else manual)
        self.findings.append(found)
        return found

    def edit(self, start, end, text, finding, **kw) -> _Edit:
        e = _Edit(start=start, end=end, text=text, finding=finding, **kw)
        self.edits.append(e)
        return e


class Rewriter:
    """Compute the migration of one notebook's code cells."""

    def __init__(self, active=None, drive_root=None):
        self.active = frozenset(R.BY_CODE) if active is None else frozenset(active)
        self.drive_root = drive_root

    def on(self, code) -> bool:
        return code in self.active

    # entry point -----------------------------------------------------------------------------------------
    def run(self, sources: list) -> list:
        """``sources``: per cell, its source text, or None for a cell that is not code. One CellResult per code
        cell, in order."""
        works = []
        for index, source in enumerate(sources):
            if source is None:
                continue
            code = read_cell(source, R.PYTHON_CELL_MAGICS)
            works.append(_CellWork(index, source, code))
        self.unit = _indent_unit(works)
        self.bindings = {}
        self.python_names = set()   # names the notebook's Python binds at top level: what IPython's $name expands
        if any("$" in e.arg for w in works for e in w.code.escapes):
            for work in works:
                if work.code.tree is not None and work.code.problem is None:
                    self.python_names.update(_bound_names(work.code.tree))
        for work in works:
            if work.code.tree is not None and work.code.problem is None and "colab" in work.source:
                self._collect_bindings(work)
        # A cell that mentions none of these has nothing any rule matches (most cells of a notebook).
        names = "".join(f"|\\b{re.escape(name)}\\b" for name in sorted(self.bindings))
        trigger = re.compile(r"colab|content|drive|@(?:title|param|markdown)" + names)
        for work in works:
            if work.code.problem is not None:
                code, line, message = work.code.problem
                work.finding(code, line - 1, f"cell left unchanged: {message}", False)
                continue
            self._cell_magic(work)
            if work.code.tree is None:
                continue
            if not work.code.escapes and not trigger.search(work.source):
                work.inert = True
                continue
            self._guards(work)
            self._python(work)
            self._escapes(work)
            self._forms(work)
        self._imports(works)
        self._ensure_import(works)
        return [self._apply(work) for work in works]

    # pass 1: names bound to google.colab -------------------------------------------------------------------
    def _collect_bindings(self, work):
        for node in ast.walk(work.code.tree):
            if isinstance(node, ast.Import):
                for alias in node.names:
                    if _is_colab(alias.name):
                        if alias.asname:
                            self.bindings[alias.asname] = alias.name
                        else:
                            self.bindings[alias.name.split(".")[0]] = alias.name.split(".")[0]
            elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
                for alias in node.names:
                    qual = f"{node.module}.{alias.name}"
                    if _is_colab(qual) and alias.name != "*":
                        self.bindings[alias.asname or alias.name] = qual

    def _qualname(self, node):
        parts = []
        while isinstance(node, ast.Attribute):
            parts.append(node.attr)
            node = node.value
        if not isinstance(node, ast.Name) or node.id not in self.bindings:
            return None, None
        qual = ".".join([self.bindings[node.id]] + parts[::-1])
        return (qual, node.id) if _is_colab(qual) else (None, None)

    # guarded regions (code the notebook already runs only on Colab, or only elsewhere) -----------------------
    def _guards(self, work):
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

    # pass 2: Python -----------------------------------------------------------------------------------------
    def _python(self, work):
        tree = work.code.tree
        for node in ast.walk(tree):
            if isinstance(node, ast.Call):
                self._call(work, node)
        self._references(work, tree)
        for node in ast.walk(tree):
            if node in work.handled or (node.lineno - 1 if hasattr(node, "lineno") else -1) in work.escape_lines:
                continue
            if isinstance(node, ast.Constant) and isinstance(node.value, str):
                parent = work.parents.get(node)
                if isinstance(parent, (ast.Expr, ast.JoinedStr, ast.FormattedValue)):
                    continue
                self._literal(work, node, node.value, parent)
            elif isinstance(node, ast.JoinedStr):
                parent = work.parents.get(node)
                if isinstance(parent, (ast.Expr, ast.JoinedStr, ast.FormattedValue)):
                    continue
                if node.values and isinstance(node.values[0], ast.Constant) and isinstance(node.values[0].value, str):
                    self._literal(work, node, node.values[0].value, parent)
                elif not work.is_guarded(work.start(node)):
                    self._embedded(work, node, parent)

    def _call(self, work, call):
        qual, _ = self._qualname(call.func)
        if qual is None or work.is_guarded(work.start(call)):
            return
        if qual in R.CALLS:
            code, replacement = R.CALLS[qual]
            if not self.on(code):
                return
            work.handled.add(call.func)
            work.consumed.add(call.func)
            func_text = work.text(work.start(call.func), work.end(call.func))
            message = f"{func_text}(...) -> {replacement}(...)"
            manual = None
            if code == "CK304":
                key = call.args[0].value if call.args and isinstance(call.args[0], ast.Constant) else None
                manual = (f"set the environment variable {key} on this machine" if isinstance(key, str)
                          else R.BY_CODE[code].manual)
            found = work.finding(code, call.lineno - 1, message, True, manual)
            work.edit(work.start(call.func), work.end(call.func), replacement, found)
            if code == "CK101":
                self._drop_mountpoint(work, call, found)
        elif qual in R.GUARD_CALLS and self.on("CK308"):
            work.handled.add(call.func)
            stmt = work.parents.get(call)
            if isinstance(stmt, ast.Expr) and work.owns_lines(stmt):
                found = work.finding("CK308", stmt.lineno - 1, f"{qual}() runs only on Colab", True)
                self._guard_statement(work, stmt, found)
            else:
                work.finding("CK308", call.lineno - 1, f"{qual}() runs only on Colab, but its value is used or it "
                             f"shares its line", False, "put it under 'if colabkit.on_colab():' by hand")

    def _drop_mountpoint(self, work, call, found):
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

    def _guard_statement(self, work, stmt, found):
        (l0, c0), (l1, _) = work.start(stmt), work.end(stmt)
        indent = work.lines[l0][:c0]
        work.edit((l0, 0), (l0, 0), f"{indent}if colabkit.on_colab():\n", found, order=6)
        inside = _lines_inside_strings(work, stmt)
        for line in range(l0, l1 + 1):
            if line not in inside:
                work.edit((line, 0), (line, 0), self.unit, found, order=7)

    def _references(self, work, tree):
        """Uses of google.colab names that no rule rewrote."""
        stack = [tree]   # depth first in source order, without recursion (a tree can be thousands of levels deep)
        while stack:
            node = stack.pop()
            if isinstance(node, (ast.Attribute, ast.Name)) and not isinstance(node.ctx, ast.Store):
                qual, binding = self._qualname(node)
                if qual is not None:
                    guarded = work.is_guarded(work.start(node))
                    work.refs.append(_Ref(node, qual, binding, guarded))
                    if node not in work.handled and not guarded and work.start(node)[0] not in work.escape_lines:
                        code = next((c for p, c in R.REPORT_PREFIXES if qual.startswith(p)), "CK309")
                        if self.on(code):
                            work.finding(code, node.lineno - 1, f"{qual} has no portable equivalent", False)
                    continue
            stack.extend(reversed(list(ast.iter_child_nodes(node))))

    def _literal(self, work, node, value, parent):
        if work.is_guarded(work.start(node)):
            return
        found = classify_colab_path(value)
        line = node.lineno - 1
        if found is None:
            self._embedded(work, node, parent)
            return
        if self._as_text(work, node, parent, value, found):
            return
        constant_fstring = isinstance(node, ast.JoinedStr) and all(isinstance(v, ast.Constant) for v in node.values)
        if isinstance(node, ast.JoinedStr) and not (found.rest or found.trailing_slash) and not constant_fstring:
            # f"/content{x}": the static part does not end at a folder boundary
            if found.kind != "mountpoint" and self._fstring_prefix(work, node, value, found):
                return
            if self.on("CK108"):
                work.finding("CK108", line, f"{work.text(work.start(node), work.end(node))}: a Colab path joined to "
                             f"an expression without a '/' between them is left as it is", False,
                             "write the path with colabkit.drive() / colabkit.workdir(), e.g. "
                             "f\"{colabkit.drive()}{...}\"")
            return
        chdir = isinstance(parent, ast.Call) and parent.args and parent.args[0] is node and \
            _dotted(parent.func) in ("os.chdir", "chdir")
        if self._mount_check(work, node, parent, found):
            return
        if found.kind == "mountpoint":
            if self.on("CK104"):
                work.finding("CK104", line, f"{value!r} is a Drive path outside My Drive", False)
            return
        code = _path_code(found, chdir)
        if not self.on(code):
            return
        if _EMBEDDED_PATH.search(value[1:]):  # "/content/a.npz,/content/b.npz": several paths in one string
            if self.on("CK108"):
                work.finding("CK108", line, f"{value!r} holds several Colab paths; left as it is", False)
            return
        if _FORM.search(work.content(node.end_lineno - 1)) and "@param" in work.content(node.end_lineno - 1):
            self._form_path(work, node, value)
            return
        func = "colabkit.drive" if found.kind == "drive" else "colabkit.workdir"
        replacement = self._literal_replacement(work, node, value, found, func, parent)
        if replacement is None:
            work.finding(code, line, f"{value!r} is a Colab path, but its string is too unusual to rewrite", False,
                         f"replace it by hand with {func}(...)")
            return
        manual = self._path_manual(found, static=isinstance(node, ast.Constant))
        segment = work.text(work.start(node), work.end(node))
        found_ = work.finding(code, line, f"{segment} -> {replacement}", True, manual)
        work.edit(work.start(node), work.end(node), replacement, found_)

    def _fstring_prefix(self, work, node, value, found) -> bool:
        """f"/content{x}" -> f"{colabkit.workdir()}{x}": only the prefix is replaced by its equivalent, so the
        string is the same on Colab whatever x holds."""
        code = _path_code(found)
        if not self.on(code):
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
                              True, self._path_manual(found))
        work.edit(start, end, text, found_)
        return True

    def _mount_check(self, work, node, parent, found) -> bool:
        """os.path.exists('/content/drive') and kin -> colabkit.drive_mounted() (CK107)."""
        if not (isinstance(parent, ast.Call) and parent.args and parent.args[0] is node and not parent.keywords
                and len(parent.args) == 1 and _dotted(parent.func) in _EXISTS_CALLS):
            return False
        if found.rest or found.kind not in ("mountpoint", "drive"):
            return False
        if not self.on("CK107"):
            return found.kind == "mountpoint"
        call = work.text(work.start(parent), work.end(parent))
        found_ = work.finding("CK107", node.lineno - 1, f"{call} -> colabkit.drive_mounted(): whether My Drive is "
                              f"there, without mounting it (off Colab: the drive_root folder)", True)
        work.handled.add(node)
        work.handled.add(parent.func)
        work.edit(work.start(parent), work.end(parent), "colabkit.drive_mounted()", found_)
        return True

    def _display_only(self, work, node) -> bool:
        """The value is only shown: it sits in print(...), logging, a raised exception's message."""
        current = node
        while current is not None and not isinstance(current, ast.Module):
            parent = work.parents.get(current)
            if isinstance(parent, ast.Call) and current is not parent.func:
                name = _dotted(parent.func).rsplit(".", 1)[-1] or \
                    (parent.func.attr if isinstance(parent.func, ast.Attribute) else "")
                if name in _DISPLAY_CALLS or name.endswith(("Error", "Exception", "Warning")):
                    return True
            if isinstance(parent, (ast.Raise, ast.Assert)):
                return True
            if isinstance(parent, ast.stmt):
                return False
            current = parent
        return False

    def _as_text(self, work, node, parent, value, found) -> bool:
        """A Colab path used as text (a string method's argument, 'x' in s). Where the result is only shown it is
        left alone (at home the message shows the full local path: harmless). Otherwise a path with a portable
        equivalent is rewritten like any other (the text it is matched against is a real path, which at home
        starts with colabkit.drive() / colabkit.workdir()); the bare mount point has none: reported (CK108)."""
        method = None
        if isinstance(parent, ast.Call) and node in parent.args and isinstance(parent.func, ast.Attribute) and \
                parent.func.attr in _TEXT_METHODS and not _dotted(parent.func).startswith("os."):
            method = f".{parent.func.attr}(...)"
        elif isinstance(parent, ast.Compare) and any(isinstance(op, (ast.In, ast.NotIn)) for op in parent.ops):
            method = "an 'in' test"
        if method is None:
            return False
        if self._display_only(work, node):
            work.handled.add(node)
            return True
        if found.kind != "mountpoint":
            return False
        work.handled.add(node)
        if self.on("CK108"):
            work.finding("CK108", node.lineno - 1, f"{value!r} is used as text in {method}; left as it is", False,
                         f"at home paths do not start with {value!r}: match against colabkit.drive() (My Drive) "
                         f"instead, by hand")
        return True

    def _embedded(self, work, node, parent):
        """A Colab path inside a longer string: cannot be rewritten without knowing the string's syntax (CK108)."""
        if not self.on("CK108"):
            return
        values = [node.value] if isinstance(node, ast.Constant) else \
            [v.value for v in getattr(node, "values", []) if isinstance(v, ast.Constant) and isinstance(v.value, str)]
        for value in values:
            match = _EMBEDDED_PATH.search(value)
            if match is None or classify_colab_path(match.group(0)) is None:
                continue
            if self._display_only(work, node):
                return
            inner = classify_colab_path(match.group(0))
            func = "colabkit.drive" if inner.kind == "drive" else "colabkit.workdir"
            manual = (f"build this string with {func}({inner.rest!r}) in place of {match.group(0)}"
                      if inner.kind != "mountpoint" else R.BY_CODE["CK104"].manual)
            work.finding("CK108", node.lineno - 1, f"Colab path {match.group(0)} inside a longer string is left as "
                         f"it is", False, manual)
            return

    def _literal_replacement(self, work, node, value, found, func, parent):
        segment = work.text(work.start(node), work.end(node))
        head_len = len(value) - len(found.rest) if found.rest else len(value)
        head = value[:head_len]
        rest_expr = None
        if _single_literal(segment):
            match = _STR_PREFIX.match(segment)
            if match and not set(match.group(1).lower()) - set("rfu"):
                letters, quote = match.groups()
                body = segment[match.end():len(segment) - len(quote)]
                if body.startswith(head):
                    raw_rest = body[len(head):]
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

    def _path_manual(self, found, static=True) -> str:
        """The by-hand step for a path: sample_data, or (with --drive-root) a Drive file missing there."""
        if found.kind == "content":
            if found.rest.split("/")[0] == "sample_data":
                return ("Colab's sample_data folder exists only on Colab: copy the files used into sample_data/ "
                        "in the working folder")
            return ""
        if self.drive_root is not None and found.rest and static:
            from pathlib import Path
            if not (Path(self.drive_root) / found.rest).exists():
                return f"{found.rest} is not in {self.drive_root} (fine if the notebook creates it)"
        return ""

    def _form_path(self, work, node, value):
        stmt = work.parents.get(node)
        if not (isinstance(stmt, ast.Assign) and stmt.value is node and len(stmt.targets) == 1
                and isinstance(stmt.targets[0], ast.Name) and work.owns_lines(stmt)):
            if self.on("CK402"):
                work.finding("CK402", node.lineno - 1, f"form field holds the Colab path {value!r}", False,
                             "map it with colabkit.portable_path(...) where it is used")
            return
        if not self.on("CK402"):
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

    # pass 2: magics and shell escapes -----------------------------------------------------------------------
    def _escapes(self, work):
        for esc in work.code.escapes:
            if work.is_guarded((esc.line, esc.col)):
                continue
            if esc.kind == "magic":
                self._magic(work, esc)
            elif esc.kind in ("system", "getoutput"):
                self._shell(work, esc)

    def _magic(self, work, esc):
        line_text = work.content(esc.line)
        if esc.name == "tensorflow_version":
            if not self.on("CK310"):
                return
            version = esc.arg.strip()
            manual = "" if version.startswith("2") else \
                "TensorFlow 1.x is gone from Colab too: port this notebook to TensorFlow 2 (tf.compat.v1 helps)"
            found = work.finding("CK310", esc.line, f"%tensorflow_version {version} commented out", True, manual)
            note = "  # colabkit migrate: Colab-only magic, no effect on current Colab"
            original = line_text[esc.col:]
            stmt = work.statement_of(_node_at_line(work, esc.line))
            if stmt is not None and work.only_in_block(stmt):
                work.edit((esc.line, esc.col), (esc.end_line, len(work.content(esc.end_line))),
                          f"pass  # {original}{note}", found)
            else:
                work.edit((esc.line, esc.col), (esc.line, esc.col), "# ", found)
                work.edit((esc.end_line, len(work.content(esc.end_line))),
                          (esc.end_line, len(work.content(esc.end_line))), note, found)
            return
        if esc.name == "load_ext" and esc.arg.strip().startswith("google.colab"):
            if not self.on("CK308") or esc.assign:
                return
            indent = line_text[:esc.col]
            found = work.finding("CK308", esc.line, f"%load_ext {esc.arg.strip()} runs only on Colab", True)
            call = f"get_ipython().run_line_magic('load_ext', {esc.arg.strip()!r})"
            work.edit((esc.line, esc.col), (esc.end_line, len(work.content(esc.end_line))),
                      f"if colabkit.on_colab():\n{indent}{self.unit}{call}", found)
            return
        if esc.name in R.RAW_PATH_MAGICS:
            self._cd(work, esc)
        elif esc.name == "env" and not esc.assign:
            self._env(work, esc)
        elif esc.name in R.WORD_MAGICS:
            self._shell_paths(work, esc, f"%{esc.name}")
        else:
            self._report_paths(work, esc.line, esc.arg, f"%{esc.name}")

    def _cd(self, work, esc):
        if esc.end_line != esc.line:
            return
        arg = work.content(esc.line)[esc.content_col:]
        stripped = arg.rstrip()
        offset = 0
        while True:
            match = re.match(r"(-[qb]+\s+)", stripped[offset:])
            if not match:
                break
            offset += match.end()
        path = stripped[offset:]
        quoted = len(path) >= 2 and path[0] == path[-1] and path[0] in "'\""
        value = path[1:-1] if quoted else path
        found = classify_colab_path(value)
        if found is None:
            return
        if "{" in value or "$" in value:
            code = "CK104" if found.kind == "mountpoint" else "CK202"
            if self.on(code):
                work.finding(code, esc.line, f"%cd {value} left as it is: it is built with IPython's {{...}} / $ "
                             f"expansion", False, "rewrite it by hand as %cd {colabkit.drive(...)} / %cd {colabkit.workdir(...)}, "
                             "building the rest of the path in Python")
            return
        if found.kind == "mountpoint":
            if self.on("CK104"):
                work.finding("CK104", esc.line, f"%cd {value} is a Drive path outside My Drive", False)
            return
        if not self.on("CK202"):
            return
        expr = self._path_expr(found, quoted=False)
        start = (esc.line, esc.content_col + offset)
        end = (esc.line, esc.content_col + offset + len(path))
        text = "{" + expr + "}" + ("/" if found.trailing_slash else "")
        item = work.finding("CK202", esc.line, f"%cd {value} -> %cd {text}", True, self._path_manual(found))
        work.edit(start, end, text, item)

    def _env(self, work, esc):
        """%env NAME=/content/x (or %env NAME /content/x): the value is one raw path, like %cd's."""
        if esc.end_line != esc.line:
            return
        arg = work.content(esc.line)[esc.content_col:]
        match = re.match(r"(\w+)(\s*=\s*|\s+)(\S.*?)\s*$", arg)
        if not match:
            return
        value = match.group(3)
        found = classify_colab_path(value)
        if found is None:
            self._report_paths(work, esc.line, value.replace(":", " "), "%env", "colabkit cannot rewrite paths there",
                               code="CK108")
            return
        code = "CK104" if found.kind == "mountpoint" else _path_code(found)
        if found.kind == "mountpoint" or "{" in value or "$" in value or _EMBEDDED_PATH.search(value[1:]):
            if self.on(code if found.kind == "mountpoint" else "CK108"):
                self._report_paths(work, esc.line, value.replace(":", " "), "%env",
                                   "it is a mount point, a list of paths or built with {...} / $",
                                   code=None if found.kind == "mountpoint" else "CK108")
            return
        if not self.on(code):
            return
        text = "{" + self._path_expr(found, quoted=False) + "}" + ("/" if found.trailing_slash else "")
        start = (esc.line, esc.content_col + match.start(3))
        end = (esc.line, esc.content_col + match.end(3))
        item = work.finding(code, esc.line, f"%env {match.group(1)}{match.group(2)}{value} -> {text}", True,
                            self._path_manual(found))
        work.edit(start, end, text, item)

    @staticmethod
    def _path_expr(found, quoted) -> str:
        func = "colabkit.drive" if found.kind == "drive" else "colabkit.workdir"
        args = []
        if found.rest:
            args.append(repr(found.rest))
        if quoted:
            args.append("quoted=True")
        return f"{func}({', '.join(args)})"

    def _shell(self, work, esc):
        command = esc.arg
        line_text = work.content(esc.line)
        head = _PIP_HEAD.match(line_text, esc.col)
        if head and esc.kind == "system" and not esc.assign and self.on("CK203"):
            if _unquoted_meta(command):
                work.finding("CK203", esc.line, "!pip with shell redirection or pipes kept as it is", False,
                             "!pip installs into the first pip on PATH, not necessarily the kernel's Python: "
                             "prefer %pip")
            else:
                found = work.finding("CK203", esc.line, f"{head.group(0)} -> %pip", True)
                work.edit((esc.line, esc.col), (esc.line, head.end()), "%pip", found)
        if _APT.match(command) and self.on("CK204"):
            segment = next((part for part in re.split(r"[|&;<>]", command) if _APT.match(part)), command)
            words = segment.split()
            after = words[words.index("install") + 1:] if "install" in words else []
            packages = [w for w in after if not w.startswith("-")]
            work.finding("CK204", esc.line, f"system package install: {command.strip()}", False,
                         f"install {' '.join(packages) or 'these packages'} with your system package manager")
        if "kaggle.json" in command and self.on("CK206"):
            work.finding("CK206", esc.line, "Kaggle credentials are copied here", False)
        if _NVIDIA_SMI.match(command) and esc.end_line == esc.line and self.on("CK205"):
            end = (esc.line, len(line_text))
            found = work.finding("CK205", esc.line, "nvidia-smi kept; explains itself where there is no GPU", True)
            work.edit(end, end, R.NVIDIA_SMI_FALLBACK, found)
            return
        self._shell_paths(work, esc, "!")

    def _shell_paths(self, work, esc, what):
        """Colab paths among the words of a shell escape or word magic -> {colabkit.drive(..., quoted=True)}."""
        command = esc.arg
        if not any(p in command for p in ("content", "drive")):
            return
        if esc.end_line != esc.line:
            self._continued_paths(work, esc, what)
            return
        why = self._dollar_problem(command)
        if why:
            self._report_paths(work, esc.line, command, what, why, hint=_dollar_hint(command, self.python_names))
            return
        line_text = work.content(esc.line)
        if line_text[esc.content_col:esc.content_col + len(command)] != command:
            self._report_paths(work, esc.line, command, what, "colabkit cannot locate its words in the line")
            return
        self._rewrite_words(work, esc.line, esc.content_col, command, what)

    def _dollar_problem(self, command) -> str:
        """Why a {colabkit...} expression cannot be added to this command because of its $ expansions ("" if it
        can). IPython expands $name and {expr} in one pass, all or nothing: if one name is missing (a shell
        variable), nothing is expanded. So every $name must be a name the notebook's Python binds."""
        if "$" not in command:
            return ""
        if "${" in command:
            return "it uses ${...}, which IPython reads as a Python expression"
        missing = sorted({name for name in _dollar_names(command) if name not in self.python_names})
        if missing:
            return (f"it uses {', '.join('$' + n for n in missing)}, which no Python code in the notebook binds "
                    f"(a shell variable?); IPython would then expand nothing, colabkit expressions included")
        return ""

    def _continued_paths(self, work, esc, what):
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
            self._report_paths(work, esc.line, esc.arg, what, "colabkit cannot locate its words in the lines",
                               code="CK209")
            return
        # A quote opened on one line and closed on another: each line read alone would be misread.
        spanning = split_words(joined) is None or any(split_words(text) is None for _, _, text in pieces)
        for number, start, text in pieces:
            if not any(p in text for p in ("content", "drive")):
                continue
            if spanning:
                self._report_paths(work, number, text, what, "a quoted string spans its lines", code="CK209")
                continue
            why = self._dollar_problem(esc.arg)
            if why:
                self._report_paths(work, number, text, what, why, code="CK209",
                                   hint=_dollar_hint(esc.arg, self.python_names))
                continue
            self._rewrite_words(work, number, start, text, what, continued=True)

    def _rewrite_words(self, work, line, col, command, what, continued=False):
        """Rewrite the Colab path words of ``command``, which starts at column ``col`` of ``line``; report any
        Colab path that is not a word of its own."""
        spans = path_spans(command, lambda p: classify_colab_path(p) is not None)
        if spans is None:
            self._report_paths(work, line, command, what, "its quoting is unbalanced",
                               code="CK209" if continued else None)
            return
        covered = []
        for span, word in spans:
            if _EMBEDDED_PATH.search(span.path[1:]):
                continue  # "/content/a.npz,/content/b.npz": a list of paths in one word (reported below)
            covered.append((word.start, word.end))
            found = classify_colab_path(span.path)
            if found.kind == "mountpoint":
                if self.on("CK104"):
                    work.finding("CK104", line, f"{span.path} is a Drive path outside My Drive", False)
                continue
            code = _path_code(found)
            if not self.on(code) or (continued and not self.on("CK209")):
                continue
            code = "CK209" if continued else code
            if any(c in found.rest for c in "{}!"):
                work.finding(code, line, f"{span.path} has characters IPython would expand", False,
                             "replace the path by hand")
                continue
            text = "{" + self._path_expr(found, quoted=True) + "}" + ("/" if found.trailing_slash else "") + span.suffix
            start = (line, col + span.start)
            end = (line, col + span.end)
            item = work.finding(code, line, f"{span.path} -> {text}", True, self._path_manual(found))
            work.edit(start, end, text, item)
        for match in _SHELL_PATH.finditer(command):
            if any(s <= match.start() < e for s, e in covered):
                continue
            found = classify_colab_path(match.group(0))
            if found is None:
                continue
            code = "CK209" if continued else "CK104" if found.kind == "mountpoint" else _path_code(found)
            if self.on(code):
                work.finding(code, line, f"Colab path {match.group(0)} in {what} left as it is: it is not a word "
                             f"of its own (part of a quoted list or a longer word)", False, _by_hand(found))
            return

    def _report_paths(self, work, line, text, what, why="colabkit cannot rewrite paths there", code=None,
                      hint=""):
        override = code
        words = split_words(text)
        tokens = [piece for w in words for piece in re.split(r"[=,]", w.value)] if words is not None else \
            re.split(r"[\s\"'=,]+", text)
        for token in tokens:
            found = classify_colab_path(token.rstrip(";,)"))
            if found is None:
                continue
            code = override or ("CK104" if found.kind == "mountpoint" else _path_code(found))
            if self.on(code):
                work.finding(code, line, f"Colab path {token} in {what} left as it is: {why}", False,
                             _by_hand(found) + hint)
            return

    # cell magics ----------------------------------------------------------------------------------------------
    def _cell_magic(self, work):
        magic = work.code.magic
        if magic is None:
            return
        name, args = magic
        first = work.content(0)
        if name == "shell" and self.on("CK207"):
            found = work.finding("CK207", 0, "%%shell -> %%bash", True)
            work.edit((0, 2), (0, 2 + len("shell")), "bash", found)
        shell_body = name in ("bash", "sh", "shell") or (name == "script" and args.split()[:1] in (["bash"], ["sh"]))
        if shell_body and self.on("CK208"):
            for number in range(1, len(work.lines)):
                for token in re.split(r"[\s\"'=]+", work.content(number)):
                    if classify_colab_path(token) is not None:
                        work.finding("CK208", number, f"Colab path {token} in a %%{name} cell", False)
                        break
        if name == "writefile" and args:
            from .cells import Escape
            offset = first.index(args, 2 + len(name))
            pseudo = Escape(kind="magic", line=0, col=0, end_line=0, name=name, arg=args, assign=False,
                            content_col=offset, masked="")
            self._shell_paths(work, pseudo, "%%writefile")

    # forms ----------------------------------------------------------------------------------------------------
    def _forms(self, work):
        if not self.on("CK401") or "@" not in work.source:
            return
        masked = "".join(work.code.masked or work.lines)
        try:
            comments = [(t.start[0] - 1, t.string) for t in tokenize.generate_tokens(io.StringIO(masked).readline)
                        if t.type == tokenize.COMMENT]
        except (tokenize.TokenError, SyntaxError, IndentationError):
            comments = [(i, line) for i, line in enumerate(work.lines) if _FORM.search(line)]
        kinds = Counter(m.group(1) for _, text in comments for m in [_FORM.search(text)] if m)
        if kinds:
            first = min(line for line, text in comments if _FORM.search(text))
            summary = ", ".join(f"{n} {k}" for k, n in sorted(kinds.items()))
            work.finding("CK401", first, f"Colab form kept ({summary}); plain comments elsewhere", False)

    # pass 3: imports of google.colab -----------------------------------------------------------------------------
    def _imports(self, works):
        if not self.on("CK301"):
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
                    guarded_imports.update(_binding(node, a) for a in node.names)
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
                    (colab if _is_colab(qual) else other).append(alias)
                if not colab:
                    continue
                if not work.owns_lines(node):
                    work.finding("CK301", node.lineno - 1, "google.colab import shares its line; left as it is",
                                 False, "move it to its own line and run colabkit migrate again")
                    continue
                keep = [a for a in colab if _binding(node, a) in residual]
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
                    parts.append(self.unit + _import_text(node, keep))
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

    # pass 4: "import colabkit" before the first use ---------------------------------------------------------
    def _ensure_import(self, works):
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

    # applying edits -----------------------------------------------------------------------------------------
    def _apply(self, work) -> CellResult:
        lines = work.lines
        starts = [0]
        for line in lines:
            starts.append(starts[-1] + len(line))
        source = work.source

        def offset(pos):
            line, col = pos
            return starts[min(line, len(lines))] + col

        edits = sorted(work.edits, key=lambda e: (offset(e.start), offset(e.end), e.order))
        if lines and lines[0].endswith("\r\n"):  # the cell uses Windows line breaks: so do the new lines
            for e in edits:
                e.text = e.text.replace("\n", "\r\n")
        pieces, last, size = [], 0, 0
        for e in edits:
            s, t = offset(e.start), offset(e.end)
            if s < last:  # overlapping edits: keep the first, report the other as not applied
                if e.finding is not None:
                    e.finding.applied = False
                    e.finding.manual = e.finding.manual or "overlaps another change; check by hand"
                continue
            pieces.append(source[last:s])
            size += s - last
            pieces.append(e.text)
            e.new_span = (size, size + len(e.text))
            size += len(e.text)
            last = t
        pieces.append(source[last:])
        new_source = "".join(pieces)
        raw_lines = new_source.split("\n")
        new_starts = [0]
        for line in raw_lines:
            new_starts.append(new_starts[-1] + len(line) + 1)
        new_lines = [line.rstrip("\r") for line in raw_lines]
        by_finding = {}
        for e in edits:
            if e.new_span is not None and e.finding is not None:
                by_finding.setdefault(id(e.finding), []).append(e)
        for found in work.findings:
            mine = by_finding.get(id(found))
            if not mine:
                found.before = [work.content(found.line - 1)] if found.line - 1 < len(lines) else []
                if found.applied:
                    found.applied = False
                found.after = None
                continue
            first_line = min(e.start[0] for e in mine)
            last_line = max(e.end[0] - 1 if e.end[1] == 0 and e.end[0] > e.start[0] else e.end[0] for e in mine)
            whole_line_inserts = all(e.start == e.end and e.start[1] == 0 and e.text.endswith("\n") for e in mine)
            found.before = [] if whole_line_inserts else \
                [work.content(i) for i in range(first_line, min(last_line, len(lines) - 1) + 1)]
            lo = min(e.new_span[0] for e in mine)
            hi = max(e.new_span[1] for e in mine)
            a = bisect.bisect_right(new_starts, lo) - 1
            b = bisect.bisect_right(new_starts, max(lo, hi - 1 if hi > lo else hi)) - 1
            found.after = [] if hi == lo and all(not e.text for e in mine) and \
                all(e.start[1] == 0 and e.end[1] == 0 for e in mine) else new_lines[a:b + 1]
        work.findings.sort(key=lambda f: (f.line, f.code))
        return CellResult(index=work.index, source=work.source, new_source=new_source, findings=work.findings)


# helpers ---------------------------------------------------------------------------------------------------------

def _indent_unit(works) -> str:
    """The notebook's indentation step (Colab writes 2 spaces, most editors 4)."""
    steps = Counter()
    for work in works:
        previous = None
        for line in work.lines:
            stripped = line.strip()
            if not stripped or stripped.startswith("#"):
                continue
            width = len(line) - len(line.lstrip(" "))
            if previous is not None and previous[1].endswith(":") and width > previous[0]:
                steps[width - previous[0]] += 1
            previous = (width, stripped.split("#")[0].rstrip())
    if not steps:
        return "    "
    return " " * steps.most_common(1)[0][0]


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
        return any(_is_colab(a.name) for a in node.names)
    if isinstance(node, ast.ImportFrom):
        return bool(node.module) and (_is_colab(node.module) or (
            node.module == "google" and any(a.name == "colab" for a in node.names)))
    return False


def _binding(node, alias) -> str:
    if alias.asname:
        return alias.asname
    if isinstance(node, ast.Import):
        return alias.name.split(".")[0]
    return alias.name


def _import_text(node, aliases) -> str:
    names = ", ".join(a.name + (f" as {a.asname}" if a.asname else "") for a in aliases)
    if isinstance(node, ast.Import):
        return f"import {names}"
    return f"from {'.' * node.level}{node.module or ''} import {names}"


def _dotted(node) -> str:
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if isinstance(node, ast.Name):
        parts.append(node.id)
        return ".".join(parts[::-1])
    return ""


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


def _lines_inside_strings(work, stmt) -> set:
    """0-based lines of ``stmt`` that begin inside a multi-line string (re-indenting them would change it)."""
    inside = set()
    for node in ast.walk(stmt):
        if isinstance(node, (ast.Constant, ast.JoinedStr)) and getattr(node, "end_lineno", None) and \
                node.end_lineno > node.lineno:
            inside.update(range(node.lineno, node.end_lineno))  # 0-based lines after the first
    return inside


def _node_at_line(work, line):
    for node in ast.walk(work.code.tree):
        if isinstance(node, ast.stmt) and node.lineno - 1 == line:
            return node
    return None
