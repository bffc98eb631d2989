"""Each rule on the many spellings real Colab notebooks use: source in, source out, findings."""
from __future__ import annotations

import pytest

from colabkit.migrate import RULES, rule_table, select

# (cell source, expected source after migration). Every case is one cell of its own notebook.
CASES = {
    # --- Drive mount, however google.colab.drive is reached -------------------------------------------------
    "mount": ("from google.colab import drive\ndrive.mount('/content/drive')",
              "import colabkit\ncolabkit.mount_drive()"),
    "mount-double-quotes-force": ('from google.colab import drive\ndrive.mount("/content/drive", force_remount=True)',
                                  "import colabkit\ncolabkit.mount_drive(force_remount=True)"),
    "mount-multiline": ("from google.colab import drive\ndrive.mount(\n    '/content/drive',\n    force_remount=True,\n)",
                        "import colabkit\ncolabkit.mount_drive(\n    force_remount=True,\n)"),
    "mount-old-mountpoint-keyword": ("from google.colab import drive\ndrive.mount(mountpoint='/content/gdrive')",
                                     "import colabkit\ncolabkit.mount_drive()"),
    "mount-positional-flags-kept": ("from google.colab import drive\ndrive.mount('/content/drive', True)",
                                    "import colabkit\ncolabkit.mount_drive('/content/drive', True)"),
    "mount-own-mountpoint-kept": ("from google.colab import drive\ndrive.mount('/mnt/x')",
                                  "import colabkit\ncolabkit.mount_drive('/mnt/x')"),
    "mount-module-alias": ("import google.colab.drive as gd\ngd.mount('/content/drive')",
                           "import colabkit\ncolabkit.mount_drive()"),
    "mount-function-import": ("from google.colab.drive import mount\nmount('/content/drive')",
                              "import colabkit\ncolabkit.mount_drive()"),
    "mount-dotted": ("import os, google.colab\ngoogle.colab.drive.mount('/content/drive')",
                     "import os\nimport colabkit\ncolabkit.mount_drive()"),
    "mount-from-google": ("from google import colab\ncolab.drive.mount('/content/drive')",
                          "import colabkit\ncolabkit.mount_drive()"),
    "flush": ("from google.colab import drive\ndrive.flush_and_unmount()",
              "import colabkit\ncolabkit.flush_and_unmount_drive()"),
    # --- paths in Python strings ----------------------------------------------------------------------------
    "path-drive": ("df = open('/content/drive/MyDrive/data/train.csv')",
                   "import colabkit\ndf = open(colabkit.drive('data/train.csv'))"),
    "path-old-spellings": ('a = "/content/drive/My Drive/x"\nb = "/content/gdrive/MyDrive/x"\n'
                           'c = "/content/gdrive/My Drive/x"\nd = "/gdrive/My Drive/x"\ne = "drive/MyDrive/x"',
                           'import colabkit\na = colabkit.drive("x")\nb = colabkit.drive("x")\n'
                           'c = colabkit.drive("x")\nd = colabkit.drive("x")\ne = colabkit.drive("x")'),
    "path-string-kinds": ("x = r'/content/drive/MyDrive/a'\ny = '''/content/x.txt'''\nz = u'/content/z'",
                          "import colabkit\nx = colabkit.drive(r'a')\ny = colabkit.workdir('''x.txt''')\n"
                          "z = colabkit.workdir(u'z')"),
    "path-fstring": ("name = 'a'\np = f'/content/drive/MyDrive/runs/{name}.h5'",
                     "import colabkit\nname = 'a'\np = colabkit.drive(f'runs/{name}.h5')"),
    "path-fstring-prefix-only": ("s = f'/content{x}'", "import colabkit\ns = f'{colabkit.workdir()}{x}'"),
    "path-concatenation": ("x = ('/content/drive/MyDrive/' 'a.csv')", "import colabkit\nx = (colabkit.drive('a.csv'))"),
    "path-root-and-slash": ("a = '/content/drive/MyDrive'\nb = '/content/drive/MyDrive/'\nc = b + 'x'",
                            "import colabkit\na = colabkit.drive()\nb = colabkit.drive() + '/'\nc = b + 'x'"),
    "path-slash-root-method": ("u = '/content/drive/MyDrive/'.upper()", "import colabkit\nu = (colabkit.drive() + '/').upper()"),
    "path-templates": ("z = '/content/drive/MyDrive/{}.csv'.format(1)\nw = '/content/%s' % 'a'",
                       "import colabkit\nz = colabkit.drive('{}.csv').format(1)\nw = colabkit.workdir('%s') % 'a'"),
    "path-pathlib": ("from pathlib import Path\np = Path('/content/drive/MyDrive') / 'x'",
                     "from pathlib import Path\nimport colabkit\np = Path(colabkit.drive()) / 'x'"),
    "path-not-colab": ("b = b'/content/x'\nq = '/contents/x'\nr = 'see /content/x'", "b = b'/content/x'\nq = '/contents/x'\nr = 'see /content/x'"),
    "path-docstring-comment": ('def f():\n    """Reads /content/drive/MyDrive/x."""\n    return 1  # /content/x',
                               'def f():\n    """Reads /content/drive/MyDrive/x."""\n    return 1  # /content/x'),
    "path-chdir": ("import os\nos.chdir('/content/drive/MyDrive/project')",
                   "import os\nimport colabkit\nos.chdir(colabkit.drive('project'))"),
    "path-unicode": ("p = '/content/drive/MyDrive/données/été.csv'  # é",
                     "import colabkit\np = colabkit.drive('données/été.csv')  # é"),
    # --- paths in shell escapes and magics --------------------------------------------------------------------
    "shell-plain": ("!ls /content/drive/MyDrive", "import colabkit\n!ls {colabkit.drive(quoted=True)}"),
    "shell-quoted-trailing-slash": ('!ls "/content/drive/My Drive/"', "import colabkit\n!ls {colabkit.drive(quoted=True)}/"),
    "shell-backslash-space": ("!cp /content/drive/My\\ Drive/x.zip .",
                              "import colabkit\n!cp {colabkit.drive('x.zip', quoted=True)} ."),
    "shell-option-value": ("!python train.py --data_dir=/content/drive/MyDrive/data",
                           "import colabkit\n!python train.py --data_dir={colabkit.drive('data', quoted=True)}"),
    "shell-glob": ("!ls /content/drive/MyDrive/imgs/*.jpg", "import colabkit\n!ls {colabkit.drive('imgs', quoted=True)}/*.jpg"),
    "shell-glob-after-quotes": ('!ls "/content/drive/My Drive/"*.csv',
                                'import colabkit\n!ls {colabkit.drive(quoted=True)}"/"*.csv'),
    "shell-unzip": ("!unzip -q /content/drive/MyDrive/data.zip -d /content/data",
                    "import colabkit\n!unzip -q {colabkit.drive('data.zip', quoted=True)} -d {colabkit.workdir('data', quoted=True)}"),
    "shell-comment": ("!ls /content/drive/MyDrive # list", "import colabkit\n!ls {colabkit.drive(quoted=True)} # list"),
    "shell-assign-and-capture": ("files = !ls /content/x\n!!ls /content",
                                 "import colabkit\nfiles = !ls {colabkit.workdir('x', quoted=True)}\n"
                                 "!!ls {colabkit.workdir(quoted=True)}"),
    "shell-indented": ("for i in range(2):\n    !echo /content/x",
                       "import colabkit\nfor i in range(2):\n    !echo {colabkit.workdir('x', quoted=True)}"),
    "shell-dollar-left": ("!cp /content/drive/MyDrive/a $HOME/", "!cp /content/drive/MyDrive/a $HOME/"),
    "shell-continued": ("!cp /content/a \\\n  /content/b",
                        "import colabkit\n!cp {colabkit.workdir('a', quoted=True)} \\\n"
                        "  {colabkit.workdir('b', quoted=True)}"),
    "cd": ('%cd "/content/drive/My Drive/proj"\n%cd -q /content',
           "import colabkit\n%cd {colabkit.drive('proj')}\n%cd -q {colabkit.workdir()}"),
    "cd-mountpoint-left": ("%cd /content/drive", "%cd /content/drive"),
    "run-magic": ("%run /content/drive/MyDrive/script.py", "import colabkit\n%run {colabkit.drive('script.py', quoted=True)}"),
    # --- pip, apt, nvidia-smi, tensorflow_version, %%shell ------------------------------------------------------
    "pip-spellings": ("!pip install x\n! pip install x\n!pip3 install x\n!python -m pip install y\n"
                      "!python3 -m pip install y\n!{sys.executable} -m pip install z",
                      "%pip install x\n%pip install x\n%pip install x\n%pip install y\n%pip install y\n%pip install z"),
    "pip-left": ("x = !pip list\n%pip install w\n!pip install -q x > /dev/null\n!pip install x && echo ok",
                 "x = !pip list\n%pip install w\n!pip install -q x > /dev/null\n!pip install x && echo ok"),
    "pip-continued": ("!pip install a \\\n    b", "%pip install a \\\n    b"),
    "pip-requirements-on-drive": ("!pip install -r /content/drive/MyDrive/req.txt",
                                  "import colabkit\n%pip install -r {colabkit.drive('req.txt', quoted=True)}"),
    "nvidia-smi": ("!nvidia-smi\n!nvidia-smi -L\ngpu = !nvidia-smi --query-gpu=name --format=csv",
                   '!nvidia-smi || echo "colabkit: nvidia-smi failed or is missing (no NVIDIA GPU driver here)"\n'
                   '!nvidia-smi -L || echo "colabkit: nvidia-smi failed or is missing (no NVIDIA GPU driver here)"\n'
                   'gpu = !nvidia-smi --query-gpu=name --format=csv || echo "colabkit: nvidia-smi failed or is '
                   'missing (no NVIDIA GPU driver here)"'),
    "nvidia-smi-pipelines-left": ("!nvidia-smi | grep MiB\n!nvidia-smi || true", "!nvidia-smi | grep MiB\n!nvidia-smi || true"),
    "tensorflow-version": ("%tensorflow_version 2.x\nimport tensorflow as tf",
                           "# %tensorflow_version 2.x  # colabkit migrate: Colab-only magic, no effect on current Colab"
                           "\nimport tensorflow as tf"),
    "tensorflow-version-alone-in-block": ("try:\n  %tensorflow_version 2.x\nexcept Exception:\n  pass",
                                          "try:\n  pass  # %tensorflow_version 2.x  # colabkit migrate: Colab-only "
                                          "magic, no effect on current Colab\nexcept Exception:\n  pass"),
    "shell-cell": ("%%shell\necho hi", "%%bash\necho hi"),
    "capture-body": ("%%capture\n!pip install x\np = '/content/x'",
                     "%%capture\n%pip install x\nimport colabkit\np = colabkit.workdir('x')"),
    # --- google.colab APIs -------------------------------------------------------------------------------------------
    "secret": ("from google.colab import userdata\nkey = userdata.get('OPENAI_API_KEY')",
               "import colabkit\nkey = colabkit.secret('OPENAI_API_KEY')"),
    "upload-download": ("from google.colab import files\nup = files.upload()\nfiles.download('model.h5')",
                        "import colabkit\nup = colabkit.upload()\ncolabkit.download('model.h5')"),
    "auth": ("from google.colab import auth\nauth.authenticate_user()", "import colabkit\ncolabkit.authenticate_user()"),
    "cv2-imshow": ("from google.colab.patches import cv2_imshow\ncv2_imshow(img)", "import colabkit\ncolabkit.cv2_imshow(img)"),
    "imports-merged": ("from google.colab import drive, files\nfrom google.colab import userdata\n"
                       "drive.mount('/content/drive')\nfiles.upload()\nuserdata.get('K')",
                       "import colabkit\ncolabkit.mount_drive()\ncolabkit.upload()\ncolabkit.secret('K')"),
    "import-in-function": ("def setup():\n    from google.colab import drive\n    drive.mount('/content/drive')",
                           "import colabkit\ndef setup():\n    colabkit.mount_drive()"),
    "guard-widget-manager": ("from google.colab import output\noutput.enable_custom_widget_manager()",
                             "import colabkit\nif colabkit.on_colab():\n    from google.colab import output\n"
                             "if colabkit.on_colab():\n    output.enable_custom_widget_manager()"),
    "guard-in-loop-keeps-strings": ("from google.colab import files\nfor i in range(3):\n    files.view('''a\nb''')",
                                    "import colabkit\nif colabkit.on_colab():\n    from google.colab import files\n"
                                    "for i in range(3):\n    if colabkit.on_colab():\n        files.view('''a\nb''')"),
    "guard-load-ext": ("%load_ext google.colab.data_table",
                       "import colabkit\nif colabkit.on_colab():\n    get_ipython().run_line_magic('load_ext', "
                       "'google.colab.data_table')"),
    "eval-js-reported": ("from google.colab import output\nx = output.eval_js('1')",
                         "import colabkit\nif colabkit.on_colab():\n    from google.colab import output\n"
                         "x = output.eval_js('1')"),
    # --- what is already portable, or must not be touched ------------------------------------------------------------
    "user-guard-if": ("import sys\nif 'google.colab' in sys.modules:\n    from google.colab import drive\n"
                      "    drive.mount('/content/drive')\n    path = '/content/drive/MyDrive/x'\nelse:\n    path = './x'",
                      "import sys\nif 'google.colab' in sys.modules:\n    from google.colab import drive\n"
                      "    drive.mount('/content/drive')\n    path = '/content/drive/MyDrive/x'\nelse:\n    path = './x'"),
    "user-guard-try": ("try:\n  from google.colab import drive\n  drive.mount('/content/drive')\n  IN_COLAB = True\n"
                       "except ImportError:\n  IN_COLAB = False",
                       "try:\n  from google.colab import drive\n  drive.mount('/content/drive')\n  IN_COLAB = True\n"
                       "except ImportError:\n  IN_COLAB = False"),
    "user-guard-ifexp": ("root = '/content/drive/MyDrive' if IN_COLAB else './data'",
                         "root = '/content/drive/MyDrive' if IN_COLAB else './data'"),
    "top-level-await": ("import asyncio\nawait asyncio.sleep(0)\np = '/content/x'",
                        "import asyncio\nimport colabkit\nawait asyncio.sleep(0)\np = colabkit.workdir('x')"),
    "help-syntax": ("len?\np = '/content/x'", "len?\nimport colabkit\np = colabkit.workdir('x')"),
    "not-magics": ("x = 10 % 3\ny = x != 1\nprint('100%')", "x = 10 % 3\ny = x != 1\nprint('100%')"),
    "syntax-error-cell-untouched": ("!pip install x\ndef f(:\n  pass", "!pip install x\ndef f(:\n  pass"),
    "indented-cell-untouched": ("  x = '/content/x'\n  y = 1", "  x = '/content/x'\n  y = 1"),
    "prompt-cell-untouched": (">>> x = '/content/x'", ">>> x = '/content/x'"),
    "forms-kept": ('#@title Settings { display-mode: "form" }\n#@markdown Pick one\nlr = 0.1 #@param {type:"number"}',
                   '#@title Settings { display-mode: "form" }\n#@markdown Pick one\nlr = 0.1 #@param {type:"number"}'),
    "form-path": ("#@title Data\ndata_dir = '/content/drive/MyDrive/data' #@param {type:\"string\"}\nprint(data_dir)",
                  "#@title Data\nimport colabkit\ndata_dir = '/content/drive/MyDrive/data' #@param {type:\"string\"}\n"
                  "data_dir = colabkit.portable_path(data_dir)\nprint(data_dir)"),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_rewrite(case, migrate_sources):
    source, expected = CASES[case]
    (new,), _ = migrate_sources(source)
    assert new == expected


@pytest.mark.parametrize("case", sorted(CASES))
def test_rewrite_is_idempotent(case, migrate_sources):
    _, expected = CASES[case]
    (again,), findings = migrate_sources(expected)
    assert again == expected
    assert not [f for f in findings if f.applied]


def _codes(findings, applied=None):
    return [f.code for f in findings if applied is None or f.applied == applied]


def test_findings_say_where_and_what(migrate_sources):
    _, findings = migrate_sources("import os\n", "from google.colab import drive\ndrive.mount('/content/drive')")
    mount = next(f for f in findings if f.code == "CK101")
    assert (mount.cell, mount.line, mount.applied) == (1, 2, True)
    assert mount.before == ["drive.mount('/content/drive')"] and mount.after == ["colabkit.mount_drive()"]
    assert "drive_root" in mount.manual
    imp = next(f for f in findings if f.code == "CK301")
    assert imp.before == ["from google.colab import drive"] and imp.after == ["import colabkit"]


def test_secret_manual_step_names_the_variable(migrate_sources):
    _, findings = migrate_sources("from google.colab import userdata\nk = userdata.get('WANDB_API_KEY')")
    assert next(f for f in findings if f.code == "CK304").manual == \
        "set the environment variable WANDB_API_KEY on this machine"


@pytest.mark.parametrize("source, code", [
    ("!apt-get -qq install -y graphviz > /dev/null", "CK204"),
    ("!sudo apt install ffmpeg", "CK204"),
    ("!cp kaggle.json ~/.kaggle/", "CK206"),
    ("from google.colab import output\nx = output.eval_js('1')", "CK307"),
    ("from google.colab import widgets\ng = widgets.Grid(2, 2)", "CK309"),
    ("from google.colab import runtime\nx = runtime.unassign()", "CK308"),
    ("t = '/content/drive/Shareddrives/team/a.csv'", "CK104"),
    ("m = '/content/drive'", "CK104"),
    ("%%bash\ncp /content/drive/MyDrive/a /content/", "CK208"),
    ("!cp /content/a $HOME/", "CK201"),
    ("def f(:\n  pass", "CK001"),
    (">>> 1", "CK002"),
    ("%tensorflow_version 1.x", "CK310"),
    ("!pip install x > log.txt", "CK203"),
])
def test_reported_for_the_user(source, code, migrate_sources):
    _, findings = migrate_sources(source)
    found = [f for f in findings if f.code == code]
    assert found and found[0].manual, findings
    if code != "CK310":
        assert not found[0].applied


def test_apt_manual_step_names_packages(migrate_sources):
    _, findings = migrate_sources("!apt-get -qq install -y graphviz libgraphviz-dev > /dev/null")
    assert findings[0].manual == "install graphviz libgraphviz-dev with your system package manager"


def test_sample_data_gets_a_manual_step(migrate_sources):
    _, findings = migrate_sources("df = open('/content/sample_data/mnist_test.csv')")
    assert "sample_data" in next(f for f in findings if f.code == "CK201").manual


def test_import_kept_for_colab_when_another_cell_still_needs_it(migrate_sources):
    cells, findings = migrate_sources("from google.colab import drive, output",
                                      "drive.mount('/content/drive')",
                                      "html = output.eval_js('document.title')")
    assert cells[0] == "import colabkit\nif colabkit.on_colab():\n    from google.colab import output"
    assert cells[1] == "import colabkit\ncolabkit.mount_drive()"  # each cell imports what it uses
    assert _codes(findings, applied=False) == ["CK307"]


def test_try_import_idiom_does_not_keep_the_import_alive(migrate_sources):
    """`try: from google.colab import drive` + `if IN_COLAB: drive.mount(...)` is already portable."""
    cells, _ = migrate_sources("try:\n  from google.colab import drive\n  IN_COLAB = True\nexcept ImportError:\n"
                               "  IN_COLAB = False",
                               "if IN_COLAB:\n  drive.mount('/content/drive')",
                               "from google.colab import files\nfiles.upload()")
    assert cells[2] == "import colabkit\ncolabkit.upload()"


def test_import_added_before_first_use_in_each_cell_that_uses_it(migrate_sources):
    cells, _ = migrate_sources("#@title Paths\n# data lives on Drive\n\nDATA = '/content/drive/MyDrive/d'",
                               "OUT = '/content/out'")
    assert cells[0] == "#@title Paths\n# data lives on Drive\n\nimport colabkit\nDATA = colabkit.drive('d')"
    assert cells[1] == "import colabkit\nOUT = colabkit.workdir('out')"


def test_writefile_path_needs_an_earlier_import(migrate_sources):
    # a %%writefile cell cannot import colabkit before IPython expands its first line: an earlier cell must
    cells, findings = migrate_sources("%%writefile /content/x.py\nprint(1)", ignore="install-cell")
    assert cells == ["%%writefile /content/x.py\nprint(1)"]
    assert "import colabkit" in findings[0].manual and not findings[0].applied
    cells, _ = migrate_sources("import colabkit", "%%writefile /content/x.py\nprint(1)", ignore="install-cell")
    assert cells[1] == "%%writefile {colabkit.workdir('x.py', quoted=True)}\nprint(1)"
    # the install cell migrate adds at the top imports colabkit before any other cell runs
    cells, findings = migrate_sources("%%writefile /content/x.py\nprint(1)")
    assert cells == ["%%writefile {colabkit.workdir('x.py', quoted=True)}\nprint(1)"]
    assert all(f.applied for f in findings)


def test_guard_uses_the_notebooks_indentation(migrate_sources):
    cells, _ = migrate_sources("if True:\n  x = 1", "from google.colab import runtime\nruntime.unassign()")
    assert cells[1] == ("import colabkit\nif colabkit.on_colab():\n  from google.colab import runtime\n"
                        "if colabkit.on_colab():\n  runtime.unassign()")


def test_rule_selection(migrate_sources):
    source = "!pip install x\np = '/content/drive/MyDrive/x'"
    (only_pip,), findings = migrate_sources(source, rules="CK203")
    assert only_pip == "%pip install x\np = '/content/drive/MyDrive/x'"
    assert _codes(findings) == ["CK203"]
    (no_drive,), _ = migrate_sources(source, ignore=["drive-path"])
    assert no_drive == "%pip install x\np = '/content/drive/MyDrive/x'"
    (by_prefix,), _ = migrate_sources(source, rules="CK1")
    assert by_prefix == "!pip install x\nimport colabkit\np = colabkit.drive('x')"


def test_unknown_rule_is_a_clear_error():
    with pytest.raises(ValueError, match=r"Unknown rule 'CK999' in --rules; known rules: CK001 \(syntax-error\)"):
        select("CK101,CK999")


def test_drive_root_check_reports_missing_files(tmp_path, migrate_sources):
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "have.csv").write_text("x")
    _, findings = migrate_sources("a = '/content/drive/MyDrive/data/have.csv'\nb = '/content/drive/MyDrive/data/gone.csv'",
                                  drive_root=str(tmp_path))
    manual = {f.line: f.manual for f in findings if f.code == "CK102"}
    assert manual[1] == ""
    assert manual[2] == f"data/gone.csv is not in {tmp_path} (fine if the notebook creates it)"


def test_non_python_notebook_is_left_alone(colab_notebook):
    import json
    from colabkit.migrate import migrate_text
    data = json.loads(colab_notebook("drive.mount('/content/drive')"))
    data["metadata"]["kernelspec"] = {"name": "ir", "display_name": "R", "language": "R"}
    text = json.dumps(data, indent=2)
    assert migrate_text(text) == (text, [], [])


def test_rule_registry_is_complete_and_listed():
    codes = [r.code for r in RULES]
    assert codes == sorted(codes) and len(set(codes)) == len(codes)
    assert len({r.name for r in RULES}) == len(RULES)
    table = rule_table()
    for rule in RULES:
        assert rule.code in table and rule.title in table and rule.matches and rule.fix
    issue_constructs = ["drive-mount", "drive-path", "drive-path-old", "content-path", "content-cwd", "pip-install",
                        "nvidia-smi", "files-upload", "files-download", "secrets", "auth", "cv2-imshow",
                        "colab-output", "forms", "tensorflow-version"]
    assert set(issue_constructs) <= {r.name for r in RULES}
    assert not next(r for r in RULES if r.name == "colab-output").automatic


def test_windows_line_breaks_inside_cells_are_kept(migrate_sources):
    source = "from google.colab import output\r\noutput.enable_custom_widget_manager()\r\n!nvidia-smi\r\nx = '/content/x'\r\n"
    (new,), findings = migrate_sources(source)
    assert new == ("import colabkit\r\nif colabkit.on_colab():\r\n    from google.colab import output\r\n"
                   "if colabkit.on_colab():\r\n    output.enable_custom_widget_manager()\r\n"
                   '!nvidia-smi || echo "colabkit: nvidia-smi failed or is missing (no NVIDIA GPU driver here)"\r\n'
                   "x = colabkit.workdir('x')\r\n")
    assert next(f for f in findings if f.code == "CK201").after == ["x = colabkit.workdir('x')"]
    (again,), _ = migrate_sources(new)
    assert again == new
