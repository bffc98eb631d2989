import math

import pytest

from colabkit.units import format_duration, format_size, parse_duration, parse_size


@pytest.mark.parametrize("value, seconds", [
    (90, 90.0),
    (1.5, 1.5),
    ("90", 90.0),
    (" 45.5 ", 45.5),
    ("90s", 90.0),
    ("15min", 900.0),
    ("15 min", 900.0),
    ("1.5h", 5400.0),
    ("1h30m", 5400.0),
    ("1h 30m 15s", 5415.0),
    ("2 days", 172800.0),
    ("24h", 86400.0),
    ("12H", 43200.0),
    ("1d12h", 129600.0),
])
def test_parse_duration_accepts_documented_forms(value, seconds):
    assert parse_duration(value) == seconds


@pytest.mark.parametrize("value", [
    "", "   ", "h", "12 parsecs", "1h30", "1.5.h", "-1h", "-5", "0", 0, -3, "nan", "inf",
    float("nan"), float("inf"), True, None, [1], "1h-30m",
])
def test_parse_duration_rejects_with_the_name_and_value(value):
    with pytest.raises(ValueError) as info:
        parse_duration(value, name="runtime_cap")
    message = str(info.value)
    assert message.startswith(f"runtime_cap={value!r} ")
    assert '"15min"' in message  # the expected forms are spelled out


@pytest.mark.parametrize("value, size", [
    (0, 0), (1024, 1024), (1.9, 1), ("12", 12), ("12B", 12),
    ("1kb", 1000), ("1KiB", 1024), ("1k", 1024),
    ("512MiB", 512 * 2**20), ("2GB", 2 * 10**9), ("8GiB", 8 * 2**30), ("8 G", 8 * 2**30),
    ("1.5GiB", int(1.5 * 2**30)), ("1TiB", 2**40),
])
def test_parse_size_accepts_documented_forms(value, size):
    assert parse_size(value) == size


@pytest.mark.parametrize("value", ["", "GiB", "8 parsecs", "-1GB", -1, float("inf"), float("nan"), True, None])
def test_parse_size_rejects_with_the_name_and_value(value):
    with pytest.raises(ValueError) as info:
        parse_size(value, name="min_free_memory")
    assert str(info.value).startswith(f"min_free_memory={value!r} ")
    assert '"8GiB"' in str(info.value)


@pytest.mark.parametrize("seconds, text", [
    (0, "0s"), (12, "12s"), (59.4, "59s"), (59.6, "1m 00s"), (250, "4m 10s"),
    (3599.6, "1h 00m"), (3 * 3600 + 5 * 60, "3h 05m"), (43200, "12h 00m"),
    (86400, "1d 00h"), (86400 + 7200, "1d 02h"), (-90, "-1m 30s"),
    (None, "n/a"), (float("nan"), "n/a"), (float("inf"), "n/a"),
])
def test_format_duration(seconds, text):
    assert format_duration(seconds) == text


@pytest.mark.parametrize("n, text", [
    (12, "12 B"), (1023, "1023 B"), (1024, "1.0 KiB"), (300 * 2**20, "300.0 MiB"),
    (1.5 * 2**30, "1.5 GiB"), (2**50, "1024.0 TiB"), (None, "n/a"), (math.inf, "n/a"),
])
def test_format_size(n, text):
    assert format_size(n) == text


@pytest.mark.parametrize("seconds, resolution", [(5, 1), (61, 1), (3661, 60), (43200, 60), (90061, 3600)])
def test_formatted_duration_parses_back_to_within_its_shown_resolution(seconds, resolution):
    text = format_duration(seconds).replace(" ", "")
    assert abs(parse_duration(text) - seconds) < resolution
