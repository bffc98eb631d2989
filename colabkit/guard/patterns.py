"""What counts as a checkpoint in a watched folder: a table of name patterns, each with the file that its writer
puts last (a folder counts as complete only once that marker exists), and the step a name carries.

The defaults come from what training scripts write (their public sources):

* Hugging Face Trainer (and TRL): ``checkpoint-<global_step>/``, ``trainer_state.json`` written last;
  diffusers' training scripts name their ``accelerator.save_state`` folders the same way.
* accelerate ``save_state``: ``step_<n>/`` / ``epoch_<n>/`` (its examples' ``--checkpointing_steps``) and, with
  ``ProjectConfiguration(automatic_checkpoint_naming=True)``, ``checkpoints/checkpoint_<n>/``; it writes the model,
  optimizer, scheduler, sampler and scaler files, then ``random_states_<rank>.pkl``, then custom objects
  (``custom_checkpoint_<i>.pkl``, covered by the settle time).
* PyTorch Lightning: ``last.ckpt`` and ``epoch=<e>-step=<s>.ckpt`` (one file each, rewritten in place).
* YOLOv5/v8 and plain scripts: ``last.pt`` / ``last.pth`` (``weights/last.pt``; ``best.pt`` is not a resume point).
* StyleGAN2-ADA / StyleGAN3: ``network-snapshot-<kimg>.pkl``.

A file also has to look whole in its own format where it has one that says so: a zip (torch.save, Lightning)
with its end record, a pickle ending in its STOP opcode, a safetensors file as long as its header says; a file
killed half way through its write stays incomplete however long it rests.

Names holding ``.colabkit-`` (what a restore moved aside, or is writing) and hidden names are never checkpoints.
"""
from __future__ import annotations

import dataclasses
import fnmatch
import json
import os
import re
import struct
import zipfile

__all__ = ["DEFAULT_PATTERNS", "Pattern", "patterns_from", "step_in_name"]


@dataclasses.dataclass(frozen=True)
class Pattern:
    """``glob`` matches an entry's name (or, when it holds a ``/``, its path under the watched folder).
    ``markers``: for a folder, names of which at least one must exist in it (the file its writer puts last);
    empty: the settle time alone decides. ``kind``: "folder", "file" or "any"."""
    glob: str
    kind: str = "any"
    markers: tuple = ()
    source: str = ""      # who writes it, for the docs

    def matches(self, rel: str, name: str, is_dir: bool) -> bool:
        if self.kind == "folder" and not is_dir or self.kind == "file" and is_dir:
            return False
        return fnmatch.fnmatchcase(rel if "/" in self.glob else name, self.glob)


ACCELERATE_MARKERS = ("random_states_0.pkl",)
DEFAULT_PATTERNS = (
    Pattern("checkpoint-*", "folder", ("trainer_state.json", *ACCELERATE_MARKERS), "HF Trainer, diffusers scripts"),
    Pattern("checkpoint_*", "folder", ACCELERATE_MARKERS, "accelerate automatic_checkpoint_naming"),
    Pattern("step_*", "folder", ACCELERATE_MARKERS, "accelerate examples (--checkpointing_steps N)"),
    Pattern("epoch_*", "folder", ACCELERATE_MARKERS, "accelerate examples (--checkpointing_steps epoch)"),
    Pattern("*.ckpt", "file", (), "PyTorch Lightning (last.ckpt, epoch=E-step=S.ckpt)"),
    Pattern("last.pt", "file", (), "YOLOv5/v8 weights/last.pt, plain scripts"),
    Pattern("last.pth", "file", (), "plain scripts"),
    Pattern("network-snapshot-*.pkl", "file", (), "StyleGAN2-ADA, StyleGAN3"),
)


def patterns_from(globs=None, markers=()) -> tuple:
    """The patterns for ``globs`` (None: the defaults). A user's glob matches folders and files; ``markers``
    (file names) apply to the folders it matches. ValueError naming a bad glob."""
    if globs is None:
        return DEFAULT_PATTERNS
    if isinstance(globs, str):
        globs = [globs]
    if isinstance(markers, str):
        markers = [markers]
    out = []
    for glob in globs:
        if not isinstance(glob, str) or not glob.strip() or glob.startswith("/") or ".." in glob.split("/"):
            raise ValueError(f"pattern {glob!r} is invalid: pass a file or folder name pattern under the watched "
                             f"folder, such as \"checkpoint-*\", \"*.ckpt\" or \"weights/last.pt\".")
        out.append(Pattern(glob.strip().rstrip("/"), "any", tuple(markers), "--pattern"))
    for marker in markers:
        if not isinstance(marker, str) or not marker or "/" in marker:
            raise ValueError(f"marker {marker!r} is invalid: pass the name of the file the training writes last "
                             f"in each checkpoint folder, such as \"trainer_state.json\".")
    return tuple(out)


def ignored(name: str) -> bool:
    """Names that are never checkpoints: hidden ones, and what a restore moved aside or is writing."""
    return name.startswith(".") or ".colabkit-" in name


_STEP = re.compile(r"step[=_-]?(\d+)", re.I)
_DIGITS = re.compile(r"\d+")


def step_in_name(name: str) -> int | None:
    """The step a checkpoint's name carries: ``step=500`` / ``step_500`` when present, else the last number
    in its name without the extension (checkpoint-1500 -> 1500, network-snapshot-000200.pkl -> 200); None
    for a name without one (last.pt)."""
    stem = name.rsplit(".", 1)[0] if "." in name[1:] else name
    found = _STEP.findall(stem) or _DIGITS.findall(stem)
    if not found:
        return None
    value = int(found[-1])
    return value if value < 2 ** 63 else None


def looks_whole(path) -> bool:
    """Whether a checkpoint file is whole by its own format (an empty file never is): a zip archive (torch.save,
    Lightning) needs its end record, a pickle its final STOP opcode, a safetensors file the length its header
    gives; other files pass."""
    try:
        with open(path, "rb") as fh:
            head = fh.read(8)
            size = os.fstat(fh.fileno()).st_size
            if size == 0:
                return False   # truncated for the next write, or never written: no checkpoint is empty
            if head[:4] == b"PK\x03\x04":
                return zipfile.is_zipfile(fh)
            if head[:1] == b"\x80" and str(path).endswith((".pkl", ".pickle", ".pt", ".pth", ".ckpt")):
                fh.seek(size - 1)
                return fh.read(1) == b"."
            if str(path).endswith(".safetensors") and len(head) == 8:
                (n,) = struct.unpack("<Q", head)
                if n > size - 8 or n > 100_000_000:
                    return False
                header = json.loads(fh.read(n))
                end = max((v["data_offsets"][1] for k, v in header.items() if k != "__metadata__"), default=0)
                return size == 8 + n + end
    except (OSError, ValueError, KeyError, TypeError, IndexError, struct.error):
        return False
    return True
