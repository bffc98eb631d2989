"""Stand-in for google.colab.runtime: ``unassign()`` releases the VM (here: records it, and sets a flag)."""
from google.colab._standin import record

__all__ = ["unassign"]

unassigned = False  # stand-in only: True once unassign() was called


def unassign():
    """Instruct Colab to unassign the currently assigned runtime.

    On Colab the VM goes away and the page disconnects; the stand-in only records the call, so code that
    calls it must be tested for what it does *before* the call (e.g. a final checkpoint flushed to Drive).
    """
    global unassigned
    record("runtime.unassign")
    unassigned = True
