"""Bookkeeping shared by the stand-in modules (this file does not exist in the real google.colab).

Every stand-in call is appended to ``CALLS`` (in this process) and, when the environment variable
``COLABKIT_TEST_COLAB_LOG`` names a file, written to it as one JSON object per line, so a test can see
what code running in a subprocess or a Jupyter kernel asked of "Colab".
"""
import json
import os
import threading

CALLS = []
_lock = threading.Lock()


def record(call, **arguments):
    entry = {"call": call, **{k: _jsonable(v) for k, v in arguments.items()}}
    with _lock:
        CALLS.append(entry)
        log = os.environ.get("COLABKIT_TEST_COLAB_LOG")
        if log:
            with open(log, "a", encoding="utf-8") as fh:
                fh.write(json.dumps(entry) + "\n")


def read_log(path):
    """The entries a (sub)process wrote to the COLABKIT_TEST_COLAB_LOG file ``path`` ([] if none)."""
    try:
        with open(path, encoding="utf-8") as fh:
            return [json.loads(line) for line in fh if line.strip()]
    except FileNotFoundError:
        return []


def _jsonable(value):
    if isinstance(value, (str, int, float, bool, type(None))):
        return value
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    return repr(value)
