"""The skins of colabkit.guard.run: `colabkit guard` (help with examples, errors that name the bad value and the
fix, the command after --) and the %%guard cell magic (documented by its magic_arguments)."""
import subprocess
import sys

from tests.guard.helpers import REPO, SCRIPTS


def cli(*args, cwd=None):
    return subprocess.run([sys.executable, "-m", "colabkit", "guard", *args], capture_output=True, text=True,
                          cwd=cwd, env={**__import__("os").environ, "PYTHONPATH": str(REPO)})


def test_help_shows_the_form_and_examples():
    done = cli("--help")
    assert done.returncode == 0
    for text in ("--watch", "--resume-arg", "{latest}", "--stop-signal", "--retries", "examples:",
                 "accelerate launch train.py", "checkpoint-*", "last.pt"):
        assert text in done.stdout, text


def test_errors_name_the_bad_value_and_the_fix(tmp_path):
    done = cli("--watch", "out", "--to", str(tmp_path / "d"), "--stop-signal", "SIGNOPE", "--", "true")
    assert done.returncode == 1 and "'SIGNOPE' is not a signal" in done.stderr and "SIGTERM" in done.stderr
    done = cli("--watch", "out", "--to", str(tmp_path / "d"), "--resume-arg", "--resume", "--", "true")
    assert done.returncode == 1 and "does not hold {latest}" in done.stderr
    done = cli("--watch", "out", "--to", str(tmp_path / "d"))
    assert done.returncode == 1 and "put it after --" in done.stderr
    (tmp_path / "file").write_text("x")
    done = cli("--watch", str(tmp_path / "file"), "--to", str(tmp_path / "d"), "--", "true")
    assert done.returncode == 1 and "is a file" in done.stderr


def test_a_resume_arg_beginning_with_dashes_reaches_the_script(tmp_path):
    dest = tmp_path / "dest"
    script = [sys.executable, str(SCRIPTS / "folders.py"), "--out", str(tmp_path / "a"), "--steps", "2", "--sleep",
              "0", "--save-every", "2"]
    assert cli("--watch", str(tmp_path / "a"), "--to", str(dest), "--settle", "0.1", "--deadline", "off",
               "--", *script).returncode == 0
    script[3] = str(tmp_path / "b")
    done = cli("--watch", str(tmp_path / "b"), "--to", str(dest), "--settle", "0.1", "--deadline", "off",
               "--resume-arg", "--resume_from_checkpoint={latest}", "--", *script[:-4], "--steps", "3",
               "--sleep", "0")
    assert done.returncode == 0, done.stderr
    assert "resumed from step 2" in done.stdout


def test_the_cell_magic_is_registered_and_documents_its_options():
    from colabkit.magics import ColabkitMagics
    assert "guard" in ColabkitMagics.magics["cell"]
    doc = ColabkitMagics.guard.__doc__
    for text in ("--watch", "--to", "--resume-arg", "--stop-signal", "--grace", "--retries", "{latest}"):
        assert text in doc, text
