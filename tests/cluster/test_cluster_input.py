"""`colabkit run --cluster`: bad input gets one clear line before anything starts (no cluster needed)."""
from __future__ import annotations

import socket
import sys
import time

import pytest

from colabkit import cli
from colabkit.cluster import connect
from colabkit.cluster.packing import pack_folder, unpack_folder
from colabkit.jobs import JobError, run_jobs


def _errors(capsys) -> list:
    return [line for line in capsys.readouterr().err.splitlines() if line.strip()]


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]   # nothing listens there once the socket is closed


@pytest.fixture
def job(tmp_path):
    path = tmp_path / "train.py"
    path.write_text("print('ran')\n")
    return path


def test_an_unreachable_address_is_one_line_and_starts_nothing(job, tmp_path, capsys):
    pytest.importorskip("ray")
    port = _closed_port()
    began = time.monotonic()
    code = cli.main(["run", "--cluster", f"127.0.0.1:{port}", "--run-dir", str(tmp_path / "run"), str(job)])
    errors = _errors(capsys)
    assert code == 1 and len(errors) == 1, errors
    assert f"cannot reach a Ray cluster at 127.0.0.1:{port}" in errors[0] and "ray start --head" in errors[0]
    assert time.monotonic() - began < 30  # not Ray's minute of retries
    assert not (tmp_path / "run").exists()


def test_a_missing_job_file_is_reported_before_the_cluster_is_contacted(tmp_path, capsys):
    code = cli.main(["run", "--cluster", f"127.0.0.1:{_closed_port()}", str(tmp_path / "nope.py")])
    errors = _errors(capsys)
    assert code == 1
    assert any("nope.py: no such file" in line for line in errors), errors
    assert not any("cannot reach" in line for line in errors)


def test_without_ray_the_cluster_option_names_the_extra_to_install(job, monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "ray", None)   # `import ray` raises ImportError, as where it is not installed
    code = cli.main(["run", "--cluster", "auto", str(job)])
    errors = _errors(capsys)
    assert code == 1 and len(errors) == 1, errors
    assert 'pip install "colabkit[cluster]"' in errors[0]


@pytest.mark.parametrize("flags, expected", [
    (["--gpus", "0,1"], "--gpus, --min-free and --max-util choose GPUs of this machine"),
    (["--min-free", "8GiB"], "ask for a number per job with --gpus-per-job"),
    (["--gpus-per-job", "0"], "--gpus-per-job 0: expected a whole number"),
])
def test_options_that_mean_nothing_on_a_cluster_are_refused(job, capsys, flags, expected):
    code = cli.main(["run", "--cluster", "auto", *flags, str(job)])
    errors = _errors(capsys)
    assert code == 1 and len(errors) == 1 and expected in errors[0], errors


def test_shared_without_a_cluster_is_refused(job):
    with pytest.raises(JobError, match="--shared is for --cluster runs"):
        run_jobs([job], shared=True)


@pytest.mark.parametrize("address, expected", [
    ("auto", ("auto", None, None)),
    ("head.lan", ("head.lan:6379", "head.lan", 6379)),
    ("10.0.0.5:6380", ("10.0.0.5:6380", "10.0.0.5", 6380)),
    ("ray://head.lan", ("ray://head.lan:10001", "head.lan", 10001)),
    ("ray://10.0.0.5:10002", ("ray://10.0.0.5:10002", "10.0.0.5", 10002)),
])
def test_address_forms(address, expected):
    assert connect.parse_address(address) == expected


@pytest.mark.parametrize("address", ["", "http://head:6379", "head:port", "head:70000", "ray://head:1/x"])
def test_bad_addresses_name_the_forms_that_work(address):
    with pytest.raises(JobError, match="ray://HOST:10001"):
        connect.parse_address(address)


def test_capacity_counts_whole_groups_per_machine_and_refuses_too_few():
    nodes = [connect.Node("a" * 16, "10.0.0.1", "box1", 2, 8), connect.Node("b" * 16, "10.0.0.2", "box2", 3, 8)]
    assert connect.capacity(nodes, gpus_per_job=1, per_gpu=1)[:3] == (5, 1, 0.0)
    assert connect.capacity(nodes, gpus_per_job=2, per_gpu=1)[:3] == (2, 2, 0.0)  # 1 + 1: one GPU of box2 idle
    assert connect.capacity(nodes, gpus_per_job=1, per_gpu=2)[:3] == (10, 0.5, 0.0)
    with pytest.raises(JobError, match="--gpus-per-job 4: no machine of the cluster has that many GPUs"):
        connect.capacity(nodes, gpus_per_job=4, per_gpu=1)
    cpu_only = [connect.Node("c" * 16, "10.0.0.3", "box3", 0, 4)]
    slots, num_gpus, num_cpus, desc = connect.capacity(cpu_only, gpus_per_job=1, per_gpu=2)
    assert (slots, num_gpus, num_cpus) == (2, 0.0, 1.0) and "the jobs run on CPUs" in desc
    with pytest.raises(JobError, match="--gpus-per-job 2: the cluster has no GPUs"):
        connect.capacity(cpu_only, gpus_per_job=2, per_gpu=1)   # not quietly on CPUs


def test_a_job_folder_travels_without_runs_and_caches_and_keeps_modes(tmp_path):
    src = tmp_path / "src"
    (src / "data").mkdir(parents=True)
    (src / "data" / "x.csv").write_text("1,2\n")
    (src / "run.sh").write_text("echo hi\n")
    (src / "run.sh").chmod(0o755)
    for skipped in ("colabkit-runs/20260101/a.log", ".git/HEAD", "__pycache__/m.pyc", "out/run1/s.json"):
        (src / skipped).parent.mkdir(parents=True, exist_ok=True)
        (src / skipped).write_text("x")
    data = pack_folder(src, [".git/", "__pycache__/", "colabkit-runs/", "out/run1/"])
    unpack_folder(data, tmp_path / "dst")
    files = sorted(p.relative_to(tmp_path / "dst").as_posix() for p in (tmp_path / "dst").rglob("*") if p.is_file())
    assert files == ["data/x.csv", "run.sh"]
    assert (tmp_path / "dst" / "run.sh").stat().st_mode & 0o111


def test_a_folder_too_large_to_send_says_to_use_shared_storage(tmp_path):
    (tmp_path / "big.bin").write_bytes(b"\0" * 4096)
    with pytest.raises(JobError, match="pass --shared"):
        pack_folder(tmp_path, [], max_bytes=1000)


def test_what_gitignore_lists_stays_home_and_a_bad_upload_limit_is_one_line(tmp_path, monkeypatch):
    from colabkit.cluster.packing import pack
    src, dst = tmp_path / "src", tmp_path / "dst"
    src.mkdir()
    (src / ".gitignore").write_text(".env\n*.key\ncache/\n")
    for name in (".env", "id.key", "cache/blob", "train.py", "sub/notes.txt"):
        (src / name).parent.mkdir(parents=True, exist_ok=True)
        (src / name).write_text("x")
    packed = pack(src, [])
    unpack_folder(packed.data, dst)
    files = sorted(p.relative_to(dst).as_posix() for p in dst.rglob("*") if p.is_file())
    assert files == [".gitignore", "sub/notes.txt", "train.py"]
    assert packed.describe().startswith("3 file(s)")
    monkeypatch.setenv("COLABKIT_CLUSTER_MAX_UPLOAD", "lots")
    with pytest.raises(JobError, match="COLABKIT_CLUSTER_MAX_UPLOAD='lots': expected a number of bytes"):
        pack(src, [])



def test_waiting_for_a_lost_node_ends_with_ctrl_c_and_is_skipped_for_an_actor_killed_for_memory():
    import threading

    from colabkit.cluster import runner

    class AliveForever:   # a node Ray has not (yet) marked dead
        @staticmethod
        def nodes():
            return [{"NodeID": "n1", "Alive": True}]

    waiting = runner.ClusterRunner.__new__(runner.ClusterRunner)
    waiting.ray, waiting.stop_signal = AliveForever(), None
    threading.Timer(0.5, lambda: setattr(waiting, "stop_signal", "SIGINT")).start()
    began = time.monotonic()
    assert waiting._wait_for_node_death("n1") is None
    assert time.monotonic() - began < runner.NODE_DEATH_WAIT_S / 2   # not the full wait past Ctrl-C
    assert not runner._names_a_lost_node("ActorDiedError: the worker was killed by the memory monitor (OOM)")
    assert runner._names_a_lost_node("ActorDiedError: The actor died because its node has died. Node Id: ab")


def test_a_process_connected_to_one_cluster_refuses_another_address(monkeypatch):
    class Connected:   # ray, as a program that called ray.init() on another cluster leaves it
        @staticmethod
        def is_initialized():
            return True

        @staticmethod
        def get_runtime_context():
            class Context:
                gcs_address = "10.9.9.9:6379"
            return Context()

    monkeypatch.setattr(connect, "import_ray", lambda: Connected)
    with pytest.raises(JobError, match="already connected to the Ray cluster at 10.9.9.9:6379"):
        connect.connect("127.0.0.1:6379")
    assert connect.connect("10.9.9.9:6379") == (Connected, False)   # the same cluster: reused
    assert connect.connect("auto") == (Connected, False)


class _FlakyRayClient:
    """Stands in for the ray module behind a Ray Client address whose head fails to start a client server
    `failures` times (Ray raises ConnectionAbortedError "Initialization failure from server" then)."""

    def __init__(self, failures: int, error=ConnectionAbortedError):
        self.failures, self.error, self.calls, self.shutdowns = failures, error, 0, 0

    def is_initialized(self):
        return False

    def init(self, address, **_):
        self.calls += 1
        if self.calls <= self.failures:
            raise self.error("Initialization failure from server:\n")

    def shutdown(self):
        self.shutdowns += 1


@pytest.fixture
def listening_port():
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        yield server.getsockname()[1]


@pytest.mark.parametrize("failures, connected", [(1, True), (2, True), (3, False)])
def test_a_ray_client_server_that_fails_to_start_is_tried_again(listening_port, monkeypatch, failures, connected):
    ray = _FlakyRayClient(failures)
    monkeypatch.setattr(connect, "import_ray", lambda: ray)
    monkeypatch.setattr(connect, "CLIENT_INIT_BACKOFF_S", 0.01)
    address = f"ray://127.0.0.1:{listening_port}"
    if connected:
        assert connect.connect(address) == (ray, True)
        assert ray.calls == failures + 1 and ray.shutdowns == failures
    else:
        with pytest.raises(JobError, match="could not connect to a Ray cluster .Initialization failure"):
            connect.connect(address)
        assert ray.calls == connect.CLIENT_INIT_ATTEMPTS


def test_a_refused_gcs_connection_is_not_tried_again(listening_port, monkeypatch):
    ray = _FlakyRayClient(1, error=ConnectionError)
    monkeypatch.setattr(connect, "import_ray", lambda: ray)
    with pytest.raises(JobError, match="could not connect"):
        connect.connect(f"127.0.0.1:{listening_port}")
    assert ray.calls == 1
