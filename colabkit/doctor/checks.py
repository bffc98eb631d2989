"""The checks, as a table of small functions. Each takes the Box (what NVML and the probes report, read once)
and returns Findings; run_checks() runs the table."""
from __future__ import annotations

import os

from ..devices.nvml import call, open_nvml, text
from ..devices.records import SourceUnavailable
from . import probes
from .findings import Finding

IDLE_HOT_C = 60            # an idle GPU with working fans sits at 30-50 C
MIN_DRIVER = {11: "450.80.02", 12: "525.60.13", 13: "580.65.06"}   # Linux, per CUDA major (minor-version compat)
TORCH_WHEELS = [((11, 8), "cu118"), ((12, 1), "cu121"), ((12, 4), "cu124"), ((12, 6), "cu126"), ((12, 8), "cu128"),
                ((13, 0), "cu130")]
FRAMEWORKS = ("torch", "tensorflow")
NCCL_FIX = "try NCCL_P2P_DISABLE=1 (and check the IOMMU / ACS settings in the BIOS)"


class Box:
    """What the checks read: NVML (opened once) and the framework probes (run on first use, then kept)."""

    def __init__(self, nccl_timeout: float = probes.NCCL_TIMEOUT_S, probe_timeout: float = probes.PROBE_TIMEOUT_S):
        self.nccl_timeout, self.probe_timeout = nccl_timeout, probe_timeout
        self._probes = {}
        try:
            self.nv, self.nvml_error = open_nvml(), None
        except SourceUnavailable as exc:
            self.nv, self.nvml_error = None, str(exc)
        self.handles, self.lost = [], []   # [(NVML index, handle)], ["GPU i: why"] for GPUs NVML cannot open
        if self.nv is not None:
            try:
                count = self.nv.nvmlDeviceGetCount()
            except self.nv.NVMLError as exc:
                self.nv, self.nvml_error = None, str(exc)
                count = 0
            for i in range(count):
                try:
                    self.handles.append((i, self.nv.nvmlDeviceGetHandleByIndex(i)))
                except self.nv.NVMLError as exc:   # "GPU is lost" and the like: the driver check says so
                    self.lost.append(f"GPU {i}: {exc}")

    def call(self, name: str, *args):
        return call(self.nv, name, *args)

    def probe(self, framework: str) -> dict:
        if framework not in self._probes:
            self._probes[framework] = probes.probe_framework(framework, timeout=self.probe_timeout)
        return self._probes[framework]

    def pci(self, handle) -> str | None:
        info = self.call("nvmlDeviceGetPciInfo", handle)
        return normal_bus_id(text(getattr(info, "busId", None)))

    def busy(self, handle) -> tuple[int | None, int]:
        """(utilization %, compute processes)."""
        util = self.call("nvmlDeviceGetUtilizationRates", handle)
        procs = self.call("nvmlDeviceGetComputeRunningProcesses", handle) or []
        return getattr(util, "gpu", None), len(procs)

    def driver_cuda(self) -> tuple[int, int] | None:
        value = self.call("nvmlSystemGetCudaDriverVersion")   # e.g. 12040 for 12.4
        return None if not value else (int(value) // 1000, int(value) % 1000 // 10)


def normal_bus_id(bus_id: str | None) -> str | None:
    """"00000000:3B:00.0" (NVML) and "0000:3b:00.0" (TensorFlow, torch) as one form: "0000:3b:00.0"."""
    if not bus_id:
        return None
    try:
        domain, bus, rest = bus_id.strip().split(":")
        device, _, function = rest.partition(".")
        return f"{int(domain, 16):04x}:{int(bus, 16):02x}:{int(device, 16):02x}.{int(function or '0', 16)}"
    except ValueError:
        return bus_id.lower()


def version_tuple(text_: str | None) -> tuple[int, int] | None:
    try:
        major, minor = str(text_).split(".")[:2]
        return int(major), int(minor)
    except (ValueError, TypeError):
        return None


def _v(t) -> str:
    return f"{t[0]}.{t[1]}"


def _no_nvml(check: str, box: Box) -> list:
    return [Finding(check, "skip", f"NVML unavailable ({box.nvml_error})")]


# -- the checks -----------------------------------------------------------------------------------------------

def check_driver(box: Box) -> list:
    if box.nv is None:
        missing = "not installed" in (box.nvml_error or "")
        return [Finding("driver", "fail", f"cannot read the GPUs through NVML: {box.nvml_error}",
                        'pip install "colabkit[gpu]" (nvidia-ml-py)' if missing else
                        "install the NVIDIA driver (`nvidia-smi` must list the GPUs), or run this on the GPU box")]
    driver = text(box.call("nvmlSystemGetDriverVersion")) or "?"
    cuda = box.driver_cuda()
    found = f"driver {driver}" + (f", supports CUDA up to {_v(cuda)}" if cuda else "") + f", {len(box.handles)} GPU(s)"
    out = [Finding("driver", "ok", found)]
    for lost in box.lost:
        out.append(Finding("driver", "fail", f"NVML cannot open {lost}",
                           "look for Xid errors in `sudo dmesg`; reboot, and reseat the card if it stays lost"))
    if not box.handles and not box.lost:
        out[0] = Finding("driver", "fail", found, "the driver sees no GPU: check `lspci | grep -i nvidia`")
    return out


def _wheel_for(cuda: tuple[int, int]) -> str | None:
    fitting = [tag for version, tag in TORCH_WHEELS if version <= cuda]
    return fitting[-1] if fitting else None


def _install_hint(framework: str, cuda: tuple[int, int] | None) -> str:
    if framework == "torch":
        tag = (_wheel_for(cuda) if cuda else None) or "cu12x"
        return f"pip install torch --index-url https://download.pytorch.org/whl/{tag}"
    return 'pip install "tensorflow[and-cuda]"'


def check_cuda_versions(box: Box) -> list:
    """Each framework's CUDA build against the most the driver supports."""
    out = []
    driver = box.driver_cuda() if box.nv is not None else None
    for name in FRAMEWORKS:
        p = box.probe(name)
        if not p.get("installed"):
            out.append(Finding("cuda", "skip", f"{name} is not installed"))
        elif p.get("timed_out"):
            out.append(Finding("cuda", "warn", f"import {name} took over {box.probe_timeout:g} s; not checked",
                               f"time `python -c 'import {name}'`; a slow or network disk makes it slow"))
        elif p.get("crashed"):
            out.append(Finding("cuda", "fail", f"import {name} fails: {p['crashed']}",
                               f"reinstall it: pip install --force-reinstall {name}"))
        elif not p.get("cuda"):
            out.append(Finding("cuda", "warn" if box.handles else "ok",
                               f"{name} {p['version']} is a CPU-only build",
                               _install_hint(name, driver) if box.handles else ""))
        else:
            out.append(_compare_cuda(name, p, driver))
    return out


def _compare_cuda(name: str, p: dict, driver) -> Finding:
    built = version_tuple(p["cuda"])
    what = f"{name} {p['version']} is built for CUDA {p['cuda']}"
    if built is None or driver is None:
        return Finding("cuda", "skip", what + "; the driver's CUDA version is unknown")
    if built[0] > driver[0]:
        other = (f"install the {name} build for CUDA {_v(driver)}: {_install_hint(name, driver)}" if name == "torch"
                 else f"install a TensorFlow release built for CUDA <= {_v(driver)} "
                      f"(https://www.tensorflow.org/install/source#gpu)")
        return Finding("cuda", "fail", f"{what}, newer than the driver supports ({_v(driver)})",
                       f"upgrade the driver to >= {MIN_DRIVER.get(built[0], 'the ' + p['cuda'] + ' release')}, "
                       f"or {other}")
    if built > driver:
        # CUDA minor-version compatibility: a 12.x build runs on any 12.x driver, but kernels JIT-compiled from
        # PTX for the newer minor fail there
        return Finding("cuda", "warn", f"{what}, newer than the driver's {_v(driver)}: runs through CUDA "
                                       f"minor-version compatibility, but PTX JIT for new kernels can fail",
                       f"upgrade the driver to one for CUDA >= {p['cuda']}")
    return Finding("cuda", "ok", f"{what}; the driver supports up to {_v(driver)}")


def _unusable(p: dict) -> str | None:
    """Why a framework probe has no GPUs to compare (the cuda check reports it), or None."""
    if not p.get("installed"):
        return "not installed"
    if p.get("crashed") or p.get("timed_out"):
        return "could not be imported (see the cuda line)"
    return None if p.get("cuda") else "a CPU-only build"


def _no_gpu_fix(framework: str) -> str:
    if framework == "tensorflow":   # the pip wheel is a CUDA build that loads CUDA's libraries from pip packages
        return ('pip install "tensorflow[and-cuda]" (the CUDA libraries it loads); TF_CPP_MIN_LOG_LEVEL=0 '
                "python -c \"import tensorflow as tf; tf.config.list_physical_devices('GPU')\" names what is missing")
    return "see the cuda line: a build the driver cannot run sees no GPU; the error above says why"


def check_framework_gpus(box: Box) -> list:
    """Each framework sees every GPU NVML lists, in PCI order."""
    if box.nv is None:
        return _no_nvml("gpus seen", box)
    nvml = [box.pci(h) for _, h in box.handles]
    order = os.environ.get("CUDA_DEVICE_ORDER")
    mask = os.environ.get("CUDA_VISIBLE_DEVICES")
    note = f" (checked without your CUDA_VISIBLE_DEVICES={mask})" if mask is not None else ""
    out = []
    for name in FRAMEWORKS:
        p = box.probe(name)
        why = _unusable(p)
        if why:
            out.append(Finding("gpus seen", "skip", f"{name}: {why}"))
            continue
        seen = [d.get("pci") for d in p.get("devices", [])]
        if not seen and nvml:
            out.append(Finding("gpus seen", "fail", f"{name} sees no GPU of the {len(nvml)} NVML lists"
                               + (f": {p['error']}" if p.get("error") else "") + note,
                               _no_gpu_fix(name)))
        elif len(seen) < len(nvml):
            missing = [b for b in nvml if b not in seen] if all(seen) else []
            out.append(Finding("gpus seen", "fail", f"{name} sees {len(seen)} of the {len(nvml)} GPUs"
                               + (f"; missing {', '.join(missing)}" if missing else "") + note,
                               "look for Xid errors in `sudo dmesg` and check that GPU with "
                               "`nvidia-smi -q -i <bus id>`"))
        elif len(seen) > len(nvml):
            out.append(Finding("gpus seen", "warn", f"{name} sees {len(seen)} GPUs, NVML could open only "
                               f"{len(nvml)}" + note, "see the driver line: a GPU NVML cannot open is unwell"))
        elif not all(seen):
            out.append(Finding("gpus seen", "ok", f"{name} sees all {len(nvml)} GPUs (this version does not report "
                               f"PCI bus ids, so the order is not checked)" + note,
                               "" if order == "PCI_BUS_ID" else "export CUDA_DEVICE_ORDER=PCI_BUS_ID"))
        elif seen != nvml:
            out.append(Finding("gpus seen", "warn", f"{name} sees all {len(nvml)} GPUs but not in PCI order: its "
                               f"cuda:0.. are {', '.join(seen)} (nvidia-smi: {', '.join(nvml)})" + note,
                               "export CUDA_DEVICE_ORDER=PCI_BUS_ID (colabkit.use_gpus sets it), so that GPU N is "
                               "the same GPU everywhere"))
        else:
            out.append(Finding("gpus seen", "ok", f"{name} sees all {len(nvml)} GPUs in PCI order" + note
                               + ("" if order == "PCI_BUS_ID" or len(nvml) < 2 else
                                  " (CUDA_DEVICE_ORDER is not PCI_BUS_ID: with GPUs of different models CUDA would put "
                                  "the fastest first)")))
    return out


def check_pcie(box: Box) -> list:
    if box.nv is None:
        return _no_nvml("pcie", box)
    out = []
    for i, h in box.handles:
        gen = box.call("nvmlDeviceGetCurrPcieLinkGeneration", h)
        max_gen = box.call("nvmlDeviceGetMaxPcieLinkGeneration", h)
        gpu_max = box.call("nvmlDeviceGetGpuMaxPcieLinkGeneration", h) or max_gen
        width, max_width = box.call("nvmlDeviceGetCurrPcieLinkWidth", h), box.call("nvmlDeviceGetMaxPcieLinkWidth", h)
        if None in (gen, max_gen, width, max_width):
            out.append(Finding("pcie", "skip", "PCIe link not reported by this GPU", gpu=i))
            continue
        link = f"PCIe gen {gen} x{width} (max gen {max_gen} x{max_width})"
        if width < max_width:
            out.append(Finding("pcie", "warn", f"{link}: the link is narrowed to x{width} of x{max_width}",
                               "reseat the card, check the slot (a x16-long slot may be wired x8 or share lanes "
                               "with an M.2 / other slot) and the riser; x8/x8 when two GPUs split the CPU's lanes "
                               "is by design", gpu=i))
        elif gpu_max and max_gen < gpu_max:
            out.append(Finding("pcie", "warn", f"{link}: the slot or system caps the link at gen {max_gen}; the GPU "
                               f"supports gen {gpu_max}",
                               "use a faster slot, or set the slot's PCIe speed to Auto in the BIOS (risers often "
                               "need a lower one)", gpu=i))
        elif gen < max_gen:
            util, procs = box.busy(h)
            if util is not None and util >= 20:
                out.append(Finding("pcie", "warn", f"{link}: below its maximum generation while {util}% busy",
                                   "check the BIOS PCIe speed setting and the riser, and reseat the card", gpu=i))
            else:
                out.append(Finding("pcie", "ok", f"{link}: a lower generation at idle saves power; run "
                                   f"`colabkit doctor` during training to check it under load", gpu=i))
        else:
            out.append(Finding("pcie", "ok", link, gpu=i))
    return out


def check_persistence(box: Box) -> list:
    if box.nv is None:
        return _no_nvml("persistence", box)
    out = []
    for i, h in box.handles:
        mode = box.call("nvmlDeviceGetPersistenceMode", h)
        if mode is None:
            out.append(Finding("persistence", "skip", "persistence mode not reported (Windows has none)", gpu=i))
        elif mode == getattr(box.nv, "NVML_FEATURE_ENABLED", 1):
            out.append(Finding("persistence", "ok", "persistence mode on", gpu=i))
        else:
            out.append(Finding("persistence", "warn", "persistence mode off: on a headless box the driver unloads "
                               "between jobs, so each start takes seconds and settings such as power limits reset",
                               "sudo nvidia-smi -pm 1 (or enable the nvidia-persistenced service)", gpu=i))
    return out


def check_power(box: Box) -> list:
    if box.nv is None:
        return _no_nvml("power", box)
    out = []
    for i, h in box.handles:
        limit = box.call("nvmlDeviceGetPowerManagementLimit", h)
        default = box.call("nvmlDeviceGetPowerManagementDefaultLimit", h)
        if limit is None or default is None:
            out.append(Finding("power", "skip", "power limits not reported by this GPU", gpu=i))
            continue
        bounds = box.call("nvmlDeviceGetPowerManagementLimitConstraints", h)
        allowed = f" (allowed {bounds[0] / 1000:g}-{bounds[1] / 1000:g} W)" if bounds else ""
        if limit < default * 0.98:
            out.append(Finding("power", "warn", f"power limit {limit / 1000:g} W, below the default "
                               f"{default / 1000:g} W{allowed}: training runs slower",
                               f"if not on purpose (heat, power supply): sudo nvidia-smi -i {i} -pl {default / 1000:g}",
                               gpu=i))
        else:
            out.append(Finding("power", "ok", f"power limit {limit / 1000:g} W (default {default / 1000:g} W)",
                               gpu=i))
    return out


_P2P_WHY = {1: ("the chipset does not support it", "normal on many desktop boards"),
            2: ("the GPU does not support it", "normal for GeForce cards"),
            3: ("the PCIe topology does not allow it (the GPUs hang off different CPUs or root ports)",
                "put the GPUs under one CPU / PCIe switch for faster all-reduce"),
            4: ("it is disabled in the driver (registry key / module option)", "remove the setting to enable it"),
            5: ("it is not supported", ""), 6: ("its status is unknown", "")}


def check_p2p(box: Box) -> list:
    if box.nv is None:
        return _no_nvml("p2p", box)
    if len(box.handles) < 2:
        return [Finding("p2p", "skip", "one GPU: no peer-to-peer to check")]
    read = getattr(box.nv, "NVML_P2P_CAPS_INDEX_READ", 0)
    out, pairs = [], 0
    for a, (i, hi) in enumerate(box.handles):
        for j, hj in box.handles[a + 1:]:
            status = box.call("nvmlDeviceGetP2PStatus", hi, hj, read)
            pairs += 1
            if status is None:
                return [Finding("p2p", "skip", "peer-to-peer status not reported by this driver")]
            if status != 0:
                why, hint = _P2P_WHY.get(status, _P2P_WHY[6])
                out.append(Finding("p2p", "warn", f"GPU {i} <-> GPU {j}: no peer-to-peer reads: {why}",
                                   "NCCL then copies through host memory (slower all-reduce)"
                                   + (f"; {hint}" if hint else "")))
    return out or [Finding("p2p", "ok", f"peer-to-peer reads supported between all {len(box.handles)} GPUs "
                                        f"({pairs} pair(s), as NVML reports)")]


def check_nccl(box: Box) -> list:
    if box.nv is None:
        return _no_nvml("nccl", box)
    if len(box.handles) < 2:
        return [Finding("nccl", "skip", "one GPU: no all-reduce to test")]
    why = _unusable(box.probe("torch"))
    if why:
        return [Finding("nccl", "skip", f"needs PyTorch with CUDA to run an NCCL all-reduce (torch: {why})")]
    p = box.probe("torch")
    count = len(p.get("devices", []))
    if count < 2:
        return [Finding("nccl", "skip", f"torch sees {count} GPU(s): no all-reduce to test")]
    result = probes.all_reduce(count, timeout=box.nccl_timeout)
    already = " (NCCL_P2P_DISABLE=1 is already set)" if os.environ.get("NCCL_P2P_DISABLE") == "1" else ""
    if result["hung"]:
        return [Finding("nccl", "fail", f"an NCCL all-reduce over {count} GPUs hung (no result in "
                        f"{box.nccl_timeout:g} s){already}", NCCL_FIX)]
    if not result["ok"]:
        return [Finding("nccl", "fail", f"an NCCL all-reduce over {count} GPUs failed: {result['error']}{already}",
                        NCCL_FIX + "; NCCL_DEBUG=INFO shows why")]
    return [Finding("nccl", "ok", f"an NCCL all-reduce over {count} GPUs gave the right sum in "
                    f"{result['seconds']:.1f} s")]


def check_ecc(box: Box) -> list:
    if box.nv is None:
        return _no_nvml("ecc", box)
    nv, out = box.nv, []
    unc = getattr(nv, "NVML_MEMORY_ERROR_TYPE_UNCORRECTED", 1)
    for i, h in box.handles:
        volatile = box.call("nvmlDeviceGetTotalEccErrors", h, unc, getattr(nv, "NVML_VOLATILE_ECC", 0))
        if volatile is None:
            out.append(Finding("ecc", "skip", "ECC not reported by this GPU (no ECC memory, or ECC off)", gpu=i))
            continue
        lifetime = box.call("nvmlDeviceGetTotalEccErrors", h, unc, getattr(nv, "NVML_AGGREGATE_ECC", 1)) or 0
        reset = f"sudo nvidia-smi -r -i {i} (no jobs on it) or reboot"
        if volatile:
            out.append(Finding("ecc", "fail", f"{volatile} uncorrected ECC error(s) since the driver loaded",
                               f"stop the jobs on it and reset it: {reset}; if they come back, the card needs "
                               f"service (RMA)", gpu=i))
        rows = box.call("nvmlDeviceGetRemappedRows", h)   # A100 and newer remap rows instead of retiring pages
        if rows is not None:
            corr, uncorr, pending, failure = rows
            if failure:
                out.append(Finding("ecc", "fail", "row remapping failed (no spare rows left)",
                                   "the card needs service (RMA)", gpu=i))
            elif pending:
                out.append(Finding("ecc", "warn", f"remapped rows pending ({corr} correctable, {uncorr} "
                                   f"uncorrectable)", f"reset the GPU to apply them: {reset}", gpu=i))
            elif not volatile:
                out.append(Finding("ecc", "warn" if lifetime else "ok",
                                   f"no uncorrected ECC errors since the driver loaded ({lifetime} in its lifetime); "
                                   f"{corr + uncorr} remapped row(s)",
                                   "watch for new ones: repeated errors mean RMA" if lifetime else "", gpu=i))
            continue
        single = box.call("nvmlDeviceGetRetiredPages", h,
                          getattr(nv, "NVML_PAGE_RETIREMENT_CAUSE_MULTIPLE_SINGLE_BIT_ECC_ERRORS", 0)) or []
        double = box.call("nvmlDeviceGetRetiredPages", h,
                          getattr(nv, "NVML_PAGE_RETIREMENT_CAUSE_DOUBLE_BIT_ECC_ERROR", 1)) or []
        retired = len(single) + len(double)
        pending = box.call("nvmlDeviceGetRetiredPagesPendingStatus", h) == getattr(nv, "NVML_FEATURE_ENABLED", 1)
        if pending:
            out.append(Finding("ecc", "warn", f"{retired} retired page(s), some pending retirement",
                               f"reboot (or {reset}) to retire them", gpu=i))
        elif retired >= 48:   # the driver retires at most 64 pages
            out.append(Finding("ecc", "warn", f"{retired} retired pages, near the limit of 64",
                               "plan to replace the card (RMA)", gpu=i))
        elif not volatile:
            out.append(Finding("ecc", "warn" if lifetime else "ok",
                               f"no uncorrected ECC errors since the driver loaded ({lifetime} in its lifetime); "
                               f"{retired} retired page(s)",
                               "watch for new ones: repeated errors mean RMA" if lifetime else "", gpu=i))
    return out


def check_idle_temperature(box: Box) -> list:
    if box.nv is None:
        return _no_nvml("temperature", box)
    out = []
    for i, h in box.handles:
        temp = box.call("nvmlDeviceGetTemperature", h, getattr(box.nv, "NVML_TEMPERATURE_GPU", 0))
        util, procs = box.busy(h)
        if temp is None:
            out.append(Finding("temperature", "skip", "temperature not reported by this GPU", gpu=i))
        elif util or procs:
            out.append(Finding("temperature", "skip", f"{temp} C while busy ({util or 0}% , {procs} process(es)): "
                               f"the idle temperature needs an idle GPU", gpu=i))
        elif temp > IDLE_HOT_C:
            out.append(Finding("temperature", "warn", f"{temp} C while idle (an idle GPU sits at 30-50 C)",
                               "check the fans (`nvidia-smi -q -d TEMPERATURE,PERFORMANCE`), the case airflow and "
                               "dust", gpu=i))
        else:
            out.append(Finding("temperature", "ok", f"{temp} C while idle", gpu=i))
    return out


# the checks in the order the report lists them: (name, function)
CHECKS = [
    ("driver", check_driver),
    ("cuda", check_cuda_versions),
    ("gpus seen", check_framework_gpus),
    ("pcie", check_pcie),
    ("persistence", check_persistence),
    ("power", check_power),
    ("p2p", check_p2p),
    ("nccl", check_nccl),
    ("ecc", check_ecc),
    ("temperature", check_idle_temperature),
]


def run_checks(*, nccl_timeout: float = probes.NCCL_TIMEOUT_S, probe_timeout: float = probes.PROBE_TIMEOUT_S,
               skip: tuple = ()) -> list:
    """Run every check on this machine; returns the Findings in report order. ``skip``: check names left out
    (e.g. ("nccl",) for a quick look)."""
    names = [n for n, _ in CHECKS]
    unknown = [s for s in skip if s not in names]
    if unknown:
        raise ValueError(f"unknown check(s) to skip: {', '.join(map(repr, unknown))}; the checks are "
                         f"{', '.join(names)}")
    box = Box(nccl_timeout=nccl_timeout, probe_timeout=probe_timeout)
    findings = []
    for name, check in CHECKS:
        if name in skip:
            findings.append(Finding(name, "skip", "left out on request"))
            continue
        try:
            findings.extend(check(box))
        except Exception as exc:  # noqa: BLE001 - one broken check must not hide the others' findings
            findings.append(Finding(name, "warn", f"the check itself failed: {type(exc).__name__}: {exc}",
                                    "please report this with the output of `nvidia-smi -q`"))
    return findings
