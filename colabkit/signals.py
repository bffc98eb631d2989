"""Handing a signal on to the handler an AutoResume displaced (shared by the Keras, PyTorch and Lightning ones)."""
from __future__ import annotations

import signal


def pass_signal_on(previous, signum, frame) -> None:
    """Let ``previous`` (a handler signal.signal returned, already reinstalled) handle the signal: call it, or for
    SIG_DFL raise the signal again so that its default action (ending the process) happens; SIG_IGN does nothing."""
    if callable(previous):
        previous(signum, frame)
    elif previous == signal.SIG_DFL:
        signal.raise_signal(signum)
