"""IPython magics: %cd, %env, %tensorflow_version, %load_ext, word magics (%ls, %run...), cell magics (%%shell...)."""
from __future__ import annotations

import re

from .. import rules as R
from ..cells import Escape
from . import config_text
from .escapes import report_paths, shell_paths
from .paths import EMBEDDED_PATH, path_code, path_expr, path_manual


def line_magic(ctx, work, esc):
    """One line magic (%name, x = %name)."""
    line_text = work.content(esc.line)
    if esc.name == "tensorflow_version":
        if not ctx.on("CK310"):
            return
        version = esc.arg.strip()
        manual = "" if version.startswith("2") else \
            "TensorFlow 1.x is gone from Colab too: port this notebook to TensorFlow 2 (tf.compat.v1 helps)"
        found = work.finding("CK310", esc.line, f"%tensorflow_version {version} commented out", True, manual)
        note = "  # colabkit migrate: Colab-only magic, no effect on current Colab"
        original = line_text[esc.col:]
        stmt = work.statement_of(work.statement_at_line(esc.line))
        if stmt is not None and work.only_in_block(stmt):
            work.edit((esc.line, esc.col), (esc.end_line, len(work.content(esc.end_line))),
                      f"pass  # {original}{note}", found)
        else:
            work.edit((esc.line, esc.col), (esc.line, esc.col), "# ", found)
            work.edit((esc.end_line, len(work.content(esc.end_line))),
                      (esc.end_line, len(work.content(esc.end_line))), note, found)
        return
    if esc.name == "load_ext" and esc.arg.strip().startswith("google.colab"):
        if not ctx.on("CK308") or esc.assign:
            return
        indent = line_text[:esc.col]
        found = work.finding("CK308", esc.line, f"%load_ext {esc.arg.strip()} runs only on Colab", True)
        call = f"get_ipython().run_line_magic('load_ext', {esc.arg.strip()!r})"
        work.edit((esc.line, esc.col), (esc.end_line, len(work.content(esc.end_line))),
                  f"if colabkit.on_colab():\n{indent}{ctx.unit}{call}", found)
        return
    if esc.name in R.RAW_PATH_MAGICS:
        _cd(ctx, work, esc)
    elif esc.name == "env" and not esc.assign:
        _env(ctx, work, esc)
    elif esc.name in R.WORD_MAGICS:
        shell_paths(ctx, work, esc, f"%{esc.name}")
    else:
        report_paths(ctx, work, esc.line, esc.arg, f"%{esc.name}")


def _cd(ctx, work, esc):
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
    found = ctx.classify(value)
    if found is None:
        return
    if "{" in value or "$" in value:
        code = "CK104" if found.kind == "mountpoint" else "CK202"
        if ctx.on(code):
            work.finding(code, esc.line, f"%cd {value} left as it is: it is built with IPython's {{...}} / $ "
                         f"expansion", False,
                         "rewrite it by hand as %cd {colabkit.drive(...)} / %cd {colabkit.workdir(...)}, "
                         "building the rest of the path in Python")
        return
    if found.kind == "mountpoint":
        if ctx.on("CK104"):
            work.finding("CK104", esc.line, f"%cd {value} is a Drive path outside My Drive", False)
        return
    if not ctx.on("CK202"):
        return
    expr = path_expr(found, quoted=False)
    start = (esc.line, esc.content_col + offset)
    end = (esc.line, esc.content_col + offset + len(path))
    text = "{" + expr + "}" + ("/" if found.trailing_slash else "")
    item = work.finding("CK202", esc.line, f"%cd {value} -> %cd {text}", True, path_manual(ctx, found))
    work.edit(start, end, text, item)


def _env(ctx, work, esc):
    """%env NAME=/content/x (or %env NAME /content/x): the value is one raw path, like %cd's."""
    if esc.end_line != esc.line:
        return
    arg = work.content(esc.line)[esc.content_col:]
    match = re.match(r"(\w+)(\s*=\s*|\s+)(\S.*?)\s*$", arg)
    if not match:
        return
    value = match.group(3)
    found = ctx.classify(value)
    if found is None:
        report_paths(ctx, work, esc.line, value.replace(":", " "), "%env", "colabkit cannot rewrite paths there",
                     code="CK108")
        return
    code = "CK104" if found.kind == "mountpoint" else path_code(found)
    if found.kind == "mountpoint" or "{" in value or "$" in value or EMBEDDED_PATH.search(value[1:]):
        if ctx.on(code if found.kind == "mountpoint" else "CK108"):
            report_paths(ctx, work, esc.line, value.replace(":", " "), "%env",
                         "it is a mount point, a list of paths or built with {...} / $",
                         code=None if found.kind == "mountpoint" else "CK108")
        return
    if not ctx.on(code):
        return
    text = "{" + path_expr(found, quoted=False) + "}" + ("/" if found.trailing_slash else "")
    start = (esc.line, esc.content_col + match.start(3))
    end = (esc.line, esc.content_col + match.end(3))
    item = work.finding(code, esc.line, f"%env {match.group(1)}{match.group(2)}{value} -> {text}", True,
                        path_manual(ctx, found))
    work.edit(start, end, text, item)


def cell_magic(ctx, work):
    """The cell magics of the cell, if any: %%shell -> %%bash (CK207), Colab paths in a shell body (CK208), in
    %%writefile's file name; comment lines above the magic (CK210)."""
    code = work.code
    if not code.magics:
        return
    for name, _, line in code.magics:
        if name == "shell" and ctx.on("CK207"):
            found = work.finding("CK207", line, "%%shell -> %%bash", True)
            work.edit((line, 2), (line, 2 + len("shell")), "bash", found)
    name, args = code.magic
    magic_line = code.magics[-1][2]
    first = work.content(magic_line)
    if shell_body(name, args) and ctx.on("CK208"):
        for number in range(magic_line + 1, len(work.lines)):
            for token in re.split(r"[\s\"'=]+", work.content(number)):
                if ctx.classify(token) is not None:
                    work.finding("CK208", number, f"Colab path {token} in a %%{name} cell", False)
                    break
    if name == "writefile" and args and not config_text.writefile(ctx, work):
        offset = first.index(args, 2 + len(name))
        pseudo = Escape(kind="magic", line=magic_line, col=0, end_line=magic_line, name=name, arg=args,
                        assign=False, content_col=offset, masked="")
        shell_paths(ctx, work, pseudo, "%%writefile")
    if code.comments_above:
        _comments_above(ctx, work)


def shell_body(name, args) -> bool:
    """The body of cell magic ``name`` (first-line arguments ``args``) is run by a POSIX shell."""
    return name in ("bash", "sh", "shell") or (name == "script" and args.split()[:1] in (["bash"], ["sh"]))


# Cell magics whose body reads a line starting with '#' as a comment (besides those whose body is Python).
_HASH_COMMENT_BODIES = frozenset({"bash", "sh", "shell", "python", "python2", "python3", "pypy", "perl", "ruby"})


def _comments_above(ctx, work):
    """Comment lines above a cell magic (CK210). Colab runs such a cell as the magic; IPython runs a cell magic only
    on the first line (else the cell is a SyntaxError). Where the body reads '#' lines as comments (shell, Python)
    the magic line(s) move to the top and the comments right below them; otherwise (the comments would become part
    of a file, HTML, ...) it is reported."""
    if not ctx.on("CK210"):
        return
    code = work.code
    first_magic, last_magic = code.magics[0][2], code.magics[-1][2]
    top = next(n for n in range(first_magic) if work.lines[n].strip())  # blank lines above: IPython drops them
    name, args = code.magic
    script = args.split()[:1] if name == "script" else []
    shown = ", ".join(f"%%{n}" for n, _, _ in code.magics)
    if not (code.python or name in _HASH_COMMENT_BODIES or (script and script[0] in _HASH_COMMENT_BODIES)):
        first = work.content(first_magic)
        work.finding("CK210", first_magic, f"{shown} below comment lines: Colab runs it, IPython does not (a cell "
                     f"magic must be the first line); left as it is", False,
                     f"make '{first}' the first line of this cell and move the comment line(s) above it to a "
                     f"markdown cell (below it they would become part of the %%{name} text)")
        return
    comments = "".join(work.lines[top:first_magic])
    found = work.finding("CK210", top, f"{shown} below comment lines -> the magic first, the comments right after "
                         f"it (IPython runs a cell magic only on the first line; Colab also below comments)", True, "")
    work.edit((top, 0), (first_magic, 0), "", found)
    end = last_magic + 1
    if end >= len(work.lines) and not work.lines[last_magic].endswith("\n"):
        work.edit((last_magic, len(work.lines[last_magic])), (last_magic, len(work.lines[last_magic])),
                  "\n" + comments.rstrip("\n"), found, order=-1)
    else:
        work.edit((end, 0), (end, 0), comments, found, order=-1)
