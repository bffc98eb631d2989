"""Stand-in for the ``google.colab`` package, for tests that simulate running on Google Colab.

Not the real thing (that is not installable from PyPI): it mirrors the public signatures colabkit uses
(drive, output, runtime, userdata, errors) and behaves like Colab where a test can observe it, without a
browser, a Google account or FUSE. See tests/standins/README.md.
"""
from google.colab import errors, drive, output, runtime, userdata  # noqa: F401  (the real package imports its modules too)

__version__ = "0.0.1a2"

# Lets tests assert that the google.colab they imported is this stand-in and not the real package.
_STANDIN = True
