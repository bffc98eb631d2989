"""Where output goes: a kernel that can show widgets, or plain text (decided once per call, as
tqdm.autonotebook does), and the one switch Colab needs before ipywidgets 8 render there."""
from __future__ import annotations

import logging
import sys

log = logging.getLogger("colabkit")


def in_kernel() -> bool:
    """True inside a Jupyter kernel (widgets can be shown), False in a terminal or a plain script."""
    if "IPython" not in sys.modules:
        return False
    from IPython import get_ipython
    shell = get_ipython()
    return shell is not None and getattr(shell, "kernel", None) is not None


def prepare_widgets() -> None:
    """On Colab, ipywidgets 8 needs the custom widget manager; harmless to call twice, a no-op elsewhere."""
    from .runtime import detect_kind
    if detect_kind() != "colab":
        return
    try:
        from google.colab import output
        output.enable_custom_widget_manager()
    except Exception as exc:  # noqa: BLE001 - an old Colab image: widgets may still render
        log.debug("colabkit: enable_custom_widget_manager failed: %s", exc)
