"""Import costs nothing: no framework, Drive client, NVML or google.colab is imported by `import colabkit` or
`%load_ext colabkit` (checked in fresh interpreters), public names resolve lazily, and a missing optional
dependency names the extra to install."""
import ast
import configparser
import importlib
import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

import colabkit

REPO = Path(__file__).resolve().parent.parent
FORBIDDEN = ("tensorflow", "keras", "torch", "jax", "pydrive2", "gdown", "pynvml", "google.colab", "matplotlib",
             "psutil", "ipywidgets", "blake3")

PROBE = """
import json, sys
{code}
forbidden = {forbidden!r}
loaded = sorted(m for m in sys.modules if any(m == f or m.startswith(f + ".") for f in forbidden))
ours = sorted(m for m in sys.modules if m == "colabkit" or m.startswith("colabkit."))
print("PROBE" + json.dumps({{"forbidden": loaded, "colabkit_modules": ours}}))
"""

SHELL = """
from IPython.core.interactiveshell import InteractiveShell
shell = InteractiveShell.instance()
for line in {lines!r}:
    result = shell.run_cell(line)
    assert result.success, (line, result.error_before_exec or result.error_in_exec)
"""


def probe(code: str) -> dict:
    """Run `code` in a fresh interpreter; return which forbidden and which colabkit modules it loaded."""
    out = subprocess.run([sys.executable, "-c", PROBE.format(code=code, forbidden=FORBIDDEN)],
                         capture_output=True, text=True, timeout=120, cwd=REPO)
    assert out.returncode == 0, out.stderr
    line = [ln for ln in out.stdout.splitlines() if ln.startswith("PROBE")][-1]
    return json.loads(line[len("PROBE"):])


def test_the_forbidden_packages_are_installed_or_standin_available(colab_standin):
    # Otherwise "not imported" would hold trivially. The dev extra installs torch; jax is not required.
    for name in ("tensorflow", "keras", "torch"):
        if importlib.util.find_spec(name) is None:
            pytest.skip(f"{name} is not installed here; the guarantee cannot be checked for it")
    assert importlib.util.find_spec("google.colab") is not None  # the stand-in


def test_probe_notices_a_forbidden_import(colab_standin):
    # Control: the probe does report an import of google.colab (the stand-in) when it happens.
    loaded = probe("import colabkit, google.colab")["forbidden"]
    assert "google.colab" in loaded and "google.colab.drive" in loaded
    assert all(m.startswith("google.colab") for m in loaded)


def test_import_colabkit_loads_nothing_heavy(colab_standin):
    result = probe("import colabkit")
    assert result["forbidden"] == []
    assert result["colabkit_modules"] == ["colabkit", "colabkit._version"]


def test_env_and_status_load_no_framework(colab_standin):
    result = probe("import colabkit\ncolabkit.env()\ncolabkit.status().text()\ncolabkit.settings()")
    assert result["forbidden"] == []


def test_load_ext_and_magic_load_no_framework(colab_standin):
    code = SHELL.format(lines=["%load_ext colabkit", "%colabkit", "%colabkit config", "%colabkit --json"])
    assert probe(code)["forbidden"] == []


def test_cli_status_and_config_load_no_framework(colab_standin):
    code = "from colabkit import cli\ncli.main(['status'])\ncli.main(['status', '--json'])\ncli.main(['config'])"
    assert probe(code)["forbidden"] == []


def test_lazy_public_names_resolve():
    from colabkit import config, runtime, summary
    assert colabkit.env is runtime.env
    assert colabkit.Environment is runtime.Environment
    assert colabkit.status is summary.status
    assert colabkit.settings is config.load
    assert colabkit.ConfigError is config.ConfigError
    assert colabkit.config is config
    assert {"env", "status", "settings", "Checkpoints", "keras"} <= set(dir(colabkit))
    assert set(colabkit._LAZY) <= set(colabkit.__all__)


def test_unknown_attribute_is_an_attribute_error():
    with pytest.raises(AttributeError, match="no attribute 'no_such_thing'"):
        colabkit.no_such_thing
    assert not hasattr(colabkit, "no_such_thing")


def test_no_lazy_function_shares_its_name_with_a_plain_submodule():
    # Importing submodule colabkit.X sets the package attribute X to the module, replacing a lazily bound
    # function of the same name (colabkit.status() once failed with "'module' object is not callable").
    # A clash is safe only if the module itself is callable (keepalive.py / presence.py do that).
    clashes = [name for name, (module, attr) in colabkit._LAZY.items()
               if attr is not None and importlib.util.find_spec(f"colabkit.{name}") is not None
               and not callable(importlib.import_module(f"colabkit.{name}"))]
    assert clashes == []


def test_status_stays_a_function_after_the_magic_and_cli_ran():
    code = ("import colabkit\nfrom colabkit import cli, magics\ncli.main(['status', '--json'])\n"
            "print(type(colabkit.status()).__name__)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, cwd=REPO)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip().splitlines()[-1] == "Status"


# ---- missing optional dependencies ----

def test_require_names_the_extra_to_install():
    from colabkit.optional import require
    with pytest.raises(ImportError) as info:
        require("colabkit_no_such_package", "gpu", "Listing GPUs")
    message = str(info.value)
    assert message.startswith("Listing GPUs needs the Python package 'colabkit_no_such_package'")
    assert message.endswith('Install it with: pip install "colabkit[gpu]"')


def test_require_with_a_blocked_installed_package(monkeypatch):
    from colabkit.optional import require
    monkeypatch.setitem(sys.modules, "pynvml", None)  # as if nvidia-ml-py were not installed
    with pytest.raises(ImportError, match=r'pip install "colabkit\[gpu\]"'):
        require("pynvml", "gpu", "Querying GPUs through NVML")


def test_require_returns_the_module_when_present():
    from colabkit.optional import require
    assert require("json", "dev", "Testing") is sys.modules["json"]


def _declared_extras() -> set:
    parser = configparser.ConfigParser()
    parser.read(REPO / "setup.cfg")
    return set(parser["options.extras_require"])


def test_every_extra_named_by_require_exists_in_setup_cfg():
    extras = _declared_extras()
    assert {"tf", "drive", "gpu", "notebook", "dev", "all"} <= extras
    used = []
    for path in sorted((REPO / "colabkit").rglob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for node in ast.walk(tree):
            if (isinstance(node, ast.Call) and getattr(node.func, "id", getattr(node.func, "attr", None)) == "require"
                    and len(node.args) >= 2 and isinstance(node.args[1], ast.Constant)):
                used.append((path.name, node.args[1].value))
    unknown = [(f, extra) for f, extra in used if extra not in extras]
    assert unknown == []
