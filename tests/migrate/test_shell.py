"""Finding path words in shell command lines without disturbing their quoting."""
from __future__ import annotations

import pytest

from colabkit.migrate.shell import path_spans, split_words
from colabkit.portable import classify_colab_path


def accept(path):
    return classify_colab_path(path) is not None


def words(command):
    return [w.value for w in split_words(command)]


def test_split_words_quotes_escapes_operators_comments():
    assert words("ls -la 'a b' \"c d\" e\\ f") == ["ls", "-la", "a b", "c d", "e f"]
    assert words("a|b&&c;d>e<f") == ["a", "b", "c", "d", "e", "f"]
    assert words("echo hi # a comment 'unbalanced") == ["echo", "hi"]
    assert words('say "it\'s" \'"q"\'') == ["say", "it's", '"q"']
    assert split_words("echo 'unbalanced") is None
    assert split_words('echo "unbalanced') is None


def spans(command):
    return [(command[s.start:s.end], s.path, s.suffix) for s, _ in path_spans(command, accept)]


@pytest.mark.parametrize("command, expected", [
    ("cp /content/a /content/drive/MyDrive/b", [("/content/a", "/content/a", ""),
                                               ("/content/drive/MyDrive/b", "/content/drive/MyDrive/b", "")]),
    ('ls "/content/drive/My Drive/x y"', [('"/content/drive/My Drive/x y"', "/content/drive/My Drive/x y", "")]),
    ("ls '/content/x'/*.csv", [("'/content/x'", "/content/x", "")]),
    ('ls "/content/x/"*.csv', [('"/content/x', "/content/x", '"')]),
    ("ls /content/x/{a,b}", [("/content/x", "/content/x", "")]),
    ("run --out=/content/o --in '/content/i'", [("/content/o", "/content/o", ""), ("'/content/i'", "/content/i", "")]),
    ('run "--out=/content/o"', []),
    ("ls /contents /tmp/content drive", []),
    ("ls /content/*", [("/content", "/content", "")]),
    ("ls /con*", []),
    ("echo {x}/content/y", []),
])
def test_path_spans(command, expected):
    assert spans(command) == expected


def test_path_spans_gives_up_on_unbalanced_quotes():
    assert path_spans("ls '/content/x", accept) is None
