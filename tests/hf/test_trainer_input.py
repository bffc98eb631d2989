"""What a user gets wrong with colabkit.hf.AutoResume gets a clear error or warning naming the value and the fix;
`import colabkit.hf` imports no framework, and a missing transformers names the extra to install."""
from __future__ import annotations

import subprocess
import sys
import warnings

import pytest

from tests.hf.runner import REPO


def _python(code: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=REPO)


def test_import_colabkit_hf_imports_no_framework():
    done = _python("import sys, colabkit, colabkit.hf\nprint(sorted(m for m in sys.modules if m.split('.')[0] in "
                   "('torch', 'transformers', 'accelerate', 'trl')))\nprint('AutoResume' in dir(colabkit.hf))")
    assert done.stdout.split() == ["[]", "True"], done.stdout + done.stderr


def test_without_transformers_the_error_names_the_extra():
    done = _python("import sys\nsys.modules['transformers'] = None\nimport colabkit\n"
                   "try:\n    colabkit.hf.AutoResume\nexcept ImportError as e:\n    print('ERROR', e)")
    assert "ERROR colabkit.hf.AutoResume needs the Python package 'transformers'" in done.stdout, done.stderr
    assert done.stdout.strip().endswith('Install it with: pip install "colabkit[hf]"'), done.stdout


transformers = pytest.importorskip("transformers")
pytest.importorskip("accelerate")


@pytest.mark.parametrize("kwargs, named", [
    (dict(every="soon"), "every='soon' is invalid"),
    (dict(every=-5), "every=-5 is invalid"),
    (dict(save_freq=0), "save_freq=0 is invalid: pass a number of optimizer steps"),
    (dict(save_freq="500"), "save_freq='500' is invalid"),
    (dict(save_freq=True), "save_freq=True is invalid"),
    (dict(deadline="tomorrow"), "deadline='tomorrow' is invalid"),
    (dict(deadline_margin="a bit"), "deadline_margin"),
    (dict(keep=0), "keep=0 is invalid"),
])
def test_bad_arguments_raise_naming_the_value(tmp_path, ck_env, kwargs, named):
    import colabkit
    with pytest.raises(ValueError) as info:
        colabkit.hf.AutoResume(tmp_path / "run", **kwargs)
    assert named in str(info.value)
    assert not (tmp_path / "run").exists()


def _trainer(tmp_path, callbacks, max_steps=2, output_dir=None):
    torch = pytest.importorskip("torch")
    torch.manual_seed(0)
    model = transformers.GPT2LMHeadModel(transformers.GPT2Config(vocab_size=32, n_positions=8, n_embd=16, n_layer=1,
                                                                 n_head=2))
    rows = [{"input_ids": [i % 32] * 8, "labels": [i % 32] * 8} for i in range(8)]
    args = transformers.TrainingArguments(output_dir=str(output_dir or tmp_path / "out"), max_steps=max_steps,
                                          per_device_train_batch_size=4, report_to="none", use_cpu=True,
                                          disable_tqdm=True, logging_strategy="no", save_strategy="no")
    return transformers.Trainer(model=model, args=args, train_dataset=rows, callbacks=callbacks)


def test_resume_from_read_without_the_callback_wired_warns(tmp_path, ck_env):
    import colabkit
    ar = colabkit.hf.AutoResume(tmp_path / "run", deadline=None)
    _trainer(tmp_path, callbacks=[])   # forgot callbacks=[ar]
    with pytest.warns(RuntimeWarning, match=r"no Trainer has this AutoResume among its callbacks: pass "
                                            r"callbacks=\[ar\] to Trainer"):
        assert ar.resume_from is None


@pytest.mark.parametrize("how", ["callbacks", "add_callback"])
def test_resume_from_read_with_the_callback_wired_does_not_warn(tmp_path, ck_env, how):
    import colabkit
    ar = colabkit.hf.AutoResume(tmp_path / "run", deadline=None)
    trainer = _trainer(tmp_path, callbacks=[ar] if how == "callbacks" else [])
    if how == "add_callback":
        trainer.add_callback(ar)
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)
        assert ar.resume_from is None


def test_training_that_does_not_resume_from_the_checkpoint_refuses_before_training(tmp_path, ck_env, capsys):
    """The callback is wired, but trainer.train() got no resume_from_checkpoint: it would train from step 0 and
    fail at its first save (the folder holds a newer step); it stops at once instead, having changed nothing."""
    import colabkit
    ar = colabkit.hf.AutoResume(tmp_path / "run", deadline=None)
    _trainer(tmp_path, [ar]).train(resume_from_checkpoint=ar.resume_from)
    assert [c.step for c in colabkit.Checkpoints(tmp_path / "run").list()] == [2]   # the end of training
    ar.close()
    again = colabkit.hf.AutoResume(tmp_path / "run", deadline=None)
    trainer = _trainer(tmp_path, [again], max_steps=4, output_dir=tmp_path / "out2")
    before = [p.detach().clone() for p in trainer.model.parameters()]
    with pytest.raises(ValueError, match=r"holds step 2, but trainer.train\(\) started from step 0: pass "
                                         r"resume_from_checkpoint=ar.resume_from"):
        trainer.train()
    assert all((a == b).all() for a, b in zip(before, trainer.model.parameters()))
    trainer.train(resume_from_checkpoint=again.resume_from)   # as the message says
    assert "resumed from step 2 (epoch 1, step 0 of it)" in capsys.readouterr().out
    assert [c.step for c in colabkit.Checkpoints(tmp_path / "run").list()] == [2, 4]


def test_output_dir_inside_the_destination_warns(tmp_path, ck_env):
    import colabkit
    ar = colabkit.hf.AutoResume(tmp_path / "run", deadline=None)
    with pytest.warns(RuntimeWarning, match=r"output_dir=.* is inside .*run: the Trainer writes each checkpoint "
                                            r"there while training waits"):
        _trainer(tmp_path, [ar], output_dir=tmp_path / "run" / "outputs")


def test_a_changed_batch_layout_at_resume_is_said_in_one_line(tmp_path, ck_env):
    import colabkit
    ar = colabkit.hf.AutoResume(tmp_path / "run", deadline=None)
    _trainer(tmp_path, [ar]).train()
    ar.close()
    again = colabkit.hf.AutoResume(tmp_path / "run", deadline=None)
    trainer = _trainer(tmp_path, [again], max_steps=3, output_dir=tmp_path / "out2")
    trainer.args.gradient_accumulation_steps = 2
    with pytest.warns(RuntimeWarning, match=r"this run's gradient_accumulation_steps=2 \(checkpoint: 1\) differ "
                                            r"from the checkpoint's: .*not an exact resume"):
        trainer.train(resume_from_checkpoint=again.resume_from)
