"""Stand-in for google.colab._message: only the exception that eval_js raises on a timeout."""


class MessageError(RuntimeError):
    """Raised when the frontend reports an error for a request."""


class TimeoutException(RuntimeError):
    """Raised when no reply arrives from the frontend within the timeout."""
