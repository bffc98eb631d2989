"""Verdicts: one line each that names the evidence and what to try, from a monitor's measurements.

Input-bound thresholds are the TensorFlow Profiler's input-pipeline analyzer's: input >= 20% of step time is
"highly input-bound", >= 5% "moderately". The advice depends on the input kind in use (a table, not a chain
of ifs). Thermal/power verdicts name the limit that bites, the share of time it did, and the GPU's slowdown
temperature. A GPU that sits mostly idle while the host CPU is saturated is said too.
"""
from __future__ import annotations

import dataclasses

HIGHLY_INPUT_BOUND = 0.20
MODERATELY_INPUT_BOUND = 0.05
THROTTLED_SHARE = 0.05     # throttled at least this share of the time: worth a verdict
IDLE_GPU_UTILIZATION = 50.0
SATURATED_CPU = 85.0

INPUT_ADVICE = {
    "tf.data": ("end the pipeline with .prefetch(tf.data.AUTOTUNE); use .map(fn, num_parallel_calls="
                "tf.data.AUTOTUNE); .cache() after loading/decoding if it fits in RAM (or a file); "
                ".interleave(..., num_parallel_calls=tf.data.AUTOTUNE) to read many files at once; move "
                "augmentation into the model as Keras preprocessing layers (they run on the GPU)"),
    "numpy": ("NumPy arrays are sliced and copied on the host every step: wrap them in tf.data."
              "Dataset.from_tensor_slices((x, y)).shuffle(...).batch(B).prefetch(tf.data.AUTOTUNE), and do "
              "augmentation as Keras preprocessing layers inside the model"),
    "generator": ("a Python generator runs in one thread under the GIL: move the loading to tf.data "
                  "(from_tensor_slices(files).map(load, num_parallel_calls=tf.data.AUTOTUNE).prefetch"
                  "(tf.data.AUTOTUNE)), or make it a keras.utils.PyDataset with workers=N, "
                  "use_multiprocessing=True"),
    "PyDataset": ("give the PyDataset workers=N (and use_multiprocessing=True for CPU-heavy Python), or "
                  "move the loading to tf.data with num_parallel_calls=tf.data.AUTOTUNE"),
    "DataLoader": ("give the DataLoader num_workers=N (about the CPU count), pin_memory=True, "
                   "persistent_workers=True, and do augmentation on the GPU"),
    "unknown": ("load and preprocess in parallel and ahead of the step (tf.data with prefetch and "
                "num_parallel_calls=AUTOTUNE, or DataLoader/PyDataset workers); move augmentation onto the GPU"),
}

THROTTLE_ADVICE = {
    "thermal": ("improve airflow (case fans, space around the card, dust, a cooler room) or lower the power "
                "limit a little (sudo nvidia-smi -pl WATTS): a lower limit costs less speed than thermal "
                "throttling"),
    "sw_power_cap": ("the card draws its power limit: normal at full load; if the limit was lowered "
                     "(nvidia-smi -q -d POWER), raise it back, or accept it"),
    "hw_power_brake_slowdown": ("an external power brake: the power supply or its cables cannot deliver "
                                "enough; check the PSU's rating and that every power connector is plugged in"),
    "hw_slowdown": ("hardware slowdown (temperature or power supply): check cooling and the power supply"),
}
REASON_WORDS = {"sw_thermal_slowdown": "SW thermal slowdown", "hw_thermal_slowdown": "HW thermal slowdown",
                "sw_power_cap": "SW power cap", "hw_power_brake_slowdown": "HW power brake",
                "hw_slowdown": "HW slowdown"}


@dataclasses.dataclass
class Verdict:
    kind: str        # "input", "throttle", "idle_gpu", "ok"
    severity: str    # "high", "moderate", "info"
    text: str

    def as_dict(self) -> dict:
        return dataclasses.asdict(self)


def input_verdict(input_fraction, step_time_s, input_kind: str, samples: int) -> Verdict | None:
    if input_fraction is None:
        return None
    share = f"{input_fraction:.0%} of each {step_time_s * 1000:.1f} ms step" if step_time_s else \
        f"{input_fraction:.0%} of step time"
    kind = input_kind if input_kind in INPUT_ADVICE else "unknown"
    where = {"tf.data": "the tf.data pipeline", "numpy": "NumPy arrays", "generator": "a Python generator",
             "PyDataset": "a PyDataset", "DataLoader": "a DataLoader"}.get(kind, "the input")
    if input_fraction >= HIGHLY_INPUT_BOUND:
        return Verdict("input", "high", f"highly input-bound: waiting for input ({where}) takes {share} "
                                        f"(measured over {samples} steps; >= 20% is highly input-bound). Try: "
                                        f"{INPUT_ADVICE[kind]}.")
    if input_fraction >= MODERATELY_INPUT_BOUND:
        return Verdict("input", "moderate", f"moderately input-bound: waiting for input ({where}) takes {share} "
                                            f"(measured over {samples} steps; 5-20% is moderately input-bound). "
                                            f"Try: {INPUT_ADVICE[kind]}.")
    return Verdict("ok", "info", f"compute-bound: input takes {share} (under 5%, measured over {samples} steps); "
                                 f"a faster input pipeline would not speed this up")


def throttle_verdicts(window: dict) -> list:
    out = []
    for gpu in window.get("gpus", []):
        violation = gpu.get("violation") or {}
        reasons = gpu.get("reasons") or {}
        thermal_share = violation.get("thermal")
        if thermal_share is None:
            thermal_share = max([reasons.get(r, 0.0) for r in ("sw_thermal_slowdown", "hw_thermal_slowdown")])
        power_share = violation.get("power")
        if power_share is None:
            power_share = max([reasons.get(r, 0.0) for r in ("sw_power_cap", "hw_power_brake_slowdown")])
        label = f"GPU {gpu['index']} ({gpu['name']})"
        slowdown = (gpu.get("thresholds") or {}).get("slowdown")
        temp = gpu.get("temperature_max")
        if thermal_share >= THROTTLED_SHARE:
            which = [REASON_WORDS[r] for r in ("hw_thermal_slowdown", "sw_thermal_slowdown") if reasons.get(r)]
            limit = f" (slowdown temperature {slowdown:.0f} C)" if slowdown is not None else ""
            at = f" at up to {temp:.0f} C{limit}" if temp is not None else limit
            out.append(Verdict("throttle", "high" if thermal_share >= 0.2 else "moderate",
                               f"thermal throttling: {label} was slowed by {' and '.join(which) or 'thermal limits'} "
                               f"{thermal_share:.0%} of the time{at}. Try: {THROTTLE_ADVICE['thermal']}."))
        if power_share >= THROTTLED_SHARE:
            brake = reasons.get("hw_power_brake_slowdown")
            key = "hw_power_brake_slowdown" if brake else "sw_power_cap"
            draw = gpu.get("power")
            limit = gpu.get("power_limit")
            watts = f" ({draw:.0f} W of a {limit:.0f} W limit)" if draw is not None and limit else ""
            out.append(Verdict("throttle", "moderate" if key == "sw_power_cap" else "high",
                               f"power-limited: {label} was held back by the {REASON_WORDS[key]} "
                               f"{power_share:.0%} of the time{watts}. Try: {THROTTLE_ADVICE[key]}."))
        if reasons.get("hw_slowdown", 0.0) >= THROTTLED_SHARE and thermal_share < THROTTLED_SHARE and \
                power_share < THROTTLED_SHARE:
            out.append(Verdict("throttle", "high", f"hardware slowdown: {label} was slowed (HW slowdown) "
                                                   f"{reasons['hw_slowdown']:.0%} of the samples. Try: "
                                                   f"{THROTTLE_ADVICE['hw_slowdown']}."))
    return out


def idle_gpu_verdict(window: dict, input_fraction) -> Verdict | None:
    cpu = (window.get("host") or {}).get("cpu_percent")
    utils = [g["utilization"] for g in window.get("gpus", []) if g.get("utilization") is not None]
    if cpu is None or not utils or max(utils) >= IDLE_GPU_UTILIZATION or cpu < SATURATED_CPU:
        return None
    waits = "" if input_fraction is None else f"; waiting for input takes {input_fraction:.0%} of each step"
    return Verdict("idle_gpu", "high", f"the GPU is idle much of the time (busy {max(utils):.0f}%) while the host "
                                       f"CPU is saturated ({cpu:.0f}%){waits}: the CPU side (input preprocessing, "
                                       f"Python "
                                       f"in the step) is the bottleneck; move preprocessing onto the GPU (Keras "
                                       f"preprocessing layers) or parallelize it (tf.data AUTOTUNE, workers)")
