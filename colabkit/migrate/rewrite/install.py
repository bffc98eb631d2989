"""The install cell (CK003): a migrated notebook starts on a fresh Colab runtime, where colabkit is not installed.

The cell migrate adds before the notebook's first code cell::

    # colabkit makes this notebook run on Colab and elsewhere; this cell installs it where it is missing
    # (a fresh Colab runtime). It installs the colabkit the notebook was migrated with; edit the line to change it
    try:
      import colabkit
    except ImportError:
      %pip install -q "colabkit @ git+https://github.com/ORG/colabkit@COMMIT"
      import importlib
      importlib.invalidate_caches()
      import colabkit

Why this form:

- ``try: import colabkit`` first, pip only on ImportError: where colabkit is installed (a home machine, a Colab
  runtime that already ran the cell) pip is not even started, so nothing is downloaded and nothing is upgraded
  behind the user's back, and "Run all" stays fast. (FEM on Colab's installation cells use the same idiom.)
- ``%pip``, not ``!pip``: it installs into the kernel's own Python, the one that will import colabkit (a venv or
  conda kernel at home, Colab's Python there); ``!pip`` runs whichever pip comes first on PATH. IPython turns a
  magic inside an ``except`` block into the same call as anywhere else, in any IPython kernel (Jupyter's,
  VS Code's, Colab's).
- ``importlib.invalidate_caches()``, then ``import colabkit`` again: the failed import has just cached the
  contents of the folders it searched, and Python's documentation asks for this call when modules appear while
  the interpreter runs. Importing in the cell makes a failed install fail here, right under pip's message, not
  with a NameError in some later cell.
- A cell of its own, before the first code cell (a markdown title stays on top): visible, editable (the comment
  says how to pin a version; the README too), and run first by "Run all". Every later cell still imports
  colabkit itself (imports.py): a cell run alone after the install cell works.
- The requirement names where colabkit comes from, never a bare ``colabkit``: the index holds an unrelated
  package of that name. It is the git URL and commit the migrating colabkit was installed from (PEP 610's
  direct_url.json), or ``install_from`` (``--install-from``), else ``colabkit>=VERSION`` (the calls migrate
  wrote exist from this version on; the report says when this colabkit came from a folder a Colab runtime cannot
  reach). It carries the extras the migrated code needs (``"colabkit[notebook]"`` for cv2_imshow), the same as
  the report's install command.

It is added only where the migrated notebook uses colabkit and migration changed something (a notebook already
written for colabkit is left alone), and not where a code cell up to the first one using colabkit already
installs colabkit with pip: this cell from an earlier migration (pinned or not) or the user's own
``!pip install colabkit``. So migrating a migrated notebook adds nothing.
"""
from __future__ import annotations

import dataclasses
import importlib.metadata
import json
import re

from ..._version import __version__
from .. import rules as R
from ..shell import split_words
from .edits import Finding

CELL_ID = "colabkit-install"
_PIP = re.compile(r"^\s*(?:pip3?|python3?\s+-m\s+pip|\{sys\.executable\}\s+-m\s+pip)\s")
_COLABKIT = re.compile(r"^colabkit(?:\[[^\]]*\])?(?:\s*[<>=!~;@].*)?$", re.IGNORECASE)


@dataclasses.dataclass
class NewCell:
    """A code cell to insert before the original cell ``index``."""
    index: int
    source: str
    finding: Finding


# what pip may be given after "colabkit @" without quoting trouble in the cell (a URL, no spaces or quotes)
_URL = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*://[^\s'\"\\]+$")


def installed_from() -> tuple[str | None, str | None]:
    """(the pip URL of the colabkit running migrate, or None; a note on what a fresh runtime gets instead).

    From the installation's PEP 610 record: a git install gives its URL and commit, so a fresh Colab runtime gets
    the same colabkit the notebook was migrated with. An index install has no record (None: the version bound
    is enough). A local folder or archive is nothing a Colab runtime can reach: the note says so.
    """
    try:
        dist = importlib.metadata.distribution("colabkit")
        record = dist.read_text("direct_url.json")
        info = json.loads(record) if record else None
    except (importlib.metadata.PackageNotFoundError, ValueError, OSError):
        return None, None
    if not isinstance(info, dict):
        return None, None
    url, vcs = info.get("url"), info.get("vcs_info")
    if isinstance(vcs, dict) and isinstance(url, str) and isinstance(vcs.get("commit_id"), str):
        pinned = f"{vcs.get('vcs', 'git')}+{url}@{vcs['commit_id']}"
        if _URL.match(pinned):
            return pinned, None
    return None, (f"this colabkit was installed from {url}, which a fresh Colab runtime cannot reach: it gets "
                  f"colabkit from PyPI; pass --install-from git+https://.../colabkit@TAG to name where yours comes "
                  f"from")


def requirement(extras, install_from=None) -> str:
    """The requirement the install cell gives pip: ``colabkit[extras] @ URL`` where colabkit comes from a URL
    (``install_from``, else the git URL and commit it was installed from), else ``colabkit[extras]>=VERSION``:
    never a bare name, which could install an older or unrelated package of that name from the index."""
    name = R.requirement(extras)
    url = install_from if install_from is not None else installed_from()[0]
    if url is not None:
        if not _URL.match(url):
            raise ValueError(f"install_from={url!r}: expected a URL pip takes after 'colabkit @', for example "
                             f"git+https://github.com/ORG/colabkit@v0.1 (no spaces or quotes)")
        return f"{name} @ {url}"
    return f"{name}>={__version__}"


def command(extras, install_from=None) -> str:
    """The line the install cell runs: ``%pip install -q "colabkit>=X.Y"`` (see requirement())."""
    return f'%pip install -q "{requirement(extras, install_from)}"'


def cell_source(unit: str, extras, install_from=None) -> str:
    """The install cell, indented with the notebook's indentation step ``unit``."""
    return ("# colabkit makes this notebook run on Colab and elsewhere; this cell installs it where it is missing\n"
            "# (a fresh Colab runtime). It installs the colabkit the notebook was migrated with; edit the line to "
            "change it\n"
            "try:\n"
            f"{unit}import colabkit\n"
            "except ImportError:\n"
            f"{unit}{command(extras, install_from)}\n"
            f"{unit}import importlib\n"
            f"{unit}importlib.invalidate_caches()\n"
            f"{unit}import colabkit")


def installs_colabkit(work) -> bool:
    """The cell pip-installs colabkit (``%pip install ... colabkit[...]==...``, ``!pip install colabkit``)."""
    for esc in work.code.escapes:
        if esc.kind == "magic" and esc.name == "pip":
            arg = esc.arg
        elif esc.kind == "system" and _PIP.match(esc.arg):
            arg = _PIP.sub("", esc.arg, count=1)
        else:
            continue
        words = [w.value for w in split_words(arg) or []]
        if "install" in words and any(_COLABKIT.match(w) for w in words[words.index("install") + 1:]):
            return True
    return False


def existing(works):
    """(the first code cell that installs colabkit, whether it also imports it) or (None, False)."""
    for work in works:
        if installs_colabkit(work):
            imports = any(line.strip() == "import colabkit" for line in work.lines)
            return work, imports
    return None, False


def new_cells(ctx, works, results, installer) -> list:
    """The install cell to add, as a one-item list, or an empty list (see the module docstring for when)."""
    if not ctx.on("CK003") or not works:
        return []
    users = [r.index for r in results if "colabkit" in r.new_source and
             ("import colabkit" in r.new_source or "colabkit." in r.new_source)]
    if not users or not any(r.new_source != r.source and "colabkit" in r.new_source for r in results):
        return []
    if installer is not None and installer.index <= min(users):
        return []
    extras = {extra for r in results for f in r.findings if f.applied for extra in R.BY_CODE[f.code].extras}
    source = cell_source(ctx.unit, extras, ctx.install_from)
    line = command(extras, ctx.install_from)
    note = None if ctx.install_from is not None else installed_from()[1]
    found = Finding(code="CK003", cell=works[0].index, line=1, applied=True, new_cell=True, command=line,
                    message=f"installs colabkit where it is missing (a fresh Colab runtime), then imports it: {line}"
                    + (f" ({note})" if note else ""),
                    before=[], after=source.split("\n"))
    return [NewCell(index=works[0].index, source=source, finding=found)]
