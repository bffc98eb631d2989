import sys as _sys

_sys.path.insert(0, __file__.rsplit("/torch/", 1)[0])
from _cuda_scenario import framework as _framework  # noqa: E402

_entry = _framework("torch")
__version__ = _entry.get("version", "2.3.1+cu121")
cuda = _entry.get("cuda", "12.1")
