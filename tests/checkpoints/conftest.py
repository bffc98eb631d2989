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
        # no flight-recorder thread left in the test process by a training here (tests/health/test_recorder.py)
        "COLABKIT_FLIGHT_RECORDER": "false",
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


# the last commit before the state codec (colabkit/checkpoints/codec.py): checkpoints it writes must restore
BEFORE_CODEC = "6775974"


# the last commit whose manifests record sha256 (BLAKE3 since): checkpoints it writes must restore, verified
BEFORE_BLAKE3 = "f1b4539"


@pytest.fixture(scope="session")
def old_colabkit(tmp_path_factory):
    """The colabkit package as commit BEFORE_CODEC had it (see colabkit_at)."""
    return colabkit_at(BEFORE_CODEC, tmp_path_factory)


@pytest.fixture(scope="session")
def sha256_colabkit(tmp_path_factory):
    """The colabkit package as commit BEFORE_BLAKE3 had it (see colabkit_at)."""
    return colabkit_at(BEFORE_BLAKE3, tmp_path_factory)


def colabkit_at(commit: str, tmp_path_factory) -> Path:
    """The colabkit package as ``commit`` had it, taken from this clone's history with git archive (the
    repository is only read): a folder to put on a subprocess's PYTHONPATH. Skips where that history is not at
    hand (a source archive, a shallow clone)."""
    import io
    import subprocess
    import tarfile
    try:
        done = subprocess.run(["git", "-C", str(REPO), "archive", "--format=tar", commit, "colabkit"],
                              capture_output=True, timeout=120)
    except (OSError, subprocess.TimeoutExpired) as exc:
        pytest.skip(f"git cannot read commit {commit}: {exc}")
    if done.returncode != 0:
        pytest.skip(f"commit {commit} is not in this clone: {done.stderr.decode(errors='replace').strip()}")
    root = tmp_path_factory.mktemp(f"colabkit-{commit}")
    with tarfile.open(fileobj=io.BytesIO(done.stdout)) as tar:
        if hasattr(tarfile, "data_filter"):
            tar.extractall(root, filter="data")
        else:  # pragma: no cover - Python before 3.10.12
            tar.extractall(root)   # our own repository's archive
    return root
