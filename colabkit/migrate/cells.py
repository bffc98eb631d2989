"""Reading one code cell the way IPython does: magics, shell escapes and the Python around them.

Magics and shell escapes are found by IPython's own input transformer (``IPython.core.inputtransformer2``, the
code every IPython kernel runs on each cell), one construct at a time, exactly as ``TransformerManager`` does;
each is replaced by the Python call IPython would run, padded so that line numbers stay those of the original
cell. The result parses with ``ast``, so everything else is found by Python's own parser, with positions that
point into the original source.
"""
from __future__ import annotations

import ast
import dataclasses
import importlib.util
import os
import sys
import warnings

from .nbjson import split_lines

_AST_FLAGS = ast.PyCF_ONLY_AST | getattr(ast, "PyCF_ALLOW_TOP_LEVEL_AWAIT", 0)
# IPython's input transformer holds every token of a cell and tokenizes it again for each magic it replaces
# (about 450 bytes of memory per byte of source: a 50 MB cell took 19 GB). A cell past these bounds is generated
# data rather than code to migrate; it is left as it is, with a note.
MAX_CELL_LINES = 10_000
MAX_CELL_CHARS = 2_000_000
_it2 = None


def inputtransformer():
    """IPython's ``inputtransformer2`` module.

    In IPython 8 it depends on the standard library only, so when IPython is not imported yet it is loaded
    from IPython's installation by itself: ``import IPython`` 8 costs about 0.3 s, which would make
    ``colabkit migrate --check`` in a pre-commit hook feel slow. IPython 9's imports ``IPython.utils`` (a
    lighter package import, ~0.1 s): then, as on any surprise, the normal import is used.
    """
    global _it2
    if _it2 is not None:
        return _it2
    module = sys.modules.get("IPython.core.inputtransformer2")
    if module is None:
        try:
            spec = importlib.util.find_spec("IPython")  # finds IPython without importing it
            path = os.path.join(os.path.dirname(spec.origin), "core", "inputtransformer2.py")
            file_spec = importlib.util.spec_from_file_location("colabkit.migrate._ipython_inputtransformer2", path)
            module = importlib.util.module_from_spec(file_spec)
            file_spec.loader.exec_module(module)
            module.TransformerManager  # noqa: B018  (the API this module relies on)
        except Exception:  # noqa: BLE001 - any surprise: use the ordinary import below
            module = None
    if module is None:
        from ..optional import require
        module = require("IPython.core.inputtransformer2", "notebook", "Finding magics and shell escapes")
    _it2 = module
    return module


@dataclasses.dataclass
class Escape:
    """A line magic, shell escape or help request, as IPython reads it."""
    kind: str        # "system" (!cmd), "getoutput" (!!cmd, x = !cmd), "magic" (%name, x = %name), "help", "other"
    line: int        # 0-based first line in the cell
    col: int         # column of the escape character
    end_line: int    # 0-based last line (after backslash continuations)
    name: str        # the magic's name ("" for shell escapes)
    arg: str         # what IPython passes on: the command, or the magic's argument string
    assign: bool     # x = !cmd / x = %magic
    content_col: int  # column where ``arg`` starts in the line (single-line escapes)
    masked: str      # the Python line IPython runs instead


@dataclasses.dataclass
class CellCode:
    """A code cell read the way IPython reads it."""
    lines: list                 # the original lines ("\n" kept)
    magic: tuple = None         # (name, first-line arguments) of a cell magic (the innermost of a stack)
    magics: list = dataclasses.field(default_factory=list)  # [(name, arguments, line)]: %%capture over %%shell...
    comments_above: int = 0     # lines of comments (and blanks) above the first cell magic: Colab runs such a
    #                             cell as the magic, IPython only with the magic on the first line
    body_start: int = 0         # first line of Python (the line after the cell magics whose body is Python)
    python: bool = True         # the (body of the) cell is Python and was analysed
    escapes: list = dataclasses.field(default_factory=list)
    tree: ast.Module = None
    masked: list = None         # the lines with magics and escapes replaced by IPython's Python calls
    problem: tuple = None       # (rule code, line (1-based), message) when the cell is left alone


def _compile(text: str):
    """ast of ``text``; the warnings CPython gives about the notebook's own code (invalid escape sequences such as
    "My\\ Drive") are the notebook's business, not migrate's."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return compile(text, "<cell>", "exec", _AST_FLAGS)


def read_cell(source: str, python_cell_magics) -> CellCode:
    too_large = _too_large(source)
    if too_large:  # checked before the cell is split into lines, which costs its own memory
        return CellCode(lines=[], problem=("CK002", 1, too_large))
    lines = split_lines(source)
    cell = CellCode(lines=lines)
    if not lines:
        cell.tree = ast.Module(body=[], type_ignores=[])
        return cell
    if "\r" in source.replace("\r\n", ""):
        cell.problem = ("CK002", 1, "the cell has lone carriage returns (\\r) as line breaks")
        return cell
    if not _read_cell_magics(cell, lines, python_cell_magics):
        return cell
    code_lines = ["\n"] * cell.body_start + lines[cell.body_start:]
    try:
        cell.tree = _compile("".join(code_lines))
        return cell  # valid Python as it stands: IPython would change nothing
    except (SyntaxError, ValueError):
        pass
    except (MemoryError, RecursionError) as exc:  # what IPython's escapes would change leaves it as deep
        cell.problem = ("CK001", 1, _too_deep(exc))
        return cell
    it2 = inputtransformer()
    work = [line if line.endswith("\n") else line + "\n" for line in code_lines]
    first = next((i for i in range(cell.body_start, len(work)) if work[i].strip()), None)
    if first is not None and work[first][:1] in (" ", "\t"):
        cell.problem = ("CK002", first + 1, "the whole cell is indented (IPython strips that before running it)")
        return cell
    body = work[cell.body_start:]
    if it2.classic_prompt(body) != body or it2.ipython_prompt(body) != body:
        cell.problem = ("CK002", cell.body_start + 1, "the cell holds pasted prompts ('>>>' or 'In [1]:')")
        return cell
    try:
        cell.escapes, masked = _find_escapes(work, it2)
        cell.masked = masked
    except Exception as exc:  # noqa: BLE001 - IPython itself could not read it
        cell.problem = ("CK002", 1, f"IPython's input transformer failed on it ({exc})")
        return cell
    try:
        cell.tree = _compile("".join(masked))
    except SyntaxError as exc:
        cell.problem = ("CK001", exc.lineno or 1, f"SyntaxError: {exc.msg}")
    except ValueError as exc:
        cell.problem = ("CK001", 1, f"not valid Python source: {exc}")
    except (MemoryError, RecursionError) as exc:
        cell.problem = ("CK001", 1, _too_deep(exc))
    return cell


def _magic_start(lines: list) -> tuple:
    """(line of the cell magic IPython or Colab runs, lines of comments above it). IPython drops blank lines at
    the top of a cell; Colab also runs a cell magic below comment lines (a note, a form title)."""
    comments = 0
    for number, line in enumerate(lines):
        if line.startswith("%%"):
            return number, comments
        stripped = line.strip()
        if stripped.startswith("#"):
            comments = number + 1
        elif stripped:
            break
    return None, 0


def _read_cell_magics(cell, lines, python_cell_magics) -> bool:
    """Fill in the cell magics of ``cell``; False when its body is not Python (nothing more to read)."""
    start, comments = _magic_start(lines)
    if start is None:
        return True
    it2 = inputtransformer()
    while True:
        body = [line if line.endswith("\n") else line + "\n" for line in lines[start:]]
        transformed = it2.cell_magic(body)
        call = _parse_call(transformed[0]) if len(transformed) == 1 else None
        if call is None or call[0] != "run_cell_magic":
            return True
        name, first_line = call[1][0], call[1][1]
        cell.magic = (name, first_line)
        cell.magics.append((name, first_line, start))
        cell.comments_above = comments
        if name not in python_cell_magics:
            cell.python = False
            return False
        cell.body_start = start + 1
        # the body of %%capture / %%time is a cell IPython reads again: it may start with a cell magic of its own
        following = next((n for n in range(start + 1, len(lines)) if lines[n].strip()), None)
        if following is None or not lines[following].startswith("%%"):
            return True
        start = following


def _too_large(source: str) -> str:
    lines = source.count("\n") + (not source.endswith("\n"))
    if lines > MAX_CELL_LINES:
        return f"it has {lines} lines, more than colabkit migrate reads in one cell ({MAX_CELL_LINES})"
    if len(source) > MAX_CELL_CHARS:
        return f"it has {len(source)} characters, more than colabkit migrate reads in one cell ({MAX_CELL_CHARS})"
    return ""


def _too_deep(exc: BaseException) -> str:
    """Python's parser stops on code nested past its own limits (100,000 unary minus signs: MemoryError, a chain of
    thousands of operators: RecursionError) after little work; Python could not run the cell either."""
    return f"Python's parser gives up on it: nested too deeply ({type(exc).__name__})"


def _parse_call(code: str):
    """(method name, [literal args]) of ``get_ipython().method(...)`` in ``code``, else None."""
    try:
        node = ast.parse(code.strip()).body[0]
    except (SyntaxError, IndexError):
        return None
    value = getattr(node, "value", None)
    if not (isinstance(value, ast.Call) and isinstance(value.func, ast.Attribute)):
        return None
    try:
        args = [ast.literal_eval(a) for a in value.args]
    except ValueError:
        args = []
    return value.func.attr, args


def _find_escapes(lines: list, it2):
    """Run IPython's token transformers one construct at a time (as TransformerManager.do_token_transforms
    does), keeping line numbers: the lines a construct spanned become its Python call plus blank lines."""
    token_transformers = it2.TransformerManager().token_transformers
    lines = list(lines)
    escapes = []
    for _ in range(it2.TRANSFORM_LOOP_LIMIT):
        tokens_by_line = it2.make_tokens_by_line(lines)
        candidates = [t for t in (cls.find(tokens_by_line) for cls in token_transformers) if t]
        chosen = None
        for transformer in sorted(candidates, key=it2.TokenTransformBase.sortby):
            try:
                new_lines = transformer.transform(lines)
            except SyntaxError:
                continue
            chosen = transformer
            break
        if chosen is None:
            return escapes, lines
        start = chosen.start_line
        joined = len(lines) - len(new_lines)
        new_lines[start + 1:start + 1] = ["\n"] * joined
        escapes.append(_escape(chosen, lines, start, start + joined, new_lines[start]))
        lines = new_lines
    raise RuntimeError("input transformation did not settle")


def _escape(transformer, lines, start, end, masked_line) -> Escape:
    col = transformer.start_col
    text = lines[start][col:]
    kind_by_class = {"SystemAssign": "getoutput", "MagicAssign": "magic", "HelpEnd": "help"}
    cls_name = type(transformer).__name__
    if cls_name in kind_by_class:
        kind = kind_by_class[cls_name]
    elif text.startswith("!!"):
        kind = "getoutput"
    elif text.startswith("!"):
        kind = "system"
    elif text.startswith("%"):
        kind = "magic"
    elif text.startswith("?"):
        kind = "help"
    else:
        kind = "other"
    name, arg, content_col = "", "", col
    call = _parse_call(masked_line)
    if call is not None:
        method, args = call
        if method in ("system", "getoutput") and args:
            arg = args[0]
            content_col = col + (2 if text.startswith("!!") else 1)
        elif method == "run_line_magic" and len(args) == 2 and kind == "magic":
            name, arg = args
            content_col = col + 1 + len(name) + 1
    return Escape(kind=kind, line=start, col=col, end_line=end, name=name, arg=arg,
                  assign=cls_name in ("SystemAssign", "MagicAssign"), content_col=content_col, masked=masked_line)
