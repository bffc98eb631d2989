"""The body of the `nvidia-smi` stand-in (bin/nvidia-smi runs it). Prints the output shapes of the real tool for
the queries colabkit makes, from the scenario named by COLABKIT_TEST_GPUS. See README.md."""
import json
import os
import sys

DRIVER_FAILURE = ("NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver. "
                  "Make sure that the latest NVIDIA driver is installed and running.\n")


def value(record, key, scale=1):
    v = record.get(key)
    if v is None:
        return "[N/A]"
    if v == "not_supported":
        return "[Not Supported]"
    return str(v)


def mig_mode(gpu):
    if gpu.get("mig"):
        return "Enabled" if gpu["mig"].get("enabled") else "Disabled"
    return "Disabled" if gpu.get("mig_capable") else "[N/A]"


def free(gpu):
    if isinstance(gpu.get("memory_free"), int):
        return str(gpu["memory_free"])
    total, used = gpu.get("memory_total"), gpu.get("memory_used")
    if isinstance(total, int) and isinstance(used, int):
        return str(total - used)
    return "[N/A]"


def gpu_field(name, index, gpu, scenario):
    if name == "index":
        return str(index)
    if name == "uuid":
        return gpu["uuid"]
    if name == "name":
        return gpu["name"]
    if name == "memory.total":
        return value(gpu, "memory_total")
    if name == "memory.used":
        return value(gpu, "memory_used")
    if name == "memory.free":
        return free(gpu)
    if name == "utilization.gpu":
        return "[N/A]" if gpu.get("mig", {}).get("enabled") else value(gpu, "utilization")
    if name == "temperature.gpu":
        return value(gpu, "temperature")
    if name == "pci.bus_id":
        return gpu["pci_bus_id"]
    if name == "driver_version":
        return scenario.get("driver_version", "535.183.01")
    if name == "mig.mode.current":
        return mig_mode(gpu)
    if name == "count":
        return str(len(scenario["gpus"]))
    if name in ("power.draw", "power.limit"):
        v = gpu.get("power_usage" if name == "power.draw" else "power_limit")
        return value(gpu, "_") if v is None else f"{v:.2f}"
    family, _, reason = name.partition(".")
    if family in ("clocks_throttle_reasons", "clocks_event_reasons"):   # the name before / since driver 535
        bits = reasons(gpu)
        if reason == "active":
            return f"0x{bits:016x}"
        if reason in REASON_BITS:
            return "Active" if bits & REASON_BITS[reason] else "Not Active"
    raise KeyError(name)


REASON_BITS = {"gpu_idle": 0x1, "applications_clocks_setting": 0x2, "sw_power_cap": 0x4, "hw_slowdown": 0x8,
               "sync_boost": 0x10, "sw_thermal_slowdown": 0x20, "hw_thermal_slowdown": 0x40,
               "hw_power_brake_slowdown": 0x80}


def reasons(gpu) -> int:
    v = gpu.get("clocks_event_reasons", 0)
    return sum(REASON_BITS[r] for r in v) if isinstance(v, list) else int(v)


KNOWN_GPU_FIELDS = ("index", "uuid", "name", "memory.total", "memory.used", "memory.free", "utilization.gpu",
                    "temperature.gpu", "pci.bus_id", "driver_version", "mig.mode.current", "count",
                    "power.draw", "power.limit",
                    *(f"{family}.{reason}" for family in ("clocks_throttle_reasons", "clocks_event_reasons")
                      for reason in ("active", "gpu_idle", "applications_clocks_setting", "sw_power_cap",
                                     "hw_slowdown", "sync_boost", "sw_thermal_slowdown", "hw_thermal_slowdown",
                                     "hw_power_brake_slowdown")))


def main(argv):
    log = os.environ.get("COLABKIT_TEST_NVIDIA_SMI_LOG")
    if log:
        with open(log, "a") as fh:
            fh.write(json.dumps(argv) + "\n")
    path = os.environ.get("COLABKIT_TEST_GPUS")
    scenario = None
    if path:
        with open(path) as fh:
            scenario = json.load(fh)
    if scenario is None or scenario.get("driver_loaded") is False:
        sys.stdout.write(DRIVER_FAILURE)
        return 9
    gpus = scenario["gpus"]
    options = dict(a.split("=", 1) if "=" in a else (a, "") for a in argv)
    if "--query-gpu" in options:
        if options.get("--format") != "csv,noheader,nounits":
            sys.stderr.write("stand-in: only --format=csv,noheader,nounits is implemented\n")
            return 2
        fields = [f.strip() for f in options["--query-gpu"].split(",")]
        known = scenario.get("smi_fields", KNOWN_GPU_FIELDS)
        for f in fields:
            if f not in known:
                sys.stdout.write(f'Field "{f}" is not a valid field to query.\n\n')
                return 2
        for i, gpu in enumerate(gpus):
            sys.stdout.write(", ".join(gpu_field(f, i, gpu, scenario) for f in fields) + "\n")
        return 0
    if "--query-compute-apps" in options:
        fields = [f.strip() for f in options["--query-compute-apps"].split(",")]
        for gpu in gpus:
            procs = list(gpu.get("processes", []))
            procs += [p for inst in gpu.get("mig", {}).get("instances", []) for p in inst.get("processes", [])]
            for p in procs:
                row = {"gpu_uuid": gpu["uuid"], "pid": str(p["pid"]), "process_name": p["name"],
                       "used_memory": "[N/A]" if p.get("used_memory") is None else str(p["used_memory"]),
                       "gpu_bus_id": gpu["pci_bus_id"], "gpu_name": gpu["name"]}
                try:
                    sys.stdout.write(", ".join(row[f] for f in fields) + "\n")
                except KeyError as exc:
                    sys.stdout.write(f'Field "{exc.args[0]}" is not a valid field to query.\n\n')
                    return 2
        return 0
    if argv in (["-L"], ["--list-gpus"]):
        for i, gpu in enumerate(gpus):
            sys.stdout.write(f"GPU {i}: {gpu['name']} (UUID: {gpu['uuid']})\n")
            if gpu.get("mig", {}).get("enabled"):
                for n, inst in enumerate(sorted(gpu["mig"].get("instances", []), key=lambda x: x["slot"])):
                    sys.stdout.write(f"  MIG {inst['profile']:<11} Device {n:>2}: (UUID: {inst['uuid']})\n")
        return 0
    sys.stderr.write(f"stand-in nvidia-smi: options {argv} are not implemented\n")
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
