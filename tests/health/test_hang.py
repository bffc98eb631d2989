"""The hang watchdog with real Keras: a train step that blocks (a py_function sleeping far past the learned
budget) gets a stack dump and a hang report that says the GPU was idle; a run with validation and checkpoint
saves (longer than a step, with budgets of their own) gets no false hang.

Margins: steps of these models take milliseconds and the budget floor is 5 s (a loaded machine does not
stall a step that long); a blocked step stays blocked until the hang has been reported (event-driven, at most
BLOCK_S), so neither outcome depends on this machine's speed."""
from __future__ import annotations

import json
import threading
import time

import numpy as np

from tests.health.conftest import tiny_model
from tests.waiting import wait_for

BLOCK_S = 120.0      # the longest a blocked step waits for its hang report
FLOOR = "5s"


def _release_when_reported(monitor, released):
    """Release the blocked step once the watchdog has reported the hang."""
    def watch():
        wait_for(lambda: monitor.hangs, BLOCK_S)
        time.sleep(0.5)      # the stall goes on a little past the report
        released.set()
    threading.Thread(target=watch, daemon=True).start()


def _data(n=640):
    rng = np.random.default_rng(1)
    return rng.random((n, 32), dtype="float32"), rng.random((n, 1), dtype="float32")


def test_a_blocking_step_gets_a_stack_dump_and_a_hang_report(tf_keras, fake_gpus, tmp_path, capsys):
    tf, keras = tf_keras
    fake_gpus("idle_gpu")     # the GPU reports 0% busy: a host-side hang
    import colabkit
    calls = {"n": 0}
    released = threading.Event()

    def block_once_in_a_while(x):
        calls["n"] += 1
        if calls["n"] == 30:
            released.wait(BLOCK_S)    # stuck, as on a lock nobody releases
        return x

    class Blocking(keras.layers.Layer):
        def call(self, x):
            y = tf.py_function(block_once_in_a_while, [x], tf.float32)
            y.set_shape(x.shape)
            return y

    x, y = _data()
    model = tiny_model(keras, extra=[Blocking()])
    monitor = colabkit.keras.Monitor(tmp_path / "run", hang_floor=FLOOR, first_step_timeout="60s",
                                     sample_every="0.2s")
    _release_when_reported(monitor.health, released)
    model.fit(x, y, batch_size=32, epochs=3, verbose=0, callbacks=[monitor])
    report = monitor.report()
    assert report["steps"] == 60
    assert len(report["hangs"]) == 1, report["hangs"]
    hang = report["hangs"][0]
    assert hang["phase"] == "step" and hang["step"] == 29
    assert hang["budget_s"] == 5.0 and "floor" in hang["budget_how"]
    assert hang["gpu"] == "gpu_idle" and "host side is stuck" in hang["text"]
    assert hang["resumed_after_s"] >= 5.0                # the step came back: reported as it ended
    dump = tmp_path / "run" / hang["dump"].rsplit("/", 1)[-1]
    assert dump.exists() and str(dump) == hang["dump"]
    stacks = dump.read_text()
    assert "no progress for" in stacks and "a training step" in stacks
    assert "block_once_in_a_while" in stacks and "Thread 0x" in stacks   # faulthandler's dump of every thread
    out = capsys.readouterr().out
    assert out.count("colabkit: HANG?") == 1 and "training moved again after" in out
    assert any(kind == "hang" for _, kind, _ in monitor.health.events)


def test_no_false_hang_with_validation_and_checkpoint_saves(tf_keras, tmp_path):
    """Validation (its own compile first), epoch-end and every-10-batches checkpoint saves through
    AutoResume(monitor=...) take longer than a step; each has a budget of its own. A slow saver callback
    makes every epoch end take ~30x a step."""
    keras = tf_keras[1]
    import colabkit
    x, y = _data()

    class SlowSaver(keras.callbacks.Callback):
        def on_epoch_end(self, epoch, logs=None):
            time.sleep(0.3)       # a ModelCheckpoint writing a big file

    resume = colabkit.keras.AutoResume(tmp_path / "ckpt", save_freq=10, verbose=0,
                                       monitor={"hang_floor": FLOOR, "first_step_timeout": "60s",
                                                "sample_every": "0.2s", "directory": tmp_path / "run"})
    model = tiny_model(keras)
    model.fit(x, y, batch_size=32, epochs=4, validation_data=(x[:320], y[:320]), verbose=0,
              callbacks=[SlowSaver(), resume])
    report = resume.monitor.report()
    assert report["steps"] == 80
    assert report["hangs"] == [] and not (tmp_path / "run").exists()
    durations = resume.monitor.health._durations
    assert len(durations["validation"]) == 4 and len(durations["checkpoint"]) >= 8
    # the saves and validation are not in the step times
    assert max(durations["step"]) < min(durations["validation"]) or max(durations["step"]) < 0.3
    assert report["epochs"][-1]["val_loss"] > 0
    assert resume.checkpoints.list()[-1].step == 80


def test_learned_budgets_per_phase():
    from colabkit.health.watchdog import Budgets
    b = Budgets("auto", floor=1, ceiling=100, first=50)
    assert b.budget("first", {}) == (50, "first step: first_step_timeout")
    seen = {"step": [0.01] * 20 + [0.05], "validation": [2.0, 4.0], "checkpoint": []}
    assert b.budget("step", seen)[0] == 1             # 10x median = 0.1 s, 3x max = 0.15 s: the floor
    seen["step"] = [1.0] * 20 + [5.0]
    assert b.budget("step", seen)[0] == 15.0          # 3x the longest step
    assert b.budget("validation", seen)[0] == 12.0    # 3x the longest validation
    assert b.budget("checkpoint", seen)[0] == 50      # none seen yet: the first-step budget
    seen["step"] = [60.0]
    assert b.budget("step", seen) == (100, "10x the median step (1m 00s), ceiling 1m 40s")
    assert Budgets("off").budget("step", seen) == (None, "off")
    assert Budgets("30s").budget("step", seen)[0] == 30.0


def test_a_fit_left_by_an_exception_is_not_a_hang(tf_keras, tmp_path, capsys, monkeypatch):
    """Keras calls no callback when fit() raises: the watchdog sees fit() is gone and stands down at once,
    and its last heartbeat says done (or `colabkit run` would take the stale heartbeat for a frozen job)."""
    keras = tf_keras[1]
    import colabkit
    x, y = _data()
    queue_dir = tmp_path / "queue"
    queue_dir.mkdir()
    monkeypatch.setenv("COLABKIT_RUN_DIR", str(queue_dir))
    monkeypatch.setenv("COLABKIT_JOB", "job")
    monkeypatch.setenv("COLABKIT_JOB_ATTEMPT", "1")

    class Boom(keras.callbacks.Callback):
        def on_train_batch_end(self, batch, logs=None):
            if batch == 25:
                raise RuntimeError("boom")
    monitor = colabkit.keras.Monitor(tmp_path / "run", hang_floor=FLOOR, sample_every="0.2s")
    try:
        tiny_model(keras).fit(x, y, batch_size=32, epochs=1, verbose=0, callbacks=[monitor, Boom()])
    except RuntimeError:
        pass
    assert wait_for(lambda: not monitor.health.running, 60), "the watchdog did not stand down"
    assert monitor.report()["hangs"] == [] and "HANG?" not in capsys.readouterr().out
    assert monitor.health.current_phase == "done"
    beat = json.loads((queue_dir / "job.health.json").read_text())
    assert beat["phase"] == "done" and not beat["hung"]
    assert not (tmp_path / "run").exists()


def test_a_stall_while_the_gpu_is_busy_is_called_a_slow_step(fake_gpus, tmp_path, capsys):
    """Custom loop, NVML stand-in at 99% busy: the stall is reported as a slow step, not a host-side hang,
    and a checkpoint save (a phase with a budget of its own) is not part of a step."""
    fake_gpus("throttling")
    import colabkit
    with colabkit.monitor(tmp_path / "run", hang_floor=FLOOR, sample_every="0.1s") as mon:
        for i in mon.wrap(range(40)):
            time.sleep(0.003)
            if i == 10:
                with mon.phase("checkpoint"):     # first save: the generous first-of-a-phase budget, not the floor
                    time.sleep(0.5)
            if i == 30:                           # a step far past the budget, with the GPU busy all along
                assert wait_for(lambda: mon.hangs, BLOCK_S), "no hang reported"
                time.sleep(0.5)
            mon.step()
    hangs = mon.report()["hangs"]
    assert len(hangs) == 1 and hangs[0]["step"] == 30 and hangs[0]["phase"] == "step", hangs
    assert hangs[0]["gpu"] == "gpu_busy" and "a very slow step" in hangs[0]["text"]
    assert "it was a slow step, not a hang" in capsys.readouterr().out
    assert len(list((tmp_path / "run").glob("hang-*.txt"))) == 1
