"""Every public name README.md shows works: each `colabkit.X` / `colabkit.X.Y` resolves after a plain
`import colabkit` in a fresh interpreter, each `from colabkit... import ...` of its code blocks runs, each
`colabkit <command>` it shows has `--help` (and so does each `colabkit <command> <action>`), and each `%magic`
is registered by `%load_ext colabkit` or is IPython's own.

The names are read from README.md when the tests are collected, one test case per name; the extraction is itself
checked (it finds the names a README of this size must show, and catches a misspelt one in a README of our own),
so that a README the parser misreads cannot pass by showing nothing.
"""
from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
README = REPO / "README.md"

# `%magics` in README.md that are neither colabkit's nor IPython's, each with the reason it is shown
FOREIGN_MAGICS = {"tensorflow_version": "Colab's own; the migrate table shows `colabkit migrate` commenting it out"}

_FENCE = re.compile(r"^```[^\n]*\n(.*?)^```", re.S | re.M)
_SPAN = re.compile(r"`([^`\n]+)`")
_DOTTED = re.compile(r"(?<![\w./-])colabkit(?:\.[A-Za-z_]\w*)+")
_FROM_IMPORT = re.compile(r"^\s*from\s+(colabkit(?:\.\w+)*)\s+import\s+\(?([\w\s,]+?)\)?\s*(?:#.*)?$", re.M)
_IMPORT = re.compile(r"^\s*import\s+(colabkit(?:\.\w+)*(?:\s*,\s*[\w.]+)*)\s*(?:#.*)?$", re.M)
# a command: at the start of a line or after a shell operator or a bin/ folder; the next word, when it is a plain
# lowercase word (or words joined by |), may be an action of that command (`colabkit drive login|whoami`)
_COMMAND = re.compile(r"(?:^|&&|;|\||\bbin/)\s*colabkit ([a-z][a-z-]*)(?: ([a-z]+(?:\|[a-z]+)*)(?=\s|$))?", re.M)
_SPAN_COMMAND = re.compile(r"^colabkit ([a-z][a-z-]*)(?: ([a-z]+(?:\|[a-z]+)*)(?=\s|$))?")
_MAGIC = re.compile(r"(?<![\w%])%([A-Za-z_]\w*)")


def _code(text: str) -> tuple[list[str], list[str]]:
    """(the code blocks' bodies, the inline `code` spans outside them)."""
    blocks = _FENCE.findall(text)
    return blocks, _SPAN.findall(_FENCE.sub("", text))


def extract(text: str) -> dict:
    """What a README shows: {"names": dotted colabkit names, "imports": import statements of its code blocks,
    "commands": [(command, action or None)], "magics": %names}, each sorted and without repeats."""
    blocks, spans = _code(text)
    names = {m.rstrip(".") for m in _DOTTED.findall(text)}
    imports = set()
    for block in blocks:
        for module, what in _FROM_IMPORT.findall(block):
            imports |= {f"from {module} import {name.strip()}" for name in what.split(",") if name.strip()}
        for modules in _IMPORT.findall(block):
            imports |= {f"import {m.strip()}" for m in modules.split(",") if m.strip().startswith("colabkit")}
    commands = set()
    found = [m for block in blocks for m in _COMMAND.findall(re.sub(r"(?m)^\s*#.*$", "", block))]
    found += [m.groups() for span in spans if (m := _SPAN_COMMAND.match(span.strip()))]
    for command, actions in found:
        commands.add((command, None))
        commands |= {(command, action) for action in (actions or "").split("|") if action}
    magics = {m for part in [*blocks, *spans] for m in _MAGIC.findall(part)}
    return {"names": sorted(names), "imports": sorted(imports), "commands": sorted(commands, key=str),
            "magics": sorted(magics)}


SHOWN = extract(README.read_text(encoding="utf-8"))

RESOLVE = r"""
import importlib, json, sys


def fresh_colabkit():
    # each name from a plain `import colabkit`, as in a fresh interpreter: no name may resolve only because an
    # earlier one imported its module (frameworks already imported stay: they hold no colabkit attribute)
    for module in [m for m in sys.modules if m == "colabkit" or m.startswith("colabkit.")]:
        del sys.modules[module]
    return importlib.import_module("colabkit")


out = {}
for name in NAMES:
    obj = fresh_colabkit()
    try:
        for part in name.split(".")[1:]:
            obj = getattr(obj, part)
        out[name] = ["ok", ""]
    except ImportError as exc:          # an optional dependency that is not installed here names its extra
        out[name] = ["extra" if 'pip install "colabkit[' in str(exc) else "error", f"{type(exc).__name__}: {exc}"]
    except Exception as exc:
        out[name] = ["error", f"{type(exc).__name__}: {exc}"]
for statement in STATEMENTS:
    fresh_colabkit()
    try:
        exec(statement, {})
        out[statement] = ["ok", ""]
    except ImportError as exc:
        out[statement] = ["extra" if 'pip install "colabkit[' in str(exc) else "error", f"{type(exc).__name__}: {exc}"]
    except Exception as exc:
        out[statement] = ["error", f"{type(exc).__name__}: {exc}"]
print("RESOLVED" + json.dumps(out))
"""


def resolve(names, statements=()) -> dict:
    """{name or statement: [outcome, detail]} from one fresh interpreter: "ok", "extra" (needs an optional
    dependency that is not installed), or "error"."""
    code = f"NAMES = {list(names)!r}\nSTATEMENTS = {list(statements)!r}\n" + RESOLVE
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600, cwd=REPO)
    assert done.returncode == 0, done.stdout + done.stderr
    line = [ln for ln in done.stdout.splitlines() if ln.startswith("RESOLVED")][-1]
    return json.loads(line[len("RESOLVED"):])


def _family(name: str) -> str:
    """PyTorch and TensorFlow are not imported into one interpreter (as the test suite runs them apart)."""
    second = (name.split(".") + [""])[1]
    return "torch" if second.startswith("torch") else "tensorflow" if second == "keras" else "light"


@pytest.fixture(scope="module")
def resolved():
    out = {}
    for family in ("light", "tensorflow", "torch"):
        names = [n for n in SHOWN["names"] if _family(n) == family]
        statements = [s for s in SHOWN["imports"] if _family(s.split()[1]) == family]
        if names or statements:
            out.update(resolve(names, statements))
    return out


def _check(outcome):
    status, detail = outcome
    if status == "extra":
        pytest.skip(f"its optional dependency is not installed here: {detail}")
    assert status == "ok", detail


@pytest.mark.parametrize("name", SHOWN["names"])
def test_a_name_the_readme_shows_resolves_after_import_colabkit(resolved, name):
    _check(resolved[name])


@pytest.mark.parametrize("statement", SHOWN["imports"])
def test_an_import_the_readme_shows_runs(resolved, statement):
    _check(resolved[statement])


@pytest.mark.parametrize("command, action", SHOWN["commands"], ids=lambda v: v or "-")
def test_a_command_the_readme_shows_has_help(command, action):
    argv = [command] + ([action] if action else [])
    done = subprocess.run([sys.executable, "-m", "colabkit", *argv, "--help"], capture_output=True, text=True,
                          timeout=120, cwd=REPO)
    assert done.returncode == 0, done.stdout + done.stderr
    # argparse names the (sub)command it documents: an unknown action would show the command's own usage
    assert done.stdout.startswith(f"usage: colabkit {' '.join(argv)} "), done.stdout


@pytest.fixture(scope="module")
def magics():
    """{"ours": magics %load_ext colabkit registers, "ipython": the ones IPython has without it}."""
    code = ("import json\nfrom IPython.core.interactiveshell import InteractiveShell\n"
            "shell = InteractiveShell.instance()\n"
            "table = shell.magics_manager.magics\n"
            "before = set(table['line']) | set(table['cell'])\n"
            "shell.run_line_magic('load_ext', 'colabkit')\n"
            "after = set(table['line']) | set(table['cell'])\n"
            "print('MAGICS' + json.dumps({'ours': sorted(after - before), 'ipython': sorted(before)}))\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=REPO)
    assert done.returncode == 0, done.stdout + done.stderr
    line = [ln for ln in done.stdout.splitlines() if ln.startswith("MAGICS")][-1]
    return {k: set(v) for k, v in json.loads(line[len("MAGICS"):]).items()}


@pytest.mark.parametrize("magic", SHOWN["magics"])
def test_a_magic_the_readme_shows_exists(magics, magic):
    assert magic in magics["ours"] or magic in magics["ipython"] or magic in FOREIGN_MAGICS, \
        f"%{magic}: not registered by %load_ext colabkit, not IPython's, and not listed in FOREIGN_MAGICS"


# -- the extraction itself -------------------------------------------------------------------------------------
def test_the_readme_yields_the_names_it_must_show():
    """A parser that silently finds nothing would make every test above pass vacuously."""
    assert len(SHOWN["names"]) >= 30, SHOWN["names"]
    assert {"colabkit.keras.AutoResume", "colabkit.torch.AutoResume", "colabkit.Checkpoints", "colabkit.monitor",
            "colabkit.use_gpus", "colabkit.checkpoints.InvalidCheckpoint"} <= set(SHOWN["names"])
    assert "from colabkit.jobs import run_jobs" in SHOWN["imports"]
    commands = {c for c, _ in SHOWN["commands"]}
    assert {"status", "config", "demo", "checkpoints", "drive", "fetch", "stage", "gpus", "run", "migrate"} <= commands
    assert {("drive", "login"), ("drive", "whoami")} <= set(SHOWN["commands"])
    assert {"colabkit", "keepalive", "monitor", "gpus", "stage", "load_ext"} <= set(SHOWN["magics"])


def test_the_readmes_colabkit_magics_are_the_ones_it_registers(magics):
    assert {"colabkit", "keepalive", "monitor", "gpus", "stage"} <= magics["ours"]


def test_a_misspelt_name_in_a_readme_is_caught():
    text = ("Set `colabkit.gdrive.TIMEOUT_S` or `colabkit.gdrive.TIMEUOT_S`.\n\n```python\n"
            "from colabkit.jobs import run_jobs, run_jobz\nimport colabkit\ncolabkit.no_such_thing()\n```\n\n"
            "```\ncolabkit stauts\ncolabkit drive login|whoamii   # sign in\n```\nand `%keepalive`, `%keepalve`.\n")
    shown = extract(text)
    assert shown["names"] == ["colabkit.gdrive.TIMEOUT_S", "colabkit.gdrive.TIMEUOT_S", "colabkit.jobs",
                              "colabkit.no_such_thing"]
    assert shown["imports"] == ["from colabkit.jobs import run_jobs", "from colabkit.jobs import run_jobz",
                                "import colabkit"]
    assert ("stauts", None) in shown["commands"] and ("drive", "whoamii") in shown["commands"]
    assert shown["magics"] == ["keepalive", "keepalve"]
    outcome = resolve(shown["names"], shown["imports"])
    assert outcome["colabkit.gdrive.TIMEOUT_S"] == ["ok", ""]
    assert outcome["colabkit.gdrive.TIMEUOT_S"][0] == "error" and "TIMEUOT_S" in outcome["colabkit.gdrive.TIMEUOT_S"][1]
    assert outcome["colabkit.no_such_thing"][0] == "error"
    assert outcome["from colabkit.jobs import run_jobz"][0] == "error"
    assert outcome["from colabkit.jobs import run_jobs"] == ["ok", ""]
    for argv in (["stauts"], ["drive", "whoamii"]):
        done = subprocess.run([sys.executable, "-m", "colabkit", *argv, "--help"], capture_output=True, text=True,
                              timeout=120, cwd=REPO)
        assert done.returncode != 0 or not done.stdout.startswith(f"usage: colabkit {' '.join(argv)} ")
