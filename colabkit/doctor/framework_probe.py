"""Run as a script (`python framework_probe.py torch|tensorflow`) by colabkit doctor, one framework per process
(both are heavy to import, and TensorFlow and PyTorch in one process can clash over CUDA libraries).

Prints one JSON line: {"installed", "version", "cuda" (the CUDA the build targets; null: CPU-only build),
"devices": [{"name", "pci"}] in the framework's order ("pci": "0000:3b:00.0" or null where not reported),
"error" (CUDA's complaint when a CUDA build sees no GPU)}. Imports nothing from colabkit.
"""
import json
import re
import sys


def probe_torch() -> dict:
    import torch
    out = {"installed": True, "version": torch.__version__, "cuda": torch.version.cuda, "devices": [], "error": None}
    if not out["cuda"]:
        return out
    try:
        torch.cuda.init()
    except Exception as exc:  # noqa: BLE001 - CUDA's reason, e.g. a driver too old for this build
        out["error"] = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        return out
    for i in range(torch.cuda.device_count()):
        props = torch.cuda.get_device_properties(i)
        pci = None
        if all(hasattr(props, a) for a in ("pci_domain_id", "pci_bus_id", "pci_device_id")):   # torch >= 2.5
            pci = f"{props.pci_domain_id:04x}:{props.pci_bus_id:02x}:{props.pci_device_id:02x}.0"
        out["devices"].append({"name": props.name, "pci": pci})
    return out


def probe_tensorflow() -> dict:
    import tensorflow as tf
    build = tf.sysconfig.get_build_info()
    cuda = build.get("cuda_version") if build.get("is_cuda_build") else None
    out = {"installed": True, "version": tf.__version__, "cuda": cuda, "devices": [], "error": None}
    if not cuda:
        return out
    gpus = tf.config.list_physical_devices("GPU")
    names = [tf.config.experimental.get_device_details(g).get("device_name") for g in gpus]
    buses = []
    try:   # only the device descriptions carry the PCI bus id
        from tensorflow.python.client import device_lib
        for d in device_lib.list_local_devices():
            if d.device_type == "GPU":
                found = re.search(r"pci bus id: ([0-9a-fA-F:.]+)", d.physical_device_desc or "")
                buses.append(found.group(1) if found else None)
    except Exception:  # noqa: BLE001 - names and order without bus ids still tell something
        buses = []
    for n, name in enumerate(names):
        out["devices"].append({"name": name, "pci": buses[n] if len(buses) == len(names) else None})
    if not gpus:
        out["error"] = "TensorFlow found no GPU"
    return out


def main() -> int:
    which = sys.argv[1]
    try:
        result = {"torch": probe_torch, "tensorflow": probe_tensorflow}[which]()
    except ImportError as exc:
        if getattr(exc, "name", None) in (which, None) and f"'{which}'" in str(exc):
            result = {"installed": False}
        else:
            result = {"installed": True, "crashed": f"{type(exc).__name__}: {exc}"}
    except Exception as exc:  # noqa: BLE001 - reported as a finding, not a traceback
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
        result = {"installed": True, "crashed": f"{type(exc).__name__}: {first}"}
    print("COLABKIT-PROBE " + json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
