"""NVML calls `colabkit doctor` makes: CUDA driver version, PCIe link, persistence mode, power limits, P2P status,
ECC counters, retired pages and remapped rows. Names, signatures, units and errors as in nvidia-ml-py 12/13.

Scenario keys (top level): "cuda_driver_version" (int, e.g. 12040; default 12020). Per GPU, all optional:
"pcie": {gen, max_gen, gpu_max_gen?, width, max_width}, "persistence_mode" (bool), "power_limit" (W, the limit
in force), "power_limit_default" (W), "power_limit_constraints": [min W, max W], "p2p": {"0,1": "ok" |
"chipset_not_supported" | "gpu_not_supported" | "topology_not_supported" | "disabled_by_regkey" |
"not_supported"} (on the lower-indexed GPU; absent: "not_supported"), "ecc": {volatile_uncorrected,
aggregate_uncorrected, volatile_corrected, aggregate_corrected, retired_single_bit: [addresses],
retired_double_bit: [addresses], retired_pending: bool, remapped_rows: {correctable, uncorrectable, pending,
failure}}. A missing key raises NVMLError_NotSupported, as on GeForce boards.
"""
import sys as _sys

_INVALID_ARGUMENT, _NOT_SUPPORTED = 2, 3   # NVML_ERROR_* codes


def _pynvml():
    """The package as it is now: tests drop `pynvml` from sys.modules to re-read a scenario, and this submodule
    (kept in sys.modules as pynvml._doctor) must use the fresh package's state and error classes, not the old."""
    return _sys.modules[__name__.rpartition(".")[0]]


def _need():
    return _pynvml()._need()


def _field(record, key):
    return _pynvml()._field(record, key)


def _whole_gpu(handle):
    return _pynvml()._whole_gpu(handle)


def _error(value):
    return _pynvml().NVMLError(value)   # the current package's class, subclass chosen by code

NVML_FEATURE_DISABLED = 0
NVML_FEATURE_ENABLED = 1

NVML_P2P_CAPS_INDEX_READ = 0
NVML_P2P_CAPS_INDEX_WRITE = 1
NVML_P2P_CAPS_INDEX_NVLINK = 2
NVML_P2P_CAPS_INDEX_ATOMICS = 3
NVML_P2P_CAPS_INDEX_PROP = 4
NVML_P2P_CAPS_INDEX_LOOPBACK = 5
NVML_P2P_CAPS_INDEX_UNKNOWN = 6

NVML_P2P_STATUS_OK = 0
NVML_P2P_STATUS_CHIPSET_NOT_SUPPORED = 1   # sic: the binding's spelling
NVML_P2P_STATUS_CHIPSET_NOT_SUPPORTED = 1
NVML_P2P_STATUS_GPU_NOT_SUPPORTED = 2
NVML_P2P_STATUS_IOH_TOPOLOGY_NOT_SUPPORTED = 3
NVML_P2P_STATUS_DISABLED_BY_REGKEY = 4
NVML_P2P_STATUS_NOT_SUPPORTED = 5
NVML_P2P_STATUS_UNKNOWN = 6

NVML_MEMORY_ERROR_TYPE_CORRECTED = 0
NVML_MEMORY_ERROR_TYPE_UNCORRECTED = 1
NVML_VOLATILE_ECC = 0
NVML_AGGREGATE_ECC = 1
NVML_PAGE_RETIREMENT_CAUSE_MULTIPLE_SINGLE_BIT_ECC_ERRORS = 0
NVML_PAGE_RETIREMENT_CAUSE_DOUBLE_BIT_ECC_ERROR = 1

_P2P_STATUS = {"ok": 0, "chipset_not_supported": 1, "gpu_not_supported": 2, "topology_not_supported": 3,
               "disabled_by_regkey": 4, "not_supported": 5, "unknown": 6}


def nvmlSystemGetCudaDriverVersion():
    return int(_need().get("cuda_driver_version", 12020))


def nvmlSystemGetCudaDriverVersion_v2():
    return nvmlSystemGetCudaDriverVersion()


def _pcie(handle, key):
    return int(_field(_field(_whole_gpu(handle), "pcie"), key))


def nvmlDeviceGetCurrPcieLinkGeneration(handle):
    return _pcie(handle, "gen")


def nvmlDeviceGetMaxPcieLinkGeneration(handle):   # the most this GPU and this system (slot, chipset) allow
    return _pcie(handle, "max_gen")


def nvmlDeviceGetGpuMaxPcieLinkGeneration(handle):   # the most the GPU itself supports
    rec = _field(_whole_gpu(handle), "pcie")
    return int(rec.get("gpu_max_gen", _field(rec, "max_gen")))


def nvmlDeviceGetCurrPcieLinkWidth(handle):
    return _pcie(handle, "width")


def nvmlDeviceGetMaxPcieLinkWidth(handle):
    return _pcie(handle, "max_width")


def nvmlDeviceGetPersistenceMode(handle):
    return NVML_FEATURE_ENABLED if _field(_whole_gpu(handle), "persistence_mode") else NVML_FEATURE_DISABLED


def nvmlDeviceGetPowerManagementLimit(handle):
    return int(_field(_whole_gpu(handle), "power_limit") * 1000)   # mW


def nvmlDeviceGetPowerManagementDefaultLimit(handle):
    return int(_field(_whole_gpu(handle), "power_limit_default") * 1000)   # mW


def nvmlDeviceGetPowerManagementLimitConstraints(handle):
    low, high = _field(_whole_gpu(handle), "power_limit_constraints")
    return [int(low * 1000), int(high * 1000)]   # [min mW, max mW]


def nvmlDeviceGetP2PStatus(device1, device2, p2pIndex):  # noqa: N803 - the real parameter name
    _whole_gpu(device1), _whole_gpu(device2)
    if device1._index == device2._index or not 0 <= int(p2pIndex) <= NVML_P2P_CAPS_INDEX_UNKNOWN:
        raise _error(_INVALID_ARGUMENT)
    low, high = sorted((device1, device2), key=lambda h: h._index)
    name = (low._gpu.get("p2p") or {}).get(f"{low._index},{high._index}", "not_supported")
    return _P2P_STATUS[name]


def _ecc(handle) -> dict:
    return _field(_whole_gpu(handle), "ecc")


def nvmlDeviceGetTotalEccErrors(handle, errorType, counterType):  # noqa: N803
    kind = {NVML_MEMORY_ERROR_TYPE_CORRECTED: "corrected", NVML_MEMORY_ERROR_TYPE_UNCORRECTED: "uncorrected"}
    counter = {NVML_VOLATILE_ECC: "volatile", NVML_AGGREGATE_ECC: "aggregate"}
    if errorType not in kind or counterType not in counter:
        raise _error(_INVALID_ARGUMENT)
    return int(_ecc(handle).get(f"{counter[counterType]}_{kind[errorType]}", 0))


def nvmlDeviceGetRetiredPages(device, sourceFilter):  # noqa: N803
    ecc = _ecc(device)
    if "remapped_rows" in ecc:   # A100 and newer remap rows instead of retiring pages
        raise _error(_NOT_SUPPORTED)
    key = {NVML_PAGE_RETIREMENT_CAUSE_MULTIPLE_SINGLE_BIT_ECC_ERRORS: "retired_single_bit",
           NVML_PAGE_RETIREMENT_CAUSE_DOUBLE_BIT_ECC_ERROR: "retired_double_bit"}.get(sourceFilter)
    if key is None:
        raise _error(_INVALID_ARGUMENT)
    return list(ecc.get(key, []))


def nvmlDeviceGetRetiredPagesPendingStatus(device):
    ecc = _ecc(device)
    if "remapped_rows" in ecc:
        raise _error(_NOT_SUPPORTED)
    return NVML_FEATURE_ENABLED if ecc.get("retired_pending") else NVML_FEATURE_DISABLED


def nvmlDeviceGetRemappedRows(device):
    rows = _field(_ecc(device), "remapped_rows")
    return (int(rows.get("correctable", 0)), int(rows.get("uncorrectable", 0)), int(bool(rows.get("pending"))),
            int(bool(rows.get("failure"))))
