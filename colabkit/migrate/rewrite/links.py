"""Links to Drive made at the filesystem root (CK109): ``!ln -s /content/drive/MyDrive /mydrive``, then
``/mydrive/...``.

Notebooks shorten Drive paths with a link at the root (``/mydrive``, ``/proj``, ``os.symlink(...)`` too). At home
that link cannot be made without root, and the paths through it point nowhere. The link's target is a Colab path,
so every path through the link has the same portable equivalent: ``/mydrive/data/x.csv`` is
``/content/drive/MyDrive/data/x.csv`` is ``colabkit.drive('data/x.csv')``. Such paths are rewritten like the Colab
paths they stand for (in Python strings, shell lines and %cd, in every cell of the notebook), and the link itself
then runs only on Colab (``if colabkit.on_colab():``), where it keeps working for anything left as it was.

A link made elsewhere outside the working folder (``/root/.kaggle``, ``/usr/...``, a deeper path) is what some
program looks for at that place, which colabkit cannot move: it is reported, with the portable path of its target.
"""
from __future__ import annotations

import ast
import dataclasses
import posixpath
import re

from ...portable import ColabPath, classify_colab_path
from ..shell import split_words
from .calls import guard_statement
from .colab import dotted

# Root folders a notebook links into for what some program expects there: reported, not rewritten.
SYSTEM_DIRS = frozenset({"bin", "boot", "dev", "etc", "home", "lib", "lib32", "lib64", "media", "mnt", "opt", "proc",
                         "root", "run", "sbin", "srv", "sys", "tmp", "usr", "var", "content", "gdrive", "kaggle"})
_SAFE_BASE = re.compile(r"^[\w .+,@%=-]*(?:/[\w .+,@%=-]*)*$")


@dataclasses.dataclass(frozen=True)
class LinkedPath(ColabPath):
    """A path through a root link: ``prefix`` is the link ('/proj'), ``rest`` the path below My Drive (or /content)
    it stands for ('proj/x'), ``base`` the part of it that the link's target gives ('proj')."""
    base: str = ""


def classify(ctx, path):
    """A Colab path, or a path through one of the notebook's root links (LinkedPath), or None."""
    found = classify_colab_path(path)
    if found is not None or not ctx.links or not isinstance(path, str):
        return found
    for link, target in ctx.links.items():
        if path == link or path.startswith(link + "/"):
            after = path[len(link):]
            below = after.lstrip("/")
            stands_for = classify_colab_path(target + ("/" + below if below else ""))
            if stands_for is None:
                return None
            return LinkedPath(kind=stands_for.kind, spelling="link", prefix=link, rest=stands_for.rest,
                              trailing_slash=not below and after.endswith("/"),
                              base=classify_colab_path(target).rest)
    return None


def literal_rest(found, raw_after, quote, fstring):
    """The text of the string literal that gives the path below My Drive (or /content) for a path through a link,
    from the raw text written after the link in the original literal; None when the target's part cannot be
    written into that literal as it is."""
    base = found.base
    if base and (not _SAFE_BASE.match(base) or quote in base or (fstring and ("{" in base or "}" in base))):
        return None
    return base + raw_after if base else raw_after.lstrip("/")


def collect(ctx, works):
    """Pass 1: the notebook's root links to Colab paths, into ``ctx.links`` (link -> target); the ``ln`` and
    ``os.symlink`` statements that make them, into ``ctx.link_sites`` (work index, line) -> (link, target,
    handled: a root link whose uses are rewritten)."""
    for work in works:
        if work.code.problem is not None:
            continue
        for esc in work.code.escapes:
            if esc.kind == "system" and "ln" in esc.arg:
                _add(ctx, work.index, esc.line, _ln_args(esc.arg))
        if work.code.tree is not None and "symlink" in work.source:
            for node in ast.walk(work.code.tree):
                if isinstance(node, ast.Call) and dotted(node.func) in ("os.symlink", "symlink") and \
                        len(node.args) == 2 and not node.keywords and \
                        all(isinstance(a, ast.Constant) and isinstance(a.value, str) for a in node.args):
                    _add(ctx, work.index, node.lineno - 1, (node.args[0].value, node.args[1].value))


def _add(ctx, index, line, args):
    if args is None:
        return
    target, path = args
    found = classify_colab_path(target)
    if found is None or not path.startswith("/") or classify_colab_path(path) is not None:
        return
    path, target = posixpath.normpath(path), target.rstrip("/") or target
    handled = path.count("/") == 1 and path[1:] not in SYSTEM_DIRS and path != "/"
    if handled:
        ctx.links[path] = target
    ctx.link_sites[(index, line)] = (path, target, handled)


def _ln_args(command):
    """(target, link) of 'ln -s TARGET LINK' (options anywhere, -s required), else None."""
    words = split_words(command)
    if not words or words[0].value != "ln":
        return None
    options = [w.value for w in words[1:] if w.value.startswith("-")]
    operands = [w.value for w in words[1:] if not w.value.startswith("-")]
    symbolic = any(o == "--symbolic" or (not o.startswith("--") and "s" in o[1:]) for o in options)
    if not symbolic or len(operands) != 2 or any(o in ("-t", "--target-directory") for o in options):
        return None
    return operands[0], operands[1]


def site(ctx, work, line):
    """(link, target, handled) when ``line`` of ``work`` makes a root link, else None."""
    return ctx.link_sites.get((work.index, line))


def link_finding(ctx, work, line, link, target, handled):
    """The finding for the statement that makes a link: applied (it now runs only on Colab), or reported."""
    found = classify_colab_path(target)
    func = "colabkit.drive" if found.kind == "drive" else "colabkit.workdir"
    expr = f"{func}({found.rest!r})" if found.rest else f"{func}()"
    if handled:
        return work.finding("CK109", line, f"the link {link} -> {target} is made only on Colab; paths through it "
                            f"become {expr}...", True, "")
    return work.finding("CK109", line, f"the link {link} -> {target} is outside the working folder: off Colab "
                        f"creating it may need root, and what looks for {link} is left as it is", False,
                        f"off Colab, use {expr} where the notebook uses {link}, or make the link yourself where "
                        f"the program looking for {link} finds it")


def symlink(ctx, work, node):
    """os.symlink('/content/drive/MyDrive', '/mydrive') making a root link: the statement runs only on Colab."""
    link = site(ctx, work, node.lineno - 1) if dotted(node.func) in ("os.symlink", "symlink") else None
    if link is None or not ctx.on("CK109") or work.is_guarded(work.start(node)):
        return
    path, target, handled = link
    work.handled.update(node.args)  # the link's own paths stay as they are (on Colab it still makes the link)
    found = link_finding(ctx, work, node.lineno - 1, path, target, handled)
    stmt = work.parents.get(node)
    if not handled:
        work.handled.difference_update(node.args[:1])  # its target is still rewritten (a link made off Colab)
        return
    if isinstance(stmt, ast.Expr) and work.owns_lines(stmt):
        guard_statement(ctx, work, stmt, found)
    else:
        found.applied = False
        found.manual = "put this statement under 'if colabkit.on_colab():' by hand"
