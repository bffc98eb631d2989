"""One signal latch for every AutoResume: SIGINT/SIGTERM are caught, latched for the loop, then handed on."""
from __future__ import annotations

import signal
import sys
import threading

__all__ = ["SignalLatch", "pass_signal_on"]

SIGNALS = (signal.SIGINT, signal.SIGTERM)


def pass_signal_on(previous, signum, frame) -> None:
    """Let ``previous`` (a handler signal.signal returned, already reinstalled) handle the signal: call it, or for
    SIG_DFL raise the signal again so that its default action (ending the process) happens; SIG_IGN does nothing."""
    if callable(previous):
        previous(signum, frame)
    elif previous == signal.SIG_DFL:
        signal.raise_signal(signum)


class SignalLatch:
    """The SIGINT/SIGTERM handlers of one training loop.

    ``install()`` puts ``handle`` in place (main thread only) and keeps the handlers it displaced; a handler of
    another latch left installed (a loop that ended without restoring) is chained past, to the handler that was
    there before it. The first signal is latched in ``received`` ("SIGINT" / "SIGTERM"): the loop saves at its
    next step boundary and acts on it. The same signal twice stops waiting: the displaced handler acts at once
    (a second SIGINT also raises KeyboardInterrupt). ``is_running(frame)``, when given, says whether the loop is
    still on the stack; when it is not (left by an exception, nothing restored), the latch puts the displaced
    handlers back, calls ``on_step_aside`` and hands the signal on as if it had never been installed.
    ``restore()`` puts the displaced handlers back.
    """

    def __init__(self, is_running=None, on_step_aside=None):
        self.is_running = is_running
        self.on_step_aside = on_step_aside
        self.received = None     # "SIGINT" / "SIGTERM" once received
        self.displaced = {}      # signum -> the handler install() displaced

    def install(self) -> None:
        stale, self.displaced = self.displaced, {}   # non-empty: installed before and never restored
        if threading.current_thread() is not threading.main_thread():
            return
        for sig in SIGNALS:
            try:
                previous = signal.signal(sig, self.handle)
            except (ValueError, OSError):
                continue
            owner = getattr(previous, "__self__", None)
            if isinstance(owner, SignalLatch):
                default = signal.default_int_handler if sig == signal.SIGINT else signal.SIG_DFL
                previous = (stale if owner is self else owner.displaced).get(sig, default)
            self.displaced[sig] = previous

    def restore(self) -> None:
        for sig, handler in self.displaced.items():
            signal.signal(sig, handler)
        self.displaced = {}

    def handle(self, signum, frame) -> None:
        previous = self.displaced.get(signum, signal.SIG_DFL)
        if self.is_running is not None and not self.is_running(frame if frame is not None else sys._getframe(1)):
            # the loop is gone (left by an exception): act as if the latch had never been installed
            if self.on_step_aside is not None:
                self.on_step_aside()
            self.restore()
            pass_signal_on(previous, signum, frame)
            return
        name = signal.Signals(signum).name
        if self.received != name:
            self.received = name   # acted on at the loop's next step boundary: save, commit, then pass it on
            return
        # the same signal twice: stop waiting for the save and let the previous handler act now
        self.restore()
        pass_signal_on(previous, signum, frame)
        if signum == signal.SIGINT:
            raise KeyboardInterrupt
