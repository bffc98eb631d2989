"""Stand-in for google.colab.output: ``eval_js``, ``register_callback``, ``enable_custom_widget_manager``.

There is no browser. What the "output iframe" answers to ``eval_js`` is decided by a frontend function a
test installs with ``set_frontend(fn)`` (stand-in only; ``fn(script)`` returns the JavaScript result or
raises). Without one, ``eval_js`` behaves like Colab with no page attached: with ``timeout_sec`` it waits
that long and raises ``google.colab._message.TimeoutException``; without a timeout the real call would block
forever, so the stand-in raises ``StandinWouldBlockForever`` instead of hanging the test.

``_invoke_function(name, json_args, json_kwargs)`` is the real entry point the frontend uses for
``google.colab.kernel.invokeFunction(name, args, kwargs)``; tests call it to play the browser's part.
"""
import json
import time

from google.colab import _message
from google.colab._standin import record

__all__ = ["eval_js", "register_callback", "enable_custom_widget_manager", "disable_custom_widget_manager"]

_functions = {}
_frontend = None
_custom_widget_manager = False


class StandinWouldBlockForever(RuntimeError):
    """eval_js without timeout_sec and without a frontend: the real call would never return."""


def set_frontend(fn):
    """Stand-in only: install ``fn(script) -> result`` as the browser side of eval_js (None removes it)."""
    global _frontend
    _frontend = fn


def eval_js(script, ignore_result=False, timeout_sec=None):
    """Evaluates the Javascript within the context of the current cell."""
    record("output.eval_js", script=script, ignore_result=ignore_result, timeout_sec=timeout_sec)
    if ignore_result:
        if _frontend is not None:
            _frontend(script)
        return None
    if _frontend is not None:
        return _frontend(script)
    if timeout_sec is None:
        raise StandinWouldBlockForever(
            "google.colab.output.eval_js was called without timeout_sec and no frontend is attached: on Colab "
            "this call would block forever. Pass timeout_sec, or install a frontend with output.set_frontend().")
    time.sleep(timeout_sec)
    raise _message.TimeoutException(f"Timed out waiting for a reply after {timeout_sec} s.")


def register_callback(function_name, callback):
    """Registers a function as a target invokable by Javascript in outputs."""
    record("output.register_callback", function_name=function_name)
    _functions[function_name] = callback


def _invoke_function(function_name, json_args, json_kwargs):
    """What the frontend runs for ``google.colab.kernel.invokeFunction(name, args, kwargs)``."""
    args = json.loads(json_args)
    kwargs = json.loads(json_kwargs)
    callback = _functions.get(function_name, None)
    if not callback:
        raise ValueError(f"Function not found: {function_name}")
    return callback(*args, **kwargs)


def enable_custom_widget_manager():
    """Enables a Jupyter widget manager which supports custom widgets (ipywidgets 8, third-party widgets)."""
    global _custom_widget_manager
    record("output.enable_custom_widget_manager")
    _custom_widget_manager = True


def disable_custom_widget_manager():
    """Disable support for custom Jupyter widgets."""
    global _custom_widget_manager
    record("output.disable_custom_widget_manager")
    _custom_widget_manager = False


def custom_widget_manager_enabled():
    """Stand-in only: whether enable_custom_widget_manager() is in effect."""
    return _custom_widget_manager
