"""What energy costs at the user's price, and what the same GPU-hours would cost in the cloud.

The cloud table is dated and small: on-demand prices per GPU-hour (an instance's price divided by its GPUs), and
which cloud GPU each local GPU is compared with. The comparison is a guess about what a user would rent instead
(a consumer RTX 3090/4090 is closest to an A10G/L4-class cloud GPU in memory and speed; it is not the same
chip). Replace or extend it with ``cloud_prices`` in the config file::

    [cloud_prices]
    date = "2026-11"
    currency = "USD"
    "aws g5 (A10G)" = 1.006                  # per GPU-hour
    [cloud_prices.compare]
    "RTX 4090" = "aws g5 (A10G)"             # a part of the local GPU's name -> a price above
"""
from __future__ import annotations

# Sources: AWS EC2 on-demand price list, us-east-1, Linux, as of 2024-06 (instance price / GPUs; AWS lowered
# P4/P5 prices in 2025: check yours); Colab pay-as-you-go: 100 compute units for 9.99 USD, a T4 uses ~1.96
# units/h, an L4 ~4.8, an A100 ~12 (mccormickml.com "Colab GPUs Features & Pricing", units as Colab shows them).
DEFAULT_DATE = "2024-06"
DEFAULT_CURRENCY = "USD"
DEFAULT_PRICES = {
    "aws g4dn (T4)": 0.526,
    "aws g6 (L4)": 0.805,
    "aws g5 (A10G)": 1.006,
    "aws p4d (A100 40GB)": 4.097,
    "aws p5 (H100)": 12.29,
    "colab T4": round(1.96 * 0.0999, 3),
    "colab L4": round(4.8 * 0.0999, 3),
    "colab A100": round(12.0 * 0.0999, 3),
}
# a part of the GPU's name (case-insensitive, first match wins) -> the comparable cloud GPU; a guess
DEFAULT_COMPARE = {
    "H100": "aws p5 (H100)", "H200": "aws p5 (H100)", "H800": "aws p5 (H100)",
    "A100": "aws p4d (A100 40GB)", "A800": "aws p4d (A100 40GB)",
    "T4": "aws g4dn (T4)", "L4": "aws g6 (L4)",
    "": "aws g5 (A10G)",      # consumer and workstation cards (RTX 3090/4090, A5000, A6000, L40...): A10G class
}


class PriceTable:
    """The cloud prices in effect: the built-in table updated by the ``cloud_prices`` setting."""

    def __init__(self, override: dict | None = None):
        override = dict(override or {})
        self.date = str(override.pop("date", DEFAULT_DATE))
        self.currency = str(override.pop("currency", DEFAULT_CURRENCY)).strip().upper()
        compare = override.pop("compare", {}) or {}
        if not isinstance(compare, dict):
            raise ValueError(f"cloud_prices.compare={compare!r}: expected a table of \"GPU name part\" = "
                             f"\"cloud price name\".")
        self.prices = dict(DEFAULT_PRICES)
        for name, value in override.items():
            if isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0:
                raise ValueError(f"cloud_prices.{name}={value!r}: expected a price per GPU-hour, such as 1.006.")
            self.prices[str(name)] = float(value)
        self.compare = {str(k): str(v) for k, v in compare.items()}
        for part, name in self.compare.items():
            if name not in self.prices:
                raise ValueError(f"cloud_prices.compare.{part}={name!r} names no price; known: "
                                 f"{', '.join(self.prices)}.")
        self.compare.update({k: v for k, v in DEFAULT_COMPARE.items() if k not in self.compare})

    def comparable(self, gpu_name: str) -> str:
        """The cloud GPU (a key of ``prices``) compared with ``gpu_name``."""
        low = (gpu_name or "").lower()
        for part, name in self.compare.items():
            if part and part.lower() in low:
                return name
        return self.compare[""]

    def cloud_cost(self, gpu_names: list, gpu_hours: float) -> dict | None:
        """{"cost", "per_gpu_hour", "as", "date", "currency"} for ``gpu_hours`` spread over ``gpu_names``."""
        if not gpu_names or not gpu_hours:
            return None
        per_gpu = gpu_hours / len(gpu_names)
        names = [self.comparable(n) for n in gpu_names]
        cost = sum(self.prices[n] * per_gpu for n in names)
        return {"cost": cost, "per_gpu_hour": cost / gpu_hours, "as": ", ".join(sorted(set(names))),
                "date": self.date, "currency": self.currency}


def price_table(settings=None) -> PriceTable:
    if settings is None:
        from .. import config
        settings = config.load()
    return PriceTable(settings.cloud_prices)


def costs_of(reading: dict, settings=None) -> dict:
    """A meter reading priced: {"money" (None without electricity_price), "currency", "cloud" (see
    PriceTable.cloud_cost), "saved" (cloud cost - money, None when either is missing or in other currencies)}."""
    if settings is None:
        from .. import config
        settings = config.load()
    price = settings.electricity_price
    kwh = reading.get("kwh")
    money = None if price is None or kwh is None else kwh * price
    cloud = PriceTable(settings.cloud_prices).cloud_cost(reading.get("gpus") or [], reading.get("gpu_hours") or 0)
    saved = None
    if cloud is not None and money is not None and cloud["currency"] == settings.currency:
        saved = cloud["cost"] - money
    return {"money": money, "currency": settings.currency, "price_per_kwh": price, "cloud": cloud, "saved": saved}


def num(value: float) -> str:
    """A figure with the digits that matter: 1234, 12.35, 0.0123 (tiny runs still show something)."""
    if value == 0:
        return "0"
    if abs(value) >= 100:
        return f"{value:.0f}"
    if abs(value) >= 1:
        return f"{value:.2f}"
    return f"{value:.3g}"


def line(reading: dict, priced: dict) -> str:
    """One line for people: GPU-hours, kWh, money, cloud equivalent ("~" marks an estimate)."""
    approx = "~" if reading.get("estimate") else ""
    kwh = reading.get("kwh")
    parts = [f"{num(reading.get('gpu_hours') or 0)} GPU-h",
             "kWh n/a" if kwh is None else f"{approx}{num(kwh)} kWh"]
    if priced.get("money") is not None:
        parts.append(f"{approx}{num(priced['money'])} {priced['currency']}")
    cloud = priced.get("cloud")
    if cloud is not None:
        parts.append(f"cloud {num(cloud['cost'])} {cloud['currency']} as {cloud['as']} (prices of {cloud['date']})")
    text = "energy: " + " · ".join(parts)
    if priced.get("money") is None and kwh is not None:
        text += " · set electricity_price (per kWh) to see money"
    return text
