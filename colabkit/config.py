"""Settings with one precedence: explicit arguments > COLABKIT_* environment variables > config file > defaults.

The config file is TOML (``~/.config/colabkit/config.toml`` on Linux, the platform's config dir elsewhere,
or the file named by ``COLABKIT_CONFIG``)::

    drive_root = "/mnt/gdrive"
    runtime_cap = "24h"      # Colab Pro
    idle_cutoff = "90min"
    keep = 5
"""
from __future__ import annotations

import dataclasses
import os
import sys
import warnings
from pathlib import Path
from typing import Any
from collections.abc import Callable

from .units import DURATION_FORMS, parse_duration

AUTO = "auto"


class ConfigError(ValueError):
    """A setting has a value colabkit cannot use; the message names where it came from and the expected form."""


class ConfigWarning(UserWarning):
    """The configuration is usable but probably not what was meant (e.g. COLABKIT_CONFIG names no file)."""


_WARNED_MISSING: set = set()


def _duration_or_auto(value: Any, name: str):
    """'auto' (platform default), 'none'/'off' (no limit) or a duration in seconds."""
    if isinstance(value, str) and value.strip().lower() == AUTO:
        return AUTO
    if value is None or (isinstance(value, str) and value.strip().lower() in ("none", "off", "never")):
        return None
    return parse_duration(value, name=name)


def _duration(value: Any, name: str) -> float:
    return parse_duration(value, name=name)


def _positive_int(value: Any, name: str) -> int:
    try:
        number = int(str(value).strip()) if not isinstance(value, bool) else None
    except ValueError:
        number = None
    if number is None or number < 1 or (isinstance(value, float) and value != number):
        raise ValueError(f"{name}={value!r} must be a whole number of at least 1.")
    return number


def _bool(value: Any, name: str) -> bool:
    text = str(value).strip().lower()
    if isinstance(value, bool) or text in ("true", "false", "1", "0", "yes", "no", "on", "off"):
        return value if isinstance(value, bool) else text in ("true", "1", "yes", "on")
    raise ValueError(f"{name}={value!r} must be true or false.")


def _megabytes(value: Any, name: str) -> float:
    try:
        number = float(str(value).strip()) if not isinstance(value, bool) else None
    except ValueError:
        number = None
    if number is None or not number >= 0 or number == float("inf"):
        raise ValueError(f"{name}={value!r} must be a number of megabytes, 0 or more (e.g. 64).")
    return number


def _path_or_auto(value: Any, name: str):
    if not isinstance(value, (str, os.PathLike)) or not str(value).strip():
        raise ValueError(f"{name}={value!r} must be a folder path (or \"auto\").")
    if str(value).strip().lower() == AUTO:
        return AUTO
    return Path(os.path.expanduser(str(value)))


def _drive_via(value: Any, name: str) -> str:
    text = str(value).strip().lower()
    if text not in ("mount", "api"):
        raise ValueError(f"{name}={value!r} must be \"mount\" or \"api\".")
    return text


def _claims_folder(value: Any, name: str):
    """"auto" (the machine-wide default folder), "off" (no claims) or a folder every user of the machine sees."""
    text = str(value).strip() if isinstance(value, (str, os.PathLike)) else ""
    if isinstance(value, bool) or not text:
        raise ValueError(f"{name}={value!r} must be \"auto\", \"off\" or a folder path.")
    if text.lower() in (AUTO, "off", "none", "false", "no"):
        return AUTO if text.lower() == AUTO else "off"
    return Path(os.path.expanduser(text))


def _size(value: Any, name: str) -> int:
    from .units import parse_size
    return parse_size(value, name=name)


def _price_or_none(value: Any, name: str):
    """A price per kWh (a number, 0 or more), or "none" (only kWh are shown)."""
    if value is None or (isinstance(value, str) and value.strip().lower() in ("", "none", "off")):
        return None
    try:
        number = float(str(value).strip()) if not isinstance(value, bool) else None
    except ValueError:
        number = None
    if number is None or not 0 <= number < float("inf"):
        raise ValueError(f"{name}={value!r} must be a price per kWh such as 0.30, or \"none\".")
    return number


def _text(value: Any, name: str) -> str:
    if not isinstance(value, str) or not value.strip():
        raise ValueError(f"{name}={value!r} must be a non-empty text.")
    return value.strip()


def _currency(value: Any, name: str) -> str:
    """A currency code, upper case ("eur" and "EUR" are one currency when prices are compared)."""
    return _text(value, name).upper()


def _text_or_none(value: Any, name: str):
    return None if isinstance(value, str) and value.strip().lower() in ("", "none") else _text(value, name)


def _path_or_none(value: Any, name: str):
    if isinstance(value, str) and value.strip().lower() in ("auto", "none", ""):
        return None
    if not isinstance(value, (str, os.PathLike)):
        raise ValueError(f"{name}={value!r} must be a file path (or \"auto\").")
    return Path(os.path.expanduser(str(value)))


def _cloud_prices(value: Any, name: str) -> dict:
    """A TOML table ([cloud_prices] in the config file) or the path of a TOML file holding one."""
    if isinstance(value, (str, os.PathLike)):
        path = Path(os.path.expanduser(str(value)))
        try:
            import tomllib
            with open(path, "rb") as fh:
                value = tomllib.load(fh)
        except (OSError, ValueError) as exc:
            raise ValueError(f"{name}={str(path)!r} cannot be read as TOML ({exc}).") from None
        value = value.get("cloud_prices", value)
    if not isinstance(value, dict):
        raise ValueError(f"{name}={value!r} must be a table of prices per GPU-hour.")
    for key, price in value.items():
        if key in ("date", "currency", "compare"):
            continue
        if isinstance(price, bool) or not isinstance(price, (int, float)) or price < 0:
            raise ValueError(f"{name}.{key}={price!r} must be a price per GPU-hour such as 1.006.")
    return dict(value)
def _duration_or_zero(value: Any, name: str) -> float:
    """A duration in seconds, or 0 (at once)."""
    if not isinstance(value, bool) and str(value).strip() in ("0", "0.0", "0s"):
        return 0.0
    return parse_duration(value, name=name)


def _temperature_or_none(value: Any, name: str):
    """None ("none"/"off") or a GPU temperature in C (20 to 120)."""
    if value is None or (isinstance(value, str) and value.strip().lower() in ("none", "off")):
        return None
    number = _number(value)
    if number is None or not 20 <= number <= 120:
        raise ValueError(f"{name}={value!r} must be a GPU temperature in C between 20 and 120, or \"none\".")
    return _whole(number)


def _degrees(value: Any, name: str) -> float:
    number = _number(value)
    if number is None or not 0 < number <= 50:
        raise ValueError(f"{name}={value!r} must be a number of degrees C above 0 and at most 50 (e.g. 5).")
    return _whole(number)


def _power_limit(value: Any, name: str):
    """None ("off") or "250W" / "80%": a power limit for a hot GPU, in watts or % of its default limit (see
    power_limit_parts)."""
    text = str(value).strip().lower() if value is not None and not isinstance(value, bool) else "off"
    if value is None or text in ("off", "none"):
        return None
    unit = "%" if text.endswith("%") else "W"
    number = _number(text.rstrip("%w").strip())
    if number is None or number <= 0 or (unit == "%" and number > 100):
        raise ValueError(f"{name}={value!r} must be \"off\", watts (\"250W\") or a share of the default "
                         f"limit (\"80%\").")
    return f"{_whole(number)}{unit}"


def power_limit_parts(text: str) -> tuple:
    """(number, "W" | "%") of a parsed thermal_power_limit ("250W", "80%")."""
    return float(text[:-1]), text[-1]


def _whole(number: float):
    """An int where the number is whole (shown as 83, not 83.0)."""
    return int(number) if number == int(number) else number


def _number(value: Any) -> float | None:
    if isinstance(value, bool):
        return None
    try:
        number = float(str(value).strip())
    except ValueError:
        return None
    return number if number == number and number not in (float("inf"), float("-inf")) else None


@dataclasses.dataclass(frozen=True)
class _Field:
    name: str
    parse: Callable[[Any, str], Any]
    default: Any
    forms: str
    help: str

    @property
    def env_var(self) -> str:
        return "COLABKIT_" + self.name.upper()


FIELDS = (
    _Field("drive_root", _path_or_auto, AUTO, 'a folder path, or "auto"',
           'What "drive:" means off Colab (a Google Drive for desktop folder, an rclone mount, any folder). '
           "auto: /content/drive/MyDrive on Colab (mounted on first use), ~/colabkit-drive elsewhere."),
    _Field("runtime_cap", _duration_or_auto, AUTO, f'"auto", "none" or {DURATION_FORMS}',
           "How long the VM may live. auto: 12h on Colab (set 24h for Pro), 12h on Kaggle, none elsewhere."),
    _Field("idle_cutoff", _duration_or_auto, AUTO, f'"auto", "none" or {DURATION_FORMS}',
           "How long a runtime survives with no browser attached. auto: 90min on Colab, none elsewhere."),
    _Field("keep", _positive_int, 3, "a whole number of at least 1",
           "How many committed checkpoints to keep per checkpoint folder."),
    _Field("read_timeout", _duration, 120.0, DURATION_FORMS,
           "How long restoring retries a checkpoint folder it cannot read (a dropped Drive mount) before it "
           "stops with an error, instead of starting over."),
    _Field("snapshot_buffers", _positive_int, 1, "a whole number of at least 1",
           "Sets of host buffers (each the size of the training state) AutoResume snapshots into. 1: a save "
           "due while the previous snapshot is still being written is taken at a later batch, when that write "
           "is done; 2 or more: it is taken at once into a spare set, for that much more memory."),
    _Field("small_state_mb", _megabytes, 16.0, "a number of megabytes, 0 or more",
           "Training states up to this size are saved at every batch a save is due: a periodic save waits for "
           "what is left of the previous snapshot's write (at most one durable write of the state: up to "
           "~0.1 s at 16 MB) instead of moving to a later batch. 0: periodic saves never wait."),
    _Field("cache_dir", _path_or_auto, AUTO, 'a folder path, or "auto"',
           "Fast local disk for checkpoint staging. auto: the platform cache dir (~/.cache/colabkit on Linux)."),
    _Field("memory_growth", _bool, True, "true or false",
           "TensorFlow memory growth on the GPUs colabkit.use_gpus / colabkit run choose (TF_FORCE_GPU_ALLOW_GROWTH)."),
    _Field("gpu_claims", _claims_folder, AUTO, '"auto", "off" or a folder path',
           "Where GPU claims live, so that notebooks, scripts, `colabkit run` and other users of this machine never "
           "get the same GPU. auto: /tmp/colabkit-gpu-claims (created with mode 1777); off on Colab and Kaggle. "
           "off: no claims (use_gpus picks as if alone)."),
    _Field("gpu_foreign_memory", _size, 256 * 2 ** 20, 'a size such as "256MiB"',
           "A compute process that uses more GPU memory than this and belongs to no GPU claim (a program that does "
           "not use colabkit) keeps its GPU out of use_gpus' pick."),
    _Field("drive_via", _drive_via, "mount", '"mount" or "api"',
           'How "drive:" paths reach Google Drive. mount: the drive_root folder; api: the Drive API, as '
           '"gdrive://" (for machines without a mount; sign in with `colabkit drive login`).'),
    _Field("drive_credentials", _path_or_auto, AUTO, 'a file path, or "auto"',
           "Drive API credentials (a service-account key, or tokens saved by `colabkit drive login`; kept 0600). "
           "auto: drive-credentials.json next to the config file."),
    # the flight recorder (colabkit/health/recorder.py, `colabkit health --last`)
    _Field("flight_recorder", _bool, True, "true or false",
           "While training runs, record GPU temperatures, power, clocks, throttling and host load into a small "
           "ring file under cache_dir/flight, read back after a freeze by `colabkit health --last`."),
    _Field("flight_sample_every", _duration, 2.0, DURATION_FORMS, "How often the flight recorder takes a sample."),
    _Field("flight_sync_every", _duration, 5.0, DURATION_FORMS,
           "How often the flight recorder's samples are forced to disk (what a power loss can lose at most)."),
    _Field("flight_ring_size", _size, 4 * 2 ** 20, 'a size such as "4MiB" (at least 64KiB)',
           "The flight recorder's file size; it never grows (4 MiB: about 12 hours with two GPUs). A new size "
           "starts a new file."),
    # what a run cost (colabkit.health.energy, prices, ledger)
    _Field("electricity_price", _price_or_none, None, 'a price per kWh such as 0.30, or "none"',
           "What a kWh costs you; none: reports show kWh, not money."),
    _Field("currency", _currency, "USD", "a currency code such as \"EUR\"",
           "The currency of electricity_price (cloud prices are compared only in the same currency)."),
    _Field("project", _text_or_none, None, "a name, or \"none\"",
           "The project runs are booked under in the cost ledger. none: the run's checkpoint folder name, "
           "a job's name under `colabkit run`, else the working directory's name."),
    _Field("ledger", _path_or_none, None, 'a file path, or "auto"',
           "The cost ledger (JSON lines) every run appends to. auto: ~/.local/share/colabkit/ledger.jsonl "
           "($XDG_DATA_HOME/colabkit)."),
    _Field("cloud_prices", _cloud_prices, {}, "a [cloud_prices] table, or the path of a TOML file with one",
           "Cloud prices per GPU-hour that replace or extend the built-in dated table, and [cloud_prices.compare] "
           "to say which one a local GPU is compared with (see colabkit.health.prices)."),
    # the thermal guard (colabkit.health.thermal): pause training between steps while a GPU is too hot
    _Field("thermal_guard", _bool, True, "true or false",
           "Pause training between steps while a GPU it uses stays in thermal slowdown (or above "
           "max_gpu_temperature), until it cools; every AutoResume and `colabkit run`."),
    _Field("max_gpu_temperature", _temperature_or_none, None, 'a temperature in C (20 to 120), or "none"',
           "Also pause while a GPU stays above this temperature. none: pause on thermal slowdown only."),
    _Field("thermal_resume_margin", _degrees, 5, "degrees C above 0, at most 50",
           "A paused GPU must cool this far below max_gpu_temperature (or its slowdown threshold) to resume."),
    _Field("thermal_slowdown_for", _duration_or_zero, 30.0, f"0 or {DURATION_FORMS}",
           "How long a GPU must stay in thermal slowdown (or above max_gpu_temperature) before training pauses."),
    _Field("thermal_power_limit", _power_limit, None, '"off", watts ("250W") or a percentage ("80%")',
           "While a GPU is too hot, also lower its power limit to this (needs root; within the board's limits); "
           "the old limit is put back when training ends. off: never touch power limits."),
)
_BY_NAME = {f.name: f for f in FIELDS}


@dataclasses.dataclass(frozen=True)
class Settings:
    """Effective settings. ``sources[name]`` says where each value came from."""
    drive_root: Any
    runtime_cap: Any
    idle_cutoff: Any
    keep: int
    cache_dir: Any
    config_file: Path
    sources: dict
    memory_growth: bool = True
    drive_via: str = "mount"
    drive_credentials: Any = AUTO
    read_timeout: float = 120.0
    snapshot_buffers: int = 1
    small_state_mb: float = 16.0
    gpu_claims: Any = AUTO
    gpu_foreign_memory: int = 256 * 2 ** 20
    flight_recorder: bool = True
    flight_sample_every: float = 2.0
    flight_sync_every: float = 5.0
    flight_ring_size: int = 4 * 2 ** 20
    electricity_price: Any = None
    currency: str = "USD"
    project: Any = None
    ledger: Any = None
    cloud_prices: Any = dataclasses.field(default_factory=dict)
    thermal_guard: bool = True
    max_gpu_temperature: Any = None
    thermal_resume_margin: float = 5
    thermal_slowdown_for: float = 30.0
    thermal_power_limit: Any = None

    def resolved_cache_dir(self) -> Path:
        return default_cache_dir() if self.cache_dir == AUTO else self.cache_dir


def default_config_file() -> Path:
    """COLABKIT_CONFIG, else the platform's per-user config dir."""
    explicit = os.environ.get("COLABKIT_CONFIG", "").strip()
    if explicit:
        return Path(os.path.expanduser(explicit))
    if sys.platform == "win32":
        base = Path(os.environ.get("APPDATA") or Path.home() / "AppData" / "Roaming")
    elif sys.platform == "darwin":
        base = Path.home() / "Library" / "Application Support"
    else:
        base = Path(os.environ.get("XDG_CONFIG_HOME") or Path.home() / ".config")
    return base / "colabkit" / "config.toml"


def default_cache_dir() -> Path:
    if sys.platform == "win32":
        base = Path(os.environ.get("LOCALAPPDATA") or Path.home() / "AppData" / "Local")
    elif sys.platform == "darwin":
        base = Path.home() / "Library" / "Caches"
    else:
        base = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return base / "colabkit"


def _read_file(path: Path) -> dict:
    if not path.exists():
        explicit = os.environ.get("COLABKIT_CONFIG", "").strip()
        if explicit and str(path) not in _WARNED_MISSING:  # a typo would otherwise drop every setting silently
            _WARNED_MISSING.add(str(path))
            warnings.warn(f"COLABKIT_CONFIG={explicit!r} names {path.absolute()}, which does not exist; using "
                          f"the defaults and COLABKIT_* variables. Fix the path, create the file, or unset "
                          f"COLABKIT_CONFIG.", ConfigWarning, stacklevel=3)
        return {}
    if sys.version_info >= (3, 11):
        import tomllib
    else:  # pragma: no cover - exercised on 3.10 only
        import tomli as tomllib
    try:
        with open(path, "rb") as fh:
            data = tomllib.load(fh)
    except OSError as exc:
        raise ConfigError(f"Cannot read the colabkit config file {path}: {exc.strerror or exc}. "
                          f"Fix its permissions, or point COLABKIT_CONFIG at another file.") from None
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise ConfigError(f"The colabkit config file {path} is not valid TOML ({exc}). "
                          f"Expected UTF-8 text with lines such as: keep = 5 / runtime_cap = \"24h\".") from None
    unknown = sorted(set(data) - set(_BY_NAME))
    if unknown:
        raise ConfigError(f"The colabkit config file {path} has unknown setting(s) {', '.join(unknown)}; "
                          f"known settings: {', '.join(_BY_NAME)}.")
    return data


def check(name: str, value: Any):
    """``value`` for setting ``name``, parsed as the config file's would be (an explicit argument). Raises ConfigError
    naming the argument and the expected form."""
    field = _BY_NAME[name]
    try:
        return field.parse(value, name)
    except ValueError:
        raise ConfigError(f"Bad value {value!r} for the {name} argument: expected {field.forms}.") from None


def load(**overrides) -> Settings:
    """The effective settings; keyword arguments are explicit values that win over everything else.

    Raises ConfigError naming the file, variable or argument that holds a bad value.
    """
    unknown = sorted(set(overrides) - set(_BY_NAME))
    if unknown:
        raise ConfigError(f"Unknown setting(s) {', '.join(unknown)}; known settings: {', '.join(_BY_NAME)}.")
    path = default_config_file()
    from_file = _read_file(path)
    values, sources = {}, {}
    for field in FIELDS:
        if overrides.get(field.name) is not None:
            raw, source, label = overrides[field.name], "argument", f"{field.name} argument"
        elif os.environ.get(field.env_var, "").strip():
            raw = os.environ[field.env_var]
            source, label = f"env {field.env_var}", f"environment variable {field.env_var}"
        elif field.name in from_file:
            raw, source, label = from_file[field.name], f"file {path}", f"{field.name} in {path}"
        else:
            values[field.name], sources[field.name] = field.default, "default"
            continue
        try:
            values[field.name] = field.parse(raw, field.name)
        except ValueError:
            raise ConfigError(f"Bad value {raw!r} for {label}: expected {field.forms}.") from None
        sources[field.name] = source
    return Settings(**values, config_file=path, sources=sources)
