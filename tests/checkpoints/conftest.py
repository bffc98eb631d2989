import os
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).parent
REPO = HERE.parent.parent


@pytest.fixture
def ck_env(tmp_path, monkeypatch):
    """Isolated cache/config/drive root for checkpoint tests; returns the env for subprocesses too."""
    env = {
        "XDG_CACHE_HOME": str(tmp_path / "cache"),
        "XDG_CONFIG_HOME": str(tmp_path / "config"),
        "COLABKIT_DRIVE_ROOT": str(tmp_path / "drive"),
        "TF_CPP_MIN_LOG_LEVEL": "3",
        "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]),
    }
    for key in list(os.environ):
        if key.startswith("COLABKIT_"):
            monkeypatch.delenv(key)
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    return {**os.environ, **env}


def run_worker(args, env, **kw):
    import subprocess
    return subprocess.run([sys.executable, str(HERE / "workers.py"), *map(str, args)], env=env,
                          capture_output=True, text=True, **kw)
