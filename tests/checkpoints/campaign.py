#!/usr/bin/env python3
"""Fault campaign on the checkpoint store, in the spirit of SQLite's I/O-error tests and of crash-consistency
checkers (ALICE, CrashMonkey): every filesystem operation of a whole cycle is made to fail in turn, and a
kill -9 lands at every one, then a fresh "VM" (a new process, an empty local staging folder) must restore.

Cycles (each trial starts from a copy of a prepared destination on the Drive mount stand-in, drivefs.py):

* ``save``: a VM that resumed step 3 of a folder holding steps 1, 2, 3 (keep=3) saves step 4 and closes:
  snapshot, local commit, lease, upload, manifest, retention.
* ``save-local``: the same save, on a mount that shows as a FUSE filesystem over a local disk
  (``fuse.mergerfs``) with no ``local_dir``: the store writes and commits the checkpoint there directly, once,
  and stages it locally only when that fails.
* ``restore``: a fresh VM restores a folder holding steps 100, 200, 300.

Faults, at operation k = 1..N of the cycle (N counted by a dry run of the same cycle):
``EIO``, ``ENOTCONN``, ``ENOSPC``, ``ETIMEDOUT`` (that one operation fails), ``drop`` (operation k and every
later one fail with ENOTCONN: the mount drops) and ``kill`` (the process is SIGKILLed at operation k).

After each trial, with the mount healthy again, a fresh process restores and the outcome is one of:
``ok``; ``lost`` (a checkpoint committed before the fault, or committed by the trial, and kept by the
retention policy is gone); ``wrong`` (the fresh restore did not give the newest verified checkpoint with its
content); ``restart`` (the trial's own restore returned nothing, or an older step, without an error). For the
restore cycle a clear CheckpointError is an acceptable answer; silently starting over is not.

Usage (also what tests/checkpoints/test_fault_campaign.py and bench/fault_campaign.py run)::

    python tests/checkpoints/campaign.py fuse WORKDIR [--workers 2] [--stride 1] [--json OUT]

Each worker is one process with its own FUSE mount; it forks one child per trial (no threads exist in the
worker when it forks; the store's threads live in the children). Trials are handed out one at a time to whichever
worker is free, so that a few slow trials (a fault the store waits out) do not hold up a worker's whole share.
"""
from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent.parent
sys.path[:0] = [str(REPO), str(REPO / "tests" / "standins")]

KINDS = {
    "EIO": ("fail-op {k} EIO", False),
    "ENOTCONN": ("fail-op {k} ENOTCONN", False),
    "ENOSPC": ("fail-op {k} ENOSPC", False),
    "ETIMEDOUT": ("fail-op {k} ETIMEDOUT", False),
    "drop": ("drop-at {k} ENOTCONN", True),
    "kill": ("kill-at {k}", True),
}
CYCLES = {"save": ([1, 2, 3], 4), "save-local": ([1, 2, 3], 4), "restore": ([100, 200, 300], None)}
LOCAL_DISK_SUBTYPE = "mergerfs"   # colabkit.mounts counts fuse.mergerfs as a local disk
KEEP = 3
NEVER = 10 ** 9


def state(step: int) -> dict:
    import numpy as np
    return {"w": np.full(20_000, float(step)), "step": step, "note": f"step {step}"}


def _quick_retries() -> None:
    from colabkit.checkpoints import uploader
    uploader.BACKOFF_START, uploader.BACKOFF_MAX = 0.005, 0.05


def set_control(control: Path, text: str) -> None:
    tmp = control.with_name(control.name + ".tmp")
    tmp.write_text(text + "\n", encoding="utf-8")
    os.replace(tmp, control)


# -- what runs in the forked children ------------------------------------------------------------------
def _prepare(template: Path, steps: list[int], local: Path) -> None:
    import colabkit
    with colabkit.Checkpoints(str(template), local_dir=local, keep=KEEP) as ckpt:
        for step in steps:
            ckpt.save(step, state(step), wait=True)


def _save_trial(dest: Path, local: Path, control: Path, fault: str, persistent: bool, out: Path,
                staged: bool = True) -> None:
    """``staged=False``: no local_dir, the default staging folder under ``local`` (an empty cache)."""
    import colabkit
    _quick_retries()
    if not staged:
        os.environ["XDG_CACHE_HOME"] = str(local)
    ckpt = colabkit.Checkpoints(str(dest), local_dir=local if staged else None, keep=KEEP, read_timeout=5)
    restored = ckpt.restore()
    out.write_text(json.dumps({"resumed": None if restored is None else restored.step}))
    set_control(control, fault)
    ckpt.save(4, state(4))
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and not ckpt.wait(0.02):
        if persistent and ckpt.status.state == "retrying":
            break   # the mount stays down: the upload will not succeed in this trial
    ckpt.close(timeout=0.2 if persistent else 10)
    result = json.loads(out.read_text())
    result["staged"] = sorted(str(p.parent.relative_to(local)) for p in local.rglob("MANIFEST.json"))
    out.write_text(json.dumps(result))


def _restore_trial(dest: Path, local: Path, control: Path, fault: str, out: Path) -> None:
    import colabkit
    ckpt = colabkit.Checkpoints(str(dest), local_dir=local, keep=KEEP, read_timeout=1)
    set_control(control, fault)
    try:
        restored = ckpt.restore()
    except colabkit.CheckpointError as exc:
        result = {"error": str(exc)}
    else:
        result = {"restored": None if restored is None else restored.step,
                  "content_ok": restored is not None and _content_ok(restored)}
    out.write_text(json.dumps(result))
    ckpt.close(timeout=0.2)


def _content_ok(restored) -> bool:
    s = restored.state
    return (s.get("step") == restored.step and s.get("note") == f"step {restored.step}"
            and bool((s["w"] == float(restored.step)).all()) and s["w"].shape == (20_000,))


def _check(backing: Path, dest: Path, local: Path, out: Path) -> None:
    """With the mount healthy: what Drive holds (verified, read behind the mount) and what a fresh VM gets."""
    from colabkit.checkpoints.folder import CheckpointFolder
    check_outcome(CheckpointFolder(backing), str(dest), local, out)


def check_outcome(folder, location: str, local: Path, out: Path) -> None:
    """Write to ``out`` the steps ``folder`` holds verified, and what a fresh Checkpoints on ``location``
    (with the empty staging folder ``local``) restores."""
    import colabkit
    from colabkit.checkpoints.folder import CorruptCheckpoint
    verified = []
    for info in folder.committed():
        try:
            folder.verify(info, full=True)
            verified.append(info.step)
        except CorruptCheckpoint:
            pass
    result = {"verified": sorted(verified)}
    try:
        with colabkit.Checkpoints(location, local_dir=local, read_timeout=5) as ckpt:
            restored = ckpt.restore()
        result["fresh_restore"] = None if restored is None else restored.step
        result["fresh_content_ok"] = restored is not None and _content_ok(restored)
    except Exception as exc:  # noqa: BLE001 - recorded as the outcome
        result["fresh_error"] = f"{type(exc).__name__}: {exc}"
    out.write_text(json.dumps(result))


def _in_child(fn, *args) -> int:
    """Run ``fn(*args)`` in a forked child; its exit status (negative: killed by that signal)."""
    pid = os.fork()
    if pid == 0:
        code = 0
        try:
            import warnings
            warnings.simplefilter("ignore")
            fn(*args)
        except BaseException as exc:  # noqa: BLE001 - reported through the exit code and stderr
            print(f"campaign child: {type(exc).__name__}: {exc}", file=sys.stderr)
            code = 70
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    return -os.WTERMSIG(status) if os.WIFSIGNALED(status) else os.WEXITSTATUS(status)


# -- one worker: a mount, dry runs, then its share of the trials ----------------------------------------------
def _read(path: Path) -> dict:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return {}


def _judge(cycle: str, trial: dict, check: dict) -> tuple[str, str]:
    before, new_step = CYCLES[cycle]
    verified = set(check.get("verified", []))
    committed = before + ([new_step] if new_step in verified else [])
    required = set(committed[-KEEP:])
    if not required <= verified:
        return "lost", f"missing {sorted(required - verified)}; verified {sorted(verified)}"
    newest = max(verified)
    if check.get("fresh_restore") != newest or not check.get("fresh_content_ok"):
        return "wrong", f"fresh restore gave {check.get('fresh_restore')} ({check.get('fresh_error', '')}), " \
                        f"newest verified is {newest}"
    if cycle == "restore" and "error" not in trial and trial:
        if trial.get("restored") != before[-1] or not trial.get("content_ok"):
            return "restart", f"restore under the fault gave {trial.get('restored')} without an error"
    if cycle == "save" and trial and trial.get("resumed") != before[-1]:
        return "restart", f"the trial resumed {trial.get('resumed')}"
    return "ok", "error" if "error" in trial else ""


def worker(workdir: Path, index: int, cycles: list[str]) -> None:
    os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
    from drive_mount import mounted_drive
    import colabkit.checkpoints.api  # noqa: F401 - loaded once, before the forks
    import numpy  # noqa: F401

    base = workdir / f"w{index}"
    shutil.rmtree(base, ignore_errors=True)
    base.mkdir(parents=True)
    os.environ["XDG_CACHE_HOME"] = str(base / "cache")
    with contextlib.ExitStack() as mounts:
        mount = mounts.enter_context(mounted_drive(base, rate=None))
        local_disk = None
        if "save-local" in cycles:
            local_disk = mounts.enter_context(mounted_drive(
                base / "local-disk", rate=None, extra_args=["--subtype", LOCAL_DISK_SUBTYPE]))
        counter = 0

        def fresh(name):
            nonlocal counter
            counter += 1
            return base / f"{name}{counter}"

        templates = {}
        for cycle, (steps, _) in CYCLES.items():
            templates[cycle] = base / f"template-{cycle}"
            assert _in_child(_prepare, templates[cycle], steps, fresh("prep")) == 0

        def run(cycle: str, fault: str, persistent: bool) -> tuple[dict, dict, int, int]:
            on = local_disk if cycle == "save-local" else mount
            name = f"t{index}-{fresh('n').name}"
            shutil.copytree(templates[cycle], on.backing / "MyDrive" / name)
            dest, out = on.my_drive / name, fresh("out")
            set_control(on.control, "ok")
            if cycle == "restore":
                code = _in_child(_restore_trial, dest, fresh("vm"), on.control, fault, out)
            else:
                code = _in_child(_save_trial, dest, fresh("vm"), on.control, fault, persistent, out,
                                 cycle == "save")
            from drivefs import read_count
            ops = read_count(on.control)
            set_control(on.control, "ok")
            check_out = fresh("check")
            _in_child(_check, on.backing / "MyDrive" / name, dest, fresh("vm"), check_out)
            return _read(out), _read(check_out), code, ops

        for cycle in cycles:
            # the dry run counts the operations, and shows where the save was staged
            dry, _, _, n_ops = run(cycle, f"fail-op {NEVER} EIO", False)
            print(json.dumps({"cycle": cycle, "operations": n_ops, "staged": dry.get("staged")}), flush=True)

        def trial(cycle: str, kind: str, k: int) -> dict:
            template, persistent = KINDS[kind]
            started = time.monotonic()
            for _attempt in range(3):
                trial, check, code, ops = run(cycle, template.format(k=k), persistent)
                # a run may make an operation fewer than the dry run counted (readahead, a background thread's
                # timing): a kill at its last operations then never fires, and the trial is tried again
                if kind != "kill" or code == -signal.SIGKILL or ops >= k:
                    break
            outcome, detail = _judge(cycle, trial, check)
            if kind == "kill" and code != -signal.SIGKILL:
                detail = f"not killed (exit {code}, {ops} operations counted); {detail}"
            return {"cycle": cycle, "kind": kind, "k": k, "outcome": outcome, "detail": detail, "exit": code,
                    "seconds": round(time.monotonic() - started, 3)}

        serve_trials(trial)


def serve_trials(trial) -> None:
    """A worker's main loop: read trials from stdin, one JSON line each ({"cycle", "kind", "k"}), and write
    ``trial(cycle, kind, k)`` for each as one JSON line, until stdin closes. Each line is flushed before the worker
    forks again, so that no child inherits (and writes out a second time) buffered output."""
    while True:
        line = sys.stdin.readline()
        if not line:
            return
        job = json.loads(line)
        print(json.dumps(trial(job["cycle"], job["kind"], job["k"])), flush=True)


def run_campaign(workdir: Path, *, workers: int = 2, stride: int = 1, cycles=tuple(CYCLES),
                 kinds=tuple(KINDS), script: str = __file__) -> dict:
    """Run the campaign in ``workers`` processes (``script worker WORKDIR INDEX CYCLES``: this one, or
    gdrive_campaign.py). Each worker first prints one line per cycle from its dry run ({"cycle", "operations",
    ...}); then the trials, every k = 1, 1 + stride, ... up to the most operations any worker counted, for each
    fault kind, go one at a time to whichever worker is free and counted at least k operations in that cycle (a
    fault at an operation that worker's cycle never reaches would not fire).
    Returns {"trials": [...], "operations": {cycle: N, the fewest any worker's dry run counted: readahead can
    add one}, "staged": {cycle: the checkpoints a healthy run of a save cycle left in local staging}, "seconds":
    wall time}."""
    started = time.monotonic()
    workdir.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    logs = [workdir / f"worker{i}.stderr" for i in range(workers)]
    procs = []
    for i, log in enumerate(logs):
        with open(log, "w") as err:
            procs.append(subprocess.Popen([sys.executable, script, "worker", str(workdir), str(i), ",".join(cycles)],
                                          stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=err, text=True,
                                          env=env))
    trials, operations, most, staged = [], {}, {}, {}
    counted = {p: {} for p in procs}
    try:
        for p in procs:   # each worker's dry runs: the fewest operations is what every worker covers
            for _ in cycles:
                line = p.stdout.readline()
                if not line:
                    break
                row = json.loads(line)
                n = counted[p][row["cycle"]] = row["operations"]
                operations[row["cycle"]] = min(n, operations.get(row["cycle"], n))
                most[row["cycle"]] = max(n, most.get(row["cycle"], n))
                staged[row["cycle"]] = row.get("staged")
        jobs = [{"cycle": cycle, "kind": kind, "k": k} for cycle in cycles if cycle in most for kind in kinds
                for k in range(1, most[cycle] + 1, stride)]
        # a seeded shuffle spreads the trials that mostly wait (a fault the store waits out: a restore's read
        # timeout, a lease record watched for renewals) over the run, where they overlap with other workers' busy
        # trials, instead of bunching them up (the same k of every kind, or one whole kind at the end)
        random.Random(0).shuffle(jobs)
        lock = threading.Lock()

        def feed(p: subprocess.Popen) -> None:
            while True:
                with lock:
                    mine = next((i for i, j in enumerate(jobs) if j["k"] <= counted[p].get(j["cycle"], 0)), None)
                    if mine is None:
                        break
                    job = jobs.pop(mine)
                try:
                    p.stdin.write(json.dumps(job) + "\n")
                    p.stdin.flush()
                except OSError:   # the worker died: the others take the remaining trials, and it is reported
                    return
                line = p.stdout.readline()
                if not line:
                    return
                row = json.loads(line)
                with lock:
                    trials.append(row)
            p.stdin.close()

        threads = [threading.Thread(target=feed, args=(p,), daemon=True) for p in procs]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    finally:
        for p in procs:
            with contextlib.suppress(OSError):
                p.stdin.close()
        for p in procs:
            p.wait()
    errors = [log.read_text(errors="replace")[-3000:] for p, log in zip(procs, logs) if p.returncode != 0]
    if errors:
        raise RuntimeError("a campaign worker failed:\n" + "\n".join(errors))
    if set(operations) != set(cycles) or jobs:
        raise RuntimeError(f"the campaign workers stopped early (dry runs: {sorted(operations)}, {len(jobs)} trials "
                           f"not run)")
    trials.sort(key=lambda t: (list(cycles).index(t["cycle"]), list(kinds).index(t["kind"]), t["k"]))
    return {"trials": trials, "operations": operations, "staged": staged, "seconds": time.monotonic() - started}


def table(result: dict, kinds=KINDS, unit: str = "operations") -> str:
    """Markdown: fault kind x operations covered x trials -> lost commits, wrong resumes, silent restarts."""
    lines = [f"| cycle | fault | {unit} covered | trials | lost commits | wrong resumes | silent restarts |",
             "|---|---|---|---|---|---|---|"]
    for cycle in CYCLES:
        for kind in kinds:
            rows = [t for t in result["trials"] if t["cycle"] == cycle and t["kind"] == kind]
            if not rows:
                continue
            count = {o: sum(t["outcome"] == o for t in rows) for o in ("lost", "wrong", "restart")}
            lines.append(f"| {cycle} | {kind} | {len({t['k'] for t in rows})} of {result['operations'][cycle]} | "
                         f"{len(rows)} | {count['lost']} | {count['wrong']} | {count['restart']} |")
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    fuse = sub.add_parser("fuse", help="run the campaign on the Drive mount stand-in")
    fuse.add_argument("workdir", type=Path)
    fuse.add_argument("--workers", type=int, default=2)
    fuse.add_argument("--stride", type=int, default=1, help="try every n-th operation only (default: all)")
    fuse.add_argument("--json", type=Path, help="write every trial's outcome here")
    w = sub.add_parser("worker")
    for name in ("workdir", "index", "cycles"):
        w.add_argument(name)
    args = parser.parse_args(argv)
    if args.command == "worker":
        worker(Path(args.workdir), int(args.index), args.cycles.split(","))
        return 0
    result = run_campaign(args.workdir, workers=args.workers, stride=args.stride)
    if args.json:
        args.json.write_text(json.dumps(result, indent=1))
    return report(result, table(result))


def report(result: dict, text: str) -> int:
    """Print the table and the first trials that went wrong; the exit status (1 if any did)."""
    print(text)
    print(f"\n{len(result['trials'])} trials in {result['seconds']:.0f}s")
    bad = [t for t in result["trials"] if t["outcome"] != "ok"]
    for t in bad[:30]:
        print(f"  {t['cycle']} {t['kind']} k={t['k']}: {t['outcome']}: {t['detail']}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
