"""The edit model: findings, edits of a cell's source, and applying a cell's edits to give its new source."""
from __future__ import annotations

import bisect
import dataclasses

from .. import rules as R


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
    new_cell: bool = False    # about a cell migrate adds before cell ``cell`` (the install cell)
    command: str = ""         # new_cell: the install command it runs

    @property
    def title(self) -> str:
        return R.BY_CODE[self.code].title


@dataclasses.dataclass
class Edit:
    """One replacement of a span of a cell's original source (an insertion where start == end)."""
    start: tuple               # (line, col), 0-based, in the original cell source
    end: tuple
    text: str
    finding: Finding = None
    order: int = 5             # tie-break for insertions at the same place
    provides_import: bool = False  # writes "import colabkit"
    drop: tuple = None         # (start, end, text) to write instead when the cell imports colabkit elsewhere
    top_level: bool = False
    needs_import: bool = False  # its text also uses colabkit (a kept google.colab import under on_colab())
    new_span: tuple = None     # (start, end) offsets in the new source, set when applied


@dataclasses.dataclass
class CellResult:
    index: int
    source: str
    new_source: str
    findings: list


def apply(work) -> CellResult:
    """The cell's new source from its edits (overlapping ones are dropped and their findings marked not
    applied), with each finding's before/after lines filled in."""
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
