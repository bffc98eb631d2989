"""`colabkit doctor --cluster ADDRESS`: the checks on every node of a Ray cluster, as a task pinned to each node
(NodeAffinitySchedulingStrategy, no CPU or GPU reserved, so a busy cluster still answers)."""
from __future__ import annotations

from ..cluster.connect import alive_nodes, connect
from .findings import Finding


def _checks_as_dicts(kwargs: dict) -> list:
    from colabkit.doctor.checks import run_checks
    return [f.as_dict() for f in run_checks(**kwargs)]


def run_on_cluster(address: str, **kwargs) -> list:
    """[(node label, [Finding])] for each alive node, in Ray's order. A node whose task fails gets one fail line."""
    ray, we_connected = connect(address)
    try:
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy
        task = ray.remote(num_cpus=0, max_retries=0)(_checks_as_dicts)
        nodes = alive_nodes(ray)
        refs = [task.options(scheduling_strategy=NodeAffinitySchedulingStrategy(node_id=n.node_id, soft=False))
                .remote(kwargs) for n in nodes]
        reports = []
        for node, ref in zip(nodes, refs):
            try:
                findings = [Finding(**d) for d in ray.get(ref)]
            except Exception as exc:  # noqa: BLE001 - the other nodes' reports still count
                findings = [Finding("node", "fail", f"the checks could not run there: {type(exc).__name__}: "
                                    f"{str(exc).strip().splitlines()[-1] if str(exc).strip() else ''}",
                                    "check that colabkit is installed on that node (same version as here)")]
            reports.append((node.label, findings))
        return reports
    finally:
        if we_connected:
            ray.shutdown()
