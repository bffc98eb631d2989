"""What ``colabkit migrate`` tells the user: per notebook, each finding, what is left to do by hand, a diff."""
from __future__ import annotations

import dataclasses
import difflib

from . import rules as R
from .rewrite.install import requirement as install_requirement

STATUS_MIGRATED = "migrated"          # written to ``output``
STATUS_WOULD = "would migrate"        # --check / --diff: changes needed, nothing written
STATUS_UNCHANGED = "unchanged"        # nothing to change; written only to an output the user named
STATUS_ERROR = "error"                # could not be processed; ``error`` says why


@dataclasses.dataclass
class CellChange:
    cell: int        # 0-based index (of the original notebook's cell; a new cell goes before that one)
    before: str
    after: str
    new: bool = False  # a cell migrate adds (before is "")


@dataclasses.dataclass
class NotebookReport:
    """The outcome for one notebook."""
    path: str
    status: str
    output: str = None           # where the migrated notebook is (or would be) written
    backup: str = None           # --in-place: where the original was copied first
    error: str = None
    findings: list = dataclasses.field(default_factory=list)
    changes: list = dataclasses.field(default_factory=list)   # CellChange per changed cell
    copied: bool = False         # nothing to change, but the named output got an identical copy

    @property
    def changed(self) -> bool:
        """The notebook needs (or got) changes."""
        return bool(self.changes)

    @property
    def failed(self) -> bool:
        return self.status == STATUS_ERROR

    @property
    def manual_steps(self) -> list:
        """What the user still has to do by hand, each step once, in notebook order."""
        steps = []
        for found in self.findings:
            if found.manual and found.manual not in steps:
                steps.append(found.manual)
        return steps

    @property
    def install(self) -> str:
        """The pip command the migrated notebook needs (the install cell's requirement, where one was added)."""
        cell = self.install_cell
        if cell is not None and cell.command:
            return cell.command.lstrip("%").replace(" -q ", " ", 1)
        extras = {extra for found in self.findings if found.applied for extra in R.BY_CODE[found.code].extras}
        return f'pip install "{install_requirement(extras)}"'

    @property
    def install_cell(self):
        """The finding of the cell migrate added to install colabkit on a fresh runtime (None if it added none)."""
        return next((f for f in self.findings if f.new_cell and f.applied), None)

    def counts(self) -> tuple:
        applied = sum(1 for f in self.findings if f.applied)
        return applied, len(self.manual_steps)

    def as_dict(self) -> dict:
        return {
            "path": self.path, "status": self.status, "output": self.output, "backup": self.backup,
            "error": self.error, "changed": self.changed, "copied": self.copied,
            "findings": [{"code": f.code, "rule": R.BY_CODE[f.code].name, "cell": f.cell + 1, "line": f.line,
                          "new_cell": f.new_cell, "message": f.message, "applied": f.applied,
                          "manual": f.manual or None, "before": f.before, "after": f.after} for f in self.findings],
            "manual_steps": self.manual_steps,
            "install": self.install if self.changed else None,
        }

    def diff(self) -> str:
        """A unified diff of the changed cell sources."""
        out = []
        target = self.output or self.path
        for change in self.changes:
            where = f"new cell before cell {change.cell + 1}" if change.new else f"cell {change.cell + 1}"
            lines = difflib.unified_diff(
                _diff_lines(change.before), _diff_lines(change.after),
                fromfile=f"{self.path} ({'no cell' if change.new else where})", tofile=f"{target} ({where})")
            out.extend(line if line.endswith("\n") else line + "\n" for line in lines)
        return "".join(out)

    def text(self, quiet: bool = False) -> str:
        if self.failed:
            return f"{self.path}: error: {self.error}"
        applied, by_hand = self.counts()
        if self.status == STATUS_UNCHANGED:
            head = f"{self.path}: nothing to change"
            if self.copied:
                head += f"; unchanged copy written to {self.output}"
        elif self.status == STATUS_WOULD:
            head = f"{self.path}: would migrate to {self.output}: {applied} change{'s' * (applied != 1)}"
        else:
            head = f"{self.path} -> {self.output}: {applied} change{'s' * (applied != 1)}"
            if self.backup:
                head += f" (original kept as {self.backup})"
        if by_hand:
            head += f", {by_hand} to do by hand"
        if quiet:
            return head
        lines = [head]
        added = self.install_cell
        if added is not None:
            lines.append(f"  (cell numbers are those of {self.path}; the migrated notebook has a new cell before "
                         f"cell {added.cell + 1}, so from there on its cells are one further down)")
        for found in self.findings:
            mark = "" if found.applied else ("  [by hand]" if found.manual else "  [note]")
            where = f"new cell before cell {found.cell + 1}" if found.new_cell else \
                f"cell {found.cell + 1} line {found.line}"
            lines.append(f"  {where}  {found.code} {found.message}{mark}")
            if found.applied and found.after is not None:
                lines.extend(f"      - {_shown(line)}" for line in found.before)
                lines.extend(f"      + {_shown(line)}" for line in found.after)
            elif found.manual and found.before:
                lines.extend(f"      | {_shown(line)}" for line in found.before)
        steps = self.manual_steps
        if steps:
            lines.append("  by hand:")
            where = {}
            for found in self.findings:
                if found.manual:
                    places = where.setdefault(found.manual, [])
                    place = f"cell {found.cell + 1} line {found.line}"
                    if place not in places:
                        places.append(place)
            for step in steps:
                places = where.get(step, [])
                shown = ", ".join(places[:6]) + (f" and {len(places) - 6} more" if len(places) > 6 else "")
                lines.append(f"    - {step}" + (f" ({shown})" if shown else ""))
        if self.changed:
            cell = self.install_cell
            how = (f" (a fresh Colab runtime: the new first code cell runs {cell.command})" if cell is not None
                   else " (each cell that uses colabkit imports it)")
            lines.append(f"  to run it: {self.install}{how}")
        return "\n".join(lines)


SHOWN_CHARS = 200


def _shown(line: str) -> str:
    """A source line as the report shows it: a line of generated data is cut, not printed whole."""
    if len(line) <= SHOWN_CHARS:
        return line
    return f"{line[:SHOWN_CHARS]} ... ({len(line) - SHOWN_CHARS} more characters)"


def _diff_lines(text: str) -> list:
    lines = text.splitlines(keepends=True)
    if lines and not lines[-1].endswith("\n"):
        lines[-1] += "\n\\ No newline at end of cell\n"
    return lines


def summary(reports) -> str:
    total = len(reports)
    failed = sum(r.failed for r in reports)
    changed = sum(r.changed and not r.failed for r in reports)
    verb = "migrated" if any(r.status == STATUS_MIGRATED for r in reports) else "to migrate"
    return (f"{total} notebook{'s' * (total != 1)}: {changed} {verb}, {total - changed - failed} already portable, "
            f"{failed} failed")
