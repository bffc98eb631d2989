"""`colabkit migrate` on files: outputs, backups, refusals, --check/--diff exit codes, bad input, JSON reports."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from colabkit._version import __version__
from colabkit.cli import main
from colabkit.migrate import default_output, migrate_notebook, migrate_paths

GOLDEN = Path(__file__).resolve().parent / "golden"


@pytest.fixture
def nbs(tmp_path):
    """A folder with copies of the Colab golden notebooks, plus the expected results."""
    for name in ("colab_drive_training", "colab_secrets_files", "already_portable"):
        shutil.copy(GOLDEN / f"{name}.ipynb", tmp_path / f"{name}.ipynb")
    return tmp_path


def expected(name) -> bytes:
    return (GOLDEN / f"{name}.expected.ipynb").read_bytes()


def run_cli(*args, capsys):
    code = main(["migrate", *map(str, args)])
    out, err = capsys.readouterr()
    return code, out, err


def test_default_output_is_a_new_file_and_the_original_is_untouched(nbs, capsys):
    original = (nbs / "colab_drive_training.ipynb").read_bytes()
    code, out, _ = run_cli(nbs / "colab_drive_training.ipynb", capsys=capsys)
    assert code == 0
    assert (nbs / "colab_drive_training.ipynb").read_bytes() == original
    assert (nbs / "colab_drive_training.local.ipynb").read_bytes() == expected("colab_drive_training")
    assert f"-> {nbs / 'colab_drive_training.local.ipynb'}: 20 changes, 1 to do by hand" in out
    assert "cell 2 line 3  CK101 drive.mount(...) -> colabkit.mount_drive(...)" in out
    assert "      - drive.mount('/content/drive')\n      + colabkit.mount_drive()" in out
    assert "by hand:" in out and f'to run it: pip install "colabkit>={__version__}"' in out


def test_default_output_name():
    assert default_output("a/train.ipynb") == Path("a/train.local.ipynb")
    assert default_output("notes") == Path("notes.local.ipynb")


def test_nothing_written_when_nothing_changes(nbs, capsys):
    code, out, _ = run_cli(nbs / "already_portable.ipynb", capsys=capsys)
    assert code == 0 and "nothing to change" in out
    assert not (nbs / "already_portable.local.ipynb").exists()


def test_existing_output_is_refused_without_force(nbs, capsys):
    target = nbs / "colab_drive_training.local.ipynb"
    target.write_text("my own edits")
    code, _, err = run_cli(nbs / "colab_drive_training.ipynb", capsys=capsys)
    assert code == 2
    assert f"the output {target} already exists; pass --force to overwrite it" in err
    assert target.read_text() == "my own edits"
    code, _, _ = run_cli(nbs / "colab_drive_training.ipynb", "--force", capsys=capsys)
    assert code == 0 and target.read_bytes() == expected("colab_drive_training")


def test_existing_output_with_the_same_result_is_fine(nbs, capsys):
    assert run_cli(nbs / "colab_drive_training.ipynb", capsys=capsys)[0] == 0
    assert run_cli(nbs / "colab_drive_training.ipynb", capsys=capsys)[0] == 0  # idempotent re-run, no --force


def test_in_place_keeps_a_backup_and_never_overwrites_one(nbs, capsys):
    path = nbs / "colab_drive_training.ipynb"
    original = path.read_bytes()
    (nbs / "colab_drive_training.ipynb.bak").write_bytes(b"an older backup")
    code, out, _ = run_cli(path, "--in-place", capsys=capsys)
    assert code == 0
    assert path.read_bytes() == expected("colab_drive_training")
    assert (nbs / "colab_drive_training.ipynb.bak").read_bytes() == b"an older backup"
    assert (nbs / "colab_drive_training.ipynb.bak1").read_bytes() == original
    assert "original kept as" in out and "colab_drive_training.ipynb.bak1" in out
    # a second in-place run changes nothing and makes no new backup
    assert run_cli(path, "--in-place", capsys=capsys)[0] == 0
    assert not (nbs / "colab_drive_training.ipynb.bak2").exists()


def test_in_place_keeps_the_file_mode(nbs, capsys):
    path = nbs / "colab_drive_training.ipynb"
    path.chmod(0o640)
    run_cli(path, "--in-place", capsys=capsys)
    assert (path.stat().st_mode & 0o777) == 0o640


def test_output_file_and_output_folder(nbs, tmp_path, capsys):
    out_file = tmp_path / "out" / "mine.ipynb"
    assert run_cli(nbs / "colab_drive_training.ipynb", "-o", out_file, capsys=capsys)[0] == 0
    assert out_file.read_bytes() == expected("colab_drive_training")
    folder = tmp_path / "portable"
    code, out, _ = run_cli(nbs / "colab_drive_training.ipynb", nbs / "colab_secrets_files.ipynb",
                           nbs / "already_portable.ipynb", "-o", folder, capsys=capsys)
    assert code == 0
    assert (folder / "colab_drive_training.ipynb").read_bytes() == expected("colab_drive_training")
    assert (folder / "colab_secrets_files.ipynb").read_bytes() == expected("colab_secrets_files")
    # the folder the user named holds every notebook: the one with nothing to change as an identical copy
    assert (folder / "already_portable.ipynb").read_bytes() == (nbs / "already_portable.ipynb").read_bytes()
    assert "3 notebooks: 2 migrated, 1 already portable, 0 failed" in out


def test_output_that_is_the_input_is_refused(nbs, capsys):
    code, _, err = run_cli(nbs / "colab_drive_training.ipynb", "-o", nbs / "colab_drive_training.ipynb", capsys=capsys)
    assert code == 2 and "use --in-place" in err


def test_same_output_for_two_inputs_is_refused(nbs, tmp_path, capsys):
    other = tmp_path / "other"
    other.mkdir()
    shutil.copy(nbs / "colab_drive_training.ipynb", other / "colab_drive_training.ipynb")
    code, _, err = run_cli(nbs / "colab_drive_training.ipynb", other / "colab_drive_training.ipynb",
                           "-o", tmp_path / "out", capsys=capsys)
    assert code == 2 and "is also the output of" in err
    assert (tmp_path / "out" / "colab_drive_training.ipynb").exists()


def test_check_writes_nothing_and_exits_1_when_changes_are_needed(nbs, capsys):
    before = sorted(os.listdir(nbs))
    code, out, _ = run_cli(nbs / "colab_drive_training.ipynb", "--check", capsys=capsys)
    assert code == 1 and "would migrate to" in out
    assert sorted(os.listdir(nbs)) == before
    assert run_cli(nbs / "already_portable.ipynb", "--check", capsys=capsys)[0] == 0


def test_check_passes_on_a_migrated_notebook(nbs, capsys):
    run_cli(nbs / "colab_drive_training.ipynb", capsys=capsys)
    code, out, _ = run_cli(nbs / "colab_drive_training.local.ipynb", "--check", "-q", capsys=capsys)
    assert code == 0 and "nothing to change" in out


def test_diff_prints_cell_source_diffs_and_writes_nothing(nbs, capsys):
    code, out, _ = run_cli(nbs / "colab_drive_training.ipynb", "--diff", capsys=capsys)
    assert code == 0
    assert f"--- {nbs / 'colab_drive_training.ipynb'} (cell 2)\n+++ {nbs / 'colab_drive_training.local.ipynb'} (cell 2)" in out
    assert "-drive.mount('/content/drive')\n" in out and "+colabkit.mount_drive()\n" in out
    assert '"cell_type"' not in out  # sources, not JSON
    assert not (nbs / "colab_drive_training.local.ipynb").exists()
    assert run_cli(nbs / "colab_drive_training.ipynb", "--diff", "--check", capsys=capsys)[0] == 1


def test_list_rules(capsys):
    code, out, _ = run_cli("--list-rules", capsys=capsys)
    assert code == 0
    assert "CK101  drive-mount" in out and "CK307  colab-output" in out and "report" in out


def test_rules_option(nbs, capsys):
    code, out, _ = run_cli(nbs / "colab_drive_training.ipynb", "--check", "--rules", "CK105", capsys=capsys)
    assert code == 1 and "CK105" in out and "CK101" not in out
    code, _, err = run_cli(nbs / "colab_drive_training.ipynb", "--rules", "nope", capsys=capsys)
    assert code == 2 and "Unknown rule 'nope'" in err


def test_json_report(nbs, capsys):
    code, out, _ = run_cli(nbs / "colab_secrets_files.ipynb", "--check", "--json", capsys=capsys)
    reports = json.loads(out)
    assert code == 1 and len(reports) == 1
    report = reports[0]
    assert report["status"] == "would migrate" and report["changed"] is True
    secret = next(f for f in report["findings"] if f["code"] == "CK304")
    assert secret == {"code": "CK304", "rule": "secrets", "cell": 2, "line": 2, "new_cell": False,
                      "message": "userdata.get(...) -> colabkit.secret(...)", "applied": True,
                      "manual": "set the environment variable HF_TOKEN on this machine",
                      "before": ["token = userdata.get('HF_TOKEN')"], "after": ["token = colabkit.secret('HF_TOKEN')"]}
    assert "set the environment variable HF_TOKEN on this machine" in report["manual_steps"]


def test_no_notebooks_is_a_usage_error(capsys):
    code, _, err = run_cli(capsys=capsys)
    assert code == 2 and "no notebooks given" in err


# --- bad input: one clear line per file, the other files still processed, exit code 2 ----------------------------

@pytest.fixture
def bad_inputs(nbs):
    (nbs / "text.ipynb").write_text("this is not json {")
    (nbs / "list.ipynb").write_text("[1, 2, 3]")
    (nbs / "v3.ipynb").write_text(json.dumps({"nbformat": 3, "nbformat_minor": 0, "metadata": {},
                                              "worksheets": [{"cells": []}]}))
    (nbs / "latin1.ipynb").write_bytes('{"nbformat": 4, "cells": [], "x": "caf\xe9"}'.encode("latin-1"))
    (nbs / "folder.ipynb").mkdir()
    unreadable = nbs / "secret.ipynb"
    shutil.copy(nbs / "colab_drive_training.ipynb", unreadable)
    unreadable.chmod(0)
    yield nbs
    unreadable.chmod(0o644)


def test_bad_inputs_are_reported_and_the_rest_is_processed(bad_inputs, capsys):
    nbs = bad_inputs
    names = ["text", "list", "v3", "latin1", "folder", "missing", "colab_drive_training"]
    can_read_anything = os.geteuid() == 0 if hasattr(os, "geteuid") else False
    if not can_read_anything:
        names.insert(-1, "secret")
    code, out, err = run_cli(*[nbs / f"{n}.ipynb" for n in names], capsys=capsys)
    assert code == 2
    lines = {line.split(": error: ")[0]: line.split(": error: ")[1] for line in err.splitlines() if ": error: " in line}
    assert lines[str(nbs / "text.ipynb")].startswith("not JSON (Expecting value at line 1 column 1)")
    assert lines[str(nbs / "list.ipynb")].startswith("not a Jupyter notebook")
    assert lines[str(nbs / "v3.ipynb")].startswith("nbformat 3 notebook")
    assert lines[str(nbs / "latin1.ipynb")].startswith("not UTF-8 text")
    assert lines[str(nbs / "folder.ipynb")].startswith("is a directory")
    assert lines[str(nbs / "missing.ipynb")] == "no such file"
    if not can_read_anything:
        assert lines[str(nbs / "secret.ipynb")] == "cannot read it: permission denied"
    assert (nbs / "colab_drive_training.local.ipynb").read_bytes() == expected("colab_drive_training")
    assert f"{len(names)} notebooks: 1 migrated, 0 already portable, {len(names) - 1} failed" in out


def test_unreadable_file_reports_permission_denied(bad_inputs, monkeypatch):
    """Root reads any file, so make the read fail the way it does for other users."""
    real = Path.read_bytes

    def denied(self):
        if self.name == "secret.ipynb":
            raise PermissionError(13, "Permission denied", str(self))
        return real(self)

    monkeypatch.setattr(Path, "read_bytes", denied)
    report = migrate_notebook(bad_inputs / "secret.ipynb")
    assert report.failed and report.error == "cannot read it: permission denied"


def test_syntax_error_cell_is_left_alone_and_reported(tmp_path, colab_notebook, capsys):
    path = tmp_path / "broken.ipynb"
    path.write_text(colab_notebook("from google.colab import drive\ndrive.mount('/content/drive')",
                                   "for x in range(3)\n    print('/content/x')"))
    code, out, _ = run_cli(path, capsys=capsys)
    assert code == 0
    cells = json.loads((tmp_path / "broken.local.ipynb").read_text())["cells"][1:]  # after the install cell
    assert "".join(cells[0]["source"]) == "import colabkit\ncolabkit.mount_drive()"
    assert "".join(cells[1]["source"]) == "for x in range(3)\n    print('/content/x')"
    assert "cell 2 line 1  CK001 cell left unchanged: SyntaxError: expected ':'" in out


def test_unwritable_output_is_a_clear_error(nbs, tmp_path):
    blocked = tmp_path / "blocked"
    blocked.write_text("a file where a folder should be")
    report = migrate_notebook(nbs / "colab_drive_training.ipynb", blocked / "x.ipynb")
    assert report.failed and report.error.startswith("cannot write")


def test_migrate_paths_validates_rules_before_touching_files(nbs):
    with pytest.raises(ValueError, match="Unknown rule"):
        migrate_paths([nbs / "colab_drive_training.ipynb"], rules="CK9")
    assert not (nbs / "colab_drive_training.local.ipynb").exists()


def test_python_api_report(nbs):
    report = migrate_notebook(nbs / "colab_secrets_files.ipynb", check=True)
    assert report.status == "would migrate" and report.changed and not report.failed
    assert [(c.cell, c.new) for c in report.changes] == [(1, True), (1, False), (2, False), (4, False), (5, False),
                                                         (6, False)]
    assert "set the environment variable HF_TOKEN on this machine" in report.manual_steps
    assert report.install == f'pip install "colabkit[notebook]>={__version__}"'  # cv2_imshow shows images with IPython.display


def test_console_script_end_to_end(nbs):
    """The real `python -m colabkit migrate --check`, as a pre-commit hook runs it."""
    done = subprocess.run([sys.executable, "-m", "colabkit", "migrate", "--check", "-q",
                           str(nbs / "colab_drive_training.ipynb"), str(nbs / "already_portable.ipynb")],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 1, done.stderr
    assert "would migrate to" in done.stdout and "nothing to change" in done.stdout
    assert "2 notebooks: 1 to migrate, 1 already portable, 0 failed" in done.stdout


def _transformer_needs_ipython() -> bool:
    """IPython 9's inputtransformer2 imports IPython.utils (so the IPython package); IPython 8's is stdlib-only."""
    import importlib.util
    import os
    path = os.path.join(os.path.dirname(importlib.util.find_spec("IPython").origin), "core", "inputtransformer2.py")
    return "from IPython" in open(path).read()


def test_migrate_imports_neither_ipython_nor_nbformat(tmp_path):
    """`colabkit migrate --check` stays fast: notebooks are read as JSON, without nbformat, and IPython's input
    transformer is loaded on its own where it allows (IPython 8, whose package import costs ~0.3 s)."""
    shutil.copy(GOLDEN / "colab_magics_gpu.ipynb", tmp_path / "nb.ipynb")
    heavy_roots = ("nbformat", "jsonschema") if _transformer_needs_ipython() else ("IPython", "nbformat", "jsonschema")
    code = ("import sys\nfrom colabkit.cli import main\n"
            f"rc = main(['migrate', '--check', '-q', {str(tmp_path / 'nb.ipynb')!r}])\n"
            f"heavy = sorted(m for m in sys.modules if m.split('.')[0] in {heavy_roots!r})\n"
            "print(rc, heavy)\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.stdout.strip().splitlines()[-1] == "1 []", done.stdout + done.stderr


# --- hostile input: what Python's own parsers give up on stays one notebook's (or one cell's) problem -------------

def _code_cells(*sources) -> str:
    cells = [{"cell_type": "code", "source": s, "metadata": {}, "outputs": [], "execution_count": None}
             for s in sources]
    return json.dumps({"nbformat": 4, "nbformat_minor": 0, "metadata": {}, "cells": cells})


MOUNT = "from google.colab import drive\ndrive.mount('/content/drive')"


@pytest.fixture
def hostile(nbs):
    """Notebooks that made `colabkit migrate` stop with a traceback, beside a good one."""
    (nbs / "deep_list.ipynb").write_text('{"nbformat": 4, "metadata": {"x": ' + "[" * 100_000 + "]" * 100_000
                                         + '}, "cells": []}')
    (nbs / "deep_dict.ipynb").write_text('{"nbformat": 4, "cells": [], "metadata": ' + '{"a": ' * 100_000 + "1"
                                         + "}" * 100_001)
    (nbs / "minus.ipynb").write_text(_code_cells(MOUNT, "-" * 100_000 + "1"))   # MemoryError from Python's parser
    (nbs / "parens.ipynb").write_text(_code_cells(MOUNT, "(" * 100_000))
    (nbs / "chain.ipynb").write_text(_code_cells(MOUNT + "\ntotal = a" + " + a" * 2500))  # parses; 2500 levels deep
    return nbs


def test_hostile_notebooks_are_one_line_each_and_the_others_are_migrated(hostile, capsys):
    nbs = hostile
    names = ["deep_list", "deep_dict", "minus", "parens", "chain", "colab_drive_training"]
    code, out, err = run_cli(*[nbs / f"{n}.ipynb" for n in names], capsys=capsys)
    assert code == 2   # some notebook failed
    assert "Traceback" not in out + err
    errors = [line for line in err.splitlines() if line.strip()]
    assert errors == [f"{nbs / 'deep_list.ipynb'}: error: not a notebook colabkit can read: its JSON is nested "
                      f"deeper than Python's json module reads (a notebook nests a few levels)",
                      f"{nbs / 'deep_dict.ipynb'}: error: not a notebook colabkit can read: its JSON is nested "
                      f"deeper than Python's json module reads (a notebook nests a few levels)"]
    assert (nbs / "colab_drive_training.local.ipynb").read_bytes() == expected("colab_drive_training")
    for name, left_alone in (("minus", "-" * 100_000 + "1"), ("parens", "(" * 100_000)):
        cells = json.loads((nbs / f"{name}.local.ipynb").read_text())["cells"][1:]  # after the install cell
        assert "".join(cells[0]["source"]) == "import colabkit\ncolabkit.mount_drive()"   # the rest is migrated
        assert "".join(cells[1]["source"]) == left_alone                                   # that cell, byte for byte
    assert ("cell 2 line 1  CK001 cell left unchanged: Python's parser gives up on it: nested too deeply "
            "(MemoryError)") in out
    assert "cell 2 line 1  CK001 cell left unchanged: SyntaxError: too many nested parentheses" in out
    assert "      | " + "(" * 200 + " ... (99800 more characters)\n" in out   # the report shows a line, not a page
    chain = json.loads((nbs / "chain.local.ipynb").read_text())["cells"][1:]
    assert "".join(chain[0]["source"]) == "import colabkit\ncolabkit.mount_drive()\ntotal = a" + " + a" * 2500
    assert "6 notebooks: 4 migrated, 0 already portable, 2 failed" in out


def test_cells_too_large_to_read_are_left_alone_and_the_rest_is_migrated(tmp_path, capsys):
    """IPython's input transformer holds every token of a cell (and reads the cell again per magic): a 50 MB cell
    took 19 GB and more than 10 minutes. A cell past 10,000 lines or 2,000,000 characters is left as it is."""
    long = "!pip install torch\n" + "x = '/content/a'\n" * 10_000
    wide = "!ls /content\nblob = '" + "A" * 2_000_000 + "'"
    path = tmp_path / "big.ipynb"
    path.write_text(_code_cells(MOUNT, long, wide))
    code, out, err = run_cli(path, capsys=capsys)
    assert code == 0, err
    cells = json.loads((tmp_path / "big.local.ipynb").read_text())["cells"][1:]  # after the install cell
    assert "".join(cells[0]["source"]) == "import colabkit\ncolabkit.mount_drive()"
    assert (cells[1]["source"], cells[2]["source"]) == (long, wide)
    assert ("cell 2 line 1  CK002 cell left unchanged: it has 10001 lines, more than colabkit migrate reads in one "
            "cell (10000)") in out
    assert (f"cell 3 line 1  CK002 cell left unchanged: it has {len(wide)} characters, more than colabkit migrate "
            f"reads in one cell (2000000)") in out
