"""Where fit() is on the call stack: every stack-frame look-up of the Keras adapter, in one place.

Keras tells a callback neither which fit() runs it, nor which CallbackList calls its ``set_model``, nor what
fit()'s input iterator is. AutoResume reads them from the frames of the calling thread: the caller of a hook or
of a train function, Keras 3's ``fit()`` frame (a function named ``fit`` with an ``epoch_iterator`` local, in
every back end's trainer), and that frame's locals. Nothing else in the adapter touches a frame.
"""
from __future__ import annotations

import sys

UNKNOWN = object()   # recorded where no fit() was found above on_train_begin: its handlers assume it runs
_LOCALS_DEPTH = 12   # fit() -> CallbackList.on_train_begin -> AutoResume.on_train_begin -> ...: a few frames up


def caller(depth: int = 1):
    """The frame ``depth`` calls above the function that calls this: 1, its caller; 0, its own frame."""
    return sys._getframe(depth + 1)


def calling_object(frame):
    """The ``self`` of the method running in ``frame`` (a CallbackList calling set_model), or None."""
    return frame.f_locals.get("self")


def fit_frame_above(frame):
    """The innermost Keras ``fit()`` frame at or above ``frame``: a function named fit with an
    ``epoch_iterator`` local (Keras 3's trainers, all backends), or None."""
    while frame is not None:
        code = frame.f_code
        if code.co_name == "fit" and ("epoch_iterator" in code.co_varnames or "epoch_iterator" in code.co_cellvars):
            return frame
        frame = frame.f_back
    return None


def fit_locals_above(frame) -> dict:
    """The locals of the Keras fit() frame at or above ``frame`` (one with an epoch iterator over a data
    adapter), looking a few frames up, or {}."""
    for _ in range(_LOCALS_DEPTH):
        if frame is None:
            return {}
        found = frame.f_locals
        if hasattr(found.get("epoch_iterator"), "data_adapter"):
            return found
        frame = frame.f_back
    return {}


def epoch_iterator(fit_frame):
    """fit()'s epoch iterator, read from its frame (None: no frame, or none there yet)."""
    return fit_frame.f_locals.get("epoch_iterator") if fit_frame is not None else None


class FitFrame:
    """The frame of the fit() one callback runs in: recorded at its on_train_begin, forgotten when that fit()
    ends. When fit() is left by an exception Keras calls no callback, so the frame stays recorded; it is then
    found off the stack (``running`` is False) and the callback knows that fit() is gone."""

    def __init__(self):
        self.frame = None   # None: not in a fit(); UNKNOWN: in one whose frame was not found

    def record(self, frame) -> None:
        """Record the fit() at or above ``frame`` (on_train_begin's own frame)."""
        self.frame = fit_frame_above(frame) or UNKNOWN

    def forget(self) -> None:
        self.frame = None

    @property
    def known(self):
        """The recorded fit() frame, or None when there is none or it was not found."""
        return None if self.frame is UNKNOWN else self.frame

    def running(self, frame) -> bool:
        """Whether the recorded fit() is on the stack at ``frame`` (a frame of the calling thread)."""
        fit_frame = self.frame
        if fit_frame is None or fit_frame is UNKNOWN:
            return fit_frame is UNKNOWN   # not in a fit(), or its frame was not found: assume running
        while frame is not None:
            if frame is fit_frame:
                return True
            frame = frame.f_back
        return False
