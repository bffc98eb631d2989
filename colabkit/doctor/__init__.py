"""`colabkit doctor`: a health check of a GPU box, the way a support engineer does it.

Each check (checks.py, a table of small functions) gives findings: one line each with a status (ok / warn /
fail / skip), what was found and the fix. Frameworks are imported in subprocesses of their own (probes.py).

    from colabkit.doctor import run_checks
    for f in run_checks():
        print(f.status, f.check, f.found, f.fix)
"""
from __future__ import annotations


def run_checks(**kwargs) -> list:
    """The findings for this machine (see checks.run_checks for the options)."""
    from .checks import run_checks as run
    return run(**kwargs)


def run_on_cluster(address: str, **kwargs) -> list:
    """[(node label, findings)] for every node of the Ray cluster at ``address`` (see cluster.py)."""
    from .cluster import run_on_cluster as run
    return run(address, **kwargs)


__all__ = ["run_checks", "run_on_cluster"]
