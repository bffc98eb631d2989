"""AutoResume under MultiWorkerMirroredStrategy: two real TensorFlow worker processes on 127.0.0.1."""
from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from tests.cluster.conftest import namespaces_work
from tests.waiting import wait_for

WORKER = Path(__file__).with_name("mw_worker.py")
REPO_ROOT = Path(__file__).resolve().parent.parent.parent
RUN_TIMEOUT_S = 240


def _free_ports(n: int) -> list:
    socks = [socket.socket() for _ in range(n)]
    try:
        for s in socks:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


_in_netns: list = []   # the command prefix that runs a worker in this module's network namespace, if any


@pytest.fixture(scope="module", autouse=True)
def _network_namespace(tmp_path_factory):
    """The workers' gRPC servers listen inside a network namespace of the module's own (only loopback), where
    their fixed ports are free whatever else runs on the machine; without namespaces, ports probed free."""
    if namespaces_work() is not None:
        yield
        return
    ready = tmp_path_factory.mktemp("netns") / "ready"
    holder = subprocess.Popen(["unshare", "--net", "--", "bash", "-c",
                               f"ip link set lo up && touch {ready} && exec sleep 100000"])
    try:
        assert wait_for(lambda: ready.exists() or holder.poll() is not None, timeout=60) and ready.exists()
        _in_netns[:] = ["nsenter", "--target", str(holder.pid), "--net", "--"]   # --net alone: no fork, the
        yield                                                                     # worker's pid is the Popen's
    finally:
        _in_netns.clear()
        holder.kill()
        holder.wait()


def _start(tmp_path: Path, run: str, ckpt: Path, extra=((), ())) -> list:
    ports = "23456,23457" if _in_netns else ",".join(map(str, _free_ports(2)))
    env = {k: v for k, v in os.environ.items() if not k.startswith(("COLABKIT_", "TF_CONFIG"))}
    env.update(TF_CPP_MIN_LOG_LEVEL="3", CUDA_VISIBLE_DEVICES="-1", HOME=str(tmp_path), XDG_CACHE_HOME=str(tmp_path / "cache"),
               XDG_CONFIG_HOME=str(tmp_path / "config"),
               PYTHONPATH=os.pathsep.join([str(REPO_ROOT), os.environ.get("PYTHONPATH", "")]))
    procs = []
    for i in range(2):
        out = tmp_path / f"{run}-{i}.json"
        log = open(tmp_path / f"{run}-{i}.log", "w")  # noqa: SIM115 - closed by _finish()
        procs.append((subprocess.Popen([*_in_netns, sys.executable, str(WORKER), str(i), ports, str(ckpt), str(out), *extra[i]],
                                       env=env, stdout=log, stderr=subprocess.STDOUT), out, log))
    return procs


def _finish(procs) -> list:
    codes = []
    try:
        for proc, _, _ in procs:
            codes.append(proc.wait(RUN_TIMEOUT_S))
    finally:
        for proc, _, log in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
            log.close()
    return codes


def _result(out: Path) -> dict:
    return json.loads(out.read_text())


def _text(tmp_path: Path, run: str, i: int) -> str:
    return (tmp_path / f"{run}-{i}.log").read_text()


def _weights(result: dict) -> list:
    return [np.asarray(w) for w in result["weights"]]


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory):
    pytest.importorskip("tensorflow")
    tmp = tmp_path_factory.mktemp("mw-full")
    procs = _start(tmp, "full", tmp / "ckpt")
    codes = _finish(procs)
    assert codes == [0, 0], _text(tmp, "full", 0)[-3000:] + _text(tmp, "full", 1)[-3000:]
    results = [_result(p[1]) for p in procs]
    for a, b in zip(_weights(results[0]), _weights(results[1])):
        np.testing.assert_array_equal(a, b)   # the two workers hold one model
    return results[0]


@pytest.mark.slow
def test_two_workers_compute_what_one_process_does_with_the_same_global_batch(uninterrupted, tmp_path):
    """The strategy really splits each global batch of 32 between the workers and sums their gradients: the
    weights match one plain process's, up to the order of float sums (hence allclose, not equal)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("COLABKIT_", "TF_CONFIG"))}
    env.update(TF_CPP_MIN_LOG_LEVEL="3", CUDA_VISIBLE_DEVICES="-1", HOME=str(tmp_path),
               PYTHONPATH=os.pathsep.join([str(REPO_ROOT), os.environ.get("PYTHONPATH", "")]))
    out = tmp_path / "alone.json"
    done = subprocess.run([sys.executable, str(WORKER), "0", "0", str(tmp_path / "ckpt"), str(out), "--alone"],
                          env=env, capture_output=True, text=True, timeout=RUN_TIMEOUT_S, check=False)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    alone = _result(out)
    assert alone["steps_here"] == uninterrupted["steps_here"] == 36   # 3 epochs of 384 / 32
    for got, want in zip(_weights(uninterrupted), _weights(alone)):
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)


@pytest.mark.slow
def test_sigterm_on_one_worker_saves_once_for_all_and_the_resume_matches_an_uninterrupted_run(
        uninterrupted, tmp_path):
    ckpt = tmp_path / "ckpt"
    procs = _start(tmp_path, "cut", ckpt, extra=((), ("--sigterm-at", "17")))
    codes = _finish(procs)
    logs = [_text(tmp_path, "cut", i) for i in range(2)]
    assert codes[1] == -signal.SIGTERM, logs[1][-3000:]   # the signalled worker: saved, then the signal went on
    assert codes[0] == 0, logs[0][-3000:]                  # the chief stopped with it, at the same step
    chief = _result(tmp_path / "cut-0.json")
    assert chief["stopped"] == "a signal on another worker received" and chief["steps_here"] == 17
    assert "SIGTERM received: saved step 17" in logs[1]
    steps = sorted(int(p.name.split("-")[1]) for p in ckpt.glob("ckpt-*"))
    assert steps and steps[-1] == 17, steps                # one checkpoint of step 17, by the chief alone
    # the non-chief wrote nothing that lasts: no checkpoint and no lease of its own anywhere but the chief's folder
    lease = json.loads((ckpt / ".colabkit-lease.json").read_text()) if (ckpt / ".colabkit-lease.json").exists() \
        else None
    assert lease is None or lease["pid"] == procs[0][0].pid

    procs = _start(tmp_path, "resume", ckpt)
    codes = _finish(procs)
    assert codes == [0, 0], _text(tmp_path, "resume", 0)[-3000:]
    results = [_result(p[1]) for p in procs]
    assert [r["restored"] for r in results] == [17, 17]   # both restored the chief's choice
    for got, want in zip(_weights(results[0]), _weights(uninterrupted)):
        np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-7)
    for a, b in zip(_weights(results[0]), _weights(results[1])):
        np.testing.assert_array_equal(a, b)


@pytest.mark.slow
def test_a_deadline_on_one_worker_is_one_save_and_stop_for_both(uninterrupted, tmp_path):
    ckpt = tmp_path / "ckpt"
    # "1s" with AutoResume's 60 s margin: due at the first batch end, whatever the machine's speed; the chief
    # has a deadline of its own at the same batch, one that only saves: the other's stop wins on both
    procs = _start(tmp_path, "deadline", ckpt, extra=(("--save-deadline",), ("--deadline", "1s")))
    codes = _finish(procs)
    assert codes == [0, 0], _text(tmp_path, "deadline", 0)[-3000:] + _text(tmp_path, "deadline", 1)[-3000:]
    results = [_result(p[1]) for p in procs]
    assert [r["steps_here"] for r in results] == [1, 1]
    assert "a deadline on another worker" in results[0]["stopped"]
    assert "time budget" in results[1]["stopped"] and "another worker" not in results[1]["stopped"]
    assert [p.name.split("-")[1] for p in ckpt.glob("ckpt-*")] == ["000000000001"]


@pytest.mark.slow
def test_a_killed_worker_is_a_clear_error_on_the_other_then_both_resume(uninterrupted, tmp_path):
    ckpt = tmp_path / "ckpt"
    procs = _start(tmp_path, "kill", ckpt, extra=((), ("--hang-at", "13")))
    try:
        assert wait_for((tmp_path / "kill-1.json.ready").exists, timeout=RUN_TIMEOUT_S, step=0.2), \
            _text(tmp_path, "kill", 1)[-3000:]
        lease = json.loads((ckpt / ".colabkit-lease.json").read_text())   # mid-training: the chief holds it
        assert lease["pid"] == procs[0][0].pid, lease
        procs[1][0].kill()
    finally:
        codes = _finish(procs)
    chief_log = _text(tmp_path, "kill", 0)
    assert codes[0] != 0 and codes[1] == -signal.SIGKILL
    assert "WorkerLost" in chief_log and "another worker of this multi-worker run died or stopped answering" in \
        chief_log, chief_log[-4000:]
    steps = sorted(int(p.name.split("-")[1]) for p in ckpt.glob("ckpt-*"))
    assert steps and steps[-1] == 10, steps   # save_freq=5: the last save before the kill

    procs = _start(tmp_path, "again", ckpt)
    codes = _finish(procs)
    assert codes == [0, 0], _text(tmp_path, "again", 0)[-3000:] + _text(tmp_path, "again", 1)[-3000:]
    results = [_result(p[1]) for p in procs]
    assert [r["restored"] for r in results] == [10, 10]
    for got, want in zip(_weights(results[0]), _weights(uninterrupted)):
        np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-7)
