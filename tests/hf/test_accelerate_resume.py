"""colabkit.hf.AccelerateResume with real accelerate on CPU: a run stopped mid-epoch (SIGTERM, a deadline) and
resumed in a fresh process on a fresh local disk ends bit-equal to an uninterrupted one (every parameter, buffer,
optimizer and scheduler state, a registered object) and trains the same batches after the resume; kill -9 during a
save leaves nothing partial that a run could restore; bad input fails with errors that name the value; the run
shows in `colabkit checkpoints` and the status panel.

Run as a script, this file is the training worker: ``python test_accelerate_resume.py '<json spec>'``.
"""
import hashlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("accelerate")

HERE = Path(__file__).resolve()
REPO = HERE.parent.parent.parent


# -- the worker (runs in the subprocess) -----------------------------------------------------------------

class Counter:
    """An object of the user's own, registered with accelerator.register_for_checkpointing. ``on_save`` (when set)
    runs inside save_state: the place where a test kills the process mid-save."""

    def __init__(self):
        self.n, self.loss_sum, self.on_save = 0, 0.0, None

    def state_dict(self):
        if self.on_save is not None:
            self.on_save()
        return {"n": self.n, "loss_sum": self.loss_sum}

    def load_state_dict(self, state):
        self.n, self.loss_sum = state["n"], state["loss_sum"]


class Ballast:
    """A registered object of ``mb`` megabytes (drawing no random numbers)."""

    def __init__(self, mb):
        self.w = torch.zeros(mb * 2 ** 18)

    def state_dict(self):
        return {"w": self.w}

    def load_state_dict(self, state):
        self.w = state["w"]


class Clock:
    """A deadline clock (deadline=clock) the loop arms at a chosen batch: the deadline save happens there."""

    def __init__(self):
        self.at = None

    def next_deadline(self):
        from colabkit.deadline import Deadline
        return None if self.at is None else Deadline(at=self.at, reason="the test deadline", stop_training=True,
                                                     key="test")


def _digest(tensor) -> str:
    return hashlib.sha256(tensor.detach().contiguous().numpy().tobytes()).hexdigest()[:16]


def _dump(model, opt, counter, out):
    arrays = {f"model/{k}": v.detach().numpy() for k, v in model.state_dict().items()}
    for pid, state in opt.state_dict()["state"].items():
        for k, v in state.items():
            arrays[f"opt/{pid}/{k}"] = v.detach().numpy() if isinstance(v, torch.Tensor) else np.array(v)
    arrays["rng/torch"] = torch.get_rng_state().numpy()
    np.savez(out, **arrays)
    return {"counter": [counter.n, counter.loss_sum], "lr": opt.param_groups[0]["lr"]}


def worker(spec):
    import random

    from accelerate import Accelerator
    from accelerate.utils import DataLoaderConfiguration

    import colabkit
    torch.set_num_threads(1)
    seed = spec.get("seed", 0)   # a resumed run seeds differently: nothing may depend on it
    torch.manual_seed(seed)
    np.random.seed(seed)
    random.seed(seed)
    accelerator = Accelerator(cpu=True, gradient_accumulation_steps=2, dataloader_config=DataLoaderConfiguration(
        use_seedable_sampler=spec.get("seedable", False)))
    g = torch.Generator().manual_seed(1)
    x = torch.randn(24, 4, generator=g)
    data = torch.utils.data.TensorDataset(x, (x.sum(1, keepdim=True) > 0).float())
    loader = torch.utils.data.DataLoader(data, batch_size=4, shuffle=True)
    model = torch.nn.Sequential(torch.nn.Linear(4, 16), torch.nn.BatchNorm1d(16), torch.nn.ReLU(),
                                torch.nn.Dropout(0.3), torch.nn.Linear(16, 1))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=2, gamma=0.7)
    model, opt, loader, sched = accelerator.prepare(model, opt, loader, sched)
    counter = Counter()
    accelerator.register_for_checkpointing(counter)
    if spec.get("ballast_mb"):   # a larger checkpoint: its commit takes a while after the save returns
        accelerator.register_for_checkpointing(Ballast(spec["ballast_mb"]))
    clock = Clock()
    ar = colabkit.hf.AccelerateResume(spec["dest"], accelerator, save_freq=spec.get("save_freq"), deadline=clock)
    kill_now = []

    def on_save():
        if ar.step == spec.get("kill_in_save_at"):   # kill -9 in the middle of save_state
            assert ar.checkpoints.wait(60)             # the save before it is committed
            print("KILLED-IN-SAVE " + json.dumps({"step": ar.step, "newest": ar.checkpoints.list()[-1].step}),
                  flush=True)
            os.kill(os.getpid(), signal.SIGKILL)
        if ar.step == spec.get("kill_after_save_at"):
            kill_now.append(True)                      # at the next batch: the commit is in flight
    counter.on_save = on_save

    seen = []
    try:
        for epoch in ar.epochs(3):
            for xb, yb in ar.batches(loader):
                if kill_now:
                    print("KILLED-AFTER-SAVE", flush=True)
                    os.kill(os.getpid(), signal.SIGKILL)
                index = ar.batch
                with accelerator.accumulate(model):
                    loss = torch.nn.functional.binary_cross_entropy_with_logits(
                        model(xb + 0.01 * torch.randn_like(xb)), yb)
                    accelerator.backward(loss)
                    opt.step()
                    sched.step()
                    opt.zero_grad()
                counter.n += 1
                counter.loss_sum += float(loss.detach())
                seen.append([epoch, index, _digest(xb)])
                if [epoch, index] == spec.get("sigterm_at"):
                    os.kill(os.getpid(), signal.SIGTERM)
                if [epoch, index] == spec.get("deadline_at"):
                    clock.at = time.time() + 30   # inside the margin: due at this batch's end
    except colabkit.hf.Stopped as exc:
        print(f"STOPPED {exc}", flush=True)
        return None
    ar.close()
    restored = None if ar.restored is None else [ar.restored.step, ar.restored.epoch, ar.restored.batch]
    return {"seen": seen, "restored": restored, "step": ar.step, **_dump(model, opt, counter, spec["out"])}


# -- running workers -------------------------------------------------------------------------------------

def _env(base, root, cache):
    """The worker's environment: the test's Drive root and config, a local cache of its own (``cache``)."""
    return {**base, "XDG_CACHE_HOME": str(root / cache), "OMP_NUM_THREADS": "1",
            "PYTHONPATH": os.pathsep.join([str(REPO), base.get("PYTHONPATH", "")])}


def _chain(base, root, steps):
    """Run the worker once per step, one after the other, each a fresh process: [(returncode, stdout, stderr,
    RESULT or None, what the step's ``after`` returned once the process ended)]."""
    done = []
    for cache, spec, *after in steps:
        proc = subprocess.run([sys.executable, str(HERE), json.dumps(spec)], env=_env(base, root, cache),
                              capture_output=True, text=True, timeout=300)
        lines = [line for line in proc.stdout.splitlines() if line.startswith("RESULT ")]
        done.append((proc.returncode, proc.stdout, proc.stderr, json.loads(lines[0][7:]) if lines else None,
                     after[0]() if after else None))
    return done


def _check_rc(run, expect_rc):
    rc, stdout, stderr, result, _ = run
    explain = f"rc={rc}\n--- stdout\n{stdout}\n--- stderr\n{stderr[-4000:]}"
    assert rc == expect_rc, explain
    return result, stdout, explain


def _assert_equal_to(reference, resumed, out_ref, out_resumed, explain):
    """Every parameter, buffer, optimizer state and registered value bit-equal; the batches after the resume
    position are the reference's."""
    with np.load(out_ref) as want, np.load(out_resumed) as got:
        assert sorted(want.files) == sorted(got.files), explain
        differing = [k for k in want.files if want[k].shape != got[k].shape or not np.array_equal(want[k], got[k])]
    assert differing == [], f"{differing}\n{explain}"
    assert resumed["counter"] == reference["counter"] and resumed["lr"] == reference["lr"], explain
    assert resumed["step"] == reference["step"] == 18, explain
    _, epoch, batch = resumed["restored"]
    assert resumed["seen"] == [s for s in reference["seen"] if (s[0], s[1]) >= (epoch, batch)], explain


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """Two chains of fresh worker processes, run side by side in the background, and the uninterrupted
    reference, run in this process meanwhile (each with a Drive root and local caches of its own):
    "stops": a deadline stops the first run mid-epoch; the second, on a fresh local disk with another seed,
    resumes and is stopped by SIGTERM; the third, on a fresh disk again, resumes and finishes.
    "kills": kill -9 inside save_state; the next run on the same machine resumes and is killed with kill -9 just
    after its save returned (its commit and upload in flight); the third, on a fresh disk, resumes and finishes."""
    import concurrent.futures

    from colabkit.checkpoints.report import checkpoints_report
    root = tmp_path_factory.mktemp("accelerate-runs")
    base = {k: v for k, v in os.environ.items() if not k.startswith("COLABKIT_")}
    base.update({"XDG_CONFIG_HOME": str(root / "config"), "COLABKIT_DRIVE_ROOT": str(root / "drive")})
    common = {"save_freq": 3}
    stops = [("cache-1", dict(dest="drive:runs/stops", deadline_at=[0, 3], **common)),
             ("cache-2", dict(dest="drive:runs/stops", sigterm_at=[1, 2], seed=7, **common)),
             ("cache-3", dict(dest="drive:runs/stops", out=str(root / "stops.npz"), seed=8, **common))]
    kills = [("cache-k", dict(dest="drive:runs/kills", kill_in_save_at=10, ballast_mb=8, **common)),
             ("cache-k", dict(dest="drive:runs/kills", kill_after_save_at=16, ballast_mb=8, seed=7, **common),
              lambda: checkpoints_report(root / "drive" / "runs" / "kills", verify=True, as_json=True)),
             ("cache-k2", dict(dest="drive:runs/kills", out=str(root / "kills.npz"), ballast_mb=8, seed=8,
                               **common))]
    pool = concurrent.futures.ThreadPoolExecutor(2)
    chains = {"stops": pool.submit(_chain, base, root, stops), "kills": pool.submit(_chain, base, root, kills)}
    with pytest.MonkeyPatch.context() as mp:   # the reference: this process, its own Drive root and cache
        for key in [k for k in os.environ if k.startswith("COLABKIT_")]:
            mp.delenv(key)
        mp.setenv("COLABKIT_FLIGHT_RECORDER", "false")   # no recorder thread left in the test process
        mp.setenv("COLABKIT_DRIVE_ROOT", str(root / "drive-ref"))
        mp.setenv("XDG_CACHE_HOME", str(root / "cache-ref"))
        mp.setenv("XDG_CONFIG_HOME", str(root / "config"))
        reference = worker(dict(dest="drive:runs/ref", out=str(root / "ref.npz"), **common))
    assert reference["restored"] is None
    yield root, reference, chains
    pool.shutdown()


@pytest.mark.subprocess_kill
def test_stopped_by_a_deadline_then_sigterm_mid_epoch_resumes_bit_exactly_on_fresh_disks(runs):
    """The deadline is due after the fourth batch of epoch 0: saved, committed, Stopped. SIGTERM after the third
    batch of epoch 1: the save waits for the accumulation's optimizer step (batch 4), is committed, then SIGTERM
    ends the process. Each resume is a fresh process with an empty local cache and another seed, restoring from
    Drive; the last ends bit-equal to the uninterrupted run."""
    root, reference, chains = runs
    first, second, third = chains["stops"].result()
    _, out, explain = _check_rc(first, 0)
    assert "STOPPED the test deadline is" in out and "saved step 4 (epoch 0, batch 4)" in out, explain
    _, out, explain = _check_rc(second, -signal.SIGTERM)
    assert "resumed from step 4 (epoch 0, batch 4) in drive:runs/stops" in out, explain
    assert "SIGTERM received: saved step 10 (committed to drive:runs/stops) and stopped training" in out, explain
    resumed, out, explain = _check_rc(third, 0)
    assert resumed["restored"] == [10, 1, 4], explain
    _assert_equal_to(reference, resumed, root / "ref.npz", root / "stops.npz", explain)


@pytest.mark.subprocess_kill
def test_kill_9_during_saves_leaves_nothing_partial_and_the_next_run_resumes_from_the_previous(runs):
    """kill -9 inside save_state (step 10): the next run on the same machine resumes from the save before it
    (step 6). That run is killed just after its save at step 16 returned; every checkpoint Drive lists then
    verifies, and a third run, on a fresh disk, resumes from the newest of them and ends bit-equal to the
    uninterrupted run."""
    root, reference, chains = runs
    first, second, third = chains["kills"].result()
    _, out, explain = _check_rc(first, -signal.SIGKILL)
    assert 'KILLED-IN-SAVE {"step": 10, "newest": 6}' in out, explain
    _, out, explain = _check_rc(second, -signal.SIGKILL)
    assert "resumed from step 6 (epoch 1, batch 0)" in out and "KILLED-AFTER-SAVE" in out, explain
    report, ok = second[4]   # Drive after the second kill
    assert ok, report   # every checkpoint listed verifies; nothing partial counts as one
    committed = [c["step"] for c in json.loads(report)["checkpoints"]]
    # 10, 12 and 16 were saved milliseconds apart: any of them may still have been uploading (or been dropped for
    # a newer one) at the kill; what the first kill left committed is never lost
    assert max(committed) >= 6 and {4, 6} & set(committed), report
    resumed, out, explain = _check_rc(third, 0)
    assert resumed["restored"][0] == max(committed), explain
    _assert_equal_to(reference, resumed, root / "ref.npz", root / "kills.npz", explain)


# -- in this process -------------------------------------------------------------------------------------

@pytest.fixture
def setup(ck_env):
    from accelerate import Accelerator
    torch.manual_seed(0)
    accelerator = Accelerator(cpu=True)
    model = torch.nn.Linear(3, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(torch.randn(12, 3)), batch_size=4,
                                         shuffle=True)
    model, opt, loader = accelerator.prepare(model, opt, loader)
    return accelerator, model, opt, loader


def _train(ar, accelerator, model, opt, loader, epochs):
    for _ in ar.epochs(epochs):
        for (x,) in ar.batches(loader):
            opt.zero_grad()
            accelerator.backward(model(x).sum())
            opt.step()


@pytest.mark.parametrize("kwargs, match", [
    ({"save_freq": 0}, r"save_freq=0 is invalid"),
    ({"save_freq": "500"}, r"save_freq='500' is invalid"),
    ({"every": "soon"}, r"every='soon' is invalid"),
    ({"deadline": "whenever"}, r"deadline='whenever' is invalid.*auto"),
    ({"keep": 0}, r"keep=0 is invalid"),
    ({"verbose": 2}, r"verbose=2 is invalid"),
])
def test_bad_arguments_name_the_value(tmp_path, setup, kwargs, match):
    import colabkit
    with pytest.raises(ValueError, match=match):
        colabkit.hf.AccelerateResume(tmp_path / "run", setup[0], **kwargs)
    assert not (tmp_path / "run").exists() or not any((tmp_path / "run").iterdir())


def test_careless_calls_say_what_to_pass(tmp_path, setup):
    import colabkit
    accelerator, model, opt, loader = setup
    with pytest.raises(TypeError, match=r"accelerator=Linear.*is not an accelerate.Accelerator"):
        colabkit.hf.AccelerateResume(tmp_path / "run", model)
    with pytest.raises(ValueError, match=r"directory=''"):
        colabkit.hf.AccelerateResume("", accelerator)
    ar = colabkit.hf.AccelerateResume(tmp_path / "run", accelerator, deadline=None, verbose=0)
    with pytest.raises(ValueError, match=r"epochs\(n='3'\) is invalid"):
        next(ar.epochs("3"))
    with pytest.raises(TypeError, match=r"batches\(loader=\[1, 2\]\) takes a torch DataLoader"):
        next(ar.batches([1, 2]))
    ar.state["model"] = model   # not JSON: the save says what to do instead, and nothing is committed
    with pytest.raises(Exception, match=r"ar.state holds a value that is not JSON.*register_for_checkpointing"):
        _train(ar, accelerator, model, opt, loader, 1)
    ar.close()
    assert colabkit.Checkpoints(tmp_path / "run").list() == []


def test_a_checkpoint_of_another_model_names_the_tensor_and_loads_nothing(tmp_path, setup):
    import colabkit
    from accelerate import Accelerator
    accelerator, model, opt, loader = setup
    ar = colabkit.hf.AccelerateResume(tmp_path / "run", accelerator, deadline=None, verbose=0)
    _train(ar, accelerator, model, opt, loader, 1)
    ar.close()
    other = Accelerator(cpu=True)
    wide = torch.nn.Linear(5, 1)
    before = wide.weight.detach().clone()
    wide, other_opt = other.prepare(wide, torch.optim.SGD(wide.parameters(), lr=0.1))
    with pytest.raises(colabkit.CheckpointError, match=r"'weight' has shape \[1, 3\] there and \[1, 5\]"):
        colabkit.hf.AccelerateResume(tmp_path / "run", other, deadline=None, verbose=0)
    assert torch.equal(wide.weight, before)


def test_the_run_shows_in_colabkit_checkpoints_and_the_status_panel(tmp_path, setup, capsys):
    import colabkit
    from colabkit import cli, widgets
    accelerator, model, opt, loader = setup
    ar = colabkit.hf.AccelerateResume(tmp_path / "run", accelerator, save_freq=2, deadline=None, verbose=0)
    _train(ar, accelerator, model, opt, loader, 2)
    resume, store = widgets.latest()
    assert resume is ar and store is ar.checkpoints
    assert "step 6 (epoch 2)" in str(widgets.snapshot().rows)
    ar.close()
    capsys.readouterr()
    assert cli.main(["checkpoints", str(tmp_path / "run"), "--verify"]) == 0
    out = capsys.readouterr().out
    committed = len(colabkit.Checkpoints(tmp_path / "run").list())   # a save superseded while queued is dropped
    assert f"{committed} committed checkpoint(s)" in out and "step        6  epoch 2, batch 0" in out, out
    assert out.count("  OK") == committed >= 1, out


def test_a_finished_run_says_so_and_trains_nothing(tmp_path, setup, capsys):
    import colabkit
    accelerator, model, opt, loader = setup
    ar = colabkit.hf.AccelerateResume(tmp_path / "run", accelerator, deadline=None)
    _train(ar, accelerator, model, opt, loader, 1)
    ar.close()
    weights = model.weight.detach().clone()
    again = colabkit.hf.AccelerateResume(tmp_path / "run", accelerator, deadline=None)
    assert list(again.epochs(1)) == []
    again.close()
    out = capsys.readouterr().out
    assert "resumed from step 3 (epoch 1, batch 0)" in out and "training already finished" in out
    assert torch.equal(model.weight, weights)


def _seedable_run(directory, seed, interrupt_at=None):
    """Dropout and accelerate's seedable sampler, in this process; ``interrupt_at``: (epoch, batch) where the
    stop button is pressed. Returns (the batches trained, the final weights)."""
    import random

    from accelerate import Accelerator
    from accelerate.utils import DataLoaderConfiguration

    import colabkit
    torch.manual_seed(seed)   # the sampler's seed is torch's initial seed: the resumed run's differs
    random.seed(seed)
    accelerator = Accelerator(cpu=True, dataloader_config=DataLoaderConfiguration(use_seedable_sampler=True))
    data = torch.utils.data.TensorDataset(torch.arange(40, dtype=torch.float32).reshape(20, 2))
    model = torch.nn.Sequential(torch.nn.Linear(2, 4), torch.nn.Dropout(0.5), torch.nn.Linear(4, 1))
    opt = torch.optim.Adam(model.parameters(), lr=0.01)
    model, opt, loader = accelerator.prepare(model, opt, torch.utils.data.DataLoader(data, batch_size=4,
                                                                                     shuffle=True))
    ar = colabkit.hf.AccelerateResume(directory, accelerator, deadline=None)
    seen = []
    for epoch in ar.epochs(3):
        for (x,) in ar.batches(loader):
            opt.zero_grad()
            accelerator.backward(model(x).square().mean())
            opt.step()
            seen.append((epoch, ar.batch, x[:, 0].tolist()))
            if (epoch, ar.batch) == interrupt_at:
                os.kill(os.getpid(), signal.SIGINT)
    ar.close()
    return seen, [p.detach().clone() for p in model.parameters()]


def test_interrupt_mid_epoch_with_the_seedable_sampler_resumes_bit_exactly(tmp_path, ck_env, capsys):
    """The stop button mid-epoch: saved, committed, KeyboardInterrupt; a re-run with another torch seed (so
    another sampler seed, unless the saved one is restored) trains the uninterrupted run's batches and ends
    bit-equal."""
    want_seen, want = _seedable_run(tmp_path / "ref", seed=0)
    with pytest.raises(KeyboardInterrupt):
        _seedable_run(tmp_path / "run", seed=0, interrupt_at=(1, 2))
    assert "SIGINT received: saved step 8 (committed to" in capsys.readouterr().out
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler   # handed back
    seen, got = _seedable_run(tmp_path / "run", seed=123)
    assert seen == [s for s in want_seen if s[:2] > (1, 2)]
    assert all(torch.equal(a, b) for a, b in zip(want, got))


def test_importing_colabkit_hf_imports_neither_accelerate_nor_torch():
    code = ("import sys, colabkit, colabkit.hf\nassert 'AccelerateResume' in dir(colabkit.hf)\n"
            "print(sorted(m for m in sys.modules if m.split('.')[0] in ('torch', 'accelerate', 'transformers')))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=REPO)
    assert done.returncode == 0 and done.stdout.strip() == "[]", done.stdout + done.stderr


if __name__ == "__main__":
    result = worker(json.loads(sys.argv[1]))
    if result is not None:
        print("RESULT " + json.dumps(result), flush=True)


def test_a_save_called_outside_the_loops_saves_the_state_of_that_moment_every_time(tmp_path, setup):
    """As colabkit.torch.AutoResume: the step does not move outside ar.batches(), yet every ar.save() saves."""
    import colabkit
    accelerator, model, opt, loader = setup
    ar = colabkit.hf.AccelerateResume(tmp_path / "run", accelerator, deadline=None, verbose=0)
    for _ in range(2):
        with torch.no_grad():
            model.weight.add_(1.0)
        assert ar.save() is True
    assert ar.checkpoints.wait(30)
    ar.close()
    expected = model.weight.detach().clone()
    with torch.no_grad():
        model.weight.zero_()
    colabkit.hf.AccelerateResume(tmp_path / "run", accelerator, deadline=None, verbose=0).close()
    assert torch.equal(model.weight, expected)
