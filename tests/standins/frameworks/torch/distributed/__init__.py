"""torch.distributed with the NCCL backend as the scenario's "torch": {"nccl": ...} has it: "ok" (ranks meet
through files named after MASTER_ADDR:MASTER_PORT and sum their tensors), "hang" (all_reduce never returns, as
NCCL over broken PCIe P2P does; NCCL_P2P_DISABLE=1 makes it work) or "fail" (a DistBackendError)."""
import os as _os
import tempfile as _tempfile
import time as _time

from .. import version as _version
from .._tensor import Tensor as _Tensor
from _cuda_scenario import framework as _framework


class DistError(RuntimeError):
    pass


class DistBackendError(DistError):
    pass


class ReduceOp:
    SUM = "sum"


_group = {}


def is_available():
    return True


def is_nccl_available():
    return bool(_version.cuda)


def is_initialized():
    return bool(_group)


def init_process_group(backend=None, init_method=None, timeout=None, world_size=-1, rank=-1, **kwargs):
    if backend != "nccl":
        raise ValueError(f"the stand-in has only the nccl backend, not {backend!r}")
    rank = int(_os.environ["RANK"]) if rank == -1 else rank
    world_size = int(_os.environ["WORLD_SIZE"]) if world_size == -1 else world_size
    where = f"{_os.environ['MASTER_ADDR']}-{_os.environ['MASTER_PORT']}"
    _group.update(rank=rank, world_size=world_size, dir=_os.path.join(_tempfile.gettempdir(), f"torch-standin-{where}"))
    _os.makedirs(_group["dir"], exist_ok=True)


def all_reduce(tensor, op=ReduceOp.SUM, group=None, async_op=False):
    if not _group:
        raise ValueError("Default process group has not been initialized, please make sure to call "
                         "init_process_group.")
    mode = _framework("torch").get("nccl", "ok")
    if mode == "hang" and _os.environ.get("NCCL_P2P_DISABLE") != "1":
        while True:   # a real NCCL kernel spinning on a peer write that never arrives
            _time.sleep(3600)
    if mode == "fail":
        raise DistBackendError("NCCL error in: ../torch/csrc/distributed/c10d/ProcessGroupNCCL.cpp:1970, unhandled "
                               "system error (run with NCCL_DEBUG=INFO for details), NCCL version 2.20.5")
    mine = _os.path.join(_group["dir"], f"rank{_group['rank']}")
    with open(mine + ".tmp", "w") as fh:
        fh.write(repr(tensor.tolist()))
    _os.replace(mine + ".tmp", mine)
    names = [_os.path.join(_group["dir"], f"rank{r}") for r in range(_group["world_size"])]
    while not all(_os.path.exists(n) for n in names):
        _time.sleep(0.02)
    rows = []
    for n in names:
        with open(n) as fh:
            rows.append(eval(fh.read()))  # noqa: S307 - lists of floats this module wrote
    tensor._values = [sum(col) for col in zip(*rows)]


def destroy_process_group(group=None):
    _group.clear()
