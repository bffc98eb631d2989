"""Training scripts that meet the guard's stop in the ways that went wrong, each told by marker files where it
is, so that the tests wait on files rather than on time:

* ``interrupt``: saves in ``except KeyboardInterrupt`` (as many scripts do), only once the test has created
  ``go`` after the signal: a second SIGINT meanwhile interrupts the save.
* ``periodic``: its periodic checkpoint-1 is still settling when the stop signal comes; it then writes its final
  checkpoint-2 slowly (trainer_state.json last, after checkpoint-1 is committed at the destination and 3 s more).
* ``accel``: accelerate's save_state order (model, random_states_0.pkl, then custom_checkpoint_0.pkl); step_1 is
  whole, then it dies in the middle of step_2, after random_states_0.pkl.
"""
import argparse
import json
import os
import signal
import sys
import time


def wait_for(condition, timeout=30.0):
    end = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > end:
            sys.exit(f"timed out after {timeout}s")
        time.sleep(0.02)


def committed(dest, step):
    from colabkit.checkpoints.folder import CheckpointFolder
    return os.path.isdir(dest) and any(c.step == step for c in CheckpointFolder(dest).committed())


def trainer_folder(out, step, marker=True):
    folder = os.path.join(out, f"checkpoint-{step}")
    os.makedirs(folder, exist_ok=True)
    with open(os.path.join(folder, "model.bin"), "wb") as fh:
        fh.write(bytes([step]) * 65536)
    if marker:
        with open(os.path.join(folder, "trainer_state.json"), "w") as fh:
            json.dump({"global_step": step}, fh)


def accel_folder(out, step, die_after_random_states=False):
    folder = os.path.join(out, f"step_{step}")
    os.makedirs(folder, exist_ok=True)
    for name in ("model.safetensors", "optimizer.bin", "random_states_0.pkl", "custom_checkpoint_0.pkl"):
        with open(os.path.join(folder, name), "wb") as fh:
            fh.write(bytes([step]) * 4096)
        if die_after_random_states and name == "random_states_0.pkl":
            os._exit(1)   # killed in the middle of save_state (out of memory, a preempted worker)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("mode", choices=("interrupt", "periodic", "accel"))
    p.add_argument("--out", required=True)
    p.add_argument("--marks", required=True)
    p.add_argument("--dest")
    args = p.parse_args()
    os.makedirs(args.out, exist_ok=True)
    mark = lambda name: open(os.path.join(args.marks, name), "w").close()  # noqa: E731
    marked = lambda name: os.path.exists(os.path.join(args.marks, name))  # noqa: E731

    if args.mode == "interrupt":
        try:
            mark("ready")
            while True:
                time.sleep(0.05)
        except KeyboardInterrupt:
            mark("caught")
            wait_for(lambda: marked("go"))
            trainer_folder(args.out, 1)
            print("saved step 1 on KeyboardInterrupt", flush=True)
    elif args.mode == "periodic":
        stop = []
        signal.signal(signal.SIGINT, lambda *a: stop.append(1))
        signal.signal(signal.SIGTERM, lambda *a: (mark("terminated"), os._exit(143)))
        trainer_folder(args.out, 1)
        mark("ready")
        wait_for(lambda: stop)
        trainer_folder(args.out, 2, marker=False)
        wait_for(lambda: committed(args.dest, 1))
        time.sleep(3)
        trainer_folder(args.out, 2)
        print("saved step 2 on SIGINT", flush=True)
    else:
        accel_folder(args.out, 1)
        wait_for(lambda: committed(args.dest, 1))
        accel_folder(args.out, 2, die_after_random_states=True)


if __name__ == "__main__":
    main()
