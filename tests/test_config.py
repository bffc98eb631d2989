"""Settings precedence: explicit argument > COLABKIT_* env var > config file > default, with sources."""
import dataclasses
from pathlib import Path

import pytest

from colabkit import config
from colabkit.config import AUTO, ConfigError, load


def write_config(text: str, path: Path = None) -> Path:
    path = path or config.default_config_file()
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")
    return path


def test_defaults_without_file_or_env(monkeypatch):
    monkeypatch.delenv("COLABKIT_FLIGHT_RECORDER")   # set off by tests/conftest.py for the other tests
    settings = load()
    assert settings.drive_root == AUTO
    assert settings.runtime_cap == AUTO
    assert settings.idle_cutoff == AUTO
    assert settings.keep == 3
    assert settings.cache_dir == AUTO
    assert set(settings.sources.values()) == {"default"}
    assert set(settings.sources) == {f.name for f in config.FIELDS}


def test_config_file_lives_in_the_platform_config_dir(monkeypatch, tmp_path):
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "xdg"))
    assert config.default_config_file() == tmp_path / "xdg" / "colabkit" / "config.toml"
    monkeypatch.delenv("XDG_CONFIG_HOME")
    assert config.default_config_file() == Path.home() / ".config" / "colabkit" / "config.toml"
    monkeypatch.setenv("COLABKIT_CONFIG", str(tmp_path / "elsewhere.toml"))
    assert config.default_config_file() == tmp_path / "elsewhere.toml"


def test_cache_dir_auto_resolves_to_the_platform_cache_dir(monkeypatch, tmp_path):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    assert load().resolved_cache_dir() == tmp_path / "cache" / "colabkit"
    assert load(cache_dir=str(tmp_path / "fast")).resolved_cache_dir() == tmp_path / "fast"


def test_file_beats_default():
    path = write_config('keep = 5\nruntime_cap = "24h"\nidle_cutoff = "none"\ndrive_root = "/mnt/gdrive"\n')
    settings = load()
    assert settings.keep == 5
    assert settings.runtime_cap == 86400.0
    assert settings.idle_cutoff is None
    assert settings.drive_root == Path("/mnt/gdrive")
    assert settings.config_file == path
    for name in ("keep", "runtime_cap", "idle_cutoff", "drive_root"):
        assert settings.sources[name] == f"file {path}"
    assert settings.sources["cache_dir"] == "default"


def test_env_beats_file(monkeypatch):
    write_config('keep = 5\nruntime_cap = "24h"\n')
    monkeypatch.setenv("COLABKIT_KEEP", "7")
    settings = load()
    assert settings.keep == 7
    assert settings.sources["keep"] == "env COLABKIT_KEEP"
    assert settings.runtime_cap == 86400.0  # still from the file
    assert settings.sources["runtime_cap"].startswith("file ")


def test_argument_beats_env_and_file(monkeypatch):
    write_config("keep = 5\n")
    monkeypatch.setenv("COLABKIT_KEEP", "7")
    monkeypatch.setenv("COLABKIT_RUNTIME_CAP", "12h")
    settings = load(keep=9, runtime_cap="24h")
    assert (settings.keep, settings.sources["keep"]) == (9, "argument")
    assert (settings.runtime_cap, settings.sources["runtime_cap"]) == (86400.0, "argument")


def test_none_argument_means_not_given(monkeypatch):
    monkeypatch.setenv("COLABKIT_KEEP", "7")
    settings = load(keep=None)
    assert (settings.keep, settings.sources["keep"]) == (7, "env COLABKIT_KEEP")


def test_blank_env_value_is_ignored(monkeypatch):
    write_config("keep = 5\n")
    monkeypatch.setenv("COLABKIT_KEEP", "  ")
    assert load().keep == 5


def test_colabkit_config_names_another_file(monkeypatch, tmp_path):
    other = write_config("keep = 11\n", tmp_path / "team.toml")
    write_config("keep = 5\n")  # the default location is then ignored
    monkeypatch.setenv("COLABKIT_CONFIG", str(other))
    settings = load()
    assert settings.keep == 11
    assert settings.sources["keep"] == f"file {other}"


def test_colabkit_config_naming_a_missing_file_warns_once_and_uses_defaults(monkeypatch, tmp_path):
    monkeypatch.setattr(config, "_WARNED_MISSING", set())
    monkeypatch.setenv("COLABKIT_CONFIG", f" {tmp_path / 'tema.toml'} ")   # stray spaces are ignored
    monkeypatch.setenv("COLABKIT_KEEP", "4")
    with pytest.warns(config.ConfigWarning, match=r"names .*tema\.toml, which does not exist") as caught:
        assert load().keep == 4 and load().sources["keep"] == "env COLABKIT_KEEP"
    assert len(caught) == 1, "one warning per path, not one per load()"


@pytest.mark.parametrize("raw, expected", [
    ("auto", AUTO), ("AUTO", AUTO), ("none", None), ("off", None), ("never", None),
    ("24h", 86400.0), ("90min", 5400.0), ("3600", 3600.0),
])
def test_duration_settings_accept_auto_none_and_durations(monkeypatch, raw, expected):
    monkeypatch.setenv("COLABKIT_RUNTIME_CAP", raw)
    monkeypatch.setenv("COLABKIT_IDLE_CUTOFF", raw)
    settings = load()
    assert settings.runtime_cap == expected
    assert settings.idle_cutoff == expected


def test_numbers_in_the_file_are_seconds():
    write_config("runtime_cap = 7200\nidle_cutoff = 1800.5\n")
    settings = load()
    assert (settings.runtime_cap, settings.idle_cutoff) == (7200.0, 1800.5)


def test_drive_root_expands_the_home_folder(monkeypatch, isolated_env):
    monkeypatch.setenv("COLABKIT_DRIVE_ROOT", "~/gdrive")
    assert load().drive_root == isolated_env / "gdrive"


def test_settings_are_immutable():
    with pytest.raises(dataclasses.FrozenInstanceError):
        load().keep = 4


# ---- bad input: ConfigError naming the variable / file, the value and the expected form ----

@pytest.mark.parametrize("var, value, expected_form", [
    ("COLABKIT_KEEP", "x", "a whole number of at least 1"),
    ("COLABKIT_KEEP", "0", "a whole number of at least 1"),
    ("COLABKIT_KEEP", "2.5", "a whole number of at least 1"),
    ("COLABKIT_KEEP", "-3", "a whole number of at least 1"),
    ("COLABKIT_RUNTIME_CAP", "12 parsecs", '"15min"'),
    ("COLABKIT_RUNTIME_CAP", "-1h", '"15min"'),
    ("COLABKIT_IDLE_CUTOFF", "soon", '"auto", "none"'),
])
def test_bad_env_value_names_variable_value_and_form(monkeypatch, var, value, expected_form):
    monkeypatch.setenv(var, value)
    with pytest.raises(ConfigError) as info:
        load()
    message = str(info.value)
    assert f"environment variable {var}" in message
    assert repr(value) in message
    assert expected_form in message


def test_bad_argument_names_the_argument():
    with pytest.raises(ConfigError, match=r"Bad value 'lots' for keep argument: expected a whole number"):
        load(keep="lots")


def test_unknown_argument_lists_known_settings():
    with pytest.raises(ConfigError) as info:
        load(kepp=3)
    assert "kepp" in str(info.value) and "keep" in str(info.value)


def test_malformed_toml_names_the_file():
    path = write_config("keep = \n[unclosed\n")
    with pytest.raises(ConfigError) as info:
        load()
    message = str(info.value)
    assert str(path) in message
    assert "not valid TOML" in message
    assert "keep = 5" in message  # shows the expected form


def test_non_utf8_file_names_the_file():
    path = config.default_config_file()
    path.parent.mkdir(parents=True)
    path.write_bytes(b'keep = 5\n\xff\xfe = 1\n')
    with pytest.raises(ConfigError) as info:
        load()
    assert str(path) in str(info.value)


def test_unreadable_file_names_the_file():
    path = config.default_config_file()
    path.mkdir(parents=True)  # a folder where the file should be: open() fails
    with pytest.raises(ConfigError) as info:
        load()
    assert f"Cannot read the colabkit config file {path}" in str(info.value)
    assert "COLABKIT_CONFIG" in str(info.value)


def test_unknown_key_in_file_names_file_and_key():
    path = write_config('keep = 5\nruntime_cpa = "24h"\n')
    with pytest.raises(ConfigError) as info:
        load()
    message = str(info.value)
    assert str(path) in message and "runtime_cpa" in message and "runtime_cap" in message


@pytest.mark.parametrize("line, name, shown", [
    ('keep = "many"', "keep", "'many'"),
    ("keep = 0", "keep", "0"),
    ("keep = true", "keep", "True"),
    ('runtime_cap = "forever-ish"', "runtime_cap", "'forever-ish'"),
    ("drive_root = 3", "drive_root", "3"),
    ('drive_root = ""', "drive_root", "''"),
])
def test_bad_value_in_file_names_setting_file_and_value(line, name, shown):
    path = write_config(line + "\n")
    with pytest.raises(ConfigError) as info:
        load()
    assert str(info.value).startswith(f"Bad value {shown} for {name} in {path}: expected ")


def test_a_bad_env_value_wins_over_a_good_file_value(monkeypatch):
    # The env var has precedence, so its bad value must be reported, not silently skipped.
    write_config("keep = 5\n")
    monkeypatch.setenv("COLABKIT_KEEP", "five")
    with pytest.raises(ConfigError, match="COLABKIT_KEEP"):
        load()


def test_config_error_is_a_value_error():
    assert issubclass(ConfigError, ValueError)
