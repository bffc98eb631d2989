"""``colabkit migrate``: turn Colab notebooks into notebooks that run unchanged on Colab and on a home rig.

    from colabkit.migrate import migrate_notebook
    report = migrate_notebook("train.ipynb")            # writes train.local.ipynb, never touches train.ipynb
    print(report.text())

Colab-only calls are replaced by colabkit's portable ones (``colabkit.mount_drive()``, ``colabkit.drive("...")``,
``colabkit.secret("...")``, ...); what has no portable equivalent is put under ``if colabkit.on_colab():`` or
reported. Only cell sources change: every other byte of the file (key order, indentation, Colab metadata,
outputs, nbformat_minor) stays as it was. Notebook code is never executed. The rules: ``RULES`` (``colabkit
migrate --list-rules``).
"""
from __future__ import annotations

import importlib

# public name -> submodule; loaded on first use so that building the `colabkit` command line stays cheap
_LAZY = {
    "migrate_notebook": "api", "migrate_paths": "api", "migrate_text": "api", "default_output": "api",
    "MigrateError": "api", "NotebookReport": "report", "summary": "report", "Finding": "rewrite",
    "Rule": "rules", "RULES": "rules", "rule_table": "rules", "select": "rules",
}

__all__ = list(_LAZY)


def __getattr__(name):
    try:
        module = importlib.import_module(f"{__name__}.{_LAZY[name]}")
    except KeyError:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}") from None
    value = getattr(module, name)
    globals()[name] = value
    return value


def __dir__():
    return sorted(set(globals()) | set(_LAZY))
