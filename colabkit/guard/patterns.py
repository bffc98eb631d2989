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

__all__ = ["DEFAULT_PATTERNS", "NOT_LAST_MARKERS", "Pattern", "patterns_from", "step_in_name", "whole_state"]


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
# markers that exist before the folder is whole: accelerate writes random_states_0.pkl, then custom objects
# (custom_checkpoint_<i>.pkl), and other ranks their random_states_<rank>.pkl; the settle time covers them
NOT_LAST_MARKERS = frozenset(ACCELERATE_MARKERS)
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
    """Whether a checkpoint file may be whole (see ``whole_state``): everything but a file shown to be partial."""
    return whole_state(path) != "partial"


def whole_state(path) -> str:
    """What a checkpoint file's own format says of it: "whole" (a zip archive (torch.save, Lightning) with its
    end record, a pickle ending in its STOP opcode, a safetensors file as long as its header says, a legacy
    torch.save file whose storages are all there), "partial" (an empty file, or one of those formats cut
    short), or "unchecked" (a format without an end to check: the settle time alone decides)."""
    try:
        with open(path, "rb") as fh:
            head = fh.read(8)
            size = os.fstat(fh.fileno()).st_size
            if size == 0:
                return "partial"   # truncated for the next write, or never written: no checkpoint is empty
            if head[:4] == b"PK\x03\x04":
                return "whole" if zipfile.is_zipfile(fh) else "partial"
            if head[:1] == b"\x80" and str(path).endswith((".pkl", ".pickle", ".pt", ".pth", ".ckpt")):
                fh.seek(size - 1)
                if fh.read(1) == b".":
                    return "whole"
                fh.seek(0)
                return _legacy_torch_state(fh, size)
            if str(path).endswith(".safetensors") and len(head) == 8:
                (n,) = struct.unpack("<Q", head)
                if n > size - 8 or n > 100_000_000:
                    return "partial"
                header = json.loads(fh.read(n))
                end = max((v["data_offsets"][1] for k, v in header.items() if k != "__metadata__"), default=0)
                return "whole" if size == 8 + n + end else "partial"
    except (OSError, ValueError, KeyError, TypeError, IndexError, struct.error):
        return "partial"
    return "unchecked"


# torch.save(..., _use_new_zipfile_serialization=False): five pickles (a magic number, the protocol version, the
# system's sizes, the object with its storages as persistent ids, the storages' keys), then each storage as an
# 8-byte element count and its raw bytes
_LEGACY_MAGIC = 0x1950a86a20f9469cfc6c
_ELEMENT_SIZE = {"Double": 8, "Float": 4, "Half": 2, "BFloat16": 2, "Long": 8, "Int": 4, "Short": 2, "Char": 1,
                 "Byte": 1, "Bool": 1, "ComplexFloat": 8, "ComplexDouble": 16, "QInt8": 1, "QUInt8": 1,
                 "QInt32": 4, "QUInt4x2": 1, "QUInt2x4": 1, "UInt16": 2, "UInt32": 4, "UInt64": 8}


def _legacy_torch_state(fh, size: int) -> str:
    """"whole", "partial" or "unchecked" for a file that starts as a pickle but does not end as one: a legacy
    torch.save file is checked storage by storage without running anything it holds (every class it names is
    read as a stand-in); any other such file is "partial"."""
    import pickle

    storages = {}

    class Stub:
        def __new__(cls, *args, **kwargs):
            return object.__new__(cls)

        def __init__(self, *args, **kwargs):
            pass

        def __call__(self, *args, **kwargs):
            return Stub()

        def __setstate__(self, state):
            pass

        def __setitem__(self, key, value):
            pass

        def append(self, value):
            pass

        def extend(self, values):
            pass

    class Reader(pickle.Unpickler):
        def find_class(self, module, name):
            return type(name, (Stub,), {"qualified": f"{module}.{name}"})

        def persistent_load(self, pid):
            if isinstance(pid, tuple) and len(pid) >= 5 and pid[0] == "storage":
                storages[str(pid[2])] = (getattr(pid[1], "qualified", ""), pid[4])
            return Stub()

    try:
        if Reader(fh).load() != _LEGACY_MAGIC:
            return "partial"
        for _ in range(3):   # protocol version, system info, the object
            Reader(fh).load()
        keys = Reader(fh).load()
    except Exception:  # noqa: BLE001 - whatever a cut-short or foreign pickle raises, it is not whole
        return "partial"
    if not isinstance(keys, list) or any(k not in storages for k in keys):
        return "unchecked"
    offset = fh.tell()
    for key in keys:
        kind, numel = storages[key]
        element = _ELEMENT_SIZE.get(kind.rsplit(".", 1)[-1][: -len("Storage")]) if kind.endswith("Storage") else None
        if element is None or not isinstance(numel, int):
            return "unchecked"
        fh.seek(offset)
        count = fh.read(8)
        if len(count) < 8 or struct.unpack("<q", count)[0] != numel:
            return "partial"
        offset += 8 + numel * element
        if offset > size:
            return "partial"
    return "whole" if offset == size else "partial"
