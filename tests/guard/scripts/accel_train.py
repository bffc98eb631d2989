"""An accelerate script in the shape of accelerate's examples: accelerator.save_state(output_dir/step_N) every N
steps, --resume_from_checkpoint PATH loads it and skips the steps its name says. Deterministic on the CPU."""
import argparse
import json
import os
import time

import torch
from accelerate import Accelerator


def batch(step):
    g = torch.Generator().manual_seed(7 + step)
    x = torch.randn(16, 8, generator=g)
    return x, (x[:, :4].sum(1, keepdim=True) > 0).float()


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--output_dir", required=True)
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--checkpointing_steps", type=int, default=5)
    p.add_argument("--sleep", type=float, default=0.05)
    p.add_argument("--resume_from_checkpoint")
    args = p.parse_args()
    accelerator = Accelerator(cpu=True)
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=10, gamma=0.5)
    model, opt, sched = accelerator.prepare(model, opt, sched)
    start = 0
    if args.resume_from_checkpoint:
        accelerator.load_state(args.resume_from_checkpoint)
        start = int(os.path.basename(args.resume_from_checkpoint.rstrip("/")).split("_")[-1])
        accelerator.print(f"resumed from step {start}")
    for step in range(start, args.steps):
        x, y = batch(step)
        loss = torch.nn.functional.binary_cross_entropy_with_logits(model(x), y)
        accelerator.backward(loss)
        opt.step()
        sched.step()
        opt.zero_grad()
        if (step + 1) % args.checkpointing_steps == 0:
            accelerator.save_state(os.path.join(args.output_dir, f"step_{step + 1}"))
        accelerator.print(f"step {step + 1} loss {loss.item():.6f}")
        time.sleep(args.sleep)
    params = [p.detach().double().flatten().tolist() for p in accelerator.unwrap_model(model).parameters()]
    with open(os.path.join(args.output_dir, "result.json"), "w") as fh:
        json.dump({"params": params, "started_from": start}, fh)


if __name__ == "__main__":
    main()
