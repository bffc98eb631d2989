"""colabkit.torch.AutoResume: a run interrupted mid-epoch and resumed in a fresh process ends bit-equal to an
uninterrupted one (every parameter, buffer, optimizer/scheduler/scaler state and RNG), and trains the same
batches after the resume; bad input fails with errors that name the parameter and change nothing.

Run as a script, this file is the training worker: ``python test_torch_resume.py '<json spec>'``.
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


# -- the worker (runs in the subprocess) -----------------------------------------------------------------

class Augmented(torch.utils.data.Dataset):
    """Random augmentation from torch, NumPy and Python RNGs: in the main process, or in each worker."""

    def __init__(self, n=24):
        g = torch.Generator().manual_seed(1)
        self.x = torch.randn(n, 4, generator=g)
        self.y = (self.x.sum(1, keepdim=True) > 0).float()

    def __len__(self):
        return len(self.x)

    def __getitem__(self, i):
        import random
        noise = torch.randn(4) * 0.1 + float(np.random.uniform(-0.05, 0.05)) + random.random() * 0.01
        return self.x[i] + noise, self.y[i]


class Stream(torch.utils.data.IterableDataset):
    def __iter__(self):
        for i in range(12):
            yield torch.full((4,), float(i))


def _digest(tensor) -> str:
    return hashlib.sha256(tensor.detach().contiguous().numpy().tobytes()).hexdigest()[:16]


def _case(name, num_workers, own_generator=False, stateful=False):
    import random
    torch.manual_seed(0)
    np.random.seed(0)
    random.seed(0)
    generator = torch.Generator().manual_seed(5) if own_generator else None
    if stateful:
        from torchdata.stateful_dataloader import StatefulDataLoader
        loader_class = StatefulDataLoader
    else:
        loader_class = torch.utils.data.DataLoader
    loader = loader_class(Augmented(), batch_size=4, shuffle=True, num_workers=num_workers, generator=generator)
    if name == "plain":
        model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.BatchNorm1d(8), torch.nn.ReLU(),
                                    torch.nn.Dropout(0.3), torch.nn.Linear(8, 1))
        opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
        sched = torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.5)

        def step(ar, batch):
            x, y = batch
            opt.zero_grad()
            loss = torch.nn.functional.binary_cross_entropy_with_logits(model(x), y)
            loss.backward()
            opt.step()
            ar.state["losses"] = ar.state.get("losses", 0) + 1
            return x

        return loader, dict(model=model, opt=opt, sched=sched), step, sched.step
    if name == "gan":
        gen = torch.nn.Sequential(torch.nn.Linear(3, 8), torch.nn.ReLU(), torch.nn.Linear(8, 4))
        disc = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.LeakyReLU(0.2), torch.nn.Dropout(0.2),
                                   torch.nn.Linear(8, 1))
        opt_g = torch.optim.Adam(gen.parameters(), lr=1e-3, betas=(0.5, 0.999))
        opt_d = torch.optim.AdamW(disc.parameters(), lr=2e-3)
        sched = torch.optim.lr_scheduler.ExponentialLR(opt_g, gamma=0.9)
        scaler = torch.amp.GradScaler("cpu", init_scale=2.0 ** 8, growth_interval=3)
        bce = torch.nn.functional.binary_cross_entropy_with_logits

        def step(ar, batch):
            real, _ = batch
            z = torch.randn(len(real), 3)
            with torch.autocast("cpu", dtype=torch.bfloat16):
                fake = gen(z)
                d_loss = bce(disc(real), torch.ones(len(real), 1)) + bce(disc(fake.detach()), torch.zeros(len(real), 1))
            opt_d.zero_grad()
            scaler.scale(d_loss.float()).backward()
            scaler.step(opt_d)
            with torch.autocast("cpu", dtype=torch.bfloat16):
                g_loss = bce(disc(fake), torch.ones(len(real), 1))
            opt_g.zero_grad()
            scaler.scale(g_loss.float()).backward()
            scaler.step(opt_g)
            scaler.update()
            ar.state["best_g"] = min(ar.state.get("best_g", 1e9), float(g_loss))
            return real

        return loader, dict(gen=gen, disc=disc, opt_g=opt_g, opt_d=opt_d, sched=sched, scaler=scaler), step, sched.step
    raise ValueError(name)


def _plain(value):
    """A state dict's non-tensor part as JSON; tensors go to ``arrays``."""
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return value if value is None or isinstance(value, (bool, int, float, str)) else repr(value)


def _dump(objects, out) -> dict:
    import random
    arrays, plain = {}, {}

    def walk(prefix, value):
        if isinstance(value, torch.Tensor):
            arrays[prefix] = value.detach().float().numpy() if value.dtype == torch.bfloat16 else value.numpy()
            return "<tensor>"
        if isinstance(value, dict):
            return {str(k): walk(f"{prefix}/{k}", v) for k, v in value.items()}
        if isinstance(value, (list, tuple)):
            return [walk(f"{prefix}[{i}]", v) for i, v in enumerate(value)]
        return _plain(value)

    for name, obj in objects.items():
        plain[name] = walk(name, obj.state_dict())
    arrays["rng/torch"] = torch.get_rng_state().numpy()
    arrays["rng/numpy"] = np.random.get_state()[1]
    plain["rng/python"] = list(random.getstate()[1])
    np.savez(out, **arrays)
    return plain


def ddp_worker(spec):
    """One rank of a ``torchrun --nproc_per_node=2`` run (gloo, CPU): DDP model, DistributedSampler."""
    import random

    import torch.distributed as dist

    import colabkit
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    np.random.seed(rank)
    random.seed(rank)
    dataset = Augmented(32)
    sampler = torch.utils.data.distributed.DistributedSampler(dataset, shuffle=True, seed=3)
    loader = torch.utils.data.DataLoader(dataset, batch_size=4, sampler=sampler)
    model = torch.nn.parallel.DistributedDataParallel(torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(),
                                                                          torch.nn.Dropout(0.2), torch.nn.Linear(8, 1)))
    opt = torch.optim.Adam(model.parameters(), lr=0.01)
    ar = colabkit.torch.AutoResume(spec["dest"], save_freq=2, deadline=None, model=model, opt=opt)
    for epoch in ar.epochs(3):
        sampler.set_epoch(epoch)
        for x, y in ar.batches(loader):
            opt.zero_grad()
            torch.nn.functional.binary_cross_entropy_with_logits(model(x), y).backward()
            opt.step()
            if rank == 1 and [epoch, ar.batch] == spec.get("sigterm_at"):
                os.kill(os.getpid(), signal.SIGTERM)   # one rank is told to stop: both must, at the same batch
            if [epoch, ar.batch] == spec.get("manual_save_at"):
                ar.save()   # every rank calls it, as the docs say
            if rank == 0 and [epoch, ar.batch] == spec.get("unstorable_at"):
                ar.state[(1, 2)] = "a tuple key"   # rank 0's next save raises CheckpointError; rank 1's has nothing to write
    _dump({"model": model.module, "opt": opt}, f"{spec['out']}.{rank}.npz")
    if rank == 0:
        print("RESULT " + json.dumps({"restored": None if ar.restored is None else
                                      [ar.restored.step, ar.restored.epoch, ar.restored.batch], "step": ar.step}),
              flush=True)
    dist.destroy_process_group()


def worker(spec):
    import colabkit
    loader, objects, step, end_of_epoch = _case(spec["case"], spec.get("num_workers", 0),
                                                spec.get("own_generator", False), spec.get("stateful", False))
    ar = colabkit.torch.AutoResume(spec["dest"], save_freq=spec.get("save_freq"), deadline=None, **objects)
    seen = []
    for epoch in ar.epochs(spec.get("epochs", 3)):
        for batch in ar.batches(loader):
            index = ar.batch
            x = step(ar, batch)
            seen.append([epoch, index, _digest(x)])
            if spec.get("step_sleep"):
                time.sleep(spec["step_sleep"])
            if [epoch, index] == spec.get("sigterm_at"):
                os.kill(os.getpid(), signal.SIGTERM)
            if [epoch, index] == spec.get("crash_at"):
                assert ar.checkpoints.wait(120)   # a late commit would move the resume point
                os._exit(3)   # no save, no cleanup: the resume starts from the last periodic checkpoint
        end_of_epoch()
    plain = _dump(objects, spec["out"])
    restored = None if ar.restored is None else [ar.restored.step, ar.restored.epoch, ar.restored.batch]
    print("RESULT " + json.dumps({"plain": plain, "seen": seen, "restored": restored, "step": ar.step,
                                  "user": ar.state}), flush=True)


# -- the tests ---------------------------------------------------------------------------------------------

def _start(env, **spec):
    return subprocess.Popen([sys.executable, str(Path(__file__).resolve()), json.dumps(spec)], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _finish(proc, expect_rc=0):
    stdout, stderr = proc.communicate(timeout=300)
    explain = f"rc={proc.returncode}\n--- stdout\n{stdout}\n--- stderr\n{stderr[-4000:]}"
    assert proc.returncode == expect_rc, explain
    lines = [line for line in stdout.splitlines() if line.startswith("RESULT ")]
    return (json.loads(lines[0][len("RESULT "):]) if lines else None), stdout, explain


def _equivalence(tmp_path, env, case, expect_rc, boundary=False, **spec):
    """Run ``case`` uninterrupted and interrupted (in parallel), then resume the interrupted one in a fresh
    process; assert the two end bit-equal and that the resumed run trained exactly the reference's batches.
    ``boundary``: the resume starts at an epoch's first batch (from the epoch-end checkpoint), else mid-epoch."""
    ref = _start(env, case=case, dest=str(tmp_path / "ref"), out=str(tmp_path / "ref.npz"),
                 **{k: v for k, v in spec.items() if k not in ("sigterm_at", "crash_at")})
    cut = _start(env, case=case, dest=str(tmp_path / "run"), out=str(tmp_path / "cut.npz"), **spec)
    expected, _, _ = _finish(ref)
    _, cut_out, _ = _finish(cut, expect_rc)
    resumed, out, explain = _finish(_start(env, case=case, dest=str(tmp_path / "run"),
                                           out=str(tmp_path / "resumed.npz"),
                                           **{k: v for k, v in spec.items() if k not in ("sigterm_at", "crash_at")}))
    assert resumed["restored"] is not None, explain
    with np.load(tmp_path / "ref.npz") as want, np.load(tmp_path / "resumed.npz") as got:
        assert sorted(want.files) == sorted(got.files)
        differing = [k for k in want.files if want[k].shape != got[k].shape or not np.array_equal(want[k], got[k])]
    assert differing == [], f"{differing}\n{explain}"
    assert resumed["plain"] == expected["plain"], explain
    assert resumed["user"] == expected["user"] and resumed["step"] == expected["step"]
    step, epoch, batch = resumed["restored"]
    tail = [s for s in expected["seen"] if (s[0], s[1]) >= (epoch, batch)]
    assert resumed["seen"] == tail, explain   # the next batch (and every one after it) is the same
    if boundary:
        assert batch == 0, "the resume starts at an epoch's start"
    else:
        assert batch > 0, "the resume starts mid-epoch"
    return resumed, cut_out, out


@pytest.mark.parametrize("own_generator", [False, pytest.param(True, marks=pytest.mark.slow)],
                         ids=["global-rng", "loader-generator"])
def test_plain_loop_crashed_mid_epoch_resumes_bit_exactly_from_a_periodic_save(tmp_path, ck_env, own_generator):
    """num_workers=0: the shuffle order (drawn from the global torch RNG, or from the DataLoader's own
    generator), the augmentation and dropout repeat after skipping to the saved batch."""
    resumed, _, out = _equivalence(tmp_path, ck_env, "plain", 3, crash_at=[1, 4], save_freq=3,
                                   own_generator=own_generator)
    step, epoch, batch = resumed["restored"]
    assert (epoch, batch) == (1, 3) and step == 9, resumed["restored"]   # the last periodic save, mid-epoch
    assert "resumed from step 9 (epoch 1, batch 3)" in out


def test_loader_with_its_own_generator_resumed_at_an_epoch_boundary_resumes_bit_exactly(tmp_path, ck_env):
    """The epoch-end checkpoint holds the DataLoader generator's state after the epoch: the next epoch's
    shuffle order is the uninterrupted run's, not the previous epoch's again."""
    resumed, _, _ = _equivalence(tmp_path, ck_env, "plain", 3, boundary=True, crash_at=[1, 0],
                                   own_generator=True)
    assert resumed["restored"] == [6, 1, 0], resumed["restored"]   # 6 batches an epoch: the epoch-end save


@pytest.mark.parametrize("num_workers", [0, pytest.param(2, marks=pytest.mark.slow)])
def test_stateful_dataloader_resumes_from_its_own_state_bit_exactly(tmp_path, ck_env, num_workers):
    """torchdata's StatefulDataLoader: without workers the resume loads its saved state_dict instead of skipping
    batches; with workers (map-style data) it skips by loading, which replays each worker's augmentation RNG.
    Either way the shuffle order, augmentation and dropout repeat."""
    pytest.importorskip("torchdata.stateful_dataloader", reason="torchdata is not installed (colabkit[torch])")
    resumed, _, _ = _equivalence(tmp_path, ck_env, "plain", 3, crash_at=[1, 4], save_freq=3, stateful=True,
                                 own_generator=True, num_workers=num_workers)
    assert resumed["restored"] == [9, 1, 3], resumed["restored"]


class _CountingStream(torch.utils.data.IterableDataset):
    """An iterable dataset that counts what it yields: a resume that skipped by iterating would show it."""

    def __init__(self):
        self.yielded = 0

    def __iter__(self):
        for i in range(12):
            self.yielded += 1
            yield torch.full((3,), float(i))


def test_stateful_dataloader_over_an_iterable_dataset_resumes_at_its_position(tmp_path, ck_env, capsys):
    """An IterableDataset cannot be skipped to a position; a StatefulDataLoader's state puts it there."""
    pytest.importorskip("torchdata.stateful_dataloader", reason="torchdata is not installed (colabkit[torch])")
    from torchdata.stateful_dataloader import StatefulDataLoader

    import colabkit
    model, opt = _tiny()
    ar = colabkit.torch.AutoResume(tmp_path / "run", model=model, opt=opt, save_freq=2, deadline=None)
    for _ in ar.epochs(1):
        for _x in ar.batches(StatefulDataLoader(_CountingStream(), batch_size=2)):
            if ar.step == 3:
                break   # a crash after the save at step 2 (epoch 0, batch 2)
        break
    ar.close()
    model, opt = _tiny(seed=4)
    again = colabkit.torch.AutoResume(tmp_path / "run", model=model, opt=opt, save_freq=2, deadline=None)
    assert (again.epoch, again.batch) == (0, 2)
    stream, firsts = _CountingStream(), []
    for _ in again.epochs(1):
        for x in again.batches(StatefulDataLoader(stream, batch_size=2)):
            firsts.append(float(x[0, 0]))
    assert firsts == [4.0, 6.0, 8.0, 10.0], firsts
    assert "cannot be positioned" not in capsys.readouterr().out


@pytest.mark.slow
def test_plain_loop_with_two_workers_sigterm_mid_epoch_resumes_bit_exactly(tmp_path, ck_env):
    """num_workers=2: each worker's seed (from the epoch's base seed) repeats, so its augmentation does."""
    resumed, cut_out, _ = _equivalence(tmp_path, ck_env, "plain", -signal.SIGTERM, sigterm_at=[1, 2],
                                       num_workers=2)
    assert resumed["restored"][1:] == [1, 3]
    assert "SIGTERM received: saved step 9" in cut_out and "Re-run this cell to resume" in cut_out


@pytest.mark.slow
def test_gan_with_two_optimizers_scheduler_and_grad_scaler_sigterm_resumes_bit_exactly(tmp_path, ck_env):
    resumed, cut_out, _ = _equivalence(tmp_path, ck_env, "gan", -signal.SIGTERM, sigterm_at=[0, 4])
    assert resumed["restored"] == [5, 0, 5]
    assert "committed to" in cut_out


@pytest.mark.slow
@pytest.mark.subprocess_kill
def test_kill_9_at_random_moments_never_restarts_from_zero_and_ends_bit_exactly(tmp_path, ck_env):
    import random

    from colabkit.checkpoints.folder import CheckpointFolder
    spec = dict(case="plain", save_freq=2, step_sleep=0.04)
    ref = _start(ck_env, dest=str(tmp_path / "ref"), out=str(tmp_path / "ref.npz"), **spec)
    dest = tmp_path / "run"
    rng, resumed_at, killed = random.Random(), [], []
    for attempt in range(4):
        before = max((c.step for c in CheckpointFolder(dest).committed()), default=-1) if dest.exists() else -1
        proc = _start(ck_env, dest=str(dest), out=str(tmp_path / "killed.npz"), **spec)
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and proc.poll() is None:   # until this attempt has committed one
            if dest.exists() and any(c.step > before for c in CheckpointFolder(dest).committed()):
                break
            time.sleep(0.02)
        time.sleep(rng.uniform(0, 0.3))   # then kill -9 anywhere: mid-step, mid-write, mid-commit
        proc.kill()
        stdout, _ = proc.communicate(timeout=60)
        killed.append(proc.returncode == -signal.SIGKILL)
        if attempt:
            lines = [ln for ln in stdout.splitlines() if ln.startswith("colabkit: resumed from step ")]
            assert lines and int(lines[0].split()[4]) > 0, f"attempt {attempt} restarted from zero:\n{stdout}"
            resumed_at.append(int(lines[0].split()[4]))
    assert resumed_at == sorted(resumed_at) and sum(killed) >= 3, (resumed_at, killed)
    expected, _, _ = _finish(ref)
    final, out, explain = _finish(_start(ck_env, dest=str(dest), out=str(tmp_path / "final.npz"), **spec))
    assert final["restored"] is not None and final["restored"][0] > 0, explain
    with np.load(tmp_path / "ref.npz") as want, np.load(tmp_path / "final.npz") as got:
        assert [k for k in want.files if not np.array_equal(want[k], got[k])] == [], explain
    assert final["plain"] == expected["plain"] and final["user"] == expected["user"]


def _torchrun(env, start_new_session=False, **spec):
    return subprocess.Popen([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
                             str(Path(__file__).resolve()), json.dumps({"ddp": True, **spec})], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=start_new_session)


@pytest.mark.slow
def test_torchrun_two_processes_rank_0_commits_and_both_ranks_resume_bit_exactly(tmp_path, ck_env):
    """2 CPU processes (gloo): SIGTERM to one rank stops both at the same batch after rank 0 has committed;
    a new torchrun restores the same checkpoint in both ranks and ends bit-equal to an uninterrupted run."""
    env = {**ck_env, "OMP_NUM_THREADS": "1"}
    ref = _torchrun(env, dest=str(tmp_path / "ref"), out=str(tmp_path / "ref"))
    expected, _, _ = _finish(ref)
    cut = _torchrun(env, dest=str(tmp_path / "run"), out=str(tmp_path / "cut"), sigterm_at=[1, 2])
    stdout, stderr = cut.communicate(timeout=300)
    assert cut.returncode != 0 and "SIGTERM received: saved step 7" in stdout, f"{stdout}\n{stderr[-3000:]}"
    resumed, out, explain = _finish(_torchrun(env, dest=str(tmp_path / "run"), out=str(tmp_path / "resumed")))
    assert resumed["restored"] == [7, 1, 3], explain   # 4 batches per rank and epoch
    assert resumed["step"] == expected["step"] == 12
    for rank in (0, 1):
        with np.load(tmp_path / f"ref.{rank}.npz") as want, np.load(tmp_path / f"resumed.{rank}.npz") as got:
            assert [k for k in want.files if not np.array_equal(want[k], got[k])] == [], (rank, explain)


@pytest.mark.slow
def test_torchrun_manual_save_after_rank_0_skipped_a_busy_periodic_save_does_not_hang(tmp_path, ck_env):
    """small_state_mb=0: rank 0's first periodic save finds its new buffer set being touched and is taken at a
    later batch, while rank 1 has nothing to write; a manual save at that same batch must not leave rank 0
    alone in the gather (a hang until the collective's timeout)."""
    env = {**ck_env, "OMP_NUM_THREADS": "1", "COLABKIT_SMALL_STATE_MB": "0"}
    proc = _torchrun(env, dest=str(tmp_path / "run"), out=str(tmp_path / "out"), manual_save_at=[0, 2],
                     start_new_session=True)
    try:
        stdout, stderr = proc.communicate(timeout=120)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)   # torchrun and both ranks
        stdout, stderr = proc.communicate()
        pytest.fail(f"the run hung after the manual save\n{stdout}\n{stderr[-3000:]}")
    assert proc.returncode == 0, f"{stdout}\n{stderr[-3000:]}"
    import colabkit
    steps = [c.step for c in colabkit.Checkpoints(tmp_path / "run").list()]
    assert steps[-1] == 12, steps


@pytest.mark.slow
def test_torchrun_a_save_that_fails_on_rank_0_raises_on_every_rank(tmp_path, ck_env):
    """Rank 0 alone writes; when its save raises, rank 1 must not go on into the next batch's collective (a
    hang under mp.spawn or in a notebook): it raises too, naming rank 0's error."""
    env = {**ck_env, "OMP_NUM_THREADS": "1"}
    proc = _torchrun(env, dest=str(tmp_path / "run"), out=str(tmp_path / "out"), unstorable_at=[0, 1],
                     start_new_session=True)
    try:
        stdout, stderr = proc.communicate(timeout=120)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        stdout, stderr = proc.communicate()
        pytest.fail(f"the run hung after rank 0's failed save\n{stdout}\n{stderr[-3000:]}")
    assert proc.returncode != 0
    assert "cannot be stored" in stderr, stderr[-3000:]                       # rank 0's own error
    assert "rank 0 could not save step 2" in stderr, stderr[-3000:]           # and rank 1's, naming it


# -- in-process: the store's contents and bad input --------------------------------------------------------

def _tiny(seed=0, width=3):
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(width, 4), torch.nn.BatchNorm1d(4), torch.nn.Linear(4, 2))
    opt = torch.optim.Adam(model.parameters(), lr=0.01)
    return model, opt


def _train(ar, model, opt, loader, epochs):
    for _ in ar.epochs(epochs):
        for (x,) in ar.batches(loader):
            opt.zero_grad()
            model(x).sum().backward()
            opt.step()


def _loader(width=3):
    return torch.utils.data.DataLoader(torch.utils.data.TensorDataset(torch.randn(12, width)), batch_size=4,
                                       shuffle=True)


def test_checkpoint_holds_arrays_and_json_only(tmp_path, ck_env):
    import colabkit
    model, opt = _tiny()
    ar = colabkit.torch.AutoResume(tmp_path / "run", model=model, opt=opt, deadline=None, verbose=0)
    ar.state["note"] = "hi"
    _train(ar, model, opt, _loader(), 1)
    ar.close()
    newest = colabkit.Checkpoints(tmp_path / "run").list()[-1]
    assert (newest.step, newest.epoch, newest.batch) == (3, 1, 0)
    assert set(newest.manifest["files"]) == {"arrays.npz", "state.json"}
    with np.load(newest.path / "arrays.npz", allow_pickle=False) as arrays:   # nothing pickled
        assert any(np.array_equal(arrays[k], model[0].weight.detach().numpy()) for k in arrays.files)


def test_the_status_panel_shows_the_run(tmp_path, ck_env):
    import colabkit
    from colabkit import widgets
    model, opt = _tiny()
    ar = colabkit.torch.AutoResume(tmp_path / "run", model=model, opt=opt, deadline=None, verbose=0)
    _train(ar, model, opt, _loader(), 1)
    resume, store = widgets.latest()
    assert resume is ar and store is ar.checkpoints
    assert "step 3 (epoch 1)" in str(widgets.snapshot().rows)
    ar.close()


@pytest.mark.parametrize("wrap", [torch.nn.DataParallel, torch.compile], ids=["DataParallel", "compile"])
def test_wrapped_model_checkpoint_fits_the_bare_model(tmp_path, ck_env, wrap):
    import colabkit
    model, opt = _tiny()
    ar = colabkit.torch.AutoResume(tmp_path / "run", model=wrap(model), opt=opt, deadline=None, verbose=0)
    _train(ar, model, opt, _loader(), 1)   # the bare model trains: torch.compile would need a C compiler here
    ar.close()
    saved = colabkit.Checkpoints(tmp_path / "run").restore().state["objects"]["model"]
    assert set(saved) == set(model.state_dict())   # no "module." / "_orig_mod." prefix
    other, other_opt = _tiny(seed=5)
    colabkit.torch.AutoResume(tmp_path / "run", model=other, opt=other_opt, deadline=None, verbose=0)
    for a, b in zip(model.state_dict().values(), other.state_dict().values()):
        assert torch.equal(a, b)


def test_object_without_state_dict_is_refused_naming_the_parameter(tmp_path, ck_env):
    import colabkit
    with pytest.raises(ValueError, match=r"best_loss=float has no state_dict\(\)/load_state_dict\(\).*ar.state"):
        colabkit.torch.AutoResume(tmp_path / "run", model=torch.nn.Linear(2, 2), best_loss=0.5)


def test_checkpoint_of_another_model_names_both_shapes_and_changes_nothing(tmp_path, ck_env):
    import colabkit
    model, opt = _tiny()
    ar = colabkit.torch.AutoResume(tmp_path / "run", opt=opt, model=model, deadline=None, verbose=0)
    _train(ar, model, opt, _loader(), 1)
    ar.close()
    # the optimizer comes first and fits; the model does not: neither may change
    other, other_opt = _tiny(seed=7, width=5)
    other_opt = torch.optim.Adam(other.parameters(), lr=0.01)
    before = {k: v.clone() for k, v in other.state_dict().items()}
    opt_before = json.dumps(_plain(other_opt.state_dict()))
    with pytest.raises(colabkit.CheckpointError) as info:
        colabkit.torch.AutoResume(tmp_path / "run", opt=other_opt, model=other, deadline=None, verbose=0)
    message = str(info.value)
    assert message.startswith("model:") or "opt:" in message
    assert "(4, 3)" in message and "(4, 5)" in message and "Nothing was restored" in message
    assert all(torch.equal(before[k], v) for k, v in other.state_dict().items())
    assert json.dumps(_plain(other_opt.state_dict())) == opt_before


def test_other_names_than_the_checkpoints_are_refused(tmp_path, ck_env):
    import colabkit
    model, opt = _tiny()
    ar = colabkit.torch.AutoResume(tmp_path / "run", model=model, opt=opt, deadline=None, verbose=0)
    _train(ar, model, opt, _loader(), 1)
    ar.close()
    with pytest.raises(colabkit.CheckpointError, match=r"not passed now: \['opt'\]"):
        colabkit.torch.AutoResume(tmp_path / "run", model=model, deadline=None, verbose=0)


def test_an_optimizer_of_another_class_is_refused_and_nothing_changes(tmp_path, ck_env):
    import colabkit
    model, opt = _tiny()
    ar = colabkit.torch.AutoResume(tmp_path / "run", model=model, opt=opt, deadline=None, verbose=0)
    _train(ar, model, opt, _loader(), 1)
    ar.close()
    other, _ = _tiny(seed=9)
    sgd = torch.optim.SGD(other.parameters(), lr=0.1)
    before = {k: v.clone() for k, v in other.state_dict().items()}
    with pytest.raises(colabkit.CheckpointError, match=r"opt: .* was saved from Adam, and opt is SGD now"):
        colabkit.torch.AutoResume(tmp_path / "run", model=other, opt=sgd, deadline=None, verbose=0)
    assert all(torch.equal(before[k], v) for k, v in other.state_dict().items())
    assert sgd.state_dict()["param_groups"][0]["lr"] == 0.1


def test_iterable_dataset_says_it_cannot_be_positioned_and_restarts_the_epoch(tmp_path, ck_env, capsys):
    import colabkit
    model = torch.nn.Linear(4, 1)
    ar = colabkit.torch.AutoResume(tmp_path / "run", model=model, save_freq=2, deadline=None)
    loader = torch.utils.data.DataLoader(Stream(), batch_size=3)
    for _ in ar.epochs(1):
        for _batch in ar.batches(loader):
            if ar.batch == 2:   # two batches trained and saved (save_freq=2), then "the VM goes"
                break
        break
    ar.checkpoints.wait(30)
    ar.close()
    ar = colabkit.torch.AutoResume(tmp_path / "run", model=model, deadline=None)
    assert (ar.epoch, ar.batch) == (0, 2)
    first = []
    for _ in ar.epochs(1):
        for batch in ar.batches(loader):
            first.append(float(batch[0, 0]))
    out = capsys.readouterr().out
    assert "cannot be positioned mid-epoch" in out and "epoch 0 restarts from its first batch" in out
    assert first == [0.0, 3.0, 6.0, 9.0]


def test_interrupt_saves_commits_then_raises_keyboard_interrupt_and_a_rerun_resumes(tmp_path, ck_env, capsys):
    import colabkit
    model, opt = _tiny()
    ar = colabkit.torch.AutoResume(tmp_path / "run", model=model, opt=opt, deadline=None)
    loader = _loader()
    with pytest.raises(KeyboardInterrupt):
        for _ in ar.epochs(3):
            for (x,) in ar.batches(loader):
                opt.zero_grad()
                model(x).sum().backward()
                opt.step()
                if ar.step == 4:   # the second batch of epoch 1: the stop button
                    os.kill(os.getpid(), signal.SIGINT)
    assert "SIGINT received: saved step 5" in capsys.readouterr().out
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler   # handed back
    weights = model[0].weight.detach().clone()
    other, other_opt = _tiny(seed=3)
    again = colabkit.torch.AutoResume(tmp_path / "run", model=other, opt=other_opt, deadline=None)
    assert (again.step, again.epoch, again.batch) == (5, 1, 2)
    assert torch.equal(other[0].weight, weights)
    _train(again, other, other_opt, loader, 3)   # the re-run in the same process may write the folder
    assert colabkit.Checkpoints(tmp_path / "run").list()[-1].step == 9


def test_deadline_saves_then_stops_both_loops(tmp_path, ck_env, capsys):
    import colabkit
    model, opt = _tiny()
    ar = colabkit.torch.AutoResume(tmp_path / "run", model=model, opt=opt, deadline="1s", deadline_margin="1s")
    seen, after_the_epoch = [], []
    with pytest.raises(colabkit.torch.Stopped, match=r"time budget.*saved step 1 \(epoch 0, batch 1\).*Re-run"):
        for epoch in ar.epochs(3):
            for (x,) in ar.batches(_loader()):
                seen.append((epoch, ar.batch))
            after_the_epoch.append(epoch)   # validation, logging: never on a partial epoch
    assert seen == [(0, 0)] and after_the_epoch == [] and "time budget" in ar.stopped_for
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler   # handed back
    assert "Re-run this cell to resume" in capsys.readouterr().out
    newest = colabkit.Checkpoints(tmp_path / "run").list()[-1]
    assert (newest.step, newest.epoch, newest.batch) == (1, 0, 1)


class _Ema:
    """A user object with a state dict of nested values: int keys, tuples, tensors of several dtypes."""

    def __init__(self, seed):
        g = torch.Generator().manual_seed(seed)
        self.values = {0: torch.randn(3, generator=g).to(torch.bfloat16), 1: torch.arange(4)}
        self.meta = {"decay": (0.99, seed), "mask": torch.rand(2, generator=g) > 0.5, "dtype": torch.float16}

    def state_dict(self):
        return {"values": self.values, "meta": self.meta}

    def load_state_dict(self, state):
        self.values, self.meta = state["values"], state["meta"]


def test_user_objects_round_trip_bfloat16_int_keys_tuples_and_dtypes(tmp_path, ck_env):
    import colabkit
    ema = _Ema(1)
    ar = colabkit.torch.AutoResume(tmp_path / "run", ema=ema, deadline=None, verbose=0)
    ar.save(wait=True)
    ar.close()
    back = _Ema(2)
    colabkit.torch.AutoResume(tmp_path / "run", ema=back, deadline=None, verbose=0)
    assert set(back.values) == {0, 1} and back.values[0].dtype == torch.bfloat16
    assert torch.equal(back.values[0], ema.values[0]) and torch.equal(back.values[1], ema.values[1])
    assert back.meta["decay"] == (0.99, 1) and back.meta["dtype"] is torch.float16
    assert torch.equal(back.meta["mask"], ema.meta["mask"])


def test_a_loop_left_by_an_exception_leaves_no_signal_handler_acting(tmp_path, ck_env):
    import time

    import colabkit
    model, opt = _tiny()
    ar = colabkit.torch.AutoResume(tmp_path / "run", model=model, opt=opt, deadline=None, verbose=0)
    epochs = ar.epochs(2)   # held here, as a notebook's namespace may hold it: not closed by the exception

    def cell():
        for _ in epochs:
            raise RuntimeError("a bug in the training step")

    with pytest.raises(RuntimeError):
        cell()
    assert signal.getsignal(signal.SIGINT) == ar._on_signal   # still installed (epochs() is open) ...
    with pytest.raises(KeyboardInterrupt):                    # ... but the stop button works as without it
        os.kill(os.getpid(), signal.SIGINT)
        for _ in range(100):
            time.sleep(0.01)
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
    epochs.close()
    with pytest.raises(RuntimeError):   # without a reference, the loop's generator closes with its frame
        for _ in ar.epochs(2):
            raise RuntimeError("again")
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler


class _Running:
    """A user object whose state dict returns its NumPy array itself (as an EMA of one might)."""

    def __init__(self):
        self.avg = np.zeros(3)

    def state_dict(self):
        return {"avg": self.avg}

    def load_state_dict(self, state):
        self.avg[...] = state["avg"]


def test_arrays_and_tensors_are_copied_at_save_time_not_when_the_write_runs(tmp_path, ck_env, monkeypatch):
    """The write runs in the background: NumPy arrays of a state dict and tensors/arrays in ar.state updated
    in place after save() are saved as they were at save(); ar.state's tensors come back as tensors."""
    import colabkit
    import colabkit.checkpoints.state as store
    write = store.write_data
    monkeypatch.setattr(store, "write_data", lambda snap, d: (time.sleep(0.5), write(snap, d))[1])
    running = _Running()
    ar = colabkit.torch.AutoResume(tmp_path / "run", running=running, deadline=None, verbose=0)
    ar.state.update(t=torch.zeros(2), a=np.zeros(2), nested={"x": [torch.ones(1)]})
    ar.save()
    running.avg += 7
    ar.state["t"] += 5
    ar.state["a"] += 3
    ar.state["nested"]["x"][0] += 1
    ar.state["nested"]["y"] = 1
    assert ar.checkpoints.wait(30)
    ar.close()
    back = _Running()
    again = colabkit.torch.AutoResume(tmp_path / "run", running=back, deadline=None, verbose=0)
    assert np.array_equal(back.avg, np.zeros(3))
    assert isinstance(again.state["t"], torch.Tensor) and torch.equal(again.state["t"], torch.zeros(2))
    assert np.array_equal(again.state["a"], np.zeros(2))
    assert again.state["nested"].keys() == {"x"} and torch.equal(again.state["nested"]["x"][0], torch.ones(1))


def test_a_load_that_fails_after_others_loaded_puts_every_object_back(tmp_path, ck_env):
    """A GradScaler saved disabled does not load into an enabled one: the model and optimizer, loaded before
    it, are put back as they were."""
    import colabkit
    model, opt = _tiny(0)
    for _ in range(2):
        opt.zero_grad()
        model(torch.randn(4, 3)).sum().backward()
        opt.step()
    ar = colabkit.torch.AutoResume(tmp_path / "run", model=model, opt=opt, deadline=None, verbose=0,
                                   scaler=torch.amp.GradScaler("cpu", enabled=False))
    ar.save(wait=True)
    ar.close()
    model2, opt2 = _tiny(1)
    before = {k: v.clone() for k, v in model2.state_dict().items()}
    opt_before = repr(opt2.state_dict())
    with pytest.raises(colabkit.CheckpointError, match="scaler"):
        colabkit.torch.AutoResume(tmp_path / "run", model=model2, opt=opt2, deadline=None, verbose=0,
                                  scaler=torch.amp.GradScaler("cpu", enabled=True))
    after = model2.state_dict()
    assert all(torch.equal(before[k], after[k]) for k in before), "the model kept the checkpoint's weights"
    assert repr(opt2.state_dict()) == opt_before and not opt2.state


@pytest.mark.parametrize("failing, error", [("post_hook", "a load hook refuses"),
                                            ("own_load", "this module's own load refuses"),
                                            ("extra_state", "_extra_state")])
def test_a_module_whose_own_load_code_fails_is_put_back(tmp_path, ck_env, failing, error):
    """A module loads without a copy of its weights kept only when its load cannot fail halfway (torch's own
    code, no hooks, no extra state): a load hook or a module's own _load_from_state_dict that raises after
    copying some weights, or a set_extra_state without get_extra_state (torch's load then wants an extra state
    the module's state_dict never holds, and says so once every tensor is copied), still finds the module put
    back as it was."""
    import colabkit

    class OwnLoad(torch.nn.Linear):
        refuse = False

        def _load_from_state_dict(self, state_dict, prefix, *args):
            super()._load_from_state_dict(state_dict, prefix, *args)
            if self.refuse:
                raise RuntimeError("this module's own load refuses")

    class Remembers(torch.nn.Linear):
        def set_extra_state(self, state):
            self.remembered = state

    model, opt = _tiny(0)
    ar = colabkit.torch.AutoResume(tmp_path / "run", model=model, opt=opt, deadline=None, verbose=0)
    ar.save(wait=True)
    ar.close()
    model2, opt2 = _tiny(1)
    if failing == "post_hook":
        def refuse(module, keys):
            raise RuntimeError("a load hook refuses")
        model2.register_load_state_dict_post_hook(refuse)
    elif failing == "own_load":
        own = OwnLoad(4, 2)
        own.load_state_dict(model2[2].state_dict())
        own.refuse = True
        model2[2] = own
    else:
        own = Remembers(4, 2)
        own.load_state_dict(model2[2].state_dict(), strict=False)
        model2[2] = own
    before = {k: v.clone() for k, v in model2.state_dict().items()}
    with pytest.raises(colabkit.CheckpointError, match=f"{error}.*Every object was put back as it was"):
        colabkit.torch.AutoResume(tmp_path / "run", model=model2, opt=opt2, deadline=None, verbose=0)
    after = model2.state_dict()
    assert all(torch.equal(before[k], after[k]) for k in before), "the model kept the checkpoint's weights"


def test_a_module_load_that_copies_and_still_fails_says_what_it_left_and_the_fix(tmp_path, ck_env):
    """A module whose load only copies is loaded last with no copy of its weights kept; when a copy fails
    anyway (here a buffer made under torch.inference_mode, which torch will not write outside it), the error
    names the module as partly restored and says what to do, and the optimizer loaded before it is put back."""
    import colabkit
    model, opt = _tiny(0)
    for _ in range(2):
        opt.zero_grad()
        model(torch.randn(4, 3)).sum().backward()
        opt.step()
    ar = colabkit.torch.AutoResume(tmp_path / "run", model=model, opt=opt, deadline=None, verbose=0)
    ar.save(wait=True)
    ar.close()
    model2, opt2 = _tiny(1)
    with torch.inference_mode():
        frozen = torch.zeros(4)
    model2[1].running_mean = frozen
    opt_before = repr(opt2.state_dict())
    with pytest.raises(colabkit.CheckpointError) as raised:
        colabkit.torch.AutoResume(tmp_path / "run", model=model2, opt=opt2, deadline=None, verbose=0)
    message = str(raised.value)
    assert "running_mean" in message and "model may hold part of the checkpoint" in message
    assert "Create it anew before training" in message and "every other object is as it was" in message
    assert repr(opt2.state_dict()) == opt_before and not opt2.state


def test_an_optimizer_with_state_is_put_back_when_a_later_load_fails(tmp_path, ck_env):
    """The optimizer's state before a failed restore is kept without a copy of its tensors: it must still come
    back as it was, moments included, and keep training from there."""
    import colabkit
    model, opt = _tiny(0)
    ar = colabkit.torch.AutoResume(tmp_path / "run", model=model, opt=opt, deadline=None, verbose=0,
                                   scaler=torch.amp.GradScaler("cpu", enabled=False))
    ar.save(wait=True)
    ar.close()
    model2, opt2 = _tiny(1)
    for _ in range(2):
        opt2.zero_grad()
        model2(torch.randn(4, 3)).sum().backward()
        opt2.step()
    moments = {i: {k: v.clone() if isinstance(v, torch.Tensor) else v for k, v in s.items()}
               for i, s in opt2.state_dict()["state"].items()}
    with pytest.raises(colabkit.CheckpointError, match="scaler"):
        colabkit.torch.AutoResume(tmp_path / "run", model=model2, opt=opt2, deadline=None, verbose=0,
                                  scaler=torch.amp.GradScaler("cpu", enabled=True))
    after = opt2.state_dict()["state"]
    assert after.keys() == moments.keys()
    for i, saved in moments.items():
        for k, v in saved.items():
            assert torch.equal(after[i][k], v) if isinstance(v, torch.Tensor) else after[i][k] == v, (i, k)
    opt2.zero_grad()
    model2(torch.randn(4, 3)).sum().backward()
    opt2.step()   # its state objects are live ones again


def _big_adam(seed):
    torch.manual_seed(seed)
    model = torch.nn.Linear(600, 600)     # 1.44 MB of weight: above npz's 1 MB copy-out, so it shares the buffer
    opt = torch.optim.Adam(model.parameters(), lr=0.1)
    opt.zero_grad()
    model(torch.ones(2, 600)).sum().backward()
    opt.step()
    return model, opt


def test_tensors_sharing_the_read_buffer_restore_and_train_independently(tmp_path, ck_env):
    """Tensors over 1 MB come back as views of the checkpoint's read buffer (no copy each): the optimizer's
    moments must equal the saved ones, and a step writing them in place must leave the model's parameters and
    the other moments alone."""
    import colabkit
    model, opt = _big_adam(0)
    ar = colabkit.torch.AutoResume(tmp_path / "run", model=model, opt=opt, deadline=None, verbose=0)
    ar.save(wait=True)
    ar.close()
    model2, opt2 = _big_adam(1)
    colabkit.torch.AutoResume(tmp_path / "run", model=model2, opt=opt2, deadline=None, verbose=0).close()
    for a, b in zip(model.parameters(), model2.parameters()):
        assert torch.equal(a, b)
    for i, saved in opt.state_dict()["state"].items():
        for k, v in saved.items():
            assert torch.equal(opt2.state_dict()["state"][i][k], v), (i, k)
    for o, m in ((opt, model), (opt2, model2)):
        o.zero_grad()
        m(torch.ones(2, 600)).sum().backward()
        o.step()
    for a, b in zip(model.parameters(), model2.parameters()):
        assert torch.equal(a, b)


if __name__ == "__main__":
    _spec = json.loads(sys.argv[1])
    ddp_worker(_spec) if _spec.get("ddp") else worker(_spec)


@pytest.mark.parametrize("dtype", ["float8_e4m3fnuz", "float8_e5m2fnuz", "float8_e8m0fnu", "complex32", "uint16"])
def test_tensors_of_dtypes_numpy_lacks_round_trip_bit_exactly(tmp_path, ck_env, dtype):
    import colabkit
    source = torch.arange(6, dtype=torch.float32) / 4
    if dtype == "complex32":
        source = source.to(torch.complex64)
    value = source.to(getattr(torch, dtype))

    class Holder:
        def __init__(self, t):
            self.t = t

        def state_dict(self):
            return {"t": self.t}

        def load_state_dict(self, state):
            self.t = state["t"]

    ar = colabkit.torch.AutoResume(tmp_path / "run", holder=Holder(value), deadline=None, verbose=0)
    ar.save(wait=True)
    ar.close()
    back = Holder(torch.zeros_like(value))
    colabkit.torch.AutoResume(tmp_path / "run", holder=back, deadline=None, verbose=0)
    assert back.t.dtype == value.dtype
    assert back.t.view(torch.uint8).tolist() == value.view(torch.uint8).tolist()


def test_the_plain_loop_and_the_lightning_stopped_are_one_class():
    pytest.importorskip("lightning")
    import colabkit
    assert colabkit.torch.Stopped is colabkit.torch_lightning.Stopped


def test_an_uncaught_stopped_shows_one_line_in_a_real_ipython_shell(ck_env):
    script = (
        "from IPython.core.interactiveshell import InteractiveShell\n"
        "shell = InteractiveShell.instance()\n"
        "shell.run_cell('import colabkit.torch\\n'\n"
        "               'def fit():\\n'\n"
        "               '    raise colabkit.torch.Stopped(\"the time budget is 59s away: saved step 41 ... '\n"
        "               'Re-run this cell to resume.\")\\n'\n"
        "               'fit()')\n")
    proc = subprocess.run([sys.executable, "-c", script], env=ck_env, capture_output=True, text=True, timeout=120,
                          check=False)
    shown = [line for line in (proc.stdout + proc.stderr).splitlines() if line.strip()]
    assert shown == ["colabkit.torch.Stopped: the time budget is 59s away: saved step 41 ... Re-run this cell to "
                     "resume."], proc.stdout + proc.stderr


def test_a_save_called_outside_the_loops_saves_the_state_of_that_moment_every_time(tmp_path, ck_env):
    """A loop of the user's own, not ar.batches(): the step does not move, yet every ar.save() must save the
    model as it is then (on a fresh AutoResume and after a resume alike), not count as taken already."""
    import colabkit
    model, opt = _tiny()
    ar = colabkit.torch.AutoResume(tmp_path / "run", model=model, opt=opt, deadline=None, verbose=0)
    for _ in range(2):
        with torch.no_grad():
            model[0].weight.add_(1.0)
        assert ar.save() is True
    assert ar.checkpoints.wait(30)
    ar.close()
    expected = model[0].weight.detach().clone()
    model2, opt2 = _tiny(1)
    again = colabkit.torch.AutoResume(tmp_path / "run", model=model2, opt=opt2, deadline=None, verbose=0)
    assert torch.equal(model2[0].weight, expected)
    with torch.no_grad():
        model2[0].weight.add_(1.0)
    assert again.save(wait=True) is True   # the first save after a resume, at the restored step
    again.close()
    model3, opt3 = _tiny(2)
    colabkit.torch.AutoResume(tmp_path / "run", model=model3, opt=opt3, deadline=None, verbose=0)
    assert torch.equal(model3[0].weight, expected + 1.0)


def test_the_batch_index_counts_from_the_resumed_batch_and_enumerate_is_named(tmp_path, ck_env, capsys):
    """An example's `if i % 100 == 0:` block: ar.enumerate() gives the index an uninterrupted run has; the
    builtin enumerate(ar.batches(...)) counts from 0 again, and the resume says so."""
    import shutil
    import colabkit
    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(torch.randn(24, 3)), batch_size=4)

    def run(directory, spelling, stop_at=None):
        model, opt = _tiny()
        ar = colabkit.torch.AutoResume(directory, model=model, opt=opt, deadline=None)
        seen = []
        for epoch in ar.epochs(2):
            batches = ar.enumerate(loader) if spelling == "ar" else enumerate(ar.batches(loader))
            for i, (x,) in batches:
                opt.zero_grad()
                model(x).sum().backward()
                opt.step()
                seen.append((epoch, i))
                if (epoch, i) == stop_at:
                    os.kill(os.getpid(), signal.SIGINT)
        return seen

    with pytest.raises(KeyboardInterrupt):
        run(tmp_path / "run", "ar", stop_at=(1, 2))
    shutil.copytree(tmp_path / "run", tmp_path / "again")
    capsys.readouterr()
    assert run(tmp_path / "run", "ar") == [(1, 3), (1, 4), (1, 5)]
    assert "enumerate(" not in capsys.readouterr().out
    assert run(tmp_path / "again", "builtin") == [(1, 0), (1, 1), (1, 2)]
    [said] = [line for line in capsys.readouterr().out.splitlines() if "enumerate(ar.batches(loader))" in line]
    assert "epoch 1 resumes at batch 3" in said and "ar.enumerate(loader)" in said
