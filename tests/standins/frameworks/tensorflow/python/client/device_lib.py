"""device_lib.list_local_devices(): DeviceAttributes-like records; a GPU's physical_device_desc as TF writes it."""
import types

from tensorflow import _gpus


def list_local_devices(session_config=None):
    out = [types.SimpleNamespace(name="/device:CPU:0", device_type="CPU", memory_limit=268435456,
                                 physical_device_desc="")]
    for n, gpu in enumerate(_gpus()):
        bus = gpu["pci_bus_id"][4:].lower()   # TF prints "0000:3b:00.0"
        out.append(types.SimpleNamespace(
            name=f"/device:GPU:{n}", device_type="GPU", memory_limit=(gpu["memory_total"] - 500) * 2 ** 20,
            physical_device_desc=f"device: {n}, name: {gpu['name']}, pci bus id: {bus}, compute capability: 8.6"))
    return out
