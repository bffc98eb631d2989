"""What the PyTorch adapters refuse, and why, before anything changes: arguments that cannot work (an object
without state_dict(), a save_freq or every that is not one), and a checkpoint whose contents cannot be valid
(InvalidCheckpoint: the store warns and tries the previous one) or do not fit the objects given (CheckpointError:
nothing is restored). Everything a checkpoint holds is checked here before the first load_state_dict.
"""
from __future__ import annotations

import functools
import warnings

import numpy as np

from ..optional import require

torch = require("torch", "torch", "colabkit.torch")

from ..checkpoints import rng, untrusted  # noqa: E402
from ..checkpoints.api import CheckpointError  # noqa: E402
from ..checkpoints.folder import InvalidCheckpoint  # noqa: E402
from ..resume import schedule  # noqa: E402
from .state import FORMAT, _decode, target  # noqa: E402

# objects whose saved class must match (their state dicts load into another class without an error)
_CLASS_CHECKED = (torch.optim.Optimizer, torch.optim.lr_scheduler.LRScheduler)
# optimizer state entries shaped like their parameter (torch.optim's own optimizers)
_PARAM_SHAPED = ("exp_avg", "exp_avg_sq", "max_exp_avg_sq", "momentum_buffer", "sum", "square_avg", "acc_delta",
                 "grad_avg")


# -- arguments -------------------------------------------------------------------------------------------------

def check_schedule(save_freq, every):
    """Both PyTorch adapters' save_freq/every arguments, checked: returns ``every`` in seconds (or None)."""
    return schedule.check_schedule(save_freq, every, unit="batches")


def check_objects(objects: dict) -> None:
    """colabkit.torch.AutoResume's objects: each has state_dict() and load_state_dict()."""
    for name, obj in objects.items():
        if not (callable(getattr(obj, "state_dict", None)) and callable(getattr(obj, "load_state_dict", None))):
            raise ValueError(
                f"{name}={type(obj).__name__} has no state_dict()/load_state_dict(), so AutoResume cannot save "
                f"and restore it. Pass modules, optimizers, LR schedulers, GradScaler, or an object of your own "
                f"with those two methods; put plain values in ar.state[{name!r}] instead.")


# -- a checkpoint ----------------------------------------------------------------------------------------------

def check_checkpoint(restored, objects: dict, directory):
    """Everything a candidate checkpoint of colabkit.torch.AutoResume holds, checked against ``objects`` (name ->
    object) before anything live changes: a value that cannot be valid raises InvalidCheckpoint; a valid
    checkpoint that does not fit these objects raises CheckpointError naming ``directory``. Returns what it
    decoded: (name -> state dict, ar.state, the ranks' states)."""
    untrusted.position(restored)
    state = untrusted.mapping(restored.state, "the state")
    if state.get("format") != FORMAT:
        raise CheckpointError(f"{directory} holds a checkpoint that colabkit.torch did not write "
                              f"(format {state.get('format')!r}); use another folder. Nothing was restored.")
    saved = untrusted.mapping(state.get("objects") or {}, "the state's objects")
    missing = [n for n in objects if n not in saved]
    extra = [n for n in saved if n not in objects]
    if missing or extra:
        raise CheckpointError(
            f"The checkpoint in {directory} (step {restored.step}) holds {sorted(saved)}, and AutoResume "
            f"was given {sorted(objects)}"
            + (f"; missing from the checkpoint: {missing}" if missing else "")
            + (f"; not passed now: {extra}" if extra else "")
            + ". Pass the same names as the run that saved it, or use another folder. Nothing was restored.")
    decoded = {name: _decode(saved[name], name) for name in objects}
    user = untrusted.mapping(_decode(state.get("user") or {}, "ar.state"), "ar.state")
    ranks = untrusted.sequence(state.get("ranks") or [], "the ranks' states")
    for i, own in enumerate([state, *ranks]):
        where = "the checkpoint" if i == 0 else f"rank {i - 1}'s states"
        own = untrusted.mapping(own, where)
        check_rng(own.get("rng"), f"{where}' RNG states")
        if own.get("epoch_start") is not None:
            start = untrusted.mapping(own["epoch_start"], f"{where}' epoch start")
            untrusted.vector(start.get("torch"), f"{where}' epoch start torch state", dtype=np.uint8,
                             length=torch.get_rng_state().numel())
            check_generators(start.get("generators"), f"{where}' epoch start generators")
        if own.get("loader") is not None:
            untrusted.mapping(_decode(own["loader"], f"{where}' loader state"), f"{where}' loader state")
    classes = untrusted.mapping(state.get("classes") or {}, "the state's classes")
    for name, obj in objects.items():   # everything is checked before anything is loaded
        live = target(obj)
        untrusted.mapping(decoded[name], f"{name}'s state")   # state_dict() is a dict, whatever else it holds
        if isinstance(live, torch.optim.Optimizer):
            check_optimizer_state(decoded[name], name)
        if isinstance(live, _CLASS_CHECKED) and classes.get(name, type(live).__name__) != type(live).__name__:
            raise CheckpointError(f"{name}: the checkpoint in {directory} was saved from "
                                  f"{classes[name]}, and {name} is {type(live).__name__} now. Pass the same "
                                  f"kind of object under each name, or use another folder. Nothing was restored.")
        _check_fits(name, live, decoded[name], directory)
    return decoded, user, ranks


def check_optimizer_state(saved, where: str) -> None:
    """A torch.optim optimizer's state_dict() as it writes one: parameter groups that number the parameters
    0, 1, 2, ... in order, state for those numbers only, and numeric hyperparameters that are numbers."""
    saved = untrusted.mapping(saved, where)
    groups = untrusted.sequence(saved.get("param_groups"), f"{where}['param_groups']")
    ids = []
    for g, group in enumerate(groups):
        group = untrusted.mapping(group, f"{where}['param_groups'][{g}]")
        ids += untrusted.sequence(group.get("params"), f"{where}['param_groups'][{g}]['params']")
        for key in ("lr", "weight_decay", "eps", "momentum", "dampening", "initial_lr", "lr_decay", "alpha"):
            value = group.get(key)
            if value is not None and not (isinstance(value, torch.Tensor) and value.numel() == 1):
                untrusted.real(value, f"{where}['param_groups'][{g}][{key!r}]", low=0)
    if ids != list(range(len(ids))):
        raise untrusted.invalid(f"{where}'s parameter ids", ids, f"0 to {len(ids) - 1} in order")
    for key, entry in untrusted.mapping(saved.get("state"), f"{where}['state']").items():
        if key not in ids:
            raise InvalidCheckpoint(f"{where} holds state for parameter {key!r}, which no group lists")
        untrusted.mapping(entry, f"{where}['state'][{key!r}]")


def check_rng(state, where: str = "the RNG states") -> None:
    """The states _rng_state() saves (and a loader's generators'), each of the length this torch uses."""
    state = rng.check_global_state(state, where)
    untrusted.vector(state.get("torch"), f"{where}' torch state", dtype=np.uint8, length=_torch_rng_size())
    for i, cuda in enumerate(untrusted.sequence(state.get("cuda") or [], f"{where}' CUDA states")):
        untrusted.vector(cuda, f"{where}' CUDA state {i}", dtype=np.uint8)
    check_generators(state.get("generators"), f"{where}' loader generators")


def check_generators(saved, where: str) -> None:
    for i, g in enumerate(untrusted.sequence(saved or [], where)):
        untrusted.vector(g, f"{where}[{i}]", dtype=np.uint8, length=_torch_rng_size())


def _torch_rng_size() -> int:
    return torch.get_rng_state().numel()   # a torch.Generator's state on the CPU: the same size


def _check_fits(name, obj, saved, directory):
    """Raise CheckpointError naming ``name`` when the saved state cannot be loaded into ``obj``."""
    def mismatch(detail):
        return CheckpointError(f"{name}: the checkpoint in {directory} does not fit it ({detail}). It was saved "
                               f"from a different model or setup: use the same objects, or another folder. "
                               f"Nothing was restored.")

    current = obj.state_dict()
    if isinstance(obj, torch.nn.Module):
        missing = [k for k in current if k not in saved]
        unexpected = [k for k in saved if k not in current]
        if missing or unexpected:
            raise mismatch((f"missing {missing[:5]}" if missing else "")
                           + ("; " if missing and unexpected else "")
                           + (f"unexpected {unexpected[:5]}" if unexpected else ""))
        # torch's load copies every other tensor before it reports one it could not copy (autoresume.py loads
        # a module whose load only copies without keeping its state, so that must be refused here); an extra
        # state is handed to set_extra_state as it is
        for key, value in current.items():
            if not isinstance(value, torch.Tensor) or key.endswith("_extra_state"):
                continue
            if not isinstance(saved[key], torch.Tensor):
                raise untrusted.invalid(f"{name}['{key}'] in the checkpoint", saved[key], "a tensor")
            if not _copies(saved[key].dtype, value.dtype):
                raise mismatch(f"{key} is {saved[key].dtype} in the checkpoint, which torch cannot copy into "
                               f"its {value.dtype}")
    if isinstance(obj, torch.optim.Optimizer):
        groups, saved_groups = current["param_groups"], saved.get("param_groups", [])
        sizes, saved_sizes = [len(g["params"]) for g in groups], [len(g["params"]) for g in saved_groups]
        if sizes != saved_sizes:
            raise mismatch(f"parameter groups of sizes {saved_sizes} in the checkpoint, {sizes} now")
        params = [p for g in obj.param_groups for p in g["params"]]
        saved_ids = [i for g in saved_groups for i in g["params"]]
        for i, param in zip(saved_ids, params):
            for key, value in (saved.get("state") or {}).get(i, {}).items():
                if key in _PARAM_SHAPED and isinstance(value, torch.Tensor) and value.shape != param.shape:
                    raise mismatch(f"state[{i}][{key!r}] has shape {tuple(value.shape)} in the checkpoint, the "
                                   f"parameter has shape {tuple(param.shape)} now")
    _check_shapes(current, saved, "", mismatch)


@functools.cache
def _copies(source, dest) -> bool:
    """Whether torch copies a tensor of dtype ``source`` into one of ``dest`` (not every pair: float4 copies
    into no other dtype), tried once on one-element CPU tensors."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")   # complex into real: torch warns that it drops the imaginary part
            torch.empty(1, dtype=dest).copy_(torch.empty(1, dtype=source))
    except RuntimeError:   # NotImplementedError included
        return False
    return True


def _check_shapes(current, saved, where, mismatch):
    if isinstance(current, torch.Tensor) and isinstance(saved, torch.Tensor):
        if tuple(current.shape) != tuple(saved.shape):
            raise mismatch(f"{where or 'the value'} has shape {tuple(saved.shape)} in the checkpoint and "
                           f"{tuple(current.shape)} now")
    elif isinstance(current, dict) and isinstance(saved, dict):
        for key in current:
            if key in saved:
                _check_shapes(current[key], saved[key], f"{where}.{key}" if where else str(key), mismatch)
