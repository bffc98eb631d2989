"""Installing an extra next to the frameworks Colab preinstalls replaces none of them.

A Colab runtime ships its own torch (built for its CUDA), TensorFlow, Keras, NumPy and JAX. The extras a Colab
user installs (`pip install "colabkit[torch]"`, ...) must accept those versions instead of downloading gigabytes
and swapping the framework under a running notebook. The stand-in for a Colab VM is an empty virtual environment
holding only `.dist-info` folders of the preinstalled versions; pip resolves each extra against it with
`--dry-run --report` (nothing is downloaded beyond metadata, nothing is installed).
"""
from __future__ import annotations

import concurrent.futures
import json
import subprocess
import sys
import venv
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

# What a Colab runtime preinstalls (versions of a 2025 image; the exact numbers matter less than that they are
# not the ones CI pins in .ci/constraints.txt, and carry the local "+cu126" builds pip must not replace)
COLAB_PREINSTALLED = {
    "torch": "2.9.0+cu126", "torchvision": "0.24.0+cu126", "torchaudio": "2.9.0+cu126",
    "tensorflow": "2.19.0", "keras": "3.10.0", "numpy": "2.0.2", "jax": "0.7.2", "jaxlib": "0.7.2",
    "matplotlib": "3.10.0", "psutil": "5.9.5", "tqdm": "4.67.1", "pydrive2": "1.21.3",
    "transformers": "4.57.1", "accelerate": "1.11.0",
}
# the extras a Colab user installs ("notebook", "all" and "dev" are for a machine without Colab's own Jupyter)
COLAB_EXTRAS = ["tf", "torch", "lightning", "hf", "drive", "gpu", "health", "cluster"]


def _normalized(name: str) -> str:
    return name.lower().replace("_", "-").replace(".", "-")


@pytest.fixture(scope="module")
def colab_like_env(tmp_path_factory):
    root = tmp_path_factory.mktemp("colab-vm")
    env = root / "venv"
    venv.EnvBuilder(with_pip=False).create(env)
    python = env / ("Scripts/python.exe" if sys.platform == "win32" else "bin/python")
    purelib = Path(subprocess.run([python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                                  capture_output=True, text=True, check=True).stdout.strip())
    for name, version in COLAB_PREINSTALLED.items():
        info = purelib / f"{name}-{version}.dist-info"
        info.mkdir(parents=True)
        (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")
        (info / "INSTALLER").write_text("pip\n")
        (info / "RECORD").write_text("")
    # colabkit itself as a wheel, so pip reads the extras from the package's real metadata
    wheels = root / "wheels"
    subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w",
                    str(wheels), str(ROOT)], check=True, capture_output=True)
    (wheel,) = wheels.glob("colabkit-*.whl")
    return python, wheel, root


def _would_install(python: Path, wheel: Path, extra: str, report: Path) -> list[tuple[str, str]]:
    done = subprocess.run([sys.executable, "-m", "pip", "--python", str(python), "install", "--dry-run", "-q",
                           "--report", str(report), f"colabkit[{extra}] @ {wheel.as_uri()}"],
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, f"colabkit[{extra}]: {done.stderr[-3000:]}"
    return [(item["metadata"]["name"], item["metadata"]["version"])
            for item in json.loads(report.read_text())["install"]]


@pytest.mark.slow
def test_no_extra_replaces_a_framework_colab_preinstalls(colab_like_env):
    python, wheel, root = colab_like_env
    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        plans = dict(zip(COLAB_EXTRAS, pool.map(
            lambda extra: _would_install(python, wheel, extra, root / f"{extra}.json"), COLAB_EXTRAS)))
    preinstalled = {_normalized(name) for name in COLAB_PREINSTALLED}
    replaced = {extra: [f"{name}=={version}" for name, version in plan if _normalized(name) in preinstalled]
                for extra, plan in plans.items()}
    assert replaced == {extra: [] for extra in COLAB_EXTRAS}, replaced
    # and the extras do bring what they are for (a resolver that installed nothing would pass the line above)
    brought = {extra: {_normalized(name) for name, _ in plan} for extra, plan in plans.items()}
    assert "lightning" in brought["lightning"] and "torchdata" in brought["torch"]
    assert "ray" in brought["cluster"] and "pydrive2" not in brought["drive"]   # Colab's own pydrive2 is kept


def test_the_wheel_carries_its_package_data(colab_like_env):
    """What the package reads from its own files at run time (the keep-alive page script) is in the wheel."""
    import zipfile
    _, wheel, _ = colab_like_env
    names = set(zipfile.ZipFile(wheel).namelist())
    assert "colabkit/keepalive_page.js" in names and "colabkit/keepalive_page.py" in names


def test_ci_pins_live_in_the_constraints_file_not_in_the_extras():
    """The extras users install declare ranges; the exact versions CI tests are pinned by .ci/constraints.txt,
    which the README's test command passes to pip."""
    import configparser
    config = configparser.ConfigParser()
    config.read(ROOT / "setup.cfg")
    pinned = [(extra, line.strip()) for extra, text in config["options.extras_require"].items()
              for line in text.splitlines() if "==" in line and not line.strip().startswith("ruff")]
    assert pinned == []
    readme = (ROOT / "README.md").read_text()
    assert '-c .ci/constraints.txt' in readme
