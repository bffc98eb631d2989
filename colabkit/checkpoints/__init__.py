"""Crash-safe checkpoints: a folder protocol with a manifest written last, local staging, background upload."""
from .api import CheckpointError, Checkpoints, Restored
from .folder import CheckpointInfo, InvalidCheckpoint
from .writer import FolderInUse

__all__ = ["Checkpoints", "Restored", "CheckpointError", "CheckpointInfo", "InvalidCheckpoint", "FolderInUse"]
