"""bench/migrate_corpus.py's own judgement: what it counts as a Colab-only leftover, and when it calls a notebook
clean. (The corpus itself is not in the repository; these are its rules on small notebooks of our own.)"""
from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

pytest.importorskip("IPython")

_SPEC = importlib.util.spec_from_file_location(
    "migrate_corpus", Path(__file__).resolve().parents[2] / "bench" / "migrate_corpus.py")
corpus = importlib.util.module_from_spec(_SPEC)
_SPEC.loader.exec_module(corpus)


def kinds(source):
    return [kind for kind, _, _ in corpus.leftovers(source)]


def test_leftovers_in_python_shell_lines_and_imports():
    assert kinds("p = '/content/drive/MyDrive/x'") == ["left"]
    assert kinds("!cp /content/a b") == ["left"]
    assert kinds("%cd /content/gdrive/MyDrive") == ["left"]
    assert kinds("from google.colab import drive") == ["left"]


def test_what_is_not_a_leftover():
    assert kinds("# p = '/content/x'\nq = colabkit.workdir('x')") == []
    assert kinds("def f():\n    '''Reads /content/x.'''") == []
    assert kinds("if IN_COLAB:\n    p = '/content/x'\n    from google.colab import drive") == []
    assert kinds("try:\n    import google.colab\n    p = '/content/x'\nexcept ImportError:\n    pass") == []
    assert kinds("p = 'https://example.com/content/x'") == []


def test_shown_only_and_mapped_form_fields():
    assert kinds("print(folder.replace('/content/drive/', ''))") == ["shown"]
    assert kinds("raise ValueError(f'put it in /content/data')") == ["shown"]
    assert kinds("x = '/content/a' #@param {type:'string'}\nx = colabkit.portable_path(x)") == ["mapped"]
    assert kinds("x = '/content/a' #@param {type:'string'}\ny = colabkit.portable_path(x)") == ["left"]


def test_a_leftover_the_report_names_is_clean_one_it_does_not_is_not(tmp_path, colab_notebook, monkeypatch):
    path = tmp_path / "nb.ipynb"
    path.write_text(colab_notebook("import os\nprint(os.listdir('/content/drive'))\nbase = '/content/drive'"),
                    encoding="utf-8")
    row = corpus.check(path)
    assert row["reported"] and not row["silent"] and corpus.clean(row)
    # the same notebook judged against a migrate that reports nothing: the leftover becomes silent
    from colabkit.migrate import api
    real = api.migrate_text
    monkeypatch.setattr("colabkit.migrate.migrate_text",
                        lambda text, **kw: (lambda r: (r[0], [f for f in r[1] if f.applied], r[2]))(real(text, **kw)))
    row = corpus.check(path)
    assert row["silent"] and not corpus.clean(row)


def test_the_install_cell_is_not_counted_as_a_change_to_other_cells(tmp_path, colab_notebook):
    path = tmp_path / "nb.ipynb"
    path.write_text(colab_notebook("p = '/content/drive/MyDrive/x'", "x = 1"), encoding="utf-8")
    row = corpus.check(path)
    assert row["added_cells"] == 1 and row["changed"] == 1
    assert row["sources"] and row["parses"] and row["idem"] and corpus.clean(row)


def test_colab_only_runtime_leftovers():
    assert kinds("import condacolab\ncondacolab.install()") == ["left"]
    assert kinds("import colabkit\nif colabkit.on_colab():\n    import condacolab") == []
    assert kinds("tpu = os.environ['COLAB_TPU_ADDR']") == ["left"]
    assert kinds("tag = os.environ.get('COLAB_RELEASE_TAG')") == []
    assert kinds("if 'COLAB_TPU_ADDR' in os.environ:\n    a = os.environ['COLAB_TPU_ADDR']") == []
    assert kinds("try:\n    a = os.environ['COLAB_GPU']\nexcept KeyError:\n    a = None") == []


def test_python_cell_magics_colab_variable_branches_and_root_links():
    # %%capture / %%time run their body as Python: a form field mapped there is mapped, not one string left
    assert kinds("%%capture\nx = '/content/a' #@param {type:'string'}\nx = colabkit.portable_path(x)") == ["mapped"]
    assert kinds("%%time\np = '/content/a'") == ["left"]
    assert kinds("%%bash\ncp /content/a b") == ["left"]
    # a branch taken only where Colab set its variable is a Colab branch, as for migrate
    assert kinds("if 'COLAB_TPU_ADDR' in os.environ:\n    p = open('/content/adc.json')") == []
    # paths through a link the notebook makes at the root to Drive count as Colab paths
    links = corpus.root_links(["!ln -s /content/gdrive/My\\ Drive/ /mydrive", "!ln -s /usr/lib/a /b"])
    assert links == ["/mydrive"]
    assert [k for k, _, _ in corpus.leftovers("q = 'cfg=/mydrive/x.cfg'\nr = '/mydrivers/x'", links)] == ["left"]
    assert kinds("q = 'cfg=/mydrive/x.cfg'") == []
