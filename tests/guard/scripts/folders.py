"""A training script that writes numbered checkpoint folders as the HF Trainer does (checkpoint-N, with
trainer_state.json written last) and resumes with --resume_from_checkpoint PATH. Pure Python, deterministic:
its result after S steps is the same however often it was stopped and resumed."""
import argparse
import json
import os
import signal
import sys
import time


def advance(value: int, step: int) -> int:
    return (value * 31 + step * 7 + 1) % 1_000_003


def save(out: str, step: int, value: int, marker: bool = True) -> str:
    folder = os.path.join(out, f"checkpoint-{step}")
    os.makedirs(folder, exist_ok=True)
    with open(os.path.join(folder, "model.bin"), "wb") as fh:
        fh.write(value.to_bytes(8, "little") * 4096)
    with open(os.path.join(folder, "optimizer.pt"), "wb") as fh:
        fh.write(os.urandom(8192))
    if marker:
        with open(os.path.join(folder, "trainer_state.json"), "w") as fh:
            json.dump({"global_step": step, "value": value}, fh)
    return folder


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--out", required=True)
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--save-every", type=int, default=4)
    p.add_argument("--sleep", type=float, default=0.05)
    p.add_argument("--resume_from_checkpoint")
    p.add_argument("--crash-at", type=int, help="exit 3 at this step (only when not resumed)")
    p.add_argument("--half-at", type=int, help="at this step write a folder without its marker, then stall")
    p.add_argument("--exit-code", type=int, default=0)
    p.add_argument("--save-on-signal", action="store_true", help="on SIGINT: save, then exit with --exit-code")
    args = p.parse_args()
    os.makedirs(args.out, exist_ok=True)
    step, value = 0, 1
    if args.resume_from_checkpoint:
        with open(os.path.join(args.resume_from_checkpoint, "trainer_state.json")) as fh:
            state = json.load(fh)
        with open(os.path.join(args.resume_from_checkpoint, "model.bin"), "rb") as fh:
            assert int.from_bytes(fh.read(8), "little") == state["value"]
        step, value = state["global_step"], state["value"]
        print(f"resumed from step {step}", flush=True)
    started = step
    stop = []
    if args.save_on_signal:
        signal.signal(signal.SIGINT, lambda *a: stop.append(1))
    while step < args.steps:
        step += 1
        value = advance(value, step)
        sys.stdout.write(f"\rstep {step}/{args.steps}")
        sys.stdout.flush()
        if args.crash_at == step and not args.resume_from_checkpoint:
            print(f"\ncrash at step {step}", file=sys.stderr, flush=True)
            sys.exit(3)
        if args.half_at == step:
            save(args.out, step, value, marker=False)
            time.sleep(3600)
        if step % args.save_every == 0:
            save(args.out, step, value)
        if stop:
            save(args.out, step, value)
            print(f"\nsaved step {step} on signal", flush=True)
            sys.exit(args.exit_code)
        time.sleep(args.sleep)
    print(f"\ndone at step {step}", flush=True)
    print("a line on stderr", file=sys.stderr, flush=True)
    with open(os.path.join(args.out, "result.json"), "w") as fh:
        json.dump({"value": value, "started_from": started, "steps": step}, fh)
    sys.exit(args.exit_code)


if __name__ == "__main__":
    main()
