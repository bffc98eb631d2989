"""Deadlines given to AutoResume: a time that has already passed is refused with the time it names."""
import datetime as dt
import time

import pytest

from colabkit.deadline import watch_for


@pytest.mark.parametrize("deadline", [
    dt.datetime.now() - dt.timedelta(hours=1),
    dt.datetime.now(dt.timezone.utc) - dt.timedelta(days=1),
    dt.datetime.now().astimezone() - dt.timedelta(seconds=5),
])
def test_a_deadline_in_the_past_is_refused_naming_it(deadline):
    with pytest.raises(ValueError) as info:
        watch_for(deadline, started_at=time.time())
    message = str(info.value)
    assert repr(deadline) in message and "passed" in message and deadline.strftime("%H:%M") in message, message


def test_a_deadline_ahead_is_kept():
    at = dt.datetime.now() + dt.timedelta(hours=2)
    deadline = watch_for(at, started_at=time.time()).due(0.0, now=at.timestamp())
    assert deadline is not None and deadline.at == at.timestamp()


def test_autoresume_refuses_a_deadline_in_the_past(tmp_path):
    pytest.importorskip("torch")
    import colabkit
    past = dt.datetime.now() - dt.timedelta(minutes=10)
    with pytest.raises(ValueError, match="passed"):
        colabkit.torch.AutoResume(str(tmp_path / "run"), deadline=past)
