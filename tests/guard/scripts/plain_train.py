"""A plain PyTorch script that rewrites last.pt in place (torch.save) every N steps and resumes with
--resume PATH. Deterministic: the data of each step comes from a generator seeded with the step."""
import argparse
import json
import os
import time

import torch


def batch(step):
    g = torch.Generator().manual_seed(1000 + step)
    x = torch.randn(16, 8, generator=g)
    return x, x.sum(1, keepdim=True) * 0.5


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--out", required=True)
    p.add_argument("--steps", type=int, default=40)
    p.add_argument("--save-every", type=int, default=5)
    p.add_argument("--sleep", type=float, default=0.05)
    p.add_argument("--resume")
    args = p.parse_args()
    os.makedirs(args.out, exist_ok=True)
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 1))
    opt = torch.optim.Adam(model.parameters(), lr=0.01)
    step = 0
    if args.resume:
        ck = torch.load(args.resume, weights_only=True)
        model.load_state_dict(ck["model"])
        opt.load_state_dict(ck["opt"])
        step = ck["step"]
        print(f"resumed from step {step}", flush=True)
    started = step
    while step < args.steps:
        x, y = batch(step)
        loss = torch.nn.functional.mse_loss(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        step += 1
        if step % args.save_every == 0:
            torch.save({"model": model.state_dict(), "opt": opt.state_dict(), "step": step},
                       os.path.join(args.out, "last.pt"))
        print(f"step {step} loss {loss.item():.6f}", flush=True)
        time.sleep(args.sleep)
    params = [p.detach().double().flatten().tolist() for p in model.parameters()]
    with open(os.path.join(args.out, "result.json"), "w") as fh:
        json.dump({"params": params, "started_from": started}, fh)


if __name__ == "__main__":
    main()
