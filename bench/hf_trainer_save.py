"""What a checkpoint costs a Hugging Face Trainer: the stall per save with colabkit.hf.AutoResume (the Trainer
writes checkpoint-N to a local output_dir, AutoResume hard-links it into the store and uploads it in the
background) against the Trainer writing checkpoint-N straight to a Drive-like mount (the Drive stand-in FUSE
mount, writes throttled like Drive's, tens of MB/s), measured in the same run.

    python bench/hf_trainer_save.py [--width 256] [--layers 4] [--saves 4] [--rate 20e6] [--no-mount]

The stall is the time the training loop spends in a save (the Trainer's _save_checkpoint and every on_save
callback). The last save (the end of training, which waits for its upload) is not counted. Needs transformers and
accelerate; the mount needs /dev/fuse + fusermount3 + mfusepy (without it, a local folder stands in and both sides
write locally). Not a test: nothing fails on speed.
"""
from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "tests" / "standins"))


def train(transformers, torch, output_dir, callbacks, width, layers, saves, every=3):
    """A tiny-data GPT-2 run that saves every ``every`` steps; returns (stalls of the saves before the last,
    checkpoint bytes)."""
    torch.manual_seed(0)
    config = transformers.GPT2Config(vocab_size=8192, n_positions=32, n_embd=width, n_layer=layers, n_head=4)
    model = transformers.GPT2LMHeadModel(config)
    rows = [{"input_ids": [i % 8192] * 32, "labels": [i % 8192] * 32} for i in range(64)]
    steps = every * saves + 1
    args = transformers.TrainingArguments(output_dir=str(output_dir), max_steps=steps, per_device_train_batch_size=2,
                                          save_strategy="steps", save_steps=every, report_to="none", use_cpu=True,
                                          disable_tqdm=True, logging_strategy="no", save_total_limit=2)
    stalls = []

    class Timed(transformers.Trainer):
        def _maybe_log_save_evaluate(self, *a, **kw):
            saving = self.control.should_save
            t0 = time.perf_counter()
            super()._maybe_log_save_evaluate(*a, **kw)
            if saving and self.state.global_step < steps:
                stalls.append(time.perf_counter() - t0)

    trainer = Timed(model=model, args=args, train_dataset=rows, callbacks=callbacks)
    trainer.train()
    newest = max(Path(output_dir).glob("checkpoint-*"), key=lambda p: int(p.name.split("-")[1]))
    size = sum(p.stat().st_size for p in newest.rglob("*") if p.is_file())
    return stalls, size


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--width", type=int, default=256)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--saves", type=int, default=4)
    parser.add_argument("--rate", type=float, default=20e6, help="the mount's write rate, bytes/s (default 20e6)")
    parser.add_argument("--no-mount", action="store_true", help="use a local folder instead of the FUSE mount")
    args = parser.parse_args()
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    import torch
    import transformers
    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory(prefix="colabkit-hf-bench-") as tmp:
        tmp = Path(tmp)
        os.environ["XDG_CACHE_HOME"] = str(tmp / "cache")   # local staging of our own
        from drive_mount import fuse_unavailable_reason, mounted_drive

        import colabkit
        reason = "--no-mount" if args.no_mount else fuse_unavailable_reason()
        with contextlib.ExitStack() as stack:
            if reason is None:
                drive = stack.enter_context(mounted_drive(tmp / "fuse", rate=args.rate))
                mount, where = Path(drive.mountpoint) / "MyDrive", (
                    f"the Drive stand-in FUSE mount ({args.rate / 1e6:.0f} MB/s writes)")
            else:
                mount, where = tmp / "local", f"a local folder (no FUSE mount: {reason})"
            mount.mkdir(parents=True, exist_ok=True)
            direct, size = train(transformers, torch, mount / "direct-outputs", [], args.width, args.layers,
                                 args.saves)
            ar = colabkit.hf.AutoResume(mount / "runs", deadline=None, verbose=0)
            ours, _ = train(transformers, torch, tmp / "outputs", [ar], args.width, args.layers, args.saves)
            t0 = time.perf_counter()
            ar.checkpoints.wait(600)
            drain = time.perf_counter() - t0
            ar.close()
    base, mine = statistics.median(direct), statistics.median(ours)
    print(f"checkpoint-N: {size / 1e6:.1f} MB (GPT-2 width {args.width}, {args.layers} layers, with AdamW state); "
          f"Drive side: {where}; {len(direct)} saves each")
    print("| measure | seconds | ratio |")
    print("|---|---:|---:|")
    print(f"| Trainer saving checkpoint-N straight to the mount (baseline; median) | {base:.3f} | 1.0 |")
    print(f"| Trainer + colabkit.hf.AutoResume: local output_dir + save_folder (median) | {mine:.3f} | "
          f"{mine / base:.3f} x baseline ({base / mine:.1f}x less stall) |")
    print(f"| slowest save: direct / colabkit | {max(direct):.3f} / {max(ours):.3f} | "
          f"{max(ours) / max(direct):.3f} |")
    print(f"| after train() returned: waiting for the uploads still running | {drain:.3f} | |")


if __name__ == "__main__":
    main()
