"""The `colabkit` command: output and exit codes (run as `python -m colabkit` in a subprocess)."""
import configparser
import json
import subprocess
import sys
from pathlib import Path

import pytest

import colabkit
from colabkit import cli, config

REPO = Path(__file__).resolve().parent.parent


def colabkit_cmd(*args, cwd=None):
    return subprocess.run([sys.executable, "-m", "colabkit", *args], capture_output=True, text=True,
                          timeout=60, cwd=cwd)


def write_config(text):
    path = config.default_config_file()
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")
    return path


def assert_one_paragraph_error(result, *fragments):
    assert result.returncode == 1, (result.stdout, result.stderr)
    assert result.stdout == ""
    err = result.stderr.strip()
    assert "Traceback" not in err
    assert "\n\n" not in err and len(err.splitlines()) == 1
    for fragment in fragments:
        assert fragment in err


def test_version(tmp_path):
    result = colabkit_cmd("--version", cwd=tmp_path)
    assert result.returncode == 0
    assert result.stdout.strip() == f"colabkit {colabkit.__version__}"


def test_help_lists_the_subcommands():
    result = colabkit_cmd("--help")
    assert result.returncode == 0
    assert "status" in result.stdout and "config" in result.stdout and "--version" in result.stdout


def test_no_subcommand_prints_help_and_succeeds():
    result = colabkit_cmd()
    assert result.returncode == 0
    assert result.stdout.startswith("usage: colabkit")


def test_status_text():
    result = colabkit_cmd("status")
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[0] == "colabkit: running on script"
    assert lines[1].startswith("  VM age") and "(from " in lines[1]
    assert "  runtime     no runtime cap" in lines
    assert any(line.startswith("  drive root  ") and line.endswith("colabkit-drive") for line in lines)


def test_status_json_is_valid_and_reflects_the_settings(monkeypatch, tmp_path):
    monkeypatch.setenv("COLABKIT_RUNTIME_CAP", "1000h")
    monkeypatch.setenv("COLABKIT_DRIVE_ROOT", str(tmp_path / "gdrive"))
    result = colabkit_cmd("status", "--json")
    assert result.returncode == 0, result.stderr
    data = json.loads(result.stdout)
    assert data["kind"] == "script"
    assert data["runtime_cap_s"] == 1000 * 3600
    assert data["time_left_s"] == pytest.approx(1000 * 3600 - data["vm_age_s"], abs=1)
    assert data["idle_cutoff_s"] is None
    assert data["drive_root"] == str(tmp_path / "gdrive")
    assert data["gpus"] is None or isinstance(data["gpus"], int)


def test_status_past_the_cap_says_so(monkeypatch):
    monkeypatch.setenv("COLABKIT_RUNTIME_CAP", "1s")   # every VM here is older than that
    result = colabkit_cmd("status")
    assert result.returncode == 0, result.stderr
    runtime = next(line for line in result.stdout.splitlines() if line.startswith("  runtime"))
    assert "past the 1s cap by " in runtime and "-" not in runtime, runtime


def test_status_on_colab_does_not_mount_drive(tmp_path, monkeypatch, capsys, colab_standin):
    marker = tmp_path / "hostname"
    marker.write_text("vm\n")
    monkeypatch.setattr("colabkit.runtime.COLAB_MARKER", marker)  # a `!colabkit status` child on a Colab VM
    assert cli.main(["status", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["kind"] == "colab"
    assert data["runtime_cap_s"] == 12 * 3600 and data["idle_cutoff_s"] == 90 * 60
    assert data["drive_root"] == f"{colab_standin.my_drive} (not mounted yet; mounted on first use)"
    assert not colab_standin.my_drive.exists()
    assert "google.colab" not in sys.modules


def test_config_shows_values_and_their_sources(monkeypatch):
    path = write_config('runtime_cap = "24h"\n')
    monkeypatch.setenv("COLABKIT_KEEP", "7")
    result = colabkit_cmd("config")
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[0] == f"config file: {path}"
    rows = {line.split()[0]: line for line in lines[1:]}
    assert set(rows) == {f.name for f in config.FIELDS}
    assert rows["keep"].split()[1] == "7" and rows["keep"].endswith("(env COLABKIT_KEEP)")
    assert rows["runtime_cap"].split()[1:3] == ["1d", "00h"] and rows["runtime_cap"].endswith(f"(file {path})")
    assert rows["idle_cutoff"].split()[1] == "auto" and rows["idle_cutoff"].endswith("(default)")


def test_config_says_when_there_is_no_file():
    result = colabkit_cmd("config")
    assert result.returncode == 0
    assert result.stdout.splitlines()[0] == f"config file: {config.default_config_file()} (not present)"


@pytest.mark.parametrize("command", ["status", "config"])
def test_bad_env_value_exits_1_with_one_paragraph(monkeypatch, command):
    monkeypatch.setenv("COLABKIT_KEEP", "-2")
    result = colabkit_cmd(command)
    assert_one_paragraph_error(result, f"colabkit {command}: error:", "COLABKIT_KEEP", "'-2'",
                               "a whole number of at least 1")


@pytest.mark.parametrize("command", ["status", "config"])
def test_malformed_config_file_exits_1_naming_the_file(command):
    path = write_config("keep = [unclosed\n")
    result = colabkit_cmd(command)
    assert_one_paragraph_error(result, str(path), "not valid TOML")


def test_unknown_key_in_config_file_exits_1():
    path = write_config("kep = 3\n")
    assert_one_paragraph_error(colabkit_cmd("status"), str(path), "kep")


def test_errors_write_nothing(tmp_path, monkeypatch):
    monkeypatch.setenv("COLABKIT_KEEP", "x")
    home = Path.home()
    before = sorted(p for p in home.rglob("*"))
    colabkit_cmd("status", cwd=tmp_path)
    assert sorted(p for p in home.rglob("*")) == before
    assert list(tmp_path.iterdir()) == []


def test_unknown_subcommand_exits_2():
    result = colabkit_cmd("bogus")
    assert result.returncode == 2
    assert "invalid choice: 'bogus'" in result.stderr
    assert "Traceback" not in result.stderr


def test_unknown_option_exits_2():
    result = colabkit_cmd("status", "--frobnicate")
    assert result.returncode == 2
    assert "unrecognized arguments: --frobnicate" in result.stderr


def test_console_script_points_at_main():
    parser = configparser.ConfigParser()
    parser.read(REPO / "setup.cfg")
    scripts = parser["options.entry_points"]["console_scripts"]
    assert "colabkit = colabkit.cli:main" in scripts
    assert callable(cli.main)
