"""Constructs found in real public Colab notebooks that migrate must not leave Colab-only.

Each test states what a user sees: the migrated cell source, the report's lines, the output file.
"""
from __future__ import annotations

from colabkit.cli import main


def codes(findings, applied=None):
    return [f.code for f in findings if applied is None or f.applied == applied]


# 1. shell escapes continued over several lines with "\" -------------------------------------------------------

def test_continued_shell_escape_rewrites_the_paths_on_every_line(migrate_sources):
    source = ('!python model_main_tf2.py --pipeline_config_path "/content/gdrive/MyDrive/proj/pipeline.config" \\\n'
              '    --model_dir "/content/gdrive/MyDrive/proj/out" \\\n'
              '    --alsologtostderr')
    (new,), findings = migrate_sources(source)
    assert new == ("import colabkit\n"
                   "!python model_main_tf2.py --pipeline_config_path "
                   "{colabkit.drive('proj/pipeline.config', quoted=True)} \\\n"
                   "    --model_dir {colabkit.drive('proj/out', quoted=True)} \\\n"
                   "    --alsologtostderr")
    assert [(f.code, f.line, f.applied) for f in findings if f.code == "CK209"] == [("CK209", 1, True),
                                                                                    ("CK209", 2, True)]


def test_continued_shell_escape_after_cd_and_with_unquoted_content_paths(migrate_sources):
    source = ("%cd /content/models/research\n"
              "!python object_detection/exporter_main_v2.py \\\n"
              "  --trained_checkpoint_dir=/content/training \\\n"
              "  --output_directory /content/drive/MyDrive/exported")
    (new,), findings = migrate_sources(source)
    assert new.splitlines()[1:] == [
        "%cd {colabkit.workdir('models/research')}",
        "!python object_detection/exporter_main_v2.py \\",
        "  --trained_checkpoint_dir={colabkit.workdir('training', quoted=True)} \\",
        "  --output_directory {colabkit.drive('exported', quoted=True)}"]
    assert not [f for f in findings if not f.applied]


def test_continued_shell_escape_with_a_dollar_is_reported_line_by_line(migrate_sources):
    source = '!python train.py --data $DATA \\\n  --out "/content/drive/MyDrive/out"'
    (new,), findings = migrate_sources(source, ignore="training-script")  # its note: test_trainers.py
    assert new == source
    left = [f for f in findings if not f.applied]
    assert [(f.code, f.line) for f in left] == [("CK209", 2)]
    assert "$" in left[0].message and left[0].manual


def test_migrating_a_continued_escape_twice_changes_nothing(migrate_sources):
    source = '!cp "/content/drive/MyDrive/a b.txt" \\\n   /content/x/'
    (once,), _ = migrate_sources(source)
    (twice,), findings = migrate_sources(once)
    assert twice == once and not codes(findings, applied=True)


# 2. unquoted Drive paths as shell arguments ----------------------------------------------------------------------

def test_unquoted_drive_script_path_and_option_values(migrate_sources):
    source = ("!python /content/gdrive/MyDrive/models/research/object_detection/exporter_main_v2.py "
              "--pipeline_config_path=/content/gdrive/MyDrive/proj/pipeline.config --output_directory "
              "/content/gdrive/MyDrive/proj/exported")
    (new,), findings = migrate_sources(source)
    assert new == ("import colabkit\n"
                   "!python {colabkit.drive('models/research/object_detection/exporter_main_v2.py', quoted=True)} "
                   "--pipeline_config_path={colabkit.drive('proj/pipeline.config', quoted=True)} --output_directory "
                   "{colabkit.drive('proj/exported', quoted=True)}")
    assert codes(findings, applied=False) == []


def test_a_path_that_cannot_be_rewritten_in_a_shell_line_is_named_in_the_report(migrate_sources):
    # a list of paths inside one quoted option value: no word of its own to replace
    source = "!python combine.py --npzs='/content/a/x.npz,/content/b/y.npz'"
    (new,), findings = migrate_sources(source)
    assert new == source
    left = [f for f in findings if not f.applied]
    assert left and left[0].line == 1 and "/content/a/x.npz" in left[0].message and left[0].manual


# 3. form fields whose value is a Drive path -----------------------------------------------------------------------

def test_form_field_keeps_its_literal_and_maps_it_on_the_next_line(migrate_sources):
    source = 'zip = "/content/drive/MyDrive/lora_training/datasets/example.zip" #@param {type:"string"}'
    (new,), findings = migrate_sources(source)
    assert new.splitlines() == [
        "import colabkit",
        'zip = "/content/drive/MyDrive/lora_training/datasets/example.zip" #@param {type:"string"}',
        "zip = colabkit.portable_path(zip)"]
    assert "CK402" in codes(findings, applied=True)


def test_form_field_with_escaped_space_is_mapped(migrate_sources):
    source = "snapshot = '/content/drive/My\\ Drive/results/net.pkl' #@param {type:\"string\"}"
    (new,), findings = migrate_sources(source)
    assert new.splitlines()[-1] == "snapshot = colabkit.portable_path(snapshot)"
    assert "CK402" in codes(findings, applied=True)
    from colabkit.portable import classify_colab_path
    found = classify_colab_path("/content/drive/My\\ Drive/results/net.pkl")
    assert found is not None and found.kind == "drive" and found.rest == "results/net.pkl"


# 4. checks for the mount point -----------------------------------------------------------------------------------

def test_mount_point_checks_ask_about_drive_root(migrate_sources):
    source = ("import os\n"
              "from google.colab import drive\n"
              "if not os.path.exists('/content/drive'):\n"
              "  drive.mount('/content/drive')\n"
              "elif os.path.isdir(\"/content/drive/\"):\n"
              "  print('already mounted')")
    (new,), findings = migrate_sources(source)
    assert new == ("import os\n"
                   "import colabkit\n"
                   "if not colabkit.drive_mounted():\n"
                   "  colabkit.mount_drive()\n"
                   "elif colabkit.drive_mounted():\n"
                   "  print('already mounted')")
    assert [(f.line, f.applied) for f in findings if f.code == "CK107"] == [(3, True), (5, True)]
    assert "CK104" not in codes(findings)


def test_mount_point_check_before_the_import_gets_an_import(migrate_sources):
    source = ("import os\n"
              "if not os.path.exists('/content/drive'):\n"
              "  from google.colab import drive\n"
              "  drive.mount('/content/drive')")
    (new,), _ = migrate_sources(source)
    lines = new.splitlines()
    assert lines.index("import colabkit") < lines.index("if not colabkit.drive_mounted():")


def test_mount_point_used_as_a_path_is_still_reported(migrate_sources):
    (new,), findings = migrate_sources("os.listdir('/content/drive')")
    assert new == "os.listdir('/content/drive')"
    assert codes(findings) == ["CK104"]


# 5. shell-style escaped spaces in Python strings --------------------------------------------------------------------

def test_escaped_space_in_a_python_string(migrate_sources):
    source = 'network = "/content/drive/My\\ Drive/results/network-snapshot-000160.pkl"'
    (new,), findings = migrate_sources(source)
    assert new == 'import colabkit\nnetwork = colabkit.drive("results/network-snapshot-000160.pkl")'
    assert "CK106" in codes(findings, applied=True)


def test_escaped_space_in_an_fstring_and_a_shell_line(migrate_sources):
    source = ("out = f'/content/drive/My\\ Drive/runs/{name}'\n"
              "!ls /content/drive/My\\ Drive/runs")
    (new,), findings = migrate_sources(source)
    assert new.splitlines()[1:] == ["out = colabkit.drive(f'runs/{name}')",
                                    "!ls {colabkit.drive('runs', quoted=True)}"]
    assert codes(findings, applied=False) == [] and "CK106" in codes(findings)


# 6. !pip with quoted requirement specifiers -------------------------------------------------------------------------

def test_pip_with_quoted_specifiers_becomes_percent_pip(migrate_sources):
    source = ('!pip install -q torch\n'
              '!pip install "opencv-python-headless<4.3"\n'
              "!pip install 'transformers>=4.30,<5' \"numpy<2\"")
    (new,), findings = migrate_sources(source)
    assert new == ('%pip install -q torch\n'
                   '%pip install "opencv-python-headless<4.3"\n'
                   "%pip install 'transformers>=4.30,<5' \"numpy<2\"")
    assert codes(findings, applied=False) == []


def test_pip_with_a_real_redirection_stays_and_is_reported(migrate_sources):
    source = '!pip install "numpy<2" > /dev/null'
    (new,), findings = migrate_sources(source)
    assert new == source
    assert [(f.code, f.applied) for f in findings] == [("CK203", False)]


def test_apt_install_after_an_update_is_reported_with_its_packages(migrate_sources):
    source = "!sudo apt-get update && sudo apt-get install -y ffmpeg libsm6"
    (new,), findings = migrate_sources(source)
    assert new == source
    assert [f.code for f in findings] == ["CK204"]
    assert "ffmpeg libsm6" in findings[0].manual


# 7. -o OUT with nothing to change -----------------------------------------------------------------------------------

def test_explicit_output_is_written_when_nothing_changes(tmp_path, colab_notebook, capsys):
    source = tmp_path / "plain.ipynb"
    source.write_text(colab_notebook("import numpy as np\nprint(np.pi)"), encoding="utf-8")
    out = tmp_path / "out" / "plain.home.ipynb"
    assert main(["migrate", str(source), "-o", str(out)]) == 0
    printed = capsys.readouterr().out
    assert out.read_bytes() == source.read_bytes()
    assert f"{source}: nothing to change; unchanged copy written to {out}" in printed


def test_explicit_output_folder_gets_unchanged_copies_too(tmp_path, colab_notebook, capsys):
    a, b = tmp_path / "a.ipynb", tmp_path / "b.ipynb"
    a.write_text(colab_notebook("x = 1"), encoding="utf-8")
    b.write_text(colab_notebook("p = '/content/drive/MyDrive/x'"), encoding="utf-8")
    folder = tmp_path / "portable"
    assert main(["migrate", str(a), str(b), "-o", str(folder)]) == 0
    assert (folder / "a.ipynb").read_bytes() == a.read_bytes()
    assert "colabkit.drive('x')" in (folder / "b.ipynb").read_text()
    assert "unchanged copy written" in capsys.readouterr().out


def test_no_output_named_still_writes_nothing_when_nothing_changes(tmp_path, colab_notebook, capsys):
    source = tmp_path / "plain.ipynb"
    source.write_text(colab_notebook("x = 1"), encoding="utf-8")
    assert main(["migrate", str(source)]) == 0
    printed = capsys.readouterr().out
    assert "nothing to change" in printed and "written" not in printed
    assert not (tmp_path / "plain.local.ipynb").exists()


def test_explicit_output_that_exists_with_other_content_is_still_refused(tmp_path, colab_notebook, capsys):
    source = tmp_path / "plain.ipynb"
    source.write_text(colab_notebook("x = 1"), encoding="utf-8")
    out = tmp_path / "taken.ipynb"
    out.write_text("mine", encoding="utf-8")
    assert main(["migrate", str(source), "-o", str(out)]) == 2
    assert out.read_text() == "mine"


# 8. string manipulation of Drive paths --------------------------------------------------------------------------------

def test_display_only_string_manipulation_is_left_alone_silently(migrate_sources):
    source = "print('folder: ' + folder.replace('/content/drive/', ''))\nprint(f\"{folder.replace('/content/drive/MyDrive/', '')}\")"
    (new,), findings = migrate_sources(source)
    assert new == source
    assert findings == []


def test_matching_against_the_mount_point_as_text_is_a_by_hand_item(migrate_sources):
    source = "rel = path.replace('/content/drive/', '')\nshutil.copy(path, rel)"
    (new,), findings = migrate_sources(source)
    assert new == source
    assert [(f.code, f.line, f.applied) for f in findings] == [("CK108", 1, False)]
    assert "replace" in findings[0].message and "colabkit.drive()" in findings[0].manual


def test_matching_against_a_my_drive_path_uses_the_portable_path(migrate_sources):
    source = ("if not p.startswith('/content/drive/MyDrive'):\n"
              "  p = os.path.join('/content/drive/MyDrive', p)\n"
              "rel = p.replace('/content/drive/MyDrive/', '')")
    (new,), findings = migrate_sources(source)
    assert new == ("import colabkit\n"
                   "if not p.startswith(colabkit.drive()):\n"
                   "  p = os.path.join(colabkit.drive(), p)\n"
                   "rel = p.replace(colabkit.drive() + '/', '')")
    assert codes(findings, applied=False) == []


def test_fstring_that_joins_an_expression_to_a_colab_prefix(migrate_sources):
    source = ("model = f\"/content{url[url.rfind('/'):]}\"\n"
              "root = f'/content/drive/MyDrive{sub}'\n"
              "bad = f'/content/drive{sub}'")
    (new,), findings = migrate_sources(source)
    assert new.splitlines() == ["import colabkit",
                                "model = f\"{colabkit.workdir()}{url[url.rfind('/'):]}\"",
                                "root = f'{colabkit.drive()}{sub}'",
                                "bad = f'/content/drive{sub}'"]
    assert [(f.code, f.line, f.applied) for f in findings if not f.applied] == [("CK108", 3, False)]


def test_colab_path_inside_a_longer_string_is_a_by_hand_item(migrate_sources):
    source = "os.environ['PYTHONPATH'] += ':/content/models/research/:/content/models/research/slim/'"
    (new,), findings = migrate_sources(source)
    assert new == source
    assert [(f.code, f.applied) for f in findings] == [("CK108", False)]


def test_new_rules_are_listed(capsys):
    assert main(["migrate", "--list-rules"]) == 0
    table = capsys.readouterr().out
    for code, name in (("CK106", "drive-path-escaped-space"), ("CK107", "drive-mount-check"),
                       ("CK108", "path-in-text"), ("CK209", "shell-continued")):
        assert f"{code}  {name}" in table


def test_cd_into_a_colab_path_built_with_dollar_is_a_by_hand_item(migrate_sources):
    source = "%cd /content/gdrive/$mainpth/ComfyUI\n%cd /content/{repo}/src"
    (new,), findings = migrate_sources(source)
    assert new == source
    assert [(f.code, f.line, f.applied) for f in findings] == [("CK104", 1, False), ("CK202", 2, False)]
    assert all("/content/" in f.message and f.manual for f in findings)


def test_by_hand_steps_name_the_cells_and_lines(tmp_path, colab_notebook, capsys):
    source = tmp_path / "nb.ipynb"
    source.write_text(colab_notebook("x = 1", "!apt-get install -y ffmpeg\nos.listdir('/content/drive')",
                                     "!sudo apt-get install -y ffmpeg"), encoding="utf-8")
    assert main(["migrate", str(source), "--check"]) == 0
    out = capsys.readouterr().out
    assert "    - install ffmpeg with your system package manager (cell 2 line 1, cell 3 line 1)" in out
    assert "for files in My Drive use colabkit.drive('...') (cell 2 line 2)" in out


def test_env_magic_with_a_colab_path_value(migrate_sources):
    source = ("%env LD_PRELOAD=/content/gdrive/MyDrive/sd/libtcmalloc_minimal.so.4\n"
              "%env DATA_DIR /content/data/\n"
              "%env PYTHONPATH=/content/a:/content/b")
    (new,), findings = migrate_sources(source)
    assert new.splitlines() == [
        "import colabkit",
        "%env LD_PRELOAD={colabkit.drive('sd/libtcmalloc_minimal.so.4')}",
        "%env DATA_DIR {colabkit.workdir('data/')}",
        "%env PYTHONPATH=/content/a:/content/b"]
    left = [f for f in findings if not f.applied]
    assert [(f.line, f.code) for f in left] == [(3, "CK108")]


def test_continued_escape_with_a_quote_across_lines_is_reported_not_rewritten(migrate_sources):
    source = '!echo "note: \\\n/content/x \\\nend" > /content/log.txt'
    (new,), findings = migrate_sources(source)
    assert new == source
    assert {f.code for f in findings} == {"CK209"} and not [f for f in findings if f.applied]


def test_mount_check_with_the_import_inside_gets_one_import(migrate_sources):
    source = ("import os\n"
              "if not os.path.exists('/content/drive'):\n"
              "  from google.colab import drive\n"
              "  drive.mount('/content/drive')\n"
              "if not os.path.isdir('/content/drive'):\n"
              "  from google.colab import drive")
    (new,), findings = migrate_sources(source)
    assert new == ("import os\n"
                   "import colabkit\n"
                   "if not colabkit.drive_mounted():\n"
                   "  colabkit.mount_drive()\n"
                   "if not colabkit.drive_mounted():\n"
                   "  pass")
    (twice,), again = migrate_sources(new)
    assert twice == new and not [f for f in again if f.applied]


def test_dollar_names_the_notebook_binds_do_not_block_the_rewrite(migrate_sources):
    # IPython expands $name and {expr} together, all or nothing: safe when every $name is a Python name
    first = 'MODEL_PATH = "model.ckpt"\nfor step in range(2):\n  pass'
    second = ('!python /content/convert.py "$MODEL_PATH" --step $step \\\n'
              '  --out /content/drive/MyDrive/out\n'
              "!echo '$HOME is not expanded by IPython' /content/x")
    (_, new), findings = migrate_sources(first, second)
    assert new.splitlines() == [
        "import colabkit",
        "!python {colabkit.workdir('convert.py', quoted=True)} \"$MODEL_PATH\" --step $step \\",
        "  --out {colabkit.drive('out', quoted=True)}",
        "!echo '$HOME is not expanded by IPython' {colabkit.workdir('x', quoted=True)}"]
    assert not [f for f in findings if not f.applied]


def test_dollar_name_the_notebook_does_not_bind_keeps_the_line_and_says_which(migrate_sources):
    source = '!python /content/train.py --out $OUTPUT_DIR\n!cp /content/a ${HOME}/a'
    (new,), findings = migrate_sources(source, ignore="training-script")
    assert new == source
    left = [f for f in findings if not f.applied]
    assert [f.line for f in left] == [1, 2]
    assert "$OUTPUT_DIR" in left[0].message and "${" in left[1].message
