"""Stand-in for google.colab.files: ``upload``, ``download`` and ``view`` with the real signatures.

There is no browser. What the user "picks" in the upload dialog is every file in the folder named by the
environment variable ``COLABKIT_TEST_UPLOADS`` (none when unset: the real dialog would wait forever, so the
stand-in raises ``StandinWouldBlockForever`` instead of hanging the test). As on Colab the files are written to
``target_dir`` (default: the current directory), "Saving <name> to <path>" is printed, and ``{name: bytes}`` is
returned. ``download`` raises FileNotFoundError for a missing file with the real message, else records the call
(the browser would save the file); ``view`` records the call (Colab would open the file in its editor).
"""
import os

from google.colab._standin import record

__all__ = ["upload", "download", "view"]


class StandinWouldBlockForever(RuntimeError):
    """files.upload() with no COLABKIT_TEST_UPLOADS folder: the real dialog would wait for the user forever."""


def upload(target_dir=""):
    """Render a widget to upload local (to the browser) files to the kernel."""
    record("files.upload", target_dir=target_dir)
    folder = os.environ.get("COLABKIT_TEST_UPLOADS", "").strip()
    if not folder:
        raise StandinWouldBlockForever(
            "google.colab.files.upload() waits for the user to pick files in the browser; the stand-in takes them "
            "from the folder named by COLABKIT_TEST_UPLOADS, which is not set.")
    uploaded = {}
    for name in sorted(os.listdir(folder)):
        source = os.path.join(folder, name)
        if not os.path.isfile(source):
            continue
        with open(source, "rb") as fh:
            uploaded[name] = fh.read()
    local_names = {}
    for name, data in uploaded.items():
        if target_dir:
            os.makedirs(target_dir, exist_ok=True)
            path = os.path.join(target_dir, name)
        else:
            path = name
        with open(path, "wb") as fh:
            fh.write(data)
        local_names[name] = path
    for name, path in local_names.items():
        print(f"Saving {name} to {path}")
    return uploaded


def download(filename):
    """Downloads the file to the user's local disk via a browser download action."""
    if not os.path.exists(filename):
        raise FileNotFoundError(f"Cannot find file: {filename}")
    record("files.download", filename=os.fspath(filename), size=os.path.getsize(filename))


def view(filepath):
    """View a file in Colab's file viewer."""
    if not os.path.exists(filepath):
        raise FileNotFoundError(f"Cannot find file: {filepath}")
    record("files.view", filepath=os.fspath(filepath))
