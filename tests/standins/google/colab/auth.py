"""Stand-in for google.colab.auth: ``authenticate_user`` with the real signature.

On Colab this runs an interactive sign-in and leaves Application Default Credentials for Google Cloud client
libraries. The stand-in records the call and returns; it grants no credentials (nothing here talks to Google).
"""
from google.colab._standin import record

__all__ = ["authenticate_user"]


def authenticate_user(clear_output=True, project_id=None):
    """Ensures that the given user is authenticated."""
    record("auth.authenticate_user", clear_output=clear_output, project_id=project_id)
