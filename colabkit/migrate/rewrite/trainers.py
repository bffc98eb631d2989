"""Training the notebook does not write itself (CK501-CK503): reported with the colabkit resume that fits it.

Nothing here is rewritten: each resume needs a destination the user chooses, so the report gives the lines to
add, built from the cell.

- CK501: a shell line that runs a training script (``!python train.py ...``, ``!accelerate launch``, ``!torchrun``,
  ``!deepspeed``, ``!python -m accelerate.commands.launch`` / ``torch.distributed.run``, the same lines in a
  ``%%bash`` / ``%%shell`` cell) -> the line run under ``colabkit guard``: the folder it watches from the script's
  arguments (``--output_dir X``, ``--save_dir``, ``--checkpoint_dir``, ``--project X --name Y``, ...), a
  destination ``drive:runs/NAME`` and ``--resume-arg`` where the line shows the script's resume option. A script
  counts as training that writes checkpoints when its name says so (train*.py, finetune*.py, ...), when a
  distributed launcher runs it, when it is given a save cadence or a resume option (``--save_steps``,
  ``--checkpointing_steps``, ``--resume_from_checkpoint``, ``--do_train``), or an output folder and a length of
  training (``--output_dir`` with ``--epochs``).
- CK502: a transformers ``Trainer`` or a trainer built on it (TRL's ``SFTTrainer``, ``DPOTrainer``, ...; a class
  of the notebook's own deriving from one), constructed -> ``colabkit.hf.AutoResume``: ``ar = ...``,
  ``callbacks=[ar]``, ``trainer.train(resume_from_checkpoint=ar.resume_from)``.
- CK503: an accelerate loop (``Accelerator(...)``, ``accelerator.save_state(...)``) -> ``colabkit.hf.AccelerateResume``.

Trainer and accelerate names count only where the notebook imports them from transformers, trl or accelerate.
"""
from __future__ import annotations

import ast
import dataclasses
import re
import shlex

from .colab import binding, dotted
from .escapes import ipython_expands, portable_command
from .magics import shell_body
from ..shell import split_words

# Options whose value is the folder a training script writes its checkpoints to, most specific first.
DIR_OPTIONS = ("--checkpoint_dir", "--checkpoint-dir", "--ckpt_dir", "--ckpt-dir", "--save_dir", "--save-dir",
               "--output_dir", "--output-dir", "--outdir", "--out_dir", "--out-dir", "--model_dir", "--model-dir",
               "--logdir", "--log_dir", "--log-dir", "-o")
# Options through which a script resumes from a checkpoint, most specific first.
RESUME_OPTIONS = ("--resume_from_checkpoint", "--resume-from-checkpoint", "--resume_from", "--resume-from",
                  "--resume", "--ckpt_path", "--ckpt-path", "--checkpoint")
# Options that make a run save checkpoints on a cadence (or train, for HF's example scripts).
SAVE_OPTIONS = frozenset({"--save_steps", "--save-steps", "--checkpointing_steps", "--checkpointing-steps",
                          "--save_strategy", "--save-strategy", "--save_every", "--save-every", "--save_interval",
                          "--save-interval", "--save_freq", "--save-freq", "--save_period", "--save-period",
                          "--do_train"})
LENGTH_OPTIONS = frozenset({"--epochs", "--num_train_epochs", "--num-train-epochs", "--num_epochs", "--num-epochs",
                            "--n_epochs", "--max_steps", "--max-steps", "--max_train_steps", "--max-train-steps"})
TRAINING_NAME = re.compile(r"train|fine[_-]?tun|pretrain", re.IGNORECASE)
_PYTHON = re.compile(r"^(?:\S*/)?python(?:\d+(?:\.\d+)*)?$|^\{sys\.executable\}$")
_ASSIGNMENT = re.compile(r"^[A-Za-z_]\w*=")
_PREFIX_COMMANDS = frozenset({"nohup", "time", "env", "exec"})
_LAUNCHER_MODULES = {"accelerate.commands.launch": "accelerate launch", "torch.distributed.run": "torchrun",
                     "torch.distributed.launch": "torchrun", "deepspeed.launcher.runner": "deepspeed"}
_PYTHON_VALUE_OPTIONS = frozenset({"-W", "-X", "-Q"})
_HF_MODULES = ("transformers", "trl", "accelerate")
GUARD_CLUES = re.compile(r"python|accelerate|torchrun|deepspeed|sys\.executable")


@dataclasses.dataclass
class TrainingRun:
    """A training script started by a shell command line."""
    launcher: str         # "python3" (as the line says it), "accelerate launch", "torchrun", "deepspeed"
    script: str           # "train.py" / "-m pkg.train"
    start: int            # index in the command line where the launcher (after VAR=value words) begins
    watch: str = ""       # the folder it writes to, as shell text ("" if the line does not say)
    watch_value: str = ""  # the same, unquoted
    resume: str = ""      # the resume option the line gives it
    numbered: bool = False  # YOLO-style --project/--name without --exist-ok: a new run gets a new folder


def training_run(command: str):
    """The training script ``command`` starts (one in a list such as 'cd repo && python train.py'), else None."""
    words = split_words(command)
    if not words:
        return None
    segments, current = [], []
    for index, word in enumerate(words):
        gap = command[words[index - 1].end:word.start] if index else ""
        if current and any(c in gap for c in ";&|"):
            segments.append(current)
            current = []
        current.append(word)
    segments.append(current)
    for segment in segments:
        run = _segment_run(command, segment)
        if run is not None:
            return run
    return None


def _segment_run(command, words):
    while words and (_ASSIGNMENT.match(words[0].value) or words[0].value in _PREFIX_COMMANDS):
        words = words[1:]
    if not words:
        return None
    head = words[0].value
    start = words[0].start
    rest = [w.value for w in words]
    launcher, script_at = None, None
    if _PYTHON.match(head):
        i = 1
        while i < len(rest) and rest[i].startswith("-") and rest[i] != "-m":
            if rest[i] == "-c" or rest[i] in ("-h", "--help", "-V", "--version"):
                return None
            i += 2 if rest[i] in _PYTHON_VALUE_OPTIONS else 1
        if i >= len(rest):
            return None
        if rest[i] == "-m":
            if i + 1 >= len(rest):
                return None
            module = rest[i + 1]
            if module in _LAUNCHER_MODULES:
                launcher = _LAUNCHER_MODULES[module]
                script_at = _launched_script(rest, i + 2)
            else:
                launcher, script_at = head, i
        else:
            launcher, script_at = head, i
    elif head == "accelerate" and rest[1:2] == ["launch"]:
        launcher, script_at = "accelerate launch", _launched_script(rest, 2)
    elif head.rsplit("/", 1)[-1] in ("torchrun", "deepspeed"):
        launcher, script_at = head.rsplit("/", 1)[-1], _launched_script(rest, 1)
    if launcher is None or script_at is None:
        return None
    if rest[script_at] == "-m" or rest[script_at] in ("--module",):
        script, name, args_at = f"-m {rest[script_at + 1]}", rest[script_at + 1].rsplit(".", 1)[-1], script_at + 2
    else:
        script, args_at = rest[script_at], script_at + 1
        name = script.rsplit("/", 1)[-1]
        if not name.endswith(".py"):
            return None
    options = _options(command, words[args_at:])
    if "-h" in options or "--help" in options:
        return None
    distributed = launcher in ("accelerate launch", "torchrun", "deepspeed")
    saves = any(o in SAVE_OPTIONS for o in options) or any(o in RESUME_OPTIONS for o in options)
    folder = any(o in DIR_OPTIONS for o in options) or "--project" in options
    length = any(o in LENGTH_OPTIONS for o in options)
    if not (TRAINING_NAME.search(name) or distributed or saves or (folder and length)):
        return None
    run = TrainingRun(launcher=launcher, script=script, start=start)
    run.resume = next((o for o in RESUME_OPTIONS if o in options), "")
    option = next((o for o in DIR_OPTIONS if o in options and options[o][1]), None)
    if option is not None:
        run.watch, run.watch_value = options[option]
    elif "--project" in options and options["--project"][1]:
        run.watch, run.watch_value = options["--project"]
        if "--name" in options and options["--name"][1]:
            run.watch += "/" + options["--name"][0]
            run.watch_value += "/" + options["--name"][1]
        run.numbered = not any(o in options for o in ("--exist-ok", "--exist_ok"))
    return run


def _launched_script(words, i):
    """Index of the script a launcher (accelerate launch, torchrun, deepspeed) runs: its first .py word, or
    '-m' before a module; None if there is none."""
    for j in range(i, len(words)):
        if words[j] in ("-m", "--module") and j + 1 < len(words):
            return j
        if words[j].endswith(".py") and not words[j].startswith("-"):
            return j
    return None


def _options(command, words) -> dict:
    """The script's options: name -> (value as shell text, value) ('' for a flag without one)."""
    options = {}
    for index, word in enumerate(words):
        value = word.value
        if not value.startswith("-") or value in ("-", "--"):
            continue
        raw = command[word.start:word.end]
        if "=" in value and value.startswith("--"):
            name, _, given = value.partition("=")
            text = raw[len(name) + 1:] if raw.startswith(name + "=") else shlex.quote(given)
            options.setdefault(name, (text, given))
            continue
        following = words[index + 1] if index + 1 < len(words) else None
        if following is not None and not following.value.startswith("-"):
            options.setdefault(value, (command[following.start:following.end], following.value))
        else:
            options.setdefault(value, ("", ""))
    return options


def _run_name(run) -> str:
    """NAME in drive:runs/NAME: the watched folder's last part, else the script's name."""
    value = run.watch_value.rstrip("/")
    last = value.rsplit("/", 1)[-1]
    if not last or last in (".", "..") or any(c in value for c in "{}$`*?"):
        last = run.script.rsplit("/", 1)[-1].rsplit(".", 1)[0] if not run.script.startswith("-m ") else \
            run.script.rsplit(".", 1)[-1]
    return re.sub(r"[^\w.-]+", "-", last).strip("-.") or "train"


def guard_options(run, expanded: bool, watch: str) -> str:
    """The options of ``colabkit guard`` for ``run``. ``expanded``: for a ! line IPython expands, where it would read
    {latest} as a Python expression (and '{{' is how the line says '{')."""
    latest = "{{latest}}" if expanded else "{latest}"
    text = f"--watch {watch or 'FOLDER'} --to drive:runs/{_run_name(run)}"
    if run.resume:
        text += f' --resume-arg "{run.resume}={latest}"'
    return text


def _guard_message(run, line, continued, watch, expanded) -> str:
    """The CK501 message: what the line runs, and ``line`` (the line run under the guard; "" where the launcher
    is not on the escape's first line: then what to put before it)."""
    where = f" to {run.watch_value}" if run.watch else ""
    what = f"{run.launcher} {run.script}"
    if line:
        how = f"{'its first line' if continued else 'this line'} becomes: {line}"
    else:
        how = f"put 'colabkit guard {guard_options(run, expanded, watch)} --' before '{run.launcher}'"
    notes = []
    if not run.watch:
        notes.append(f"put the folder {run.script} writes its checkpoints to in place of FOLDER")
    if not run.resume:
        notes.append("add --resume-arg with the script's resume option")
    if run.numbered:
        notes.append("add --exist-ok to the script's options, so that a relaunch writes to the same folder "
                     "(without it a YOLO-style script numbers a new one)")
    if run.watch_value.startswith(("/content/drive", "/content/gdrive", "/gdrive", "drive/")):
        notes.append(f"{run.watch_value} is on Drive already: give the script a local folder to write to and "
                     f"keep Drive for --to")
    return (f"{what} trains and writes checkpoints{where}: colabkit guard commits them to Drive and relaunches it "
            f"from the last one after a disconnect; {how}" + "".join(f"; {n}" for n in notes))


def shell(ctx, work, esc):
    """A shell escape (!cmd, x = !cmd) that runs a training script (CK501)."""
    if not ctx.on("CK501") or not GUARD_CLUES.search(esc.arg):
        return
    run = training_run(esc.arg)
    if run is None:
        return
    line_text = work.content(esc.line)
    text = line_text[esc.content_col:]
    continued = esc.end_line != esc.line
    if continued:
        text = text.rstrip()
        text = text[:-1].rstrip() if text.endswith("\\") else text
    elif text != esc.arg:
        text = ""
    # the Colab paths of the line as the migrated notebook has them (where IPython expands the line at all)
    expanded = ipython_expands(ctx, esc.arg)
    portable = (lambda words: portable_command(ctx, words)) if expanded else (lambda words: words)
    watch = portable(run.watch)
    first = training_run(text) if text else None
    shown = ""
    if first is not None and (first.launcher, first.script) == (run.launcher, run.script):
        before, after = text[:first.start], text[first.start:]
        shown = (line_text[:esc.content_col] + portable(before) + "colabkit guard "
                 + guard_options(run, expanded, watch) + " -- " + portable(after) + (" \\" if continued else ""))
    work.finding("CK501", esc.line, _guard_message(run, shown, continued, watch, expanded), False)


def shell_cell(ctx, work):
    """The lines of a %%bash / %%shell cell that run a training script (CK501)."""
    code = work.code
    if not ctx.on("CK501") or not code.magics or not shell_body(*code.magic):
        return
    number = code.magics[-1][2] + 1
    while number < len(work.lines):
        first, logical = number, []
        while True:  # one command, continued with '\' over several lines
            text = work.content(number)
            number += 1
            if text.rstrip().endswith("\\") and number < len(work.lines):
                logical.append(text.rstrip()[:-1].rstrip())
                continue
            logical.append(text)
            break
        command = " ".join(logical)
        if command.lstrip().startswith("#") or not GUARD_CLUES.search(command):
            continue
        run = training_run(command)
        if run is None:
            continue
        head, continued = logical[0], len(logical) > 1
        located = training_run(head)
        shown = ""
        if located is not None and (located.launcher, located.script) == (run.launcher, run.script):
            shown = (head[:located.start] + "colabkit guard " + guard_options(run, False, run.watch) + " -- "
                     + head[located.start:] + (" \\" if continued else ""))
        work.finding("CK501", first, _guard_message(run, shown, continued, run.watch, False), False)


# --- transformers / TRL trainers and accelerate loops in the notebook's Python ----------------------------------

def collect(ctx, works):
    """The names the notebook binds to transformers, trl and accelerate, and to its own subclasses of their
    trainers (``ctx.hf_names``: name -> qualified name); whether it already uses colabkit.hf's resume."""
    names = ctx.hf_names
    classes = []
    for work in works:
        if work.code.tree is None or work.code.problem is not None:
            continue
        source = work.source
        if not any(word in source for word in _HF_MODULES + ("colabkit", "class ")):
            continue
        for node in ast.walk(work.code.tree):
            if isinstance(node, ast.Import):
                for alias in node.names:
                    top = alias.name.split(".")[0]
                    if top in _HF_MODULES:
                        names[binding(node, alias)] = alias.name if alias.asname else top
                    elif alias.name.startswith("colabkit.hf"):
                        _uses_colabkit_hf(ctx, work)
            elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
                if node.module.split(".")[0] in _HF_MODULES:
                    names.update((alias.asname or alias.name, f"{node.module}.{alias.name}")
                                 for alias in node.names if alias.name != "*")
                elif node.module.startswith("colabkit.hf") or (
                        node.module == "colabkit" and any(a.name == "hf" for a in node.names)):
                    _uses_colabkit_hf(ctx, work)
            elif isinstance(node, ast.Attribute) and dotted(node) == "colabkit.hf":
                _uses_colabkit_hf(ctx, work)
            elif isinstance(node, ast.ClassDef) and node.bases:
                classes.append(node)
    for _ in range(3):  # class B(A), class A(Trainer): a few levels of the notebook's own trainers
        for node in classes:
            base = next((q for q in (qualified(ctx, b) for b in node.bases) if is_trainer(q)), None)
            if base is not None and node.name not in names:
                names[node.name] = base
                ctx.hf_subclasses.add(node.name)


def _uses_colabkit_hf(ctx, work):
    ctx.hf_resume_used.update(name for name in ("AutoResume", "AccelerateResume") if name in work.source)


def trigger_names(ctx) -> list:
    """The names whose mention makes a cell worth reading for CK502 / CK503."""
    names = {name for name, qual in ctx.hf_names.items()
             if is_trainer(qual) or qual == "accelerate.Accelerator" or "." not in qual}
    if any(qual.split(".")[0] == "accelerate" for qual in ctx.hf_names.values()):
        names.add("save_state")
    return sorted(names)


def qualified(ctx, node) -> str:
    """The transformers / trl / accelerate name a name or attribute chain stands for ("" for anything else)."""
    text = dotted(node)
    head, _, rest = text.partition(".")
    if head not in ctx.hf_names:
        return ""
    return ctx.hf_names[head] + ("." + rest if rest else "")


def is_trainer(qual) -> bool:
    return qual.split(".")[0] in ("transformers", "trl") and qual.rsplit(".", 1)[-1].endswith("Trainer")


def trainers(ctx, work, tree):
    """Trainer constructions (CK502) and accelerate loops (CK503) in the cell's Python."""
    if not ctx.hf_names:
        return
    trainer_on = ctx.on("CK502") and "AutoResume" not in ctx.hf_resume_used
    loop_on = ctx.on("CK503") and "AccelerateResume" not in ctx.hf_resume_used and \
        any(q.split(".")[0] == "accelerate" for q in ctx.hf_names.values())
    if not (trainer_on or loop_on):
        return
    calls = sorted((n for n in ast.walk(tree) if isinstance(n, ast.Call)), key=lambda n: (n.lineno, n.col_offset))
    for node in calls:
        if node.lineno - 1 in work.escape_lines:
            continue
        qual = qualified(ctx, node.func)
        if trainer_on and is_trainer(qual):
            _trainer(ctx, work, tree, node, qual)
        elif loop_on and (qual == "accelerate.Accelerator" or (
                isinstance(node.func, ast.Attribute) and node.func.attr == "save_state")):
            loop_on = False  # one finding per cell
            work.finding("CK503", node.lineno - 1,
                         f"{dotted(node.func) or node.func.attr}(...): this accelerate training loop can resume "
                         f"after a disconnect with colabkit.hf.AccelerateResume (for accelerate loops: it saves the "
                         f"loop's state with Accelerator.save_state to a folder such as "
                         f"drive:runs/{_folder_name(tree) or 'train'} on a schedule and restores it with "
                         f"load_state)", False)


def _trainer(ctx, work, tree, node, qual):
    shown = dotted(node.func)
    last = qual.rsplit(".", 1)[-1]
    library = "TRL's" if qual.startswith("trl") else "transformers'"
    kind = "transformers' Trainer" if last == "Trainer" and qual.startswith("transformers") else \
        f"{library} {last}, built on transformers' Trainer"
    if shown.split(".")[0] in ctx.hf_subclasses:
        kind = f"a subclass of {kind}"
    statement = work.statement_of(node)
    variable = "trainer"
    if isinstance(statement, ast.Assign) and statement.value is node and len(statement.targets) == 1 and \
            isinstance(statement.targets[0], ast.Name):
        variable = statement.targets[0].id
    name = _folder_name(tree) or re.sub(r"trainer$", "", last.lower()) or "trainer"
    add = f"add ar to the callbacks list of {shown}(...)" if any(k.arg == "callbacks" for k in node.keywords) \
        else f"pass callbacks=[ar] to {shown}(...)"
    work.finding("CK502", node.lineno - 1,
                 f"{shown}(...) ({kind}) can resume after a disconnect with colabkit.hf.AutoResume, which saves it "
                 f"to Drive on a schedule: before it, ar = colabkit.hf.AutoResume(\"drive:runs/{name}\", "
                 f"every=\"15min\"); {add}; then "
                 f"{variable}.train(resume_from_checkpoint=ar.resume_from)", False)


def _folder_name(tree) -> str:
    """The last part of a literal output_dir="..." in the cell ("" if there is none)."""
    for node in ast.walk(tree):
        if isinstance(node, ast.keyword) and node.arg == "output_dir" and isinstance(node.value, ast.Constant) \
                and isinstance(node.value.value, str):
            last = re.sub(r"[^\w.-]+", "-", node.value.value.rstrip("/").rsplit("/", 1)[-1]).strip("-.")
            if last:
                return last
    return ""
