"""`colabkit guard`: crash-safe checkpoints and one-line resume for training scripts you do not edit.

    colabkit guard --watch outputs/ --to drive:runs/lora \\
        --resume-arg "--resume_from_checkpoint={latest}" -- accelerate launch train.py ...

The guard restores the newest checkpoint from ``--to`` into the watched folder and passes its path to the
script, commits each complete checkpoint the script writes, and stops the script before the runtime's deadline
once its last checkpoint is safe. Inside: patterns.py (what is a checkpoint), watch.py (finding complete new
ones), commit.py (the committing thread), launch.py (the training process, its output and signals), api.py
(``run``, the restore, the stop and the retries), options.py (what the CLI and the ``%%guard`` magic share).
"""
from .api import DEFAULT_EVERY, DEFAULT_GRACE, DEFAULT_SETTLE, Guard, run
from .patterns import DEFAULT_PATTERNS, Pattern

__all__ = ["DEFAULT_EVERY", "DEFAULT_GRACE", "DEFAULT_PATTERNS", "DEFAULT_SETTLE", "Guard", "Pattern", "run"]
