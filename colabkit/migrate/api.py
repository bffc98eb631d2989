"""The Python API of colabkit migrate (files in, reports out); see colabkit/migrate/__init__.py."""
from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

from . import nbjson
from .report import STATUS_ERROR, STATUS_MIGRATED, STATUS_UNCHANGED, STATUS_WOULD, CellChange, NotebookReport
from .rewrite import Rewriter, install
from .rules import select

LOCAL_SUFFIX = ".local"


class MigrateError(ValueError):
    """A notebook could not be migrated; the message names the file and what to do."""


def migrate_text(text: str, *, rules=None, ignore=None, drive_root=None, install_from=None):
    """Migrate a notebook given as JSON text. Returns (new_text, findings, changes); ``new_text`` is ``text``
    itself when nothing changes. Changed cells keep their place; a cell migrate adds (the install cell, CK003)
    is a change with ``new=True`` and a finding with ``new_cell=True``, both numbered by the cell it goes before.
    Raises nbjson.NotebookFormatError for text that is not an nbformat 4 notebook."""
    notebook = nbjson.parse(text)
    if not _is_python(notebook):
        return text, [], []
    sources = [nbjson.source_text(cell) if cell.get("cell_type") == "code" else None for cell in notebook["cells"]]
    results, new_cells = Rewriter(select(rules, ignore), drive_root=drive_root, install_from=install_from).run(sources)
    findings = [cell.finding for cell in new_cells]
    changes = [CellChange(cell.index, "", cell.source, new=True) for cell in new_cells]
    new_sources = {}
    for result in results:
        findings.extend(result.findings)
        if result.new_source != result.source:
            changes.append(CellChange(result.index, result.source, result.new_source))
            new_sources[result.index] = result.new_source
    new_text = nbjson.replace_sources(text, new_sources)
    for cell in new_cells:  # (one at most: the install cell)
        new_text = nbjson.insert_code_cell(new_text, cell.index, cell.source, install.CELL_ID)
    return new_text, findings, changes


def _is_python(notebook: dict) -> bool:
    metadata = notebook.get("metadata") or {}
    language = ((metadata.get("kernelspec") or {}).get("language")
                or (metadata.get("language_info") or {}).get("name") or "python")
    return str(language).lower().startswith("python")


def default_output(path) -> Path:
    """Where a migrated copy goes by default: ``name.ipynb`` -> ``name.local.ipynb`` beside it."""
    path = Path(path)
    suffix = path.suffix or ".ipynb"
    return path.with_name(path.stem + LOCAL_SUFFIX + suffix)


def _read(path: Path) -> str:
    if path.is_dir():
        raise MigrateError("is a directory; pass notebook files (e.g. folder/*.ipynb)")
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        raise MigrateError("no such file") from None
    except PermissionError:
        raise MigrateError("cannot read it: permission denied") from None
    except OSError as exc:
        raise MigrateError(f"cannot read it: {exc.strerror or exc}") from None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise MigrateError(f"not UTF-8 text (byte {exc.start}); a notebook file is UTF-8 JSON") from None


def _write_atomic(path: Path, text: str, mode_from: Path = None) -> None:
    folder = path.parent
    folder.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=folder)
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(text.encode("utf-8"))
        if mode_from is not None:
            shutil.copymode(mode_from, tmp)
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


def _backup_path(path: Path) -> Path:
    candidate = path.with_name(path.name + ".bak")
    number = 1
    while candidate.exists():
        candidate = path.with_name(f"{path.name}.bak{number}")
        number += 1
    return candidate


def migrate_notebook(path, output=None, *, in_place: bool = False, check: bool = False, rules=None, ignore=None,
                     drive_root=None, force: bool = False, install_from=None) -> NotebookReport:
    """Migrate one notebook file and return its report; errors are reported, not raised.

    output: the file to write (default ``name.local.ipynb`` beside the original). in_place: overwrite the
    original after copying it to ``name.ipynb.bak`` (``.bak1``, ... if taken). check: write nothing (``--check``
    / ``--diff``). An existing output is overwritten only with ``force`` (unless it already holds exactly the
    result). Nothing is written when nothing changes. drive_root: a folder standing for "My Drive" on this
    machine; Drive files the notebook names that are missing there are reported.
    """
    path = Path(path)
    shown = str(path)
    if in_place and output is not None:
        raise ValueError("Pass either output or in_place=True, not both.")
    target = path if in_place else Path(output) if output is not None else default_output(path)
    try:
        text = _read(path)
        try:
            new_text, findings, changes = migrate_text(text, rules=rules, ignore=ignore, drive_root=drive_root,
                                                           install_from=install_from)
        except nbjson.NotebookFormatError as exc:
            raise MigrateError(str(exc)) from None
        report = NotebookReport(path=shown, status=STATUS_UNCHANGED, output=str(target), findings=findings,
                                changes=changes)
        explicit = output is not None and not in_place
        if not changes and not (explicit and not check):
            report.output = None
            return report
        if check:
            report.status = STATUS_WOULD
            return report
        if not in_place:
            if target.resolve() == path.resolve():
                raise MigrateError(f"the output {target} is the notebook itself; use --in-place to overwrite it "
                                   f"(a backup is kept)")
            if target.is_dir():
                raise MigrateError(f"the output {target} is a directory")
            if target.exists() and not force:
                try:
                    same = target.read_text(encoding="utf-8") == new_text
                except (OSError, UnicodeDecodeError):
                    same = False
                if same:
                    report.status = STATUS_MIGRATED if changes else STATUS_UNCHANGED
                    report.copied = not changes
                    return report
                raise MigrateError(f"the output {target} already exists; pass --force to overwrite it, or -o to "
                                   f"write elsewhere")
            _write_atomic(target, new_text, mode_from=path)
            if not changes:  # the user named an output: they get one, an identical copy
                report.copied = True
                return report
        else:
            backup = _backup_path(path)
            shutil.copy2(path, backup)
            report.backup = str(backup)
            _write_atomic(path, new_text, mode_from=path)
        report.status = STATUS_MIGRATED
        return report
    except MigrateError as exc:
        return NotebookReport(path=shown, status=STATUS_ERROR, error=str(exc))
    except OSError as exc:
        where = getattr(exc, "filename", None) or target
        return NotebookReport(path=shown, status=STATUS_ERROR,
                              error=f"cannot write {where}: {exc.strerror or exc}")
    except (RecursionError, MemoryError) as exc:  # the limits Python sets on hostile input: this file, not the run
        return NotebookReport(path=shown, status=STATUS_ERROR,
                              error=f"too deeply nested or too large for colabkit migrate to read "
                                    f"({type(exc).__name__})")


def migrate_paths(paths, output=None, *, in_place: bool = False, check: bool = False, rules=None, ignore=None,
                  drive_root=None, force: bool = False, install_from=None) -> list:
    """Migrate several notebooks; one report each, in order. A failing file does not stop the others.

    With more than one notebook, ``output`` is a folder (created if missing) that receives each migrated
    notebook under its own name. Bad ``rules``/``ignore`` raise ValueError before any file is touched.
    """
    paths = [Path(p) for p in paths]
    select(rules, ignore)  # validate the rule selection once, up front
    if in_place and output is not None:
        raise ValueError("Pass either an output (-o) or --in-place, not both.")
    targets = [None] * len(paths)
    if output is not None:
        output = Path(output)
        if len(paths) > 1 or output.is_dir() or str(output).endswith(("/", os.sep)):
            if output.exists() and not output.is_dir():
                raise ValueError(f"-o {output}: with several notebooks the output must be a folder.")
            targets = [output / p.name for p in paths]
        else:
            targets = [output]
    reports, seen = [], {}
    for path, target in zip(paths, targets):
        if target is not None:
            key = os.path.abspath(target)
            if key in seen:
                reports.append(NotebookReport(path=str(path), status=STATUS_ERROR,
                                              error=f"its output {target} is also the output of {seen[key]}"))
                continue
            seen[key] = path
        reports.append(migrate_notebook(path, target, in_place=in_place, check=check, rules=rules, ignore=ignore,
                                        drive_root=drive_root, force=force,
                                        install_from=install_from))
    return reports
