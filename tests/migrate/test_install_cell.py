"""A migrated notebook starts on a fresh Colab runtime: its first code cell installs colabkit where it is missing.

What a user sees: one new code cell before the notebook's first code cell (installing only when `import colabkit`
fails, then importing it), the install command in the report, nothing added twice. The cell is run in real Jupyter
kernels: one where colabkit is installed (nothing is installed), and fresh ones without it, at home and with
Colab's google.colab loaded (pip installs it, from a local wheel: no network).
"""
from __future__ import annotations

import json
import zipfile
from pathlib import Path

import nbformat
import pytest
from nbclient import NotebookClient

from colabkit._version import __version__
from colabkit.cli import main
from colabkit.migrate import migrate_notebook, migrate_text

# this colabkit is installed from a folder (editable), so the cell asks the index for this version or newer
PIP = f'%pip install -q "colabkit>={__version__}"'
INSTALL = ("# colabkit makes this notebook run on Colab and elsewhere; this cell installs it where it is missing\n"
           "# (a fresh Colab runtime). It installs the colabkit the notebook was migrated with; edit the line to "
           "change it\n"
           "try:\n"
           "    import colabkit\n"
           "except ImportError:\n"
           f"    {PIP}\n"
           "    import importlib\n"
           "    importlib.invalidate_caches()\n"
           "    import colabkit")


def _cells(text):
    return json.loads(text)["cells"]


def _sources(text):
    return ["".join(c["source"]) for c in _cells(text)]


def _notebook(colab_notebook, *sources):
    """A Colab notebook whose first cell is a markdown title, then ``sources`` as code cells."""
    data = json.loads(colab_notebook("# Training", *sources))
    data["cells"][0] = {"cell_type": "markdown", "source": ["# Training"], "metadata": {"id": "title"}}
    return json.dumps(data, indent=2)


def test_the_first_code_cell_installs_colabkit_where_it_is_missing(colab_notebook):
    original = _notebook(colab_notebook, "from google.colab import drive\ndrive.mount('/content/drive')",
                         "x = 1")
    new_text, findings, changes = migrate_text(original)
    cells = _cells(new_text)
    assert len(cells) == 4
    assert [c["cell_type"] for c in cells] == ["markdown", "code", "code", "code"]
    assert "".join(cells[1]["source"]) == INSTALL
    assert cells[1]["outputs"] == [] and cells[1]["execution_count"] is None
    assert _sources(new_text)[2:] == ["import colabkit\ncolabkit.mount_drive()", "x = 1"]
    install = [f for f in findings if f.code == "CK003"]
    assert len(install) == 1 and install[0].applied


def test_the_install_cell_follows_the_notebooks_indentation_and_extras(colab_notebook):
    original = _notebook(colab_notebook, "from google.colab.patches import cv2_imshow\ncv2_imshow(img)",
                         "for i in range(2):\n  print(i)")
    source = _sources(migrate_text(original)[0])[1]
    assert f'\n  %pip install -q "colabkit[notebook]>={__version__}"\n' in source  # cv2_imshow needs the notebook extra
    assert "try:\n  import colabkit\n" in source                  # two spaces, as this notebook (and Colab) indents


def test_migrating_a_migrated_notebook_adds_no_second_install_cell(colab_notebook):
    once, _, _ = migrate_text(_notebook(colab_notebook, "p = '/content/drive/MyDrive/a.csv'"))
    twice, findings, changes = migrate_text(once)
    assert twice == once and changes == [] and not [f for f in findings if f.applied]
    assert _sources(twice).count(INSTALL) == 1


def test_a_pinned_install_cell_is_kept_as_the_user_edited_it(colab_notebook):
    once, _, _ = migrate_text(_notebook(colab_notebook, "p = '/content/drive/MyDrive/a.csv'"))
    pinned = once.replace(PIP.replace('"', '\\"'), '%pip install -q \\"colabkit==0.1.0\\"')
    assert pinned != once
    data = json.loads(pinned)
    data["cells"].append({"cell_type": "code", "source": ["q = '/content/drive/MyDrive/b.csv'"], "metadata": {},
                          "execution_count": None, "outputs": []})
    twice, _, _ = migrate_text(json.dumps(data, indent=2))
    sources = _sources(twice)
    assert sum("%pip install" in s for s in sources) == 1
    assert '%pip install -q "colabkit==0.1.0"' in sources[1]
    assert sources[-1] == "import colabkit\nq = colabkit.drive('b.csv')"


def test_a_notebook_that_installs_colabkit_itself_gets_no_install_cell(colab_notebook):
    new_text, findings, _ = migrate_text(_notebook(colab_notebook, "!pip install -q colabkit",
                                                   "p = '/content/drive/MyDrive/a.csv'"))
    assert _sources(new_text)[1:] == ["%pip install -q colabkit", "import colabkit\np = colabkit.drive('a.csv')"]
    assert "CK003" not in [f.code for f in findings]


def test_no_install_cell_when_no_cell_uses_colabkit(colab_notebook):
    for sources in (["!pip install -q torch", "x = 1"], ["import colabkit\np = colabkit.drive('a.csv')"]):
        new_text, findings, _ = migrate_text(_notebook(colab_notebook, *sources))
        assert len(_cells(new_text)) == len(sources) + 1
        assert "CK003" not in [f.code for f in findings]


def test_the_install_cell_can_be_turned_off(colab_notebook):
    new_text, findings, _ = migrate_text(_notebook(colab_notebook, "p = '/content/x'"), ignore="install-cell")
    assert len(_cells(new_text)) == 2 and "CK003" not in [f.code for f in findings]


def test_migrated_notebooks_stay_valid_nbformat(colab_notebook):
    # Colab's nbformat 4.0 (cell ids in metadata) and Jupyter's 4.5 (an "id" on each cell)
    colab = _notebook(colab_notebook, "p = '/content/x'")
    notebook = nbformat.v4.new_notebook()
    notebook.cells = [nbformat.v4.new_markdown_cell("# t"), nbformat.v4.new_code_cell("p = '/content/x'")]
    jupyter = nbformat.writes(notebook)
    for text in (colab, jupyter):
        new_text, _, _ = migrate_text(text)
        migrated = nbformat.reads(new_text, as_version=4)
        nbformat.validate(migrated)
        ids = [c.get("id") or c["metadata"].get("id") for c in json.loads(new_text)["cells"]]
        assert len(set(ids)) == len(ids) and all(ids)
    assert '"id": "colabkit-install"' in migrate_text(jupyter)[0]


def test_the_report_gives_the_install_command(tmp_path, colab_notebook, capsys):
    path = tmp_path / "train.ipynb"
    path.write_text(_notebook(colab_notebook, "p = '/content/drive/MyDrive/a.csv'"), encoding="utf-8")
    assert main(["migrate", str(path)]) == 0
    out = capsys.readouterr().out
    assert "new cell before cell 2  CK003 installs colabkit where it is missing" in out
    assert f"(cell numbers are those of {path}; the migrated notebook has a new cell before cell 2" in out
    assert f"      + except ImportError:\n      +     {PIP}\n" in out
    assert f'to run it: pip install "colabkit>={__version__}" (a fresh Colab runtime: the new first code cell runs ' \
           f"{PIP})" in out
    report = migrate_notebook(path, tmp_path / "again.ipynb")
    data = report.as_dict()
    assert data["install"] == f'pip install "colabkit>={__version__}"'
    assert {"code": "CK003", "cell": 2, "new_cell": True}.items() <= data["findings"][0].items()
    assert "(new cell before cell 2)" in report.diff() and f"+    {PIP}" in report.diff()


# --- the cell in real kernels ----------------------------------------------------------------------------------

HIDE_COLABKIT = """\
import os, sys
# a fresh runtime: no colabkit anywhere on the path (the test machine has it installed in development mode)
sys.meta_path[:] = [f for f in sys.meta_path if 'colabkit' not in getattr(f, '__module__', '')]
sys.path[:] = [p for p in sys.path if not os.path.isfile(os.path.join(p or '.', 'colabkit', '__init__.py'))]
sys.path.insert(0, os.environ['COLABKIT_TEST_SITE'])   # where pip installs (--target), as site-packages
"""


def _wheel(folder: Path) -> Path:
    """A tiny colabkit distribution for pip to install without a network."""
    path = folder / "colabkit-99.0-py3-none-any.whl"
    info = "colabkit-99.0.dist-info"
    files = {"colabkit/__init__.py": "FROM_TEST_WHEEL = True\n",
             f"{info}/METADATA": "Metadata-Version: 2.1\nName: colabkit\nVersion: 99.0\n",
             f"{info}/WHEEL": "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n"}
    with zipfile.ZipFile(path, "w") as z:
        for name, text in files.items():
            z.writestr(name, text)
        z.writestr(f"{info}/RECORD", "".join(f"{name},,\n" for name in files) + f"{info}/RECORD,,\n")
    return path


def _run(cells, cwd):
    notebook = nbformat.v4.new_notebook()
    notebook.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    notebook.cells = [nbformat.v4.new_code_cell(source) for source in cells]
    NotebookClient(notebook, timeout=180, kernel_name="python3", resources={"metadata": {"path": str(cwd)}}).execute()
    return "".join(o.get("text", "") for c in notebook.cells for o in c.get("outputs", []))


@pytest.fixture
def kernel_env(monkeypatch, tmp_path):
    monkeypatch.setenv("IPYTHONDIR", str(tmp_path / "ipython"))
    monkeypatch.setenv("PIP_DISABLE_PIP_VERSION_CHECK", "1")
    monkeypatch.setenv("PIP_NO_INDEX", "1")
    startup = tmp_path / "ipython" / "profile_default" / "startup"
    startup.mkdir(parents=True)
    return startup


def test_where_colabkit_is_installed_the_cell_installs_nothing(kernel_env, tmp_path, monkeypatch):
    site, wheels = tmp_path / "site-packages", tmp_path / "wheels"
    site.mkdir()
    wheels.mkdir()
    _wheel(wheels)
    monkeypatch.setenv("PIP_TARGET", str(site))       # were pip to run, it would install the test wheel here
    monkeypatch.setenv("PIP_FIND_LINKS", str(wheels))
    out = _run([INSTALL, "print('colabkit from', colabkit.__file__, hasattr(colabkit, 'FROM_TEST_WHEEL'))"],
               tmp_path)
    assert "colabkit from" in out and out.rstrip().endswith("False"), out
    assert list(site.iterdir()) == []


@pytest.mark.parametrize("where", ["home", "colab"])
def test_on_a_fresh_runtime_the_cell_installs_colabkit_and_imports_it(where, kernel_env, tmp_path, monkeypatch,
                                                                     request):
    site = tmp_path / "site-packages"
    site.mkdir()
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    _wheel(wheels)
    monkeypatch.setenv("COLABKIT_TEST_SITE", str(site))
    monkeypatch.setenv("PIP_TARGET", str(site))
    monkeypatch.setenv("PIP_FIND_LINKS", str(wheels))
    startup = HIDE_COLABKIT
    if where == "colab":
        request.getfixturevalue("colab_standin")
        startup += "import google.colab  # a Colab kernel starts with google.colab imported\n"
    (kernel_env / "00-fresh-runtime.py").write_text(startup)
    out = _run(["try:\n  import colabkit\n  print('already there')\nexcept ImportError:\n  print('missing')",
                INSTALL,
                "print('installed:', colabkit.FROM_TEST_WHEEL)"], tmp_path)
    assert "missing" in out and "already there" not in out
    assert "installed: True" in out, out
    assert (site / "colabkit" / "__init__.py").is_file()


def _migrate_in_a_process(tmp_path, notebook_text, *args, direct_url=None):
    """`colabkit migrate` in a fresh process whose colabkit distribution record says where it was installed from
    (PEP 610's direct_url.json, as pip writes it); the package code is this checkout's."""
    import subprocess
    import sys
    site = tmp_path / "record"
    info = site / f"colabkit-{__version__}.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: colabkit\nVersion: {__version__}\n")
    if direct_url is not None:
        (info / "direct_url.json").write_text(json.dumps(direct_url))
    path = tmp_path / "train.ipynb"
    path.write_text(notebook_text, encoding="utf-8")
    root = Path(__file__).resolve().parents[2]
    code = ("import sys; sys.path[:0] = [sys.argv[1], sys.argv[2]]; from colabkit.cli import main; "
            "sys.exit(main(['migrate', *sys.argv[3:]]))")
    done = subprocess.run([sys.executable, "-c", code, str(site), str(root), str(path), "-o",
                           str(tmp_path / "out.ipynb"), *args], capture_output=True, text=True, timeout=120)
    out = tmp_path / "out.ipynb"
    return done, (_sources(out.read_text()) if out.exists() else None)


def test_a_git_install_gives_the_cell_its_url_and_commit(tmp_path, colab_notebook):
    """The index has an unrelated package named colabkit: the cell names where this one came from."""
    record = {"url": "https://github.com/example/colabkit.git",
              "vcs_info": {"vcs": "git", "commit_id": "0123456789abcdef0123456789abcdef01234567"}}
    done, sources = _migrate_in_a_process(tmp_path, _notebook(colab_notebook, "p = '/content/drive/MyDrive/a'"),
                                          direct_url=record)
    assert done.returncode == 0, done.stderr
    assert ('%pip install -q "colabkit @ git+https://github.com/example/colabkit.git'
            '@0123456789abcdef0123456789abcdef01234567"') in sources[1]
    assert 'to run it: pip install "colabkit @ git+https://github.com/example/colabkit.git@0123' in done.stdout


def test_a_folder_install_says_what_a_fresh_runtime_gets_and_install_from_overrides_it(tmp_path, colab_notebook):
    notebook = _notebook(colab_notebook, "p = '/content/drive/MyDrive/a'")
    done, sources = _migrate_in_a_process(tmp_path, notebook, direct_url={"url": "file:///home/me/colabkit",
                                                                          "dir_info": {"editable": True}})
    assert done.returncode == 0, done.stderr
    assert PIP in sources[1] and "pip install -q colabkit\n" not in sources[1]
    assert "installed from file:///home/me/colabkit, which a fresh Colab runtime cannot reach" in done.stdout
    assert "--install-from" in done.stdout
    done, sources = _migrate_in_a_process(tmp_path / "2", notebook, "--install-from",
                                          "git+https://github.com/example/colabkit@v0.1")
    assert done.returncode == 0, done.stderr
    assert '%pip install -q "colabkit @ git+https://github.com/example/colabkit@v0.1"' in sources[1]


def test_an_install_from_that_pip_cannot_take_is_refused_naming_it(tmp_path, colab_notebook):
    done, sources = _migrate_in_a_process(tmp_path, _notebook(colab_notebook, "p = '/content/drive/MyDrive/a'"),
                                          "--install-from", 'colabkit" ; rm -rf ~')
    assert done.returncode != 0 and sources is None
    assert "install_from='colabkit\" ; rm -rf ~': expected a URL pip takes" in done.stderr + done.stdout
    assert "Traceback" not in done.stderr
