"""The `colabkit` command: thin subcommands over colabkit's Python functions."""
from __future__ import annotations

import argparse
import os
import sys
import warnings

from ._version import __version__


def _cmd_status(args) -> int:
    from .summary import status
    s = status()
    print(s.json() if args.json else s.text())
    return 0


def _cmd_config(args) -> int:
    from .summary import config_report
    print(config_report())
    return 0


def _cmd_demo(args) -> int:
    from .demo import run_demo
    run_demo(cap=args.cap, epochs=args.epochs, directory=args.dir, framework=args.framework)
    return 0


def _cmd_checkpoints(args) -> int:
    from .checkpoints.report import checkpoints_report
    text, ok = checkpoints_report(args.directory, verify=args.verify, as_json=args.json)
    print(text)
    return 0 if ok else 1


def _cmd_gpus(args) -> int:
    from .devices import gpus
    inventory = gpus()
    print(inventory.json() if args.json else inventory.table())
    return 0


def _cmd_health(args) -> int:
    import json

    from .health.flight_report import last_recording, text
    report = last_recording(minutes=args.minutes)
    print(json.dumps(report, indent=2, default=str) if args.json else text(report))
    return 0


def _cmd_costs(args) -> int:
    import json

    from .health.ledger import costs, costs_text
    data = costs(since=args.since, by=args.by)
    print(json.dumps(data, indent=2) if args.json else costs_text(data))
    return 0


def _cmd_run(args) -> int:
    from .jobs.cli import main_from_args
    return main_from_args(args)


def _cmd_guard(args) -> int:
    from .guard import run
    from .guard.options import run_kwargs
    command = args.passthrough or args.command_words
    if not command:
        raise ValueError("no training command: put it after --, e.g. colabkit guard --watch outputs/ --to "
                         "drive:runs/lora -- python train.py")
    return run(command[0] if len(command) == 1 and " " in command[0] else command, **run_kwargs(args))


def _cmd_drive(args) -> int:
    from . import gdrive
    if args.drive_command == "login":
        who = gdrive.login(service_account=args.service_account, client_secrets=args.client_secrets)
        print(f"Signed in to Google Drive as {who}; credentials saved to {gdrive.credentials_path()} (mode 0600).")
    else:
        print(f"{gdrive.connect().whoami()} (credentials: {gdrive.credentials_path()})")
    return 0


def _cmd_fetch(args) -> int:
    from .gdrive.links import fetch
    print(fetch(args.url, args.dest, quiet=args.quiet))
    return 0


def _cmd_stage(args) -> int:
    from .gdrive.staging import stage
    print(stage(args.src, args.dst, checksum=args.checksum, workers=args.workers))
    return 0


GUARD_HELP = """\
Run a training command you do not edit and keep its checkpoints safe.

Before launch, the newest verified checkpoint in --to is put back where it was under --watch, and --resume-arg
is appended to the command with {latest} replaced by its path (nothing to restore: the argument is left out, or
--fresh-arg is passed instead). While the command runs, each complete checkpoint it writes under --watch is
committed to --to in the background (kept: --keep). Before the runtime's deadline (--deadline) the command gets
--stop-signal and --grace to write its checkpoint; that is committed and uploaded, then the command is stopped
and one line says how to resume. Ctrl-C / SIGTERM to the guard do the same. The exit status is the command's.

Checkpoints (--pattern replaces these): folders checkpoint-* (HF Trainer, diffusers; complete once
trainer_state.json or random_states_0.pkl exists), checkpoint_*, step_*, epoch_* (accelerate save_state;
random_states_0.pkl); files *.ckpt (Lightning), last.pt, last.pth (YOLO, plain scripts),
network-snapshot-*.pkl (StyleGAN). Complete = unchanged for --settle, whole in its format, not open for writing.

examples:
  colabkit guard --watch outputs/ --to drive:runs/lora \\
      --resume-arg "--resume_from_checkpoint={latest}" -- accelerate launch train.py --output_dir outputs
  colabkit guard --watch runs/train --to drive:runs/yolo --resume-arg "--resume {latest}" \\
      -- python train.py --data coco128.yaml
  colabkit guard --watch lightning_logs --to drive:runs/gan --pattern last.ckpt --deadline 11h30m \\
      --resume-arg "--ckpt_path={latest}" --retries 2 -- python train.py
"""


def _split_guard(argv: list) -> tuple[list, list]:
    """`colabkit guard [options] -- COMMAND ...`: (the guard's arguments, the command). Values of --resume-arg and
    --fresh-arg may begin with a dash; they are glued to their option."""
    from .guard.options import glue_values
    at = argv.index("guard")
    if "--" in argv[at:]:
        cut = argv.index("--", at)
        return glue_values(argv[:cut]), argv[cut + 1:]
    return glue_values(argv), []


def add_guard_arguments(p) -> None:
    from .guard.api import DEFAULT_EVERY, DEFAULT_GRACE, DEFAULT_SETTLE
    p.add_argument("--watch", required=True, metavar="FOLDER",
                   help="the folder the command writes its checkpoints in (searched 6 levels deep)")
    p.add_argument("--to", required=True, metavar="LOCATION",
                   help='where checkpoints are committed: "drive:runs/lora", "gdrive://runs/lora" or a folder')
    p.add_argument("--resume-arg", metavar="TEXT",
                   help='appended to the command when a checkpoint was restored, {latest} replaced by its path, '
                        'e.g. "--resume_from_checkpoint={latest}" or "--resume {latest}"')
    p.add_argument("--fresh-arg", metavar="TEXT",
                   help="appended instead when there is nothing to restore (default: nothing)")
    p.add_argument("--pattern", action="append", metavar="GLOB",
                   help='a checkpoint file or folder name (repeatable; replaces the defaults), e.g. "ckpt_*" or '
                        '"weights/last.pt"')
    p.add_argument("--marker", action="append", metavar="NAME",
                   help="a file the command writes last in each checkpoint folder your --pattern matches "
                        "(repeatable: any one of them)")
    p.add_argument("--keep", type=int, default=None, help="committed checkpoints kept in --to (default: the keep "
                                                          "setting, 3)")
    p.add_argument("--settle", default=DEFAULT_SETTLE,
                   help=f"a checkpoint is complete once unchanged this long (default {DEFAULT_SETTLE})")
    p.add_argument("--every", default=DEFAULT_EVERY,
                   help=f"how often --watch is looked at (default {DEFAULT_EVERY})")
    p.add_argument("--deadline", default="auto",
                   help='"auto" (Colab\'s runtime cap, the idle cutoff), a budget such as "11h30m", or "off"')
    p.add_argument("--margin", default=None,
                   help="how long before the deadline the command is stopped (default: 60s + --grace)")
    p.add_argument("--stop-signal", default="SIGINT", metavar="SIGNAL",
                   help="sent to the command before the deadline (default SIGINT, as Ctrl-C)")
    p.add_argument("--grace", default=DEFAULT_GRACE,
                   help=f"time for the command to write its checkpoint and exit after the signal, before "
                        f"SIGTERM (and SIGKILL 10s later) (default {DEFAULT_GRACE})")
    p.add_argument("--retries", type=int, default=0,
                   help="relaunch after a non-zero exit the guard did not cause, from the newest committed "
                        "checkpoint, at most this many times (default 0)")
    p.add_argument("command_words", nargs="*", metavar="-- COMMAND", help="the training command, after --")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="colabkit",
        description="Crash-safe checkpoints, one-line resume and a session clock for Colab and home GPU rigs.")
    parser.add_argument("--version", action="version", version=f"colabkit {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")

    p = sub.add_parser("status", help="where we run, VM age, time left to the runtime cap, drive root, GPUs")
    p.add_argument("--json", action="store_true", help="print machine-readable JSON")
    p.set_defaults(func=_cmd_status)

    p = sub.add_parser("config", help="print the effective settings and where each came from")
    p.set_defaults(func=_cmd_config)

    p = sub.add_parser("demo", help="train a small Keras (or PyTorch) model through a simulated session cap, "
                                    "then resume it",
                       description="Session 1 trains with AutoResume until a simulated runtime cap, saves and "
                                   "stops; the local disk is wiped as on a reclaimed VM; session 2 resumes from "
                                   "the drive root and finishes. Prints a timeline.")
    p.add_argument("--cap", default="8s", help="the simulated session cap (default: 8s)")
    p.add_argument("--epochs", type=int, default=30, help="epochs to train in total (default: 30)")
    p.add_argument("--dir", help='checkpoint location (default: "drive:colabkit-demo/run-<time>")')
    p.add_argument("--framework", choices=["keras", "torch"], default="keras",
                   help="keras: colabkit.keras.AutoResume in model.fit; torch: colabkit.torch.AutoResume in a "
                        "plain PyTorch loop (default: keras)")
    p.set_defaults(func=_cmd_demo)

    p = sub.add_parser("checkpoints", help="list the committed checkpoints in a folder, optionally verifying them")
    p.add_argument("directory", help='a checkpoint location, e.g. "drive:runs/mnist" or a local folder')
    p.add_argument("--verify", action="store_true", help="check every file's size and hash against the manifest")
    p.add_argument("--json", action="store_true", help="print machine-readable JSON")
    p.set_defaults(func=_cmd_checkpoints)

    p = sub.add_parser("gpus", help="list the GPUs: memory, utilization, temperature, processes, MIG instances")
    p.add_argument("--json", action="store_true", help="print machine-readable JSON")
    p.set_defaults(func=_cmd_gpus)

    p = sub.add_parser("health", help="after a freeze or a reset: what the machine looked like in the last minutes "
                                      "of the flight recorder's newest recording",
                       description="Reads the flight recorder's ring file (cache_dir/flight/flight.ring, written "
                                   "while trainings run): whether the newest recording ended cleanly, was killed or "
                                   "ended in a freeze or reboot; per GPU the last and peak temperature, power, "
                                   "clocks, throttle reasons and memory; host CPU temperature, load and RAM; the "
                                   "GPU errors (Xid) NVML reported while recording; and the kernel log's Xid, "
                                   "thermal, OOM and lockup lines for that time.")
    p.add_argument("--last", action="store_true", help="the newest recording (the default, and so far the only view)")
    p.add_argument("--minutes", type=float, default=10.0, help="how much of its end to summarize (default 10)")
    p.add_argument("--json", action="store_true", help="print machine-readable JSON")
    p.set_defaults(func=_cmd_health)

    p = sub.add_parser("drive", help="sign in to Google Drive's API (for gdrive:// locations) and check it")
    drive_sub = p.add_subparsers(dest="drive_command", metavar="ACTION", required=True)
    q = drive_sub.add_parser("login", help="save credentials: a service-account key, or an OAuth client with a "
                                           "console consent flow (works on headless machines); saved with mode 0600")
    q.add_argument("--service-account", metavar="KEY.json", help="a service-account key file")
    q.add_argument("--client-secrets", metavar="CLIENT.json", help="an OAuth client (desktop app) file")
    drive_sub.add_parser("whoami", help="print the account the saved credentials sign in as")
    p.set_defaults(func=_cmd_drive)

    p = sub.add_parser("fetch", help="download a Google Drive shared file or folder (link) with a progress bar")
    p.add_argument("url", help="a share link: https://drive.google.com/drive/folders/<id> or .../file/d/<id>/view")
    p.add_argument("dest", help="folder to download into (a shared folder's contents land directly in it)")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    p.set_defaults(func=_cmd_fetch)

    p = sub.add_parser("stage", help="copy a dataset (folder or .zip/.tar[.gz]) from Drive to fast local disk, cached")
    p.add_argument("src", help='a folder or archive: a path, "drive:data/x", "gdrive://data/x" or a share link')
    p.add_argument("dst", nargs="?", help="local folder (default: under the cache dir); prints the path used")
    p.add_argument("--checksum", action="store_true", help="decide 'unchanged' by sha256, not size+mtime")
    p.add_argument("--workers", type=int, default=None, help="parallel copies (default: automatic)")
    p.set_defaults(func=_cmd_stage)

    p = sub.add_parser("costs", help="what runs cost: GPU-hours, kWh, money, saved against the cloud, time lost",
                       description="Sums the machine's cost ledger (every fit watched by the training monitor and "
                                   "every `colabkit run` job appends to it) per user or project. Money needs the "
                                   "electricity_price setting; the cloud figure uses a dated table of on-demand "
                                   "prices for a comparable GPU (see colabkit.health.prices).")
    p.add_argument("--since", metavar="DATE", help="only runs that ended since: 2026-11-01, 2026-11-01T14:00, or "
                                                   "a time back from now such as 7d or 12h (default: all)")
    p.add_argument("--by", choices=["user", "project"], default="project", help="one row per (default: project)")
    p.add_argument("--json", action="store_true", help="print machine-readable JSON")
    p.set_defaults(func=_cmd_costs)

    from .jobs.cli import add_arguments as add_run_arguments
    p = sub.add_parser("run", help="run notebooks and scripts side by side, one per GPU, from a queue",
                       usage="colabkit run [options] JOB [JOB ...] [-- ARGS ...]",
                       description="Queue jobs over the chosen GPUs: each job gets its own CUDA_VISIBLE_DEVICES, "
                                   "jobs beyond the free GPUs wait, logs go to a run folder. Exits 1 if a job "
                                   "failed; Ctrl-C gives running jobs SIGTERM and --grace seconds, then SIGKILL.")
    add_run_arguments(p)
    p.set_defaults(func=_cmd_run)

    p = sub.add_parser(
        "guard", help="run a training script you do not edit: commit its checkpoints to Drive, resume after a new VM",
        usage="colabkit guard --watch FOLDER --to LOCATION [options] -- COMMAND ...",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        description=GUARD_HELP)
    add_guard_arguments(p)
    p.set_defaults(func=_cmd_guard)

    from .migrate.cli import add_parser as add_migrate_parser  # `colabkit migrate`, see colabkit/migrate/cli.py
    add_migrate_parser(sub)

    from .doctor.cli import add_parser as add_doctor_parser  # `colabkit doctor`, see colabkit/doctor/cli.py
    add_doctor_parser(sub)

    return parser


def main(argv=None) -> int:
    parser = build_parser()
    argv = list(sys.argv[1:] if argv is None else argv)
    passthrough = []
    if "run" in argv and "--" in argv[argv.index("run"):]:  # `colabkit run JOB... -- ARGS`: ARGS go to the jobs
        cut = argv.index("--", argv.index("run"))
        argv, passthrough = argv[:cut], argv[cut + 1:]
    elif argv[:1] == ["guard"]:   # `colabkit guard [options] -- COMMAND`
        argv, passthrough = _split_guard(argv)
    args = parser.parse_args(argv)
    args.passthrough = passthrough
    if not getattr(args, "func", None):
        parser.print_help()
        return 0
    from .config import ConfigError

    package = os.path.dirname(os.path.abspath(__file__))

    def show(message, category, filename, lineno, file=None, line=None, _default=warnings.showwarning):
        if os.path.abspath(filename).startswith(package + os.sep):  # ours: one line, not a source excerpt
            print(f"colabkit {args.command}: warning: {message}", file=sys.stderr)
        else:
            _default(message, category, filename, lineno, file, line)
    try:
        with warnings.catch_warnings():
            warnings.showwarning = show
            return args.func(args)
    except (ConfigError, ValueError, ImportError, OSError) as exc:  # OSError: Drive, links, disk space
        print(f"colabkit {args.command}: error: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print(f"colabkit {args.command}: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
