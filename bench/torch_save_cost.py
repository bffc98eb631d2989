"""What a checkpoint costs a PyTorch training loop (colabkit.torch.AutoResume), against baselines measured in the
same run, on the Drive stand-in FUSE mount (writes throttled like Drive's, tens of MB/s):

1. stall per save (the time ``ar.save()`` keeps the loop, its previous save already written)
   / one copy of the whole state into warm host buffers, and / ``torch.save`` of the same state to the mount;
2. resume (a fresh AutoResume on fresh objects, local staging wiped as on a new VM, reading from the mount)
   / reading the checkpoint's bytes from the mount, / ``torch.load(weights_only=True)`` of the torch.save file
   (alone, and followed by the objects' ``load_state_dict``: what a resume does), and / ``dcp.load``
   (torch.distributed.checkpoint, in place into the fresh objects' state dicts) of a ``dcp.save`` of the same
   state; ``--resumes`` rounds, round-robin, best and median of each (load on the machine only adds time);
3. checkpoint size on the mount / the raw tensor bytes (and torch.save's file size).

    python bench/torch_save_cost.py [--width 1024] [--saves 5] [--resumes 3] [--rate 20e6] [--read-rate 40e6]
                                    [--no-mount]

Width 1024: Linear(1024, 2048) + Linear(2048, 1024) + Linear(1024, 1), 4.2M parameters, 50 MB with Adam's state;
width 2048: 201 MB.
Needs torch; the mount needs /dev/fuse + fusermount3 + mfusepy (without it, a local folder stands in and the
torch.save baseline is local too). Not a test: nothing fails on speed.
"""
from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import statistics
import sys
import tempfile
import time
import warnings
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "tests" / "standins"))

import numpy as np  # noqa: E402


def build(torch, width):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(width, 2 * width), torch.nn.ReLU(), torch.nn.Linear(2 * width, width),
                                torch.nn.ReLU(), torch.nn.Linear(width, 1))
    opt = torch.optim.Adam(model.parameters(), lr=1e-4)
    x = torch.randn(8, width)
    for _ in range(2):   # Adam's state exists once it has stepped
        opt.zero_grad()
        model(x).pow(2).mean().backward()
        opt.step()
    return model, opt


def tensors_of(torch, model, opt):
    found = list(model.state_dict().values())
    for state in opt.state_dict()["state"].values():
        found += [v for v in state.values() if isinstance(v, torch.Tensor)]
    return found


def copy_baseline(torch, tensors, repeats=20):
    """The fastest of ``repeats`` copies into warm buffers: a loaded machine only ever adds time to it."""
    buffers = [np.empty(tuple(t.shape), dtype=np.float32) for t in tensors]
    for b, t in zip(buffers, tensors):   # warm: the pages are touched once before timing
        torch.from_numpy(b).copy_(t)
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        for b, t in zip(buffers, tensors):
            torch.from_numpy(b).copy_(t)
        times.append(time.perf_counter() - t0)
    return min(times)


def read_all(path: Path) -> float:
    t0 = time.perf_counter()
    for f in sorted(p for p in path.rglob("*") if p.is_file()):
        with open(f, "rb") as fh:
            while fh.read(1 << 22):
                pass
    return time.perf_counter() - t0


def folder_bytes(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def measure(torch, colabkit, dest: Path, width: int, saves: int, resumes: int) -> dict:
    import torch.distributed.checkpoint as dcp
    warnings.filterwarnings("ignore", message="torch.distributed is disabled")   # one process, as intended
    model, opt = build(torch, width)
    tensors = tensors_of(torch, model, opt)
    raw = sum(t.numel() * t.element_size() for t in tensors)
    out = {"raw_bytes": raw, "copy_s": copy_baseline(torch, tensors)}

    # torch.save of the same state to the same place (synchronous: the loop waits for the whole write)
    ts_path = dest / "torch_save" / "state.pt"
    ts_path.parent.mkdir(parents=True, exist_ok=True)
    times = []
    for _ in range(max(1, min(saves, 3))):
        t0 = time.perf_counter()
        torch.save({"model": model.state_dict(), "opt": opt.state_dict()}, ts_path)
        times.append(time.perf_counter() - t0)
    out["torch_save_s"], out["torch_save_bytes"] = statistics.median(times), ts_path.stat().st_size

    # colabkit: the stall of each save (its previous save committed first, outside the timing)
    run = dest / "run"
    ar = colabkit.torch.AutoResume(run, model=model, opt=opt, deadline=None, verbose=0)
    stalls, commits = [], []
    for step in range(saves + 1):
        ar.step = step + 1
        t0 = time.perf_counter()
        ar.save()
        stalls.append(time.perf_counter() - t0)
        t1 = time.perf_counter()
        ar.checkpoints.wait()
        commits.append(time.perf_counter() - t1 + stalls[-1])
    out["first_stall_s"], out["stall_s"] = stalls[0], statistics.median(stalls[1:])
    out["commit_s"] = statistics.median(commits[1:])   # like the stalls: the first save's buffers start cold
    from colabkit.checkpoints.folder import CheckpointFolder
    newest = CheckpointFolder(run).committed()[-1]   # the copy on the destination, not the local one
    out["ckpt_bytes"] = folder_bytes(Path(newest.path))
    local = Path(ar.checkpoints.local.path)
    ar.close()

    dcp_path = dest / "dcp"
    dcp.save({"model": model.state_dict(), "opt": opt.state_dict()}, checkpoint_id=dcp_path)

    # resume on a "fresh VM": local staging gone, fresh objects, read from the destination; each way of loading
    # once per round, round-robin, so that the machine's load falls on all of them alike
    times = {key: [] for key in ("read_s", "resume_s", "torch_load_s", "torch_load_into_s", "dcp_load_s")}
    for _ in range(resumes):
        shutil.rmtree(local, ignore_errors=True)
        times["read_s"].append(read_all(Path(newest.path)))
        fresh, fresh_opt = build(torch, width)
        t0 = time.perf_counter()
        again = colabkit.torch.AutoResume(run, model=fresh, opt=fresh_opt, deadline=None, verbose=0)
        times["resume_s"].append(time.perf_counter() - t0)
        assert again.restored is not None and again.restored.source == "destination", again.restored
        assert all(torch.equal(a, b) for a, b in zip(model.state_dict().values(), fresh.state_dict().values()))
        again.close()
        del again, fresh, fresh_opt
        t0 = time.perf_counter()
        torch.load(ts_path, weights_only=True)
        times["torch_load_s"].append(time.perf_counter() - t0)
        fresh, fresh_opt = build(torch, width)
        t0 = time.perf_counter()
        loaded = torch.load(ts_path, weights_only=True)
        fresh.load_state_dict(loaded["model"])
        fresh_opt.load_state_dict(loaded["opt"])
        times["torch_load_into_s"].append(time.perf_counter() - t0)
        del loaded
        fresh, fresh_opt = build(torch, width)
        t0 = time.perf_counter()
        into = {"model": fresh.state_dict(), "opt": fresh_opt.state_dict()}
        dcp.load(into, checkpoint_id=dcp_path)
        fresh.load_state_dict(into["model"])
        fresh_opt.load_state_dict(into["opt"])
        times["dcp_load_s"].append(time.perf_counter() - t0)
        assert all(torch.equal(a, b) for a, b in zip(model.state_dict().values(), fresh.state_dict().values()))
        del into, fresh, fresh_opt
    for key, values in times.items():
        out[key], out[key + "_median"] = min(values), statistics.median(values)
    return out


def main():
    parser = argparse.ArgumentParser(prog="python bench/torch_save_cost.py", description=__doc__.split("\n\n")[0])
    parser.add_argument("--width", type=int, default=1024, help="model width (default 1024: 50 MB with Adam)")
    parser.add_argument("--saves", type=int, default=5, help="saves to time after the first (default 5)")
    parser.add_argument("--resumes", type=int, default=3, help="rounds of resumes and loads (default 3)")
    parser.add_argument("--rate", type=float, default=20e6, help="the mount's write rate, bytes/s (default 20e6)")
    parser.add_argument("--read-rate", type=float, default=40e6, help="the mount's read rate, bytes/s (default 40e6)")
    parser.add_argument("--no-mount", action="store_true", help="use a local folder instead of the FUSE mount")
    args = parser.parse_args()
    import torch
    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory(prefix="colabkit-torch-bench-") as tmp:
        tmp = Path(tmp)
        os.environ["XDG_CACHE_HOME"] = str(tmp / "cache")   # local staging of our own
        from drive_mount import fuse_unavailable_reason, mounted_drive

        import colabkit
        reason = "--no-mount" if args.no_mount else fuse_unavailable_reason()
        with contextlib.ExitStack() as stack:
            if reason is None:
                drive = stack.enter_context(mounted_drive(tmp / "fuse", rate=args.rate, read_rate=args.read_rate))
                dest, where = Path(drive.mountpoint) / "MyDrive" / "bench", (
                    f"the Drive stand-in FUSE mount ({args.rate / 1e6:.0f} MB/s writes, "
                    f"{args.read_rate / 1e6:.0f} MB/s reads)")
            else:
                dest, where = tmp / "local", f"a local folder (no FUSE mount: {reason})"
            dest.mkdir(parents=True, exist_ok=True)
            r = measure(torch, colabkit, dest, args.width, args.saves, args.resumes)
    mb = r["raw_bytes"] / 1e6
    print(f"state: {mb:.1f} MB of tensors (width {args.width}: weights + Adam state); destination: {where}")
    print("| measure | seconds | ratio |")
    print("|---|---:|---:|")
    print(f"| torch.save to the same place (the loop waits for it; baseline) | {r['torch_save_s']:.3f} | 1.0 |")
    print(f"| stall per colabkit save (median of {args.saves}) | {r['stall_s']:.4f} | "
          f"{r['stall_s'] / r['torch_save_s']:.4f} x torch.save, {r['stall_s'] / r['copy_s']:.2f} x copy |")
    print(f"| one copy of the state into warm host buffers (best of 20; secondary) | {r['copy_s']:.4f} | "
          f"{r['copy_s'] / r['torch_save_s']:.4f} x torch.save |")
    print(f"| stall of the first save (buffers allocated and touched) | {r['first_stall_s']:.4f} | "
          f"{r['first_stall_s'] / r['copy_s']:.2f} x copy |")
    print(f"| save -> committed there (background; median of {args.saves}) | {r['commit_s']:.3f} | "
          f"{r['commit_s'] / r['torch_save_s']:.2f} x torch.save |")
    print(f"\nresume, {args.resumes} rounds round-robin: best s (median s); ratios of the best figures; "
          f"load average {os.getloadavg()[0]:.1f} at the end")
    print("| measure | best s (median) | / read | / torch.load | / torch.load + load_state_dict | / dcp.load |")
    print("|---|---:|---:|---:|---:|---:|")
    for key, what in (("read_s", "reading the checkpoint's bytes"),
                      ("resume_s", "resume: fresh AutoResume from the destination, verified"),
                      ("torch_load_s", "`torch.load(weights_only=True)` of the torch.save file"),
                      ("torch_load_into_s", "same + `load_state_dict` into fresh model and optimizer"),
                      ("dcp_load_s", "`dcp.load` into fresh model and optimizer")):
        print(f"| {what} | {r[key]:.3f} ({r[key + '_median']:.3f}) | " + " | ".join(
            f"{r[key] / r[base]:.2f}" for base in ("read_s", "torch_load_s", "torch_load_into_s", "dcp_load_s"))
            + " |")
    print(f"\ncheckpoint size: {r['ckpt_bytes'] / 1e6:.2f} MB = {r['ckpt_bytes'] / r['raw_bytes']:.4f} x the raw "
          f"tensor bytes; torch.save file: {r['torch_save_bytes'] / 1e6:.2f} MB = "
          f"{r['torch_save_bytes'] / r['raw_bytes']:.4f} x")


if __name__ == "__main__":
    main()
