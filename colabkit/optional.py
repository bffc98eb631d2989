"""Optional dependencies: imported on first use, with the exact install command when missing."""
from __future__ import annotations

import importlib


def require(module: str, extra: str, purpose: str):
    """Import ``module`` or raise an ImportError that names the colabkit extra to install."""
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        raise ImportError(
            f"{purpose} needs the Python package '{module.split('.')[0]}', which could not be imported ({exc}). "
            f'Install it with: pip install "colabkit[{extra}]"'
        ) from exc
