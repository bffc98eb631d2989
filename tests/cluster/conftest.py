"""A real Ray cluster of three nodes on 127.0.0.1, in a network and pid namespace of its own.

Ray's processes also talk over the machine's interface address, and `ray stop` kills Ray processes by name on
the whole machine; so the cluster lives inside `unshare --net --pid` with only loopback, and ends when the
namespace's first process is killed. Commands that talk to it (the `colabkit run` driver, a node "dying") run
inside the namespace through nsenter.

Nodes: a head without GPUs (so killing a worker never kills the cluster) and two workers declaring two logical
GPUs each, each with a hostname of its own (a UTS namespace: to colabkit's checkpoint lease they are machines), with the NVML stand-in's two-GPU scenario in their environment (`colabkit.gpus()` inside a job lists
the "machine's" two GPUs).
"""
from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

TESTS = Path(__file__).resolve().parent.parent
REPO_ROOT = TESTS.parent
GPU_STANDINS = TESTS / "standins" / "gpu"
PORT = 46379
START_TIMEOUT_S = 240


class ClusterStartError(RuntimeError):
    pass


def namespaces_work() -> str | None:
    if sys.platform != "linux" or shutil.which("unshare") is None or shutil.which("nsenter") is None:
        return "needs Linux with unshare and nsenter"
    probe = subprocess.run(["unshare", "--net", "--fork", "--pid", "--mount-proc", "true"], capture_output=True, check=False)
    if probe.returncode != 0:
        return f"cannot make a network namespace here: {probe.stderr.decode(errors='replace').strip()}"
    return None


class RayCluster:
    def __init__(self, base: Path):
        self.base = base
        self.address = f"127.0.0.1:{PORT}"
        self.ns_pid: int | None = None
        self.proc: subprocess.Popen | None = None
        self.temp: Path | None = None
        self.env: dict | None = None   # the nodes' environment
        self.log = None
        self.added = 0

    def command(self, *argv: str) -> list:
        """argv run inside the cluster's namespaces."""
        return ["nsenter", "--target", str(self.ns_pid), "--net", "--pid", "--mount", "--", *argv]

    def run(self, *argv: str, **kwargs) -> subprocess.CompletedProcess:
        kwargs.setdefault("capture_output", True)
        kwargs.setdefault("text", True)
        kwargs.setdefault("timeout", 180)
        return subprocess.run(self.command(*argv), check=False, **kwargs)

    def popen(self, *argv: str, **kwargs) -> subprocess.Popen:
        return subprocess.Popen(self.command(*argv), **kwargs)

    def colabkit_run(self, *args: str, cwd: Path, **kwargs):
        return self.run(sys.executable, "-m", "colabkit", "run", "--cluster", self.address, *args, cwd=cwd, **kwargs)

    def kill_node_of(self, pid: int) -> str:
        """Kill (SIGKILL) the Ray node whose worker runs the namespace process `pid`: its raylet and every process
        below it, as when that machine loses power. Returns what was killed."""
        done = self.run(sys.executable, str(Path(__file__).with_name("kill_node.py")), str(pid), timeout=60)
        assert done.returncode == 0, done.stdout + done.stderr
        return done.stdout

    def add_worker(self, gpus: int = 2) -> None:
        """Start one more worker node (e.g. in place of one a test killed)."""
        self.added += 1
        done = self.run("unshare", "--uts", "sh", "-c", f"hostname ckbox-added-{self.added} && exec ray start "
                        f"--address={self.address} --node-ip-address=127.0.0.1 --disable-usage-stats "
                        f"--num-gpus={gpus} --num-cpus=2", env=self.env, timeout=120)
        assert done.returncode == 0, done.stdout + done.stderr

    def stop(self) -> None:
        if self.ns_pid is not None:
            try:
                os.kill(self.ns_pid, signal.SIGKILL)  # the namespace's first process: the kernel ends them all
            except ProcessLookupError:
                pass
        if self.proc is not None:
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        if self.log is not None:
            self.log.close()
        if self.temp is not None:
            shutil.rmtree(self.temp, ignore_errors=True)


def _child_of(pid: int) -> int | None:
    try:
        text = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
    except OSError:
        return None
    return int(text[0]) if text else None


def kill_driver(proc: subprocess.Popen) -> None:
    """SIGKILL a `colabkit run` started through nsenter: the driver (nsenter's child) first, then nsenter, so a
    failed test leaves no driver holding the cluster's GPUs for the next ones."""
    if proc.poll() is not None:
        return
    child = _child_of(proc.pid)
    if child is not None:
        try:
            os.kill(child, signal.SIGKILL)
        except ProcessLookupError:
            pass
    proc.kill()
    proc.wait(30)


@pytest.fixture(scope="module")
def ray_cluster(tmp_path_factory):
    why = namespaces_work()
    if why:
        pytest.skip(why)
    pytest.importorskip("ray")
    cluster = None
    try:
        try:
            cluster = start_cluster(tmp_path_factory.mktemp("raycluster"))
        except ClusterStartError as exc:
            pytest.fail(str(exc))
        yield cluster
    finally:
        if cluster is not None:
            cluster.stop()


def start_cluster(base: Path, *, workers: int = 2, gpus: int = 2) -> RayCluster:
    """A head without GPUs and `workers` nodes with `gpus` logical GPUs each, in namespaces of their own."""
    # Ray's unix sockets live under --temp-dir: keep that path short (socket paths stop at 107 bytes)
    temp = Path(tempfile.mkdtemp(prefix="ckray-", dir="/tmp"))
    home = base / "home"
    (home / ".cache").mkdir(parents=True)
    scenario = base / "gpus.json"
    scenario.write_text((GPU_STANDINS / "scenarios" / "home_rig.json").read_text())
    ready = base / "ready"
    bindir = Path(sys.executable).parent
    env = {k: v for k, v in os.environ.items() if not k.startswith(("COLABKIT_", "RAY_", "CUDA_"))}
    env.update({"PATH": f"{bindir}{os.pathsep}{env.get('PATH', '')}", "HOME": str(home),
                "XDG_CACHE_HOME": str(home / ".cache"), "XDG_CONFIG_HOME": str(home / ".config"),
                "PYTHONPATH": os.pathsep.join([str(REPO_ROOT), str(GPU_STANDINS)]),
                "COLABKIT_TEST_GPUS": str(scenario), "RAY_USAGE_STATS_ENABLED": "0",
                # a dead node is noticed in about 15 s instead of Ray's default of about 30 s, with room for a
                # healthy node's late answers on two busy cores
                "RAY_health_check_period_ms": "1000", "RAY_health_check_timeout_ms": "3000",
                "RAY_health_check_failure_threshold": "5", "RAY_health_check_initial_delay_ms": "1000",
                # a job's lease on a machine that died is taken over after 2 x 2 s of silence, not 2 x 30 s
                "COLABKIT_LEASE_RENEW_S": "2",
                # Ray Client's per-client server can take more than its default 30 s to start on 2 busy cores
                "RAY_CLIENT_SERVER_CHECK_CHANNEL_TIMEOUT_S": "150"})
    common = "--node-ip-address=127.0.0.1 --disable-usage-stats"
    script = f"""
set -e
ip link set lo up
ray start --head --port={PORT} {common} --num-gpus=0 --num-cpus=1 --include-dashboard=false \
    --temp-dir={temp} > {base}/head.log 2>&1
for n in $(seq 1 {workers}); do
  # each machine has its own /tmp, so its own GPU claims (colabkit.devices.claims)
  unshare --uts sh -c "hostname ckbox-$n && COLABKIT_GPU_CLAIMS={base}/gpu-claims-ckbox-$n exec ray start --address=127.0.0.1:{PORT} {common} \
      --num-gpus={gpus} --num-cpus=2" > {base}/worker-$n.log 2>&1
done
touch {ready}
while :; do sleep 1; done   # the namespace's first process: bash reaps the orphans of killed nodes
"""
    cluster = RayCluster(base)
    cluster.temp, cluster.env = temp, env
    cluster.log = open(base / "namespace.log", "w")  # noqa: SIM115 - closed by stop()
    cluster.proc = subprocess.Popen(["unshare", "--net", "--fork", "--pid", "--mount-proc", "--kill-child",
                                     "bash", "-c", script], env=env, stdout=cluster.log, stderr=subprocess.STDOUT)
    deadline = time.monotonic() + START_TIMEOUT_S
    while not ready.exists():
        if cluster.ns_pid is None:
            cluster.ns_pid = _child_of(cluster.proc.pid)
        if cluster.proc.poll() is not None or time.monotonic() > deadline:
            logs = "\n".join(f"--- {p.name}\n{p.read_text()[-3000:]}" for p in sorted(base.glob("*.log")))
            cluster.stop()
            raise ClusterStartError(f"the Ray test cluster did not start:\n{logs}")
        time.sleep(0.2)
    cluster.ns_pid = cluster.ns_pid or _child_of(cluster.proc.pid)
    return cluster


def read_summary(run_dir: Path) -> dict | None:
    try:
        return json.loads((run_dir / "summary.json").read_text())
    except (OSError, ValueError):
        return None
