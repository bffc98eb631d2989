"""The `colabkit run` options and their handler (colabkit/cli.py registers the subcommand)."""
from __future__ import annotations

from .queue import DEFAULT_GRACE, run_jobs


def add_arguments(parser) -> None:
    """The `colabkit run` options (cli.py registers the subcommand)."""
    parser.add_argument("jobs", nargs="+", metavar="JOB",
                        help="notebooks (.ipynb, run with papermill), scripts (.py, .sh) or executables; "
                             "arguments after -- go to every script, and as --name value parameters to notebooks")
    parser.add_argument("--gpus", default="auto",
                        help="which GPUs: auto (default: all), a count (2), indices (0,1; 1, for GPU 1 alone) "
                             "or UUIDs")
    parser.add_argument("--per-gpu", type=int, default=1, metavar="N",
                        help="jobs at a time on each GPU (or group of --gpus-per-job GPUs; default 1)")
    parser.add_argument("--gpus-per-job", type=int, default=1, metavar="N",
                        help="GPUs each job gets: the chosen GPUs grouped in PCI order (default 1; 2+ for a "
                             "MirroredStrategy job)")
    parser.add_argument("-p", "--parameter", nargs=2, action="append", default=[], metavar=("NAME", "VALUE"),
                        help="a papermill parameter for notebook jobs (repeatable)")
    parser.add_argument("--retries", type=int, default=0, metavar="N",
                        help="start a failed job again up to N times (default 0)")
    parser.add_argument("--grace", type=float, default=DEFAULT_GRACE, metavar="SECONDS",
                        help=f"on Ctrl-C/SIGTERM, seconds between SIGTERM and SIGKILL (default {DEFAULT_GRACE:g})")
    parser.add_argument("--hang-timeout", default="auto", metavar="auto|DURATION|off",
                        help="kill a hung job and count it as failed (so --retries restarts it): auto (default) "
                             "when the job's colabkit monitor reports a hang or its heartbeat stops; DURATION "
                             "(e.g. 20min) after that long without a step (without a monitor: without output); "
                             "off: never")
    parser.add_argument("--run-dir", metavar="DIR", help="where logs, output notebooks and summary.json go "
                                                         "(default ./colabkit-runs/<date-time>)")
    parser.add_argument("--min-free", metavar="SIZE", help="only GPUs with this much free memory, e.g. 8GiB")
    parser.add_argument("--max-util", type=float, metavar="PCT", help="only GPUs at most this busy (%%)")
    parser.add_argument("--kernel", metavar="NAME", help="Jupyter kernel for notebooks (default: the notebook's)")
    parser.add_argument("--cluster", metavar="ADDRESS",
                        help="run the jobs on a Ray cluster: ray://HOST:10001, HOST:6379 or auto; each job asks "
                             "Ray for --gpus-per-job GPUs and runs on any machine with free ones "
                             '(needs pip install "colabkit[cluster]")')
    parser.add_argument("--shared", action="store_true",
                        help="with --cluster: the job files are on storage every machine sees at the same path "
                             "(default: each job's folder is uploaded to the machine that runs it)")


def main_from_args(args) -> int:
    report = run_jobs(args.jobs, gpus=args.gpus, per_gpu=args.per_gpu, gpus_per_job=args.gpus_per_job,
                      params=args.parameter, args=getattr(args, "passthrough", []) or [], retries=args.retries,
                      run_dir=args.run_dir,
                      grace=args.grace, min_free=args.min_free, max_util=args.max_util, kernel=args.kernel,
                      hang_timeout=args.hang_timeout, cluster=args.cluster, shared=args.shared)
    return report.exit_code
