"""A multi-worker run's worker list: TF_CONFIG, which entry this machine is, and one clear line for a bad list."""
from __future__ import annotations

import json
import os
import socket

import pytest

from colabkit.devices import workers as worker_list
from colabkit.devices.distribute import multi_worker_strategy


def test_a_worker_list_writes_tf_config_and_names_this_worker(monkeypatch):
    monkeypatch.delenv("TF_CONFIG", raising=False)
    info = worker_list.tf_config([f"{socket.gethostname()}:2222", "far-away-box:2222"])
    assert info.index == 0 and info.is_chief
    assert json.loads(os.environ["TF_CONFIG"]) == {
        "cluster": {"worker": [f"{socket.gethostname()}:2222", "far-away-box:2222"]},
        "task": {"type": "worker", "index": 0}}
    assert "worker 0 of 2" in str(info) and "the chief" in str(info)
    info = worker_list.tf_config(["box-a", "box-b:3333"], index=1)
    assert info.workers == ["box-a:12345", "box-b:3333"] and not info.is_chief
    monkeypatch.setenv("COLABKIT_WORKER_INDEX", "1")
    assert worker_list.tf_config(["127.0.0.1:1", "127.0.0.1:2"]).index == 1


@pytest.mark.parametrize("workers, index, expected", [
    (["box-a:1", "box-b:1"], None, "does not include this host"),
    (["127.0.0.1:1", "127.0.0.1:1"], 0, "appears twice"),
    ("box-a,box-b", None, "expected a list of hosts"),
    (["box-a:1", "box-b:1"], 2, "expected 0 to 1"),
    (["box-a:x"], 0, "is not HOST or HOST:PORT"),
])
def test_bad_worker_lists_are_one_clear_line(monkeypatch, workers, index, expected):
    monkeypatch.delenv("COLABKIT_WORKER_INDEX", raising=False)
    with pytest.raises(worker_list.WorkerListError, match=expected):
        worker_list.tf_config(workers, index=index)


def test_a_strategy_without_workers_or_tf_config_says_what_to_pass(monkeypatch):
    monkeypatch.delenv("TF_CONFIG", raising=False)
    with pytest.raises(worker_list.WorkerListError, match="needs TF_CONFIG set, or a worker list"):
        multi_worker_strategy()
    import colabkit
    with pytest.raises(ValueError, match="go with workers"):
        colabkit.strategy(index=1)


def test_an_address_of_this_machine_that_its_hostname_does_not_resolve_to_names_it(monkeypatch):
    # as a LAN address on Debian, where the hostname resolves to 127.0.1.1: any address it can bind to counts
    monkeypatch.delenv("COLABKIT_WORKER_INDEX", raising=False)
    monkeypatch.delenv("TF_CONFIG", raising=False)
    assert "127.0.0.2" not in worker_list._my_names()
    assert worker_list.tf_config(["box-a:1", "127.0.0.2:2222"]).index == 1


def test_the_same_host_twice_needs_an_index(monkeypatch):
    monkeypatch.delenv("COLABKIT_WORKER_INDEX", raising=False)
    host = socket.gethostname()
    with pytest.raises(worker_list.WorkerListError, match="say which one this process is"):
        worker_list.tf_config([f"{host}:1", f"{host}:2"])
