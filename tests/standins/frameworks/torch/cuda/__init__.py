"""torch.cuda over the scenario's GPUs (see ../../_cuda_scenario.py)."""
import types as _types

from .. import version as _version
from _cuda_scenario import pci_parts as _pci_parts, visible_gpus as _visible_gpus

_current = [0]


def _gpus():
    return _visible_gpus() if _version.cuda else []


def is_available():
    return bool(_gpus())


def device_count():
    return len(_gpus())


def init():
    if not _version.cuda:
        raise AssertionError("Torch not compiled with CUDA enabled")
    if not _gpus():
        raise RuntimeError("Found no NVIDIA driver on your system. Please check that you have an NVIDIA GPU and "
                           "installed a driver from http://www.nvidia.com/Download/index.aspx")


def _lazy_check(device: str):
    init()
    index = int(device.split(":")[1]) if ":" in device else _current[0]
    if not 0 <= index < device_count():
        raise RuntimeError("CUDA error: invalid device ordinal")


def set_device(device):
    _lazy_check(f"cuda:{int(str(device).rsplit(':', 1)[-1])}")
    _current[0] = int(str(device).rsplit(":", 1)[-1])


def current_device():
    return _current[0]


def synchronize(device=None):
    init()


def get_device_properties(device):
    _lazy_check(f"cuda:{int(device)}")
    gpu = _gpus()[int(device)]
    domain, bus, dev = _pci_parts(gpu)
    return _types.SimpleNamespace(name=gpu["name"], total_memory=gpu["memory_total"] * 2 ** 20, major=8, minor=6,
                                  multi_processor_count=48, uuid=gpu["uuid"][len("GPU-"):],
                                  pci_bus_id=bus, pci_device_id=dev, pci_domain_id=domain)
