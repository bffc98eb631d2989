"""The custom-loop monitor's bookkeeping: calls of many batches, phases inside a step, abandoned loops.

No assertion here depends on this machine's speed: sleeps only ever last longer than asked, so the bounds
below are lower bounds on blocking sleeps or budgets many times what a loaded machine adds."""
from __future__ import annotations

import time


def test_a_call_of_many_batches_is_not_a_hang(tmp_path):
    """step(n=60) after 0.6 s: the watchdog compares a stall with whole calls (budget 10x 0.6 s), not with
    the 10 ms per batch that step_time_s reports (which would make every call a hang)."""
    import colabkit
    with colabkit.monitor(tmp_path / "run", hang_floor="0.3s", sample_every="0.1s", gpus=False,
                          verbose=0) as mon:
        for _ in range(5):
            time.sleep(0.6)
            mon.step(n=60)
        budget = mon.budget()[0]
    report = mon.report()
    assert report["hangs"] == [] and not (tmp_path / "run").exists()
    assert budget >= 6.0, budget
    assert 0.6 / 60 <= report["step_time_s"] < 0.6, report["step_time_s"]


def test_a_phase_inside_a_step_leaves_the_step_time_and_input_share(tmp_path):
    """A checkpoint save between a step's compute and its step() (as AutoResume's saves and the README's
    loop do): 40 ms input + 40 ms compute per step, with a 40 ms save after every step or every third."""
    import colabkit

    def slow_input():
        while True:
            time.sleep(0.04)
            yield 1

    for save_every in (1, 3):
        with colabkit.monitor(tmp_path / "run", gpus=False, verbose=0) as mon:
            for i, _ in zip(range(25), mon.wrap(slow_input())):
                time.sleep(0.04)                       # compute
                if i % save_every == 0:
                    with mon.phase("checkpoint"):
                        time.sleep(0.04)
                mon.step()
        report = mon.report()
        assert report["step_time_s"] >= 0.08, (save_every, report["step_time_s"])
        assert 0.25 <= report["input_fraction"] <= 0.75, (save_every, report["input_fraction"])


def test_a_loop_left_by_an_exception_stands_the_watchdog_down(tmp_path):
    """No ``with``: the loop raises; the wrapped iterator is closed and the monitor stops (no later hang
    report, no thread left sampling). A later step() starts watching again."""
    import colabkit
    mon = colabkit.monitor(tmp_path / "run", hang_floor="5s", sample_every="0.1s", gpus=False, verbose=0)

    def batches():
        while True:
            yield 1

    def train():
        for i, _ in enumerate(mon.wrap(batches())):
            mon.step()
            if i == 10:
                raise RuntimeError("boom")

    try:
        train()
    except RuntimeError:
        pass
    assert not mon.running and mon.current_phase == "done"
    assert mon.report()["hangs"] == [] and not (tmp_path / "run").exists()
    mon.step()
    assert mon.running and mon.current_phase == "step"
    mon.stop()


def test_standing_down_writes_a_final_heartbeat(tmp_path, monkeypatch):
    """Under `colabkit run`: when the watched loop is gone (left by an exception), the monitor's last heartbeat
    says done, so the queue does not later take the stale file for a frozen process. (A Keras fit() left by an
    exception: tests/health/test_hang.py.)"""
    import json

    import colabkit
    monkeypatch.setenv("COLABKIT_RUN_DIR", str(tmp_path))
    monkeypatch.setenv("COLABKIT_JOB", "job")
    monkeypatch.setenv("COLABKIT_JOB_ATTEMPT", "1")
    mon = colabkit.monitor(gpus=False, verbose=0)

    def train():
        for i, _ in enumerate(mon.wrap(iter(int, 1))):     # endless input
            mon.step()
            if i == 5:
                raise RuntimeError("boom")

    try:
        train()
    except RuntimeError:
        pass
    beat = json.loads((tmp_path / "job.health.json").read_text())
    assert beat["phase"] == "done" and not beat["hung"] and beat["steps"] == 6 and beat["attempt"] == "1"
    assert mon.report()["hangs"] == []


def test_an_input_verdict_is_said_again_when_it_gets_worse(capsys):
    """Moderately input-bound is printed once; when the share grows past 20% the highly input-bound verdict
    is printed too (once), and easing back says nothing more. Each step's input share is given through
    record_input() (as the Keras callback reports its sampled steps), so no clock decides it."""
    from colabkit.health import HealthMonitor
    mon = HealthMonitor(gpus=False, verbose=1, input_kind="generator")

    def measured(share):
        for _ in range(30):
            mon.record_input(0.01 * share, 0.01)
            mon.step()
        mon.stop()    # says what the evidence shows by now (its thread may have said it already)
        return [line for line in capsys.readouterr().out.splitlines() if "input-bound" in line]

    assert [line[:30] for line in measured(0.1)] == ["colabkit: moderately input-bou"]
    assert measured(0.1) == []
    assert [line[:30] for line in measured(0.5)] == ["colabkit: highly input-bound: w"[:30]]
    assert measured(0.1) == [] and measured(0.5) == []
