"""`colabkit demo`: a Keras (or, with ``--framework torch``, a PyTorch) run cut by a (simulated) session cap,
then resumed on a fresh "VM".

Session 1 trains with AutoResume until the cap is near, saves and stops. Then the local disk is wiped,
as when Colab reclaims a VM (Drive survives). Session 2, a new process, resumes from Drive and finishes.
Runs on CPU in well under two minutes, with no GPU, no Google account and no network.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from .units import format_duration, parse_duration


def _train_session(directory: str, cap: float | None, epochs: int, report: Path) -> None:
    """One session in its own process: build the model, fit with AutoResume, write what happened."""
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    import keras
    import numpy as np

    import colabkit

    keras.utils.set_random_seed(0)
    rng = np.random.RandomState(0)
    x = rng.normal(size=(12000, 32)).astype("float32")
    y = ((x[:, :16] ** 2).sum(axis=1) > (x[:, 16:] ** 2).sum(axis=1)).astype("float32")
    x_train, y_train, x_test, y_test = x[:10000], y[:10000], x[10000:], y[10000:]
    model = keras.Sequential([keras.Input((32,)), keras.layers.Dense(256, activation="relu"),
                              keras.layers.Dropout(0.1), keras.layers.Dense(256, activation="relu"),
                              keras.layers.Dense(1, activation="sigmoid")])
    model.compile(optimizer="adam", loss="binary_crossentropy", metrics=["accuracy"])
    auto = colabkit.keras.AutoResume(directory, save_freq=100, deadline=cap, deadline_margin="1s", verbose=0)
    started = time.time()
    model.fit(x_train, y_train, batch_size=32, epochs=epochs, shuffle=False, verbose=0, callbacks=[auto])
    finished = not model.stop_training
    accuracy = float(model.evaluate(x_test, y_test, verbose=0)[1]) if finished else None
    report.write_text(json.dumps({
        "started": started, "events": auto.events, "finished": finished, "accuracy": accuracy,
        "destination": str(auto.checkpoints.destination), "local": str(auto.checkpoints.local.path),
        "steps": auto._step}))


def _train_session_torch(directory: str, cap: float | None, epochs: int, report: Path) -> None:
    """The same session with a PyTorch loop: a shuffling DataLoader, dropout, Adam, colabkit.torch.AutoResume."""
    import numpy as np
    import torch

    import colabkit

    torch.set_num_threads(1)
    torch.manual_seed(0)
    rng = np.random.RandomState(0)
    x = torch.from_numpy(rng.normal(size=(12000, 32)).astype("float32"))
    y = ((x[:, :16] ** 2).sum(1) > (x[:, 16:] ** 2).sum(1)).float().unsqueeze(1)
    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x[:10000], y[:10000]), batch_size=32,
                                         shuffle=True, generator=torch.Generator().manual_seed(1))
    model = torch.nn.Sequential(torch.nn.Linear(32, 256), torch.nn.ReLU(), torch.nn.Dropout(0.1),
                                torch.nn.Linear(256, 256), torch.nn.ReLU(), torch.nn.Linear(256, 1))
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    ar = colabkit.torch.AutoResume(directory, model=model, opt=opt, save_freq=100, deadline=cap,
                                   deadline_margin="1s", verbose=0)
    # session 1 stands for a bigger model: paced so that its epochs outlast the cap on any machine, however fast
    pace = 2 * cap / (epochs * len(loader)) if cap else 0.0
    started, finished = time.time(), False
    try:
        for _ in ar.epochs(epochs):
            model.train()
            for xb, yb in ar.batches(loader):
                opt.zero_grad()
                torch.nn.functional.binary_cross_entropy_with_logits(model(xb), yb).backward()
                opt.step()
                if pace:
                    time.sleep(pace)
        finished = True
    except colabkit.torch.Stopped:
        pass
    accuracy = None
    if finished:
        ar.events.append((time.time(), "end of training", f"step {ar.step} (epoch {ar.epoch})"))
        model.eval()
        with torch.no_grad():
            accuracy = float(((model(x[10000:]) > 0).float() == y[10000:]).float().mean())
    report.write_text(json.dumps({
        "started": started, "events": ar.events, "finished": finished, "accuracy": accuracy,
        "destination": str(ar.checkpoints.destination), "local": str(ar.checkpoints.local.path),
        "steps": ar.step}))


FRAMEWORKS = {"keras": (_train_session, "Keras"), "torch": (_train_session_torch, "PyTorch")}


def _run_session(directory, cap, epochs, workdir: Path, n: int, framework: str = "keras") -> dict:
    report = workdir / f"session{n}.json"
    cmd = [sys.executable, "-m", "colabkit.demo", "--dir", directory, "--epochs", str(epochs),
           "--framework", framework, "--session-report", str(report)] + (
               ["--session-cap", str(cap)] if cap else [])
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        raise RuntimeError(f"demo session {n} failed (exit {proc.returncode}):\n{proc.stderr[-3000:]}")
    return json.loads(report.read_text())


def _print_timeline(title: str, session: dict) -> None:
    """One line per event; a run of periodic saves is shown as its first and last with a count between."""
    print(title)
    events, i = session["events"], 0
    while i < len(events):
        j = i
        while j + 1 < len(events) and events[j + 1][1] == "save" == events[i][1]:
            j += 1
        shown = [events[i]] if j - i < 3 else [events[i], None, events[j]]
        if 0 < j - i < 3:
            shown = events[i:j + 1]
        for event in shown:
            if event is None:
                print(f"  {'':>8}  {'':<13} ... {j - i - 1} more saves")
            else:
                at, kind, detail = event
                print(f"  {at - session['started']:+7.1f}s  {kind:<13} {detail}")
        i = j + 1


def run_demo(cap="8s", epochs: int = 30, directory: str | None = None, framework: str = "keras") -> dict:
    """Run the two-session demo and print its timeline; returns both sessions' reports.
    ``framework``: "keras" (colabkit.keras.AutoResume in model.fit) or "torch" (colabkit.torch.AutoResume in a
    plain PyTorch loop)."""
    if framework not in FRAMEWORKS:
        raise ValueError(f"framework={framework!r} is not one of {sorted(FRAMEWORKS)}.")
    cap_s = parse_duration(cap, name="cap")
    if isinstance(epochs, bool) or not isinstance(epochs, int) or epochs < 1:
        raise ValueError(f"epochs={epochs!r} must be a whole number of at least 1.")
    directory = directory or f"drive:colabkit-demo/run-{time.strftime('%Y%m%d-%H%M%S')}"
    print(f"colabkit demo: a {epochs}-epoch {FRAMEWORKS[framework][1]} run with a simulated "
          f"{format_duration(cap_s)} session cap")
    print(f"checkpoints go to {directory}")
    t0 = time.time()
    with tempfile.TemporaryDirectory(prefix="colabkit-demo-") as tmp:
        first = _run_session(directory, cap_s, epochs, Path(tmp), 1, framework)
        _print_timeline(f"\nsession 1 (cap at +{cap_s:.1f}s)", first)
        if first["finished"]:
            print("  (training finished before the cap; use a shorter --cap or more --epochs to see a cut)")
        shutil.rmtree(first["local"], ignore_errors=True)
        print("\nthe VM is reclaimed: its local disk (checkpoint staging included) is gone; Drive remains")
        second = _run_session(directory, None, epochs, Path(tmp), 2, framework)
        _print_timeline("\nsession 2 (a fresh VM: re-run the same cell)", second)
    print(f"\ndone in {format_duration(time.time() - t0)}: {second['steps']} batches trained in total, "
          f"test accuracy {second['accuracy']:.3f}")
    print(f"checkpoints: {second['destination']}")
    return {"session1": first, "session2": second}


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(prog="python -m colabkit.demo")
    parser.add_argument("--session-report", help=argparse.SUPPRESS)
    parser.add_argument("--session-cap", type=float, help=argparse.SUPPRESS)
    parser.add_argument("--dir")
    parser.add_argument("--cap", default="8s")
    parser.add_argument("--epochs", type=int, default=30)
    parser.add_argument("--framework", choices=sorted(FRAMEWORKS), default="keras")
    args = parser.parse_args(argv)
    if args.session_report:
        FRAMEWORKS[args.framework][0](args.dir, args.session_cap, args.epochs, Path(args.session_report))
    else:
        run_demo(args.cap, args.epochs, args.dir, args.framework)


if __name__ == "__main__":
    main()
