"""Applying a choice: CUDA_DEVICE_ORDER / CUDA_VISIBLE_DEVICES, and telling TensorFlow or PyTorch if they started."""
from __future__ import annotations

import contextlib
import logging
import os
import sys
import warnings

from . import claims, state
from .inventory import gpus
from .records import GROWTH_VAR, NO_GPUS, ORDER_VAR, VISIBLE_VAR, Inventory, gpu_names
from .select import GPUSelectionError, GPUSelectionWarning, GPUsTaken, cuda_order, request_text, select_gpus
from .share import apply as share_apply
from .share import clear as share_clear
from .share import limits, parse_share

log = logging.getLogger("colabkit")


class DevicesAlreadyInitialized(RuntimeError):
    """A framework initialized its GPUs before the choice was applied; the message says what to do."""


def chosen() -> Inventory | None:
    """The GPUs the latest ``use_gpus`` call chose (None before any call)."""
    return state.current.chosen


def use_gpus(request="auto", *, min_free=None, max_util=None, strict: bool = True,
             memory_growth: bool | None = None, wait=False, share=None) -> Inventory:
    """Choose GPUs, claim them for this process, and make this process (and the processes it starts) use them.

    request: a count (``2``: the GPUs with most free memory, then least busy; ``0``: none, CPU only); indices in
    nvidia-smi numbering (``"0,1"``, ``[0, 1]``); UUIDs (``"GPU-8f3e..."``, ``"MIG-..."``, or unique prefixes);
    or ``"auto"``: every GPU that passes the filters. min_free: a size ("8GiB") each GPU must have free;
    max_util: the highest utilization in %. strict=False turns an unmet request into a warning and takes what is
    available. memory_growth: TensorFlow memory growth (default: the ``memory_growth`` setting, on).

    Claims (colabkit.devices.claims; off on Colab and Kaggle): the chosen GPUs are claimed machine-wide for the
    life of this process (a later call replaces the claim; ``use_gpus(0)`` drops it). A count or "auto" never
    picks a GPU another process claimed, nor one a program without a claim keeps busy. When none is free:
    wait=False raises GPUsTaken naming who holds what; wait=True (or a duration, "30min") waits in line, first
    come first served across processes and users, with a message; Ctrl-C leaves the line. A GPU someone earlier
    in line waits for and could take now is kept for them; requests for other GPUs go ahead. A call that has to
    wait gives up this process's earlier claim when it joins the line (holding it while waiting for more could
    deadlock two processes), so after a wait that ends without GPUs the process holds none.
    share: a size ("12GiB") or fraction (0 < share <= 1, or "50%") of each chosen GPU's memory instead of the
    whole GPU (a number above 1 is refused, not taken for bytes): counted in
    the claims, so several processes share one GPU, and applied to TensorFlow (logical-device memory limit),
    PyTorch (per-process memory fraction) and JAX.

    Sets CUDA_DEVICE_ORDER=PCI_BUS_ID and CUDA_VISIBLE_DEVICES (see the module docs). Returns the chosen GPUs
    in CUDA's order (device 0 first): empty for the CPU path. Raises GPUSelectionError for a request that cannot
    be met and DevicesAlreadyInitialized when TensorFlow or PyTorch already use their GPUs (strict=False: warns).
    """
    if memory_growth is None:
        from .. import config
        memory_growth = config.load().memory_growth
    what = f"use_gpus({request_text(request)})"
    share_bytes, fraction = parse_share(share, what=what)
    wait_s = _wait_seconds(wait, what)
    where = claims.folder()
    old = state.current.claim
    claim = None
    inventory = gpus(processes=where is not None, claims=False)
    if where is None or not inventory:   # no claims (Colab, Kaggle, setting off, no GPU): the choice alone
        choice = select_gpus(request, min_free=min_free, max_util=max_util, strict=strict, inventory=inventory)
    else:
        inventory, choice, claim = _choose_and_claim(request, where, what, min_free=min_free, max_util=max_util,
                                                     strict=strict, wait_s=wait_s, share_bytes=share_bytes,
                                                     fraction=fraction, old=old, inventory=inventory)
    if choice.leave_env:
        log.warning("colabkit: %s", choice.note)  # the CPU path: one line, environment left alone
        _swap_claim(old, None)
        state.current.chosen = choice
        return choice
    per_gpu = limits(choice, share_bytes, fraction) if (share_bytes or fraction) else []
    if not per_gpu and claims.SHARE_VAR in os.environ and claims.handed_down():
        inherited = int(os.environ[claims.SHARE_VAR] or 0)   # a parent's claim gives this process a share
        per_gpu = limits(choice, inherited, None) if inherited > 0 else []
    before = {k: os.environ.get(k) for k in (ORDER_VAR, VISIBLE_VAR, GROWTH_VAR)}
    value = ",".join(g.cuda_id for g in choice) or NO_GPUS
    if state.current.applied_value is None or before[VISIBLE_VAR] != state.current.applied_value:
        state.current.inherited = before[VISIBLE_VAR]
    os.environ[ORDER_VAR] = "PCI_BUS_ID"
    os.environ[VISIBLE_VAR] = value
    if memory_growth and choice and GROWTH_VAR not in os.environ:
        os.environ[GROWTH_VAR] = "true"
    try:
        if before[VISIBLE_VAR] != value or before[ORDER_VAR] != "PCI_BUS_ID":
            _apply_to_frameworks(choice, inventory, before, memory_growth and not per_gpu, what)
    except DevicesAlreadyInitialized as exc:
        if strict:
            for key, old_value in before.items():
                if old_value is None:
                    os.environ.pop(key, None)
                else:
                    os.environ[key] = old_value
            if claim is not None:
                claim.release()
            raise
        warnings.warn(f"{exc} (strict=False: {VISIBLE_VAR}={value} is set for processes started from here.)",
                      GPUSelectionWarning, stacklevel=2)
    if per_gpu:
        share_apply(per_gpu)
    else:
        share_clear()
    _swap_claim(old, claim)
    choice.claim = claim
    state.current.chosen, state.current.applied_value = choice, value
    log.info("colabkit: %s -> %s=%s", what, VISIBLE_VAR, value)
    return choice


def _wait_seconds(wait, what: str) -> float | None:
    if wait is None or wait is False:
        return None
    if wait is True:
        return float("inf")
    from ..units import parse_duration
    try:
        seconds = parse_duration(wait, name="wait")
    except ValueError as exc:
        raise GPUSelectionError(f"{what}: {exc} (or wait=True: as long as it takes)") from None
    return seconds or None


def _choose_and_claim(request, where, what: str, *, min_free, max_util, strict, wait_s, share_bytes, fraction,
                      old, inventory):
    """(inventory, choice, new Claim or None): choose among the GPUs nobody else holds, and claim them in one
    step under the claim table's lock (waiting in line when wait_s says so)."""
    inherited = claims.handed_down()   # a parent's claims; this process's own earlier claim is ``old``
    mine = inherited | ({old.id} if old is not None and old.held else set())
    current = {"inventory": inventory}

    def choose(view, strict=strict or wait_s is not None):
        inventory = current["inventory"]
        taken, busy = claims.taken(inventory, view, mine=mine, share=share_bytes, fraction=fraction)
        shared = {g.uuid for g in inventory if g.uuid not in taken
                  and any(s is not None for r, s in view.holders(g.uuid) if r.id not in mine)}
        choice = select_gpus(request, min_free=min_free, max_util=max_util, strict=strict, inventory=inventory,
                             claimed=taken, busy=busy, prefer=shared if (share_bytes or fraction) else ())
        covered = {g["uuid"] for r in view.claims if r.id in inherited for g in r.gpus}
        per_gpu = limits(choice, share_bytes, fraction) if (share_bytes or fraction) else [(None, None)] * len(choice)
        wanted = [{"uuid": g.uuid, "index": g.index, "label": g.label, "share": size}
                  for g, (size, _) in zip(choice, per_gpu) if g.uuid not in covered]
        return choice, wanted

    def say(text):
        print(text, file=sys.stderr, flush=True)

    def join():   # holding the old claim while waiting for more could deadlock with another process
        if old is not None and old.held:
            _swap_claim(old, None)

    want = claims.want_of(_candidates(request, inventory, what), share=share_bytes, fraction=fraction, mine=mine)
    try:
        choice, claim = claims.acquire(choose, path=where, wait=wait_s, request=what, retry=(GPUsTaken,), say=say,
                                       refresh=lambda: current.update(inventory=gpus(processes=True, claims=False)),
                                       want=want, on_join=join)
    except GPUsTaken:
        if strict:
            raise
        # strict=False: after any wait, take what is free now (select_gpus warns)
        choice, claim = claims.acquire(lambda view: choose(view, strict=False), path=where, request=what,
                                       retry=(GPUsTaken,))
    return current["inventory"], choice, claim


def _candidates(request, inventory, what: str) -> list:
    """The GPUs a request could use, whoever holds them (what its place in line says it waits for): those named,
    or for a count or "auto" every usable one."""
    from .select import _classify
    if _classify(request, what)[0] == "explicit":
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            with contextlib.suppress(GPUSelectionError):
                return list(select_gpus(request, strict=False, inventory=inventory))
    return [g for g in inventory if g.usable]


def _swap_claim(old, new) -> None:
    """Make ``new`` this process's claim (what children inherit, with the parent's); release the one it
    replaces."""
    if old is not None and old is not new:
        old.release()
    state.current.claim = new
    ids = claims.handed_down()   # a parent's: this process's own claims are not among them
    if new is not None:
        ids.add(new.id)
    if ids:
        os.environ[claims.HANDED_VAR] = ",".join(sorted(ids))
    else:
        os.environ.pop(claims.HANDED_VAR, None)


def _apply_to_frameworks(choice: Inventory, inventory: Inventory, before: dict, memory_growth: bool,
                         what: str) -> None:
    torch = sys.modules.get("torch")
    cuda = getattr(torch, "cuda", None)
    try:
        torch_started = bool(cuda.is_initialized()) if cuda is not None else False
    except Exception:  # noqa: BLE001 - a broken torch install must not break GPU selection
        torch_started = False
    if torch_started:
        raise DevicesAlreadyInitialized(
            f"{what} chose {gpu_names(choice)}, but PyTorch has already initialized CUDA in this process, so "
            f"{VISIBLE_VAR} no longer changes which GPUs it uses. Restart the kernel (on Colab: Runtime > Restart "
            f"session) and call colabkit.use_gpus(...) before anything uses torch.cuda.")
    tf = sys.modules.get("tensorflow")
    if tf is not None and hasattr(tf, "config"):
        _apply_to_tensorflow(tf, choice, inventory, before, memory_growth, what)


def _tf_state(tf):
    """(listed, initialized): whether TensorFlow has listed its physical devices / created its context.
    None where this TensorFlow does not tell (private attributes, checked defensively)."""
    try:
        from tensorflow.python.eager import context as tf_context
        ctx = tf_context.context()
        return ctx._physical_devices is not None, ctx._context_handle is not None
    except Exception:  # noqa: BLE001
        return None, None


def _apply_to_tensorflow(tf, choice: Inventory, inventory: Inventory, before: dict, memory_growth: bool,
                         what: str) -> None:
    listed, initialized = _tf_state(tf)
    if listed is False:
        return  # TensorFlow is imported but has not asked CUDA for GPUs yet: the variables will take effect
    physical = tf.config.list_physical_devices("GPU")
    if listed is None and len(physical) == len(choice):
        return  # cannot tell; what TensorFlow sees matches the choice
    order = cuda_order(inventory, before)
    if order is not None and len(order) == len(physical):
        by_uuid = {g.uuid: d for g, d in zip(order, physical)}
        targets = [by_uuid[g.uuid] for g in choice if g.uuid in by_uuid]
        if len(targets) == len(choice):
            if [d.name for d in tf.config.get_visible_devices("GPU")] != [d.name for d in targets]:
                try:
                    tf.config.set_visible_devices(targets, "GPU")
                except RuntimeError:
                    targets = None
            if targets is not None:
                for d in targets if memory_growth else ():
                    with contextlib.suppress(RuntimeError, ValueError):
                        tf.config.experimental.set_memory_growth(d, True)
                return
    visible = tf.config.get_visible_devices("GPU") if physical else []
    seen = f"{len(visible)}: {', '.join(d.name for d in visible) or 'none'}"
    raise DevicesAlreadyInitialized(
        f"{what} chose {gpu_names(choice)}, but TensorFlow has already "
        f"{'initialized' if initialized or initialized is None else 'listed'} its GPUs in this process "
        f"(it sees {seen}), so the choice cannot take effect here. Restart the kernel (on Colab: "
        f"Runtime > Restart session) and call colabkit.use_gpus(...) before any TensorFlow or Keras code touches a "
        f"device (strategy(), list_physical_devices, building a model). If TensorFlow sees no GPU even then, it is a "
        f"CPU-only build or cannot load CUDA (pip install \"tensorflow[and-cuda]\").")
