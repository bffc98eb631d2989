"""More constructs of real public Colab notebooks that migrate must not leave Colab-only (issue 28, point 4).

Each test states what a user sees: the migrated cell source, the report's findings, and, where practical, the
migrated cell run by IPython in a fresh process on a "home" machine (no google.colab; Drive is drive_root).
"""
from __future__ import annotations

import json
import sys

import pytest

if sys.version_info >= (3, 11):
    import tomllib
else:
    import tomli as tomllib


def codes(findings, applied=None):
    return [f.code for f in findings if applied is None or f.applied == applied]


@pytest.fixture
def home(tmp_path, monkeypatch):
    """A home machine: drive_root with a data file, a working folder standing for /content."""
    drive_root = tmp_path / "my-drive"
    (drive_root / "data").mkdir(parents=True)
    (drive_root / "data" / "train.csv").write_text("x,y\n1,2\n")
    work = tmp_path / "notebook"
    work.mkdir()
    monkeypatch.setenv("COLABKIT_DRIVE_ROOT", str(drive_root))
    monkeypatch.setenv("COLABKIT_WORKDIR", str(work))
    return drive_root, work


# 1. every spelling of "is Drive mounted" -----------------------------------------------------------------------

MOUNT_CHECKS = ("import os, pathlib\n"
                "from pathlib import Path\n"
                "if Path('/content/drive').is_mount():\n    print('a')\n"
                "if not Path('/content/drive/MyDrive').exists():\n    print('b')\n"
                "if pathlib.Path(\"/content/drive/My Drive\").is_dir():\n    print('c')\n"
                "if os.path.ismount('/content/drive'):\n    print('d')\n"
                "if os.path.exists('/content/drive/MyDrive/'):\n    print('e')\n"
                "if 'drive' not in os.listdir('/content'):\n    print('f')\n"
                "print(Path('/content/gdrive').exists())")


def test_every_spelling_of_is_drive_mounted_asks_colabkit(migrate_sources):
    (new,), findings = migrate_sources(MOUNT_CHECKS)
    assert new == ("import os, pathlib\n"
                   "from pathlib import Path\n"
                   "import colabkit\n"
                   "if colabkit.drive_mounted():\n    print('a')\n"
                   "if not colabkit.drive_mounted():\n    print('b')\n"
                   "if colabkit.drive_mounted():\n    print('c')\n"
                   "if colabkit.drive_mounted():\n    print('d')\n"
                   "if colabkit.drive_mounted():\n    print('e')\n"
                   "if not colabkit.drive_mounted():\n    print('f')\n"
                   "print(colabkit.drive_mounted())")
    assert codes(findings, applied=False) == []
    assert codes(findings).count("CK107") == 7 and "CK104" not in codes(findings)


def test_the_mount_checks_take_the_mounted_branch_at_home(migrate_sources, run_cell_alone, home):
    (new,), _ = migrate_sources(MOUNT_CHECKS)
    ok, output = run_cell_alone(new)
    assert ok, output
    assert output.split() == ["a", "c", "d", "e", "True"]  # drive_root is there: "mounted"


def test_the_mount_point_kept_in_a_variable_is_reported_with_the_check_to_use(migrate_sources):
    (new,), findings = migrate_sources("DRIVE = '/content/drive'\nif not os.path.exists(DRIVE):\n    pass")
    assert new.startswith("DRIVE = '/content/drive'")
    left = [f for f in findings if not f.applied]
    assert [(f.code, f.line) for f in left] == [("CK104", 1)]
    assert "colabkit.drive_mounted()" in left[0].manual  # the exact replacement for an "is it mounted" test


# 2. a %%shell cell below a comment ------------------------------------------------------------------------------

def test_a_shell_cell_below_a_comment_becomes_a_bash_cell(migrate_sources):
    (new,), findings = migrate_sources("# Install the tools\n%%shell\nset -e\necho installed")
    assert new == "%%bash\n# Install the tools\nset -e\necho installed"
    assert ("CK210", True) in [(f.code, f.applied) for f in findings]
    assert ("CK207", True) in [(f.code, f.applied) for f in findings]


def test_a_stack_of_cell_magics_below_a_comment(migrate_sources):
    source = "# Installation cell\n%%capture\n%%shell\nif ! command -v julia; then\n  echo no julia\nfi"
    (new,), findings = migrate_sources(source)
    assert new == "%%capture\n%%bash\n# Installation cell\nif ! command -v julia; then\n  echo no julia\nfi"
    assert codes(findings, applied=False) == []


def test_the_converted_shell_cell_runs_in_ipython(migrate_sources, run_cell_alone):
    (new,), _ = migrate_sources("#@title Say hello\n# (a form title, then the magic)\n%%shell\necho hello from bash")
    ok, output = run_cell_alone(new)
    assert ok and "hello from bash" in output, output


def test_blank_lines_before_a_shell_cell(migrate_sources):
    (new,), findings = migrate_sources("\n%%shell\necho hi")
    assert new == "\n%%bash\necho hi"
    assert codes(findings) == ["CK207"]


def test_a_comment_above_a_writefile_cell_is_reported_not_moved_into_the_file(migrate_sources):
    source = "# the settings\n%%writefile settings.txt\nlr=0.1"
    (new,), findings = migrate_sources(source)
    assert new == source
    left = [f for f in findings if not f.applied]
    assert [f.code for f in left] == ["CK210"]
    assert "%%writefile settings.txt" in left[0].manual and "first line" in left[0].manual


# 3. a link to Drive made at the filesystem root -----------------------------------------------------------------

def test_a_root_link_to_my_drive_and_the_paths_through_it(migrate_sources):
    cells, findings = migrate_sources(
        "!ln -s /content/drive/MyDrive /mydrive",
        "!ls /mydrive/data\n"
        "import pandas as pd\n"
        "df = open('/mydrive/data/train.csv').read()\n"
        "%cd /mydrive/data\n"
        "out = f'/mydrive/runs/{1}'")
    assert cells[0] == "import colabkit\nif colabkit.on_colab():\n    !ln -s /content/drive/MyDrive /mydrive"
    assert cells[1] == ("import colabkit\n"
                        "!ls {colabkit.drive('data', quoted=True)}\n"
                        "import pandas as pd\n"
                        "df = open(colabkit.drive('data/train.csv')).read()\n"
                        "%cd {colabkit.drive('data')}\n"
                        "out = colabkit.drive(f'runs/{1}')")
    assert codes(findings, applied=False) == []
    assert codes(findings).count("CK109") == 4 and "CK202" in codes(findings)  # the link, 3 paths, %cd


def test_a_root_link_to_a_folder_in_drive_and_os_symlink(migrate_sources):
    cells, findings = migrate_sources(
        "import os\nos.symlink('/content/drive/My Drive/proj', '/proj')",
        "with open('/proj/notes.txt') as fh:\n    print(fh.read())")
    assert cells[0] == ("import os\nimport colabkit\nif colabkit.on_colab():\n"
                        "    os.symlink('/content/drive/My Drive/proj', '/proj')")
    assert cells[1] == "import colabkit\nwith open(colabkit.drive('proj/notes.txt')) as fh:\n    print(fh.read())"


def test_the_linked_paths_work_at_home(migrate_sources, run_cell_alone, home):
    drive_root, _ = home
    cells, _ = migrate_sources("!ln -s /content/drive/MyDrive /mydrive",
                               "print(open('/mydrive/data/train.csv').read())")
    for source in cells:
        ok, output = run_cell_alone(source)
        assert ok and "Permission denied" not in output and "ln:" not in output, output
    assert "x,y" in output


def test_a_path_through_a_root_link_inside_a_longer_string_is_reported(migrate_sources):
    (_, new), findings = migrate_sources(
        "!ln -s /content/drive/MyDrive /mydrive",
        "opts = '--weights /mydrive/ckpt/last.pt --epochs 3'\n"
        "line = f'save_dir=/mydrive/runs/{1}'\n"
        "other = 'x=/mydrivers/y'")
    assert "'--weights /mydrive/ckpt/last.pt --epochs 3'" in new and "other = 'x=/mydrivers/y'" in new
    left = [f for f in findings if not f.applied]
    assert [f.code for f in left] == ["CK108", "CK108"]
    assert "/mydrive/ckpt/last.pt" in left[0].message and "colabkit.drive('ckpt/last.pt')" in left[0].manual
    assert "/mydrive/runs/" in left[1].message


def test_a_link_into_a_system_folder_is_reported(migrate_sources):
    (new,), findings = migrate_sources("!ln -s /content/drive/MyDrive/kaggle /root/.kaggle")
    left = [f for f in findings if not f.applied]
    assert [f.code for f in left] == ["CK109"]
    assert "/root/.kaggle" in left[0].message and "colabkit.drive('kaggle')" in left[0].manual


# 4. condacolab -------------------------------------------------------------------------------------------------

def test_condacolab_runs_only_on_colab(migrate_sources):
    cells, findings = migrate_sources("!pip install -q condacolab\nimport condacolab\ncondacolab.install()",
                                      "import condacolab\ncondacolab.check()\n!mamba install -q -y openmm")
    assert cells[0] == ("%pip install -q condacolab\nimport colabkit\nif colabkit.on_colab():\n"
                        "    import condacolab\n    condacolab.install()")
    assert cells[1] == ("import colabkit\nif colabkit.on_colab():\n    import condacolab\n    condacolab.check()\n"
                        "!mamba install -q -y openmm")
    found = [f for f in findings if f.code == "CK311"]
    assert found and all(f.applied for f in found)
    assert "conda" in found[0].manual and "mamba install -q -y openmm" not in found[0].manual


def test_the_condacolab_cell_runs_at_home(migrate_sources, run_cell_alone):
    (new,), _ = migrate_sources("import condacolab\ncondacolab.install()\nprint('after')")
    ok, output = run_cell_alone(new)
    assert ok and "after" in output, output


# 5. environment variables only Colab sets ----------------------------------------------------------------------

def test_unguarded_reads_of_colab_variables_are_reported_with_the_replacement(migrate_sources):
    source = ("import os\n"
              "tpu = 'grpc://' + os.environ['COLAB_TPU_ADDR']\n"
              "gpu = int(os.environ[\"COLAB_GPU\"])\n"
              "tag = os.environ.get('COLAB_RELEASE_TAG')\n"
              "if 'COLAB_TPU_ADDR' in os.environ:\n"
              "    addr = os.environ['COLAB_TPU_ADDR']")
    (new,), findings = migrate_sources(source)
    assert new == source
    left = [f for f in findings if not f.applied]
    assert [(f.code, f.line) for f in left] == [("CK312", 2), ("CK312", 3)]
    assert "os.environ.get('COLAB_TPU_ADDR')" in left[0].manual
    assert "os.environ.get('COLAB_GPU')" in left[1].manual
    assert "KeyError" in left[0].message


# 6. a form string with embedded quotes ---------------------------------------------------------------------------

def test_a_form_string_with_embedded_quotes_is_mapped(migrate_sources):
    source = 'wavs = "\\"/content/drive/MyDrive/wavs.zip\\"" #@param {type:"string"}\n!unzip -q {wavs} -d /content/wavs'
    (new,), findings = migrate_sources(source)
    assert new.splitlines()[:3] == [
        "import colabkit",
        'wavs = "\\"/content/drive/MyDrive/wavs.zip\\"" #@param {type:"string"}',
        "wavs = colabkit.portable_path(wavs)"]
    assert "CK402" in codes(findings, applied=True) and "CK108" not in codes(findings)


def test_the_quoted_form_value_maps_with_its_quotes(migrate_sources, run_cell_alone, home):
    drive_root, _ = home
    (new,), _ = migrate_sources('wavs = "\\"/content/drive/MyDrive/wavs.zip\\"" #@param {type:"string"}\n'
                                "print(wavs)")
    ok, output = run_cell_alone(new)
    assert ok and output.strip() == f'"{drive_root / "wavs.zip"}"', output


# 7. Drive paths in config text a cell writes to a file ----------------------------------------------------------

TOML_CELL = ('config = """\n'
             '[data]\n'
             'root = "/content/drive/MyDrive/data"\n'
             "out = '/content/out'\n"
             "[model]\n"
             "sizes = {a = 1}\n"
             '"""\n'
             "with open('/content/train.toml', 'w') as fh:\n"
             "    fh.write(config)")


def test_drive_paths_in_a_triple_quoted_config_are_rewritten(migrate_sources):
    (new,), findings = migrate_sources(TOML_CELL)
    assert new == ("import colabkit\n"
                   'config = f"""\n'
                   "[data]\n"
                   "root = \"{colabkit.drive('data')}\"\n"
                   "out = '{colabkit.workdir('out')}'\n"
                   "[model]\n"
                   "sizes = {{a = 1}}\n"
                   '"""\n'
                   "with open(colabkit.workdir('train.toml'), 'w') as fh:\n"
                   "    fh.write(config)")
    assert codes(findings, applied=False) == [] and codes(findings).count("CK110") == 2


def test_the_config_file_gets_this_machines_paths(migrate_sources, run_cell_alone, home):
    drive_root, work = home
    (new,), _ = migrate_sources(TOML_CELL)
    ok, output = run_cell_alone(new)
    assert ok, output
    written = tomllib.loads((work / "train.toml").read_text())
    assert written == {"data": {"root": str(drive_root / "data"), "out": str(work / "out")},
                       "model": {"sizes": {"a": 1}}}


WRITEFILE_CELL = ("%%writefile /content/train.yaml\n"
                  "data: /content/drive/MyDrive/data\n"
                  'output_dir: "/content/out"\n'
                  "params: {lr: 0.1}  # \\d is not an escape here")


def test_drive_paths_in_a_writefile_cell_are_rewritten(migrate_sources):
    (new,), findings = migrate_sources(WRITEFILE_CELL)
    assert new == ("import colabkit\n"
                   "get_ipython().run_cell_magic('writefile', \"{colabkit.workdir('train.yaml', quoted=True)}\", "
                   "rf\"\"\"data: {colabkit.drive('data')}\n"
                   "output_dir: \"{colabkit.workdir('out')}\"\n"
                   "params: {{lr: 0.1}}  # \\d is not an escape here\n"
                   '""")')
    assert codes(findings, applied=False) == []


def test_the_writefile_cell_writes_this_machines_paths(migrate_sources, run_cell_alone, home):
    drive_root, work = home
    (new,), _ = migrate_sources(WRITEFILE_CELL)
    ok, output = run_cell_alone(new)
    assert ok, output
    assert (work / "train.yaml").read_text() == (f"data: {drive_root / 'data'}\n"
                                                 f'output_dir: "{work / "out"}"\n'
                                                 "params: {lr: 0.1}  # \\d is not an escape here\n")


def test_shown_only_text_and_docstrings_stay_as_they_are(migrate_sources):
    source = ('def f():\n    """Reads\n    /content/drive/MyDrive/data."""\n'
              'print("""Put the files in\n/content/drive/MyDrive/data""")')
    (new,), findings = migrate_sources(source)
    assert new == source and findings == []


def test_goldens_of_these_constructs_exist():
    from pathlib import Path
    golden = Path(__file__).resolve().parent / "golden"
    for name in ("colab_mount_checks", "colab_shell_comment", "colab_root_link", "colab_condacolab",
                 "colab_env_vars", "colab_form_quoted", "colab_config_files"):
        assert json.loads((golden / f"{name}.ipynb").read_text(encoding="utf-8"))["cells"]
