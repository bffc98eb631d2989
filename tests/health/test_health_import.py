"""The monitor costs nothing until used: importing it (and a host-only monitor) loads no framework, NVML or
matplotlib; the public names resolve through colabkit's lazy facade."""
from __future__ import annotations

import time

import colabkit
from tests.test_lazy_import import probe


def test_importing_and_running_a_host_only_monitor_loads_nothing_heavy():
    result = probe("import colabkit, colabkit.health\nimport sys\n"
                   "m = colabkit.monitor(gpus=False, verbose=0)\n"
                   "for _ in m.wrap(range(30)):\n    m.step()\nm.stop()\nm.report()\n"
                   "assert 'matplotlib' not in sys.modules, 'matplotlib'")
    # a running monitor reads host CPU and RAM through psutil; nothing heavier
    assert [m for m in result["forbidden"] if m.split(".")[0] != "psutil"] == []
    assert "colabkit.health.keras_monitor" not in result["colabkit_modules"]


def test_importing_colabkit_health_loads_no_psutil_matplotlib_or_widgets():
    result = probe("import colabkit, colabkit.health, colabkit.health.health_monitor, colabkit.health.plots")
    assert result["forbidden"] == []


def test_public_names():
    import colabkit.health
    import colabkit.health.health_monitor
    assert callable(colabkit.monitor) and colabkit.monitor is colabkit.health.monitor
    # one class per name: the framework-free monitor, and the Keras callback that feeds one
    assert colabkit.health.HealthMonitor is colabkit.health.health_monitor.HealthMonitor


def test_the_keras_callback_feeds_the_framework_free_monitor():
    import pytest
    pytest.importorskip("keras")
    assert isinstance(colabkit.keras.Monitor(gpus=False, verbose=0).health, colabkit.health.HealthMonitor)
    assert colabkit.keras.Monitor.__module__ == "colabkit.health.keras_monitor"


def test_bad_options_name_the_value(tmp_path):
    import pytest
    with pytest.raises(ValueError, match=r"hang_timeout='soon': expected 'auto', 'off'"):
        colabkit.health.HealthMonitor(hang_timeout="soon")
    with pytest.raises(ValueError, match="hang_floor .* is above hang_ceiling"):
        colabkit.health.HealthMonitor(hang_floor="2h", hang_ceiling="1h")
    with pytest.raises(ValueError, match="phase 'eval'"):
        colabkit.health.HealthMonitor(gpus=False).enter_phase("eval")


def test_a_bad_monitor_option_of_autoresume_names_the_value(tmp_path):
    import pytest
    pytest.importorskip("keras")
    with pytest.raises(TypeError, match="AutoResume\\(monitor='yes'\\)"):
        colabkit.keras.AutoResume(tmp_path / "ck", monitor="yes")


def test_monitor_magic_and_status_row_in_a_terminal_shell(capsys):
    """`%monitor` outside a kernel prints the compact text; `%colabkit --text` gains a training-health row."""
    from IPython.core.interactiveshell import InteractiveShell
    shell = InteractiveShell.instance()
    try:
        assert shell.run_cell("%load_ext colabkit").success
        assert shell.run_cell("%monitor").success
        if colabkit.health.latest_monitor() is None:
            assert "no monitor has run in this process yet" in capsys.readouterr().out
        mon = colabkit.monitor(gpus=False, verbose=0)
        for _ in mon.wrap(range(25)):
            time.sleep(0.002)      # a step ~1000x the cost of next() on a range: compute-bound on any machine
            mon.step()
        capsys.readouterr()
        assert shell.run_cell("%monitor").success
        out = capsys.readouterr().out
        assert out.startswith("colabkit health · 25 steps") and "verdict: compute-bound" in out
        assert shell.run_cell("%colabkit --text").success
        assert "training health" in capsys.readouterr().out
        mon.stop()
    finally:
        shell.run_cell("%unload_ext colabkit")
        InteractiveShell.clear_instance()


def test_a_refused_monitor_option_leaves_no_store_open(tmp_path):
    """The status panel of the process still says no checkpoints are open after AutoResume refused its options."""
    import subprocess
    import sys

    import pytest
    pytest.importorskip("keras")
    code = ("import sys, colabkit, colabkit.widgets\n"
            "try:\n    colabkit.keras.AutoResume(sys.argv[1], monitor='yes')\n"
            "except TypeError:\n    pass\n"
            "print(colabkit.widgets.text())\n")
    done = subprocess.run([sys.executable, "-c", code, str(tmp_path / "ck")], capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "none (no AutoResume or Checkpoints in this process)" in done.stdout, done.stdout
