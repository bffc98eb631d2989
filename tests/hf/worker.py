"""A training run with a tiny model, as a user's notebook cell would do it, for tests/hf (one run per process):
``python worker.py '<json spec>'``. Prints one ``RESULT {json}`` line and writes the final model and optimizer
tensors to ``spec["out"]`` (.npz)."""
import hashlib
import json
import os
import signal
import sys
import time

import numpy as np
import torch
import transformers

SEQ, VOCAB, EXAMPLES = 16, 64, 24


def _examples(n=EXAMPLES):
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(4, VOCAB, (n, SEQ), generator=g)
    return [{"input_ids": row.tolist(), "labels": row.tolist()} for row in ids]


def _model(kind):
    torch.manual_seed(0)
    if kind == "llama":
        config = transformers.LlamaConfig(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                          num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=64,
                                          attention_dropout=0.1, pad_token_id=0, bos_token_id=1, eos_token_id=2)
        return transformers.LlamaForCausalLM(config)
    config = transformers.GPT2Config(vocab_size=VOCAB, n_positions=SEQ, n_embd=32, n_layer=2, n_head=2)
    return transformers.GPT2LMHeadModel(config)   # dropout 0.1 everywhere: the RNG state matters


def _tokenizer():
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast
    vocab = {"[PAD]": 0, "[BOS]": 1, "[EOS]": 2, "[UNK]": 3, **{f"w{i}": i for i in range(4, VOCAB)}}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    return PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="[PAD]", bos_token="[BOS]", eos_token="[EOS]",
                                   unk_token="[UNK]")


def _digest(batch) -> str:
    return hashlib.sha256(batch["input_ids"].numpy().tobytes()).hexdigest()[:12]


def build(spec, ar):
    """The Trainer (or TRL's SFTTrainer) the spec asks for, with ``ar`` (and the test's own callbacks) wired."""
    seen = []

    class Cut(transformers.TrainerCallback):
        """What happens to the run from outside: a SIGTERM mid-step, a kill -9."""

        def on_step_begin(self, args, state, control, **kw):
            if state.global_step == spec.get("sigterm_in_step"):   # arrives while the step runs
                os.kill(os.getpid(), signal.SIGTERM)
            if state.global_step == spec.get("sigint_in_step"):
                os.kill(os.getpid(), signal.SIGINT)

    class AfterTaken(transformers.TrainerCallback):
        """Runs after ``ar`` took each checkpoint: a kill -9 while its commit is in the background, or (with
        commit_each_save) a wait for that commit, so that the store has no later save to coalesce it with."""

        def on_save(self, args, state, control, **kw):
            if state.global_step == spec.get("kill_after_save"):
                os.kill(os.getpid(), signal.SIGKILL)
            if spec.get("commit_each_save") and ar is not None:
                assert ar.checkpoints.wait(120), f"step {state.global_step} was not committed within 120 s"

    common = dict(output_dir=spec["output_dir"], per_device_train_batch_size=spec.get("batch", 4),
                  gradient_accumulation_steps=spec.get("accumulation", 1), num_train_epochs=spec.get("epochs", 2),
                  learning_rate=1e-3, report_to="none", use_cpu=True, disable_tqdm=True, logging_strategy="no",
                  save_strategy=spec.get("save_strategy", "no"), save_steps=spec.get("save_steps", 500),
                  save_total_limit=spec.get("save_total_limit"), seed=42, dataloader_num_workers=0,
                  ignore_data_skip=spec.get("ignore_data_skip", False))
    callbacks = [Cut()] + ([ar] if ar is not None else []) + [AfterTaken()]
    if spec.get("trainer") == "sft":
        from trl import SFTConfig, SFTTrainer
        model = _model("llama")
        args = SFTConfig(max_length=SEQ, packing=False, **common)
        trainer_class, extra = SFTTrainer, dict(processing_class=_tokenizer())
        from datasets import Dataset
        data = Dataset.from_list([{"input_ids": e["input_ids"]} for e in _examples()])
    else:
        model = _model("gpt2")
        args = transformers.TrainingArguments(**common)
        trainer_class, extra, data = transformers.Trainer, {}, _examples()

    slow = spec.get("slow_save_at")

    class Watched(trainer_class):
        def training_step(self, model, inputs, *a, **kw):
            seen.append([self.state.global_step, _digest(inputs)])
            return super().training_step(model, inputs, *a, **kw)

        def _save_optimizer_and_scheduler(self, output_dir):
            super()._save_optimizer_and_scheduler(output_dir)
            if self.state.global_step == slow:   # a slow disk: the test kills -9 while this checkpoint is written
                with open(os.path.join(output_dir, "optimizer.pt"), "r+b") as f:
                    f.truncate(100)
                print(f"WRITING {output_dir}", flush=True)
                time.sleep(60)

    trainer = Watched(model=model, args=args, train_dataset=data, callbacks=callbacks, **extra)
    return trainer, seen


def dump(trainer, out):
    arrays = {f"model/{k}": v.detach().numpy() for k, v in trainer.model.state_dict().items()}
    for i, state in trainer.optimizer.state_dict()["state"].items():
        for k, v in state.items():
            arrays[f"opt/{i}/{k}"] = v.numpy() if isinstance(v, torch.Tensor) else np.array(v)
    arrays["sched/last_epoch"] = np.array(trainer.lr_scheduler.state_dict()["last_epoch"])
    np.savez(out, **arrays)


def main(spec):
    import colabkit
    ar = None
    if not spec.get("without_autoresume"):
        ar = colabkit.hf.AutoResume(spec["dest"], save_freq=spec.get("save_freq"), every=spec.get("every"),
                                    deadline=spec.get("deadline"), keep=spec.get("keep"))
    trainer, seen = build(spec, ar)
    resume_from = ar.resume_from if ar is not None else None
    stopped = None
    try:
        trainer.train(resume_from_checkpoint=resume_from)
    except colabkit.hf.Stopped as exc:
        stopped = str(exc)
    except KeyboardInterrupt as exc:
        stopped = f"KeyboardInterrupt: {exc}"
    dump(trainer, spec["out"])
    if spec.get("panel"):   # what %colabkit shows in this kernel after the run
        import colabkit.widgets
        print("PANEL " + json.dumps(colabkit.widgets.text()), flush=True)
    print("RESULT " + json.dumps({"resume_from": resume_from, "step": trainer.state.global_step, "seen": seen,
                                  "stopped": stopped}), flush=True)


if __name__ == "__main__":
    main(json.loads(sys.argv[1]))
