"""Where we run (colab / kaggle / jupyter / script) and the session clock."""
import dataclasses
import json
import subprocess
import sys
import time

import pytest

from colabkit import runtime
from colabkit.runtime import detect_kind, env, read_uptime

HOUR = 3600.0


def fake_uptime(tmp_path, seconds, idle=1234.5):
    path = tmp_path / "uptime"
    path.write_text(f"{seconds} {idle}\n")
    return path


# ---- kind detection ----

def test_plain_python_is_script():
    assert detect_kind() == "script"
    assert env().kind == "script"


def test_colab_when_google_colab_is_imported(colab_standin):
    assert detect_kind() == "script"  # importable is not enough: a Colab kernel has it imported
    import google.colab
    assert google.colab._STANDIN  # the stand-in, not something else named google.colab
    assert detect_kind() == "colab"


def test_colab_when_the_vm_marker_file_exists(tmp_path, monkeypatch):
    marker = tmp_path / "hostname"
    marker.write_text("colab-vm\n")
    monkeypatch.setattr(runtime, "COLAB_MARKER", marker)
    assert "google.colab" not in sys.modules
    assert detect_kind() == "colab"


def test_the_marker_is_the_colab_vm_hostname_file():
    # colab-facts.md: /var/colab/hostname marks a real Colab VM (a `!python script.py` child sees no
    # google.colab in sys.modules, only this file). The conftest points the constant elsewhere in-process.
    out = subprocess.run([sys.executable, "-c", "from colabkit import runtime; print(runtime.COLAB_MARKER)"],
                         capture_output=True, text=True, timeout=60, check=True)
    assert out.stdout.strip() == "/var/colab/hostname"


@pytest.mark.parametrize("kaggle_var", ["KAGGLE_KERNEL_RUN_TYPE", "KAGGLE_URL_BASE"])
def test_kaggle_wins_over_colab_release_tag(monkeypatch, kaggle_var):
    monkeypatch.setenv("COLAB_RELEASE_TAG", "release-colab_20240920-060127_RC00")  # Kaggle's image sets it
    monkeypatch.setenv(kaggle_var, "Interactive" if kaggle_var.endswith("TYPE") else "https://www.kaggle.com")
    assert detect_kind() == "kaggle"


def test_kaggle_wins_even_with_google_colab_imported(monkeypatch, colab_standin):
    import google.colab  # noqa: F401  (Kaggle's Colab-derived image can import it)
    monkeypatch.setenv("KAGGLE_KERNEL_RUN_TYPE", "Batch")
    monkeypatch.setenv("COLAB_RELEASE_TAG", "release-colab_20240920-060127_RC00")
    assert detect_kind() == "kaggle"


@pytest.mark.parametrize("var, value", [("COLAB_RELEASE_TAG", "release-colab_20240920-060127_RC00"),
                                        ("COLAB_GPU", "1")])
def test_colab_env_vars_alone_do_not_mean_colab(monkeypatch, var, value):
    monkeypatch.setenv(var, value)
    assert detect_kind() == "script"


def test_kind_in_a_fresh_interpreter_with_the_standin(colab_standin):
    code = ("import colabkit; a = colabkit.env().kind; import google.colab; b = colabkit.env().kind; "
            "print(a, b)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True)
    assert out.stdout.split() == ["script", "colab"]


def test_jupyter_and_colab_in_a_real_kernel(colab_standin, tmp_path):
    """A real ipykernel kernel (via nbclient) says "jupyter"; after google.colab is imported, "colab";
    the extension loads there and %colabkit reports the kind."""
    nbformat = pytest.importorskip("nbformat")
    nbclient = pytest.importorskip("nbclient")
    nb = nbformat.v4.new_notebook(metadata={"kernelspec": {"name": "python3", "display_name": "Python 3",
                                                           "language": "python"}})
    nb.cells = [
        nbformat.v4.new_code_cell("import colabkit\nprint(colabkit.env().kind)"),
        nbformat.v4.new_code_cell("%load_ext colabkit\n%colabkit"),
        nbformat.v4.new_code_cell("import sys\nprint(sorted(m for m in ('tensorflow', 'keras', 'pynvml', "
                                  "'google.colab') if m in sys.modules))"),
        nbformat.v4.new_code_cell("import google.colab\nprint(colabkit.env().kind)"),
    ]
    client = nbclient.NotebookClient(nb, kernel_name="python3", timeout=60, startup_timeout=60,
                                     resources={"metadata": {"path": str(tmp_path)}})
    client.execute()

    def stdout(cell):
        return "".join(o.get("text", "") for o in cell.outputs if o.get("name") == "stdout").strip()

    def shown_text(cell):  # printed text, or the text/plain of a display (the widget panel's fallback)
        return stdout(cell) + "".join(o.get("data", {}).get("text/plain", "") for o in cell.outputs
                                      if o.get("output_type") == "display_data")

    assert stdout(nb.cells[0]) == "jupyter"
    assert "colabkit: running on jupyter" in shown_text(nb.cells[1])
    assert not [o for o in nb.cells[1].outputs if o.get("output_type") == "error"]
    assert stdout(nb.cells[2]) == "[]"
    assert stdout(nb.cells[3]) == "colab"


# ---- the clock ----

def test_uptime_comes_from_proc_uptime(tmp_path):
    path = fake_uptime(tmp_path, 3600.5)
    assert read_uptime(path) == (3600.5, str(path))
    e = env(proc_uptime=path)
    assert (e.uptime, e.uptime_source) == (3600.5, str(path))


def test_real_proc_uptime_is_read_on_linux():
    if not runtime.PROC_UPTIME.exists():
        pytest.skip("no /proc/uptime on this system")
    seconds, source = read_uptime()
    assert source == "/proc/uptime"
    assert 0 < seconds < 10 * 365 * 86400


@pytest.mark.parametrize("content", [None, "", "garbage here", "nan 1", "inf 1", "-5 1"])
def test_missing_or_bad_proc_uptime_falls_back_and_says_so(tmp_path, content):
    path = tmp_path / "uptime"
    if content is not None:
        path.write_text(content)
    seconds, source = read_uptime(path)
    assert source != str(path)
    assert 0 <= seconds < float("inf")
    assert env(proc_uptime=path).uptime_source == source


def test_linux_fallback_is_boottime_and_close_to_proc_uptime(tmp_path):
    if not hasattr(time, "CLOCK_BOOTTIME") or not runtime.PROC_UPTIME.exists():
        pytest.skip("Linux only")
    seconds, source = read_uptime(tmp_path / "missing")
    assert source == "clock_gettime(CLOCK_BOOTTIME)"
    assert abs(seconds - read_uptime()[0]) < 5


def test_last_resort_is_process_age(tmp_path, monkeypatch):
    # A system with neither /proc/uptime nor CLOCK_BOOTTIME (and not macOS/Windows).
    monkeypatch.delattr(time, "CLOCK_BOOTTIME", raising=False)
    monkeypatch.setattr(runtime.sys, "platform", "sunos5")
    monkeypatch.setattr(runtime, "_PROCESS_START", time.time() - 42)
    seconds, source = read_uptime(tmp_path / "missing")
    assert source == "process age (no system uptime source found)"
    assert 42 <= seconds < 60


def test_colab_defaults_12h_cap_and_90min_idle(tmp_path, colab_standin):
    import google.colab  # noqa: F401
    e = env(proc_uptime=fake_uptime(tmp_path, 3 * HOUR + 30))
    assert e.kind == "colab"
    assert e.runtime_cap == 12 * HOUR
    assert e.idle_cutoff == 90 * 60
    assert e.time_left == 9 * HOUR - 30
    assert e.cap_at == pytest.approx(e.taken_at + 9 * HOUR - 30)
    assert e.is_hosted


def test_colab_pro_24h_cap_by_argument(tmp_path, colab_standin):
    import google.colab  # noqa: F401
    e = env(runtime_cap="24h", proc_uptime=fake_uptime(tmp_path, 13 * HOUR))
    assert e.runtime_cap == 24 * HOUR
    assert e.time_left == 11 * HOUR


def test_colab_pro_24h_cap_by_config_file_and_env(tmp_path, colab_standin, monkeypatch):
    import google.colab  # noqa: F401
    from colabkit import config
    path = config.default_config_file()
    path.parent.mkdir(parents=True)
    path.write_text('runtime_cap = "24h"\nidle_cutoff = "2h"\n')
    uptime = fake_uptime(tmp_path, HOUR)
    assert (env(proc_uptime=uptime).runtime_cap, env(proc_uptime=uptime).idle_cutoff) == (24 * HOUR, 2 * HOUR)
    monkeypatch.setenv("COLABKIT_RUNTIME_CAP", "18h")
    assert env(proc_uptime=uptime).time_left == 17 * HOUR
    assert env(runtime_cap="auto", proc_uptime=uptime).runtime_cap == 12 * HOUR  # argument wins


def test_past_the_cap_time_left_is_negative(tmp_path, colab_standin):
    import google.colab  # noqa: F401
    assert env(proc_uptime=fake_uptime(tmp_path, 12 * HOUR + 60)).time_left == -60


def test_kaggle_has_a_12h_cap_and_no_idle_cutoff(tmp_path, monkeypatch):
    monkeypatch.setenv("KAGGLE_KERNEL_RUN_TYPE", "Interactive")
    e = env(proc_uptime=fake_uptime(tmp_path, 2 * HOUR))
    assert (e.kind, e.runtime_cap, e.idle_cutoff, e.time_left) == ("kaggle", 12 * HOUR, None, 10 * HOUR)
    assert e.is_hosted


def test_no_cap_locally_unless_configured(tmp_path, monkeypatch):
    uptime = fake_uptime(tmp_path, 100 * HOUR)
    e = env(proc_uptime=uptime)
    assert (e.kind, e.runtime_cap, e.idle_cutoff, e.time_left, e.cap_at) == ("script", None, None, None, None)
    assert not e.is_hosted
    monkeypatch.setenv("COLABKIT_RUNTIME_CAP", "120h")
    e = env(proc_uptime=uptime)
    assert (e.runtime_cap, e.time_left) == (120 * HOUR, 20 * HOUR)


def test_none_switches_the_colab_cap_off(tmp_path, colab_standin):
    import google.colab  # noqa: F401
    e = env(runtime_cap="none", idle_cutoff="off", proc_uptime=fake_uptime(tmp_path, HOUR))
    assert (e.runtime_cap, e.idle_cutoff, e.time_left) == (None, None, None)


def test_bad_override_raises_config_error(tmp_path):
    from colabkit.config import ConfigError
    with pytest.raises(ConfigError, match="runtime_cap argument"):
        env(runtime_cap="a fortnight", proc_uptime=fake_uptime(tmp_path, 1))


def test_environment_is_an_immutable_value(tmp_path):
    e = env(proc_uptime=fake_uptime(tmp_path, 10))
    with pytest.raises(dataclasses.FrozenInstanceError):
        e.kind = "colab"
    assert e == dataclasses.replace(e)
    assert abs(e.taken_at - time.time()) < 5


def test_status_json_from_the_cli_carries_the_clock(tmp_path, monkeypatch):
    monkeypatch.setenv("KAGGLE_KERNEL_RUN_TYPE", "Batch")
    out = subprocess.run([sys.executable, "-m", "colabkit", "status", "--json"], capture_output=True, text=True,
                         timeout=60, check=True)
    data = json.loads(out.stdout)
    assert data["kind"] == "kaggle"
    assert data["runtime_cap_s"] == 12 * HOUR
    assert data["time_left_s"] == pytest.approx(12 * HOUR - data["vm_age_s"], abs=1)
