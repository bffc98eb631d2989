"""The state the rule families share: the notebook's (active rules, google.colab names) and each cell's."""
from __future__ import annotations

import ast
import dataclasses
from collections import Counter

from .. import rules as R
from . import links
from .edits import Edit, Finding


@dataclasses.dataclass
class Context:
    """Notebook-wide state: which rules are on, and what the first pass learnt about the whole notebook."""
    active: frozenset
    drive_root: object = None
    unit: str = "    "                      # the notebook's indentation step
    install_from: str | None = None         # where the install cell gets colabkit (a pip URL), else detected
    bindings: dict = dataclasses.field(default_factory=dict)      # name -> the google.colab name it is bound to
    python_names: set = dataclasses.field(default_factory=set)    # names the notebook's Python binds at top
    #                                                                level: what IPython's $name expands
    links: dict = dataclasses.field(default_factory=dict)         # root link -> the Colab path it points to
    link_sites: dict = dataclasses.field(default_factory=dict)    # (cell, line) -> (link, target, handled)
    condacolab: set = dataclasses.field(default_factory=set)      # names bound to the condacolab module
    hf_names: dict = dataclasses.field(default_factory=dict)      # name -> transformers / trl / accelerate name
    hf_subclasses: set = dataclasses.field(default_factory=set)   # the notebook's own classes among them
    hf_resume_used: set = dataclasses.field(default_factory=set)  # "AutoResume" / "AccelerateResume" in use

    def on(self, code) -> bool:
        return code in self.active

    def classify(self, path):
        """A Colab path (portable.ColabPath), a path through a root link to one (links.LinkedPath), or None."""
        return links.classify(self, path)

    def mentions_paths(self, text) -> bool:
        """``text`` may hold a Colab path or a path through a root link (a cheap test before parsing it)."""
        return "content" in text or "drive" in text or any(link in text for link in self.links)


class CellWork:
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

    def statement_at_line(self, line):
        """A statement that begins on 0-based ``line`` (None if none does)."""
        for node in ast.walk(self.code.tree):
            if isinstance(node, ast.stmt) and node.lineno - 1 == line:
                return node
        return None

    # findings ---------------------------------------------------------------------------------------------
    def finding(self, code, line, message, applied, manual=None) -> Finding:
        """Record a finding; ``manual`` None means the rule's own "by hand" text."""
        found = Finding(code=code, cell=self.index, line=line + 1, message=message, applied=applied,
                        manual=R.BY_CODE[code].manual if manual is None else manual)
        self.findings.append(found)
        return found

    def edit(self, start, end, text, finding, **kw) -> Edit:
        e = Edit(start=start, end=end, text=text, finding=finding, **kw)
        self.edits.append(e)
        return e


def indent_unit(works) -> str:
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
