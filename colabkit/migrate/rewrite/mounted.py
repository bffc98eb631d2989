"""'Is Drive mounted?' however a notebook asks it -> colabkit.drive_mounted() (CK107).

Notebooks test the mount point before ``drive.mount(...)`` (or before a backup or export step) in many spellings:
``os.path.exists / isdir / lexists / ismount('/content/drive')``, ``Path('/content/drive').is_mount()``,
``pathlib.Path('/content/drive/MyDrive').exists()``, ``'drive' in os.listdir('/content')``; the mount point may
be '/content/drive', '/content/gdrive' or '/gdrive', with or without a trailing '/' or '/MyDrive'. Each asks
whether My Drive is there, which colabkit.drive_mounted() answers on Colab (Drive mounted, without mounting it) and
elsewhere (the drive_root folder exists), so the branch goes the same way on both. The bare mount point left in a
variable is reported with that replacement (what the variable is for is not known).
"""
from __future__ import annotations

import ast

from .colab import dotted

# Calls whose first argument is tested for existence.
EXISTS_CALLS = frozenset({"os.path.exists", "os.path.isdir", "os.path.lexists", "os.path.ismount", "path.exists",
                          "path.isdir", "path.lexists", "path.ismount", "exists", "isdir", "lexists", "ismount"})
# pathlib: Path(p).exists() and kin.
PATH_CLASSES = frozenset({"Path", "pathlib.Path", "PosixPath", "pathlib.PosixPath"})
PATH_TESTS = frozenset({"exists", "is_dir", "is_mount"})
# The folders Colab mounts Drive in, as names listed in /content: 'drive' in os.listdir('/content').
MOUNT_NAMES = frozenset({"drive", "gdrive"})
LISTDIR = frozenset({"os.listdir", "listdir"})

REPLACEMENT = "colabkit.drive_mounted()"
MOUNT_POINT_MANUAL = ("if this tests whether Drive is mounted, write colabkit.drive_mounted() instead (on Colab: "
                      "is Drive mounted; elsewhere: is drive_root there); for files in My Drive use "
                      "colabkit.drive('...')")


def check(ctx, work, node, parent, found) -> bool:
    """Rewrite the existence test ``node`` (a Colab mount point literal) belongs to, if it is one. True when the
    literal is dealt with (rewritten, or a test the rule is off for)."""
    if found.rest:
        return False
    test = _test_of(work, node, parent, found)
    if test is None:
        return False
    expression, negated = test
    if not ctx.on("CK107"):
        return found.kind == "mountpoint"
    text = REPLACEMENT
    if negated:
        outer = work.parents.get(expression)
        text = f"not {REPLACEMENT}"
        if isinstance(outer, (ast.Compare, ast.BinOp, ast.Attribute, ast.Subscript, ast.UnaryOp)):
            text = f"({text})"
    original = work.text(work.start(expression), work.end(expression))
    found_ = work.finding("CK107", node.lineno - 1, f"{original} -> {text}: whether My Drive is there, without "
                          f"mounting it (off Colab: the drive_root folder)", True)
    for inner in ast.walk(expression):
        work.handled.add(inner)
    work.edit(work.start(expression), work.end(expression), text, found_)
    return True


def _test_of(work, node, parent, found):
    """(the expression that tests the mount point, whether it asks 'not mounted') or None."""
    if not isinstance(parent, ast.Call) or parent.keywords or len(parent.args) != 1 or parent.args[0] is not node:
        return None
    func = dotted(parent.func)
    if found.kind in ("mountpoint", "drive"):
        if func in EXISTS_CALLS:
            return parent, False
        method = work.parents.get(parent)
        call = work.parents.get(method)
        if func in PATH_CLASSES and isinstance(method, ast.Attribute) and method.value is parent and \
                method.attr in PATH_TESTS and isinstance(call, ast.Call) and call.func is method and \
                not call.args and not call.keywords:
            return call, False
        return None
    # 'drive' in os.listdir('/content')
    compare = work.parents.get(parent)
    if func in LISTDIR and isinstance(compare, ast.Compare) and len(compare.ops) == 1 and \
            compare.comparators[0] is parent and isinstance(compare.ops[0], (ast.In, ast.NotIn)) and \
            isinstance(compare.left, ast.Constant) and compare.left.value in MOUNT_NAMES:
        return compare, isinstance(compare.ops[0], ast.NotIn)
    return None


def report_mount_point(ctx, work, node, value) -> None:
    """The bare mount point used some other way ('/content/drive' in a variable, os.listdir('/content/drive')):
    reported, with what to write if it tests the mount (CK104)."""
    if ctx.on("CK104"):
        work.finding("CK104", node.lineno - 1, f"{value!r} is the Drive mount point itself, not a path in My "
                     f"Drive; left as it is", False, MOUNT_POINT_MANUAL)


def is_mount_point(found) -> bool:
    """The Drive mount point itself ('/content/drive', '/content/gdrive', '/gdrive'), not a folder beside My
    Drive."""
    return found.kind == "mountpoint" and not found.rest
