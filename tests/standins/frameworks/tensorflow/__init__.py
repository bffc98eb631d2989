"""Stand-in for TensorFlow, for colabkit doctor's probes: the scenario (COLABKIT_TEST_GPUS) key "tensorflow":
{"version": "2.16.1", "cuda_version": "12.3" (null: a CPU-only build)}. Without that key `import tensorflow`
fails as where TensorFlow is not installed. Devices follow CUDA's rules (../_cuda_scenario.py)."""
import sys as _sys
import types as _types

_sys.path.insert(0, __file__.rsplit("/tensorflow/", 1)[0])
from _cuda_scenario import framework as _framework, visible_gpus as _visible_gpus  # noqa: E402

_entry = _framework("tensorflow")
__version__ = _entry.get("version", "2.16.1")
_cuda = _entry.get("cuda_version", "12.3")


def _gpus():
    return _visible_gpus() if _cuda else []


def _build_info():
    info = {"cpu_compiler": "/usr/lib/llvm-17/bin/clang", "is_cuda_build": bool(_cuda), "is_rocm_build": False,
            "is_tensorrt_build": bool(_cuda)}
    if _cuda:
        info.update(cuda_version=_cuda, cudnn_version="8", cuda_compute_capabilities=["sm_50", "sm_60", "sm_70",
                                                                                        "sm_80", "compute_90"])
    return info


class PhysicalDevice(_types.SimpleNamespace):
    pass


def _list_physical_devices(device_type=None):
    gpus = [PhysicalDevice(name=f"/physical_device:GPU:{n}", device_type="GPU") for n in range(len(_gpus()))]
    cpus = [PhysicalDevice(name="/physical_device:CPU:0", device_type="CPU")]
    return {None: cpus + gpus, "GPU": gpus, "CPU": cpus}.get(device_type, [])


def _get_device_details(device):
    if device.device_type != "GPU":
        return {}
    gpu = _gpus()[int(device.name.rsplit(":", 1)[1])]
    return {"device_name": gpu["name"], "compute_capability": (8, 6)}


sysconfig = _types.SimpleNamespace(get_build_info=_build_info)
config = _types.SimpleNamespace(list_physical_devices=_list_physical_devices,
                                experimental=_types.SimpleNamespace(get_device_details=_get_device_details))
