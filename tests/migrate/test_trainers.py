"""Training the notebook does not write itself, reported with the colabkit resume that fits it: a training script
run from a shell line -> colabkit guard (CK501), a transformers / TRL trainer -> colabkit.hf.AutoResume (CK502), an
accelerate loop -> colabkit.hf.AccelerateResume (CK503). Nothing is rewritten: each needs a destination the user
chooses."""
from __future__ import annotations

import pytest

from colabkit.cli import main
from colabkit.migrate import rule_table, select


def notes(findings, code):
    return [f for f in findings if f.code == code]


def suggested_line(message) -> str:
    """The line a CK501 message says to run (after 'becomes: ', up to the first '; ' note)."""
    assert "becomes: " in message, message
    return message.split("becomes: ", 1)[1].split("; ", 1)[0]


# --- CK501: a training script run from a shell line ---------------------------------------------------------------

def test_a_training_script_gets_the_guard_line_ready_to_paste_and_the_cell_is_left_alone(migrate_sources):
    source = ("!accelerate launch train_dreambooth_lora.py --output_dir outputs/lora --checkpointing_steps 500 "
              "--resume_from_checkpoint latest")
    (new,), findings = migrate_sources(source)
    assert new == source
    (found,) = notes(findings, "CK501")
    assert not found.applied and found.manual == ""
    assert found.line == 1
    assert found.message.startswith("accelerate launch train_dreambooth_lora.py trains and writes checkpoints to "
                                    "outputs/lora: colabkit guard commits them to Drive")
    assert suggested_line(found.message) == (
        '!colabkit guard --watch outputs/lora --to drive:runs/lora --resume-arg "--resume_from_checkpoint={{latest}}" '
        "-- accelerate launch train_dreambooth_lora.py --output_dir outputs/lora --checkpointing_steps 500 "
        "--resume_from_checkpoint latest")
    assert "resume option" not in found.message


@pytest.mark.parametrize("line, what", [
    ("!python train.py --epochs 3", "python train.py"),
    ("!python3 finetune_llama.py --output-dir o", "python3 finetune_llama.py"),
    ("!python scripts/pretrain.py", "python scripts/pretrain.py"),
    ("!python main.py --save_steps 100", "python main.py"),
    ("!python main.py --output_dir o --num_train_epochs 3", "python main.py"),
    ("!python run_clm.py --do_train --output_dir o", "python run_clm.py"),
    ("!python -m llava.train.train_mem --output_dir o", "python -m llava.train.train_mem"),
    ("!accelerate launch --num_processes 2 --mixed_precision fp16 sft.py --output_dir o", "accelerate launch sft.py"),
    ("!torchrun --nproc_per_node=2 main.py", "torchrun main.py"),
    ("!deepspeed --num_gpus 2 main.py --deepspeed ds.json", "deepspeed main.py"),
    ("!python -m accelerate.commands.launch --multi_gpu sft.py", "accelerate launch sft.py"),
    ("!python -m torch.distributed.run --nproc_per_node 2 main.py", "torchrun main.py"),
    ("!torchrun --nproc_per_node 2 -m pkg.sft", "torchrun -m pkg.sft"),
    ("!{sys.executable} train.py", "{sys.executable} train.py"),
    ("!cd repo && CUDA_VISIBLE_DEVICES=0 nohup python train.py", "python train.py"),
    ("log = !python train.py --output_dir o", "python train.py"),
])
def test_every_launcher_spelling_is_recognised(migrate_sources, line, what):
    _, findings = migrate_sources(line)
    (found,) = notes(findings, "CK501")
    assert found.message.startswith(f"{what} trains and writes checkpoints")


@pytest.mark.parametrize("line", [
    "!python inference.py --output_dir preds",
    "!python main.py --epochs 3",
    "!python -m pip install transformers",
    "!python setup.py install",
    '!python -c "import train"',
    "!python train.py --help",
    "!python3 --version",
    "!accelerate config default",
    "!ls train.py",
    "!colabkit guard --watch o --to drive:runs/o -- python train.py --output_dir o",
    "# !python train.py",
])
def test_other_command_lines_are_not_reported(migrate_sources, line):
    _, findings = migrate_sources(line)
    assert notes(findings, "CK501") == []


@pytest.mark.parametrize("options, watch, name", [
    ("--output_dir runs/a", "runs/a", "a"),
    ("--output_dir=runs/a/", "runs/a/", "a"),
    ("--output-dir runs/b", "runs/b", "b"),
    ("--outdir out", "out", "out"),
    ("--save_dir ckpts", "ckpts", "ckpts"),
    ("--checkpoint_dir ck --output_dir samples", "ck", "ck"),
    ("--logdir logs/x", "logs/x", "x"),
    ("--model_dir m", "m", "m"),
    ("-o results", "results", "results"),
    ('--output_dir "my run"', '"my run"', "my-run"),
    ("--output_dir {out_dir}", "{out_dir}", "train"),
    ("--project runs/train --name wheat --exist-ok", "runs/train/wheat", "wheat"),
])
def test_the_watched_folder_comes_from_the_scripts_options(migrate_sources, options, watch, name):
    _, findings = migrate_sources(f"!python train.py {options}")
    (found,) = notes(findings, "CK501")
    assert suggested_line(found.message).startswith(f"!colabkit guard --watch {watch} --to drive:runs/{name} -- ")
    assert "in place of FOLDER" not in found.message and "add --exist-ok" not in found.message


def test_without_a_folder_option_the_line_says_what_to_fill_in(migrate_sources):
    _, findings = migrate_sources("!python train.py --img 640")
    (found,) = notes(findings, "CK501")
    assert suggested_line(found.message) == "!colabkit guard --watch FOLDER --to drive:runs/train -- python train.py " \
                                            "--img 640"
    assert found.message.endswith("; put the folder train.py writes its checkpoints to in place of FOLDER; "
                                  "add --resume-arg with the script's resume option")


def test_a_yolo_style_run_folder_without_exist_ok_is_pointed_out(migrate_sources):
    _, findings = migrate_sources("!python train.py --project runs/train --name wheat --epochs 3")
    (found,) = notes(findings, "CK501")
    assert "--watch runs/train/wheat --to drive:runs/wheat" in found.message
    assert "add --exist-ok to the script's options" in found.message


@pytest.mark.parametrize("option", ["--resume_from_checkpoint", "--resume", "--resume_from", "--ckpt_path",
                                    "--checkpoint", "--resume-from-checkpoint"])
def test_the_resume_option_the_line_shows_becomes_resume_arg(migrate_sources, option):
    _, findings = migrate_sources(f"!python train.py --output_dir o {option}=last")
    (found,) = notes(findings, "CK501")
    assert f'--to drive:runs/o --resume-arg "{option}={{{{latest}}}}" -- python train.py' in found.message
    assert "resume option" not in found.message


def test_colab_paths_in_the_line_are_those_of_the_migrated_line(migrate_sources, run_cell_alone, tmp_path,
                                                                monkeypatch):
    source = "!python train.py --output_dir /content/out --save_steps 50 --resume_from_checkpoint latest"
    (new,), findings = migrate_sources(source)
    (found,) = notes(findings, "CK501")
    line = suggested_line(found.message)
    migrated = new.splitlines()[-1]
    assert migrated == "!python train.py --output_dir {colabkit.workdir('out', quoted=True)} --save_steps 50 " \
                       "--resume_from_checkpoint latest"
    assert line == ("!colabkit guard --watch {colabkit.workdir('out', quoted=True)} --to drive:runs/out "
                    '--resume-arg "--resume_from_checkpoint={{latest}}" -- ' + migrated[1:])
    # What the pasted line hands the guard once IPython has expanded it (echo stands in for the command):
    # the local folder, and {latest} for the guard to fill in.
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.setenv("COLABKIT_WORKDIR", str(work))
    ok, output = run_cell_alone("import colabkit\n" + line.replace("!colabkit guard", "!echo guard", 1))
    assert ok, output
    assert output.strip() == (f"guard --watch {work / 'out'} --to drive:runs/out --resume-arg "
                              f"--resume_from_checkpoint={{latest}} -- python train.py --output_dir {work / 'out'} "
                              f"--save_steps 50 --resume_from_checkpoint latest")


def test_a_line_ipython_does_not_expand_keeps_its_text_and_a_plain_latest(migrate_sources):
    # $DATA is no Python name: IPython expands nothing in the line, so {latest} must not be doubled and the Colab
    # path is not rewritten (CK201 reports it)
    _, findings = migrate_sources("!python train.py --data $DATA --output_dir /content/out --resume x")
    (found,) = notes(findings, "CK501")
    assert suggested_line(found.message) == ('!colabkit guard --watch /content/out --to drive:runs/out --resume-arg '
                                             '"--resume={latest}" -- python train.py --data $DATA --output_dir '
                                             '/content/out --resume x')


def test_a_drive_folder_as_output_is_pointed_out(migrate_sources):
    _, findings = migrate_sources("!python train.py --output_dir /content/drive/MyDrive/runs/a")
    (found,) = notes(findings, "CK501")
    assert "--watch {colabkit.drive('runs/a', quoted=True)} --to drive:runs/a" in found.message
    assert found.message.endswith("; /content/drive/MyDrive/runs/a is on Drive already: give the script a local "
                                  "folder to write to and keep Drive for --to")


def test_a_continued_line_gets_its_first_line_run_under_the_guard(migrate_sources):
    source = "!torchrun --nproc_per_node=2 finetune.py \\\n  --output_dir out \\\n  --num_train_epochs 3"
    (new,), findings = migrate_sources(source)
    assert new == source
    (found,) = notes(findings, "CK501")
    assert found.line == 1
    assert "its first line becomes: !colabkit guard --watch out --to drive:runs/out -- torchrun " \
           "--nproc_per_node=2 finetune.py \\;" in found.message


def test_a_continued_line_whose_launcher_is_not_on_the_first_line_says_where_the_guard_goes(migrate_sources):
    _, findings = migrate_sources("!CUDA_VISIBLE_DEVICES=0 \\\n  python train.py --output_dir o")
    (found,) = notes(findings, "CK501")
    assert "put 'colabkit guard --watch o --to drive:runs/o --' before 'python'" in found.message


@pytest.mark.parametrize("magic", ["%%bash", "%%shell", "%%script bash"])
def test_training_lines_of_a_shell_cell_are_reported_with_shell_text(migrate_sources, magic):
    source = (f"{magic}\n"
              "cd yolov5\n"
              "# python train.py --output_dir old\n"
              "accelerate launch train.py \\\n"
              "  --output_dir out --resume_from_checkpoint latest\n"
              "python detect.py --weights out/best.pt\n")
    _, findings = migrate_sources(source)
    (found,) = notes(findings, "CK501")
    assert found.line == 4
    # a shell cell: no IPython expansion, so {latest} is written as the guard reads it
    assert ('its first line becomes: colabkit guard --watch out --to drive:runs/out --resume-arg '
            '"--resume_from_checkpoint={latest}" -- accelerate launch train.py \\') in found.message


def test_other_cell_magics_are_not_read_as_shell(migrate_sources):
    _, findings = migrate_sources("%%writefile run.sh\npython train.py --output_dir out")
    assert notes(findings, "CK501") == []


# --- CK502: transformers and TRL trainers -------------------------------------------------------------------------

SFT = ("from trl import SFTTrainer, SFTConfig\n"
       "trainer = SFTTrainer(\n"
       "    model=model,\n"
       "    args=SFTConfig(output_dir='outputs/qwen-lora', save_steps=100),\n"
       "    train_dataset=ds,\n"
       ")\n"
       "trainer.train()")


def test_a_trl_trainer_gets_the_autoresume_lines_and_the_cell_is_left_alone(migrate_sources):
    (new,), findings = migrate_sources(SFT)
    assert new == SFT
    (found,) = notes(findings, "CK502")
    assert found.line == 2 and not found.applied and found.manual == ""
    assert found.message == (
        "SFTTrainer(...) (TRL's SFTTrainer, built on transformers' Trainer) can resume after a disconnect with "
        "colabkit.hf.AutoResume, which saves it to Drive on a schedule: before it, "
        'ar = colabkit.hf.AutoResume("drive:runs/qwen-lora", every="15min"); pass callbacks=[ar] to SFTTrainer(...); '
        "then trainer.train(resume_from_checkpoint=ar.resume_from)")


@pytest.mark.parametrize("imports, call, shown", [
    ("from transformers import Trainer", "Trainer(model=m)", "Trainer(...) (transformers' Trainer)"),
    ("import transformers", "transformers.Trainer(model=m)", "transformers.Trainer(...) (transformers' Trainer)"),
    ("from transformers import Trainer as HFTrainer", "HFTrainer(model=m)", "HFTrainer(...) (transformers' Trainer)"),
    ("from transformers import Seq2SeqTrainer", "Seq2SeqTrainer(model=m)",
     "(transformers' Seq2SeqTrainer, built on transformers' Trainer)"),
    ("import trl", "trl.DPOTrainer(model=m)", "trl.DPOTrainer(...) (TRL's DPOTrainer"),
    ("from trl import GRPOTrainer", "GRPOTrainer(model=m)", "(TRL's GRPOTrainer"),
    ("from trl import ORPOTrainer", "ORPOTrainer(model=m)", "(TRL's ORPOTrainer"),
    ("from trl import RewardTrainer", "RewardTrainer(model=m)", "(TRL's RewardTrainer"),
    ("from trl.trainer import SFTTrainer", "SFTTrainer(model=m)", "(TRL's SFTTrainer"),
])
def test_every_trainer_spelling_is_recognised(migrate_sources, imports, call, shown):
    _, findings = migrate_sources(f"{imports}\nt = {call}\nt.train()")
    (found,) = notes(findings, "CK502")
    assert shown in found.message and "t.train(resume_from_checkpoint=ar.resume_from)" in found.message


def test_a_subclass_in_another_cell_and_existing_callbacks(migrate_sources):
    _, findings = migrate_sources(
        "from transformers import Trainer, TrainingArguments\n"
        "class WeightedTrainer(Trainer):\n    pass",
        "args = TrainingArguments(output_dir='/content/runs/bert')\n"
        "wt = WeightedTrainer(model=m, args=args, callbacks=[EarlyStoppingCallback()])")
    (found,) = notes(findings, "CK502")
    assert (found.cell, found.line) == (1, 2)
    assert found.message.startswith("WeightedTrainer(...) (a subclass of transformers' Trainer) can resume")
    assert 'colabkit.hf.AutoResume("drive:runs/bert", every="15min")' in found.message
    assert "add ar to the callbacks list of WeightedTrainer(...); then wt.train(" in found.message


@pytest.mark.parametrize("cells", [
    ("from mylib import Trainer\nt = Trainer()",),
    ("t = Trainer(model=m)",),
    ("from transformers import TrainingArguments, TrainerCallback\nargs = TrainingArguments('o')\n"
     "class CB(TrainerCallback):\n    pass\ncb = CB()",),
    ("from trl import SFTTrainer\nimport colabkit.hf\nar = colabkit.hf.AutoResume('drive:runs/a')",
     "t = SFTTrainer(model=m, callbacks=[ar])"),
])
def test_no_trainer_note_where_none_is_built_or_autoresume_is_used(migrate_sources, cells):
    _, findings = migrate_sources(*cells)
    assert notes(findings, "CK502") == []


# --- CK503: accelerate loops --------------------------------------------------------------------------------------

def test_an_accelerate_loop_gets_one_note_per_cell(migrate_sources):
    (first, second), findings = migrate_sources(
        "from accelerate import Accelerator\naccelerator = Accelerator(mixed_precision='fp16')\n"
        "model, opt = accelerator.prepare(model, opt)",
        "for epoch in range(3):\n    train_one(epoch)\n    accelerator.save_state('ckpt')\n"
        "accelerator.save_state('final')")
    found = notes(findings, "CK503")
    assert [(f.cell, f.line) for f in found] == [(0, 2), (1, 3)]
    assert all(not f.applied and f.manual == "" for f in found)
    assert found[0].message.startswith("Accelerator(...): this accelerate training loop can resume after a "
                                       "disconnect with colabkit.hf.AccelerateResume (for accelerate loops")
    assert found[1].message.startswith("accelerator.save_state(...): ")
    assert "Accelerator(" in first and "save_state" in second  # unchanged


def test_save_state_without_accelerate_is_not_an_accelerate_loop(migrate_sources):
    _, findings = migrate_sources("env.save_state('x')")
    assert notes(findings, "CK503") == []


def test_accelerate_resume_already_in_use(migrate_sources):
    _, findings = migrate_sources("import accelerate\nfrom colabkit.hf import AccelerateResume\n"
                                  "acc = accelerate.Accelerator()")
    assert notes(findings, "CK503") == []


# --- the rules as a user chooses and lists them ---------------------------------------------------------------------

def test_the_rules_are_listed_as_report_only_and_can_be_turned_off(migrate_sources):
    table = rule_table()
    for code, name in (("CK501", "training-script"), ("CK502", "hf-trainer"), ("CK503", "accelerate-loop")):
        assert f"{code}  {name:<22} report " in table
    assert select("CK5") == {"CK501", "CK502", "CK503"}
    _, findings = migrate_sources(SFT, "!python train.py --output_dir o", ignore="CK5")
    assert [f.code for f in findings if f.code.startswith("CK5")] == []


def test_a_notebook_with_only_these_notes_needs_no_migration(tmp_path, colab_notebook, capsys):
    notebook = tmp_path / "train.ipynb"
    notebook.write_text(colab_notebook(SFT, "!accelerate launch train.py --output_dir out"))
    assert main(["migrate", "--check", str(notebook)]) == 0
    out = capsys.readouterr().out
    assert "nothing to change" in out and "to do by hand" not in out
    assert "CK502 SFTTrainer(...)" in out and "CK501 accelerate launch train.py" in out and "[note]" in out
    assert not (tmp_path / "train.local.ipynb").exists()
