"""Words of a shell command line (what follows ``!`` in a notebook), with where each character came from.

Enough of POSIX shell quoting to find path words and replace exactly the characters of a path: single and double
quotes, backslash escapes, operators that end a word, comments. IPython expands ``{expr}`` and ``$name`` in the
whole command before the shell sees it, quoted or not, so those characters make a word dynamic.
"""
from __future__ import annotations

import dataclasses

_OPERATORS = frozenset("|&;<>()")
_BLANKS = frozenset(" \t\n")
_GLOB = frozenset("*?[]~`")
_IPYTHON_EXPANSION = frozenset("{}$")


@dataclasses.dataclass
class Char:
    ch: str
    raw: int            # index in the command of this character's raw text (a backslash for \x)
    segment: int        # id of the quoted segment it belongs to; -1 outside quotes
    quote: str          # "'" or '"' inside a quoted segment, "" outside
    literal: bool       # quoted or backslash-escaped: not subject to globbing
    dynamic: bool       # an expansion: IPython's {expr} / $name, or the shell's $ / ` inside double quotes


@dataclasses.dataclass
class Word:
    start: int          # raw start index (an opening quote included)
    end: int            # raw end index, exclusive (a closing quote included)
    chars: list

    @property
    def value(self) -> str:
        return "".join(c.ch for c in self.chars)


def split_words(command: str):
    """The words of ``command``; None when its quoting is unbalanced (then nothing should be rewritten)."""
    words, current, i, n, segment_id = [], None, 0, len(command), 0

    def close(end):
        nonlocal current
        if current is not None:
            current.end = end
            words.append(current)
            current = None

    while i < n:
        c = command[i]
        if c in _BLANKS or c in _OPERATORS:
            close(i)
            i += 1
            continue
        if c == "#" and current is None:
            break
        if current is None:
            current = Word(start=i, end=i, chars=[])
        if c == "'":
            j = command.find("'", i + 1)
            if j < 0:
                return None
            segment_id += 1
            current.chars.extend(Char(command[k], k, segment_id, "'", True, command[k] in _IPYTHON_EXPANSION)
                                 for k in range(i + 1, j))
            i = j + 1
            continue
        if c == '"':
            segment_id += 1
            j = i + 1
            while j < n and command[j] != '"':
                if command[j] == "\\" and j + 1 < n and command[j + 1] in '"\\$`':
                    current.chars.append(Char(command[j + 1], j, segment_id, '"', True, command[j + 1] == "$"))
                    j += 2
                    continue
                ch = command[j]
                current.chars.append(Char(ch, j, segment_id, '"', True, ch in _IPYTHON_EXPANSION or ch == "`"))
                j += 1
            if j >= n:
                return None
            i = j + 1
            continue
        if c == "\\":
            if i + 1 >= n:
                return None
            current.chars.append(Char(command[i + 1], i, -1, "", True, command[i + 1] in _IPYTHON_EXPANSION))
            i += 2
            continue
        current.chars.append(Char(c, i, -1, "", False, c in _IPYTHON_EXPANSION or c in _GLOB))
        i += 1
    close(i)
    return words


@dataclasses.dataclass
class PathSpan:
    start: int     # raw range in the command to replace
    end: int
    path: str      # the static path those characters spell
    suffix: str    # text to put right after the replacement (re-opens a quote that was cut)


def path_spans(command: str, accept):
    """(PathSpan, word) for every word (or ``--opt=`` value) whose leading static part ``accept(path)`` accepts.

    A glob or expansion after the static part stays as it is: ``/content/drive/MyDrive/imgs/*.jpg`` yields the
    span of ``/content/drive/MyDrive/imgs``. Returns None when the command cannot be split into words.
    """
    words = split_words(command)
    if words is None:
        return None
    spans = []
    for word in words:
        value = word.value
        starts = [0]
        if "=" in value:
            starts.append(value.index("=") + 1)
        for p in starts:
            if p >= len(value) or not accept(value[p:]):
                continue
            chars = word.chars
            dynamic = next((k for k in range(p, len(chars)) if chars[k].dynamic), len(chars))
            q = dynamic
            if dynamic < len(chars):
                cut = value.rfind("/", p, dynamic)
                if cut <= p:
                    break
                q = cut
            static = value[p:q]
            if any(c.dynamic for c in chars[p:q]) or not accept(static):
                break
            if p > 0 and chars[p].segment != -1 and chars[p].segment == chars[p - 1].segment:
                break  # the path starts inside a quoted "--opt=/path": not rewritten
            start = _raw_begin(word, p)
            if q == len(chars):
                end, suffix = word.end, ""
            elif chars[q].segment != -1 and chars[q].segment == chars[q - 1].segment:
                end, suffix = chars[q].raw, chars[q].quote
            else:
                end, suffix = _raw_begin(word, q), ""
            spans.append((PathSpan(start, end, static, suffix), word))
            break
    return spans


def _raw_begin(word: Word, k: int) -> int:
    """Raw index where character k's text begins, including the opening quote when it starts a segment."""
    c = word.chars[k]
    first_of_segment = c.segment != -1 and (k == 0 or word.chars[k - 1].segment != c.segment)
    if first_of_segment:
        return c.raw - 1
    return c.raw
