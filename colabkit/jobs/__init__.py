"""`colabkit run`: run experiments side by side, one per GPU, from a queue.

    colabkit run --gpus 0,1 train_a.ipynb train_b.ipynb sweep.py -- --lr 1e-3

Each job gets its own GPU through CUDA_DEVICE_ORDER=PCI_BUS_ID + CUDA_VISIBLE_DEVICES (``--per-gpu N`` packs N
jobs on each GPU; ``--gpus-per-job N`` gives each job N GPUs, e.g. for a MirroredStrategy run; TensorFlow memory
growth is switched on for them unless the ``memory_growth`` setting is off); jobs beyond the free slots wait.
Notebooks run through papermill (``-p name value``; output notebooks are saved next to the logs), ``.py`` files
with this Python, ``.sh`` files with bash, other executable files directly. Arguments after ``--`` go to
scripts; notebooks receive ``--name value`` pairs from there as parameters. Notebooks run in their own folder,
scripts in the current one.

Every job file is checked before anything starts. Each job's output goes to ``<run dir>/<job>.log`` (all
attempts, each with a header), its state to ``<run dir>/summary.json``. A failed job is started again up to
``--retries`` times (with colabkit's AutoResume in the job, the restart resumes from its last checkpoint;
COLABKIT_JOB_ATTEMPT tells the job which attempt it is). Ctrl-C or SIGTERM stops the queue: running jobs get
SIGTERM and ``--grace`` seconds to save, then SIGKILL; a second Ctrl-C kills at once. Exit status: 0 when every
job succeeded, 1 when one failed, 130 / 143 when interrupted by SIGINT / SIGTERM.

Hung jobs (``--hang-timeout``, default ``auto``): a job that runs colabkit's training monitor
(``colabkit.monitor()``, ``colabkit.keras.Monitor``, ``AutoResume(monitor=True)``) writes a heartbeat to
``<run dir>/<job>.health.json``; with ``auto`` the queue kills the job when its monitor reports a hang (no step
for longer than the budget it learned; its stack dump is ``<run dir>/<job>.hang-*.txt``) or when the heartbeat
stops coming. ``--hang-timeout DURATION`` kills a job after DURATION without a step (jobs without a monitor:
without a new line in their log). A killed job (SIGTERM, SIGKILL 10 s later) counts as failed, so ``--retries``
restarts it, from its last checkpoint with AutoResume. ``off``: never.

A machine without GPUs runs the jobs on the CPU, ``--per-gpu`` at a time. On a GPU in MIG mode each instance is a
slot of its own (CUDA gives a process one instance).

``--cluster ADDRESS`` runs the same jobs on a Ray cluster instead, each on any machine with free GPUs
(colabkit/cluster/runner.py).

Inside: spec.py (the job model and the checks every job file passes), slots.py (GPUs per job, ``--per-gpu``),
process.py (one job's processes: its command, starting, signalling, hangs), queue.py (``run_jobs`` and the public
``Runner``, which colabkit.cluster's ClusterRunner extends), cli.py (the `colabkit run` options).
"""
from .cli import add_arguments, main_from_args
from .queue import (DEFAULT_GRACE, EXIT_FAILED, EXIT_SIGINT, EXIT_SIGTERM, HANG_KILL_GRACE, default_run_dir,
                    run_jobs)
from .slots import Slot, plan_slots
from .spec import KINDS, Job, JobError, JobState, RunReport, args_to_params, prepare_jobs

__all__ = ["DEFAULT_GRACE", "EXIT_FAILED", "EXIT_SIGINT", "EXIT_SIGTERM", "HANG_KILL_GRACE", "KINDS", "Job",
           "JobError", "JobState", "RunReport", "Slot", "add_arguments", "args_to_params", "default_run_dir",
           "main_from_args", "plan_slots", "prepare_jobs", "run_jobs"]
