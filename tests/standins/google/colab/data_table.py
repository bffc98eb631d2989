"""Stand-in for google.colab.data_table: the interactive DataFrame display Colab offers.

``%load_ext google.colab.data_table`` calls ``load_ipython_extension``, which (like the real module) turns the
formatter on; ``enable_dataframe_formatter`` / ``disable_dataframe_formatter`` switch it. The stand-in records
the calls and keeps the state in ``formatter_enabled``; it registers no display formatter (there is no Colab
frontend to draw the table).
"""
from google.colab._standin import record

__all__ = ["enable_dataframe_formatter", "disable_dataframe_formatter", "load_ipython_extension",
           "unload_ipython_extension"]

formatter_enabled = False  # stand-in only


def enable_dataframe_formatter():
    """Enables DataTable as the default IPython formatter for Pandas DataFrames."""
    global formatter_enabled
    record("data_table.enable_dataframe_formatter")
    formatter_enabled = True


def disable_dataframe_formatter():
    """Restores the original IPython formatter for Pandas DataFrames."""
    global formatter_enabled
    record("data_table.disable_dataframe_formatter")
    formatter_enabled = False


def load_ipython_extension(ipython):  # noqa: ARG001 - the real signature
    """Called by IPython when this module is loaded as an IPython extension."""
    enable_dataframe_formatter()


def unload_ipython_extension(ipython):  # noqa: ARG001
    """Called by IPython when this module is unloaded as an IPython extension."""
    disable_dataframe_formatter()
