"""Common error types of google.colab (same names and bases as the real module)."""


class Error(Exception):
    """Base class for all Colab errors."""


class AuthorizationError(Error):
    """Authorization-related failures."""


class RuntimeManagementError(Error):
    """Runtime-management failures (google.colab.runtime)."""


class WidgetException(Exception):
    """colab.widgets failures."""
