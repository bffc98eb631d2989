"""Machine-wide GPU claims (colabkit.devices.claims) between real processes on the GPU stand-ins: processes started
together, kill -9, the line, two users, `colabkit run` beside a notebook and a script, programs without a claim,
shares. Every wait below polls for a condition with a timeout; none sleeps for a race to end."""
from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

import colabkit
from colabkit.devices import GPUSelectionWarning, GPUsTaken, claims

CHILD = Path(__file__).with_name("claim_child.py")


def until(condition, timeout=30.0, what="condition"):
    end = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > end:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.01)


class Box:
    """Child processes claiming GPUs in one folder (see claim_child.py)."""

    def __init__(self, folder: Path, python=sys.executable, prefix=()):
        self.folder, self.python, self.prefix, self.procs = folder, python, list(prefix), {}
        folder.mkdir(parents=True, exist_ok=True)

    def start(self, name, request="1", wait="-", share="-", env=None):
        self.procs[name] = subprocess.Popen([*self.prefix, self.python, str(CHILD), str(self.folder), name, request,
                                             wait, share], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                            env=env)
        return self.procs[name]

    def result(self, name, timeout=60):
        path = self.folder / f"{name}.json"
        proc = self.procs[name]

        def ready():
            if path.exists():
                return json.loads(path.read_text())
            if proc.poll() is not None:
                raise AssertionError(f"{name} ended ({proc.returncode}): {proc.stderr.read()}")
            return None
        return until(ready, timeout, f"{name} to claim")

    def release(self, name):
        (self.folder / f"release-{name}").touch()

    def finish(self):
        (self.folder / "release-all").touch()
        for proc in self.procs.values():
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


@pytest.fixture
def box(fake_gpus, tmp_path):
    boxes = []

    def make(scenario="shared_box", **overrides):
        fake_gpus(scenario, **overrides)
        b = Box(tmp_path / f"box-{len(boxes)}")
        boxes.append(b)
        return b
    yield make
    for b in boxes:
        b.finish()


def claim_folder() -> Path:
    return Path(os.environ["COLABKIT_GPU_CLAIMS"])


def test_processes_started_together_never_share_a_gpu(box):
    b = box("shared_box")
    for trial in range(10):
        b.folder = b.folder.parent / f"trial-{trial}"
        b.folder.mkdir()
        (b.folder / "barrier").touch()
        names = [f"t{trial}p{i}" for i in range(3)]
        for name in names:
            b.start(name, "1")
        until(lambda names=names: all((b.folder / f"ready-{n}").exists() for n in names), 60,
              "3 processes to be ready")
        (b.folder / "go").touch()
        got = [b.result(n)["gpus"] for n in names]
        assert sorted(g for gs in got for g in gs) == [0, 1, 2], f"trial {trial}: {got}"
        b.finish()
        b.procs.clear()


def test_kill_9_frees_the_claim_at_once(box):
    b = box("shared_box")
    proc = b.start("holder", "1")
    held = b.result("holder")["gpus"]
    with pytest.raises(GPUsTaken) as err:
        colabkit.use_gpus(str(held[0]) + ",")
    assert f"pid {proc.pid}" in str(err.value) and "claim_child.py" in str(err.value)
    assert "wait=True" in str(err.value)
    proc.send_signal(signal.SIGKILL)
    proc.wait(10)
    assert [g.index for g in colabkit.use_gpus(str(held[0]) + ",")] == held   # no pause: the lock died with it


def test_the_line_is_first_come_first_served_and_ctrl_c_leaves_it(box):
    b = box("shared_box")
    data = json.loads(Path(os.environ["COLABKIT_TEST_GPUS"]).read_text())
    box("shared_box", gpus=data["gpus"][:2])   # a 2-GPU box
    b.start("holder", "2")
    assert b.result("holder")["gpus"] == [0, 1]
    waiters = ["w1", "w2", "w3", "w4"]
    for i, name in enumerate(waiters):
        b.start(name, "1", "true")
        until(lambda i=i: len([n for n in os.listdir(claim_folder()) if n.startswith("wait-")]) == i + 1, 60,
              f"{name} to join the line")
    quitter = b.start("quitter", "1", "true")
    until(lambda: len([n for n in os.listdir(claim_folder()) if n.startswith("wait-")]) == 5, 60, "the quitter")
    with pytest.raises(GPUsTaken, match="wait=True"):
        colabkit.use_gpus(1)   # no wait: it does not jump the line
    quitter.send_signal(signal.SIGINT)
    assert quitter.wait(30) != 0 and "KeyboardInterrupt" in quitter.stderr.read()
    until(lambda: len([n for n in os.listdir(claim_folder()) if n.startswith("wait-")]) == 4, 10, "the line to shrink")
    b.release("holder")
    first = [b.result(n) for n in waiters[:2]]
    b.release("w1")
    b.release("w2")
    later = [b.result(n) for n in waiters[2:]]
    granted = [int(r["claim"].split("-")[1]) for r in first + later]   # claim-<clock>: made under the table lock
    assert granted == sorted(granted), "served out of arrival order"
    assert sorted(first[0]["gpus"] + first[1]["gpus"]) == [0, 1]
    assert sorted(later[0]["gpus"] + later[1]["gpus"]) == [0, 1]
    assert "colabkit: waiting for use_gpus(1): " in b.procs["w3"].stderr.readline()   # the visible message


def test_programs_without_a_claim_keep_their_gpu_out_of_the_pick(fake_gpus):
    data = fake_gpus("shared_box")
    data["gpus"][0]["processes"] = [{"pid": 999999, "name": "/usr/bin/python3", "used_memory": 8000}]
    data["gpus"][2]["processes"] = [{"pid": 999998, "name": "nvtop", "used_memory": 100}]   # below the threshold
    smi_log, passes = Path(os.environ["COLABKIT_TEST_NVIDIA_SMI_LOG"]), []
    for source in ({}, {"nvml": False}):   # NVML's process list, then nvidia-smi's
        fake_gpus("shared_box", gpus=data["gpus"], **source)
        smi_calls = len(smi_log.read_text().splitlines()) if smi_log.exists() else 0
        chosen = colabkit.use_gpus(2)
        assert [g.index for g in chosen] == [1, 2], source
        with pytest.raises(GPUsTaken, match=r"busy with python3 \(pid 999999, 7.8 GiB\), which holds no GPU claim"):
            colabkit.use_gpus(3)
        with pytest.warns(GPUSelectionWarning, match="busy with python3"):
            assert [g.index for g in colabkit.use_gpus("0,")] == [0]   # named: used, with a warning
        colabkit.use_gpus(0)
        if source:   # the nvidia-smi pass asked nvidia-smi
            assert len(smi_log.read_text().splitlines()) > smi_calls, "nvidia-smi was never asked"
        passes.append(source)
    assert passes == [{}, {"nvml": False}]


def test_a_share_puts_two_small_jobs_on_one_gpu_and_limits_the_frameworks(fake_gpus, monkeypatch, tmp_path):
    fake_gpus("shared_box")
    torch = tmp_path / "fw" / "torch"
    torch.mkdir(parents=True)
    (torch / "__init__.py").write_text(
        "__version__ = '0-standin'\nimport types\nlimits = []\n_queued = []\n_ready = False\n"
        "def _lazy_call(fn):\n    fn() if _ready else _queued.append(fn)\n"
        "def _init():\n    global _ready\n    _ready = True\n    [f() for f in _queued]\n"
        "cuda = types.SimpleNamespace(_lazy_call=_lazy_call, device_count=lambda: 1, is_initialized=lambda: _ready,"
        " set_per_process_memory_fraction=lambda f, i: limits.append((round(f, 3), i)), init=_init)\n")
    monkeypatch.syspath_prepend(str(tmp_path / "fw"))
    _, other = claims.acquire(lambda view: ("other", [{"uuid": "GPU-40900001-aaaa-4bbb-8ccc-000000000001",
                                                       "index": 1, "share": 11 * 2 ** 30}]),
                              path=claim_folder())
    chosen = colabkit.use_gpus(1, share=0.5)
    assert [g.index for g in chosen] == [1], "a share goes where one is already shared"
    assert os.environ["XLA_PYTHON_CLIENT_MEM_FRACTION"] == "0.500"
    import torch as fw   # imported after the choice: limited at CUDA's initialization
    assert fw.limits == []
    fw.cuda.init()
    assert fw.limits == [(0.5, 0)]
    with pytest.raises(GPUsTaken):
        colabkit.use_gpus("1,")   # the whole GPU is not free
    view = claims.read_view()
    shares = sorted(s for r, s in view.holders("GPU-40900001-aaaa-4bbb-8ccc-000000000001"))
    assert shares == [11 * 2 ** 30, 24564 * 2 ** 20 // 2]
    other.release()


def test_gpus_shows_who_holds_each_gpu(box, run_cli):
    b = box("shared_box")
    env = dict(os.environ, JPY_SESSION_NAME="/home/ana/experiments/train.ipynb")
    b.start("notebook", "1", env=env)
    held = b.result("notebook")["gpus"]
    out = run_cli("gpus")
    assert out.returncode == 0, out.stderr
    line = next(ln for ln in out.stdout.splitlines() if ln.strip().startswith(f"GPU {held[0]} "))
    assert "train.ipynb" in line and f"pid {b.procs['notebook'].pid}" in line and "since" in line
    data = json.loads(run_cli("gpus", "--json").stdout)
    holders = [h for hs in data["claims"]["gpus"].values() for h in hs]
    assert [h["what"] for h in holders] == ["train.ipynb"]


def test_notebook_kernel_script_and_colabkit_run_share_one_box(box, run_cli, tmp_path):
    b = box("shared_box")
    kernel = subprocess.Popen(
        [sys.executable, "-c", "from IPython.core.interactiveshell import InteractiveShell; import sys, time, os\n"
         "shell = InteractiveShell.instance()\n"
         "for line in ['%load_ext colabkit', '%gpus 1']:\n    assert shell.run_cell(line).success\n"
         f"open({str(tmp_path / 'kernel-ready')!r}, 'w').write(os.environ['CUDA_VISIBLE_DEVICES'])\n"
         f"while not os.path.exists({str(tmp_path / 'kernel-stop')!r}): time.sleep(0.01)\n"],
        env=dict(os.environ, JPY_SESSION_NAME="explore.ipynb"), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        text=True)
    try:
        notebook_gpu = until(lambda: (tmp_path / "kernel-ready").exists() and (tmp_path / "kernel-ready").read_text(),
                             60, "the kernel's %gpus 1")
        b.start("script", "1")
        script_gpu = b.result("script")["gpus"]
        jobs = []
        for i in range(2):
            job = tmp_path / f"job{i}.py"
            job.write_text("import os, colabkit\nchosen = colabkit.use_gpus(1)\n"
                           "print('JOB', os.environ['CUDA_VISIBLE_DEVICES'], [g.index for g in chosen])\n")
            jobs.append(job)
        done = run_cli("run", "--gpus", "auto", *jobs, "--run-dir", tmp_path / "run", timeout=120)
        assert done.returncode == 0, done.stdout + done.stderr
        used = {int(notebook_gpu), *script_gpu}
        free = ({0, 1, 2} - used).pop()
        for i in range(2):
            log = (tmp_path / "run" / f"job{i}.log").read_text()
            assert f"JOB {free} [{free}]" in log, log   # its own use_gpus works under the run's claim
        assert "waiting" in done.stdout and "claimed by" in done.stdout and "explore.ipynb" in done.stdout
    finally:
        (tmp_path / "kernel-stop").touch()
        kernel.wait(30)


def _other_uid_python(folder: Path):
    """(interpreter, setpriv prefix) a uid other than ours can run colabkit with, or a reason to skip."""
    if os.geteuid() != 0 or shutil.which("setpriv") is None:
        return None, "needs root and setpriv to act as two users"
    repo = Path(colabkit.__file__).resolve().parent.parent
    for python in (sys.executable, shutil.which("python3"), "/usr/bin/python3"):
        if not python:
            continue
        probe = subprocess.run(["setpriv", "--reuid=23456", "--regid=23456", "--clear-groups", python, "-c",
                                "import colabkit.devices.claims"], capture_output=True, text=True,
                               env=dict(os.environ, PYTHONPATH=str(repo)), cwd=folder)
        if probe.returncode == 0:
            return python, None
    return None, "no Python interpreter that another uid can run colabkit with"


def test_two_users_see_each_others_claims_and_cannot_release_them(fake_gpus, monkeypatch):
    base = Path(tempfile.mkdtemp(prefix="colabkit-two-users-"))
    try:
        os.chmod(base, 0o1777)   # as /tmp: where the claim folder is made
        python, why = _other_uid_python(base)
        if python is None:
            pytest.skip(why)
        data = fake_gpus("shared_box")
        scenario = base / "scenario.json"
        scenario.write_text(json.dumps(data))
        scenario.chmod(0o644)
        monkeypatch.setenv("COLABKIT_TEST_GPUS", str(scenario))
        monkeypatch.setenv("COLABKIT_GPU_CLAIMS", str(base / "claims"))
        for var in ("HOME", "XDG_CONFIG_HOME", "XDG_CACHE_HOME"):
            monkeypatch.setenv(var, str(base))
        (base / "a").mkdir(mode=0o777)
        (base / "a").chmod(0o777)
        alice = Box(base / "a", python, ["setpriv", "--reuid=23456", "--regid=23456", "--clear-groups"])
        try:
            alice.start("alice", "1")
            held = alice.result("alice")["gpus"]
            assert oct((base / "claims").stat().st_mode & 0o7777) == "0o1777"
            bob_code = (
                "import json, os, colabkit\nfrom colabkit.devices import claims, GPUsTaken\n"
                "view = claims.read_view()\nout = {'seen': [(r.uid, r.gpus[0]['index']) for r in view.claims]}\n"
                f"try:\n    colabkit.use_gpus('{held[0]},')\nexcept GPUsTaken as exc:\n    out['taken'] = str(exc)\n"
                "folder = os.environ['COLABKIT_GPU_CLAIMS']\n"
                "try:\n    os.unlink(os.path.join(folder, view.claims[0].id))\nexcept PermissionError:\n"
                "    out['unlink'] = 'refused'\n"
                "out['own'] = [g.index for g in colabkit.use_gpus(1)]\nprint(json.dumps(out))\n")
            bob = subprocess.run(["setpriv", "--reuid=23457", "--regid=23457", "--clear-groups", python, "-c",
                                  bob_code], capture_output=True, text=True, timeout=60, cwd=base)
            assert bob.returncode == 0, bob.stderr
            out = json.loads(bob.stdout.splitlines()[-1])
            assert out["seen"] == [[23456, held[0]]]
            assert "claimed by uid 23456" in out["taken"]   # the file's owner (no passwd entry: its uid)
            assert out["unlink"] == "refused" and out["own"] != held
            assert claims.read_view().claims[0].uid == 23456   # still alice's, still alive
        finally:
            alice.finish()
    finally:
        shutil.rmtree(base, ignore_errors=True)


def test_the_claim_folder_refuses_links_and_unsafe_permissions(tmp_path):
    target = tmp_path / "elsewhere"
    target.mkdir()
    (tmp_path / "link").symlink_to(target)
    with pytest.raises(claims.ClaimFolderError, match="symbolic link"):
        claims.Folder(tmp_path / "link")
    open_folder = tmp_path / "open"
    open_folder.mkdir()
    open_folder.chmod(0o777)
    with pytest.raises(claims.ClaimFolderError, match="sticky bit"):
        claims.Folder(open_folder)
    made = claims.Folder(tmp_path / "new")
    assert oct((tmp_path / "new").stat().st_mode & 0o7777) == "0o1777"
    os.mkfifo(tmp_path / "new" / "claim-0-1-x.json")   # a FIFO under a claim's name: skipped, not waited on
    assert made.view().claims == []


def test_on_colab_nothing_is_claimed_and_nothing_waits(fake_gpus, colab_standin, monkeypatch):
    import google.colab  # noqa: F401 - what makes this a Colab kernel
    fake_gpus("colab_t4")
    monkeypatch.setenv("COLABKIT_GPU_CLAIMS", "auto")   # the default
    assert claims.folder() is None
    chosen = colabkit.use_gpus(1, wait=True)
    assert [g.index for g in chosen] == [0] and chosen.claim is None
    start = time.monotonic()
    with pytest.raises(colabkit.devices.GPUSelectionError, match="there is 1 on this machine"):
        colabkit.use_gpus(2, wait=True)
    assert time.monotonic() - start < 5


def _mine(view=None) -> set:
    """Indices of the GPUs this process's live claims hold, as any process reads the folder."""
    view = claims.read_view() if view is None else view
    return {g["index"] for r in view.claims if r.pid == os.getpid() for g in r.gpus}


def test_every_later_use_gpus_call_keeps_what_it_chose_claimed(fake_gpus, run_cli):
    fake_gpus("shared_box")
    for request in (1, 1, 1, 2):   # one GPU three times, then two
        chosen = colabkit.use_gpus(request)
        assert _mine() == {g.index for g in chosen}, f"use_gpus({request}) left its GPUs unclaimed"
        assert len(claims.read_view().claims) == 1   # the earlier claim was replaced, not kept
    out = run_cli("gpus", "--json")
    data = json.loads(out.stdout)
    pids = {h["pid"] for hs in data["claims"]["gpus"].values() for h in hs}
    assert pids == {os.getpid()} and len([hs for hs in data["claims"]["gpus"].values() if hs]) == 2, data["claims"]


def test_a_forked_child_neither_holds_nor_releases_its_parents_claim(fake_gpus, tmp_path):
    import fcntl
    fake_gpus("shared_box")
    chosen = colabkit.use_gpus(1)
    claim = chosen.claim
    assert fcntl.fcntl(claim._fd, fcntl.F_GETFD) & fcntl.FD_CLOEXEC   # no program it starts keeps the lock
    out = tmp_path / "child.json"
    pid = os.fork()
    if pid == 0:   # the child: what a forked worker does, then what it does at exit (Claim.__del__)
        code = 1
        try:
            from colabkit.devices import state
            result = {"holds": claim.held, "state": state.current.claim is not None}
            got = colabkit.use_gpus(1)
            result["child"] = [g.index for g in got]
            claim.release()
            del got
            out.write_text(json.dumps(result))
            code = 0
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert status == 0
    assert json.loads(out.read_text()) == {"holds": False, "state": False, "child": [g.index for g in chosen]}
    assert claim.held and _mine() == {g.index for g in chosen}, "the child ended the parent's claim"


def test_a_waiter_blocks_only_the_gpus_it_waits_for(box):
    b = box("shared_box")
    b.start("holder", "0,")
    assert b.result("holder")["gpus"] == [0]
    b.start("waiter", "0,", "true")
    until(lambda: any(n.startswith("wait-") for n in os.listdir(claim_folder())), 30, "the waiter to join the line")
    chosen = colabkit.use_gpus(1)   # GPUs 1 and 2 are free: nobody earlier waits for them
    assert [g.index for g in chosen] in ([1], [2])
    b.release("holder")
    assert b.result("waiter")["gpus"] == [0]


def test_a_queue_leaves_the_line_once_it_got_its_claim(fake_gpus):
    fake_gpus("shared_box")
    inventory = colabkit.devices.gpus(processes=False, claims=False)
    gpu0 = inventory[0]
    record = [{"uuid": gpu0.uuid, "index": 0, "share": None}]
    _, holder = claims.acquire(lambda view: (None, record), path=claim_folder())

    def choose(view):
        taken, _ = claims.taken([gpu0], view, mine=set(), share=None)
        if taken:
            raise GPUsTaken(taken[gpu0.uuid])
        return record
    line = claims.Line(claim_folder(), "colabkit run (test)", "colabkit run")
    want = claims.want_of([gpu0])
    assert line.try_claim(choose, retry=(GPUsTaken,), want=want) is None
    assert [r.want["gpus"][0]["uuid"] for r in claims.read_view().line] == [gpu0.uuid]   # says what it waits for
    holder.release()
    got = line.try_claim(choose, retry=(GPUsTaken,), want=want)
    assert got is not None and claims.read_view().line == []   # a later request is not kept behind it
    got.release()
    line.close()


def test_waiting_for_more_gives_up_the_old_claim_so_two_processes_cannot_deadlock(box):
    b = box("shared_box")
    data = json.loads(Path(os.environ["COLABKIT_TEST_GPUS"]).read_text())
    box("shared_box", gpus=data["gpus"][:2])   # a 2-GPU box
    first = {}
    for name, gpu in (("a", "0,"), ("b", "1,")):
        proc = b.start(name, f"{gpu}>2", "true")
        first[name] = until(lambda name=name: (b.folder / f"{name}.first.json").exists() and json.loads(
            (b.folder / f"{name}.first.json").read_text()), 30, f"{name}'s first claim")
        assert proc.poll() is None
    (b.folder / "next-a").touch()   # a asks for both GPUs and waits
    until(lambda: any(n.startswith("wait-") for n in os.listdir(claim_folder())), 30, "a to join the line")
    held = {r.pid: [g["index"] for g in r.gpus] for r in claims.read_view().claims}
    assert held == {b.procs["b"].pid: [1]}, f"a kept its claim on GPU 0 while waiting: {held}"
    (b.folder / "next-b").touch()   # b too: it gives up GPU 1 when it joins the line, a gets both
    assert b.result("a", 30)["gpus"] == [0, 1]
    b.release("a")
    assert b.result("b", 30)["gpus"] == [0, 1]


def test_the_table_and_claims_are_readable_by_every_user_whatever_the_umask(fake_gpus, monkeypatch, tmp_path):
    fake_gpus("shared_box")
    old = os.umask(0o077)
    try:
        colabkit.use_gpus(1)
    finally:
        os.umask(old)
    modes = {p.name.split("-")[0]: oct(p.stat().st_mode & 0o777) for p in claim_folder().iterdir()}
    assert modes == {"table": "0o644", "claim": "0o644"}
    real_open = os.open

    def other_users_table(path, flags, *args, **kwargs):   # as another user finds a table nobody else may read
        if path == "table" and not flags & os.O_CREAT:
            raise PermissionError(13, "Permission denied", path)
        return real_open(path, flags, *args, **kwargs)
    monkeypatch.setattr(claims.os, "open", other_users_table)
    with pytest.raises(claims.ClaimFolderError, match=r"belongs to .* with mode 0644.*sudo rm .*table"):
        colabkit.use_gpus(1)


def test_a_claim_being_made_is_never_seen_unlocked(fake_gpus, monkeypatch):
    """A reader (gpus(), `colabkit gpus`) takes no table lock: whenever it looks, every claim or place in line it
    finds must already be held, so its probe neither takes a new claim for an ended one nor makes the maker's
    lock fail."""
    import fcntl
    fake_gpus("shared_box")
    folder = claim_folder()
    real_flock, unlocked = fcntl.flock, []

    def flock(fd, op):
        if op == fcntl.LOCK_EX | fcntl.LOCK_NB and folder.exists():   # a maker locks: a reader looks right now
            for name in os.listdir(folder):
                if name.endswith(".json") and name.startswith(("claim-", "wait-")):
                    probe = os.open(folder / name, os.O_RDONLY)
                    try:
                        real_flock(probe, fcntl.LOCK_SH | fcntl.LOCK_NB)
                    except BlockingIOError:
                        os.close(probe)   # held: a live claim
                    else:
                        unlocked.append((name, probe))   # the reader still holds its probe lock
        return real_flock(fd, op)
    monkeypatch.setattr(claims.fcntl, "flock", flock)
    try:
        colabkit.use_gpus(1)
    finally:
        for _, probe in unlocked:
            os.close(probe)
    assert unlocked == []


def test_without_fcntl_or_gpus_nothing_is_claimed(fake_gpus, tmp_path, monkeypatch):
    fake_gpus("shared_box")
    code = ("import sys\nsys.modules['fcntl'] = None   # as on Windows\nimport colabkit\n"
            "from colabkit.devices import claims\nassert claims.folder() is None\n"
            "print([g.index for g in colabkit.use_gpus(1)], colabkit.gpus().claims)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and out.stdout.split() == ["[0]", "None"], out.stderr
    fake_gpus(None)   # no GPU: no claim folder made, nothing to refuse
    monkeypatch.setenv("COLABKIT_GPU_CLAIMS", str(tmp_path / "none" / "claims"))
    chosen = colabkit.use_gpus(1, strict=False)
    assert list(chosen) == [] and not (tmp_path / "none").exists()


def test_claims_that_say_pid_1_or_programs_of_unknown_memory_do_not_hide_strangers(fake_gpus, monkeypatch):
    fake_gpus("shared_box")
    stranger = 4_000_000
    monkeypatch.setattr(claims, "process_parents", lambda: {stranger: 1, os.getpid(): 1})
    view = claims.View([claims.Record("claim-1", "claim", "x", 0, 1, "", None, [])], [])
    assert stranger not in claims._known_pids(view)
    import dataclasses
    process = type("P", (), {"pid": stranger, "name": "python3", "used_memory": None})()
    gpu = dataclasses.replace(colabkit.devices.gpus(processes=False, claims=False)[0], processes=(process,))
    _, busy = claims.taken([gpu], view, mine=set(), share=None, threshold=256 * 2 ** 20)
    assert "pid 4000000, memory use unknown" in busy[gpu.uuid], busy


def test_a_bare_number_above_1_is_no_share(fake_gpus):
    fake_gpus("shared_box")
    for share in (2, "2", 2.5):
        with pytest.raises(ValueError, match=r"share=.*2.*at most 1.*share=\"2(\.5)?GiB\""):
            colabkit.use_gpus(1, share=share)
    assert claims.read_view() is None or claims.read_view().claims == []


def test_the_claim_folder_appears_with_mode_1777(tmp_path, monkeypatch):
    made = []
    real_mkdir = os.mkdir
    monkeypatch.setattr(claims.os, "mkdir", lambda path, *a, **k: (made.append(Path(path)), real_mkdir(path, *a, **k)))
    claims.Folder(tmp_path / "claims")
    assert oct((tmp_path / "claims").stat().st_mode & 0o7777) == "0o1777"
    assert made and tmp_path / "claims" not in made, "made under its own name, closed (0700) until chmod"
    assert os.listdir(tmp_path) == ["claims"]
