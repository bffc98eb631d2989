"""Run as a script by colabkit doctor, once per GPU (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT in the
environment): an NCCL all-reduce of a tensor of ones on GPU RANK. Prints the sum; exit 0 when it is WORLD_SIZE.
Imports nothing from colabkit."""
import os
import sys


def main() -> int:
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    import torch
    import torch.distributed as dist
    torch.cuda.set_device(rank)
    dist.init_process_group("nccl", rank=rank, world_size=world)
    tensor = torch.ones(1, device=f"cuda:{rank}")
    dist.all_reduce(tensor)
    torch.cuda.synchronize()
    total = tensor.item()
    dist.destroy_process_group()
    print(f"rank {rank}: sum {total:g}")
    return 0 if total == world else 3


if __name__ == "__main__":
    sys.exit(main())
