"""Choosing GPUs without applying the choice: requests (counts, indices, UUIDs, "auto"), filters and CUDA's order."""
from __future__ import annotations

import os
import re
import warnings
from collections.abc import Sequence

from ..units import format_size, parse_size
from . import state
from .inventory import gpus
from .records import GPU, NA, NO_GPUS, ORDER_VAR, VISIBLE_VAR, Inventory


class GPUSelectionError(ValueError):
    """A GPU request that cannot be met; the message names what was asked and what exists."""


class GPUsTaken(GPUSelectionError):
    """The GPUs a request needs exist but are claimed by other processes or busy with programs that hold no claim;
    waiting (``use_gpus(..., wait=True)``) can help. The message says who holds which GPU; ``short`` in one line."""
    short = ""

    @classmethod
    def with_short(cls, short: str, message: str) -> GPUsTaken:
        error = cls(message)
        error.short = short
        return error


class GPUSelectionWarning(UserWarning):
    """A request was only partly met (strict=False), or the choice only applies to child processes."""


def parse_request(text: str):
    """The request in a magic or CLI argument: '2' is a count (as in `docker --gpus 2`); 'auto'/'all'; indices
    and UUIDs otherwise ('0,1', '1,' or 'device=1' for GPU 1 alone, 'GPU-8f3e...')."""
    text = str(text).strip()
    if text.lower() in ("auto", "all"):
        return "auto"
    if re.fullmatch(r"\d+", text):
        return int(text)
    if text.lower().startswith("device="):
        text = text[len("device="):].strip().strip('"')
    return text


def request_text(request) -> str:
    """A request as error messages quote it: use_gpus(<this>)."""
    return repr(request) if not isinstance(request, (list, tuple)) else repr(list(request))


def select_gpus(request="auto", *, min_free=None, max_util=None, strict: bool = True,
                inventory: Inventory | None = None, one_process: bool = True, claimed: dict | None = None,
                busy: dict | None = None, prefer=()) -> Inventory:
    """Choose GPUs without applying the choice (see ``use_gpus`` for the forms of ``request``).

    Returns the chosen GPUs in the order CUDA will number them; empty for the CPU path (``note`` says why).
    one_process=False: each chosen device goes to a process of its own (`colabkit run`), so several MIG
    instances may be chosen (named, counted, or by "auto").
    claimed / busy: {uuid: why} for GPUs other processes claimed / programs without a claim keep busy (see
    colabkit.devices.claims): a count or "auto" never picks them; naming a claimed GPU raises GPUsTaken, naming a
    busy one warns. prefer: UUIDs picked first among those that qualify (GPUs already shared, for a share).
    """
    claimed, busy = claimed or {}, busy or {}
    what = f"use_gpus({request_text(request)})"
    min_free_bytes = None
    if min_free is not None:
        try:
            min_free_bytes = parse_size(min_free, name="min_free")
        except ValueError as exc:
            raise GPUSelectionError(f"{what}: {exc}") from None
    if max_util is not None:
        max_util = _percent(max_util, what)
    inv = gpus(processes=False) if inventory is None else inventory
    hidden_by, allowed = _inherited_restriction(inv)
    candidates = [g for g in inv if g.usable and (allowed is None or g.uuid in allowed)]
    if allowed is not None:
        candidates.sort(key=lambda g: allowed.index(g.uuid))

    kind, value = _classify(request, what)
    if kind == "count" and value == 0:
        return inv._derive([], note=f"{what}: no GPU chosen; CUDA_VISIBLE_DEVICES={NO_GPUS} hides them all.")
    if not candidates:
        if kind == "explicit":
            if inv:
                raise GPUSelectionError(f"{what}: {hidden_by} hides every GPU in this process; it has these:\n"
                                        f"{_listing(inv)}")
            raise GPUSelectionError(f"{what}: this machine has no NVIDIA GPU to choose from. {inv.note or ''}".strip())
        why = f"{hidden_by} hides every GPU in this process" if inv else (inv.note or "No NVIDIA GPU found.")
        return inv._derive([], note=f"{why.rstrip('.')}: running on the CPU.", leave_env=True)

    wanted = [f"at least {format_size(min_free_bytes)} free"] if min_free_bytes is not None else []
    wanted += [f"at most {max_util:g} % utilization"] if max_util is not None else []

    def failing(g: GPU, taken: bool = True) -> list:
        reasons = []
        if taken and g.uuid in claimed:
            reasons.append(claimed[g.uuid])
        elif taken and g.uuid in busy:
            reasons.append(busy[g.uuid])
        if min_free_bytes is not None and (g.memory_free is None or g.memory_free < min_free_bytes):
            reasons.append(f"{format_size(g.memory_free)} free")
        if max_util is not None and (g.utilization is None or g.utilization > max_util):
            reasons.append(f"{NA if g.utilization is None else g.utilization} % busy")
        return reasons

    if kind == "explicit":
        chosen = _resolve(value, inv, candidates, allowed, hidden_by, what, one_process)
        held = [g for g in chosen if g.uuid in claimed]
        if held:
            short = "; ".join(f"GPU {g.label} {claimed[g.uuid]}" for g in held)
            raise GPUsTaken.with_short(short, f"{what}: " + "; ".join(f"{g.describe()} is {claimed[g.uuid]}"
                                                                      for g in held)
                                       + f".\n{_TAKEN_HINT.format(what=what[:-1])}")
        for g in chosen:
            if g.uuid in busy:
                warnings.warn(f"{what}: {g.describe()} is {busy[g.uuid]}; using it as you named it.",
                              GPUSelectionWarning, stacklevel=3)
        bad = [(g, failing(g, taken=False)) for g in chosen if failing(g, taken=False)]
        if bad:
            message = (f"{what} asked for GPUs with {' and '.join(wanted)}, but "
                       + "; ".join(f"{g.describe()} has {', '.join(r)}" for g, r in bad) + ".")
            if strict:
                raise GPUSelectionError(message)
            warnings.warn(message + " Using them anyway (strict=False).", GPUSelectionWarning, stacklevel=3)
        return inv._derive(chosen)

    preferred = set(prefer)
    qualifying = sorted((g for g in candidates if not failing(g)), key=lambda g: (g.uuid not in preferred, _rank(g)))
    whole = [g for g in qualifying if not g.is_mig]
    if kind == "auto":  # every qualifying GPU; a MIG instance only alone (CUDA uses one per process)
        pool = qualifying if not one_process else whole or qualifying[:1]
        need, take = 1, len(pool)
    else:
        pool = whole if value > 1 and one_process else qualifying
        need = take = value
    if len(pool) < need:
        asked = "GPUs" if kind == "auto" else f"{value} GPU{'s' * (value != 1)}"
        condition = f" with {' and '.join(wanted)}" if wanted else ""
        n_have = len(candidates)
        scope = "in this process" if allowed is not None else "on this machine"
        if condition:
            have = (f"{len(pool)} of the {n_have} {'GPU' if n_have == 1 else 'GPUs'} {scope} "
                    f"{'qualifies' if len(pool) == 1 else 'qualify'}")
        else:
            have = f"there {'is' if n_have == 1 else 'are'} {n_have} {scope}"
        if kind == "count" and value > 1 and one_process and any(g.is_mig for g in candidates):
            have += " (MIG instances do not count: CUDA uses at most one per process)"
        message = f"{what} asked for {asked}{condition}; {have}:\n{_listing(inv, failing, allowed)}"
        untaken = [g for g in candidates if not failing(g, taken=False)]
        if kind == "count" and value > 1 and one_process:
            untaken = [g for g in untaken if not g.is_mig]
        if len(untaken) >= need and len(pool) < need:   # enough GPUs qualify, but others hold them
            message = (f"{what} asked for {asked}{condition}; {len(pool)} of them "
                       f"{'is' if len(pool) == 1 else 'are'} free, the others are taken:\n"
                       f"{_listing(inv, failing, allowed)}\n{_TAKEN_HINT.format(what=what[:-1])}")
            if strict:
                error = GPUsTaken(message)
                error.short = "; ".join(f"GPU {g.label} {claimed.get(g.uuid) or busy.get(g.uuid)}"
                                        for g in candidates if g.uuid in claimed or g.uuid in busy)
                raise error
        if strict:
            raise GPUSelectionError(message)
        if not pool:
            warnings.warn(message + "\nRunning on the CPU (strict=False).", GPUSelectionWarning, stacklevel=3)
            return inv._derive([], note=f"{what}: nothing qualifies; running on the CPU.")
        warnings.warn(message + f"\nUsing the best {len(pool)} (strict=False).", GPUSelectionWarning, stacklevel=3)
        take = len(pool)
    chosen = sorted(pool[:take], key=lambda g: (g.index, -1 if g.mig_index is None else g.mig_index))
    return inv._derive(chosen)


_TAKEN_HINT = ("Wait in line for them with {what}, wait=True) (or wait=\"30min\"), share a GPU with "
               "share=\"8GiB\" (or a fraction), or see who holds what with `colabkit gpus`.")


def _rank(g: GPU):
    """Most free memory first, then least busy, then lowest index; unknown values last."""
    return (g.memory_free is None, -(g.memory_free or 0), g.utilization is None, g.utilization or 0,
            g.index, g.mig_index or 0)


def _percent(value, what: str) -> float:
    text = str(value).strip().rstrip("%").strip() if not isinstance(value, bool) else ""
    try:
        number = float(text)
    except ValueError:
        number = float("nan")
    if not 0 <= number <= 100:
        raise GPUSelectionError(f"{what}: max_util={value!r} is not a utilization; expected a percentage from 0 "
                                f"to 100, such as 50 or \"50%\".")
    return number


def _classify(request, what: str):
    if isinstance(request, bool) or request is None:
        raise GPUSelectionError(f"{what}: expected a number of GPUs (2), indices (\"0,1\"), UUIDs or \"auto\".")
    if isinstance(request, int):
        if request < 0:
            raise GPUSelectionError(f"{what}: the number of GPUs must be 0 or more.")
        return "count", request
    if isinstance(request, GPU):
        return "explicit", [request.label]
    if isinstance(request, str):
        if request.strip().lower() in ("auto", "all"):
            return "auto", None
        tokens = [t.strip() for t in request.split(",")]
        if not any(tokens) or (any(not t for t in tokens[:-1])):
            raise GPUSelectionError(f"{what}: expected indices or UUIDs separated by commas, such as \"0,1\".")
        return "explicit", [t for t in tokens if t]
    if isinstance(request, (list, tuple)):
        tokens = []
        for item in request:
            if isinstance(item, GPU):
                tokens.append(item.label)
            elif isinstance(item, int) and not isinstance(item, bool):
                tokens.append(str(item))
            elif isinstance(item, str) and item.strip():
                tokens.append(item.strip())
            else:
                raise GPUSelectionError(f"{what}: {item!r} is neither a GPU index nor a UUID.")
        if not tokens:
            raise GPUSelectionError(f"{what}: the list names no GPU; use 0 for none.")
        return "explicit", tokens
    raise GPUSelectionError(f"{what}: expected a number of GPUs (2), indices (\"0,1\"), UUIDs or \"auto\", "
                            f"not a {type(request).__name__}.")


def _match(token: str, inv: Sequence[GPU]) -> list:
    """GPUs a token names: an index ('1'), a MIG label ('0:1'), a UUID or a unique UUID prefix."""
    if re.fullmatch(r"\d+(:\d+)?", token):
        return [g for g in inv if g.label == token]
    low = token.lower()
    exact = [g for g in inv if g.uuid.lower() == low]
    return exact or [g for g in inv if len(low) > 4 and g.uuid.lower().startswith(low)]


def _resolve(tokens: list, inv: Inventory, candidates: list, allowed, hidden_by, what: str,
             one_process: bool = True) -> list:
    chosen, named = [], {}
    for token in tokens:
        found = _match(token, inv)
        if not found:
            if re.fullmatch(r"\d+(:\d+)?", token):
                problem = f"there is no GPU {token}" if ":" not in token else f"there is no MIG instance {token}"
            elif re.fullmatch(r"(?i)(GPU|MIG)-.*", token):
                problem = f"no GPU or MIG instance has UUID {token!r}"
            else:
                problem = f"{token!r} is neither a GPU index (such as 0) nor a UUID (GPU-..., MIG-...)"
            raise GPUSelectionError(f"{what}: {problem}; this machine has:\n{_listing(inv)}")
        if len(found) > 1:
            raise GPUSelectionError(f"{what}: {token!r} matches several UUIDs ({', '.join(g.uuid for g in found)}); "
                                    f"give more of the UUID.")
        g = found[0]
        if g.uuid in named:
            same = "" if named[g.uuid] == token else f" (as {named[g.uuid]!r} and {token!r})"
            raise GPUSelectionError(f"{what}: {g.describe()} is named twice{same}; name each GPU once.")
        named[g.uuid] = token
        if g.mig_enabled:
            instances = [m.uuid for m in inv if m.is_mig and m.index == g.index]
            raise GPUSelectionError(f"{what}: GPU {g.index} is in MIG mode, so CUDA cannot use it as a whole; choose "
                                    f"one of its MIG instances by UUID: {', '.join(instances) or 'none configured'}.")
        if g not in candidates:
            raise GPUSelectionError(f"{what}: {g.describe()} is outside {hidden_by}, which was set before colabkit "
                                    f"chose GPUs (by `colabkit run`, a scheduler or you); available here:\n"
                                    f"{_listing([c for c in inv if c in candidates])}")
        chosen.append(g)
    if one_process and len(chosen) > 1 and any(g.is_mig for g in chosen):
        raise GPUSelectionError(f"{what}: CUDA uses at most one MIG instance per process, and not together with "
                                f"other GPUs; choose a single MIG instance per process (`colabkit run` with "
                                f"one GPU per job runs one process on each).")
    return chosen


def _listing(inv: Sequence[GPU], failing=None, allowed=None) -> str:
    if not inv:
        return "  (none)"
    lines = []
    for g in inv:
        extra = []
        if g.mig_enabled:
            extra.append("MIG mode: use its instances")
        elif allowed is not None and g.uuid not in allowed:
            extra.append(f"hidden by {VISIBLE_VAR}")
        elif failing is not None and failing(g):
            reasons = failing(g)
            taken = all(r.startswith(("claimed by", "busy with", "waited for by")) for r in reasons)
            extra.append(("" if taken else "does not qualify: ") + ", ".join(reasons))
        lines.append(f"  {g.describe()}  {g.uuid}" + (f"  [{'; '.join(extra)}]" if extra else ""))
    return "\n".join(lines)


def _inherited_restriction(inv: Inventory):
    """(description, UUIDs in CUDA order) from a CUDA_VISIBLE_DEVICES set before colabkit chose GPUs here,
    e.g. by `colabkit run` or a cluster scheduler; (None, None) when there is none."""
    current = os.environ.get(VISIBLE_VAR)
    if state.current.applied_value is not None and current == state.current.applied_value:
        current = state.current.inherited  # our own earlier choice is not a restriction
    if current is None:
        return None, None
    order = cuda_order(inv, {VISIBLE_VAR: current, ORDER_VAR: "PCI_BUS_ID"})
    return f"{VISIBLE_VAR}={current!r}", [g.uuid for g in order or ()]


def cuda_order(inv: Sequence[GPU], environ) -> list | None:
    """The GPUs CUDA enumerates under these CUDA_* values, in CUDA's order; None when that cannot be known."""
    usable = [g for g in inv if g.usable]
    order_known = environ.get(ORDER_VAR) == "PCI_BUS_ID" or len({g.name for g in usable if not g.is_mig}) <= 1
    visible = environ.get(VISIBLE_VAR)
    if visible is None:
        if any(g.is_mig for g in usable):
            return None
        return [g for g in usable if not g.is_mig] if order_known else None
    out = []
    for token in (t.strip() for t in visible.split(",")):
        if token.isdigit():
            if not order_known:
                return None
            found = [g for g in inv if not g.is_mig and g.index == int(token)]
            if found and found[0].mig_enabled:  # CUDA then enumerates that GPU's (first) MIG instance
                found = [g for g in inv if g.is_mig and g.index == int(token)][:1]
        else:
            low = token.lower()
            found = [g for g in usable if low and g.uuid.lower().startswith(low)]
            found = [g for g in found if g.uuid.lower() == low] or found
        if len(found) != 1 or found[0] in out:
            break  # CUDA stops at the first entry it cannot use
        out.append(found[0])
    return out
