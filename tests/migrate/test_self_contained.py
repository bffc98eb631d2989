"""Migrated cells define what they use: every cell that calls colabkit imports it itself, at the top level of the
cell and before the first call, so a cell a user runs first (in a fresh kernel) does not stop with NameError."""
from __future__ import annotations

import zipfile

MOUNT = "from google.colab import drive\ndrive.mount('/content/drive')"

# A real notebook's "unzip the dataset" cell: a form, then the mount check with the google.colab import nested
# in an `if`, well below the form field that needs colabkit.
UNZIP = ("#@title Unzip the dataset\n"
         "import os\n"
         "import zipfile\n"
         'zip_path = "/content/drive/MyDrive/data/images.zip" #@param {type:"string"}\n'
         'target = "images" #@param {type:"string"}\n'
         "\n"
         "\n"
         "\n"
         "if not os.path.exists('/content/drive'):\n"
         "  from google.colab import drive\n"
         "  drive.mount('/content/drive')\n"
         "with zipfile.ZipFile(zip_path) as z:\n"
         "  z.extractall(target)\n"
         "print('unzipped', sorted(os.listdir(target)))")


def _colabkit_lines(source):
    return [number for number, line in enumerate(source.splitlines()) if "colabkit" in line]


def _drive_root(tmp_path, monkeypatch):
    root = tmp_path / "my-drive"
    (root / "data").mkdir(parents=True)
    with zipfile.ZipFile(root / "data" / "images.zip", "w") as z:
        z.writestr("a.png", b"png")
    monkeypatch.setenv("COLABKIT_DRIVE_ROOT", str(root))
    return root


def test_cell_after_the_mount_cell_imports_colabkit_before_its_first_use(migrate_sources):
    (_, new), _ = migrate_sources(MOUNT, UNZIP)
    lines = new.splitlines()
    assert "import colabkit" in lines
    first_import = lines.index("import colabkit")
    assert first_import <= min(_colabkit_lines(new))  # defined before the form field's mapping uses it
    assert lines[0] == "#@title Unzip the dataset"     # the form title stays the first line
    assert all(line == "import colabkit" or not line.strip().startswith("import colabkit") for line in lines)
    assert lines.count("import colabkit") == 1          # not again inside the `if`


def test_the_unzip_cell_runs_alone_in_a_fresh_kernel(migrate_sources, run_cell_alone, tmp_path, monkeypatch):
    _drive_root(tmp_path, monkeypatch)
    (_, new), _ = migrate_sources(MOUNT, UNZIP)
    ok, output = run_cell_alone(new)
    assert ok, output
    assert "NameError" not in output
    assert "unzipped ['a.png']" in output


def test_a_shell_cell_after_the_mount_cell_gets_its_own_import(migrate_sources, run_cell_alone, tmp_path,
                                                               monkeypatch):
    _drive_root(tmp_path, monkeypatch)
    copy = "!cp /content/drive/MyDrive/data/images.zip /content/copy.zip\nprint('copied')"
    (_, new), _ = migrate_sources(MOUNT, copy)
    assert new.splitlines()[0] == "import colabkit"
    work = tmp_path / "notebook-folder"
    work.mkdir()
    ok, output = run_cell_alone(new, cwd=work)
    assert ok and "copied" in output, output
    assert (work / "copy.zip").is_file()


def test_every_cell_that_uses_colabkit_imports_it(migrate_sources):
    cells = [MOUNT, "p = '/content/drive/MyDrive/a.csv'", "x = 1", "%cd /content/work\n!ls /content"]
    new, _ = migrate_sources(*cells)
    for source in new:
        uses = _colabkit_lines(source)
        if uses:
            assert source.splitlines()[min(uses)] == "import colabkit", source
    assert new[2] == "x = 1"


def test_google_colab_import_below_a_use_moves_up_and_is_not_repeated(migrate_sources):
    source = ("import os\n"
              "data = '/content/drive/MyDrive/data'\n"
              "from google.colab import drive\n"
              "drive.mount('/content/drive')")
    (new,), findings = migrate_sources(source)
    assert new == ("import os\n"
                   "import colabkit\n"
                   "data = colabkit.drive('data')\n"
                   "colabkit.mount_drive()")
    (twice,), again = migrate_sources(new)
    assert twice == new and not [f for f in again if f.applied]


def test_google_colab_import_kept_for_colab_still_gets_colabkit_first(migrate_sources):
    # the kept import sits under `if colabkit.on_colab():`, which itself needs colabkit
    source = ("out = '/content/out'\n"
              "from google.colab import output\n"
              "output.eval_js('1')")
    (new,), _ = migrate_sources(source)
    lines = new.splitlines()
    assert lines.index("import colabkit") < lines.index("if colabkit.on_colab():")
    assert lines.count("import colabkit") == 1


def test_a_writefile_cell_that_needs_colabkit_is_rewritten_when_an_earlier_cell_imports_it(migrate_sources):
    (_, new), findings = migrate_sources(MOUNT, "%%writefile /content/run.sh\necho hi")
    assert new == "%%writefile {colabkit.workdir('run.sh', quoted=True)}\necho hi"


def test_import_goes_above_a_continued_shell_line_not_inside_it(migrate_sources):
    source = "STEPS = 5\n!python eval.py --steps $STEPS \\\n  --model_dir /content/drive/MyDrive/run"
    (new,), _ = migrate_sources(source)
    assert new == ("import colabkit\nSTEPS = 5\n!python eval.py --steps $STEPS \\\n"
                   "  --model_dir {colabkit.drive('run', quoted=True)}")


def test_each_migrated_cell_of_the_golden_notebook_runs_alone(run_cell_alone, tmp_path, monkeypatch):
    """tests/migrate/golden/colab_cells_alone: every code cell, migrated, run first in its own fresh process."""
    import json
    from pathlib import Path
    root = _drive_root(tmp_path, monkeypatch)
    (root / "colabkit-test").mkdir()
    (root / "data" / "images.zip").rename(root / "colabkit-test" / "images.zip")
    (root / "colabkit-test" / "labels.csv").write_text("x,y\n")
    golden = Path(__file__).resolve().parent / "golden" / "colab_cells_alone.expected.ipynb"
    cells = [c for c in json.loads(golden.read_text(encoding="utf-8"))["cells"] if c["cell_type"] == "code"]
    assert len(cells) == 6 and "%pip install -q \"colabkit>=" in "".join(cells[0]["source"])  # the install cell
    for number, cell in enumerate(cells):
        work = tmp_path / f"fresh-{number}"
        work.mkdir()
        ok, output = run_cell_alone("".join(cell["source"]), cwd=work)
        assert ok and "Error" not in output, output
