"""Stand-in for google.colab.userdata: notebook secrets.

Secrets come from the environment variable ``COLABKIT_TEST_SECRETS``, a JSON object read at each call:
``{"HF_TOKEN": "hf_x"}`` gives a secret the notebook may read; ``{"KEY": {"value": "v", "access": false}}``
gives one that exists but this notebook was not granted (NotebookAccessError). A key that is absent raises
SecretNotFoundError, with the real messages.
"""
import json
import os
import threading

from google.colab import errors
from google.colab._standin import record

_userdata_lock = threading.Lock()


class NotebookAccessError(Exception):
    """Exception thrown when the current notebook doesn't have access to the requested secret."""

    def __init__(self, key):
        super().__init__(f"Notebook does not have access to secret {key}")


class SecretNotFoundError(errors.Error):
    """Exception thrown when the requested secret is not found."""

    def __init__(self, key):
        super().__init__(f"Secret {key} does not exist.")


def _secrets():
    raw = os.environ.get("COLABKIT_TEST_SECRETS", "").strip()
    if not raw:
        return {}
    secrets = json.loads(raw)
    if not isinstance(secrets, dict):
        raise ValueError("COLABKIT_TEST_SECRETS must hold a JSON object")
    return secrets


def get(key):
    """Fetches the value for specified secret keys."""
    with _userdata_lock:
        record("userdata.get", key=key)
        secrets = _secrets()
    if key not in secrets:
        raise SecretNotFoundError(key)
    entry = secrets[key]
    if isinstance(entry, dict):
        if not entry.get("access", True):
            raise NotebookAccessError(key)
        return entry.get("value", "")
    return entry
