"""colabkit.resume.schedule: the one save decision every AutoResume takes at a step boundary."""
from colabkit.deadline import Deadline
from colabkit.resume.schedule import NO_SAVE, SaveContext, SavePolicy, final_wait_s, margin_floor

CAP = Deadline(at=100.0, reason="the 12h runtime cap", stop_training=True, key="cap")
IDLE = Deadline(at=100.0, reason="the 90min idle cutoff", stop_training=False, key="idle")


def test_a_signal_comes_first_then_a_deadline_then_save_freq_then_every():
    policy = SavePolicy(save_freq=10, every=60.0)
    everything = SaveContext(steps_since_save=10, every_due=True, signal="SIGTERM", deadline=IDLE)
    assert (policy.should_save(5, everything).reason, policy.should_save(5, everything).stop) == ("signal", True)
    no_signal = SaveContext(steps_since_save=10, every_due=True, deadline=CAP)
    decision = policy.should_save(5, no_signal)
    assert (decision.reason, decision.stop, decision.deadline) == ("deadline", True, CAP)
    decision = policy.should_save(5, SaveContext(steps_since_save=10, every_due=True, deadline=IDLE))
    assert (decision.reason, decision.stop) == ("deadline", False)   # save and upload, keep training
    assert policy.should_save(5, SaveContext(steps_since_save=10, every_due=True)).reason == "save_freq"
    assert policy.should_save(5, SaveContext(steps_since_save=9, every_due=True)).reason == "every"
    assert not policy.should_save(5, SaveContext(steps_since_save=9))
    assert policy.should_save(5, SaveContext(steps_since_save=9)) == NO_SAVE


def test_without_save_freq_or_every_only_signals_and_deadlines_save():
    policy = SavePolicy()
    assert not policy.every_due(10 ** 9)
    assert not policy.should_save(1, SaveContext(steps_since_save=10 ** 6))
    assert SavePolicy(every=60.0).every_due(60.0) and not SavePolicy(every=60.0).every_due(59.9)


def test_the_final_wait_and_the_deadline_margin_have_one_floor_each():
    assert final_wait_s(0.1) == 60.0 and final_wait_s(100.0) == 300.0
    assert margin_floor(None) == 60.0 and margin_floor("2min") == 120.0
